"""The Llama family (models/llama.py): closed-form parameter counts of the published shapes
(abstract, nothing allocated), training of the small config, remat equivalence, grouped-query
attention against a per-head reference, mixed precision, and planner coverage."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jaxpar_zoo as zoo
import numpy as np
import pytest
from helpers import assert_trains
from jaxpar_zoo.llama import Attention, llama_config, llama_example

import jaxpar

# Published totals (Meta's model cards: 8.03B and 70.6B; the Gemma report: 8.54B for 7B;
# Mistral's Mixtral 8x7B: 46.7B)
PUBLISHED_PARAMS = {
    "llama3_8b": 8.03e9, "llama3_70b": 70.55e9, "gemma_7b": 8.54e9, "mixtral_8x7b": 46.7e9,
}  # fmt: skip


def closed_form_params(cfg: dict) -> int:
    """Embedding + layers (attention, SwiGLU or a router and ``num_experts`` SwiGLUs, two
    norms) + final norm + LM head (none when tied to the embedding)."""
    d, vocab, ffn = cfg["d_model"], cfg["vocab_size"], cfg["ffn_dim"]
    heads, kv_heads = cfg["num_heads"], cfg["num_kv_heads"]
    head_dim = cfg.get("head_dim") or d // heads
    attention = d * heads * head_dim + 2 * d * kv_heads * head_dim + heads * head_dim * d
    experts = cfg.get("num_experts", 0)
    mlp = experts * (3 * d * ffn + d) if experts else 3 * d * ffn
    layer = attention + mlp + 2 * d
    head = 0 if cfg.get("tie_embeddings") else d * vocab
    return vocab * d + cfg["num_layers"] * layer + d + head


def _remat_equations(jaxpr) -> int:
    """Number of checkpoint/remat equations in ``jaxpr`` and its sub-jaxprs."""
    count = 0
    for eqn in jaxpr.eqns:
        count += eqn.primitive.name in ("checkpoint", "remat", "remat2")
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    count += _remat_equations(inner)
    return count


@pytest.mark.closed_form
@pytest.mark.parametrize("name", zoo.LARGE)
def test_full_param_counts(name):
    ex = zoo.get(name)  # abstract: eval_shape of init, nothing allocated
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(ex.args))
    n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(ex.args[0].params))
    assert n == ex.config["params"] == closed_form_params(ex.config)
    assert abs(n / PUBLISHED_PARAMS[name] - 1) <= 0.01, (name, n)
    exact = {
        "llama3_8b": 8_030_261_248, "llama3_70b": 70_553_706_496, "gemma_7b": 8_537_680_896,
        "mixtral_8x7b": 46_702_792_704,
    }  # fmt: skip
    assert n == exact[name]
    assert ex.args[1]["tokens"].shape == (8, 4096)


@pytest.mark.closed_form
@pytest.mark.parametrize("name", (*zoo.LARGE, *zoo.LARGE_EXTRA))
def test_small_param_counts_and_divisibility(name):
    ex = zoo.get(name, small=True)
    assert ex.config["params"] == closed_form_params(ex.config)
    cfg = ex.config
    for key in ("batch", "d_model", "num_heads", "num_kv_heads", "ffn_dim", "vocab_size"):
        assert cfg[key] % 8 == 0, (name, key, cfg[key])
    assert cfg["num_kv_heads"] < cfg["num_heads"] or name == "gemma_7b"  # Gemma 7B: MHA


@pytest.mark.api
def test_config_overrides():
    cfg = llama_config("llama3_70b", remat=True, batch=64, seq_len=2048)
    assert (cfg["batch"], cfg["seq_len"], cfg["remat"]) == (64, 2048, True)
    assert cfg["rope_theta"] == 500_000.0 and cfg["norm_eps"] == 1e-5
    assert llama_config("llama3_70b")["remat"] is False  # the stored config is untouched
    assert zoo.get("llama_small", batch=24).args[1]["tokens"].shape == (24, 16)
    with pytest.raises(KeyError, match="unknown Llama config"):
        llama_config("llama3_405b")


@pytest.mark.numerics
def test_small_trains_in_float32():
    ex = zoo.get("llama_small", small=True)
    state, _ = ex.make_args(0)
    assert {x.dtype for x in jax.tree.leaves(state.params)} == {jnp.dtype(jnp.float32)}
    assert_trains(ex)


@pytest.mark.numerics
def test_remat_matches_plain_in_float64():
    with jax.enable_x64(True):
        plain = llama_example("llama_small", llama_config("llama_small"), jnp.float64)
        remat = llama_example("llama_small", llama_config("llama_small", remat=True), jnp.float64)
        state, batch = plain.make_args(0)
        assert {x.dtype for x in jax.tree.leaves(state.params)} == {jnp.dtype(jnp.float64)}
        # the same parameters and optimizer state, applied by the remat model
        remat_state = state.replace(apply_fn=remat.model.apply, tx=remat.args[0].tx)
        assert _remat_equations(jax.make_jaxpr(plain.step)(state, batch).jaxpr) == 0
        assert _remat_equations(jax.make_jaxpr(remat.step)(remat_state, batch).jaxpr) > 0
        # one program for both steps: a single (CPU) compilation
        both = jax.jit(lambda s, rs, b: (plain.step(s, b), remat.step(rs, b)))
        (want, want_metrics), (got, got_metrics) = both(state, remat_state, batch)
    np.testing.assert_allclose(got_metrics["loss"], want_metrics["loss"], rtol=1e-12)
    for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(want.params), strict=True):
        assert a.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-12)


def _reference_attention(x, params, num_heads, num_kv_heads, theta):
    """Per-head causal attention in NumPy float64; RoPE as complex rotation of (i, i + hd/2)."""
    x = np.asarray(x, np.float64)
    w = {k: np.asarray(v["kernel"], np.float64) for k, v in params.items()}
    batch, length, d = x.shape
    hd = d // num_heads
    half = hd // 2
    angle = np.arange(length)[:, None] * theta ** (-2.0 * np.arange(half) / hd)
    rotation = np.exp(1j * angle)  # [length, half]

    def rope(t):  # [batch, length, hd]
        z = (t[..., :half] + 1j * t[..., half:]) * rotation
        return np.concatenate([z.real, z.imag], axis=-1)

    q = (x @ w["q"]).reshape(batch, length, num_heads, hd)
    k = (x @ w["k"]).reshape(batch, length, num_kv_heads, hd)
    v = (x @ w["v"]).reshape(batch, length, num_kv_heads, hd)
    mask = np.tril(np.ones((length, length), bool))
    heads = []
    for h in range(num_heads):
        kv = h // (num_heads // num_kv_heads)  # the K/V head this query head shares
        scores = rope(q[:, :, h]) @ rope(k[:, :, kv]).transpose(0, 2, 1) / np.sqrt(hd)
        scores = np.where(mask, scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        heads.append(probs @ v[:, :, kv])
    return np.concatenate(heads, axis=-1) @ w["o"]


@pytest.mark.numerics
@pytest.mark.parametrize("num_kv_heads", [8, 2])
def test_grouped_query_attention_matches_reference(num_kv_heads):
    num_heads, d, theta = 8, 64, 500_000.0
    module = Attention(num_heads, num_kv_heads, theta, dtype=jnp.float32)
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 16, d), jnp.float32)
    params = module.init(jax.random.PRNGKey(1), x)["params"]
    assert params["q"]["kernel"].shape == (d, d)
    assert params["k"]["kernel"].shape == params["v"]["kernel"].shape == (d, num_kv_heads * 8)
    # a large theta leaves the high frequencies untested: check a small one too
    for rope_theta in (theta, 10.0):
        got = module.clone(rope_theta=rope_theta).apply({"params": params}, x)
        want = _reference_attention(x, params, num_heads, num_kv_heads, rope_theta)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)


@pytest.mark.numerics
def test_bfloat16_mixed_precision():
    ex = zoo.get("llama_small", small=True, dtype=jnp.bfloat16)
    assert ex.config["dtype"] == "bfloat16" and ex.config["param_dtype"] == "float32"
    state, batch = ex.make_args(0)
    assert {x.dtype for x in jax.tree.leaves(state.params)} == {jnp.dtype(jnp.float32)}
    step = jax.jit(ex.step).trace(state, batch)
    dots = [e for e in step.jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
    assert dots and all(v.aval.dtype == jnp.bfloat16 for e in dots for v in e.invars)
    new_state, metrics = step.lower().compile()(state, batch)
    assert metrics["loss"].dtype == jnp.float32 and np.isfinite(float(metrics["loss"]))
    assert {x.dtype for x in jax.tree.leaves(new_state.params)} == {jnp.dtype(jnp.float32)}


@pytest.mark.api
def test_full_size_default_is_bfloat16_compute():
    # llama_example without a dtype computes a full-size config in bfloat16 (one layer here
    # to keep the abstract build cheap); parameters stay float32
    cfg = llama_config("llama3_8b", batch=8, seq_len=128)
    cfg["num_layers"] = 1
    ex = llama_example("llama3_8b", cfg)
    assert ex.config["dtype"] == "bfloat16"
    assert {x.dtype for x in jax.tree.leaves(ex.args[0].params)} == {jnp.dtype(jnp.float32)}
    _, metrics = jax.eval_shape(ex.step, *ex.args)
    assert metrics["loss"].dtype == jnp.float32


@pytest.mark.api
@pytest.mark.parametrize("remat", [False, True])
@pytest.mark.parametrize("name", ["llama_small", "mixtral_8x7b"])
def test_every_primitive_has_a_sharding_rule(name, remat):
    from jaxpar.rules import table as rules
    from jaxpar.trace.tracing import trace

    cfg = llama_config(name, small=True, remat=remat)
    ex = llama_example(name, cfg, jnp.float32)
    program, _ = trace(ex.step, ex.args)
    fallback = {
        e.primitive
        for e in program.eqns
        if rules.RULES.get(e.primitive, rules.replicated_space) is rules.replicated_space
    }
    assert not fallback, sorted(fallback)


@pytest.mark.api
def test_small_plans():
    ex = zoo.get("llama_small", small=True)
    plan = jaxpar.plan(ex.step, *ex.args, mesh={"data": 2, "model": 4}, cluster="dgx-h100")
    assert plan.stats["equations"] > 0
    assert np.isfinite(plan.cost.step_s) and plan.cost.step_s > 0


@pytest.mark.numerics
def test_gemma_shape_shards_like_the_unsharded_step():
    """Gemma's shape at test size (heads x head_dim wider than d, tied embeddings, GeGLU, scaled
    embeddings): trains, and its auto-sharded step on 2 x 4 equals the unsharded one in
    float64."""
    from helpers import assert_equivalent

    with jax.enable_x64(True):
        ex = llama_example("gemma_7b", llama_config("gemma_7b", small=True), jnp.float64)
        state, batch = ex.make_args(0)
        assert "lm_head" not in state.params  # tied: the embedding's transpose
        assert state.params["block0"]["attn"]["q"]["kernel"].shape == (128, 256)
        ref = jax.jit(ex.step)(state, batch)
        mesh = jaxpar.make_mesh({"data": 2, "model": 4})
        step = jaxpar.auto_shard(ex.step, mesh=mesh, cluster="dgx-h100")
        assert_equivalent(step(state, batch), ref, rtol=1e-5)
    assert np.isfinite(float(ref[1]["loss"]))


@pytest.mark.numerics
@pytest.mark.slow
@pytest.mark.parametrize(("scan", "capacity"), [(False, None), (True, None), (True, 1.25)])
def test_mixture_of_experts_shards_like_the_unsharded_step(scan, capacity):
    """Mixtral's shape at test size (4 SwiGLU experts, top-2), dropless (grouped matmuls over
    tokens sorted by expert; unrolled and scanned) and with GShard's capacity dispatch
    (scanned): its auto-sharded step on 2 x 4 equals the unsharded one in float64, and the
    compiled collectives are the predicted ones."""
    from helpers import assert_equivalent, assert_fidelity

    with jax.enable_x64(True):
        cfg = llama_config("mixtral_8x7b", small=True, scan_layers=scan, capacity_factor=capacity)
        ex = llama_example("mixtral_8x7b", cfg, jnp.float64)
        state, batch = ex.make_args(0)
        moe = (state.params["blocks"] if scan else state.params["block0"])["moe"]
        assert moe["gate"].shape[-3:] == (4, 128, 256) and moe["down"].shape[-3:] == (4, 256, 128)
        ref = jax.jit(ex.step)(state, batch)
        step = jaxpar.auto_shard(ex.step, mesh=jaxpar.make_mesh({"data": 2, "model": 4}))
        assert_equivalent(step(state, batch), ref, rtol=1e-6)
        assert_fidelity(step.plan, step.lower(state, batch).compile())
    assert np.isfinite(float(ref[1]["loss"]))


@pytest.mark.numerics
@pytest.mark.slow
def test_capacity_dispatch_without_drops_is_the_dropless_mixture():
    """With a capacity of every token (capacity_factor = experts / top_k), GShard's dispatch
    drops nothing and computes what the grouped matmuls do (float64, the same parameters);
    at 0.5 (4 of the 32 copies of a 16-token group per expert) it drops some and differs."""
    with jax.enable_x64(True):

        def step_of(capacity):
            cfg = llama_config("mixtral_8x7b", small=True, capacity_factor=capacity)
            return llama_example("mixtral_8x7b", cfg, jnp.float64)

        dropless, every, tight = step_of(None), step_of(4 / 2), step_of(0.5)
        state, batch = dropless.make_args(0)
        # the same parameters and optimizer state, applied by each model
        examples = (dropless, every, tight)
        states = [state.replace(apply_fn=ex.model.apply) for ex in examples]
        run = jax.jit(lambda s, b: [ex.step(x, b) for ex, x in zip(examples, s, strict=True)])
        (want, want_m), (got, got_m), (_, tight_m) = run(states, batch)
    for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(want.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(float(got_m["loss"]), float(want_m["loss"]), rtol=1e-6)
    assert abs(float(tight_m["loss"]) - float(want_m["loss"])) > 1e-6


@pytest.mark.api
@pytest.mark.slow
def test_capacity_dispatch_plans_expert_parallelism():
    """Mixtral 8x7B with GShard's dispatch (capacity 1.25, scanned, remat; 64 x 4,096 tokens)
    on 8 DGX H100 nodes: the plan splits the experts over a mesh axis (expert parallelism)
    and reaches their tokens by all-to-all, which no hand plan does, and beats the dropless
    grouped matmuls on the same mesh, whose token dim stays whole
    (bench/scale/results/scanned.md)."""
    mesh = {"node": 8, "gpu": 8}

    def planned(capacity):
        cfg = llama_config(
            "mixtral_8x7b", remat=True, batch=64, scan_layers=True, capacity_factor=capacity
        )  # fmt: skip
        ex = llama_example("mixtral_8x7b", cfg)
        return jaxpar.plan(ex.step, *ex.args, mesh=mesh, cluster="dgx-h100")

    plan = planned(1.25)
    assert plan.memory.fits
    paths = zip(plan.program.invars, plan.program.invar_paths, strict=True)
    experts = [t for t, p in paths if p.startswith("[0].params") and "['moe']['gate']" in p]
    (gate,) = experts  # [layers, experts, d, ffn]
    assert plan.tensor_specs[gate][1], "the experts are not split"
    moe = [c for c in plan.collectives if "moe" in c.layer]
    assert any(c.kind == "all-to-all" for c in moe)
    hand = min(plan.baselines[s].overlapped_step_s for s in ("fsdp", "fsdp_tp"))
    assert plan.cost.overlapped_step_s < hand / 3
    assert plan.cost.overlapped_step_s < planned(None).cost.overlapped_step_s / 2
