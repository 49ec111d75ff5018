"""Linen convolutional networks: a residual CNN with BatchNorm (``cnn``) and LeNet-5."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from models._train import (
    Example,
    build_example,
    classification_batch_spec,
    linen_batchnorm_classifier_step,
    linen_classifier_step,
    linen_init_state,
    pick,
    register,
)


def _conv(features: int, kernel: int, strides: int, dtype: Any, name: str) -> nn.Conv:
    """Bias-free SAME conv (the following BatchNorm makes a bias redundant)."""
    return nn.Conv(
        features,
        (kernel, kernel),
        (strides, strides),
        padding="SAME",
        use_bias=False,
        dtype=dtype,
        param_dtype=dtype,
        name=name,
    )


def _batch_norm(train: bool, dtype: Any, name: str) -> nn.BatchNorm:
    """BatchNorm using batch statistics while training, running averages otherwise."""
    return nn.BatchNorm(
        use_running_average=not train, momentum=0.9, dtype=dtype, param_dtype=dtype, name=name
    )


class ResidualBlock(nn.Module):
    """Basic ResNet block: conv-BN-ReLU-conv-BN plus a (projected) shortcut."""

    features: int
    strides: int = 1
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        y = _conv(self.features, 3, self.strides, self.dtype, "conv1")(x)
        y = nn.relu(_batch_norm(train, self.dtype, "bn1")(y))
        y = _conv(self.features, 3, 1, self.dtype, "conv2")(y)
        y = _batch_norm(train, self.dtype, "bn2")(y)
        if x.shape[-1] != self.features or self.strides != 1:
            # Channel/resolution change: 1x1 projection so the shortcut can be added.
            x = _conv(self.features, 1, self.strides, self.dtype, "proj")(x)
            x = _batch_norm(train, self.dtype, "proj_bn")(x)
        return nn.relu(x + y)


class ResNet(nn.Module):
    """Small CIFAR-style ResNet: stem conv, residual stages, global average pool, Dense."""

    stage_features: Sequence[int]
    blocks_per_stage: int
    num_classes: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = True) -> jax.Array:
        x = _conv(self.stage_features[0], 3, 1, self.dtype, "stem")(x)
        x = _batch_norm(train, self.dtype, "stem_bn")(x)
        x = nn.relu(x)
        for s, feats in enumerate(self.stage_features):
            for b in range(self.blocks_per_stage):
                # Downsample at the start of every stage but the first.
                strides = 2 if (s > 0 and b == 0) else 1
                x = ResidualBlock(feats, strides, self.dtype, name=f"stage{s}_block{b}")(x, train)
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(self.num_classes, dtype=self.dtype, param_dtype=self.dtype, name="head")(x)


_CNN_SMALL = {
    "batch": 16,
    "image": (8, 8, 3),
    "stage_features": (8, 16),
    "blocks_per_stage": 1,
    "num_classes": 10,
    "lr": 0.05,
    "momentum": 0.9,
}
# ResNet-20 on CIFAR-10 (3 stages x 3 blocks of 16/32/64 channels).
_CNN_FULL = {
    "batch": 128,
    "image": (32, 32, 3),
    "stage_features": (16, 32, 64),
    "blocks_per_stage": 3,
    "num_classes": 10,
    "lr": 0.1,
    "momentum": 0.9,
}


@register("cnn")
def cnn(batch: int | None, small: bool, dtype: Any) -> Example:
    """Residual CNN with BatchNorm (NHWC), SGD with momentum; the step updates batch_stats."""
    cfg = pick(small, _CNN_SMALL, _CNN_FULL, batch)
    model = ResNet(
        stage_features=tuple(cfg["stage_features"]),
        blocks_per_stage=cfg["blocks_per_stage"],
        num_classes=cfg["num_classes"],
        dtype=dtype,
    )
    tx = optax.sgd(cfg["lr"], momentum=cfg["momentum"])
    spec = classification_batch_spec(cfg["batch"], tuple(cfg["image"]), dtype)
    init = linen_init_state(model, tx, spec["x"], batch_norm=True, init_kwargs={"train": False})
    cfg["dtype"] = jnp.dtype(dtype).name
    return build_example("cnn", model, linen_batchnorm_classifier_step, init, spec, cfg)


class LeNet5(nn.Module):
    """LeNet-5 (tanh, average pooling) on 28x28x1; the first conv pads SAME to keep 28x28."""

    num_classes: int = 10
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kw = {"dtype": self.dtype, "param_dtype": self.dtype}
        x = nn.tanh(nn.Conv(6, (5, 5), padding="SAME", name="conv1", **kw)(x))
        x = nn.avg_pool(x, (2, 2), strides=(2, 2))
        x = nn.tanh(nn.Conv(16, (5, 5), padding="VALID", name="conv2", **kw)(x))
        x = nn.avg_pool(x, (2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))
        x = nn.tanh(nn.Dense(120, name="fc1", **kw)(x))
        x = nn.tanh(nn.Dense(84, name="fc2", **kw)(x))
        return nn.Dense(self.num_classes, name="fc3", **kw)(x)


# LeNet-5 is small either way; the configs differ only in batch size.
_LENET_SMALL = {"batch": 16, "image": (28, 28, 1), "num_classes": 10, "lr": 0.1}
_LENET_FULL = {"batch": 256, "image": (28, 28, 1), "num_classes": 10, "lr": 0.1}


@register("lenet5")
def lenet5(batch: int | None, small: bool, dtype: Any) -> Example:
    """LeNet-5 trained with plain SGD."""
    cfg = pick(small, _LENET_SMALL, _LENET_FULL, batch)
    model = LeNet5(num_classes=cfg["num_classes"], dtype=dtype)
    tx = optax.sgd(cfg["lr"])
    spec = classification_batch_spec(cfg["batch"], tuple(cfg["image"]), dtype)
    cfg["dtype"] = jnp.dtype(dtype).name
    return build_example(
        "lenet5", model, linen_classifier_step, linen_init_state(model, tx, spec["x"]), spec, cfg
    )
