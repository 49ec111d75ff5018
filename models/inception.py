"""Inception-v3 (Szegedy et al., 2016) in linen, following torchvision's ``Inception3`` layout.

Every convolution is bias-free and followed by BatchNorm (eps 1e-3, two-pass batch variance as in
PyTorch / cuDNN: the one-pass ``mean(x^2) - mean^2`` cancels badly in float32 here) and ReLU.
Network::

    299x299x3 stem: conv 3x3/2 (32), conv 3x3 (32), conv 3x3 pad 1 (64), max-pool 3x3/2,
                    conv 1x1 (80), conv 3x3 (192), max-pool 3x3/2             -> 35x35x192
    3 x InceptionA  (1x1 | 1x1-5x5 | 1x1-3x3-3x3 | avg-pool-1x1)              -> 35x35x288
    InceptionB      grid reduction (3x3/2 | 1x1-3x3-3x3/2 | max-pool)         -> 17x17x768
    4 x InceptionC  factorized 7x7: (1x1 | 1x1-1x7-7x1 | 1x1-7x1-1x7-7x1-1x7 | pool-1x1)
    InceptionD      grid reduction (1x1-3x3/2 | 1x1-1x7-7x1-3x3/2 | max-pool) ->  8x8x1280
    2 x InceptionE  expanded filter bank: 1x3 and 3x1 branches concatenated   ->  8x8x2048
    global average pool, Dense 1000

23.8M parameters.  The auxiliary classifier (a training-time side head on the 17x17 grid) is
omitted, and so is dropout before the classifier (the train steps carry no dropout RNG).

The small config keeps the stem and one block of every kind (A, B, C, D, E) with all channel
counts divided by 16 on a 75x75x3 input, the smallest the stem and the two grid reductions
accept (75 -> 7x7 after the stem -> 3x3 after B -> 1x1 after D).
"""

from __future__ import annotations

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
    linen_init_state,
    pick,
    register,
)


class ConvBN(nn.Module):
    """Bias-free convolution + BatchNorm + ReLU (torchvision's ``BasicConv2d``)."""

    features: int
    kernel: tuple[int, int]
    strides: int = 1
    padding: tuple[int, int] = (0, 0)  # symmetric (rows, cols) padding; (0, 0) is VALID
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        ph, pw = self.padding
        x = nn.Conv(
            self.features,
            self.kernel,
            (self.strides, self.strides),
            padding=((ph, ph), (pw, pw)),
            use_bias=False,
            dtype=self.dtype,
            param_dtype=self.dtype,
            name="conv",
        )(x)
        x = nn.BatchNorm(
            use_running_average=not train,
            momentum=0.9,
            epsilon=1e-3,
            use_fast_variance=False,
            dtype=self.dtype,
            param_dtype=self.dtype,
            name="bn",
        )(x)
        return nn.relu(x)


def _avg_pool_3x3(x: jax.Array) -> jax.Array:
    """3x3 stride-1 average pool with padding 1 (padded zeros counted, as torchvision)."""
    return nn.avg_pool(x, (3, 3), strides=(1, 1), padding=((1, 1), (1, 1)))


def _max_pool_3x3_s2(x: jax.Array) -> jax.Array:
    return nn.max_pool(x, (3, 3), strides=(2, 2))


class _Block(nn.Module):
    """Base class: ``c(n)`` scales a paper channel count; ``conv`` builds a named ConvBN."""

    div: int = 1  # channel divisor (1 at full size)
    dtype: Any = jnp.float32

    def c(self, n: int) -> int:
        return max(1, n // self.div)

    def conv(self, name: str, n: int, kernel: tuple[int, int], strides: int = 1, pad=(0, 0)):
        return ConvBN(self.c(n), kernel, strides, pad, self.dtype, name=name)


class InceptionA(_Block):
    pool_features: int = 32

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        b1 = self.conv("b1x1", 64, (1, 1))(x, train)
        b5 = self.conv("b5x5_1", 48, (1, 1))(x, train)
        b5 = self.conv("b5x5_2", 64, (5, 5), pad=(2, 2))(b5, train)
        b3 = self.conv("b3x3dbl_1", 64, (1, 1))(x, train)
        b3 = self.conv("b3x3dbl_2", 96, (3, 3), pad=(1, 1))(b3, train)
        b3 = self.conv("b3x3dbl_3", 96, (3, 3), pad=(1, 1))(b3, train)
        bp = self.conv("bpool", self.pool_features, (1, 1))(_avg_pool_3x3(x), train)
        return jnp.concatenate([b1, b5, b3, bp], axis=-1)


class InceptionB(_Block):
    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        b3 = self.conv("b3x3", 384, (3, 3), strides=2)(x, train)
        bd = self.conv("b3x3dbl_1", 64, (1, 1))(x, train)
        bd = self.conv("b3x3dbl_2", 96, (3, 3), pad=(1, 1))(bd, train)
        bd = self.conv("b3x3dbl_3", 96, (3, 3), strides=2)(bd, train)
        return jnp.concatenate([b3, bd, _max_pool_3x3_s2(x)], axis=-1)


class InceptionC(_Block):
    channels_7x7: int = 128

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        c7 = self.channels_7x7
        b1 = self.conv("b1x1", 192, (1, 1))(x, train)
        b7 = self.conv("b7x7_1", c7, (1, 1))(x, train)
        b7 = self.conv("b7x7_2", c7, (1, 7), pad=(0, 3))(b7, train)
        b7 = self.conv("b7x7_3", 192, (7, 1), pad=(3, 0))(b7, train)
        bd = self.conv("b7x7dbl_1", c7, (1, 1))(x, train)
        bd = self.conv("b7x7dbl_2", c7, (7, 1), pad=(3, 0))(bd, train)
        bd = self.conv("b7x7dbl_3", c7, (1, 7), pad=(0, 3))(bd, train)
        bd = self.conv("b7x7dbl_4", c7, (7, 1), pad=(3, 0))(bd, train)
        bd = self.conv("b7x7dbl_5", 192, (1, 7), pad=(0, 3))(bd, train)
        bp = self.conv("bpool", 192, (1, 1))(_avg_pool_3x3(x), train)
        return jnp.concatenate([b1, b7, bd, bp], axis=-1)


class InceptionD(_Block):
    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        b3 = self.conv("b3x3_1", 192, (1, 1))(x, train)
        b3 = self.conv("b3x3_2", 320, (3, 3), strides=2)(b3, train)
        b7 = self.conv("b7x7x3_1", 192, (1, 1))(x, train)
        b7 = self.conv("b7x7x3_2", 192, (1, 7), pad=(0, 3))(b7, train)
        b7 = self.conv("b7x7x3_3", 192, (7, 1), pad=(3, 0))(b7, train)
        b7 = self.conv("b7x7x3_4", 192, (3, 3), strides=2)(b7, train)
        return jnp.concatenate([b3, b7, _max_pool_3x3_s2(x)], axis=-1)


class InceptionE(_Block):
    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        b1 = self.conv("b1x1", 320, (1, 1))(x, train)
        b3 = self.conv("b3x3_1", 384, (1, 1))(x, train)
        b3 = jnp.concatenate(
            [
                self.conv("b3x3_2a", 384, (1, 3), pad=(0, 1))(b3, train),
                self.conv("b3x3_2b", 384, (3, 1), pad=(1, 0))(b3, train),
            ],
            axis=-1,
        )
        bd = self.conv("b3x3dbl_1", 448, (1, 1))(x, train)
        bd = self.conv("b3x3dbl_2", 384, (3, 3), pad=(1, 1))(bd, train)
        bd = jnp.concatenate(
            [
                self.conv("b3x3dbl_3a", 384, (1, 3), pad=(0, 1))(bd, train),
                self.conv("b3x3dbl_3b", 384, (3, 1), pad=(1, 0))(bd, train),
            ],
            axis=-1,
        )
        bp = self.conv("bpool", 192, (1, 1))(_avg_pool_3x3(x), train)
        return jnp.concatenate([b1, b3, bd, bp], axis=-1)


class InceptionV3(_Block):
    """Stem, A x n_a, B, C x len(c7), D, E x n_e, global average pool, Dense."""

    num_classes: int = 1000
    a_pool_features: tuple[int, ...] = (32, 64, 64)  # one InceptionA per entry
    c_channels_7x7: tuple[int, ...] = (128, 160, 160, 192)  # one InceptionC per entry
    num_e: int = 2

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = True) -> jax.Array:
        kw = {"div": self.div, "dtype": self.dtype}
        x = self.conv("conv1a_3x3", 32, (3, 3), strides=2)(x, train)
        x = self.conv("conv2a_3x3", 32, (3, 3))(x, train)
        x = self.conv("conv2b_3x3", 64, (3, 3), pad=(1, 1))(x, train)
        x = _max_pool_3x3_s2(x)
        x = self.conv("conv3b_1x1", 80, (1, 1))(x, train)
        x = self.conv("conv4a_3x3", 192, (3, 3))(x, train)
        x = _max_pool_3x3_s2(x)
        for i, pool_features in enumerate(self.a_pool_features):
            x = InceptionA(pool_features=pool_features, name=f"mixed5_{i}", **kw)(x, train)
        x = InceptionB(name="mixed6a", **kw)(x, train)
        for i, c7 in enumerate(self.c_channels_7x7):
            x = InceptionC(channels_7x7=c7, name=f"mixed6_{i}", **kw)(x, train)
        x = InceptionD(name="mixed7a", **kw)(x, train)
        for i in range(self.num_e):
            x = InceptionE(name=f"mixed7_{i}", **kw)(x, train)
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(self.num_classes, dtype=self.dtype, param_dtype=self.dtype, name="fc")(x)


_INCEPTION_FULL = {
    "batch": 64,
    "image": (299, 299, 3),
    "div": 1,
    "a_pool_features": (32, 64, 64),
    "c_channels_7x7": (128, 160, 160, 192),
    "num_e": 2,
    "num_classes": 1000,
    "lr": 0.045,
    "momentum": 0.9,
}
_INCEPTION_SMALL = {
    "batch": 16,
    "image": (75, 75, 3),
    "div": 16,
    "a_pool_features": (32,),
    "c_channels_7x7": (128,),
    "num_e": 1,
    "num_classes": 10,
    # A small step size: at larger ones the second step of this tiny, deep BatchNorm network
    # lands where its gradient is ill-conditioned in float32 (summation order matters).
    "lr": 0.001,
    "momentum": 0.9,
}


@register("inception_v3")
def inception_v3(batch: int | None, small: bool, dtype: Any) -> Example:
    """Inception-v3 without the auxiliary head (23.8M params), SGD + momentum, BatchNorm."""
    cfg = pick(small, _INCEPTION_SMALL, _INCEPTION_FULL, batch)
    model = InceptionV3(
        div=cfg["div"],
        dtype=dtype,
        num_classes=cfg["num_classes"],
        a_pool_features=tuple(cfg["a_pool_features"]),
        c_channels_7x7=tuple(cfg["c_channels_7x7"]),
        num_e=cfg["num_e"],
    )
    tx = optax.sgd(cfg["lr"], momentum=cfg["momentum"])
    spec = classification_batch_spec(cfg["batch"], tuple(cfg["image"]), dtype)
    init = linen_init_state(model, tx, spec["x"], batch_norm=True, init_kwargs={"train": False})
    cfg["dtype"] = jnp.dtype(dtype).name
    return build_example("inception_v3", model, linen_batchnorm_classifier_step, init, spec, cfg)
