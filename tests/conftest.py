"""Eight fake CPU devices for every test, set before any backend initializes."""

import jax

jax.config.update("jax_num_cpu_devices", 8)
