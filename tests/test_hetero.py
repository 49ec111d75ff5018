"""Tests for heterogeneous clusters (device groups, AccPar presets) and the ratio split the
planner prices (`jaxpar.hardware.speeds`, through `mesh_model.mesh_speeds`).

Closed forms from AccPar (Song et al., HPCA 2020), computed here from the device rates c_i:
Eq. 8 (computation E_cp,i = s_i · F / c_i), Eq. 10 (partition ratio α = c_i / (c_i + c_j) for
compute, applied cut by cut) and Eq. 7's per-device network rate b_i. Pure python and numpy:
the whole file runs in milliseconds.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from jaxpar.hardware import Cluster, DeviceGroup, DeviceSpec, LinkLevel
from jaxpar.hardware.mesh_model import mesh_axes, mesh_speeds
from jaxpar.hardware.speeds import ratio_factor

T = 1e12  # FLOP/s in one TFLOP/s
GB = 1e9
C_V2, C_V3 = 180 * T, 420 * T  # AccPar Table 7: TPU-v2 and TPU-v3 boards, bfloat16


def _eq8_times(flops: float, rates: list[float], shares: list[float]) -> list[float]:
    """AccPar Eq. 8 per device: E_cp,i = s_i · F / c_i."""
    return [s * flops / c for s, c in zip(shares, rates, strict=True)]


def _hierarchical_shares(rates: list[float]) -> list[float]:
    """AccPar's recursive partition: cut the devices in two halves, give the first half
    α = C_1 / (C_1 + C_2) by Eq. 10 (C = Σ c of a half that balances inside), recurse."""
    if len(rates) == 1:
        return [1.0]
    half = len(rates) // 2
    first, second = rates[:half], rates[half:]
    alpha = sum(first) / (sum(first) + sum(second))
    return [alpha * s for s in _hierarchical_shares(first)] + [
        (1 - alpha) * s for s in _hierarchical_shares(second)
    ]


def _flat_cluster(rates: list[float]) -> Cluster:
    """One device per group, group i of rate rates[i], all on one flat level."""
    groups = [
        DeviceGroup(f"g{i}", DeviceSpec(f"d{i}", {"float32": c}, 1e12, 16e9), 1)
        for i, c in enumerate(rates)
    ]
    return Cluster.from_groups("flat", groups, [LinkLevel("net", len(rates), 10 * GB, 0.0)])


# ---- Eq. 8 / Eq. 10 through the planner's MeshSpeeds ------------------------------------------


@pytest.mark.closed_form
def test_two_devices_split_at_eq10_alpha_and_finish_together() -> None:
    cluster = Cluster.preset("accpar-tpu", devices=2)  # one TPU-v2 board, one TPU-v3 board
    speeds = mesh_speeds(cluster, (2,), None)
    assert speeds is not None
    alpha = C_V2 / (C_V2 + C_V3)  # Eq. 10 for compute: 180 / 600 = 0.3
    shares = speeds.shares("bfloat16", (0,))
    assert shares == pytest.approx({"tpu-v2": alpha, "tpu-v3": 1 - alpha})
    assert alpha == pytest.approx(0.3)
    # Eq. 8 at the ratio split: both boards finish together ...
    flops = 1.8e15
    t_v2, t_v3 = _eq8_times(flops, [C_V2, C_V3], [shares["tpu-v2"], shares["tpu-v3"]])
    assert t_v2 == pytest.approx(t_v3)
    # ... while the even split waits on the TPU-v2; the factor is their ratio (0.6).
    t_even = max(_eq8_times(flops, [C_V2, C_V3], [0.5, 0.5]))
    assert speeds.factor("bfloat16", (0,)) == pytest.approx(t_v2 / t_even)
    assert speeds.factor("bfloat16", (0,)) == pytest.approx(0.6)
    assert speeds.factor("bfloat16", ()) == 1.0  # nothing split: both compute everything
    # even split: the TPU-v3 is busy c_v2 / c_v3 of the step
    assert speeds.slowdown("bfloat16") == pytest.approx({"tpu-v2": 1.0, "tpu-v3": C_V2 / C_V3})


@pytest.mark.closed_form
def test_accpar_array_ratio_split_depends_on_the_axes_it_crosses() -> None:
    """AccPar §6.2: 128 TPU-v2 + 128 TPU-v3 boards as a (group=2, x=128) mesh."""
    speeds = mesh_speeds(Cluster.preset("accpar-tpu"), (2, 128), None)
    assert speeds is not None
    # Split over every board: even = F / (256 · c_v2), ratio = F / (128 · (c_v2 + c_v3)).
    flops = 1e18
    even, ratio = flops / (256 * C_V2), flops / (128 * (C_V2 + C_V3))
    assert speeds.factor("bfloat16", (0, 1)) == pytest.approx(ratio / even)
    assert ratio / even == pytest.approx(0.6)
    assert speeds.shares("bfloat16", (0, 1)) == pytest.approx({"tpu-v2": 0.3, "tpu-v3": 0.7})
    # Split over the group axis only: one TPU-v2 shard and one TPU-v3 shard, same closed form.
    assert speeds.factor("bfloat16", (0,)) == pytest.approx(2 * C_V2 / (C_V2 + C_V3))
    # Split over x only: every shard is replicated on a TPU-v2 and a TPU-v3 board, and its
    # TPU-v2 replica sets the pace: all shards alike, nothing for a ratio split to win.
    assert speeds.factor("bfloat16", (1,)) == pytest.approx(1.0)
    assert speeds.shares("bfloat16", (1,)) == pytest.approx({"tpu-v2": 1.0})


@pytest.mark.closed_form
def test_shares_equal_accpars_hierarchical_cuts() -> None:
    rates = [180 * T, 420 * T, 180 * T, 420 * T, 989.4 * T]
    speeds = mesh_speeds(_flat_cluster(rates), (5,), None)
    assert speeds is not None
    expected = _hierarchical_shares(rates)
    assert sum(expected) == pytest.approx(1.0)
    shares = speeds.shares("float32", (0,))
    assert [shares[f"g{i}"] for i in range(5)] == pytest.approx(expected)
    # every device finishes together (Eq. 8), at F / Σ c; the even split at F / (5 · c_min)
    times = _eq8_times(1e15, rates, expected)
    assert times == pytest.approx([1e15 / sum(rates)] * 5)
    even = 1e15 / (5 * min(rates))
    assert speeds.factor("float32", (0,)) == pytest.approx(times[0] / even)


@pytest.mark.closed_form
def test_ratio_factor_matches_the_closed_form_on_random_meshes() -> None:
    """k · min_j c_j / Σ_j c_j over shards, each shard's rate its slowest replica's."""
    rng = np.random.default_rng(0)
    for _ in range(60):
        shape = tuple(int(n) for n in rng.choice([1, 2, 3, 4], size=int(rng.integers(1, 4))))
        n = math.prod(shape)
        rates = list(rng.uniform(10, 1000, n) * T)  # distinct: one kind per device
        cluster = _flat_cluster(rates)
        ids = rng.permutation(n).reshape(shape) + 7  # jax ids, ranked onto cluster devices
        speeds = mesh_speeds(cluster, shape, ids) if n > 1 else None
        if speeds is None:
            continue
        order = np.argsort(ids.reshape(-1)).argsort().reshape(shape)  # cluster position per slot
        for r in range(len(shape) + 1):
            for axes in itertools.combinations(range(len(shape)), r):
                shard_rate: dict[tuple[int, ...], float] = {}
                for index in itertools.product(*(range(k) for k in shape)):
                    key = tuple(index[a] for a in axes)
                    c = rates[int(order[index])]
                    shard_rate[key] = min(shard_rate.get(key, math.inf), c)
                c_shards = list(shard_rate.values())
                expected = len(c_shards) * min(c_shards) / sum(c_shards)
                assert speeds.factor("float32", axes) == pytest.approx(expected)
                assert ratio_factor(speeds.rates("float32"), axes) == pytest.approx(expected)
                assert speeds.factor("float32", axes) <= 1 + 1e-12  # never slower than even
                assert sum(speeds.shares("float32", axes).values()) == pytest.approx(1.0)


@pytest.mark.closed_form
def test_meshes_of_one_kind_have_no_ratio_costs() -> None:
    assert mesh_speeds(Cluster.preset("accpar-tpu-homogeneous", devices=8), (2, 4), None) is None
    # a heterogeneous cluster, but the mesh holds only its first (TPU-v2) boards
    speeds = mesh_speeds(Cluster.preset("accpar-tpu", devices=8), (2, 2), None)
    assert speeds is not None
    assert speeds.groups.tolist() == [[0, 0], [0, 0]]
    assert speeds.factor("bfloat16", (0, 1)) == pytest.approx(1.0)
    assert speeds.slowdown("bfloat16") == {"tpu-v2": 1.0}


@pytest.mark.closed_form
def test_eq7_network_rates_are_each_boards_b_i() -> None:
    """AccPar §6.1: 8 Gb/s per TPU-v2 board and 16 Gb/s per TPU-v3 board = 1 and 2 GB/s."""
    cluster = Cluster.preset("accpar-tpu", devices=8)  # boards 0-3 TPU-v2, 4-7 TPU-v3

    def ring(ids: list[int]) -> float:
        return cluster.axis_bandwidths((len(ids),), np.array(ids))[0]

    assert ring([0, 1, 2, 3]) == pytest.approx(8e9 / 8)
    assert ring([4, 5, 6, 7]) == pytest.approx(16e9 / 8)
    assert ring([3, 4]) == pytest.approx(1 * GB)  # a transfer runs at the slower end's b_i
    # the planner's view of a (group=2, x=4) mesh: each axis at its slowest ring
    mesh = mesh_axes(cluster, ("group", "x"), (2, 4), None)
    assert mesh.bandwidth == pytest.approx((1 * GB, 1 * GB))
    assert mesh.latency == (0.0, 0.0)  # Eq. 7 has no latency term
    v3_only = Cluster.preset("accpar-tpu-homogeneous", devices=8)
    assert mesh_axes(v3_only, ("group", "x"), (2, 4), None).bandwidth == pytest.approx(
        (2 * GB, 2 * GB)
    )


@pytest.mark.api
def test_mesh_speeds_reject_a_mesh_the_cluster_cannot_hold() -> None:
    with pytest.raises(ValueError, match=r"pass Cluster.preset\('accpar-tpu', devices=16\)"):
        mesh_speeds(Cluster.preset("accpar-tpu", devices=8), (4, 4), None)
    with pytest.raises(ValueError, match="repeats"):
        mesh_speeds(Cluster.preset("accpar-tpu", devices=8), (2,), np.array([5, 5]))


def _pair_bandwidth(cluster: Cluster, a: int, b: int) -> float:
    """Bytes/s of a transfer between devices a and b: a two-device ring, no contention."""
    return cluster.axis_bandwidths((2,), np.array([a, b]))[0]


# ---- presets ----------------------------------------------------------------------------------


@pytest.mark.closed_form
def test_accpar_tpu_preset_follows_table_7() -> None:
    cluster = Cluster.preset("accpar-tpu")
    assert cluster.num_devices == 256 and cluster.heterogeneous
    v2, v3 = cluster.groups
    assert (v2.name, v2.count, v3.name, v3.count) == ("tpu-v2", 128, "tpu-v3", 128)
    assert cluster.device == v2.device  # the first (slowest) group
    assert cluster.device_spec(0).flops("bfloat16") == pytest.approx(180 * T)
    assert cluster.device_spec(255).flops("bfloat16") == pytest.approx(420 * T)
    assert cluster.device_spec(0).memory_bytes == pytest.approx(64 * GB)
    assert cluster.device_spec(255).mem_bandwidth == pytest.approx(4800 * GB)
    assert cluster.group_ids()[[0, 127, 128, 255]].tolist() == [0, 0, 1, 1]
    # b_i: 8 Gb/s and 16 Gb/s (gigabits) = 1 and 2 GB/s; one flat level.
    assert [level.name for level in cluster.levels] == ["network"]
    rows = np.arange(256).reshape(2, 128)  # one ring per kind
    assert cluster.axis_bandwidths((128,), rows[0]) == pytest.approx((1 * GB,))
    assert cluster.axis_bandwidths((128,), rows[1]) == pytest.approx((2 * GB,))
    assert cluster.axis_bandwidths((2,), np.array([0, 255])) == pytest.approx((1 * GB,))
    c = cluster.device_flops("bfloat16")
    assert c[:128] == pytest.approx(np.full(128, 180 * T))
    assert c[128:] == pytest.approx(np.full(128, 420 * T))


@pytest.mark.closed_form
def test_accpar_homogeneous_preset_is_128_tpu_v3_boards() -> None:
    cluster = Cluster.preset("accpar-tpu-homogeneous")
    assert cluster.num_devices == 128 and not cluster.heterogeneous and cluster.groups == ()
    assert cluster.device.flops("bfloat16") == pytest.approx(420 * T)
    assert cluster.levels[0].bandwidth == pytest.approx(2 * GB)
    assert Cluster.preset("accpar-tpu-homogeneous", devices=8).num_devices == 8


@pytest.mark.closed_form
def test_accpar_tpu_sizes_by_devices_keeping_the_ratio() -> None:
    cluster = Cluster.preset("accpar-tpu", devices=8)
    assert [g.count for g in cluster.groups] == [4, 4]
    assert cluster.levels[0].group_size == 8
    # mesh (2, 4): axis-0 pairs {i, i+4} mix both kinds, axis-1 rows hold one kind each.
    speeds = mesh_speeds(cluster, (2, 4), None)
    assert speeds is not None and speeds.groups.tolist() == [[0] * 4, [1] * 4]
    assert speeds.factor("bfloat16", (0,)) < 1.0  # the split crosses kinds
    assert cluster.axis_bandwidths((2, 4)) == pytest.approx((1 * GB, 1 * GB))  # slowest ring


@pytest.mark.closed_form
def test_mixed_gpu_preset_matches_datasheets() -> None:
    cluster = Cluster.preset("mixed-gpu")
    assert cluster.num_devices == 16 and cluster.heterogeneous
    a100, h100 = cluster.device_spec(0), cluster.device_spec(8)
    assert a100.name == "A100-SXM4-80GB" and h100.name == "H100-SXM5-80GB"
    assert a100.flops("bfloat16") == pytest.approx(312 * T)  # dense, not "with sparsity"
    assert a100.flops("tensorfloat32") == pytest.approx(156 * T)
    assert a100.flops("float32") == pytest.approx(19.5 * T)
    assert a100.mem_bandwidth == pytest.approx(2039 * GB)
    assert h100 == Cluster.preset("dgx-h100").device
    nvlink, infiniband = cluster.levels
    assert (nvlink.group_size, nvlink.bandwidth) == (8, 450 * GB)
    assert (infiniband.group_size, infiniband.bandwidth) == (16, 50 * GB)
    # NVLink 3 (300 GB/s) in the A100 node, NVLink 4 in the H100 node, HDR between nodes.
    assert _pair_bandwidth(cluster, 0, 1) == pytest.approx(300 * GB)
    assert _pair_bandwidth(cluster, 8, 9) == pytest.approx(450 * GB)
    assert _pair_bandwidth(cluster, 0, 8) == pytest.approx(25 * GB)
    assert cluster.axis_bandwidths((2, 8)) == pytest.approx((25 * GB, 300 * GB))


@pytest.mark.closed_form
def test_mixed_gpu_sizes() -> None:
    two = Cluster.preset("mixed-gpu", nodes=2)  # nodes of each kind
    assert two.num_devices == 32 and [g.count for g in two.groups] == [16, 16]
    assert _pair_bandwidth(two, 16, 24) == pytest.approx(50 * GB)  # H100 node to H100 node
    assert _pair_bandwidth(two, 0, 8) == pytest.approx(25 * GB)  # A100 node to A100 node
    assert "nodes=2" in two.describe()
    half = Cluster.preset("mixed-gpu", devices=8)  # half a node of each kind
    assert [g.count for g in half.groups] == [4, 4]
    assert [level.group_size for level in half.levels] == [4, 8]
    assert Cluster.preset("mixed-gpu", devices=32) == two


@pytest.mark.closed_form
def test_describe_shows_every_group_with_sources() -> None:
    text = Cluster.preset("accpar-tpu").describe()
    assert "heterogeneous" in text
    assert "'tpu-v2': devices 0..127" in text and "'tpu-v3': devices 128..255" in text
    assert "180.00 TFLOP/s" in text and "420.00 TFLOP/s" in text
    assert "AccPar Table 7" in text and "8 Gb/s" in text and "16 Gb/s" in text
    assert "1.00 GB/s" in text and "2.00 GB/s" in text  # each group's b_i
    mixed = Cluster.preset("mixed-gpu").describe()
    assert "A100-SXM4-80GB" in mixed and "H100-SXM5-80GB" in mixed
    assert "A100 datasheet" in mixed and "HDR" in mixed and "300.00 GB/s" in mixed


@pytest.mark.api
def test_new_presets_hash_and_size_like_the_planner_asks() -> None:
    for name in ("accpar-tpu", "accpar-tpu-homogeneous", "mixed-gpu"):
        assert name in Cluster.presets()
        assert hash(Cluster.preset(name)) == hash(Cluster.preset(name))
        # meshes.resolve_cluster sizes a preset to a mesh of jax devices: devices=8 here.
        assert Cluster.preset(name, devices=8).num_devices == 8
        assert Cluster.preset(name, nodes=1) == Cluster.preset(name)


@pytest.mark.api
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "accpar-tpu", "devices": 7}, "multiple of 2"),
        ({"name": "accpar-tpu", "nodes": 2}, "devices="),
        ({"name": "accpar-tpu", "devices": 0}, "devices must be >= 1"),
        ({"name": "mixed-gpu", "devices": 20}, "multiple of 16"),
        ({"name": "mixed-gpu", "devices": 5}, "multiple of 2"),
        ({"name": "mixed-gpu", "nodes": 2, "devices": 32}, "not both"),
        ({"name": "mixed-gpu", "nodes": 0}, "nodes must be >= 1"),
    ],
)
def test_grouped_presets_reject_bad_sizes(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Cluster.preset(**kwargs)


@pytest.mark.api
def test_too_small_grouped_cluster_says_how_to_fix_it() -> None:
    with pytest.raises(ValueError, match=r"Cluster.preset\('accpar-tpu', devices=16\)"):
        Cluster.preset("accpar-tpu", devices=4).check_mesh((4, 4))
    with pytest.raises(ValueError, match=r"Cluster.preset\('mixed-gpu', nodes=2\)"):
        Cluster.preset("mixed-gpu").check_mesh((4, 8))


# ---- hand-built groups ------------------------------------------------------------------------


def _spec(name: str, tflops: float) -> DeviceSpec:
    return DeviceSpec(name, {"float32": tflops * T}, 1e12, 16e9)


def _two_nodes() -> tuple[LinkLevel, LinkLevel]:
    return LinkLevel("node", 4, 100 * GB, 1e-6), LinkLevel("net", 8, 10 * GB, 5e-6)


@pytest.mark.closed_form
def test_from_groups_builds_a_heterogeneous_cluster() -> None:
    slow, fast = _spec("slow", 1), _spec("fast", 3)
    groups = (DeviceGroup("a", slow, 4, link_bandwidth=5 * GB), DeviceGroup("b", fast, 4))
    cluster = Cluster.from_groups("mine", groups, _two_nodes())
    assert (cluster.num_devices, cluster.device) == (8, slow)
    assert cluster.device_flops("float32") == pytest.approx([1 * T] * 4 + [3 * T] * 4)
    # group "a" drives 5 GB/s on any level; "b" has the node's 100 GB/s
    assert cluster.axis_bandwidths((4,), np.arange(4)) == pytest.approx((5 * GB,))
    assert cluster.axis_bandwidths((4,), np.arange(4, 8)) == pytest.approx((100 * GB,))
    assert cluster.axis_bandwidths((2, 4)) == pytest.approx((5 * GB, 5 * GB))
    assert [cluster.device_spec(i).memory_bytes for i in (0, 7)] == [16e9, 16e9]
    # Two groups of one kind are not heterogeneous: no ratio costs.
    same = Cluster.from_groups(
        "same", (DeviceGroup("x", slow, 4), DeviceGroup("y", slow, 4)), _two_nodes()
    )
    assert not same.heterogeneous and mesh_speeds(same, (2, 4), None) is None
    # A single flat level may split anywhere.
    flat = (LinkLevel("flat", 3, 1 * GB, 0.0),)
    odd = Cluster.from_groups("odd", (DeviceGroup("a", slow, 1), DeviceGroup("b", fast, 2)), flat)
    assert odd.group_ids().tolist() == [0, 1, 1]
    assert odd.device_flops("float32") == pytest.approx([1 * T, 3 * T, 3 * T])


@pytest.mark.api
def test_bad_groups_are_rejected() -> None:
    slow, fast = _spec("slow", 1), _spec("fast", 3)
    levels = _two_nodes()
    with pytest.raises(ValueError, match="sum to num_devices"):
        Cluster("x", slow, 8, levels, (DeviceGroup("a", slow, 4), DeviceGroup("b", fast, 2)))
    with pytest.raises(ValueError, match="innermost level 'node'"):
        Cluster.from_groups("x", (DeviceGroup("a", slow, 2), DeviceGroup("b", fast, 6)), levels)
    with pytest.raises(ValueError, match="first group's spec"):
        Cluster("x", fast, 8, levels, (DeviceGroup("a", slow, 4), DeviceGroup("b", fast, 4)))
    with pytest.raises(ValueError, match="caps levels"):
        bad = DeviceGroup("a", slow, 4, level_bandwidths={"pcie": 1 * GB})
        Cluster.from_groups("x", (bad, DeviceGroup("b", fast, 4)), levels)
    with pytest.raises(ValueError, match="count must be an integer >= 1"):
        DeviceGroup("a", slow, 0)
    with pytest.raises(ValueError, match="link_bandwidth must be > 0"):
        DeviceGroup("a", slow, 1, link_bandwidth=0.0)
    with pytest.raises(ValueError, match="level_bandwidths"):
        DeviceGroup("a", slow, 1, level_bandwidths={"node": -1.0})
    with pytest.raises(ValueError, match="at least one device group"):
        Cluster.from_groups("x", (), levels)
    cluster = Cluster.preset("accpar-tpu", devices=4)
    with pytest.raises(ValueError, match="out of range"):
        cluster.device_spec(4)
    with pytest.raises(ValueError, match="out of range"):
        cluster.device_spec(-1)
