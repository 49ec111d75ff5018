"""Closed forms (docs/testing.md, "Test tiers"): collective formulas, reshard paths, rules, the
one pricing function shared by the search and the report; the pure core imports no jax."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from jaxpar.hardware.collectives import (
    ALL_GATHER,
    ALL_TO_ALL,
    all_gather_bytes,
    all_reduce_buffer,
    all_reduce_bytes,
    all_to_all_bytes,
    reduce_scatter_bytes,
    transfer_time,
)
from jaxpar.rules.table import reshape_map
from jaxpar.xla.reshard_paths import reshard_path

pytestmark = pytest.mark.closed_form

ROOT = Path(__file__).resolve().parent.parent


def test_ring_formulas():
    assert all_reduce_bytes(1000, 4) == pytest.approx(2 * 3 / 4 * 1000)
    assert all_gather_bytes(1000, 4) == pytest.approx(750)
    assert reduce_scatter_bytes(1000, 4) == pytest.approx(750)
    assert all_to_all_bytes(1000, 8) == pytest.approx(875)
    assert all_reduce_bytes(1000, 1) == 0
    assert all_reduce_buffer(all_reduce_bytes(1000, 8), 8) == pytest.approx(1000)
    # alpha-beta: 2(n-1) steps for an all-reduce
    assert transfer_time("all-reduce", 1500, 4, 1e9, 1e-6) == pytest.approx(6e-6 + 1.5e-6)


SIZES = (2, 4)  # axis 0 of size 2, axis 1 of size 4


def test_reshard_free_slice():
    assert [s.kind for s in reshard_path(1024, ((), ()), ((0,), (1,)), SIZES)] == ["slice"] * 2


def test_reshard_gather_and_move():
    # (axis1 on dim0) -> (axis1 on dim1): one all-to-all of the 1/4 shard
    steps = reshard_path(1024, ((1,), ()), ((), (1,)), SIZES)
    assert [s.kind for s in steps] == [ALL_TO_ALL]
    assert steps[0].nbytes == pytest.approx(3 / 4 * 256)
    # (axis0, axis1 on dim0) -> replicated: gather axis1 (to 1/2), then axis0 (to full)
    steps = reshard_path(1024, ((0, 1), ()), ((), ()), SIZES)
    assert [s.kind for s in steps] == [ALL_GATHER, ALL_GATHER]
    assert [s.axis for s in steps] == [1, 0]
    assert steps[0].nbytes == pytest.approx(3 / 4 * 512)
    assert steps[1].nbytes == pytest.approx(1 / 2 * 1024)


def test_reshard_never_permutes_layouts():
    # axis1 -> (axis0, axis1) on the same dim changes which chunk each device holds: the path
    # gathers then slices rather than relying on a collective-permute
    kinds = [s.kind for s in reshard_path(1024, ((1,),), ((0, 1),), SIZES)]
    assert kinds == [ALL_GATHER, "slice", "slice"]


def test_reshape_maps_major_dims():
    op_map, _ = reshape_map((8, 16, 64), (8, 16, 4, 16))  # split the last dim into heads
    assert op_map == (0, 1, 2)
    op_map, _ = reshape_map((8, 16, 4, 16), (128, 64))  # merge batch and length
    assert op_map == (0, None, 1, None)


@pytest.mark.parametrize("objective", ["time", "comm"])
@pytest.mark.parametrize(
    ("name", "mesh"),
    [("mlp", {"a": 2, "b": 4}), ("cnn", {"a": 2, "b": 4}), ("gpt_small", {"a": 2, "b": 2, "c": 2})],
)
def test_reported_cost_lies_between_the_two_search_problems(name, mesh, objective):
    """For any assignment: bound objective <= reported cost <= problem objective (equal when
    every shared reshard has its exact table), and the reported cost is Eq. 1's sum (step_s,
    or bytes under "comm")."""
    import jaxpar_zoo as zoo
    import numpy as np

    import jaxpar
    from jaxpar.cost.evaluation import evaluate
    from jaxpar.solver.problem import assignment_cost

    ex = zoo.get(name, small=True)
    plan = jaxpar.plan(ex.step, *ex.args, mesh=mesh, cluster="p100", objective=objective)
    from jaxpar.cost.search_tables import pairwise_bound

    ctx = plan.eval_context()
    pairwise = pairwise_bound(plan.ng, plan.tables)
    rng = np.random.default_rng(0)
    sizes = [len(c) for c in plan.configs]
    assignments = [plan.assignment, *(a for a, _ in plan.choice.baselines.values())]
    assignments += [tuple(int(rng.integers(n)) for n in sizes) for _ in range(8)]
    strict = 0
    for a in assignments:
        ev = evaluate(ctx, a)
        low = assignment_cost(plan.tables.bound, a)
        high = assignment_cost(plan.problem, a)
        tol = 1e-9 * max(1.0, abs(high))
        assert low <= ev.objective + tol and ev.objective <= high + tol
        strict += ev.objective < high - tol  # only where shared tables fell back to pairs
        if plan.tables.exact:  # every shared reshard priced exactly: search objective = report
            assert high == pytest.approx(ev.objective, rel=1e-9)
        assert assignment_cost(pairwise, a) <= low + tol
        total = ev.cost.comm_bytes if objective == "comm" else ev.cost.step_s
        assert total == pytest.approx(ev.objective, rel=1e-9)
    assert plan.tables.problem.factors  # tensors with several readers got one exact table
    if plan.tables.exact:
        assert name == "mlp"  # the case that checks the exact tables against the evaluation
    else:
        assert strict > 0


def test_collective_over_merged_axes_gets_the_merged_ring_bandwidth():
    """4 P100 nodes as node=4 x gpu=4: the 4 node-axis rings share each node's one InfiniBand
    card (12.5/4 GB/s each); one 16-device ring over both axes crosses each card once."""
    from jaxpar.hardware.cluster import Cluster
    from jaxpar.hardware.mesh_model import mesh_axes

    mesh = mesh_axes(Cluster.preset("p100", nodes=4), ("node", "gpu"), (4, 4), None)
    assert mesh.bandwidth == pytest.approx((12.5e9 / 4, 20e9))
    n, bw, lat = mesh.group((0, 1))
    assert n == 16 and bw == pytest.approx(12.5e9) and lat == pytest.approx(5e-6)
    assert mesh.group((1,))[1] == pytest.approx(20e9)


# ---- compute t_C: fused traffic, kernel overhead, saturation (docs/cost.md, "Compute t_C") ----


def _tiny_program(fn, *shapes):
    """The nodes of ``fn`` traced at float32 ``shapes``."""
    import jax

    from jaxpar.nodes.planning_nodes import build_nodes
    from jaxpar.trace.tracing import trace

    args = tuple(jax.ShapeDtypeStruct(s, "float32") for s in shapes)
    program, _ = trace(fn, args)
    return build_nodes(program)


def _params(overhead=0.0, half_rate_time=0.0, peak=1e12, bandwidth=1e11, sizes=(2,)):
    from jaxpar.cost.node_costs import CostParams
    from jaxpar.hardware.mesh_model import MeshAxes

    n = len(sizes)
    mesh = MeshAxes(
        names=tuple(f"a{i}" for i in range(n)), sizes=sizes, bandwidth=(1e9,) * n,
        latency=(1e-6,) * n, link_names=("l",) * n, kernel_overhead=overhead,
        half_rate_time=half_rate_time,
    )  # fmt: skip
    return CostParams(mesh, (("float32", peak),), bandwidth)


def _node_of(ng, primitive):
    return next(
        n for n in ng.nodes if n.anchor >= 0 and ng.program.eqns[n.anchor].primitive == primitive
    )


def _matmul_bias_relu(x, w, b):
    import jax

    return jax.nn.relu(x @ w + b)


def test_fused_traffic_of_a_matmul_bias_relu_node():
    """relu(x @ W + b) is one node and two kernels: the product reads x and W and writes y; the
    epilogue reads y and b (not its broadcast) and writes only the relu result."""
    from jaxpar.cost.kernels import node_kernels
    from jaxpar.cost.node_costs import node_work

    ng = _tiny_program(_matmul_bias_relu, (4, 8), (8, 16), (16,))
    node = _node_of(ng, "dot_general")
    kernels = node_kernels(ng, node)
    T = ng.program.tensors
    assert [k.contraction for k in kernels] == [True, False]
    assert [[T[s].shape for s, _, _ in k.reads] for k in kernels] == [
        [(4, 8), (8, 16)],
        [(4, 16), (16,)],
    ]
    assert [[T[t].shape for t, _ in k.writes] for k in kernels] == [[(4, 16)], [(4, 16)]]
    x, w, y, b, r = 4 * 8 * 4, 8 * 16 * 4, 4 * 16 * 4, 16 * 4, 4 * 16 * 4
    unsplit = tuple(-1 for _ in range(1))
    work = node_work(ng, node, [unsplit], _params(sizes=(2,)))
    assert work.nbytes[0] == pytest.approx(x + w + y + y + b + r)
    assert work.kernels == 2
    # the batch dim (the anchor's dim 0) split over 2 devices: x, y and r halve; W and b do not
    batch = node.space.out_maps[0][0]
    work = node_work(ng, node, [(batch,)], _params(sizes=(2,)))
    assert work.nbytes[0] == pytest.approx(x / 2 + w + y / 2 + y / 2 + b + r / 2)
    assert work.flops[0] == pytest.approx(sum(m.flops for m in node.members) / 2)
    assert work.flops[0] == pytest.approx((2 * 4 * 8 * 16 + 2 * 4 * 16) / 2)  # dot; add, max


def test_kernel_time_is_overhead_plus_roofline_per_kernel():
    """t_C = Σ_k overhead + max(FLOPs_k / peak, bytes_k / bandwidth): memory-bound kernels here."""
    from jaxpar.cost.kernels import node_kernels
    from jaxpar.cost.node_costs import compute_times, node_work

    ng = _tiny_program(_matmul_bias_relu, (4, 8), (8, 16), (16,))
    node = _node_of(ng, "dot_general")
    params = _params(overhead=3e-6, peak=1e15, bandwidth=1e9)
    work = node_work(ng, node, [(-1,)], params)
    bytes_k = [4 * 8 * 4 + 8 * 16 * 4 + 4 * 16 * 4, 4 * 16 * 4 + 16 * 4 + 4 * 16 * 4]
    expected = sum(3e-6 + b / 1e9 for b in bytes_k)
    assert work.seconds[0] == pytest.approx(expected)
    assert compute_times(ng, node, [(-1,)], params)[0] == pytest.approx(expected)
    assert len(node_kernels(ng, node)) == work.kernels == 2
    # a small node is not predicted at ~0: at least one overhead per kernel
    assert compute_times(ng, node, [(-1,)], _params(overhead=3e-6, bandwidth=1e30))[0] >= 6e-6


@pytest.mark.oracle
@pytest.mark.parametrize("name", ["gpt2_124m", "cnn"])
def test_copies_share_node_work_only_when_priced_alike(name):
    """`node_work`'s memo (a layer's copies share one `NodeWork`) changes no number: every node's
    FLOPs, bytes and t_C per configuration equal the unshared computation, on a 12-layer GPT-2
    and a small CNN, and the copies did share (fewer works than nodes)."""
    import jaxpar_zoo as zoo

    import jaxpar
    from jaxpar.cost.node_costs import node_work

    ex = zoo.get(name, small=name != "gpt2_124m")
    plan = jaxpar.plan(ex.step, *ex.args, mesh={"a": 4, "b": 4}, cluster="p100")
    memo: dict = {}
    for node, cfgs in zip(plan.ng.nodes, plan.tables.configs, strict=True):
        shared = node_work(plan.ng, node, cfgs, plan.params, memo)
        alone = node_work(plan.ng, node, cfgs, plan.params)
        for field in ("flops", "nbytes", "seconds"):
            np.testing.assert_array_equal(getattr(shared, field), getattr(alone, field))
        assert shared.kernels == alone.kernels
    if name == "gpt2_124m":
        assert len(memo) < len(plan.ng.nodes) / 4, (len(memo), len(plan.ng.nodes))


@pytest.mark.oracle
def test_resharded_reads_are_the_reads_whose_layouts_differ():
    """`evaluate._resharded` (layout numbers compared over all reads at once) picks exactly the
    reads whose producer's and reader's layouts differ, for 200 random assignments."""
    import jaxpar_zoo as zoo

    import jaxpar
    from jaxpar.cost.evaluation import _priced_reads, _resharded
    from jaxpar.nodes.configs import spec_of

    ex = zoo.get("gpt_small", small=True)
    plan = jaxpar.plan(ex.step, *ex.args, mesh={"a": 2, "b": 4}, cluster="p100")
    ctx, configs = plan.eval_context(), plan.tables.configs
    rs = np.random.RandomState(0)
    for _ in range(200):
        a = [int(rs.randint(len(c))) for c in configs]
        expected = [
            r
            for r, (_, use, *_) in enumerate(_priced_reads(ctx))
            if spec_of(use.src_map, configs[use.src][a[use.src]])
            != spec_of(use.dst_map, configs[use.dst][a[use.dst]])
        ]
        assert list(_resharded(ctx, a)) == expected


def test_an_elementwise_result_read_by_one_reduction_is_computed_inside_it():
    """sum(y * y) after y = x @ W: the product y*y joins the dot's node but has one reader, a
    reduction, which recomputes it (XLA's producer-consumer fusion): the epilogue writes nothing
    and costs no launch, and the reduction reads y."""
    from jaxpar.cost.kernels import node_kernels
    from jaxpar.cost.node_costs import node_work
    from jaxpar.xla.fusion import recomputed

    ng = _tiny_program(lambda x, w: ((x @ w) * (x @ w)).sum(), (4, 8), (8, 16))
    node = _node_of(ng, "dot_general")
    square = next(e for e in ng.program.eqns if e.primitive in ("mul", "integer_pow", "square"))
    assert recomputed(ng.program, square.outputs[0])
    reduce = _node_of(ng, "reduce_sum")
    (kernel,) = node_kernels(ng, reduce)
    T = ng.program.tensors
    assert [T[s].shape for s, _, _ in kernel.reads] == [(4, 16)] * len(kernel.reads)
    assert [k.runs for k in node_kernels(ng, node)] == [True, False]
    assert node_work(ng, node, [(-1,)], _params()).kernels == 1


def _reduce_nodes(ng):
    return [
        n for n in ng.nodes if n.anchor >= 0 and "reduce" in ng.program.eqns[n.anchor].primitive
    ]


def test_sibling_reductions_share_their_read():
    """A batch norm's Σx and Σx² over the same axes: XLA's multi-output fusion reads x once, so
    the later reduction's kernel reads nothing from memory; softmax's Σexp(x − max x) reads the
    max it depends on, so it is no sibling and reads x again."""
    import jax.numpy as jnp

    from jaxpar.cost.kernels import node_kernels
    from jaxpar.xla.fusion import shared_reads

    def stats(x):
        return x.sum(axis=0), (x * x).sum(axis=0)

    ng = _tiny_program(stats, (32, 8))
    T = ng.program.tensors
    first, second = (node_kernels(ng, n) for n in _reduce_nodes(ng))
    assert [[T[s].shape for s, _, _ in k.reads] for k in first] == [[(32, 8)]]
    assert [[T[s].shape for s, _, _ in k.reads] for k in second] == [[]]
    assert len(shared_reads(ng.program)) == 1
    # over other axes they are no siblings: each reads x
    ng = _tiny_program(lambda x: (x.sum(axis=0), (x * x).sum(axis=1)), (32, 8))
    T = ng.program.tensors
    reads = [
        [T[s].shape for k in node_kernels(ng, n) for s, _, _ in k.reads] for n in _reduce_nodes(ng)
    ]
    assert reads == [[(32, 8)], [(32, 8)]]

    def softmax_denominator(x):
        m = x.max(axis=1, keepdims=True)
        return jnp.exp(x - m).sum(axis=1)

    ng = _tiny_program(softmax_denominator, (32, 8))
    assert shared_reads(ng.program) == {}
    T = ng.program.tensors
    later = _reduce_nodes(ng)[-1]
    assert (32, 8) in [T[s].shape for k in node_kernels(ng, later) for s, _, _ in k.reads]


def test_fusion_rules_follow_the_backend():
    """XLA:GPU recomputes an elementwise result in each of several fusing readers (softmax's
    exp(x − max) in its sum and its division) and merges sibling reductions; XLA:CPU writes a
    result with two readers once and reads it in each, and runs siblings apart. A CPU mesh
    prices CPU rules, any other mesh the accelerator's."""
    import jax.numpy as jnp

    from jaxpar.cost.kernels import node_kernels
    from jaxpar.xla.fusion import (
        ACCELERATOR_FUSION,
        CPU_FUSION,
        fusion_for,
        recomputed,
        shared_reads,
    )

    def softmax(x):
        e = jnp.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    ng = _tiny_program(softmax, (32, 8))
    program = ng.program
    (exp,) = [e for e in program.eqns if e.primitive == "exp"]
    assert len(program.consumers()[exp.outputs[0]]) == 2
    assert recomputed(program, exp.outputs[0], ACCELERATOR_FUSION)
    assert not recomputed(program, exp.outputs[0], CPU_FUSION)
    written = {
        rules: {t for n in ng.nodes for k in node_kernels(ng, n, rules) for t, _ in k.writes}
        for rules in (ACCELERATOR_FUSION, CPU_FUSION)
    }
    assert exp.outputs[0] in written[CPU_FUSION] - written[ACCELERATOR_FUSION]
    siblings = _tiny_program(lambda x: (x.sum(axis=0), (x * x).sum(axis=0)), (32, 8)).program
    assert len(shared_reads(siblings, ACCELERATOR_FUSION)) == 1
    assert shared_reads(siblings, CPU_FUSION) == {}
    assert fusion_for("cpu") is CPU_FUSION
    assert fusion_for("gpu") is fusion_for("tpu") is fusion_for("abstract") is ACCELERATOR_FUSION


def test_xla_cpu_copies_a_kernel_gradients_operands_first():
    """XLA:CPU runs a convolution on (batch, spatial..., feature) inputs and (spatial..., in,
    out) kernels: the kernel gradient (batch contracted) copies both its operands into that
    layout first, one kernel each that reads and writes the operand; the forward convolution
    none; an accelerator's rules none."""
    import jax

    from jaxpar.cost.kernels import node_kernels
    from jaxpar.cost.node_costs import node_work
    from jaxpar.xla.fusion import ACCELERATOR_FUSION, CPU_FUSION

    def loss(w, x):
        y = jax.lax.conv_general_dilated(
            x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        return (y**2).sum()

    ng = _tiny_program(jax.grad(loss), (3, 3, 4, 8), (2, 6, 6, 4))
    T = ng.program.tensors
    convs = [n for n in ng.nodes if n.anchor >= 0 and ng.program.eqns[n.anchor].primitive
             == "conv_general_dilated"]  # fmt: skip
    by_output = {T[ng.program.eqns[n.anchor].outputs[0]].shape: n for n in convs}
    forward, kernel_grad = by_output[(2, 6, 6, 8)], by_output[(3, 3, 4, 8)]
    for node in convs:
        assert len(node_kernels(ng, node, CPU_FUSION)) == len(
            node_kernels(ng, node, ACCELERATOR_FUSION)
        ) + (2 if node is kernel_grad else 0)
    x_bytes, dy_bytes = 2 * 6 * 6 * 4 * 4, 2 * 6 * 6 * 8 * 4
    unsplit = (-1,)  # one mesh axis, no dim split
    cpu, gpu = (
        node_work(ng, kernel_grad, [unsplit], dataclasses.replace(_params(), fusion=rules))
        for rules in (CPU_FUSION, ACCELERATOR_FUSION)
    )
    assert cpu.nbytes[0] - gpu.nbytes[0] == pytest.approx(2 * (x_bytes + dy_bytes))
    assert cpu.flops[0] == gpu.flops[0]
    assert forward is not kernel_grad


@pytest.mark.oracle
def test_xla_cpu_writes_each_result_of_an_elementwise_node_from_a_fusion_of_its_own():
    """AdamW's update of one weight: XLA:CPU makes one loop fusion per result (μ', ν', then
    the weight from both), so the gradient is read twice; the prediction under CPU rules
    (`FusionRules.multi_output` false, `kernels._cones`) equals the compiled program's cost
    analysis. Under accelerator rules one multi-output kernel reads it once."""
    import jax
    import optax

    from jaxpar.cost.node_costs import node_work
    from jaxpar.nodes.planning_nodes import build_nodes
    from jaxpar.trace.tracing import trace
    from jaxpar.xla.fusion import ACCELERATOR_FUSION, CPU_FUSION

    opt = optax.adamw(1e-3)

    def update(p, g, mu, nu):
        state = opt.init(p)
        state = (optax.ScaleByAdamState(state[0].count, mu, nu), *state[1:])
        u, state = opt.update(g, state, p)
        return optax.apply_updates(p, u), state[0].mu, state[0].nu

    args = [jax.ShapeDtypeStruct((64, 32), "float32")] * 4
    ng = build_nodes(trace(update, tuple(args))[0])

    def predicted(rules):
        params = dataclasses.replace(_params(sizes=(1,)), fusion=rules)
        return sum(float(node_work(ng, n, [(-1,)], params).nbytes[0]) for n in ng.nodes)

    analysis = jax.jit(update).lower(*args).compile().cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    assert predicted(CPU_FUSION) == pytest.approx(analysis["bytes accessed"], rel=1e-3)
    weight = 64 * 32 * 4
    # the gradient once more, and the step count's scalars
    assert predicted(CPU_FUSION) - predicted(ACCELERATOR_FUSION) == pytest.approx(weight, abs=16)


# (input shape, window, strides) of a max pool
POOL_CASES = [
    ((2, 15, 15, 4), (1, 3, 3, 1), (1, 2, 2, 1)),  # AlexNet's overlapping pool
    ((4, 8, 8, 16), (1, 2, 2, 1), (1, 2, 2, 1)),
    ((3, 9, 7, 5), (1, 3, 3, 1), (1, 1, 1, 1)),
    ((2, 33, 6), (1, 3, 1), (1, 2, 1)),  # rank 3
]


@pytest.mark.oracle
@pytest.mark.parametrize(("shape", "window", "strides"), POOL_CASES)
def test_xla_cpu_expands_a_max_pool_gradient(shape, window, strides):
    """A max pool's gradient (select_and_scatter_add) on XLA:CPU is its select-and-scatter
    expansion: iotas, zeros, a variadic reduce-window, a concatenate, a copy and a scatter
    (`kernels.expanded_select_and_scatter`). Its predicted bytes equal the compiled program's
    cost analysis (within 0.1 %: XLA also counts a scalar); before, one kernel reading g and x
    and writing the result was 7-9 times less."""
    import jax
    import jax.numpy as jnp

    from jaxpar.cost.node_costs import node_work
    from jaxpar.xla.fusion import CPU_FUSION

    def pool(x):
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, window, strides, "VALID")

    def pool_grad(x, g):
        return jax.vjp(pool, x)[1](g)[0]

    x = jax.ShapeDtypeStruct(shape, "float32")
    g = jax.eval_shape(pool, x)
    ng = _tiny_program(pool_grad, shape, g.shape)
    params = dataclasses.replace(_params(sizes=(1,)), fusion=CPU_FUSION)
    predicted = sum(float(node_work(ng, n, [(-1,)], params).nbytes[0]) for n in ng.nodes)
    analysis = jax.jit(pool_grad).lower(x, g).compile().cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    assert predicted == pytest.approx(analysis["bytes accessed"], rel=1e-3)


# (lhs shape, rhs shape, ((lhs contracted, rhs contracted), (lhs batch, rhs batch)))
DOT_CASES = [
    ((4, 8, 32), (32, 16), (((2,), (0,)), ((), ()))),  # forward x·W
    ((4, 8, 16), (32, 16), (((2,), (1,)), ((), ()))),  # input gradient dy·Wᵀ
    ((32, 16), (4, 8, 16), (((1,), (2,)), ((), ()))),  # W·dyᵀ: dy copied
    ((4, 8, 32), (4, 8, 16), (((0, 1), (0, 1)), ((), ()))),  # weight gradient: x copied
    ((1, 8, 32), (1, 8, 16), (((0, 1), (0, 1)), ((), ()))),  # ... with a dim of size 1
    ((64, 32), (64, 16), (((0,), (0,)), ((), ()))),  # 2-d aᵀ·b: read transposed
    ((64, 32), (16, 64), (((0,), (1,)), ((), ()))),
    ((2, 16, 4, 16), (2, 16, 4, 16), (((3,), (3,)), ((0, 2), (0, 2)))),  # bqhd,bkhd: both
    ((2, 4, 16, 16), (2, 4, 16, 16), (((3,), (3,)), ((0, 1), (0, 1)))),  # bhqd,bhkd
    ((2, 8, 16), (2, 4, 16), (((2,), (2,)), ((0,), (0,)))),
    ((8, 2, 16), (2, 16, 4), (((2,), (1,)), ((1,), (0,)))),  # batch dim not leading
    ((4, 8, 16), (5, 16), (((2,), (1,)), ((), ()))),
    ((4, 16), (5, 3, 16), (((1,), (2,)), ((), ()))),
    ((3, 4, 16), (3, 16, 5), (((0, 2), (0, 1)), ((), ()))),
]


@pytest.mark.oracle
@pytest.mark.parametrize("lhs,rhs,dims", DOT_CASES)
def test_xla_cpu_copies_the_dot_operands_its_decomposition_reorders(lhs, rhs, dims):
    """`operand_layouts.transposed_dot_operands` names the operands XLA:CPU's compiled program
    copies into another layout before the dot (a layout-only fusion or copy reading the
    argument)."""
    import re

    import jax

    from jaxpar.xla.operand_layouts import transposed_dot_operands

    def dot(a, b):
        return jax.lax.dot_general(a, b, dims)

    ng = _tiny_program(dot, lhs, rhs)
    eqn = next(e for e in ng.program.eqns if e.primitive == "dot_general")
    args = [jax.ShapeDtypeStruct(s, "float32") for s in (lhs, rhs)]
    hlo = jax.jit(dot).lower(*args).compile().as_text()
    entry = hlo[hlo.index("ENTRY") :]
    params = dict(re.findall(r"%([\w.]+) = \S+ parameter\((\d)\)", entry))
    copied = {
        int(params[name])
        for line in entry.splitlines()
        if re.search(r"= \S+ (copy|transpose)\(|(copy|transpose)_\w*fusion", line)
        for name in re.findall(r"\(%([\w.]+)\)", line)
        if name in params
    }
    assert set(transposed_dot_operands(ng.program, eqn)) == copied, hlo


def test_indexing_touches_only_its_part():
    """A gather of 8 rows of a (1000, 64) table reads 8 rows' worth of it, not the table; a
    scatter-add of 8 rows into it updates the table in place: 8 rows' worth read and written.
    Without `PARTIAL_ACCESS` both kernels would move the whole 256 kB table."""
    import jax
    import jax.numpy as jnp

    from jaxpar.cost.node_costs import node_work
    from jaxpar.nodes.planning_nodes import build_nodes
    from jaxpar.trace.tracing import trace

    table = jax.ShapeDtypeStruct((1000, 64), jnp.float32)
    index = jax.ShapeDtypeStruct((8,), jnp.int32)
    rows = jax.ShapeDtypeStruct((8, 64), jnp.float32)
    whole, part = 1000 * 64 * 4, 8 * 64 * 4
    for fn, args, prim in (
        (lambda x, i: x[i], (table, index), "gather"),
        (lambda x, i, u: x.at[i].add(u), (table, index, rows), "scatter-add"),
    ):
        program, _ = trace(fn, args)
        ng = build_nodes(program)
        node = _node_of(ng, prim)
        work = node_work(ng, node, [tuple(-1 for _ in range(1))], _params(sizes=(2,)))
        assert 2 * part <= work.nbytes[0] <= 4 * part < whole / 10, (prim, work.nbytes)


def test_saturation_curve():
    """rate = peak · f / (f + f_half): half the peak at f_half; time (f + f_half) / peak, so a
    split into n shards runs in (f / n + f_half) / peak, not f / (n · peak)."""
    from jaxpar.cost.node_costs import saturated_rate

    peak, half = 1e12, 4e9
    assert saturated_rate(half, peak, half) == pytest.approx(peak / 2)
    assert saturated_rate(1e18, peak, half) == pytest.approx(peak, rel=1e-8)
    assert saturated_rate(1e9, peak, 0.0) == pytest.approx(peak)
    for f in (1e6, 1e9, 1e12):
        assert f / saturated_rate(f, peak, half) == pytest.approx((f + half) / peak)


def test_small_contractions_run_below_peak_with_datasheet_numbers():
    """Without a calibration a matrix product's shard runs at the saturated peak
    (f_half = peak · half_rate_time), so splitting it is not free; elementwise work at the peak."""
    params = _params(half_rate_time=4e-6, peak=1e12)
    f = np.array([1e6, 4e6, 1e12])
    assert np.allclose(params.flops_rates("float32", "dot_general", f), 1e12 * f / (f + 4e6))
    assert params.flops_rates("float32", "add", f) == 1e12
    assert _params().flops_rates("float32", "dot_general", f) == pytest.approx(1e12)


def test_presets_carry_kernel_costs():
    """Every preset prices kernels (docs: GPUs measured on an H100, CPU on the CI host)."""
    from jaxpar.hardware import Cluster, mesh_axes

    for name in ("p100", "dgx-h100", "cpu", "tpu-v5p", "accpar-tpu", "mixed-gpu"):
        cluster = Cluster.preset(name)
        axes = mesh_axes(cluster, ("d",), (cluster.num_devices,), None)
        assert axes.kernel_overhead > 0 and axes.half_rate_time > 0
    h100 = mesh_axes(Cluster.preset("dgx-h100"), ("d",), (8,), None)
    assert h100.kernel_overhead == pytest.approx(4e-6)


def test_conv_taps_fraction():
    """3x3 SAME on 4x4: per spatial dim, of 4 · 3 taps, the 2 at the edges hit padding; the
    input gradient of a stride-2 convolution (lhs dilation 2) skips the holes."""
    import jax

    from jaxpar.rules.contractions import conv_taps_fraction
    from jaxpar.trace.tracing import trace

    def conv(x, w, stride=(1, 1), dilation=(1, 1)):
        return jax.lax.conv_general_dilated(
            x, w, stride, ((1, 1), (1, 1)), lhs_dilation=dilation,
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
        )  # fmt: skip

    x, w = (
        jax.ShapeDtypeStruct((1, 4, 4, 2), "float32"),
        jax.ShapeDtypeStruct((3, 3, 2, 2), "float32"),
    )
    program, _ = trace(conv, (x, w))
    (eqn,) = [e for e in program.eqns if e.primitive == "conv_general_dilated"]
    assert conv_taps_fraction(program, eqn) == pytest.approx((10 / 12) ** 2)
    program, _ = trace(lambda x, w: conv(x, w, dilation=(2, 2)), (x, w))
    (eqn,) = [e for e in program.eqns if e.primitive == "conv_general_dilated"]
    out = program.tensors[eqn.outputs[0]].shape[1]  # (4 - 1) * 2 + 1 = 7
    taps = sum(0 <= o + j - 1 <= 6 and (o + j - 1) % 2 == 0 for o in range(out) for j in range(3))
    assert conv_taps_fraction(program, eqn) == pytest.approx((taps / (3 * out)) ** 2)


@pytest.mark.numerics
def test_plan_work_matches_xla_cost_analysis_on_a_data_parallel_mlp():
    """The predicted per-device FLOPs and bytes of a compiled plan agree with XLA's
    cost_analysis (bytes less the collectives'), within 15 %
    (bench/fidelity/compute_fidelity.py)."""
    import jaxpar_zoo as zoo

    import jaxpar
    from jaxpar.cost.node_costs import plan_work
    from jaxpar.verify.compiled import compiled_collectives

    ex = zoo.get("mlp", small=True)
    step = jaxpar.auto_shard(ex.step, mesh=jaxpar.make_mesh({"data": 8}), strategy="data")
    compiled = step.lower(*ex.args).compile()
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    comm = sum(2 * c.buffer_bytes for c in compiled_collectives(compiled))  # all-reduces
    plan = step.plan
    work = plan_work(plan.ng, plan.tables.configs, plan.assignment, plan.params)
    assert work["flops"] == pytest.approx(analysis["flops"], rel=0.15)
    assert work["bytes"] == pytest.approx(analysis["bytes accessed"] - comm, rel=0.15)
    assert work["seconds"] == pytest.approx(plan.cost.compute_s)


@pytest.mark.parametrize("name", ["gpt_small", "cnn", "llama_small"])
def test_every_tensor_a_kernel_reads_is_written_or_an_input(name):
    """A kernel reads from memory only what an argument, a constant, a loop's carry or another
    kernel put there. A reduction whose result its readers use through a recomputed division
    (a layer norm's mean) must write it: before `kernels._read_outside` 13-32 tensors per model
    were read but never written, and their reductions cost nothing."""
    import jaxpar_zoo as zoo

    from jaxpar.cost.kernels import node_kernels
    from jaxpar.nodes.planning_nodes import build_nodes
    from jaxpar.program.graph import REGION_PRIMITIVES
    from jaxpar.trace.tracing import trace
    from jaxpar.xla.fusion import ACCELERATOR_FUSION, CPU_FUSION

    ex = zoo.get(name, small=True)
    program, _ = trace(ex.step, ex.args)
    ng = build_nodes(program)
    for rules in (ACCELERATOR_FUSION, CPU_FUSION):
        written = set(program.invars) | set(program.consts)
        written |= {t for e in program.eqns if e.primitive in REGION_PRIMITIVES for t in e.outputs}
        read = set()
        for node in ng.nodes:
            for kernel in node_kernels(ng, node, rules):
                written |= {t for t, _ in kernel.writes}
                read |= {s for s, _, _ in kernel.reads}
        unwritten = {s for s in read - written if not program.tensors[s].opaque}
        assert not unwritten, (rules, [program.tensors[s].shape for s in unwritten])


@pytest.mark.parametrize("name", ["gpt_small", "cnn", "llama_small", "alexnet"])
def test_every_member_of_a_running_kernel_computes_what_it_writes(name):
    """A kernel computes only what it writes: each member of a kernel that writes makes a
    written tensor or an operand of a member that does. Members whose results are all
    recomputed by kernels elsewhere run there (`kernels._feeding`): before, a loss's elementwise
    node (its shifted exponentials and its gradient) read the gradient's operands in the kernel
    that wrote only the sliced logits."""
    import jaxpar_zoo as zoo

    from jaxpar.cost.kernels import node_kernels
    from jaxpar.nodes.planning_nodes import build_nodes
    from jaxpar.trace.tracing import trace
    from jaxpar.xla.fusion import ACCELERATOR_FUSION, CPU_FUSION

    ex = zoo.get(name, small=True)
    program, _ = trace(ex.step, ex.args)
    ng = build_nodes(program)
    idle = 0
    for rules in (ACCELERATOR_FUSION, CPU_FUSION):
        for node in ng.nodes:
            for kernel in node_kernels(ng, node, rules):
                if not kernel.runs:
                    idle += 1
                    continue
                if kernel.extra:  # an expansion's kernel: it writes arrays the program lacks
                    continue
                eqns = [program.eqns[node.members[i].eqn] for i in kernel.members]
                used = {t for t, _ in kernel.writes} | {t for e in eqns for t in e.inputs}
                for e in eqns:
                    assert used & set(e.outputs), (rules, e.primitive, e.name_stack)
    assert idle  # the check saw kernels that run inside others


@pytest.mark.parametrize("name", ["gpt_small", "cnn", "llama_small", "alexnet"])
def test_every_kernel_reads_only_what_was_made_before_it_writes(name):
    """A kernel runs at one point of the program: everything it reads from outside is made
    before the first tensor it writes (program order), so no input of it can depend on its
    own results. Multi-output fusion (GPU/TPU rules) merges a node's written results only
    where that holds (`kernels._cones`): before, a softmax's forward probabilities and its
    backward gradient, one node, were one kernel reading the backward product (6 such kernels
    in the small GPT, 4 in the CNN)."""
    import jaxpar_zoo as zoo

    from jaxpar.cost.kernels import node_kernels
    from jaxpar.nodes.planning_nodes import build_nodes
    from jaxpar.trace.tracing import trace
    from jaxpar.xla.fusion import ACCELERATOR_FUSION, CPU_FUSION, program_index

    ex = zoo.get(name, small=True)
    program, _ = trace(ex.step, ex.args)
    ng = build_nodes(program)
    made = program_index(program).producer
    for rules in (ACCELERATOR_FUSION, CPU_FUSION):
        for node in ng.nodes:
            for kernel in node_kernels(ng, node, rules):
                ins = [made[s].index for s, _, _ in kernel.reads if s in made]
                outs = [made[t].index for t, _ in kernel.writes if t in made]
                if ins and outs and kernel.members:  # (an operand's copy writes what it reads)
                    assert max(ins) < min(outs), (rules, node.index, kernel)


def test_a_sliced_cross_entropy_reads_the_logits_once_per_pass_on_gpu():
    """grad of −mean log_softmax((h @ W)[:, :-1])[labels] on GPU rules: the slice and the
    exponentials run inside the reductions (max, Σexp), the one-hot scatter updates a zero
    buffer in place, and the gradient is computed once, inside the pad that feeds the weight
    gradient: 5 logits-sized reads (max, Σexp, Σ of the one-hot gradient, the pad's two) and 2
    writes (the zeros, the pad), the traffic an H100 profile of GPT-2's loss shows
    (`bench/fidelity/results/layer_compute_repriced.md`).
    Before, the slice was written and read back,
    and kernels that wrote other tensors also read the gradient's operands: 7 reads."""
    import jax
    import jax.numpy as jnp

    from jaxpar.cost.kernels import node_kernels
    from jaxpar.xla.fusion import ACCELERATOR_FUSION, ROW_REDUCTION_LIMIT

    # vocabulary rows wider than a normalization fusion takes (GPT-2's are 50,304 wide)
    b, s, d, v = 2, 9, 4, ROW_REDUCTION_LIMIT + 64

    def grad_of_loss(h, w, labels):
        def loss(w):
            logits = (h @ w)[:, :-1]
            logp = jax.nn.log_softmax(logits)
            picked = jnp.take_along_axis(logp, labels[..., None].astype(jnp.int32), axis=-1)
            return -picked.mean()

        return jax.grad(loss)(w)

    ng = _tiny_program(grad_of_loss, (b, s, d), (d, v), (b, s - 1))
    T = ng.program.tensors
    logits = b * (s - 1) * v
    reads, writes = [], []
    for node in ng.nodes:
        for k in node_kernels(ng, node, ACCELERATOR_FUSION):
            if k.contraction or not k.runs:
                continue
            prims = tuple(ng.program.eqns[node.members[i].eqn].primitive for i in k.members)
            partial = {t for t, _, _ in k.partial}
            reads += [prims] * sum(T[x].size >= logits and x not in partial for x, _, _ in k.reads)
            writes += [prims] * sum(T[t].size >= logits and t not in partial for t, _ in k.writes)
    assert sorted(reads) == sorted(
        [("reduce_max",), ("reduce_sum",), ("reduce_sum",), ("pad",), ("pad",)]
    ), reads
    assert sorted(writes) == sorted([("broadcast_in_dim",), ("pad",)]), writes


def test_gpu_recomputes_short_row_reductions_in_their_readers():
    """The gradient of Σ softmax(x)·y over rows of at most `ROW_REDUCTION_LIMIT` on GPU rules:
    the max is computed inside the kernels that read x's rows and never written; the forward
    is one kernel reading x and writing the row sums, the backward one kernel reading x, the
    sums and y and writing the gradient, as XLA:GPU's normalization fusions ran GPT-2's
    attention softmax on an H100
    (`bench/fidelity/results/h100_hlo/gpt2_124m.hlo.gz`: fusion.939 reads
    the scores and writes the sums, fusion.769 reads them again with the probabilities'
    gradient). Rows wider than the limit keep their reductions in kernels of their own, which
    read x again; CPU rules never recompute a reduction."""
    import jax

    from jaxpar.cost.kernels import node_kernels
    from jaxpar.xla.fusion import ACCELERATOR_FUSION, CPU_FUSION, ROW_REDUCTION_LIMIT

    def traffic(rows, width, rules):
        """(row-sized reads, row-sized writes, row sums written) of the step's kernels."""
        ng = _tiny_program(
            lambda x, y: jax.grad(lambda x: (jax.nn.softmax(x, axis=-1) * y).sum())(x),
            (rows, width), (rows, width),
        )  # fmt: skip
        T = ng.program.tensors
        big, reads, writes, sums = rows * width, 0, 0, 0
        for node in ng.nodes:
            for k in node_kernels(ng, node, rules):
                if k.runs:
                    reads += sum(T[s].size == big for s, _, _ in k.reads)
                    writes += sum(T[t].size == big for t, _ in k.writes)
                    sums += sum(T[t].size == rows for t, _ in k.writes)
        return reads, writes, sums

    assert traffic(16, 1024, ACCELERATOR_FUSION) == (3, 1, 1)
    wide = traffic(2, ROW_REDUCTION_LIMIT * 2, ACCELERATOR_FUSION)
    assert wide[0] > 3 and wide[2] >= 2  # the max written and x read again for it
    assert traffic(16, 1024, CPU_FUSION)[0] > 3


def test_gpu_duplicates_a_producer_only_where_recomputing_reads_less():
    """XLA:GPU recomputes an elementwise result in each of its fusing readers when that reads
    no more than writing it once and reading it back would: exp(x) read by two reductions is
    recomputed from x in both; a sum of four tensors read by two is written once, since
    recomputing it would read all four in each reader."""
    import jax.numpy as jnp

    from jaxpar.xla.fusion import ACCELERATOR_FUSION, recomputed

    def cheap(x):
        t = jnp.exp(x)
        return (t * 2.0).sum(), (t * 3.0).sum(axis=0)

    def deep(a, b, c, d):
        t = a + b + c + d
        return (t * 2.0).sum(), (t * 3.0).sum(axis=0)

    for fn, shapes, expected in ((cheap, [(64, 32)], True), (deep, [(64, 32)] * 4, False)):
        program = _tiny_program(fn, *shapes).program
        made = next(e for e in program.eqns if e.primitive in ("exp", "add") and
                    len(program.consumers().get(e.outputs[0], [])) == 2)  # fmt: skip
        assert recomputed(program, made.outputs[0], ACCELERATOR_FUSION) is expected, fn


def test_a_reshard_prices_its_local_kernels():
    """`reshard.local_kernels`: a local slice is a kernel that reads and writes the new shard
    (2·after bytes); a collective on a tensor dim past the first runs between two layout
    copies (2·before + 2·after bytes, two kernels); on the first dim, none. Under "time" each
    costs kernels · overhead + bytes / memory bandwidth; under "comm" nothing."""
    from jaxpar.hardware import Cluster
    from jaxpar.hardware.mesh_model import mesh_axes
    from jaxpar.xla.reshard_paths import SLICE, reshard_linear, reshard_path

    mesh = mesh_axes(Cluster.preset("dgx-h100", devices=8), ("d",), (8,), None)
    whole, first, second = ((), ()), ((0,), ()), ((), (0,))
    b = 8192.0
    (cut,) = reshard_path(b, whole, second, mesh.sizes)
    assert (cut.kind, cut.local, cut.kernels, cut.nbytes) == (SLICE, 2 * b / 8, 1, 0.0)
    (late,) = reshard_path(b, second, whole, mesh.sizes)
    assert (late.local, late.kernels) == (2 * b / 8 + 2 * b, 2)
    (early,) = reshard_path(b, first, whole, mesh.sizes)
    assert (early.local, early.kernels) == (0.0, 0) and early.nbytes == late.nbytes
    fixed0, per0 = reshard_linear(first, whole, mesh, "time")
    fixed1, per1 = reshard_linear(second, whole, mesh, "time")
    assert fixed1 - fixed0 == pytest.approx(2 * mesh.kernel_overhead)
    assert per1 - per0 == pytest.approx((2 / 8 + 2) / mesh.mem_bandwidth)
    fixed, per = reshard_linear(whole, second, mesh, "time")
    assert (fixed, per) == pytest.approx((mesh.kernel_overhead, 2 / 8 / mesh.mem_bandwidth))
    assert reshard_linear(whole, second, mesh, "comm") == (0.0, 0.0)
    assert reshard_linear(second, whole, mesh, "comm") == reshard_linear(first, whole, mesh, "comm")


@pytest.mark.oracle
def test_xla_copies_the_result_of_a_gather_on_a_dim_past_the_first():
    """XLA:CPU runs an all-gather on the dim it moves made the most major: gathering dim 1 of a
    (32, 64) tensor over 8 devices, its program copies the result back (2 · 8 KB more bytes
    than gathering dim 0). The model's copies (`reshard.local_kernels`) are that plus the copy
    before the gather, which XLA fuses here into the elementwise producer: at least XLA's
    difference, at most 2·before more."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxpar.xla.reshard_paths import reshard_path

    mesh = jax.make_mesh((8,), ("d",), axis_types=(AxisType.Auto,))

    def compiled_bytes(spec):
        def f(x):
            y = jax.lax.with_sharding_constraint(x * 2.0, NamedSharding(mesh, spec))
            return jax.lax.with_sharding_constraint(y, NamedSharding(mesh, P())) @ jnp.ones(
                (64, 64)
            )

        x = jax.ShapeDtypeStruct((32, 64), jnp.float32, sharding=NamedSharding(mesh, spec))
        analysis = jax.jit(f).lower(x).compile().cost_analysis()
        return (analysis[0] if isinstance(analysis, list) else analysis)["bytes accessed"]

    xla = compiled_bytes(P(None, "d")) - compiled_bytes(P("d", None))
    b = 32 * 64 * 4
    assert xla == 2 * b
    (step,) = reshard_path(b, ((), (0,)), ((), ()), (8,))
    assert xla <= step.local <= xla + 2 * b / 8
