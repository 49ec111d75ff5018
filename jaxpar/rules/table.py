"""Sharding rules keyed by primitive: each equation's iteration space (see `opspace`).

Elementwise ops, shapes and layouts, reductions, slicing, random bits and windows are here;
contractions (dot_general, grouped matmuls, convolutions) in `rules_contractions`; FFTs and
matrix routines over batch dims in `rules_linalg`; gather and the scatter family in
`rules_indexing`; a planned scan's carry, slice and stack in
`rules_loops`. Unknown primitives, a ``while`` of unknown trip count and custom calls run replicated
(`space_of`), with one warning naming the primitive and the layer.

Pure (no jax import): params are read by attribute, never constructed.
"""

from __future__ import annotations

import dataclasses
import logging
import math

from ..program.graph import Equation, Program, layer_of
from ..program.primitives import ELEMENTWISE
from . import (
    indexing,  # noqa: F401 - registers gather and the scatter family
    linalg,  # noqa: F401 - registers FFTs and matrix routines
    loops,  # noqa: F401 - registers the planned scan's carry, slice and stack
    shard_map,  # registers shard_map
)
from .contractions import CONTRACTIONS
from .opspace import (
    RULES,
    DimMap,
    OpSpace,
    dim_names,
    out_shape,
    register_rule,
    replicated_space,
    shape_of,
)

log = logging.getLogger("jaxpar")

__all__ = [
    "CONTRACTIONS", "RULES", "DimMap", "OpSpace", "register_rule", "replicated_space", "space_of",
]  # fmt: skip


def space_of(eqn: Equation, program: Program, warned: set[str] | None = None) -> OpSpace:
    """The equation's iteration space. Unknown primitives, and the documented replicated ones
    (`REPLICATED_WARNED`: loops, custom calls, random bits XLA cannot partition), run replicated
    with one warning per primitive that names it, the layer and why (``warned``: the primitives
    a planning run has already warned about); one replicated over some axes only
    (`PARTLY_REPLICATED`) warns once per reason."""
    rule = RULES.get(eqn.primitive)
    why = _why_replicated(eqn, program, rule)
    warned = set() if warned is None else warned
    if why is not None:
        _warn_once(eqn, why, "runs replicated: its operands are gathered and its results "
                   "replicated on every device", eqn.primitive, warned)  # fmt: skip
        return replicated_space(eqn, program)
    partly = PARTLY_REPLICATED.get(eqn.primitive)
    if partly is not None and (reason := partly(eqn, program)) is not None:
        _warn_once(eqn, reason, "is planned over its other axes and runs replicated over those",
                   f"{eqn.primitive}: {reason}", warned)  # fmt: skip
    if rule is None or any(program.tensors[t].opaque for t in eqn.outputs):
        return replicated_space(eqn, program)
    return rule(eqn, program)


def _warn_once(eqn: Equation, why: str, outcome: str, key: str, warned: set[str]) -> None:
    """Log "primitive P (in layer) <why>; it <outcome>" unless ``key`` is in ``warned``."""
    if key in warned:
        return
    warned.add(key)
    layer = layer_of(eqn.name_stack) or "the step's top level"
    log.warning("jaxpar: primitive %r (in %s) %s; it %s", eqn.primitive, layer, why, outcome)


def _why_replicated(eqn: Equation, program: Program, rule) -> str | None:
    """Why ``eqn`` runs replicated with a warning, or None (it has a rule, or is bookkeeping)."""
    if rule is None:
        return "has no sharding rule"
    when = REPLICATED_WHEN.get(eqn.primitive)
    if when is not None:
        return when(eqn, program)
    return REPLICATED_WARNED.get(eqn.primitive)


def _identity_maps(eqn: Equation, program: Program, out_shape: tuple[int, ...]) -> tuple:
    """Operand maps for an elementwise op: equal-size dims follow, broadcast (size-1) dims don't."""
    maps = []
    for t in eqn.inputs:
        if t is None:
            maps.append(None)
            continue
        shp = shape_of(program, t)
        if len(shp) != len(out_shape):
            maps.append((None,) * len(shp))  # rank-0 scalar operands
        else:
            maps.append(
                tuple(
                    i if s == o else None
                    for i, (s, o) in enumerate(zip(shp, out_shape, strict=False))
                )
            )
    return tuple(maps)


@register_rule(*ELEMENTWISE)
def elementwise_rule(eqn: Equation, program: Program) -> OpSpace:
    """Results follow operands dimension by dimension (the follower rule)."""
    shape = out_shape(eqn, program)
    if any(out_shape(eqn, program, i) != shape for i in range(len(eqn.outputs))):
        return replicated_space(eqn, program)
    n = len(shape)
    return OpSpace(
        sizes=shape,
        splittable=(True,) * n,
        names=dim_names(n),
        in_maps=_identity_maps(eqn, program, shape),
        out_maps=(tuple(range(n)),) * len(eqn.outputs),
        flops=float(math.prod(shape)) * len(eqn.outputs),
    )


@register_rule("iota")
def iota_rule(eqn: Equation, program: Program) -> OpSpace:
    """No operands: any split of the result is computed locally."""
    shape = out_shape(eqn, program)
    n = len(shape)
    return OpSpace(
        shape, (True,) * n, dim_names(n), (), (tuple(range(n)),), float(math.prod(shape))
    )


@register_rule("broadcast_in_dim")
def broadcast_rule(eqn: Equation, program: Program) -> OpSpace:
    shape = out_shape(eqn, program)
    src = shape_of(program, eqn.inputs[0])
    bdims = eqn.params["broadcast_dimensions"]
    op_map = tuple(bdims[j] if src[j] == shape[bdims[j]] else None for j in range(len(src)))
    in_maps = (
        op_map,
        *tuple(None if t is None else (None,) * len(shape_of(program, t)) for t in eqn.inputs[1:]),
    )
    n = len(shape)
    return OpSpace(shape, (True,) * n, dim_names(n), in_maps, (tuple(range(n)),), 0.0)


@register_rule("bitcast_convert_type")
def bitcast_rule(eqn: Equation, program: Program) -> OpSpace:
    """Reinterpreting bits (PRNG keys, dropout masks): elementwise when the widths match; a
    narrowing cast adds a trailing dim (a widening one drops it) that stays whole."""
    src, dst = shape_of(program, eqn.inputs[0]), out_shape(eqn, program)
    common = min(len(src), len(dst))
    sizes = dst if len(dst) >= len(src) else src
    splittable = tuple(d < common for d in range(len(sizes)))
    in_map = tuple(d for d in range(len(src)))
    out_map = tuple(d for d in range(len(dst)))
    return OpSpace(
        tuple(sizes), splittable, dim_names(len(sizes)), (in_map,), (out_map,),
        float(math.prod(dst)),
    )  # fmt: skip


@register_rule("random_clone", "random_clone_p")
def clone_rule(eqn: Equation, program: Program) -> OpSpace:
    """A copy of a PRNG key (or of any array): the result follows the operand."""
    shape = out_shape(eqn, program)
    ident = tuple(range(len(shape)))
    return OpSpace(shape, (True,) * len(shape), dim_names(len(shape)), (ident,), (ident,), 0.0)


@register_rule("transpose")
def transpose_rule(eqn: Equation, program: Program) -> OpSpace:
    shape = out_shape(eqn, program)
    perm = eqn.params["permutation"]
    op_map = [0] * len(perm)
    for out_dim, in_dim in enumerate(perm):
        op_map[in_dim] = out_dim
    n = len(shape)
    return OpSpace(
        shape,
        (True,) * n,
        dim_names(n),
        (tuple(op_map),),
        (tuple(range(n)),),
        float(math.prod(shape)),
    )


def reshape_map(src: tuple[int, ...], dst: tuple[int, ...]) -> tuple[DimMap, tuple[bool, ...]]:
    """Map operand dims of a reshape onto result dims, group by group.

    Dims are grouped where running products agree. Inside a group, the operand's major dim maps to
    the result's major dim (a split of either stays a contiguous block of the other when the degree
    divides both); other dims of the group are not split on the operand side.
    """
    op_map: list[int | None] = [None] * len(src)
    splittable = [True] * len(dst)
    i = j = 0
    while i < len(src) or j < len(dst):
        gi, gj = [i], [j]
        ps = src[i] if i < len(src) else 1
        pd = dst[j] if j < len(dst) else 1
        while ps != pd:
            if ps < pd:
                i += 1
                gi.append(i)
                ps *= src[i] if i < len(src) else 1
            else:
                j += 1
                gj.append(j)
                pd *= dst[j] if j < len(dst) else 1
            if i > len(src) + 1 or j > len(dst) + 1:
                return (None,) * len(src), (False,) * len(dst)
        gi = [k for k in gi if k < len(src)]
        gj = [k for k in gj if k < len(dst)]
        # skip size-1 dims at the front of a group so the "major" dims are real ones
        mi = next((k for k in gi if src[k] > 1), None)
        mj = next((k for k in gj if dst[k] > 1), None)
        if mi is not None and mj is not None:
            op_map[mi] = mj
        i = (gi[-1] + 1) if gi else i + 1
        j = (gj[-1] + 1) if gj else j + 1
    return tuple(op_map), tuple(splittable)


@register_rule("reshape", "squeeze", "expand_dims")
def reshape_rule(eqn: Equation, program: Program) -> OpSpace:
    shape = out_shape(eqn, program)
    src = shape_of(program, eqn.inputs[0])
    op_map, splittable = reshape_map(src, shape)
    n = len(shape)
    extra = tuple(
        None if t is None else (None,) * len(shape_of(program, t)) for t in eqn.inputs[1:]
    )
    return OpSpace(shape, splittable, dim_names(n), (op_map, *extra), (tuple(range(n)),), 0.0)


def _reduction(eqn: Equation, program: Program, axes: tuple[int, ...], op: str, split_ok: bool):
    src = shape_of(program, eqn.inputs[0])
    kept = [d for d in range(len(src)) if d not in axes]
    order = kept + list(axes)  # iteration dims: kept dims first, then reduced dims
    sizes = tuple(src[d] for d in order)
    op_map = tuple(order.index(d) for d in range(len(src)))
    names = dim_names(len(kept)) + tuple(f"r{i}" for i in range(len(axes)))
    splittable = (True,) * len(kept) + (split_ok,) * len(axes)
    outs = tuple(tuple(range(len(kept))) for _ in eqn.outputs)
    in_maps = tuple(op_map if t is not None else None for t in eqn.inputs)
    return OpSpace(sizes, splittable, names, in_maps, outs, float(math.prod(src)), reduce_op=op)


@register_rule(
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or", "reduce_xor"
)  # fmt: skip
def reduce_rule(eqn: Equation, program: Program) -> OpSpace:
    """A split reduced dim leaves partial results; sums/max/min complete with an all-reduce.
    The others (products, bitwise and/or/xor) keep their reduced dims whole."""
    op = {"reduce_sum": "sum", "reduce_max": "max", "reduce_min": "min"}.get(eqn.primitive, "")
    return _reduction(eqn, program, tuple(eqn.params["axes"]), op or "sum", bool(op))


@register_rule("reduce")
def variadic_reduce_rule(eqn: Equation, program: Program) -> OpSpace:
    """``lax.reduce`` with a computation of its own (several operands reduced together, a
    value with its index): operands ``0..n-1`` of one shape, their scalar initial values
    ``n..2n-1``, one result per operand. The kept dims split; the reduced dims stay whole (no
    collective combines partial results of an arbitrary computation).
    ``flops = n · |operand|``."""
    n = len(eqn.outputs)
    operands = [shape_of(program, t) for t in eqn.inputs[:n]]
    if len(eqn.inputs) != 2 * n or any(shape != operands[0] for shape in operands):
        return replicated_space(eqn, program)
    sp = _reduction(eqn, program, tuple(eqn.params["dimensions"]), "sum", False)
    in_maps = sp.in_maps[:n] + tuple(None if t is None else () for t in eqn.inputs[n:])
    return dataclasses.replace(sp, in_maps=in_maps, flops=n * sp.flops)


@register_rule("argmax", "argmin")
def argmax_rule(eqn: Equation, program: Program) -> OpSpace:
    """Arg-reductions cannot combine partial results with one all-reduce: never split the axis."""
    return _reduction(eqn, program, tuple(eqn.params["axes"]), "sum", False)


@register_rule("device_put")
def device_put_rule(eqn: Equation, program: Program) -> OpSpace:
    """A move between memory spaces (`trace` keeps only those, one array each: a remat
    policy's offload to ``pinned_host`` and back): the result follows its operand, no FLOPs;
    the copy is a DMA, not a kernel of the device's."""
    return dataclasses.replace(elementwise_rule(eqn, program), flops=0.0)


@register_rule("optimization_barrier")  # overrides `elementwise_rule`: it computes nothing
def barrier_rule(eqn: Equation, program: Program) -> OpSpace:
    """A remat's barrier only orders the program (XLA passes its operand's buffer on, as
    `fusion.ALIASES` says): elementwise, no FLOPs."""
    return dataclasses.replace(elementwise_rule(eqn, program), flops=0.0)


@register_rule("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp")
def cumulative_rule(eqn: Equation, program: Program) -> OpSpace:
    sp = elementwise_rule(eqn, program)
    axis = eqn.params["axis"]
    split = tuple(s and d != axis for d, s in enumerate(sp.splittable))
    return dataclasses.replace(sp, splittable=split)


@register_rule("sort")
def sort_rule(eqn: Equation, program: Program) -> OpSpace:
    sp = elementwise_rule(eqn, program)
    dim = eqn.params["dimension"]
    return dataclasses.replace(
        sp, splittable=tuple(s and d != dim for d, s in enumerate(sp.splittable))
    )


@register_rule("top_k", "approx_top_k")
def top_k_rule(eqn: Equation, program: Program) -> OpSpace:
    """The k largest along one axis (a mixture of experts' routing): values and indices follow
    the operand on every other dim; the axis stays whole. ``flops = |operand| · max(1, log2 k)``
    (compare-exchanges into a k-heap)."""
    shape = out_shape(eqn, program)
    src = shape_of(program, eqn.inputs[0])
    p = eqn.params
    axis = p["axis"] if "axis" in p else p["reduction_dimension"]
    axis = axis % len(src)
    n = len(shape)
    in_map = tuple(None if d == axis else d for d in range(n))
    ident = tuple(range(n))
    return OpSpace(
        shape, tuple(d != axis for d in range(n)), dim_names(n), (in_map,),
        tuple(ident for _ in eqn.outputs), float(math.prod(src) * max(1.0, math.log2(p["k"]))),
    )  # fmt: skip


def _fixed_dims_rule(eqn: Equation, program: Program, fixed: set[int]) -> OpSpace:
    """Ops that keep rank but change/offset some dims: those dims are never split."""
    shape = out_shape(eqn, program)
    n = len(shape)
    in_maps = []
    for t in eqn.inputs:
        shp = shape_of(program, t)
        if t is None or len(shp) != n:
            in_maps.append(None if t is None else (None,) * len(shp))
        else:
            in_maps.append(tuple(None if d in fixed or shp[d] != shape[d] else d for d in range(n)))
    split = tuple(d not in fixed for d in range(n))
    return OpSpace(shape, split, dim_names(n), tuple(in_maps), (tuple(range(n)),), 0.0)


@register_rule("slice", "pad", "rev", "dynamic_slice", "dynamic_update_slice", "tile")
def slicing_rule(eqn: Equation, program: Program) -> OpSpace:
    """Dims whose extent or offset changes stay whole (a tiled dim: ``jnp.tile``); the rest
    follow the operand."""
    shape = out_shape(eqn, program)
    src = shape_of(program, eqn.inputs[0])
    fixed = {d for d in range(len(shape)) if src[d] != shape[d]}
    if eqn.primitive == "rev":
        fixed |= set(eqn.params["dimensions"])
    if eqn.primitive in ("dynamic_update_slice",):
        upd = shape_of(program, eqn.inputs[1])
        fixed |= {d for d in range(len(shape)) if upd[d] != shape[d]}
    if eqn.primitive == "pad":
        fixed |= {
            d for d, (lo, hi, it) in enumerate(eqn.params["padding_config"]) if lo or hi or it
        }
    return _fixed_dims_rule(eqn, program, fixed)


@register_rule("concatenate")
def concatenate_rule(eqn: Equation, program: Program) -> OpSpace:
    return _fixed_dims_rule(eqn, program, {eqn.params["dimension"]})


@register_rule("split")
def split_rule(eqn: Equation, program: Program) -> OpSpace:
    axis = eqn.params["axis"]
    src = shape_of(program, eqn.inputs[0])
    n = len(src)
    maps = tuple(tuple(range(n)) for _ in eqn.outputs)
    op_map = tuple(None if d == axis else d for d in range(n))
    split = tuple(d != axis for d in range(n))
    return OpSpace(src, split, dim_names(n), (op_map,), maps, 0.0)


# Control flow, custom calls and random-bit generation XLA cannot partition: one replicated
# node each (documented), warned about once per planning run with the reason here; key
# bookkeeping (seed, wrap, split, fold_in) and debug callbacks are too small to mention.
_LOOPS = "is planned as one replicated node (custom calls are not planned inside)"
_WHILE = (
    "is planned as one replicated node: its trip count is not known when tracing (its condition "
    "reads values the step computes); scans and loops of a fixed count are planned inside"
)
_BITS = "generates random bits, which XLA's partitioner does not split"
_GAMMA = (
    "draws gamma variates by rejection (jax.random.gamma, beta, dirichlet); split, XLA "
    "all-reduces each rejection loop's flag over the split axes on every iteration, so it runs "
    "replicated (its draws are usually a vector per example: small to hold whole)"
)
REPLICATED_WARNED = {
    "scan": _LOOPS, "while": _WHILE, "cond": _LOOPS, "custom_call": _LOOPS,
    "random_gamma": _GAMMA,
    "pure_callback": "calls back into Python on the host",
    "io_callback": "calls back into Python on the host",
    "threefry2x32": _BITS, "rng_bit_generator": _BITS, "rng_uniform": _BITS,
}  # fmt: skip
for _name in [
    *REPLICATED_WARNED,
    "random_seed",
    "random_wrap",
    "random_unwrap",
    "random_split",
    "random_fold_in",
    "debug_callback",
    "platform_index",  # lax.platform_dependent's branch index: a scalar with no operands
]:
    RULES[_name] = replicated_space

# Integer operations per 32-bit word of JAX's partitionable threefry bits: an iota counter pair,
# Threefry-2x32's 20 rounds of add, rotate (two shifts and an or) and xor with 5 key injections,
# and the xor of the pair.
THREEFRY_OPS = 120


def partitionable_bits(eqn: Equation, program: Program) -> bool:
    """Whether XLA can split ``random_bits``: a threefry key, traced with
    jax_threefry_partitionable on, makes each bit from the key and its own index alone."""
    return program.threefry_partitionable and program.tensors[eqn.inputs[0]].dtype == "key<fry>"


def _unsplit_bits(eqn: Equation, program: Program) -> str | None:
    """Why `random_bits_rule` keeps these bits replicated, or None when it splits them."""
    if partitionable_bits(eqn, program):
        return None
    return (
        f"draws random bits from a {program.tensors[eqn.inputs[0]].dtype} key, which XLA "
        "partitions only for threefry keys with jax_threefry_partitionable on (the default)"
    )


@register_rule("random_bits")
def random_bits_rule(eqn: Equation, program: Program) -> OpSpace:
    """Random bits of a (replicated, opaque) key array: results ``key dims + shape``, every dim
    splittable, each device drawing its own shard (bit-identical to the unsplit draw);
    ``flops = THREEFRY_OPS · |result| · max(1, bit_width / 32)``. Keys XLA cannot partition
    run replicated, with a warning that says why (`REPLICATED_WHEN`)."""
    if not partitionable_bits(eqn, program):
        return replicated_space(eqn, program)
    shape = out_shape(eqn, program)
    n, keys = len(shape), len(shape_of(program, eqn.inputs[0]))
    words = max(1, eqn.params["bit_width"] // 32)
    return OpSpace(
        shape, (True,) * n, dim_names(n), ((None,) * keys,), (tuple(range(n)),),
        float(THREEFRY_OPS * words * math.prod(shape)),
    )  # fmt: skip


# Primitives whose rule runs them replicated only in some cases: per primitive, why (for the
# warning), or None when the rule splits them
REPLICATED_WHEN = {"random_bits": _unsplit_bits, "shard_map": shard_map.unplanned}
# Primitives whose rule runs them replicated over some mesh axes only: per primitive, why (for a
# warning, once per reason), or None when it runs split over every axis its rule chooses
PARTLY_REPLICATED = {"shard_map": shard_map.automatic_axes}


@register_rule(
    "reduce_window_sum",
    "reduce_window_max",
    "reduce_window_min",
    "reduce_window",
    "select_and_scatter_add",
    "select_and_gather_add",
)
def window_rule(eqn: Equation, program: Program) -> OpSpace:
    """Pooling: dims the window slides over stay whole; dims with a unit window follow."""
    p = eqn.params
    win = p.get("window_dimensions", ())
    strides = p.get("window_strides", (1,) * len(win))
    pad = p.get("padding", ((0, 0),) * len(win))
    fixed = {
        d for d in range(len(win)) if win[d] != 1 or strides[d] != 1 or tuple(pad[d]) != (0, 0)
    }
    return _fixed_dims_rule(eqn, program, fixed)
