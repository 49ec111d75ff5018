"""Eight fake CPU devices for every test, set before any backend initializes; and two ways to
compile less, neither of which changes what the tests check (docs/testing.md, "Test tiers"):

* XLA:CPU's LLVM code generation runs at -O0 (``--xla_backend_optimization_level=0``). It only
  changes the machine code of each kernel, not the HLO passes the tests check (SPMD
  partitioning, the collective combiners, buffer assignment, ``memory_analysis()``); compiles
  take about half as long. The processes the tests start get it too (`helpers.FAST_CODEGEN`).
* One persistent compilation cache per run, shared by the xdist workers: a program two workers
  (or two tests) compile alike is compiled once. It starts empty and is removed at the end. A
  size limit makes JAX lock it (``filelock``) around every read and write, so no worker reads an
  entry another is still writing.
"""

import importlib.util
import os
import shutil
import tempfile

import jax
from helpers import FAST_CODEGEN

# before any backend starts: that is when XLA reads its flags
os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), FAST_CODEGEN]).strip()

jax.config.update("jax_num_cpu_devices", 8)

CACHE_VAR = "JAXPAR_TEST_COMPILATION_CACHE"


def pytest_configure(config):
    if importlib.util.find_spec("filelock") is None:
        return  # installed without the test extra: no shared cache, each process compiles
    if not hasattr(config, "workerinput"):  # the run's own process: workers inherit the folder
        os.environ[CACHE_VAR] = tempfile.mkdtemp(prefix="jaxpar-tests-xla-cache-")
    jax.config.update("jax_compilation_cache_dir", os.environ[CACHE_VAR])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    jax.config.update("jax_compilation_cache_max_size", 8 * 2**30)  # far above what a run writes


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput") and CACHE_VAR in os.environ:
        shutil.rmtree(os.environ.pop(CACHE_VAR), ignore_errors=True)
