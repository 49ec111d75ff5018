"""Linen GPT-style decoder-only transformer (``gpt_small``) trained on next-token prediction.

Attention is written out with ``jnp.einsum`` (no fused attention helpers) so that the traced
program consists of plain dot_general / softmax primitives the planner can reason about.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from models._train import (
    Example,
    build_example,
    linen_init_state,
    linen_lm_step,
    pick,
    register,
    token_batch_spec,
)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with a fused QKV projection."""

    num_heads: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        batch, length, d_model = x.shape
        head_dim = d_model // self.num_heads
        kw = {"dtype": self.dtype, "param_dtype": self.dtype}
        # no qkv bias: the key bias gets an exactly-zero gradient (softmax is shift-invariant),
        # which Adam turns into rounding-noise-sized sign flips (ill-posed to compare numerically)
        qkv = nn.Dense(3 * d_model, use_bias=False, name="qkv", **kw)(x)
        qkv = qkv.reshape(batch, length, 3, self.num_heads, head_dim)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)
        causal = jnp.tril(jnp.ones((length, length), dtype=bool))
        # Softmax in f32 for stability when the model runs in bf16.
        scores = jnp.where(causal, scores.astype(jnp.float32), jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(self.dtype)
        out = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, length, d_model)
        return nn.Dense(d_model, name="out", **kw)(out)


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)); x + mlp(ln(x)) with a 4x GELU MLP."""

    num_heads: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        d_model = x.shape[-1]
        kw = {"dtype": self.dtype, "param_dtype": self.dtype}
        x = x + CausalSelfAttention(self.num_heads, self.dtype, name="attn")(
            nn.LayerNorm(name="ln1", **kw)(x)
        )
        h = nn.Dense(4 * d_model, name="fc", **kw)(nn.LayerNorm(name="ln2", **kw)(x))
        h = nn.Dense(d_model, name="proj", **kw)(nn.gelu(h))
        return x + h


class GPT(nn.Module):
    """Token + learned positional embeddings, ``num_layers`` blocks, final LN, LM head."""

    vocab_size: int
    seq_len: int
    num_layers: int
    d_model: int
    num_heads: int
    tie_embeddings: bool = True
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        kw = {"dtype": self.dtype, "param_dtype": self.dtype}
        embed = nn.Embed(self.vocab_size, self.d_model, name="wte", **kw)
        pos = self.param(
            "wpe", nn.initializers.normal(0.02), (self.seq_len, self.d_model), self.dtype
        )
        x = embed(tokens) + pos[None, : tokens.shape[1]]
        for i in range(self.num_layers):
            x = Block(self.num_heads, self.dtype, name=f"block{i}")(x)
        x = nn.LayerNorm(name="ln_f", **kw)(x)
        if self.tie_embeddings:
            # GPT-2 style: the output projection reuses the token embedding matrix.
            return embed.attend(x)
        return nn.Dense(self.vocab_size, use_bias=False, name="lm_head", **kw)(x)


_GPT_SMALL = {
    "batch": 16,
    "seq_len": 16,
    "vocab_size": 128,
    "num_layers": 2,
    "d_model": 64,
    "num_heads": 4,
    "tie_embeddings": True,
    "lr": 1e-3,
    "weight_decay": 0.1,
}
# GPT-2 small (124M); vocabulary padded from 50257 to 50304 (a multiple of 64) as in nanoGPT,
# which also keeps the vocab dimension divisible by the device count.
_GPT_FULL = {
    "batch": 8,
    "seq_len": 1024,
    "vocab_size": 50304,
    "num_layers": 12,
    "d_model": 768,
    "num_heads": 12,
    "tie_embeddings": True,
    "lr": 6e-4,
    "weight_decay": 0.1,
}


def gpt_example(name: str, cfg: dict[str, Any], dtype: Any = jnp.float32) -> Example:
    """A GPT decoder + AdamW train step from a config dict (keys as in ``_GPT_SMALL``)."""
    cfg = dict(cfg)
    model = GPT(
        vocab_size=cfg["vocab_size"],
        seq_len=cfg["seq_len"],
        num_layers=cfg["num_layers"],
        d_model=cfg["d_model"],
        num_heads=cfg["num_heads"],
        tie_embeddings=cfg.get("tie_embeddings", True),
        dtype=dtype,
    )
    tx = optax.adamw(cfg["lr"], b1=0.9, b2=0.95, weight_decay=cfg["weight_decay"])
    spec = token_batch_spec(cfg["batch"], cfg["seq_len"])
    cfg["dtype"] = jnp.dtype(dtype).name
    init = linen_init_state(model, tx, spec["tokens"])
    return build_example(name, model, linen_lm_step, init, spec, cfg)


@register("gpt_small")
def gpt_small(batch: int | None, small: bool, dtype: Any) -> Example:
    """GPT decoder trained with AdamW on random tokens (next-token cross-entropy)."""
    return gpt_example("gpt_small", pick(small, _GPT_SMALL, _GPT_FULL, batch), dtype)
