"""Evaluation: the reported cost and the predicted collectives of one assignment.

The one place an assignment is priced for the user. Node terms come from the same functions as
the search's unary tables (`cost.compute_times` via the tables, `cost.node_collectives`); reads
are priced along `reshard.reshard_path`, each collective step once per (tensor, before, after)
however many readers share it, exactly as `apply` emits it (docs/design.md, "Reported cost").
So ``Evaluation.objective`` lies between the ``bound`` and ``problem`` objectives of `tables`
(equal to both when the tables are exact).

Pure: numpy only.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import numpy as np

from .collectives import ALL_GATHER, ALL_REDUCE, all_reduce_buffer, ring_steps
from .combine import (
    COMBINERS,
    AllReduceItem,
    Combiner,
    combined_runs,
    group_all_reduces,
    item_dependencies,
)
from .configs import spec_of, split_axes
from .cost import CostParams, is_grad_sync, node_collectives, node_dtype, node_price
from .graph import SCAN_SLICE, SCAN_STACK, shape_str
from .hardware.speeds import MeshSpeeds
from .nodes import NodeGraph
from .overlap import COMM, COMPUTE, Timeline, list_schedule
from .reshard import SLICE, local_priced, local_time, priced_steps, reshard_path, step_time
from .tables import CostTables, gathers_free


@dataclasses.dataclass(frozen=True)
class Collective:
    """One predicted collective."""

    kind: str  # all-reduce / all-gather / all-to-all / collective-permute
    axes: tuple[str, ...]  # mesh axes of its groups
    group_size: int
    bytes: float  # bytes sent per device per step (ring accounting), all `count` runs
    time_s: float  # per step, all `count` runs
    tensor: str  # dtype[shape] of the full tensor
    reason: str  # "reshard", "partial-sum", "gradient-sync", "halo", "state-feedback"
    phase: str
    layer: str
    count: int = 1  # runs per step: the trip counts of the loops it runs in
    group: int = -1  # all-reduces: its combined all-reduce (`combine`); -1 for other kinds
    # all-reduces: runs per step of its combined all-reduce (below ``count`` where the copies
    # of an unrolled scan's body combine: `combine.combined_runs`)
    group_runs: int = 0


@dataclasses.dataclass(frozen=True)
class PlanCost:
    """Predicted cost of one training step."""

    step_s: float  # t_C + t_X + t_S (OptCNN Eq. 1)
    compute_s: float  # Σ t_C
    comm_s: float  # Σ t_X + Σ t_S
    comm_bytes: float  # bytes sent per device per step
    reshard_s: float  # Σ t_X: resharding, non-gradient partial sums, halos
    sync_s: float  # Σ t_S: gradient all-reduces (partial sums over the batch)
    # AccPar's ratio split: the same plan with every split that crosses device groups of
    # different speed partitioned in proportion to speed (Eq. 10); NamedSharding splits evenly,
    # so step_s is what XLA runs and ratio_step_s what uneven partitioning would give.
    ratio_step_s: float = math.nan  # t_C with ratios + the same t_X + t_S
    ratio_compute_s: float = math.nan  # Σ t_C with ratios (= compute_s on homogeneous meshes)
    # XLA's combiner merges independent all-reduces (`combine`): latency once per combined one
    combined_step_s: float = math.nan  # step_s with all-reduce latency per combined group
    combined_all_reduces: int = 0  # all-reduces per step after combining (runs counted)
    # compute and communication on two streams (`overlap`); ≤ combined_step_s ≤ step_s
    overlapped_step_s: float = math.nan
    # bytes the reshards' local kernels read and write (slices, layout copies around
    # collectives: `reshard.local_kernels`; their time is in reshard_s), beside the nodes'
    # compute traffic (`cost.plan_work`)
    local_bytes: float = 0.0

    def step_for(self, objective: str) -> float:
        """The step a plan is compared by: the overlapped one under "overlap", else Eq. 1."""
        return self.overlapped_step_s if objective == "overlap" else self.step_s

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class NodeRow:
    """One node's share of the step."""

    t_C: float
    t_C_ratio: float
    t_X: float  # reshards into this node, its non-gradient partial sums and halos
    t_S: float  # its gradient all-reduces
    bytes: float


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """Stage result: the reported cost of an assignment."""

    cost: PlanCost
    collectives: tuple[Collective, ...]
    # per node, its `NodeRow`'s fields in order (one array: an evaluation keeps no object per
    # node, and most evaluations are never shown)
    rows: np.ndarray = dataclasses.field(compare=False, repr=False)
    objective: float  # under the planning objective: step_s ("time"), bytes ("comm") or
    # overlapped_step_s ("overlap")

    @functools.cached_property
    def node_rows(self) -> tuple[NodeRow, ...]:
        """One node's share of the step, per node."""
        return tuple(NodeRow(*map(float, row)) for row in self.rows)


@dataclasses.dataclass(frozen=True)
class EvalContext:
    """What evaluating any assignment of one set of tables needs."""

    ng: NodeGraph
    tables: CostTables
    params: CostParams
    batch: Sequence[set[int]]
    labels: Sequence[str]
    feedback: frozenset[int]  # state results that become the next step's arguments
    speeds: MeshSpeeds | None = None
    combiner: Combiner = COMBINERS["gpu"]  # the target backend's all-reduce combiner
    # the scans whose steps overlap one another's collectives: the loops XLA's collective
    # pipeliner moves them across (`PlannerOptions.pipelined_loops`) and the scans it runs in
    # line (`PlannerOptions.overlapped_regions`)
    pipelined: frozenset[int] = frozenset()
    # what every evaluation of these tables shares (`_priced_reads`), built on first use
    memo: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)


def _tensor_name(ng: NodeGraph, tid: int) -> str:
    t = ng.program.tensors[tid]
    return f"{t.dtype}{shape_str(t.shape)}"


@dataclasses.dataclass(frozen=True)
class _NodeTerms:
    """What a node contributes under one of its configurations, whatever the rest does."""

    price: float  # its term of the objective (`node_price`, all iterations)
    t_C: float
    t_C_ratio: float
    t_X: float  # its non-gradient partial sums and halos
    t_S: float  # its gradient all-reduces
    nbytes: float
    # its own collectives, each with its combiner item and latency per run (all-reduces only)
    collectives: tuple[tuple[Collective, AllReduceItem | None, float], ...]


def _node_terms(ctx: EvalContext, v: int, a: int) -> _NodeTerms:
    """Node ``v``'s terms under configuration ``a`` (kept in ``ctx.memo``: evaluations of one
    set of tables mostly agree on a node's configuration)."""
    memo = ctx.memo.setdefault("nodes", {})
    hit = memo.get((v, a))
    if hit is not None:
        return hit
    ng, mesh = ctx.ng, ctx.params.mesh
    node = ng.nodes[v]
    cfg = ctx.tables.configs[v][a]
    compute = float(ctx.tables.compute[v][a])  # all iterations of a loop body's node
    trips = ng.program.trips(node.region)
    own = node_collectives(ng, node, cfg, mesh)
    factor = 1.0
    if ctx.speeds is not None:
        factor = ctx.speeds.factor(node_dtype(ng, node), split_axes(cfg))
    terms = {"t_X": 0.0, "t_S": 0.0}
    nbytes = 0.0
    sync = is_grad_sync(node, cfg, ctx.batch[v])
    colls = []
    for c in own:
        if c.kind == ALL_REDUCE:
            reason, term = ("gradient-sync", "t_S") if sync else ("partial-sum", "t_X")
            tensor = _tensor_name(ng, c.tensor)
        else:
            reason, term, tensor = "halo", "t_X", "halo"
        terms[term] += c.time_s * trips
        nbytes += c.nbytes * trips
        axes = tuple(mesh.names[x] for x in c.axes)
        item, latency = None, 0.0
        if c.kind == ALL_REDUCE and c.group_size > 1:
            n, _, lat = mesh.group(c.axes)
            key = (node.space.reduce_op, ng.program.tensors[c.tensor].dtype, c.axes)
            # XLA combines within one computation: a cond's branches never together, a scan it
            # runs in line with the computation around it
            comp = ng.program.computation(node.region)
            body = ng.program.body_of(comp, node.anchor)
            item = AllReduceItem(
                node.anchor, (*key, comp, body), all_reduce_buffer(c.nbytes, n), node.region
            )
            latency = lat * ring_steps(ALL_REDUCE, n)
        collective = Collective(
            c.kind, axes, c.group_size, c.nbytes * trips, c.time_s * trips, tensor, reason,
            node.phase, ctx.labels[v], trips,
        )  # fmt: skip
        colls.append((collective, item, latency))
    price = node_price(compute / trips, own, ctx.params.objective) * trips
    hit = _NodeTerms(
        price, compute, compute * factor, terms["t_X"], terms["t_S"], nbytes, tuple(colls)
    )
    memo[(v, a)] = hit
    return hit


def evaluate(ctx: EvalContext, assignment: Sequence[int]) -> Evaluation:
    """Cost, per-node rows and predicted collectives of ``assignment``."""
    ng, tables, mesh = ctx.ng, ctx.tables, ctx.params.mesh
    t_c, ratio, t_x, t_s, sent_bytes = [], [], [], [], []  # per node, its row's fields
    colls: list[Collective] = []
    items: list[tuple[int, AllReduceItem, float]] = []  # (collective, item, latency per run)
    own_of: list[list[int]] = [[] for _ in ng.nodes]  # per node, its own collectives
    objective = 0.0
    for v in range(len(ng.nodes)):
        terms = _node_terms(ctx, v, assignment[v])
        objective += terms.price
        t_c.append(terms.t_C)
        ratio.append(terms.t_C_ratio)
        t_x.append(terms.t_X)
        t_s.append(terms.t_S)
        sent_bytes.append(terms.nbytes)
        for collective, item, latency in terms.collectives:
            own_of[v].append(len(colls))
            if item is not None:
                items.append((len(colls), item, latency))
            colls.append(collective)
    # (tensor, context, before, after): each reshard step is emitted once per loop context
    produced: set[tuple] = set()
    paths: dict[int, list[tuple[tuple, float]]] = {}  # per resharded use, (key, s) per step
    configs = tables.configs
    local = local_priced(mesh, ctx.params.objective)
    local_bytes = 0.0  # what the reshards' local kernels read and write
    priced = _priced_reads(ctx)
    gathered: set[int] = set()  # resharded reads that only gather (and slice)
    for r in _resharded(ctx, assignment):  # the rest are read as they are (most reads)
        u, use, nbytes, trips, feedback, name, gathers_free = priced[r]
        src = spec_of(use.src_map, configs[use.src][assignment[use.src]])
        dst = spec_of(use.dst_map, configs[use.dst][assignment[use.dst]])
        path = reshard_path(nbytes, src, dst, mesh.sizes)
        steps = priced_steps(path, gathers_free, local)
        if ctx.pipelined and all(step.kind in (ALL_GATHER, SLICE) for step in steps):
            gathered.add(u)
        for step in steps:
            key = (use.tensor, use.context, step.before, step.after)
            sent = step_time(step, mesh) * trips
            copying = local_time(step, mesh) * trips if local else 0.0
            paths.setdefault(u, []).append((key, sent + copying))
            if key in produced:
                continue
            produced.add(key)
            t, moved = sent + copying, step.nbytes * trips
            objective += moved if ctx.params.objective == "comm" else t
            t_x[use.dst] += t
            if local:
                local_bytes += step.local * trips
            if step.kind == SLICE:  # a local kernel: no collective, nothing sent
                continue
            sent_bytes[use.dst] += moved
            colls.append(
                Collective(
                    step.kind, (mesh.names[step.axis],), mesh.sizes[step.axis], moved, t, name,
                    "state-feedback" if feedback else "reshard", ng.nodes[use.dst].phase,
                    ctx.labels[use.dst], trips,
                )
            )  # fmt: skip
    riding = _combine(ctx, colls, items)
    saved = sum(riding.values())
    plain = _plan_cost(t_c, ratio, t_x, t_s, sent_bytes)
    plain = dataclasses.replace(plain, local_bytes=local_bytes)
    schedules = [(ctx, gathered, False)]
    if any(pipelining(ctx)):  # the shortest placement, never longer unpipelined (`_timeline`)
        plain_ctx = dataclasses.replace(ctx, pipelined=frozenset(), memo=ctx.memo)
        schedules += [(ctx, gathered, True), (plain_ctx, set(), False)]
    overlapped = min(
        _timeline(c, t_c, colls, own_of, riding, paths, g, top).makespan()
        for c, g, top in schedules
    )
    cost = dataclasses.replace(
        plain,
        combined_all_reduces=sum({c.group: c.group_runs for c in colls if c.group >= 0}.values()),
        combined_step_s=plain.step_s - saved, overlapped_step_s=overlapped,
    )  # fmt: skip
    if ctx.params.objective == "overlap":  # the searches priced Eq. 1, its upper bound
        objective = overlapped
    rows = np.array([t_c, ratio, t_x, t_s, sent_bytes], dtype=np.float64).T
    rows.flags.writeable = False
    return Evaluation(cost, tuple(colls), rows, objective)


# Nodes that only change a tensor's shape, order or type: XLA's collective pipeliner moves an
# all-reduce across iterations through them (`pipelining`)
FORMATTING = frozenset(
    ("reshape", "squeeze", "expand_dims", "transpose", "convert_element_type", "copy")
)


def _priced_reads(ctx: EvalContext) -> list[tuple]:
    """The reads an evaluation prices, with what does not depend on the assignment: (use index,
    use, tensor bytes, trip count, whether it feeds the next step's state, tensor name, whether
    its gathers are free: `tables.gathers_free`). Reads of opaque, scalar or empty tensors move
    nothing. Kept in ``ctx.memo``."""
    if "reads" not in ctx.memo:
        ng, out = ctx.ng, []
        for u, use in enumerate(ctx.tables.uses):
            tensor = ng.program.tensors[use.tensor]
            if tensor.opaque or not tensor.shape or not tensor.nbytes:
                continue
            feedback = use.tensor in ctx.feedback and ng.nodes[use.dst].anchor < 0
            trips = ng.program.trips(use.context)
            free = gathers_free(ng.program, use.tensor, ctx.tables.reshards.devices)
            name = _tensor_name(ng, use.tensor)
            out.append((u, use, tensor.nbytes, trips, feedback, name, free))
        ctx.memo["reads"] = out
    return ctx.memo["reads"]


def _resharded(ctx: EvalContext, assignment: Sequence[int]) -> np.ndarray:
    """Positions in `_priced_reads` of the reads whose producer's layout differs from the
    reader's under ``assignment``, in order: compared as layout numbers
    (`tables.ReshardTables.layout_numbers`), all reads at once."""
    if "layouts" not in ctx.memo:
        reads = [use for _, use, *_ in _priced_reads(ctx)]
        ends = dict.fromkeys(k for u in reads for k in ((u.src, u.src_map), (u.dst, u.dst_map)))
        arrays = [ctx.tables.reshards.layout_numbers(*k) for k in ends]
        offset = dict(zip(ends, np.cumsum([0, *map(len, arrays)]).tolist(), strict=False))
        src_at = np.array([offset[(u.src, u.src_map)] for u in reads], dtype=np.int64)
        dst_at = np.array([offset[(u.dst, u.dst_map)] for u in reads], dtype=np.int64)
        flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
        srcs = np.array([use.src for use in reads], dtype=np.int64)
        dsts = np.array([use.dst for use in reads], dtype=np.int64)
        ctx.memo["layouts"] = (flat, src_at, dst_at, srcs, dsts)
    flat, src_at, dst_at, srcs, dsts = ctx.memo["layouts"]
    a = np.asarray(assignment, dtype=np.int64)
    return np.flatnonzero(flat[src_at + a[srcs]] != flat[dst_at + a[dsts]])


def _combine(ctx: EvalContext, colls: list[Collective], items) -> dict[int, float]:
    """Group the all-reduces as the combiner does (`combine`) and tag each with its group.
    Returns, per collective that rides on an earlier member of its group, the latency it no
    longer pays (per step)."""
    if not items:
        return {}
    program = ctx.ng.program
    just = [it for _, it, _ in items]
    groups = group_all_reduces(just, item_dependencies(program, just), ctx.combiner)
    members: dict[int, list[AllReduceItem]] = {}
    for it, g in zip(just, groups, strict=True):
        members.setdefault(g, []).append(it)
    riding, runs = {}, {}
    for (k, _, latency), g in zip(items, groups, strict=True):
        count = colls[k].count
        if g in runs:
            riding[k] = latency * count
        else:  # the first member pays the latency, once per run of the combined all-reduce
            runs[g] = combined_runs(program, members[g], ctx.combiner)
            if runs[g] != count:  # the group's latency: once per run of it, whoever rides
                riding[k] = latency * (count - runs[g])
        colls[k] = dataclasses.replace(colls[k], group=g, group_runs=runs[g])
    return riding


def _timeline(ctx, t_c, colls, own_of, riding, paths, gathered, top: bool) -> Timeline:
    """The step on a compute and a communication stream (`overlap`): nodes list-scheduled in
    program order (`overlap.list_schedule`), each after the reshards it reads through; deferred
    reads (the state into the next step's layout, a scan's carry) at the end.

    In a pipelined loop (``ctx.pipelined``, `pipelining`) a loop body's node reads its
    gathered slices without waiting (they were gathered during the previous iteration), and
    the all-reduces of a node whose results are only stacked are the previous iteration's:
    all iterations' but the last run during the loop, the last after the loop's last run of
    their producer, and what reads the stacked results after the loop waits for both. The
    pipeliner puts them at the top of the next iteration's body, and XLA's scheduler may move
    them down it: ``top`` issues them on the communication stream where the loop starts, ahead
    of the iteration's own collectives (`_behind_seconds`), else after those, where their
    producer has run. `evaluate` takes the shorter schedule, and the unpipelined one if that
    is shorter still: moving collectives earlier can reorder the greedy list schedule for the
    worse (a list-scheduling anomaly, which XLA's scheduler, free to keep the collectives where
    they were, does not suffer)."""
    uses, nodes = ctx.tables.uses, ctx.ng.nodes
    line = Timeline()
    order, into, deferred, srcs, producers = _stream_order(ctx)
    behind, ahead = pipelining(ctx)
    late: dict[int, int] = {}  # node -> its all-reduce run an iteration behind (its last)
    started: dict[int, int] = {}  # pipelined loop -> a marker task where its compute starts
    early: dict[int, int] = {}  # ``top``: loop -> its all-reduces run behind, but the last

    def read(u: int) -> int | None:
        last = None
        steps = paths.get(u, ())
        share = 1.0
        if u in ahead and u in gathered:  # the first iteration's gathers, waited on
            share = 1.0 / _rounds(ctx.ng.program, nodes[uses[u].dst].region)
        for key, seconds in steps:
            last = line.reshard(key, uses[u].src, last, seconds * share)
        if share < 1.0:  # the rest, each during the iteration before its own
            rest = None
            for key, seconds in steps:
                rest = line.reshard((*key, "ahead"), uses[u].src, rest, seconds * (1 - share))
        return last if last is not None else line.ready.get(uses[u].src)

    ready = line.ready
    groups, member_of = _combined_groups(order, colls, own_of)
    owner = {k: v for v, ks in enumerate(own_of) for k in ks}  # collective -> its node
    program = ctx.ng.program
    moved = _behind_seconds(ctx, colls, owner, riding, groups, behind) if top else {}
    left = {g: len(members) for g, (members, _) in groups.items()}  # members not yet run
    # nodes run before a group's collective that read its members' results, directly or not
    # (a weight gradient's transpose): their results are ready only once it has finished
    waits: dict[int, set[int]] = {}  # node -> the open groups it waits for
    waiting: dict[int, list[int]] = {g: [] for g in groups}  # open group -> its waiting nodes

    def issue(v: int) -> list[int | None]:
        tasks = [read(u) if u in paths else ready.get(srcs[u]) for u in into.get(v, ())]
        if late:  # outside the loop, a stack waits for its all-reduces run an iteration behind
            loop = nodes[v].region
            tasks += [late.get(srcs[u]) for u in into.get(v, ()) if nodes[srcs[u]].region != loop]
        return tasks

    def behind_task(loop: int, seconds: float, deps: list, runs: int) -> int:
        """An all-reduce run an iteration behind: all rounds' but the last (at the top, or here
        where its producer has run), the last after ``deps``; the later of the two (``runs``:
        of its combined all-reduce, `_rounds`)."""
        rounds = _rounds(ctx.ng.program, loop, runs)
        if top:
            rest = early[loop]
        else:
            rest = line.add(COMM, seconds * (rounds - 1) / rounds, [started[loop]])
        last = line.add(COMM, seconds / rounds, deps)
        return last if line.finish[last] >= line.finish[rest] else rest

    def run(v: int, reads: list[int | None]) -> None:
        loop = nodes[v].region
        if loop in ctx.pipelined and loop not in started:
            started[loop] = line.add(COMPUTE, 0.0)
            if loop in moved:
                early[loop] = line.add(COMM, moved[loop], [started[loop]])
        before, after, later = [], [], []
        for k in own_of[v]:
            c = colls[k]
            if c.group in groups:
                continue  # runs with its combined all-reduce, after the group's last member
            seconds = c.time_s - riding.get(k, 0.0)
            if c.kind != ALL_REDUCE:
                before.append(seconds)
            else:
                if v in behind and _lags(program, loop, c.group_runs):
                    later.append((seconds, c.group_runs))
                elif in_line_copies(loop) > 1 and _rounds(program, loop, c.group_runs) == 1:
                    at_end.setdefault(loop, []).append((v, seconds))  # the copies' in one
                else:
                    after.append(seconds)
        line.node(v, t_c[v], reads, before, after)
        for seconds, runs in later:
            _latest(line, late, v, behind_task(loop, seconds, [ready[v]], runs))
        if late:  # formatting and stacking results reduced an iteration behind
            for u in into.get(v, ()):
                _latest(line, late, v, late.get(srcs[u]))
        pending = member_of.get(v, set()).union(*(waits.get(srcs[u], ()) for u in into.get(v, ())))
        pending = {g for g in pending if g in waiting}
        if pending:
            waits[v] = pending
            for g in pending:
                waiting[g].append(v)
        # a combined group's collective, once its last member has run: one collective takes
        # every operand
        for g in member_of.get(v, ()):
            left[g] -= 1
            if not left[g]:
                issue_group(g, loop)

    def issue_group(g: int, loop: int, end: int | None = None) -> None:
        """A combined group's collective, once its last member has run (in ``loop``); one that
        combines the copies of a scan run in line waits for the scan's ``end``: its last copy
        runs last (the body's nodes run once for all copies here)."""
        members, ks = groups[g]
        runs = colls[ks[0]].group_runs
        lagging = _moved_members(program, nodes, members, behind, runs)
        if end is None and len(lagging) < len(members) and in_line_copies(loop) > 1:
            at_end.setdefault(loop, []).append((g, None))
            return
        for part, tasks in ((lagging, late), (set(members) - lagging, ready)):
            if not part:
                continue
            seconds = sum(colls[k].time_s - riding.get(k, 0.0) for k in ks if owner[k] in part)
            deps = [ready[m] for m in members if m in part]
            if part is lagging:
                task = behind_task(nodes[next(iter(part))].region, seconds, deps, runs)
            else:
                task = line.add(COMM, seconds, [*deps, end])
            for t in waiting[g]:
                _latest(line, tasks, t, task)
        del waiting[g]

    def in_line_copies(region: int) -> int:
        """Copies of a scan run in line per run of the computation around it (1 elsewhere)."""
        if region < 0 or program.regions[region].iterations:
            return 1
        return program.trips(region) // program.trips(program.computation(region))

    def ended(loop: int) -> None:
        """A scan run in line has run all its nodes: the all-reduces combining its copies."""
        end = line.add(COMPUTE, 0.0)
        for g, seconds in at_end.pop(loop):
            if seconds is None:
                issue_group(g, loop, end)
            else:  # a node's own all-reduce of every copy
                _latest(line, ready, g, line.add(COMM, seconds, [ready[g], end]))

    def scheduled(v: int, reads: list[int | None]) -> None:
        for loop in [r for r in at_end if r != nodes[v].region]:
            ended(loop)
        run(v, reads)

    # scan run in line -> what waits for its end: (combined group, None) or (node, seconds)
    at_end: dict[int, list[tuple[int, float | None]]] = {}
    list_schedule(
        line, order, lambda v: producers.get(v, ()), lambda v: nodes[v].region, issue, scheduled
    )
    for loop in list(at_end):
        ended(loop)
    for u in deferred:
        read(u)
    return line


def _rounds(program, region: int, runs: int = 0) -> int:
    """The rounds a pipelined region's moved collectives spread over: its loop's iterations;
    where XLA runs the scan in line, the runs of their combined all-reduce per run of the
    computation around it (the copies combine: one all-reduce of them all waits for the last
    copy), or with none (``runs`` 0: gathers) the scan's steps."""
    r = program.regions[region]
    if r.iterations:
        return r.iterations
    if not runs:
        return r.trips
    return max(1, runs // program.trips(program.computation(region)))


def _behind_seconds(ctx, colls, owner, riding, groups, behind) -> dict[int, float]:
    """Per pipelined loop, the seconds of the all-reduces it runs behind, all rounds' but the
    last (`_rounds`): the behind nodes' own all-reduces, and their share of the combined
    groups whose members all are (`pipelining`) or which join a scan run in line to the step
    around it (`_moved_members`)."""
    nodes, program = ctx.ng.nodes, ctx.ng.program
    out: dict[int, float] = {}

    def add(k: int) -> None:
        loop, c = nodes[owner[k]].region, colls[k]
        rounds = _rounds(program, loop, c.group_runs)
        out[loop] = out.get(loop, 0.0) + (c.time_s - riding.get(k, 0.0)) * (1 - 1 / rounds)

    for k, c in enumerate(colls):
        v = owner.get(k)
        lone = v in behind and c.kind == ALL_REDUCE and c.group not in groups
        if lone and _lags(program, nodes[v].region, c.group_runs):
            add(k)
    for members, ks in groups.values():
        moved = _moved_members(program, nodes, members, behind, colls[ks[0]].group_runs)
        for k in ks:
            if owner[k] in moved:
                add(k)
    return out


def _moved_members(program, nodes, members: list[int], behind, runs: int) -> set[int]:
    """The members of a combined all-reduce (of ``runs`` per step) that run behind their
    iteration (`_lags`): all of them when all are behind (one collective takes them all); the
    behind ones when the group joins a scan run in line to the step around it (members of
    several regions: each copy's share runs behind its copy)."""
    inside = {m for m in members if m in behind}
    if not inside or not _lags(program, nodes[next(iter(inside))].region, runs):
        return set()
    if len(inside) == len(members) or len({nodes[m].region for m in members}) > 1:
        return inside
    return set()


def _lags(program, region: int, runs: int) -> bool:
    """Whether an all-reduce of a pipelined region (of ``runs`` per step) runs behind its
    round: always in a loop; in a scan run in line, when its copies make more than one
    all-reduce (one of them all waits for the last copy: `_timeline` issues it where the scan
    ends)."""
    if program.regions[region].iterations:
        return True
    copies = program.trips(region) // program.trips(program.computation(region))
    return _rounds(program, region, runs) >= min(copies, 2)


def _latest(line: Timeline, tasks: dict[int, int], v: int, task: int | None) -> None:
    """``tasks[v]``: ``task`` if it finishes after the one there."""
    if task is not None and (v not in tasks or line.finish[task] > line.finish[tasks[v]]):
        tasks[v] = task


def pipelining(ctx: EvalContext) -> tuple[frozenset[int], frozenset[int]]:
    """What XLA's collective pipeliner moves in the loops of ``ctx.pipelined`` (kept in
    ``ctx.memo``; empty sets when none is):

    - the nodes whose every reader stacks their results into the loop's ys, directly or
      through `FORMATTING` nodes (a weight gradient, transposed): their all-reduces run an
      iteration behind, beside the next iteration (XLA:GPU's forward pipelining of
      all-reduce);
    - the reads of an xs slice by a node of the same loop (a layer's weights): their
      all-gathers run an iteration ahead (backward pipelining of all-gather), so the reader
      does not wait for them (`_timeline` checks that a read only gathers)."""
    if not ctx.pipelined:
        return frozenset(), frozenset()
    if "pipelining" not in ctx.memo:
        nodes, eqns = ctx.ng.nodes, ctx.ng.program.eqns
        primitive = [eqns[n.anchor].primitive if n.anchor >= 0 else "" for n in nodes]
        readers: dict[int, set[int]] = {}
        ahead = set()
        for u, use in enumerate(ctx.tables.uses):
            if use.src == use.dst:
                continue
            readers.setdefault(use.src, set()).add(use.dst)
            loop = nodes[use.src].region
            if (
                loop in ctx.pipelined
                and nodes[use.dst].region == loop
                and primitive[use.src] == SCAN_SLICE
            ):
                ahead.add(u)
        behind: set[int] = set()
        for v in sorted(readers, key=lambda v: -max(m.eqn for m in nodes[v].members)):
            loop = nodes[v].region  # readers first: in reverse program order
            if loop in ctx.pipelined and all(
                nodes[d].region == loop
                and (primitive[d] == SCAN_STACK or (d in behind and primitive[d] in FORMATTING))
                for d in readers[v]
            ):
                behind.add(v)
        ctx.memo["pipelining"] = (frozenset(behind), frozenset(ahead))
    return ctx.memo["pipelining"]


def _combined_groups(order: list[int], colls: list[Collective], own_of) -> tuple[dict, dict]:
    """The combined all-reduces of more than one member, as group -> (its members' nodes, its
    collectives), and node -> its groups. One collective takes every operand, so it starts
    once its last member has run."""
    nodes: dict[int, list[int]] = {}
    members: dict[int, list[int]] = {}
    for v in order:
        for k in own_of[v]:
            g = colls[k].group
            if g >= 0:
                nodes.setdefault(g, []).append(v)
                members.setdefault(g, []).append(k)
    groups, member_of = {}, {}
    for g, ks in members.items():
        if len(ks) > 1:
            groups[g] = (list(dict.fromkeys(nodes[g])), ks)
            for v in groups[g][0]:
                member_of.setdefault(v, set()).add(g)
    return groups, member_of


def _stream_order(ctx: EvalContext) -> tuple[list, dict, list, list, dict]:
    """What the timeline of every assignment shares (kept in ``ctx.memo``): the nodes that run,
    in program order (an argument's node is ready at the start; the optimizer updates that
    joined it run where its last member does), the reads each waits on, the deferred reads
    (of a producer that runs later), each read's producing node, and each node's producers
    that run."""
    if "stream order" not in ctx.memo:
        ng = ctx.ng
        position = [max((m.eqn for m in n.members), default=-1) if n.anchor < 0 else n.anchor
                    for n in ng.nodes]  # fmt: skip
        order = sorted(range(len(ng.nodes)), key=lambda v: position[v])
        place = {v: i for i, v in enumerate(order)}
        into: dict[int, list[int]] = {}
        deferred = []
        for u, use in enumerate(ctx.tables.uses):
            if use.src != use.dst and place[use.src] < place[use.dst]:
                into.setdefault(use.dst, []).append(u)
            elif use.src != use.dst:
                deferred.append(u)
        running = [v for v in order if position[v] >= 0]
        sources = [use.src for use in ctx.tables.uses]
        runs = set(running)
        producers = {  # per node, the nodes that run whose results it waits on
            v: list(dict.fromkeys(sources[u] for u in us if sources[u] in runs))
            for v, us in into.items()
        }
        ctx.memo["stream order"] = (running, into, deferred, sources, producers)
    return ctx.memo["stream order"]


def _plan_cost(t_c, t_c_ratio, t_x, t_s, nbytes) -> PlanCost:
    """Totals of the node rows (OptCNN Eq. 1, and AccPar's ratio split beside it)."""
    compute = sum(t_c)
    ratio = sum(t_c_ratio)
    resh = sum(t_x)
    sync = sum(t_s)
    return PlanCost(
        step_s=compute + resh + sync,
        compute_s=compute,
        comm_s=resh + sync,
        comm_bytes=sum(nbytes),
        reshard_s=resh,
        sync_s=sync,
        ratio_step_s=ratio + resh + sync,
        ratio_compute_s=ratio,
    )
