"""The library calls a plan's contractions make on one device, and the keys of measured tables.

OptCNN prices a layer under a configuration by running that configuration's per-device work on
a device (its t_C is measured, not modelled). jaxpar does the same for the kernels that vary
most with shape, the library calls: every matrix product and convolution member of a node,
under every configuration of the node, calls its primitive on the per-device shards of its
operands (each operand dim divided by the degree of the iteration dim it maps to, rounded up as
XLA pads). `jaxpar.measure_contractions` times each distinct call on the device at hand, a
calibration file keeps the seconds under `contraction_key`, and `cost.node_work` prices a
kernel whose work is such calls at their measured seconds (`measured_kernel_seconds`).

Pure: numpy only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..nodes.configs import Config, dim_degrees
from ..nodes.planning_nodes import Member, NodeGraph
from ..program.graph import Program

# The primitives a table can price, and the parameters that change their kernels: the call's
# geometry and its output type (precision hints and output shardings do not enter the key).
KEYED_PARAMS = {
    "dot_general": ("dimension_numbers", "preferred_element_type"),
    "conv_general_dilated": (
        "window_strides", "padding", "lhs_dilation", "rhs_dilation", "dimension_numbers",
        "feature_group_count", "batch_group_count", "preferred_element_type",
    ),
}  # fmt: skip
TABLE_PRIMITIVES = tuple(KEYED_PARAMS)


@dataclasses.dataclass(frozen=True)
class ContractionCall:
    """One library call: a contraction primitive on per-device operands of these shapes."""

    primitive: str
    params: Mapping[str, Any]  # the traced equation's parameters (bound as they are to measure)
    shapes: tuple[tuple[int, ...], ...]  # per operand
    dtypes: tuple[str, ...]  # per operand
    flops: float  # FLOPs of the call
    bind: Any = dataclasses.field(default=None, compare=False)  # the jax primitive (`Eqn.bind`)

    @property
    def key(self) -> str:
        return contraction_key(self.primitive, self.params, self.shapes, self.dtypes)


def _plain(value: Any) -> Any:
    """Parameters as plain nested tuples of numbers and names, equal across jax versions
    (a conv's `ConvDimensionNumbers` is a named tuple; dtypes are numpy objects)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (tuple, list)):
        return tuple(_plain(v) for v in value)
    try:
        return str(np.dtype(value))
    except TypeError:
        return str(value)


def contraction_key(
    primitive: str,
    params: Mapping[str, Any],
    shapes: Sequence[Sequence[int]],
    dtypes: Sequence[str],
) -> str:
    """The table key of one call: its primitive, operand dtypes and shapes, and the parameters
    of `KEYED_PARAMS`, e.g. ``dot_general float32[64, 768] float32[768, 3072]
    dimension_numbers=(((1,), (0,)), ((), ())) preferred_element_type='float32'``."""
    operands = [f"{dt}{list(int(n) for n in s)}" for s, dt in zip(shapes, dtypes, strict=True)]
    named = [f"{k}={_plain(params.get(k))!r}" for k in KEYED_PARAMS[primitive]]
    return " ".join([primitive, *operands, *named])


def _is_table_member(program: Program, member: Member) -> bool:
    return member.eqn >= 0 and program.eqns[member.eqn].primitive in KEYED_PARAMS


def member_shard_shapes(
    program: Program, member: Member, degrees: np.ndarray
) -> list[tuple[tuple[int, ...], ...]]:
    """Per configuration (a row of ``degrees``: `dim_degrees`), the per-device shape of each
    operand of ``member``: size / degree of the iteration dim the operand dim maps to, rounded
    up (XLA pads an uneven shard)."""
    eqn = program.eqns[member.eqn]
    out = []
    for row in degrees:
        shapes = []
        for t, mp in zip(eqn.inputs, member.in_maps, strict=True):
            shape = program.tensors[t].shape
            shapes.append(
                tuple(
                    -(-n // int(row[d])) if mp is not None and d is not None else n
                    for n, d in zip(shape, mp or (None,) * len(shape), strict=True)
                )
            )
        out.append(tuple(shapes))
    return out


def member_calls(
    program: Program, member: Member, degrees: np.ndarray, used_shards: np.ndarray
) -> list[ContractionCall]:
    """The call ``member`` makes under each configuration (rows of ``degrees``; FLOPs divided
    by ``used_shards``, the degree of the dims its work is split over)."""
    eqn = program.eqns[member.eqn]
    dtypes = tuple(program.tensors[t].dtype for t in eqn.inputs)
    return [
        ContractionCall(
            eqn.primitive, eqn.params, shapes, dtypes, member.flops / float(shards), eqn.bind
        )
        for shapes, shards in zip(
            member_shard_shapes(program, member, degrees), used_shards, strict=True
        )
    ]


def _used_shards(degrees: np.ndarray, used_dims: frozenset[int]) -> np.ndarray:
    out = np.ones(len(degrees))
    for d in used_dims:
        out = out * degrees[:, d]
    return out


def _distinct_degrees(degrees: np.ndarray, member: Member) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of ``degrees`` as far as ``member``'s calls can tell (the dims its
    operands map to and its work is split over; the others set to 1), and each row's index
    among them: many configurations make the same call."""
    dims = set(member.used_dims)
    for mp in member.in_maps:
        dims.update(d for d in mp or () if d is not None)
    keep = sorted(dims)
    rows, inverse = np.unique(degrees[:, keep], axis=0, return_inverse=True)
    distinct = np.ones((len(rows), degrees.shape[1]), dtype=degrees.dtype)
    distinct[:, keep] = rows
    return distinct, inverse.reshape(-1)


def _calls(program: Program, member: Member, degrees: np.ndarray) -> list[ContractionCall]:
    return member_calls(program, member, degrees, _used_shards(degrees, member.used_dims))


def plan_calls(
    ng: NodeGraph, configs: Sequence[Sequence[Config]], sizes: Sequence[int]
) -> list[ContractionCall]:
    """Every distinct call the contractions of ``ng`` make under any of their nodes'
    configurations, largest first (the table `measure_contractions` fills)."""
    calls: dict[str, ContractionCall] = {}
    for node in ng.nodes:
        members = [m for m in node.members if _is_table_member(ng.program, m)]
        if not members:
            continue
        degrees = dim_degrees(configs[node.index], len(node.space.sizes), sizes)
        for m in members:
            for call in _calls(ng.program, m, _distinct_degrees(degrees, m)[0]):
                calls.setdefault(call.key, call)
    return sorted(calls.values(), key=lambda c: (-c.flops, c.key))


def measured_kernel_seconds(
    program: Program,
    members: Sequence[Member],
    degrees: np.ndarray,
    table: Mapping[str, float],
) -> np.ndarray | None:
    """Per configuration, the measured seconds of a kernel whose work is ``members``' calls
    (NaN where the table lacks one), or None when a member with FLOPs is no table primitive
    (its kernel is priced by the model)."""
    working = [m for m in members if m.flops]
    if not working or not all(_is_table_member(program, m) for m in working):
        return None
    total = np.zeros(len(degrees))
    for m in working:
        distinct, inverse = _distinct_degrees(degrees, m)
        seconds = np.array([table.get(c.key, np.nan) for c in _calls(program, m, distinct)])
        total += seconds[inverse]
    return total
