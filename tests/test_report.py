"""Reports that explain a comparison (docs/testing.md, "Test tiers": api): per-phase totals add up
to the plan's cost, state bytes per device follow the layouts, and the tables name every plan."""

from __future__ import annotations

import math

import jaxpar_zoo as zoo
import pytest

import jaxpar
from jaxpar.planner import report

pytestmark = pytest.mark.api


@pytest.fixture(scope="module")
def plans():
    ex = zoo.get("gpt_small", small=True, batch=64)
    plan = jaxpar.plan(ex.step, *ex.args, mesh={"data": 2, "model": 4}, cluster="p100")
    return {"auto": plan, **{n: plan.variant(n) for n in ("data", "model", "owt")}}


def test_phase_totals_add_up_to_the_cost(plans):
    for plan in plans.values():
        totals = report.phase_totals(plan)
        assert set(totals) == set(report.PHASES)
        c = plan.cost
        assert sum(t["t_C"] for t in totals.values()) == pytest.approx(c.compute_s, rel=1e-9)
        assert sum(t["t_X"] + t["t_S"] for t in totals.values()) == pytest.approx(
            c.comm_s, rel=1e-9
        )
        assert sum(t["bytes"] for t in totals.values()) == pytest.approx(c.comm_bytes, rel=1e-9)
        # gradient synchronization happens in the gradient phase only
        assert sum(t["t_S"] for p, t in totals.items() if p != "gradient") == 0.0


def test_state_bytes_per_device_follow_the_layouts(plans):
    data = report.state_layouts(plans["data"])
    full = sum(r["bytes"] for r in data)
    # data parallel replicates the state: every device holds all of it
    assert sum(r["bytes_per_device"] for r in data) == pytest.approx(full)
    assert not any(r["sharded"] for r in data)
    model = report.state_layouts(plans["model"])
    assert sum(r["bytes_per_device"] for r in model) < full / 2
    for r in model:
        spec = r["spec"]
        shards = r["bytes"] / r["bytes_per_device"]
        assert math.isclose(shards, round(shards)) and (shards > 1) == r["sharded"], (spec, r)
        assert (spec != "P()") == r["sharded"]


def test_tables_name_every_plan_and_phase(plans):
    phases = report.phase_table(plans)
    state = report.state_table(plans)
    for name in plans:
        assert name in phases.splitlines()[1] and name in state
    for phase in ("forward", "backward", "gradient"):
        assert any(line.startswith(phase) for line in phases.splitlines())
    assert "Eq. 1 ms" in phases and "MB sent" in phases
    auto = next(iter(plans.values()))
    overlap = [line for line in phases.splitlines() if line.startswith("overlap ms")]
    assert len(overlap) == (auto.objective == "overlap")  # the step the plan was chosen by
    if overlap:
        cells = [float(x) for x in overlap[0].split()[2:]]
        want = [p.cost.overlapped_step_s * 1e3 for p in plans.values()]
        assert cells == pytest.approx(want, abs=0.06)
    assert "P(" in state  # the largest tensors' layouts
