"""Scanned against unrolled under each objective: Eq. 1, combined and overlapped steps.

The GPT-2-wide decoder of `bench/scale/scanned.py` (``gpt_scan_linen`` / ``gpt_unrolled_linen``,
same shapes and math) at 4, 12 and 64 layers, planned for 64 H100s (node=8, gpu=8, an abstract
mesh) with ``objective="time"`` (OptCNN's Eq. 1) and ``"overlap"``. Each plan is priced three
ways (`PlanCost`): Eq. 1 (``step_s``: every predicted collective pays its latency), with XLA's
all-reduce combiner (``combined_step_s``) and overlapped (``overlapped_step_s``).

    python bench/scale/scanned_overlap.py --json bench/scale/results/scanned_overlap.json \\
        --md bench/scale/results/scanned_overlap.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import jax
from jaxpar_zoo.scanned import scanned_config, scanned_example

import jaxpar

MESH = {"node": 8, "gpu": 8}
MODELS = ("gpt_scan_linen", "gpt_unrolled_linen")


def row(name: str, layers: int, objective: str) -> dict:
    ex = scanned_example(name, scanned_config(name, layers=layers))
    t0 = time.perf_counter()
    plan = jaxpar.plan(ex.step, *ex.args, mesh=MESH, cluster="dgx-h100", objective=objective)
    wall = time.perf_counter() - t0
    c = plan.cost
    return {
        "model": name,
        "layers": layers,
        "objective": objective,
        "plan_s": wall,
        "eq1_ms": c.step_s * 1e3,
        "combined_ms": c.combined_step_s * 1e3,
        "overlapped_ms": c.overlapped_step_s * 1e3,
        "sync_ms": c.sync_s * 1e3,
        "reshard_ms": c.reshard_s * 1e3,
    }


def markdown(rows: list[dict], command: str) -> str:
    lines = [
        "# Scanned vs unrolled GPT-2-wide decoder, per objective (64 H100s, node=8, gpu=8)",
        "",
        f"`{command}` — jax {jax.__version__}",
        "",
        "Steps in ms: Eq. 1 (each collective pays its latency), with XLA's all-reduce combiner, "
        "overlapped. Scanned / unrolled compares the objective the plan was chosen by.",
        "",
        "| layers | objective | model | plan s | Eq. 1 | combined | overlapped | t_S | t_X |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['layers']} | {r['objective']} | {r['model']} | {r['plan_s']:.2f} | "
            f"{r['eq1_ms']:.3f} | {r['combined_ms']:.3f} | {r['overlapped_ms']:.3f} | "
            f"{r['sync_ms']:.3f} | {r['reshard_ms']:.3f} |"
        )
    lines += ["", "| layers | objective | scanned / unrolled (its objective) |", "|---|---|---|"]
    key = {"time": "eq1_ms", "overlap": "overlapped_ms"}
    for layers in sorted({r["layers"] for r in rows}):
        for objective in ("time", "overlap"):
            pair = {
                r["model"]: r for r in rows if (r["layers"], r["objective"]) == (layers, objective)
            }
            if len(pair) == 2:
                k = key[objective]
                ratio = pair[MODELS[0]][k] / pair[MODELS[1]][k]
                lines.append(f"| {layers} | {objective} | {ratio:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[4, 12, 64])
    parser.add_argument("--json", default=None)
    parser.add_argument("--md", default=None)
    args = parser.parse_args()
    rows = []
    for layers in args.layers:
        for objective in ("time", "overlap"):
            for name in MODELS:
                r = row(name, layers, objective)
                rows.append(r)
                print(
                    f"{layers:3d} {objective:8s} {name:20s} {r['plan_s']:5.2f} s  Eq.1 "
                    f"{r['eq1_ms']:.3f}  combined {r['combined_ms']:.3f}  overlapped "
                    f"{r['overlapped_ms']:.3f} ms",
                    flush=True,
                )
    command = "python bench/scale/scanned_overlap.py " + " ".join(sys.argv[1:])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": command, "jax": jax.__version__, "rows": rows}, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(rows, command))


if __name__ == "__main__":
    main()
