"""Planning: trace → nodes → cost tables → search → a `Plan` (shardings, costs, collectives).

The `Plan` is what a user reads: predicted step time split into t_C / t_X / t_S, the collectives
the compiled program should contain, per-layer configurations in OptCNN's notation, and the
shardings `apply` hands to XLA.

Reported costs count a collective once per (tensor, target layout): XLA computes a reshard once
however many readers share it, and `apply` emits it once. The search sums per read (Eq. 1 as
written); the two agree except where several readers share a reshard.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from jax import tree_util
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding, PartitionSpec

from .cluster import Cluster
from .cost import (
    ALL_REDUCE,
    PERMUTE,
    Config,
    CostParams,
    EdgeUse,
    MeshAxes,
    NodeCost,
    ReshardTables,
    Spec,
    compute_times,
    edge_uses,
    halo_bytes,
    halo_time,
    node_configs,
    node_cost,
    node_reductions,
    reshard_path,
    spec_of,
    transfer_time,
    unary_costs,
)
from .graph import BACKWARD, FORWARD, UPDATE, Program, shape_str
from .hetero import MeshSpeeds
from .kcut import certified, cut_order, kcut, project, restrict
from .merge import NodeGraph, build_nodes
from .search import Problem, evaluate, solve
from .strategies import (
    BASELINES,
    STRATEGIES,
    baseline_assignment,
    batch_dims,
    hypar_space,
    node_labels,
)
from .trace import is_array_leaf, trace

OBJECTIVES = ("time", "comm")
SEARCHES = ("elimination", "kcut")  # joint elimination (OptCNN) / one DP per mesh axis (SoyBean)
Progress = Callable[[str, str], None]  # progress(stage, detail) after each planning stage


@dataclasses.dataclass(frozen=True)
class PlannerOptions:
    """How to plan."""

    strategy: str = "auto"  # "auto" (search), "hypar" (search over HyPar's Type-I/II space)
    # or a fixed baseline: "data", "model", "owt"
    objective: str = "time"  # "time": OptCNN Eq. 1; "comm": SoyBean's bytes moved
    search: str = "elimination"  # "elimination": joint DP over all mesh axes (OptCNN Alg. 1);
    # "kcut": SoyBean's k-cut, one exact DP per mesh axis, slowest link first. Either way the
    # other search runs too (same tables) and `Plan.comparison()` shows both, unless:
    compare_searches: bool = True  # False: run only `search` (saves its time; no comparison)
    batch_argnums: tuple[int, ...] | None = None  # args whose leaves carry the batch on dim 0;
    # None: every argument but the first (the state), or the only argument
    table_budget: float = 4e6  # largest elimination table (entries) for the exact attempt
    block_budget: float = 2.5e5  # largest table inside a decomposition block
    enum_budget: float = 2e6  # largest residual graph (assignments) enumerated exhaustively
    max_rounds: int = 6  # coordinate-descent rounds per starting point

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy={self.strategy!r}; choose one of {STRATEGIES}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective={self.objective!r}; choose one of {OBJECTIVES}")
        if self.search not in SEARCHES:
            raise ValueError(
                f"search={self.search!r}; choose one of {SEARCHES} (joint elimination, or "
                "SoyBean's k-cut: one cut per mesh axis, slowest interconnect first)"
            )


@dataclasses.dataclass(frozen=True)
class Collective:
    """One predicted collective."""

    kind: str  # all-reduce / all-gather / all-to-all / collective-permute
    axes: tuple[str, ...]  # mesh axes of its groups
    group_size: int
    bytes: float  # bytes sent per device (ring accounting)
    time_s: float
    tensor: str  # dtype[shape] of the full tensor
    reason: str  # "reshard", "partial-sum", "gradient-sync", "halo", "state-feedback"
    phase: str
    layer: str


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


@dataclasses.dataclass
class Evaluation:
    cost: PlanCost
    collectives: list[Collective]
    node_rows: list[dict]  # per node: compute, reshard, sync, bytes


class Plan:
    """The result of planning one train step signature (see README for the fields)."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)

    # ---- shardings -------------------------------------------------------------------------

    def partition_spec(self, spec: Spec) -> PartitionSpec:
        names = self.mesh_axes.names
        entries = []
        for axes in spec:
            if not axes:
                entries.append(None)
            elif len(axes) == 1:
                entries.append(names[axes[0]])
            else:
                entries.append(tuple(names[a] for a in axes))
        while entries and entries[-1] is None:
            entries.pop()
        return PartitionSpec(*entries)

    def named(self, spec: Spec) -> NamedSharding:
        return NamedSharding(self.mesh, self.partition_spec(spec))

    @property
    def in_shardings(self) -> Any:
        """Pytree (like the arguments) of NamedSharding; None at static leaves."""
        it = iter(self.invar_specs)
        leaves = [self.named(next(it)) if arr else None for arr in self.arg_is_array]
        return tree_util.tree_unflatten(self.arg_treedef, leaves)

    @property
    def out_shardings(self) -> Any:
        """Pytree (like the results) of NamedSharding."""
        return tree_util.tree_unflatten(self.out_tree, [self.named(s) for s in self.outvar_specs])

    def variant(self, strategy: str) -> Plan:
        """The plan of another strategy on the same trace and cost tables (no re-planning).

        Baselines are always computed while planning, so ``plan.variant("data")`` is free.
        """
        if strategy == self.strategy:
            return self
        base = self.context["base_assign"]
        if strategy not in base:
            raise ValueError(
                f"no {strategy!r} variant: this plan holds {self.strategy!r} and the baselines "
                f"{sorted(base)}; plan with strategy={strategy!r} instead"
            )
        stats = {k: v for k, v in self.stats.items() if k in _SHARED_STATS}
        stats["objective"] = evaluate(self.problem, base[strategy])
        return assemble_plan(
            self.context,
            strategy,
            base[strategy],
            self.context["base_eval"][strategy],
            False,
            stats,
        )

    # ---- reports ---------------------------------------------------------------------------

    def layer_rows(self) -> list[dict]:
        rows: dict[str, dict] = {}
        for node, r in zip(self.ng.nodes, self.eval.node_rows, strict=True):
            key = self.labels[node.index] or f"({_phase_name(node.phase)})"
            row = rows.setdefault(
                key,
                {
                    "layer": key,
                    "rep": None,
                    "t_C": 0.0,
                    "t_C_ratio": 0.0,
                    "t_X": 0.0,
                    "t_S": 0.0,
                    "bytes": 0.0,
                },
            )
            for k in ("t_C", "t_C_ratio", "t_X", "t_S", "bytes"):
                row[k] += r[k]
            prim = self.program.eqns[node.anchor].primitive if node.anchor >= 0 else ""
            flops = sum(m.flops for m in node.members)
            score = (prim in ("dot_general", "conv_general_dilated"), node.phase == FORWARD, flops)
            if row["rep"] is None or score > row["score"]:
                row["rep"], row["score"] = node.index, score
        # program order: a layer sits where its first computation does (inputs, which are
        # listed by parameter path, do not decide the order)
        first: dict[str, int] = {}
        for node in self.ng.nodes:
            key = self.labels[node.index] or f"({_phase_name(node.phase)})"
            if node.anchor >= 0:
                first[key] = min(first.get(key, node.anchor), node.anchor)
        out = []
        for row in sorted(rows.values(), key=lambda r: first.get(r["layer"], -1)):
            node = self.ng.nodes[row.pop("rep")]
            row.pop("score")
            cfg = self.configs[node.index][self.assignment[node.index]]
            row["config"] = self.paper_notation(node.index, cfg)
            tensor = self.program.eqns[node.anchor].outputs[0] if node.anchor >= 0 else node.invar
            row["spec"] = str(self.partition_spec(self.tensor_specs[tensor]))
            out.append(row)
        return out

    def node_phase(self, node_index: int) -> str:
        """AccPar's phases: "forward", "backward" (error propagation), "gradient" (contractions
        over the batch: weight gradients and their synchronization), "update" (optimizer)."""
        node = self.ng.nodes[node_index]
        if node.phase == BACKWARD:
            red = set(node.space.reduce_dims) & set(self.batch[node_index])
            return "gradient" if red else "backward"
        return {FORWARD: "forward", UPDATE: "update"}.get(node.phase, "input")

    def phase_rows(self) -> list[dict]:
        """Per (layer, phase): t_C even and with ratios, t_X, t_S, and on heterogeneous meshes
        each device group's busy time (even split) and its ratio share α of the layer's work."""
        speeds = self.context.get("speeds")
        rows: dict[tuple[str, str], dict] = {}
        for node, r in zip(self.ng.nodes, self.eval.node_rows, strict=True):
            layer = self.labels[node.index] or f"({_phase_name(node.phase)})"
            phase = self.node_phase(node.index)
            row = rows.setdefault(
                (layer, phase),
                {
                    "layer": layer,
                    "phase": phase,
                    "t_C": 0.0,
                    "t_C_ratio": 0.0,
                    "t_X": 0.0,
                    "t_S": 0.0,
                    "groups": {},
                    "alpha": {},
                },
            )
            for k in ("t_C", "t_C_ratio", "t_X", "t_S"):
                row[k] += r[k]
            if speeds is None or not r["t_C"]:
                continue
            cfg = self.configs[node.index][self.assignment[node.index]]
            dtype = node_dtype(self.ng, node)
            for g, busy in speeds.slowdown(dtype).items():
                row["groups"][g] = row["groups"].get(g, 0.0) + r["t_C"] * busy
            shares = speeds.shares(dtype, split_axes(cfg))
            if len(shares) > 1:  # only splits that cross groups have a ratio
                for g, share in shares.items():
                    # α weighted by compute, so a layer's shares sum to 1
                    row["alpha"][g] = row["alpha"].get(g, 0.0) + share * r["t_C"]
        for row in rows.values():
            total = sum(row["alpha"].values())
            row["alpha"] = {g: a / total for g, a in row["alpha"].items()} if total else {}
        return [r for r in rows.values() if r["t_C"] or r["t_X"] or r["t_S"]]

    def heterogeneity_report(self) -> str:
        """Per layer and phase: each device group's compute time under the even split, the
        ratio split's time and shares (AccPar Eq. 10). Empty on homogeneous meshes."""
        speeds = self.context.get("speeds")
        if speeds is None:
            return ""
        rows = self.phase_rows()
        groups = list(speeds.slowdown("float32"))
        w = max([len(r["layer"]) for r in rows] + [5])
        head = (
            f"{'layer':<{w}}  {'phase':<8} "
            + " ".join(f"{'t_C ' + g:>16}" for g in groups)
            + f" {'t_C ratio':>10}  alpha ({', '.join(groups)})"
        )
        lines = [
            "heterogeneous mesh: even split (what XLA runs) vs ratio split (uneven, AccPar Eq. 10);"
            " times in ms",
            head,
            "-" * len(head),
        ]
        for r in rows:
            busy = " ".join(f"{r['groups'].get(g, 0.0) * 1e3:16.4f}" for g in groups)
            alpha = "/".join(f"{r['alpha'].get(g, 0.0):.2f}" for g in groups) if r["alpha"] else "-"
            lines.append(
                f"{r['layer']:<{w}}  {r['phase']:<8} {busy} {r['t_C_ratio'] * 1e3:10.4f}  {alpha}"
            )
        c = self.cost
        lines.append(
            f"step: even split {c.step_s * 1e3:.4f} ms, ratio split {c.ratio_step_s * 1e3:.4f} ms "
            f"(compute {c.compute_s * 1e3:.4f} -> {c.ratio_compute_s * 1e3:.4f} ms)"
        )
        return "\n".join(lines)

    def paper_notation(self, node_index: int, cfg: Config) -> str:
        """Degrees per iteration dim in OptCNN's notation, e.g. ``{n=4, c=2, k=1}``."""
        node = self.ng.nodes[node_index]
        sizes = self.mesh_axes.sizes
        names = list(node.space.names)
        out_map = node.space.out_maps[0] if node.space.out_maps else ()
        if out_map and out_map[-1] is not None and names[out_map[-1]].startswith(("d", "m")):
            names[out_map[-1]] = "c"
        batch = sorted(self.batch[node_index], key=lambda d: -node.space.sizes[d])
        if batch:  # the largest batch dim is n (a weight gradient also contracts one)
            names[batch[0]] = "n"
        parts = []
        for d, name in enumerate(names):
            deg = math.prod(sizes[a] for a, x in enumerate(cfg) if x == d)
            parts.append(f"{name}={deg}")
        return "{" + ", ".join(parts) + "}"

    def report(self) -> str:
        """A table: one row per layer, then totals and the comparison with the baselines."""
        rows = self.layer_rows()
        w = max([len(r["layer"]) for r in rows] + [5])
        cw = max([len(r["config"]) for r in rows] + [6])
        sw = max([len(r["spec"]) for r in rows] + [4])
        head = (
            f"{'layer':<{w}}  {'config':<{cw}}  {'spec':<{sw}}  {'t_C ms':>9} {'t_X ms':>9} "
            f"{'t_S ms':>9} {'MB':>9}"
        )
        lines = [
            f"jaxpar plan: strategy={self.strategy} objective={self.objective} "
            f"mesh={dict(zip(self.mesh_axes.names, self.mesh_axes.sizes, strict=True))} "
            f"cluster={self.cluster.name} optimal={self.optimal}",
            head,
            "-" * len(head),
        ]
        for r in rows:
            lines.append(
                f"{r['layer']:<{w}}  {r['config']:<{cw}}  {r['spec']:<{sw}}  "
                f"{r['t_C'] * 1e3:9.4f} {r['t_X'] * 1e3:9.4f} {r['t_S'] * 1e3:9.4f} "
                f"{r['bytes'] / 1e6:9.4f}"
            )
        c = self.cost
        lines.append("-" * len(head))
        lines.append(
            f"{'total':<{w}}  {'':<{cw}}  {'':<{sw}}  {c.compute_s * 1e3:9.4f} "
            f"{c.reshard_s * 1e3:9.4f} {c.sync_s * 1e3:9.4f} {c.comm_bytes / 1e6:9.4f}"
        )
        lines.append(
            f"step {c.step_s * 1e3:.4f} ms = compute {c.compute_s * 1e3:.4f} + comm "
            f"{c.comm_s * 1e3:.4f}; {c.comm_bytes / 1e6:.4f} MB sent per device; "
            f"{len(self.collectives)} collectives"
        )
        lines.append(self.comparison())
        hetero = self.heterogeneity_report()
        if hetero:
            lines.append(hetero)
        return "\n".join(lines)

    def comparison(self) -> str:
        """Predicted step time and communication of this plan beside the baselines."""
        lines = [f"{'strategy':<9} {'step ms':>10} {'comm MB':>10} {'vs data':>8}"]
        data = self.baselines.get("data")
        entries = dict(self.baselines)
        entries[self.strategy] = self.cost
        for name in STRATEGIES:
            if name not in entries:
                continue
            c = entries[name]
            speed = (data.step_s / c.step_s) if data and c.step_s > 0 else float("nan")
            mark = "*" if name == self.strategy else " "
            lines.append(
                f"{name + mark:<9} {c.step_s * 1e3:10.4f} {c.comm_bytes / 1e6:10.4f} {speed:7.2f}x"
            )
        searches = self.context.get("search_costs", {})
        if len(searches) > 1:
            lines.append(_search_line(self.context, self.stats.get("search")))
        return "\n".join(lines)

    def to_json(self) -> str:
        """`as_dict` as indented JSON."""
        return json.dumps(self.as_dict(), indent=1, default=str)

    def as_dict(self) -> dict[str, Any]:
        """Everything a report needs, as plain JSON-able data."""
        return {
            "strategy": self.strategy,
            "objective": self.objective,
            "mesh": dict(zip(self.mesh_axes.names, self.mesh_axes.sizes, strict=True)),
            "cluster": self.cluster.name,
            "optimal": self.optimal,
            "cost": self.cost.as_dict(),
            "baselines": {k: v.as_dict() for k, v in self.baselines.items()},
            "search": {k: v for k, v in self.stats.items() if isinstance(v, (int, float, str))},
            "layers": self.layer_rows(),
            "collectives": [dataclasses.asdict(c) for c in self.collectives],
            "in_specs": {
                p: str(self.partition_spec(s))
                for p, s in zip(self.program.invar_paths, self.invar_specs, strict=True)
            },
        }

    def __repr__(self) -> str:
        c = self.cost
        return (
            f"Plan(strategy={self.strategy!r}, step_s={c.step_s:.3e}, "
            f"comm_bytes={c.comm_bytes:.3e}, optimal={self.optimal})"
        )


class _Throttled:
    """Calls ``progress(stage, detail)`` at stage ends, and from long loops every few seconds."""

    def __init__(self, progress: Progress | None, every: float = 2.0) -> None:
        self.progress = progress
        self.every = every
        self.last = time.perf_counter()

    def __call__(self, stage: str, detail: str) -> None:
        if self.progress is not None:
            self.progress(stage, detail)
        self.last = time.perf_counter()

    def tick(self, stage: str, detail: str, every: float | None = None) -> None:
        if self.progress is None:
            return
        if time.perf_counter() - self.last >= (self.every if every is None else every):
            self(stage, detail + " ...")


# stats that describe the trace and tables, shared by every variant of a plan
_SHARED_STATS = (
    "trace_s",
    "graph_s",
    "cost_s",
    "search_s",
    "equations",
    "nodes",
    "free_nodes",
    "edges",
    "max_configs",
)


def _search_line(context: dict[str, Any], chosen: str | None) -> str:
    """Both searches' results on the same tables, and which one wins by how much."""
    costs, objective = context["search_costs"], context["objective"]
    unit = (lambda c: f"{c.comm_bytes / 1e6:.4f} MB") if objective == "comm" else None
    unit = unit or (lambda c: f"{c.step_s * 1e3:.4f} ms")
    key = (lambda c: c.comm_bytes) if objective == "comm" else (lambda c: c.step_s)
    parts = [f"{n}{'*' if n == chosen else ''} {unit(c)}" for n, c in costs.items()]
    elim, kc = key(costs["elimination"]), key(costs["kcut"])
    if math.isclose(elim, kc, rel_tol=1e-9, abs_tol=1e-15):
        verdict = "same cost"
    elif elim < kc:
        verdict = f"joint elimination wins by {(kc - elim) / kc:.1%}"
    else:
        verdict = f"k-cut wins by {(elim - kc) / elim:.1%}"
    return f"search ({context['search_strategy']}): " + ", ".join(parts) + f"; {verdict}"


def _phase_name(phase: str) -> str:
    return {UPDATE: "optimizer", BACKWARD: "backward", FORWARD: "forward"}.get(phase, phase)


# ---------------------------------------------------------------- mesh description


def mesh_description(mesh: Any) -> tuple[Any, tuple[str, ...], tuple[int, ...], np.ndarray | None]:
    """(mesh usable in NamedSharding, axis names, sizes, device ids or None for abstract)."""
    if isinstance(mesh, dict):
        if not mesh:
            raise ValueError("mesh={} has no axes; give e.g. {'data': 2, 'model': 4}")
        for name, size in mesh.items():
            if not isinstance(name, str) or not isinstance(size, int) or size < 1:
                raise ValueError(f"mesh entry {name!r}: {size!r}; axes are name -> positive int")
        names, sizes = tuple(mesh), tuple(mesh.values())
        return (
            AbstractMesh(sizes, names, axis_types=(AxisType.Auto,) * len(names)),
            names,
            sizes,
            None,
        )
    if isinstance(mesh, Mesh):
        ids = np.vectorize(lambda d: d.id)(mesh.devices)
        return mesh, tuple(mesh.axis_names), tuple(mesh.devices.shape), ids
    if isinstance(mesh, AbstractMesh):
        return mesh, tuple(mesh.axis_names), tuple(mesh.axis_sizes), None
    raise TypeError(f"mesh must be a dict of axis sizes or a jax Mesh, not {type(mesh).__name__}")


def mesh_axes_for(cluster: Cluster, names, sizes, ids) -> MeshAxes:
    if ids is not None:
        # cluster device ids are positions in the job's device order (jax device ids)
        ids = _positions(sizes, ids)
    cluster.check_mesh(sizes, ids)
    links = cluster.axis_links(sizes, ids)
    bws = cluster.axis_bandwidths(sizes, ids)
    return MeshAxes(
        names=names,
        sizes=sizes,
        bandwidth=tuple(bws),
        latency=tuple(link.latency for link in links),
        link_names=tuple(link.name for link in links),
        group_bandwidth=merged_group_bandwidths(cluster, tuple(sizes), ids),
    )


def merged_group_bandwidths(cluster: Cluster, sizes: tuple[int, ...], ids) -> tuple:
    """Bandwidth of collectives over every set of two or more mesh axes (see `MeshAxes`).

    The set's axes are merged into one (mesh order, row-major: the order of the devices in
    XLA's replica group) and the cluster rates that axis like any other.
    """
    positions = _positions(sizes, ids)
    out = []
    k = len(sizes)
    for r in range(2, k + 1):
        for axes in itertools.combinations(range(k), r):
            rest = [a for a in range(k) if a not in axes]
            merged = np.transpose(positions, (*rest, *axes))
            shape = (*(sizes[a] for a in rest), math.prod(sizes[a] for a in axes))
            out.append((axes, cluster.axis_bandwidths(shape, merged.reshape(shape))[-1]))
    return tuple(out)


# ---------------------------------------------------------------- state feedback and pins


def feedback_pairs(program: Program) -> list[tuple[int, int]]:
    """(result tensor, argument tensor) pairs where a result is the next step's argument.

    A train step returns the new state where it took the old one: same pytree path, shape and
    dtype. Its sharding must come back as the argument's, or the next call reshards it.
    """
    by_path = {p: t for p, t in zip(program.invar_paths, program.invars, strict=True)}
    pairs = []
    for path, t in zip(program.outvar_paths, program.outvars, strict=True):
        src = by_path.get(path)
        if t is None or src is None:
            continue
        a, b = program.tensors[t], program.tensors[src]
        if a.shape == b.shape and a.dtype == b.dtype and t != src:
            pairs.append((t, src))
    return pairs


def pins_from_specs(in_specs: Any, args: tuple, program: Program) -> dict[int, PartitionSpec]:
    """Argument tensor -> PartitionSpec, from a pytree prefix of specs (None leaves free)."""
    if in_specs is None:
        return {}
    is_spec = lambda x: x is None or isinstance(x, PartitionSpec)
    try:
        expanded = tree_util.tree_map(
            lambda spec, sub: tree_util.tree_map(lambda _: spec, sub, is_leaf=lambda x: x is None),
            in_specs,
            args,
            is_leaf=is_spec,
        )
    except ValueError as err:
        raise ValueError(f"in_specs must be a pytree prefix of the arguments: {err}") from err
    specs = tree_util.tree_leaves(expanded, is_leaf=is_spec)
    leaves = tree_util.tree_leaves(args, is_leaf=lambda x: x is None)
    arr_specs = [s for s, leaf in zip(specs, leaves, strict=True) if is_array_leaf(leaf)]
    return {t: s for t, s in zip(program.invars, arr_specs, strict=True) if s is not None}


def pinned_configs(
    ng: NodeGraph, pins: dict[int, PartitionSpec], names, sizes
) -> dict[int, Config]:
    """Input node -> forced configuration from user PartitionSpecs; clear errors when impossible."""
    out: dict[int, Config] = {}
    for tid, pspec in pins.items():
        shape = ng.program.tensors[tid].shape
        path = ng.program.invar_paths[ng.program.invars.index(tid)]
        if len(pspec) > len(shape):
            raise ValueError(
                f"in_specs for argument {path} ({shape_str(shape)}) has {len(pspec)} entries but "
                f"the array has rank {len(shape)}"
            )
        cfg = [-1] * len(names)
        for dim, entry in enumerate(pspec):
            axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
            deg = 1
            for ax in axes:
                if ax not in names:
                    raise ValueError(
                        f"in_specs for argument {path} names mesh axis {ax!r}, which does not "
                        f"exist; the mesh axes are {names}"
                    )
                a = names.index(ax)
                if cfg[a] != -1:
                    raise ValueError(f"in_specs for argument {path} uses mesh axis {ax!r} twice")
                cfg[a] = dim
                deg *= sizes[a]
            if shape[dim] % deg:
                raise ValueError(
                    f"in_specs for argument {path}: dimension {dim} has size {shape[dim]}, which "
                    f"mesh axes {axes} (total {deg} devices) do not divide; use axes whose "
                    "product divides it, or leave that dimension unsharded (None)"
                )
        out[ng.node_of_tensor[tid]] = tuple(cfg)
    return out


# ---------------------------------------------------------------- evaluation


def evaluate_plan(
    ng: NodeGraph,
    configs: list[list[Config]],
    assignment: list[int],
    uses: list[EdgeUse],
    params: CostParams,
    batch: list[set[int]],
    labels: list[str],
    feedback: set[int],
    compute: list[np.ndarray] | None = None,
    speeds: MeshSpeeds | None = None,
) -> Evaluation:
    """Cost and predicted collectives of an assignment (reshards counted once per layout).

    ``compute``: per node, t_C of every configuration (`compute_times`), when already known.
    """
    mesh = params.mesh
    rows = [{"t_C": 0.0, "t_C_ratio": 0.0, "t_X": 0.0, "t_S": 0.0, "bytes": 0.0} for _ in ng.nodes]
    colls: list[Collective] = []
    program = ng.program
    for node in ng.nodes:
        cfg = configs[node.index][assignment[node.index]]
        if compute is None:
            c = node_cost(ng, node, cfg, params)
        else:
            halo = halo_time(node, cfg, ng, mesh) if node.space.halo else 0.0
            c = NodeCost(float(compute[node.index][assignment[node.index]]), 0.0, halo, 0.0)
        row = rows[node.index]
        row["t_C"] += c.compute
        row["t_C_ratio"] = c.compute * _ratio_factor(ng, node, cfg, speeds)
        red_dims = set(node.space.reduce_dims)
        grad_sync = node.phase == BACKWARD and any(
            cfg[a] in batch[node.index] for a in range(len(cfg)) if cfg[a] in red_dims
        )
        for r in node_reductions(node, cfg, ng, mesh.sizes):
            n, bw, lat = mesh.group(r.axes)
            t = transfer_time(ALL_REDUCE, r.nbytes, n, bw, lat)
            row["t_S" if grad_sync else "t_X"] += t
            row["bytes"] += r.nbytes
            tensor = program.tensors[r.tensor]
            colls.append(
                Collective(
                    ALL_REDUCE,
                    tuple(mesh.names[a] for a in r.axes),
                    n,
                    r.nbytes,
                    t,
                    f"{tensor.dtype}{shape_str(tensor.shape)}",
                    "gradient-sync" if grad_sync else "partial-sum",
                    node.phase,
                    labels[node.index],
                )
            )
        if c.halo:
            hb = halo_bytes(node, cfg, ng, mesh.sizes)
            axes = tuple(a for a, d in enumerate(cfg) if d >= 0 and node.space.halo[d])
            row["t_X"] += c.halo
            row["bytes"] += hb
            colls.append(
                Collective(
                    PERMUTE,
                    tuple(mesh.names[a] for a in axes),
                    mesh.group(axes)[0],
                    hb,
                    c.halo,
                    "halo",
                    "halo",
                    node.phase,
                    labels[node.index],
                )
            )
    reached: set[tuple[int, Spec]] = set()
    for use in uses:
        tensor = program.tensors[use.tensor]
        if tensor.opaque or not tensor.shape:
            continue
        src = spec_of(use.src_map, configs[use.src][assignment[use.src]])
        dst = spec_of(use.dst_map, configs[use.dst][assignment[use.dst]])
        reason = (
            "state-feedback"
            if use.tensor in feedback and ng.nodes[use.dst].anchor < 0
            else ("reshard")
        )
        for step in reshard_path(tensor.nbytes, src, dst, mesh.sizes):
            key = (use.tensor, step.after)
            if step.kind == "slice" or key in reached:
                continue
            reached.add(key)
            a = step.axis
            t = transfer_time(
                step.kind, step.nbytes, mesh.sizes[a], mesh.bandwidth[a], mesh.latency[a]
            )
            row = rows[use.dst]
            row["t_X"] += t
            row["bytes"] += step.nbytes
            colls.append(
                Collective(
                    step.kind,
                    (mesh.names[a],),
                    mesh.sizes[a],
                    step.nbytes,
                    t,
                    f"{tensor.dtype}{shape_str(tensor.shape)}",
                    reason,
                    ng.nodes[use.dst].phase,
                    labels[use.dst],
                )
            )
    compute = sum(r["t_C"] for r in rows)
    ratio = sum(r["t_C_ratio"] for r in rows)
    resh = sum(r["t_X"] for r in rows)
    sync = sum(r["t_S"] for r in rows)
    nbytes = sum(r["bytes"] for r in rows)
    cost = PlanCost(
        step_s=compute + resh + sync,
        compute_s=compute,
        comm_s=resh + sync,
        comm_bytes=nbytes,
        reshard_s=resh,
        sync_s=sync,
        ratio_step_s=ratio + resh + sync,
        ratio_compute_s=ratio,
    )
    return Evaluation(cost, colls, rows)


def node_dtype(ng: NodeGraph, node) -> str:
    """The dtype a node computes in (its anchor's first result), for its FLOP rate."""
    if node.anchor < 0:
        return "float32"
    return ng.program.tensors[ng.program.eqns[node.anchor].outputs[0]].dtype


def split_axes(cfg: Config) -> tuple[int, ...]:
    """Mesh axes a configuration splits work over (the rest replicate it)."""
    return tuple(a for a, d in enumerate(cfg) if d >= 0)


def _ratio_factor(ng: NodeGraph, node, cfg: Config, speeds: MeshSpeeds | None) -> float:
    if speeds is None:
        return 1.0
    return speeds.factor(node_dtype(ng, node), split_axes(cfg))


def mesh_speeds(cluster: Cluster, sizes: tuple[int, ...], ids) -> MeshSpeeds | None:
    """Per-device rates shaped like the mesh; None on a homogeneous cluster (all factors 1)."""
    if not cluster.heterogeneous:
        return None
    positions = _positions(sizes, ids)
    names = tuple(g.name for g in cluster.all_groups())
    return MeshSpeeds(
        lambda dtype: cluster.device_flops(dtype)[positions],
        cluster.group_ids()[positions],
        names,
    )


def _positions(sizes: tuple[int, ...], ids) -> np.ndarray:
    """Cluster device position of every mesh slot (jax device ids ranked; abstract: in order)."""
    if ids is None:
        return np.arange(math.prod(sizes)).reshape(sizes)
    order = {d: i for i, d in enumerate(sorted(np.asarray(ids).reshape(-1).tolist()))}
    return np.vectorize(order.get)(ids)


def _score(ev: Evaluation, objective: str) -> float:
    return ev.cost.comm_bytes if objective == "comm" else ev.cost.step_s


# ---------------------------------------------------------------- the pipeline


def make_plan(
    fn: Any,
    args: tuple,
    mesh: Any,
    cluster: Cluster,
    options: PlannerOptions,
    in_specs: Any = None,
    platform: str = "cpu",
    progress: Progress | None = None,
) -> Plan:
    """Plan ``fn(*args)`` on ``mesh`` for ``cluster`` (``in_specs``: optional argument pins).

    ``progress(stage, detail)`` is called when each stage finishes (trace, graph, costs, search).
    """
    say = _Throttled(progress)
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    program, out_tree = trace(fn, args)
    times["trace_s"] = time.perf_counter() - t0
    say("trace", f"{len(program.eqns)} equations")

    t0 = time.perf_counter()
    mesh_obj, names, sizes, ids = mesh_description(mesh)
    mesh_axes = mesh_axes_for(cluster, names, sizes, ids)
    # even split: every device runs the same shard, so the mesh's slowest device sets t_C
    in_mesh = sorted(set(_positions(sizes, ids).reshape(-1).tolist()))
    specs = {cluster.device_spec(i) for i in in_mesh}
    dtypes = sorted({k for spec in specs for k, _ in spec.peak_flops})
    params = CostParams(
        mesh=mesh_axes,
        peak_flops=tuple((k, min(spec.flops(k) for spec in specs)) for k in dtypes),
        mem_bandwidth=min(spec.mem_bandwidth for spec in specs),
        objective=options.objective,
    )
    speeds = mesh_speeds(cluster, sizes, ids)
    ng = build_nodes(program)
    leaves, arg_treedef = tree_util.tree_flatten(args, is_leaf=lambda x: x is None)
    arg_is_array = [is_array_leaf(x) for x in leaves]
    batch_args = options.batch_argnums
    if batch_args is None:
        batch_args = tuple(range(1, len(args))) if len(args) > 1 else (0,)
    batch_tensors = [
        t
        for t, p in zip(program.invars, program.invar_paths, strict=True)
        if any(p.startswith(f"[{i}]") for i in batch_args)
    ]
    batch = batch_dims(ng, batch_tensors)
    labels = node_labels(ng)
    pairs = feedback_pairs(program)
    times["graph_s"] = time.perf_counter() - t0
    say("graph", f"{len(ng.nodes)} nodes")

    t0 = time.perf_counter()
    configs = []
    for node in ng.nodes:
        configs.append(node_configs(ng, node, params))
        say.tick("costs", f"configurations of {len(configs)}/{len(ng.nodes)} nodes")
    pins = pins_from_specs(in_specs, args, program)
    if pins:
        for node_index, cfg in pinned_configs(ng, pins, names, sizes).items():
            configs[node_index] = [cfg]
    unary, compute = [], []
    for node, cfgs in zip(ng.nodes, configs, strict=True):
        compute.append(compute_times(ng, node, cfgs, params))
        unary.append(unary_costs(ng, node, cfgs, params, compute[-1]))
        say.tick("costs", f"compute/sync tables of {len(unary)}/{len(ng.nodes)} nodes")
    problem = Problem(unary=unary, edges={})
    uses = edge_uses(ng, pairs)
    tables = ReshardTables(ng, configs, params)
    for i, use in enumerate(uses):
        problem.add_edge(use.src, use.dst, tables.table(use))
        say.tick("costs", f"reshard tables of {i + 1}/{len(uses)} edges")
    fwd = [n.index for n in ng.nodes if n.phase in (FORWARD, "input")]
    bwd = [n.index for n in ng.nodes if n.phase in (BACKWARD, UPDATE)]
    upd = [n.index for n in ng.nodes if n.phase in (UPDATE, "input")]
    problem.blocks = [fwd, bwd, upd]
    times["cost_s"] = time.perf_counter() - t0
    say("costs", f"{sum(len(c) for c in configs)} configurations, {len(problem.edges)} edges")

    t0 = time.perf_counter()
    feedback = {t for t, _ in pairs}

    def ev(assign: list[int]) -> Evaluation:
        return evaluate_plan(
            ng, configs, assign, uses, params, batch, labels, feedback, compute, speeds
        )

    base_assign = {s: baseline_assignment(s, ng, configs, batch, sizes) for s in BASELINES}
    base_eval = {s: ev(a) for s, a in base_assign.items()}
    stats: dict[str, Any] = {}
    search_costs: dict[str, PlanCost] = {}
    if options.strategy in ("auto", "hypar"):
        space = None  # per node, the configuration indices the strategy may use
        if options.strategy == "hypar":
            space = hypar_space(ng, configs, batch, base_assign["data"])
        runs = {}
        names = [options.search]
        if options.compare_searches:
            names += [s for s in SEARCHES if s != options.search]
        # k-cut first: when joint elimination is not exact, k-cut's plan is one more start
        # for its block descent (on wide steps it is often the best start)
        names.sort(key=lambda n: n != "kcut")
        for name in names:
            t1 = time.perf_counter()
            if name == "elimination":
                extra = [runs["kcut"][0]] if "kcut" in runs else []
                runs[name] = _eliminate(problem, space, base_assign, options, say, extra)
            else:
                runs[name] = _kcut(
                    problem, configs, space, base_assign, options, params, ng, uses, say
                )
            runs[name][3]["time_s"] = time.perf_counter() - t1
        if "kcut" in runs and "elimination" in runs:  # certified if it meets elimination's
            elim, kc = runs["elimination"], runs["kcut"]
            runs["kcut"] = (kc[0], kc[1], certified(kc[1], elim[1], elim[2]), kc[3])
        assignment, objective, optimal, stats = runs[options.search]
        stats = dict(stats)
        stats["objective"] = objective
        stats["search"] = options.search
        stats["search_objectives"] = {n: r[1] for n, r in runs.items()}
        stats["search_times"] = {n: r[3]["time_s"] for n, r in runs.items()}
        stats["search_optimal"] = {n: r[2] for n, r in runs.items()}
        if "kcut" in runs:
            stats["kcut_cuts"] = runs["kcut"][3]["cuts"]
            stats["kcut_exact"] = runs["kcut"][3]["exact"]
        evals = {n: ev(r[0]) for n, r in runs.items()}
        search_costs = {n: e.cost for n, e in evals.items()}
        evaluation = evals[options.search]
        # never report a plan worse than a baseline under the reported (deduplicated) cost
        # (hypar: only baselines inside its space, i.e. data parallel)
        allowed = [
            s for s in base_eval if space is None or project(base_assign[s], space) is not None
        ]
        best = min(allowed, key=lambda s: _score(base_eval[s], options.objective))
        if _score(base_eval[best], options.objective) < _score(evaluation, options.objective):
            assignment, evaluation, optimal = base_assign[best], base_eval[best], False
            stats["fell_back_to"] = best
    else:
        assignment = base_assign[options.strategy]
        evaluation = base_eval[options.strategy]
        optimal = False
        stats["objective"] = evaluate(problem, assignment)
    times["search_s"] = time.perf_counter() - t0
    say("search", "certified optimal" if optimal else "best found (not certified)")
    stats.update(times)
    stats["equations"] = len(program.eqns)
    stats["nodes"] = len(ng.nodes)
    stats["free_nodes"] = sum(1 for c in configs if len(c) > 1)
    stats["edges"] = len(problem.edges)
    stats["max_configs"] = max(len(c) for c in configs)
    context = dict(
        params=params,
        speeds=speeds,
        objective=options.objective,
        options=options,
        mesh=mesh_obj,
        mesh_axes=mesh_axes,
        cluster=cluster,
        platform=platform,
        program=program,
        ng=ng,
        configs=configs,
        baselines={s: e.cost for s, e in base_eval.items()},
        labels=labels,
        batch=batch,
        arg_treedef=arg_treedef,
        arg_is_array=arg_is_array,
        out_tree=out_tree,
        problem=problem,
        uses=uses,
        pairs=pairs,
        base_assign=base_assign,
        base_eval=base_eval,
        search_costs=search_costs,  # search name -> cost of its result (auto/hypar plans)
        search_strategy=options.strategy,
    )
    return assemble_plan(context, options.strategy, assignment, evaluation, optimal, stats)


# ---------------------------------------------------------------- the two searches
# each returns (assignment, search objective, certified optimal, stats)


def _eliminate(problem, space, base_assign, options, say, extra_starts=()):
    """Joint elimination (`search.solve`) over the whole space or over ``space`` (HyPar).

    When the step is too wide to eliminate exactly, block descent starts from the baselines and
    from ``extra_starts`` (k-cut's plan).
    """
    starts = [*base_assign.values(), *extra_starts]
    sub = problem
    if space is not None:
        sub = restrict(problem, space)
        starts = [p for p in (project(s, space) for s in starts) if p is not None]
    sol = solve(
        sub,
        starts=starts,
        table_budget=options.table_budget,
        enum_budget=options.enum_budget,
        max_rounds=options.max_rounds,
        block_budget=options.block_budget,
        on_round=lambda detail: say.tick("search", detail, every=0.0),
    )
    assignment = sol.assignment
    if space is not None:
        assignment = [space[v][i] for v, i in enumerate(assignment)]
    return assignment, sol.objective, sol.optimal, dict(sol.stats)


def _kcut(problem, configs, space, base_assign, options, params, ng, uses, say):
    """SoyBean's k-cut (`kcut.kcut`), one cut per mesh axis, slowest interconnect first.

    Under ``objective="comm"`` contractions only have full-degree configurations, which a cut
    that leaves later axes unused cannot pass through: k-cut then runs on tables over every
    configuration (`_unfiltered_problem`) and may only end on the planner's own ones.
    """
    mesh = params.mesh
    n = len(configs)
    final = space if space is not None else [list(range(len(c))) for c in configs]
    starts = list(base_assign.values())
    tables_s = 0.0
    if params.objective == "comm":
        t0 = time.perf_counter()
        ext_configs, ext = _unfiltered_problem(ng, configs, params, uses, problem.blocks)
        tables_s = time.perf_counter() - t0
        index = [{c: i for i, c in enumerate(e)} for e in ext_configs]
        final = [[index[v][configs[v][i]] for i in final[v]] for v in range(n)]
        starts = [[index[v][configs[v][a]] for v, a in enumerate(s)] for s in starts]
    else:
        ext_configs, ext = configs, problem
    res = kcut(
        ext,
        ext_configs,
        mesh.sizes,
        mesh.bandwidth,
        final=final,
        starts=starts,
        table_budget=options.table_budget,
        enum_budget=options.enum_budget,
        block_budget=options.block_budget,
        max_rounds=options.max_rounds,
    )
    say.tick("search", f"k-cut: {len(res.cuts)} cuts", every=0.0)
    assignment = res.assignment
    if ext is not problem:
        back = [{c: i for i, c in enumerate(cf)} for cf in configs]
        assignment = [back[v][ext_configs[v][a]] for v, a in enumerate(assignment)]
    cuts = [dict(c.as_dict(), axis_name=mesh.names[c.axis]) for c in res.cuts]
    stats = {
        "method": "k-cut",
        "order": [mesh.names[a] for a in cut_order(mesh.sizes, mesh.bandwidth)],
        "cuts": cuts,
        "exact": res.exact_cuts,
        "tables_s": tables_s,  # building tables over every configuration ("comm" only)
    }
    return assignment, evaluate(problem, assignment), False, stats


def _unfiltered_problem(ng, configs, params, uses, blocks):
    """Tables over every configuration (no full-degree filter for contractions)."""
    loose = dataclasses.replace(params, objective="time")
    ext_configs = []
    for node, cfgs in zip(ng.nodes, configs, strict=True):
        every = node_configs(ng, node, loose)
        ext_configs.append(every if set(cfgs) <= set(every) else cfgs)
    unary = [
        unary_costs(ng, node, cfgs, params, compute_times(ng, node, cfgs, params))
        for node, cfgs in zip(ng.nodes, ext_configs, strict=True)
    ]
    ext = Problem(unary=unary, edges={}, blocks=blocks)
    tables = ReshardTables(ng, ext_configs, params)
    for use in uses:
        ext.add_edge(use.src, use.dst, tables.table(use))
    return ext_configs, ext


def assemble_plan(
    context: dict[str, Any],
    strategy: str,
    assignment: list[int],
    evaluation: Evaluation,
    optimal: bool,
    stats: dict[str, Any],
) -> Plan:
    """The `Plan` of one assignment: layouts of every tensor, argument and result."""
    program, ng, configs = context["program"], context["ng"], context["configs"]
    pairs = context["pairs"]
    # layouts of every tensor and of every read
    tensor_specs: dict[int, Spec] = {}
    for node in ng.nodes:
        cfg = configs[node.index][assignment[node.index]]
        for t, m in node.tensor_maps.items():
            tensor_specs[t] = spec_of(m, cfg)
    invar_specs = [tensor_specs.get(t, ()) for t in program.invars]
    pair_of = dict(pairs)
    outvar_specs = []
    for t in program.outvars:
        if t is None:
            outvar_specs.append(())
        elif t in pair_of:
            outvar_specs.append(tensor_specs[pair_of[t]])
        else:
            outvar_specs.append(tensor_specs.get(t, ()))
    fields = {k: v for k, v in context.items() if k not in ("pairs", "base_assign", "base_eval")}
    return Plan(
        **fields,
        context=context,
        strategy=strategy,
        assignment=assignment,
        eval=evaluation,
        cost=evaluation.cost,
        collectives=evaluation.collectives,
        optimal=optimal,
        stats=stats,
        tensor_specs=tensor_specs,
        invar_specs=invar_specs,
        outvar_specs=outvar_specs,
        feedback=pair_of,
    )
