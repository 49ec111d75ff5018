"""The overlapped step (`jaxpar.overlap`): compute and communication on two in-order streams."""

import jaxpar_zoo as zoo
import numpy as np
import pytest

import jaxpar
from jaxpar.cost.overlap import COMM, COMPUTE, Task, Timeline, list_schedule, schedule


def _event_simulation(tasks: list[Task]) -> list[int]:
    """Brute force: advance time one unit at a time; a stream that is idle starts its next
    task (in list order) once every dependency has finished."""
    queues = {s: [i for i, t in enumerate(tasks) if t.stream == s] for s in (COMPUTE, COMM)}
    finish: dict[int, int] = {}
    running: dict[int, tuple[int, int]] = {}  # stream -> (task, end)
    t = 0
    while len(finish) < len(tasks):
        changed = True
        while changed:  # at time t: retire what has ended, start what may start, repeat
            changed = False
            for s in (COMPUTE, COMM):
                if s in running and running[s][1] <= t:
                    finish[running[s][0]] = running[s][1]
                    del running[s]
                    changed = True
                if s not in running and queues[s]:
                    i = queues[s][0]
                    if all(d in finish for d in tasks[i].deps):
                        queues[s].pop(0)
                        running[s] = (i, t + int(tasks[i].duration))
                        changed = True
        t += 1
    return [finish[i] for i in range(len(tasks))]


@pytest.mark.oracle
@pytest.mark.parametrize("seed", range(20))
def test_one_pass_schedule_equals_an_event_simulation(seed):
    rs = np.random.RandomState(seed)
    tasks = []
    for i in range(rs.randint(2, 25)):
        deps = tuple(sorted(set(rs.randint(0, i, size=rs.randint(0, 3))))) if i else ()
        tasks.append(Task(int(rs.randint(2)), float(rs.randint(0, 6)), deps))
    assert schedule(tasks) == pytest.approx(_event_simulation(tasks))


def _node_event_simulation(compute, after, producers, regions) -> tuple[int, list[int]]:
    """Brute force of `list_schedule`: advance time one unit at a time. An idle compute stream
    starts the first node in program order whose producers' results are ready (their compute,
    and their all-reduce if any, finished) and whose earlier regions have all started; a node's
    all-reduce is issued when its compute starts and the communication stream runs them in that
    order, each after its node's compute. Returns (makespan, the order nodes started in)."""
    n = len(compute)
    started, result_at, comm_queue, started_order = {}, {}, [], []
    comm_busy_until, t = 0, 0
    compute_busy_until = 0
    comm_running = None
    while len(result_at) < n or comm_running is not None:
        changed = True
        while changed:
            changed = False
            if comm_running is not None and comm_busy_until <= t:
                result_at[comm_running] = comm_busy_until
                comm_running, changed = None, True
            for v in list(started):  # results of nodes without an all-reduce
                end = started[v] + compute[v]
                if not after[v] and v not in result_at and end <= t:
                    result_at[v], changed = end, True
            if comm_running is None and comm_queue:
                v = comm_queue[0]
                if started[v] + compute[v] <= t:
                    comm_queue.pop(0)
                    comm_running, comm_busy_until, changed = v, t + after[v], True
            if compute_busy_until <= t:
                for v in range(n):
                    earlier = [w for w in range(n) if regions[w] < regions[v]]
                    if v in started or any(w not in started for w in earlier):
                        continue
                    if all(p in result_at and result_at[p] <= t for p in producers[v]):
                        started[v], compute_busy_until, changed = t, t + compute[v], True
                        started_order.append(v)
                        if after[v]:
                            comm_queue.append(v)
                        break
        t += 1
    return max(result_at.values(), default=0), started_order


@pytest.mark.oracle
@pytest.mark.parametrize("seed", range(40))
def test_list_schedule_equals_an_event_simulation(seed):
    """Random node graphs (program order topological, loop regions in runs, some nodes
    all-reducing their results): `list_schedule` on a `Timeline` gives the brute force's
    makespan and start order."""
    rs = np.random.RandomState(seed)
    n = int(rs.randint(1, 14))
    compute = [int(rs.randint(0, 6)) for _ in range(n)]
    after = [int(rs.randint(0, 5)) if rs.rand() < 0.5 else 0 for _ in range(n)]
    producers = [sorted(set(rs.randint(0, v, size=rs.randint(0, 3)).tolist())) if v else []
                 for v in range(n)]  # fmt: skip
    regions = np.cumsum(rs.rand(n) < 0.15).tolist()
    line, ran = Timeline(), []

    def issue(v):
        return [line.ready[p] for p in producers[v]]

    def run(v, tasks):
        ran.append(v)
        line.node(v, float(compute[v]), tasks, [], [float(after[v])] if after[v] else [])

    list_schedule(line, range(n), producers.__getitem__, regions.__getitem__, issue, run)
    makespan, order = _node_event_simulation(compute, after, producers, regions)
    assert line.makespan() == pytest.approx(makespan)
    assert ran == order


@pytest.mark.closed_form
def test_a_node_waiting_on_an_all_reduce_lets_independent_nodes_run():
    """Node 0 computes 2 and all-reduces 5; node 1 (1) reads it; node 2 (4) does not. In program
    order node 1 would wait until 7 and node 2 end at 12; list-scheduled, node 2 runs while the
    all-reduce does and node 1 after it: 8."""
    line = Timeline()
    producers = {0: [], 1: [0], 2: []}
    compute, after = {0: 2.0, 1: 1.0, 2: 4.0}, {0: [5.0], 1: [], 2: []}

    def run(v, tasks):
        line.node(v, compute[v], tasks, [], after[v])

    list_schedule(line, [0, 1, 2], producers.__getitem__, lambda v: -1,
                  lambda v: [line.ready[p] for p in producers[v]], run)  # fmt: skip
    assert line.makespan() == 8.0


@pytest.mark.closed_form
def test_a_gradient_all_reduce_hides_behind_independent_compute():
    """Node A computes 2 then all-reduces 3; node B (4) does not read A: the all-reduce runs
    beside B, 6 in all instead of Eq. 1's 9; a node reading A waits for the all-reduce."""
    line = Timeline()
    line.node(0, 2.0, [], [], [3.0])
    line.node(1, 4.0, [], [], [])
    assert line.makespan() == 6.0
    line.node(2, 1.0, [line.ready[0]], [], [])
    assert line.makespan() == 7.0


@pytest.mark.closed_form
@pytest.mark.parametrize("name", ["gpt_small", "cnn"])
def test_overlapped_step_lies_between_compute_and_eq1(name):
    """compute ≤ overlapped ≤ combined ≤ Eq. 1 for every strategy. Data parallelism on the
    small GPT: its gradient all-reduces combine into one collective, which takes every operand
    and so starts after the last gradient; only work that reads no gradient (Adam's step count)
    runs beside it. On the CNN, the batch norms' backward all-reduces (combined with the
    weight-gradient all-reduces beside them) lie on the backward pass's critical path, and the
    list scheduler runs the weight gradients and the updates of the layers already reduced
    while they wait (in program order, nothing hid)."""
    ex = zoo.get(name, small=True)
    for strategy in ("auto", "data", "model", "fsdp"):
        plan = jaxpar.plan(ex.step, *ex.args, mesh={"node": 2, "gpu": 4}, cluster="p100",
                           strategy=strategy)  # fmt: skip
        c = plan.cost
        assert c.compute_s * (1 - 1e-12) <= c.overlapped_step_s
        assert c.overlapped_step_s <= c.combined_step_s * (1 + 1e-12)
        assert c.combined_step_s <= c.step_s * (1 + 1e-12)
        if strategy == "data":
            groups = {"gpt_small": 1, "cnn": 12}[name]  # the CNN's closed by the batch norms
            assert c.combined_all_reduces == groups
            hidden = (c.combined_step_s - c.overlapped_step_s) / (c.combined_step_s - c.compute_s)
            if name == "gpt_small":
                assert 0 < hidden < 0.1, c  # Adam's step count: 2 nodes of 4 µs
            else:
                assert hidden > 0.5, c


@pytest.mark.closed_form
def test_gradient_all_reduce_groups_hide_behind_the_backward_pass():
    """GPT-2 124M, data parallel: 30 MiB combined all-reduces, each issued after its last
    gradient, run beside the backward compute of the layers below; the last waits for the
    first layer's gradients."""
    ex = zoo.get("gpt2_124m")
    plan = jaxpar.plan(ex.step, *ex.args, mesh={"node": 2, "gpu": 4}, cluster="p100",
                       strategy="data", memory_budget=None)  # fmt: skip
    c = plan.cost
    assert c.combined_all_reduces > 10
    hidden = c.combined_step_s - c.overlapped_step_s
    assert 0.02 * (c.combined_step_s - c.compute_s) < hidden < c.combined_step_s - c.compute_s


def _tiny_step():
    """A two-layer MLP train step (SGD), small enough to sample its whole space."""
    import jax
    import jax.numpy as jnp

    def step(params, batch):
        def loss_fn(p):
            h = jnp.tanh(batch["x"] @ p["w1"])
            return jnp.mean((h @ p["w2"] - batch["y"]) ** 2)

        grads = jax.grad(loss_fn)(params)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)

    f32 = jnp.float32
    params = {
        "w1": jax.ShapeDtypeStruct((64, 128), f32),
        "w2": jax.ShapeDtypeStruct((128, 32), f32),
    }
    batch = {"x": jax.ShapeDtypeStruct((256, 64), f32), "y": jax.ShapeDtypeStruct((256, 32), f32)}
    return step, params, batch


@pytest.mark.oracle
def test_overlap_lower_bound_is_below_every_sampled_plan():
    """`choose.overlap_lower_bound` (Σ over nodes of the least t_C) is at most the overlapped
    step of every plan (2,000 sampled, the baselines, and the plan of least compute, which
    reaches it on the compute stream), and the chosen plan is the shortest candidate."""
    from jaxpar.cost.evaluation import evaluate

    step, params, batch = _tiny_step()
    plan = jaxpar.plan(step, params, batch, mesh={"data": 4}, cluster="p100", objective="overlap")
    ctx, lower = plan.eval_context(), plan.lower_bound
    assert lower is not None and plan.evaluation.objective == plan.cost.overlapped_step_s
    rs = np.random.RandomState(0)
    sizes = [len(u) for u in plan.problem.unary]
    assert np.prod(sizes, dtype=float) > 1e4  # a space worth sampling
    least = [int(np.argmin(c)) for c in plan.tables.compute]
    samples = [least] + [[int(rs.randint(n)) for n in sizes] for _ in range(2000)]
    steps = [evaluate(ctx, a).cost for a in samples]
    assert steps[0].compute_s == pytest.approx(lower, rel=1e-12)
    assert min(c.overlapped_step_s for c in steps) >= lower * (1 - 1e-12)
    for _, ev in plan.choice.baselines.values():
        assert plan.cost.overlapped_step_s <= ev.cost.overlapped_step_s * (1 + 1e-12)
        assert ev.cost.overlapped_step_s >= lower * (1 - 1e-12)


@pytest.mark.closed_form
@pytest.mark.parametrize("name", ["gpt_small", "cnn"])
def test_overlap_objective_is_never_slower_than_the_eq1_plan_overlapped(name):
    """objective="overlap" runs the same searches (certified on Eq. 1) and keeps the candidate
    with the shortest overlapped step: never longer than the Eq. 1 plan's or a baseline's."""
    ex = zoo.get(name, small=True)
    kw = dict(mesh={"node": 2, "gpu": 4}, cluster="p100")
    eq1 = jaxpar.plan(ex.step, *ex.args, objective="time", **kw)
    ovl = jaxpar.plan(ex.step, *ex.args, **kw)  # the default
    assert ovl.objective == "overlap"
    assert ovl.cost.overlapped_step_s <= eq1.cost.overlapped_step_s * (1 + 1e-12)
    for _, ev in ovl.choice.baselines.values():
        assert ovl.cost.overlapped_step_s <= ev.cost.overlapped_step_s * (1 + 1e-12)
    assert ovl.choice.step_lower_bound == eq1.lower_bound  # the Eq. 1 certificate, kept
    assert ovl.lower_bound <= ovl.cost.compute_s * (1 + 1e-12)
    report = ovl.report()
    assert "overlapped step (its compute stream alone)" in report
    assert "overlap ms" in report


@pytest.mark.closed_form
def test_overlap_objective_on_one_device_is_certified():
    """One device: no communication, so the overlapped step is the least compute: certified."""
    step, params, batch = _tiny_step()
    plan = jaxpar.plan(step, params, batch, mesh={"data": 1}, cluster="p100", objective="overlap")
    assert plan.optimal
    assert plan.cost.overlapped_step_s == pytest.approx(plan.lower_bound, rel=1e-9)
    # an axis of one device beside a real one (one node of a cluster): no all-reduce over it
    two = jaxpar.plan(
        step, params, batch, mesh={"node": 1, "gpu": 2}, cluster="p100", objective="overlap"
    )
    assert two.cost.overlapped_step_s <= two.choice.baselines["data"][1].cost.overlapped_step_s


@pytest.mark.closed_form
def test_overlap_objective_under_a_memory_budget():
    """The budget's Lagrangian search compares plans by the same objective: under "overlap"
    every plan it prices reports its overlapped step, and the returned plan fits."""
    ex = zoo.get("gpt_small", small=True)
    kw = dict(mesh={"node": 2, "gpu": 4}, cluster="p100", objective="overlap")
    free = jaxpar.plan(ex.step, *ex.args, memory_budget=None, **kw)
    tight = jaxpar.plan(ex.step, *ex.args, memory_budget=0.6 * free.memory.peak, **kw)
    assert tight.memory.fits
    assert tight.stats["budget_bound"]
    assert tight.evaluation.objective == tight.cost.overlapped_step_s


@pytest.mark.closed_form
def test_combined_sync_problem_charges_gradient_all_reduces_their_combined_latency():
    """`tables.combined_sync_problem` (searched under "overlap"): on the data-parallel plan of
    the tiny MLP (4 devices) its objective is Eq. 1's less, for each gradient all-reduce the
    evaluation predicts, α · ring steps · (1 − share), share = max(min(1, buffer / 30 MiB),
    1 / 256) (XLA:GPU's combiner); no configuration of any node costs more than under Eq. 1,
    and a node without a gradient all-reduce costs the same."""
    from jaxpar.cost.search_tables import combined_sync_problem
    from jaxpar.hardware.collectives import ALL_REDUCE, ring_steps

    step, params, batch = _tiny_step()
    plan = jaxpar.plan(step, params, batch, mesh={"data": 4}, cluster="p100", objective="overlap")
    ctx = plan.eval_context()
    assert (ctx.combiner.max_bytes, ctx.combiner.max_count) == (30 * 2**20, 256)
    combined = combined_sync_problem(ctx.ng, ctx.tables, ctx.params, ctx.batch, ctx.combiner)
    eq1 = ctx.tables.problem
    data, ev = plan.choice.baselines["data"]
    syncs = [c for c in ev.collectives if c.reason == "gradient-sync"]
    assert len(syncs) == 2  # w1 and w2
    n, _, latency = ctx.params.mesh.group((0,))
    saved = 0.0
    for c in syncs:
        buffer = c.bytes * n / (2 * (n - 1))
        share = max(min(1.0, buffer / (30 * 2**20)), 1 / 256)
        saved += latency * ring_steps(ALL_REDUCE, n) * (1 - share)
    total = [sum(float(u[a]) for u, a in zip(p.unary, data, strict=True)) for p in (eq1, combined)]
    assert total[0] - total[1] == pytest.approx(saved, rel=1e-9)
    assert saved > 0
    for u, w in zip(eq1.unary, combined.unary, strict=True):
        assert (w <= u + 1e-18).all()
    assert combined.edges.keys() == eq1.edges.keys()
    pairs = enumerate(zip(eq1.unary, combined.unary, strict=True))
    grad_nodes = {v for v, (u, w) in pairs if (w < u).any()}
    assert grad_nodes and all(ctx.ng.nodes[v].phase == "backward" for v in grad_nodes)


def _offloading_step(layers: int = 4, width: int = 512, batch: int = 256):
    """A tanh MLP whose hidden activations a remat policy offloads to pinned host memory and
    brings back for the backward pass, with SGD; abstract arguments."""
    import jax
    import jax.numpy as jnp
    from jax.ad_checkpoint import checkpoint_name

    policy = jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[],
        names_which_can_be_offloaded=["hidden"],
        offload_src="device",
        offload_dst="pinned_host",
    )

    def block(w, x):
        return checkpoint_name(jnp.tanh(x @ w), "hidden") @ w

    def loss(ws, x):
        for w in ws:
            x = jax.checkpoint(block, policy=policy)(w, x)
        return jnp.mean(x**2)

    def step(ws, x):
        grads = jax.grad(loss)(ws, x)
        return [w - 0.1 * g for w, g in zip(ws, grads, strict=True)]

    ws = [jax.ShapeDtypeStruct((width, width), jnp.float32)] * layers
    return step, (ws, jax.ShapeDtypeStruct((batch, width), jnp.float32))


def _with_host_link(cluster: str, bandwidth: float):
    import dataclasses

    c = jaxpar.Cluster.preset(cluster, devices=8)
    return dataclasses.replace(c, device=dataclasses.replace(c.device, host_bandwidth=bandwidth))


@pytest.mark.closed_form
def test_host_copies_are_priced_on_the_host_link_and_hide_behind_compute():
    """Each move between device and host memory copies the device's shard over its host link:
    t_H = Σ shard bytes / host bandwidth, in Eq. 1 (`cost.host_move_seconds`). In the
    overlapped step the copies run on a copy engine per direction: on the H100's 64 GB/s link
    they hide behind compute (the step equals the one whose link is free); on a link 10,000
    times slower the copies set the step, at least each direction's total."""
    step, args = _offloading_step()
    plans = {}
    for name, bandwidth in (("h100", 64e9), ("free", 0.0), ("slow", 6.4e6)):
        cluster = _with_host_link("dgx-h100", bandwidth)
        plans[name] = jaxpar.plan(
            step, *args, mesh={"data": 8}, cluster=cluster, strategy="data", memory_budget=None
        )
    plan = plans["h100"]
    moves = [e for e in plan.program.eqns if e.primitive == "device_put"]
    to_host = [e for e in moves if plan.program.tensors[e.outputs[0]].host]
    assert len(to_host) == 4 and len(moves) == 8  # one offload and one return per layer
    shard = sum(plan.program.tensors[e.outputs[0]].nbytes for e in moves) / 8
    assert shard == 8 * 256 * 512 * 4 / 8  # the batch split: each device copies its rows
    for name, bandwidth in (("h100", 64e9), ("slow", 6.4e6)):
        c = plans[name].cost
        assert c.host_bytes == pytest.approx(shard)
        assert c.host_s == pytest.approx(shard / bandwidth)
        assert c.step_s == pytest.approx(c.compute_s + c.comm_s + c.host_s)
        assert c.compute_s <= c.overlapped_step_s <= c.step_s * (1 + 1e-12)
    free = plans["free"].cost
    assert free.host_s == 0 and free.host_bytes == pytest.approx(shard)
    assert plan.cost.overlapped_step_s == pytest.approx(free.overlapped_step_s, rel=1e-9)
    slow = plans["slow"].cost
    assert slow.overlapped_step_s >= slow.host_s / 2
    assert slow.overlapped_step_s > 10 * free.overlapped_step_s


@pytest.mark.closed_form
def test_a_move_back_from_the_host_is_issued_ahead_by_its_own_time():
    """`_prefetch_after`: a move back is issued after the last node before compute of at least
    its copy time, walking back over its own loop body; the nodes of another region stop it."""
    from types import SimpleNamespace

    from jaxpar.cost.step_timeline import _prefetch_after

    regions = [-1, -1, -1, -1, -1, 0, 0, 0]
    ng = SimpleNamespace(nodes=[SimpleNamespace(region=r) for r in regions])
    order = list(range(8))
    t_c = [1.0, 2.0, 3.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    t_h = [0.0, 0.0, 0.0, 0.0, 4.0, 0.0, 0.0, 5.0]
    moves = {3: True, 4: False, 7: False}
    # node 4 needs 4 s: nodes 2 (3 s) and 1 (2 s) cover it; issued after node 0 (node 3, a
    # copy alone, runs no compute); node 7 needs 5 s, its body has 2: after node 4's region,
    # whose last computing node is 2
    assert _prefetch_after(ng, order, t_c, t_h, moves) == {4: 0, 7: 2}


@pytest.mark.closed_form
def test_report_says_what_is_offloaded_and_how_it_is_priced():
    """The report's host line: the bytes each device copies, the link priced (H100), the
    unknown link not priced (TPU v5p), no copies on XLA:CPU's one memory."""
    step, args = _offloading_step()
    h100 = jaxpar.plan(step, *args, mesh={"data": 8}, cluster="dgx-h100", memory_budget=None)
    text = h100.report()
    kb = h100.cost.host_bytes / 1e3
    assert f"host offload: {kb:.2f} KB copied per device per step (both ways)" in text
    assert "on its 64 GB/s host link" in text and "+ host copies" in text
    tpu = jaxpar.plan(step, *args, mesh={"data": 8}, cluster="tpu-v5p", memory_budget=None)
    assert "not priced, " in tpu.report() and tpu.cost.host_s == 0
    cpu = jaxpar.plan(step, *args, mesh=jaxpar.make_mesh({"data": 8}), memory_budget=None)
    assert "XLA:CPU has one memory" in cpu.report() and cpu.cost.host_s == 0
    assert "host link" in jaxpar.Cluster.preset("dgx-h100").describe()


@pytest.mark.closed_form
def test_device_spec_rejects_a_negative_host_link():
    with pytest.raises(ValueError, match="host_bandwidth must be >= 0"):
        jaxpar.DeviceSpec("x", {"float32": 1e12}, 1e12, 1e9, host_bandwidth=-1.0)
