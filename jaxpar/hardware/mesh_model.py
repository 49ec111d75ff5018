"""The cost model's view of a mesh on a cluster: links per axis, device speeds, slowest device.

A mesh names and sizes its axes; its devices are either abstract (no devices: mesh position p,
in row-major order, is cluster device p) or jax devices, whose ids are ranked to give each
mesh slot a cluster device position (`device_positions`). From the cluster this module derives
what the planner prices:

- `mesh_axes`: `MeshAxes`, per axis the link its collective groups cross (bandwidth with port
  contention, latency, level name), and the bandwidth of collectives over several axes at once;
- `mesh_speeds`: `speeds.MeshSpeeds`, the per-device FLOP/s laid out like the mesh, for the
  ratio-split costs of a heterogeneous cluster (None on a homogeneous one);
- `slowest_device`: the peak FLOP/s per dtype and memory bandwidth of the mesh's slowest device,
  which sets the even split's compute time t_C (every device runs a same-size shard).

Pure module: numpy only, no jax import.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Sequence

import numpy as np

from .calibration import Calibration
from .cluster import Cluster
from .speeds import MeshSpeeds


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
    # Axes whose bandwidth and latency were measured (`Cluster.calibration`), not datasheet.
    measured_axes: tuple[int, ...] = ()
    # The calibrated cluster's measurements: its throughput curves price compute
    # (`cost.CostParams.flops_rates`). None: the datasheet peaks.
    calibration: Calibration | None = None
    # Per-kernel costs of the mesh's slowest device (`kernel_costs`), for `cost.CostParams`:
    # seconds each kernel costs beyond its roofline, and the contraction saturation time.
    kernel_overhead: float = 0.0
    half_rate_time: float = 0.0
    # bytes/s of the slowest device's memory: prices a reshard's local kernels (slices, layout
    # copies: `reshard.local_priced`); 0: they are free
    mem_bandwidth: float = 0.0
    # bytes/s per direction of the slowest device's link to host memory: prices moves to and
    # from pinned host memory (`cost.host_move_seconds`); 0: not known, they are not priced
    host_bandwidth: float = 0.0
    # The user's mesh axes of size 1, left out of the planning mesh (`names` are the others):
    # code partitioned by hand may name them, and splitting over them is a no-op.
    trivial: tuple[str, ...] = ()

    @property
    def num_devices(self) -> int:
        return math.prod(self.sizes)

    @functools.cached_property
    def _groups(self) -> dict[tuple[int, ...], tuple[int, float, float]]:
        return {}  # `group`'s answers: asked once per configuration that communicates

    def group(self, axes: Sequence[int]) -> tuple[int, float, float]:
        """(group size, bandwidth, latency) of a collective over several axes."""
        key = tuple(axes)
        if key not in self._groups:
            self._groups[key] = self._group(key)
        return self._groups[key]

    def _group(self, axes: tuple[int, ...]) -> tuple[int, float, float]:
        n = math.prod(self.sizes[a] for a in axes)
        key = tuple(sorted(axes))
        bw = dict(self.group_bandwidth).get(key) if len(key) > 1 else None
        if bw is None:
            bw = min((self.bandwidth[a] for a in axes), default=math.inf)
        lat = max((self.latency[a] for a in axes), default=0.0)
        return n, bw, lat


def device_positions(sizes: Sequence[int], device_ids: np.ndarray | None) -> np.ndarray:
    """Cluster device position of every mesh slot, an int array shaped `sizes`.

    `device_ids` None (an abstract mesh): positions 0 .. n-1 in row-major order. Otherwise the
    jax device ids of the mesh, shaped like it: each id's rank among them, so a mesh over jax
    devices [[10, 3], [7, 5]] sits on cluster devices [[3, 0], [2, 1]] (cluster device ids are
    positions in the job's device order).
    """
    shape = tuple(int(s) for s in sizes)
    if device_ids is None:
        return np.arange(math.prod(shape)).reshape(shape)
    ids = np.asarray(device_ids)
    if ids.shape != shape:
        raise ValueError(f"device_ids has shape {ids.shape} but the mesh shape is {shape}")
    order = {d: i for i, d in enumerate(sorted(ids.reshape(-1).tolist()))}
    return np.vectorize(order.get, otypes=[int])(ids)


def mesh_axes(
    cluster: Cluster,
    names: Sequence[str],
    sizes: Sequence[int],
    device_ids: np.ndarray | None,
) -> MeshAxes:
    """The mesh as the cost model sees it: per axis the link its groups cross (`MeshAxes`).

    Raises the cluster's ValueError (`Cluster.check_mesh`) when the mesh does not fit it: too
    few devices (with the `Cluster.preset` call that fixes it), or bad device ids.
    """
    names, sizes = tuple(names), tuple(int(s) for s in sizes)
    if len(names) != len(sizes):
        raise ValueError(f"mesh has {len(names)} axis names {names} but {len(sizes)} sizes")
    positions = _checked_positions(cluster, sizes, device_ids)
    links = cluster.axis_links(sizes, positions)
    bandwidth = list(cluster.axis_bandwidths(sizes, positions))
    latency = [link.latency for link in links]
    link_names = [link.name for link in links]
    measured = []
    calibration = cluster.calibration
    for a, (name, size, link) in enumerate(zip(names, sizes, links, strict=True)):
        axis = calibration.axis_for(name, size, link.name) if calibration and size > 1 else None
        if axis is not None:  # the measured link replaces the level's datasheet numbers
            bandwidth[a], latency[a] = axis.bandwidth, axis.step_latency
            link_names[a] += " (measured)"
            measured.append(a)
    merged = _merged_group_bandwidths(cluster, sizes, positions)
    overhead, half_rate = kernel_costs(cluster, positions)
    _, mem_bandwidth = slowest_device(cluster, sizes, device_ids)
    groups = cluster.all_groups()
    present = np.unique(cluster.group_ids()[positions.reshape(-1)]).tolist()
    host_bandwidth = min(groups[g].device.host_bandwidth for g in present)
    return MeshAxes(
        names=names,
        sizes=sizes,
        bandwidth=tuple(bandwidth),
        latency=tuple(latency),
        link_names=tuple(link_names),
        # a merged group over a measured axis runs at the slowest member axis (no entry)
        group_bandwidth=tuple(e for e in merged if not set(e[0]) & set(measured)),
        measured_axes=tuple(measured),
        calibration=calibration,
        kernel_overhead=overhead,
        half_rate_time=half_rate,
        mem_bandwidth=mem_bandwidth,
        host_bandwidth=host_bandwidth,
    )


def kernel_costs(cluster: Cluster, positions: np.ndarray) -> tuple[float, float]:
    """(kernel overhead, half-rate time) in seconds of the slowest device at `positions`.

    The maximum over the device kinds present of `DeviceSpec.kernel_overhead` and
    `DeviceSpec.half_rate_time` (datasheet numbers); on a calibrated cluster the overhead is the
    measured one (`Calibration.measured_kernel_overhead`).
    """
    groups = cluster.all_groups()
    present = np.unique(cluster.group_ids()[np.asarray(positions).reshape(-1)]).tolist()
    specs = [groups[g].device for g in present]
    overhead = max(spec.kernel_overhead for spec in specs)
    half_rate = max(spec.half_rate_time for spec in specs)
    if cluster.calibration is not None:
        overhead = cluster.calibration.measured_kernel_overhead()
    return overhead, half_rate


def cost_sources(axes: MeshAxes, cluster: Cluster) -> str:
    """One line for reports: where the compute and link numbers of a plan come from.

    E.g. "compute: datasheet; links: datasheet", or "compute: measured on NVIDIA H100 80GB HBM3,
    2026-11-30; links: measured (data), datasheet (node)".
    """
    measured = [axes.names[a] for a in axes.measured_axes]
    rest = [n for a, n in enumerate(axes.names) if a not in axes.measured_axes]
    links = []
    if measured:
        links.append(f"measured ({', '.join(measured)})")
    if rest:
        links.append("datasheet" + (f" ({', '.join(rest)})" if measured else ""))
    return f"compute: {cluster.source}; links: {', '.join(links)}"


def mesh_speeds(
    cluster: Cluster, sizes: Sequence[int], device_ids: np.ndarray | None
) -> MeshSpeeds | None:
    """Per-device FLOP/s shaped like the mesh; None on a homogeneous cluster (all factors 1)."""
    sizes = tuple(int(s) for s in sizes)
    positions = _checked_positions(cluster, sizes, device_ids)
    if not cluster.heterogeneous:
        return None
    names = tuple(g.name for g in cluster.all_groups())
    return MeshSpeeds(
        lambda dtype: cluster.device_flops(dtype)[positions],
        cluster.group_ids()[positions],
        names,
    )


def slowest_device(
    cluster: Cluster, sizes: Sequence[int], device_ids: np.ndarray | None
) -> tuple[tuple[tuple[str, float], ...], float]:
    """(peak FLOP/s per dtype name, memory bandwidth) of the mesh's slowest device.

    Under an even split every device runs a same-size shard, so the slowest device sets the
    compute time t_C. Each number is the minimum over the device kinds in the mesh (dtype by
    dtype, a kind without an entry running at its float32 rate); the pairs are sorted by
    dtype name and cover every dtype any kind in the mesh lists.
    """
    sizes = tuple(int(s) for s in sizes)
    positions = _checked_positions(cluster, sizes, device_ids)
    groups = cluster.all_groups()
    present = np.unique(cluster.group_ids()[positions]).tolist()
    specs = {groups[g].device for g in present}
    dtypes = sorted({k for spec in specs for k, _ in spec.peak_flops})
    peak_flops = tuple((k, min(spec.flops(k) for spec in specs)) for k in dtypes)
    return peak_flops, min(spec.mem_bandwidth for spec in specs)


def smallest_memory(cluster: Cluster, sizes: Sequence[int], device_ids: np.ndarray | None) -> float:
    """Bytes of memory of the mesh's smallest device (a plan must fit every device)."""
    positions = _checked_positions(cluster, tuple(int(s) for s in sizes), device_ids)
    groups = cluster.all_groups()
    present = np.unique(cluster.group_ids()[positions]).tolist()
    return min(groups[g].device.memory_bytes for g in present)


def _checked_positions(
    cluster: Cluster, sizes: tuple[int, ...], device_ids: np.ndarray | None
) -> np.ndarray:
    """`device_positions` of the mesh, validated against the cluster (`Cluster.check_mesh`)."""
    positions = device_positions(sizes, device_ids)
    cluster.check_mesh(sizes, positions)
    return positions


def _merged_group_bandwidths(
    cluster: Cluster, sizes: tuple[int, ...], positions: np.ndarray
) -> tuple[tuple[tuple[int, ...], float], ...]:
    """Bandwidth of collectives over every set of two or more mesh axes (see `MeshAxes`).

    The set's axes are merged into one (mesh order, row-major: the order of the devices in
    XLA's replica group) and the cluster rates that axis like any other.
    """
    out = []
    k = len(sizes)
    for r in range(2, k + 1):
        for axes in itertools.combinations(range(k), r):
            rest = [a for a in range(k) if a not in axes]
            merged = np.transpose(positions, (*rest, *axes))
            shape = (*(sizes[a] for a in rest), math.prod(sizes[a] for a in axes))
            out.append((axes, cluster.axis_bandwidths(shape, merged.reshape(shape))[-1]))
    return tuple(out)
