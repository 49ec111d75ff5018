"""Linen Llama-3-style decoders (next-token prediction), mixed precision, optional remat.

* ``llama3_8b``: Llama 3 8B (Meta, 2024): 32 layers, d=4096, 32 heads, 8 KV heads (head_dim
  128), SwiGLU FFN 14336, vocabulary 128256, 8,030,261,248 parameters;
* ``llama3_70b``: Llama 3 70B: 80 layers, d=8192, 64 heads, 8 KV heads, FFN 28672, the same
  vocabulary, 70,553,706,496 parameters;
* ``gemma_7b``: Gemma-7B-size (Gemma Team, 2024): 28 layers, d=3072, 16 heads of head_dim 256
  (multi-head: 16 K/V heads; heads x head_dim = 4096 > d), GeGLU FFN 24576, vocabulary 256000,
  embeddings tied with the LM head and scaled by sqrt(d), RoPE theta 10000, 8,537,680,896
  parameters. Shapes are Gemma's; its RMSNorm's (1 + scale) and soft-capping-free details do
  not change a plan and are not reproduced;
* ``mixtral_8x7b``: Mixtral 8x7B (Mistral AI, 2024): Mistral 7B's attention (32 layers,
  d=4096, 32 heads, 8 KV heads, RoPE theta 1e6, vocabulary 32000) with each MLP a dropless
  mixture of 8 SwiGLU experts of width 14336, the top 2 per token (`MixtureOfExperts`: grouped
  matmuls over the tokens sorted by expert, ``jax.lax.ragged_dot``), 46,702,792,704
  parameters; its small config has 4 experts;
* ``llama_small``: a 2-layer test decoder of the same structure (the same config for
  ``small=True`` and ``small=False``).

A block is ``x + attn(rms_norm(x))``, then ``x + swiglu(rms_norm(x))``: grouped-query attention
(``num_kv_heads`` K/V heads, each shared by ``num_heads / num_kv_heads`` query heads; K and V
are repeated up to ``num_heads``) with rotary position embeddings (RoPE, theta 500000, the
"rotate half" pairing of dimension ``i`` with ``i + head_dim / 2``) and a causal mask, and a
SwiGLU MLP ``down(silu(gate(x)) * up(x))``.  No biases anywhere; a final RMSNorm and an untied
LM head.  Attention is written out with ``jnp.einsum`` and a softmax (no fused attention), and
the blocks are an unrolled Python loop (no ``nn.scan``), as in ``models/transformer.py``, unless
``cfg["scan_layers"]`` (below).

Mixed precision: parameters (the master weights AdamW updates) are float32 and the layers
compute in the compute ``dtype`` (bfloat16 by default for the full-size configs when built with
``llama_example``); RMSNorm, the RoPE rotation and the softmax compute in float32 and cast back;
logits and the loss are float32.  With ``dtype=float64`` parameters are float64 too and nothing
is computed in a narrower type (the loss itself is float32, as for every zoo model).

``cfg["remat"] = True`` wraps every block in ``nn.remat``: activations inside a block are
recomputed in the backward pass instead of stored.  The registered names use ``remat=False``;
build the remat variant with ``llama_example(name, llama_config(name, remat=True))``.
``cfg["remat_policy"]`` picks what remat keeps, by MaxText's names (`REMAT_POLICIES`):
``"full"`` (nothing, the default), ``"minimal"`` (the results of matmuls without batch dims:
the projections, not attention's scores), ``"minimal_offloaded"`` (those results offloaded to
the host's pinned memory and brought back for the backward pass), ``"save_qkv_proj"`` (the
query, key and value projections, by their checkpoint names) or ``"qkv_proj_offloaded"``
(those offloaded). The projections carry MaxText's checkpoint names (``query_proj``,
``key_proj``, ``value_proj``, ``out_proj``, ``mlpwi_0``, ``mlpwi_1``, ``mlpwo``).

``cfg["scan_layers"] = True`` (``llama_config(name, scan_layers=True)``) stacks the blocks with
``nn.scan`` (``jaxpar_zoo.scanned.scan_blocks``): one ``params["blocks"]`` subtree whose parameters
have a leading layer axis, the same parameters as the unrolled ``block0`` ... stacked
(``jaxpar_zoo.scanned.stack_layers``).  With ``remat`` too, the block is rematerialized inside the
scan (``nn.scan(nn.remat(LlamaBlock))``, as MaxText does).

Full-size batches are 8 sequences of 4096 tokens; ``llama_config(..., batch=, seq_len=)``
overrides both (e.g. 256 x 4096 for benchmarks).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.ad_checkpoint import checkpoint_name

from ._train import (
    Example,
    build_example,
    linen_init_state,
    linen_lm_step,
    register,
    token_batch_spec,
)
from .scanned import scan_blocks


def param_dtype_for(dtype: Any) -> jnp.dtype:
    """Master-weight dtype for a compute dtype: float64 for float64, else float32."""
    return jnp.dtype(jnp.float64 if jnp.dtype(dtype) == jnp.float64 else jnp.float32)


def _accumulation_dtype(dtype: Any) -> jnp.dtype:
    """At least float32: the type of norms, RoPE and softmax for a compute dtype."""
    return jnp.promote_types(jnp.float32, dtype)


class RMSNorm(nn.Module):
    """``x / rms(x) * scale``, computed in (at least) float32 and cast to ``dtype``."""

    eps: float = 1e-5
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), self.param_dtype)
        acc = _accumulation_dtype(x.dtype)
        x = x.astype(acc)
        x = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + self.eps)
        return (x * scale.astype(acc)).astype(self.dtype)


@functools.lru_cache(maxsize=16)
def rope_tables(
    length: int, head_dim: int, theta: float, dtype: Any = np.float64
) -> tuple[np.ndarray, np.ndarray]:
    """``(cos, sin)`` of shape ``[1, length, 1, head_dim]`` for the rotate-half RoPE pairing.

    Dimension ``i`` and ``i + head_dim / 2`` rotate together by ``pos * theta**(-2i/head_dim)``.
    Computed in NumPy float64 at trace time and cast to ``dtype``, so the program holds them as
    constants. Cached per dtype: every layer of every trace asks for the same tables, and
    casting them anew per layer took a seventh of an unrolled llama3_70b trace (treat them as
    read-only).
    """
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.arange(length, dtype=np.float64)[:, None] * inv_freq[None, :]
    angles = np.concatenate([angles, angles], axis=-1)[None, :, None, :]
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


def apply_rope(x: jax.Array, theta: float) -> jax.Array:
    """Rotary position embedding of ``x: [batch, length, heads, head_dim]`` (float32 math)."""
    _, length, _, head_dim = x.shape
    acc = _accumulation_dtype(x.dtype)
    # a view per layer: constants of its own, as when each layer computes them (one constant
    # shared by every layer changes where the budget's search lands on llama3_70b over 1,024
    # H100s: 3.16 s instead of 2.62 s per step; bench/scale/README.md, issue 10).
    # JAX tells constants
    # apart by object, so a view does it without copying (copies took a fifth of the trace).
    cos, sin = (t.view() for t in rope_tables(length, head_dim, theta, np.dtype(acc)))
    xf = x.astype(acc)
    half = head_dim // 2
    rotated = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
    return (xf * cos + rotated * sin).astype(x.dtype)


class Attention(nn.Module):
    """Causal grouped-query self-attention with RoPE; no biases. ``head_dim`` None: d / heads."""

    num_heads: int
    num_kv_heads: int
    rope_theta: float = 500_000.0
    head_dim: int | None = None
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        batch, length, d_model = x.shape
        head_dim = self.head_dim or d_model // self.num_heads
        group = self.num_heads // self.num_kv_heads
        kw = {"use_bias": False, "dtype": self.dtype, "param_dtype": self.param_dtype}
        # MaxText's checkpoint names, which its remat policies save or offload
        q = checkpoint_name(nn.Dense(self.num_heads * head_dim, name="q", **kw)(x), "query_proj")
        k = checkpoint_name(nn.Dense(self.num_kv_heads * head_dim, name="k", **kw)(x), "key_proj")
        v = checkpoint_name(nn.Dense(self.num_kv_heads * head_dim, name="v", **kw)(x), "value_proj")
        q = apply_rope(q.reshape(batch, length, self.num_heads, head_dim), self.rope_theta)
        k = apply_rope(k.reshape(batch, length, self.num_kv_heads, head_dim), self.rope_theta)
        v = v.reshape(batch, length, self.num_kv_heads, head_dim)
        # grouped-query attention: query head h reads K/V head h // group
        k = jnp.repeat(k, group, axis=2)
        v = jnp.repeat(v, group, axis=2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)
        # softmax in (at least) float32
        acc = _accumulation_dtype(self.dtype)
        scores = scores.astype(acc)
        causal = jnp.tril(jnp.ones((length, length), dtype=bool))
        scores = jnp.where(causal, scores, jnp.finfo(acc).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(self.dtype)
        out = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
        out = out.reshape(batch, length, self.num_heads * head_dim)
        return checkpoint_name(nn.Dense(d_model, name="o", **kw)(out), "out_proj")


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))`` with hidden width ``ffn_dim``; no biases. With
    ``activation="gelu"`` it is GeGLU (tanh-approximate GELU, as Gemma)."""

    ffn_dim: int
    activation: str = "silu"
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kw = {"use_bias": False, "dtype": self.dtype, "param_dtype": self.param_dtype}
        gate = checkpoint_name(nn.Dense(self.ffn_dim, name="gate", **kw)(x), "mlpwi_0")
        up = checkpoint_name(nn.Dense(self.ffn_dim, name="up", **kw)(x), "mlpwi_1")
        act = nn.gelu if self.activation == "gelu" else nn.silu
        return checkpoint_name(nn.Dense(x.shape[-1], name="down", **kw)(act(gate) * up), "mlpwo")


class MixtureOfExperts(nn.Module):
    """A mixture of SwiGLU experts (Mixtral's sparse MoE block): a linear router picks each
    token's ``top_k`` experts, their logits softmaxed into gates, and the gated outputs of the
    chosen experts are summed per token. Two ways to run the experts, with the same
    parameters:

    - ``capacity_factor`` 0 (default): dropless. The token copies are sorted by expert and each
      expert's rows run through its SwiGLU as grouped matmuls (``jax.lax.ragged_dot``,
      ``bincount`` rows per expert). XLA's partitioner keeps the token and expert dims of a
      grouped matmul whole: every device holds every token there.
    - ``capacity_factor`` > 0: GShard's dispatch. Each sequence is a group; an expert takes at
      most ``C = ceil(length · top_k / experts · capacity_factor)`` of a group's token copies,
      first come in token order, and drops the rest (their share is zero: the residual carries
      the token). Dispatch and combine are einsums with one-hot ``[group, token, expert, C]``
      tensors, the experts batched matmuls over ``[expert, group, C, d]``: every dim may split,
      and the expert dim's split (expert parallelism) reaches its tokens by all-to-all.
    """

    num_experts: int
    top_k: int
    ffn_dim: int
    activation: str = "silu"
    capacity_factor: float = 0.0
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        e, k = self.num_experts, self.top_k
        router = nn.Dense(e, use_bias=False, name="router", dtype=self.dtype,
                          param_dtype=self.param_dtype)  # fmt: skip
        logits, experts = jax.lax.top_k(router(x).astype(_accumulation_dtype(x.dtype)), k)
        gates = jax.nn.softmax(logits, axis=-1).astype(self.dtype)  # [..., k]
        init = nn.initializers.lecun_normal(in_axis=1, out_axis=2)

        def weight(name: str, fan_in: int, fan_out: int) -> jax.Array:
            w = self.param(name, init, (e, fan_in, fan_out), self.param_dtype)
            return w.astype(self.dtype)

        d, f = x.shape[-1], self.ffn_dim
        weights = (weight("gate", d, f), weight("up", d, f), weight("down", f, d))
        act = nn.gelu if self.activation == "gelu" else nn.silu
        if self.capacity_factor > 0:
            return self._dispatched(x, experts, gates, weights, act)
        tokens = x.reshape(-1, d)
        chosen = experts.reshape(-1)  # [tokens * k]: copy i is token i // k
        order = jnp.argsort(chosen)
        sizes = jnp.bincount(chosen, length=e).astype(jnp.int32)
        rows = tokens[order // k]
        w_gate, w_up, w_down = weights
        gate = jax.lax.ragged_dot(rows, w_gate, sizes)
        up = jax.lax.ragged_dot(rows, w_up, sizes)
        out = jax.lax.ragged_dot(act(gate) * up, w_down, sizes)
        out = out * gates.reshape(-1)[order][:, None]
        return jnp.zeros_like(tokens).at[order // k].add(out).reshape(x.shape)

    def _dispatched(self, x, experts, gates, weights, act) -> jax.Array:
        """GShard's capacity dispatch of ``x: [groups, length, d]`` (see the class docstring)."""
        groups, length, _ = x.shape
        e, k = self.num_experts, self.top_k
        capacity = max(1, math.ceil(length * k / e * self.capacity_factor))
        chosen = jax.nn.one_hot(experts, e, dtype=jnp.int32)  # [g, s, k, e]
        # each copy's slot in its expert: copies counted in token order, then by rank
        slot = jnp.cumsum(chosen.reshape(groups, length * k, e), axis=1).reshape(chosen.shape) - 1
        kept = (chosen > 0) & (slot < capacity)
        # a dropped copy's slot is `capacity`, whose one-hot row is all zeros
        slots = jax.nn.one_hot(jnp.where(kept, slot, capacity), capacity, dtype=self.dtype)
        dispatch = slots.sum(2)  # [g, s, e, c]
        combine = (slots * gates[..., None, None]).sum(2)
        w_gate, w_up, w_down = weights
        rows = jnp.einsum("gsec,gsd->egcd", dispatch, x)
        hidden = act(jnp.einsum("egcd,edf->egcf", rows, w_gate))
        hidden = hidden * jnp.einsum("egcd,edf->egcf", rows, w_up)
        out = jnp.einsum("egcf,efd->egcd", hidden, w_down)
        return jnp.einsum("gsec,egcd->gsd", combine, out)


class LlamaBlock(nn.Module):
    """Pre-RMSNorm block: ``x + attn(norm(x))``, then ``x + swiglu(norm(x))`` (or a mixture of
    SwiGLU experts when ``num_experts``)."""

    num_heads: int
    num_kv_heads: int
    ffn_dim: int
    norm_eps: float = 1e-5
    rope_theta: float = 500_000.0
    head_dim: int | None = None
    activation: str = "silu"
    num_experts: int = 0
    experts_per_token: int = 2
    capacity_factor: float = 0.0
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kw = {"dtype": self.dtype, "param_dtype": self.param_dtype}
        h = RMSNorm(self.norm_eps, name="attn_norm", **kw)(x)
        attn = Attention(
            self.num_heads, self.num_kv_heads, self.rope_theta, self.head_dim, name="attn", **kw
        )
        x = x + attn(h)
        h = RMSNorm(self.norm_eps, name="mlp_norm", **kw)(x)
        if self.num_experts:
            moe = MixtureOfExperts(
                self.num_experts, self.experts_per_token, self.ffn_dim, self.activation,
                self.capacity_factor, name="moe", **kw,
            )  # fmt: skip
            return x + moe(h)
        return x + SwiGLU(self.ffn_dim, self.activation, name="mlp", **kw)(h)


class Llama(nn.Module):
    """Token embedding, ``num_layers`` blocks, final RMSNorm, LM head (f32 logits): untied, or
    the embedding's transpose with ``tie_embeddings`` (Gemma, which also scales the embedded
    tokens by sqrt(d): ``embed_scale``)."""

    vocab_size: int
    num_layers: int
    d_model: int
    num_heads: int
    num_kv_heads: int
    ffn_dim: int
    norm_eps: float = 1e-5
    rope_theta: float = 500_000.0
    remat: bool = False
    remat_policy: str = "full"  # a key of REMAT_POLICIES
    scan_layers: bool = False
    head_dim: int | None = None
    activation: str = "silu"
    tie_embeddings: bool = False
    embed_scale: bool = False
    num_experts: int = 0  # > 0: each block's MLP is a mixture of this many SwiGLU experts
    experts_per_token: int = 2
    capacity_factor: float = 0.0  # > 0: GShard's capacity dispatch (MixtureOfExperts)
    dtype: Any = jnp.bfloat16
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        kw = {"dtype": self.dtype, "param_dtype": self.param_dtype}
        embed = nn.Embed(self.vocab_size, self.d_model, name="embed", **kw)
        x = embed(tokens)
        if self.embed_scale:
            x = x * jnp.asarray(math.sqrt(self.d_model), x.dtype)
        block_args = (
            self.num_heads,
            self.num_kv_heads,
            self.ffn_dim,
            self.norm_eps,
            self.rope_theta,
            self.head_dim,
            self.activation,
            self.num_experts,
            self.experts_per_token,
            self.capacity_factor,
        )
        if self.scan_layers:
            # no barrier: the scan already keeps XLA from merging the recomputation into the
            # forward pass (JAX's advice for remat inside scan; MaxText's setting)
            policy = REMAT_POLICIES[self.remat_policy]()
            block = (
                nn.remat(LlamaBlock, prevent_cse=False, policy=policy) if self.remat else LlamaBlock
            )
            x = scan_blocks(block(*block_args, name="blocks", **kw), x, self.num_layers)
        else:
            policy = REMAT_POLICIES[self.remat_policy]()
            block = nn.remat(LlamaBlock, policy=policy) if self.remat else LlamaBlock
            for i in range(self.num_layers):
                x = block(*block_args, name=f"block{i}", **kw)(x)
        x = RMSNorm(self.norm_eps, name="norm_f", **kw)(x)
        if self.tie_embeddings:
            logits = embed.attend(x)
        else:
            logits = nn.Dense(self.vocab_size, use_bias=False, name="lm_head", **kw)(x)
        return logits.astype(_accumulation_dtype(self.dtype))


_QKV = ("query_proj", "key_proj", "value_proj")  # the projections' checkpoint names
# What `nn.remat` keeps of a block, by MaxText's ``remat_policy`` names (None: nothing saved)
REMAT_POLICIES = {
    "full": lambda: None,
    "minimal": lambda: jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
    "minimal_offloaded": lambda: jax.checkpoint_policies.offload_dot_with_no_batch_dims(
        "device", "pinned_host"
    ),
    "save_qkv_proj": lambda: jax.checkpoint_policies.save_only_these_names(*_QKV),
    "qkv_proj_offloaded": lambda: jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[],
        names_which_can_be_offloaded=list(_QKV),
        offload_src="device",
        offload_dst="pinned_host",
    ),
}


def _config(
    layers: int, d_model: int, heads: int, kv_heads: int, ffn: int, vocab: int, **rest: Any
) -> dict[str, Any]:
    return {
        "batch": 8,
        "seq_len": 4096,
        "vocab_size": vocab,
        "num_layers": layers,
        "d_model": d_model,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "ffn_dim": ffn,
        "norm_eps": 1e-5,
        "rope_theta": 500_000.0,
        "remat": False,
        "scan_layers": False,
        "dtype": "bfloat16",  # default compute dtype of llama_example
        "lr": 3e-4,
        "weight_decay": 0.1,
        **rest,
    }


# Published shapes.
_LLAMA3_8B = _config(32, 4096, 32, 8, 14336, 128256)
_LLAMA3_70B = _config(80, 8192, 64, 8, 28672, 128256)
_GEMMA = {"head_dim": 256, "activation": "gelu", "tie_embeddings": True, "embed_scale": True}
_GEMMA_7B = _config(28, 3072, 16, 16, 24576, 256000, rope_theta=10_000.0, norm_eps=1e-6, **_GEMMA)
# Mixtral 8x7B: Mistral-7B's attention, each MLP 8 SwiGLU experts of 14336, top-2 routing
_MIXTRAL = {"num_experts": 8, "experts_per_token": 2, "rope_theta": 1_000_000.0}
_MIXTRAL_8X7B = _config(32, 4096, 32, 8, 14336, 32000, **_MIXTRAL)
# Tiny configs of the same structure: every shardable dimension (batch, d_model, heads, KV
# heads, FFN, vocabulary) divisible by 8; head_dim 8; the full-size GQA group sizes (4 and 8).
_SMALL = {"batch": 16, "seq_len": 16, "dtype": "float32", "lr": 1e-3}
_LLAMA_SMALL = _config(2, 128, 16, 8, 256, 256, **_SMALL)
_LLAMA3_8B_SMALL = _config(2, 256, 32, 8, 512, 256, **_SMALL)
_LLAMA3_70B_SMALL = _config(2, 512, 64, 8, 1024, 256, **_SMALL)
# Gemma's shape at test size: heads x head_dim (8 x 32 = 256) wider than d (128), MHA, tied
_GEMMA_7B_SMALL = _config(
    2, 128, 8, 8, 256, 256, rope_theta=10_000.0, norm_eps=1e-6, **{**_GEMMA, "head_dim": 32},
    **_SMALL,
)  # fmt: skip

_MIXTRAL_8X7B_SMALL = _config(2, 128, 16, 8, 256, 256, **{**_MIXTRAL, "num_experts": 4}, **_SMALL)

CONFIGS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # name: (small, full)
    "llama3_8b": (_LLAMA3_8B_SMALL, _LLAMA3_8B),
    "llama3_70b": (_LLAMA3_70B_SMALL, _LLAMA3_70B),
    "gemma_7b": (_GEMMA_7B_SMALL, _GEMMA_7B),
    "mixtral_8x7b": (_MIXTRAL_8X7B_SMALL, _MIXTRAL_8X7B),
    "llama_small": (_LLAMA_SMALL, _LLAMA_SMALL),
}


def llama_config(
    name: str,
    small: bool = False,
    remat: bool = False,
    batch: int | None = None,
    seq_len: int | None = None,
    scan_layers: bool = False,
    capacity_factor: float | None = None,
    remat_policy: str | None = None,
) -> dict[str, Any]:
    """A fresh copy of the config of ``name`` (a key of ``CONFIGS``), with overrides
    (``capacity_factor``: a mixture of experts' dispatch, see `MixtureOfExperts`;
    ``remat_policy``: a key of `REMAT_POLICIES`, which turns ``remat`` on)."""
    if name not in CONFIGS:
        raise KeyError(f"unknown Llama config {name!r}; known: {', '.join(CONFIGS)}")
    cfg = dict(CONFIGS[name][0 if small else 1])
    cfg["remat"] = bool(remat) or remat_policy is not None
    if remat_policy is not None:
        if remat_policy not in REMAT_POLICIES:
            raise ValueError(
                f"unknown remat_policy {remat_policy!r}; known: {', '.join(REMAT_POLICIES)}"
            )
        cfg["remat_policy"] = remat_policy
    cfg["scan_layers"] = bool(scan_layers)
    if batch is not None:
        cfg["batch"] = int(batch)
    if seq_len is not None:
        cfg["seq_len"] = int(seq_len)
    if capacity_factor is not None:
        if not cfg.get("num_experts"):
            raise ValueError(f"{name} has no mixture of experts: capacity_factor applies to none")
        cfg["capacity_factor"] = float(capacity_factor)
    return cfg


def llama_example(name: str, cfg: dict[str, Any], dtype: Any = None) -> Example:
    """A Llama decoder + AdamW train step from a config dict (keys as in ``llama_config``).

    ``dtype`` is the compute dtype (``None``: ``cfg["dtype"]``, bfloat16 for the full-size
    configs); parameters are float32 (float64 when ``dtype`` is float64).
    """
    cfg = dict(cfg)
    dtype = jnp.dtype(cfg.get("dtype", "bfloat16") if dtype is None else dtype)
    if cfg["num_heads"] % cfg["num_kv_heads"] or (
        cfg.get("head_dim") is None and cfg["d_model"] % cfg["num_heads"]
    ):
        raise ValueError(f"{name}: need num_kv_heads | num_heads | d_model, got {cfg}")
    model = Llama(
        vocab_size=cfg["vocab_size"],
        num_layers=cfg["num_layers"],
        d_model=cfg["d_model"],
        num_heads=cfg["num_heads"],
        num_kv_heads=cfg["num_kv_heads"],
        ffn_dim=cfg["ffn_dim"],
        norm_eps=cfg["norm_eps"],
        rope_theta=cfg["rope_theta"],
        remat=bool(cfg.get("remat", False)),
        remat_policy=cfg.get("remat_policy", "full"),
        scan_layers=bool(cfg.get("scan_layers", False)),
        head_dim=cfg.get("head_dim"),
        activation=cfg.get("activation", "silu"),
        tie_embeddings=bool(cfg.get("tie_embeddings", False)),
        embed_scale=bool(cfg.get("embed_scale", False)),
        num_experts=int(cfg.get("num_experts", 0)),
        experts_per_token=int(cfg.get("experts_per_token", 2)),
        capacity_factor=float(cfg.get("capacity_factor", 0.0)),
        dtype=dtype,
        param_dtype=param_dtype_for(dtype),
    )
    tx = optax.adamw(cfg["lr"], b1=0.9, b2=0.95, weight_decay=cfg["weight_decay"])
    spec = token_batch_spec(cfg["batch"], cfg["seq_len"])
    cfg["dtype"] = dtype.name
    cfg["param_dtype"] = param_dtype_for(dtype).name
    init = linen_init_state(model, tx, spec["tokens"])
    return build_example(name, model, linen_lm_step, init, spec, cfg)


@register("llama3_8b")
def llama3_8b(batch: int | None, small: bool, dtype: Any) -> Example:
    """Llama 3 8B (32 x d4096, 32/8 heads, SwiGLU 14336), AdamW; batch 8x4096."""
    return llama_example("llama3_8b", llama_config("llama3_8b", small, batch=batch), dtype)


@register("llama3_70b")
def llama3_70b(batch: int | None, small: bool, dtype: Any) -> Example:
    """Llama 3 70B (80 x d8192, 64/8 heads, SwiGLU 28672), AdamW; batch 8x4096."""
    return llama_example("llama3_70b", llama_config("llama3_70b", small, batch=batch), dtype)


@register("gemma_7b")
def gemma_7b(batch: int | None, small: bool, dtype: Any) -> Example:
    """Gemma-7B-size (28 x d3072, 16 heads of 256, GeGLU 24576, tied 256k vocab), AdamW."""
    return llama_example("gemma_7b", llama_config("gemma_7b", small, batch=batch), dtype)


@register("llama_small")
def llama_small(batch: int | None, small: bool, dtype: Any) -> Example:
    """2-layer Llama test decoder (d128, 16/8 heads, SwiGLU 256, vocab 256), AdamW; 16x16."""
    return llama_example("llama_small", llama_config("llama_small", small, batch=batch), dtype)


@register("mixtral_8x7b")
def mixtral_8x7b(batch: int | None, small: bool, dtype: Any) -> Example:
    """Mixtral 8x7B (32 x d4096, 32/8 heads, 8 SwiGLU experts of 14336, top-2), AdamW."""
    cfg = llama_config("mixtral_8x7b", small, batch=batch)
    return llama_example("mixtral_8x7b", cfg, dtype)
