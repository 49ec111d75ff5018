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

Devices may differ (AccPar's heterogeneous arrays, §2.3 and §6.2): `Cluster.groups` lists
*device groups*, consecutive blocks of ids that share one `DeviceSpec` (AccPar's computation
density c_i) and one per-device link bandwidth (AccPar's network bandwidth b_i)::

    accpar-tpu         ids 0 .. 127 | 128 .. 255
    groups             [TPU-v2 x 128] [TPU-v3 x 128]   c = 180 / 420 TFLOP/s, b = 1 / 2 GB/s
    level 0 network    [0 .. 255]                       one flat fabric (AccPar models no other)

A group's devices drive at most their own link bandwidth on any level, so a transfer or ring
between two devices runs at min(level bandwidth, b_a, b_b) (`Cluster.bandwidth_between`,
`Cluster.axis_bandwidths`). Per-device arrays of c_i and b_i (`Cluster.device_flops`,
`Cluster.device_bandwidth`) feed the formulas of `hetero.py` (AccPar Eq. 7-10). A cluster with
no groups is homogeneous: every device is `Cluster.device`, as before.

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
class DeviceGroup:
    """A block of consecutive device ids of one kind (AccPar: same c_i and b_i for all of them).

    `Cluster.groups` lists the groups in id order: the first holds ids 0 .. count-1, the next
    the following ids, and so on. Two groups may share a kind (equal spec and bandwidths); the
    cluster is heterogeneous when it has more than one kind.
    """

    name: str  # label for reports, e.g. "tpu-v2" or "a100-node"
    device: DeviceSpec  # spec of every device in the group (AccPar's c_i is device.flops(dtype))
    count: int  # number of devices in the group
    # Bytes/s per direction one device of the group can drive on any link level (its port
    # rate; AccPar's b_i). A transfer runs at min(level bandwidth, b of each end). None: the
    # device never limits a level below the level's own bandwidth.
    link_bandwidth: float | None = None
    # Per-level caps, (level name, bytes/s per direction) pairs, e.g. an A100 reaches 300 GB/s
    # on "nvlink" but 25 GB/s on "infiniband" (one HDR card per GPU). Combined with
    # link_bandwidth by taking the smaller. A Mapping is accepted and stored as a sorted tuple.
    level_bandwidths: tuple[tuple[str, float], ...] = ()
    source: str = ""  # where the group's numbers come from; shown by Cluster.describe

    def __post_init__(self) -> None:
        pairs = self.level_bandwidths
        pairs = pairs.items() if isinstance(pairs, Mapping) else pairs
        table = tuple(sorted((str(k), float(v)) for k, v in pairs))
        object.__setattr__(self, "level_bandwidths", table)
        if not isinstance(self.count, (int, np.integer)) or self.count < 1:
            raise ValueError(
                f"device group {self.name!r}: count must be an integer >= 1, got {self.count!r}"
            )
        object.__setattr__(self, "count", int(self.count))
        if self.link_bandwidth is not None:
            if not self.link_bandwidth > 0:
                raise ValueError(
                    f"device group {self.name!r}: link_bandwidth must be > 0 bytes/s (or None "
                    f"for no limit), got {self.link_bandwidth}"
                )
            object.__setattr__(self, "link_bandwidth", float(self.link_bandwidth))
        if any(not v > 0 for _, v in table):
            raise ValueError(f"device group {self.name!r}: level_bandwidths must all be > 0")

    def bandwidth_cap(self, level_name: str) -> float:
        """Bytes/s per direction one device of the group can drive on level `level_name`.

        The smaller of `link_bandwidth` and the level's entry in `level_bandwidths`; infinity
        when neither is set (the level's own bandwidth is then the only limit).
        """
        caps = [v for k, v in self.level_bandwidths if k == level_name]
        if self.link_bandwidth is not None:
            caps.append(self.link_bandwidth)
        return min(caps, default=math.inf)

    def kind(self) -> tuple[DeviceSpec, float | None, tuple[tuple[str, float], ...]]:
        """What makes two groups' devices interchangeable: spec and bandwidth caps."""
        return (self.device, self.link_bandwidth, self.level_bandwidths)


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


@dataclass(frozen=True)
class _GroupedPreset:
    """How to build a cluster of several device kinds in equal numbers (AccPar §6.2 style)."""

    # One group per kind, slowest first, so that Cluster.device (the first group's spec) is the
    # slowest part; count = devices of the kind at the preset's default size.
    kinds: tuple[DeviceGroup, ...]
    # Link inside one node; group_size = devices per node, and every node holds one kind. None
    # for a flat fabric, where all devices talk through `network` alone.
    node_link: LinkLevel | None
    network: LinkLevel  # link between nodes (or between all devices of a flat fabric)
    summary: str  # one line for error messages


# AccPar §6.1 / Table 7. "An accelerator is a board that holds the processing units -- 2 cores per
# chip and 4 chip per board": every number below is per *board* (4 chips, 8 TensorCores), and
# one device of these presets is one board. The paper trains in bfloat16 and gives one FLOP/s
# figure; XLA:TPU runs float32 matmuls as one bf16 pass at its default precision, so float32
# gets the same figure (HIGHEST precision would be several times slower).
_TPU_V2_BOARD = DeviceSpec(
    name="TPU-v2 board (4 chips)",
    peak_flops={"float32": 180 * TFLOPS, "bfloat16": 180 * TFLOPS},  # Table 7: "180T"
    # Table 7: 2400 GB/s (= 4 chips x 600 GB/s, the Cloud TPU v2 per-chip figure).
    mem_bandwidth=2400 * GB,
    memory_bytes=64 * GB,  # Table 7: "64GB" HBM (4 chips x 16 GiB)
    source="AccPar Table 7 / §6.1 (per board of 4 chips; Cloud TPU v2: 45 TFLOP/s, 16 GiB, "
    "600 GB/s per chip)",
)
_TPU_V3_BOARD = DeviceSpec(
    name="TPU-v3 board (4 chips)",
    peak_flops={"float32": 420 * TFLOPS, "bfloat16": 420 * TFLOPS},  # Table 7: "420T"
    # Table 7: 4800 GB/s, which §6.1 says is *assumed* ("not available"); the Cloud TPU v3
    # page now gives 900 GB/s per chip, i.e. 3600 GB/s per board. We keep the paper's number.
    mem_bandwidth=4800 * GB,
    memory_bytes=128 * GB,  # Table 7: "128GB" HBM (4 chips x 32 GiB)
    source="AccPar Table 7 / §6.1 (per board of 4 chips; 4800 GB/s is the paper's assumption, "
    "Cloud TPU v3 gives 900 GB/s per chip)",
)
# AccPar §6.1: "the maximum data rate per core is 2Gb/s [166]. We set the network data rate for
# TPU-v2 as 8Gb/s and that for TPU-v3 as 16Gb/s." Gigabits: 8 Gb/s = 1 GB/s, 16 Gb/s = 2 GB/s.
# AccPar's cost model (Eq. 7, Tables 4-5) has no topology: every transfer costs A(T) / b_i with
# the device's own b_i. So one flat level whose bandwidth is the fastest b_i (it never binds
# below a device's own rate) and no latency term; the groups carry b_i.
_ACCPAR_NETWORK = LinkLevel(
    name="network",
    group_size=256,  # placeholder: set to the cluster size when built
    bandwidth=2 * GB,  # 16 Gb/s, the TPU-v3 board's b_i
    latency=0.0,  # AccPar's Eq. 7 has no latency term
    source="AccPar §6.1: flat network, per-board data rate b_i (TPU-v2 8 Gb/s, TPU-v3 16 Gb/s)",
)
_ACCPAR_TPU_V2 = DeviceGroup(
    name="tpu-v2",
    device=_TPU_V2_BOARD,
    count=128,  # AccPar §6.2: 128 TPU-v2 + 128 TPU-v3
    link_bandwidth=1 * GB,  # §6.1: 8 Gb/s
    source="AccPar §6.1-6.2: 128 boards, network data rate 8 Gb/s",
)
_ACCPAR_TPU_V3 = DeviceGroup(
    name="tpu-v3",
    device=_TPU_V3_BOARD,
    count=128,  # §6.2 (heterogeneous array) and §6.3 (homogeneous array): 128 TPU-v3
    link_bandwidth=2 * GB,  # §6.1: 16 Gb/s
    source="AccPar §6.1-6.3: 128 boards, network data rate 16 Gb/s",
)
_ACCPAR_TPU = _GroupedPreset(
    kinds=(_ACCPAR_TPU_V2, _ACCPAR_TPU_V3),
    node_link=None,
    network=_ACCPAR_NETWORK,
    summary="AccPar §6.2 array: TPU-v2 and TPU-v3 boards in equal numbers, flat network",
)
_ACCPAR_TPU_HOMOGENEOUS = _GroupedPreset(
    kinds=(_ACCPAR_TPU_V3,),
    node_link=None,
    network=_ACCPAR_NETWORK,
    summary="AccPar §6.3 array: TPU-v3 boards only, flat network",
)

# A100: NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB column; tensor rates dense, i.e. half
# the "with sparsity" figures) and the NVIDIA DGX A100 datasheet.
_A100_SXM4_80GB = DeviceSpec(
    name="A100-SXM4-80GB",
    peak_flops={
        "float64": 19.5 * TFLOPS,  # FP64 tensor core (as the H100 preset)
        "float32": 19.5 * TFLOPS,  # FP32 (CUDA cores)
        "tensorfloat32": 156 * TFLOPS,  # TF32 tensor core, dense (312 sparse)
        "bfloat16": 312 * TFLOPS,  # BF16 tensor core, dense (624 sparse)
        "float16": 312 * TFLOPS,  # FP16 tensor core, dense (624 sparse)
    },
    mem_bandwidth=2039 * GB,  # datasheet: HBM2e at 2,039 GB/s (80GB SXM)
    memory_bytes=80 * GB,  # datasheet: 80 GB
    source="NVIDIA A100 datasheet (SXM4 80GB; dense tensor-core rates)",
)
_MIXED_A100 = DeviceGroup(
    name="a100-node",
    device=_A100_SXM4_80GB,
    count=8,  # DGX A100: eight GPUs per node
    level_bandwidths={
        # NVLink 3 through NVSwitch: 600 GB/s bidirectional per GPU = 300 GB/s per direction.
        "nvlink": 300 * GB,
        # DGX A100: 8 x 200 Gb/s HDR ConnectX-6, one per GPU = 25 GB/s per direction. Traffic
        # between an A100 and an H100 node runs at this slower side.
        "infiniband": 25 * GB,
    },
    source="DGX A100 datasheet: NVLink 3 / NVSwitch 600 GB/s bidirectional per GPU; "
    "8 x 200 Gb/s HDR ConnectX-6, one per GPU",
)
_MIXED_H100 = DeviceGroup(
    name="h100-node",
    device=_DGX_H100.device,
    count=8,  # DGX H100: eight GPUs per node
    # No caps: the link levels carry the H100 numbers (NVLink 4 450 GB/s, NDR 50 GB/s per GPU).
    source="DGX H100 datasheet (the link levels' own numbers)",
)
_MIXED_GPU = _GroupedPreset(
    kinds=(_MIXED_A100, _MIXED_H100),
    node_link=replace(
        _DGX_H100.node_link,
        source="DGX H100/A100 datasheets: NVSwitch in each node; 450 GB/s/direction (NVLink 4), "
        "A100 nodes capped at 300 (NVLink 3)",
    ),
    network=replace(
        _DGX_H100.network,
        source="DGX H100 datasheet: 400 Gb/s NDR per GPU; A100 nodes capped at 200 Gb/s HDR",
    ),
    summary="nodes of 8 x A100-SXM4 and nodes of 8 x H100-SXM5 in equal numbers, InfiniBand",
)

_PRESETS: dict[str, _Preset] = {"p100": _P100, "dgx-h100": _DGX_H100, "cpu": _CPU}
_GROUPED_PRESETS: dict[str, _GroupedPreset] = {
    "accpar-tpu": _ACCPAR_TPU,
    "accpar-tpu-homogeneous": _ACCPAR_TPU_HOMOGENEOUS,
    "mixed-gpu": _MIXED_GPU,
}
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

    name: str  # preset name ("p100", "dgx-h100", "cpu", ...) or a label for a hand-built cluster
    # Homogeneous cluster: every device's spec. Heterogeneous: the first group's spec (device 0;
    # the presets list their slowest kind first, so this is a conservative stand-in for code
    # that reads one spec). Read per-device specs through device_spec(i).
    device: DeviceSpec
    num_devices: int  # devices in the cluster, numbered 0 .. num_devices - 1
    # Link levels, innermost first; level L's groups are consecutive blocks of
    # levels[L].group_size ids, each group size divides the next, the last is num_devices.
    levels: tuple[LinkLevel, ...]
    # Device groups in id order (counts sum to num_devices); empty: homogeneous, all `device`.
    # Unless the cluster has a single, flat level, every block of the innermost level (a node)
    # lies inside one group. Build with Cluster.from_groups to get `device` and `num_devices`.
    groups: tuple[DeviceGroup, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "levels", tuple(self.levels))
        object.__setattr__(self, "groups", tuple(self.groups))
        _check_levels(self.name, self.num_devices, self.levels)
        _check_groups(self)

    # ---- construction -------------------------------------------------------------------

    @classmethod
    def presets(cls) -> list[str]:
        """Names accepted by `Cluster.preset`."""
        return _preset_names()

    @classmethod
    def preset(cls, name: str, nodes: int = 1, *, devices: int | None = None) -> Cluster:
        """A documented cluster.

        Homogeneous: "p100" (OptCNN §6), "dgx-h100", "cpu". `nodes` picks how many nodes a GPU
        preset has. `devices` sizes the "cpu" preset (default 8), and for a GPU preset asks for
        part of one node (devices <= per node) or a whole number of nodes.

        Heterogeneous, devices of each kind in equal numbers, slowest kind first (lowest ids):

        - "accpar-tpu": AccPar §6.2, 128 TPU-v2 + 128 TPU-v3 boards on one flat network.
          `devices=N` (even) gives N/2 of each; `nodes` must stay 1.
        - "accpar-tpu-homogeneous": AccPar §6.3, 128 TPU-v3 boards; `devices=N` gives N.
        - "mixed-gpu": nodes of 8 A100-SXM4-80GB and nodes of 8 H100-SXM5, NVSwitch inside a
          node, InfiniBand between. `nodes=k` means k nodes *of each kind* (16k GPUs; default
          one A100 node + one H100 node). `devices=N` (even) gives N/2 of each kind: part of
          one node each (N <= 16) or whole nodes (N a multiple of 16).
        """
        if nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {nodes}")
        if devices is not None and devices < 1:
            raise ValueError(f"devices must be >= 1, got {devices}")
        if name in _GROUPED_PRESETS:
            return _build_grouped(name, _GROUPED_PRESETS[name], nodes, devices)
        preset = _lookup_preset(name)
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
    def from_groups(
        cls, name: str, groups: Sequence[DeviceGroup], levels: Sequence[LinkLevel]
    ) -> Cluster:
        """A cluster of device groups: `device` is the first group's, `num_devices` the total."""
        groups = tuple(groups)
        if not groups:
            raise ValueError(f"cluster {name!r}: from_groups needs at least one device group")
        total = sum(group.count for group in groups)
        return cls(name, groups[0].device, total, tuple(levels), groups)

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

    @property
    def heterogeneous(self) -> bool:
        """True when devices differ: more than one kind (spec and bandwidth caps) of group."""
        return len({group.kind() for group in self.groups}) > 1

    def all_groups(self) -> tuple[DeviceGroup, ...]:
        """The device groups; a homogeneous cluster reports one implicit group of every device."""
        if self.groups:
            return self.groups
        return (DeviceGroup(self.device.name, self.device, self.num_devices),)

    def group_slices(self) -> tuple[slice, ...]:
        """Device-id range of each group of `all_groups()`, in order."""
        ends = np.cumsum([group.count for group in self.all_groups()]).tolist()
        return tuple(slice(start, end) for start, end in zip([0, *ends[:-1]], ends, strict=True))

    def group_ids(self) -> np.ndarray:
        """Index into `all_groups()` of every device: an int array of length num_devices."""
        counts = [group.count for group in self.all_groups()]
        return np.repeat(np.arange(len(counts)), counts)

    def group_of(self, device_id: int) -> int:
        """Index into `all_groups()` of the group holding `device_id`."""
        self._check_id(device_id)
        return int(self.group_ids()[device_id])

    def device_spec(self, device_id: int) -> DeviceSpec:
        """Spec of one device: its group's spec (`device` for a homogeneous cluster)."""
        self._check_id(device_id)
        if not self.groups:
            return self.device
        return self.groups[self.group_of(device_id)].device

    def device_flops(self, dtype: object) -> np.ndarray:
        """Peak FLOP/s of every device for `dtype` (AccPar's c_i): floats, length num_devices."""
        rates = [group.device.flops(dtype) for group in self.all_groups()]
        return np.asarray(rates, dtype=float)[self.group_ids()]

    def device_memory(self) -> np.ndarray:
        """Memory capacity in bytes of every device: floats, length num_devices."""
        sizes = [group.device.memory_bytes for group in self.all_groups()]
        return np.asarray(sizes, dtype=float)[self.group_ids()]

    def device_bandwidth(self, level: int = -1) -> np.ndarray:
        """Bytes/s per direction every device drives on link level `level` (AccPar's b_i).

        min(levels[level].bandwidth, the device's own cap on that level); no port sharing
        (see `axis_bandwidths` for that). Default: the outermost level, where AccPar's
        transfers between accelerator groups run. Floats, length num_devices.
        """
        link = self.levels[level]  # IndexError for a bad level, as for any tuple
        return np.minimum(link.bandwidth, self._device_caps(link.name))

    def bandwidth_between(self, a: int, b: int) -> float:
        """Bytes/s per direction of a transfer between devices a and b (no contention).

        The bandwidth of the innermost level holding both, limited by each end's own cap:
        a transfer between groups runs at the slower device's b_i or the level's bandwidth,
        whichever is smaller.
        """
        index = self.level_index((a, b))
        caps = self._device_caps(self.levels[index].name)
        return float(min(self.levels[index].bandwidth, caps[a], caps[b]))

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

        With device groups, a ring also runs no faster than its slowest member's own cap
        (`DeviceGroup.link_bandwidth`, `level_bandwidths`); the axis reports its slowest ring.
        """
        ids = self.check_mesh(mesh_shape, device_ids)
        result = []
        for axis, level in enumerate(self._axis_level_indices(mesh_shape, ids)):
            rows = _axis_groups(ids, axis)
            bandwidth = self._group_bandwidth(rows, level)
            if self.groups and rows.shape[1] > 1:
                # Heterogeneous: every ring also runs at its slowest member's own cap.
                bandwidth = min(bandwidth, self._rows_cap(rows))
            result.append(bandwidth)
        return tuple(result)

    def axis_device_groups(
        self, mesh_shape: Sequence[int], axis: int, device_ids: np.ndarray | None = None
    ) -> tuple[tuple[int, ...], ...]:
        """For each collective group along mesh axis `axis`, the device groups it spans.

        Collective groups are ordered as the other axes' indices in row-major order; each entry
        is the sorted indices into `all_groups()` of the devices in it.
        """
        rows = self._axis_rows(mesh_shape, axis, device_ids)
        members = self.group_ids()[rows]
        return tuple(tuple(int(g) for g in np.unique(row)) for row in members)

    def axis_spans_groups(
        self, mesh_shape: Sequence[int], axis: int, device_ids: np.ndarray | None = None
    ) -> bool:
        """Whether some collective group along `axis` mixes device kinds (spec or bandwidth).

        When it does, an even split along the axis leaves the faster devices idle and a
        collective over it runs at the slower kind's bandwidth (AccPar §2.3).
        """
        rows = self._axis_rows(mesh_shape, axis, device_ids)
        kinds = self._kind_ids()[rows]
        return bool((kinds != kinds[:, :1]).any())

    def axis_device_bandwidths(
        self, mesh_shape: Sequence[int], axis: int, device_ids: np.ndarray | None = None
    ) -> np.ndarray:
        """Per device of the mesh (array shaped like it), its b_i in a collective along `axis`.

        Each device's collective group runs on the level it spans; the device drives the
        smaller of that level's bandwidth per device (split among the groups sharing a port, as
        in `axis_bandwidths`) and its own cap. A ring over the group runs at the smallest of
        its members' values, which is what `axis_bandwidths` reports per axis.
        """
        ids = self.check_mesh(mesh_shape, device_ids)
        rows = _axis_groups(ids, self._axis_index(ids, axis))
        row_levels = self._row_levels(rows)
        values = np.empty(rows.shape, dtype=float)
        for index in np.unique(row_levels).tolist():
            at_level = row_levels == index
            link = self.levels[index]
            shared = self._group_bandwidth(rows, index)
            values[at_level] = np.minimum(shared, self._device_caps(link.name)[rows[at_level]])
        moved = np.moveaxis(ids, self._axis_index(ids, axis), -1).shape
        return np.moveaxis(values.reshape(moved), -1, self._axis_index(ids, axis))

    # ---- reporting ----------------------------------------------------------------------

    def describe(self) -> str:
        """Human-readable table of the cluster's numbers and where each comes from."""
        if not self.groups:
            spec = self.device
            lines = [
                f"cluster {self.name!r} ({self._size_label()}): {self.num_devices} x {spec.name}",
                f"  device numbers: {spec.source or 'no source given'}",
                *_spec_lines(spec),
            ]
        else:
            parts = " + ".join(f"{group.count} x {group.device.name}" for group in self.groups)
            kind = "heterogeneous" if self.heterogeneous else "one kind"
            lines = [f"cluster {self.name!r} ({self._size_label()}, {kind}): {parts}"]
            for index, (group, ids) in enumerate(
                zip(self.groups, self.group_slices(), strict=True)
            ):
                lines.append(
                    f"  group {index} {group.name!r}: devices {ids.start}..{ids.stop - 1}, "
                    f"{group.count} x {group.device.name}"
                )
                lines.append(f"    device numbers: {group.device.source or 'no source given'}")
                lines += ["  " + line for line in _spec_lines(group.device)]
                for level in self.levels:  # the group's own b_i on each level it caps
                    cap = group.bandwidth_cap(level.name)
                    if math.isfinite(cap):
                        label = f"link cap {level.name}"
                        lines.append(f"      {label:<20} {f'{cap / GB:.2f} GB/s':>16}")
                if group.source:
                    lines.append(f"    group numbers: {group.source}")
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

    def _check_id(self, device_id: int) -> None:
        if not 0 <= device_id < self.num_devices:
            raise ValueError(self._out_of_range_message([device_id]))

    def _device_caps(self, level_name: str) -> np.ndarray:
        """Each device's own cap (bytes/s) on the level named `level_name`; inf for none."""
        caps = [group.bandwidth_cap(level_name) for group in self.all_groups()]
        return np.asarray(caps, dtype=float)[self.group_ids()]

    def _rows_cap(self, rows: np.ndarray) -> float:
        """Smallest own cap of any device in the rows, each on the level its row spans."""
        row_levels = self._row_levels(rows)
        cap = math.inf
        for index in np.unique(row_levels).tolist():
            caps = self._device_caps(self.levels[index].name)[rows[row_levels == index]]
            cap = min(cap, float(caps.min()))
        return cap

    def _kind_ids(self) -> np.ndarray:
        """Per device, an index of its kind (groups with equal spec and caps share one)."""
        kinds: dict[object, int] = {}
        per_group = [kinds.setdefault(group.kind(), len(kinds)) for group in self.all_groups()]
        return np.asarray(per_group, dtype=int)[self.group_ids()]

    def _axis_index(self, ids: np.ndarray, axis: int) -> int:
        if not -ids.ndim <= axis < ids.ndim:
            raise ValueError(f"mesh axis {axis} out of range for a {ids.ndim}-axis mesh")
        return axis % ids.ndim

    def _axis_rows(
        self, mesh_shape: Sequence[int], axis: int, device_ids: np.ndarray | None
    ) -> np.ndarray:
        ids = self.check_mesh(mesh_shape, device_ids)
        return _axis_groups(ids, self._axis_index(ids, axis))

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
        grouped = _GROUPED_PRESETS.get(self.name)
        if grouped is not None and grouped.node_link is not None:
            per_size = grouped.node_link.group_size * len(grouped.kinds)
            full_nodes = self.levels[0].group_size == grouped.node_link.group_size
            if full_nodes and self.num_devices % per_size == 0:
                return f"nodes={self.num_devices // per_size}"
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
        grouped = _GROUPED_PRESETS.get(self.name)
        if grouped is not None:
            return f"{head}; pass {_grouped_hint(self.name, grouped, needed)} or a smaller mesh"
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


def _spec_lines(spec: DeviceSpec) -> list[str]:
    """describe() rows of one device spec: peak rates, memory bandwidth, memory."""
    lines = [f"    {'peak ' + k:<20} {_flops_text(v):>16}" for k, v in spec.peak_flops]
    lines.append(f"    {'memory bandwidth':<20} {f'{spec.mem_bandwidth / GB:.1f} GB/s':>16}")
    lines.append(f"    {'memory':<20} {f'{spec.memory_bytes / GB:.1f} GB':>16}")
    return lines


def _preset_names() -> list[str]:
    return [*_PRESETS, *_GROUPED_PRESETS]


def _lookup_preset(name: str) -> _Preset:
    if name not in _PRESETS:
        raise ValueError(f"unknown cluster preset {name!r}; presets: {', '.join(_preset_names())}")
    return _PRESETS[name]


def _build_grouped(name: str, preset: _GroupedPreset, nodes: int, devices: int | None) -> Cluster:
    """A cluster of a grouped preset, sized as `Cluster.preset` documents."""
    kinds = len(preset.kinds)
    if devices is not None and nodes != 1:
        raise ValueError("pass either nodes= or devices=, not both")
    if preset.node_link is None:
        if nodes != 1:
            default = kinds * preset.kinds[0].count
            raise ValueError(
                f"preset {name!r} is one flat network ({preset.summary}): size it with "
                f"devices= (default {default}), not nodes="
            )
        total = devices if devices is not None else kinds * preset.kinds[0].count
    else:
        total = devices if devices is not None else nodes * kinds * preset.node_link.group_size
    if total % kinds:
        raise ValueError(
            f"preset {name!r} has {kinds} device kinds in equal numbers ({preset.summary}): "
            f"devices must be a multiple of {kinds}, got {total}"
        )
    per_kind = total // kinds
    if preset.node_link is None:
        levels: tuple[LinkLevel, ...] = (replace(preset.network, group_size=total),)
    else:
        per_node = preset.node_link.group_size
        if per_kind > per_node and per_kind % per_node:
            raise ValueError(
                f"{total} devices give {per_kind} of each kind, which do not split into nodes "
                f"of {per_node} ({preset.summary}); use a multiple of {kinds * per_node}, or "
                f"at most {kinds * per_node} for part of one node of each kind"
            )
        inner = min(per_kind, per_node)
        node_level = replace(preset.node_link, group_size=inner)
        if inner == total:
            levels = (node_level,)
        else:
            shared = math.gcd(preset.network.shared_by, inner)
            network = replace(preset.network, group_size=total, shared_by=shared)
            levels = (node_level, network)
    if kinds == 1:
        # One kind: a plain homogeneous cluster, its caps folded into the levels.
        only = preset.kinds[0]
        levels = tuple(
            replace(level, bandwidth=min(level.bandwidth, only.bandwidth_cap(level.name)))
            for level in levels
        )
        return Cluster(name=name, device=only.device, num_devices=total, levels=levels)
    groups = tuple(replace(kind, count=per_kind) for kind in preset.kinds)
    return Cluster.from_groups(name, groups, levels)


def _grouped_hint(name: str, preset: _GroupedPreset, needed: int) -> str:
    """The `Cluster.preset` call of a grouped preset that holds `needed` devices."""
    kinds = len(preset.kinds)
    per_kind = math.ceil(needed / kinds)
    if preset.node_link is None:
        return f"Cluster.preset({name!r}, devices={per_kind * kinds})"
    nodes = math.ceil(per_kind / preset.node_link.group_size)
    sizing = f", nodes={nodes}" if nodes > 1 else ""
    return f"Cluster.preset({name!r}{sizing})"


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


def _check_groups(cluster: Cluster) -> None:
    """Raise ValueError unless `cluster.groups` fits the cluster as Cluster.groups documents."""
    groups, name = cluster.groups, cluster.name
    if not groups:
        return
    if not all(isinstance(group, DeviceGroup) for group in groups):
        raise ValueError(f"cluster {name!r}: groups must be DeviceGroup objects")
    total = sum(group.count for group in groups)
    if total != cluster.num_devices:
        counts = " + ".join(f"{group.name}: {group.count}" for group in groups)
        raise ValueError(
            f"cluster {name!r}: device groups hold {total} devices ({counts}) but num_devices is "
            f"{cluster.num_devices}; the counts must sum to num_devices"
        )
    if cluster.device != groups[0].device:
        raise ValueError(
            f"cluster {name!r}: device must be the first group's spec "
            f"({groups[0].device.name!r}), got {cluster.device.name!r}; "
            f"Cluster.from_groups sets it"
        )
    level_names = {level.name for level in cluster.levels}
    for group in groups:
        unknown = sorted({k for k, _ in group.level_bandwidths} - level_names)
        if unknown:
            raise ValueError(
                f"cluster {name!r}: group {group.name!r} caps levels {unknown}, but the "
                f"cluster's levels are {[level.name for level in cluster.levels]}"
            )
    if len(cluster.levels) == 1:
        return  # one flat level: every device reaches every other the same way, any split fits
    inner = cluster.levels[0]
    start = 0
    for group in groups:
        stop = start + group.count
        if start % inner.group_size or stop % inner.group_size:
            raise ValueError(
                f"cluster {name!r}: group {group.name!r} (devices {start}..{stop - 1}) splits a "
                f"block of the innermost level {inner.name!r} ({inner.group_size} devices): "
                f"every node must hold one device kind, so group counts must be multiples of "
                f"{inner.group_size} (a flat single-level cluster may split anywhere)"
            )
        start = stop


def _mesh_shape(mesh_shape: Sequence[int]) -> tuple[int, ...]:
    shape = tuple(int(n) for n in mesh_shape)
    if not shape or any(n < 1 for n in shape):
        raise ValueError(f"mesh shape must be a non-empty tuple of positive sizes, got {shape}")
    return shape


def _axis_groups(ids: np.ndarray, axis: int) -> np.ndarray:
    """The groups of a mesh axis as rows: index `axis` varies, all other indices fixed."""
    return np.moveaxis(ids, axis, -1).reshape(-1, ids.shape[axis])
