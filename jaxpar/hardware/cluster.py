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
all the cost model needs: which level each mesh axis crosses (`Cluster.axis_links`), and how
much of that level's bandwidth one group gets when several groups cross it at once
(`Cluster.axis_bandwidths`). `mesh_model.mesh_axes` turns both
into the cost model's view of a mesh; the collective cost formulas live in `cost.py`.

Devices may differ (AccPar's heterogeneous arrays, §2.3 and §6.2): `Cluster.groups` lists
*device groups*, consecutive blocks of ids that share one `DeviceSpec` (AccPar's computation
density c_i) and one per-device link bandwidth (AccPar's network bandwidth b_i)::

    accpar-tpu         ids 0 .. 127 | 128 .. 255
    groups             [TPU-v2 x 128] [TPU-v3 x 128]   c = 180 / 420 TFLOP/s, b = 1 / 2 GB/s
    level 0 network    [0 .. 255]                       one flat fabric (AccPar models no other)

A group's devices drive at most their own link bandwidth on any level, so a collective runs
no faster than min(level bandwidth, b_i of its slowest member) (`Cluster.axis_bandwidths`).
The per-device c_i (`Cluster.device_flops`) feed the ratio costs of `speeds.py` (AccPar
Eq. 8-10). A cluster with no groups is homogeneous: every device is `Cluster.device`.

Every preset number carries its source (`DeviceSpec.source`, `LinkLevel.source`; the presets
are in `presets.py`), and `Cluster.describe` prints them, so a prediction can always be traced
back to a datasheet.

Pure module: numpy only, no jax import; `from_device_kind` takes the strings jax reports.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np

from . import presets
from .calibration import Calibration
from .devices import GB, TFLOPS, US, DeviceGroup, DeviceSpec, LinkLevel
from .presets import DeviceInfo


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
    # What `Cluster.detect` assumed, one sentence each (shown by describe). Not compared: two
    # clusters with the same devices and links price plans the same however they were found.
    assumptions: tuple[str, ...] = field(default=(), compare=False)
    # Numbers measured on the devices (`jaxpar calibrate`; `Cluster.from_calibration`): its
    # throughput curves price compute and its axis fits replace the levels' link numbers for
    # the mesh axes they match (`mesh_model.mesh_axes`). None: datasheet numbers only.
    calibration: Calibration | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "levels", tuple(self.levels))
        object.__setattr__(self, "groups", tuple(self.groups))
        _check_levels(self.name, self.num_devices, self.levels)
        _check_groups(self)

    # ---- construction -------------------------------------------------------------------

    @classmethod
    def presets(cls) -> list[str]:
        """Names accepted by `Cluster.preset`."""
        return presets.preset_names()

    @classmethod
    def preset(
        cls, name: str, nodes: int = 1, *, devices: int | None = None, slices: int = 1
    ) -> Cluster:
        """A documented cluster (`Cluster.presets()`; `jaxpar clusters` prints every number).

        Homogeneous: "p100" (OptCNN §6), "dgx-a100", "dgx-h100", "dgx-h200", "dgx-b200", "cpu".
        `nodes` picks how many nodes a GPU preset has. `devices` sizes the "cpu" preset (default
        8), and for a GPU preset asks for part of one node (devices <= per node) or a whole
        number of nodes.

        TPU slices: "tpu-v4", "tpu-v5p" (3-D torus), "tpu-v5e", "tpu-v6e" (2-D torus). ICI joins
        the chips of a slice, DCN joins `slices` slices (Multislice). `devices` is the total
        chip count, split into `slices` equal slices of whole hosts; without it `nodes` is the
        hosts per slice (default one host). E.g. `Cluster.preset("tpu-v5p", devices=8192,
        slices=4)`: 4 slices of 2,048 chips.

        Heterogeneous, devices of each kind in equal numbers, slowest kind first (lowest ids):

        - "accpar-tpu": AccPar §6.2, 128 TPU-v2 + 128 TPU-v3 boards on one flat network.
          `devices=N` (even) gives N/2 of each; `nodes` must stay 1.
        - "accpar-tpu-homogeneous": AccPar §6.3, 128 TPU-v3 boards; `devices=N` gives N.
        - "mixed-gpu": nodes of 8 A100-SXM4-80GB and nodes of 8 H100-SXM5, NVSwitch inside a
          node, InfiniBand between. `nodes=k` means k nodes *of each kind* (16k GPUs; default
          one A100 node + one H100 node). `devices=N` (even) gives N/2 of each kind: part of
          one node each (N <= 16) or whole nodes (N a multiple of 16).
        """
        return cls(*presets.preset_layout(name, nodes, devices, slices))

    @classmethod
    def detect(cls, devices: Sequence[DeviceInfo | Mapping]) -> Cluster:
        """The cluster of the devices described, and what was assumed (`assumptions`).

        Pure: each device is a `DeviceInfo` (or a dict of its fields) with the platform, device
        kind, id, process index, and for TPUs the slice index and coords that jax reports
        (`jaxpar.meshes.detect_cluster` reads them from `jax.devices()`). CPU devices give the
        "cpu" preset; TPU chips a TPU preset with one slice per slice index (DCN between
        slices); GPUs a DGX preset whose nodes are one process's devices. Unknown kinds get
        placeholder numbers and a warning.
        """
        layout, notes = presets.detect_devices(devices)
        return cls(*layout, assumptions=notes)

    @classmethod
    def from_calibration(cls, calibration: Calibration, num_devices: int | None = None) -> Cluster:
        """The cluster of the calibrated device kind (`from_device_kind`, `num_devices` of them,
        default as many as were calibrated) with the measured numbers in place of the datasheet's:
        the device's peak FLOP/s per measured dtype (the best matmul rate) and memory bandwidth,
        its memory where jax reported it, and `calibration` itself (throughput curves, per-axis
        collective fits).
        """
        n = calibration.num_devices if num_devices is None else num_devices
        base = cls.from_device_kind(calibration.platform, calibration.device_kind, n)
        peak = {**dict(base.device.peak_flops), **calibration.peak_flops()}
        device = DeviceSpec(
            name=calibration.device_kind,
            peak_flops=peak,
            mem_bandwidth=calibration.memory_bandwidth,
            memory_bytes=calibration.memory_bytes or base.device.memory_bytes,
            # measured where the moves are copies (XLA:CPU's are the identity)
            host_bandwidth=calibration.host_bandwidth
            if calibration.host_bandwidth and calibration.platform != "cpu"
            else base.device.host_bandwidth,
            source=f"{calibration.source}; dtypes not measured: {base.device.source}",
        )
        axes = ", ".join(f"{a.name}={a.size} ({a.link})" for a in calibration.axes) or "none"
        note = (
            f"link numbers measured for mesh axes {axes}; they price a mesh axis of the same "
            f"name and size, or of the same size crossing the same link; other axes use the "
            f"levels below"
        )
        assumptions = (*base.assumptions, note)
        return cls(base.name, device, base.num_devices, base.levels, (), assumptions, calibration)

    @property
    def source(self) -> str:
        """Where the cost numbers come from: "datasheet", or "measured on <device>, <date>"."""
        return "datasheet" if self.calibration is None else self.calibration.source

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
        own node size is assumed. TPU chips are one slice of their preset (ICI only; use
        `Cluster.detect` for Multislice). Unrecognised kinds get placeholder numbers and a
        warning.
        """
        layout = presets.detect_layout(platform, device_kind, num_devices, devices_per_node)
        return cls(*layout)

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

    def group_ids(self) -> np.ndarray:
        """Index into `all_groups()` of every device: an int array of length num_devices."""
        counts = [group.count for group in self.all_groups()]
        return np.repeat(np.arange(len(counts)), counts)

    def device_spec(self, device_id: int) -> DeviceSpec:
        """Spec of one device: its group's spec (`device` for a homogeneous cluster)."""
        self._check_id(device_id)
        if not self.groups:
            return self.device
        return self.groups[int(self.group_ids()[device_id])].device

    def device_flops(self, dtype: object) -> np.ndarray:
        """Peak FLOP/s of every device for `dtype` (AccPar's c_i): floats, length num_devices."""
        rates = [group.device.flops(dtype) for group in self.all_groups()]
        return np.asarray(rates, dtype=float)[self.group_ids()]

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

    # ---- reporting ----------------------------------------------------------------------

    def describe(self) -> str:
        """Human-readable table of the cluster's numbers and where each comes from.

        The header gives the size as `Cluster.preset` takes it and the layout (nodes, and which
        link joins what); the link levels table says what each level spans. A one-node cluster
        of a multi-node preset also lists the preset's link between nodes, which a cluster of
        two or more nodes adds.
        """
        if not self.groups:
            spec = self.device
            lines = [
                f"cluster {self.name!r} ({self._size_label()}): {self.num_devices} x {spec.name}",
                f"  layout: {self.layout_summary()}",
                f"  device numbers: {spec.source or 'no source given'}",
                *_spec_lines(spec),
            ]
        else:
            parts = " + ".join(f"{group.count} x {group.device.name}" for group in self.groups)
            kind = "heterogeneous" if self.heterogeneous else "one kind"
            lines = [
                f"cluster {self.name!r} ({self._size_label()}, {kind}): {parts}",
                f"  layout: {self.layout_summary()}",
            ]
            for index, ids in enumerate(self._group_slices()):
                lines += self._group_lines(index, ids)
        lines += self._topology_lines()
        lines += [f"  assumed: {note}" for note in self.assumptions]
        unit = self._unit()
        none_here = f"between {unit}s (none here)"
        spans = [self._level_span(index) for index in range(len(self.levels))]
        missing = self._missing_network()
        width = max(len(text) for text in [*spans, "spans", none_here])
        lines.append(
            "  link levels, innermost first (GB/s/dir: bandwidth per device and direction; "
            "shared: devices sharing one port of the level):"
        )
        lines.append(
            f"    {'level':<14} {'spans':<{width}} {'GB/s/dir':>9} {'latency':>9} {'shared':>6}"
            f"  source"
        )
        rows = list(zip(self.levels, spans, strict=True))
        if missing is not None:
            rows.append((missing, none_here))
        for level, span in rows:
            lines.append(
                f"    {level.name:<14} {span:<{width}} {level.bandwidth / GB:>9.2f} "
                f"{level.latency / US:>7.1f}us {level.shared_by:>6}  {level.source}"
            )
        return "\n".join(lines)

    def layout_summary(self) -> str:
        """One line: how many devices, in how many nodes, and which link joins what.

        E.g. "8 devices in 2 nodes of 4: nvlink inside a node, infiniband between nodes". A
        node is a group of the innermost level; a cluster with one level is one node (or one
        flat network). TPU presets say "slice" (ICI inside, DCN between) instead of "node".
        """
        n, levels, unit = self.num_devices, self.levels, self._unit()
        devices = f"{n} device{'s' if n != 1 else ''}"
        if len(levels) == 1:
            text = f"{devices}, all joined by one link level ({levels[0].name})"
            missing = self._missing_network()
            if missing is not None:
                text += f"; a cluster of 2 or more {unit}s adds {missing.name} between {unit}s"
            return text
        inner = levels[0].group_size
        nodes = n // inner
        links = [f"{levels[0].name} inside a {unit}"]
        for index in range(1, len(levels)):
            if index == 1:
                links.append(f"{levels[index].name} between {unit}s")
            else:
                per = levels[index - 1].group_size // inner
                links.append(f"{levels[index].name} between groups of {per} {unit}s")
        kinds = " (one device kind per node)" if self.heterogeneous else ""
        return f"{devices} in {nodes} {unit}s of {inner}{kinds}: {', '.join(links)}"

    def _unit(self) -> str:
        """What a block of the innermost level is called: "slice" (TPU ICI) or "node"."""
        return "slice" if self.levels[0].name == "ici" else "node"

    def _topology_lines(self) -> list[str]:
        """describe() rows of a TPU preset: the torus and how the model simplifies it."""
        tpu = presets.slice_preset(self.name)
        if tpu is None or self.levels[0].name != "ici":
            return []
        return [
            f"  topology: {tpu.torus} ICI, {tpu.links_per_chip} links per chip at "
            f"{tpu.ici_link / GB:.0f} GB/s per link and direction; {tpu.chips_per_host} chips "
            f"per host; at most {tpu.max_slice} chips per slice",
            f"  model: an axis inside a slice gets a ring along one torus dimension, 2 links "
            f"per chip ({2 * tpu.ici_link / GB:.0f} GB/s); an axis across slices gets DCN, one "
            f"host's NICs shared by its {tpu.chips_per_host} chips (simplified: no link sharing "
            f"between axes, wraparound assumed)",
        ]

    def _level_span(self, index: int) -> str:
        """What one group of level `index` holds, for describe()."""
        size, unit = self.levels[index].group_size, self._unit()
        if len(self.levels) == 1:
            one_node = self._missing_network() is not None  # a node of a multi-node preset
            return f"inside a {unit} of {size}" if one_node else f"all {size} devices"
        if index == 0:
            return f"inside a {unit} of {size}"
        inner = self.levels[index - 1].group_size
        if index == 1:
            return f"between {size // inner} {unit}s ({size} devices)"
        return f"between {size // inner} blocks of {inner} ({size} devices)"

    def _missing_network(self) -> LinkLevel | None:
        """The preset's link between nodes when this is a one-level cluster of a multi-node
        preset (so describe() still shows it); None otherwise."""
        if len(self.levels) != 1 or self.name not in presets.preset_names():
            return None
        return presets.preset_network(self.name)

    def _group_lines(self, index: int, ids: slice) -> list[str]:
        """describe() rows of device group `index` (device ids `ids`): specs, caps, sources."""
        group = self.groups[index]
        lines = [
            f"  group {index} {group.name!r}: devices {ids.start}..{ids.stop - 1}, "
            f"{group.count} x {group.device.name}",
            f"    device numbers: {group.device.source or 'no source given'}",
            *["  " + line for line in _spec_lines(group.device)],
        ]
        for level in self.levels:  # the group's own b_i on each level it caps
            cap = group.bandwidth_cap(level.name)
            if math.isfinite(cap):
                label = f"link cap {level.name}"
                lines.append(f"      {label:<20} {f'{cap / GB:.2f} GB/s':>16}")
        if group.source:
            lines.append(f"    group numbers: {group.source}")
        return lines

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

    def _group_slices(self) -> tuple[slice, ...]:
        """Device-id range of each group of `all_groups()`, in order."""
        ends = np.cumsum([group.count for group in self.all_groups()]).tolist()
        return tuple(slice(start, end) for start, end in zip([0, *ends[:-1]], ends, strict=True))

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
        return presets.size_label(self.name, self.num_devices, self.levels[0].group_size)

    def _too_small_message(self, needed: int) -> str:
        return presets.too_small_message(
            self.name, self.num_devices, self.levels[0].group_size, needed
        )


# ---- module helpers -------------------------------------------------------------------------


def _flops_text(flops: float) -> str:
    """'10.60 TFLOP/s', or '50.0 GFLOP/s' below one TFLOP/s (CPU numbers)."""
    return f"{flops / TFLOPS:.2f} TFLOP/s" if flops >= TFLOPS else f"{flops / 1e9:.1f} GFLOP/s"


def _spec_lines(spec: DeviceSpec) -> list[str]:
    """describe() rows of one device spec: peak rates, memory bandwidth, memory, host link."""
    lines = [f"    {'peak ' + k:<20} {_flops_text(v):>16}" for k, v in spec.peak_flops]
    lines.append(f"    {'memory bandwidth':<20} {f'{spec.mem_bandwidth / GB:.1f} GB/s':>16}")
    lines.append(f"    {'memory':<20} {f'{spec.memory_bytes / GB:.1f} GB':>16}")
    if spec.host_bandwidth:
        lines.append(f"    {'host link':<20} {f'{spec.host_bandwidth / GB:.1f} GB/s':>16}")
    return lines


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
