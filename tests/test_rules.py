"""Rules for primitives Flax code emits (docs/testing.md, "Test tiers": numerics + api): bit casts,
key clones, dropout's random bits, top-k and the scatter family have real rules; replicated
fallbacks, loops included, warn once naming the primitive, the layer and why."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_equivalent

import jaxpar
from jaxpar.rules.table import space_of

pytestmark = pytest.mark.numerics


@pytest.fixture(scope="module")
def mesh():
    return jaxpar.make_mesh({"data": 2, "model": 4})


def _spaces(step, primitive):
    plan = step.plan
    return [space_of(e, plan.program) for e in plan.program.eqns if e.primitive == primitive]


def test_bitcast_convert_type_has_a_rule_and_keeps_the_numbers(mesh):
    def f(x):
        same = jax.lax.bitcast_convert_type(x, jnp.int32)  # same width: elementwise
        narrow = jax.lax.bitcast_convert_type(x, jnp.uint8)  # adds a trailing dim of 4
        return (same & 0xFF).astype(jnp.float32) + narrow.astype(jnp.float32).sum(-1)

    x = jnp.arange(256.0, dtype=jnp.float32).reshape(16, 16) / 7
    step = jaxpar.auto_shard(f, mesh=mesh)
    np.testing.assert_array_equal(np.asarray(step(x)), np.asarray(jax.jit(f)(x)))
    spaces = _spaces(step, "bitcast_convert_type")
    assert len(spaces) == 2 and not any(s.replicated for s in spaces)
    narrow = next(s for s in spaces if len(s.sizes) == 3)
    assert narrow.splittable == (True, True, False)  # the byte dim stays whole


def test_scatter_set_splits_windows_but_never_scattered_dims(mesh):
    def g(x, idx, v):
        return x.at[idx].set(v) * 2.0

    x = jnp.arange(16 * 8, dtype=jnp.float32).reshape(16, 8)
    idx, v = jnp.array([1, 3, 5, 7]), jnp.ones((4, 8))
    step = jaxpar.auto_shard(g, mesh=mesh)
    np.testing.assert_array_equal(np.asarray(step(x, idx, v)), np.asarray(jax.jit(g)(x, idx, v)))
    (space,) = _spaces(step, "scatter")
    assert not space.replicated
    operand_dims = len(x.shape)
    scattered = range(operand_dims, len(space.sizes))
    assert scattered and not any(space.splittable[d] for d in scattered)
    assert space.splittable[1]  # the window (feature) dim follows the operand and may split


@pytest.mark.parametrize("combine", ["max", "min", "mul", "sub"])
def test_scatter_extremes_products_and_differences_have_the_set_rule(mesh, caplog, combine):
    """``segment_max`` (graph networks' pooling), ``.at[].min/multiply`` and a scatter-sub keep
    their scattered dims whole and split the windows; no replicated fallback, no warning."""

    def g(x, ids, v):
        if combine == "sub":  # jnp has no spelling of it
            dn = jax.lax.ScatterDimensionNumbers((1,), (0,), (0,))
            return jax.lax.scatter_sub(x, ids[:, None], v, dn) * 2.0
        if combine == "max":
            return jax.ops.segment_max(v, ids, num_segments=16) * 2.0
        at = x.at[ids]
        return (at.min(v) if combine == "min" else at.multiply(v)) * 2.0

    x = jnp.arange(16 * 8, dtype=jnp.float32).reshape(16, 8) / 16
    ids, v = jnp.array([1, 3, 5, 7, 3, 1]), jnp.arange(6 * 8, dtype=jnp.float32).reshape(6, 8)
    with caplog.at_level(logging.WARNING, logger="jaxpar"):
        step = jaxpar.auto_shard(g, mesh=mesh)
        out = step(x, ids, v)
    np.testing.assert_allclose(np.asarray(out), np.asarray(jax.jit(g)(x, ids, v)), rtol=1e-6)
    assert not [r for r in caplog.records if "scatter" in r.getMessage()]
    (space,) = _spaces(step, f"scatter-{combine}")
    assert not space.replicated
    assert not any(space.splittable[d] for d in range(len(x.shape), len(space.sizes)))
    assert space.splittable[1]  # the window (feature) dim


def test_ffts_and_factorizations_split_their_batch(mesh, caplog):
    """An FFT per channel (an FNO / Hyena-style mixer, under the gradient) and a Shampoo-style
    update of stacked per-layer matrices (Cholesky, triangular solves, eigh): the core dims stay
    whole, the batch dims split; no replicated fallback, no warning; equal to the unsharded
    step."""

    def step(w, x, stats):
        def loss(w):
            h = jnp.tanh(x @ w)  # [B, T, C]
            f = jnp.fft.rfft(h, axis=1) * jnp.exp(-jnp.arange(h.shape[1] // 2 + 1.0))[:, None]
            return (jnp.fft.irfft(f, n=h.shape[1], axis=1) ** 2).mean()

        g = jax.grad(loss)(w)
        gram = stats + 1e-3 * jnp.einsum("li,lj->lij", g[:4, :16], g[:4, :16]) + jnp.eye(16)
        chol = jnp.linalg.cholesky(gram)
        solved = jax.scipy.linalg.solve_triangular(
            chol, jnp.ones(gram.shape[:-1])[..., None], lower=True
        )
        evals, _ = jnp.linalg.eigh(gram)
        return w - 0.1 * g, solved[..., 0] + evals

    rs = np.random.RandomState(0)
    w, x = jnp.asarray(rs.randn(16, 32) / 4), jnp.asarray(rs.randn(8, 16, 16))
    a = rs.randn(4, 16, 16)
    stats = jnp.asarray(a @ a.transpose(0, 2, 1) / 16)
    with caplog.at_level(logging.WARNING, logger="jaxpar"):
        sharded = jaxpar.auto_shard(step, mesh=mesh, strategy="data")
        out = sharded(w, x, stats)
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    for got, want in zip(
        jax.tree.leaves(out), jax.tree.leaves(jax.jit(step)(w, x, stats)), strict=True
    ):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-4, atol=2e-5)
    for prim, batch in (("fft", 2), ("cholesky", 1), ("triangular_solve", 1), ("eigh", 1)):
        spaces = _spaces(sharded, prim)
        assert spaces and all(s.splittable == (True,) * batch for s in spaces), prim


def _whitening_step(w, x, stats):
    """A step that reaches for every matrix routine a second-order optimizer or a normalizing
    flow uses, on per-layer stacks of matrices: SVD and QR of the stacked gradients, LU (solve,
    inverse, log-determinant), a general eigendecomposition, and reductions without a
    collective (bitwise xor, a variadic max-with-sum), a symmetric product and a reduction to
    tridiagonal form of per-layer 4 x 4 blocks, and a
    histogram's bins (``jnp.searchsorted``: total-order comparisons)."""
    from jax import lax

    def loss(w):
        return (jnp.tanh(x @ w) ** 2).mean()

    g = jax.grad(loss)(w)  # [16, 32]
    stack = g.reshape(4, 4, 32) @ g.reshape(4, 32, 4) + stats  # [4, 4, 4] per-layer blocks
    u, s, vt = jnp.linalg.svd(stack, full_matrices=False)
    q, r = jnp.linalg.qr(stack)
    solved = jnp.linalg.solve(stack, jnp.ones((4, 4, 2)))
    inverse = jnp.linalg.inv(stack)
    _, logdet = jnp.linalg.slogdet(stack)
    eigenvalues = jnp.linalg.eig(stack)[0]  # host-only on GPU; XLA:CPU runs it
    gram = lax.linalg.symmetric_product(stack, stats, alpha=0.5, beta=2.0)  # Shampoo's G G^T
    diagonal = lax.linalg.tridiagonal(gram)[1]  # the tridiagonal form's diagonal
    bits = jnp.bitwise_xor.reduce(jnp.round(stack * 64).astype(jnp.int64), axis=-1)
    bins = jnp.searchsorted(jnp.linspace(-1.0, 1.0, 9), jnp.tanh(stack))  # total-order compares
    big, total = lax.reduce(
        (stack, stack), (-jnp.inf, 0.0), lambda a, b: (jnp.maximum(a[0], b[0]), a[1] + b[1]), (2,)
    )
    return w - 0.1 * g, (
        (u * s[:, None, :]) @ vt + q @ r,
        solved.sum(-1) + inverse.sum(-1) + logdet[:, None] + jnp.abs(eigenvalues) + diagonal,
        bits.astype(jnp.float64) + big + total + bins.sum(-1),
    )


def test_matrix_routines_and_reductions_without_a_collective_split_their_batch(mesh, caplog):
    """Every routine of `_whitening_step`: no replicated fallback, no warning; the per-matrix
    batch dims split and the matrix dims stay whole; a variadic reduce and a bitwise xor keep
    their reduced dim whole; the step on (2, 4) under data parallelism and the planner's own
    plan equals the unsharded one in float64 (``jnp.linalg.solve`` is its solve's body)."""
    rs = np.random.RandomState(0)
    with jax.enable_x64(True):
        w, x = jnp.asarray(rs.randn(16, 32) / 4), jnp.asarray(rs.randn(8, 16, 16))
        stats = jnp.asarray(np.eye(4)[None] * 4 + rs.randn(4, 4, 4) / 8)
        want = jax.jit(_whitening_step)(w, x, stats)
        for strategy in ("data", "auto"):
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="jaxpar"):
                sharded = jaxpar.auto_shard(_whitening_step, mesh=mesh, strategy=strategy)
                got = sharded(w, x, stats)
            assert not caplog.records, [r.getMessage() for r in caplog.records]
            for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-9)
        assert not any(e.primitive == "custom_linear_solve" for e in sharded.plan.program.eqns)
        plan = sharded.plan
        # Golub & Van Loan's counts for one 4 x 4 block (`rules_linalg._core_flops`), times 4
        # blocks: SVD with U and V 4M²k + 8Mk² + 9k³, QR 4Mk² - 4k³/3, LU 2n³/3, eig with
        # vectors 25n³, tridiagonal form 4n³/3, symmetric product (k = n) 2n³ + 3n²
        n = 4
        per_block = {
            "svd": 21 * n**3,
            "qr": 8 * n**3 / 3,
            "lu": 2 * n**3 / 3,
            "eig": 25 * n**3,
            "tridiagonal": 4 * n**3 / 3,
            "symmetric_product": 2 * n**3 + 3 * n**2,
        }
        for prim in per_block:
            spaces = _spaces(sharded, prim)
            assert spaces and all(s.splittable == (True,) for s in spaces), prim
            assert all(s.flops == pytest.approx(4 * per_block[prim]) for s in spaces), prim
            for e in (e for e in plan.program.eqns if e.primitive == prim):  # run sharded
                assert 0 in plan.config(plan.ng.node_of_eqn[e.index]), prim
        for prim in ("reduce", "reduce_xor"):
            (space,) = _spaces(sharded, prim)
            assert space.splittable == (True, True, False), prim


def test_device_puts_to_host_memory_stay_and_layouts_give_way(mesh, caplog):
    """``jax.device_put`` inside a step: a move to a layout (a NamedSharding in device memory)
    is dropped, the plan's layouts replace it; a move to the host's memory kind and back stays,
    one ``device_put`` to each memory space, its result held on the host (`Tensor.host`).
    No warning; equal to the unsharded step."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    def step(w, x):
        y = jax.device_put(x, NamedSharding(mesh, P("model")))
        h = jnp.tanh(y @ w)
        off = jax.device_put(h, NamedSharding(mesh, P(), memory_kind="pinned_host"))
        back = jax.device_put(off, NamedSharding(mesh, P(), memory_kind="device"))
        return (back * h).sum(0)

    w, x = jnp.arange(256.0).reshape(16, 16) / 256, jnp.arange(512.0).reshape(32, 16) / 512
    with caplog.at_level(logging.WARNING, logger="jaxpar"):
        sharded = jaxpar.auto_shard(step, mesh=mesh)
        out = sharded(w, x)
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    np.testing.assert_allclose(np.asarray(out), np.asarray(jax.jit(step)(w, x)), rtol=1e-6)
    program = sharded.plan.program
    puts = [e for e in program.eqns if e.primitive == "device_put"]
    assert [e.params["devices"] for e in puts] == [
        (jax.memory.Space.Host,),
        (jax.memory.Space.Device,),
    ]
    assert [program.tensors[e.outputs[0]].host for e in puts] == [True, False]


def _attention_kernel(q, k, v):
    """One shard's causal attention (what a flash-attention kernel under shard_map computes)."""
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    mask = jnp.tril(jnp.ones(logits.shape[-2:], bool))
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(jnp.where(mask, logits, -1e9), -1), v)


def _sharded_attention_step(mesh, spec):
    """A step whose attention is a kernel under shard_map with a custom VJP, forward and
    backward each a shard_map over the same specs (how flash-attention kernels are wrapped)."""
    from jax.sharding import PartitionSpec as P

    kernel_grad = lambda q, k, v, g: jax.vjp(_attention_kernel, q, k, v)[1](g)
    fwd_map = jax.shard_map(
        _attention_kernel, mesh=mesh, in_specs=(P(*spec),) * 3, out_specs=P(*spec)
    )
    bwd_map = jax.shard_map(
        kernel_grad, mesh=mesh, in_specs=(P(*spec),) * 4, out_specs=(P(*spec),) * 3
    )

    @jax.custom_vjp
    def attend(q, k, v):
        return fwd_map(q, k, v)

    attend.defvjp(lambda q, k, v: (fwd_map(q, k, v), (q, k, v)), lambda res, g: bwd_map(*res, g))
    return _attention_train_step(attend, heads=4)


def _attention_train_step(attend, heads):
    """A train step of one attention layer (q, k, v and output projections ``w[0..3]``) whose
    attention is ``attend(q, k, v)`` over [batch, tokens, heads, head dim]."""

    def step(w, x):
        def loss(w):
            b, t, d = x.shape
            q, k, v = (jnp.tanh(x @ w[i]).reshape(b, t, heads, d // heads) for i in range(3))
            return (attend(q, k, v).reshape(b, t, d) @ w[3]).var()

        value, grad = jax.value_and_grad(loss)(w)
        return w - 0.1 * grad, value

    return step


def _quiet_and_equal(mesh, step, args, caplog):
    """``step`` under the auto plan on ``mesh``: no warning, results equal to the unsharded
    step's (call it under ``jax.enable_x64`` with float64 ``args``); returns the sharded step
    and its predicted collectives against the compiled program's (`verify.fidelity`)."""
    from jaxpar.verify.compiled import fidelity

    with caplog.at_level(logging.WARNING, logger="jaxpar"):
        sharded = jaxpar.auto_shard(step, mesh=mesh)
        out = sharded(*args)
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    want = jax.jit(step)(*args)
    for got, ref in zip(jax.tree.leaves(out), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-10, atol=1e-12)
    return sharded, fidelity(sharded.plan.collectives, sharded.lower(*args).compile())


@pytest.mark.parametrize("spec", [("data", None, "model", None), ("data",), (("data", "model"),)])
def test_shard_map_keeps_its_layouts_and_is_predicted(mesh, caplog, spec):
    """A shard_map (a per-shard attention kernel, forward and backward) keeps the layouts its
    specs name: its operands are read in them and its results come out in them. The
    collectives predicted equal the compiled program's; no warning; equal to the unsharded
    step in float64. Before, it ran replicated: every operand gathered, and the results'
    gathers went unpredicted."""

    step = _sharded_attention_step(mesh, spec)
    rs = np.random.RandomState(0)
    with jax.enable_x64(True):
        w, x = jnp.asarray(rs.randn(4, 32, 32) / 6), jnp.asarray(rs.randn(8, 16, 32))
        sharded, check = _quiet_and_equal(mesh, step, (w, x), caplog)
    assert check.ok() and check.counts_ok(), check.text
    plan = sharded.plan
    nodes = [
        n
        for n in plan.ng.nodes
        if n.anchor >= 0 and plan.program.eqns[n.anchor].primitive == "shard_map"
    ]
    assert len(nodes) == 2  # the kernel and its gradient
    names = plan.mesh_axes.names
    for n in nodes:
        assert len(plan.tables.configs[n.index]) == 1
        eqn = plan.program.eqns[n.anchor]
        first = plan.tensor_specs[eqn.outputs[0]]
        want = eqn.params["out_specs"][0]
        for d, entry in enumerate(want):
            axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
            assert tuple(names[a] for a in first[d]) == axes


def test_shard_maps_the_space_cannot_say_run_replicated_with_a_reason(mesh, caplog):
    """A body that communicates in a loop, and one axis in two combinations: replicated, each
    with its reason, and still equal to the unsharded step."""
    from jax.sharding import PartitionSpec as P

    shift = [(i, (i + 1) % 4) for i in range(4)]
    cases = {
        "communicates inside its body in a way the plan does not price": jax.shard_map(
            lambda a: jax.lax.fori_loop(  # a while loop: runs unknown
                0, jnp.int32(2), lambda i, b: jax.lax.ppermute(b, "model", shift), a
            ),
            mesh=mesh, in_specs=P("data", "model"), out_specs=P("data", "model"),
        ),
        "in different combinations": jax.shard_map(
            lambda a, b: (a * 2, b), mesh=mesh, in_specs=(P("data"), P(("data", "model"))),
            out_specs=(P("data"), P(("data", "model"))),
        ),
    }  # fmt: skip
    # per-device blocks concatenated over both axes that the step returns, or reads itself
    stacked = jax.shard_map(
        lambda a: (a * 2, a * 3), mesh=mesh, in_specs=P("data", "model"),
        out_specs=(P("data", "model"), P(("data", "model"))),
    )  # fmt: skip
    cases["in different combinations (a result)"] = stacked
    cases["in different combinations (read by the step)"] = lambda a: sum(
        o.sum() for o in stacked(a)
    )
    x = jnp.arange(16 * 8, dtype=jnp.float32).reshape(16, 8)
    for why, fn in cases.items():
        f = (lambda a, fn=fn: fn(a, a)) if why == "in different combinations" else fn
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="jaxpar"):
            sharded = jaxpar.auto_shard(f, mesh=mesh)
            out = sharded(x)
        for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(jax.jit(f)(x)), strict=True):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want))
        messages = [r.getMessage() for r in caplog.records if "'shard_map'" in r.getMessage()]
        assert len(messages) == 1 and why.split(" (")[0] in messages[0], (why, messages)


def test_a_shard_map_that_communicates_is_priced_and_predicted(mesh, caplog):
    """Collectives inside a shard_map body are the node's own, fixed like its layouts: a
    hand-written Megatron MLP (column- then row-parallel, a ``psum`` over ``model``), a ring
    shift (``ppermute``), and the ``psum`` over ``data`` JAX's differentiation puts in the
    backward body for the replicated weights' gradients. No warning, equal to the unsharded
    step in float64, and every collective predicted as compiled: kinds, counts (the gradient
    all-reduces of both layers combined into one, as XLA combines them) and bytes. Before, both
    ran replicated."""
    from jax.sharding import PartitionSpec as P

    def mlp_body(x, w1, w2):
        return jax.lax.psum(jax.nn.gelu(x @ w1) @ w2, "model")

    specs = (P("data", None), P(None, "model"), P("model", None))
    mlp = jax.shard_map(mlp_body, mesh=mesh, in_specs=specs, out_specs=P("data", None))
    shift = [(i, (i + 1) % 4) for i in range(4)]
    ring = jax.shard_map(
        lambda a: jax.lax.ppermute(a, "model", shift), mesh=mesh, in_specs=P("data", "model"),
        out_specs=P("data", "model"),
    )  # fmt: skip

    def step(params, x):
        def loss(p):
            h = x
            for w1, w2 in zip(p["w1"], p["w2"], strict=True):  # two layers
                h = h + mlp(h, w1, w2)
            return (ring(jnp.tanh(h)) ** 2).mean()

        value, grad = jax.value_and_grad(loss)(params)
        return jax.tree.map(lambda a, b: a - 0.1 * b, params, grad), value

    rs = np.random.RandomState(0)
    with jax.enable_x64(True):
        params = {
            "w1": jnp.asarray(rs.randn(2, 32, 64) / 6), "w2": jnp.asarray(rs.randn(2, 64, 32) / 6)
        }  # fmt: skip
        x = jnp.asarray(rs.randn(16, 32))
        sharded, check = _quiet_and_equal(mesh, step, (params, x), caplog)
    assert check.relative_error < 1e-9 and check.counts_ok(tolerance=0, slack=0), check.text
    mine = [c for c in sharded.plan.collectives if c.reason == "shard_map"]
    assert [c.kind for c in mine].count("collective-permute") == 2
    # the four backward all-reduces over `data` (two weights, two layers) combine into one
    # group, as compiled: a layer's weight gradients do not hold up the layer below
    grads = [c for c in mine if c.kind == "all-reduce" and c.axes == ("data",)]
    assert len(grads) == 4 and len({c.group for c in grads}) == 1


def _shard_map_nodes(sharded):
    """(node, chosen configuration) of every shard_map of a planned step."""
    plan = sharded.plan
    return [
        (node, plan.config(node.index))
        for node in plan.ng.nodes
        if node.anchor >= 0 and plan.program.eqns[node.anchor].primitive == "shard_map"
    ]


def test_a_differentiated_shard_map_plans_its_automatic_axis_where_dims_pass(mesh, caplog):
    """A hand-written tensor-parallel MLP, manual over ``model`` only (``axis_names``), ``data``
    left to the compiler, differentiated by JAX. Its batch dim reaches the residuals JAX stacks
    per device over ``model``, so ``data`` may not split it; the feature dims pass through the
    bodies (`body_dims`), and with 32 rows of 1,024 features the plan splits one of them over
    ``data`` in the forward and one in the backward shard_map. Only the equations carrying the
    split dim divide their FLOPs (`OpSpace.flop_parts`). No warning; equal to the unsharded
    step in float64; every collective predicted as compiled, the backward body's all-reduce
    over ``data`` (its contraction over the split dim) included. Before, both ran replicated
    over ``data`` with a warning."""
    from jax.sharding import PartitionSpec as P

    from jaxpar.cost.node_costs import node_work

    def mlp_body(x, w1, w2):
        return jax.lax.psum(jax.nn.relu(x @ w1) @ w2, "model")

    specs = (P(), P(None, "model"), P("model", None))
    mlp = jax.shard_map(mlp_body, mesh=mesh, in_specs=specs, out_specs=P(), axis_names={"model"})

    def step(params, x, y):
        grad = jax.grad(lambda p: ((mlp(x, p["w1"], p["w2"]) - y) ** 2).mean())(params)
        return jax.tree.map(lambda a, b: a - 0.1 * b, params, grad)

    rs = np.random.RandomState(0)
    with jax.enable_x64(True):
        w1, w2 = rs.randn(1024, 4096) / 32, rs.randn(4096, 1024) / 64
        params = {"w1": jnp.asarray(w1), "w2": jnp.asarray(w2)}
        x, y = jnp.asarray(rs.randn(32, 1024)), jnp.asarray(rs.randn(32, 1024))
        sharded, check = _quiet_and_equal(mesh, step, (params, x, y), caplog)
    assert check.relative_error < 1e-9 and check.counts_ok(tolerance=0, slack=0), check.text
    found = _shard_map_nodes(sharded)
    assert len(found) == 2
    for node, cfg in found:
        space = node.space
        assert dict(space.manual).keys() == {"model"} and space.automatic_axes == ("data",)
        assert space.automatic and all(space.sizes[d] == 1024 for d in space.automatic)
        assert sum(f for _, f in space.flop_parts) == pytest.approx(space.flops)
        assert cfg[0] in space.automatic  # data splits a feature dim
        work = node_work(sharded.plan.ng, node, [cfg, (-1, *cfg[1:])], sharded.plan.params)
        assert work.flops[1] / 2 < work.flops[0] < work.flops[1]  # a part of its work halves
    assert any(c.reason == "shard_map" and c.axes == ("data",) for c in sharded.plan.collectives)
    assert any(c.reason == "shard_map" and c.axes == ("model",) for c in sharded.plan.collectives)


def test_a_hand_written_kernel_splits_its_batch_over_the_automatic_axis(mesh, caplog):
    """MaxText's kernel pattern: a custom VJP whose forward and backward are shard_maps, manual
    over ``model`` (Megatron's column- then row-parallel MLP, ``psum`` over ``model``), ``data``
    automatic. The batch passes through both bodies, so on 2 P100 nodes with 8,192 rows the plan
    splits it over ``data``: the forward's ``psum`` carries half the rows, and the backward's
    weight-gradient contractions over the split batch end in all-reduces over ``data``, which
    XLA combines into one, as predicted. Each body's work per device halves. Equal to the
    unsharded step in float64."""
    from jaxpar_zoo.kernels import megatron_mlp_step

    from jaxpar.cost.node_costs import node_work
    from jaxpar.verify.compiled import fidelity

    step = megatron_mlp_step(mesh)
    rs = np.random.RandomState(0)
    with jax.enable_x64(True):
        params = {
            "w1": jnp.asarray(rs.randn(256, 1024) / 16), "w2": jnp.asarray(rs.randn(1024, 256) / 32)
        }  # fmt: skip
        x, y = jnp.asarray(rs.randn(8192, 256)), jnp.asarray(rs.randn(8192, 256))
        with caplog.at_level(logging.WARNING, logger="jaxpar"):
            sharded = jaxpar.auto_shard(step, mesh=mesh, cluster="p100")
            out = sharded(params, x, y)
        assert not caplog.records, [r.getMessage() for r in caplog.records]
        assert_equivalent(out, jax.jit(step)(params, x, y), rtol=1e-10)
        check = fidelity(sharded.plan.collectives, sharded.lower(params, x, y).compile())
    assert check.relative_error < 1e-9 and check.counts_ok(tolerance=0, slack=0), check.text
    plan = sharded.plan
    found = _shard_map_nodes(sharded)
    assert len(found) == 2
    for node, cfg in found:
        batch = next(d for d in node.space.automatic if node.space.sizes[d] == 8192)
        assert cfg[0] == batch, (node.space.names, cfg)  # data splits the batch
        work = node_work(plan.ng, node, [cfg, (-1, *cfg[1:])], plan.params)
        # the body's FLOPs halve (an elementwise follower of the node's, unsplit, adds 0.003 %)
        assert work.flops[0] == pytest.approx(work.flops[1] / 2, rel=1e-4)
    data = [c for c in plan.collectives if c.axes == ("data",)]
    assert len(data) == 2 and all(c.reason == "shard_map" for c in data)  # dw1, dw2
    assert len({c.group for c in data}) == 1  # combined, as compiled
    (model,) = [c for c in plan.collectives if c.axes == ("model",)]
    # the forward's psum over 4 devices, of half the rows: 2(n-1)/n of its 4,096 x 256 float64
    assert model.bytes == 1.5 * 8192 // 2 * 256 * 8


def test_a_shard_map_whose_body_blocks_every_dim_warns_about_its_automatic_axes(mesh, caplog):
    """A body that loops over its block (a ``fori_loop``: planned as a whole) passes no dim
    through untouched: ``data`` cannot split it, and the one warning says so. Still equal."""
    from jax.sharding import PartitionSpec as P

    body = jax.shard_map(
        lambda a: jax.lax.fori_loop(0, 3, lambda i, b: b * 2.0 + 1.0, a), mesh=mesh,
        in_specs=P(None, "model"), out_specs=P(None, "model"), axis_names={"model"},
    )  # fmt: skip
    x = jnp.arange(16 * 8, dtype=jnp.float32).reshape(16, 8)
    with caplog.at_level(logging.WARNING, logger="jaxpar"):
        sharded = jaxpar.auto_shard(body, mesh=mesh)
        out = sharded(x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(jax.jit(body)(x)))
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1, messages
    assert "leaves mesh axes ['data'] automatic" in messages[0]
    assert "no dim of its operands or results passes through the body untouched" in messages[0]
    ((node, cfg),) = _shard_map_nodes(sharded)
    assert not node.space.automatic and cfg[0] == -1


@pytest.mark.closed_form
def test_body_dims_follow_what_a_split_passes_through():
    """`body_dims` on a body with a call (``jnp.einsum``), a transpose, a reduce_max and a
    reshape merging dims: the batch dim (8) reaches both results and is free; the contracted
    dim (6) and the sequence dim (4) reach the reshape, which merges them, so they are
    blocked; the einsum's output features (5) end in a reduce_max, an all-reduce of its result
    over the axes that split them."""
    from jax.sharding import PartitionSpec as P

    from jaxpar.rules.shard_map_body import body_dims

    def body(x, w):
        h = jnp.einsum("bsd,de->bse", x, w)
        m = jnp.transpose(h, (1, 0, 2)).max(axis=2)
        return m, x.reshape(8, 24).sum(1)

    jaxpr = jax.make_jaxpr(body)(jnp.ones((8, 4, 6)), jnp.ones((6, 5))).jaxpr
    dims = body_dims(jaxpr, (P(), P()), (P(), P()), (False, False), (False, False))
    assert dims.sizes == (8, 5)
    assert dims.invars == ((0, None, None), (None, 1))
    assert dims.outvars == ((None, 0), (0,))
    ((reduction,),) = [[r for r in dims.reductions if r.op == "max"]]
    assert reduction.dim == 1 and tuple(reduction.value.aval.shape) == (4, 8)
    # a manual axis blocks what it splits: the batch, named on x's dim 0
    manual = body_dims(jaxpr, (P("model"), P()), (P(None, "model"), P("model")), (False,) * 2,
                       (False,) * 2)  # fmt: skip
    assert manual.sizes == (5,)


def _differentiated_attention_step(mesh, spec):
    """A step whose attention kernel is a shard_map that JAX differentiates (MaxText's pattern:
    no custom VJP), which splits it into a forward and a backward shard_map with residuals
    between them, each device's block concatenated over both axes."""
    from jax.sharding import PartitionSpec as P

    attend = jax.shard_map(
        _attention_kernel, mesh=mesh, in_specs=(P(*spec),) * 3, out_specs=P(*spec)
    )
    return _attention_train_step(attend, heads=8)


@pytest.mark.parametrize(
    "spec, stacked", [(("data", None, "model", None), True), ((("data", "model"),), False)]
)
def test_a_differentiated_shard_map_keeps_its_residuals_where_they_are(mesh, caplog, spec, stacked):
    """JAX's residuals of a differentiated shard_map (each device's block, concatenated over
    ``("data", "model")``) are planned as one device's block held on every device, and
    neither constrained nor resharded: no warning, equal to the unsharded step in float64, the
    predicted collectives equal the compiled program's, and the peak it predicts (the
    kernels' bodies' own buffers included) is within the memory model's band of the compiled
    one. Before, both shard_maps ran replicated with a warning. (Split over ``("data",
    "model")`` everywhere, the residuals are ordinary tensors of that layout.)"""
    from test_memory import FIDELITY_BAND

    from jaxpar.verify.compiled import compiled_peak_bytes

    step = _differentiated_attention_step(mesh, spec)
    rs = np.random.RandomState(0)
    with jax.enable_x64(True):
        w, x = jnp.asarray(rs.randn(4, 64, 64) / 8), jnp.asarray(rs.randn(8, 16, 64))
        sharded, check = _quiet_and_equal(mesh, step, (w, x), caplog)
    assert check.ok() and check.counts_ok(), check.text
    program = sharded.plan.program
    maps = [e for e in program.eqns if e.primitive == "shard_map"]
    assert len(maps) == 2
    stacks = [t for t in maps[0].outputs if program.tensors[t].hand_split]
    assert bool(stacks) == stacked and all(t in maps[1].inputs for t in stacks)
    for t in stacks:  # each one device's block: 8 of them make the residual JAX stacks
        assert program.tensors[t].hand_split == ("data", "model")
        assert sharded.plan.tensor_specs[t] == ((),) * len(program.tensors[t].shape)
    # at a size where the kernel's own buffers are most of the peak, in float32
    big = _differentiated_attention_step(mesh, spec)
    w = jax.ShapeDtypeStruct((4, 256, 256), jnp.float32)
    x = jax.ShapeDtypeStruct((16, 512, 256), jnp.float32)
    sharded = jaxpar.auto_shard(big, mesh=mesh)
    compiled = sharded.lower(w, x).compile()
    ratio = sharded.plan.memory.peak / compiled_peak_bytes(compiled)
    assert FIDELITY_BAND[0] <= ratio <= FIDELITY_BAND[1], ratio


@pytest.mark.parametrize("remat", [False, True])
def test_a_differentiated_shard_map_in_scanned_layers(mesh, caplog, remat):
    """Scanned layers around a differentiated shard_map: JAX stacks the residuals as the
    forward loop's ys (each iteration's per-device blocks) and slices them in the backward
    loop, and with remat it hoists the ones that depend on no operand out of the loop into a
    shard_map of their own. Every such tensor is planned as a per-device stack: no warning,
    equal to the unsharded step in float64, collectives as compiled."""
    from jax.sharding import PartitionSpec as P

    spec = P("data", None, "model", None)
    attend = jax.shard_map(_attention_kernel, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)

    def layer(h, w):
        b, t, d = h.shape
        q, k, v = (jnp.tanh(h @ w[i]).reshape(b, t, 4, d // 4) for i in range(3))
        return h + attend(q, k, v).reshape(b, t, d) @ w[3], None

    def step(w, x):
        def loss(w):
            return jax.lax.scan(jax.checkpoint(layer) if remat else layer, x, w)[0].var()

        value, grad = jax.value_and_grad(loss)(w)
        return w - 0.1 * grad, value

    rs = np.random.RandomState(0)
    with jax.enable_x64(True):
        w, x = jnp.asarray(rs.randn(3, 4, 32, 32) / 6), jnp.asarray(rs.randn(8, 16, 32))
        sharded, check = _quiet_and_equal(mesh, step, (w, x), caplog)
    assert check.ok() and check.counts_ok(), check.text
    program = sharded.plan.program
    stacks = [t for t in program.tensors if t.hand_split]
    layered = [t for t in stacks if len(t.shape) == 5]  # the ys: layers ahead of the block
    assert stacks and bool(layered) != remat and all(t.shape[0] == 3 for t in layered)


def test_a_shard_map_over_axes_the_planning_mesh_lacks_is_an_error(mesh):
    step = _sharded_attention_step(mesh, ("data",))
    x = jax.ShapeDtypeStruct((8, 16, 32), jnp.float32)
    w = jax.ShapeDtypeStruct((4, 32, 32), jnp.float32)
    with pytest.raises(ValueError, match=r"names mesh axes \['data'\] that the planning mesh"):
        jaxpar.plan(step, w, x, mesh={"x": 2, "model": 4})


def test_tiled_dims_stay_whole_and_the_rest_follow(mesh, caplog):
    """``jnp.tile`` (the ``tile`` primitive) ran replicated; now the tiled dim stays whole and
    the others follow the operand."""

    def f(x):
        return jnp.tile(jnp.tanh(x), (1, 3)) * 2.0

    x = jnp.arange(16 * 8, dtype=jnp.float32).reshape(16, 8) / 64
    with caplog.at_level(logging.WARNING, logger="jaxpar"):
        step = jaxpar.auto_shard(f, mesh=mesh, strategy="data")
        out = step(x)
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    np.testing.assert_allclose(np.asarray(out), np.asarray(jax.jit(f)(x)), rtol=1e-6)
    (space,) = _spaces(step, "tile")
    assert space.splittable == (True, False) and space.in_maps == ((0, None),)


def test_scatter_add_still_splits_scattered_dims(mesh):
    def seg(data, ids):
        return jax.ops.segment_sum(data, ids, num_segments=4)

    data = jnp.arange(32.0).reshape(16, 2)
    ids = jnp.arange(16) % 4
    step = jaxpar.auto_shard(seg, mesh=mesh)
    np.testing.assert_allclose(np.asarray(step(data, ids)), np.asarray(jax.jit(seg)(data, ids)))
    (space,) = _spaces(step, "scatter-add")
    assert any(space.splittable[d] for d in range(2, len(space.sizes)))  # partial sums allowed


@pytest.mark.api
def test_loops_warn_once_naming_the_layer(mesh, caplog):
    import flax.linen as nn

    class Cumulative(nn.Module):
        @nn.compact
        def __call__(self, x):
            # a while loop whose trip count depends on the values is not planned inside
            def grow(c):
                return jax.lax.while_loop(lambda c: c.sum() < 1e4, lambda c: c * 2 + x[0], c)

            c = grow(x[1])
            return c.sum() + grow(c + 1).sum()

    model = Cumulative()
    x = jnp.arange(64.0).reshape(8, 8)
    params = model.init(jax.random.key(0), x)
    f = lambda p, x: model.apply(p, x)
    with caplog.at_level(logging.WARNING, logger="jaxpar"):
        step = jaxpar.auto_shard(f, mesh=mesh)
        out = step(params, x)
    np.testing.assert_allclose(np.asarray(out), np.asarray(jax.jit(f)(params, x)))
    messages = [r.getMessage() for r in caplog.records if "'while'" in r.getMessage()]
    assert len(messages) == 1, messages  # two loops, one warning per planning run
    assert "Cumulative" in messages[0] and "replicated" in messages[0]


@pytest.mark.api
def test_checkpoint_names_are_identities(mesh, caplog):
    """`checkpoint_name` (how MaxText marks what a remat policy saves) is an identity once JAX
    has applied the policy: it makes no node and no warning. Before, it ran replicated, and a
    data-parallel step gathered the named activation on every device."""
    from jax.ad_checkpoint import checkpoint_name

    def step(w, x):
        def loss(w):
            h = checkpoint_name(jnp.tanh(x @ w["a"]), "hidden")
            return (jnp.tanh(h @ w["b"]) ** 2).mean()

        policy = jax.checkpoint_policies.save_only_these_names("hidden")
        return jax.tree.map(
            lambda p, g: p - 0.1 * g, w, jax.grad(jax.checkpoint(loss, policy=policy))(w)
        )

    rs = np.random.RandomState(0)
    w = {"a": jnp.asarray(rs.randn(32, 64) / 8), "b": jnp.asarray(rs.randn(64, 16) / 8)}
    x = jnp.asarray(rs.randn(64, 32))
    with caplog.at_level(logging.WARNING, logger="jaxpar"):
        sharded = jaxpar.auto_shard(step, mesh=mesh, strategy="data")
        out = sharded(w, x)
    assert not [r for r in caplog.records if "'name'" in r.getMessage()]
    primitives = {e.primitive for e in sharded.plan.program.eqns}
    # nor the full-precision reduce_precision the policy puts on the saved name (XLA removes it)
    assert "name" not in primitives and "reduce_precision" not in primitives
    for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(jax.jit(step)(w, x)), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
    hlo = sharded.lower(w, x).compile().as_text()
    assert "all-gather" not in hlo and "all-reduce" in hlo  # gradients reduced, nothing gathered


@pytest.mark.numerics
def test_a_composite_is_planned_as_its_decomposition(mesh, caplog):
    """`jax.lax.composite` (a named op with its decomposition; a metric here, as it has no
    JVP) is inlined, as XLA inlines it: no warning, its equations planned, equal results."""
    from functools import partial

    @partial(jax.lax.composite, name="jaxpar.test.tanh_gelu")
    def gelu(x):
        return 0.5 * x * (1 + jnp.tanh(0.79788456 * (x + 0.044715 * x**3)))

    def step(w, x):
        g = jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
        return w - 0.1 * g, jnp.mean(gelu(x @ w))

    rs = np.random.RandomState(0)
    w, x = jnp.asarray(rs.randn(32, 64) / 8), jnp.asarray(rs.randn(64, 32))
    with caplog.at_level(logging.WARNING, logger="jaxpar"):
        sharded = jaxpar.auto_shard(step, mesh=mesh, strategy="data")
        out = sharded(w, x)
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    primitives = [e.primitive for e in sharded.plan.program.eqns]
    assert "composite" not in primitives and "tanh" in primitives
    for got, want in zip(out, jax.jit(step)(w, x), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


@pytest.mark.numerics
def test_a_platform_dependent_branch_index_plans_without_a_warning(mesh, caplog):
    """`lax.platform_dependent` (how `jnp` code picks a Pallas kernel or a fallback) adds a
    `platform_index` equation: a scalar with no operands, replicated by its rule, not an
    unknown primitive with a "runs replicated" warning. The cond it selects is planned."""

    def step(w, x):
        act = lambda h: jax.lax.platform_dependent(h, cpu=jnp.tanh, default=jnp.sin)
        g = jax.grad(lambda w: jnp.mean(act(x @ w) ** 2))(w)
        return w - 0.1 * g

    rs = np.random.RandomState(0)
    w, x = jnp.asarray(rs.randn(32, 64) / 8), jnp.asarray(rs.randn(64, 32))
    with caplog.at_level(logging.WARNING, logger="jaxpar"):
        sharded = jaxpar.auto_shard(step, mesh=mesh, strategy="data")
        out = sharded(w, x)
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    assert "platform_index" in [e.primitive for e in sharded.plan.program.eqns]
    np.testing.assert_allclose(np.asarray(out), np.asarray(jax.jit(step)(w, x)), rtol=1e-5)


@pytest.mark.closed_form
def test_reduce_precision_that_drops_bits_stays():
    """Only a `reduce_precision` that keeps every bit of its type is the identity: one to
    bfloat16's bits on a float32 value rounds it, and stays in the program."""
    from jaxpar.trace.tracing import trace

    def step(x):
        full = jax.lax.reduce_precision(x, exponent_bits=8, mantissa_bits=23)
        return jax.lax.reduce_precision(full * 3.0, exponent_bits=8, mantissa_bits=7)

    program, _ = trace(step, (jnp.ones((4, 4), jnp.float32),))
    kept = [e for e in program.eqns if e.primitive == "reduce_precision"]
    assert len(kept) == 1 and kept[0].params["mantissa_bits"] == 7
    mul = next(e for e in program.eqns if e.primitive == "mul")
    assert mul.inputs[0] == program.invars[0]  # the identity's result is its operand


class _DropoutMLP:
    """A linen MLP with dropout on its hidden and output activations, and its Adam step."""

    def __init__(self):
        import flax.linen as nn
        import optax

        class MLP(nn.Module):
            @nn.compact
            def __call__(self, x):
                h = nn.Dropout(0.25, deterministic=False)(nn.relu(nn.Dense(1024)(x)))
                return nn.Dropout(0.5, deterministic=False)(nn.Dense(64)(h))

        self.model, self.tx = MLP(), optax.adam(1e-2)

    def step(self, params, opt, x, key):
        import optax

        def loss(p):
            out = self.model.apply({"params": p}, x, rngs={"dropout": key})
            return (out**2).mean()

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt = self.tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, value

    def args(self, key_impl=None):
        x = jnp.cos(jnp.arange(512 * 256, dtype=jnp.float32)).reshape(512, 256)
        params = self.model.init(jax.random.key(1), x)["params"]
        return params, self.tx.init(params), x, jax.random.key(7, impl=key_impl)


@pytest.mark.parametrize("shape", [(8,), (2, 4), (2, 2, 2)])
def test_dropout_draws_its_bits_sharded_and_keeps_the_numbers(shape, caplog):
    """Threefry bits are partitionable (each from the key and its index): the plan splits
    dropout's draws with the batch, the sharded step equals the unsharded one, nothing warns."""
    m = _DropoutMLP()
    args = m.args()
    mesh = jaxpar.make_mesh(dict(zip(("a", "b", "c"), shape, strict=False)))
    with caplog.at_level(logging.WARNING, logger="jaxpar"):
        step = jaxpar.auto_shard(m.step, mesh=mesh)
        out = step(*args)
    assert not [r for r in caplog.records if "random_bits" in r.getMessage()]
    ref = jax.jit(m.step)(*args)
    assert_equivalent(out, ref)
    plan = step.plan
    draws = [e for e in plan.program.eqns if e.primitive == "random_bits"]
    assert len(draws) == 2 and not any(s.replicated for s in _spaces(step, "random_bits"))
    hidden = max(draws, key=lambda e: plan.program.tensors[e.outputs[0]].size)
    assert any(plan.tensor_specs[hidden.outputs[0]]), "the hidden layer's bits drawn whole"


def test_dropout_masks_are_bit_identical_when_sharded(mesh):
    def masked(x, key):
        keep = jax.random.bernoulli(key, 0.5, x.shape)
        return jnp.where(keep, x * 2.0, 0.0)

    x = jnp.arange(32 * 64, dtype=jnp.float32).reshape(32, 64)
    key = jax.random.key(3)
    step = jaxpar.auto_shard(masked, mesh=mesh)
    out = step(x, key)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(jax.jit(masked)(x, key)))
    (draw,) = [e for e in step.plan.program.eqns if e.primitive == "random_bits"]
    assert any(step.plan.tensor_specs[draw.outputs[0]])  # drawn in shards


@pytest.mark.api
def test_random_bits_of_an_rbg_key_run_replicated_with_one_warning(mesh, caplog):
    """XLA does not partition rng_bit_generator: an rbg key's draws stay replicated, and the
    warning says why."""
    m = _DropoutMLP()
    args = m.args(key_impl="rbg")
    with caplog.at_level(logging.WARNING, logger="jaxpar"):
        step = jaxpar.auto_shard(m.step, mesh=mesh)
        out = step(*args)
    messages = [r.getMessage() for r in caplog.records if "'random_bits'" in r.getMessage()]
    assert len(messages) == 1, messages  # two draws, one warning
    assert "key<rbg>" in messages[0] and "jax_threefry_partitionable" in messages[0]
    assert all(s.replicated for s in _spaces(step, "random_bits"))
    ref = jax.jit(m.step)(*args)
    assert_equivalent(out, ref)


def test_gamma_draws_run_replicated_with_the_reason(mesh, caplog):
    """Mixup's weights (``jax.random.beta``: two gamma draws by rejection) run replicated with
    one warning that says why (split, each rejection loop would all-reduce its flag on every
    iteration); the rest of the step is planned; equal to the unsharded step, bit for bit."""

    def step(x, key):
        lam = jax.random.beta(key, 0.4, 0.4, (x.shape[0],))[:, None]
        return jnp.tanh(3 * (lam * x + (1 - lam) * x[::-1]))

    x = jnp.arange(256 * 64, dtype=jnp.float32).reshape(256, 64) / 2**14
    with caplog.at_level(logging.WARNING, logger="jaxpar"):
        sharded = jaxpar.auto_shard(step, mesh=mesh)
        out = sharded(x, jax.random.key(0))
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "'random_gamma'" in messages[0], messages  # two draws
    assert "rejection" in messages[0] and "all-reduces" in messages[0]
    spaces = _spaces(sharded, "random_gamma")
    assert len(spaces) == 2 and all(s.replicated for s in spaces)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(jax.jit(step)(x, jax.random.key(0))))


def test_top_k_splits_every_dim_but_its_axis(mesh):
    """A mixture of experts' routing: top-k over the experts, per token."""

    def route(x, w):
        scores = jnp.einsum("btd,de->bte", x, w)
        values, experts = jax.lax.top_k(scores, 2)
        return jax.nn.softmax(values, axis=-1) * experts.astype(jnp.float32)

    x = jnp.arange(8 * 16 * 32, dtype=jnp.float32).reshape(8, 16, 32) / 4096
    w = jnp.cos(jnp.arange(32 * 8, dtype=jnp.float32)).reshape(32, 8)
    step = jaxpar.auto_shard(route, mesh=mesh)
    np.testing.assert_allclose(np.asarray(step(x, w)), np.asarray(jax.jit(route)(x, w)), 1e-5)
    (space,) = _spaces(step, "top_k")
    assert space.sizes == (8, 16, 2) and space.splittable == (True, True, False)
    assert space.in_maps == ((0, 1, None),) and len(space.out_maps) == 2


def test_dropout_inside_a_scanned_stack_is_drawn_in_shards(mesh):
    """`nn.scan` over blocks with dropout (``split_rngs`` for it, as production stacks do):
    the draw is planned inside the loop body, split, and the step equals the unsharded one."""
    import flax.linen as nn
    import optax

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, _):
            h = nn.Dropout(0.1, deterministic=False)(nn.gelu(nn.Dense(256)(nn.LayerNorm()(x))))
            return x + nn.Dense(64)(h), None

    class Stack(nn.Module):
        @nn.compact
        def __call__(self, x):
            layers = nn.scan(
                Block, variable_axes={"params": 0}, length=4,
                split_rngs={"params": True, "dropout": True},
            )  # fmt: skip
            return layers()(x, None)[0].mean()

    model, tx = Stack(), optax.adam(1e-3)
    x = jnp.cos(jnp.arange(64 * 32 * 64, dtype=jnp.float32)).reshape(64, 32, 64)
    params = model.init({"params": jax.random.key(1), "dropout": jax.random.key(2)}, x)["params"]

    def step(params, opt, x, key):
        def loss(p):
            return model.apply({"params": p}, x, rngs={"dropout": key}) ** 2

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, value

    args = (params, tx.init(params), x, jax.random.key(0))
    sharded = jaxpar.auto_shard(step, mesh=mesh)
    assert_equivalent(sharded(*args), jax.jit(step)(*args))
    plan = sharded.plan
    (draw,) = [e for e in plan.program.eqns if e.primitive == "random_bits"]
    assert draw.region >= 0 and plan.program.regions[draw.region].trips == 4  # in the body
    assert any(plan.tensor_specs[draw.outputs[0]])


def _ragged_space(shapes, dimension_numbers):
    """The space of one ``ragged_dot_general`` of operands of ``shapes`` (the last: group sizes)."""
    from jaxpar.trace.tracing import trace

    def f(lhs, rhs, sizes):
        return jax.lax.ragged_dot_general(lhs, rhs, sizes, dimension_numbers)

    args = [jnp.ones(s, jnp.int32 if i == 2 else jnp.float32) for i, s in enumerate(shapes)]
    program, _ = trace(f, tuple(args))
    (eqn,) = [e for e in program.eqns if e.primitive == "ragged_dot_general"]
    return space_of(eqn, program)


def test_ragged_dot_splits_every_dim_but_the_ragged_and_group_dims():
    """The three modes of a grouped matmul (XLA's partitioner replicates the ragged dim and the
    group dim); FLOPs are a native kernel's: each row meets one group's matrix."""
    numbers = jax.lax.RaggedDotDimensionNumbers
    # forward: lhs[m=16, k=8] x rhs[g=4, k, n=12] -> [m, n]; rhs's group dim is no iteration dim
    fwd = _ragged_space(((16, 8), (4, 8, 12), (4,)), numbers((((1,), (1,)), ((), ())), (0,), (0,)))
    assert fwd.sizes == (16, 12, 8) and fwd.splittable == (False, True, True)
    assert fwd.in_maps == ((0, 2), (None, 2, 1), (None,)) and fwd.out_maps == ((0, 1),)
    assert fwd.reduce_dims == (2,) and fwd.flops == 2.0 * 16 * 12 * 8
    # weight gradient: lhs[m, k] x e[m, n] -> [g, k, n], the ragged dim contracted
    grad = _ragged_space(((16, 8), (16, 12), (4,)), numbers((((0,), (0,)), ((), ())), (0,), ()))
    assert grad.sizes == (8, 12, 16, 4) and grad.splittable == (True, True, False, False)
    assert grad.out_maps == ((3, 0, 1),) and grad.flops == 2.0 * 8 * 12 * 16
    # ragged batch: a batched dot whose batch dim is ragged
    batch = _ragged_space(
        ((16, 8, 5), (16, 5, 7), (4,)), numbers((((2,), (1,)), ((0,), (0,))), (0,), ())
    )
    assert batch.sizes == (16, 8, 7, 5) and batch.splittable == (False, True, True, True)


class _RaggedMoE:
    """The zoo's dropless mixture of experts (`jaxpar_zoo.llama.MixtureOfExperts`: top-2 routing,
    tokens sorted by expert, grouped matmuls, ``bincount`` rows per expert) on its own, and its
    Adam step (float64)."""

    experts, width, hidden, tokens = 4, 64, 256, 512

    def __init__(self):
        import optax
        from jaxpar_zoo.llama import MixtureOfExperts

        kw = {"dtype": jnp.float64, "param_dtype": jnp.float64}
        self.model = MixtureOfExperts(self.experts, 2, self.hidden, **kw)
        self.tx = optax.adam(1e-3)

    def step(self, params, opt, x):
        import optax

        def loss(p):
            return (self.model.apply({"params": p}, x) ** 2).mean()

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt = self.tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, value

    def args(self):
        n = self.tokens * self.width
        x = jnp.cos(jnp.arange(n, dtype=jnp.float64)).reshape(self.tokens, self.width)
        params = self.model.init(jax.random.key(0), x)["params"]
        return params, self.tx.init(params), x


@pytest.mark.parametrize("shape", [(8,), (2, 4), (2, 2, 2)])
def test_grouped_matmul_moe_shards_its_experts_and_keeps_the_numbers(shape, caplog):
    """A ragged_dot MoE's step: nothing falls back to replicated, the expert weights are split
    (over their hidden or model dim: the tokens' ragged dim cannot be), the step equals the
    unsharded one in float64, and the compiled collectives are the predicted ones."""
    from helpers import assert_fidelity

    moe = _RaggedMoE()
    mesh = jaxpar.make_mesh(dict(zip(("a", "b", "c"), shape, strict=False)))
    with jax.enable_x64(True):
        args = moe.args()
        with caplog.at_level(logging.WARNING, logger="jaxpar"):
            step = jaxpar.auto_shard(moe.step, mesh=mesh)
            out = step(*args)
        assert not [r for r in caplog.records if "replicated" in r.getMessage()]
        assert_equivalent(out, jax.jit(moe.step)(*args), rtol=1e-12)
        plan = step.plan
        dots = [e for e in plan.program.eqns if e.primitive == "ragged_dot_general"]
        # gate, up and down forward; down's input gradient; the three weight gradients
        assert len(dots) == 7
        paths = zip(plan.program.invars, plan.program.invar_paths, strict=True)
        names = ("['gate']", "['up']", "['down']")
        experts = [t for t, p in paths if p.endswith(names)]  # the parameters, then Adam's
        assert len(experts) == 9 and all(any(plan.tensor_specs[t]) for t in experts[:3])
        assert_fidelity(plan, step.lower(*args).compile())
