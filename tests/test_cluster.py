"""Tests for jaxpar.hardware: presets, the cluster's links per mesh axis, the mesh model the
planner prices (links, slowest device), errors, device-kind detection.

Pure python and numpy: the whole file runs in milliseconds.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from jaxpar.hardware import Cluster, DeviceSpec, LinkLevel, preset_sizing
from jaxpar.hardware.mesh_model import device_positions, mesh_axes, mesh_speeds, slowest_device


def _names(levels: tuple[LinkLevel, ...]) -> list[str]:
    return [level.name for level in levels]


# ---- presets ----------------------------------------------------------------------------------


@pytest.mark.closed_form
def test_presets_lists_the_documented_names() -> None:
    assert Cluster.presets() == [
        "p100",
        "dgx-h100",
        "cpu",
        "dgx-a100",
        "dgx-h200",
        "dgx-b200",
        "tpu-v4",
        "tpu-v5e",
        "tpu-v5p",
        "tpu-v6e",
        "accpar-tpu",
        "accpar-tpu-homogeneous",
        "mixed-gpu",
    ]


@pytest.mark.closed_form
def test_p100_matches_datasheet_and_optcnn_setup() -> None:
    cluster = Cluster.preset("p100", nodes=4)  # OptCNN §6: 4 nodes x 4 P100
    assert cluster.num_devices == 16
    spec = cluster.device_spec(0)
    assert spec.flops("float32") == pytest.approx(10.6e12)
    assert spec.flops("float16") == pytest.approx(21.2e12)
    assert spec.mem_bandwidth == pytest.approx(732e9)
    assert spec.memory_bytes == pytest.approx(16e9)
    nvlink, infiniband = cluster.levels
    assert (nvlink.name, nvlink.group_size, nvlink.bandwidth) == ("nvlink", 4, 20e9)
    assert (infiniband.name, infiniband.group_size) == ("infiniband", 16)
    assert infiniband.bandwidth == pytest.approx(12.5e9)  # 100 Gb/s EDR
    assert nvlink.latency < infiniband.latency


@pytest.mark.closed_form
def test_single_node_has_only_the_node_level() -> None:
    cluster = Cluster.preset("p100")
    assert cluster.num_devices == 4
    assert _names(cluster.levels) == ["nvlink"]


@pytest.mark.closed_form
def test_dgx_h100_matches_datasheet() -> None:
    cluster = Cluster.preset("dgx-h100", nodes=2)
    spec = cluster.device_spec(15)
    assert spec.flops("float32") == pytest.approx(67e12)
    assert spec.flops("bfloat16") == pytest.approx(989.4e12)  # dense, not "with sparsity"
    assert spec.flops("tensorfloat32") == pytest.approx(494.7e12)
    assert spec.mem_bandwidth == pytest.approx(3.35e12)
    assert spec.memory_bytes == pytest.approx(80e9)
    nvlink, infiniband = cluster.levels
    assert (nvlink.group_size, nvlink.bandwidth) == (8, 450e9)
    assert (infiniband.group_size, infiniband.bandwidth) == (16, 50e9)


@pytest.mark.closed_form
def test_cpu_preset_counts_devices() -> None:
    assert Cluster.preset("cpu").num_devices == 8
    cluster = Cluster.preset("cpu", devices=4)
    assert cluster.num_devices == 4
    assert _names(cluster.levels) == ["shared-memory"]
    assert cluster.device_spec(0).flops("float32") == pytest.approx(50e9)


@pytest.mark.closed_form
def test_gpu_preset_can_take_part_of_a_node() -> None:
    cluster = Cluster.preset("dgx-h100", devices=2)
    assert cluster.num_devices == 2
    assert _names(cluster.levels) == ["nvlink"]
    assert Cluster.preset("p100", devices=8) == Cluster.preset("p100", nodes=2)


@pytest.mark.closed_form
def test_flops_falls_back_to_float32_and_accepts_numpy_dtypes() -> None:
    spec = Cluster.preset("p100").device
    assert spec.flops("int8") == spec.flops("float32")
    assert spec.flops(np.float32) == spec.flops("float32")
    assert spec.flops(np.dtype("float16")) == pytest.approx(21.2e12)


@pytest.mark.closed_form
def test_device_spec_is_hashable_and_accepts_a_mapping() -> None:
    a = DeviceSpec("x", {"float32": 1e12, "float16": 2e12}, 1e11, 1e9)
    b = DeviceSpec("x", (("float16", 2e12), ("float32", 1e12)), 1e11, 1e9)
    assert a == b and hash(a) == hash(b)
    assert hash(Cluster.preset("p100", nodes=2)) == hash(Cluster.preset("p100", nodes=2))


@pytest.mark.closed_form
def test_describe_lists_numbers_and_sources() -> None:
    text = Cluster.preset("p100", nodes=2).describe()
    assert "nodes=2" in text
    assert "10.60 TFLOP/s" in text and "732.0 GB/s" in text
    assert "infiniband" in text and "12.50" in text
    assert "OptCNN" in text and "datasheet" in text


# ---- levels and mesh axes ---------------------------------------------------------------------


@pytest.mark.closed_form
def test_a_collective_runs_on_the_slowest_level_its_devices_span() -> None:
    cluster = Cluster.preset("p100", nodes=2)

    def level(ids: list[int]) -> str:
        (link,) = cluster.axis_links((len(ids),), np.array(ids))
        return link.name

    assert level([0, 1]) == "nvlink"
    assert level([3, 4]) == "infiniband"
    assert level([4, 5, 6, 7]) == "nvlink"
    assert level(list(range(8))) == "infiniband"
    assert level([5]) == "nvlink"  # one device: innermost
    assert level([7, 0]) == "infiniband"


@pytest.mark.closed_form
def test_axis_links_row_major_meshes() -> None:
    cluster = Cluster.preset("p100", nodes=2)
    # (2, 4): axis 0 groups {i, i+4} cross nodes; axis 1 groups are whole nodes.
    assert _names(cluster.axis_links((2, 4))) == ["infiniband", "nvlink"]
    # (4, 2): axis 0 groups {0,2,4,6} span both nodes; axis 1 pairs stay inside a node.
    assert _names(cluster.axis_links((4, 2))) == ["infiniband", "nvlink"]
    assert _names(cluster.axis_links((8,))) == ["infiniband"]
    assert _names(cluster.axis_links((2, 2))) == ["nvlink", "nvlink"]  # 4 of the 8 devices


@pytest.mark.closed_form
def test_axis_links_follow_explicit_device_ids() -> None:
    cluster = Cluster.preset("p100", nodes=2)
    # Transposed assignment: each row of the (2, 4) mesh now spans both nodes.
    ids = np.arange(8).reshape(4, 2).T
    assert _names(cluster.axis_links((2, 4), ids)) == ["nvlink", "infiniband"]
    assert _names(cluster.axis_links((1, 8))) == ["nvlink", "infiniband"]  # size-1 axis


@pytest.mark.closed_form
def test_axis_bandwidths_split_a_shared_network_card() -> None:
    p100 = Cluster.preset("p100", nodes=4)
    # One ring over all 16 devices passes each node's card once: the full 12.5 GB/s.
    assert p100.axis_bandwidths((16,)) == pytest.approx((12.5e9,))
    # Four concurrent axis-0 rings all pass through each node's one card.
    assert p100.axis_bandwidths((4, 4)) == pytest.approx((12.5e9 / 4, 20e9))
    # DGX H100: one NIC per GPU, so eight concurrent cross-node pairs do not contend.
    dgx = Cluster.preset("dgx-h100", nodes=2)
    assert dgx.axis_bandwidths((2, 8)) == pytest.approx((50e9, 450e9))


@pytest.mark.closed_form
def test_homogeneous_cluster_reports_one_implicit_group() -> None:
    cluster = Cluster.preset("p100", nodes=2)
    assert cluster.groups == () and not cluster.heterogeneous
    (group,) = cluster.all_groups()
    assert (group.device, group.count) == (cluster.device, 8)
    assert cluster.group_ids().tolist() == [0] * 8
    assert cluster.device_flops("float16") == pytest.approx([21.2e12] * 8)
    # One pair: NVLink inside a node; across nodes the pair has the node's card to itself.
    assert cluster.axis_bandwidths((2,), np.array([0, 1])) == pytest.approx((20e9,))
    assert cluster.axis_bandwidths((2,), np.array([0, 4])) == pytest.approx((12.5e9,))
    # Every device alike: no ratio-split costs for the planner.
    assert mesh_speeds(cluster, (2, 4), None) is None


# ---- errors -----------------------------------------------------------------------------------


@pytest.mark.api
def test_unknown_preset_lists_presets() -> None:
    with pytest.raises(ValueError, match="p100, dgx-h100, cpu"):
        Cluster.preset("v100")


@pytest.mark.api
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "p100", "nodes": 0}, "nodes must be >= 1"),
        ({"name": "cpu", "nodes": 2}, "devices="),
        ({"name": "cpu", "devices": 0}, "devices must be >= 1"),
        ({"name": "p100", "devices": 6}, "multiple of 4"),
        ({"name": "p100", "nodes": 2, "devices": 8}, "not both"),
    ],
)
def test_preset_rejects_bad_sizes(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Cluster.preset(**kwargs)


@pytest.mark.api
def test_mesh_larger_than_cluster_says_how_to_fix_it() -> None:
    message = (
        "cluster 'p100' (nodes=1) has 4 devices but the mesh needs 8 devices; "
        "pass Cluster.preset('p100', nodes=2) or a smaller mesh"
    )
    with pytest.raises(ValueError) as info:
        Cluster.preset("p100").axis_links((2, 4))
    assert str(info.value) == message
    with pytest.raises(ValueError, match=r"Cluster.preset\('cpu', devices=16\)"):
        Cluster.preset("cpu").check_mesh((4, 4))


@pytest.mark.api
def test_bad_device_ids_are_rejected() -> None:
    cluster = Cluster.preset("p100", nodes=2)
    with pytest.raises(ValueError, match=r"out of range.*0\.\.7"):
        cluster.check_mesh((2,), np.array([0, 9]))
    with pytest.raises(ValueError, match="repeats"):
        cluster.check_mesh((2,), np.array([1, 1]))
    with pytest.raises(ValueError, match="shape"):
        cluster.check_mesh((2, 2), np.arange(4))
    with pytest.raises(ValueError, match="out of range"):
        cluster.axis_links((2,), np.array([0, 8]))
    with pytest.raises(ValueError, match="integers"):
        cluster.axis_bandwidths((2,), np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="non-empty"):
        cluster.check_mesh(())
    with pytest.raises(ValueError, match="positive"):
        cluster.check_mesh((2, 0))


@pytest.mark.api
def test_inconsistent_levels_are_rejected() -> None:
    spec = Cluster.preset("cpu").device
    link = LinkLevel("l", 3, 1e9, 1e-6)
    with pytest.raises(ValueError, match="whole cluster"):
        Cluster("x", spec, 4, (link,))
    with pytest.raises(ValueError, match="dividing"):
        Cluster("x", spec, 8, (link, LinkLevel("m", 8, 1e9, 1e-6)))


# ---- detection --------------------------------------------------------------------------------


@pytest.mark.api
def test_from_device_kind_recognises_presets() -> None:
    h100 = Cluster.from_device_kind("gpu", "NVIDIA H100 80GB HBM3", 16)
    assert h100 == Cluster.preset("dgx-h100", nodes=2)
    p100 = Cluster.from_device_kind("gpu", "Tesla P100-SXM2-16GB", 4)
    assert p100 == Cluster.preset("p100")
    assert Cluster.from_device_kind("cpu", "cpu", 8) == Cluster.preset("cpu")


@pytest.mark.api
def test_from_device_kind_uses_devices_per_node() -> None:
    cluster = Cluster.from_device_kind("gpu", "NVIDIA H100 80GB HBM3", 8, devices_per_node=4)
    assert [level.group_size for level in cluster.levels] == [4, 8]
    assert cluster.name != "dgx-h100"  # not the preset's topology
    with pytest.raises(ValueError, match="devices_per_node"):
        Cluster.from_device_kind("gpu", "NVIDIA H100 80GB HBM3", 12)


@pytest.mark.api
def test_unknown_gpu_kind_warns_and_uses_a_generic_spec() -> None:
    with pytest.warns(UserWarning, match="placeholder"):
        cluster = Cluster.from_device_kind("gpu", "NVIDIA H100 PCIe", 2)
    assert cluster.num_devices == 2
    assert cluster.device_spec(1).flops("float32") > 0
    with pytest.warns(UserWarning, match="tpu"):
        Cluster.from_device_kind("tpu", "TPU v3", 4)
    with pytest.raises(ValueError, match="platform"):
        Cluster.from_device_kind("metal", "Apple M2", 1)


@pytest.mark.api
def test_known_kinds_do_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Cluster.from_device_kind("gpu", "Tesla P100-SXM2-16GB", 8)


# ---- the mesh model: what the planner prices ---------------------------------------------------


@pytest.mark.closed_form
def test_device_positions_rank_jax_device_ids() -> None:
    assert device_positions((2, 3), None).tolist() == [[0, 1, 2], [3, 4, 5]]
    # cluster device ids are positions in the job's device order: jax ids are ranked
    assert device_positions((2, 2), np.array([[10, 3], [7, 5]])).tolist() == [[3, 0], [2, 1]]
    with pytest.raises(ValueError, match="shape"):
        device_positions((4,), np.array([[10, 3], [7, 5]]))


@pytest.mark.closed_form
def test_mesh_axes_price_each_axis_on_its_link() -> None:
    cluster = Cluster.preset("p100", nodes=2)
    mesh = mesh_axes(cluster, ("node", "gpu"), (2, 4), None)
    assert (mesh.names, mesh.sizes, mesh.num_devices) == (("node", "gpu"), (2, 4), 8)
    assert mesh.link_names == ("infiniband", "nvlink")
    # the four node-axis pairs all pass through each node's one EDR card: 12.5 / 4 GB/s each
    assert mesh.bandwidth == pytest.approx((12.5e9 / 4, 20e9))
    assert mesh.latency == pytest.approx((5e-6, 1e-6))
    # one 8-device ring over both axes crosses each card once
    assert mesh.group((0, 1)) == pytest.approx((8, 12.5e9, 5e-6))
    # jax devices laid out transposed (ids ranked): each gpu-axis row now spans both nodes,
    # and the two rows share each card
    ids = np.arange(8).reshape(4, 2).T + 100
    swapped = mesh_axes(cluster, ("a", "b"), (2, 4), ids)
    assert swapped.link_names == ("nvlink", "infiniband")
    assert swapped.bandwidth == pytest.approx((20e9, 12.5e9 / 2))


@pytest.mark.api
def test_mesh_axes_reject_a_mesh_the_cluster_cannot_hold() -> None:
    with pytest.raises(ValueError, match=r"pass Cluster.preset\('p100', nodes=2\)"):
        mesh_axes(Cluster.preset("p100"), ("a",), (8,), None)
    with pytest.raises(ValueError, match="2 axis names"):
        mesh_axes(Cluster.preset("p100"), ("a", "b"), (4,), None)
    with pytest.raises(ValueError, match="repeats"):
        mesh_axes(Cluster.preset("p100"), ("a",), (2,), np.array([3, 3]))


@pytest.mark.closed_form
def test_slowest_device_sets_the_even_split_rates() -> None:
    mixed = Cluster.preset("mixed-gpu")  # 8 A100 (ids 0-7), then 8 H100
    peak, mem = slowest_device(mixed, (2, 8), None)
    table = dict(peak)
    assert table["bfloat16"] == pytest.approx(312e12)  # the A100's, not the H100's 989.4
    assert table["float32"] == pytest.approx(19.5e12)
    assert table["float8_e4m3fn"] == pytest.approx(19.5e12)  # no FP8 on an A100: its f32 rate
    assert mem == pytest.approx(2039e9)
    assert [k for k, _ in peak] == sorted(table)
    # a mesh over the first 8 devices holds only A100s: their own table, no float8 entry
    a100 = mixed.device_spec(0)
    assert slowest_device(mixed, (8,), None) == (a100.peak_flops, a100.mem_bandwidth)
    with pytest.raises(ValueError, match="needs 32 devices"):
        slowest_device(mixed, (4, 8), None)


@pytest.mark.closed_form
def test_preset_sizing_is_the_smallest_cluster_holding_the_mesh() -> None:
    assert preset_sizing("p100", 6) == {"nodes": 2}
    assert preset_sizing("p100", 4096) == {"nodes": 1024}
    assert preset_sizing("dgx-h100", 2) == {"nodes": 1}
    assert preset_sizing("cpu", 3) == {"devices": 3}
    assert preset_sizing("accpar-tpu", 7) == {"devices": 8}  # 4 of each kind
    assert preset_sizing("mixed-gpu", 8) == {"devices": 8}  # half a node of each kind
    assert preset_sizing("mixed-gpu", 16) == {"nodes": 1}
    assert preset_sizing("mixed-gpu", 24) == {"nodes": 2}
    for name in Cluster.presets():
        for n in (1, 2, 3, 8, 13, 16, 40):
            cluster = Cluster.preset(name, **preset_sizing(name, n))
            cluster.check_mesh((n,))
            speeds = mesh_speeds(cluster, (n,), None)
            if speeds is not None and n > 1:  # a grouped preset: every kind is in the mesh
                assert len(speeds.slowdown("float32")) == len(cluster.groups), (name, n)
    with pytest.raises(ValueError, match="unknown cluster preset 'v100'"):
        preset_sizing("v100", 8)
    with pytest.raises(ValueError, match="at least 1 device"):
        preset_sizing("p100", 0)
