"""Planning time of two revisions, paired: each plan the first in a fresh process, alternating.

This machine's speed drifts by 3x from day to day and by tens of percent within minutes, so a
revision's planning time means little next to another day's. Paired runs compare two revisions
in the same minutes: for each case, ``--pairs`` times, the older revision (a checkout given by
``--before``) plans in a fresh process, then this one. Cases are Llama models with per-block
remat on dgx-h100 meshes, the auto plan with the default objective: unrolled, or scanned where
the model's name ends in ``:scan`` (``--case llama3_8b:scan pod=2,node=4,nvl=2,gpu=4``;
default: `CASES`).

    git worktree add /tmp/before REV
    python bench/search_speed/paired_plans.py --before /tmp/before \
        --json bench/search_speed/results/labels_pairs.json \
        --md bench/search_speed/results/labels_pairs.md

One plan (the child process): ``python bench/search_speed/paired_plans.py --one ROOT MODEL MESH``
prints a JSON line with the stage times, the wall time of `jaxpar.plan` and the predicted step.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CASES = [("llama3_8b", "node=8,gpu=8"), ("llama3_8b", "pod=2,node=4,nvl=2,gpu=4")]
STAGES = ("trace_s", "graph_s", "cost_s", "search_s")


def one(root: str, model: str, mesh_text: str) -> None:
    sys.path.insert(0, root)
    from jaxpar_zoo.llama import llama_config, llama_example

    import jaxpar

    if not jaxpar.__file__.startswith(os.path.abspath(root)):
        raise SystemExit(f"imported {jaxpar.__file__}, not the revision in {root}")
    mesh = {k: int(v) for k, v in (kv.split("=") for kv in mesh_text.split(","))}
    name, _, variant = model.partition(":")
    ex = llama_example(name, llama_config(name, remat=True, scan_layers=variant == "scan"))
    t0 = time.perf_counter()
    plan = jaxpar.plan(ex.step, *ex.args, mesh=mesh, cluster="dgx-h100")
    wall = time.perf_counter() - t0
    row = {"model": model, "mesh": mesh_text, "wall_s": wall}
    row.update({k: plan.stats[k] for k in STAGES})
    row.update(
        step_s=plan.cost.step_for(plan.objective), tied_nodes=plan.stats.get("tied_nodes", 0)
    )
    print(json.dumps(row))


def run(root: str, model: str, mesh: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--one", root, model, mesh],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def markdown(rows: list[dict], command: str) -> str:
    lines = [
        "# Planning time, two revisions paired",
        "",
        f"`{command}`",
        "",
        "Medians of the pairs, [min–max] in brackets, seconds.",
        "",
        "| model | mesh | revision | wall | trace | costs | search | step ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model, mesh in dict.fromkeys((r["model"], r["mesh"]) for r in rows):
        for rev in ("before", "after"):
            mine = [r for r in rows if (r["model"], r["mesh"], r["revision"]) == (model, mesh, rev)]

            def cell(key: str, mine: list[dict] = mine) -> str:
                xs = [r[key] for r in mine]
                return f"{statistics.median(xs):.2f} [{min(xs):.2f}–{max(xs):.2f}]"

            steps = sorted({round(r["step_s"] * 1e3, 3) for r in mine})
            lines.append(
                f"| {model} | {mesh} | {rev} | {cell('wall_s')} | {cell('trace_s')} | "
                f"{cell('cost_s')} | {cell('search_s')} | {', '.join(map(str, steps))} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--one", nargs=3, metavar=("ROOT", "MODEL", "MESH"))
    parser.add_argument("--before", help="a checkout of the older revision")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument(
        "--case", nargs=2, action="append", metavar=("MODEL", "MESH"), help="repeatable"
    )
    parser.add_argument("--json")
    parser.add_argument("--md")
    args = parser.parse_args()
    if args.one:
        one(*args.one)
        return
    if not args.before:
        parser.error("give --before DIR (a checkout of the older revision)")
    rows = []
    for model, mesh in args.case or CASES:
        for _ in range(args.pairs):
            for rev, root in (("before", args.before), ("after", HERE)):
                row = run(root, model, mesh) | {"revision": rev}
                rows.append(row)
                print(json.dumps(row), flush=True)
    command = "python bench/search_speed/paired_plans.py " + " ".join(sys.argv[1:])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": command, "rows": rows}, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(rows, command))


if __name__ == "__main__":
    main()
