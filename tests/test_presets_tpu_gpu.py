"""TPU slice and DGX presets, `Cluster.detect`, and the hardware mesh helper (issue 12).

Pure presets and detection run in milliseconds; the pod-scale plans are abstract meshes (nothing
allocated), about half a second each; the mesh helper uses the 8 simulated CPU devices.
"""

from __future__ import annotations

import warnings

import jaxpar_zoo as zoo
import pytest

import jaxpar
from jaxpar.hardware import DeviceInfo, preset_sizing
from jaxpar.hardware.cluster import Cluster
from jaxpar.hardware.mesh_model import mesh_axes
from jaxpar.trace.meshes import detect_cluster, make_hardware_mesh

TPUS = ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e")
GPUS = ("dgx-a100", "dgx-h200", "dgx-b200")
GB = 1e9


# ---- presets -----------------------------------------------------------------------------------


@pytest.mark.closed_form
@pytest.mark.parametrize("name", TPUS + GPUS)
def test_every_new_preset_builds_at_several_sizes(name: str) -> None:
    assert name in Cluster.presets()
    one = Cluster.preset(name)
    per_node = one.num_devices
    for nodes in (1, 2, 4, 16):
        cluster = Cluster.preset(name, nodes=nodes)
        assert cluster.num_devices == nodes * per_node
        assert hash(cluster) == hash(Cluster.preset(name, nodes=nodes))
    if name in TPUS:  # one slice: ICI only, whatever the hosts; slices add DCN
        assert [lv.name for lv in Cluster.preset(name, nodes=4).levels] == ["ici"]
        multi = Cluster.preset(name, nodes=2, slices=3)  # 3 slices of 2 hosts
        assert multi.num_devices == 6 * per_node
        assert [(lv.name, lv.group_size) for lv in multi.levels] == [
            ("ici", 2 * per_node),
            ("dcn", 6 * per_node),
        ]
        assert Cluster.preset(name, devices=2 * per_node, slices=2) == Cluster.preset(
            name, nodes=1, slices=2
        )
    else:
        assert [lv.name for lv in Cluster.preset(name, nodes=2).levels] == ["nvlink", "infiniband"]
        with pytest.raises(ValueError, match="slices= is for the TPU presets"):
            Cluster.preset(name, slices=2)


@pytest.mark.closed_form
def test_datasheet_numbers() -> None:
    v5p = Cluster.preset("tpu-v5p")
    spec = v5p.device
    assert spec.flops("bfloat16") == pytest.approx(459e12)
    assert spec.mem_bandwidth == pytest.approx(2765e9)
    assert spec.memory_bytes == 95 * 2**30
    assert v5p.levels[0].bandwidth == pytest.approx(200e9)  # 2 links x 100 GB/s
    assert Cluster.preset("tpu-v4").device.flops("bfloat16") == pytest.approx(275e12)
    assert Cluster.preset("tpu-v5e").device.mem_bandwidth == pytest.approx(819e9)
    v6e = Cluster.preset("tpu-v6e", nodes=1, slices=2)
    assert v6e.device.flops("bfloat16") == pytest.approx(918e12)
    assert v6e.levels[1].bandwidth == pytest.approx(100e9)  # 4 x 200 Gb/s per host
    assert v6e.levels[1].shared_by == 8
    a100, h200, b200 = (Cluster.preset(n, nodes=2) for n in GPUS)
    assert [lv.bandwidth for lv in a100.levels] == [300e9, 25e9]
    assert [lv.bandwidth for lv in h200.levels] == [450e9, 50e9]
    assert [lv.bandwidth for lv in b200.levels] == [900e9, 50e9]
    assert h200.device.memory_bytes == 141e9 and h200.device.mem_bandwidth == 4.8e12
    assert b200.device.flops("bfloat16") == pytest.approx(2250e12)
    assert b200.device.memory_bytes == 180e9


@pytest.mark.api
@pytest.mark.parametrize("name", TPUS + GPUS)
def test_describe_gives_a_source_for_every_number(name: str) -> None:
    text = Cluster.preset(name, nodes=2, slices=2 if name in TPUS else 1).describe()
    lines = text.splitlines()
    source = next(line for line in lines if "device numbers:" in line)
    assert "page" in source or "datasheet" in source, source
    head = next(i for i, line in enumerate(lines) if line.strip().startswith("level "))
    rows = [line for line in lines[head + 1 :] if line.startswith("    ")]
    assert len(rows) == 2
    for row in rows:  # every level: bandwidth and latency sources
        tail = row.split("us", 1)[1]
        assert "page" in tail or "datasheet" in tail or "approximate" in tail, row
        assert "latency" in tail or "per step" in tail or "ring step" in tail, row
    if name in TPUS:
        assert "topology:" in text and "torus" in text and "model:" in text
        assert "2 links per chip" in text and "between 2 slices" in text
        assert "DCN" in text


@pytest.mark.closed_form
def test_v5p_axis_inside_a_slice_gets_ici_and_across_slices_dcn() -> None:
    cluster = Cluster.preset("tpu-v5p", devices=2048, slices=4)
    axes = mesh_axes(cluster, ("slice", "chip"), (4, 512), None)
    assert axes.link_names == ("dcn", "ici")
    assert axes.bandwidth[1] == pytest.approx(200e9)  # a ring on one torus dimension
    # every chip crosses slices at once: the host's 200 Gb/s shared by its 4 chips = 50 Gb/s
    assert axes.bandwidth[0] == pytest.approx(50e9 / 8)
    # one ring across the slices alone gets the host's whole 200 Gb/s (slices of one chip)
    lone = mesh_axes(Cluster.preset("tpu-v5p", devices=4, slices=4), ("slice",), (4,), None)
    assert lone.link_names == ("dcn",) and lone.bandwidth[0] == pytest.approx(25e9)
    # the inner axis spanning two slices is DCN too
    assert mesh_axes(cluster, ("a", "b"), (2, 1024), None).link_names == ("dcn", "dcn")


@pytest.mark.closed_form
def test_tpu_sizing_and_slice_limits() -> None:
    assert preset_sizing("tpu-v5p", 13) == {"nodes": 4}
    assert preset_sizing("tpu-v5e", 256) == {"nodes": 32}
    assert preset_sizing("tpu-v5e", 1024) == {"nodes": 32, "slices": 4}
    for name in TPUS:
        for n in (1, 5, 300, 5000, 20000):
            Cluster.preset(name, **preset_sizing(name, n)).check_mesh((n,))
    with pytest.raises(ValueError, match=r"at most 256 chips.*slices=4"):
        Cluster.preset("tpu-v6e", devices=1024)
    with pytest.raises(ValueError, match="whole hosts of 4"):
        Cluster.preset("tpu-v5p", devices=12, slices=2)
    with pytest.raises(ValueError, match=r"Cluster.preset\('tpu-v5e', nodes=32, slices=2\)"):
        Cluster.preset("tpu-v5e").check_mesh((512,))


# ---- detection ---------------------------------------------------------------------------------


def _v5p_chips(slices: int = 2, hosts_per_slice: int = 1, per_host: int = 4) -> list[DeviceInfo]:
    out = []
    for s in range(slices):
        for h in range(hosts_per_slice):
            for c in range(per_host):
                i = (s * hosts_per_slice + h) * per_host + c
                coords = (c % 2, c // 2, h)
                out.append(DeviceInfo("tpu", "TPU v5", i, s * hosts_per_slice + h, s, coords))
    return out


@pytest.mark.api
def test_detect_tpu_slices_from_synthetic_devices() -> None:
    cluster = Cluster.detect(_v5p_chips())  # 8 chips, 2 hosts, 2 slices
    assert cluster == Cluster.preset("tpu-v5p", nodes=1, slices=2)
    assert [(lv.name, lv.group_size) for lv in cluster.levels] == [("ici", 4), ("dcn", 8)]
    notes = " | ".join(cluster.assumptions)
    assert "'tpu-v5p'" in notes and "2 slice(s) of 4 chips" in notes
    assert "2x2x1" in notes  # the torus shape read from coords
    assert "assumed:" in cluster.describe()
    # no slice_index: one slice; dicts work as well as DeviceInfo
    flat = [
        {"platform": "tpu", "device_kind": "TPU v5 lite", "process_index": i // 8}
        for i in range(16)
    ]
    one = Cluster.detect(flat)
    assert one.name == "tpu-v5e" and [lv.name for lv in one.levels] == ["ici"]
    assert any("one slice" in note for note in one.assumptions)
    with pytest.raises(ValueError, match="unequal"):
        Cluster.detect(_v5p_chips()[:6])


@pytest.mark.api
def test_detect_gpus_cpus_and_unknown_kinds() -> None:
    gpus = [DeviceInfo("gpu", "NVIDIA H200", i, i // 8) for i in range(16)]
    cluster = Cluster.detect(gpus)
    assert cluster == Cluster.preset("dgx-h200", nodes=2)
    assert any("2 host(s)" in note for note in cluster.assumptions)
    cpu = Cluster.detect([DeviceInfo("cpu", "cpu", i) for i in range(8)])
    assert cpu == Cluster.preset("cpu") and "assumed" in cpu.assumptions[0]
    with pytest.warns(UserWarning, match="placeholder"):
        Cluster.detect([DeviceInfo("gpu", "NVIDIA H200 NVL", i) for i in range(2)])
    with pytest.raises(ValueError, match="from_groups"):
        Cluster.detect([DeviceInfo("gpu", "NVIDIA H200"), DeviceInfo("gpu", "NVIDIA B200")])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Cluster.from_device_kind("tpu", "TPU v6 lite", 8).name == "tpu-v6e"
        assert Cluster.from_device_kind("gpu", "NVIDIA B200", 8).name == "dgx-b200"
        assert Cluster.from_device_kind("gpu", "NVIDIA A100-SXM4-80GB", 8).name == "dgx-a100"


@pytest.mark.api
def test_detect_cluster_reads_the_cpu_devices() -> None:
    cluster = detect_cluster()
    assert cluster == Cluster.preset("cpu", devices=8)
    assert cluster.assumptions and "cpu" in cluster.assumptions[0]


# ---- the hardware mesh -------------------------------------------------------------------------


@pytest.mark.api
def test_make_hardware_mesh_keeps_ici_axes_inside_a_slice() -> None:
    mesh = make_hardware_mesh({"chip": 4}, {"slice": 2})
    assert mesh.axis_names == ("slice", "chip") and mesh.devices.shape == (2, 4)
    ids = [[d.id for d in row] for row in mesh.devices]
    assert ids == [[0, 1, 2, 3], [4, 5, 6, 7]]  # each slice one contiguous block
    assert all(t == jaxpar.make_mesh({"a": 8}).axis_types[0] for t in mesh.axis_types)
    # an axis in both: slices outermost, so data index = slice * 2 + index inside the slice
    both = make_hardware_mesh({"data": 2, "model": 2}, {"data": 2})
    assert both.devices.shape == (4, 2)
    assert [[d.id for d in row] for row in both.devices] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert make_hardware_mesh({"x": 2, "y": 4}).devices.shape == (2, 4)
    with pytest.raises(ValueError, match="needs 16 devices"):
        make_hardware_mesh({"chip": 8}, {"slice": 2})
    with pytest.raises(TypeError, match="dicts of axis sizes"):
        make_hardware_mesh({"chip": 4}, [2])  # type: ignore[arg-type]


# ---- pod scale: the heaviest collectives stay on ICI / NVLink -----------------------------------

POD = [
    ("tpu-v5p", {"slice": 4, "chip": 512}, {"devices": 2048, "slices": 4}),
    ("tpu-v4", {"slice": 4, "chip": 512}, {"devices": 2048, "slices": 4}),
    ("tpu-v5e", {"slice": 4, "chip": 256}, {"devices": 1024, "slices": 4}),
    ("tpu-v6e", {"slice": 4, "chip": 256}, {"devices": 1024, "slices": 4}),
    ("dgx-a100", {"node": 16, "gpu": 8}, {"nodes": 16}),
    ("dgx-h200", {"node": 16, "gpu": 8}, {"nodes": 16}),
    ("dgx-b200", {"node": 16, "gpu": 8}, {"nodes": 16}),
]


@pytest.mark.closed_form
@pytest.mark.parametrize(("name", "mesh", "size"), POD, ids=[case[0] for case in POD])
def test_pod_scale_plan_puts_heaviest_collectives_on_the_fast_axis(
    name: str, mesh: dict[str, int], size: dict[str, int]
) -> None:
    outer, inner = mesh
    cluster = Cluster.preset(name, **size)
    # 128 sequences per device: with fewer, this tiny model runs fastest mostly replicated
    # (per-kernel overheads do not shrink with the split)
    ex = zoo.get("gpt_small", small=True, batch=128 * mesh[outer] * mesh[inner])
    plan = jaxpar.plan(ex.step, *ex.args, mesh=mesh, cluster=cluster)
    assert plan.mesh_axes.link_names[0] in ("dcn", "infiniband")
    assert plan.mesh_axes.link_names[1] in ("ici", "nvlink")
    slow = sum(c.bytes for c in plan.collectives if outer in c.axes)
    fast = sum(c.bytes for c in plan.collectives if inner in c.axes)
    assert fast > 0 and slow < fast, (slow, fast)
