"""Reusing a saved plan: the checks and the pinned choice `pipeline.make_plan` runs with one.

Applying a plan file (``auto_shard(plan=...)``) runs the pipeline with ``saved=`` the file: the
call is checked against it (`check_call`: mesh axis names and sizes, the argument signature);
the function is re-traced and its planning nodes rebuilt (the cheap, deterministic stages), and
the program checked (`saved_configs`: counts and fingerprint, every configuration valid for its
node). Each node is pinned to its saved configuration, so the search stage is that choice
(`saved_choice`); the plan is re-priced on the cluster given at application and its layouts
must equal the file's (`check_layouts`). Any difference is a `PlanFileError` naming it.
"""

from __future__ import annotations

import os
from typing import Any

from jax import tree_util

from ..cost.evaluation import EvalContext, evaluate
from ..memory.model import MemoryModel
from ..nodes.configs import enumerate_configs, tensor_dims
from ..nodes.planning_nodes import NodeGraph
from ..program.graph import Program
from ..search.candidates import Baselines, Choice
from ..search.memory_budget import BudgetFit
from ..search.options import PlannerOptions
from ..trace.meshes import MeshDescription, describe_mesh
from ..trace.tracing import is_array_leaf
from .plan import Plan
from .plan_file import PlanFile, PlanFileError, fingerprint, load_plan, names_to_pspec, treedef_text


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


def saved_configs(
    pf: PlanFile, program: Program, ng: NodeGraph, mesh: MeshDescription
) -> dict[int, tuple]:
    """Node -> saved configuration over the planning mesh (the file's, per axis of the user's
    mesh, without its size-1 axes), after checking the program and every configuration."""
    sizes = mesh.planning_sizes
    counts = (len(program.eqns), len(program.tensors), len(ng.nodes))
    if counts != pf.counts or fingerprint(program, ng) != pf.fingerprint:
        raise PlanFileError(
            "the function traced to another program than the plan was made for (equations, "
            f"tensors, nodes: {counts} here, {pf.counts} in the plan; fingerprints "
            f"{'equal' if fingerprint(program, ng) == pf.fingerprint else 'differ'}): the step's "
            "code, a static argument or the jax version changed; plan it again"
        )
    pinned = {}
    for node, full in zip(ng.nodes, pf.assignment, strict=True):
        cfg = tuple(full[a] for a in mesh.planned)
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


def check_call(pf: PlanFile, mesh: Any, args: tuple) -> None:
    """`PlanFileError` unless the mesh and the arguments are the ones the plan was made for."""
    check_mesh(pf, mesh)
    check_signature(pf, args)


def saved_choice(
    ctx: EvalContext, options: PlannerOptions, model: MemoryModel, budget: float | None
) -> tuple[Choice, BudgetFit]:
    """The search stage of a saved plan: every node's one (pinned) configuration, its memory
    reported against the budget, not enforced."""
    zeros = (0,) * len(ctx.ng.nodes)
    evaluation = evaluate(ctx, zeros)
    baselines = Baselines({}, ctx)
    choice = Choice(options.strategy, zeros, evaluation, False, None, {}, baselines, None)
    return choice, BudgetFit(model.estimate(zeros, budget), False, None, 0)


def check_layouts(pf: PlanFile, plan: Plan) -> None:
    """`PlanFileError` unless the re-priced plan's argument and result layouts are the file's."""
    mine = PlanFile.from_plan(plan)
    trivial = set(plan.target.mesh.trivial_names)  # older files may split over size-1 axes

    def planned(specs: tuple) -> tuple:
        return tuple(
            (path, tuple(tuple(a for a in axes if a not in trivial) for axes in spec))
            for path, spec in specs
        )

    for kind, have, saved in (
        ("arguments", mine.arguments, planned(pf.arguments)),
        ("results", mine.results, planned(pf.results)),
    ):
        if len(have) != len(saved):
            raise PlanFileError(f"plan file: {len(saved)} {kind}, the program has {len(have)}")
        for i, ((path, spec), (spath, sspec)) in enumerate(zip(have, saved, strict=True)):
            if (path, spec) != (spath, sspec):
                raise PlanFileError(
                    f"plan file: {kind}[{i}] does not match its assignment: the assignment "
                    f"gives {path}: {names_to_pspec(spec)}, the file says {spath}: "
                    f"{names_to_pspec(sspec)}"
                )


def as_plan_file(source: Any) -> PlanFile:
    """A `PlanFile` from a `PlanFile`, a `Plan`, or the path of a plan file."""
    if isinstance(source, PlanFile):
        return source
    if isinstance(source, Plan):
        return PlanFile.from_plan(source)
    if isinstance(source, (str, os.PathLike)):
        return load_plan(source)
    raise TypeError(
        f"plan= takes a Plan, a loaded plan file (jaxpar.load_plan) or a path, not "
        f"{type(source).__name__}"
    )
