"""The cluster a plan targets: OptCNN's device graph (§4) in a compact hierarchical form.

OptCNN models the hardware as a graph whose nodes are devices and whose edges carry a bandwidth
b(d_i, d_j). Real clusters are hierarchical, so instead of an n-by-n table we keep *levels*,
innermost first: GPUs inside a node joined by NVLink, nodes joined by InfiniBand. Devices are
numbered so that every group of a level is a consecutive block of ids::

    p100, nodes=2      ids 0 1 2 3 | 4 5 6 7
    level 0 nvlink     [0 1 2 3]     [4 5 6 7]     group_size 4
    level 1 infiniband [0 1 2 3 4 5 6 7]           group_size 8 (the whole cluster)

The link between two devices is the innermost level whose group holds both, and a collective
over a set of devices runs at the speed of the slowest (outermost) level the set spans. That is
all the cost model needs (DESIGN.md, "Communication accounting"): which level each mesh axis
crosses (`Cluster.axis_links`), and how much of that level's bandwidth one group gets when
several groups cross it at once (`Cluster.axis_bandwidths`). The collective cost formulas
themselves live in `cost.py`.

Every preset number carries its source (`DeviceSpec.source`, `LinkLevel.source`), and
`Cluster.describe` prints them, so a prediction can always be traced back to a datasheet.

Pure module: numpy only, no jax import; `from_device_kind` takes the strings jax reports.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise

import numpy as np

GB = 1e9  # datasheets quote decimal gigabytes (and GB/s)
TFLOPS = 1e12  # FLOP/s in one TFLOP/s
US = 1e-6  # seconds in one microsecond


@dataclass(frozen=True)
class DeviceSpec:
    """Speeds and capacity of one device."""

    name: str  # product name, e.g. "P100-SXM2-16GB"
    # (dtype name, peak FLOP/s) pairs, e.g. (("float32", 10.6e12), ...); a Mapping is accepted
    # and stored as a sorted tuple so the spec stays hashable (plans cache on the cluster).
    peak_flops: tuple[tuple[str, float], ...]
    mem_bandwidth: float  # bytes/s of device memory (HBM/DRAM)
    memory_bytes: float  # device memory capacity in bytes
    source: str = ""  # where these numbers come from; shown by Cluster.describe

    def __post_init__(self) -> None:
        pairs = self.peak_flops.items() if isinstance(self.peak_flops, Mapping) else self.peak_flops
        table = tuple(sorted((str(k), float(v)) for k, v in pairs))
        object.__setattr__(self, "peak_flops", table)
        if "float32" not in dict(table):
            raise ValueError(f"device {self.name!r}: peak_flops needs a 'float32' entry")
        if any(v <= 0 for _, v in table) or self.mem_bandwidth <= 0 or self.memory_bytes <= 0:
            raise ValueError(f"device {self.name!r}: speeds and memory must be positive")

    def flops(self, dtype: object) -> float:
        """Peak FLOP/s for `dtype` (a name such as "bfloat16", or a numpy-compatible dtype).

        Dtypes without an entry (integers, float8 on older parts, ...) fall back to the float32
        rate: that is what the device runs them at when it has no dedicated units.
        """
        table = dict(self.peak_flops)
        return table.get(_dtype_name(dtype), table["float32"])


@dataclass(frozen=True)
class LinkLevel:
    """One level of the interconnect hierarchy."""

    name: str  # "nvlink", "infiniband", "shared-memory", ...
    # Devices in one group of this level (4 GPUs per node); the outermost level's group is the
    # whole cluster. Groups are consecutive blocks of device ids.
    group_size: int
    # Bytes/s per direction that one device's traffic gets on this level's links when its
    # collective group is the only traffic there (what a single ring step sees).
    bandwidth: float
    latency: float  # seconds per message step (the alpha of an alpha-beta model)
    # Devices of one inner group that share one port of this level (4 P100s behind a node's one
    # InfiniBand card -> 4; one NIC per H100 in a DGX -> 1). Groups crossing the level at the
    # same time through a shared port split its bandwidth (Cluster.axis_bandwidths).
    shared_by: int = 1
    source: str = ""  # where these numbers come from; shown by Cluster.describe


@dataclass(frozen=True)
class _Preset:
    """How to build one family of clusters (a preset, or a detected device kind)."""

    device: DeviceSpec  # the device every member has
    node_link: LinkLevel  # link inside one node; its group_size is the devices per node
    network: LinkLevel | None  # link between nodes; None for a single-host family (cpu)
    summary: str  # one line for error messages and Cluster.describe


# P100: NVIDIA Tesla P100 datasheet (SXM2 16GB); the paper's cluster is OptCNN §6
# "Experimental setup": 4 nodes x 4 P100, NVLink inside a node, 100 Gb/s EDR InfiniBand.
_P100 = _Preset(
    device=DeviceSpec(
        name="P100-SXM2-16GB",
        peak_flops={
            "float64": 5.3 * TFLOPS,  # datasheet
            "float32": 10.6 * TFLOPS,  # datasheet
            "float16": 21.2 * TFLOPS,  # datasheet
            # Pascal has no bfloat16 units; XLA computes bf16 in f32, so the f32 rate.
            "bfloat16": 10.6 * TFLOPS,
        },
        mem_bandwidth=732 * GB,  # datasheet: CoWoS HBM2 at 732 GB/s
        memory_bytes=16 * GB,  # datasheet "16 GB" (decimal: a little under the usable size)
        source="NVIDIA Tesla P100 (SXM2) datasheet",
    ),
    node_link=LinkLevel(
        name="nvlink",
        group_size=4,  # OptCNN §6: four P100 per node
        # NVLink 1.0: 20 GB/s per link per direction (4 links, 160 GB/s bidirectional total).
        # In a 4-GPU NVLink quad (DGX-1 hybrid cube-mesh) each GPU pair shares one link, so a
        # ring step uses one link: 20 GB/s. Conservative: NCCL can run rings on several links.
        bandwidth=20 * GB,
        # NCCL's tuning model (src/graph/tuning.cc, hwLat) puts a ring step on NVLink at
        # ~0.5-3.4 us depending on protocol; 1 us is the order of magnitude.
        latency=1 * US,
        source="OptCNN §6 (NVLink in a node); NVLink 1.0: 20 GB/s/link/direction",
    ),
    network=LinkLevel(
        name="infiniband",
        group_size=8,  # placeholder: set to the cluster size when built
        bandwidth=12.5 * GB,  # OptCNN §6: 100 Gb/s EDR InfiniBand = 12.5 GB/s per direction
        # NCCL's tuning model puts a network ring step at ~2-14 us; 5 us is typical for EDR.
        latency=5 * US,
        # The paper does not say how many cards a node has; assume one, shared by its 4 GPUs.
        shared_by=4,
        source="OptCNN §6: 100 Gb/s EDR InfiniBand between nodes (one HCA per node assumed)",
    ),
    summary="nodes of 4 x P100-SXM2 (NVLink), EDR InfiniBand between nodes (OptCNN §6)",
)

# H100: NVIDIA H100 Tensor Core GPU datasheet (SXM5 column; tensor rates are dense, i.e. half
# the "with sparsity" figures) and the NVIDIA DGX H100 datasheet / user guide.
_DGX_H100 = _Preset(
    device=DeviceSpec(
        name="H100-SXM5-80GB",
        peak_flops={
            "float64": 67 * TFLOPS,  # FP64 tensor core
            "float32": 67 * TFLOPS,  # FP32 (CUDA cores)
            "tensorfloat32": 494.7 * TFLOPS,  # TF32 tensor core, dense (989.4 sparse)
            "bfloat16": 989.4 * TFLOPS,  # BF16 tensor core, dense (1,979 sparse)
            "float16": 989.4 * TFLOPS,  # FP16 tensor core, dense (1,979 sparse)
            "float8_e4m3fn": 1978.9 * TFLOPS,  # FP8 tensor core, dense (3,958 sparse)
            "float8_e5m2": 1978.9 * TFLOPS,  # FP8 tensor core, dense (3,958 sparse)
        },
        mem_bandwidth=3.35e12,  # datasheet: HBM3 at 3.35 TB/s
        memory_bytes=80 * GB,  # datasheet: 80 GB
        source="NVIDIA H100 datasheet (SXM5; dense tensor-core rates)",
    ),
    node_link=LinkLevel(
        name="nvlink",
        group_size=8,  # DGX H100: eight GPUs per node
        # NVLink 4 through NVSwitch: 900 GB/s bidirectional per GPU = 450 GB/s per direction,
        # to any other GPU of the node (full-bandwidth switch).
        bandwidth=450 * GB,
        latency=1 * US,  # order of magnitude of NCCL's NVLink ring step (see the p100 preset)
        source="DGX H100 datasheet: NVLink 4 / NVSwitch, 900 GB/s bidirectional per GPU",
    ),
    network=LinkLevel(
        name="infiniband",
        group_size=16,  # placeholder: set to the cluster size when built
        bandwidth=50 * GB,  # one 400 Gb/s ConnectX-7 per GPU = 50 GB/s per direction
        latency=5 * US,  # order of magnitude of NCCL's network ring step
        shared_by=1,  # 8 NICs for 8 GPUs: no sharing
        source="DGX H100 datasheet: 8 x 400 Gb/s ConnectX-7 (NDR InfiniBand), one per GPU",
    ),
    summary="nodes of 8 x H100-SXM5 (NVLink 4 / NVSwitch), NDR InfiniBand between nodes",
)

# CPU: the fake devices of one host (`jax_num_cpu_devices`). Modest assumed numbers, not a
# measurement: they only need the right proportions so plans for tests look sensible.
_CPU = _Preset(
    device=DeviceSpec(
        name="host-cpu",
        peak_flops={
            # Assumed ~50 GFLOP/s per fake device: one or two AVX2 cores' share (a core with two
            # FMA units peaks at 32 f32 FLOP/cycle, ~80 GFLOP/s at 2.5 GHz; XLA gets less).
            "float32": 50e9,
            "float64": 25e9,  # half the f32 SIMD lanes
            # XLA:CPU upcasts 16-bit floats to f32 for arithmetic: same rate.
            "bfloat16": 50e9,
            "float16": 50e9,
        },
        mem_bandwidth=20 * GB,  # assumed: one DDR4/DDR5 channel's worth per device
        memory_bytes=4 * GB,  # assumed share of host RAM per fake device
        source="assumed modest host-CPU numbers (not measured)",
    ),
    node_link=LinkLevel(
        name="shared-memory",
        group_size=8,  # placeholder: set to the device count when built
        bandwidth=10 * GB,  # assumed memcpy rate between device buffers in one process
        # XLA:CPU collectives rendezvous across threads: tens of microseconds; assumed.
        latency=10 * US,
        source="assumed in-process copy rate (not measured)",
    ),
    network=None,
    summary="fake devices of one host CPU (jax_num_cpu_devices), assumed numbers",
)

# Unknown accelerators: placeholder numbers (an A100 PCIe 40GB datasheet, PCIe 4.0 between
# devices, 100 Gb/s between hosts) so planning still works; a warning says so.
_GENERIC_ACCELERATOR = _Preset(
    device=DeviceSpec(
        name="generic-accelerator",
        peak_flops={
            "float64": 9.7 * TFLOPS,  # A100 PCIe datasheet
            "float32": 19.5 * TFLOPS,  # A100 PCIe datasheet
            "tensorfloat32": 156 * TFLOPS,  # dense
            "bfloat16": 312 * TFLOPS,  # dense
            "float16": 312 * TFLOPS,  # dense
        },
        mem_bandwidth=1555 * GB,  # A100 PCIe 40GB datasheet
        memory_bytes=40 * GB,  # A100 PCIe 40GB datasheet
        source="placeholder (A100 PCIe 40GB datasheet) for an unrecognised device kind",
    ),
    node_link=LinkLevel(
        name="pcie",
        group_size=8,  # assumed devices per host unless devices_per_node says otherwise
        bandwidth=25 * GB,  # PCIe 4.0 x16: 32 GB/s raw per direction, ~25 GB/s achieved
        latency=2 * US,  # NCCL's PCI ring step is ~1-5 us
        source="placeholder: PCIe 4.0 x16 between devices of a host",
    ),
    network=LinkLevel(
        name="network",
        group_size=16,  # placeholder: set to the cluster size when built
        bandwidth=12.5 * GB,  # placeholder: one 100 Gb/s card per host
        latency=5 * US,
        shared_by=8,  # one card per host, shared by its devices
        source="placeholder: one 100 Gb/s card per host",
    ),
    summary="placeholder numbers for an unrecognised accelerator",
)

_PRESETS: dict[str, _Preset] = {"p100": _P100, "dgx-h100": _DGX_H100, "cpu": _CPU}
_CPU_DEFAULT_DEVICES = 8  # tests/conftest.py sets 8 fake CPU devices
_GENERIC_NAME = "generic"  # Cluster.name of clusters built from _GENERIC_ACCELERATOR

# jax device_kind substrings (upper-cased) -> preset. Only the exact parts the presets model:
# an H100 PCIe or a P100 PCIe has other speeds and no NVLink switch, so it gets the generic spec.
_GPU_KINDS: tuple[tuple[str, str], ...] = (
    ("H100 80GB HBM3", "dgx-h100"),
    ("H100 SXM", "dgx-h100"),
    ("P100-SXM2", "p100"),
)


@dataclass(frozen=True)
class Cluster:
    """Devices and the hierarchy of links between them (OptCNN's device graph)."""

    name: str  # preset name ("p100", "dgx-h100", "cpu") or a label for a hand-built cluster
    device: DeviceSpec  # every device's spec; read it through device_spec(i) (see below)
    num_devices: int  # devices in the cluster, numbered 0 .. num_devices - 1
    # Link levels, innermost first; level L's groups are consecutive blocks of
    # levels[L].group_size ids, each group size divides the next, the last is num_devices.
    levels: tuple[LinkLevel, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "levels", tuple(self.levels))
        _check_levels(self.name, self.num_devices, self.levels)

    # ---- construction -------------------------------------------------------------------

    @classmethod
    def presets(cls) -> list[str]:
        """Names accepted by `Cluster.preset`."""
        return list(_PRESETS)

    @classmethod
    def preset(cls, name: str, nodes: int = 1, *, devices: int | None = None) -> Cluster:
        """A documented cluster: "p100" (OptCNN §6), "dgx-h100" or "cpu".

        `nodes` picks how many nodes a GPU preset has. `devices` sizes the "cpu" preset
        (default 8), and for a GPU preset asks for part of one node (devices <= per node) or a
        whole number of nodes.
        """
        preset = _lookup_preset(name)
        if nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {nodes}")
        if devices is not None and devices < 1:
            raise ValueError(f"devices must be >= 1, got {devices}")
        if preset.network is None:
            if nodes != 1:
                raise ValueError(
                    f"preset {name!r} is one host: size it with devices= "
                    f"(default {_CPU_DEFAULT_DEVICES}), not nodes="
                )
            return _build(name, preset, devices or _CPU_DEFAULT_DEVICES)
        if devices is not None and nodes != 1:
            raise ValueError("pass either nodes= or devices=, not both")
        per_node = preset.node_link.group_size
        return _build(name, preset, devices if devices is not None else nodes * per_node)

    @classmethod
    def from_device_kind(
        cls,
        platform: str,
        device_kind: str,
        num_devices: int,
        *,
        devices_per_node: int | None = None,
    ) -> Cluster:
        """The cluster for devices jax reports (`jax.devices()[0].platform` / `.device_kind`).

        `devices_per_node` is `jax.local_device_count()` when known; without it a GPU preset's
        own node size is assumed. Unrecognised GPU and TPU kinds get placeholder numbers and a
        warning (TPU interconnect topology is not modelled).
        """
        if num_devices < 1:
            raise ValueError(f"num_devices must be >= 1, got {num_devices}")
        if devices_per_node is not None and devices_per_node < 1:
            raise ValueError(f"devices_per_node must be >= 1, got {devices_per_node}")
        platform = platform.lower()
        if platform == "cpu":
            return cls.preset("cpu", devices=num_devices)
        if platform not in ("gpu", "cuda", "rocm", "tpu"):
            raise ValueError(f"unknown platform {platform!r}; expected cpu, gpu or tpu")
        name = _match_gpu_kind(device_kind) if platform != "tpu" else None
        if name is None:
            warnings.warn(
                f"no cluster preset for {platform} device kind {device_kind!r}: using placeholder "
                f"numbers; pass a Cluster (Cluster.preset or hand-built) for a trustworthy plan",
                UserWarning,
                stacklevel=2,
            )
            return _build(_GENERIC_NAME, _GENERIC_ACCELERATOR, num_devices, devices_per_node)
        preset = _PRESETS[name]
        per_node = devices_per_node or preset.node_link.group_size
        if num_devices > per_node and num_devices % per_node:
            raise ValueError(
                f"{num_devices} {device_kind!r} devices do not split into nodes of {per_node}; "
                f"pass devices_per_node= (jax.local_device_count())"
            )
        if per_node != preset.node_link.group_size and num_devices > per_node:
            # Same parts, different node size: not the preset's topology, so not its name.
            name = f"{name} ({per_node} per node)"
        return _build(name, preset, num_devices, per_node)

    # ---- devices and links --------------------------------------------------------------

    def device_spec(self, device_id: int) -> DeviceSpec:
        """Spec of one device.

        Callers go through this (not `.device`) so that heterogeneous clusters (AccPar's
        per-device speeds) can be added without changing them.
        """
        if not 0 <= device_id < self.num_devices:
            raise ValueError(self._out_of_range_message([device_id]))
        return self.device

    def level_index(self, device_ids: Iterable[int]) -> int:
        """Index in `levels` of the slowest (outermost) level spanned by a set of devices.

        A single device spans no link; it reports the innermost level.
        """
        ids = np.asarray(list(device_ids) if not isinstance(device_ids, np.ndarray) else device_ids)
        if ids.size == 0:
            raise ValueError("a device group needs at least one device id")
        self._check_ids(ids)
        return int(self._row_levels(ids.reshape(1, -1))[0])

    def level_for_group(self, device_ids: Iterable[int]) -> LinkLevel:
        """Slowest (outermost) level spanned by a set of devices: its collectives run there."""
        return self.levels[self.level_index(device_ids)]

    def link_between(self, a: int, b: int) -> LinkLevel:
        """The level of the device-graph edge (a, b): OptCNN's b(d_a, d_b) is its bandwidth."""
        return self.level_for_group((a, b))

    # ---- meshes -------------------------------------------------------------------------

    def check_mesh(
        self, mesh_shape: Sequence[int], device_ids: np.ndarray | None = None
    ) -> np.ndarray:
        """Validate a mesh against the cluster; return its device-id array.

        `device_ids` (shape `mesh_shape`) holds cluster device ids; None means row-major
        `arange`, as for an abstract mesh. Raises ValueError when the cluster is too small, the
        shape does not match, or ids are out of range or repeated.
        """
        shape = _mesh_shape(mesh_shape)
        needed = math.prod(shape)
        if needed > self.num_devices:
            raise ValueError(self._too_small_message(needed))
        if device_ids is None:
            return np.arange(needed).reshape(shape)
        ids = np.asarray(device_ids)
        if ids.shape != shape:
            raise ValueError(f"device_ids has shape {ids.shape} but the mesh shape is {shape}")
        self._check_ids(ids)
        if np.unique(ids).size != ids.size:
            raise ValueError(f"device_ids repeats a device: {ids.tolist()}")
        return ids

    def axis_links(
        self, mesh_shape: Sequence[int], device_ids: np.ndarray | None = None
    ) -> tuple[LinkLevel, ...]:
        """For each mesh axis, the slowest level any of its groups spans.

        The groups of axis k are the device sets obtained by varying index k with the other
        indices fixed: a collective over axis k runs within them, concurrently. Axes of size 1
        report the innermost level (they never communicate).
        """
        return tuple(self.levels[i] for i in self._axis_level_indices(mesh_shape, device_ids))

    def axis_bandwidths(
        self, mesh_shape: Sequence[int], device_ids: np.ndarray | None = None
    ) -> tuple[float, ...]:
        """For each mesh axis, the bytes/s per direction one device gets in a collective over it.

        That is the bandwidth of the axis's level divided by the contention on shared ports:
        every group crossing a level passes once (ring) through the port of each inner group it
        touches, and when more groups pass through a block than it has ports (block size /
        shared_by) they split them. Example, p100 with 4 nodes and a (4, 4) mesh: each axis-0
        group {i, i+4, i+8, i+12} crosses every node, the four of them share each node's one
        InfiniBand card, so each gets 12.5 / 4 GB/s; a single 16-device ring gets 12.5 GB/s.
        """
        ids = self.check_mesh(mesh_shape, device_ids)
        return tuple(
            self._group_bandwidth(_axis_groups(ids, axis), level)
            for axis, level in enumerate(self._axis_level_indices(mesh_shape, ids))
        )

    # ---- reporting ----------------------------------------------------------------------

    def describe(self) -> str:
        """Human-readable table of the cluster's numbers and where each comes from."""
        spec = self.device
        lines = [
            f"cluster {self.name!r} ({self._size_label()}): {self.num_devices} x {spec.name}",
            f"  device numbers: {spec.source or 'no source given'}",
        ]
        lines += [f"    {'peak ' + k:<20} {_flops_text(v):>16}" for k, v in spec.peak_flops]
        lines.append(f"    {'memory bandwidth':<20} {f'{spec.mem_bandwidth / GB:.1f} GB/s':>16}")
        lines.append(f"    {'memory':<20} {f'{spec.memory_bytes / GB:.1f} GB':>16}")
        lines.append("  link levels, innermost first:")
        lines.append(
            f"    {'level':<14} {'group':>5} {'GB/s/dir':>9} {'latency':>9} {'shared':>6}  source"
        )
        for level in self.levels:
            lines.append(
                f"    {level.name:<14} {level.group_size:>5} {level.bandwidth / GB:>9.2f} "
                f"{level.latency / US:>7.1f}us {level.shared_by:>6}  {level.source}"
            )
        return "\n".join(lines)

    # ---- internals ----------------------------------------------------------------------

    def _axis_level_indices(
        self, mesh_shape: Sequence[int], device_ids: np.ndarray | None
    ) -> tuple[int, ...]:
        ids = self.check_mesh(mesh_shape, device_ids)
        return tuple(int(self._row_levels(_axis_groups(ids, a)).max()) for a in range(ids.ndim))

    def _row_levels(self, rows: np.ndarray) -> np.ndarray:
        """Level index spanned by each row of a (groups, members) id array."""
        result = np.full(rows.shape[0], len(self.levels) - 1)
        # Walk outward-in so each row ends at the innermost level whose block holds it.
        for index in range(len(self.levels) - 1, -1, -1):
            blocks = rows // self.levels[index].group_size
            inside = (blocks == blocks[:, :1]).all(axis=1)
            result[inside] = index
        return result

    def _group_bandwidth(self, groups: np.ndarray, level_index: int) -> float:
        """Bandwidth per device for `groups` running concurrently on level `level_index`."""
        level = self.levels[level_index]
        if level_index == 0 or level.shared_by == 1:
            return level.bandwidth
        block_size = self.levels[level_index - 1].group_size
        ports_per_block = block_size // level.shared_by
        crossing = groups[self._row_levels(groups) == level_index]
        # Count, for every inner block, the crossing groups that pass through it.
        passes = np.zeros(self.num_devices // block_size, dtype=int)
        for row in crossing:
            passes[np.unique(row // block_size)] += 1
        contention = max(1, math.ceil(int(passes.max(initial=0)) / ports_per_block))
        return level.bandwidth / contention

    def _check_ids(self, ids: np.ndarray) -> None:
        if not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"device ids must be integers, got dtype {ids.dtype}")
        bad = ids[(ids < 0) | (ids >= self.num_devices)]
        if bad.size:
            raise ValueError(self._out_of_range_message(bad.tolist()))

    def _out_of_range_message(self, bad: list[int]) -> str:
        return (
            f"device ids {sorted(set(bad))} are out of range for cluster {self.name!r} "
            f"({self._size_label()}), whose devices are 0..{self.num_devices - 1}"
        )

    def _size_label(self) -> str:
        """How `Cluster.preset` would size this cluster: "nodes=2" or "devices=6"."""
        preset = _PRESETS.get(self.name)
        if preset is not None and preset.network is not None:
            per_node = preset.node_link.group_size
            if self.levels[0].group_size == per_node and self.num_devices % per_node == 0:
                return f"nodes={self.num_devices // per_node}"
        return f"devices={self.num_devices}"

    def _too_small_message(self, needed: int) -> str:
        head = (
            f"cluster {self.name!r} ({self._size_label()}) has {self.num_devices} devices "
            f"but the mesh needs {needed} devices"
        )
        preset = _PRESETS.get(self.name)
        if preset is None:
            return f"{head}; use a cluster with at least {needed} devices or a smaller mesh"
        if preset.network is None:
            return f"{head}; pass Cluster.preset({self.name!r}, devices={needed}) or a smaller mesh"
        nodes = math.ceil(needed / preset.node_link.group_size)
        sizing = f", nodes={nodes}" if nodes > 1 else ""
        return f"{head}; pass Cluster.preset({self.name!r}{sizing}) or a smaller mesh"


# ---- module helpers -------------------------------------------------------------------------


def _dtype_name(dtype: object) -> str:
    """Name of a dtype given as a string, np.float32, np.dtype("float32"), jnp.bfloat16, ..."""
    if isinstance(dtype, str):
        return dtype
    return np.dtype(dtype).name  # type: ignore[call-overload]


def _flops_text(flops: float) -> str:
    """'10.60 TFLOP/s', or '50.0 GFLOP/s' below one TFLOP/s (CPU numbers)."""
    return f"{flops / TFLOPS:.2f} TFLOP/s" if flops >= TFLOPS else f"{flops / 1e9:.1f} GFLOP/s"


def _lookup_preset(name: str) -> _Preset:
    if name not in _PRESETS:
        raise ValueError(f"unknown cluster preset {name!r}; presets: {', '.join(_PRESETS)}")
    return _PRESETS[name]


def _match_gpu_kind(device_kind: str) -> str | None:
    kind = device_kind.upper()
    return next((preset for key, preset in _GPU_KINDS if key.upper() in kind), None)


def _build(
    name: str, preset: _Preset, num_devices: int, devices_per_node: int | None = None
) -> Cluster:
    """A cluster of `num_devices` of a preset's devices: one node if they fit, else nodes."""
    per_node = devices_per_node or preset.node_link.group_size
    if preset.network is None or num_devices <= per_node:
        levels = (replace(preset.node_link, group_size=num_devices),)
        return Cluster(name=name, device=preset.device, num_devices=num_devices, levels=levels)
    if num_devices % per_node:
        raise ValueError(
            f"{num_devices} devices do not split into nodes of {per_node} "
            f"({preset.summary}); use a multiple of {per_node}, or at most {per_node} for "
            f"part of one node"
        )
    levels = (
        replace(preset.node_link, group_size=per_node),
        replace(preset.network, group_size=num_devices, shared_by=_sharing(preset, per_node)),
    )
    return Cluster(name=name, device=preset.device, num_devices=num_devices, levels=levels)


def _sharing(preset: _Preset, per_node: int) -> int:
    """`shared_by` of the network level for nodes of `per_node` devices.

    A preset with one network card per node (shared_by == its node size) keeps one card per
    node at any node size; one with a card per device keeps that.
    """
    assert preset.network is not None
    if preset.network.shared_by == preset.node_link.group_size:
        return per_node
    return math.gcd(preset.network.shared_by, per_node)


def _check_levels(name: str, num_devices: int, levels: tuple[LinkLevel, ...]) -> None:
    """Raise ValueError unless `levels` nest as Cluster.levels documents."""
    if num_devices < 1:
        raise ValueError(f"cluster {name!r}: num_devices must be >= 1, got {num_devices}")
    if not levels:
        raise ValueError(f"cluster {name!r}: needs at least one link level")
    sizes = [level.group_size for level in levels]
    if sizes[-1] != num_devices:
        raise ValueError(
            f"cluster {name!r}: the outermost level's group ({sizes[-1]}) must be the whole "
            f"cluster ({num_devices} devices)"
        )
    for inner, outer in pairwise(sizes):
        if inner < 1 or outer <= inner or outer % inner:
            raise ValueError(
                f"cluster {name!r}: level group sizes {sizes} must grow, each dividing the next"
            )
    for index, level in enumerate(levels):
        if level.bandwidth <= 0 or level.latency < 0:
            raise ValueError(f"cluster {name!r}: level {level.name!r} needs bandwidth > 0")
        inner_size = sizes[index - 1] if index else 1
        if level.shared_by < 1 or inner_size % level.shared_by:
            raise ValueError(
                f"cluster {name!r}: level {level.name!r} shared_by={level.shared_by} must divide "
                f"the inner group size {inner_size}"
            )


def _mesh_shape(mesh_shape: Sequence[int]) -> tuple[int, ...]:
    shape = tuple(int(n) for n in mesh_shape)
    if not shape or any(n < 1 for n in shape):
        raise ValueError(f"mesh shape must be a non-empty tuple of positive sizes, got {shape}")
    return shape


def _axis_groups(ids: np.ndarray, axis: int) -> np.ndarray:
    """The groups of a mesh axis as rows: index `axis` varies, all other indices fixed."""
    return np.moveaxis(ids, axis, -1).reshape(-1, ids.shape[axis])
