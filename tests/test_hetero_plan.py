"""Heterogeneous clusters in the planner: even-split vs ratio costs, slow links, and real runs."""

from __future__ import annotations

from collections import defaultdict

import jax
import jaxpar_zoo as zoo
import numpy as np
import pytest

import jaxpar
from jaxpar.hardware.cluster import Cluster
from jaxpar.hardware.devices import DeviceGroup, DeviceSpec, LinkLevel
from tests.helpers import assert_equivalent, assert_fidelity

SLOW, FAST = 180e12, 420e12  # AccPar Table 7's TPU-v2 / TPU-v3 FLOP/s


def two_device_cluster() -> Cluster:
    """One slow and one fast device on one link: α has AccPar Eq. 10's closed form."""

    def spec(name: str, flops: float) -> DeviceSpec:
        return DeviceSpec(name, {"float32": flops}, mem_bandwidth=1e15, memory_bytes=1e11)

    groups = [
        DeviceGroup("slow", spec("slow", SLOW), 1),
        DeviceGroup("fast", spec("fast", FAST), 1),
    ]
    link = LinkLevel("link", group_size=2, bandwidth=1e9, latency=0.0)
    return Cluster.from_groups("two", groups, [link])


@pytest.mark.closed_form
def test_two_group_alpha_and_per_device_costs_match_closed_form():
    ex = zoo.get("mlp", small=True)
    plan = jaxpar.plan(
        ex.step, *ex.args, mesh={"x": 2}, cluster=two_device_cluster(), strategy="data"
    )
    alpha = SLOW / (SLOW + FAST)  # Eq. 10 without communication terms: 0.3
    split_rows = [r for r in plan.phase_rows() if r["alpha"]]
    assert split_rows, "data parallel splits every layer across the two devices"
    for r in split_rows:
        assert r["alpha"]["slow"] == pytest.approx(alpha)
        assert r["alpha"]["fast"] == pytest.approx(1 - alpha)
        # even split: both devices run the same shard, the fast one idles part of it (Eq. 8)
        assert r["groups"]["slow"] == pytest.approx(r["t_C"])
        assert r["groups"]["fast"] == pytest.approx(r["t_C"] * SLOW / FAST)
    # per node: ratio t_C = even t_C · 2·c_min / (c_slow + c_fast) where the split crosses groups
    factor = 2 * SLOW / (SLOW + FAST)
    for node, row in zip(plan.ng.nodes, plan.evaluation.node_rows, strict=True):
        cfg = plan.configs[node.index][plan.assignment[node.index]]
        expect = row.t_C * (factor if any(d >= 0 for d in cfg) else 1.0)
        assert row.t_C_ratio == pytest.approx(expect, rel=1e-12)
    c = plan.cost
    assert c.compute_s > c.ratio_compute_s > c.compute_s * factor * 0.999
    assert c.ratio_step_s == pytest.approx(c.ratio_compute_s + c.comm_s)
    # the even split is priced at the slow device (what NamedSharding runs)
    homo = Cluster.from_groups(
        "slow-only", [two_device_cluster().groups[0]] * 2, [LinkLevel("link", 2, 1e9, 0.0)]
    )
    same = jaxpar.plan(ex.step, *ex.args, mesh={"x": 2}, cluster=homo, strategy="data")
    assert plan.cost.step_s == pytest.approx(same.cost.step_s, rel=1e-12)
    assert same.cost.ratio_step_s == pytest.approx(same.cost.step_s, rel=1e-12)


@pytest.mark.closed_form
def test_homogeneous_ratio_equals_even():
    ex = zoo.get("cnn", small=True)
    plan = jaxpar.plan(ex.step, *ex.args, mesh={"a": 2, "b": 4}, cluster="p100")
    assert plan.cost.ratio_step_s == pytest.approx(plan.cost.step_s, rel=1e-12)
    assert plan.heterogeneity_report() == ""


def _bytes_per_axis(plan) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for c in plan.collectives:
        for axis in c.axes:
            out[axis] += c.bytes / len(c.axes)
    return out


@pytest.mark.closed_form
@pytest.mark.parametrize("mesh", [{"node": 2, "gpu": 4}, {"gpu": 4, "node": 2}])
def test_slow_link_axis_carries_the_small_transfers(mesh):
    """Whichever mesh axis crosses the slow inter-node link, the big transfers avoid it (a batch
    of 256: smaller, this tiny model runs fastest replicated, per-kernel overheads included).
    Under Eq. 1, which charges every byte on the slow link; the overlapped step hides some."""
    ex = zoo.get("gpt_small", small=True, batch=256)
    cluster = Cluster.preset("p100", nodes=2)
    plan = jaxpar.plan(ex.step, *ex.args, mesh=mesh, cluster=cluster, objective="time")
    links = dict(zip(plan.mesh_axes.names, plan.mesh_axes.link_names, strict=True))
    slow = next(a for a, link in links.items() if link == "infiniband")
    fast = next(a for a, link in links.items() if link == "nvlink")
    per_axis = _bytes_per_axis(plan)
    assert per_axis[fast] > 0
    assert per_axis[slow] < 0.25 * per_axis[fast], dict(per_axis)


@pytest.mark.closed_form
def test_heterogeneous_mixed_gpu_prefers_the_fast_boundary():
    """mixed-gpu: 8 A100 + 8 H100; the node axis crosses the 25 GB/s A100 HDR links."""
    ex = zoo.get("gpt_small", small=True)
    cluster = Cluster.preset("mixed-gpu")
    plan = jaxpar.plan(ex.step, *ex.args, mesh={"node": 2, "gpu": 8}, cluster=cluster)
    assert cluster.heterogeneous
    per_axis = _bytes_per_axis(plan)
    assert per_axis["node"] < 0.25 * max(per_axis["gpu"], 1.0), dict(per_axis)
    assert plan.cost.ratio_step_s <= plan.cost.step_s
    assert "ratio split" in plan.report()


@pytest.mark.numerics
@pytest.mark.parametrize("preset", ["accpar-tpu", "mixed-gpu"])
def test_heterogeneous_plan_applies_and_matches_unsharded(preset):
    """Even split on 8 fake devices: same numbers as the unsharded step, HLO as predicted."""
    ex = zoo.get("mlp", small=True)
    cluster = Cluster.preset(preset, devices=8)
    mesh = jaxpar.make_mesh({"group": 2, "dev": 4})
    step = jaxpar.auto_shard(ex.step, mesh=mesh, cluster=cluster, strategy="data")
    state, batch = ex.make_args(0)
    out = step(state, batch)
    ref = jax.jit(ex.step)(state, batch)
    assert_equivalent(out, ref)
    assert_fidelity(step.plan, step.lower(state, batch).compile())
    assert step.plan.cost.ratio_step_s < step.plan.cost.step_s
    assert np.isfinite(step.plan.cost.ratio_step_s)
