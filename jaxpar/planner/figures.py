"""Figures of plans: the strategies side by side, then per layer each one's configuration and
its t_C / t_X / t_S.

matplotlib is an optional extra (``pip install -e ".[plot]"``); it is imported only when a
figure is drawn, and a clear error says how to install it.
"""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .plan import Plan


# one colour per cost term, the same in every panel
_COLORS = {"t_C": "#4C72B0", "t_X": "#DD8452", "t_S": "#C44E52"}
_TERMS = {"t_C": "compute t_C", "t_X": "transfer t_X", "t_S": "gradient sync t_S"}
_COST = {"t_C": "compute_s", "t_X": "reshard_s", "t_S": "sync_s"}

# Layout, in inches (the figure is laid out by hand so that text sizes stay fixed in print while
# the layer axis grows with the model).
_DPI = 100
_LEFT, _RIGHT = 1.05, 0.35
_LAYER_PITCH = 0.2  # inches per layer while the layer axis is below its cap
_AXES_W = (7.5, 16.5)  # the layer axis's width: at least, at most
_PANEL_H = 2.2  # a strategy panel's height
_LABEL_GAP = 0.12  # inches between two rotated labels (7 pt text is ~0.1 in tall)
_BAR_TOP = 0.74  # the tallest bar of a strategy panel reaches this fraction of its height
_CUT = 4.0  # comparison: steps over _CUT x the fastest one are drawn cut off (see `_cut_at`)


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: never needs a display
        import matplotlib.pyplot as plt
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            'drawing a plot needs matplotlib: pip install -e ".[plot]" (or pip install matplotlib)'
        ) from err
    return plt


# ---------------------------------------------------------------------------- text helpers


def short_config(config: str) -> str:
    """OptCNN's ``{n=16, h=1, w=1, c=1, k=1}`` -> ``n=16``: only the dimensions split more than
    one way; ``repl`` when none is (replicated); "" when the configuration has no dimensions."""
    pairs = re.findall(r"(\w+)=(\d+)", config)
    if not pairs:
        return ""
    split = [f"{k}={v}" for k, v in pairs if int(v) > 1]
    return ",".join(split) if split else "repl"


def _num(x: float) -> str:
    """3-4 significant digits: 10,260 / 335 / 44.3 / 4.43 / 0.123."""
    if x >= 1000:
        return f"{x:,.0f}"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def time_unit(seconds: float) -> tuple[str, float]:
    """The unit to print times of this size in: ("ms", 1e3), or ("µs", 1e6) below 1 ms."""
    return ("µs", 1e6) if seconds < 1e-3 else ("ms", 1e3)


def _root(layers: Sequence[str]) -> str:
    """The first path component most layers share ("VGG", "InceptionV3"), or ""."""
    heads = [lay.split("/", 1)[0] for lay in layers if "/" in lay]
    if not heads:
        return ""
    top = max(set(heads), key=heads.count)
    return top if heads.count(top) * 2 >= len(layers) else ""


def _strip(layer: str, root: str) -> str:
    return layer[len(root) + 1 :] if root and layer.startswith(root + "/") else layer


def layer_ticks(layers: Sequence[str], slots: int) -> tuple[list[int], list[str], list[int]]:
    """Tick positions and labels for the layer axis, and where to draw group separators.

    With room for every layer (``len(layers) <= slots``) each gets its name (less the shared
    root); otherwise each run of layers of one top-level module (``mixed5b``, ``block3``) gets
    one label at its first layer and a separator, thinned further if there are still too many.
    """
    root = _root(layers)
    names = [_strip(lay, root) for lay in layers]
    if len(layers) <= slots:
        return list(range(len(layers))), names, []
    groups = [name.split("/", 1)[0] for name in names]
    starts = [i for i, g in enumerate(groups) if i == 0 or g != groups[i - 1]]
    size = {i: j - i for i, j in zip(starts, [*starts[1:], len(layers)], strict=True)}
    min_gap = max(1, math.ceil(len(layers) / max(slots, 1)))
    ticks = _spaced(sorted(starts, key=lambda i: -size[i]), min_gap)
    return ticks, [groups[i] for i in ticks], [i for i in starts if i > 0]


def _spaced(order: Sequence[int], min_gap: int) -> list[int]:
    """Positions taken in ``order`` (most important first), each kept if it is at least
    ``min_gap`` from every one kept before it; sorted."""
    kept: list[int] = []
    for i in order:
        if all(abs(i - j) >= min_gap for j in kept):
            kept.append(i)
    return sorted(kept)


def config_labels(
    configs: Sequence[str], weights: Sequence[float], min_gap: int
) -> tuple[list[int], str]:
    """Which layers get their configuration printed, and the one left unprinted ("" if none).

    Every layer's, when there is room (labels ``min_gap`` layers apart). Otherwise the most
    common configuration is said once (returned) and the layers with another one are labelled,
    the costliest (``weights``) first, as many as fit: hundreds of "n=16" would hide the few
    layers a strategy treats differently.
    """
    named = [i for i, c in enumerate(configs) if c]
    every = _spaced(named, min_gap)
    if len(every) == len(named):
        return every, ""
    common = max(set(configs) - {""}, key=configs.count)
    order = sorted((i for i in named if configs[i] != common), key=lambda i: -weights[i])
    return _spaced(order, min_gap), common


def _cut_at(totals: Sequence[float]) -> float | None:
    """Where the comparison's time axis ends, or None to show every bar whole.

    Model parallelism can be 30x slower than the rest; one linear axis to its step leaves the
    others' bars a few pixels long and their compute / transfer / sync split unreadable, and a
    log axis would misdraw stacked segments. So bars over _CUT x the fastest are cut off at
    1.25 x the slowest of the others, marked as cut, and their values printed.
    """
    fastest = min(totals)
    if fastest <= 0:
        return None
    kept = [t for t in totals if t <= _CUT * fastest]
    if len(kept) == len(totals):
        return None
    return 1.25 * max(kept)


def strategy_limits(rows: Mapping[str, Sequence[dict]], per_s: float = 1e3) -> dict[str, float]:
    """Per strategy (its `Plan.layer_rows`), the top of its panel's time axis (in ms, or the
    unit of ``per_s`` units per second): set by its own tallest layer, not the slowest plan's.

    Stacked bars need a linear axis (on a log axis a segment's length would depend on what lies
    below it), so the spread between strategies is handled by giving each panel its own scale.
    """
    out = {}
    for name, rs in rows.items():
        top = max(((r["t_C"] + r["t_X"] + r["t_S"]) * per_s for r in rs), default=0.0)
        out[name] = (top or 1e-6) / _BAR_TOP
    return out


# ---------------------------------------------------------------------------- the figure

_NOTE = (
    "Below, per layer: each strategy on its own time scale (read its axis before comparing "
    "panels), the layer's configuration above its bar: the dimensions split more than one way "
    "(e.g. n=16: the batch split 16 ways; repl: replicated){thinned}."
)


def strategy_figure(plans: Mapping[str, Plan], title: str = "") -> Any:
    """The figure `plot_strategies` saves, returned (a matplotlib ``Figure``) for inspection.

    Its axes carry labels: ``"comparison"`` (first, on top) and ``"strategy:<name>"`` per plan.
    """
    if not plans:
        raise ValueError("plot_strategies needs at least one plan")
    plt = _pyplot()
    rows = {name: p.layer_rows() for name, p in plans.items()}
    layers: list[str] = []
    for rs in rows.values():  # the union in program order (every variant has the same layers)
        seen = set(layers)
        layers += [r["layer"] for r in rs if r["layer"] not in seen]
    n = len(layers)
    unit = time_unit(max(p.cost.step_s for p in plans.values()))
    axes_w = min(max(n * _LAYER_PITCH, _AXES_W[0]), _AXES_W[1])
    pitch = axes_w / max(n, 1)  # inches per layer
    ticks, tick_labels, separators = layer_ticks(layers, int(axes_w / _LABEL_GAP))

    labels, horizontal, note_lines = _layout_labels(rows, layers, pitch, axes_w)

    bottom_h = 0.5 + 0.058 * max((len(t) for t in tick_labels), default=4)
    comp_h = 0.45 * len(plans) + 0.1
    # title; the comparison (its title above, axis label below); the note; the strategy panels
    heights = [0.6 if title else 0.1, 0.35, comp_h, 0.55, 0.2 * len(note_lines) + 0.4]
    heights += [_PANEL_H, 0.4] * len(plans)
    heights[-1] = bottom_h
    fig_w, fig_h = _LEFT + axes_w + _RIGHT, sum(heights)
    fig = plt.figure(figsize=(fig_w, fig_h), dpi=_DPI)

    def axes_at(top_in: float, height: float, label: str) -> Any:
        return fig.add_axes(
            (_LEFT / fig_w, 1 - (top_in + height) / fig_h, axes_w / fig_w, height / fig_h),
            label=label,
        )

    if title:
        fig.text(0.5, 1 - 0.3 / fig_h, title, ha="center", va="center", fontsize=12)
    top_in = sum(heights[:2])
    _comparison(axes_at(top_in, comp_h, "comparison"), plans, axes_w, unit)
    top_in += comp_h + heights[3]
    fig.text(
        _LEFT / fig_w / 3,
        1 - (top_in + 0.1) / fig_h,
        "\n".join(note_lines),
        va="top",
        fontsize=9,
        color="0.25",
    )
    top_in += heights[4]
    limits = strategy_limits(rows, unit[1])
    for k, (name, plan) in enumerate(plans.items()):
        ax = axes_at(top_in, _PANEL_H, f"strategy:{name}")
        _strategy_panel(ax, name, plan, rows[name], layers, limits[name], unit)
        _config_text(ax, *labels[name], horizontal)
        ax.set_xlim(-0.6, n - 0.4)
        for x in separators:
            ax.axvline(x - 0.5, color="0.8", lw=0.6, zorder=0)
        ax.set_xticks(ticks)
        if k < len(plans) - 1:
            ax.set_xticklabels([])
        else:
            ax.set_xticklabels(tick_labels, rotation=90, fontsize=8)
            grouped = ", one label per top-level module" if separators else ""
            root = _root(layers)
            ax.set_xlabel(f"layers{' of ' + root if root else ''} (program order{grouped})")
        top_in += _PANEL_H + 0.4
    return fig


def _layout_labels(rows: dict, layers: list[str], pitch: float, axes_w: float) -> tuple:
    """Which layers get a configuration label per strategy, whether labels lie flat (each fits
    its layer's width) or rotated, and the wrapped note explaining it."""
    configs = {name: [short_config(r["config"]) for r in rs] for name, rs in rows.items()}
    widest = max((0.067 * len(c) for cs in configs.values() for c in cs), default=0.0)
    horizontal = widest + 0.08 <= pitch
    min_gap = 1 if horizontal else max(1, math.ceil(_LABEL_GAP / pitch))
    labels = {}
    for name, rs in rows.items():
        weights = [r["t_C"] + r["t_X"] + r["t_S"] for r in rs]
        picked, common = config_labels(configs[name], weights, min_gap)
        at = {layers.index(rs[i]["layer"]): configs[name][i] for i in picked}
        labels[name] = (at, common)
    thinned = any(common for _, common in labels.values())
    note = _NOTE.format(
        thinned="; where crowded, only the layers whose configuration differs from the "
        "strategy's most common one (named in its title), the costliest first"
        if thinned
        else ""
    )
    return labels, horizontal, textwrap.wrap(note, int((_LEFT + axes_w) / 0.075))


def _comparison(ax: Any, plans: Mapping[str, Plan], axes_w: float, unit: tuple[str, float]) -> None:
    """One horizontal bar per strategy: step time stacked compute / transfer / sync, its value
    and its speedup over data parallelism printed beside it."""
    name_u, per_s = unit
    names = list(plans)
    totals = [plans[s].cost.step_s * per_s for s in names]
    data = plans["data"].cost.step_s if "data" in plans else None
    cut = _cut_at(totals)
    end = cut if cut is not None else (max(totals) or 1.0)
    texts = []
    for name, total in zip(names, totals, strict=True):
        c = plans[name].cost
        text = f"{_num(total)} {name_u}"
        if data and c.step_s > 0:
            text += ", data parallel" if name == "data" else f", {data / c.step_s:.2f}x vs data"
        if cut is not None and total > cut:
            text += " (bar cut)"
        texts.append(text)
    room = 0.075 * max(len(t) for t in texts) + 0.25  # inches the printed values need
    right = end * axes_w / max(axes_w - room, 1.0)
    per_in = right / axes_w  # time units per inch
    for y, (name, total, text) in enumerate(zip(names, totals, texts, strict=True)):
        c = plans[name].cost
        left = 0.0
        for term, color in _COLORS.items():
            value = getattr(c, _COST[term]) * per_s
            lo, hi = min(left, end), min(left + value, end)
            ax.barh(y, hi - lo, left=lo, height=0.64, color=color, label=_TERMS[term] * (y == 0))
            if (hi - lo) / per_in > 0.1 + 0.075 * len(_num(value)):  # room for its value
                ax.text((lo + hi) / 2, y, _num(value), ha="center", va="center", color="white")
            left += value
        if cut is not None and total > cut:
            for dx in (0.0, 0.1):  # a break mark: this bar goes on beyond the axis
                x0 = end - (0.16 + dx) * per_in
                ax.plot([x0, x0 + 0.08 * per_in], [y + 0.4, y - 0.4], color="white", lw=2.5)
        ax.text(min(total, end) + 0.08 * per_in, y, text, va="center", fontsize=10)
    fastest = min(range(len(names)), key=lambda i: totals[i])
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=10)
    ax.get_yticklabels()[fastest].set_fontweight("bold")
    ax.set_ylim(len(names) - 0.5, -0.5)
    ax.set_xlim(0, right)
    ax.set_xticks([t for t in ax.get_xticks() if t <= end * 1.001])
    ax.tick_params(axis="x", labelsize=8)
    if cut is not None:
        ax.axvline(end, color="0.4", lw=0.8, ls="--")
    ax.set_xlabel(
        f"predicted {name_u} per step (OptCNN Eq. 1: no overlap)"
        + ("; the axis ends at the dashed line" if cut is not None else ""),
        fontsize=9,
    )
    ax.set_title("Step time by strategy", fontsize=11, loc="left", fontweight="bold")
    ax.legend(
        loc="lower right",
        bbox_to_anchor=(1.0, 1.0),
        ncols=3,
        fontsize=9,
        frameon=False,
        borderaxespad=0.1,
    )
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)


def _strategy_panel(
    ax: Any,
    name: str,
    plan: Plan,
    rows: list[dict],
    layers: list[str],
    top: float,
    unit: tuple[str, float],
) -> None:
    """Per layer, stacked t_C / t_X / t_S on the panel's own scale."""
    name_u, per_s = unit
    by_layer = {r["layer"]: r for r in rows}
    bottom = [0.0] * len(layers)
    width = 0.8 if len(layers) < 60 else 1.0  # hundreds of bars: no gaps, or they alias away
    for term, color in _COLORS.items():
        values = [by_layer[lay][term] * per_s if lay in by_layer else 0.0 for lay in layers]
        ax.bar(range(len(layers)), values, bottom=bottom, width=width, color=color, lw=0)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    c = plan.cost
    mb = c.comm_bytes / 1e6
    ax.set_ylim(0, top)
    ax.set_ylabel(f"{name_u} per step", fontsize=9)
    ax.tick_params(axis="y", labelsize=8)
    ax.set_title(
        f"{name}: step {_num(c.step_s * per_s)} {name_u} = compute {_num(c.compute_s * per_s)}"
        f" + transfer {_num(c.reshard_s * per_s)} + sync {_num(c.sync_s * per_s)};  "
        f"{mb:,.{0 if mb >= 100 else 2}f} MB sent per device",
        fontsize=10,
        loc="left",
    )
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def _config_text(ax: Any, at: Mapping[int, str], common: str, horizontal: bool) -> None:
    """Configurations above the bars, in a band over the tallest one (see _BAR_TOP)."""
    band = ax.get_xaxis_transform()  # x in layers, y in axes fractions
    for i, cfg in at.items():
        ax.text(
            i,
            _BAR_TOP + 0.02,
            cfg,
            rotation=0 if horizontal else 90,
            ha="center",
            va="bottom",
            fontsize=8 if horizontal else 7,
            transform=band,
        )
    if common:
        ax.text(
            1.0,
            1.02,
            f"unlabelled layers: {common}",
            ha="right",
            va="bottom",
            fontsize=10,
            fontweight="bold",
            transform=ax.transAxes,
        )


def plot_strategies(plans: Mapping[str, Plan], path: str, title: str = "") -> str:
    """Draw the strategies' step times side by side, then one panel per strategy.

    The first panel has one bar per strategy (its step stacked compute / transfer / gradient
    sync, the value and the speedup over data parallelism printed). Each strategy panel shows,
    per layer, stacked times on its own scale and, above the bars, the layers' configurations:
    the dimensions split more than one way (``n=16`` for OptCNN's ``{n=16, h=1, w=1, c=1,
    k=1}``, ``repl`` for replicated); with hundreds of layers, the most common configuration is
    named once and the layers with another one are labelled where there is room. Layers are
    the rows of `Plan.layer_rows` (linen module / NNX parameter path), in program order.
    Returns ``path``.
    """
    plt = _pyplot()
    fig = strategy_figure(plans, title)
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)
    return path
