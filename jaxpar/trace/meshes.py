"""Meshes on the jax side: build one, describe one, and pick the cluster a mesh runs on.

`make_mesh` lays devices out in order; `make_hardware_mesh` the way the hardware wants them
(ICI axes inside a slice, DCN axes across slices). `detect_cluster` reads `jax.devices()` into
the pure `Cluster.detect`. `describe_mesh` turns what a user passes as a mesh (a dict
{name: size}, a jax `Mesh`, or an `AbstractMesh`) into a `MeshDescription`: the mesh to build
shardings with, its axis names and sizes, and where known its devices' ids, platform and kind.
`resolve_cluster` is the one place that turns a cluster argument (a `Cluster`, a preset name, a
calibration file or `Calibration`, or None) into the `Cluster` for a described mesh. Everything
after that is pure: `jaxpar.hardware.mesh_model`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any

import jax
import numpy as np
from jax.sharding import AbstractMesh, AxisType, Mesh

from ..hardware.calibration import Calibration, load_calibration, looks_like_calibration_path
from ..hardware.cluster import Cluster
from ..hardware.presets import DeviceInfo, match_device_kind, preset_sizing

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

    # ---- the planning mesh: the axes larger than 1 ------------------------------------------
    # An axis of size 1 splits nothing: a configuration putting it on a dim is the same layout
    # as one leaving it off. The planner plans on the other axes only (docs/meshes.md), so a
    # MaxText-style mesh of 12 named axes, ten of them of size 1, plans as fast as its 2-axis
    # twin; shardings are still built on ``mesh``, the user's, whose spec names are theirs.

    @property
    def planned(self) -> tuple[int, ...]:
        """Indices of the axes the planner plans on: those larger than 1 (a mesh of one
        device keeps its first axis, so there is one)."""
        return tuple(a for a, s in enumerate(self.sizes) if s > 1) or (0,)

    @property
    def planning_names(self) -> tuple[str, ...]:
        return tuple(self.names[a] for a in self.planned)

    @property
    def planning_sizes(self) -> tuple[int, ...]:
        return tuple(self.sizes[a] for a in self.planned)

    @property
    def planning_device_ids(self) -> np.ndarray | None:
        """`device_ids` without the size-1 axes (the same devices, in the same order)."""
        if self.device_ids is None:
            return None
        return np.asarray(self.device_ids).reshape(self.planning_sizes)

    @property
    def trivial_names(self) -> tuple[str, ...]:
        """The axes of size 1 the planner leaves out (a spec may still name them)."""
        kept = set(self.planned)
        return tuple(n for a, n in enumerate(self.names) if a not in kept)

    @property
    def axis_types(self) -> tuple[Any, ...]:
        return tuple(self.mesh.axis_types)

    @property
    def explicit_names(self) -> tuple[str, ...]:
        """The mesh's `AxisType.Explicit` axes (`jax.make_mesh`'s default): the applier runs
        the planned step inside `jax.sharding.auto_axes` over them."""
        return tuple(
            n for n, t in zip(self.names, self.axis_types, strict=True) if t == AxisType.Explicit
        )


def describe_mesh(mesh: Any) -> MeshDescription:
    """Describe a mesh given as a dict {name: size}, a jax `Mesh` or an `AbstractMesh`.

    A dict becomes an `AbstractMesh` with `AxisType.Auto` axes (nothing allocated, no devices
    needed). Raises ValueError for an empty dict or bad entries, TypeError for anything else.
    """
    if isinstance(mesh, MeshDescription):
        return mesh
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


# Axes larger than 1 the planner plans on at most (docs/meshes.md): the configurations of a
# node grow as (dims + 1)^axes, its reshard tables as (rank + 1)^axes and the tables between
# two nodes as the square of the first. Four plan a 2-block GPT in 5 s and 0.6 GB; five took
# more than 8 GB.
MAX_PLANNED_AXES = 4


def check_planning_mesh(desc: MeshDescription) -> None:
    """ValueError, before anything is planned, for a mesh the planner cannot plan on: more
    than `MAX_PLANNED_AXES` axes larger than 1, or Manual axes (inside a shard_map)."""
    big = {n: s for n, s in zip(desc.names, desc.sizes, strict=True) if s > 1}
    if len(big) > MAX_PLANNED_AXES:
        raise ValueError(
            f"the mesh has {len(big)} axes larger than 1 ({big}); jaxpar plans on at most "
            f"{MAX_PLANNED_AXES} (axes of size 1 are free: they are left out). Merge axes that "
            "play the same role into one axis of their product (e.g. two data-parallel axes "
            "into one), or give size 1 to the axes you do not want split"
        )
    manual = [n for n, t in zip(desc.names, desc.axis_types, strict=True) if t == AxisType.Manual]
    if manual:
        raise ValueError(
            f"mesh axes {manual} are Manual (the mesh of a shard_map body); jaxpar plans a whole "
            "step: give it the mesh outside the shard_map, whose axes are Auto or Explicit"
        )


def auto_twin(mesh: Mesh | AbstractMesh) -> Mesh | AbstractMesh:
    """The mesh with every axis `AxisType.Auto` (same names, sizes and devices)."""
    auto = (AxisType.Auto,) * len(mesh.axis_names)
    if isinstance(mesh, Mesh):
        return Mesh(mesh.devices, mesh.axis_names, axis_types=auto)
    return AbstractMesh(tuple(mesh.axis_sizes), tuple(mesh.axis_names), axis_types=auto)


def ambient_mesh() -> Mesh | AbstractMesh | None:
    """The mesh the caller set: ``jax.set_mesh``'s (a concrete `Mesh`), else
    ``jax.sharding.use_abstract_mesh``'s (an `AbstractMesh`), else None."""
    concrete = jax.sharding.get_mesh()
    if not concrete.empty:
        return concrete
    abstract = jax.sharding.get_abstract_mesh()
    return None if abstract.empty else abstract


def _shape_text(mesh: Any) -> str:
    desc = describe_mesh(mesh)
    return str(dict(zip(desc.names, desc.sizes, strict=True)))


def resolve_mesh(mesh: Any, caller: str, need_devices: bool) -> Any:
    """The mesh to plan on: ``mesh`` when given, else the ambient one (`ambient_mesh`); None
    when neither is (the caller's default applies).

    Never a different mesh than the one the user set: a given mesh must agree with an
    ambient one (axis names and sizes, and devices when both have them; axis types may differ),
    else a ValueError says which two differ. ``need_devices`` (``auto_shard`` runs the step):
    an ambient abstract mesh alone is an error saying how to give devices.
    """
    ambient = ambient_mesh()
    if mesh is None:
        if ambient is not None and need_devices and not isinstance(ambient, Mesh):
            raise ValueError(
                f"{caller} runs on devices, but the mesh set around it is abstract "
                f"(jax.sharding.use_abstract_mesh: {_shape_text(ambient)}); set a concrete mesh "
                "with jax.set_mesh(mesh) or pass mesh="
            )
        return ambient
    if ambient is not None and not _agree(describe_mesh(mesh), describe_mesh(ambient)):
        raise ValueError(
            f"{caller} was given mesh {_shape_text(mesh)} inside a jax.set_mesh / "
            f"use_abstract_mesh context whose mesh is {_shape_text(ambient)} (or another set "
            "of devices); plan on the mesh you set: drop mesh= to use it, or pass that mesh"
        )
    return mesh


def _agree(given: MeshDescription, ambient: MeshDescription) -> bool:
    """Same axis names and sizes, and the same devices where both meshes have devices."""
    if (given.names, given.sizes) != (ambient.names, ambient.sizes):
        return False
    if given.device_ids is None or ambient.device_ids is None:
        return True
    return bool(np.array_equal(given.device_ids, ambient.device_ids))


def tracing_mesh(desc: MeshDescription) -> contextlib.AbstractContextManager:
    """The mesh context the step is traced in: under an ambient mesh (``jax.set_mesh``), the
    planned mesh's Auto twin, abstract, so the traced program holds no Explicit shardings
    (the applier runs it with every axis Auto, `runtime.auto_shard`); none otherwise."""
    if ambient_mesh() is None:
        return contextlib.nullcontext()
    twin = auto_twin(desc.mesh)
    abstract = twin.abstract_mesh if isinstance(twin, Mesh) else twin
    return jax.sharding.use_abstract_mesh(abstract)


def resolve_cluster(cluster: Cluster | str | None, desc: MeshDescription) -> Cluster:
    """The cluster a described mesh runs on, from a `Cluster`, a preset name, a calibration
    (a `Calibration` or the path of a `jaxpar calibrate` file), or None.

    - a `Cluster` is used as given;
    - a calibration is `Cluster.from_calibration`, sized to the mesh (`calibrated_size`);
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
    elif isinstance(cluster, Calibration):
        resolved = Cluster.from_calibration(cluster, calibrated_size(cluster, desc))
    elif isinstance(cluster, str) and is_calibration_file(cluster):
        calibration = load_calibration(cluster)
        resolved = Cluster.from_calibration(calibration, calibrated_size(calibration, desc))
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
            f"cluster must be a Cluster, a preset name ({', '.join(Cluster.presets())}), a "
            f"calibration file (jaxpar calibrate) or None (detect from the mesh's devices), not "
            f"{type(cluster).__name__}"
        )
    resolved.check_mesh(desc.sizes)  # too small: the error names the preset call that fits
    return resolved


def is_calibration_file(cluster: str) -> bool:
    """A cluster argument naming a calibration file rather than a preset (`resolve_cluster`)."""
    return cluster not in Cluster.presets() and looks_like_calibration_path(cluster)


def calibrated_size(calibration: Calibration, desc: MeshDescription) -> int:
    """Devices of the cluster a calibration is sized to for a mesh: the mesh's own devices, or
    for an abstract mesh whole nodes of the calibrated kind holding it (a GPU's DGX preset)."""
    n = desc.num_devices
    if desc.device_ids is not None or calibration.platform == "cpu":
        return n
    name = match_device_kind(calibration.platform, calibration.device_kind)
    if name is None or name not in Cluster.presets():
        return n
    sizing = preset_sizing(name, n)
    return Cluster.preset(name, **sizing).num_devices


def _detect(desc: MeshDescription) -> Cluster:
    """The cluster of a mesh's own devices (cpu preset for an abstract mesh)."""
    if desc.device_ids is None:
        return Cluster.preset("cpu", devices=desc.num_devices)
    assert isinstance(desc.mesh, Mesh)
    return detect_cluster(desc.mesh.devices.reshape(-1).tolist())


def device_info(device: Any) -> DeviceInfo:
    """What `Cluster.detect` reads of one jax device: platform, kind, id, process, slice, coords.

    `slice_index` and `coords` are TPU attributes; other devices report None.
    """
    coords = getattr(device, "coords", None)
    return DeviceInfo(
        platform=device.platform,
        device_kind=device.device_kind,
        id=int(device.id),
        process_index=int(getattr(device, "process_index", 0)),
        slice_index=getattr(device, "slice_index", None),
        coords=tuple(int(c) for c in coords) if coords is not None else None,
    )


def detect_cluster(devices: Any = None) -> Cluster:
    """The cluster of `devices` (default `jax.devices()`), with what it assumed.

    Reads each device's kind, process, slice and coords (`device_info`) and hands them to the
    pure `Cluster.detect`; `cluster.assumptions` (also in `describe()`) says what was assumed.
    On a CPU host this is the cpu preset, with a note that its numbers are assumed.
    """
    devices = list(jax.devices() if devices is None else devices)
    return Cluster.detect([device_info(d) for d in devices])


def make_hardware_mesh(
    ici: dict[str, int], dcn: dict[str, int] | None = None, devices: Any = None
) -> Mesh:
    """An `AxisType.Auto` mesh laid out the way the hardware wants it.

    ``ici``: {name: size} of the axes inside one slice (or host group), innermost (most
    communication) last. ``dcn``: {name: slices} of the axes across slices; a name also in
    ``ici`` multiplies that axis (its size is dcn x ici, slices outermost), a new name is an
    axis of its own, placed before the ici axes. ``devices``: default ``jax.devices()``.

    Slices are the devices' ``slice_index`` (TPU Multislice), else their processes; the layout
    inside a slice is `jax.experimental.mesh_utils` (physical torus order on TPU). On devices
    without slices or processes to split by (the simulated CPU devices), consecutive blocks of
    the device list stand in for slices: the same layout, from a plain reshape.
    """
    dcn = {} if dcn is None else dcn
    for part in (ici, dcn):
        if not isinstance(part, dict):
            raise TypeError(
                f"make_hardware_mesh takes dicts of axis sizes, e.g. ici={{'chip': 4}}, "
                f"dcn={{'slice': 2}}, not {part!r}"
            )
    check_axes(ici)
    if dcn:
        check_axes(dcn)
    names = [n for n in dcn if n not in ici] + list(ici)
    ici_shape = [ici.get(n, 1) for n in names]
    dcn_shape = [dcn.get(n, 1) for n in names]
    sizes = {n: i * d for n, i, d in zip(names, ici_shape, dcn_shape, strict=True)}
    devices = list(jax.devices() if devices is None else devices)
    need = math.prod(sizes.values())
    if need > len(devices):
        make_mesh(sizes, devices)  # raises the too-few-devices error with its fix
    devices = devices[:need]
    arr = _hardware_layout(ici_shape, dcn_shape, devices)
    return Mesh(arr, tuple(names), axis_types=(AxisType.Auto,) * len(names))


def _hardware_layout(ici_shape: list[int], dcn_shape: list[int], devices: list) -> np.ndarray:
    """Device array of shape ici x dcn (elementwise), each slice a contiguous ici block."""
    from jax.experimental import mesh_utils

    slices = math.prod(dcn_shape)
    on_accelerator = devices[0].platform != "cpu"
    if on_accelerator and slices > 1:
        by_slice = all(getattr(d, "slice_index", None) is not None for d in devices)
        by_process = len({d.process_index for d in devices}) == slices
        if by_slice or by_process:
            return mesh_utils.create_hybrid_device_mesh(
                ici_shape, dcn_shape, devices, process_is_granule=not by_slice
            )
    if on_accelerator and slices == 1:
        return mesh_utils.create_device_mesh(ici_shape, devices)
    # Plain reshape: block k of the device list is slice k, laid out (dcn..., ici...) and then
    # interleaved so that axis a's index is dcn_index * ici_size + ici_index.
    arr = np.array(devices, dtype=object).reshape(*dcn_shape, *ici_shape)
    k = len(ici_shape)
    arr = arr.transpose([i for a in range(k) for i in (a, k + a)])
    return arr.reshape([d * i for d, i in zip(dcn_shape, ici_shape, strict=True)])
