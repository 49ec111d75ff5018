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
import math
from collections.abc import Sequence

from .collectives import ALL_REDUCE
from .configs import spec_of, split_axes
from .cost import CostParams, node_collectives, node_dtype, node_price
from .graph import BACKWARD, shape_str
from .hardware.speeds import MeshSpeeds
from .nodes import Node, NodeGraph
from .reshard import SLICE, reshard_path, step_time
from .tables import CostTables


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
    node_rows: tuple[NodeRow, ...]
    objective: float  # the cost under the planning objective: step_s ("time") or bytes ("comm")


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


def _tensor_name(ng: NodeGraph, tid: int) -> str:
    t = ng.program.tensors[tid]
    return f"{t.dtype}{shape_str(t.shape)}"


def is_grad_sync(node: Node, cfg, batch: set[int]) -> bool:
    """A backward node whose split reduced dim carries the batch reduces gradients (t_S)."""
    red = set(node.space.reduce_dims)
    return node.phase == BACKWARD and any(d in red and d in batch for d in cfg if d >= 0)


def evaluate(ctx: EvalContext, assignment: Sequence[int]) -> Evaluation:
    """Cost, per-node rows and predicted collectives of ``assignment``."""
    ng, tables, mesh = ctx.ng, ctx.tables, ctx.params.mesh
    rows = [dict(t_C=0.0, t_C_ratio=0.0, t_X=0.0, t_S=0.0, bytes=0.0) for _ in ng.nodes]
    colls: list[Collective] = []
    objective = 0.0
    for node in ng.nodes:
        v, a = node.index, assignment[node.index]
        cfg = tables.configs[v][a]
        compute = float(tables.compute[v][a])  # all iterations of a loop body's node
        trips = ng.program.trips(node.region)
        own = node_collectives(ng, node, cfg, mesh)
        objective += node_price(compute / trips, own, ctx.params.objective) * trips
        factor = 1.0
        if ctx.speeds is not None:
            factor = ctx.speeds.factor(node_dtype(ng, node), split_axes(cfg))
        row = rows[v]
        row.update(t_C=compute, t_C_ratio=compute * factor)
        sync = is_grad_sync(node, cfg, ctx.batch[v])
        for c in own:
            if c.kind == ALL_REDUCE:
                reason, term = ("gradient-sync", "t_S") if sync else ("partial-sum", "t_X")
                tensor = _tensor_name(ng, c.tensor)
            else:
                reason, term, tensor = "halo", "t_X", "halo"
            row[term] += c.time_s * trips
            row["bytes"] += c.nbytes * trips
            axes = tuple(mesh.names[x] for x in c.axes)
            colls.append(
                Collective(
                    c.kind, axes, c.group_size, c.nbytes * trips, c.time_s * trips, tensor,
                    reason, node.phase, ctx.labels[v], trips,
                )
            )  # fmt: skip
    # (tensor, context, before, after): each reshard step is emitted once per loop context
    produced: set[tuple] = set()
    for use in tables.uses:
        tensor = ng.program.tensors[use.tensor]
        if tensor.opaque or not tensor.shape or not tensor.nbytes:
            continue
        src = spec_of(use.src_map, tables.configs[use.src][assignment[use.src]])
        dst = spec_of(use.dst_map, tables.configs[use.dst][assignment[use.dst]])
        feedback = use.tensor in ctx.feedback and ng.nodes[use.dst].anchor < 0
        trips = ng.program.trips(use.context)
        for step in reshard_path(tensor.nbytes, src, dst, mesh.sizes):
            key = (use.tensor, use.context, step.before, step.after)
            if step.kind == SLICE or key in produced:
                continue
            produced.add(key)
            t, nbytes = step_time(step, mesh) * trips, step.nbytes * trips
            objective += nbytes if ctx.params.objective == "comm" else t
            row = rows[use.dst]
            row["t_X"] += t
            row["bytes"] += nbytes
            colls.append(
                Collective(
                    step.kind, (mesh.names[step.axis],), mesh.sizes[step.axis], nbytes, t,
                    _tensor_name(ng, use.tensor), "state-feedback" if feedback else "reshard",
                    ng.nodes[use.dst].phase, ctx.labels[use.dst], trips,
                )
            )  # fmt: skip
    return Evaluation(_plan_cost(rows), tuple(colls), tuple(NodeRow(**r) for r in rows), objective)


def _plan_cost(rows: list[dict]) -> PlanCost:
    """Totals of the node rows (OptCNN Eq. 1, and AccPar's ratio split beside it)."""
    compute = sum(r["t_C"] for r in rows)
    ratio = sum(r["t_C_ratio"] for r in rows)
    resh = sum(r["t_X"] for r in rows)
    sync = sum(r["t_S"] for r in rows)
    return PlanCost(
        step_s=compute + resh + sync,
        compute_s=compute,
        comm_s=resh + sync,
        comm_bytes=sum(r["bytes"] for r in rows),
        reshard_s=resh,
        sync_s=sync,
        ratio_step_s=ratio + resh + sync,
        ratio_compute_s=ratio,
    )
