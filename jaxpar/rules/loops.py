"""Rules of the equations a planned region adds around its bodies (`graph.Region`).

- ``scan_carry``: the carry an iteration reads follows its initial value dim by dim.
- ``scan_slice``: an iteration's slice of a stacked ``xs`` follows the stack's dims after the
  leading (iteration) one, which stays whole: each device holds every iteration's shard.
- ``scan_stack``: the stacked ``ys`` follow an iteration's ``y``, the leading dim whole.
- ``cond_merge``: a cond's result, and that result of every branch, in one layout.

They move no data of their own (XLA indexes the stacks in place): zero FLOPs. Also here:
``empty`` / ``empty2``, the uninitialized buffers jax puts in a cond branch for residuals the
other branch makes (no operands: any split).

Pure (no jax import).
"""

from __future__ import annotations

from ..program.graph import COND_MERGE, SCAN_CARRY, SCAN_SLICE, SCAN_STACK, Equation, Program
from .opspace import OpSpace, dim_names, out_shape, register_rule


def _follow(shape: tuple[int, ...], in_map: tuple, out_map: tuple) -> OpSpace:
    n = len(shape)
    return OpSpace(shape, (True,) * n, dim_names(n), (in_map,), (out_map,), 0.0)


@register_rule(SCAN_CARRY)
def carry_rule(eqn: Equation, program: Program) -> OpSpace:
    shape = out_shape(eqn, program)
    ident = tuple(range(len(shape)))
    return _follow(shape, None if eqn.inputs[0] is None else ident, ident)


@register_rule(SCAN_SLICE)
def slice_rule(eqn: Equation, program: Program) -> OpSpace:
    shape = out_shape(eqn, program)
    ident = tuple(range(len(shape)))
    return _follow(shape, (None, *ident), ident)


@register_rule(SCAN_STACK)
def stack_rule(eqn: Equation, program: Program) -> OpSpace:
    shape = out_shape(eqn, program)[1:]
    ident = tuple(range(len(shape)))
    return _follow(shape, None if eqn.inputs[0] is None else ident, (None, *ident))


@register_rule(COND_MERGE)
def merge_rule(eqn: Equation, program: Program) -> OpSpace:
    shape = out_shape(eqn, program)
    ident = tuple(range(len(shape)))
    n = len(shape)
    in_maps = tuple(None if t is None else ident for t in eqn.inputs)
    return OpSpace(shape, (True,) * n, dim_names(n), in_maps, (ident,), 0.0)


@register_rule("empty", "empty2")
def empty_rule(eqn: Equation, program: Program) -> OpSpace:
    shape = out_shape(eqn, program)
    n = len(shape)
    return OpSpace(shape, (True,) * n, dim_names(n), (), (tuple(range(n)),), 0.0)
