"""Model zoo of Flax train steps for the jaxpar planner.

Usage::

    import models
    ex = models.get("gpt_small", small=True)
    state_spec, batch_spec = ex.args          # jax.ShapeDtypeStruct pytrees, nothing allocated
    state, batch = ex.make_args(seed=0)       # concrete arrays, deterministic per seed
    new_state, metrics = jax.jit(ex.step)(state, batch)

Adding a model: write a builder ``(batch, small, dtype) -> Example`` decorated with
``@register("name")`` in a family module and import that module below.
"""

from __future__ import annotations

# Family modules register their builders on import; the order here is the order of NAMES.
from models import cnn, mlp, nnx_models, transformer  # noqa: F401
from models._train import Example, get, register, registered_names

NAMES: tuple[str, ...] = registered_names()

__all__ = ["NAMES", "Example", "get", "register", "registered_names"]
