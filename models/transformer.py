"""Linen transformers: GPT-style decoders (next-token prediction) and the Vision Transformer.

* ``gpt_small``: a 2-layer decoder when small, GPT-2 124M when full (kept as a test model);
* ``gpt2_124m``: GPT-2 small (Radford et al., 2019): 12 layers, d=768, 12 heads, context 1024;
* ``gpt2_1b3``: the 1.3B GPT of Brown et al. (2020, "GPT-3 XL"): 24 layers, d=2048, 16 heads,
  the same vocabulary and context;
* ``vit_b16``: ViT-B/16 (Dosovitskiy et al., 2021): 16x16 patches of a 224x224x3 image embedded
  by a stride-16 convolution, a class token, learned positions, 12 layers, d=768, 12 heads,
  MLP 3072, classification from the final class token (1000 classes).

The GPT-2 vocabulary has 50257 tokens; as in nanoGPT the embedding table is padded to 50304 (a
multiple of 64, so the vocabulary dimension divides evenly over 2/4/8/16/32/64 devices), while
the random token batches only draw ids below 50257 (``config["vocab_size"]``; the table size is
``config["padded_vocab_size"]``).  Embeddings are tied (the LM head is the token table).  Full
GPT batches are 8 sequences of 1024 tokens.

All blocks are pre-LayerNorm and unrolled Python loops (no ``nn.scan``: the planner treats a
scan as one replicated node).  Attention is written out with ``jnp.einsum`` (no fused attention
helpers) so that the traced program consists of plain dot_general / softmax primitives the
planner can reason about.  The QKV projection has no bias (see ``SelfAttention``), which takes
2,304 parameters per layer off the published counts (GPT-2: 124.4M; ViT-B/16: 86.5M instead of
86.6M); dropout is omitted (the train steps carry no dropout RNG).
"""

from __future__ import annotations

import math
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
    linen_lm_step,
    pick,
    register,
    token_batch_spec,
)


class SelfAttention(nn.Module):
    """Multi-head self-attention with a fused QKV projection; causal unless ``causal=False``."""

    num_heads: int
    dtype: Any = jnp.float32
    causal: bool = True

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
        # Softmax in f32 for stability when the model runs in bf16.
        scores = scores.astype(jnp.float32)
        if self.causal:
            causal = jnp.tril(jnp.ones((length, length), dtype=bool))
            scores = jnp.where(causal, scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(self.dtype)
        out = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, length, d_model)
        return nn.Dense(d_model, name="out", **kw)(out)


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)); x + mlp(ln(x)) with a 4x GELU MLP."""

    num_heads: int
    dtype: Any = jnp.float32
    causal: bool = True

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        d_model = x.shape[-1]
        kw = {"dtype": self.dtype, "param_dtype": self.dtype}
        x = x + SelfAttention(self.num_heads, self.dtype, self.causal, name="attn")(
            nn.LayerNorm(name="ln1", **kw)(x)
        )
        h = nn.Dense(4 * d_model, name="fc", **kw)(nn.LayerNorm(name="ln2", **kw)(x))
        h = nn.Dense(d_model, name="proj", **kw)(nn.gelu(h))
        return x + h


# Backwards-compatible name.
CausalSelfAttention = SelfAttention


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
    """A GPT decoder + AdamW train step from a config dict (keys as in ``_GPT_SMALL``).

    An optional ``padded_vocab_size`` sizes the embedding table; token batches draw ids below
    ``vocab_size``.
    """
    cfg = dict(cfg)
    model = GPT(
        vocab_size=cfg.get("padded_vocab_size", cfg["vocab_size"]),
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


def gpt2_config(num_layers: int, d_model: int, num_heads: int, lr: float) -> dict[str, Any]:
    return {
        "batch": 8,
        "seq_len": 1024,
        "vocab_size": 50257,
        "padded_vocab_size": 50304,
        "num_layers": num_layers,
        "d_model": d_model,
        "num_heads": num_heads,
        "tie_embeddings": True,
        "lr": lr,
        "weight_decay": 0.1,
    }


_GPT2_124M_FULL = gpt2_config(12, 768, 12, 6e-4)
_GPT2_1B3_FULL = gpt2_config(24, 2048, 16, 2e-4)
# Small versions: the same decoder (padded vocabulary included) at 2 layers.
_GPT2_124M_SMALL = {
    **_GPT_SMALL,
    "vocab_size": 120,
    "padded_vocab_size": 128,
    "num_heads": 4,
}
_GPT2_1B3_SMALL = {
    **_GPT_SMALL,
    "vocab_size": 120,
    "padded_vocab_size": 128,
    "num_heads": 8,
}


@register("gpt2_124m")
def gpt2_124m(batch: int | None, small: bool, dtype: Any) -> Example:
    """GPT-2 124M (12 x d768, 12 heads, context 1024, tied embeddings), AdamW; batch 8x1024."""
    return gpt_example("gpt2_124m", pick(small, _GPT2_124M_SMALL, _GPT2_124M_FULL, batch), dtype)


@register("gpt2_1b3")
def gpt2_1b3(batch: int | None, small: bool, dtype: Any) -> Example:
    """GPT 1.3B (24 x d2048, 16 heads, context 1024, tied embeddings), AdamW; batch 8x1024."""
    return gpt_example("gpt2_1b3", pick(small, _GPT2_1B3_SMALL, _GPT2_1B3_FULL, batch), dtype)


class ViT(nn.Module):
    """Vision Transformer: patch conv, class token, learned positions, encoder, class head."""

    patch: int
    num_layers: int
    d_model: int
    num_heads: int
    num_classes: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kw = {"dtype": self.dtype, "param_dtype": self.dtype}
        p = self.patch
        x = nn.Conv(self.d_model, (p, p), (p, p), padding="VALID", name="embedding", **kw)(x)
        batch, h, w, d = x.shape
        x = x.reshape(batch, h * w, d)
        cls = self.param("cls", nn.initializers.zeros, (1, 1, d), self.dtype)
        x = jnp.concatenate([jnp.broadcast_to(cls, (batch, 1, d)), x], axis=1)
        pos = self.param(
            "pos_embedding", nn.initializers.normal(0.02), (1, h * w + 1, d), self.dtype
        )
        x = x + pos
        for i in range(self.num_layers):
            x = Block(self.num_heads, self.dtype, causal=False, name=f"block{i}")(x)
        x = nn.LayerNorm(name="ln_f", **kw)(x)
        return nn.Dense(self.num_classes, name="head", **kw)(x[:, 0])


_VIT_FULL = {
    "batch": 64,
    "image": (224, 224, 3),
    "patch": 16,
    "num_layers": 12,
    "d_model": 768,
    "num_heads": 12,
    "num_classes": 1000,
    "lr": 1e-3,
    "weight_decay": 0.1,
}
# 16x16 image in 4x4 patches: 16 patches + the class token.
_VIT_SMALL = {
    "batch": 16,
    "image": (16, 16, 3),
    "patch": 4,
    "num_layers": 2,
    "d_model": 32,
    "num_heads": 4,
    "num_classes": 10,
    "lr": 1e-3,
    "weight_decay": 0.1,
}


@register("vit_b16")
def vit_b16(batch: int | None, small: bool, dtype: Any) -> Example:
    """ViT-B/16 (224x224x3, 12 x d768, 12 heads, MLP 3072, 1000 classes), AdamW; batch 64."""
    cfg = pick(small, _VIT_SMALL, _VIT_FULL, batch)
    model = ViT(
        patch=cfg["patch"],
        num_layers=cfg["num_layers"],
        d_model=cfg["d_model"],
        num_heads=cfg["num_heads"],
        num_classes=cfg["num_classes"],
        dtype=dtype,
    )
    tx = optax.adamw(cfg["lr"], b1=0.9, b2=0.999, weight_decay=cfg["weight_decay"])
    spec = classification_batch_spec(cfg["batch"], tuple(cfg["image"]), dtype)
    cfg["dtype"] = jnp.dtype(dtype).name
    init = linen_init_state(model, tx, spec["x"])
    return build_example("vit_b16", model, linen_classifier_step, init, spec, cfg)
