"""Scanned layers and repeated blocks (issue 10): planning time and plan cost.

(a) Scanned vs unrolled: the zoo's GPT-2-wide decoder (d 768, 12 heads, 8 x 1024 tokens, AdamW)
    with its blocks under linen ``nn.scan`` (``gpt_scan_linen``) and unrolled
    (``gpt_unrolled_linen``, same shapes and math) at 4, 12 and 64 layers on 64 H100s
    (node=8, gpu=8): predicted step time of the auto plan and of data parallelism, planning wall
    time. The scanned plan's time should be flat in depth.
(b) Llama-3 planning wall time, scanned (``llama_config(scan_layers=True)``) and unrolled, on
    dgx-h100 meshes with 2, 3 and 4 axes, and llama3_70b on 1,024 devices.
(c) Inception-v3 and GPT-2 124M on a 4x4 mesh (p100), unrolled as in the zoo.

Everything is abstract (nothing allocated); wall time on this machine, one process. Planned
with the planner's default objective ("overlap" since 2026-11-24; ``--objective time`` for Eq. 1);
step ratios compare the step the plans were chosen by.

    python bench/scale/scanned.py --json bench/scale/results/scanned.json \
        --md bench/scale/results/scanned.md
"""

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import jax
import jaxpar_zoo as zoo
from jaxpar_zoo.llama import llama_config, llama_example
from jaxpar_zoo.scanned import scanned_config, scanned_example

import jaxpar

DEPTHS = [4, 12, 64]
GPT_MESH = {"node": 8, "gpu": 8}
# (model, mesh, variants)
LLAMA_CASES = [
    ("llama3_8b", {"node": 8, "gpu": 8}, (True, False)),
    ("llama3_8b", {"node": 8, "nvl": 2, "gpu": 4}, (True, False)),
    ("llama3_8b", {"pod": 2, "node": 4, "nvl": 2, "gpu": 4}, (True, False)),
    ("llama3_70b", {"node": 8, "gpu": 8}, (True, False)),
    ("llama3_70b", {"node": 128, "gpu": 8}, (True, False)),
    ("mixtral_8x7b", {"node": 8, "gpu": 8}, (True, False)),
]
ZOO_CASES = [("inception_v3", {"a": 4, "b": 4}), ("gpt2_124m", {"a": 4, "b": 4})]


def plan_row(ex, mesh: dict, cluster: str, objective: str | None) -> dict:
    given = {} if objective is None else {"objective": objective}
    t0 = time.perf_counter()
    plan = jaxpar.plan(ex.step, *ex.args, mesh=mesh, cluster=cluster, **given)
    wall = time.perf_counter() - t0
    s = plan.stats
    return {
        "mesh": mesh,
        "equations": s["equations"],
        "nodes": s["nodes"],
        "regions": len(plan.program.regions),
        "tied_nodes": s.get("tied_nodes", 0),
        "trace_s": s["trace_s"],
        "graph_s": s["graph_s"],
        "cost_s": s["cost_s"],
        "search_s": s["search_s"],
        "wall_s": wall,
        "optimal": plan.optimal,
        "objective": plan.objective,
        "step_s": plan.cost.step_s,
        "data_step_s": plan.baselines["data"].step_s,
        "overlapped_step_s": plan.cost.overlapped_step_s,
        "data_overlapped_step_s": plan.baselines["data"].overlapped_step_s,
        "chosen_step_s": plan.cost.step_for(plan.objective),
        "data_chosen_step_s": plan.baselines["data"].step_for(plan.objective),
        "peak_gb": plan.memory.peak / 1e9,
        "fits": bool(plan.memory.fits),
        "best_hand": best_fitting_hand_plan(plan),
    }


def best_fitting_hand_plan(plan) -> list:
    """[name, step s] of the fastest hand plan whose predicted peak fits (by the step the plan
    was chosen by), or [None, nan]."""
    best = [None, math.nan]
    for name, cost in plan.baselines.items():
        step = cost.step_for(plan.objective)
        assignment = plan.choice.baselines[name][0]
        fits = plan.memory_model.estimate(assignment, plan.memory.budget).fits
        if fits is not False and not step >= best[1]:
            best = [name, step]
    return best


def show(key: str, r: dict) -> None:
    print(
        f"{key:<44} nodes {r['nodes']:6d} trace {r['trace_s']:6.2f} costs {r['cost_s']:6.2f} "
        f"search {r['search_s']:6.2f} wall {r['wall_s']:6.2f} s "
        f"step {r['chosen_step_s'] * 1e3:9.3f} ms (data {r['data_chosen_step_s'] * 1e3:9.3f})",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--md", default=None)
    parser.add_argument("--parts", default="abc")
    parser.add_argument("--objective", default=None, help="time, overlap or comm")
    args = parser.parse_args()
    out: dict = {"command": "python bench/scale/scanned.py " + " ".join(sys.argv[1:])}
    out["jax"] = jax.__version__
    if "a" in args.parts:
        out["depth"] = []
        for layers in DEPTHS:
            for name in ("gpt_scan_linen", "gpt_unrolled_linen"):
                ex = scanned_example(name, scanned_config(name, layers=layers))
                r = plan_row(ex, GPT_MESH, "dgx-h100", args.objective)
                r.update(model=name, layers=layers)
                out["depth"].append(r)
                show(f"{name} {layers} layers", r)
    if "b" in args.parts:
        out["llama"] = []
        for name, mesh, variants in LLAMA_CASES:
            for scan in variants:
                ex = llama_example(name, llama_config(name, remat=True, scan_layers=scan))
                r = plan_row(ex, mesh, "dgx-h100", args.objective)
                r.update(model=name, scanned=scan)
                out["llama"].append(r)
                show(f"{name} {'scan' if scan else 'unrolled'} {mesh}", r)
    if "c" in args.parts:
        out["zoo"] = []
        for name, mesh in ZOO_CASES:
            r = plan_row(zoo.get(name), mesh, "p100", args.objective)
            r.update(model=name)
            out["zoo"].append(r)
            show(f"{name} {mesh}", r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(out))


def _chosen(r: dict, prefix: str = "") -> float:
    """The step a row's plan was chosen by (Eq. 1 in files written before rows said)."""
    return r.get(prefix + "chosen_step_s", r[prefix + "step_s"])


def _mesh(m: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in m.items())


def markdown(res: dict) -> str:
    out = ["# Scanned layers and repeated blocks", "", f"`{res['command']}` — jax {res['jax']}"]
    rows = [r for part in ("depth", "llama", "zoo") for r in res.get(part, [])]
    objective = rows[0].get("objective", "time") if rows else "time"
    out += [
        "",
        "Planning wall time on this 2-core machine; step times predicted (dgx-h100). Objective "
        f'"{objective}": ratios compare the step the plans were chosen by.',
        "",
    ]
    if "depth" in res:
        out += [
            "## Scanned vs unrolled GPT-2-wide decoder, 64 H100s (node=8, gpu=8)",
            "",
            "| layers | model | nodes | tied | plan s | auto Eq. 1 ms | auto overlapped ms | "
            "data Eq. 1 ms | data overlapped ms | optimal |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in res["depth"]:
            out.append(
                f"| {r['layers']} | {r['model']} | {r['nodes']} | {r['tied_nodes']} | "
                f"{r['wall_s']:.2f} | {r['step_s'] * 1e3:.3f} | "
                f"{r.get('overlapped_step_s', math.nan) * 1e3:.3f} | "
                f"{r['data_step_s'] * 1e3:.3f} | "
                f"{r.get('data_overlapped_step_s', math.nan) * 1e3:.3f} | "
                f"{'yes' if r['optimal'] else 'no'} |"
            )
        scan = {r["layers"]: r for r in res["depth"] if r["model"] == "gpt_scan_linen"}
        unrolled = {r["layers"]: r for r in res["depth"] if r["model"] != "gpt_scan_linen"}
        lo, hi = min(scan), max(scan)
        out += [
            "",
            f"Scanned planning time, {hi} vs {lo} layers: "
            f"{scan[hi]['wall_s'] / scan[lo]['wall_s']:.2f}x. Auto step, scanned / unrolled: "
            + ", ".join(
                f"{n} layers {_chosen(scan[n]) / _chosen(unrolled[n]):.3f}" for n in sorted(scan)
            )
            + "; data parallel, scanned / unrolled: "
            + ", ".join(
                f"{n} layers {_chosen(scan[n], 'data_') / _chosen(unrolled[n], 'data_'):.3f}"
                for n in sorted(scan)
            )
            + ".",
        ]
    if "llama" in res:
        out += [
            "",
            "## Llama-3 and Mixtral (per-block remat, 8 x 4096 tokens), dgx-h100",
            "",
            "| model | layers | mesh | nodes | trace s | costs s | search s | plan s | step s "
            "| peak GB | fits | best fitting hand plan s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in res["llama"]:
            hand, hand_s = r.get("best_hand", [None, math.nan])
            out.append(
                f"| {r['model']} | {'scanned' if r['scanned'] else 'unrolled'} | "
                f"{_mesh(r['mesh'])} | {r['nodes']} | {r['trace_s']:.2f} | {r['cost_s']:.2f} | "
                f"{r['search_s']:.2f} | **{r['wall_s']:.2f}** | {_chosen(r):.3f} | "
                f"{r['peak_gb']:.1f} | {'yes' if r['fits'] else 'no'} | "
                + (f"{hand_s:.3f} ({hand}) |" if hand else "none fits |")
            )
    if "zoo" in res:
        out += [
            "",
            "## Zoo models on 4x4 (p100)",
            "",
            "| model | nodes | tied | trace s | costs s | search s | plan s | optimal |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in res["zoo"]:
            out.append(
                f"| {r['model']} | {r['nodes']} | {r['tied_nodes']} | {r['trace_s']:.2f} | "
                f"{r['cost_s']:.2f} | {r['search_s']:.2f} | **{r['wall_s']:.2f}** | "
                f"{'yes' if r['optimal'] else 'no'} |"
            )
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
