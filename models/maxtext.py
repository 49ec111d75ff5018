"""A MaxText-style decoder: logical axes everywhere, its 12-axis mesh, its default rules.

Written from the structure of MaxText (google/maxtext, Apache-2.0; our own code: only its
configuration data, the mesh axes and the default ``logical_axis_rules`` of ``configs/base.yml``
at commit 336fb381d, is mirrored here as data):

* a Llama-style decoder layer: RMSNorm, grouped-query attention with RoPE, RMSNorm, SwiGLU MLP,
  residuals; every parameter made with ``nn.with_logical_partitioning`` under MaxText's logical
  names (``embed``, ``mlp``, ``q_heads``, ``kv_heads``, ``heads``, ``kv``, ``kv_head_dim``,
  ``vocab``, ``norm``), and the activations constrained with ``nn.with_logical_constraint``
  under its ``activation_*`` names at the points MaxText constrains them;
* the layers stacked by ``nn.scan`` over ``nn.remat(layer, policy)`` (MaxText's
  ``scan_layers``), the stacked parameters' layer dim named ``layers`` at ``param_scan_axis``
  1;
* the 12-axis mesh built from ``ici_*`` / ``dcn_*`` parallelism settings, one ``-1`` filling
  what the others leave (`mesh_shape`, `maxtext_mesh`); MaxText's default (fsdp over a
  slice's devices, data over slices) is FSDP;
* an AdamW train step whose state holds the boxed parameters and optimizer state (their
  logical names travel with them) and unboxes them with Flax's ``nn.meta.unbox``, as MaxText
  does: under a mesh and rules each leaf is constrained to its rule's layout.

The step applies the logical axis rules in force when it is traced, or its own
(``cfg.logical_axis_rules``, MaxText's defaults) restricted to the axes of the mesh in context
(`rules_for_axes`) when none are. Flax constrains nothing without a mesh in context: under
plain ``jax.jit`` call it inside ``jax.set_mesh(mesh)``; jaxpar traces under its planning mesh.

``maxtext_8b``: Llama 3 8B's dimensions (32 layers, d 4096, 32 query heads and 8 KV heads of
128, MLP 14336, vocabulary 128256), batch 8 x 4096, bfloat16 compute over float32 weights.
``maxtext_small``: 2 layers at d 128, 16/8 heads of 8, MLP 256, vocabulary 256, batch 16 x 16,
float32 (the same config for ``small=True`` and ``small=False``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import AxisType, Mesh

from ._train import Example, build_example, cross_entropy, register, token_batch_spec
from .llama import REMAT_POLICIES, apply_rope, param_dtype_for

# ---- MaxText's configuration data (configs/base.yml at 336fb381d) -------------------------

MESH_AXES = (
    "data", "stage", "fsdp", "fsdp_transpose", "sequence", "context", "context_autoregressive",
    "tensor", "tensor_transpose", "tensor_sequence", "expert", "autoregressive",
)  # fmt: skip
# the ici_* / dcn_* settings, in mesh-axis order ("pipeline" is the "stage" axis)
PARALLELISM = (
    "data", "pipeline", "fsdp", "fsdp_transpose", "sequence", "context",
    "context_autoregressive", "tensor", "tensor_transpose", "tensor_sequence", "expert",
    "autoregressive",
)  # fmt: skip
ICI_DEFAULTS = {name: 1 for name in PARALLELISM} | {"fsdp": -1}
DCN_DEFAULTS = {name: 1 for name in PARALLELISM} | {"data": -1}

_T = ("tensor", "tensor_transpose")
_BATCH = ("data", "fsdp", "fsdp_transpose", "expert")
# (logical name, mesh axes), in order: the first rule whose axes the tensor's other dims leave
# free wins; a name may repeat (fallbacks). The default rules: FSDP.
LOGICAL_AXIS_RULES: tuple[tuple[str, Any], ...] = (
    ("activation_batch", _BATCH),
    ("activation_batch_no_exp", ("data", "fsdp", "fsdp_transpose")),
    ("activation_embed_and_logits_batch", ("data", "stage", "fsdp", "fsdp_transpose", "expert")),
    ("activation_heads", (*_T, "sequence", "tensor_sequence", "autoregressive")),
    ("activation_kv_heads", (*_T, "sequence", "tensor_sequence")),
    ("activation_length", ("sequence", "context")),
    ("activation_length", ("context",)),
    ("activation_norm_length", ("tensor_sequence", "context", "sequence")),
    ("activation_embed", _T),
    ("activation_mlp", (*_T, "tensor_sequence")),
    ("activation_kv", (*_T, "tensor_sequence")),
    ("activation_prefill_kv_batch", _BATCH),
    ("activation_kv_batch", _BATCH),
    ("activation_kv_head_dim", (*_T, "tensor_sequence")),
    ("activation_vocab", (*_T, "sequence", "tensor_sequence")),
    ("activation_vocab", _T),
    ("activation_vocab", "tensor_sequence"),
    ("activation_vocab", ("sequence",)),
    ("activation_stage", "stage"),
    ("activation_exp", ("expert",)),
    ("decode_batch", _BATCH),
    ("decode_length", ("sequence",)),
    ("mlp", ("fsdp_transpose", "tensor", "tensor_sequence", "autoregressive")),
    ("vocab", (*_T, "tensor_sequence", "autoregressive")),
    ("heads", (*_T, "tensor_sequence", "autoregressive")),
    ("q_heads", (*_T, "tensor_sequence", "autoregressive")),
    ("kv_heads", (*_T, "tensor_sequence", "autoregressive")),
    ("embed", ("fsdp", "fsdp_transpose", "context", "sequence", "tensor_transpose", "expert")),
    ("embed", ("fsdp", "context", "sequence", "tensor_transpose", "expert")),
    ("embed", ("fsdp", "fsdp_transpose", "context", "sequence", "expert")),
    ("embed", ("fsdp", "context", "sequence", "expert")),
    ("embed_no_exp", ("fsdp", "fsdp_transpose", "context", "sequence", "tensor_transpose")),
    ("embed_no_exp", ("fsdp", "context", "sequence", "tensor_transpose")),
    ("embed_no_exp", ("fsdp", "fsdp_transpose", "context", "sequence")),
    ("embed_no_exp", ("fsdp", "context", "sequence")),
    ("q_lora", ("fsdp", "fsdp_transpose", "sequence", "tensor_transpose", "expert")),
    ("q_lora", ("fsdp", "sequence", "tensor_transpose", "expert")),
    ("q_lora", ("fsdp", "fsdp_transpose", "sequence", "expert")),
    ("q_lora", ("fsdp", "sequence", "expert")),
    ("kv_lora", ("fsdp", "fsdp_transpose", "sequence", "tensor_transpose", "expert")),
    ("kv_lora", ("fsdp", "sequence", "tensor_transpose", "expert")),
    ("kv_lora", ("fsdp", "fsdp_transpose", "sequence", "expert")),
    ("kv_lora", ("fsdp", "sequence", "expert")),
    ("norm", (*_T, "tensor_sequence")),
    ("layers", "stage"),
    ("kv", ()),
    ("kv_head_dim", ()),
    ("cache_batch_prefill", ()),
    ("cache_batch", ()),
    ("cache_heads_none", ()),
    ("cache_heads", ("autoregressive", *_T, "tensor_sequence")),
    ("cache_heads", ("autoregressive", "tensor", "tensor_sequence")),
    ("cache_kv", ()),
    ("cache_sequence", ()),
    ("exp", "expert"),
    ("paged_kv_heads", ()),
    ("num_pages", ("tensor",)),
    ("tokens_per_page", ()),
    ("paged_kv_head_dim_size", ()),
)


# ---- the mesh --------------------------------------------------------------------------


def fill_parallelism(settings: dict[str, int], target: int, kind: str) -> tuple[int, ...]:
    """The per-axis degrees of ``settings`` (by `PARALLELISM` name, missing ones 1), in mesh
    order, with its one ``-1`` replaced by what makes the product ``target``. ValueError when
    a name is unknown, two are -1, or the product cannot be ``target``."""
    unknown = sorted(set(settings) - set(PARALLELISM))
    if unknown:
        raise ValueError(f"unknown {kind}_* parallelism {unknown}; the axes are {PARALLELISM}")
    degrees = [int(settings.get(name, 1)) for name in PARALLELISM]
    free = [i for i, d in enumerate(degrees) if d == -1]
    if len(free) > 1:
        raise ValueError(
            f"{kind} parallelism: {[PARALLELISM[i] for i in free]} are all -1; at most one "
            "axis may take what the others leave"
        )
    given = math.prod(d for d in degrees if d != -1)
    if free:
        if target % given:
            raise ValueError(
                f"{kind} parallelism: the other axes' product {given} does not divide {target}"
            )
        degrees[free[0]] = target // given
    if math.prod(degrees) != target:
        raise ValueError(
            f"{kind} parallelism {dict(zip(PARALLELISM, degrees, strict=True))} covers "
            f"{math.prod(degrees)} devices, not {target}: make one axis -1 or fix the degrees"
        )
    return tuple(degrees)


def mesh_shape(
    num_devices: int,
    ici: dict[str, int] | None = None,
    dcn: dict[str, int] | None = None,
    num_slices: int = 1,
) -> dict[str, int]:
    """The 12 named axes and their sizes (dcn degree x ici degree, `MESH_AXES` order) for
    ``num_devices`` over ``num_slices`` slices; ``ici``/``dcn`` default to MaxText's."""
    if num_devices % num_slices:
        raise ValueError(f"{num_devices} devices do not split into {num_slices} slices")
    ici_deg = fill_parallelism(
        ICI_DEFAULTS if ici is None else ici, num_devices // num_slices, "ici"
    )
    dcn_deg = fill_parallelism(DCN_DEFAULTS if dcn is None else dcn, num_slices, "dcn")
    return {name: d * i for name, d, i in zip(MESH_AXES, dcn_deg, ici_deg, strict=True)}


def maxtext_mesh(
    ici: dict[str, int] | None = None,
    dcn: dict[str, int] | None = None,
    devices: Sequence[Any] | None = None,
    num_slices: int = 1,
) -> Mesh:
    """A jax `Mesh` (Auto axes, as MaxText's ``Mesh(devices, mesh_axes)``) over ``devices``
    (default: all), slices outermost on every axis."""
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(len(devices), ici, dcn, num_slices)
    ici_deg = fill_parallelism(
        ICI_DEFAULTS if ici is None else ici, len(devices) // num_slices, "ici"
    )
    dcn_deg = tuple(s // i for s, i in zip(shape.values(), ici_deg, strict=True))
    grid = np.array(devices, dtype=object).reshape(dcn_deg + ici_deg)
    n = len(MESH_AXES)  # interleave: axis k is (dcn_k, ici_k), slices major
    grid = grid.transpose([j for k in range(n) for j in (k, n + k)]).reshape(tuple(shape.values()))
    return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * n)


def rules_for_axes(
    rules: Sequence[tuple[str, Any]], axes: Sequence[str]
) -> tuple[tuple[str, Any], ...]:
    """``rules`` naming only mesh axes in ``axes`` (a mesh with fewer than MaxText's 12): each
    rule keeps the axes the mesh has, in order (none left: replicated)."""
    out = []
    for name, value in rules:
        listed = () if value is None else (value,) if isinstance(value, str) else tuple(value)
        kept = tuple(a for a in listed if a in axes)
        out.append((name, kept if kept else None))
    return tuple(out)


# ---- the model -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MaxTextConfig:
    """The hyper-parameters of `MaxTextDecoder` (MaxText's names where it has them)."""

    vocab_size: int = 128_256
    emb_dim: int = 4096
    num_query_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    mlp_dim: int = 14_336
    num_decoder_layers: int = 32
    normalization_layer_epsilon: float = 1e-5
    rope_max_timescale: float = 500_000.0
    scan_layers: bool = True
    remat_policy: str = "full"  # a key of jaxpar_zoo.llama.REMAT_POLICIES
    param_scan_axis: int = 1
    batch: int = 8
    seq_len: int = 4096
    dtype: str = "bfloat16"
    learning_rate: float = 3e-4
    weight_decay: float = 0.1
    logical_axis_rules: tuple[tuple[str, Any], ...] = LOGICAL_AXIS_RULES


SMALL = MaxTextConfig(
    vocab_size=256, emb_dim=128, num_query_heads=16, num_kv_heads=8, head_dim=8, mlp_dim=256,
    num_decoder_layers=2, batch=16, seq_len=16, dtype="float32", learning_rate=1e-3,
)  # fmt: skip
FULL_8B = MaxTextConfig()


def _param(module: nn.Module, name: str, shape, axes, init, dtype) -> jax.Array:
    """A parameter boxed with its logical names (``nn.with_logical_partitioning``)."""
    return module.param(name, nn.with_logical_partitioning(init, axes), shape, dtype)


def _constrain(x: jax.Array, names: tuple[str, ...]) -> jax.Array:
    return nn.with_logical_constraint(x, names)


class RMSNorm(nn.Module):
    """``x / rms(x) * scale`` in float32 (at least), the scale named ``norm``."""

    eps: float
    dtype: Any
    param_dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = _param(self, "scale", (x.shape[-1],), ("norm",), nn.initializers.ones,
                       self.param_dtype)  # fmt: skip
        acc = jnp.promote_types(jnp.float32, x.dtype)
        y = x.astype(acc)
        y = y * jax.lax.rsqrt(jnp.mean(jnp.square(y), axis=-1, keepdims=True) + self.eps)
        return (y * scale.astype(acc)).astype(self.dtype)


class Attention(nn.Module):
    """Causal grouped-query attention with RoPE: q/k/v/out kernels under MaxText's names, the
    projections constrained and checkpoint-named as MaxText's."""

    cfg: MaxTextConfig
    dtype: Any
    param_dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c = self.cfg
        init = nn.initializers.lecun_normal(in_axis=0, out_axis=(1, 2))
        h, kv, d, e = c.num_query_heads, c.num_kv_heads, c.head_dim, c.emb_dim
        wq = _param(self, "query", (e, h, d), ("embed", "q_heads", "kv"), init, self.param_dtype)
        wk = _param(self, "key", (e, kv, d), ("embed", "kv_heads", "kv_head_dim"), init,
                    self.param_dtype)  # fmt: skip
        wv = _param(self, "value", (e, kv, d), ("embed", "kv_heads", "kv_head_dim"), init,
                    self.param_dtype)  # fmt: skip
        out_init = nn.initializers.lecun_normal(in_axis=(0, 1), out_axis=2)
        wo = _param(self, "out", (h, d, e), ("heads", "kv", "embed"), out_init, self.param_dtype)
        x = _constrain(x, ("activation_batch", "activation_length", "activation_embed"))
        kv_names = ("activation_kv_batch", "activation_length", "activation_kv_heads",
                    "activation_kv_head_dim")  # fmt: skip
        cast = lambda w: w.astype(self.dtype)
        q = checkpoint_name(jnp.einsum("ble,ehd->blhd", x, cast(wq)), "query_proj")
        k = checkpoint_name(jnp.einsum("ble,ehd->blhd", x, cast(wk)), "key_proj")
        v = checkpoint_name(jnp.einsum("ble,ehd->blhd", x, cast(wv)), "value_proj")
        q = _constrain(
            q, ("activation_batch", "activation_length", "activation_heads", "activation_kv")
        )
        k, v = _constrain(k, kv_names), _constrain(v, kv_names)
        q = apply_rope(q, c.rope_max_timescale)
        k = apply_rope(k, c.rope_max_timescale)
        out = self.attend(q, k, v)
        out = _constrain(
            out, ("activation_batch", "activation_length", "activation_heads", "activation_kv")
        )
        return checkpoint_name(jnp.einsum("blhd,hde->ble", out, cast(wo)), "out_proj")

    def attend(self, q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        """Softmax attention of ``q: [b, l, h, d]`` over ``k, v: [b, l, kv, d]``, query head
        ``i`` reading K/V head ``i // (h / kv)``; causal; softmax in float32."""
        b, length, h, d = q.shape
        kv = k.shape[2]
        q = q.reshape(b, length, kv, h // kv, d)
        scores = jnp.einsum("bqkgd,bskd->bkgqs", q, k) / math.sqrt(d)
        acc = jnp.promote_types(jnp.float32, self.dtype)
        scores = scores.astype(acc)
        causal = jnp.tril(jnp.ones((length, length), dtype=bool))
        scores = jnp.where(causal, scores, jnp.finfo(acc).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(self.dtype)
        return jnp.einsum("bkgqs,bskd->bqkgd", probs, v).reshape(b, length, h, d)


class MlpBlock(nn.Module):
    """SwiGLU: ``wo(silu(wi_0 x) * wi_1 x)``, MaxText's names and checkpoint names."""

    cfg: MaxTextConfig
    dtype: Any
    param_dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        e, m = self.cfg.emb_dim, self.cfg.mlp_dim
        init = nn.initializers.lecun_normal()
        wi_0 = _param(self, "wi_0", (e, m), ("embed", "mlp"), init, self.param_dtype)
        wi_1 = _param(self, "wi_1", (e, m), ("embed", "mlp"), init, self.param_dtype)
        wo = _param(self, "wo", (m, e), ("mlp", "embed"), init, self.param_dtype)
        cast = lambda w: w.astype(self.dtype)
        gate = checkpoint_name(x @ cast(wi_0), "mlpwi_0")
        up = checkpoint_name(x @ cast(wi_1), "mlpwi_1")
        hidden = _constrain(
            nn.silu(gate) * up, ("activation_batch", "activation_length", "activation_mlp")
        )
        return checkpoint_name(hidden @ cast(wo), "mlpwo")


_EMBED = ("activation_batch", "activation_norm_length", "activation_embed")
_RESIDUAL = ("activation_batch", "activation_length", "activation_embed")


class DecoderLayer(nn.Module):
    """MaxText's Llama decoder layer, returning ``(out, None)`` as a scanned layer does."""

    cfg: MaxTextConfig
    dtype: Any
    param_dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array, _: Any = None) -> tuple[jax.Array, None]:
        c, kw = self.cfg, {"dtype": self.dtype, "param_dtype": self.param_dtype}
        x = checkpoint_name(_constrain(x, _EMBED), "decoder_layer_input")
        h = RMSNorm(c.normalization_layer_epsilon, name="pre_self_attention_layer_norm", **kw)(x)
        h = _constrain(h, _EMBED)
        h = Attention(c, name="self_attention", **kw)(h)
        x = _constrain(x + _constrain(h, _RESIDUAL), _RESIDUAL)
        h = RMSNorm(c.normalization_layer_epsilon, name="post_self_attention_layer_norm", **kw)(x)
        h = MlpBlock(c, name="mlp", **kw)(_constrain(h, _EMBED))
        return _constrain(x + _constrain(h, _RESIDUAL), _RESIDUAL), None


class MaxTextDecoder(nn.Module):
    """Embedding, the scanned (or unrolled) remat layers, the final norm, the logits."""

    cfg: MaxTextConfig
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        c, kw = self.cfg, {"dtype": self.dtype, "param_dtype": self.param_dtype}
        table = _param(self, "token_embedder", (c.vocab_size, c.emb_dim), ("vocab", "embed"),
                       nn.initializers.normal(1.0), self.param_dtype)  # fmt: skip
        x = jnp.take(table.astype(self.dtype), tokens, axis=0)
        x = _constrain(
            x, ("activation_embed_and_logits_batch", "activation_length", "activation_embed")
        )
        layer = nn.remat(DecoderLayer, prevent_cse=not c.scan_layers,
                         policy=REMAT_POLICIES[c.remat_policy]())  # fmt: skip
        if c.scan_layers:
            stack = nn.scan(
                layer, variable_axes={"params": c.param_scan_axis}, split_rngs={"params": True},
                in_axes=(nn.broadcast,), length=c.num_decoder_layers,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )  # fmt: skip
            x, _ = stack(c, name="layers", **kw)(x, None)
        else:
            for i in range(c.num_decoder_layers):
                x, _ = layer(c, name=f"layers_{i}", **kw)(x, None)
        x = RMSNorm(c.normalization_layer_epsilon, name="decoder_norm", **kw)(x)
        x = _constrain(x, _RESIDUAL)
        wl = _param(self, "logits_dense", (c.emb_dim, c.vocab_size), ("embed", "vocab"),
                    nn.initializers.lecun_normal(), self.param_dtype)  # fmt: skip
        logits = x @ wl.astype(self.dtype)
        names = ("activation_embed_and_logits_batch", "activation_length", "activation_vocab")
        return _constrain(logits, names).astype(jnp.promote_types(jnp.float32, self.dtype))


# ---- the train step --------------------------------------------------------------------


def maxtext_step(model: MaxTextDecoder, tx: optax.GradientTransformation, rules: Any):
    """``step(state, batch) -> (state, metrics)``: AdamW on the boxed state, under the rules in
    force when traced, else ``rules``."""

    def step(state: dict[str, Any], batch: dict[str, jax.Array]) -> tuple[dict, dict]:
        with nn.logical_axis_rules(rules_in_force(rules)):
            values = nn.meta.unbox(state)  # each leaf constrained by its names' rule
            tokens = batch["tokens"]
            targets = jnp.roll(tokens, -1, axis=1)  # position t predicts token t + 1

            def loss_fn(params: Any) -> jax.Array:
                return cross_entropy(model.apply({"params": params}, tokens), targets)

            loss, grads = jax.value_and_grad(loss_fn)(values["params"])
            updates, opt_state = tx.update(grads, values["opt_state"], values["params"])
            params = optax.apply_updates(values["params"], updates)
        new = {"params": params, "opt_state": opt_state, "step": values["step"] + 1}
        return rebox(state, new), {"loss": loss}

    return step


def rules_in_force(default: Any) -> tuple[tuple[str, Any], ...]:
    """The rules a step traced now applies: those in context, else ``default`` restricted to
    the axes of the mesh in context (`rules_for_axes`; none: Flax constrains nothing)."""
    given = nn.get_logical_axis_rules()
    if given:
        return tuple(given)
    mesh = jax.sharding.get_abstract_mesh()
    return rules_for_axes(default, () if mesh.empty else mesh.axis_names)


def _is_box(x: Any) -> bool:
    return isinstance(x, nn.meta.AxisMetadata)


def rebox(boxed: Any, values: Any) -> Any:
    """``values`` (the unboxed tree) put back into ``boxed``'s boxes."""
    return jax.tree.map(
        lambda b, v: b.replace_boxed(v) if _is_box(b) else v, boxed, values, is_leaf=_is_box
    )


def maxtext_example(name: str, cfg: MaxTextConfig, dtype: Any = None) -> Example:
    """The decoder of ``cfg`` and its AdamW train step as a zoo `Example` (state: boxed
    ``params``, ``opt_state``, ``step``; batch: ``tokens``). ``dtype``: the compute dtype
    (None: ``cfg.dtype``); weights float32 (float64 when computing in float64)."""
    dtype = jnp.dtype(cfg.dtype if dtype is None else dtype)
    if cfg.num_query_heads % cfg.num_kv_heads:
        raise ValueError(f"{name}: num_kv_heads must divide num_query_heads, got {cfg}")
    model = MaxTextDecoder(cfg, dtype=dtype, param_dtype=param_dtype_for(dtype))
    tx = optax.adamw(cfg.learning_rate, b1=0.9, b2=0.95, weight_decay=cfg.weight_decay)
    spec = token_batch_spec(cfg.batch, cfg.seq_len)

    def init_state(key: jax.Array) -> dict[str, Any]:
        params = model.init(key, jnp.zeros((1, cfg.seq_len), jnp.int32))["params"]
        return {"params": params, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32)}

    config = dataclasses.asdict(cfg) | {"dtype": dtype.name, "vocab_size": cfg.vocab_size}
    step = maxtext_step(model, tx, cfg.logical_axis_rules)
    return build_example(name, model, step, init_state, spec, config, lambda s: s["params"])


def _config(base: MaxTextConfig, batch: int | None) -> MaxTextConfig:
    return base if batch is None else dataclasses.replace(base, batch=int(batch))


@register("maxtext_8b")
def maxtext_8b(batch: int | None, small: bool, dtype: Any) -> Example:
    """MaxText-style Llama 3 8B (32 scanned remat layers, d 4096, 32/8 heads), AdamW."""
    return maxtext_example("maxtext_8b", _config(SMALL if small else FULL_8B, batch), dtype)


@register("maxtext_small")
def maxtext_small(batch: int | None, small: bool, dtype: Any) -> Example:
    """MaxText-style 2-layer test decoder (d 128, 16/8 heads of 8, MLP 256), AdamW; 16 x 16."""
    return maxtext_example("maxtext_small", _config(SMALL, batch), dtype)
