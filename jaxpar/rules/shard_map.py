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

The collectives its body calls (a hand-written tensor-parallel matmul's `psum`, a ring's
`ppermute`) are fixed too: `body_communication` lists them, each with its kind, axes, bytes
and runs (`OpSpace.communication`), and `cost.node_collectives` prices them as the node's own
collectives, predicted like the plan's others.

A shard_map that leaves mesh axes automatic inside its body (``axis_names``) is partitioned
over them by XLA, as any code is. Its space then has, after the manual groups' dims, the dims
those axes may split (`OpSpace.automatic`, found by `body_dims`: the dims a split passes
through the body untouched), and its configurations choose for each automatic axis one of them
or none (`configs.automatic_configs`). A split divides the FLOPs of the equations carrying it
(`body_flop_parts`) and the bytes of the collectives whose results carry it, and a split dim
the body contracts or reduces ends in an all-reduce of that reduction's result over the
splitting axes (`BodyCollective.split`). When no dim passes, the shard_map runs replicated over
its automatic axes, with a warning naming them (`automatic_axes`).

Planned this way only when the space can say it: each mesh axis in one group, each group on
some result or combined over by the body's collectives, and every collective in the body one the
kinds cover, outside a cond or a while loop. Otherwise the equation runs replicated, with a
warning that says why (`REPLICATED_WHEN` in `rules`).

Differentiating a shard_map (MaxText's pattern: a kernel inside, ``jax.grad`` outside) splits it
into a forward and a backward shard_map, and the residuals between them come out as
*per-device stacks*: each device's block, concatenated on dim 0 over every axis the block
varies over (``P(("data", "model"))``), beside operands split per axis. No layout of the
iteration space can say that, and none needs to: only shard_maps read such a stack, in that
same spec, so it never moves. `per_device_stacks` finds them; the trace records each as one
device's block (`Tensor.hand_split`), which the rule leaves out of the iteration space and
the plan holds whole on every device, each device its own, as the program does.

Pure (no jax import): params are read by attribute.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..hardware.collectives import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, PERMUTE, REDUCE_SCATTER
from ..program.graph import Equation, Program
from ..program.jaxprs import inner_jaxpr, spec_axes, sub_jaxprs
from ..program.shard_map_stacks import mesh_axis_sizes, spec_groups
from .opspace import BodyCollective, OpSpace, register_rule, shape_of
from .shard_map_body import BodyDims, body_dims

# Primitives that communicate inside a shard_map body
BODY_COLLECTIVES = frozenset(
    ("psum", "psum_invariant", "pmax", "pmin", "all_gather", "all_gather_invariant",
     "all_to_all", "ppermute", "psum_scatter", "reduce_scatter", "pbroadcast", "ragged_all_to_all")
)  # fmt: skip
# Those the plan prices, by the kind of collective the compiled program runs for each
BODY_KINDS = {
    "psum": ALL_REDUCE, "psum_invariant": ALL_REDUCE, "pmax": ALL_REDUCE, "pmin": ALL_REDUCE,
    "all_gather": ALL_GATHER, "all_gather_invariant": ALL_GATHER,
    "reduce_scatter": REDUCE_SCATTER, "psum_scatter": REDUCE_SCATTER,
    "all_to_all": ALL_TO_ALL, "ppermute": PERMUTE,
}  # fmt: skip


class Unpriced(Exception):
    """A collective in a shard_map body that `body_communication` cannot price."""


def _collective_axes(eqn: Any) -> tuple[str, ...]:
    names = eqn.params.get("axes", eqn.params.get("axis_name"))
    names = names if isinstance(names, tuple | list) else (names,)
    if not all(isinstance(a, str) for a in names) or eqn.params.get("axis_index_groups"):
        raise Unpriced(f"{eqn.primitive.name} over positional axes or axis index groups")
    return tuple(names)


def body_communication(
    jaxpr: Any, sizes: dict[str, int], automatic: BodyDims | None = None, first: int = 0
) -> list[BodyCollective]:
    """The collectives a shard_map body runs (`opspace.BodyCollective`): a scan's body runs its
    length times, a call's once. A collective-permute's bytes count only the devices that send
    (what `verify` reads of the compiled one). Each feeds the body's results computed from it
    (of a nested call or loop: from that equation's results). `Unpriced` for a collective the
    kinds do not cover (`BODY_KINDS`: a collective broadcast, a ragged all-to-all), or one
    inside a cond or a while loop.

    With the body's ``automatic`` dims (`body_dims`; numbered from ``first`` in the node's
    space): each collective's `BodyCollective.dims`, and one all-reduce per reduction an
    automatic axis may split (`BodyCollective.split`)."""
    made = _collectives(jaxpr, sizes, 1)
    found = [(c, at) for c, at, _ in made]
    if automatic is not None:

        def dims(value: Any) -> tuple[int, ...]:
            return tuple(first + d for d in automatic.dims_of(value))

        found = [(c._replace(dims=dims(v)), at) for c, at, v in made]
        found += [
            (BodyCollective(ALL_REDUCE, (), _nbytes([r.value]), 1, str(r.value.aval.dtype), r.op,
                            dims=dims(r.value), split=first + r.dim), r.at)
            for r in automatic.reductions
        ]  # fmt: skip
    tainted: dict[Any, int] = {}  # a body value -> bitmask of the collectives it comes from
    for i, eqn in enumerate(jaxpr.eqns):
        mask = 0
        for v in eqn.invars:
            if not hasattr(v, "val"):  # a Literal has a value, a variable none
                mask |= tainted.get(v, 0)
        for k, (_, at) in enumerate(found):
            if at == i:
                mask |= 1 << k
        if mask:
            tainted.update(dict.fromkeys(eqn.outvars, mask))
    masks = [0 if hasattr(v, "val") else tainted.get(v, 0) for v in jaxpr.outvars]
    return [
        c._replace(feeds=tuple(r for r, m in enumerate(masks) if m >> k & 1))
        for k, (c, _) in enumerate(found)
    ]


def _nbytes(values: Any) -> float:
    return float(
        sum(math.prod(v.aval.shape) * getattr(v.aval.dtype, "itemsize", 0) for v in values)
    )


def _collectives(
    jaxpr: Any, sizes: dict[str, int], runs: int
) -> list[tuple[BodyCollective, int, Any]]:
    """`body_communication`'s collectives, each with the index of the equation of ``jaxpr``
    running it and the body value it makes (its first result)."""
    out: list[tuple[BodyCollective, int, Any]] = []
    for i, eqn in enumerate(jaxpr.eqns):
        name = eqn.primitive.name
        subs = sub_jaxprs(eqn)
        if subs:
            inner = [(c, v) for sub in subs for c, _, v in _collectives(sub, sizes, 1)]
            if inner and ("branches" in eqn.params or name == "while"):
                kind = inner[0][0].kind
                raise Unpriced(f"{kind} inside a {'cond' if name == 'cond' else name}")
            times = eqn.params.get("length", 1) if name == "scan" else 1
            out += [(c._replace(runs=c.runs * times * runs), i, v) for c, v in inner]
            continue
        if name not in BODY_COLLECTIVES:
            continue
        if name not in BODY_KINDS:
            raise Unpriced(name)
        kind, axes = BODY_KINDS[name], _collective_axes(eqn)
        nbytes = _nbytes(eqn.outvars)
        if kind == PERMUTE:
            n = math.prod(sizes[a] for a in axes)
            nbytes *= sum(1 for src, dst in eqn.params["perm"] if src != dst) / n
        op = {"pmax": "max", "pmin": "min"}.get(name, "sum") if kind == ALL_REDUCE else ""
        dtype = str(eqn.outvars[0].aval.dtype)
        out.append((BodyCollective(kind, axes, nbytes, runs, dtype, op), i, eqn.outvars[0]))
    return out


def body_flops(jaxpr: Any) -> float:
    """FLOPs of one device's run of a shard_map body: 2 · |result| · |contracted| per matrix
    product, |results| per other equation; a scan's body times its length, a cond's dearest
    branch, a nested call's body."""
    return sum(f for _, f in _leaf_flops(jaxpr, 1.0))


def body_flop_parts(
    jaxpr: Any, dims_of: Callable[[Any], tuple[int, ...]]
) -> tuple[tuple[tuple[int, ...], float], ...]:
    """`body_flops` in parts by the automatic dims that split them (`body_dims`): per set of
    dims, the FLOPs of the equations whose operands and results carry exactly those. A split
    divides only the work of the equations it splits: of a matrix product over a split
    contracted dim, not of what reads its all-reduced result."""
    parts: dict[tuple[int, ...], float] = {}
    for eqn, flops in _leaf_flops(jaxpr, 1.0):
        values = [v for v in (*eqn.invars, *eqn.outvars) if not hasattr(v, "val")]
        key = tuple(sorted({d for v in values for d in dims_of(v)}))
        parts[key] = parts.get(key, 0.0) + flops
    return tuple(sorted(parts.items()))


def _leaf_flops(jaxpr: Any, runs: float) -> list[tuple[Any, float]]:
    """(equation, FLOPs per run of the body) of every equation with no body of its own, as
    `body_flops` counts them."""
    out: list[tuple[Any, float]] = []
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        subs = sub_jaxprs(eqn)
        if subs:
            times = runs * (eqn.params.get("length", 1) if name == "scan" else 1)
            inner = [_leaf_flops(sub, times) for sub in subs]
            if "branches" in eqn.params:
                out += max(inner, key=lambda leaves: sum(f for _, f in leaves))
            else:
                out += [leaf for leaves in inner for leaf in leaves]
            continue
        size = sum(math.prod(getattr(v.aval, "shape", ())) for v in eqn.outvars)
        if name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            out.append((eqn, runs * 2.0 * size * math.prod(lhs[d] for d in contract)))
        else:
            out.append((eqn, runs * float(size)))
    return out


def _groups(
    eqn: Equation, program: Program
) -> tuple[dict[tuple[str, ...], int], list[tuple[Any, bool]]]:
    """The axis groups of a shard_map's specs, numbered in order of appearance, and every
    (spec, is_result) pair; the specs of per-device stacks are left out (None)."""
    p = eqn.params

    def spec(t: int | None, s: Any) -> Any:
        return None if t is not None and program.tensors[t].hand_split else s

    specs = [(spec(t, s), False) for t, s in zip(eqn.inputs, p["in_specs"], strict=True)]
    specs += [(spec(t, s), True) for t, s in zip(eqn.outputs, p["out_specs"], strict=True)]
    groups = spec_groups(s for s, _ in specs if s is not None)
    return {g: i for i, g in enumerate(groups)}, specs


def unplanned(eqn: Equation, program: Program) -> str | None:
    """Why the rule cannot describe this shard_map (it then runs replicated), or None."""
    why = _unplanned(eqn, program)
    return None if why is None else f"{why} (its layouts and its collectives go unpriced)"


def automatic_axes(eqn: Equation, program: Program) -> str | None:
    """Why a shard_map that leaves mesh axes automatic inside its body (``axis_names``) runs
    replicated over those axes, or None when every axis is manual or the automatic ones may
    split some dim (`automatic_dims`). Its manual axes are planned as the rule says; over the
    automatic ones the plan then holds its operands and results whole and prices its body on
    every device, as XLA runs a body whose operands come in whole."""
    auto = _automatic_names(eqn.params)
    if not auto or automatic_dims(eqn, program) is not None:
        return None
    return (
        f"leaves mesh axes {auto} automatic inside its body, and no dim of its operands or "
        "results passes through the body untouched"
    )


def _automatic_names(params: dict) -> list[str]:
    names = tuple(params["mesh"].axis_names)
    manual = params.get("newly_manual_axes", params.get("manual_axes", frozenset(names)))
    return sorted(set(names) - set(manual))


def automatic_dims(eqn: Equation, program: Program) -> BodyDims | None:
    """The dims of a shard_map's body its automatic axes may split (`body_dims`), or None when
    it has no automatic axis or they may split none. Operands that are literals or per-device
    stacks stay whole. Kept in ``program.memo``: the rule and its warning both ask."""
    key = ("shard_map automatic dims", eqn.index)
    if key not in program.memo:
        p, found = eqn.params, None
        if _automatic_names(p):
            tensors = program.tensors
            found = body_dims(
                inner_jaxpr(p["jaxpr"]), p["in_specs"], p["out_specs"],
                [t is None or bool(tensors[t].hand_split) for t in eqn.inputs],
                [bool(tensors[t].hand_split) for t in eqn.outputs],
            )  # fmt: skip
            found = found if found.sizes else None
        program.memo[key] = found
    return program.memo[key]


def _unplanned(eqn: Equation, program: Program) -> str | None:
    p = eqn.params
    try:
        talk = body_communication(inner_jaxpr(p["jaxpr"]), mesh_axis_sizes(p))
    except Unpriced as err:
        return f"communicates inside its body in a way the plan does not price ({err})"
    groups, specs = _groups(eqn, program)
    named = [a for axes in groups for a in axes]
    if len(named) != len(set(named)):
        return "puts one mesh axis on dims of its tensors in different combinations"
    on_results = {
        spec_axes(e) for spec, result in specs if result and spec is not None for e in spec
    }
    talked = {a for c in talk for a in c.axes}  # its collectives combine over them
    if any(axes not in on_results and not set(axes) <= talked for axes in groups):
        return "splits an operand over mesh axes that split none of its results"
    return None


@register_rule("shard_map")
def shard_map_rule(eqn: Equation, program: Program) -> OpSpace:
    """A shard_map's fixed layouts as an iteration space (see the module docstring);
    ``flops = body_flops × the devices its specs split the work over``; its body's collectives
    (`body_communication`) as `OpSpace.communication`. Automatic axes add the dims they may
    split (`automatic_dims`) after the manual groups' (`OpSpace.automatic`)."""
    p = eqn.params
    groups, _ = _groups(eqn, program)
    order = list(groups)
    mesh_sizes = mesh_axis_sizes(p)
    sizes = [0] * len(order)
    auto = automatic_dims(eqn, program)
    first = len(order)

    def dim_map(
        tid: int | None, spec: Any, free: tuple[int | None, ...]
    ) -> tuple[int | None, ...] | None:
        if tid is None:
            return None
        shape = shape_of(program, tid)
        if program.tensors[tid].hand_split:  # one device's block, on every device
            return (None,) * len(shape)
        entries = [*spec, *(None,) * (len(shape) - len(spec))]
        out = []
        for d, (size, entry) in enumerate(zip(shape, entries, strict=True)):
            axes = spec_axes(entry)
            if axes:
                sizes[groups[axes]] = sizes[groups[axes]] or size
                out.append(groups[axes])
            else:
                out.append(None if not free or free[d] is None else first + free[d])
        return tuple(out)

    ins = auto.invars if auto else ((),) * len(eqn.inputs)
    outs = auto.outvars if auto else ((),) * len(eqn.outputs)
    in_maps = tuple(
        dim_map(t, s, f) for t, s, f in zip(eqn.inputs, p["in_specs"], ins, strict=True)
    )
    out_maps = tuple(
        dim_map(t, s, f) for t, s, f in zip(eqn.outputs, p["out_specs"], outs, strict=True)
    )
    devices = math.prod(mesh_sizes[a] for axes in order for a in axes)
    free = auto.sizes if auto else ()
    body = inner_jaxpr(p["jaxpr"])
    return OpSpace(
        sizes=(*sizes, *free),
        splittable=(True,) * (len(order) + len(free)),
        names=(*("+".join(axes) for axes in order), *(f"auto{k}" for k in range(len(free)))),
        in_maps=in_maps,
        out_maps=out_maps,  # type: ignore[arg-type]  # results are never literals
        flops=body_flops(body) * devices,
        manual=tuple((a, groups[axes]) for axes in order for a in axes),
        communication=tuple(body_communication(body, mesh_sizes, auto, first)),
        flop_parts=()
        if auto is None
        else tuple(
            (tuple(first + d for d in dims), flops * devices)
            for dims, flops in body_flop_parts(body, auto.dims_of)
        ),
        automatic=tuple(range(first, first + len(free))),
        automatic_axes=tuple(_automatic_names(p)) if free else (),
    )
