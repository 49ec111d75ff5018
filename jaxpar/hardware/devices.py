"""What a cluster is made of: device specs, link levels, device groups, and the units they use.

A `DeviceSpec` is one device's speeds and memory; a `LinkLevel` one level of the interconnect
hierarchy (NVLink inside a node, InfiniBand between nodes); a `DeviceGroup` a block of devices
of one kind (AccPar's computation density c_i and network bandwidth b_i). `cluster.Cluster`
puts them together; `presets` fills them with datasheet numbers, each with its source.

Pure module: numpy only, no jax import.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

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
    # Seconds every kernel (one fused XLA computation or library call) costs beyond its roofline
    # time: launch, ramp-up and tail (`cost.kernel_time`). 0: not modelled.
    kernel_overhead: float = 0.0
    # A contraction of f FLOPs runs at peak · f / (f + f_half), f_half = peak · half_rate_time:
    # the FLOPs the device does at peak in this time (`cost.saturated_rate`). 0: the peak.
    half_rate_time: float = 0.0
    # Bytes/s per direction of the device's link to its host's memory (PCIe, NVLink-C2C): a
    # move to or from pinned host memory (a remat policy's offloaded residuals) runs on a copy
    # engine at this rate (`cost.host_move_seconds`). 0: not known, the moves are not priced
    # (and on XLA:CPU host and device memory are one: the moves are no copies).
    host_bandwidth: float = 0.0

    def __post_init__(self) -> None:
        pairs = self.peak_flops.items() if isinstance(self.peak_flops, Mapping) else self.peak_flops
        table = tuple(sorted((str(k), float(v)) for k, v in pairs))
        object.__setattr__(self, "peak_flops", table)
        if "float32" not in dict(table):
            raise ValueError(f"device {self.name!r}: peak_flops needs a 'float32' entry")
        if any(v <= 0 for _, v in table) or self.mem_bandwidth <= 0 or self.memory_bytes <= 0:
            raise ValueError(f"device {self.name!r}: speeds and memory must be positive")
        if self.kernel_overhead < 0 or self.half_rate_time < 0:
            raise ValueError(f"device {self.name!r}: kernel times must be >= 0")
        if not self.host_bandwidth >= 0:
            raise ValueError(
                f"device {self.name!r}: host_bandwidth must be >= 0 bytes/s (0: not known), "
                f"got {self.host_bandwidth}"
            )

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


def _dtype_name(dtype: object) -> str:
    """Name of a dtype given as a string, np.float32, np.dtype("float32"), jnp.bfloat16, ..."""
    if isinstance(dtype, str):
        return dtype
    return np.dtype(dtype).name  # type: ignore[call-overload]
