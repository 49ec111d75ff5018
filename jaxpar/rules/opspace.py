"""Iteration spaces: how a rule describes an equation, and the registry of rules by primitive.

A rule describes an equation the way an einsum would: a list of *iteration dimensions* (with
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

The rules themselves are in `rules` (and `rules_contractions`, `rules_indexing`,
`rules_loops`). Pure (no jax import).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import NamedTuple

from ..program.graph import Equation, Program

DimMap = tuple[int | None, ...]


class BodyCollective(NamedTuple):
    """One collective a shard_map's body runs (the layouts of code partitioned by hand are
    fixed, and so are these)."""

    kind: str  # `collectives.KINDS`
    axes: tuple[str, ...]  # the mesh axes it runs over, by name
    result_bytes: float  # its result on one device (a permute: only the devices that send)
    runs: int  # per run of the shard_map (a scan inside: its length)
    dtype: str  # of its (first) result
    reduce_op: str  # an all-reduce's reduction ("sum", "max", "min"), else ""
    feeds: tuple[int, ...] = ()  # the shard_map's results computed from it (by position)
    # the automatic iteration dims its result carries: their split divides its bytes
    dims: tuple[int, ...] = ()
    # >= 0: the all-reduce completing a reduction over this automatic dim, run over the axes
    # splitting it (``axes`` empty), only when some do (`body_dims.Reduction`)
    split: int = -1


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
    # code partitioned by hand (`rules_manual`): its one configuration, mesh axis name ->
    # iteration dim (axes not named replicate the work)
    manual: tuple[tuple[str, int], ...] = ()
    # a shard_map's body's collectives (`rules_manual.body_communication`)
    communication: tuple[BodyCollective, ...] = ()
    # code partitioned by hand over some mesh axes only: the iteration dims the other
    # (automatic) axes, by name, may split (`body_dims`)
    automatic: tuple[int, ...] = ()
    automatic_axes: tuple[str, ...] = ()
    # with automatic dims: ``flops`` in parts, (the automatic dims that split a part, its
    # FLOPs); the manual dims split every part (`rules_manual.body_flop_parts`)
    flop_parts: tuple[tuple[tuple[int, ...], float], ...] = ()

    @functools.cached_property  # read per configuration while pricing (~0.5 M reads)
    def reduce_dims(self) -> tuple[int, ...]:
        """Iteration dims that no result carries: splitting them leaves partial results."""
        used = {d for m in self.out_maps for d in m if d is not None}
        return tuple(i for i in range(len(self.sizes)) if i not in used)

    @functools.cached_property
    def communicating_dims(self) -> frozenset[int]:
        """Iteration dims whose split makes the equation communicate: reduced dims (partial
        sums) and dims with a halo (a split convolution's exchange)."""
        halo = {d for d, rows in enumerate(self.halo) if rows}
        return frozenset(self.reduce_dims) | halo


Rule = Callable[[Equation, Program], OpSpace]
RULES: dict[str, Rule] = {}


def register_rule(*names: str) -> Callable[[Rule], Rule]:
    """Register a rule for one or more primitive names."""

    def deco(fn: Rule) -> Rule:
        for n in names:
            RULES[n] = fn
        return fn

    return deco


def shape_of(program: Program, tid: int | None) -> tuple[int, ...]:
    return () if tid is None else program.tensors[tid].shape


def out_shape(eqn: Equation, program: Program, i: int = 0) -> tuple[int, ...]:
    return program.tensors[eqn.outputs[i]].shape


def replicated_space(eqn: Equation, program: Program) -> OpSpace:
    """One configuration: every operand and result replicated (the documented fallback)."""
    return OpSpace(
        sizes=(),
        splittable=(),
        names=(),
        in_maps=tuple(
            None if t is None else (None,) * len(shape_of(program, t)) for t in eqn.inputs
        ),
        out_maps=tuple((None,) * len(out_shape(eqn, program, i)) for i in range(len(eqn.outputs))),
        flops=float(sum(program.tensors[t].size for t in eqn.outputs)),
        replicated=True,
    )


def dim_names(n: int) -> tuple[str, ...]:
    return tuple(f"d{i}" for i in range(n))
