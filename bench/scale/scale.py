"""Scale: planning time against model depth and against mesh size and number of axes.

(a) Depth: GPT-2 124M-wide decoders (d=768, 12 heads, vocab 50304, context 1024) + AdamW with
    12, 24, 48 and 96 layers, on an abstract 2-node P100 mesh node=2,gpu=4.
(b) Mesh: a 4-layer GPT-2-wide decoder on abstract meshes of 8 to 4,096 devices with 1 to 4
    axes (p100 preset sized to the mesh: 4 GPUs per node), nothing allocated, no devices.

Planning time only: no memory budget (a 4,096-sequence batch does not fit 8 P100s).

The fitted growth: the exponent b of time ~ a * equations^b for (a), and of time ~ a *
devices^b at a fixed number of axes for (b).

    python bench/scale/scale.py --json bench/scale/results/scale.json \
        --md bench/scale/results/scale.md
"""

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import jax
import numpy as np
from jaxpar_zoo.transformer import gpt2_config, gpt_example

import jaxpar

# The objective the committed results were planned with: OptCNN Eq. 1 ("time", the planner's
# default until 2026-11-24; the default is now "overlap").
OBJECTIVE = "time"

DEPTHS = [12, 24, 48, 96]
MESHES = {
    1: [{"a": 8}, {"a": 64}, {"a": 512}, {"a": 4096}],
    2: [{"a": 2, "b": 4}, {"a": 8, "b": 8}, {"a": 16, "b": 32}, {"a": 64, "b": 64}],
    3: [
        {"a": 2, "b": 2, "c": 2},
        {"a": 4, "b": 4, "c": 4},
        {"a": 8, "b": 8, "c": 8},
        {"a": 16, "b": 16, "c": 16},
    ],
    4: [
        {"a": 2, "b": 2, "c": 2, "d": 2},
        {"a": 4, "b": 4, "c": 4, "d": 4},
        {"a": 8, "b": 8, "c": 8, "d": 8},
    ],
}


def gpt(layers: int, batch: int):
    cfg = gpt2_config(layers, 768, 12, 6e-4)
    cfg["batch"] = batch
    return gpt_example(f"gpt2_wide_{layers}l", cfg)


def plan_row(ex, mesh: dict) -> dict:
    devices = math.prod(mesh.values())
    cluster = jaxpar.Cluster.preset("p100", devices=devices)
    t0 = time.perf_counter()
    plan = jaxpar.plan(
        ex.step,
        *ex.args,
        mesh=mesh,
        cluster=cluster,
        memory_budget=None,
        objective=OBJECTIVE,
    )
    wall = time.perf_counter() - t0
    s = plan.stats
    return {
        "mesh": mesh,
        "devices": devices,
        "axes": len(mesh),
        "equations": s["equations"],
        "nodes": s["nodes"],
        "max_configs": s["max_configs"],
        "configs": int(sum(len(c) for c in plan.configs)),
        "trace_s": s["trace_s"],
        "graph_s": s["graph_s"],
        "cost_s": s["cost_s"],
        "search_s": s["search_s"],
        "plan_s": s["trace_s"] + s["graph_s"] + s["cost_s"] + s["search_s"],
        "wall_s": wall,
        "optimal": plan.optimal,
        "step_s": plan.cost.step_s,
        "data_step_s": plan.baselines["data"].step_s,
    }


def fit_exponent(x: list[float], y: list[float]) -> float:
    """Least-squares slope of log y against log x."""
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def show(r: dict, key: str) -> None:
    print(
        f"{key:<28} eqns {r['equations']:6d} nodes {r['nodes']:6d} configs {r['configs']:7d} "
        f"trace {r['trace_s']:6.2f} costs {r['cost_s']:6.2f} search {r['search_s']:6.2f} "
        f"plan {r['plan_s']:7.2f} s optimal {r['optimal']}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--md", default=None)
    parser.add_argument("--depths", type=int, nargs="+", default=DEPTHS)
    parser.add_argument("--axes", type=int, nargs="+", default=sorted(MESHES))
    args = parser.parse_args()
    depth_rows, mesh_rows = [], []
    for layers in args.depths:
        r = plan_row(gpt(layers, 64), {"node": 2, "gpu": 4})
        r["layers"] = layers
        depth_rows.append(r)
        show(r, f"{layers} layers, node=2,gpu=4")
    depth_fit = (
        fit_exponent([r["equations"] for r in depth_rows], [r["plan_s"] for r in depth_rows])
        if len(depth_rows) > 1
        else None
    )
    ex = gpt(4, 4096)
    for k in args.axes:
        for mesh in MESHES[k]:
            r = plan_row(ex, mesh)
            mesh_rows.append(r)
            show(r, "x".join(map(str, mesh.values())))
    mesh_fit = {}
    for k in args.axes:
        rows = [r for r in mesh_rows if r["axes"] == k]
        if len(rows) > 1:
            mesh_fit[k] = fit_exponent([r["devices"] for r in rows], [r["plan_s"] for r in rows])
    command = "python bench/scale/scale.py " + " ".join(sys.argv[1:])
    result = {
        "command": command,
        "jax": jax.__version__,
        "depth": depth_rows,
        "depth_exponent": depth_fit,
        "mesh": mesh_rows,
        "mesh_exponent_by_axes": mesh_fit,
    }
    print("time ~ equations^%s" % (f"{depth_fit:.2f}" if depth_fit else "?"))
    print("time ~ devices^b at fixed axes:", {k: round(v, 2) for k, v in mesh_fit.items()})
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(result))


def markdown(res: dict) -> str:
    out = [
        "# Scale: planning time vs depth and vs mesh",
        "",
        f"`{res['command']}` — jax {res['jax']}",
        "",
    ]
    out += [
        "## Depth (GPT-2-wide decoder, mesh node=2,gpu=4, p100)",
        "",
        "| layers | equations | nodes | trace s | graph s | costs s | search s | plan s "
        "| optimal |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["depth"]:
        out.append(
            f"| {r['layers']} | {r['equations']} | {r['nodes']} | {r['trace_s']:.2f} | "
            f"{r['graph_s']:.2f} | {r['cost_s']:.2f} | {r['search_s']:.2f} | {r['plan_s']:.2f} | "
            f"{'yes' if r['optimal'] else 'no'} |"
        )
    if res["depth_exponent"] is not None:
        out += ["", f"Fitted: planning time ∝ equations^{res['depth_exponent']:.2f}."]
    out += [
        "",
        "## Mesh size and axes (4-layer GPT-2-wide decoder, batch 4096, p100 sized to the mesh)",
        "",
        "| mesh | devices | axes | max configs/node | configs | costs s | search s | plan s "
        "| optimal |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["mesh"]:
        out.append(
            f"| {'×'.join(map(str, r['mesh'].values()))} | {r['devices']} | {r['axes']} | "
            f"{r['max_configs']} | {r['configs']} | {r['cost_s']:.2f} | {r['search_s']:.2f} | "
            f"{r['plan_s']:.2f} | {'yes' if r['optimal'] else 'no'} |"
        )
    fits = ", ".join(f"{k} axes: {v:.2f}" for k, v in res["mesh_exponent_by_axes"].items())
    out += ["", f"Fitted exponent b of time ∝ devices^b at a fixed number of axes: {fits}."]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
