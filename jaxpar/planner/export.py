"""Export a plan for running without jaxpar: plain `PartitionSpec` pytrees, a listing, and
logical-axis rules in MaxText's format.

`export_specs`: the `PartitionSpec` pytrees of the arguments (None at static leaves) and results,
usable as ``jax.jit(fn, in_shardings=..., out_shardings=...)`` with `NamedSharding`s over the
same mesh; a path -> spec listing; and logical-axis rules, an ordered list of
``(logical name, mesh axis | (mesh axes) | None)`` pairs (MaxText's ``logical_axis_rules``,
Flax's ``nn.logical_axis_rules``).

The logical names are the model's own where it has them: the names of parameters boxed in
Flax's ``nn.LogicallyPartitioned`` (``nn.with_logical_partitioning``; the optimizer state's
leaves inherit their parameter's box) and of activations under ``nn.with_logical_constraint``.
An argument leaf without a box is named ``<last path key>.<dim>`` (``kernel.1``). A name is
*expressible* when the plan gives every tensor dim carrying it the same mesh axes (axes of size
1 split nothing and are not compared); its rule is then the planned axes, written as the
user's own rule where the two agree (so size-1 axes the user listed stay). The rules are
partial: a name the plan splits two ways is left out and listed in
`ExportedSpecs.not_expressible`, with the layouts it has and where; Flax then leaves its dims
unsharded, and the listing's per-path specs hold the plan's layouts.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any

from jax import tree_util
from jax.sharding import PartitionSpec

if TYPE_CHECKING:
    from .plan import Plan

Rule = tuple[str, Any]  # (logical name, None | "axis" | ("axis", ...))


@dataclasses.dataclass(frozen=True)
class ExportedSpecs:
    """A plan's layouts as plain `PartitionSpec`s and logical-axis rules (`export_specs`)."""

    in_specs: Any  # pytree like the arguments; None at static leaves
    out_specs: Any  # pytree like the results
    listing: tuple[tuple[str, PartitionSpec], ...]  # (path, spec): arguments, then results
    logical_axes: dict[str, tuple[str | None, ...]]  # argument path -> logical name per dim
    logical_rules: tuple[Rule, ...]  # the expressible names' rules, in order
    not_expressible: dict[str, str]  # logical name -> the layouts the plan gives it, and where
    logical_reason: str  # where the names came from

    def maxtext_rules(self) -> list[list[Any]]:
        """The rules as MaxText's YAML writes them: ``[name, [axes...]]`` (``[]``: none)."""
        out = []
        for name, axes in self.logical_rules:
            value = [] if axes is None else [axes] if isinstance(axes, str) else list(axes)
            out.append([name, value])
        return out

    def text(self) -> str:
        lines = [f"{path}: {spec}" for path, spec in self.listing]
        lines.append(f"logical-axis rules ({self.logical_reason}):")
        lines += [f"  {n}: {a}" for n, a in self.logical_rules]
        if self.not_expressible:
            lines.append("not expressible as logical-axis rules (left unsharded by the rules):")
            lines += [f"  {n}: {why}" for n, why in self.not_expressible.items()]
        return "\n".join(lines)


def _last_key(path: str) -> str:
    """The last key of a pytree path (``['kernel']`` -> ``kernel``), skipping a Flax box's
    ``.value``."""
    path = path.removesuffix(".value")
    m = re.search(r"(?:\['([^']*)'\]|\.(\w+)|\[(\d+)\])$", path)
    return next((g for g in m.groups() if g is not None), path) if m else path


def argument_names(plan: Plan) -> dict[str, tuple[str | None, ...]]:
    """Argument path -> logical name per dim: the leaf's Flax box's names, else
    ``<last path key>.<dim>``."""
    program = plan.program
    out = {}
    for path, t in zip(program.invar_paths, program.invars, strict=True):
        boxed = program.logical_names.get(t)
        ndim = len(program.tensors[t].shape)
        out[path] = (
            boxed if boxed is not None else tuple(f"{_last_key(path)}.{d}" for d in range(ndim))
        )
    return out


def named_tensors(plan: Plan) -> list[tuple[str, tuple[str | None, ...], Any]]:
    """(where, logical names, planned layout) of every tensor with names: the arguments, then
    the activations under the user's logical constraints."""
    program = plan.program
    out = [
        (path, names, spec)
        for (path, names), spec in zip(argument_names(plan).items(), plan.invar_specs, strict=True)
    ]
    inputs = set(program.invars)
    for c in program.user_constraints:
        names = program.logical_names.get(c.tensor)
        if names is not None and c.tensor not in inputs:
            spec = plan.tensor_specs.get(c.tensor, ())
            out.append((f"equation {c.eqn} ({c.name_stack or 'top level'})", names, spec))
    return out


def _axes_of(plan: Plan, spec: Any, d: int) -> tuple[str, ...]:
    """The mesh axes of size > 1 splitting dim ``d`` of a planned layout, by name."""
    names, sizes = plan.mesh_axes.names, plan.mesh_axes.sizes
    return tuple(names[a] for a in (spec[d] if d < len(spec) else ()) if sizes[a] > 1)


def name_layouts(plan: Plan) -> dict[str, dict[tuple[str, ...], list[str]]]:
    """Logical name -> each set of mesh axes the plan splits its dims over -> where."""
    seen: dict[str, dict[tuple[str, ...], list[str]]] = {}
    for where, names, spec in named_tensors(plan):
        for d, name in enumerate(names):
            if name is not None:
                seen.setdefault(name, {}).setdefault(_axes_of(plan, spec, d), []).append(where)
    return seen


def _rule_value(axes: tuple[str, ...], user: Any, sizes: dict[str, int]) -> Any:
    """A rule's value: the user's own when it splits over the same axes of size > 1 (it may
    list axes of size 1, as MaxText's do), else the planned axes."""
    if user is not None or not axes:
        theirs = () if user is None else (user,) if isinstance(user, str) else tuple(user)
        if tuple(a for a in theirs if sizes.get(a, 1) > 1) == axes:
            return user if not isinstance(user, list) else tuple(user)
    return None if not axes else axes[0] if len(axes) == 1 else axes


def logical_rules(plan: Plan) -> tuple[tuple[Rule, ...], dict[str, str]]:
    """(the rules of the expressible names, ordered as the user's rules then first use;
    name -> why not expressible)."""
    seen = name_layouts(plan)
    sizes = dict(zip(plan.mesh_axes.names, plan.mesh_axes.sizes, strict=True))
    user: dict[str, Any] = {}
    for name, axes in plan.program.logical_rules:
        user.setdefault(name, axes)  # the first rule of a name is the one Flax tries first
    order = [n for n in user if n in seen] + [n for n in seen if n not in user]
    rules, bad = [], {}
    for name in order:
        layouts = seen[name]
        if len(layouts) == 1:
            (axes,) = layouts
            rules.append((name, _rule_value(axes, user.get(name), sizes)))
        else:
            bad[name] = "; ".join(
                f"over {axes or 'nothing'} in {wheres[0]}"
                + (f" (and {len(wheres) - 1} more)" if len(wheres) > 1 else "")
                for axes, wheres in layouts.items()
            )
    return tuple(rules), bad


def partition_specs(plan: Plan) -> Any:
    """Pytree like the arguments of `PartitionSpec`s (None at static leaves)."""
    it = iter(plan.invar_specs)
    leaves = [
        plan.partition_spec(next(it)) if arr else None for arr in plan.arg_layout.arg_is_array
    ]
    return tree_util.tree_unflatten(plan.arg_layout.arg_treedef, leaves)


def export_specs(plan: Plan) -> ExportedSpecs:
    """The plan's argument and result layouts as `PartitionSpec` pytrees, a listing, and
    logical-axis rules (module docstring)."""
    out_specs = tree_util.tree_unflatten(
        plan.arg_layout.out_tree, [plan.partition_spec(s) for s in plan.outvar_specs]
    )
    listing = [
        (p, plan.partition_spec(s))
        for p, s in zip(plan.program.invar_paths, plan.invar_specs, strict=True)
    ]
    listing += [
        (f"result{p}", plan.partition_spec(s))
        for p, s in zip(plan.program.outvar_paths, plan.outvar_specs, strict=True)
    ]
    rules, bad = logical_rules(plan)
    program = plan.program
    boxed = any(t in program.logical_names for t in program.invars)
    activations = any(c.logical for c in program.user_constraints)
    source = (
        "the model's logical names"
        + (" (parameters" if boxed else " (activations")
        + (" and activations)" if boxed and activations else ")")
        if boxed or activations
        else "no logical names in the model: '<last path key>.<dim>' of each argument leaf"
    )
    return ExportedSpecs(
        partition_specs(plan), out_specs, tuple(listing), argument_names(plan), rules, bad, source
    )
