"""Plain (non-residual) ImageNet convnets in linen: AlexNet and VGG-11/13/16/19.

Both are the networks of the OptCNN / AccPar evaluations: stacks of ReLU convolutions with
max-pooling, followed by three large fully connected layers, trained with SGD + momentum 0.9.

* ``alexnet``: the single-tower AlexNet of Krizhevsky (2014, "One weird trick"), as in
  torchvision and OptCNN: 224x224x3 input, convolutions 64-192-384-256-256 (11x11/4 pad 2,
  5x5 pad 2, 3x3 pad 1), 3x3/2 max-pools, Dense 4096-4096-1000 on the 6x6x256 features
  (61.1M parameters).  Local response normalization is omitted (as in torchvision; it has no
  parameters) and so is dropout (the train steps carry no dropout RNG).
* ``vgg11`` / ``vgg13`` / ``vgg16`` / ``vgg19``: Simonyan & Zisserman configurations A, B, D
  and E: 3x3 pad-1 convolutions in five stages (64-128-256-512-512 channels) each closed by a
  2x2/2 max-pool, then Dense 4096-4096-1000 on the 7x7x512 features; no BatchNorm (as the
  original), no dropout (132.9M / 133.0M / 138.4M / 143.7M parameters).

Convolutions and Dense layers use He (fan-in) initialization so that the deep ReLU stacks
without normalization still train from the first step.

The small configs keep every layer (the same numbers of convolutions, pools and Dense layers)
at widths 4-16 on 64x64 (AlexNet, whose 11x11/4 stem needs it) or 32x32 (VGG) inputs.
"""

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

_HE = nn.initializers.kaiming_normal()


class AlexNet(nn.Module):
    """AlexNet: five ReLU convolutions with three max-pools, then three Dense layers."""

    conv_features: Sequence[int]  # 5 widths
    dense_features: Sequence[int]  # 2 hidden widths
    num_classes: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kw = {"dtype": self.dtype, "param_dtype": self.dtype, "kernel_init": _HE}
        c1, c2, c3, c4, c5 = self.conv_features
        x = nn.relu(nn.Conv(c1, (11, 11), (4, 4), padding=((2, 2), (2, 2)), name="conv1", **kw)(x))
        x = nn.max_pool(x, (3, 3), strides=(2, 2))
        x = nn.relu(nn.Conv(c2, (5, 5), padding=((2, 2), (2, 2)), name="conv2", **kw)(x))
        x = nn.max_pool(x, (3, 3), strides=(2, 2))
        x = nn.relu(nn.Conv(c3, (3, 3), padding=((1, 1), (1, 1)), name="conv3", **kw)(x))
        x = nn.relu(nn.Conv(c4, (3, 3), padding=((1, 1), (1, 1)), name="conv4", **kw)(x))
        x = nn.relu(nn.Conv(c5, (3, 3), padding=((1, 1), (1, 1)), name="conv5", **kw)(x))
        x = nn.max_pool(x, (3, 3), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))
        for i, width in enumerate(self.dense_features):
            x = nn.relu(nn.Dense(width, name=f"fc{i + 1}", **kw)(x))
        return nn.Dense(self.num_classes, name=f"fc{len(self.dense_features) + 1}", **kw)(x)


class VGG(nn.Module):
    """VGG: stages of 3x3 ReLU convolutions, each followed by a 2x2/2 max-pool; 3 Dense."""

    stages: Sequence[Sequence[int]]  # per stage, the width of each convolution
    dense_features: Sequence[int]
    num_classes: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kw = {"dtype": self.dtype, "param_dtype": self.dtype, "kernel_init": _HE}
        for s, widths in enumerate(self.stages):
            for c, width in enumerate(widths):
                conv = nn.Conv(width, (3, 3), padding=((1, 1), (1, 1)), name=f"conv{s}_{c}", **kw)
                x = nn.relu(conv(x))
            x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))
        for i, width in enumerate(self.dense_features):
            x = nn.relu(nn.Dense(width, name=f"fc{i + 1}", **kw)(x))
        return nn.Dense(self.num_classes, name=f"fc{len(self.dense_features) + 1}", **kw)(x)


def _sgd_example(name: str, model: nn.Module, cfg: dict[str, Any], dtype: Any) -> Example:
    tx = optax.sgd(cfg["lr"], momentum=cfg["momentum"])
    spec = classification_batch_spec(cfg["batch"], tuple(cfg["image"]), dtype)
    cfg["dtype"] = jnp.dtype(dtype).name
    init = linen_init_state(model, tx, spec["x"])
    return build_example(name, model, linen_classifier_step, init, spec, cfg)


_ALEXNET_FULL = {
    "batch": 64,
    "image": (224, 224, 3),
    "conv_features": (64, 192, 384, 256, 256),
    "dense_features": (4096, 4096),
    "num_classes": 1000,
    "lr": 0.01,
    "momentum": 0.9,
}
# 64x64 -> 15 (conv1) -> 7 (pool) -> 7 (conv2) -> 3 (pool) -> 3 (conv3-5) -> 1 (pool).
_ALEXNET_SMALL = {
    "batch": 16,
    "image": (64, 64, 3),
    "conv_features": (4, 12, 16, 8, 8),
    "dense_features": (16, 16),
    "num_classes": 10,
    "lr": 0.01,
    "momentum": 0.9,
}


@register("alexnet")
def alexnet(batch: int | None, small: bool, dtype: Any) -> Example:
    """AlexNet (5 conv + 3 Dense, 224x224x3, 61.1M params) trained with SGD + momentum."""
    cfg = pick(small, _ALEXNET_SMALL, _ALEXNET_FULL, batch)
    model = AlexNet(
        conv_features=tuple(cfg["conv_features"]),
        dense_features=tuple(cfg["dense_features"]),
        num_classes=cfg["num_classes"],
        dtype=dtype,
    )
    return _sgd_example("alexnet", model, cfg, dtype)


# Convolutions per stage for configurations A (VGG-11), B (13), D (16) and E (19).
_VGG_DEPTHS = {
    "vgg11": (1, 1, 2, 2, 2),
    "vgg13": (2, 2, 2, 2, 2),
    "vgg16": (2, 2, 3, 3, 3),
    "vgg19": (2, 2, 4, 4, 4),
}
_VGG_FULL = {
    "batch": 64,
    "image": (224, 224, 3),
    "stage_widths": (64, 128, 256, 512, 512),
    "dense_features": (4096, 4096),
    "num_classes": 1000,
    "lr": 0.01,
    "momentum": 0.9,
}
# Five stages and five pools on 32x32 (-> 1x1), every convolution kept, tiny widths.
_VGG_SMALL = {
    "batch": 16,
    "image": (32, 32, 3),
    "stage_widths": (4, 8, 8, 16, 16),
    "dense_features": (16, 16),
    "num_classes": 10,
    "lr": 0.01,
    "momentum": 0.9,
}


def _vgg(name: str, batch: int | None, small: bool, dtype: Any) -> Example:
    cfg = pick(small, _VGG_SMALL, _VGG_FULL, batch)
    cfg["convs_per_stage"] = _VGG_DEPTHS[name]
    stages = tuple(
        (width,) * n for width, n in zip(cfg["stage_widths"], _VGG_DEPTHS[name], strict=True)
    )
    model = VGG(
        stages=stages,
        dense_features=tuple(cfg["dense_features"]),
        num_classes=cfg["num_classes"],
        dtype=dtype,
    )
    return _sgd_example(name, model, cfg, dtype)


@register("vgg11")
def vgg11(batch: int | None, small: bool, dtype: Any) -> Example:
    """VGG-11 (configuration A, 132.9M params), SGD + momentum, no BatchNorm."""
    return _vgg("vgg11", batch, small, dtype)


@register("vgg13")
def vgg13(batch: int | None, small: bool, dtype: Any) -> Example:
    """VGG-13 (configuration B, 133.0M params), SGD + momentum, no BatchNorm."""
    return _vgg("vgg13", batch, small, dtype)


@register("vgg16")
def vgg16(batch: int | None, small: bool, dtype: Any) -> Example:
    """VGG-16 (configuration D, 138.4M params), SGD + momentum, no BatchNorm."""
    return _vgg("vgg16", batch, small, dtype)


@register("vgg19")
def vgg19(batch: int | None, small: bool, dtype: Any) -> Example:
    """VGG-19 (configuration E, 143.7M params), SGD + momentum, no BatchNorm."""
    return _vgg("vgg19", batch, small, dtype)
