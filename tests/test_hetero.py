"""Tests for heterogeneous clusters (device groups, AccPar presets) and jaxpar.hetero's formulas.

Closed forms from AccPar (Song et al., HPCA 2020): Eq. 7 (communication), Eq. 8 (computation)
and Eq. 10 (partition ratio α). Pure python and numpy: the whole file runs in milliseconds.
"""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest

from jaxpar import hetero
from jaxpar.cluster import Cluster, DeviceGroup, DeviceSpec, LinkLevel

T = 1e12  # FLOP/s in one TFLOP/s
GB = 1e9

# ---- Eq. 7 / Eq. 8: per-device times ----------------------------------------------------------


def test_compute_times_are_share_times_flops_over_rate() -> None:
    rates = np.array([180 * T, 420 * T])
    times = hetero.compute_times(1.8e15, rates, [0.25, 0.75])
    assert times == pytest.approx([0.25 * 1.8e15 / (180 * T), 0.75 * 1.8e15 / (420 * T)])
    even = hetero.compute_times(1.8e15, rates)  # None: the even split
    assert even == pytest.approx([5.0, 1.8e15 / 2 / (420 * T)])


def test_comm_times_are_bytes_over_bandwidth() -> None:
    assert hetero.comm_times(4e9, [1 * GB, 2 * GB]) == pytest.approx([4.0, 2.0])
    assert hetero.comm_times([1e9, 3e9], [1 * GB, 2 * GB]) == pytest.approx([1.0, 1.5])
    assert hetero.comm_times(1e9, [np.inf]) == pytest.approx([0.0])


def test_device_times_add_compute_share_and_fixed_communication() -> None:
    rates, bandwidths = [100 * T, 200 * T], [1 * GB, 4 * GB]
    shares = [0.4, 0.6]
    flops, share_bytes, fixed_bytes = 1e15, 2e9, 1e9
    times = hetero.device_times(
        flops,
        rates,
        shares,
        bandwidths=bandwidths,
        share_bytes=share_bytes,
        fixed_bytes=fixed_bytes,
    )
    expected = [
        s * (flops / c + share_bytes / b) + fixed_bytes / b
        for s, c, b in zip(shares, rates, bandwidths, strict=True)
    ]
    assert times == pytest.approx(expected)
    # A device with share 0 sits the layer out, fixed bytes included.
    idle = hetero.device_times(flops, rates, [1.0, 0.0], bandwidths=bandwidths, fixed_bytes=1e9)
    assert idle == pytest.approx([10.0 + 1.0, 0.0])


# ---- Eq. 10: the partition ratio --------------------------------------------------------------


def test_partition_ratio_for_pure_compute_is_the_speed_ratio() -> None:
    # AccPar's array: TPU-v2 (180 TFLOP/s) against TPU-v3 (420): α = 180 / 600 = 0.3.
    costs = hetero.unit_costs(1e15, [180 * T, 420 * T])
    assert hetero.partition_ratio(*costs) == pytest.approx(0.3)
    assert hetero.partition_ratio(1 / 180, 1 / 420) == pytest.approx(180 / (180 + 420))


def test_partition_ratio_with_communication_balances_both_sides() -> None:
    # F/c: 1 s on the TPU-v2, 3/7 s on the TPU-v3; S/b: 1 s at 1 GB/s, 1/2 s at 2 GB/s.
    # α (1 + 1) = (1 − α)(3/7 + 1/2)  ->  α = (13/14) / (41/14) = 13/41.
    flops, rates, bandwidths = 180 * T, [180 * T, 420 * T], [1 * GB, 2 * GB]
    costs = hetero.unit_costs(flops, rates, bandwidths=bandwidths, share_bytes=1e9)
    assert costs == pytest.approx([2.0, 13 / 14])
    alpha = hetero.partition_ratio(*costs)
    assert alpha == pytest.approx(13 / 41)
    times = hetero.device_times(
        flops, rates, [alpha, 1 - alpha], bandwidths=bandwidths, share_bytes=1e9
    )
    assert times[0] == pytest.approx(times[1])


def test_partition_ratio_with_fixed_costs_and_clipping() -> None:
    # α a_i + f_i = (1 − α) a_j + f_j: α = (a_j + f_j − f_i) / (a_i + a_j).
    assert hetero.partition_ratio(2.0, 1.0, fixed_i=0.5, fixed_j=0.2) == pytest.approx(0.7 / 3)
    assert hetero.partition_ratio(1.0, 1.0, fixed_i=5.0) == 0.0  # i is too slow to take part
    assert hetero.partition_ratio(1.0, 1.0, fixed_j=5.0) == 1.0


def test_homogeneous_devices_split_in_half_with_equal_times() -> None:
    rates, bandwidths = [420 * T, 420 * T], [2 * GB, 2 * GB]
    costs = hetero.unit_costs(1e15, rates, bandwidths=bandwidths, share_bytes=1e9)
    assert hetero.partition_ratio(*costs) == pytest.approx(0.5)
    kwargs = {"bandwidths": bandwidths, "share_bytes": 1e9, "fixed_bytes": 3e8}
    even = hetero.even_split_time(1e15, rates, **kwargs)
    assert hetero.ratio_split_time(1e15, rates, **kwargs) == pytest.approx(even)
    assert hetero.ratio_shares(1e15, rates, **kwargs) == pytest.approx([0.5, 0.5])


def test_balanced_shares_follow_speed_and_match_the_hierarchical_cuts() -> None:
    rates = np.array([180.0, 420.0, 180.0, 420.0, 989.4])
    shares = hetero.balanced_shares(1 / rates)
    assert shares == pytest.approx(rates / rates.sum())
    assert hetero.hierarchical_shares(1 / rates) == pytest.approx(shares)
    assert hetero.combined_cost([2.0, 2.0]) == pytest.approx(1.0)


def test_balanced_shares_with_fixed_costs_equalise_or_drop_devices() -> None:
    costs, fixed = np.array([1.0, 2.0, 4.0]), np.array([0.0, 0.1, 0.2])
    shares = hetero.balanced_shares(costs, fixed)
    assert shares.sum() == pytest.approx(1.0)
    finish = shares * costs + fixed
    assert finish == pytest.approx(np.full(3, finish[0]))
    # A device whose fixed cost alone exceeds the others' finish time takes no share.
    assert hetero.balanced_shares([1.0, 1.0], [0.0, 3.0]) == pytest.approx([1.0, 0.0])
    assert hetero.balanced_shares([1.0, 1.0], [0.0, 0.5]) == pytest.approx([0.75, 0.25])


def test_ratio_split_is_never_slower_than_the_even_split() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 6))
        rates = rng.uniform(10, 1000, n) * T
        bandwidths = rng.uniform(0.5, 50, n) * GB
        kwargs = {
            "bandwidths": bandwidths,
            "share_bytes": rng.uniform(0, 1e10),
            "fixed_bytes": rng.uniform(0, 1e10, n),
        }
        flops = rng.uniform(1e12, 1e16)
        even = hetero.even_split_time(flops, rates, **kwargs)
        ratio = hetero.ratio_split_time(flops, rates, **kwargs)
        assert ratio <= even * (1 + 1e-12)


def test_split_sizes_round_shares_to_whole_tiles() -> None:
    assert hetero.split_sizes(512, [0.3, 0.7]).tolist() == [154, 358]
    assert hetero.split_sizes(512, [0.3, 0.7], multiple=8).tolist() == [152, 360]
    assert hetero.split_sizes(10, [1 / 3, 1 / 3, 1 / 3]).tolist() == [4, 3, 3]
    with pytest.raises(ValueError, match="divisible"):
        hetero.split_sizes(10, [0.5, 0.5], multiple=4)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: hetero.compute_times(1.0, [1.0, 2.0], [0.5, 0.6]), "sum to 1"),
        (lambda: hetero.compute_times(1.0, [1.0, 0.0]), "> 0"),
        (lambda: hetero.device_times(1.0, [1.0], share_bytes=1.0), "need bandwidths"),
        (lambda: hetero.unit_costs(1.0, [1.0, 2.0], bandwidths=[1.0, 2.0, 3.0]), "2 values"),
        (lambda: hetero.partition_ratio(0.0, 1.0), "> 0"),
        (lambda: hetero.balanced_shares([1.0, -1.0]), "> 0"),
    ],
)
def test_bad_inputs_are_rejected(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_hetero_module_does_not_import_jax() -> None:
    source = sys.modules["jaxpar.hetero"].__file__
    assert source is not None
    with open(source, encoding="utf-8") as handle:
        text = handle.read()
    assert not re.search(r"^\s*(import jax|from jax\b)", text, re.MULTILINE)


# ---- presets ----------------------------------------------------------------------------------


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
    assert (cluster.group_of(127), cluster.group_of(128)) == (0, 1)
    assert cluster.group_slices() == (slice(0, 128), slice(128, 256))
    # b_i: 8 Gb/s and 16 Gb/s (gigabits) = 1 and 2 GB/s; one flat level.
    assert [level.name for level in cluster.levels] == ["network"]
    b = cluster.device_bandwidth()
    assert b[:128] == pytest.approx(np.full(128, 1 * GB))
    assert b[128:] == pytest.approx(np.full(128, 2 * GB))
    assert cluster.bandwidth_between(0, 255) == pytest.approx(1 * GB)
    assert cluster.bandwidth_between(128, 255) == pytest.approx(2 * GB)
    c = cluster.device_flops("bfloat16")
    assert c[:128] == pytest.approx(np.full(128, 180 * T))


def test_accpar_tpu_ratio_puts_30_percent_on_the_tpu_v2_boards() -> None:
    cluster = Cluster.preset("accpar-tpu")
    shares = hetero.ratio_shares(1e18, cluster.device_flops("bfloat16"))
    assert shares[:128].sum() == pytest.approx(0.3)
    even = hetero.even_split_time(1e18, cluster.device_flops("bfloat16"))
    ratio = hetero.ratio_split_time(1e18, cluster.device_flops("bfloat16"))
    # even: F / (256 * 180T) on a TPU-v2; ratio: F / (128 * (180T + 420T)); 0.6 of it.
    assert ratio == pytest.approx(even * 256 * 180 / (128 * 600))


def test_accpar_homogeneous_preset_is_128_tpu_v3_boards() -> None:
    cluster = Cluster.preset("accpar-tpu-homogeneous")
    assert cluster.num_devices == 128 and not cluster.heterogeneous and cluster.groups == ()
    assert cluster.device.flops("bfloat16") == pytest.approx(420 * T)
    assert cluster.levels[0].bandwidth == pytest.approx(2 * GB)
    assert Cluster.preset("accpar-tpu-homogeneous", devices=8).num_devices == 8


def test_accpar_tpu_sizes_by_devices_keeping_the_ratio() -> None:
    cluster = Cluster.preset("accpar-tpu", devices=8)
    assert [g.count for g in cluster.groups] == [4, 4]
    assert cluster.levels[0].group_size == 8
    # mesh (2, 4): axis-0 pairs {i, i+4} mix both kinds, axis-1 rows hold one kind each.
    assert cluster.axis_device_groups((2, 4), 0) == ((0, 1),) * 4
    assert cluster.axis_device_groups((2, 4), 1) == ((0,), (1,))
    assert cluster.axis_spans_groups((2, 4), 0) and not cluster.axis_spans_groups((2, 4), 1)
    assert cluster.axis_bandwidths((2, 4)) == pytest.approx((1 * GB, 1 * GB))  # slowest ring
    per_device = cluster.axis_device_bandwidths((2, 4), 1)
    assert per_device == pytest.approx(np.array([[1.0] * 4, [2.0] * 4]) * GB)


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
    assert cluster.bandwidth_between(0, 1) == pytest.approx(300 * GB)
    assert cluster.bandwidth_between(8, 9) == pytest.approx(450 * GB)
    assert cluster.bandwidth_between(0, 8) == pytest.approx(25 * GB)
    assert cluster.axis_bandwidths((2, 8)) == pytest.approx((25 * GB, 300 * GB))
    assert cluster.device_bandwidth() == pytest.approx([25 * GB] * 8 + [50 * GB] * 8)


def test_mixed_gpu_sizes() -> None:
    two = Cluster.preset("mixed-gpu", nodes=2)  # nodes of each kind
    assert two.num_devices == 32 and [g.count for g in two.groups] == [16, 16]
    assert two.bandwidth_between(16, 24) == pytest.approx(50 * GB)  # H100 node to H100 node
    assert two.bandwidth_between(0, 8) == pytest.approx(25 * GB)  # A100 node to A100 node
    assert "nodes=2" in two.describe()
    half = Cluster.preset("mixed-gpu", devices=8)  # half a node of each kind
    assert [g.count for g in half.groups] == [4, 4]
    assert [level.group_size for level in half.levels] == [4, 8]
    assert Cluster.preset("mixed-gpu", devices=32) == two


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


def test_new_presets_hash_and_size_like_the_planner_asks() -> None:
    for name in ("accpar-tpu", "accpar-tpu-homogeneous", "mixed-gpu"):
        assert name in Cluster.presets()
        assert hash(Cluster.preset(name)) == hash(Cluster.preset(name))
        # apply.resolve_cluster sizes a preset to the mesh: devices=8 on the test machine.
        assert Cluster.preset(name, devices=8).num_devices == 8
        assert Cluster.preset(name, nodes=1) == Cluster.preset(name)


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


def test_from_groups_builds_a_heterogeneous_cluster() -> None:
    slow, fast = _spec("slow", 1), _spec("fast", 3)
    groups = (DeviceGroup("a", slow, 4, link_bandwidth=5 * GB), DeviceGroup("b", fast, 4))
    cluster = Cluster.from_groups("mine", groups, _two_nodes())
    assert (cluster.num_devices, cluster.device) == (8, slow)
    assert cluster.device_flops("float32") == pytest.approx([1 * T] * 4 + [3 * T] * 4)
    assert cluster.device_bandwidth(0) == pytest.approx([5 * GB] * 4 + [100 * GB] * 4)
    assert cluster.axis_bandwidths((2, 4)) == pytest.approx((5 * GB, 5 * GB))
    assert cluster.device_memory() == pytest.approx([16e9] * 8)
    # Two groups of one kind are not heterogeneous.
    same = Cluster.from_groups(
        "same", (DeviceGroup("x", slow, 4), DeviceGroup("y", slow, 4)), _two_nodes()
    )
    assert not same.heterogeneous and not same.axis_spans_groups((2, 4), 0)
    # A single flat level may split anywhere.
    flat = (LinkLevel("flat", 3, 1 * GB, 0.0),)
    odd = Cluster.from_groups("odd", (DeviceGroup("a", slow, 1), DeviceGroup("b", fast, 2)), flat)
    assert [odd.group_of(i) for i in range(3)] == [0, 1, 1]


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
        cluster.group_of(4)
    with pytest.raises(ValueError, match="out of range"):
        cluster.device_spec(-1)
    with pytest.raises(ValueError, match="mesh axis 2"):
        cluster.axis_spans_groups((2, 2), 2)
