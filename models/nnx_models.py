"""Flax NNX models with a functional train step built on ``nnx.split`` / ``nnx.merge``.

The train state handed to the planner is ``(params, opt_state)`` where ``params`` is a plain
nested dict of arrays (``nnx.to_pure_dict``), so it is an ordinary pytree with no NNX
``Variable`` wrappers.  The ``GraphDef`` (the static structure of the module) is closed over by
``step`` and rebuilt into a live module inside the loss with ``nnx.merge``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from models._train import (
    Batch,
    Example,
    PyTree,
    build_example,
    classification_batch_spec,
    cross_entropy,
    pick,
    register,
)


class NNXMLP(nnx.Module):
    """``nnx.Linear`` stack with ReLU in between; the last layer emits logits."""

    def __init__(
        self, in_features: int, features: Sequence[int], dtype: Any, *, rngs: nnx.Rngs
    ) -> None:
        widths = (in_features, *features)
        self.layers = nnx.List(
            [
                nnx.Linear(a, b, dtype=dtype, param_dtype=dtype, rngs=rngs)
                for a, b in itertools.pairwise(widths)
            ]
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = nnx.relu(x)
        return x


def nnx_classifier_example(
    name: str,
    make_model: Callable[[nnx.Rngs], nnx.Module],
    tx: optax.GradientTransformation,
    batch_spec: Batch,
    cfg: dict[str, Any],
) -> Example:
    """Wrap an NNX classifier into an :class:`Example` with a split/merge functional step."""
    # Abstract construction: gives the GraphDef without allocating any parameter.
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: make_model(nnx.Rngs(0))))

    def init_state(key: jax.Array) -> tuple[PyTree, optax.OptState]:
        _, state = nnx.split(make_model(nnx.Rngs(params=key)))
        params = nnx.to_pure_dict(state)
        return params, tx.init(params)

    def step(
        state: tuple[PyTree, optax.OptState], batch: Batch
    ) -> tuple[tuple[PyTree, optax.OptState], dict[str, jax.Array]]:
        params, opt_state = state

        def loss_fn(params: PyTree) -> jax.Array:
            model = nnx.merge(graphdef, params)
            return cross_entropy(model(batch["x"]), batch["y"])

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return (params, opt_state), {"loss": loss}

    return build_example(name, graphdef, step, init_state, batch_spec, cfg)


_NNX_MLP_SMALL = {"batch": 16, "in_features": 32, "features": (64, 64, 10), "lr": 1e-3}
_NNX_MLP_FULL = {"batch": 128, "in_features": 784, "features": (512, 512, 10), "lr": 1e-3}


@register("nnx_mlp")
def nnx_mlp(batch: int | None, small: bool, dtype: Any) -> Example:
    """3-layer NNX MLP trained with plain optax Adam (not ``nnx.Optimizer``)."""
    cfg = pick(small, _NNX_MLP_SMALL, _NNX_MLP_FULL, batch)
    cfg["num_classes"] = cfg["features"][-1]
    cfg["dtype"] = jnp.dtype(dtype).name
    spec = classification_batch_spec(cfg["batch"], (cfg["in_features"],), dtype)
    features = tuple(cfg["features"])
    return nnx_classifier_example(
        "nnx_mlp",
        lambda rngs: NNXMLP(cfg["in_features"], features, dtype, rngs=rngs),
        optax.adam(cfg["lr"]),
        spec,
        cfg,
    )
