"""Export a plan for running without jaxpar: plain `PartitionSpec` pytrees and a listing.

`export_specs`: the `PartitionSpec` pytrees of the arguments (None at static leaves) and results,
usable as ``jax.jit(fn, in_shardings=..., out_shardings=...)`` with `NamedSharding`s over the
same mesh; a path -> spec listing; and, when expressible, MaxText-style logical-axis rules,
naming each dim ``<last path key>.<dim>`` (``kernel.1``): None with the reason when two leaves of
one logical name have different layouts.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any

from jax import tree_util
from jax.sharding import PartitionSpec

if TYPE_CHECKING:
    from .plan import Plan


@dataclasses.dataclass(frozen=True)
class ExportedSpecs:
    """A plan's layouts as plain `PartitionSpec`s (see `export_specs`)."""

    in_specs: Any  # pytree like the arguments; None at static leaves
    out_specs: Any  # pytree like the results
    listing: tuple[tuple[str, PartitionSpec], ...]  # (path, spec): arguments, then results
    logical_axes: dict[str, tuple[str, ...]]  # argument path -> logical name per dim
    logical_rules: tuple[tuple[str, Any], ...] | None  # (logical name, mesh axes) or None
    logical_reason: str  # why the rules are None (or how the names were made)

    def text(self) -> str:
        lines = [f"{path}: {spec}" for path, spec in self.listing]
        if self.logical_rules is None:
            lines.append(f"logical-axis rules: none ({self.logical_reason})")
        else:
            lines += ["logical-axis rules:"] + [f"  {n}: {a}" for n, a in self.logical_rules]
        return "\n".join(lines)


def _last_key(path: str) -> str:
    m = re.search(r"(?:\['([^']*)'\]|\.(\w+)|\[(\d+)\])$", path)
    return next((g for g in m.groups() if g is not None), path) if m else path


def logical_rules(plan: Plan) -> tuple[dict, tuple | None, str]:
    """(argument path -> logical dim names, MaxText-style rules or None, reason)."""
    program = plan.program
    logical = {
        path: tuple(f"{_last_key(path)}.{d}" for d in range(len(program.tensors[t].shape)))
        for path, t in zip(program.invar_paths, program.invars, strict=True)
    }
    axes_of: dict[str, tuple[tuple[str, ...], str]] = {}
    for (path, names), spec in zip(logical.items(), plan.invar_specs, strict=True):
        for d, name in enumerate(names):
            mesh_axes = tuple(plan.mesh_axes.names[a] for a in spec[d]) if d < len(spec) else ()
            seen = axes_of.setdefault(name, (mesh_axes, path))
            if seen[0] != mesh_axes:
                reason = (
                    f"not expressible as logical-axis rules: {name!r} (dim {d} of leaves named "
                    f"{_last_key(path)!r}) is split over {seen[0] or 'nothing'} in {seen[1]} "
                    f"but over {mesh_axes or 'nothing'} in {path}"
                )
                return logical, None, reason
    rules = tuple(
        (name, None if not ax else ax[0] if len(ax) == 1 else ax)
        for name, (ax, _) in axes_of.items()
    )
    return logical, rules, "logical names are '<last path key>.<dim>' of each argument leaf"


def partition_specs(plan: Plan) -> Any:
    """Pytree like the arguments of `PartitionSpec`s (None at static leaves)."""
    it = iter(plan.invar_specs)
    leaves = [
        plan.partition_spec(next(it)) if arr else None for arr in plan.arg_layout.arg_is_array
    ]
    return tree_util.tree_unflatten(plan.arg_layout.arg_treedef, leaves)


def export_specs(plan: Plan) -> ExportedSpecs:
    """The plan's argument and result layouts as `PartitionSpec` pytrees, a listing, and
    logical-axis rules where expressible (module docstring, "Export")."""
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
    logical, rules, reason = logical_rules(plan)
    return ExportedSpecs(partition_specs(plan), out_specs, tuple(listing), logical, rules, reason)
