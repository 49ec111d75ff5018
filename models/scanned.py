"""Scanned-layer models: train steps whose repeated layers run inside one ``lax.scan``.

* ``gpt_scan_linen``: a GPT decoder (pre-LN blocks: LayerNorm, causal multi-head attention with
  a fused QKV projection and no QKV bias, a 4x GELU MLP; learned positions, tied embeddings)
  whose blocks are stacked with ``flax.linen.scan``: every block parameter has a leading layer
  axis (``params["blocks"]``), and the step's program holds one block body;
* ``gpt_unrolled_linen``: the same decoder with the blocks unrolled in a Python loop
  (``params["block0"]`` ...), the same shapes and math, to compare scanned against unrolled;
  :func:`stack_layers` maps its parameters onto the scanned layout, and
  :func:`unstacked_specs` / :func:`stacked_specs` map a plan's argument layouts between the two;
* ``gpt_scan_nnx``: the same decoder in ``flax.nnx``: the blocks are created by ``nnx.vmap``
  over split RNG streams (stacked parameters) and applied with ``nnx.scan``; its parameter tree
  is the linen scanned one (same names and shapes);
* ``mlp_scan_lax``: a residual GELU MLP written by hand (no Flax): one ``jax.lax.scan`` over
  stacked weights ``W: [L, d, d]``, ``b: [L, d]``; plain SGD with momentum;
* ``mlp_grad_accum``: the ``mlp`` model (3 Dense layers, Adam) with a gradient-accumulation step:
  a ``jax.lax.fori_loop`` with static bounds (which JAX lowers to a ``scan``) over
  ``n_micro`` micro-batches sums the gradients, then one optimizer update.

The GPTs train with AdamW; small configs are 4 layers at d64 (batch 16 x 16 tokens), full ones
GPT-2 124M shapes (12 x d768, context 1024, vocabulary 50257 padded to 50304, batch 8 x 1024).
Softmax and masking compute in ``promote_types(float32, dtype)``: float64 models are float64
throughout.

Layer-count and batch overrides, abstract (nothing allocated)::

    from .scanned import scanned_config, scanned_example
    ex4 = scanned_example("gpt_scan_linen", scanned_config("gpt_scan_linen", layers=4))
    ex64 = scanned_example("gpt_scan_linen", scanned_config("gpt_scan_linen", layers=64))
    state_spec, batch_spec = ex64.args
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import PartitionSpec

from ._train import (
    Batch,
    Example,
    PyTree,
    StepFn,
    build_example,
    classification_batch_spec,
    cross_entropy,
    linen_init_state,
    linen_lm_step,
    register,
    token_batch_spec,
)
from .mlp import MLP
from .nnx_models import lm_loss, nnx_example

# --------------------------------------------------------------------------------------------
# Layer stacking helpers
# --------------------------------------------------------------------------------------------


def scan_blocks(block: nn.Module, x: jax.Array, num_layers: int, unroll: int = 1) -> jax.Array:
    """``num_layers`` applications of the unbound linen ``block`` to ``x`` in one ``nn.scan``
    (``unroll`` copies of the block per loop iteration).

    Every parameter of ``block`` gets a leading layer axis (``variable_axes={"params": 0}``,
    each layer initialized from its own RNG); ``block`` may be an ``nn.remat`` module.
    """
    scan = nn.scan(
        lambda module, carry, _: (module(carry), None),
        variable_axes={"params": 0},
        split_rngs={"params": True},
        length=num_layers,
        unroll=unroll,
    )
    x, _ = scan(block, x, None)
    return x


def stack_layers(
    params: PyTree, num_layers: int, prefix: str = "block", stacked: str = "blocks"
) -> dict[str, Any]:
    """Unrolled parameters ``params[f"{prefix}{i}"]`` stacked into ``params[stacked]``.

    Maps an unrolled model's parameters onto its scanned layout (leading layer axis); the other
    entries are kept as they are.
    """
    names = [f"{prefix}{i}" for i in range(num_layers)]
    out = {k: v for k, v in params.items() if k not in names}
    out[stacked] = jax.tree.map(lambda *xs: jnp.stack(xs), *(params[n] for n in names))
    return out


_LAYER_KEY = re.compile(r"\['block\d+'\]")


def _specs_by_path(specs: PyTree) -> dict[str, PartitionSpec | None]:
    leaves = jax.tree_util.tree_leaves_with_path(
        specs, is_leaf=lambda x: x is None or isinstance(x, PartitionSpec)
    )
    return {jax.tree_util.keystr(k): v for k, v in leaves}


def unstacked_specs(scanned_specs: PyTree, unrolled_args: PyTree) -> PyTree:
    """The scanned step's argument specs (a plan's ``partition_specs()``) for the unrolled
    step's arguments: each layer's parameter (``['block3']``) takes its stack's spec
    (``['blocks']``) without the leading layer entry; the other leaves keep theirs."""
    scanned = _specs_by_path(scanned_specs)

    def spec(path, _leaf):
        key = jax.tree_util.keystr(path)
        stacked = _LAYER_KEY.sub("['blocks']", key)
        s = scanned[stacked]
        return PartitionSpec(*tuple(s)[1:]) if stacked != key and s is not None else s

    return jax.tree_util.tree_map_with_path(spec, unrolled_args)


def stacked_specs(unrolled_specs: PyTree, scanned_args: PyTree) -> PyTree | None:
    """The unrolled step's argument specs for the scanned step's arguments: a stack takes its
    layers' common spec with the layer dim whole; None when the layers' specs differ."""
    by_stack: dict[str, set] = {}
    for key, s in _specs_by_path(unrolled_specs).items():
        by_stack.setdefault(_LAYER_KEY.sub("['blocks']", key), set()).add(s)
    if any(len(v) > 1 for v in by_stack.values()):
        return None

    def spec(path, _leaf):
        key = jax.tree_util.keystr(path)
        (s,) = by_stack[key]
        return PartitionSpec(None, *tuple(s)) if "['blocks']" in key and s is not None else s

    return jax.tree_util.tree_map_with_path(spec, scanned_args)


# --------------------------------------------------------------------------------------------
# GPT decoders (linen and NNX)
# --------------------------------------------------------------------------------------------


def causal_attention(qkv: jax.Array, num_heads: int) -> jax.Array:
    """Causal multi-head attention of a fused projection ``qkv: [batch, length, 3 * d]``.

    Returns ``[batch, length, d]`` before the output projection; scores, mask and softmax are
    computed in ``promote_types(float32, dtype)``.
    """
    batch, length, width = qkv.shape
    d_model = width // 3
    head_dim = d_model // num_heads
    qkv = qkv.reshape(batch, length, 3, num_heads, head_dim)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    acc = jnp.promote_types(jnp.float32, qkv.dtype)
    scores = (jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)).astype(acc)
    causal = np.tril(np.ones((length, length), dtype=bool))  # a constant: no equations
    scores = jnp.where(causal, scores, jnp.finfo(acc).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(qkv.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, length, d_model)


class GPTBlock(nn.Module):
    """Pre-LN block: ``x + out(attn(qkv(ln1(x))))``, then ``x + proj(gelu(fc(ln2(x))))``."""

    num_heads: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        d_model = x.shape[-1]
        kw = {"dtype": self.dtype, "param_dtype": self.dtype}
        qkv = nn.Dense(3 * d_model, use_bias=False, name="qkv", **kw)(
            nn.LayerNorm(name="ln1", **kw)(x)
        )
        x = x + nn.Dense(d_model, name="out", **kw)(causal_attention(qkv, self.num_heads))
        h = nn.Dense(4 * d_model, name="fc", **kw)(nn.LayerNorm(name="ln2", **kw)(x))
        return x + nn.Dense(d_model, name="proj", **kw)(jax.nn.gelu(h))


class GPTDecoder(nn.Module):
    """Token + learned position embeddings, ``num_layers`` blocks, final LN, tied LM head.

    ``scan_layers=True`` stacks the blocks with ``nn.scan`` (``params["blocks"]``, leading layer
    axis; ``scan_unroll`` copies per loop iteration); ``False`` unrolls them (``params["block0"]``
    ...).
    """

    vocab_size: int
    seq_len: int
    num_layers: int
    d_model: int
    num_heads: int
    scan_layers: bool = True
    dtype: Any = jnp.float32
    scan_unroll: int = 1

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        kw = {"dtype": self.dtype, "param_dtype": self.dtype}
        embed = nn.Embed(self.vocab_size, self.d_model, name="wte", **kw)
        pos = self.param(
            "wpe", nn.initializers.normal(0.02), (self.seq_len, self.d_model), self.dtype
        )
        x = embed(tokens) + pos[None, : tokens.shape[1]]
        if self.scan_layers:
            block = GPTBlock(self.num_heads, self.dtype, name="blocks")
            x = scan_blocks(block, x, self.num_layers, self.scan_unroll)
        else:
            for i in range(self.num_layers):
                x = GPTBlock(self.num_heads, self.dtype, name=f"block{i}")(x)
        return embed.attend(nn.LayerNorm(name="ln_f", **kw)(x))


class NNXGPTBlock(nnx.Module):
    """:class:`GPTBlock` in NNX (the same parameter names and math)."""

    def __init__(self, d_model: int, num_heads: int, dtype: Any, *, rngs: nnx.Rngs) -> None:
        self.num_heads = num_heads
        kw = {"dtype": dtype, "param_dtype": dtype, "rngs": rngs}
        self.ln1 = nnx.LayerNorm(d_model, **kw)
        self.qkv = nnx.Linear(d_model, 3 * d_model, use_bias=False, **kw)
        self.out = nnx.Linear(d_model, d_model, **kw)
        self.ln2 = nnx.LayerNorm(d_model, **kw)
        self.fc = nnx.Linear(d_model, 4 * d_model, **kw)
        self.proj = nnx.Linear(4 * d_model, d_model, **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.out(causal_attention(self.qkv(self.ln1(x)), self.num_heads))
        return x + self.proj(jax.nn.gelu(self.fc(self.ln2(x))))


class NNXScanGPT(nnx.Module):
    """:class:`GPTDecoder` (scanned) in NNX: ``nnx.vmap``-created blocks applied by ``nnx.scan``."""

    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        num_layers: int,
        d_model: int,
        num_heads: int,
        dtype: Any,
        *,
        rngs: nnx.Rngs,
    ) -> None:
        kw = {"dtype": dtype, "param_dtype": dtype, "rngs": rngs}
        self.wte = nnx.Embed(vocab_size, d_model, **kw)
        self.wpe = nnx.Param(
            nnx.initializers.normal(0.02)(rngs.params(), (seq_len, d_model), dtype)
        )

        @nnx.split_rngs(splits=num_layers)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make_blocks(rngs: nnx.Rngs) -> NNXGPTBlock:
            return NNXGPTBlock(d_model, num_heads, dtype, rngs=rngs)

        self.blocks = make_blocks(rngs)  # every parameter: leading layer axis
        self.ln_f = nnx.LayerNorm(d_model, **kw)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def apply_block(x: jax.Array, block: NNXGPTBlock) -> jax.Array:
            return block(x)

        x = self.wte(tokens) + self.wpe[None, : tokens.shape[1]]
        return self.wte.attend(self.ln_f(apply_block(x, self.blocks)))


def _adamw(cfg: dict[str, Any]) -> optax.GradientTransformation:
    return optax.adamw(cfg["lr"], b1=0.9, b2=0.95, weight_decay=cfg["weight_decay"])


def _gpt_linen_example(name: str, cfg: dict[str, Any], dtype: Any, scan_layers: bool) -> Example:
    model = GPTDecoder(
        vocab_size=cfg["padded_vocab_size"],
        seq_len=cfg["seq_len"],
        num_layers=cfg["num_layers"],
        d_model=cfg["d_model"],
        num_heads=cfg["num_heads"],
        scan_layers=scan_layers,
        dtype=dtype,
        scan_unroll=cfg["unroll"],
    )
    spec = token_batch_spec(cfg["batch"], cfg["seq_len"])
    init = linen_init_state(model, _adamw(cfg), spec["tokens"])
    return build_example(name, model, linen_lm_step, init, spec, cfg)


def _gpt_nnx_example(name: str, cfg: dict[str, Any], dtype: Any) -> Example:
    def make_model(rngs: nnx.Rngs) -> NNXScanGPT:
        return NNXScanGPT(
            cfg["padded_vocab_size"],
            cfg["seq_len"],
            cfg["num_layers"],
            cfg["d_model"],
            cfg["num_heads"],
            dtype,
            rngs=rngs,
        )

    spec = token_batch_spec(cfg["batch"], cfg["seq_len"])
    return nnx_example(name, make_model, _adamw(cfg), spec, cfg, lm_loss)


# --------------------------------------------------------------------------------------------
# Hand-written lax.scan MLP and gradient accumulation
# --------------------------------------------------------------------------------------------


def init_residual_mlp(key: jax.Array, cfg: dict[str, Any], dtype: Any) -> dict[str, Any]:
    """Parameters of :func:`residual_mlp`: ``embed``, stacked ``layers`` and ``head``.

    Kernels are normal with variance ``1 / fan_in`` (the residual kernels scaled down by
    ``sqrt(num_layers)`` so that deep stacks stay well conditioned); biases are zero.
    """
    d_in, d, depth, classes = (
        cfg["in_features"],
        cfg["d_model"],
        cfg["num_layers"],
        cfg["num_classes"],
    )
    k_embed, k_layers, k_head = jax.random.split(key, 3)
    return {
        "embed": {
            "kernel": jax.random.normal(k_embed, (d_in, d), dtype) / math.sqrt(d_in),
            "bias": jnp.zeros((d,), dtype),
        },
        "layers": {
            "kernel": jax.random.normal(k_layers, (depth, d, d), dtype) / math.sqrt(d * depth),
            "bias": jnp.zeros((depth, d), dtype),
        },
        "head": {
            "kernel": jax.random.normal(k_head, (d, classes), dtype) / math.sqrt(d),
            "bias": jnp.zeros((classes,), dtype),
        },
    }


def residual_mlp(params: dict[str, Any], x: jax.Array) -> jax.Array:
    """Logits: ``h = embed(x)``; per layer ``h = h + gelu(h @ W[l] + b[l])`` (one lax.scan)."""

    def layer(h: jax.Array, weights: dict[str, jax.Array]) -> tuple[jax.Array, None]:
        return h + jax.nn.gelu(h @ weights["kernel"] + weights["bias"]), None

    h = x @ params["embed"]["kernel"] + params["embed"]["bias"]
    h, _ = jax.lax.scan(layer, h, params["layers"])
    return h @ params["head"]["kernel"] + params["head"]["bias"]


def _mlp_scan_lax_example(name: str, cfg: dict[str, Any], dtype: Any) -> Example:
    tx = optax.sgd(cfg["lr"], momentum=0.9)

    def init_state(key: jax.Array) -> tuple[PyTree, optax.OptState]:
        params = init_residual_mlp(key, cfg, dtype)
        return params, tx.init(params)

    def step(
        state: tuple[PyTree, optax.OptState], batch: Batch
    ) -> tuple[tuple[PyTree, optax.OptState], dict[str, jax.Array]]:
        params, opt_state = state

        def loss_fn(params: PyTree) -> jax.Array:
            return cross_entropy(residual_mlp(params, batch["x"]), batch["y"])

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), {"loss": loss}

    spec = classification_batch_spec(cfg["batch"], (cfg["in_features"],), dtype)
    return build_example(name, residual_mlp, step, init_state, spec, cfg, lambda s: s[0])


def grad_accum_classifier_step(n_micro: int) -> StepFn:
    """A linen classification step accumulating gradients over ``n_micro`` micro-batches.

    The batch is reshaped to ``[n_micro, batch / n_micro, ...]``; a ``jax.lax.fori_loop`` with
    static bounds (lowered to a ``scan``) picks micro-batch ``i`` with
    ``jax.lax.dynamic_index_in_dim`` and adds its loss and gradients to the carry; one optimizer
    update applies the mean gradient (the full-batch gradient, micro-batches being equal).
    """

    def step(state: Any, batch: Batch) -> tuple[Any, dict[str, jax.Array]]:
        micro_batches = jax.tree.map(
            lambda x: x.reshape(n_micro, x.shape[0] // n_micro, *x.shape[1:]), batch
        )

        def loss_fn(params: PyTree, micro: Batch) -> jax.Array:
            return cross_entropy(state.apply_fn({"params": params}, micro["x"]), micro["y"])

        def accumulate(i: jax.Array, carry: tuple[jax.Array, PyTree]) -> tuple[jax.Array, PyTree]:
            loss_sum, grad_sum = carry
            micro = jax.tree.map(
                lambda x: jax.lax.dynamic_index_in_dim(x, i, keepdims=False), micro_batches
            )
            loss, grads = jax.value_and_grad(loss_fn)(state.params, micro)
            return loss_sum + loss, jax.tree.map(jnp.add, grad_sum, grads)

        zeros = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, state.params))
        loss_sum, grad_sum = jax.lax.fori_loop(0, n_micro, accumulate, zeros)
        grads = jax.tree.map(lambda g: g / n_micro, grad_sum)
        return state.apply_gradients(grads=grads), {"loss": loss_sum / n_micro}

    return step


def _mlp_grad_accum_example(name: str, cfg: dict[str, Any], dtype: Any) -> Example:
    if cfg["batch"] % cfg["n_micro"]:
        raise ValueError(f"{name}: batch {cfg['batch']} not divisible by {cfg['n_micro']}")
    model = MLP(features=tuple(cfg["features"]), dtype=dtype)
    tx = optax.adam(cfg["lr"])
    spec = classification_batch_spec(cfg["batch"], (cfg["in_features"],), dtype)
    init = linen_init_state(model, tx, spec["x"])
    return build_example(name, model, grad_accum_classifier_step(cfg["n_micro"]), init, spec, cfg)


# --------------------------------------------------------------------------------------------
# Configs and registration
# --------------------------------------------------------------------------------------------

_GPT_SMALL = {
    "batch": 16,
    "seq_len": 16,
    "vocab_size": 120,
    "padded_vocab_size": 128,
    "num_layers": 4,
    "d_model": 64,
    "num_heads": 4,
    "lr": 1e-3,
    "weight_decay": 0.1,
    "unroll": 1,  # gpt_scan_linen: body copies per loop iteration (nn.scan's unroll)
}
# GPT-2 124M shapes (vocabulary padded to a multiple of 64, as in models/transformer.py).
_GPT_FULL = {
    "batch": 8,
    "seq_len": 1024,
    "vocab_size": 50257,
    "padded_vocab_size": 50304,
    "num_layers": 12,
    "d_model": 768,
    "num_heads": 12,
    "lr": 6e-4,
    "weight_decay": 0.1,
    "unroll": 1,
}
_MLP_SCAN_SMALL = {
    "batch": 16,
    "in_features": 32,
    "d_model": 64,
    "num_layers": 4,
    "num_classes": 10,
    "lr": 0.05,
}
_MLP_SCAN_FULL = {
    "batch": 128,
    "in_features": 784,
    "d_model": 1024,
    "num_layers": 16,
    "num_classes": 10,
    "lr": 0.01,
}
_GRAD_ACCUM_SMALL = {
    "batch": 16,
    "n_micro": 4,
    "in_features": 32,
    "features": (64, 64, 10),
    "num_classes": 10,
    "lr": 1e-3,
}
_GRAD_ACCUM_FULL = {
    "batch": 128,
    "n_micro": 8,
    "in_features": 784,
    "features": (512, 512, 10),
    "num_classes": 10,
    "lr": 1e-3,
}

Config = dict[str, Any]
_MODELS: dict[str, tuple[Config, Config, Callable[[str, Config, Any], Example]]] = {
    # name: (small config, full config, builder)
    "gpt_scan_linen": (
        _GPT_SMALL,
        _GPT_FULL,
        lambda name, cfg, dtype: _gpt_linen_example(name, cfg, dtype, scan_layers=True),
    ),
    "gpt_unrolled_linen": (
        _GPT_SMALL,
        _GPT_FULL,
        lambda name, cfg, dtype: _gpt_linen_example(name, cfg, dtype, scan_layers=False),
    ),
    "gpt_scan_nnx": (_GPT_SMALL, _GPT_FULL, _gpt_nnx_example),
    "mlp_scan_lax": (_MLP_SCAN_SMALL, _MLP_SCAN_FULL, _mlp_scan_lax_example),
    "mlp_grad_accum": (_GRAD_ACCUM_SMALL, _GRAD_ACCUM_FULL, _mlp_grad_accum_example),
}
NAMES: tuple[str, ...] = tuple(_MODELS)


def scanned_config(
    name: str,
    small: bool = False,
    layers: int | None = None,
    batch: int | None = None,
    **overrides: Any,
) -> Config:
    """A fresh copy of the config of ``name`` (one of ``NAMES``) with overrides.

    ``layers`` sets ``num_layers`` (the scan length; ``mlp_grad_accum`` scans micro-batches
    instead: override ``n_micro``); ``overrides`` replace existing keys only.
    """
    if name not in _MODELS:
        raise KeyError(f"unknown scanned model {name!r}; known: {', '.join(_MODELS)}")
    cfg = dict(_MODELS[name][0 if small else 1])
    if layers is not None:
        overrides["num_layers"] = int(layers)
    if batch is not None:
        overrides["batch"] = int(batch)
    unknown = sorted(set(overrides) - set(cfg))
    if unknown:
        raise KeyError(f"{name} has no config keys {unknown}; keys: {', '.join(cfg)}")
    cfg.update(overrides)
    return cfg


def scanned_example(name: str, cfg: Config, dtype: Any = jnp.float32) -> Example:
    """The example ``name`` (one of ``NAMES``) built from ``cfg`` (see :func:`scanned_config`)."""
    if name not in _MODELS:
        raise KeyError(f"unknown scanned model {name!r}; known: {', '.join(_MODELS)}")
    cfg = {**cfg, "dtype": jnp.dtype(dtype).name}
    return _MODELS[name][2](name, cfg, jnp.dtype(dtype))


def _build(name: str, batch: int | None, small: bool, dtype: Any) -> Example:
    return scanned_example(name, scanned_config(name, small, batch=batch), dtype)


@register("gpt_scan_linen")
def gpt_scan_linen(batch: int | None, small: bool, dtype: Any) -> Example:
    """GPT decoder, blocks stacked with ``nn.scan`` (GPT-2 124M shapes), AdamW; 8x1024."""
    return _build("gpt_scan_linen", batch, small, dtype)


@register("gpt_unrolled_linen")
def gpt_unrolled_linen(batch: int | None, small: bool, dtype: Any) -> Example:
    """``gpt_scan_linen`` with the blocks unrolled in a Python loop, AdamW; 8x1024."""
    return _build("gpt_unrolled_linen", batch, small, dtype)


@register("gpt_scan_nnx")
def gpt_scan_nnx(batch: int | None, small: bool, dtype: Any) -> Example:
    """``gpt_scan_linen`` in NNX (``nnx.vmap``-built blocks, ``nnx.scan``), AdamW; 8x1024."""
    return _build("gpt_scan_nnx", batch, small, dtype)


@register("mlp_scan_lax")
def mlp_scan_lax(batch: int | None, small: bool, dtype: Any) -> Example:
    """Residual GELU MLP as one hand-written ``lax.scan`` over stacked weights, SGD; 128."""
    return _build("mlp_scan_lax", batch, small, dtype)


@register("mlp_grad_accum")
def mlp_grad_accum(batch: int | None, small: bool, dtype: Any) -> Example:
    """3-layer MLP, Adam, gradients accumulated over micro-batches by a ``fori_loop``; 128."""
    return _build("mlp_grad_accum", batch, small, dtype)
