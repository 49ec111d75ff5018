"""The cost model: configurations, collectives, compute, and the tables the search minimizes.

Specs are tuples (one entry per tensor dim) of tuples of mesh-axis indices, in mesh order — a
PartitionSpec over axis indices. A configuration assigns each mesh axis an iteration dim of the
node's space, or -1 (the axis replicates).

Costs follow OptCNN Eq. 1: per node t_C (roofline of the per-device shard) plus intra-op partial
sum reductions (t_S when they reduce gradients over the batch), per edge t_X (resharding between
the producer's layout and the layout the consumer reads). Collectives are α-β over the slowest link
their device groups span; bytes use the ring accounting of DESIGN.md (bytes sent per device).

Pure: numpy only.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Sequence

import numpy as np

from .merge import Node, NodeGraph
from .rules import DimMap, OpSpace

Spec = tuple[tuple[int, ...], ...]
Config = tuple[int, ...]

ALL_REDUCE = "all-reduce"
ALL_GATHER = "all-gather"
ALL_TO_ALL = "all-to-all"
REDUCE_SCATTER = "reduce-scatter"
PERMUTE = "collective-permute"


# ---------------------------------------------------------------- collective formulas (ring)


def all_reduce_bytes(buffer_bytes: float, n: int) -> float:
    """Bytes sent per device by a ring all-reduce of an S-byte buffer: 2(n-1)/n · S."""
    return 2.0 * (n - 1) / n * buffer_bytes if n > 1 else 0.0


def all_gather_bytes(out_bytes: float, n: int) -> float:
    """Bytes sent per device by a ring all-gather producing S_out bytes: (n-1)/n · S_out."""
    return (n - 1) / n * out_bytes if n > 1 else 0.0


def reduce_scatter_bytes(in_bytes: float, n: int) -> float:
    """Bytes sent per device by a ring reduce-scatter of an S_in-byte input: (n-1)/n · S_in."""
    return (n - 1) / n * in_bytes if n > 1 else 0.0


def all_to_all_bytes(buffer_bytes: float, n: int) -> float:
    """Bytes sent per device by an all-to-all of an S-byte buffer: (n-1)/n · S."""
    return (n - 1) / n * buffer_bytes if n > 1 else 0.0


def ring_steps(kind: str, n: int) -> int:
    """Message steps of the ring algorithm (for the latency term)."""
    if n <= 1:
        return 0
    return 2 * (n - 1) if kind == ALL_REDUCE else (1 if kind == PERMUTE else n - 1)


def transfer_time(kind: str, nbytes: float, n: int, bandwidth: float, latency: float) -> float:
    """α-β time of one collective: latency · steps + bytes / bandwidth."""
    if nbytes <= 0:
        return 0.0
    return latency * ring_steps(kind, n) + nbytes / bandwidth


def roofline_time(flops: float, nbytes: float, peak_flops: float, mem_bandwidth: float) -> float:
    """t_C of a per-device shard: max(FLOPs / peak, bytes / memory bandwidth)."""
    return max(flops / peak_flops, nbytes / mem_bandwidth)


# ---------------------------------------------------------------- mesh and model parameters


@dataclasses.dataclass(frozen=True)
class MeshAxes:
    """The mesh as the cost model sees it, with the link each axis's groups cross."""

    names: tuple[str, ...]  # axis names, mesh order
    sizes: tuple[int, ...]  # axis sizes
    bandwidth: tuple[float, ...]  # bytes/s per device of the slowest link each axis spans
    latency: tuple[float, ...]  # seconds per message step on that link
    link_names: tuple[str, ...]  # name of that link level (for reports)
    # (axes, bytes/s) for collectives over several axes at once, axes sorted. One ring over
    # the merged group crosses a shared port fewer times than the per-axis rings do (a
    # 16-device ring on 4 P100 nodes gets the whole InfiniBand card; 4 node-axis rings share
    # it), so it is not the per-axis minimum. Missing entries fall back to that minimum.
    group_bandwidth: tuple[tuple[tuple[int, ...], float], ...] = ()

    @property
    def num_devices(self) -> int:
        return math.prod(self.sizes)

    def group(self, axes: Sequence[int]) -> tuple[int, float, float]:
        """(group size, bandwidth, latency) of a collective over several axes."""
        n = math.prod(self.sizes[a] for a in axes)
        key = tuple(sorted(axes))
        bw = dict(self.group_bandwidth).get(key) if len(key) > 1 else None
        if bw is None:
            bw = min((self.bandwidth[a] for a in axes), default=math.inf)
        lat = max((self.latency[a] for a in axes), default=0.0)
        return n, bw, lat


@dataclasses.dataclass(frozen=True)
class CostParams:
    """Everything besides the graph that costs depend on."""

    mesh: MeshAxes
    peak_flops: tuple[tuple[str, float], ...]  # dtype name -> FLOP/s of one device
    mem_bandwidth: float  # bytes/s of one device's memory
    objective: str = "time"  # "time" (OptCNN Eq. 1) or "comm" (SoyBean: bytes moved)

    def flops_rate(self, dtype: str) -> float:
        table = dict(self.peak_flops)
        return table.get(dtype, table.get("float32", next(iter(table.values()))))


# ---------------------------------------------------------------- configurations and specs


def enumerate_configs(space: OpSpace, sizes: Sequence[int], tensor_sizes) -> list[Config]:
    """All assignments of mesh axes to splittable iteration dims that divide every tensor dim.

    ``tensor_sizes``: (tensor dim size, iteration dim) pairs of every tensor the node touches; a
    configuration is valid when each such dim is divisible by the product of the axes on it.
    """
    k = len(sizes)
    choices = [-1] + [d for d in range(len(space.sizes)) if space.splittable[d]]
    out = []
    for cfg in itertools.product(choices, repeat=k):
        deg: dict[int, int] = {}
        for a, d in enumerate(cfg):
            if d >= 0:
                deg[d] = deg.get(d, 1) * sizes[a]
        if all(size % deg.get(d, 1) == 0 for size, d in tensor_sizes):
            out.append(tuple(cfg))
    return out


def spec_of(dim_map: DimMap | None, cfg: Config) -> Spec:
    """The sharding of a tensor whose dims map to iteration dims ``dim_map`` under ``cfg``."""
    if dim_map is None:
        return ()
    return tuple(
        tuple(a for a, d in enumerate(cfg) if d >= 0 and d == m) if m is not None else ()
        for m in dim_map
    )


def shard_count(spec: Spec, sizes: Sequence[int]) -> int:
    return math.prod(sizes[a] for axes in spec for a in axes)


def degree(cfg: Config, dims: frozenset[int], sizes: Sequence[int]) -> int:
    """Degree of parallelism of work split over ``dims``: product of the axes assigned to them."""
    return math.prod(sizes[a] for a, d in enumerate(cfg) if d in dims)


# ---------------------------------------------------------------- resharding


@dataclasses.dataclass(frozen=True)
class Step:
    """One collective (or free local slice) of a reshard path."""

    kind: str  # "slice", "all-gather", "all-to-all"
    axis: int  # mesh axis index
    before: Spec
    after: Spec
    nbytes: float  # bytes sent per device (ring accounting)


def _is_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) <= len(b) and b[: len(a)] == a


@functools.lru_cache(maxsize=1 << 21)
def reshard_path(nbytes: int, src: Spec, dst: Spec, sizes: tuple[int, ...]) -> tuple[Step, ...]:
    """The sequence of collectives that turns layout ``src`` into ``dst``.

    Cheapest-first order: free slices first (an axis replicated in the current layout that the
    target puts next on a dim), then one axis at a time leaves a dim — an all-to-all when the
    target wants it next on another dim, else an all-gather — keeping buffers small. The applier
    emits exactly this chain of sharding constraints, so XLA runs these collectives.
    """
    if src == dst or not dst:
        return ()
    cur = [tuple(x) for x in src]
    steps: list[Step] = []
    n_dims = len(dst)
    for _ in range(4 * len(sizes) + 2):
        if tuple(cur) == dst:
            break
        used = {a for axes in cur for a in axes}
        progressed = False
        for d in range(n_dims):  # free slices
            while _is_prefix(cur[d], dst[d]) and len(cur[d]) < len(dst[d]):
                a = dst[d][len(cur[d])]
                if a in used:
                    break
                before = tuple(cur)
                cur[d] = cur[d] + (a,)
                used.add(a)
                steps.append(Step("slice", a, before, tuple(cur), 0.0))
                progressed = True
        if progressed:
            continue
        # pick an axis to take off a dim that is not a prefix of its target
        movable = None
        for d in range(n_dims):
            if cur[d] and not _is_prefix(cur[d], dst[d]):
                a = cur[d][-1]
                to = next(
                    (
                        d2
                        for d2 in range(n_dims)
                        if d2 != d
                        and _is_prefix(cur[d2], dst[d2])
                        and len(cur[d2]) < len(dst[d2])
                        and dst[d2][len(cur[d2])] == a
                    ),
                    None,
                )
                if movable is None or (to is not None and movable[2] is None):
                    movable = (d, a, to)
        if movable is None:  # an axis must leave a dim that is a prefix (dst puts others first)
            for d in range(n_dims):
                if cur[d] and cur[d] != dst[d][: len(cur[d])]:
                    movable = (d, cur[d][-1], None)
                    break
        if movable is None:
            raise AssertionError(f"reshard_path stuck: {src} -> {dst}")
        d, a, to = movable
        before = tuple(cur)
        buf = nbytes / shard_count(before, sizes)
        cur[d] = cur[d][:-1]
        if to is not None:
            cur[to] = cur[to] + (a,)
            steps.append(Step(ALL_TO_ALL, a, before, tuple(cur), all_to_all_bytes(buf, sizes[a])))
        else:
            out = nbytes / shard_count(tuple(cur), sizes)
            steps.append(Step(ALL_GATHER, a, before, tuple(cur), all_gather_bytes(out, sizes[a])))
    if tuple(cur) != dst:
        raise AssertionError(f"reshard_path did not converge: {src} -> {dst}")
    return tuple(steps)


@functools.lru_cache(maxsize=1 << 21)
def reshard_linear(src: Spec, dst: Spec, mesh: MeshAxes, objective: str) -> tuple[float, float]:
    """(fixed term, per-byte term) of a reshard: its cost is fixed + bytes · per_byte.

    Under "time" the fixed term is the α of every step (latency · ring steps) and the per-byte
    term Σ fraction / bandwidth; under "comm" only bytes count (fixed term 0).
    """
    steps = [s for s in reshard_path(1, src, dst, mesh.sizes) if s.kind != "slice"]
    if objective == "comm":
        return 0.0, sum(s.nbytes for s in steps)
    fixed = sum(mesh.latency[s.axis] * ring_steps(s.kind, mesh.sizes[s.axis]) for s in steps)
    return fixed, sum(s.nbytes / mesh.bandwidth[s.axis] for s in steps)


def reshard_cost(nbytes: int, src: Spec, dst: Spec, params: CostParams) -> float:
    """t_X of one tensor (or its bytes under the "comm" objective)."""
    fixed, per_byte = reshard_linear(src, dst, params.mesh, params.objective)
    return fixed + nbytes * per_byte


# ---------------------------------------------------------------- node costs


@dataclasses.dataclass(frozen=True)
class Reduction:
    """The partial-sum all-reduce a node's configuration requires (one per result)."""

    tensor: int
    axes: tuple[int, ...]
    buffer_bytes: float
    nbytes: float  # bytes sent per device


def node_reductions(node: Node, cfg: Config, ng: NodeGraph, sizes: Sequence[int]):
    """All-reduces completing partial results of the anchor (AccPar Type-II, gradient sync)."""
    if node.anchor < 0:
        return []
    red_dims = set(node.space.reduce_dims)
    axes = tuple(a for a, d in enumerate(cfg) if d in red_dims)
    if not axes:
        return []
    n = math.prod(sizes[a] for a in axes)
    out = []
    eqn = ng.program.eqns[node.anchor]
    for t, m in zip(eqn.outputs, node.space.out_maps, strict=True):
        tensor = ng.program.tensors[t]
        buf = tensor.nbytes / shard_count(spec_of(m, cfg), sizes)
        out.append(Reduction(t, axes, buf, all_reduce_bytes(buf, n)))
    return out


def halo_bytes(node: Node, cfg: Config, ng: NodeGraph, sizes: Sequence[int]) -> float:
    """Bytes each device exchanges for the halos of spatially split convolutions."""
    sp = node.space
    if not sp.halo or node.anchor < 0:
        return 0.0
    eqn = ng.program.eqns[node.anchor]
    lhs = ng.program.tensors[eqn.inputs[0]]
    shard = lhs.nbytes / max(
        1, degree(cfg, frozenset(d for d in sp.in_maps[0] if d is not None), sizes)
    )
    total = 0.0
    for d, h in enumerate(sp.halo):
        deg = degree(cfg, frozenset([d]), sizes)
        if h and deg > 1:
            total += shard * h / (sp.sizes[d] / deg)
    return total


def halo_time(node: Node, cfg: Config, ng: NodeGraph, mesh: MeshAxes) -> float:
    """Time of the halo exchange: a collective-permute of `halo_bytes` over the split axes."""
    hb = halo_bytes(node, cfg, ng, mesh.sizes)
    if not hb:
        return 0.0
    axes = [a for a, d in enumerate(cfg) if d >= 0 and node.space.halo[d]]
    n, bw, lat = mesh.group(axes)
    return transfer_time(PERMUTE, hb, n, bw, lat)


def member_compute_time(ng: NodeGraph, node: Node, cfg: Config, params: CostParams) -> float:
    """t_C of a node: roofline of each member's per-device shard."""
    sizes = params.mesh.sizes
    total = 0.0
    for m in node.members:
        if m.eqn < 0:
            continue
        eqn = ng.program.eqns[m.eqn]
        deg = degree(cfg, m.used_dims, sizes)
        nbytes = 0.0
        for t, mp in zip(eqn.inputs, m.in_maps, strict=True):
            if t is not None and mp is not None:
                tensor = ng.program.tensors[t]
                nbytes += tensor.nbytes / shard_count(spec_of(mp, cfg), sizes)
        for t, mp in zip(eqn.outputs, m.out_maps, strict=True):
            tensor = ng.program.tensors[t]
            nbytes += tensor.nbytes / shard_count(spec_of(mp, cfg), sizes)
        dtype = ng.program.tensors[eqn.outputs[0]].dtype
        total += roofline_time(
            m.flops / deg, nbytes, params.flops_rate(dtype), params.mem_bandwidth
        )
    return total


def dim_degrees(cfgs: Sequence[Config], ndims: int, sizes: Sequence[int]) -> np.ndarray:
    """``D[c, d]``: degree of iteration dim ``d`` under configuration ``c`` (product of its axes).

    The vectorized form of `degree`: every per-config quantity of a node is a product of
    columns of this table.
    """
    table = np.ones((len(cfgs), ndims + 1))  # last column: "no dim" (-1), ignored
    arr = np.asarray(cfgs, dtype=np.int64).reshape(len(cfgs), len(sizes))
    for a, size in enumerate(sizes):
        np.multiply.at(table, (np.arange(len(cfgs)), arr[:, a]), size)
    return table[:, :ndims]


def compute_times(
    ng: NodeGraph, node: Node, cfgs: Sequence[Config], params: CostParams
) -> np.ndarray:
    """`member_compute_time` of every configuration at once (same formula, numpy columns)."""
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
        if m.eqn < 0:
            continue
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
        rate = params.flops_rate(tensors[eqn.outputs[0]].dtype)
        total += np.maximum(m.flops / deg / rate, nbytes / params.mem_bandwidth)
    return total


def unary_costs(
    ng: NodeGraph,
    node: Node,
    cfgs: Sequence[Config],
    params: CostParams,
    compute: np.ndarray | None = None,
) -> np.ndarray:
    """Objective value of every configuration of a node (the search's unary table).

    Equal to ``objective_value(node_cost(...))`` per configuration; compute is vectorized (or
    given: ``compute_times``) and the rarer reductions and halos are added per configuration
    only where they occur.
    """
    mesh = params.mesh
    time_obj = params.objective != "comm"
    if not time_obj:
        out = np.zeros(len(cfgs))
    else:
        out = np.array(compute if compute is not None else compute_times(ng, node, cfgs, params))
    red_dims = set(node.space.reduce_dims)
    may_halo = bool(node.space.halo) and any(node.space.halo)
    if node.anchor < 0 or not (red_dims or may_halo):
        return out
    for i, cfg in enumerate(cfgs):
        if not any(d in red_dims for d in cfg) and not (
            may_halo and any(d >= 0 and node.space.halo[d] for d in cfg)
        ):
            continue
        reds = node_reductions(node, cfg, ng, mesh.sizes)
        hb = halo_bytes(node, cfg, ng, mesh.sizes)
        if not time_obj:
            out[i] += sum(r.nbytes for r in reds) + hb
            continue
        for r in reds:
            n, bw, lat = mesh.group(r.axes)
            out[i] += transfer_time(ALL_REDUCE, r.nbytes, n, bw, lat)
        if hb:
            out[i] += halo_time(node, cfg, ng, mesh)
    return out


@dataclasses.dataclass(frozen=True)
class NodeCost:
    """A node's cost terms under one configuration."""

    compute: float  # t_C (seconds)
    reduce: float  # partial-sum all-reduce time (seconds): t_S when it reduces gradients
    halo: float  # halo exchange time (seconds)
    comm_bytes: float  # bytes sent per device by the reductions and halos


def node_cost(ng: NodeGraph, node: Node, cfg: Config, params: CostParams) -> NodeCost:
    mesh = params.mesh
    reds = node_reductions(node, cfg, ng, mesh.sizes)
    red_t = 0.0
    for r in reds:
        n, bw, lat = mesh.group(r.axes)
        red_t += transfer_time(ALL_REDUCE, r.nbytes, n, bw, lat)
    hb = halo_bytes(node, cfg, ng, mesh.sizes)
    halo_t = halo_time(node, cfg, ng, mesh) if hb else 0.0
    return NodeCost(
        member_compute_time(ng, node, cfg, params),
        red_t,
        halo_t,
        sum(r.nbytes for r in reds) + hb,
    )


def objective_value(cost: NodeCost, params: CostParams) -> float:
    if params.objective == "comm":
        return cost.comm_bytes
    return cost.compute + cost.reduce + cost.halo


# ---------------------------------------------------------------- the tables the search reads


@dataclasses.dataclass(frozen=True)
class EdgeUse:
    """One read of a tensor by a node other than its producer (or a state output's feedback)."""

    src: int  # producing node
    dst: int  # reading node
    tensor: int  # tensor id
    src_map: DimMap  # the tensor's dims -> src node iteration dims
    dst_map: DimMap  # the layout the reader needs, in dst node iteration dims


def _valid_tensor_dims(ng: NodeGraph, node: Node) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    tensors = ng.program.tensors
    for m in node.members:
        if m.eqn < 0:
            pairs = [(node.invar, node.tensor_maps[node.invar])]
        else:
            eqn = ng.program.eqns[m.eqn]
            pairs = list(zip(eqn.inputs, m.in_maps, strict=True))
            pairs += list(zip(eqn.outputs, m.out_maps, strict=True))
        for t, mp in pairs:
            if t is None or mp is None:
                continue
            out += [(s, d) for s, d in zip(tensors[t].shape, mp, strict=True) if d is not None]
    return out


def node_configs(ng: NodeGraph, node: Node, params: CostParams) -> list[Config]:
    """Candidate configurations of a node.

    Under the "comm" objective (SoyBean's problem) every contraction is split over the whole
    mesh: dot_general / conv_general_dilated nodes keep only configurations of full degree.
    """
    sizes = params.mesh.sizes
    replicated = (-1,) * len(sizes)
    if node.fixed:
        return [replicated]
    cfgs = enumerate_configs(node.space, sizes, _valid_tensor_dims(ng, node))
    contraction = node.anchor >= 0 and ng.program.eqns[node.anchor].primitive in (
        "dot_general",
        "conv_general_dilated",
    )
    if params.objective == "comm" and contraction:
        full = [c for c in cfgs if all(d >= 0 for d in c)]
        cfgs = full or cfgs
    return cfgs or [replicated]


def edge_uses(ng: NodeGraph, feedback: Sequence[tuple[int, int]]) -> list[EdgeUse]:
    """Every cross-node read, plus state feedback edges (new state -> next step's input)."""
    uses = []
    for node in ng.nodes:
        for m in node.members:
            if m.eqn < 0:
                continue
            eqn = ng.program.eqns[m.eqn]
            for t, mp in zip(eqn.inputs, m.in_maps, strict=True):
                if t is None or mp is None or t not in ng.node_of_tensor:
                    continue
                src = ng.node_of_tensor[t]
                uses.append(EdgeUse(src, node.index, t, ng.nodes[src].tensor_maps[t], mp))
    for out_t, in_t in feedback:
        src, dst = ng.node_of_tensor[out_t], ng.node_of_tensor[in_t]
        uses.append(
            EdgeUse(
                src, dst, out_t, ng.nodes[src].tensor_maps[out_t], ng.nodes[dst].tensor_maps[in_t]
            )
        )
    return uses


class ReshardTables:
    """t_X tables for reads, cached per (producer layouts, reader layouts) pattern.

    Layers repeat, and so do their tables; a reshard's cost is linear in the tensor's bytes, so
    one pattern serves every tensor size.
    """

    def __init__(self, ng: NodeGraph, configs: list[list[Config]], params: CostParams):
        self.ng, self.configs, self.params = ng, configs, params
        self.tables: dict[tuple, np.ndarray] = {}
        self.specs: dict[tuple[int, DimMap], tuple[list[Spec], np.ndarray]] = {}

    def _layouts(self, node: int, dim_map: DimMap) -> tuple[list[Spec], np.ndarray]:
        """Distinct layouts of a tensor over a node's configs, and each config's layout index."""
        key = (node, dim_map)
        if key not in self.specs:
            index: dict[Spec, int] = {}
            inverse = [
                index.setdefault(spec_of(dim_map, c), len(index)) for c in self.configs[node]
            ]
            self.specs[key] = (list(index), np.array(inverse, dtype=np.int64))
        return self.specs[key]

    def table(self, use: EdgeUse) -> np.ndarray:
        """t_X of one read for every (producer config, reader config) pair."""
        tensor = self.ng.program.tensors[use.tensor]
        n_src, n_dst = len(self.configs[use.src]), len(self.configs[use.dst])
        if tensor.opaque or not tensor.shape:
            return np.zeros((n_src, n_dst))
        src_specs, si = self._layouts(use.src, use.src_map)
        dst_specs, di = self._layouts(use.dst, use.dst_map)
        key = (tuple(src_specs), tuple(dst_specs))
        pair = self.tables.get(key)
        if pair is None:
            mesh, objective = self.params.mesh, self.params.objective
            lin = [[reshard_linear(a, b, mesh, objective) for b in dst_specs] for a in src_specs]
            pair = self.tables[key] = (
                np.array([[x[0] for x in row] for row in lin]),
                np.array([[x[1] for x in row] for row in lin]),
            )
        small = pair[0] + float(tensor.nbytes) * pair[1]
        return small[np.ix_(si, di)]
