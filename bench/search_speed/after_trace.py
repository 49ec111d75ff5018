"""Planning time after JAX's trace against the trace itself (issue 49's goals): unrolled llama3_8b
on 64 H100s (node=8,gpu=8) and unrolled llama3_70b on 1,024 (node=128,gpu=8), planning at most
the trace's own time; Inception-v3 on 4x4 P100s within 1 s after its trace.

Each case plans in a fresh process (``--one``), the default objective, bf16 Llamas with
per-block remat as bench/scale/scanned.py. Reported: the stage times of ``Plan.stats``
(trace_s, graph_s, cost_s, search_s; of the search, the LP duals' ``dual_time_s``), planning
after the trace (graph + cost + search) and its ratio to the trace, and the plan's objective.
``--root`` plans with another checkout (a `git worktree` of an older revision) for a before
column; the load average is recorded beside each run.

    python bench/search_speed/after_trace.py --json bench/search_speed/results/after_trace.json \\
        --md bench/search_speed/results/after_trace.md [--before /tmp/before]
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CASES = [
    ("llama3_8b", "node=8,gpu=8", "trace"),
    ("llama3_70b", "node=128,gpu=8", "trace"),
    ("inception_v3", "a=4,b=4", "1 s"),
]


def one(root: str, model: str, mesh_text: str) -> None:
    sys.path.insert(0, root)
    import jaxpar_zoo as zoo

    import jaxpar

    if not jaxpar.__file__.startswith(os.path.abspath(root)):
        raise SystemExit(f"imported {jaxpar.__file__}, not the revision in {root}")
    mesh = {k: int(v) for k, v in (kv.split("=") for kv in mesh_text.split(","))}
    if model.startswith("llama"):
        from jaxpar_zoo.llama import llama_config, llama_example

        ex = llama_example(model, llama_config(model, remat=True, scan_layers=False))
        cluster = "dgx-h100"
    else:
        ex, cluster = zoo.get(model), "p100"
    t0 = time.perf_counter()
    plan = jaxpar.plan(ex.step, *ex.args, mesh=mesh, cluster=cluster)
    wall = time.perf_counter() - t0
    s = plan.stats
    row = {k: s[k] for k in ("trace_s", "graph_s", "cost_s", "search_s")}
    row.update(
        model=model, mesh=mesh_text, wall_s=wall, dual_s=s.get("dual_time_s", 0.0),
        objective=plan.evaluation.objective, bound_gap=s.get("bound_gap"),
        load=os.getloadavg()[0],
    )  # fmt: skip
    print(json.dumps(row))


def run(root: str, model: str, mesh: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--one", root, model, mesh],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def after(r: dict) -> float:
    return r["graph_s"] + r["cost_s"] + r["search_s"]


def markdown(rows: list[dict], command: str) -> str:
    lines = [
        "# Planning time after JAX's trace (issue 49)",
        "",
        f"`{command}` (one fresh process per plan; load average at the end of each run).",
        "",
        "| revision | model | mesh | trace s | graph s | cost s | search s | of it duals s | "
        "after trace s | / trace | goal | met | objective ms | load |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|",
    ]
    for r in rows:
        goal = r["goal"]
        limit = r["trace_s"] if goal == "trace" else 1.0
        met = "yes" if after(r) <= limit else "no"
        lines.append(
            f"| {r['revision']} | {r['model']} | {r['mesh']} | {r['trace_s']:.2f} | "
            f"{r['graph_s']:.2f} | {r['cost_s']:.2f} | {r['search_s']:.2f} | {r['dual_s']:.2f} | "
            f"{after(r):.2f} | {after(r) / r['trace_s']:.2f} | "
            f"{'≤ trace' if goal == 'trace' else '≤ 1 s'} | {met} | "
            f"{r['objective'] * 1e3:.4f} | {r['load']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", nargs=3, metavar=("ROOT", "MODEL", "MESH"))
    parser.add_argument("--before", default=None, help="an older checkout to plan with too")
    parser.add_argument("--json")
    parser.add_argument("--md")
    args = parser.parse_args()
    if args.one:
        one(*args.one)
        return
    rows = []
    roots = [("before", args.before)] if args.before else []
    roots.append(("this", HERE))
    for model, mesh, goal in CASES:
        for label, root in roots:
            r = run(root, model, mesh)
            r.update(revision=label, goal=goal)
            rows.append(r)
            print(json.dumps(r), flush=True)
    command = "python bench/search_speed/after_trace.py " + " ".join(sys.argv[1:])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": command, "rows": rows}, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(rows, command))


if __name__ == "__main__":
    main()
