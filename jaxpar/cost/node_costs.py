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
import math
from collections.abc import Sequence

import numpy as np

from ..hardware.collectives import (
    ALL_REDUCE,
    PERMUTE,
    all_reduce_bytes,
    result_bytes_sent,
    transfer_time,
)
from ..hardware.mesh_model import MeshAxes
from ..nodes.configs import Config, degree, dim_degrees, shard_count, spec_of
from ..nodes.planning_nodes import Node, NodeGraph
from ..program.graph import BACKWARD
from ..rules.contractions import conv_taps_fraction
from ..rules.opspace import BodyCollective
from ..rules.table import DimMap
from ..xla.fusion import ACCELERATOR_FUSION, FusionRules
from .contraction_calls import TABLE_PRIMITIVES, contraction_key, measured_kernel_seconds
from .kernels import MEASURED_PRIMITIVES, node_kernels

OBJECTIVES = ("time", "comm", "overlap")  # Eq. 1 s, SoyBean bytes, two-stream step s


@dataclasses.dataclass(frozen=True)
class CostParams:
    """Everything besides the graph that costs depend on."""

    mesh: MeshAxes
    peak_flops: tuple[tuple[str, float], ...]  # dtype name -> FLOP/s of one device
    mem_bandwidth: float  # bytes/s of one device's memory
    objective: str = "time"  # one of OBJECTIVES
    fusion: FusionRules = ACCELERATOR_FUSION  # how the target's XLA fuses (`fusion_for`)

    @property
    def kernel_overhead(self) -> float:
        """Seconds every kernel costs beyond its roofline time (launch, ramp-up, tail): the
        slowest device's (`mesh_model.kernel_costs`; measured on a calibrated mesh)."""
        return self.mesh.kernel_overhead

    @property
    def half_rate_time(self) -> float:
        """Saturation of an uncalibrated contraction (`saturated_rate`): f_half = peak ·
        half_rate_time, the FLOPs at which it runs at half its peak (0: always the peak)."""
        return self.mesh.half_rate_time

    @property
    def contraction_table(self) -> dict[str, float]:
        """Measured seconds of library calls on a calibrated mesh (`Calibration.contractions`;
        empty when none were measured)."""
        calibration = self.mesh.calibration
        return calibration.contraction_table if calibration is not None else {}

    def flops_rate(self, dtype: str) -> float:
        table = dict(self.peak_flops)
        return table.get(dtype, table.get("float32", next(iter(table.values()))))

    def flops_rates(self, dtype: str, primitive: str, flops: np.ndarray) -> np.ndarray | float:
        """FLOP/s of one device running `flops` FLOPs of `primitive` (vectorized over `flops`).

        Matrix products and convolutions run at the measured curve's achieved rate for their
        size on a calibrated mesh (`MeshAxes.calibration`, `ThroughputCurve.rate`), else at the
        peak saturated by size (`saturated_rate`); every other primitive at the peak
        `flops_rate(dtype)` (elementwise work is bound by memory, not by FLOPs).
        """
        kind = MEASURED_PRIMITIVES.get(primitive)
        if kind is None:
            return self.flops_rate(dtype)
        if self.mesh.calibration is not None:
            return self.mesh.calibration.curve(kind, dtype).rate(flops)
        peak = self.flops_rate(dtype)
        return saturated_rate(flops, peak, peak * self.half_rate_time)


def saturated_rate(flops: np.ndarray | float, peak: float, half_flops: float) -> np.ndarray:
    """FLOP/s of a kernel of `flops` FLOPs: peak · f / (f + f_half).

    Small kernels do not fill the device (too few tiles for its cores): the rate rises with
    the FLOPs per call and reaches half the peak at f_half. Equivalently the time is
    (f + f_half) / peak: splitting a kernel n ways divides f but not f_half, so splitting a
    small op further is not free. f_half = 0 gives the peak.
    """
    f = np.maximum(np.asarray(flops, dtype=float), 1e-30)
    return peak * f / (f + half_flops)


def roofline_time(flops: float, nbytes: float, peak_flops: float, mem_bandwidth: float) -> float:
    """t_C of a per-device shard: max(FLOPs / peak, bytes / memory bandwidth)."""
    return max(flops / peak_flops, nbytes / mem_bandwidth)


def kernel_time(
    flop_time: np.ndarray, nbytes: np.ndarray, mem_bandwidth: float, overhead: float
) -> np.ndarray:
    """Seconds of one kernel: overhead + max(FLOP time, bytes / memory bandwidth)."""
    return overhead + np.maximum(flop_time, nbytes / mem_bandwidth)


@dataclasses.dataclass(frozen=True)
class NodeWork:
    """Per configuration, what one run of a node does on one device (vectorized)."""

    flops: np.ndarray  # FLOPs of every member's shard
    nbytes: np.ndarray  # memory traffic of its kernels (`node_kernels`)
    seconds: np.ndarray  # t_C: Σ over kernels of `kernel_time`
    kernels: int  # kernels per run
    kernel_seconds: tuple[np.ndarray, ...] = ()  # t_k per kernel of `node_kernels`, in order


def node_work(
    ng: NodeGraph,
    node: Node,
    cfgs: Sequence[Config],
    params: CostParams,
    memo: dict | None = None,
) -> NodeWork:
    """FLOPs, bytes and t_C of one run of ``node`` per device, for every configuration.

    Per kernel k of `node_kernels` (shards(t): the product of the degrees of the iteration dims
    tensor t's dims map to; deg_m: of the dims member m uses)::

        bytes_k = Σ_{s read by k for operand t} min(nbytes(s), itemsize(s) · size(t) / shards(t))
                + Σ_{t written by k} nbytes(t) / shards(t)
                  (each term at most itemsize · size(b) / shards(b) where `Kernel.partial`
                   bounds the tensor by b: a gather's result, a scatter's update)
                + Σ_{(t, c) in `Kernel.extra`} c · nbytes(t) / shards(t)
        f_m     = flops_m · taps_m / deg_m            (taps: `conv_taps_fraction`, 1 but for convs)
                  (a shard_map with automatic dims: Σ over `OpSpace.flop_parts` (dims P, F)
                   of F / deg(manual dims ∪ P))
        t_k     = overhead + max( Σ_{m ∈ k} f_m / rate_m(f_m) , bytes_k / mem_bandwidth )
        t_C     = Σ_k t_k

    except that a kernel whose work is library calls the calibration measured (OptCNN's
    measured t_C; `contraction_calls.measured_kernel_seconds`) takes t_k = Σ of their measured
    seconds (their kernels' device time, ramp-up and tail included) under the configurations
    whose calls were all measured: no overhead is added, as a call long enough to be worth
    measuring is launched while the kernel before it runs (on the H100 the train steps of
    `bench/fidelity/results/layer_compute.md` leave 0-1 µs between kernels,
    against the 4 µs a chain of
    tiny kernels costs).

    rate_m: `CostParams.flops_rates` (a contraction's calibrated curve, or its peak saturated at
    f_m; the peak for everything else); overhead: `CostParams.kernel_overhead`. A kernel that
    writes nothing (`Kernel.runs` false) has bytes_k = 0 and no overhead: its FLOPs run inside
    its readers' kernels.

    ``memo`` (a dict kept by the caller for one set of ``params``) shares the answer between
    nodes whose kernels agree on everything priced here (`_priced_kernels`): a layer's copies.
    """
    kernels = node_kernels(ng, node, params.fusion)
    key = None
    if memo is not None:
        key = ("work", tuple(cfgs), len(node.space.sizes), _priced_kernels(ng, node, kernels))
        if key in memo:
            return memo[key]
    work = _node_work(ng, node, cfgs, params, kernels)
    if key is not None:
        for array in (work.flops, work.nbytes, work.seconds, *work.kernel_seconds):
            array.flags.writeable = False  # shared between nodes
        memo[key] = work
    return work


def _priced_kernels(ng: NodeGraph, node: Node, kernels: Sequence) -> tuple:
    """What `_node_work` reads of ``kernels``, with tensors named by their sizes: equal for
    two nodes exactly when their works are equal."""
    program = ng.program
    tensors = program.tensors
    out = []
    for kernel in kernels:
        bound = {t: (tensors[b].size, mp) for t, b, mp in kernel.partial}
        members = []
        for i in kernel.members:
            m = node.members[i]
            if m.flops:
                eqn = program.eqns[m.eqn]
                members.append(
                    (m.flops, tuple(m.used_dims), eqn.primitive, tensors[eqn.outputs[0]].dtype,
                     conv_taps_fraction(program, eqn), _call_geometry(program, m),
                     node.space.flop_parts if m.eqn == node.anchor else ())
                )  # fmt: skip
        out.append(
            (
                kernel.runs,
                tuple(
                    (tensors[s].nbytes, tensors[s].itemsize, tensors[t].size, mp, bound.get(s))
                    for s, t, mp in kernel.reads
                ),
                tuple(
                    (tensors[t].nbytes, tensors[t].itemsize, mp, bound.get(t))
                    for t, mp in kernel.writes
                ),
                tuple((tensors[t].nbytes, mp, f) for t, mp, f in kernel.extra),
                tuple(members),
            )
        )
    return tuple(out)


def _call_geometry(program, member) -> tuple | None:
    """What a measured table keys a contraction member's calls by beyond its FLOPs (operand
    shapes and maps, parameters); None for other members."""
    eqn = program.eqns[member.eqn]
    if eqn.primitive not in TABLE_PRIMITIVES:
        return None
    operands = [program.tensors[t] for t in eqn.inputs]
    key = contraction_key(
        eqn.primitive, eqn.params, [t.shape for t in operands], [t.dtype for t in operands]
    )
    return key, member.in_maps


def _node_work(
    ng: NodeGraph, node: Node, cfgs: Sequence[Config], params: CostParams, kernels: Sequence
) -> NodeWork:
    n = len(cfgs)
    D = dim_degrees(cfgs, len(node.space.sizes), params.mesh.sizes)
    program = ng.program
    tensors = program.tensors

    def shards(mp: DimMap) -> np.ndarray:
        return map_shards(D, mp)

    flops, nbytes, seconds = np.zeros(n), np.zeros(n), np.zeros(n)
    table = params.contraction_table
    per_kernel = []
    for kernel in kernels:
        k_bytes = np.zeros(n)
        bound = {t: (b, mp) for t, b, mp in kernel.partial}

        def part(t: int, full: np.ndarray, bound: dict = bound) -> np.ndarray:
            """At most the bound's shard of ``t`` (`Kernel.partial`)."""
            if t not in bound:
                return full
            b, mp = bound[t]
            return np.minimum(full, tensors[t].itemsize * tensors[b].size / shards(mp))

        for s, t, mp in kernel.reads:  # s read for operand t: t's shard of s, at most all of s
            shard_elements = tensors[t].size / shards(mp)
            k_bytes += part(s, np.minimum(tensors[s].nbytes, tensors[s].itemsize * shard_elements))
        for t, mp in kernel.writes:
            k_bytes += part(t, tensors[t].nbytes / shards(mp))
        for t, mp, factor in kernel.extra:
            k_bytes += factor * tensors[t].nbytes / shards(mp)
        k_time = np.zeros(n)
        for i in kernel.members:
            m = node.members[i]
            eqn = program.eqns[m.eqn]
            if not m.flops:
                continue
            if node.space.flop_parts and m.eqn == node.anchor:  # a shard_map's, in parts
                manual = tuple(range(node.space.automatic[0]))
                f = sum(pf / shards(manual + dims) for dims, pf in node.space.flop_parts)
            else:
                f = m.flops * conv_taps_fraction(program, eqn) / shards(tuple(m.used_dims))
            rate = params.flops_rates(tensors[eqn.outputs[0]].dtype, eqn.primitive, f)
            k_time += f / rate
            flops += f
        nbytes += k_bytes
        overhead = params.kernel_overhead if kernel.runs else 0.0
        k_seconds = kernel_time(k_time, k_bytes, params.mem_bandwidth, overhead)
        if table:
            members = [node.members[i] for i in kernel.members]
            measured = measured_kernel_seconds(program, members, D, table)
            if measured is not None:
                k_seconds = np.where(np.isnan(measured), k_seconds, measured)
        per_kernel.append(k_seconds)
        seconds += per_kernel[-1]
    return NodeWork(flops, nbytes, seconds, sum(k.runs for k in kernels), tuple(per_kernel))


def map_shards(D: np.ndarray, mp: DimMap) -> np.ndarray:
    """Per configuration (rows of `dim_degrees` ``D``), the shards of a tensor whose dims map
    to iteration dims ``mp``: the product of their degrees."""
    out = np.ones(len(D))
    for d in mp:
        if d is not None:
            out = out * D[:, d]
    return out


def host_moves(ng: NodeGraph, node: Node) -> list[tuple[int, bool]]:
    """(member position, whether it moves to the host) of the node's moves between device
    and host memory (``device_put``: `trace` keeps only moves between memory spaces)."""
    program = ng.program
    out = []
    for i, m in enumerate(node.members):
        if m.eqn >= 0 and program.eqns[m.eqn].primitive == "device_put":
            out.append((i, program.tensors[program.eqns[m.eqn].outputs[0]].host))
    return out


def host_move_bytes(
    ng: NodeGraph, node: Node, cfgs: Sequence[Config], mesh: MeshAxes
) -> np.ndarray | None:
    """Per configuration, the bytes one run of the node's moves between device and host memory
    copies per device, or None when it makes none: Σ_{moves m} nbytes(result_m) / shards(m)
    (each device copies its own shard)."""
    moves = host_moves(ng, node)
    if not moves:
        return None
    D = dim_degrees(cfgs, len(node.space.sizes), mesh.sizes)
    out = np.zeros(len(cfgs))
    for i, _ in moves:
        m = node.members[i]
        out += ng.program.tensors[ng.program.eqns[m.eqn].outputs[0]].nbytes / map_shards(
            D, m.out_maps[0]
        )
    return out


def host_move_seconds(
    ng: NodeGraph, node: Node, cfgs: Sequence[Config], params: CostParams
) -> np.ndarray | None:
    """Per configuration, t_H: seconds of one run of the node's moves between device and host
    memory on the device's link to its host, or None when it makes none::

        t_H = `host_move_bytes` / host_bandwidth

    Each device copies its own shard over its own link (a PCIe x16 per GPU), on a copy engine
    beside its compute (`step_timeline`). A host link of unknown speed (0: TPUs; XLA:CPU,
    where host and device memory are one and the moves are the identity) prices them at 0."""
    nbytes = host_move_bytes(ng, node, cfgs, params.mesh)
    if nbytes is None or not params.mesh.host_bandwidth:
        return None if nbytes is None else np.zeros(len(cfgs))
    return nbytes / params.mesh.host_bandwidth


def compute_times(
    ng: NodeGraph, node: Node, cfgs: Sequence[Config], params: CostParams, memo: dict | None = None
) -> np.ndarray:
    """t_C of every configuration (one run of the node): `node_work`'s seconds, Σ over the
    node's fused kernels of overhead + max(FLOP time, bytes / memory bandwidth)."""
    return node_work(ng, node, cfgs, params, memo).seconds


def plan_work(
    ng: NodeGraph,
    configs: Sequence[Sequence[Config]],
    assignment: Sequence[int],
    params: CostParams,
    *,
    loops: bool = True,
) -> dict[str, float]:
    """Predicted FLOPs, memory bytes, kernels and t_C per device per step of an assignment:
    Σ over nodes of `node_work` under its configuration × `Program.trips(node.region)`
    (``loops=False``: each loop body once, as XLA's ``cost_analysis`` counts a while body)."""
    total = {"flops": 0.0, "bytes": 0.0, "kernels": 0.0, "seconds": 0.0}
    for node in ng.nodes:
        cfg = configs[node.index][assignment[node.index]]
        work = node_work(ng, node, [cfg], params)
        runs = ng.program.trips(node.region) if loops else 1
        total["flops"] += float(work.flops[0]) * runs
        total["bytes"] += float(work.nbytes[0]) * runs
        total["kernels"] += work.kernels * runs
        total["seconds"] += float(work.seconds[0]) * runs
    return total


@dataclasses.dataclass(frozen=True)
class NodeCollective:
    """A collective a node's configuration implies (not a reshard between nodes)."""

    kind: str  # ALL_REDUCE (partial sum) or PERMUTE (halo)
    axes: tuple[int, ...]  # mesh axes of its groups
    group_size: int
    nbytes: float  # bytes sent per device
    time_s: float
    tensor: int | None  # the reduced result; None for a halo exchange and a shard_map's own
    body: BodyCollective | None = None  # a shard_map's own: the collective of its body


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
    - Code partitioned by hand (a shard_map): its body's collectives, of bytes its automatic
      axes divide, and the all-reduces of the reductions they split (`_body_collectives`).
    """
    if node.anchor < 0:
        return ()
    if node.space.manual:
        return _body_collectives(node, cfg, mesh)
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


def _body_collectives(node: Node, cfg: Config, mesh: MeshAxes) -> tuple[NodeCollective, ...]:
    """A shard_map body's collectives (`OpSpace.communication`): per collective of result R
    bytes on one device over axes A (n devices), run r times per run of the node,
    ``bytes = r · collectives.result_bytes_sent(kind, n, R / s)`` and
    ``time = r · transfer_time`` of one run, where s is the product of the automatic axes
    ``cfg`` puts on the dims its result carries (`BodyCollective.dims`); ``tensor`` None (a
    value of the body). A reduction's all-reduce (`BodyCollective.split`) runs over the axes
    splitting its dim, when some do."""
    out = []
    for c in node.space.communication:
        if c.split >= 0:
            axes = tuple(a for a, d in enumerate(cfg) if d == c.split)
            if not axes:
                continue
        else:  # a size-1 axis (not planned on, `MeshAxes.trivial`) moves nothing
            axes = tuple(sorted(mesh.names.index(a) for a in c.axes if a in mesh.names))
            if not axes:
                continue
        shards = math.prod(mesh.sizes[a] for a, d in enumerate(cfg) if d >= 0 and d in c.dims)
        n, bw, lat = mesh.group(axes)
        sent = result_bytes_sent(c.kind, n, c.result_bytes / shards)
        time = transfer_time(c.kind, sent, n, bw, lat)
        out.append(NodeCollective(c.kind, axes, n, sent * c.runs, time * c.runs, None, c))
    return tuple(out)


def is_grad_sync(node: Node, cfg: Config, batch: set[int]) -> bool:
    """A backward node whose split reduced dim carries the batch reduces gradients (t_S)."""
    if node.space.manual:  # a shard_map's own collectives are its body's
        return False
    red = set(node.space.reduce_dims)
    return node.phase == BACKWARD and any(d in red and d in batch for d in cfg if d >= 0)


def node_price(
    compute_s: float, colls: Sequence[NodeCollective], objective: str, host_s: float = 0.0
) -> float:
    """A node's term of the objective: t_C + t_H + Σ collective times ("time"; t_H: its moves
    to and from host memory), or Σ bytes ("comm")."""
    if objective == "comm":
        return sum(c.nbytes for c in colls)
    return compute_s + host_s + sum(c.time_s for c in colls)


def may_communicate(node: Node, cfg: Config) -> bool:
    """Cheap test: can `node_collectives` be non-empty (a reduced or halo dim is split, or a
    shard_map's body communicates)?"""
    if node.anchor < 0:
        return False
    if node.space.manual:
        return bool(node.space.communication)
    talk = node.space.communicating_dims
    return any(d in talk for d in cfg)


def unary_costs(
    ng: NodeGraph,
    node: Node,
    cfgs: Sequence[Config],
    params: CostParams,
    compute: np.ndarray,
    memo: dict | None = None,
    host: np.ndarray | None = None,
) -> np.ndarray:
    """The search's unary table: `node_price` of every configuration (``compute``: its t_C;
    ``host``: its t_H, `host_move_seconds`), i.e. t_C + t_H + `own_comm_costs` (only the
    latter under the "comm" objective)."""
    comm = own_comm_costs(ng, node, cfgs, params, memo)
    if params.objective == "comm":
        return comm
    out = np.asarray(compute, dtype=float) + comm
    return out if host is None else out + host


def own_comm_costs(
    ng: NodeGraph, node: Node, cfgs: Sequence[Config], params: CostParams, memo: dict | None
) -> np.ndarray:
    """Per configuration, Σ over the node's own collectives (`node_collectives`) of their time
    (bytes under the "comm" objective).

    ``memo`` (a dict kept by the caller for one mesh and objective) shares the answer between
    nodes that agree on everything `node_collectives` reads: the iteration space's result maps
    and reduced dims, the results' bytes and the configurations (a layer's copies, the many
    alike elementwise nodes). Nodes with a halo (split convolutions) are priced each."""
    key = None
    if memo is not None and not node.space.halo and node.anchor >= 0:
        outputs = ng.program.eqns[node.anchor].outputs
        nbytes = tuple(ng.program.tensors[t].nbytes for t in outputs)
        space = node.space
        key = (space.out_maps, space.reduce_dims, space.communication, nbytes, tuple(cfgs))
        if key in memo:
            return memo[key]
    out = np.zeros(len(cfgs))
    comm = params.objective == "comm"
    for i, cfg in enumerate(cfgs):
        if may_communicate(node, cfg):
            colls = node_collectives(ng, node, cfg, params.mesh)
            out[i] = sum(c.nbytes if comm else c.time_s for c in colls)
    if key is not None:
        out.flags.writeable = False  # shared between nodes
        memo[key] = out
    return out


def node_dtype(ng: NodeGraph, node: Node) -> str:
    """The dtype a node computes in (its anchor's first result), for its FLOP rate."""
    if node.anchor < 0:
        return "float32"
    return ng.program.tensors[ng.program.eqns[node.anchor].outputs[0]].dtype
