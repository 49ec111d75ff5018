"""The operand layouts XLA:CPU's library calls want, and which operands it copies first.

XLA:CPU runs a convolution on inputs laid out (batch, spatial..., feature) and kernels
(spatial..., in, out), and decomposes a dot_general into a matmul over merged dim groups; an
operand stored in another order is copied into the wanted one by a kernel of its own
(`kernels.node_kernels` prices it, `buffers` holds it). docs/cost.md, "Compute t_C".

Pure: no jax import.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..program.graph import Equation, Program


def copied_operands(program: Program, eqn: Equation) -> tuple[int, ...]:
    """Positions of the operands of ``eqn`` (a contraction) that XLA:CPU copies into another
    layout before running it (`transposed_conv_operands`, `transposed_dot_operands`)."""
    if eqn.primitive == "conv_general_dilated":
        return transposed_conv_operands(program, eqn)
    if eqn.primitive == "dot_general":
        return transposed_dot_operands(program, eqn)
    return ()


def _reordered(program: Program, t: int, order: Sequence[int]) -> bool:
    """Whether reading tensor ``t``'s dims in ``order`` moves data (dims of size 1 aside)."""
    moved = [d for d in order if program.tensors[t].shape[d] != 1]
    return moved != sorted(moved)


def transposed_conv_operands(program: Program, eqn: Equation) -> tuple[int, ...]:
    """Positions of the operands of ``eqn`` (a convolution) that XLA:CPU copies first.

    Its convolution kernel takes the input as (batch, spatial..., feature) and the kernel as
    (spatial..., in, out) in memory; an operand whose dimension numbers order its dims
    otherwise (dims of size 1 aside) is copied into that order. The gradient of a kernel is
    such a convolution of both a forward activation and an output gradient (batch is its
    contracted dim), the gradient of an input one of the kernel (in and out swapped).
    """
    dn = eqn.params["dimension_numbers"]
    lhs, rhs = dn.lhs_spec, dn.rhs_spec
    wanted = ((lhs[0], *lhs[2:], lhs[1]), (*rhs[2:], rhs[1], rhs[0]))
    return tuple(
        pos
        for pos, order in enumerate(wanted)
        if eqn.inputs[pos] is not None and _reordered(program, eqn.inputs[pos], order)
    )


def transposed_dot_operands(program: Program, eqn: Equation) -> tuple[int, ...]:
    """Positions of the operands of ``eqn`` (a dot_general) that XLA:CPU copies first.

    XLA's dot decomposition brings every operand to (batch..., free..., contracted...) (lhs) or
    (batch..., contracted..., free...) (rhs) and merges each group into one dim; its matmul
    reads either order of the two merged dims, so a transpose is folded into the dot where
    the operand needs no merging (at most one free and one contracted dim) and its batch dims
    lead. Otherwise an operand stored in another order (dims of size 1 aside) is copied into
    that order: the weight gradient ``x[B, S, d]ᵀ · dy[B, S, f]`` copies ``x``; attention's
    ``einsum("bqhd,bkhd->bhqk")`` copies both (batch dims b, h do not lead). Read off XLA:CPU's
    compiled programs (``copy_bitcast_fusion`` / ``transpose_copy_fusion`` before the dot).
    """
    (contract, batch) = eqn.params["dimension_numbers"]
    out = []
    for pos in (0, 1):
        t = eqn.inputs[pos]
        if t is None:
            continue
        rank = len(program.tensors[t].shape)
        b, c = tuple(batch[pos]), tuple(contract[pos])
        free = tuple(d for d in range(rank) if d not in b and d not in c)
        if len(free) <= 1 and len(c) <= 1:
            order = (*b, *sorted((*free, *c)))  # the dot reads either order of the two
        else:
            order = (*b, *free, *c) if pos == 0 else (*b, *c, *free)
        if _reordered(program, t, order):
            out.append(pos)
    return tuple(out)
