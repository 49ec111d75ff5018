"""The rule of ``shard_map``: code the user partitioned by hand keeps the layouts it names.

A ``shard_map`` (a per-shard attention kernel, a hand-written collective matmul) fixes the
layout of every operand (``in_specs``) and result (``out_specs``); its body runs on each
device's shards. The planner cannot choose another configuration for it, but it must read its
operands in those layouts and know its results come out in them: run replicated, the operands
were gathered onto every device and the results, sharded by ``out_specs``, gathered again, and
neither was predicted.

The rule describes the equation as an iteration space with one dim per group of mesh axes its
specs put on a tensor dim, each tensor dim mapped to its group's dim, and one configuration
(`OpSpace.manual`: mesh axis name -> iteration dim; `configs.node_configs` gives exactly it).
The work is the body's per-device FLOPs (`body_flops`) on every device.

Planned this way only when the space can say it: every mesh axis of the mesh manual (no auto
axes inside), each mesh axis in one group, each group on some result, and no collective in the
body (its all-reduces are not in the space). Otherwise the equation runs replicated, with a
warning that says why (`REPLICATED_WHEN` in `rules`).

Pure (no jax import): params are read by attribute.
"""

from __future__ import annotations

import math
from typing import Any

from .graph import Equation, Program
from .opspace import OpSpace, register_rule, shape_of

# Primitives that communicate inside a shard_map body
BODY_COLLECTIVES = frozenset(
    ("psum", "psum_invariant", "pmax", "pmin", "pmean", "all_gather", "all_gather_invariant",
     "all_to_all", "ppermute", "psum_scatter", "reduce_scatter", "pbroadcast", "ragged_all_to_all")
)  # fmt: skip
_SUB_JAXPRS = ("jaxpr", "call_jaxpr", "fun_jaxpr")


def _axes(entry: Any) -> tuple[str, ...]:
    """The mesh axes one entry of a PartitionSpec names (None: none)."""
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def _inner(jaxpr: Any) -> Any:
    return getattr(jaxpr, "jaxpr", jaxpr)  # a ClosedJaxpr's jaxpr, or the jaxpr itself


def _sub_jaxprs(eqn: Any) -> list[Any]:
    subs = [_inner(eqn.params[k]) for k in _SUB_JAXPRS if k in eqn.params]
    subs += [_inner(b) for b in eqn.params.get("branches", ())]
    for k in ("body_jaxpr", "cond_jaxpr"):
        if k in eqn.params:
            subs.append(_inner(eqn.params[k]))
    return subs


def body_collectives(jaxpr: Any) -> set[str]:
    """The collective primitives a shard_map body calls, nested calls included."""
    found: set[str] = set()
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in BODY_COLLECTIVES:
            found.add(eqn.primitive.name)
        for sub in _sub_jaxprs(eqn):
            found |= body_collectives(sub)
    return found


def body_flops(jaxpr: Any) -> float:
    """FLOPs of one device's run of a shard_map body: 2 · |result| · |contracted| per matrix
    product, |results| per other equation; a scan's body times its length, a cond's dearest
    branch, a nested call's body."""
    total = 0.0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        subs = _sub_jaxprs(eqn)
        if subs:
            inner = [body_flops(s) for s in subs]
            runs = eqn.params.get("length", 1) if name == "scan" else 1
            total += runs * (max(inner) if "branches" in eqn.params else sum(inner))
            continue
        out = sum(math.prod(getattr(v.aval, "shape", ())) for v in eqn.outvars)
        if name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            total += 2.0 * out * math.prod(lhs[d] for d in contract)
        else:
            total += out
    return total


def _groups(eqn: Equation) -> tuple[dict[tuple[str, ...], int], list[tuple[Any, bool]]]:
    """The axis groups of a shard_map's specs, numbered in order of appearance, and every
    (spec, is_result) pair."""
    p = eqn.params
    specs = [(s, False) for s in p["in_specs"]] + [(s, True) for s in p["out_specs"]]
    groups: dict[tuple[str, ...], int] = {}
    for spec, _ in specs:
        for entry in spec:
            axes = _axes(entry)
            if axes:
                groups.setdefault(axes, len(groups))
    return groups, specs


def unplanned(eqn: Equation, program: Program) -> str | None:
    """Why the rule cannot describe this shard_map (it then runs replicated), or None."""
    why = _unplanned(eqn)
    return None if why is None else f"{why} (its layouts and its collectives go unpriced)"


def _unplanned(eqn: Equation) -> str | None:
    p = eqn.params
    names = tuple(p["mesh"].axis_names)
    manual = p.get("newly_manual_axes", p.get("manual_axes", frozenset(names)))
    if set(manual) != set(names):
        return f"leaves mesh axes {sorted(set(names) - set(manual))} automatic inside its body"
    collectives = body_collectives(_inner(p["jaxpr"]))
    if collectives:
        return f"communicates inside its body ({', '.join(sorted(collectives))})"
    groups, specs = _groups(eqn)
    named = [a for axes in groups for a in axes]
    if len(named) != len(set(named)):
        return "puts one mesh axis on dims of its tensors in different combinations"
    on_results = {_axes(e) for spec, result in specs if result for e in spec}
    if any(axes not in on_results for axes in groups):
        return "splits an operand over mesh axes that split none of its results"
    return None


@register_rule("shard_map")
def shard_map_rule(eqn: Equation, program: Program) -> OpSpace:
    """A shard_map's fixed layouts as an iteration space with one configuration (see the module
    docstring); ``flops = body_flops × the devices its specs split the work over``."""
    p = eqn.params
    groups, _ = _groups(eqn)
    order = list(groups)
    mesh_sizes = dict(zip(p["mesh"].axis_names, p["mesh"].axis_sizes, strict=True))
    sizes = [0] * len(order)

    def dim_map(tid: int | None, spec: Any) -> tuple[int | None, ...] | None:
        if tid is None:
            return None
        shape = shape_of(program, tid)
        entries = [*spec, *(None,) * (len(shape) - len(spec))]
        out = []
        for size, entry in zip(shape, entries, strict=True):
            axes = _axes(entry)
            if axes:
                sizes[groups[axes]] = sizes[groups[axes]] or size
            out.append(groups[axes] if axes else None)
        return tuple(out)

    in_maps = tuple(dim_map(t, s) for t, s in zip(eqn.inputs, p["in_specs"], strict=True))
    out_maps = tuple(dim_map(t, s) for t, s in zip(eqn.outputs, p["out_specs"], strict=True))
    devices = math.prod(mesh_sizes[a] for axes in order for a in axes)
    return OpSpace(
        sizes=tuple(sizes),
        splittable=(True,) * len(order),
        names=tuple("+".join(axes) for axes in order),
        in_maps=in_maps,
        out_maps=out_maps,  # type: ignore[arg-type]  # results are never literals
        flops=body_flops(_inner(p["jaxpr"])) * devices,
        manual=tuple((a, groups[axes]) for axes in order for a in axes),
    )
