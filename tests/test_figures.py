"""`jaxpar.figures.plot_strategies`: a small file whose strategy panels each fit their own data."""

from __future__ import annotations

import jaxpar_zoo as zoo
import pytest

import jaxpar
from jaxpar.planner import figures

pytestmark = pytest.mark.api

STRATEGIES = ("auto", "data", "model", "owt")


@pytest.fixture(scope="module")
def plans():
    ex = zoo.get("cnn", small=True)
    # Eq. 1: the figure's stacked bars are its terms, and its plans' bars lie far apart
    plan = jaxpar.plan(ex.step, *ex.args, mesh={"a": 2, "b": 4}, cluster="p100", objective="time")
    return {s: plan.variant(s) for s in STRATEGIES}


def tallest(plan) -> float:
    """The plan's tallest stacked layer bar, in seconds."""
    return max(r["t_C"] + r["t_X"] + r["t_S"] for r in plan.layer_rows())


def test_png_is_small(plans, tmp_path):
    path = tmp_path / "strategies.png"
    assert figures.plot_strategies(plans, str(path), title="cnn (small)") == str(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert 0 < path.stat().st_size < 1_000_000


def test_every_panel_has_its_own_scale(plans):
    # the case the old shared axis got wrong: bars far apart in scale between strategies
    tops = {s: tallest(p) for s, p in plans.items()}
    assert max(tops.values()) > 5 * min(tops.values())
    fig = figures.strategy_figure(plans, title="cnn (small)")
    try:
        axes = {ax.get_label(): ax for ax in fig.axes}
        assert fig.axes[0].get_label() == "comparison"  # the comparison first
        unit, per_s = figures.time_unit(max(p.cost.step_s for p in plans.values()))
        for name in STRATEGIES:
            lo, hi = axes[f"strategy:{name}"].get_ylim()
            top = tops[name] * per_s
            assert lo == 0 and top < hi < 1.5 * top, (name, hi, top, unit)
        # the comparison: one bar per strategy, each labelled with its step and its speedup
        comp = axes["comparison"]
        assert [t.get_text() for t in comp.get_yticklabels()] == list(STRATEGIES)
        texts = " | ".join(t.get_text() for t in comp.texts)
        for name, plan in plans.items():
            speedup = plans["data"].cost.step_s / plan.cost.step_s
            assert figures._num(plan.cost.step_s * per_s) + f" {unit}" in texts
            if name != "data":
                assert f"{speedup:.2f}x vs data" in texts
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_config_labels_thin_out_to_the_exceptions():
    configs = ["n=16"] * 40 + ["c=4,k=4"] + ["n=16"] * 40 + ["repl"]
    weights = [1.0] * len(configs)
    every, common = figures.config_labels(configs, weights, min_gap=1)
    assert every == list(range(len(configs))) and common == ""
    crowded, common = figures.config_labels(configs, weights, min_gap=3)
    assert crowded == [40, 81] and common == "n=16"
    assert figures.short_config("{n=16, h=1, w=1, c=1, k=1}") == "n=16"
    assert figures.short_config("{n=1, c=4, k=4}") == "c=4,k=4"
    assert figures.short_config("{n=1, r0=1}") == "repl"
    assert figures.short_config("{}") == ""
