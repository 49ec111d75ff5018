"""The optimality certificate on the full-size zoo (issue 8).

For every model of `zoo.NAMES` on the benchmark meshes (one P100 node, mesh gpu=4, and four
nodes, mesh node=4,gpu=4; batch 32 per GPU for the CNNs, 4 sequences per GPU for the GPTs and
ViT): auto's reported cost, whether it is certified, the exact lower bound when elimination is
exact, k-cut's plan and the baselines. The promise checked: no plan reports less than an auto plan
that says ``optimal=True`` (the script exits 1 if one does).

    python bench/plan_quality/certificate.py --json bench/plan_quality/results/certificate.json \
        --md bench/plan_quality/results/certificate.md

``--gaps`` (issue 49): the gap of the zoo's uncertified plans to the best proven lower bound,
under both objectives: Inception-v3 and GPT-2 124M on 4x4 P100s, unrolled llama3_8b on 64
H100s (node=8,gpu=8; bf16, per-block remat as bench/scale/scanned.py). Runs at any revision
(the bound's method and the Eq. 1 certificate are read where the revision records them):

    python bench/plan_quality/certificate.py --gaps \
        --json bench/plan_quality/results/certificate_gaps.json \
        --md bench/plan_quality/results/certificate_gaps.md
"""

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import jaxpar_zoo as zoo

import jaxpar

SETUPS = [{"gpu": 4}, {"node": 4, "gpu": 4}]
SEQUENCE_MODELS = ("gpt", "vit", "nnx")


def batch_for(name: str, devices: int) -> int:
    return 4 * devices if name.startswith(SEQUENCE_MODELS) else 32 * devices


def measure(name: str, mesh: dict) -> dict:
    devices = math.prod(mesh.values())
    ex = zoo.get(name, batch=batch_for(name, devices))
    cluster = jaxpar.Cluster.preset("p100", devices=devices)
    t0 = time.perf_counter()
    plan = jaxpar.plan(ex.step, *ex.args, mesh=mesh, cluster=cluster)
    wall = time.perf_counter() - t0
    others = {n: r.evaluation.objective for n, r in plan.searches.items()}
    others.update({s: c.step_s for s, c in plan.baselines.items()})
    beaten = [n for n, v in others.items() if v < plan.evaluation.objective * (1 - 1e-9)]
    return {
        "model": name,
        "mesh": mesh,
        "batch": batch_for(name, devices),
        "step_s": plan.cost.step_s,
        "optimal": plan.optimal,
        "lower_bound_s": plan.lower_bound,
        "method": plan.stats.get("method", ""),
        "searches_s": {n: r.evaluation.objective for n, r in plan.searches.items()},
        "baselines_s": {s: c.step_s for s, c in plan.baselines.items()},
        "beaten_by": beaten,
        "violation": bool(plan.optimal and beaten),
        "plan_s": wall,
    }


def markdown(rows: list[dict]) -> str:
    certified = sum(r["optimal"] for r in rows)
    lines = [
        "# The optimality certificate on the full-size zoo",
        "",
        "`python bench/plan_quality/certificate.py "
        "--json bench/plan_quality/results/certificate.json "
        "--md bench/plan_quality/results/certificate.md` "
        "(p100 cluster; batch 32 per GPU, GPT/ViT 4 per GPU).",
        "",
        f"{certified} of {len(rows)} plans certified; violations (a certified plan beaten by "
        f"k-cut or a baseline): {sum(r['violation'] for r in rows)}.",
        "",
        "| model | mesh | auto ms | certified | lower bound ms | gap | k-cut ms | best baseline ms "
        "| search | plan s |",
        "|---|---|---:|---|---:|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        mesh = ",".join(f"{k}={v}" for k, v in r["mesh"].items())
        lb = r["lower_bound_s"]
        gap = f"{max(0.0, (r['step_s'] - lb) / r['step_s']):.1%}" if lb else "-"
        lbt = f"{lb * 1e3:.4f}" if lb else "-"
        kcut = r["searches_s"].get("kcut", math.nan) * 1e3
        base = min(r["baselines_s"].values()) * 1e3
        lines.append(
            f"| {r['model']} | {mesh} | {r['step_s'] * 1e3:.4f} | {r['optimal']} | {lbt} | {gap} "
            f"| {kcut:.4f} | {base:.4f} | {r['method']} | {r['plan_s']:.2f} |"
        )
    return "\n".join(lines) + "\n"


GAP_CASES = ("inception_v3", "gpt2_124m", "llama3_8b")


def gap_row(name: str, objective: str) -> dict:
    """One uncertified case's plan, its best proven lower bound and the gap between them."""
    from jaxpar.search.candidates import overlap_lower_bound

    if name == "llama3_8b":
        from jaxpar_zoo.llama import llama_config, llama_example

        ex = llama_example(name, llama_config(name, remat=True, scan_layers=False))
        mesh, cluster = {"node": 8, "gpu": 8}, "dgx-h100"
    else:
        ex, mesh, cluster = zoo.get(name), {"a": 4, "b": 4}, "p100"
    t0 = time.perf_counter()
    plan = jaxpar.plan(ex.step, *ex.args, mesh=mesh, cluster=cluster, objective=objective)
    wall = time.perf_counter() - t0
    cost, lower = plan.evaluation.objective, plan.lower_bound
    row = {
        "model": name, "mesh": mesh, "cluster": cluster, "objective": objective,
        "cost_s": cost, "lower_bound_s": lower, "optimal": plan.optimal,
        "gap": None if lower is None else max(0.0, cost - lower) / cost,
        "bound_method": getattr(plan.choice, "bound_method", None),
        "compute_stream_s": overlap_lower_bound(plan.eval_context(), None),
        "tied": plan.choice.tying is not None,
        "search_s": plan.stats["search_s"], "dual_s": plan.stats.get("dual_time_s", 0.0),
        "plan_s": wall,
    }  # fmt: skip
    return row


def gaps_markdown(rows: list[dict], command: str) -> str:
    lines = [
        "# Gaps of the uncertified plans to the best proven lower bound (issue 49)",
        "",
        f"`{command}`",
        "",
        "| model | mesh | objective | plan ms | lower bound ms | gap | bound | space | "
        "search s | of it bounds s |",
        "|---|---|---|---:|---:|---:|---|---|---:|---:|",
    ]
    for r in rows:
        mesh = ",".join(f"{k}={v}" for k, v in r["mesh"].items())
        lb = r["lower_bound_s"]
        gap = "certified" if r["optimal"] else ("-" if r["gap"] is None else f"{r['gap']:.2%}")
        space = "tied layers" if r["tied"] and r["bound_method"] != "compute stream" else "all"
        lines.append(
            f"| {r['model']} | {mesh} ({r['cluster']}) | {r['objective']} | "
            f"{r['cost_s'] * 1e3:.4f} | {'-' if lb is None else f'{lb * 1e3:.4f}'} | {gap} | "
            f"{r['bound_method'] or '-'} | {space} | {r['search_s']:.2f} | {r['dual_s']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def gaps(args) -> int:
    rows = []
    for name in GAP_CASES:
        for objective in ("overlap", "time"):
            rows.append(gap_row(name, objective))
            print(rows[-1], flush=True)
    command = "python bench/plan_quality/certificate.py " + " ".join(sys.argv[1:])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": command, "rows": rows}, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(gaps_markdown(rows, command))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--md")
    parser.add_argument("--models", nargs="*", default=list(zoo.NAMES))
    parser.add_argument("--gaps", action="store_true", help="the uncertified cases' gaps")
    args = parser.parse_args()
    if args.gaps:
        return gaps(args)
    rows = []
    for name in args.models:
        for mesh in SETUPS:
            rows.append(measure(name, mesh))
            r = rows[-1]
            print(
                f"{name:<13} {mesh} auto {r['step_s'] * 1e3:.4f} ms optimal={r['optimal']} "
                f"beaten_by={r['beaten_by']} ({r['plan_s']:.1f} s)",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(rows))
    return 1 if any(r["violation"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
