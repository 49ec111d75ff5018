"""Rules for contractions: ``dot_general``, ``ragged_dot_general`` (grouped matmuls) and
``conv_general_dilated``. Operands' dims are matched to iteration dims, some contracted: a
split contracted dim leaves partial sums (AccPar's Type-II). See `opspace` for what a rule
describes. Also `conv_taps_fraction`: the share of a convolution's FLOPs that land on data.
Pure (numpy only).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..program.graph import Equation, Program
from .opspace import DimMap, OpSpace, out_shape, register_rule, replicated_space, shape_of

# primitives whose rule is a contraction's (operands' dims matched, some contracted)
CONTRACTIONS = ("dot_general", "ragged_dot_general", "conv_general_dilated")


@dataclasses.dataclass(frozen=True)
class _DotDims:
    """A contraction's iteration dims in order batch, lhs free, rhs free, contracting, and each
    operand's map onto them."""

    sizes: tuple[int, ...]
    names: tuple[str, ...]
    lhs: DimMap
    rhs: DimMap
    n_out: int  # the result's dims are the first n_out iteration dims


def _dot_dims(ls, rs, dimension_numbers, rhs_skipped: tuple[int, ...] = ()) -> _DotDims:
    """`_DotDims` of a dot of shapes ``ls`` x ``rs``; ``rhs_skipped``: rhs dims that are no
    iteration dim (a grouped matmul's group dim), mapped to None."""
    (lc, rc), (lb, rb) = dimension_numbers
    lf = [d for d in range(len(ls)) if d not in lc and d not in lb]
    rf = [d for d in range(len(rs)) if d not in rc and d not in rb and d not in rhs_skipped]
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
    names = (
        tuple(f"b{i}" for i in range(nb))
        + tuple(f"m{i}" for i in range(nlf))
        + tuple(f"c{i}" if nrf > 1 else "c" for i in range(nrf))
        + tuple(f"k{i}" if nc > 1 else "k" for i in range(nc))
    )
    return _DotDims(sizes, names, tuple(lmap), tuple(rmap), nb + nlf + nrf)


@register_rule("dot_general")
def dot_general_rule(eqn: Equation, program: Program) -> OpSpace:
    """Batch, free and contracting dims; a split contracting dim is AccPar's Type-II."""
    ls, rs = shape_of(program, eqn.inputs[0]), shape_of(program, eqn.inputs[1])
    d = _dot_dims(ls, rs, eqn.params["dimension_numbers"])
    return OpSpace(
        d.sizes,
        (True,) * len(d.sizes),
        d.names,
        (d.lhs, d.rhs),
        (tuple(range(d.n_out)),),
        2.0 * math.prod(d.sizes),
    )


@register_rule("ragged_dot_general")
def ragged_dot_rule(eqn: Equation, program: Program) -> OpSpace:
    """A grouped matmul (``jax.lax.ragged_dot``: a mixture of experts' expert layers, rows
    sorted by expert, ``group_sizes`` rows per expert): `dot_general`'s dims, except that the
    ragged dim and the group dim are never split, and ``group_sizes`` is read replicated.

    Its three modes (the lhs ragged dim is free, contracted or batch): forward, ``lhs[m, k] x
    rhs[g, k, n] -> [m, n]`` (row i meets its group's matrix; rhs's group dim is no iteration
    dim); weight gradient, ``lhs[m, k] x e[m, n] -> [g, k, n]`` (the rows of each group
    contracted apart; the result's leading group dim is an iteration dim of its own); ragged
    batch, a batched dot. XLA's partitioner replicates the ragged and group dims (Shardy's
    rule for ``ragged_dot``: ``need_replication``), so every other dim may split, a contracted
    one leaving partial sums. FLOPs: 2 x the product of the dims other than the group's (each
    row meets one group's matrix), what a native kernel runs; XLA:CPU lowers it to a dense dot
    over all groups (g x those FLOPs), a CPU artifact left unpriced.
    """
    rd = eqn.params["ragged_dot_dimension_numbers"]
    ls, rs = shape_of(program, eqn.inputs[0]), shape_of(program, eqn.inputs[1])
    d = _dot_dims(ls, rs, rd.dot_dimension_numbers, tuple(rd.rhs_group_dimensions))
    splittable = [True] * len(d.sizes)
    for r in rd.lhs_ragged_dimensions:
        splittable[d.lhs[r]] = False
    sizes, names, out_map = d.sizes, d.names, tuple(range(d.n_out))
    flops = 2.0 * math.prod(sizes)
    (lc, _), _ = rd.dot_dimension_numbers
    if any(r in lc for r in rd.lhs_ragged_dimensions):  # the result leads with the groups
        groups = out_shape(eqn, program)[0]
        sizes, names = (*sizes, groups), (*names, "g")
        splittable.append(False)
        out_map = (len(sizes) - 1, *out_map)
    counts = [None if t is None else (None,) * len(shape_of(program, t)) for t in eqn.inputs[2:]]
    in_maps = [d.lhs, d.rhs, *counts]
    return OpSpace(sizes, tuple(splittable), names, tuple(in_maps), (out_map,), flops)


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
    ls, rs = shape_of(program, eqn.inputs[0]), shape_of(program, eqn.inputs[1])
    os_ = out_shape(eqn, program)
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


def conv_taps_fraction(program: Program, eqn) -> float:
    """The share of a convolution's window taps that land on input elements (1 for any other
    equation): Π over spatial dims of valid taps / (output size · kernel size).

    `conv_rule` counts 2 · output elements · input features · kernel taps FLOPs; taps on padding
    or, for the input gradient of a strided convolution (lhs dilation), on the holes between
    input elements multiply zeros that neither XLA's cost analysis nor cuDNN's kernels count.
    """
    if eqn.primitive != "conv_general_dilated":
        return 1.0
    p = eqn.params
    dn = p["dimension_numbers"]
    lhs = program.tensors[eqn.inputs[0]].shape
    rhs = program.tensors[eqn.inputs[1]].shape
    out = program.tensors[eqn.outputs[0]].shape
    nsp = len(out) - 2
    fraction = 1.0
    for i in range(nsp):
        n_in, k, n_out = lhs[dn.lhs_spec[2 + i]], rhs[dn.rhs_spec[2 + i]], out[dn.out_spec[2 + i]]
        stride = p["window_strides"][i]
        lo = p["padding"][i][0]
        dl = (p["lhs_dilation"] or (1,) * nsp)[i]
        dr = (p["rhs_dilation"] or (1,) * nsp)[i]
        last = (n_in - 1) * dl  # the last input element in dilated coordinates
        pos = np.arange(n_out)[:, None] * stride + np.arange(k)[None, :] * dr - lo
        valid = (pos >= 0) & (pos <= last) & (pos % dl == 0)
        fraction *= float(valid.mean()) if valid.size else 1.0
    return fraction
