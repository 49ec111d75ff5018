"""Linen multi-layer perceptrons: the toy ``mlp`` and the ``soybean_mlp`` benchmark model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from ._train import (
    Example,
    build_example,
    classification_batch_spec,
    linen_classifier_step,
    linen_init_state,
    pick,
    register,
)


class MLP(nn.Module):
    """Stack of Dense layers with ReLU in between; the last layer emits logits."""

    features: Sequence[int]
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.reshape((x.shape[0], -1))
        for i, width in enumerate(self.features):
            x = nn.Dense(width, dtype=self.dtype, param_dtype=self.dtype, name=f"dense_{i}")(x)
            if i + 1 < len(self.features):
                x = nn.relu(x)
        return x


def mlp_example(
    name: str, cfg: dict[str, Any], dtype: Any, tx: optax.GradientTransformation
) -> Example:
    """Shared builder: ``cfg`` holds batch, in_features, features (last = num_classes)."""
    model = MLP(features=tuple(cfg["features"]), dtype=dtype)
    spec = classification_batch_spec(cfg["batch"], (cfg["in_features"],), dtype)
    cfg = {**cfg, "num_classes": cfg["features"][-1], "dtype": jnp.dtype(dtype).name}
    return build_example(
        name,
        model,
        linen_classifier_step,
        linen_init_state(model, tx, spec["x"]),
        spec,
        cfg,
    )


_MLP_SMALL = {"batch": 16, "in_features": 32, "features": (64, 64, 10), "lr": 1e-3}
# MNIST-sized MLP.
_MLP_FULL = {"batch": 128, "in_features": 784, "features": (512, 512, 10), "lr": 1e-3}


@register("mlp")
def mlp(batch: int | None, small: bool, dtype: Any) -> Example:
    """3-layer ReLU MLP trained with Adam."""
    cfg = pick(small, _MLP_SMALL, _MLP_FULL, batch)
    return mlp_example("mlp", cfg, dtype, optax.adam(cfg["lr"]))


# The Soybean MLP: five Dense(320) layers on 320 input features, batch 400, plain SGD.  It is
# already small, so the small and full configs are the same.
_SOYBEAN = {"batch": 400, "in_features": 320, "features": (320,) * 5, "lr": 0.1}


@register("soybean_mlp")
def soybean_mlp(batch: int | None, small: bool, dtype: Any) -> Example:
    """5 x Dense(320) MLP, softmax cross-entropy over 320 classes, plain SGD."""
    cfg = pick(small, _SOYBEAN, _SOYBEAN, batch)
    return mlp_example("soybean_mlp", cfg, dtype, optax.sgd(cfg["lr"]))
