"""Meshes on the jax side: build one, describe one, and pick the cluster a mesh runs on.

`describe_mesh` turns what a user passes as a mesh (a dict {name: size}, a jax `Mesh`, or an
`AbstractMesh`) into a `MeshDescription`: the mesh to build shardings with, its axis names
and sizes, and where known its devices' ids, platform and kind. `resolve_cluster` is the one
place that turns a cluster argument (a `Cluster`, a preset name, or None) into the `Cluster`
for a described mesh. Everything after that is pure: `jaxpar.hardware.mesh_model`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import numpy as np
from jax.sharding import AbstractMesh, AxisType, Mesh

from .hardware.cluster import Cluster
from .hardware.presets import preset_sizing

ABSTRACT = "abstract"  # MeshDescription.platform of a mesh without devices


def check_axes(axes: dict) -> None:
    """Raise ValueError unless `axes` is a non-empty {str name: int size >= 1} (bools refused)."""
    if not axes:
        raise ValueError(
            "mesh={} has no axes; give a non-empty dict of axis sizes, e.g. {'data': 2, 'model': 4}"
        )
    for name, size in axes.items():
        is_int = isinstance(size, int) and not isinstance(size, bool)
        if not isinstance(name, str) or not is_int or size < 1:
            raise ValueError(f"mesh entry {name!r}: {size!r}; axes are name -> positive int")


def make_mesh(axes: dict[str, int], devices: Any = None) -> Mesh:
    """A mesh with `AxisType.Auto` axes (what sharding-constraint propagation wants).

    ``axes``: ordered {name: size}; ``devices``: defaults to ``jax.devices()``.
    """
    if not isinstance(axes, dict):
        raise TypeError(
            f"make_mesh takes a dict of axis sizes, e.g. {{'data': 2, 'model': 4}}, not "
            f"{type(axes).__name__}"
        )
    check_axes(axes)
    devices = list(jax.devices() if devices is None else devices)
    need = int(np.prod(list(axes.values())))
    if need > len(devices):
        raise ValueError(
            f"mesh {axes} needs {need} devices but only {len(devices)} are available; on CPU set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={need} (or "
            f"jax.config.update('jax_num_cpu_devices', {need})) before jax initializes"
        )
    arr = np.array(devices[:need], dtype=object).reshape(tuple(axes.values()))
    return Mesh(arr, tuple(axes), axis_types=(AxisType.Auto,) * len(axes))


@dataclasses.dataclass(frozen=True)
class MeshDescription:
    """A mesh as the planner reads it (`describe_mesh`)."""

    mesh: Mesh | AbstractMesh  # usable in NamedSharding
    names: tuple[str, ...]  # axis names, mesh order
    sizes: tuple[int, ...]  # axis sizes
    # jax device id of every mesh slot, shaped like the mesh; None for an abstract mesh. Not
    # compared: `mesh` already holds the devices.
    device_ids: np.ndarray | None = dataclasses.field(compare=False)
    platform: str  # the devices' platform ("cpu", "gpu", "tpu"), or "abstract"
    device_kind: str | None  # jax's device_kind of the devices; None for an abstract mesh

    @property
    def num_devices(self) -> int:
        return math.prod(self.sizes)


def describe_mesh(mesh: Any) -> MeshDescription:
    """Describe a mesh given as a dict {name: size}, a jax `Mesh` or an `AbstractMesh`.

    A dict becomes an `AbstractMesh` with `AxisType.Auto` axes (nothing allocated, no devices
    needed). Raises ValueError for an empty dict or bad entries, TypeError for anything else.
    """
    if isinstance(mesh, dict):
        check_axes(mesh)
        names, sizes = tuple(mesh), tuple(mesh.values())
        abstract = AbstractMesh(sizes, names, axis_types=(AxisType.Auto,) * len(names))
        return MeshDescription(abstract, names, sizes, None, ABSTRACT, None)
    if isinstance(mesh, Mesh):
        ids = np.vectorize(lambda d: d.id, otypes=[int])(mesh.devices)
        first = mesh.devices.reshape(-1)[0]
        names, sizes = tuple(mesh.axis_names), tuple(mesh.devices.shape)
        return MeshDescription(mesh, names, sizes, ids, first.platform, first.device_kind)
    if isinstance(mesh, AbstractMesh):
        names, sizes = tuple(mesh.axis_names), tuple(mesh.axis_sizes)
        return MeshDescription(mesh, names, sizes, None, ABSTRACT, None)
    raise TypeError(
        f"mesh must be a dict of axis sizes (e.g. {{'data': 2, 'model': 4}}), a jax Mesh or an "
        f"AbstractMesh, not {type(mesh).__name__}"
    )


def resolve_cluster(cluster: Cluster | str | None, desc: MeshDescription) -> Cluster:
    """The cluster a described mesh runs on, from a `Cluster`, a preset name, or None.

    - a `Cluster` is used as given;
    - "cpu" is the cpu preset with one device per mesh slot;
    - another preset name on a mesh of jax devices is the preset with exactly that many
      devices; on an abstract mesh, the smallest size of the preset that holds the mesh
      (`hardware.presets.preset_sizing`: whole nodes; a grouped preset in equal numbers of
      each kind);
    - None detects the cluster from the mesh's devices (`Cluster.from_device_kind`, a node
      being the mesh's devices on one host), or is the cpu preset for an abstract mesh.

    Raises TypeError for another kind of argument, and ValueError (with the fix) for an
    unknown preset or a cluster too small for the mesh.
    """
    if not isinstance(desc, MeshDescription):
        raise TypeError(
            f"resolve_cluster takes a MeshDescription (describe_mesh(mesh)), not "
            f"{type(desc).__name__}"
        )
    n = desc.num_devices
    if isinstance(cluster, Cluster):
        resolved = cluster
    elif isinstance(cluster, str):
        if cluster == "cpu":
            resolved = Cluster.preset("cpu", devices=n)
        elif desc.device_ids is not None:
            resolved = Cluster.preset(cluster, devices=n)
        else:
            resolved = Cluster.preset(cluster, **preset_sizing(cluster, n))
    elif cluster is None:
        resolved = _detect(desc)
    else:
        raise TypeError(
            f"cluster must be a Cluster, a preset name ({', '.join(Cluster.presets())}) or None "
            f"(detect from the mesh's devices), not {type(cluster).__name__}"
        )
    resolved.check_mesh(desc.sizes)  # too small: the error names the preset call that fits
    return resolved


def _detect(desc: MeshDescription) -> Cluster:
    """The cluster of a mesh's own devices (cpu preset for an abstract mesh)."""
    if desc.device_ids is None:
        return Cluster.preset("cpu", devices=desc.num_devices)
    assert isinstance(desc.mesh, Mesh) and desc.device_kind is not None
    devices = desc.mesh.devices.reshape(-1)
    host = devices[0].process_index
    per_host = sum(1 for d in devices if d.process_index == host)
    return Cluster.from_device_kind(
        desc.platform, desc.device_kind, len(devices), devices_per_node=per_host
    )
