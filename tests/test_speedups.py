"""Planning speed-ups that must not change any result."""

import dataclasses
import random

import pytest

from jaxpar.hardware import Cluster
from jaxpar.hardware.mesh_model import mesh_axes
from jaxpar.xla.reshard_paths import _reshard_linear, reshard_linear


def _random_spec(rng: random.Random, rank: int, axes: int):
    dims = [[] for _ in range(rank)]
    for a in rng.sample(range(axes), axes):
        d = rng.randrange(rank + 1)
        if d < rank:
            dims[d].append(a)
    return tuple(tuple(x) for x in dims)


@pytest.mark.closed_form
@pytest.mark.parametrize("objective", ["time", "comm"])
def test_reshard_cost_ignores_dims_whole_in_both_layouts(objective):
    """`reshard_linear` drops dims unsharded in both layouts before pricing (one cache entry for
    many ranks); the price is the one of the full layouts."""
    mesh = mesh_axes(Cluster.preset("dgx-h100", devices=64), ("a", "b", "c"), (4, 2, 8), None)
    rng = random.Random(0)
    for _ in range(3000):
        rank = rng.randint(1, 5)
        src, dst = _random_spec(rng, rank, 3), _random_spec(rng, rank, 3)
        assert reshard_linear(src, dst, mesh, objective) == pytest.approx(
            _reshard_linear(src, dst, mesh, objective), rel=1e-12, abs=1e-18
        )


def _mesh4():
    return mesh_axes(
        Cluster.preset("dgx-h100", devices=64), ("a", "b", "c", "d"), (2, 4, 2, 4), None
    )


@pytest.mark.closed_form
@pytest.mark.parametrize("gathers_free", [False, True])
@pytest.mark.parametrize("objective", ["time", "comm"])
def test_walk_matches_reshard_path_exactly(objective, gathers_free):
    """`_walk_linear` (no Step objects) and `_walk_batch` (numpy, many pairs) give the very
    floats of `_reshard_linear`, also for layouts not in mesh order and on size-1 axes; with
    ``gathers_free``, those of a uniform tensor's paths (its all-to-alls only: `_walk_batch`
    prices both from one walk)."""
    import numpy as np

    from jaxpar.cost.reshard_tables import LinearTables, _walk_batch, _walk_linear

    rng = random.Random(1)
    for mesh in (
        _mesh4(),
        mesh_axes(Cluster.preset("p100", devices=8), ("x", "y", "z"), (2, 1, 4), None),
    ):
        comm = objective == "comm"
        for _ in range(2000):
            rank = rng.randint(0, 5)
            src, dst = (
                _random_spec(rng, rank, len(mesh.sizes)),
                _random_spec(rng, rank, len(mesh.sizes)),
            )
            walked = _walk_linear(src, dst, mesh.sizes, mesh, comm, gathers_free)
            assert walked == _reshard_linear.__wrapped__(src, dst, mesh, objective, gathers_free)
        table = LinearTables(mesh, objective)
        for rank in (1, 3, 4):
            n = (rank + 1) ** len(mesh.sizes)
            s = np.array([rng.randrange(n) for _ in range(3000)])
            t = np.array([rng.randrange(n) for _ in range(3000)])
            ones = np.ones(len(s), dtype=np.int64)
            plain, free = _walk_batch(s, t, rank, mesh, comm, ones)  # one walk, both prices
            fixed, per_byte = free if gathers_free else plain
            for i in range(len(s)):
                a, b = table._layout(int(s[i]), rank), table._layout(int(t[i]), rank)
                want = _reshard_linear(a, b, mesh, objective, gathers_free)
                assert (fixed[i], per_byte[i]) == tuple(map(float, want))


@pytest.mark.closed_form
@pytest.mark.parametrize("gathers_free", [False, True])
@pytest.mark.parametrize("objective", ["time", "comm"])
def test_dense_reshard_patterns_equal_pair_by_pair(objective, gathers_free):
    """`LinearTables.pattern` (dense per-rank tables; pairs reduced by `_canonical` and walked
    in one batch) equals `reshard_linear` of every pair of a node's layouts, bit for bit (also
    with ``gathers_free``), when the table of the other ``gathers_free`` has walked the pairs
    first and this one reads its walks (`Walked`, as `linear_tables` shares them)."""
    import itertools

    from jaxpar.cost.reshard_tables import WALK_BATCH, LinearTables, Walked
    from jaxpar.nodes.configs import spec_of

    mesh = _mesh4()
    walked = Walked()
    other = LinearTables(mesh, objective, not gathers_free, walked)
    table = LinearTables(mesh, objective, gathers_free, walked)
    cfgs = list(itertools.product(range(-1, 5), repeat=4))
    for src_map, dst_map in [
        ((0, 1, 2, 3), (1, 0, 3, None)),
        ((0, None, 2, 3, 4), (4, 3, 2, None, 0)),
    ]:
        src = list(dict.fromkeys(spec_of(src_map, c) for c in cfgs))
        dst = list(dict.fromkeys(spec_of(dst_map, c) for c in cfgs))
        assert len(src) * len(dst) >= WALK_BATCH
        other.pattern(src, dst)
        known = len(walked.keys)
        fixed, per_byte = table.pattern(src, dst)
        assert len(walked.keys) == known  # nothing walked again
        for i, a in enumerate(src):
            for jj in range(0, len(dst), max(1, len(dst) // 40)):
                b = dst[jj]
                assert (fixed[i, jj], per_byte[i, jj]) == tuple(
                    map(float, reshard_linear(a, b, mesh, objective, gathers_free))
                )


@pytest.mark.golden
@pytest.mark.parametrize("objective", ["time", "comm"])
def test_shared_collective_prices_equal_each_nodes_own(objective):
    """`build_tables` prices a node's own collectives once for all nodes alike
    (`cost.own_comm_costs`' memo): every unary table equals the one priced node by node,
    bit for bit, on a transformer (alike layers) and a CNN (halo nodes, never shared)."""
    import jaxpar_zoo as zoo
    import numpy as np

    import jaxpar
    from jaxpar.cost.search_tables import node_tables

    for name, mesh in (("gpt_small", {"data": 2, "model": 4}), ("cnn", {"a": 2, "b": 2, "c": 2})):
        ex = zoo.get(name, small=True)
        plan = jaxpar.plan(
            ex.step, *ex.args, mesh=mesh, cluster="p100", objective=objective, memory_budget=None
        )
        shared = 0
        for node, cfgs, unary in zip(
            plan.ng.nodes, plan.tables.configs, plan.tables.problem.unary, strict=True
        ):
            own = node_tables(plan.ng, node, cfgs, plan.params)[2]
            assert np.array_equal(own, unary), (name, node.index)
            shared += node.anchor >= 0 and not node.space.halo
        assert shared > 50


@pytest.mark.golden
def test_read_diagonals_and_shared_tied_tables_equal_the_full_ones():
    """Two shortcuts give the same floats as what they replace, on an unrolled GPT over a
    three-axis mesh: `ReshardTables.diagonal` of a read by the node making the tensor equals
    the diagonal of its full table (built after, in a fresh cache), and `Tying.reduce` reusing
    the tied tables of a problem with the same edges (`Tying.reduce_tables`) equals reducing
    from scratch, for other unary tables too (the combined-sync candidate's)."""
    import jaxpar_zoo as zoo
    import numpy as np

    import jaxpar
    from jaxpar.cost.search_tables import ReshardTables
    from jaxpar.nodes.repeated_blocks import find_repeats

    ex = zoo.get("gpt_small", small=True)
    plan = jaxpar.plan(ex.step, *ex.args, mesh={"a": 2, "b": 2, "c": 2}, cluster="p100")
    tables = plan.tables
    fresh = ReshardTables(plan.ng, tables.configs, plan.params)
    own = [u for u in tables.uses if u.src == u.dst]  # all read as made: zero diagonals
    # and reads of each node's own 2-D tensors with their dims swapped, which move bytes
    swapped = [
        dataclasses.replace(u, dst_map=u.src_map[::-1])
        for u in tables.uses
        if u.src != u.dst and len(u.src_map) == 2 and len(set(u.src_map)) == 2
    ]
    swapped = [dataclasses.replace(u, dst=u.src) for u in swapped]
    diagonals = [fresh.diagonal(u) for u in own + swapped]
    assert len(own) > 50 and sum(d.any() for d in diagonals) > 5
    for use, diagonal in zip(own + swapped, diagonals, strict=True):
        assert np.array_equal(diagonal, np.diag(fresh.table(use)))
    tying = find_repeats(plan.ng, tables.configs, plan.labels, 0)
    assert tying is not None and tying.tied_nodes > 100
    shared = tying.reduce_tables(tables.problem)
    rng = np.random.default_rng(0)
    for unary in (tables.problem.unary, [u + rng.random(len(u)) for u in tables.problem.unary]):
        problem = dataclasses.replace(tables.problem, unary=list(unary))
        fast, full = tying.reduce(problem, shared), tying.reduce(problem)
        assert all(np.array_equal(a, b) for a, b in zip(fast.unary, full.unary, strict=True))
        assert fast.edges.keys() == full.edges.keys() and fast.blocks == full.blocks
        assert all(np.array_equal(fast.edges[k], full.edges[k]) for k in full.edges)
        assert fast.factors.keys() == full.factors.keys()
        assert all(np.array_equal(fast.factors[k], full.factors[k]) for k in full.factors)


@pytest.mark.golden
def test_combined_sync_savings_shared_by_alike_nodes_equal_each_nodes_own():
    """`combined_sync_problem` prices the latency a layer's copies save once for nodes alike:
    every unary table equals the one priced node by node (`tables._latency_saved`), bit for
    bit, on a GPT over three mesh axes; some nodes save."""
    import jaxpar_zoo as zoo
    import numpy as np

    import jaxpar
    from jaxpar.cost.search_tables import _latency_saved, combined_sync_problem
    from jaxpar.program.graph import BACKWARD

    ex = zoo.get("gpt_small", small=True)
    plan = jaxpar.plan(ex.step, *ex.args, mesh={"a": 2, "b": 2, "c": 2}, cluster="dgx-h100")
    ctx = plan.eval_context()
    combined = combined_sync_problem(ctx.ng, ctx.tables, ctx.params, ctx.batch, ctx.combiner)
    saving = 0
    for node, cfgs, u, w in zip(
        ctx.ng.nodes, ctx.tables.configs, ctx.tables.problem.unary, combined.unary, strict=True
    ):
        own = np.zeros(len(cfgs))
        if node.phase == BACKWARD:
            batch = ctx.batch[node.index]
            own = _latency_saved(ctx.ng, node, cfgs, ctx.params, batch, ctx.combiner)
        assert np.array_equal(w, u - own * ctx.ng.program.trips(node.region))
        saving += bool(own.any())
    assert saving > 10


def _scanned_mlp():
    """A tanh MLP scanned over stacked weights [4, 256, 256], SGD (pipelined below)."""
    import jax
    import jax.numpy as jnp

    def step(ws, x):
        def loss(ws):
            h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)
            return jnp.mean(h**2)

        return ws - 0.1 * jax.grad(loss)(ws)

    f32 = jnp.float32
    return step, (jax.ShapeDtypeStruct((4, 256, 256), f32), jax.ShapeDtypeStruct((64, 256), f32))


@pytest.mark.oracle
@pytest.mark.parametrize("case", ["mlp", "scanned_pipelined"])
@pytest.mark.parametrize("objective", ["overlap", "time"])
def test_plan_floor_bounds_every_plan_and_skips_only_hand_plans_that_lose(
    case, objective, monkeypatch
):
    """`choose.plan_floor` (Eq. 1's bound problem; under "overlap" max of the compute and the
    communication streams) is at most the objective of 300 sampled plans and of every hand
    plan; `choose` evaluates a hand plan only when its floor is below the plan it
    chose, and one read later is priced exactly as `evaluate` prices it (with a memo of its
    own: the plan keeps none of the search's)."""
    import jaxpar_zoo as zoo
    import numpy as np

    import jaxpar
    from jaxpar.cost.evaluation import evaluate
    from jaxpar.search import candidates as choose

    seen = []

    def counted(ctx, a):
        seen.append(tuple(a))
        return evaluate(ctx, a)

    monkeypatch.setattr(choose, "evaluate", counted)
    if case == "mlp":
        ex = zoo.get("mlp")
        step, args, options = ex.step, ex.args, None
    else:
        step, args = _scanned_mlp()
        options = jaxpar.PlannerOptions(pipelined_loops=True)
    plan = jaxpar.plan(step, *args, mesh={"node": 2, "gpu": 4}, cluster="dgx-h100",
                       objective=objective, memory_budget=None, options=options)  # fmt: skip
    ctx, chosen = plan.eval_context(), plan.evaluation.objective
    baselines = plan.choice.baselines
    skipped = [s for s, a in baselines.assignments.items() if a not in seen]
    for name in skipped:
        assert choose.plan_floor(ctx, baselines.assignments[name]) >= chosen * (1 - 1e-12)
    assert len(seen) == len(set(seen))  # each plan evaluated once
    assert baselines._ctx.memo == {}  # the search's memo is not kept with the plan
    for a, ev in baselines.values():  # read: evaluated now, the skipped ones included
        fresh = evaluate(ctx, a)
        assert ev.objective == fresh.objective and ev.cost == fresh.cost
        assert choose.plan_floor(ctx, a) <= ev.objective * (1 + 1e-12)
        assert chosen <= ev.objective * (1 + 1e-12)
    rs = np.random.RandomState(0)
    sizes = [len(c) for c in plan.tables.configs]
    for _ in range(300):
        a = [int(rs.randint(n)) for n in sizes]
        assert choose.plan_floor(ctx, a) <= evaluate(ctx, a).objective * (1 + 1e-12)
    if case == "mlp" and objective == "overlap":
        assert skipped  # data parallel computes more than the plan's whole overlapped step


@pytest.mark.oracle
@pytest.mark.parametrize("objective", ["overlap", "time"])
def test_cheapest_candidate_skips_only_plans_that_cannot_win(objective):
    """`choose.cheapest` returns the first plan of least objective among 60 (the plan, its
    hand plans, random ones), as evaluating all of them does, and leaves unevaluated only
    those whose `plan_floor` is above the best evaluated (it skips some: random plans
    communicate far more than the plan's whole step)."""
    import jaxpar_zoo as zoo
    import numpy as np

    import jaxpar
    from jaxpar.cost.evaluation import evaluate
    from jaxpar.search import candidates as choose

    ex = zoo.get("mlp")
    plan = jaxpar.plan(ex.step, *ex.args, mesh={"node": 2, "gpu": 4}, cluster="dgx-h100",
                       objective=objective, memory_budget=None)  # fmt: skip
    ctx = plan.eval_context()
    rs = np.random.RandomState(1)
    sizes = [len(c) for c in plan.tables.configs]
    plans = [[int(rs.randint(n)) for n in sizes] for _ in range(40)]
    plans[7:7] = [list(a) for a in plan.choice.baselines.assignments.values()]
    plans[20:20] = [list(plan.assignment)] * 2 + plans[:3]  # repeats: ties go to the first
    evaluations = [evaluate(ctx, a) for a in plans]
    seen = []

    def priced(a):
        seen.append(tuple(a))
        return evaluations[plans.index(list(a))]

    chosen, ev = choose.cheapest(plans, priced, lambda a: choose.plan_floor(ctx, a))
    first = min(range(len(plans)), key=lambda i: evaluations[i].objective)
    assert chosen == tuple(plans[first]) and ev is evaluations[first]
    skipped = [a for a in plans if tuple(a) not in seen]
    assert skipped
    for a in skipped:
        assert choose.plan_floor(ctx, a) >= ev.objective


@pytest.mark.api
def test_collector_paused_restores_it_and_promotes_what_planning_made():
    """`planner.collector_paused` turns the cyclic collector off inside and back on after; what
    was made inside (cycles too) goes to the oldest generation, so no young collection walks it,
    and a full collection still frees its cycles. A collector the caller turned off stays off."""
    import gc
    import weakref

    from jaxpar.planner.pipeline import collector_paused

    class Node:
        pass

    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        keep = [[i] for i in range(50_000)]  # tracked, alive after
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle, unreachable once dropped
        gone = weakref.ref(a)
        del a, b
    assert gc.isenabled()
    assert gc.get_count()[0] < 1000  # not 50,000 objects in the youngest generation
    assert gone() is not None  # the cycle waits for a full collection
    gc.collect()
    assert gone() is None and len(keep) == 50_000
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.oracle
def test_arguments_exceed_only_plans_that_cannot_fit():
    """`MemoryModel.arguments_exceed` (the budget's search skips the liveness walk of a plan
    whose arguments alone pass the budget) sums what `estimate` counts of the arguments, so
    it holds exactly when that sum passes the budget less its margin, and such a plan never
    fits; checked on 200 sampled plans at budgets just either side of each sum."""
    import jaxpar_zoo as zoo
    import numpy as np

    import jaxpar

    ex = zoo.get("gpt_small", small=True)
    plan = jaxpar.plan(ex.step, *ex.args, mesh={"a": 2, "b": 4}, cluster="dgx-h100",
                       memory_budget=None)  # fmt: skip
    model = plan.memory_model
    rs = np.random.RandomState(0)
    sizes = [len(c) for c in plan.tables.configs]
    exceeded = 0
    for _ in range(200):
        a = [int(rs.randint(n)) for n in sizes]
        est = model.estimate(a, 1.0)
        args = est.params + est.optimizer + est.batch + est.other_args
        for budget in (args / (1 - est.margin) * (1 - 1e-6), args / (1 - est.margin) * (1 + 1e-6)):
            over = model.arguments_exceed(a, budget)
            assert over == (args > budget * (1 - est.margin))
            if over:
                exceeded += 1
                assert not model.estimate(a, budget).fits
    assert exceeded == 200


@pytest.mark.oracle
# gpt_small at 0.7: its free plan is already lean (the LP dual's plans are candidates), 0.5 fits
# no plan the budget reaches
@pytest.mark.parametrize("name,small,fraction", [("mlp", False, 0.7), ("gpt_small", True, 0.7)])
def test_budget_evaluates_hand_plans_only_when_needed(name, small, fraction, monkeypatch):
    """The memory budget's search evaluates a hand plan only when `best_fit` reaches its
    compute floor (and its arguments may fit): the plan, its cost and its peak are those of
    evaluating every hand plan first, with no more evaluations."""
    import jaxpar_zoo as zoo

    import jaxpar
    from jaxpar.search import candidates as choose
    from jaxpar.search import memory_budget as budget

    ex = zoo.get(name, small=small)
    kw = dict(mesh={"a": 2, "b": 4}, cluster="dgx-h100")
    free = jaxpar.plan(ex.step, *ex.args, memory_budget=None, **kw)
    calls = []
    for module in (budget, choose):
        counted = module.evaluate

        def count(ctx, a, _f=counted):
            calls.append(tuple(a))
            return _f(ctx, a)

        monkeypatch.setattr(module, "evaluate", count)
    runs = []
    for eager in (False, True):
        if eager:  # every hand plan evaluated up front, as before
            monkeypatch.setattr(
                budget._Seen, "add_later", lambda self, a, evaluated: self.add(a, None, evaluated())
            )
        calls.clear()
        plan = jaxpar.plan(ex.step, *ex.args, memory_budget=free.memory.peak * fraction, **kw)
        assert plan.stats["budget_bound"]
        runs.append((plan.assignment, plan.evaluation.objective, plan.memory.peak, len(calls)))
    (a, objective, peak, lazy_calls), (b, eager_objective, eager_peak, eager_calls) = runs
    assert a == b and objective == eager_objective and peak == eager_peak
    assert lazy_calls <= eager_calls
    if name == "mlp":  # data parallel computes more than the fastest fitting plan's whole step
        assert lazy_calls < eager_calls
