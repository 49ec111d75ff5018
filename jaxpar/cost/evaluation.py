"""Evaluation: the reported cost and the predicted collectives of one assignment.

The one place an assignment is priced for the user. Node terms come from the same functions as
the search's unary tables (`cost.compute_times` via the tables, `cost.node_collectives`); reads
are priced along `reshard.reshard_path`, each collective step once per (tensor, before, after)
however many readers share it, exactly as `apply` emits it (docs/cost.md, "Reported cost").
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

from ..hardware.collectives import ALL_GATHER, ALL_REDUCE, all_reduce_buffer, ring_steps
from ..hardware.speeds import MeshSpeeds
from ..nodes.configs import Config, spec_of, split_axes
from ..nodes.planning_nodes import Node, NodeGraph
from ..program.graph import shape_str
from ..xla.allreduce_combiner import (
    COMBINERS,
    AllReduceItem,
    Combiner,
    combined_runs,
    group_all_reduces,
    item_dependencies,
)
from ..xla.reshard_paths import (
    SLICE,
    local_priced,
    local_time,
    priced_steps,
    reshard_path,
    step_time,
)
from .node_costs import (
    CostParams,
    host_move_bytes,
    is_grad_sync,
    node_collectives,
    node_dtype,
    node_price,
)
from .search_tables import CostTables, gathers_free
from .step_timeline import pipelining, schedule_step


@dataclasses.dataclass(frozen=True)
class Collective:
    """One predicted collective."""

    kind: str  # all-reduce / all-gather / all-to-all / collective-permute
    axes: tuple[str, ...]  # mesh axes of its groups
    group_size: int
    bytes: float  # bytes sent per device per step (ring accounting), all `count` runs
    time_s: float  # per step, all `count` runs
    tensor: str  # dtype[shape] of the full tensor
    reason: str  # "reshard", "partial-sum", "gradient-sync", "halo", "state-feedback", "shard_map"
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

    step_s: float  # t_C + t_X + t_S (OptCNN Eq. 1), + t_H (moves to and from host memory)
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
    # moves between device and host memory (a remat policy's offloaded residuals, both ways):
    # Σ t_H, in step_s; the overlapped step runs them on the copy engines
    # (`cost.host_move_seconds`), and bytes copied per device per step
    host_s: float = 0.0
    host_bytes: float = 0.0

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
    t_H: float  # its moves between device and host memory (`cost.host_move_seconds`)
    host_bytes: float  # what they copy per device
    # its own collectives, each with its combiner item and latency per run (all-reduces only)
    collectives: tuple[tuple[Collective, AllReduceItem | None, float], ...]


def group_order(
    ng: NodeGraph, node: Node, cfg: Config, reduced: tuple[int, ...]
) -> tuple[int, ...]:
    """The mesh axes a partial sum's replica groups are listed by: XLA's partitioner groups
    the devices by the tile coordinates outside the reduced axes, row-major, of the operand it
    partitions by (of a dot, the operand with more elements; else the first), so the axes
    splitting that operand in its dim order, then the axes replicating it. The combiner merges
    only identical replica-group lists: MaxText-style gradients over `data` of dots whose
    larger operand is split on `tensor` and of dots whose larger operand is split on `fsdp`
    list the same groups in two orders and stay apart (tests/test_maxtext.py)."""
    eqn = ng.program.eqns[node.anchor]
    maps = [(m, t) for m, t in zip(node.space.in_maps, eqn.inputs, strict=True) if m is not None]
    if not maps:
        return ()
    if eqn.primitive == "dot_general":
        m, _ = max(maps, key=lambda mt: ng.program.tensors[mt[1]].size)  # first on a tie
    else:
        m = maps[0][0]
    split = [a for axes in spec_of(m, cfg) for a in axes if a not in reduced]
    rest = [a for a in range(len(cfg)) if a not in reduced and a not in split]
    return (*split, *rest)


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
        if node.space.manual:  # a shard_map's body: its own collectives, of values inside it
            reason, term, tensor = "shard_map", "t_X", "shard_map body"
        elif c.kind == ALL_REDUCE:
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
            if c.body is not None:  # XLA combines a shard_map body's all-reduces like others
                key = (c.body.reduce_op, c.body.dtype, c.axes)
            else:
                key = (
                    node.space.reduce_op, ng.program.tensors[c.tensor].dtype, c.axes,
                    group_order(ng, node, cfg, c.axes),
                )  # fmt: skip
            # XLA combines within one computation: a cond's branches never together, a scan it
            # runs in line with the computation around it
            comp = ng.program.computation(node.region)
            body = ng.program.body_of(comp, node.anchor)
            feeds = None
            if c.body is not None:  # the shard_map's results its body computes from it
                outputs = ng.program.eqns[node.anchor].outputs
                feeds = tuple(outputs[k] for k in c.body.feeds)
            item = AllReduceItem(
                node.anchor,
                (*key, comp, body),
                all_reduce_buffer(c.nbytes, n),
                node.region,
                feeds,
            )
            latency = lat * ring_steps(ALL_REDUCE, n)
        collective = Collective(
            c.kind, axes, c.group_size, c.nbytes * trips, c.time_s * trips, tensor, reason,
            node.phase, ctx.labels[v], trips,
        )  # fmt: skip
        colls.append((collective, item, latency))
    host, host_bytes = ctx.tables.host[v], 0.0
    t_h = 0.0 if host is None else float(host[a])  # all iterations
    if host is not None:
        host_bytes = float(host_move_bytes(ng, node, [cfg], mesh)[0]) * trips
    price = node_price(compute / trips, own, ctx.params.objective, t_h / trips) * trips
    hit = _NodeTerms(
        price, compute, compute * factor, terms["t_X"], terms["t_S"], nbytes, t_h, host_bytes,
        tuple(colls),
    )  # fmt: skip
    memo[(v, a)] = hit
    return hit


def evaluate(ctx: EvalContext, assignment: Sequence[int]) -> Evaluation:
    """Cost, per-node rows and predicted collectives of ``assignment``."""
    tally = _Tally.empty(len(ctx.ng.nodes))
    for v in range(len(ctx.ng.nodes)):
        tally.add_node(_node_terms(ctx, v, assignment[v]), v)
    _add_reshards(ctx, tally, assignment)
    return _evaluation(ctx, tally)


@dataclasses.dataclass
class _Tally:
    """What `evaluate` sums: per node its row's fields, the collectives (and the all-reduces
    XLA's combiner may merge), each resharded read's steps, and the objective, in the order
    Eq. 1 adds them (so its float is the same whichever caller asks)."""

    t_c: list[float]
    ratio: list[float]
    t_x: list[float]
    t_s: list[float]
    sent_bytes: list[float]
    t_h: list[float]  # per node, its moves to and from host memory
    own_of: list[list[int]]  # per node, its own collectives
    colls: list[Collective] = dataclasses.field(default_factory=list)
    items: list[tuple[int, AllReduceItem, float]] = dataclasses.field(default_factory=list)
    paths: dict[int, list[tuple[tuple, float]]] = dataclasses.field(default_factory=dict)
    gathered: set[int] = dataclasses.field(default_factory=set)  # reads that only gather
    objective: float = 0.0
    host_bytes: float = 0.0
    local_bytes: float = 0.0  # what the reshards' local kernels read and write

    @classmethod
    def empty(cls, n: int) -> _Tally:
        return cls([], [], [], [], [], [], [[] for _ in range(n)])

    def add_node(self, terms: _NodeTerms, v: int) -> None:
        self.objective += terms.price
        self.t_c.append(terms.t_C)
        self.ratio.append(terms.t_C_ratio)
        self.t_x.append(terms.t_X)
        self.t_s.append(terms.t_S)
        self.sent_bytes.append(terms.nbytes)
        self.t_h.append(terms.t_H)
        self.host_bytes += terms.host_bytes
        for collective, item, latency in terms.collectives:
            self.own_of[v].append(len(self.colls))
            if item is not None:
                self.items.append((len(self.colls), item, latency))
            self.colls.append(collective)


def _add_reshards(ctx: EvalContext, tally: _Tally, assignment: Sequence[int]) -> None:
    """The reshards of the reads whose layouts differ: each step priced once per loop context
    (tensor, context, before, after), charged to its reader."""
    ng, mesh = ctx.ng, ctx.params.mesh
    produced: set[tuple] = set()
    configs = ctx.tables.configs
    local = local_priced(mesh, ctx.params.objective)
    priced = _priced_reads(ctx)
    for r in _resharded(ctx, assignment):  # the rest are read as they are (most reads)
        u, use, nbytes, trips, feedback, name, gathers_free = priced[r]
        src = spec_of(use.src_map, configs[use.src][assignment[use.src]])
        dst = spec_of(use.dst_map, configs[use.dst][assignment[use.dst]])
        path = reshard_path(nbytes, src, dst, mesh.sizes)
        steps = priced_steps(path, gathers_free, local)
        if ctx.pipelined and all(step.kind in (ALL_GATHER, SLICE) for step in steps):
            tally.gathered.add(u)
        for step in steps:
            key = (use.tensor, use.context, step.before, step.after)
            sent = step_time(step, mesh) * trips
            copying = local_time(step, mesh) * trips if local else 0.0
            tally.paths.setdefault(u, []).append((key, sent + copying))
            if key in produced:
                continue
            produced.add(key)
            t, moved = sent + copying, step.nbytes * trips
            tally.objective += moved if ctx.params.objective == "comm" else t
            tally.t_x[use.dst] += t
            if local:
                tally.local_bytes += step.local * trips
            if step.kind == SLICE:  # a local kernel: no collective, nothing sent
                continue
            tally.sent_bytes[use.dst] += moved
            tally.colls.append(
                Collective(
                    step.kind, (mesh.names[step.axis],), mesh.sizes[step.axis], moved, t, name,
                    "state-feedback" if feedback else "reshard", ng.nodes[use.dst].phase,
                    ctx.labels[use.dst], trips,
                )
            )  # fmt: skip


def _evaluation(ctx: EvalContext, tally: _Tally) -> Evaluation:
    """The tally's cost: combined all-reduces (`_combine`), the overlapped step (the shortest
    placement of pipelined loops' collectives, never longer unpipelined: `schedule_step`)."""
    t_c, t_h, colls = tally.t_c, tally.t_h, tally.colls
    riding = _combine(ctx, colls, tally.items)
    saved = sum(riding.values())
    plain = _plan_cost(t_c, tally.ratio, tally.t_x, tally.t_s, tally.sent_bytes, sum(t_h))
    plain = dataclasses.replace(plain, local_bytes=tally.local_bytes, host_bytes=tally.host_bytes)
    schedules = [(ctx, tally.gathered, False)]
    if any(pipelining(ctx)):
        plain_ctx = dataclasses.replace(ctx, pipelined=frozenset(), memo=ctx.memo)
        schedules += [(ctx, tally.gathered, True), (plain_ctx, set(), False)]
    overlapped = min(
        schedule_step(c, t_c, t_h, colls, tally.own_of, riding, tally.paths, g, top).makespan()
        for c, g, top in schedules
    )
    cost = dataclasses.replace(
        plain,
        combined_all_reduces=sum({c.group: c.group_runs for c in colls if c.group >= 0}.values()),
        combined_step_s=plain.step_s - saved, overlapped_step_s=overlapped,
    )  # fmt: skip
    objective = tally.objective
    if ctx.params.objective == "overlap":  # the searches priced Eq. 1, its upper bound
        objective = overlapped
    rows = np.array([t_c, tally.ratio, tally.t_x, tally.t_s, tally.sent_bytes], dtype=np.float64).T
    rows.flags.writeable = False
    return Evaluation(cost, tuple(colls), rows, objective)


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


def _plan_cost(t_c, t_c_ratio, t_x, t_s, nbytes, host: float) -> PlanCost:
    """Totals of the node rows (OptCNN Eq. 1, and AccPar's ratio split beside it), with the
    moves to and from host memory (``host``: Σ t_H)."""
    compute = sum(t_c)
    ratio = sum(t_c_ratio)
    resh = sum(t_x)
    sync = sum(t_s)
    return PlanCost(
        step_s=compute + resh + sync + host,
        compute_s=compute,
        comm_s=resh + sync,
        comm_bytes=sum(nbytes),
        reshard_s=resh,
        sync_s=sync,
        ratio_step_s=ratio + resh + sync + host,
        ratio_compute_s=ratio,
        host_s=host,
    )
