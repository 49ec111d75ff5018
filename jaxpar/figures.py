"""Figures of plans: per layer, each strategy's configuration and its t_C / t_X / t_S.

matplotlib is an optional extra (``pip install -e ".[plot]"``); it is imported only when a
figure is drawn, and a clear error says how to install it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .result import Plan

# one colour per cost term, the same in every panel
_COLORS = {"t_C": "#4C72B0", "t_X": "#DD8452", "t_S": "#C44E52"}
_TERMS = {"t_C": "compute t_C", "t_X": "transfer t_X", "t_S": "gradient sync t_S"}


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


def plot_strategies(plans: Mapping[str, Plan], path: str, title: str = "") -> str:
    """Draw one panel per strategy: stacked per-layer times, the layer's configuration on top.

    Layers are the rows of `Plan.layer_rows` (linen module / NNX parameter path), in program
    order; configurations are in OptCNN's notation ({n=4, c=1, ...}: degree per dimension).
    Returns ``path``.
    """
    if not plans:
        raise ValueError("plot_strategies needs at least one plan")
    plt = _pyplot()
    rows = {name: p.layer_rows() for name, p in plans.items()}
    layers = [r["layer"] for r in next(iter(rows.values()))]
    width = max(8.0, 0.38 * len(layers) + 2.5)
    fig, axes = plt.subplots(
        len(plans), 1, figsize=(width, 3.2 * len(plans) + 1.2), sharex=True, squeeze=False
    )
    top = max((r["t_C"] + r["t_X"] + r["t_S"]) * 1e3 for rs in rows.values() for r in rs) or 1.0
    for ax, (name, plan) in zip(axes[:, 0], plans.items(), strict=True):
        by_layer = {r["layer"]: r for r in rows[name]}
        bottom = [0.0] * len(layers)
        for term, color in _COLORS.items():
            values = [by_layer[lay][term] * 1e3 if lay in by_layer else 0.0 for lay in layers]
            ax.bar(range(len(layers)), values, bottom=bottom, color=color, label=_TERMS[term])
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        for i, lay in enumerate(layers):
            if lay in by_layer:
                ax.text(
                    i,
                    bottom[i] + 0.02 * top,
                    by_layer[lay]["config"],
                    rotation=90,
                    ha="center",
                    va="bottom",
                    fontsize=6,
                )
        c = plan.cost
        ax.set_ylim(0, top * 1.9)
        ax.set_ylabel("ms per step")
        ax.set_title(
            f"{name}: step {c.step_s * 1e3:.3f} ms (compute {c.compute_s * 1e3:.3f}, "
            f"transfer {c.reshard_s * 1e3:.3f}, sync {c.sync_s * 1e3:.3f}), "
            f"{c.comm_bytes / 1e6:.2f} MB/device",
            fontsize=9,
            loc="left",
        )
        ax.grid(axis="y", alpha=0.3)
    axes[0, 0].legend(loc="upper right", fontsize=8, ncols=3)
    last = axes[-1, 0]
    last.set_xticks(range(len(layers)))
    last.set_xticklabels(layers, rotation=90, fontsize=7)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
