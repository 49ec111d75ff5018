"""Layouts the step's signature imposes: user pins (``in_specs``) and state feedback.

- A train step returns the new state where it took the old one (same pytree path, shape, dtype):
  its layout must come back as the argument's, or the next call reshards it (`feedback_pairs`).
- ``in_specs`` (a pytree prefix of PartitionSpecs) force argument layouts (`pinned_configs`),
  with an error that says what is wrong when a pin is impossible.
"""

from __future__ import annotations

from typing import Any

from jax import tree_util
from jax.sharding import PartitionSpec

from ..nodes.configs import Config
from ..nodes.planning_nodes import NodeGraph
from ..program.graph import Program, shape_str
from ..trace.tracing import is_array_leaf


def feedback_pairs(program: Program) -> list[tuple[int, int]]:
    """(result tensor, argument tensor) pairs where a result is the next step's argument."""
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
    if isinstance(in_specs, str):
        raise TypeError(
            f"in_specs={in_specs!r} is a string; give PartitionSpecs, e.g. "
            f"in_specs=(None, PartitionSpec({in_specs!r})) to split argument 1's dim 0"
        )
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


def _pin_config(
    pspec: PartitionSpec, shape: tuple[int, ...], path: str, names, sizes, trivial=()
) -> tuple[int, ...]:
    """The input node configuration of one pin (mesh axis -> tensor dim) over the planning
    mesh's axes ``names``; an axis of ``trivial`` (the user's size-1 axes, not planned on)
    splits nothing, so naming it pins nothing."""
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
            if ax in trivial:
                continue
            if ax not in names:
                raise ValueError(
                    f"in_specs for argument {path} names mesh axis {ax!r}, which does not "
                    f"exist; the mesh axes are {(*names, *trivial)}"
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
    return tuple(cfg)


def pinned_configs(
    ng: NodeGraph, pins: dict[int, PartitionSpec], names, sizes, trivial=()
) -> dict[int, Config]:
    """Input node -> forced configuration from user PartitionSpecs; clear errors when impossible."""
    out: dict[int, Config] = {}
    for tid, pspec in pins.items():
        shape = ng.program.tensors[tid].shape
        path = ng.program.invar_paths[ng.program.invars.index(tid)]
        out[ng.node_of_tensor[tid]] = _pin_config(pspec, shape, path, names, sizes, trivial)
    return out
