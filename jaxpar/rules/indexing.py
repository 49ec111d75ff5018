"""Rules for indexing primitives: gather (embedding lookups) and the scatter family (embedding
gradients, ``x.at[i].set(v)``, segment sums). See `opspace` for what a rule describes. Pure.
"""

from __future__ import annotations

import math

from ..program.graph import Equation, Program
from .opspace import OpSpace, dim_names, out_shape, register_rule, shape_of


@register_rule("gather")
def gather_rule(eqn: Equation, program: Program) -> OpSpace:
    """Embedding lookups: index batch dims follow the indices; whole-slice dims follow the table."""
    dn = eqn.params["dimension_numbers"]
    os_ = out_shape(eqn, program)
    src = shape_of(program, eqn.inputs[0])
    idx = shape_of(program, eqn.inputs[1])
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
        dim_names(len(os_)),
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
    return _scatter_space(eqn, program, sum_scattered=True)


@register_rule("scatter", "scatter-mul", "scatter-min", "scatter-max", "scatter-sub")
def scatter_rule(eqn: Equation, program: Program) -> OpSpace:
    """``x.at[i].set/mul/min/max(v)``, ``segment_max``: like scatter-add, but the scattered
    dims stay whole.

    Updates that overwrite (or multiply, or take extremes, or subtract from the operand) do not
    combine by a sum, so the partial results a split scattered dim leaves cannot be completed by
    the planner's all-reduce; window dims (following the operand) and batching dims still split.
    (JAX names these primitives with a hyphen: until 2026-11-27 the rule was registered as
    ``scatter_max`` and the like, and they ran replicated.)
    """
    return _scatter_space(eqn, program, sum_scattered=False)


def _scatter_space(eqn: Equation, program: Program, sum_scattered: bool) -> OpSpace:
    """The scatter family's space; ``sum_scattered``: scattered dims may split (partial sums)."""
    dn = eqn.params["dimension_numbers"]
    os_ = out_shape(eqn, program)
    idx = shape_of(program, eqn.inputs[1])
    upd = shape_of(program, eqn.inputs[2])
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
    names = list(dim_names(n))
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
            it = len(sizes)  # a scattered dim: split -> partial sums (scatter-add only)
            sizes.append(upd[ud])
            names.append(f"r{it - n}")
            splittable.append(sum_scattered)
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
