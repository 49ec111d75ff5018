"""A shard_map's per-device stacks: residuals each device keeps as its own block.

Differentiating a shard_map splits it into a forward and a backward shard_map, and the
residuals between them come out as *per-device stacks*: each device's block, concatenated on
dim 0 over every axis the block varies over (``P(("data", "model"))``). Only shard_maps read
such a stack, in that same spec, so it never moves. `per_device_stacks` finds them; the trace
records each as one device's block (`Tensor.hand_split`). Pure: params are read by attribute.
"""

from __future__ import annotations

import math
from typing import Any

from .graph import SCAN_SLICE, SCAN_STACK, Equation, Program, Tensor
from .jaxprs import spec_axes


def spec_groups(specs: Any) -> list[tuple[str, ...]]:
    """The axis groups ``specs`` put on tensor dims, in order of appearance, once each."""
    groups: dict[tuple[str, ...], None] = {}
    for spec in specs:
        for entry in spec:
            if spec_axes(entry):
                groups.setdefault(spec_axes(entry))
    return list(groups)


def _tangled(spec: Any, groups: list[tuple[str, ...]]) -> bool:
    """Whether ``spec`` puts several mesh axes on one dim that another of ``groups`` uses in
    another combination (what a differentiated shard_map's residuals do)."""
    mine = [g for g in map(spec_axes, spec) if len(g) > 1]
    return any(g != h and set(g) & set(h) for g in mine for h in groups)


def per_device_stacks(program: Program) -> dict[int, Tensor]:
    """The per-device stacks of a program (module docstring), each as the tensor to plan in its
    place: one device's block, ``hand_split`` its spec's axes.

    A stack is a shard_map result whose spec is tangled (`_tangled`) with the specs of the
    shard_map making it or of one reading it, and that only shard_maps over the same mesh read,
    each in that spec, the step does not return, and no other equation reads, but a loop's
    stacking of it (a scan's ys; JAX saves a scanned layer's residuals so) whose slices are
    read so in turn. JAX hoists residuals that depend on no operand out of a loop into a
    shard_map of their own, with nothing to tangle with: a reader's specs count too.
    """
    if not any(eqn.primitive == "shard_map" for eqn in program.eqns):
        return {}
    readers: dict[int, list[tuple[Equation, int]]] = {}
    for eqn in program.eqns:
        for k, t in enumerate(eqn.inputs):
            if t is not None:
                readers.setdefault(t, []).append((eqn, k))
    results = set(program.outvars)

    def chain(t: int, spec: Any, mesh: Any, depth: int, found: dict, ends: list) -> bool:
        """Whether ``t`` (``depth`` loop dims ahead of ``spec``'s) is read only as a stack
        is; ``found`` gathers it and what it flows into (tensor -> depth), ``ends`` the params
        of the shard_maps reading them."""
        if t in results:
            return False
        found[t] = depth
        for r, k in readers.get(t, []):
            if r.primitive == "shard_map" and depth == 0:
                if r.params["mesh"] != mesh or r.params["in_specs"][k] != spec:
                    return False
                ends.append(r.params)
            elif r.primitive == SCAN_STACK:
                if not chain(r.outputs[0], spec, mesh, depth + 1, found, ends):
                    return False
            elif r.primitive == SCAN_SLICE and depth > 0:
                if not chain(r.outputs[0], spec, mesh, depth - 1, found, ends):
                    return False
            else:
                return False
        return True

    stacks: dict[int, Tensor] = {}
    for eqn in program.eqns:
        if eqn.primitive != "shard_map":
            continue
        p = eqn.params
        sizes = mesh_axis_sizes(p)
        for t, spec in zip(eqn.outputs, p["out_specs"], strict=True):
            found: dict[int, int] = {}
            ends: list[Any] = [p]
            if not chain(t, spec, p["mesh"], 0, found, ends):
                continue
            if not any(
                _tangled(spec, spec_groups([*q["in_specs"], *q["out_specs"]])) for q in ends
            ):
                continue
            axes = tuple(a for entry in spec for a in spec_axes(entry))
            for u, depth in found.items():
                tensor = program.tensors[u]
                entries = [*(None,) * depth, *spec]
                entries += [None] * (len(tensor.shape) - len(entries))
                block = tuple(
                    size // math.prod(sizes[a] for a in spec_axes(entry))
                    for size, entry in zip(tensor.shape, entries, strict=True)
                )
                stacks[u] = Tensor(block, tensor.dtype, tensor.itemsize, axes)
    return stacks


def mesh_axis_sizes(params: dict) -> dict[str, int]:
    """A shard_map's mesh as {axis name: size}."""
    return dict(zip(params["mesh"].axis_names, params["mesh"].axis_sizes, strict=True))
