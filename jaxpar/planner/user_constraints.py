"""The step's own sharding constraints: pinned, or hints the search may override.

A step may call ``jax.lax.with_sharding_constraint`` itself, or Flax's
``nn.with_logical_constraint`` under ``nn.logical_axis_rules`` (how MaxText, t5x and Flax's
examples steer XLA). `tracing` records each as a `graph.UserConstraint`; this module turns them
into restrictions of the configuration space and reports what the plan did with each.

- `constraint_configs`: node -> its configurations that give every constrained tensor it
  produces the user's layout (dims the user left ``UNCONSTRAINED`` free; mesh axes of size 1
  ignored, they split nothing). The same restriction ``in_specs`` makes of an argument's node,
  with an error that says why when no configuration gives the layout.
- `HintOutcome`: with ``user_constraints="hint"``, the cost of the plan keeping every
  constraint beside the search's own, and which one the plan is.
- `constraint_rows`: one row per constraint: where, the layout asked, the layout planned, kept
  or overridden.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from jax.sharding import PartitionSpec

from ..nodes.configs import Config, node_configs, spec_of
from ..nodes.planning_nodes import NodeGraph
from ..program.graph import UserConstraint, phase_of

if TYPE_CHECKING:
    from .plan import Plan

Asked = tuple[tuple[int, ...] | None, ...]  # per dim: mesh axis indices (planning mesh), None free


@dataclasses.dataclass(frozen=True)
class HintOutcome:
    """What ``user_constraints="hint"`` found: the plan keeping every constraint (None when no
    plan keeps them all: ``why``) beside the search's own, and which the plan is."""

    kept_objective: float | None  # the objective of the best plan keeping every constraint
    kept_step_s: float | None  # its step (`PlanCost.step_for` the objective)
    free_objective: float  # the objective of the search's own plan (constraints free)
    free_step_s: float
    chose_kept: bool  # the plan is the one keeping every constraint
    why: str = ""  # why no plan keeps them all, when none does
    kept_peak: float | None = None  # predicted peak bytes per device of the plan keeping them
    free_peak: float | None = None  # and of the search's own plan


def asked_layout(
    c: UserConstraint, names: Sequence[str], sizes: Sequence[int]
) -> tuple[Asked | None, str]:
    """(per dim: the mesh axes, as indices of the planning mesh, the constraint asks for, None
    where free; or None and why the planning mesh cannot hold it)."""
    if not c.readable:
        return None, "its sharding names no mesh axes"
    theirs = dict(c.axis_sizes)
    out: list[tuple[int, ...] | None] = []
    for entry in c.spec:
        if entry is None:
            out.append(None)
            continue
        axes = []
        for ax in entry:
            if ax in names:
                if sizes[names.index(ax)] > 1:
                    axes.append(names.index(ax))
            elif theirs.get(ax, 0) != 1:
                mesh = tuple(names)
                return None, f"it names mesh axis {ax!r}, which the planning mesh {mesh} lacks"
        if axes != sorted(axes):
            order = [names[a] for a in sorted(axes)]
            return None, (
                f"it splits one dim over {entry} in another order than the mesh's; jaxpar lays "
                f"axes out in mesh order: write {tuple(order)}"
            )
        out.append(tuple(axes))
    return tuple(out), ""


def _matches(spec: Sequence[tuple[int, ...]], asked: Asked, sizes: Sequence[int]) -> bool:
    """Whether a planned layout is the asked one on every dim it constrains (size-1 axes
    split nothing, so they are ignored)."""
    for have, want in zip(spec, asked, strict=True):
        if want is not None and tuple(a for a in have if sizes[a] > 1) != want:
            return False
    return True


def kept(c: UserConstraint, spec: Any, names: Sequence[str], sizes: Sequence[int]) -> bool | None:
    """Whether planned layout ``spec`` of the constrained tensor is the one asked (None: the
    constraint is not one the planning mesh can hold)."""
    asked, _ = asked_layout(c, names, sizes)
    if asked is None:
        return None
    spec = tuple(spec) + ((),) * (len(asked) - len(spec))
    return _matches(spec, asked, sizes)


def constraint_configs(
    ng: NodeGraph,
    constraints: Sequence[UserConstraint],
    names: Sequence[str],
    sizes: Sequence[int],
    full_contractions: bool = False,
    pinned: dict[int, Config] | None = None,
) -> dict[int, list[Config]]:
    """Node -> its configurations (of ``pinned``'s one, where given) that give each
    constrained tensor it produces the asked layout. Raises ValueError, saying which
    constraint and why, when one cannot be held or the node has no such configuration."""
    by_node: dict[int, list[tuple[UserConstraint, Asked]]] = {}
    for c in constraints:
        asked, why = asked_layout(c, names, sizes)
        if asked is None:
            raise ValueError(
                f"cannot pin the sharding constraint {where(c)} to {asked_text(c)}: {why}. Plan "
                "on the mesh the step constrains to, or with user_constraints='hint'"
            )
        by_node.setdefault(ng.node_of_tensor[c.tensor], []).append((c, asked))
    out: dict[int, list[Config]] = {}
    pinned = pinned or {}
    for v, items in by_node.items():
        node = ng.nodes[v]
        if v in pinned:
            cfgs = [pinned[v]]
        else:
            cfgs = node_configs(ng, node, sizes, full_contractions, names)
        keep = [
            cfg
            for cfg in cfgs
            if all(
                _matches(spec_of(node.tensor_maps[c.tensor], cfg), asked, sizes)
                for c, asked in items
            )
        ]
        if not keep:
            raise ValueError(impossible(ng, items, v in pinned))
        out[v] = keep
    return out


def impossible(ng: NodeGraph, items: list, pinned: bool) -> str:
    """Why no configuration of a node holds its constraints: the message, with the fix."""
    asks = "; ".join(f"{where(c)} asks {asked_text(c)}" for c, _ in items)
    tensor = ng.program.tensors[items[0][0].tensor]
    if pinned:
        cause = "in_specs pins that argument to another layout"
    elif len(items) > 1:
        cause = (
            "they constrain tensors computed together (one elementwise chain) to layouts no "
            "one split of that computation gives"
        )
    else:
        cause = (
            f"no split of the computation producing it gives that layout (shape {tensor.shape}: "
            "a dim the mesh axes do not divide, or one its computation cannot split)"
        )
    return (
        f"cannot keep the step's sharding constraints: {asks}; {cause}. Change the "
        "constraint, or plan with user_constraints='hint' to let the planner choose"
    )


def where(c: UserConstraint) -> str:
    """Where a constraint is, for people: its equation and name stack."""
    stack = c.name_stack or "the step's top level"
    return f"at equation {c.eqn} ({stack})"


def asked_text(c: UserConstraint) -> str:
    """The layout a constraint asks for, as a PartitionSpec (with its logical names)."""
    spec = str(partition_spec_of(c))
    if c.logical is not None:
        return f"{spec} (logical {tuple(c.logical)})"
    return spec


def partition_spec_of(c: UserConstraint) -> PartitionSpec:
    """The user's spec as a `PartitionSpec` (UNCONSTRAINED where free)."""
    entries: list[Any] = []
    for e in c.spec:
        if e is None:
            entries.append(PartitionSpec.UNCONSTRAINED)
        elif not e:
            entries.append(None)
        else:
            entries.append(e[0] if len(e) == 1 else tuple(e))
    return PartitionSpec(*entries)


def constraint_rows(plan: Plan) -> list[dict[str, Any]]:
    """One row per user constraint: equation, phase, layer, where, logical names, the layout
    asked and the one planned, and whether the plan kept it (None: not on this mesh)."""
    names, sizes = plan.mesh_axes.names, plan.mesh_axes.sizes
    program, rows = plan.program, []
    for c in program.user_constraints:
        spec = plan.tensor_specs.get(c.tensor, ())
        node = plan.ng.node_of_tensor.get(c.tensor)
        rows.append(
            {
                "equation": c.eqn,
                "phase": phase_of(c.name_stack),
                "layer": plan.labels[node] if node is not None else "",
                "where": c.name_stack,
                "logical": None if c.logical is None else list(c.logical),
                "asked": str(partition_spec_of(c)),
                "planned": str(plan.partition_spec(spec)),
                "kept": kept(c, spec, names, sizes),
            }
        )
    return rows
