"""Reusing a saved plan: check it against a call and rebuild the `Plan` without searching.

`bind(source, fn, args, mesh)` (what ``auto_shard(plan=...)`` calls): the function is re-traced
for the call's arguments and its planning nodes rebuilt (the cheap, deterministic stages), then
checked against the file — mesh axis names and sizes, the argument signature, the program's
counts and fingerprint, every configuration valid for its node. Each node is pinned to its saved
configuration, so nothing is searched; the plan is re-priced on the cluster given at application
and its layouts must equal the file's. Any difference is a `PlanFileError` naming it.
"""

from __future__ import annotations

from typing import Any

from jax import tree_util

from .budget import BudgetFit
from .choose import Choice
from .configs import enumerate_configs, tensor_dims
from .evaluate import EvalContext, evaluate
from .graph import Program
from .meshes import describe_mesh
from .nodes import NodeGraph
from .plan_file import (
    PlanFile,
    PlanFileError,
    as_plan_file,
    fingerprint,
    names_to_pspec,
    treedef_text,
)
from .planner import (
    StageClock,
    analyze,
    assemble,
    memory_budget,
    memory_model,
    target_for,
    trace_step,
)
from .result import Plan
from .tables import build_tables
from .trace import is_array_leaf


def check_mesh(pf: PlanFile, mesh: Any) -> None:
    """`PlanFileError` unless ``mesh`` has the plan's axis names and sizes (in order)."""
    desc = describe_mesh(mesh)
    if (desc.names, desc.sizes) != (pf.mesh_names, pf.mesh_sizes):
        have = dict(zip(desc.names, desc.sizes, strict=True))
        raise PlanFileError(
            f"the plan was made for mesh {pf.mesh}, but it is applied on mesh {have}; a plan "
            "applies only to a mesh with the same axis names and sizes, in the same order"
        )


def check_signature(pf: PlanFile, args: tuple) -> None:
    """`PlanFileError` naming the first difference between ``args`` and the plan's signature."""
    with_path, treedef = tree_util.tree_flatten_with_path(args, is_leaf=lambda x: x is None)
    head = "the arguments do not have the signature the plan was made for"
    if len(with_path) != len(pf.leaves):
        raise PlanFileError(
            f"{head}: {len(with_path)} argument leaves, the plan's signature has {len(pf.leaves)}"
        )
    for (p, leaf), (path, kind, shape, dtype) in zip(with_path, pf.leaves, strict=True):
        key = tree_util.keystr(p)
        if key != path:
            raise PlanFileError(f"{head}: leaf {key} where the plan has {path}")
        if is_array_leaf(leaf) != (kind == "array"):
            what = "an array" if is_array_leaf(leaf) else f"static ({type(leaf).__name__})"
            raise PlanFileError(f"{head}: argument {key} is {what}, the plan's is {kind}")
        if kind == "array" and (tuple(leaf.shape), str(leaf.dtype)) != (shape, dtype):
            raise PlanFileError(
                f"{head}: argument {key} is {leaf.dtype}{list(leaf.shape)}, the plan's is "
                f"{dtype}{list(shape)}"
            )
    if treedef_text(treedef) != pf.treedef:
        raise PlanFileError(f"{head}: the argument tree structure differs (node types or keys)")


def _check_program(pf: PlanFile, program: Program, ng: NodeGraph, sizes) -> dict[int, tuple]:
    """Node -> saved configuration, after checking the program and every configuration."""
    counts = (len(program.eqns), len(program.tensors), len(ng.nodes))
    if counts != pf.counts or fingerprint(program, ng) != pf.fingerprint:
        raise PlanFileError(
            "the function traced to another program than the plan was made for (equations, "
            f"tensors, nodes: {counts} here, {pf.counts} in the plan; fingerprints "
            f"{'equal' if fingerprint(program, ng) == pf.fingerprint else 'differ'}): the step's "
            "code, a static argument or the jax version changed; plan it again"
        )
    pinned = {}
    for node, cfg in zip(ng.nodes, pf.assignment, strict=True):
        replicated = cfg == (-1,) * len(sizes)
        if not replicated and cfg not in enumerate_configs(
            node.space, sizes, tensor_dims(ng, node)
        ):
            raise PlanFileError(
                f"plan file: assignment[{node.index}] = {list(cfg)} is not a valid configuration "
                f"of node {node.index} (iteration dims {node.space.sizes}, splittable "
                f"{node.space.splittable}) on mesh sizes {tuple(sizes)}"
            )
        pinned[node.index] = cfg
    return pinned


def rebuild(pf: PlanFile, traced: Any, target: Any, analysis: Any, clock: StageClock) -> Plan:
    """The `Plan` of the file's assignment on a re-traced program (nothing is searched)."""
    ng, params = analysis.ng, target.params
    pinned = _check_program(pf, traced.program, ng, params.mesh.sizes)
    tables = clock.run("cost", build_tables, ng, params, analysis.feedback, pinned)
    ctx = EvalContext(
        ng, tables, params, analysis.batch, analysis.labels,
        frozenset(t for t, _ in analysis.feedback), target.speeds, target.combiner,
        pf.options.overlapped_regions(traced.program),
    )  # fmt: skip
    zeros = (0,) * len(ng.nodes)
    evaluation = evaluate(ctx, zeros)
    choice = Choice(pf.options.strategy, zeros, evaluation, False, None, {}, {}, None)
    stats: dict[str, Any] = {f"{k}_s": v for k, v in clock.times.items()}
    stats.update(
        search_s=0.0, equations=pf.counts[0], nodes=pf.counts[2], free_nodes=0,
        edges=len(tables.problem.edges), max_configs=1, objective=evaluation.objective,
        lower_bound=None, saved=pf.predicted, loaded_plan=True,
    )  # fmt: skip
    model = memory_model(traced, target, analysis, tables, pf.options)
    budget = memory_budget(pf.options.memory_budget, target)
    fit = BudgetFit(model.estimate(zeros, budget), False, None, 0)  # reported, not enforced
    plan = assemble(traced, target, analysis, tables, choice, pf.options, stats, model, fit)
    mine = PlanFile.from_plan(plan)
    for kind, have, saved in (
        ("arguments", mine.arguments, pf.arguments), ("results", mine.results, pf.results)
    ):  # fmt: skip
        if len(have) != len(saved):
            raise PlanFileError(f"plan file: {len(saved)} {kind}, the program has {len(have)}")
        for i, ((path, spec), (spath, sspec)) in enumerate(zip(have, saved, strict=True)):
            if (path, spec) != (spath, sspec):
                raise PlanFileError(
                    f"plan file: {kind}[{i}] does not match its assignment: the assignment "
                    f"gives {path}: {names_to_pspec(spec)}, the file says {spath}: "
                    f"{names_to_pspec(sspec)}"
                )
    return plan


def bind(source: Any, fn: Any, args: tuple, mesh: Any, cluster: Any = None) -> Plan:
    """Apply a saved plan to ``fn(*args)`` on ``mesh``: re-trace, check, pin (no search)."""
    pf = as_plan_file(source)
    check_mesh(pf, mesh)
    check_signature(pf, args)
    clock = StageClock(None)
    traced = clock.run("trace", trace_step, fn, args, pf.options)
    target = clock.run("graph", target_for, mesh, cluster, pf.options.objective)
    analysis = clock.run("graph", analyze, traced)
    return rebuild(pf, traced, target, analysis, clock)
