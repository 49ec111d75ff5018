"""Datasheet numbers: the devices and links of every `Cluster.preset`, each with its source.

This module is data only; `presets.py` sizes these families into clusters. Three shapes:

- `NodePreset`: one device kind in nodes (GPU systems, the cpu host), a link inside a node and
  a network between nodes ("p100", "dgx-a100", "dgx-h100", "dgx-h200", "dgx-b200", "cpu");
- `GroupedPreset`: several device kinds in equal numbers, slowest first ("accpar-tpu",
  "accpar-tpu-homogeneous", "mixed-gpu");
- `SlicePreset`: TPU slices ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e"): chips joined by ICI
  inside a slice, slices joined by the data-center network (DCN, Multislice).

How a TPU torus maps onto the link-level model (a simplification, also printed by
`Cluster.describe`): a slice is one link level, "ici", whose bandwidth is what one chip sends on
a ring along *one* torus dimension: 2 links (one to each neighbour, the torus wraps around) x
the per-link, per-direction bandwidth. A mesh axis inside a slice gets that, whichever torus
dimensions it spans; concurrent axes do not share links, an axis spanning several torus
dimensions does not get their extra links, and a slice dimension without wraparound (a v4/v5p
slice dimension that is not a multiple of 4, small v5e/v6e slices) would get half. Slices are
joined by the level "dcn", whose bandwidth is one host's NICs, shared by the host's chips
(`shared_by` = chips per host): an axis across slices gets the per-chip share when every chip
sends at once. Numbers marked "approximate:" are not on the vendor's page.

Pure module: no jax import (not even numpy).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .devices import GB, TFLOPS, US, DeviceGroup, DeviceSpec, LinkLevel

GIB = 2**30  # Cloud TPU pages quote some capacities in GiB
GBIT = 1e9 / 8  # bytes/s in one Gb/s (network and ICI figures are in gigabits)


@dataclass(frozen=True)
class NodePreset:
    """How to build one family of clusters (a preset, or a detected device kind)."""

    device: DeviceSpec  # the device every member has
    node_link: LinkLevel  # link inside one node; its group_size is the devices per node
    network: LinkLevel | None  # link between nodes; None for a single-host family (cpu)
    summary: str  # one line for error messages and Cluster.describe


@dataclass(frozen=True)
class GroupedPreset:
    """How to build a cluster of several device kinds in equal numbers (AccPar §6.2 style)."""

    # One group per kind, slowest first, so that Cluster.device (the first group's spec) is the
    # slowest part; count = devices of the kind at the preset's default size.
    kinds: tuple[DeviceGroup, ...]
    # Link inside one node; group_size = devices per node, and every node holds one kind. None
    # for a flat fabric, where all devices talk through `network` alone.
    node_link: LinkLevel | None
    network: LinkLevel  # link between nodes (or between all devices of a flat fabric)
    summary: str  # one line for error messages


@dataclass(frozen=True)
class SlicePreset:
    """How to build TPU slices: chips on an ICI torus, slices joined by DCN (see the module)."""

    device: DeviceSpec  # one chip
    chips_per_host: int  # chips sharing one host's NICs (the unit `nodes=` counts)
    torus: str  # "3-D torus" or "2-D torus"
    links_per_chip: int  # ICI ports of one chip (6 on a 3-D torus, 4 on a 2-D torus)
    ici_link: float  # bytes/s per ICI link per direction
    ici: LinkLevel  # the slice level; bandwidth = 2 x ici_link (group_size set when built)
    dcn: LinkLevel  # between slices; bandwidth per host, shared_by = chips_per_host
    max_slice: int  # most chips in one slice (the largest single-slice shape)
    summary: str  # one line for error messages and `jaxpar clusters`


# Per-kernel costs (`DeviceSpec.kernel_overhead`, `DeviceSpec.half_rate_time`; docs/cost.md,
# "Compute t_C"). GPUs, measured on one H100
# (bench/fidelity/results/calibration_h100.json, jax 0.11.2): in
# a chain of dependent products a 128³ product takes 3.0 (bfloat16) to 4.3 (float32) us, whatever
# its 4 MFLOP; bfloat16 products reach half their best rate (380 of 760 TFLOP/s) near 4.5e9
# FLOPs, about 6 us of work at that rate. Other NVIDIA GPUs: approximate, the H100's numbers.
_GPU_KERNEL = {"kernel_overhead": 4 * US, "half_rate_time": 6 * US}
# approximate (not measured): XLA:TPU runs one fused program per step, ~1 us per op.
_TPU_KERNEL = {"kernel_overhead": 1 * US, "half_rate_time": 2 * US}
# XLA:CPU: ~0.25 us per fused computation (thunk), measured on this repository's 2-core CI host
# (`measure.kernel_overhead`, jax 0.10.2); the saturation is assumed.
_CPU_KERNEL = {"kernel_overhead": 0.25 * US, "half_rate_time": 1 * US}


# P100: NVIDIA Tesla P100 datasheet (SXM2 16GB); the paper's cluster is OptCNN §6
# "Experimental setup": 4 nodes x 4 P100, NVLink inside a node, 100 Gb/s EDR InfiniBand.
_P100 = NodePreset(
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
        host_bandwidth=16 * GB,  # PCIe 3.0 x16 to the host: ~16 GB/s per direction
        **_GPU_KERNEL,
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
_DGX_H100 = NodePreset(
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
        host_bandwidth=64 * GB,  # datasheet: PCIe Gen5 128 GB/s (both directions together)
        **_GPU_KERNEL,
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
_CPU = NodePreset(
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
        **_CPU_KERNEL,
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
_GENERIC_ACCELERATOR = NodePreset(
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
        host_bandwidth=32 * GB,  # A100 datasheet: PCIe Gen4 64 GB/s (both directions)
        **_GPU_KERNEL,
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
    **_TPU_KERNEL,
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
    **_TPU_KERNEL,
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
_ACCPAR_TPU = GroupedPreset(
    kinds=(_ACCPAR_TPU_V2, _ACCPAR_TPU_V3),
    node_link=None,
    network=_ACCPAR_NETWORK,
    summary="AccPar §6.2 array: TPU-v2 and TPU-v3 boards in equal numbers, flat network",
)
_ACCPAR_TPU_HOMOGENEOUS = GroupedPreset(
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
    host_bandwidth=32 * GB,  # datasheet: PCIe Gen4 64 GB/s (both directions together)
    **_GPU_KERNEL,
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
_MIXED_GPU = GroupedPreset(
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


# ---- more GPU systems -------------------------------------------------------------------------

# NCCL's tuning model puts an NVLink ring step at ~0.5-3.4 us and a network step at ~2-14 us
# (see the p100 preset); every DGX below uses the same orders of magnitude.
_NCCL_LATENCY = "latency: NCCL tuning model (order of magnitude)"

_DGX_A100 = NodePreset(
    device=_A100_SXM4_80GB,
    node_link=LinkLevel(
        name="nvlink",
        group_size=8,  # DGX A100: eight GPUs per node
        bandwidth=300 * GB,  # NVLink 3 / NVSwitch: 600 GB/s bidirectional per GPU
        latency=1 * US,
        source=f"DGX A100 datasheet: NVLink 3 / NVSwitch, 600 GB/s bidirectional per GPU; "
        f"{_NCCL_LATENCY}",
    ),
    network=LinkLevel(
        name="infiniband",
        group_size=16,  # placeholder: set to the cluster size when built
        bandwidth=200 * GBIT,  # one 200 Gb/s HDR ConnectX-6 per GPU = 25 GB/s per direction
        latency=5 * US,
        shared_by=1,  # 8 NICs for 8 GPUs
        source=f"DGX A100 datasheet: 8 x 200 Gb/s HDR InfiniBand (ConnectX-6), one per GPU; "
        f"{_NCCL_LATENCY}",
    ),
    summary="nodes of 8 x A100-SXM4-80GB (NVLink 3 / NVSwitch), HDR InfiniBand between nodes",
)

# H200: NVIDIA H200 Tensor Core GPU datasheet (SXM column): the H100's GH100 compute with
# 141 GB of HBM3e at 4.8 TB/s; tensor rates dense (half the "with sparsity" figures).
_H200_SXM = replace(
    _DGX_H100.device,
    name="H200-SXM-141GB",
    mem_bandwidth=4.8e12,  # datasheet: HBM3e at 4.8 TB/s
    memory_bytes=141 * GB,  # datasheet: 141 GB
    source="NVIDIA H200 datasheet (SXM; dense tensor-core rates, the same as H100 SXM)",
)
_DGX_H200 = NodePreset(
    device=_H200_SXM,
    node_link=replace(
        _DGX_H100.node_link,
        source=f"DGX H200 datasheet: NVLink 4 / NVSwitch, 900 GB/s bidirectional per GPU; "
        f"{_NCCL_LATENCY}",
    ),
    network=replace(
        _DGX_H100.network,  # 400 Gb/s = 50 GB/s per GPU and direction
        source=f"DGX H200 datasheet: 8 x 400 Gb/s ConnectX-7 (NDR InfiniBand), one per GPU; "
        f"{_NCCL_LATENCY}",
    ),
    summary="nodes of 8 x H200-SXM (NVLink 4 / NVSwitch), NDR InfiniBand between nodes",
)

# B200: NVIDIA DGX B200 datasheet (8 GPUs: 1,440 GB HBM3e, 64 TB/s, FP8 72 PFLOP/s with
# sparsity, NVLink 5 14.4 TB/s in all) divided by 8, tensor rates dense (half the sparse ones).
_B200 = DeviceSpec(
    name="B200-SXM-180GB",
    peak_flops={
        # approximate: HGX B200 lists FP64 ~37-40 and FP32 ~75-80 TFLOP/s per GPU by power limit
        "float64": 37 * TFLOPS,
        "float32": 75 * TFLOPS,
        "tensorfloat32": 1125 * TFLOPS,  # TF32 tensor core, dense (2.25 PFLOP/s sparse)
        "bfloat16": 2250 * TFLOPS,  # BF16 tensor core, dense (4.5 PFLOP/s sparse)
        "float16": 2250 * TFLOPS,  # FP16 tensor core, dense
        "float8_e4m3fn": 4500 * TFLOPS,  # FP8, dense (72 PFLOP/s sparse per DGX / 8 / 2)
        "float8_e5m2": 4500 * TFLOPS,
    },
    mem_bandwidth=8e12,  # 64 TB/s per DGX / 8 = 8 TB/s HBM3e
    memory_bytes=180 * GB,  # 1,440 GB per DGX / 8
    host_bandwidth=64 * GB,  # PCIe Gen5 x16 to the host: 64 GB/s per direction
    **_GPU_KERNEL,
    source="NVIDIA DGX B200 datasheet / 8 (dense tensor rates = half the sparse ones); "
    "approximate: FP32 and FP64 (HGX B200 figures vary with the power limit)",
)
_DGX_B200 = NodePreset(
    device=_B200,
    node_link=LinkLevel(
        name="nvlink",
        group_size=8,  # DGX B200: eight GPUs per node
        bandwidth=900 * GB,  # NVLink 5: 1.8 TB/s bidirectional per GPU
        latency=1 * US,
        source=f"DGX B200 datasheet: NVLink 5 / NVSwitch, 1.8 TB/s bidirectional per GPU "
        f"(14.4 TB/s per node); {_NCCL_LATENCY}",
    ),
    network=replace(
        _DGX_H100.network,  # 400 Gb/s = 50 GB/s per GPU and direction
        source=f"DGX B200 datasheet: 8 x 400 Gb/s ConnectX-7 (InfiniBand / Ethernet), one per "
        f"GPU; {_NCCL_LATENCY}",
    ),
    summary="nodes of 8 x B200 (NVLink 5 / NVSwitch), 400 Gb/s InfiniBand between nodes",
)

# ---- TPU slices ---------------------------------------------------------------------------------

# XLA:TPU runs float32 matmuls as one bf16 MXU pass at its default precision, so float32 gets the
# bf16 figure (as the AccPar TPU presets; HIGHEST precision is several times slower).
_ICI_LATENCY = "approximate: ~1 us per ring step (not published)"
_DCN_LATENCY = "approximate: ~10 us per step (not published)"


def _tpu_chip(name: str, bf16: float, hbm_bandwidth: float, hbm: float, source: str) -> DeviceSpec:
    return DeviceSpec(
        name=name,
        peak_flops={"bfloat16": bf16, "float32": bf16},
        mem_bandwidth=hbm_bandwidth,
        memory_bytes=hbm,
        **_TPU_KERNEL,
        source=source + "; float32 at the bf16 rate (XLA's default matmul precision)",
    )


def _slice(
    name: str, chip: DeviceSpec, link: float, links: int, ici_source: str, **kw: object
) -> SlicePreset:
    """A SlicePreset whose ICI level is a ring along one torus dimension: 2 links per chip."""
    dcn_per_host, dcn_source = kw.pop("dcn")
    return SlicePreset(
        device=chip,
        links_per_chip=links,
        ici_link=link,
        ici=LinkLevel(
            name="ici",
            group_size=kw["chips_per_host"],  # placeholder: set to the slice size when built
            bandwidth=2 * link,
            latency=1 * US,
            source=f"{ici_source}; 2 links per chip on a ring along one torus dimension; "
            f"{_ICI_LATENCY}",
        ),
        dcn=LinkLevel(
            name="dcn",
            group_size=2 * kw["chips_per_host"],  # placeholder: set to the cluster size
            bandwidth=dcn_per_host,
            latency=10 * US,
            shared_by=kw["chips_per_host"],
            source=f"{dcn_source}; {_DCN_LATENCY}",
        ),
        summary=f"{name} slices ({kw['torus']} ICI), DCN between slices (Multislice)",
        **kw,
    )


_TPU_V4 = _slice(
    "TPU v4",
    _tpu_chip(
        "TPU v4",
        275 * TFLOPS,
        1200 * GB,
        32 * GIB,
        "Cloud TPU v4 page: 275 TFLOP/s bf16, 32 GiB HBM2 at 1200 GBps per chip",
    ),
    link=45 * GB,  # approximate (see ici_source)
    links=6,
    ici_source="approximate: ~45 GB/s per ICI link per direction, 6 links per chip (TPU v4 "
    "paper, ISCA 2023, and public estimates; the Cloud TPU v4 page gives no per-chip figure)",
    chips_per_host=4,  # Cloud TPU v4: 4 chips per host (a 2x2x1 tray)
    torus="3-D torus",  # v4 page: 3-D torus when every slice dimension is a multiple of 4
    max_slice=4096,  # v4 page: 4096 chips per pod
    # approximate: the v4 page gives no DCN figure; assumed like v5p, 50 Gb/s per chip
    dcn=(
        200 * GBIT,
        "approximate: 200 Gb/s per 4-chip host (50 Gb/s per chip, as v5p; the "
        "Cloud TPU v4 page gives no DCN figure)",
    ),
)
_TPU_V5P = _slice(
    "TPU v5p",
    _tpu_chip(
        "TPU v5p",
        459 * TFLOPS,
        2765 * GB,
        95 * GIB,
        "Cloud TPU v5p page: 459 TFLOP/s bf16, 95 GiB HBM2e at 2765 GBps per chip",
    ),
    link=100 * GB,  # 1200 GBps bidirectional per chip / 6 links / 2 directions
    links=6,
    ici_source="Cloud TPU v5p page: 1200 GBps bidirectional ICI per chip (4800 Gbps per "
    "direction) over 6 links of a 3-D torus = 100 GB/s per link per direction",
    chips_per_host=4,  # v5p page: 4-chip VMs (ct5p-hightpu-4t), a 2x2x1 host
    torus="3-D torus",
    max_slice=6144,  # v5p page: single-slice training up to 6144 chips (16x16x24)
    dcn=(200 * GBIT, "Cloud TPU v5p page: DCN 50 Gb/s per chip = 200 Gb/s per 4-chip host"),
)
_TPU_V5E = _slice(
    "TPU v5e",
    _tpu_chip(
        "TPU v5e",
        197 * TFLOPS,
        819 * GB,
        16 * GB,
        "Cloud TPU v5e page: 197 TFLOP/s bf16, 16 GB HBM2 at 819 GBps per chip",
    ),
    link=50 * GB,  # 400 GBps bidirectional per chip / 4 ports / 2 directions
    links=4,
    ici_source="Cloud TPU v5e page: 400 GBps bidirectional ICI per chip (1600 Gbps per "
    "direction) over 4 ports of a 2-D torus = 50 GB/s per link per direction",
    chips_per_host=8,  # v6e page's v5e column: 8 chips per host
    torus="2-D torus",
    max_slice=256,  # v5e page: 256 chips per pod (16x16)
    dcn=(
        200 * GBIT,
        "Cloud TPU v6e page (v5e column): 2 x 100 Gb/s NICs per 8-chip host "
        "(6.4 Tbps per 256-chip pod)",
    ),
)
_TPU_V6E = _slice(
    "TPU v6e",
    _tpu_chip(
        "TPU v6e (Trillium)",
        918 * TFLOPS,
        1600 * GB,
        32 * GB,
        "Cloud TPU v6e page: 918 TFLOP/s bf16, 32 GB HBM at 1600 GBps per chip (an earlier "
        "revision of the page gave 1640 GBps)",
    ),
    link=100 * GB,  # 800 GBps bidirectional per chip / 4 ports / 2 directions
    links=4,
    ici_source="Cloud TPU v6e page: 800 GBps bidirectional ICI per chip (3200 Gbps per "
    "direction; an earlier revision said 3584) over 4 ports of a 2-D torus = 100 GB/s per link "
    "per direction",
    chips_per_host=8,  # v6e page: 8 chips per host
    torus="2-D torus",
    max_slice=256,  # v6e page: 256 chips per pod (16x16)
    dcn=(
        800 * GBIT,
        "Cloud TPU v6e page: 4 x 200 Gb/s NICs per 8-chip host (25.6 Tbps per 256-chip pod)",
    ),
)

# ---- registries --------------------------------------------------------------------------------

NODE_PRESETS: dict[str, NodePreset] = {
    "p100": _P100,
    "dgx-h100": _DGX_H100,
    "cpu": _CPU,  # the first three keep their place (error texts list presets in this order)
    "dgx-a100": _DGX_A100,
    "dgx-h200": _DGX_H200,
    "dgx-b200": _DGX_B200,
}
GROUPED_PRESETS: dict[str, GroupedPreset] = {
    "accpar-tpu": _ACCPAR_TPU,
    "accpar-tpu-homogeneous": _ACCPAR_TPU_HOMOGENEOUS,
    "mixed-gpu": _MIXED_GPU,
}
SLICE_PRESETS: dict[str, SlicePreset] = {
    "tpu-v4": _TPU_V4,
    "tpu-v5e": _TPU_V5E,
    "tpu-v5p": _TPU_V5P,
    "tpu-v6e": _TPU_V6E,
}
GENERIC_ACCELERATOR = _GENERIC_ACCELERATOR  # placeholder for unrecognised kinds (a warning)

# jax device_kind substrings (matched upper-cased, first hit wins) -> preset. Only the exact
# parts the presets model: an H100 PCIe or a P100 PCIe has other speeds and no NVLink switch,
# so it gets the generic spec. jax reports v5e as "TPU v5 lite", v5p as "TPU v5", v6e as
# "TPU v6 lite": the lite kinds come first.
GPU_KINDS: tuple[tuple[str, str], ...] = (
    ("A100-SXM4-80GB", "dgx-a100"),
    ("H100 80GB HBM3", "dgx-h100"),
    ("H100 SXM", "dgx-h100"),
    ("H200", "dgx-h200"),
    ("B200", "dgx-b200"),
    ("P100-SXM2", "p100"),
)
TPU_KINDS: tuple[tuple[str, str], ...] = (
    ("TPU v5 lite", "tpu-v5e"),
    ("TPU v5e", "tpu-v5e"),
    ("TPU v6 lite", "tpu-v6e"),
    ("TPU v6e", "tpu-v6e"),
    ("TPU v5p", "tpu-v5p"),
    ("TPU v5", "tpu-v5p"),
    ("TPU v4", "tpu-v4"),
)
