"""Pricing a node under a configuration: compute t_C and the node's own collectives.

OptCNN Eq. 1 splits a step's time into t_C (per node), t_X (per edge: resharding, `reshard`) and
t_S (gradient synchronization). A node's own price is its compute (the roofline of each member's
per-device shard, `compute_times`) plus the collectives its configuration implies
(`node_collectives`): the all-reduce completing a partial sum when a reduced dim is split (t_S
when it reduces gradients over the batch, else part of t_X), and the halo exchange of a spatially
split convolution. The search's unary tables (`unary_costs`) and the final evaluation
(`evaluate`) both call these two functions, so the two cannot drift.

Pure: numpy only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from .collectives import ALL_REDUCE, PERMUTE, all_reduce_bytes, transfer_time
from .configs import Config, degree, dim_degrees, shard_count, spec_of
from .graph import REGION_PRIMITIVES
from .hardware.calibration import CONV, MATMUL
from .hardware.mesh_model import MeshAxes
from .nodes import Node, NodeGraph
from .rules import DimMap

OBJECTIVES = ("time", "comm")  # OptCNN Eq. 1 seconds, or SoyBean's bytes moved
# primitives priced by a calibration's throughput curves, and the curve kind of each
MEASURED_PRIMITIVES = {"dot_general": MATMUL, "conv_general_dilated": CONV}


@dataclasses.dataclass(frozen=True)
class CostParams:
    """Everything besides the graph that costs depend on."""

    mesh: MeshAxes
    peak_flops: tuple[tuple[str, float], ...]  # dtype name -> FLOP/s of one device
    mem_bandwidth: float  # bytes/s of one device's memory
    objective: str = "time"  # one of OBJECTIVES

    def flops_rate(self, dtype: str) -> float:
        table = dict(self.peak_flops)
        return table.get(dtype, table.get("float32", next(iter(table.values()))))

    def flops_rates(self, dtype: str, primitive: str, flops: np.ndarray) -> np.ndarray | float:
        """FLOP/s of one device running `flops` FLOPs of `primitive` (vectorized over `flops`).

        On a calibrated mesh (`MeshAxes.calibration`) matrix products and convolutions run at
        the measured curve's achieved rate for their size (`ThroughputCurve.rate`); everything
        else, and every op on an uncalibrated mesh, at the peak `flops_rate(dtype)`.
        """
        kind = MEASURED_PRIMITIVES.get(primitive)
        if self.mesh.calibration is None or kind is None:
            return self.flops_rate(dtype)
        return self.mesh.calibration.curve(kind, dtype).rate(flops)


def roofline_time(flops: float, nbytes: float, peak_flops: float, mem_bandwidth: float) -> float:
    """t_C of a per-device shard: max(FLOPs / peak, bytes / memory bandwidth)."""
    return max(flops / peak_flops, nbytes / mem_bandwidth)


def compute_times(
    ng: NodeGraph, node: Node, cfgs: Sequence[Config], params: CostParams
) -> np.ndarray:
    """t_C of every configuration: Σ over members of `roofline_time` of the per-device shard,
    FLOPs / degree of the member's split dims and bytes of its operands and results / their
    shard counts (vectorized over configurations). The FLOP rate is the peak, or on a
    calibrated mesh the measured rate at the shard's size (`CostParams.flops_rates`)."""
    D = dim_degrees(cfgs, len(node.space.sizes), params.mesh.sizes)
    total = np.zeros(len(cfgs))
    tensors = ng.program.tensors

    def shards(mp: DimMap) -> np.ndarray:
        out = np.ones(len(cfgs))
        for m in mp:
            if m is not None:
                out = out * D[:, m]
        return out

    for m in node.members:
        if m.eqn < 0 or ng.program.eqns[m.eqn].primitive in REGION_PRIMITIVES:
            continue  # a scan's carry, slice and stack move no data of their own
        eqn = ng.program.eqns[m.eqn]
        deg = np.ones(len(cfgs))
        for d in m.used_dims:
            deg = deg * D[:, d]
        nbytes = np.zeros(len(cfgs))
        for t, mp in zip(eqn.inputs, m.in_maps, strict=True):
            if t is not None and mp is not None:
                nbytes += tensors[t].nbytes / shards(mp)
        for t, mp in zip(eqn.outputs, m.out_maps, strict=True):
            nbytes += tensors[t].nbytes / shards(mp)
        flops = m.flops / deg
        rate = params.flops_rates(tensors[eqn.outputs[0]].dtype, eqn.primitive, flops)
        total += np.maximum(flops / rate, nbytes / params.mem_bandwidth)
    return total


@dataclasses.dataclass(frozen=True)
class NodeCollective:
    """A collective a node's configuration implies (not a reshard between nodes)."""

    kind: str  # ALL_REDUCE (partial sum) or PERMUTE (halo)
    axes: tuple[int, ...]  # mesh axes of its groups
    group_size: int
    nbytes: float  # bytes sent per device
    time_s: float
    tensor: int | None  # the reduced result; None for a halo exchange


def _halo_bytes(node: Node, cfg: Config, ng: NodeGraph, sizes: Sequence[int]) -> float:
    """Bytes each device exchanges for the halos of a spatially split convolution:
    Σ over split spatial dims of shard_bytes · halo / (dim size / degree)."""
    sp = node.space
    eqn = ng.program.eqns[node.anchor]
    lhs = ng.program.tensors[eqn.inputs[0]]
    in_dims = frozenset(d for d in sp.in_maps[0] if d is not None)
    shard = lhs.nbytes / max(1, degree(cfg, in_dims, sizes))
    total = 0.0
    for d, h in enumerate(sp.halo):
        deg = degree(cfg, frozenset([d]), sizes)
        if h and deg > 1:
            total += shard * h / (sp.sizes[d] / deg)
    return total


def node_collectives(
    ng: NodeGraph, node: Node, cfg: Config, mesh: MeshAxes
) -> tuple[NodeCollective, ...]:
    """The collectives of ``node`` under ``cfg``, each with its bytes and α-β time.

    - Partial sums (AccPar Type-II; the weight gradient's batch contraction is gradient
      synchronization): when axes A split a reduced dim, each result of the anchor is
      all-reduced over A: buffer S = result bytes / its shard count, 2(n-1)/n · S bytes sent.
    - Halo exchange of a spatially split convolution: one collective-permute over the split
      spatial axes (`_halo_bytes`).
    """
    if node.anchor < 0:
        return ()
    out = []
    red_dims = set(node.space.reduce_dims)
    axes = tuple(a for a, d in enumerate(cfg) if d in red_dims)
    if axes:
        n, bw, lat = mesh.group(axes)
        eqn = ng.program.eqns[node.anchor]
        for t, m in zip(eqn.outputs, node.space.out_maps, strict=True):
            buf = ng.program.tensors[t].nbytes / shard_count(spec_of(m, cfg), mesh.sizes)
            nbytes = all_reduce_bytes(buf, n)
            out.append(
                NodeCollective(
                    ALL_REDUCE, axes, n, nbytes, transfer_time(ALL_REDUCE, nbytes, n, bw, lat), t
                )
            )
    halo = node.space.halo
    if halo and any(d >= 0 and halo[d] for d in cfg):
        hb = _halo_bytes(node, cfg, ng, mesh.sizes)
        if hb:
            h_axes = tuple(a for a, d in enumerate(cfg) if d >= 0 and halo[d])
            n, bw, lat = mesh.group(h_axes)
            out.append(
                NodeCollective(PERMUTE, h_axes, n, hb, transfer_time(PERMUTE, hb, n, bw, lat), None)
            )
    return tuple(out)


def node_price(compute_s: float, colls: Sequence[NodeCollective], objective: str) -> float:
    """A node's term of the objective: t_C + Σ collective times ("time"), or Σ bytes ("comm")."""
    if objective == "comm":
        return sum(c.nbytes for c in colls)
    return compute_s + sum(c.time_s for c in colls)


def may_communicate(node: Node, cfg: Config) -> bool:
    """Cheap test: can `node_collectives` be non-empty (a reduced or halo dim is split)?"""
    if node.anchor < 0:
        return False
    red = node.space.reduce_dims
    halo = node.space.halo
    return any(d in red for d in cfg) or bool(halo and any(d >= 0 and halo[d] for d in cfg))


def unary_costs(
    ng: NodeGraph, node: Node, cfgs: Sequence[Config], params: CostParams, compute: np.ndarray
) -> np.ndarray:
    """The search's unary table: `node_price` of every configuration (``compute``: its t_C)."""
    out = np.zeros(len(cfgs)) if params.objective == "comm" else np.array(compute, dtype=float)
    for i, cfg in enumerate(cfgs):
        if may_communicate(node, cfg):
            colls = node_collectives(ng, node, cfg, params.mesh)
            out[i] = node_price(float(compute[i]), colls, params.objective)
    return out


def node_dtype(ng: NodeGraph, node: Node) -> str:
    """The dtype a node computes in (its anchor's first result), for its FLOP rate."""
    if node.anchor < 0:
        return "float32"
    return ng.program.tensors[ng.program.eqns[node.anchor].outputs[0]].dtype
