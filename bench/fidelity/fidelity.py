"""Predicted vs compiled-HLO communication for every (model, mesh, strategy) the tests apply.

Bytes sent per device per step, predicted by the plan and read from the compiled HLO on 8
simulated CPU devices, with the collective kinds of each, and per kind the number of collectives
per step: predicted after XLA's all-reduce combiner (`jaxpar.combine`) beside the compiled
program's (while bodies counted per iteration).

    python bench/fidelity/fidelity.py --json bench/fidelity/results/fidelity.json \
        --md bench/fidelity/results/fidelity.md
"""

import argparse
import json
import os
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import jaxpar_zoo as zoo

import jaxpar
from jaxpar.verify.compiled import fidelity

# The objective the committed results were planned with: OptCNN Eq. 1 ("time", the planner's
# default until 2026-11-24; the default is now "overlap").
OBJECTIVE = "time"

MESHES = [{"data": 8}, {"data": 2, "model": 4}, {"a": 2, "b": 2, "c": 2}]
MODELS = ["mlp", "cnn", "lenet5", "gpt_small", "nnx_mlp", "resnet18", "gpt_scan_linen"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--md", default=None)
    args = parser.parse_args()
    rows = []
    print(f"{'model':<10} {'mesh':<26} {'strategy':<8} {'pred KB':>10} {'HLO KB':>10} {'error':>7}")
    for name in MODELS:
        ex = zoo.get(name, small=True)
        for mesh_axes in MESHES:
            mesh = jaxpar.make_mesh(mesh_axes)
            for strategy in ("auto", "data", "model", "owt"):
                step = jaxpar.auto_shard(ex.step, mesh=mesh, strategy=strategy, objective=OBJECTIVE)
                compiled = step.lower(*ex.args).compile()
                fid = fidelity(step.plan.collectives, compiled)
                row = {
                    "model": name,
                    "mesh": mesh_axes,
                    "strategy": strategy,
                    "predicted_bytes": fid.predicted_bytes,
                    "hlo_bytes": fid.hlo_bytes,
                    "relative_error": fid.relative_error,
                    "predicted_kinds": sorted(fid.predicted_kinds),
                    "hlo_kinds": sorted(fid.hlo_kinds),
                    "unexpected_kinds": sorted(fid.unexpected_kinds),
                    "predicted_counts": fid.predicted_counts,
                    "hlo_counts": fid.hlo_counts,
                    "counts_ok": fid.counts_ok(),
                }
                rows.append(row)
                print(
                    f"{name:<10} {mesh_axes!s:<26} {strategy:<8} "
                    f"{fid.predicted_bytes / 1e3:10.1f} {fid.hlo_bytes / 1e3:10.1f} "
                    f"{fid.relative_error:7.2%} counts {fid.predicted_counts} vs {fid.hlo_counts}"
                    + (
                        f" unexpected {sorted(fid.unexpected_kinds)}"
                        if fid.unexpected_kinds
                        else ""
                    ),
                    flush=True,
                )
    worst = max(rows, key=lambda r: r["relative_error"])
    unexpected = sum(bool(r["unexpected_kinds"]) for r in rows)
    print(
        f"worst: {worst['relative_error']:.2%} ({worst['model']}, {worst['mesh']}, "
        f"{worst['strategy']}); unexpected kinds in {unexpected} plans"
    )
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(rows, " ".join(sys.argv[1:])))


def markdown(rows: list[dict], argv: str) -> str:
    out = [
        "# Collective fidelity: predicted vs compiled (8 simulated CPU devices)",
        "",
        f"`python bench/fidelity/fidelity.py {argv}`. Bytes sent per device per step; counts per "
        "kind per",
        "step, predicted after XLA's all-reduce combiner (`jaxpar.combine`), compiled with while",
        "bodies counted per iteration. Counts agree when within 10 % or ±1 for every kind.",
        "",
        "| model | mesh | strategy | pred KB | HLO KB | error | counts pred | counts HLO | agree |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mesh = ",".join(f"{k}={v}" for k, v in r["mesh"].items())
        pc = ", ".join(f"{k} {v}" for k, v in r["predicted_counts"].items())
        hc = ", ".join(f"{k} {v}" for k, v in r["hlo_counts"].items())
        out.append(
            f"| {r['model']} | {mesh} | {r['strategy']} | {r['predicted_bytes'] / 1e3:.1f} | "
            f"{r['hlo_bytes'] / 1e3:.1f} | {r['relative_error']:.2%} | {pc} | {hc} | "
            f"{'yes' if r['counts_ok'] else 'no'} |"
        )
    for strategy in ("auto", "data", "model", "owt"):
        sel = [r for r in rows if r["strategy"] == strategy]
        agree = sum(r["counts_ok"] for r in sel)
        worst = max(r["relative_error"] for r in sel)
        out.append("")
        out.append(
            f"{strategy}: counts agree in {agree} of {len(sel)} plans; worst byte error "
            f"{worst:.2%}."
        )
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
