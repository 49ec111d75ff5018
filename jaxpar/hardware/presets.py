"""Sizing the datasheet presets into clusters (`Cluster.preset`), and detecting one from devices.

The numbers and their sources live in `datasheets.py`; this module is the machinery. Node
presets ("p100", "dgx-a100", "dgx-h100", "dgx-h200", "dgx-b200", "cpu") are one device kind in
nodes; slice presets ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e") are TPU slices on an ICI torus,
joined by DCN when there are several (`slices=`); grouped presets ("accpar-tpu",
"accpar-tpu-homogeneous", "mixed-gpu") hold several kinds in equal numbers, slowest first.

- `preset_layout` sizes a preset (nodes=, devices=, slices=);
- `detect_layout` picks one for the strings jax reports (`platform`, `device_kind`);
- `detect_devices` builds one from plain descriptions of the devices (`DeviceInfo`: kind,
  process, slice, coords) and says what it assumed;
- `preset_sizing` gives the smallest size of a preset that holds a mesh.

They return a `ClusterLayout`, the arguments of `Cluster`, so this module does not depend on the
topology model; `cluster.Cluster` builds from them.

Pure module: no jax import (not even numpy).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from .datasheets import (
    GENERIC_ACCELERATOR,
    GPU_KINDS,
    GROUPED_PRESETS,
    NODE_PRESETS,
    SLICE_PRESETS,
    TPU_KINDS,
    GroupedPreset,
    NodePreset,
    SlicePreset,
)
from .devices import DeviceGroup, DeviceSpec, LinkLevel


class ClusterLayout(NamedTuple):
    """The arguments of `Cluster(...)` for one sized preset (what `Cluster.preset` builds)."""

    name: str
    device: DeviceSpec
    num_devices: int
    levels: tuple[LinkLevel, ...]
    groups: tuple[DeviceGroup, ...] = ()


@dataclass(frozen=True)
class DeviceInfo:
    """One device as `Cluster.detect` reads it: plain data, what a jax device reports."""

    platform: str  # "cpu", "gpu", "tpu"
    device_kind: str  # e.g. "TPU v5", "NVIDIA H100 80GB HBM3", "cpu"
    id: int | None = None  # jax device id; devices are ordered by it when every id is given
    process_index: int = 0  # the host (process) that drives the device
    slice_index: int | None = None  # TPU Multislice: the slice; None when not reported
    coords: tuple[int, ...] | None = None  # TPU: the chip's position in its slice's torus


_CPU_DEFAULT_DEVICES = 8  # tests/conftest.py sets 8 fake CPU devices
_GENERIC_NAME = "generic"  # Cluster.name of clusters built from GENERIC_ACCELERATOR


# ---- building and sizing ---------------------------------------------------------------------


def preset_names() -> list[str]:
    """Names accepted by `Cluster.preset`: node presets, TPU slices, then the grouped ones."""
    return [*NODE_PRESETS, *SLICE_PRESETS, *GROUPED_PRESETS]


def preset_summary(name: str) -> str:
    """One line saying what preset `name` is (devices, links, paper); unknown names raise."""
    if name in _GROUPED_PRESETS:
        return _GROUPED_PRESETS[name].summary
    if name in SLICE_PRESETS:
        return SLICE_PRESETS[name].summary
    return _lookup_preset(name).summary


def slice_preset(name: str) -> SlicePreset | None:
    """The TPU family of preset `name` (torus, links, hosts), None for other presets."""
    return SLICE_PRESETS.get(name)


def preset_network(name: str) -> LinkLevel | None:
    """The link between the nodes (slices) of preset `name`, None for a one-host or flat preset.

    `Cluster.describe` shows it for a one-node (one-slice) cluster of a multi-node preset, whose
    own levels stop there. Unknown names raise the `Cluster.preset` error.
    """
    grouped = _GROUPED_PRESETS.get(name)
    if grouped is not None:
        return grouped.network if grouped.node_link is not None else None
    if name in SLICE_PRESETS:
        return SLICE_PRESETS[name].dcn
    return _lookup_preset(name).network


def preset_layout(
    name: str, nodes: int = 1, devices: int | None = None, slices: int = 1
) -> ClusterLayout:
    """What `Cluster.preset(name, nodes, devices=devices, slices=slices)` builds; its docstring
    has the rules."""
    if nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {nodes}")
    if devices is not None and devices < 1:
        raise ValueError(f"devices must be >= 1, got {devices}")
    if slices < 1:
        raise ValueError(f"slices must be >= 1, got {slices}")
    if devices is not None and nodes != 1:
        raise ValueError("pass either nodes= or devices=, not both")
    if name in SLICE_PRESETS:
        tpu = SLICE_PRESETS[name]
        total = devices if devices is not None else nodes * slices * tpu.chips_per_host
        return _build_slices(name, tpu, total, slices)
    if slices != 1:
        raise ValueError(
            f"preset {name!r} has no slices: slices= is for the TPU presets "
            f"({', '.join(SLICE_PRESETS)}); size it with nodes= or devices="
        )
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
    per_node = preset.node_link.group_size
    return _build(name, preset, devices if devices is not None else nodes * per_node)


def preset_sizing(name: str, num_devices: int) -> dict[str, int]:
    """`Cluster.preset` keywords for the smallest cluster of preset `name` holding `num_devices`.

    A multi-node preset gets the smallest whole number of nodes ({"nodes": k}); a one-host
    preset ("cpu") exactly the devices asked for ({"devices": n}). A TPU preset gets whole hosts
    in one slice ({"nodes": hosts}), or, beyond its largest slice, the fewest equal slices of
    whole hosts ({"nodes": hosts per slice, "slices": s}). A grouped preset keeps its
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
    tpu = SLICE_PRESETS.get(name)
    if tpu is not None:
        hosts = -(-num_devices // tpu.chips_per_host)
        max_hosts = max(1, tpu.max_slice // tpu.chips_per_host)
        if hosts <= max_hosts:
            return {"nodes": hosts}
        slices = -(-hosts // max_hosts)
        return {"nodes": -(-hosts // slices), "slices": slices}
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
    name = match_device_kind(platform, device_kind)
    if name is None:
        warnings.warn(
            f"no cluster preset for {platform} device kind {device_kind!r}: using placeholder "
            f"numbers; pass a Cluster (Cluster.preset or hand-built) for a trustworthy plan",
            UserWarning,
            stacklevel=3,  # the caller of Cluster.from_device_kind
        )
        return _build(_GENERIC_NAME, GENERIC_ACCELERATOR, num_devices, devices_per_node)
    if name in SLICE_PRESETS:  # one slice: ICI joins every chip, whatever the hosts
        return _build_slices(name, SLICE_PRESETS[name], num_devices, 1)
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


def match_device_kind(platform: str, device_kind: str) -> str | None:
    """The preset for a jax `device_kind` on `platform`, None when no preset models it.

    GPU kinds match only the exact SXM parts of the DGX presets (a PCIe or NVL card has other
    speeds and no NVSwitch); TPU kinds as jax reports them ("TPU v5 lite" is v5e).
    """
    kind = device_kind.upper()
    if platform.lower() == "tpu":
        table = TPU_KINDS
    else:
        if "PCIE" in kind or "NVL" in kind:
            return None
        table = GPU_KINDS
    return next((preset for key, preset in table if key.upper() in kind), None)


def detect_devices(
    devices: Sequence[DeviceInfo | Mapping],
) -> tuple[ClusterLayout, tuple[str, ...]]:
    """What `Cluster.detect` builds from plain device descriptions, and what it assumed.

    Devices are ordered by id when every id is given (cluster device ids are positions in that
    order). CPU devices are the "cpu" preset; TPU chips a slice preset with one slice per
    distinct `slice_index` (one when none is reported); GPUs a node preset whose nodes are the
    devices of one process. Unknown kinds get placeholder numbers and a warning.
    """
    infos = [d if isinstance(d, DeviceInfo) else DeviceInfo(**d) for d in devices]
    if not infos:
        raise ValueError("Cluster.detect needs at least one device")
    if all(d.id is not None for d in infos):
        infos.sort(key=lambda d: d.id)  # type: ignore[arg-type, return-value]
    platforms = {d.platform.lower() for d in infos}
    kinds = {d.device_kind for d in infos}
    if len(platforms) > 1 or len(kinds) > 1:
        raise ValueError(
            f"devices of several platforms or kinds ({sorted(platforms)}, {sorted(kinds)}): "
            f"build the cluster with Cluster.from_groups"
        )
    platform, kind, n = platforms.pop(), kinds.pop(), len(infos)
    if platform == "cpu":
        note = (
            f"{n} cpu devices: the 'cpu' preset, assumed host-CPU numbers (not measured), one "
            f"shared-memory level"
        )
        return preset_layout("cpu", devices=n), (note,)
    name = match_device_kind(platform, kind)
    if name in SLICE_PRESETS:
        return _detect_slices(name, SLICE_PRESETS[name], infos)
    hosts = _count_by(infos, lambda d: d.process_index)
    per_host = hosts[0] if len(set(hosts)) == 1 else None
    layout = detect_layout(platform, kind, n, per_host)
    if name is None:
        note = f"unrecognised {platform} kind {kind!r}: placeholder numbers ({layout.name})"
    else:
        note = f"{kind!r} is preset {name!r}"
    notes = [note, f"{len(hosts)} host(s) (process_index); a node is one host's devices"]
    if per_host is None:
        notes.append(f"hosts hold unequal device counts {hosts}: nodes of the preset's size")
    return layout, tuple(notes)


def _detect_slices(
    name: str, tpu: SlicePreset, infos: list[DeviceInfo]
) -> tuple[ClusterLayout, tuple[str, ...]]:
    """`detect_devices` for TPU chips of preset `name`: slices, hosts, torus shape."""
    n = len(infos)
    notes = [f"{infos[0].device_kind!r} is preset {name!r} ({tpu.torus} ICI inside a slice)"]
    if any(d.slice_index is None for d in infos):
        slices = 1
        notes.append("no slice_index reported: all chips assumed in one slice (ICI only)")
    else:
        per_slice = _count_by(infos, lambda d: d.slice_index)
        if len(set(per_slice)) != 1:
            raise ValueError(f"TPU slices hold unequal chip counts {per_slice}")
        slices = len(per_slice)
        order = [d.slice_index for d in infos]
        if any(a != b for a, b in zip(order, sorted(order, key=order.index), strict=True)):
            notes.append("slices are not consecutive in device order: the model assumes so")
        notes.append(f"{slices} slice(s) of {n // slices} chips (slice_index); DCN between")
    hosts = _count_by(infos, lambda d: (d.slice_index, d.process_index))
    notes.append(
        f"{len(hosts)} host(s) (process_index) of {sorted(set(hosts))} chips; DCN per host "
        f"as the preset's {tpu.chips_per_host}-chip host"
    )
    shape = _torus_shape(infos)
    if shape is not None:
        text = "x".join(str(s) for s in shape)
        notes.append(f"slice topology {text} (from coords); ICI modelled as a wrapped torus")
    return _build_slices(name, tpu, n, slices), tuple(notes)


def _count_by(infos: list[DeviceInfo], key: Callable[[DeviceInfo], object]) -> list[int]:
    """Device counts per distinct key, in first-seen order."""
    counts: dict = {}
    for info in infos:
        k = key(info)
        counts[k] = counts.get(k, 0) + 1
    return list(counts.values())


def _torus_shape(infos: list[DeviceInfo]) -> tuple[int, ...] | None:
    """The extent of the chips' coords in one slice (each dim max - min + 1), if reported."""
    first = infos[0].slice_index
    coords = [d.coords for d in infos if d.slice_index == first]
    if any(c is None for c in coords) or not coords:
        return None
    dims = len(coords[0])  # type: ignore[arg-type]
    return tuple(
        max(c[i] for c in coords) - min(c[i] for c in coords) + 1  # type: ignore[index]
        for i in range(dims)
    )


# ---- labels and error texts ------------------------------------------------------------------


def size_label(name: str, num_devices: int, inner_size: int) -> str:
    """How `Cluster.preset` would size a cluster: "nodes=2", "nodes=1 of each kind" (a grouped
    preset of whole nodes: `nodes=` counts the nodes of each device kind), "devices=6", or for a
    TPU preset "nodes=2" (hosts of one slice) or "devices=2048, slices=4".

    `inner_size` is the group size of the cluster's innermost level (devices per node; chips
    per slice for a TPU preset).
    """
    grouped = _GROUPED_PRESETS.get(name)
    if grouped is not None and grouped.node_link is not None:
        per_size = grouped.node_link.group_size * len(grouped.kinds)
        full_nodes = inner_size == grouped.node_link.group_size
        if full_nodes and num_devices % per_size == 0:
            # nodes= counts the nodes of each kind: say so, the cluster has `kinds` times more
            return f"nodes={num_devices // per_size} of each kind"
    tpu = SLICE_PRESETS.get(name)
    if tpu is not None:
        if num_devices > inner_size:
            return f"devices={num_devices}, slices={num_devices // inner_size}"
        if num_devices % tpu.chips_per_host == 0:
            return f"nodes={num_devices // tpu.chips_per_host}"
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
    if name not in preset_names():
        return f"{head}; use a cluster with at least {needed} devices or a smaller mesh"
    return f"{head}; pass {preset_call(name, preset_sizing(name, needed))} or a smaller mesh"


def preset_call(name: str, sizing: dict[str, int]) -> str:
    """The `Cluster.preset(...)` call for `sizing` (from `preset_sizing`), as text."""
    args = [repr(name)] + [f"{k}={v}" for k, v in sizing.items() if (k, v) != ("nodes", 1)]
    return f"Cluster.preset({', '.join(args)})"


# ---- helpers -----------------------------------------------------------------------------------

_PRESETS = NODE_PRESETS
_GROUPED_PRESETS = GROUPED_PRESETS


def _lookup_preset(name: str) -> NodePreset:
    if name not in _PRESETS:
        raise ValueError(f"unknown cluster preset {name!r}; presets: {', '.join(preset_names())}")
    return _PRESETS[name]


def _build_slices(name: str, tpu: SlicePreset, total: int, slices: int) -> ClusterLayout:
    """`total` chips of a TPU preset in `slices` equal slices: ICI inside, DCN between."""
    if total % slices:
        raise ValueError(f"{total} chips do not split into {slices} equal slices ({tpu.summary})")
    per_slice = total // slices
    host = tpu.chips_per_host
    if per_slice > tpu.max_slice:
        fewest = -(-total // tpu.max_slice)
        raise ValueError(
            f"a {name} slice holds at most {tpu.max_slice} chips, but {slices} slice(s) of "
            f"{total} chips need {per_slice} each; pass slices={fewest} or more (Multislice)"
        )
    if per_slice > host and per_slice % host:
        raise ValueError(
            f"a slice of {per_slice} {name} chips is not whole hosts of {host}; use a multiple "
            f"of {host} chips per slice (or at most {host}, part of one host)"
        )
    ici = replace(tpu.ici, group_size=per_slice)
    if slices == 1:
        return ClusterLayout(name, tpu.device, total, (ici,))
    dcn = replace(tpu.dcn, group_size=total, shared_by=math.gcd(host, per_slice))
    return ClusterLayout(name, tpu.device, total, (ici, dcn))


def _build_grouped(
    name: str, preset: GroupedPreset, nodes: int, devices: int | None
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
    name: str, preset: NodePreset, num_devices: int, devices_per_node: int | None = None
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


def _sharing(preset: NodePreset, per_node: int) -> int:
    """`shared_by` of the network level for nodes of `per_node` devices.

    A preset with one network card per node (shared_by == its node size) keeps one card per
    node at any node size; one with a card per device keeps that.
    """
    assert preset.network is not None
    if preset.network.shared_by == preset.node_link.group_size:
        return per_node
    return math.gcd(preset.network.shared_by, per_node)
