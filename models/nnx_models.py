"""Flax NNX models with a functional train step built on ``nnx.split`` / ``nnx.merge``.

* ``nnx_mlp``: a 3-layer MLP (test model);
* ``nnx_gpt``: a GPT-2 style decoder written with ``flax.nnx`` (pre-LN blocks held in an
  ``nnx.List`` and applied in an unrolled Python loop, tied embeddings, causal einsum attention
  without QKV bias, AdamW).  Full size is GPT-2 124M (12 layers, d=768, 12 heads, context 1024,
  vocabulary 50257 padded to 50304, batch 8x1024), the same network as the linen ``gpt2_124m``.

The train state handed to the planner is ``(params, opt_state)`` where ``params`` is a plain
nested dict of arrays (``nnx.to_pure_dict``), so it is an ordinary pytree with no NNX
``Variable`` wrappers.  The ``GraphDef`` (the static structure of the module) is closed over by
``step`` and rebuilt into a live module inside the loss with ``nnx.merge``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from ._train import (
    Batch,
    Example,
    PyTree,
    build_example,
    classification_batch_spec,
    cross_entropy,
    pick,
    register,
    token_batch_spec,
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


def nnx_example(
    name: str,
    make_model: Callable[[nnx.Rngs], nnx.Module],
    tx: optax.GradientTransformation,
    batch_spec: Batch,
    cfg: dict[str, Any],
    loss: Callable[[nnx.Module, Batch], jax.Array],
) -> Example:
    """Wrap an NNX model into an :class:`Example` with a split/merge functional step.

    ``loss(model, batch)`` is the scalar training loss of the live (merged) model.
    """
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
            return loss(nnx.merge(graphdef, params), batch)

        value, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return (params, opt_state), {"loss": value}

    return build_example(
        name, graphdef, step, init_state, batch_spec, cfg, params_of=lambda state: state[0]
    )


def nnx_classifier_example(
    name: str,
    make_model: Callable[[nnx.Rngs], nnx.Module],
    tx: optax.GradientTransformation,
    batch_spec: Batch,
    cfg: dict[str, Any],
) -> Example:
    """:func:`nnx_example` with the softmax cross-entropy of ``model(batch["x"])``."""
    return nnx_example(
        name,
        make_model,
        tx,
        batch_spec,
        cfg,
        lambda model, batch: cross_entropy(model(batch["x"]), batch["y"]),
    )


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


class NNXAttention(nnx.Module):
    """Causal multi-head self-attention, fused QKV projection without bias, einsum-based."""

    def __init__(self, d_model: int, num_heads: int, dtype: Any, *, rngs: nnx.Rngs) -> None:
        self.num_heads = num_heads
        self.dtype = dtype
        kw = {"dtype": dtype, "param_dtype": dtype, "rngs": rngs}
        self.qkv = nnx.Linear(d_model, 3 * d_model, use_bias=False, **kw)
        self.out = nnx.Linear(d_model, d_model, **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        batch, length, d_model = x.shape
        head_dim = d_model // self.num_heads
        qkv = self.qkv(x).reshape(batch, length, 3, self.num_heads, head_dim)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)
        causal = jnp.tril(jnp.ones((length, length), dtype=bool))
        scores = jnp.where(causal, scores.astype(jnp.float32), jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(self.dtype)
        out = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, length, d_model)
        return self.out(out)


class NNXBlock(nnx.Module):
    """Pre-LN decoder block: x + attn(ln(x)); x + mlp(ln(x)) with a 4x GELU MLP."""

    def __init__(self, d_model: int, num_heads: int, dtype: Any, *, rngs: nnx.Rngs) -> None:
        kw = {"dtype": dtype, "param_dtype": dtype, "rngs": rngs}
        self.ln1 = nnx.LayerNorm(d_model, **kw)
        self.attn = NNXAttention(d_model, num_heads, dtype, rngs=rngs)
        self.ln2 = nnx.LayerNorm(d_model, **kw)
        self.fc = nnx.Linear(d_model, 4 * d_model, **kw)
        self.proj = nnx.Linear(4 * d_model, d_model, **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(self.ln1(x))
        return x + self.proj(nnx.gelu(self.fc(self.ln2(x))))


class NNXGPT(nnx.Module):
    """Token + learned positional embeddings, unrolled blocks, final LN, tied LM head."""

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
        self.blocks = nnx.List(
            [NNXBlock(d_model, num_heads, dtype, rngs=rngs) for _ in range(num_layers)]
        )
        self.ln_f = nnx.LayerNorm(d_model, **kw)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = self.wte(tokens) + self.wpe[None, : tokens.shape[1]]
        for block in self.blocks:  # unrolled: one set of equations per layer
            x = block(x)
        return self.wte.attend(self.ln_f(x))


def lm_loss(model: nnx.Module, batch: Batch) -> jax.Array:
    """Next-token cross-entropy over the full sequence (last position's logits dropped)."""
    tokens = batch["tokens"]
    return cross_entropy(model(tokens)[:, :-1], tokens[:, 1:])


_NNX_GPT_SMALL = {
    "batch": 16,
    "seq_len": 16,
    "vocab_size": 120,
    "padded_vocab_size": 128,
    "num_layers": 2,
    "d_model": 64,
    "num_heads": 4,
    "lr": 1e-3,
    "weight_decay": 0.1,
}
_NNX_GPT_FULL = {
    "batch": 8,
    "seq_len": 1024,
    "vocab_size": 50257,
    "padded_vocab_size": 50304,
    "num_layers": 12,
    "d_model": 768,
    "num_heads": 12,
    "lr": 6e-4,
    "weight_decay": 0.1,
}


@register("nnx_gpt")
def nnx_gpt(batch: int | None, small: bool, dtype: Any) -> Example:
    """NNX GPT-2 124M decoder trained with plain optax AdamW on random tokens; batch 8x1024."""
    cfg = pick(small, _NNX_GPT_SMALL, _NNX_GPT_FULL, batch)
    cfg["dtype"] = jnp.dtype(dtype).name
    spec = token_batch_spec(cfg["batch"], cfg["seq_len"])
    tx = optax.adamw(cfg["lr"], b1=0.9, b2=0.95, weight_decay=cfg["weight_decay"])
    return nnx_example(
        "nnx_gpt",
        lambda rngs: NNXGPT(
            cfg["padded_vocab_size"],
            cfg["seq_len"],
            cfg["num_layers"],
            cfg["d_model"],
            cfg["num_heads"],
            dtype,
            rngs=rngs,
        ),
        tx,
        spec,
        cfg,
        lm_loss,
    )
