"""Linen convolutional networks: residual CNNs with BatchNorm and LeNet-5.

* ``cnn``: a CIFAR-style ResNet (ResNet-20 at full size), kept as a test model;
* ``resnet18`` / ``resnet34`` / ``resnet50``: the ImageNet ResNets of He et al. (2016), with
  basic blocks (18, 34) or bottleneck blocks (50); 224x224x3 input, 1000 classes, bias-free
  convolutions followed by BatchNorm, a 7x7/2 stem and a 3x3/2 max-pool.  The bottleneck block
  puts the stride on its 3x3 convolution ("ResNet v1.5", as torchvision), which does not change
  the parameter count (11.7M / 21.8M / 25.6M).  BatchNorm computes the batch variance in two
  passes (as PyTorch / cuDNN), see ``_batch_norm``;
* ``lenet5``: LeNet-5.
"""

from __future__ import annotations

import functools
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


def _batch_norm(train: bool, dtype: Any, name: str, fast_variance: bool = True) -> nn.BatchNorm:
    """BatchNorm using batch statistics while training, running averages otherwise.

    ``fast_variance=False`` computes the batch variance in two passes, ``mean((x - mean)^2)``,
    instead of ``mean(x^2) - mean^2``; the one-pass form cancels catastrophically in float32
    when a channel's mean is large against its spread, which makes gradients depend on the
    summation order (e.g. sharded vs unsharded) far beyond rounding.
    """
    return nn.BatchNorm(
        use_running_average=not train,
        momentum=0.9,
        use_fast_variance=fast_variance,
        dtype=dtype,
        param_dtype=dtype,
        name=name,
    )


class ResidualBlock(nn.Module):
    """Basic ResNet block: conv-BN-ReLU-conv-BN plus a (projected) shortcut."""

    features: int
    strides: int = 1
    dtype: Any = jnp.float32
    fast_variance: bool = True

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        bn = functools.partial(_batch_norm, train, self.dtype, fast_variance=self.fast_variance)
        y = _conv(self.features, 3, self.strides, self.dtype, "conv1")(x)
        y = nn.relu(bn("bn1")(y))
        y = _conv(self.features, 3, 1, self.dtype, "conv2")(y)
        y = bn("bn2")(y)
        if x.shape[-1] != self.features or self.strides != 1:
            # Channel/resolution change: 1x1 projection so the shortcut can be added.
            x = _conv(self.features, 1, self.strides, self.dtype, "proj")(x)
            x = bn("proj_bn")(x)
        return nn.relu(x + y)


class BottleneckBlock(nn.Module):
    """ResNet bottleneck: 1x1 (reduce) - 3x3 (strided) - 1x1 (expand x4), each + BN, shortcut."""

    features: int
    strides: int = 1
    dtype: Any = jnp.float32
    fast_variance: bool = True
    expansion: int = 4

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        bn = functools.partial(_batch_norm, train, self.dtype, fast_variance=self.fast_variance)
        out = self.features * self.expansion
        y = _conv(self.features, 1, 1, self.dtype, "conv1")(x)
        y = nn.relu(bn("bn1")(y))
        y = _conv(self.features, 3, self.strides, self.dtype, "conv2")(y)
        y = nn.relu(bn("bn2")(y))
        y = _conv(out, 1, 1, self.dtype, "conv3")(y)
        y = bn("bn3")(y)
        if x.shape[-1] != out or self.strides != 1:
            x = _conv(out, 1, self.strides, self.dtype, "proj")(x)
            x = bn("proj_bn")(x)
        return nn.relu(x + y)


class ResNet(nn.Module):
    """ResNet: stem, residual stages, global average pool, Dense.

    ``blocks_per_stage`` is one count for every stage or one count per stage.  The default
    stem is CIFAR-style (3x3/1 conv, no pooling); ``imagenet_stem`` selects the 7x7/2 conv +
    3x3/2 max-pool stem of the ImageNet ResNets.  ``bottleneck`` swaps the basic block for the
    bottleneck block (whose output has ``4 * features`` channels).  ``fast_variance=False``
    selects the two-pass BatchNorm variance (see ``_batch_norm``).
    """

    stage_features: Sequence[int]
    blocks_per_stage: int | Sequence[int]
    num_classes: int
    dtype: Any = jnp.float32
    bottleneck: bool = False
    imagenet_stem: bool = False
    fast_variance: bool = True

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = True) -> jax.Array:
        if self.imagenet_stem:
            x = _conv(self.stage_features[0], 7, 2, self.dtype, "stem")(x)
        else:
            x = _conv(self.stage_features[0], 3, 1, self.dtype, "stem")(x)
        x = _batch_norm(train, self.dtype, "stem_bn", self.fast_variance)(x)
        x = nn.relu(x)
        if self.imagenet_stem:
            x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
        blocks = self.blocks_per_stage
        if isinstance(blocks, int):
            blocks = (blocks,) * len(self.stage_features)
        block_cls = BottleneckBlock if self.bottleneck else ResidualBlock
        for s, (feats, n_blocks) in enumerate(zip(self.stage_features, blocks, strict=True)):
            for b in range(n_blocks):
                # Downsample at the start of every stage but the first.
                strides = 2 if (s > 0 and b == 0) else 1
                block = block_cls(
                    feats, strides, self.dtype, self.fast_variance, name=f"stage{s}_block{b}"
                )
                x = block(x, train)
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


def _resnet_example(name: str, cfg: dict[str, Any], dtype: Any) -> Example:
    """Shared builder for the BatchNorm ResNets: SGD with momentum, batch_stats updated."""
    model = ResNet(
        stage_features=tuple(cfg["stage_features"]),
        blocks_per_stage=tuple(cfg["blocks_per_stage"]),
        num_classes=cfg["num_classes"],
        dtype=dtype,
        bottleneck=cfg["bottleneck"],
        imagenet_stem=True,
        fast_variance=False,
    )
    tx = optax.sgd(cfg["lr"], momentum=cfg["momentum"])
    spec = classification_batch_spec(cfg["batch"], tuple(cfg["image"]), dtype)
    init = linen_init_state(model, tx, spec["x"], batch_norm=True, init_kwargs={"train": False})
    cfg["dtype"] = jnp.dtype(dtype).name
    return build_example(name, model, linen_batchnorm_classifier_step, init, spec, cfg)


def _imagenet_resnet(blocks: tuple[int, ...], bottleneck: bool) -> dict[str, Any]:
    return {
        "batch": 64,
        "image": (224, 224, 3),
        "stage_features": (64, 128, 256, 512),
        "blocks_per_stage": blocks,
        "bottleneck": bottleneck,
        "num_classes": 1000,
        "lr": 0.1,
        "momentum": 0.9,
    }


def _tiny_resnet(blocks: tuple[int, ...], bottleneck: bool) -> dict[str, Any]:
    # Same stem and four stages; 32x32 input goes 16 (stem) -> 8 (pool) -> 8/4/2/1 (stages).
    return {
        "batch": 16,
        "image": (32, 32, 3),
        "stage_features": (4, 8, 8, 16),
        "blocks_per_stage": blocks,
        "bottleneck": bottleneck,
        "num_classes": 10,
        "lr": 0.05,
        "momentum": 0.9,
    }


_RESNETS = {
    # name: (full blocks per stage, small blocks per stage, bottleneck)
    "resnet18": ((2, 2, 2, 2), (1, 1, 1, 1), False),
    "resnet34": ((3, 4, 6, 3), (1, 2, 1, 1), False),
    "resnet50": ((3, 4, 6, 3), (1, 2, 1, 1), True),
}


def _resnet(name: str, batch: int | None, small: bool, dtype: Any) -> Example:
    full_blocks, small_blocks, bottleneck = _RESNETS[name]
    cfg = pick(
        small,
        _tiny_resnet(small_blocks, bottleneck),
        _imagenet_resnet(full_blocks, bottleneck),
        batch,
    )
    return _resnet_example(name, cfg, dtype)


@register("resnet18")
def resnet18(batch: int | None, small: bool, dtype: Any) -> Example:
    """ResNet-18 (basic blocks 2-2-2-2, 11.7M params), SGD momentum; updates batch_stats."""
    return _resnet("resnet18", batch, small, dtype)


@register("resnet34")
def resnet34(batch: int | None, small: bool, dtype: Any) -> Example:
    """ResNet-34 (basic blocks 3-4-6-3, 21.8M params), SGD momentum; updates batch_stats."""
    return _resnet("resnet34", batch, small, dtype)


@register("resnet50")
def resnet50(batch: int | None, small: bool, dtype: Any) -> Example:
    """ResNet-50 (bottleneck blocks 3-4-6-3, 25.6M params), SGD momentum; updates batch_stats."""
    return _resnet("resnet50", batch, small, dtype)


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
