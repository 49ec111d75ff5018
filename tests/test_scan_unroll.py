"""Scans unrolled by k (``lax.scan(..., unroll=k)``): XLA runs k copies of the body per loop
iteration, in one computation, and its combiner merges the copies' independent all-reduces
(`combine.combined_runs`, `graph.Region.copies` / `iterations`)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpar
from jaxpar.program.graph import SCAN, Program, Region
from jaxpar.verify.compiled import fidelity
from jaxpar.xla.allreduce_combiner import COMBINERS, AllReduceItem, Combiner, combined_runs

LAYERS, WIDTH, ROWS = 6, 64, 32


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def _tanh_step(unroll):
    """A tanh MLP scanned over its stacked weights [L, d, d], SGD."""

    def step(ws, x):
        def loss(ws):
            h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws, unroll=unroll)
            return jnp.mean(h**2)

        return ws - 0.1 * jax.grad(loss)(ws)

    return step


def _residual_step(unroll):
    """Residual two-matrix blocks scanned over (w1 [L, d, 4d], w2 [L, 4d, d]), SGD."""

    def step(w1, w2, x):
        def loss(p):
            def body(h, w):
                return h + jnp.tanh(h @ w[0]) @ w[1], None

            h, _ = jax.lax.scan(body, x, p, unroll=unroll)
            return jnp.mean(h**2)

        g1, g2 = jax.grad(loss)((w1, w2))
        return w1 - 0.1 * g1, w2 - 0.1 * g2

    return step


def _region(trips: int, unroll) -> Region:
    return Region(0, SCAN, -1, trips, 0, ((0, 0),), 0, unroll=unroll)


@pytest.mark.closed_form
@pytest.mark.parametrize(
    "trips,unroll,copies,iterations",
    [(6, 1, 1, 6), (6, 2, 2, 3), (7, 2, 2, 3), (6, 4, 4, 0), (6, 6, 6, 0), (6, True, 6, 0),
     (12, 5, 5, 2), (1, 1, 1, 0)],
)  # fmt: skip
def test_loop_iterations_follow_jax_scan_lowering(trips, unroll, copies, iterations):
    """JAX runs trips // unroll iterations of unroll copies and the remainder in line; a loop
    of one iteration is no loop (XLA's while-loop simplifier inlines it)."""
    r = _region(trips, unroll)
    assert (r.copies, r.iterations) == (copies, iterations)


@pytest.mark.closed_form
def test_combined_runs_pack_copies_up_to_the_thresholds():
    """12 iterations of a body unrolled by 4, one gradient all-reduce of 10 MiB per copy:
    XLA:GPU's 30 MiB threshold packs 3 copies per combined all-reduce, so each iteration runs
    ⌈4 / 3⌉ = 2; XLA:CPU (no byte limit) packs all 4; at most 2 operands, 2 copies."""
    program = Program([], [], [], [], [], {}, [], [], regions=[_region(12, 4)])
    item = AllReduceItem(0, ("add", "float32", (0,), 0, 0), 10 * 2**20, 0)
    assert combined_runs(program, [item], COMBINERS["gpu"]) == 3 * 2
    assert combined_runs(program, [item], COMBINERS["cpu"]) == 3
    assert combined_runs(program, [item], Combiner("x", math.inf, 2)) == 3 * 2
    assert combined_runs(program, [item, item], Combiner("x", math.inf, 2)) == 12


@pytest.mark.numerics
@pytest.mark.parametrize("unroll", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("strategy", ["data", "fsdp"])
def test_unrolled_copies_combine_their_gradient_all_reduces(unroll, strategy, x64):
    """The stacked gradient's all-reduces of a tanh MLP scan (6 layers, 8 devices): one per
    layer unrolled by 1, and as XLA combines the copies of each iteration (6 / unroll combined
    all-reduces, the 2 left over by unroll 4 in line with the one iteration XLA inlines: 1).
    The step equals the unsharded one in float64, the predicted all-reduces equal the
    compiled program's, and a GPU step saves their latency."""
    step = _tanh_step(unroll)
    ws = jax.random.normal(jax.random.key(0), (LAYERS, WIDTH, WIDTH)) / WIDTH**0.5
    x = jax.random.normal(jax.random.key(1), (ROWS, WIDTH))
    sharded = jaxpar.auto_shard(step, mesh=jaxpar.make_mesh({"d": 8}), strategy=strategy)
    np.testing.assert_allclose(sharded(ws, x), jax.jit(step)(ws, x), rtol=1e-12, atol=1e-12)
    check = fidelity(sharded.plan.collectives, sharded.lower(ws, x).compile())
    expected = {1: 6, 2: 3, 3: 2, 4: 1, 6: 1}[unroll]
    assert check.predicted_counts["all-reduce"] == check.hlo_counts["all-reduce"] == expected
    assert check.ok() and check.counts_ok(), check.text
    args = (jax.ShapeDtypeStruct(ws.shape, ws.dtype), jax.ShapeDtypeStruct(x.shape, x.dtype))
    gpu = jaxpar.plan(step, *args, mesh={"d": 8}, cluster="dgx-h100", strategy=strategy)
    once = jaxpar.plan(_tanh_step(1), *args, mesh={"d": 8}, cluster="dgx-h100", strategy=strategy)
    assert gpu.cost.combined_all_reduces == expected
    assert gpu.cost.step_s == once.cost.step_s  # Eq. 1: every all-reduce its latency
    if unroll > 1:
        assert gpu.cost.combined_step_s < once.cost.combined_step_s


@pytest.mark.numerics
@pytest.mark.parametrize("unroll,expected", [(1, 7), (2, 4), (3, 3), (4, 1), (6, 1)])
def test_copies_in_line_combine_with_the_step_around_them(unroll, expected, x64):
    """A dense layer before the scan: its gradient all-reduce is the step's own. Rolled, the
    loop's combine apart from it (6 / unroll + 1); with every copy in line (unroll 6, or 4:
    one iteration, which XLA inlines, and two copies after it) they all combine into one."""

    def step(w0, ws, x):
        def loss(w0, ws):
            h, _ = jax.lax.scan(
                lambda h, w: (jnp.tanh(h @ w), None), jnp.tanh(x @ w0), ws, unroll=unroll
            )
            return jnp.mean(h**2)

        g0, g = jax.grad(loss, argnums=(0, 1))(w0, ws)
        return w0 - 0.1 * g0, ws - 0.1 * g

    keys = jax.random.split(jax.random.key(3), 3)
    w0 = jax.random.normal(keys[0], (WIDTH, WIDTH)) / WIDTH**0.5
    ws = jax.random.normal(keys[1], (LAYERS, WIDTH, WIDTH)) / WIDTH**0.5
    x = jax.random.normal(keys[2], (ROWS, WIDTH))
    sharded = jaxpar.auto_shard(step, mesh=jaxpar.make_mesh({"d": 8}), strategy="data")
    for got, want in zip(sharded(w0, ws, x), jax.jit(step)(w0, ws, x), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    check = fidelity(sharded.plan.collectives, sharded.lower(w0, ws, x).compile())
    assert check.predicted_counts["all-reduce"] == check.hlo_counts["all-reduce"] == expected
    assert check.ok(), check.text


@pytest.mark.numerics
@pytest.mark.parametrize("unroll", [1, 2, 3])
def test_partial_sums_on_the_carry_stay_one_per_copy(unroll, x64):
    """Megatron-style residual blocks (the auto plan on 2 x 4): each copy's partial-sum
    all-reduce feeds the carry the next copy reads, so copies never combine (12 per step
    however unrolled), as in the compiled program; the step equals the unsharded one."""
    step = _residual_step(unroll)
    keys = jax.random.split(jax.random.key(2), 3)
    w1 = jax.random.normal(keys[0], (LAYERS, WIDTH, 4 * WIDTH)) / WIDTH**0.5
    w2 = jax.random.normal(keys[1], (LAYERS, 4 * WIDTH, WIDTH)) / (4 * WIDTH) ** 0.5
    x = jax.random.normal(keys[2], (ROWS, WIDTH))
    sharded = jaxpar.auto_shard(step, mesh=jaxpar.make_mesh({"a": 2, "b": 4}))
    for got, want in zip(sharded(w1, w2, x), jax.jit(step)(w1, w2, x), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    partial = [c for c in sharded.plan.collectives if c.reason == "partial-sum"]
    assert partial and all(c.group_runs == c.count == LAYERS for c in partial)
    check = fidelity(sharded.plan.collectives, sharded.lower(w1, w2, x).compile())
    assert check.predicted_counts == check.hlo_counts, check.text
    assert check.ok(), check.text


@pytest.mark.closed_form
def test_a_scan_run_in_line_overlaps_its_steps_like_a_pipelined_loop():
    """Unrolled whole, the scan is no loop. Where each layer's gradient is an all-reduce of its
    own (64 MiB at d = 4,096, over the 30 MiB the GPU combiner packs), it runs beside the next
    layer's backward, as a pipelined loop's does (`PlannerOptions.overlapped_regions`): the
    data-parallel step is its compute alone, where rolled each iteration's is exposed. Where the
    copies' gradients combine into one all-reduce (1 MiB each at d = 512), it waits for the
    last copy (`step_timeline.schedule_step` issues it where the scan's nodes have all run).
    Nothing is reported or warned about XLA's pipeliner flags: no loop needs them."""
    steps = {}
    for width, rows in ((4096, 2048), (512, 64)):
        args = (
            jax.ShapeDtypeStruct((LAYERS, width, width), jnp.float32),
            jax.ShapeDtypeStruct((rows, width), jnp.float32),
        )
        for unroll in (1, LAYERS):
            steps[width, unroll] = jaxpar.plan(
                _tanh_step(unroll), *args, mesh={"d": 8}, cluster="dgx-h100", strategy="data",
                memory_budget=None,
            )  # fmt: skip
    rolled, in_line = steps[4096, 1].cost, steps[4096, LAYERS].cost
    assert steps[4096, LAYERS].program.inline_scans() and not steps[4096, 1].program.inline_scans()
    assert in_line.compute_s == pytest.approx(rolled.compute_s, rel=1e-12)
    assert in_line.combined_all_reduces == rolled.combined_all_reduces == LAYERS
    assert rolled.overlapped_step_s > 1.1 * rolled.compute_s
    assert in_line.overlapped_step_s == pytest.approx(in_line.compute_s, rel=1e-9)
    combined, looped = steps[512, LAYERS].cost, steps[512, 1].cost
    assert combined.combined_all_reduces == 1
    # after the last copy only the update is left to hide it; rolled, each iteration's shows
    assert 1.05 * combined.compute_s < combined.overlapped_step_s < looped.overlapped_step_s
    assert not steps[4096, LAYERS].options.pipelined_regions(steps[4096, LAYERS].program)
    assert "pipelined loops" not in steps[4096, LAYERS].report()
