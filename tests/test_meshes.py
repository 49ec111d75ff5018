"""jaxpar.meshes: describing meshes (dict, Mesh, AbstractMesh) and the one cluster resolution."""

from __future__ import annotations

import jax
import pytest
from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec

from jaxpar.hardware import Cluster
from jaxpar.trace.meshes import MeshDescription, describe_mesh, make_mesh, resolve_cluster

pytestmark = pytest.mark.api


def test_dict_mesh_is_an_abstract_auto_mesh() -> None:
    desc = describe_mesh({"data": 2, "model": 4})
    assert isinstance(desc.mesh, AbstractMesh)
    assert desc.mesh.axis_types == (AxisType.Auto, AxisType.Auto)
    assert (desc.names, desc.sizes, desc.num_devices) == (("data", "model"), (2, 4), 8)
    assert (desc.device_ids, desc.platform, desc.device_kind) == (None, "abstract", None)
    assert describe_mesh(desc.mesh) == desc  # an AbstractMesh describes the same way


def test_jax_mesh_reports_its_devices() -> None:
    devices = jax.devices()[:8]
    mesh = make_mesh({"a": 2, "b": 4}, devices=devices[::-1])
    desc = describe_mesh(mesh)
    assert desc.mesh is mesh and (desc.names, desc.sizes) == (("a", "b"), (2, 4))
    ids = [d.id for d in reversed(devices)]
    assert desc.device_ids.tolist() == [ids[:4], ids[4:]]
    assert (desc.platform, desc.device_kind) == (devices[0].platform, devices[0].device_kind)
    NamedSharding(desc.mesh, PartitionSpec("a"))  # usable for shardings


@pytest.mark.parametrize(
    ("mesh", "error", "match"),
    [
        ({}, ValueError, "no axes"),
        ({"data": 0}, ValueError, "positive int"),
        ({"data": 2.0}, ValueError, "positive int"),
        ({1: 2}, ValueError, "name -> positive int"),
        ((2, 4), TypeError, "dict of axis sizes"),
        (None, TypeError, "not NoneType"),
    ],
)
def test_bad_meshes_are_rejected(mesh, error, match: str) -> None:
    with pytest.raises(error, match=match):
        describe_mesh(mesh)


def test_make_mesh_needs_enough_devices() -> None:
    with pytest.raises(ValueError, match="needs 64 devices"):
        make_mesh({"data": 8, "model": 8})
    with pytest.raises(ValueError, match="non-empty dict"):
        make_mesh({})


def test_preset_names_are_sized_to_the_mesh() -> None:
    abstract = describe_mesh({"a": 6})
    # cpu: one device per mesh slot
    assert resolve_cluster("cpu", abstract) == Cluster.preset("cpu", devices=6)
    # abstract mesh: the smallest whole number of nodes that holds it
    assert resolve_cluster("p100", abstract) == Cluster.preset("p100", nodes=2)
    big = describe_mesh({"pod": 16, "node": 64, "gpu": 4})
    assert resolve_cluster("p100", big).num_devices == 4096
    # a grouped preset keeps its kinds in equal numbers, so the mesh holds both
    mixed = resolve_cluster("mixed-gpu", describe_mesh({"x": 8}))
    assert [g.count for g in mixed.groups] == [4, 4]
    # a mesh of jax devices: the preset with exactly that many devices
    concrete = describe_mesh(make_mesh({"a": 2, "b": 4}))
    assert resolve_cluster("accpar-tpu", concrete) == Cluster.preset("accpar-tpu", devices=8)
    assert resolve_cluster("p100", concrete) == Cluster.preset("p100", nodes=2)


def test_none_detects_the_cluster_and_a_cluster_is_kept() -> None:
    concrete = describe_mesh(make_mesh({"a": 8}))
    assert resolve_cluster(None, concrete) == Cluster.preset("cpu", devices=8)  # cpu devices
    assert resolve_cluster(None, describe_mesh({"a": 2, "b": 2})) == Cluster.preset(
        "cpu", devices=4
    )
    mine = Cluster.preset("dgx-h100", nodes=2)
    assert resolve_cluster(mine, describe_mesh({"a": 16})) is mine


def test_bad_cluster_arguments_say_how_to_fix_them() -> None:
    desc = describe_mesh({"a": 8})
    with pytest.raises(ValueError, match="unknown cluster preset 'tpu-v9'; presets: p100"):
        resolve_cluster("tpu-v9", desc)
    with pytest.raises(TypeError, match=r"preset name .*p100.* or None.*not int"):
        resolve_cluster(8, desc)
    with pytest.raises(
        ValueError, match=r"needs 8 devices; pass Cluster.preset\('p100', nodes=2\)"
    ):
        resolve_cluster(Cluster.preset("p100"), desc)
    with pytest.raises(TypeError, match=r"MeshDescription \(describe_mesh\(mesh\)\), not dict"):
        resolve_cluster("p100", {"a": 8})
    assert isinstance(desc, MeshDescription)
