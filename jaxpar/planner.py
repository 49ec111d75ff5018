"""The planner: the stage sequence from a train step to a `Plan`.

    trace    fn, args                    -> Traced     (flat program, argument layout)
    target   mesh, cluster, objective    -> Target     (cost parameters of the mesh's links)
    graph    Traced                      -> Analysis   (planning nodes, batch dims, layers)
    costs    Analysis, Target, pins      -> CostTables (configurations, priced; two problems)
    search   tables                      -> Choice     (searches, certificate, baselines)
    plan     all of the above            -> Plan       (layouts of every tensor)

Each stage is a function of typed, frozen inputs returning a typed, frozen result
(docs/design.md, "Pipeline").
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from jax import tree_util

from .choose import Choice, choose
from .cost import CostParams
from .evaluate import EvalContext
from .graph import Program
from .hardware import Cluster
from .hardware.mesh_model import mesh_axes, mesh_speeds, slowest_device
from .hardware.speeds import MeshSpeeds
from .labels import batch_dims, node_labels
from .meshes import MeshDescription, describe_mesh, resolve_cluster
from .nodes import NodeGraph, build_nodes
from .options import PlannerOptions
from .pins import feedback_pairs, pinned_configs, pins_from_specs
from .result import ArgLayout, Plan, layouts
from .tables import CostTables, build_tables
from .trace import is_array_leaf, trace

Progress = Callable[[str, str], None]  # progress(stage, detail) after each planning stage


@dataclasses.dataclass(frozen=True)
class Traced:
    """Stage result: the step as a flat program, and how its pytrees flatten."""

    program: Program
    arg_layout: ArgLayout
    batch_tensors: tuple[int, ...]  # argument tensors whose dim 0 is the batch


@dataclasses.dataclass(frozen=True)
class Target:
    """Stage result: the mesh, the cluster it runs on, and the cost model's parameters."""

    mesh: MeshDescription
    cluster: Cluster
    params: CostParams
    speeds: MeshSpeeds | None  # per-device rates on a heterogeneous mesh


@dataclasses.dataclass(frozen=True)
class Analysis:
    """Stage result: the planning nodes and what each one is."""

    ng: NodeGraph
    batch: tuple[set[int], ...]  # per node, iteration dims carrying the batch
    labels: tuple[str, ...]  # per node, its layer
    feedback: tuple[tuple[int, int], ...]  # (state result, argument it becomes)


def trace_step(fn: Any, args: tuple, options: PlannerOptions) -> Traced:
    """Trace ``fn(*args)`` to a flat program; find the batch arguments."""
    program, out_tree = trace(fn, args)
    leaves, treedef = tree_util.tree_flatten(args, is_leaf=lambda x: x is None)
    layout = ArgLayout(treedef, tuple(is_array_leaf(x) for x in leaves), out_tree)
    prefixes = tuple(f"[{i}]" for i in options.batch_args(len(args)))
    batch = tuple(
        t
        for t, p in zip(program.invars, program.invar_paths, strict=True)
        if p.startswith(prefixes)
    )
    return Traced(program, layout, batch)


def target_for(mesh: Any, cluster: Any, objective: str) -> Target:
    """The mesh's links and the slowest device's rates (an even split runs at its pace)."""
    desc = describe_mesh(mesh)
    cl = resolve_cluster(cluster, desc)
    axes = mesh_axes(cl, desc.names, desc.sizes, desc.device_ids)
    peak, mem_bw = slowest_device(cl, desc.sizes, desc.device_ids)
    params = CostParams(axes, peak, mem_bw, objective)
    return Target(desc, cl, params, mesh_speeds(cl, desc.sizes, desc.device_ids))


def analyze(traced: Traced) -> Analysis:
    """Planning nodes, their batch dims and layers, and the state feedback pairs."""
    ng = build_nodes(traced.program)
    batch = tuple(batch_dims(ng, traced.batch_tensors))
    return Analysis(ng, batch, tuple(node_labels(ng)), tuple(feedback_pairs(traced.program)))


def price(
    analysis: Analysis, target: Target, in_specs: Any, args: tuple, tick: Callable[[str], None]
) -> CostTables:
    """Configurations (user pins forced) and the cost tables of both search problems."""
    ng, mesh = analysis.ng, target.mesh
    pins = pins_from_specs(in_specs, args, ng.program)
    pinned = pinned_configs(ng, pins, mesh.names, mesh.sizes) if pins else {}
    return build_tables(ng, target.params, analysis.feedback, pinned, tick)


def assemble(
    traced: Traced, target: Target, analysis: Analysis, tables: CostTables, choice: Choice,
    options: PlannerOptions, stats: dict[str, Any],
) -> Plan:  # fmt: skip
    """The `Plan` of the chosen assignment: layouts of every tensor, argument and result."""
    feedback = dict(analysis.feedback)
    tensor_specs, invar_specs, outvar_specs = layouts(
        traced.program, analysis.ng, tables.configs, choice.assignment, feedback
    )
    return Plan(
        strategy=choice.strategy, options=options, program=traced.program,
        arg_layout=traced.arg_layout, mesh=target.mesh.mesh, mesh_axes=target.params.mesh,
        params=target.params, cluster=target.cluster, platform=target.mesh.platform,
        ng=analysis.ng, batch=analysis.batch, labels=analysis.labels, tables=tables,
        speeds=target.speeds, assignment=choice.assignment, evaluation=choice.evaluation,
        optimal=choice.optimal, lower_bound=choice.lower_bound, choice=choice, stats=stats,
        tensor_specs=tensor_specs, invar_specs=invar_specs, outvar_specs=outvar_specs,
        feedback=feedback,
    )  # fmt: skip


def make_plan(
    fn: Any,
    args: tuple,
    mesh: Any,
    cluster: Any,
    options: PlannerOptions,
    in_specs: Any = None,
    progress: Progress | None = None,
) -> Plan:
    """Plan ``fn(*args)`` on ``mesh`` for ``cluster`` (``in_specs``: optional argument pins)."""
    clock = StageClock(progress)
    traced = clock.run("trace", trace_step, fn, args, options)
    clock.done("trace", f"{len(traced.program.eqns)} equations")
    target = clock.run("graph", target_for, mesh, cluster, options.objective)
    analysis = clock.run("graph", analyze, traced)
    clock.done("graph", f"{len(analysis.ng.nodes)} nodes")
    tables = clock.run("cost", price, analysis, target, in_specs, args, clock.ticker("costs"))
    n_configs, n_edges = sum(map(len, tables.configs)), len(tables.problem.edges)
    clock.done("costs", f"{n_configs} configurations, {n_edges} edges")
    ctx = EvalContext(
        analysis.ng, tables, target.params, analysis.batch, analysis.labels,
        frozenset(t for t, _ in analysis.feedback), target.speeds,
    )  # fmt: skip
    sizes = target.params.mesh.sizes
    choice = clock.run("search", choose, ctx, options, sizes, clock.ticker("search", every=0.0))
    clock.done("search", "certified optimal" if choice.optimal else "best found (not certified)")
    stats = plan_stats(clock, traced, tables, choice, options)
    return assemble(traced, target, analysis, tables, choice, options, stats)


def plan_stats(
    clock: StageClock, traced: Traced, tables: CostTables, choice: Choice, options: PlannerOptions
) -> dict[str, Any]:
    """Stage times, graph sizes and search statistics (``Plan.stats``)."""
    stats: dict[str, Any] = {f"{k}_s": v for k, v in clock.times.items()}
    run = choice.runs.get(options.search)
    if run is not None:
        stats.update({k: v for k, v in run.stats.items() if k != "cuts"})
        stats["search"] = run.name
        stats["search_objectives"] = {n: r.evaluation.objective for n, r in choice.runs.items()}
        stats["search_times"] = {n: r.time_s for n, r in choice.runs.items()}
        stats["search_optimal"] = {n: r.certified for n, r in choice.runs.items()}
    if "kcut" in choice.runs:
        stats["kcut_cuts"] = choice.runs["kcut"].stats["cuts"]
        stats["kcut_exact"] = choice.runs["kcut"].stats["exact"]
    if choice.fell_back_to:
        stats["fell_back_to"] = choice.fell_back_to
    stats["objective"] = choice.evaluation.objective
    stats["lower_bound"] = choice.lower_bound
    stats["equations"] = len(traced.program.eqns)
    stats["nodes"] = len(tables.configs)
    stats["free_nodes"] = sum(1 for c in tables.configs if len(c) > 1)
    stats["edges"] = len(tables.problem.edges)
    stats["max_configs"] = max(len(c) for c in tables.configs)
    return stats


class StageClock:
    """Times the stages and reports progress: at each stage end, and every ``every`` seconds
    from inside long loops."""

    def __init__(self, progress: Progress | None, every: float = 2.0) -> None:
        self.progress, self.every = progress, every
        self.times: dict[str, float] = {}
        self.last = time.perf_counter()

    def run(self, stage: str, fn: Callable, *args: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(*args)
        self.times[stage] = self.times.get(stage, 0.0) + time.perf_counter() - t0
        return out

    def done(self, stage: str, detail: str) -> None:
        if self.progress is not None:
            self.progress(stage, detail)
        self.last = time.perf_counter()

    def ticker(self, stage: str, every: float | None = None) -> Callable[[str], None]:
        """A progress callback for a stage's inner loop (throttled)."""
        gap = self.every if every is None else every

        def tick(detail: str) -> None:
            if self.progress is not None and time.perf_counter() - self.last >= gap:
                self.done(stage, detail + " ...")

        return tick


def plan(
    fn: Any,
    *args: Any,
    mesh: Any,
    cluster: Any = None,
    strategy: str = "auto",
    objective: str = "time",
    search: str = "elimination",
    in_specs: Any = None,
    options: PlannerOptions | None = None,
    progress: Progress | None = None,
) -> Plan:
    """Plan ``fn(*args)`` without running it.

    Arguments may be arrays or ShapeDtypeStructs; ``mesh`` a dict ``{"node": 4, "gpu": 4}`` (no
    devices needed), a jax Mesh or an AbstractMesh; ``cluster`` a `Cluster`, a preset name or
    None (detected from the mesh's devices). ``strategy``, ``objective``, ``search``: see
    `PlannerOptions` (``options`` gives all of them at once). ``progress(stage, detail)``, if
    given, is called as each planning stage finishes.
    """
    opts = merge_options(options, strategy, objective, search)
    return make_plan(fn, args, mesh, cluster, opts, in_specs, progress)


def merge_options(
    options: PlannerOptions | None, strategy: str, objective: str, search: str
) -> PlannerOptions:
    """``options`` with the keyword arguments that differ from their defaults applied."""
    opts = options or PlannerOptions()
    given = {"strategy": strategy, "objective": objective, "search": search}
    defaults = {"strategy": "auto", "objective": "time", "search": "elimination"}
    changes = {k: v for k, v in given.items() if v != defaults[k] or options is None}
    return dataclasses.replace(opts, **changes)
