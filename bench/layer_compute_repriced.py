"""The H100 layer timings of `bench/layer_compute.py`, priced again by the current cost model.

`bench/results/layer_compute.json` holds what a lent H100 measured: every layer's kernels inside
the profiled train step (``in_step_ms``, attributed by their HLO ``op_name``). No GPU is needed to
price them again: each model is planned on an abstract one-device mesh (the accelerator's fusion
rules, as on the GPU) with the H100 calibration (`bench/results/calibration_h100.json`), its
predicted compute is split per equation layer as the bench does
(`layer_compute.predicted_by_equation_layer`), and set beside the stored measurement: per layer,
per block (`layer_compute.block_rows`) and summed. The stored prediction of the device run is
shown as "then" (the cost model of that session).

    python bench/layer_compute_repriced.py --json bench/results/layer_compute_repriced.json \\
        --md bench/results/layer_compute_repriced.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from layer_compute import block_rows, predicted_by_equation_layer, summarize

import jaxpar
import models

RESULTS = os.path.join(os.path.dirname(__file__), "results")
MEASURED = os.path.join(RESULTS, "layer_compute.json")
CALIBRATION = os.path.join(RESULTS, "calibration_h100.json")


def reprice(result: dict) -> dict:
    """The stored layers of one model with the current model's in-step prediction."""
    ex = models.get(result["model"], small=result["small"])
    plan = jaxpar.plan(ex.step, *ex.args, mesh={"data": 1}, cluster=CALIBRATION, memory_budget=None)
    known = {r["layer"] for r in result["layers"]}
    by_layer = predicted_by_equation_layer(plan, known)
    rows = []
    for r in result["layers"]:
        now = by_layer.get(r["layer"], 0.0) * 1e3
        rows.append(
            {
                "layer": r["layer"],
                "gflop": r["gflop"],
                "in_step_ms": r["in_step_ms"],
                "calibrated_eqn_ms": now,
                "calibrated_in_step_ratio": now / max(r["in_step_ms"], 1e-9),
                "then_ms": r["calibrated_eqn_ms"],
            }
        )
    measured_step = result["step"]["measured_ms"]
    return {
        "model": result["model"],
        "step": {
            "measured_ms": measured_step,
            "then_ms": result["step"]["calibrated_ms"],
            "now_ms": plan.cost.compute_s * 1e3,
            "now_ratio": plan.cost.compute_s * 1e3 / measured_step,
        },
        "layers": rows,
        "now": summarize(rows, "calibrated", "in_step"),
        "now_blocks": summarize(block_rows(rows, ["calibrated"]), "calibrated", "in_step"),
        "then": result["summary_in_step"]["calibrated"],
        "then_blocks": result["summary_blocks"]["calibrated"],
    }


def markdown(doc: dict) -> str:
    lines = [
        "# H100 layer timings priced again (no GPU needed)",
        "",
        f"`{doc['command']}`; measured on {doc['device']} (jax {doc['measured_jax']}), priced "
        f"with jax {doc['jax']} and the H100 calibration. Ratio = predicted / measured in the "
        "step; within 10 % means 0.9 <= ratio <= 1.1.",
        "",
        "| model | layers | within 10 % then / now | median then / now | Σ ratio then / now "
        "| blocks | blocks within 10 % then / now | block median then / now "
        "| whole step Σ t_C / measured then / now |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["results"]:
        t, n, tb, nb = r["then"], r["now"], r["then_blocks"], r["now_blocks"]
        lines.append(
            f"| {r['model']} | {n['layers']} | {t['within_10pct']} / {n['within_10pct']} | "
            f"{t['median_ratio']:.3f} / {n['median_ratio']:.3f} | {t['sum_ratio']:.3f} / "
            f"{n['sum_ratio']:.3f} | {nb['layers']} | {tb['within_10pct']} / {nb['within_10pct']}"
            f" | {tb['median_ratio']:.3f} / {nb['median_ratio']:.3f} | "
            f"{r['step']['then_ms'] / r['step']['measured_ms']:.3f} / "
            f"{r['step']['now_ratio']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--md", default=None)
    args = parser.parse_args()
    import jax

    with open(MEASURED) as f:
        measured = json.load(f)
    doc = {
        "command": "python bench/layer_compute_repriced.py " + " ".join(sys.argv[1:]),
        "device": measured["device"],
        "measured_jax": measured["jax"],
        "jax": jax.__version__,
        "results": [reprice(r) for r in measured["results"]],
    }
    for r in doc["results"]:
        print(r["model"], {k: r["now"][k] for k in ("within_10pct", "median_ratio", "sum_ratio")})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1, default=str)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(doc))


if __name__ == "__main__":
    main()
