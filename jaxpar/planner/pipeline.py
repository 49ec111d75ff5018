"""The planner: the stage sequence from a train step to a `Plan` (the only driver).

    trace    fn, args                    -> Traced     (flat program, argument layout)
    target   mesh, cluster, objective    -> Target     (cost parameters of the mesh's links)
    graph    Traced                      -> Analysis   (planning nodes, batch dims, layers)
    costs    Analysis, Target, pins      -> CostTables (configurations, priced; two problems)
    search   tables                      -> Choice     (searches, certificate, baselines)
    plan     all of the above            -> Plan       (layouts of every tensor)

Each stage is a function of typed, frozen inputs returning a typed, frozen result
(docs/architecture.md, "Pipeline"). Applying a saved plan is the same pipeline
with every node pinned to the
file's configuration and the search stage replaced by that choice (`reuse`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
from collections.abc import Iterator
from typing import Any

from jax import tree_util

from ..cost.node_costs import CostParams, is_grad_sync
from ..cost.search_tables import CostTables, build_tables
from ..hardware.mesh_model import mesh_axes, mesh_speeds, slowest_device, smallest_memory
from ..memory.buffer_reads import MemoryInputs
from ..memory.estimate import RESERVE_FRACTION, MemoryBudgetError, arg_kind, gb
from ..memory.model import MemoryModel
from ..nodes.layer_labels import batch_dims, node_labels
from ..nodes.planning_nodes import build_nodes
from ..search.candidates import Choice, choose
from ..search.memory_budget import BudgetFit, fit_budget
from ..search.options import DEFAULT_OBJECTIVE, PlannerOptions
from ..trace.meshes import (
    check_planning_mesh,
    describe_mesh,
    resolve_cluster,
    resolve_mesh,
    tracing_mesh,
)
from ..trace.tracing import is_array_leaf, planning_abstract_mesh, trace
from ..xla.allreduce_combiner import combiner_for
from ..xla.fusion import fusion_for
from .plan import Plan, eval_context, layouts
from .plan_file import PlanFile
from .reuse import check_call, check_layouts, saved_choice, saved_configs
from .signature_layouts import feedback_pairs, pinned_configs, pins_from_specs
from .stages import Analysis, ArgLayout, Progress, StageClock, Target, Traced
from .user_constraints import HintOutcome, constraint_configs


def trace_step(
    fn: Any, args: tuple, options: PlannerOptions, target: Target | None = None
) -> Traced:
    """Trace ``fn(*args)`` to a flat program (under ``target``'s whole mesh, Auto and abstract,
    when Flax's logical constraints need one: `tracing.planning_abstract_mesh`); find the
    batch arguments."""
    mesh = None if target is None else planning_abstract_mesh(target.mesh.names, target.mesh.sizes)
    program, out_tree = trace(fn, args, mesh)
    leaves, treedef = tree_util.tree_flatten(args, is_leaf=lambda x: x is None)
    layout = ArgLayout(treedef, tuple(is_array_leaf(x) for x in leaves), out_tree)
    prefixes = tuple(f"[{i}]" for i in options.batch_args(len(args)))
    donating = tuple(f"[{i}]" for i in options.donated_args(len(args)))
    pairs = list(zip(program.invars, program.invar_paths, strict=True))
    batch = tuple(t for t, p in pairs if p.startswith(prefixes))
    kinds = {t: arg_kind(p, p.startswith(prefixes)) for t, p in pairs}
    donated = frozenset(t for t, p in pairs if donating and p.startswith(donating))
    return Traced(program, layout, batch, kinds, donated)


def target_for(mesh: Any, cluster: Any, objective: str) -> Target:
    """The mesh's links and the slowest device's rates (an even split runs at its pace).

    The cost model sees the planning mesh, the user's axes larger than 1 (`MeshDescription.
    planned`); ``Target.mesh`` keeps the user's whole mesh, which shardings are built on.
    """
    desc = describe_mesh(mesh)
    cl = resolve_cluster(cluster, desc)
    names, sizes, ids = desc.planning_names, desc.planning_sizes, desc.planning_device_ids
    axes = mesh_axes(cl, names, sizes, ids)
    axes = dataclasses.replace(axes, trivial=desc.trivial_names)
    peak, mem_bw = slowest_device(cl, sizes, ids)
    params = CostParams(axes, peak, mem_bw, objective, fusion_for(desc.platform))
    memory = smallest_memory(cl, sizes, ids)
    speeds = mesh_speeds(cl, sizes, ids)
    return Target(desc, cl, params, speeds, memory, combiner_for(desc.platform, cl.device.name))


def analyze(traced: Traced) -> Analysis:
    """Planning nodes, their batch dims and layers, and the state feedback pairs."""
    ng = build_nodes(traced.program)
    batch = tuple(batch_dims(ng, traced.batch_tensors))
    return Analysis(ng, batch, tuple(node_labels(ng)), tuple(feedback_pairs(traced.program)))


def user_pins(analysis: Analysis, target: Target, in_specs: Any, args: tuple) -> dict:
    """Node -> the configuration the user's ``in_specs`` force on it."""
    ng, mesh = analysis.ng, target.params.mesh
    pins = pins_from_specs(in_specs, args, ng.program)
    return pinned_configs(ng, pins, mesh.names, mesh.sizes, mesh.trivial) if pins else {}


def memory_budget(requested: float | str | None, target: Target) -> float | None:
    """The budget in bytes per device: "device" is the smallest device's memory less the
    reserve; a budget above the device's memory is an error."""
    if requested is None:
        return None
    if requested == "device":
        return target.device_memory * (1 - RESERVE_FRACTION)
    if requested > target.device_memory:
        raise MemoryBudgetError(
            f"memory budget {gb(requested)} per device is more than the {gb(target.device_memory)}"
            f" a device of cluster {target.cluster.name!r} has; give at most that, or "
            'memory_budget="device" for its memory less the reserve'
        )
    return float(requested)


def memory_model(
    traced: Traced, target: Target, analysis: Analysis, tables: CostTables,
    options: PlannerOptions,
) -> MemoryModel:  # fmt: skip
    """The liveness model of the step's buffers under any assignment of ``tables``."""
    ng, batch = analysis.ng, analysis.batch
    return MemoryModel(
        MemoryInputs(
            ng=ng, configs=tables.configs, uses=tables.uses, sizes=target.params.mesh.sizes,
            feedback=dict(analysis.feedback), arg_kinds=traced.arg_kinds, donated=traced.donated,
            grad_sync=lambda v, cfg: is_grad_sync(ng.nodes[v], cfg, batch[v]),
            combine_syncs=target.mesh.platform == "cpu",
            pipelined=options.overlapped_regions(traced.program),
        )
    )  # fmt: skip


def assemble(
    traced: Traced, target: Target, analysis: Analysis, tables: CostTables, choice: Choice,
    options: PlannerOptions, stats: dict[str, Any], model: MemoryModel, fit: BudgetFit,
) -> Plan:  # fmt: skip
    """The `Plan` of the chosen assignment: layouts of every tensor, argument and result."""
    return Plan(
        options=options, traced=traced, target=target, analysis=analysis, tables=tables,
        choice=choice, stats=stats, memory=fit.estimate, memory_model=model,
        layouts=layouts(
            traced.program, analysis.ng, tables.configs, choice.assignment, dict(analysis.feedback)
        ),
    )  # fmt: skip


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while planning, back as it was after.

    Its full passes walk every object the trace and the tables hold (~0.5 M on an 8B-class
    step): 45 % of an evaluation's time and 10-18 % of planning (bench/scale/README.md, issue 10).
    Reference counting still frees everything acyclic; cycles wait for the next collection.
    After, the objects planning made go straight to the oldest generation (`gc.freeze`, then
    `gc.unfreeze`): the first young collection would walk them all (0.15-0.2 s on an 8B-class
    step) only to promote them there; cycles among them wait for the next full collection.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.freeze()
            gc.unfreeze()
            gc.enable()


def make_plan(
    fn: Any,
    args: tuple,
    mesh: Any,
    cluster: Any,
    options: PlannerOptions,
    in_specs: Any = None,
    progress: Progress | None = None,
    saved: PlanFile | None = None,
) -> Plan:
    """Plan ``fn(*args)`` on ``mesh`` for ``cluster`` (``in_specs``: optional argument pins).

    ``saved``: a plan file to apply instead of searching: the call is checked against it,
    every node pinned to its saved configuration, and the result's layouts checked against
    the file's (`reuse`); ``options`` are then the file's.
    """
    with collector_paused():
        return _make_plan(fn, args, mesh, cluster, options, in_specs, progress, saved)


def _make_plan(fn, args, mesh, cluster, options, in_specs, progress, saved) -> Plan:
    clock = StageClock(progress)
    mesh = describe_mesh(mesh)
    check_planning_mesh(mesh)  # before anything slow runs
    if saved is not None:
        check_call(saved, mesh, args)
    with clock.stage("graph"):
        target = target_for(mesh, cluster, options.objective)
    with clock.stage("trace"), tracing_mesh(mesh):
        traced = trace_step(fn, args, options, target)
    clock.done("trace", f"{len(traced.program.eqns)} equations")
    with clock.stage("graph"):
        analysis = analyze(traced)
    clock.done("graph", f"{len(analysis.ng.nodes)} nodes")
    with clock.stage("cost"):
        pinned = (
            saved_configs(saved, traced.program, analysis.ng, target.mesh)
            if saved is not None
            else user_pins(analysis, target, in_specs, args)
        )
    mode = options.user_constraints if traced.program.user_constraints and saved is None else ""
    budget = memory_budget(options.memory_budget, target)
    run = lambda allowed: searched(
        traced, target, analysis, options, pinned, allowed, clock, saved, budget
    )
    hint = None
    if mode == "pin":
        found = run(kept_configs(traced, target, analysis, options, pinned))
    elif mode == "hint":
        found, hint = hinted(traced, target, analysis, options, pinned, run)
    else:
        found = run(None)
    tables, choice, fit, model = found
    choice = dataclasses.replace(choice, baselines=choice.baselines.for_plan())
    stats = plan_stats(clock, traced, tables, choice, options)
    stats.update(budget_bound=fit.bound, budget_solves=fit.solves, memory_budget=budget)
    if saved is not None:
        stats.update(saved=saved.predicted, loaded_plan=True)
    plan = assemble(traced, target, analysis, tables, choice, options, stats, model, fit)
    if hint is not None:
        plan = dataclasses.replace(plan, hint=hint)
    if saved is not None:
        check_layouts(saved, plan)
    return plan


Searched = tuple[CostTables, Choice, BudgetFit, MemoryModel]


def searched(
    traced: Traced, target: Target, analysis: Analysis, options: PlannerOptions,
    pinned: dict, allowed: dict | None, clock: StageClock, saved: PlanFile | None,
    budget: float | None,
) -> Searched:  # fmt: skip
    """The cost and search stages over the configurations ``pinned`` and ``allowed`` leave:
    the tables, the chosen assignment, how it fits the memory budget, the memory model."""
    with clock.stage("cost"):
        tables = build_tables(
            analysis.ng, target.params, analysis.feedback, pinned, clock.ticker("costs"), allowed
        )
    n_configs, n_edges = sum(map(len, tables.configs)), len(tables.problem.edges)
    clock.done("costs", f"{n_configs} configurations, {n_edges} edges")
    ctx = eval_context(analysis, target, tables, options, traced.program)
    model = memory_model(traced, target, analysis, tables, options)
    with clock.stage("search"):
        if saved is not None:
            choice, fit = saved_choice(ctx, options, model, budget)
        else:
            choice = choose(ctx, options, target.params.mesh.sizes, clock.ticker("search", 0.0))
            choice, fit = fit_budget(ctx, options, model, budget, choice, clock.ticker("search"))
    clock.done("search", "certified optimal" if choice.optimal else "best found (not certified)")
    return tables, choice, fit, model


def kept_configs(
    traced: Traced, target: Target, analysis: Analysis, options: PlannerOptions, pinned: dict
) -> dict:
    """Node -> the configurations keeping every user constraint it holds (`user_constraints`)."""
    mesh = target.params.mesh
    return constraint_configs(
        analysis.ng, traced.program.user_constraints, mesh.names, mesh.sizes,
        options.objective == "comm", pinned,
    )  # fmt: skip


def hinted(
    traced: Traced, target: Target, analysis: Analysis, options: PlannerOptions, pinned: dict,
    run: Any,
) -> tuple[Searched, HintOutcome]:  # fmt: skip
    """``user_constraints="hint"``: the search's own plan and the best plan keeping every
    constraint; the faster under the objective, the kept one when they tie."""
    free = run(None)
    free_cost = free[1].evaluation
    try:
        kept = run(kept_configs(traced, target, analysis, options, pinned))
    except (ValueError, MemoryBudgetError) as err:
        outcome = HintOutcome(
            None, None, free_cost.objective, free_cost.cost.step_for(options.objective), False,
            str(err), free_peak=free[2].estimate.peak,
        )  # fmt: skip
        return free, outcome
    kept_cost = kept[1].evaluation
    chose_kept = kept_cost.objective <= free_cost.objective * (1 + 1e-9) + 1e-300
    outcome = HintOutcome(
        kept_cost.objective, kept_cost.cost.step_for(options.objective), free_cost.objective,
        free_cost.cost.step_for(options.objective), chose_kept, "", kept[2].estimate.peak,
        free[2].estimate.peak,
    )  # fmt: skip
    return (kept if chose_kept else free), outcome


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
    stats["bound_method"] = choice.bound_method
    if choice.lower_bound is not None:  # the certificate's gap, relative to the reported cost
        gap = choice.evaluation.objective - choice.lower_bound
        stats["bound_gap"] = max(0.0, gap) / max(choice.evaluation.objective, 1e-300)
    stats["equations"] = len(traced.program.eqns)
    stats["nodes"] = len(tables.configs)
    stats["free_nodes"] = sum(1 for c in tables.configs if len(c) > 1)
    stats["edges"] = len(tables.problem.edges)
    stats["max_configs"] = max(len(c) for c in tables.configs)
    stats["loops"] = [loop.trips for loop in traced.program.regions]
    if choice.tying is not None:  # repeated layers searched as one: the certificate's space
        stats["tied_nodes"] = choice.tying.tied_nodes
        stats["repeated_layers"] = [list(f) for f in choice.tying.families]
    return stats


def plan(
    fn: Any,
    *args: Any,
    mesh: Any = None,
    cluster: Any = None,
    strategy: str = "auto",
    objective: str = DEFAULT_OBJECTIVE,
    search: str = "elimination",
    in_specs: Any = None,
    memory_budget: float | str | None = "device",
    options: PlannerOptions | None = None,
    progress: Progress | None = None,
) -> Plan:
    """Plan ``fn(*args)`` without running it.

    Arguments may be arrays or ShapeDtypeStructs; ``mesh`` a dict ``{"node": 4, "gpu": 4}`` (no
    devices needed), a jax Mesh (Auto, Explicit or mixed axes) or an AbstractMesh, or None: the
    mesh set around the call (``jax.set_mesh``, ``jax.sharding.use_abstract_mesh``); a given
    mesh must agree with the one set. Axes of size 1 are kept in the plan's mesh and planned on
    by nobody (docs/meshes.md). ``cluster`` a `Cluster`, a preset name or
    None (detected from the mesh's devices). ``strategy``, ``objective``, ``search``: see
    `PlannerOptions` (``options`` gives all of them at once). ``memory_budget``: bytes per
    device the plan must fit ("60GB", a number, "device": the device's memory less a reserve,
    None: no limit); `Plan.memory` holds the prediction. ``progress(stage, detail)``, if given,
    is called as each planning stage finishes.
    """
    opts = merge_options(options, strategy, objective, search, memory_budget)
    mesh = resolve_mesh(mesh, "jaxpar.plan", need_devices=False)
    if mesh is None:
        raise TypeError(
            "jaxpar.plan needs a mesh: pass mesh= (a dict such as {'data': 2, 'model': 4}, a jax "
            "Mesh or an AbstractMesh), or call it inside `with jax.set_mesh(mesh):`"
        )
    return make_plan(fn, args, mesh, cluster, opts, in_specs, progress)


def merge_options(
    options: PlannerOptions | None,
    strategy: str,
    objective: str,
    search: str,
    memory_budget: float | str | None = "device",
) -> PlannerOptions:
    """``options`` with the keyword arguments that differ from their defaults applied."""
    opts = options or PlannerOptions()
    given = {
        "strategy": strategy, "objective": objective, "search": search,
        "memory_budget": memory_budget,
    }  # fmt: skip
    defaults = {
        "strategy": "auto", "objective": DEFAULT_OBJECTIVE, "search": "elimination",
        "memory_budget": "device",
    }  # fmt: skip
    changes = {k: v for k, v in given.items() if v != defaults[k] or options is None}
    return dataclasses.replace(opts, **changes)
