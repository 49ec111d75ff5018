"""Sharding rules keyed by primitive: each equation's iteration space.

Every rule describes an equation the way an einsum would: a list of *iteration dimensions* (with
sizes), and for every operand and result a map from its tensor dimensions to iteration dimensions
(or None: that tensor dimension is never split). A configuration assigns each mesh axis to one
iteration dimension or to none (the axis replicates). From the maps follow, for any configuration:

- each result's sharding (PartitionSpec): the axes of the iteration dims its dimensions map to;
- each operand's required sharding, which the cost model turns into resharding collectives;
- partial sums: axes on iteration dims that appear in operands but in no result (a contraction of
  ``dot_general``/``conv_general_dilated`` = AccPar's Type-II, a reduced dimension of
  ``reduce_sum``, the batch of a weight gradient = gradient synchronisation) leave partial results
  that an all-reduce completes;
- the degree of parallelism, hence the per-device compute.

Pure (no jax import): params are read by attribute, never constructed.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable

from .graph import Equation, Program

log = logging.getLogger("jaxpar")

DimMap = tuple[int | None, ...]


@dataclasses.dataclass(frozen=True)
class OpSpace:
    """The iteration space of one equation (see module docstring)."""

    sizes: tuple[int, ...]  # size of each iteration dimension
    splittable: tuple[bool, ...]  # may a mesh axis be assigned to this iteration dim?
    names: tuple[str, ...]  # short names for reports ("n", "c", "h", "w", "k", "d0", ...)
    in_maps: tuple[DimMap | None, ...]  # per equation input: tensor dim -> iter dim (None: literal)
    out_maps: tuple[DimMap, ...]  # per equation output
    flops: float  # FLOPs of the whole (unsharded) equation
    reduce_op: str = "sum"  # how partial results combine ("sum", "max", "min")
    halo: tuple[int, ...] = ()  # per iter dim: halo rows a spatial split exchanges (convolutions)
    replicated: bool = False  # fallback: a single, fully replicated configuration

    @property
    def reduce_dims(self) -> tuple[int, ...]:
        """Iteration dims that no result carries: splitting them leaves partial results."""
        used = {d for m in self.out_maps for d in m if d is not None}
        return tuple(i for i in range(len(self.sizes)) if i not in used)


Rule = Callable[[Equation, Program], OpSpace]
RULES: dict[str, Rule] = {}


def register_rule(*names: str) -> Callable[[Rule], Rule]:
    """Register a rule for one or more primitive names."""

    def deco(fn: Rule) -> Rule:
        for n in names:
            RULES[n] = fn
        return fn

    return deco


def _shape(program: Program, tid: int | None) -> tuple[int, ...]:
    return () if tid is None else program.tensors[tid].shape


def _out_shape(eqn: Equation, program: Program, i: int = 0) -> tuple[int, ...]:
    return program.tensors[eqn.outputs[i]].shape


def replicated_space(eqn: Equation, program: Program) -> OpSpace:
    """One configuration: every operand and result replicated (the documented fallback)."""
    return OpSpace(
        sizes=(),
        splittable=(),
        names=(),
        in_maps=tuple(None if t is None else (None,) * len(_shape(program, t)) for t in eqn.inputs),
        out_maps=tuple((None,) * len(_out_shape(eqn, program, i)) for i in range(len(eqn.outputs))),
        flops=float(sum(program.tensors[t].size for t in eqn.outputs)),
        replicated=True,
    )


def space_of(eqn: Equation, program: Program, warned: set[str] | None = None) -> OpSpace:
    """The equation's iteration space; unknown primitives fall back to replicated, with one
    warning per primitive among those already in ``warned`` (a planning run passes its own)."""
    rule = RULES.get(eqn.primitive)
    if rule is None:
        warned = set() if warned is None else warned
        if eqn.primitive not in warned:
            warned.add(eqn.primitive)
            log.warning(
                "jaxpar: no sharding rule for primitive %r; it runs replicated (its operands are "
                "gathered and its results replicated on every device)",
                eqn.primitive,
            )
        return replicated_space(eqn, program)
    if any(program.tensors[t].opaque for t in eqn.outputs):
        return replicated_space(eqn, program)
    return rule(eqn, program)


def _identity_maps(eqn: Equation, program: Program, out_shape: tuple[int, ...]) -> tuple:
    """Operand maps for an elementwise op: equal-size dims follow, broadcast (size-1) dims don't."""
    maps = []
    for t in eqn.inputs:
        if t is None:
            maps.append(None)
            continue
        shp = _shape(program, t)
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


def _dim_names(n: int) -> tuple[str, ...]:
    return tuple(f"d{i}" for i in range(n))


ELEMENTWISE = [
    "add",
    "add_any",
    "sub",
    "mul",
    "div",
    "rem",
    "pow",
    "max",
    "min",
    "neg",
    "sign",
    "floor",
    "ceil",
    "round",
    "is_finite",
    "exp",
    "exp2",
    "log",
    "log1p",
    "expm1",
    "tanh",
    "logistic",
    "sin",
    "cos",
    "tan",
    "asin",
    "acos",
    "atan",
    "atan2",
    "sinh",
    "cosh",
    "asinh",
    "acosh",
    "atanh",
    "sqrt",
    "rsqrt",
    "cbrt",
    "abs",
    "integer_pow",
    "square",
    "erf",
    "erfc",
    "erf_inv",
    "lgamma",
    "digamma",
    "igamma",
    "igammac",
    "nextafter",
    "select_n",
    "clamp",
    "and",
    "or",
    "xor",
    "not",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "shift_left",
    "shift_right_logical",
    "shift_right_arithmetic",
    "population_count",
    "convert_element_type",
    "copy",
    "copy_p",
    "reduce_precision",
    "stop_gradient",
    "real",
    "imag",
    "conj",
    "complex",
    "imag",
    "sharding_constraint",
    "optimization_barrier",
    "bessel_i0e",
    "bessel_i1e",
    "polygamma",
    "zeta",
    "clz",
]


@register_rule(*ELEMENTWISE)
def elementwise_rule(eqn: Equation, program: Program) -> OpSpace:
    """Results follow operands dimension by dimension (the follower rule)."""
    shape = _out_shape(eqn, program)
    if any(_out_shape(eqn, program, i) != shape for i in range(len(eqn.outputs))):
        return replicated_space(eqn, program)
    n = len(shape)
    return OpSpace(
        sizes=shape,
        splittable=(True,) * n,
        names=_dim_names(n),
        in_maps=_identity_maps(eqn, program, shape),
        out_maps=(tuple(range(n)),) * len(eqn.outputs),
        flops=float(math.prod(shape)) * len(eqn.outputs),
    )


@register_rule("iota")
def iota_rule(eqn: Equation, program: Program) -> OpSpace:
    """No operands: any split of the result is computed locally."""
    shape = _out_shape(eqn, program)
    n = len(shape)
    return OpSpace(
        shape, (True,) * n, _dim_names(n), (), (tuple(range(n)),), float(math.prod(shape))
    )


@register_rule("broadcast_in_dim")
def broadcast_rule(eqn: Equation, program: Program) -> OpSpace:
    shape = _out_shape(eqn, program)
    src = _shape(program, eqn.inputs[0])
    bdims = eqn.params["broadcast_dimensions"]
    op_map = tuple(bdims[j] if src[j] == shape[bdims[j]] else None for j in range(len(src)))
    in_maps = (
        op_map,
        *tuple(None if t is None else (None,) * len(_shape(program, t)) for t in eqn.inputs[1:]),
    )
    n = len(shape)
    return OpSpace(shape, (True,) * n, _dim_names(n), in_maps, (tuple(range(n)),), 0.0)


@register_rule("transpose")
def transpose_rule(eqn: Equation, program: Program) -> OpSpace:
    shape = _out_shape(eqn, program)
    perm = eqn.params["permutation"]
    op_map = [0] * len(perm)
    for out_dim, in_dim in enumerate(perm):
        op_map[in_dim] = out_dim
    n = len(shape)
    return OpSpace(
        shape,
        (True,) * n,
        _dim_names(n),
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
    shape = _out_shape(eqn, program)
    src = _shape(program, eqn.inputs[0])
    op_map, splittable = reshape_map(src, shape)
    n = len(shape)
    extra = tuple(None if t is None else (None,) * len(_shape(program, t)) for t in eqn.inputs[1:])
    return OpSpace(shape, splittable, _dim_names(n), (op_map, *extra), (tuple(range(n)),), 0.0)


def _reduction(eqn: Equation, program: Program, axes: tuple[int, ...], op: str, split_ok: bool):
    src = _shape(program, eqn.inputs[0])
    kept = [d for d in range(len(src)) if d not in axes]
    order = kept + list(axes)  # iteration dims: kept dims first, then reduced dims
    sizes = tuple(src[d] for d in order)
    op_map = tuple(order.index(d) for d in range(len(src)))
    names = _dim_names(len(kept)) + tuple(f"r{i}" for i in range(len(axes)))
    splittable = (True,) * len(kept) + (split_ok,) * len(axes)
    outs = tuple(tuple(range(len(kept))) for _ in eqn.outputs)
    in_maps = tuple(op_map if t is not None else None for t in eqn.inputs)
    return OpSpace(sizes, splittable, names, in_maps, outs, float(math.prod(src)), reduce_op=op)


@register_rule("reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or")
def reduce_rule(eqn: Equation, program: Program) -> OpSpace:
    """A split reduced dim leaves partial results; sums/max/min complete with an all-reduce."""
    op = {"reduce_sum": "sum", "reduce_max": "max", "reduce_min": "min"}.get(eqn.primitive, "")
    return _reduction(eqn, program, tuple(eqn.params["axes"]), op or "sum", bool(op))


@register_rule("argmax", "argmin")
def argmax_rule(eqn: Equation, program: Program) -> OpSpace:
    """Arg-reductions cannot combine partial results with one all-reduce: never split the axis."""
    return _reduction(eqn, program, tuple(eqn.params["axes"]), "sum", False)


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


def _fixed_dims_rule(eqn: Equation, program: Program, fixed: set[int]) -> OpSpace:
    """Ops that keep rank but change/offset some dims: those dims are never split."""
    shape = _out_shape(eqn, program)
    n = len(shape)
    in_maps = []
    for t in eqn.inputs:
        shp = _shape(program, t)
        if t is None or len(shp) != n:
            in_maps.append(None if t is None else (None,) * len(shp))
        else:
            in_maps.append(tuple(None if d in fixed or shp[d] != shape[d] else d for d in range(n)))
    split = tuple(d not in fixed for d in range(n))
    return OpSpace(shape, split, _dim_names(n), tuple(in_maps), (tuple(range(n)),), 0.0)


@register_rule("slice", "pad", "rev", "dynamic_slice", "dynamic_update_slice")
def slicing_rule(eqn: Equation, program: Program) -> OpSpace:
    """Dims whose extent or offset changes stay whole; the rest follow the operand."""
    shape = _out_shape(eqn, program)
    src = _shape(program, eqn.inputs[0])
    fixed = {d for d in range(len(shape)) if src[d] != shape[d]}
    if eqn.primitive == "rev":
        fixed |= set(eqn.params["dimensions"])
    if eqn.primitive in ("dynamic_update_slice",):
        upd = _shape(program, eqn.inputs[1])
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
    src = _shape(program, eqn.inputs[0])
    n = len(src)
    maps = tuple(tuple(range(n)) for _ in eqn.outputs)
    op_map = tuple(None if d == axis else d for d in range(n))
    split = tuple(d != axis for d in range(n))
    return OpSpace(src, split, _dim_names(n), (op_map,), maps, 0.0)


@register_rule("dot_general")
def dot_general_rule(eqn: Equation, program: Program) -> OpSpace:
    """Batch, free and contracting dims; a split contracting dim is AccPar's Type-II."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    ls, rs = _shape(program, eqn.inputs[0]), _shape(program, eqn.inputs[1])
    lf = [d for d in range(len(ls)) if d not in lc and d not in lb]
    rf = [d for d in range(len(rs)) if d not in rc and d not in rb]
    nb, nlf, nrf, nc = len(lb), len(lf), len(rf), len(lc)
    sizes = tuple(ls[d] for d in lb) + tuple(ls[d] for d in lf) + tuple(rs[d] for d in rf)
    sizes += tuple(ls[d] for d in lc)
    lmap: list[int | None] = [None] * len(ls)
    rmap: list[int | None] = [None] * len(rs)
    for i, (a, b) in enumerate(zip(lb, rb, strict=True)):
        lmap[a], rmap[b] = i, i
    for i, d in enumerate(lf):
        lmap[d] = nb + i
    for i, d in enumerate(rf):
        rmap[d] = nb + nlf + i
    for i, (a, b) in enumerate(zip(lc, rc, strict=True)):
        lmap[a] = rmap[b] = nb + nlf + nrf + i
    n_out = nb + nlf + nrf
    names = (
        tuple(f"b{i}" for i in range(nb))
        + tuple(f"m{i}" for i in range(nlf))
        + tuple(f"c{i}" if nrf > 1 else "c" for i in range(nrf))
        + tuple(f"k{i}" if nc > 1 else "k" for i in range(nc))
    )
    flops = 2.0 * math.prod(sizes)
    return OpSpace(
        sizes,
        (True,) * len(sizes),
        names,
        (tuple(lmap), tuple(rmap)),
        (tuple(range(n_out)),),
        flops,
    )


@register_rule("conv_general_dilated")
def conv_rule(eqn: Equation, program: Program) -> OpSpace:
    """Batch n, output channels c, input channels k (partial sums), spatial h/w with halos.

    Spatial dims are split only for stride-1, undilated convolutions whose output keeps the input
    extent ("SAME"): each device then exchanges (kernel-1) halo rows with its neighbours. Grouped
    convolutions run replicated.
    """
    p = eqn.params
    if p["feature_group_count"] != 1 or p["batch_group_count"] != 1:
        return replicated_space(eqn, program)
    dn = p["dimension_numbers"]
    lspec, rspec, ospec = dn.lhs_spec, dn.rhs_spec, dn.out_spec
    ls, rs = _shape(program, eqn.inputs[0]), _shape(program, eqn.inputs[1])
    os_ = _out_shape(eqn, program)
    nsp = len(ospec) - 2
    # iteration dims: n, spatial..., c (out features), k (in features)
    sizes = (os_[ospec[0]], *tuple(os_[ospec[2 + i]] for i in range(nsp)))
    sizes += (os_[ospec[1]], ls[lspec[1]])
    names = ("n", *tuple("hwd"[i] if i < 3 else f"s{i}" for i in range(nsp)), "c", "k")
    simple = all(s == 1 for s in p["window_strides"]) and all(
        d == 1 for d in (p["lhs_dilation"] or (1,) * nsp)
    )
    simple = simple and all(d == 1 for d in (p["rhs_dilation"] or (1,) * nsp))
    halo = [0] * len(sizes)
    split = [True] * len(sizes)
    lmap: list[int | None] = [None] * len(ls)
    rmap: list[int | None] = [None] * len(rs)
    omap: list[int | None] = [None] * len(os_)
    lmap[lspec[0]] = omap[ospec[0]] = 0
    for i in range(nsp):
        k = rs[rspec[2 + i]]
        same = simple and ls[lspec[2 + i]] == os_[ospec[2 + i]] and k <= 7
        split[1 + i] = same
        halo[1 + i] = k - 1
        omap[ospec[2 + i]] = 1 + i
        if same:
            lmap[lspec[2 + i]] = 1 + i
    c, kk = 1 + nsp, 2 + nsp
    omap[ospec[1]] = rmap[rspec[0]] = c
    lmap[lspec[1]] = rmap[rspec[1]] = kk
    kernel = math.prod(rs[rspec[2 + i]] for i in range(nsp))
    flops = 2.0 * math.prod(os_) * ls[lspec[1]] * kernel
    return OpSpace(
        tuple(sizes),
        tuple(split),
        names,
        (tuple(lmap), tuple(rmap)),
        (tuple(omap),),
        flops,
        halo=tuple(halo),
    )


@register_rule("gather")
def gather_rule(eqn: Equation, program: Program) -> OpSpace:
    """Embedding lookups: index batch dims follow the indices; whole-slice dims follow the table."""
    dn = eqn.params["dimension_numbers"]
    os_ = _out_shape(eqn, program)
    src = _shape(program, eqn.inputs[0])
    idx = _shape(program, eqn.inputs[1])
    offset_dims = tuple(dn.offset_dims)
    slice_sizes = tuple(eqn.params["slice_sizes"])
    collapsed = set(dn.collapsed_slice_dims) | set(getattr(dn, "operand_batching_dims", ()))
    batch_out = [d for d in range(len(os_)) if d not in offset_dims]
    omap = tuple(range(len(os_)))
    # operand: dims not collapsed appear, in order, as the offset dims of the output
    op_map: list[int | None] = [None] * len(src)
    kept = [d for d in range(len(src)) if d not in collapsed]
    indexed = set(dn.start_index_map)
    for od, sd in zip(offset_dims, kept, strict=False):
        if slice_sizes[sd] == src[sd] and sd not in indexed:
            op_map[sd] = od
    # indices: all dims but the index vector dim map to the output batch dims, in order
    ivd = dn.index_vector_dim if hasattr(dn, "index_vector_dim") else len(idx) - 1
    idx_dims = [d for d in range(len(idx)) if d != ivd]
    idx_map: list[int | None] = [None] * len(idx)
    for d, od in zip(idx_dims, batch_out, strict=False):
        if idx[d] == os_[od]:
            idx_map[d] = od
    # batching dims (take_along_axis): operand dim <-> indices dim <-> output batch dim
    for ob, ib in zip(
        getattr(dn, "operand_batching_dims", ()),
        getattr(dn, "start_indices_batching_dims", ()),
        strict=True,
    ):
        od = idx_map[ib]
        if od is not None and src[ob] == os_[od]:
            op_map[ob] = od
    return OpSpace(
        os_,
        (True,) * len(os_),
        _dim_names(len(os_)),
        (tuple(op_map), tuple(idx_map)),
        (omap,),
        float(math.prod(os_)),
    )


@register_rule("scatter-add", "scatter_add")
def scatter_add_rule(eqn: Equation, program: Program) -> OpSpace:
    """Embedding gradients: window dims follow the table; split scatter dims leave partial sums.

    Batching dims (the transpose of take_along_axis) pair an operand dim with an update dim and
    are split like any batch dim.
    """
    dn = eqn.params["dimension_numbers"]
    os_ = _out_shape(eqn, program)
    idx = _shape(program, eqn.inputs[1])
    upd = _shape(program, eqn.inputs[2])
    window = tuple(dn.update_window_dims)
    inserted = set(dn.inserted_window_dims)
    op_batch = tuple(getattr(dn, "operand_batching_dims", ()))
    idx_batch = tuple(getattr(dn, "scatter_indices_batching_dims", ()))
    scatter_to = set(dn.scatter_dims_to_operand_dims)
    scat = [d for d in range(len(upd)) if d not in window]
    ivd = dn.index_vector_dim if hasattr(dn, "index_vector_dim") else len(idx) - 1
    idx_dims = [d for d in range(len(idx)) if d != ivd]
    n = len(os_)
    sizes = list(os_)
    names = list(_dim_names(n))
    splittable = [d not in scatter_to for d in range(n)]
    upd_map: list[int | None] = [None] * len(upd)
    idx_map: list[int | None] = [None] * len(idx)
    operand_window = [d for d in range(n) if d not in inserted and d not in op_batch]
    for ud, od in zip(window, operand_window, strict=False):
        if upd[ud] == os_[od] and od not in scatter_to:
            upd_map[ud] = od
    for ud, idim in zip(scat, idx_dims, strict=False):
        if idim in idx_batch:
            it = op_batch[idx_batch.index(idim)]  # a batching dim: shared with the operand
        else:
            it = len(sizes)  # a scattered dim: split -> partial sums
            sizes.append(upd[ud])
            names.append(f"r{it - n}")
            splittable.append(True)
        if upd[ud] == sizes[it]:
            upd_map[ud] = it
        if idx[idim] == sizes[it]:
            idx_map[idim] = it
    op_map = tuple(d if d not in scatter_to else None for d in range(n))
    return OpSpace(
        tuple(sizes),
        tuple(splittable),
        tuple(names),
        (op_map, tuple(idx_map), tuple(upd_map)),
        (tuple(range(n)),),
        float(math.prod(upd)),
    )


# Control flow, custom calls and random-bit generation: one replicated node each (documented).
for _name in [
    "scan",
    "while",
    "cond",
    "custom_call",
    "random_bits",
    "random_seed",
    "random_wrap",
    "random_unwrap",
    "random_split",
    "random_fold_in",
    "threefry2x32",
    "rng_bit_generator",
    "rng_uniform",
    "pure_callback",
    "io_callback",
    "debug_callback",
]:
    RULES[_name] = replicated_space


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
