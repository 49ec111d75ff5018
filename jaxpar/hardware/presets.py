"""Datasheet presets: the clusters `Cluster.preset` builds, every number with its source.

Homogeneous presets ("p100", "dgx-h100", "cpu") are one device kind in nodes; grouped presets
("accpar-tpu", "accpar-tpu-homogeneous", "mixed-gpu") hold several kinds in equal numbers,
slowest first. `preset_layout` sizes a preset (nodes= or devices=), `detect_layout` picks one
for the strings jax reports (`platform`, `device_kind`), and `preset_sizing` gives the smallest
size of a preset that holds a mesh. They return a `ClusterLayout`, the arguments of `Cluster`,
so this module does not depend on the topology model; `cluster.Cluster` builds from them.

Pure module: no jax import (not even numpy).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace
from typing import NamedTuple

from .devices import GB, TFLOPS, US, DeviceGroup, DeviceSpec, LinkLevel


class ClusterLayout(NamedTuple):
    """The arguments of `Cluster(...)` for one sized preset (what `Cluster.preset` builds)."""

    name: str
    device: DeviceSpec
    num_devices: int
    levels: tuple[LinkLevel, ...]
    groups: tuple[DeviceGroup, ...] = ()


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
        source="OptCNN §6 (NVLink in a node); NVLink 1.0: 20 GB/s/link/direction; latency: NCCL "
        "tuning model (hwLat), NVLink ring step ~0.5-3.4 us",
    ),
    network=LinkLevel(
        name="infiniband",
        group_size=8,  # placeholder: set to the cluster size when built
        bandwidth=12.5 * GB,  # OptCNN §6: 100 Gb/s EDR InfiniBand = 12.5 GB/s per direction
        # NCCL's tuning model puts a network ring step at ~2-14 us; 5 us is typical for EDR.
        latency=5 * US,
        # The paper does not say how many cards a node has; assume one, shared by its 4 GPUs.
        shared_by=4,
        source="OptCNN §6: 100 Gb/s EDR InfiniBand between nodes (one HCA per node assumed); "
        "latency: NCCL tuning model, network ring step ~2-14 us",
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
        source="DGX H100 datasheet: NVLink 4 / NVSwitch, 900 GB/s bidirectional per GPU; latency: "
        "NCCL tuning model (order of magnitude)",
    ),
    network=LinkLevel(
        name="infiniband",
        group_size=16,  # placeholder: set to the cluster size when built
        bandwidth=50 * GB,  # one 400 Gb/s ConnectX-7 per GPU = 50 GB/s per direction
        latency=5 * US,  # order of magnitude of NCCL's network ring step
        shared_by=1,  # 8 NICs for 8 GPUs: no sharing
        source="DGX H100 datasheet: 8 x 400 Gb/s ConnectX-7 (NDR InfiniBand), one per GPU; "
        "latency: NCCL tuning model (order of magnitude)",
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
        source="assumed in-process copy rate and collective rendezvous latency (not measured)",
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
    source="AccPar §6.1: flat network, per-board data rate b_i (TPU-v2 8 Gb/s, TPU-v3 16 Gb/s); "
    "no latency (AccPar Eq. 7 has no latency term)",
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
        "A100 nodes capped at 300 (NVLink 3); latency: NCCL tuning model (order of magnitude)",
    ),
    network=replace(
        _DGX_H100.network,
        source="DGX H100 datasheet: 400 Gb/s NDR per GPU; A100 nodes capped at 200 Gb/s HDR; "
        "latency: NCCL tuning model (order of magnitude)",
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


# ---- building and sizing ---------------------------------------------------------------------


def preset_names() -> list[str]:
    """Names accepted by `Cluster.preset`: the homogeneous presets, then the grouped ones."""
    return [*_PRESETS, *_GROUPED_PRESETS]


def preset_summary(name: str) -> str:
    """One line saying what preset `name` is (devices, links, paper); unknown names raise."""
    if name in _GROUPED_PRESETS:
        return _GROUPED_PRESETS[name].summary
    return _lookup_preset(name).summary


def preset_network(name: str) -> LinkLevel | None:
    """The link between the nodes of preset `name`, None for a one-host or flat preset.

    `Cluster.describe` shows it for a one-node cluster of a multi-node preset, whose own levels
    stop at the node. Unknown names raise the `Cluster.preset` error.
    """
    grouped = _GROUPED_PRESETS.get(name)
    if grouped is not None:
        return grouped.network if grouped.node_link is not None else None
    return _lookup_preset(name).network


def preset_layout(name: str, nodes: int = 1, devices: int | None = None) -> ClusterLayout:
    """What `Cluster.preset(name, nodes, devices=devices)` builds; its docstring has the rules."""
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


def preset_sizing(name: str, num_devices: int) -> dict[str, int]:
    """`Cluster.preset` keywords for the smallest cluster of preset `name` holding `num_devices`.

    A multi-node preset gets the smallest whole number of nodes ({"nodes": k}); a one-host
    preset ("cpu") exactly the devices asked for ({"devices": n}). A grouped preset keeps its
    kinds in equal numbers, so a mesh over its first devices spans every kind: ceil(n / kinds)
    devices of each, as part of one node per kind or on a flat network ({"devices": ...}), or
    as whole nodes of each kind ({"nodes": k}). Unknown names raise the `Cluster.preset` error.
    """
    if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1:
        raise ValueError(f"a cluster must hold at least 1 device, got {num_devices!r}")
    grouped = _GROUPED_PRESETS.get(name)
    if grouped is not None:
        kinds = len(grouped.kinds)
        per_kind = -(-num_devices // kinds)
        if grouped.node_link is None or per_kind < grouped.node_link.group_size:
            return {"devices": kinds * per_kind}
        return {"nodes": -(-per_kind // grouped.node_link.group_size)}
    preset = _lookup_preset(name)
    if preset.network is None:
        return {"devices": num_devices}
    return {"nodes": -(-num_devices // preset.node_link.group_size)}


def detect_layout(
    platform: str, device_kind: str, num_devices: int, devices_per_node: int | None = None
) -> ClusterLayout:
    """What `Cluster.from_device_kind` builds; its docstring has the rules."""
    if num_devices < 1:
        raise ValueError(f"num_devices must be >= 1, got {num_devices}")
    if devices_per_node is not None and devices_per_node < 1:
        raise ValueError(f"devices_per_node must be >= 1, got {devices_per_node}")
    platform = platform.lower()
    if platform == "cpu":
        return preset_layout("cpu", devices=num_devices)
    if platform not in ("gpu", "cuda", "rocm", "tpu"):
        raise ValueError(f"unknown platform {platform!r}; expected cpu, gpu or tpu")
    name = _match_gpu_kind(device_kind) if platform != "tpu" else None
    if name is None:
        warnings.warn(
            f"no cluster preset for {platform} device kind {device_kind!r}: using placeholder "
            f"numbers; pass a Cluster (Cluster.preset or hand-built) for a trustworthy plan",
            UserWarning,
            stacklevel=3,  # the caller of Cluster.from_device_kind
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


# ---- labels and error texts ------------------------------------------------------------------


def size_label(name: str, num_devices: int, inner_size: int) -> str:
    """How `Cluster.preset` would size a cluster: "nodes=2", "nodes=1 of each kind" (a grouped
    preset of whole nodes: `nodes=` counts the nodes of each device kind) or "devices=6".

    `inner_size` is the group size of the cluster's innermost level (devices per node).
    """
    grouped = _GROUPED_PRESETS.get(name)
    if grouped is not None and grouped.node_link is not None:
        per_size = grouped.node_link.group_size * len(grouped.kinds)
        full_nodes = inner_size == grouped.node_link.group_size
        if full_nodes and num_devices % per_size == 0:
            # nodes= counts the nodes of each kind: say so, the cluster has `kinds` times more
            return f"nodes={num_devices // per_size} of each kind"
    preset = _PRESETS.get(name)
    if preset is not None and preset.network is not None:
        per_node = preset.node_link.group_size
        if inner_size == per_node and num_devices % per_node == 0:
            return f"nodes={num_devices // per_node}"
    return f"devices={num_devices}"


def too_small_message(name: str, num_devices: int, inner_size: int, needed: int) -> str:
    """Error text for a mesh of `needed` devices on a cluster of `num_devices`, with the fix."""
    head = (
        f"cluster {name!r} ({size_label(name, num_devices, inner_size)}) has {num_devices} "
        f"devices but the mesh needs {needed} devices"
    )
    if name not in _PRESETS and name not in _GROUPED_PRESETS:
        return f"{head}; use a cluster with at least {needed} devices or a smaller mesh"
    return f"{head}; pass {preset_call(name, preset_sizing(name, needed))} or a smaller mesh"


def preset_call(name: str, sizing: dict[str, int]) -> str:
    """The `Cluster.preset(...)` call for `sizing` (from `preset_sizing`), as text."""
    args = [repr(name)] + [f"{k}={v}" for k, v in sizing.items() if (k, v) != ("nodes", 1)]
    return f"Cluster.preset({', '.join(args)})"


# ---- helpers -----------------------------------------------------------------------------------


def _lookup_preset(name: str) -> _Preset:
    if name not in _PRESETS:
        raise ValueError(f"unknown cluster preset {name!r}; presets: {', '.join(preset_names())}")
    return _PRESETS[name]


def _match_gpu_kind(device_kind: str) -> str | None:
    kind = device_kind.upper()
    return next((preset for key, preset in _GPU_KINDS if key.upper() in kind), None)


def _build_grouped(
    name: str, preset: _GroupedPreset, nodes: int, devices: int | None
) -> ClusterLayout:
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
        return ClusterLayout(name, only.device, total, levels)
    groups = tuple(replace(kind, count=per_kind) for kind in preset.kinds)
    return ClusterLayout(name, groups[0].device, total, levels, groups)


def _build(
    name: str, preset: _Preset, num_devices: int, devices_per_node: int | None = None
) -> ClusterLayout:
    """A cluster of `num_devices` of a preset's devices: one node if they fit, else nodes."""
    per_node = devices_per_node or preset.node_link.group_size
    if preset.network is None or num_devices <= per_node:
        levels = (replace(preset.node_link, group_size=num_devices),)
        return ClusterLayout(name, preset.device, num_devices, levels)
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
    return ClusterLayout(name, preset.device, num_devices, levels)


def _sharing(preset: _Preset, per_node: int) -> int:
    """`shared_by` of the network level for nodes of `per_node` devices.

    A preset with one network card per node (shared_by == its node size) keeps one card per
    node at any node size; one with a card per device keeps that.
    """
    assert preset.network is not None
    if preset.network.shared_by == preset.node_link.group_size:
        return per_node
    return math.gcd(preset.network.shared_by, per_node)
