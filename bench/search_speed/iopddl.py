"""jaxpar's search on the IOPDDL contest's released benchmarks (ASPLOS/EuroSys 2025; issue 49).

Each benchmark runs as the contest ran it: ``python -m jaxpar solve FILE TIMEOUT`` in a fresh
process, wall clock from its start to its exit (reading included), the answer read from the
last stdout line and scored exactly (`solver.contest_format.score`). Points = the best team's
cost / ours (0 for no answer or an infeasible one); the teams' costs are the contest's final
results (misc/iopddl_final_results.csv in asplos-contest/2025), where a cost of 1e18 or more is
an infeasible answer.

Only A, G, M and S (released in advance, files present) are run: the contest judged on the
other twenty, and so do we; never add them here. The files are not in the repository:
``IOPDDL_DATA`` (default /work/shared/iopddl, where this machine had them) names a folder with
``asplos-2025-iopddl-{A,G,M,S}.json.gz`` and ``iopddl_final_results.csv``.

    python bench/search_speed/iopddl.py --json bench/search_speed/results/iopddl.json \\
        --md bench/search_speed/results/iopddl.md
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from jaxpar.solver.contest_format import read_contest, score  # noqa: E402

DATA = Path(os.environ.get("IOPDDL_DATA", "/work/shared/iopddl"))
BENCHMARKS = {"A": 60, "G": 120, "M": 180, "S": 240}  # the contest's timeouts, seconds
INFEASIBLE = 10**18


def best_costs(path: Path) -> dict[str, int]:
    """Per benchmark the best feasible cost any team reached."""
    best: dict[str, int] = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            for name, value in row.items():
                if name in BENCHMARKS and value and int(value) < INFEASIBLE:
                    best[name] = min(best.get(name, INFEASIBLE), int(value))
    return best


def run_one(name: str, timeout: int, best: int) -> dict:
    """One benchmark in a fresh process, scored."""
    path = DATA / f"asplos-2025-iopddl-{name}.json.gz"
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "jaxpar", "solve", str(path), str(timeout)],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    wall = time.perf_counter() - t0
    lines = done.stdout.strip().splitlines()
    answer = json.loads(lines[-1]) if lines else []
    data = read_contest(path).data
    result = score(data, answer) if answer else None
    ok = result is not None and result.feasible and result.cost < INFEASIBLE
    return {
        "benchmark": name,
        "timeout_s": timeout,
        "wall_s": round(wall, 2),
        "exit": done.returncode,
        "cost": result.cost if result else None,
        "feasible": bool(ok),
        "peak_over_limit": round(result.peak / data["usage_limit"], 4) if result else None,
        "best_team_cost": best,
        "points": round(best / result.cost, 4) if ok else 0.0,
        "load_before": round(load, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "log_tail": done.stderr.strip().splitlines()[-3:],
    }


def markdown(rows: list[dict], command: str) -> str:
    """The results as a table."""
    out = [
        f"`{command}`",
        "",
        "| benchmark | our cost | best team | points | feasible (peak/limit) | wall s | timeout s "
        "| load (1 min, before/after) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cost = f"{r['cost']:,}" if r["cost"] is not None else "none"
        out.append(
            f"| {r['benchmark']} | {cost} | {r['best_team_cost']:,} | {r['points']:.3f} "
            f"| {'yes' if r['feasible'] else 'no'} ({r['peak_over_limit']}) | {r['wall_s']} "
            f"| {r['timeout_s']} | {r['load_before']} / {r['load_after']} |"
        )
    total = sum(r["points"] for r in rows)
    out.append(f"\nTotal {total:.3f} of {len(rows)} points.")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="".join(BENCHMARKS), help="benchmarks, e.g. AG")
    parser.add_argument("--json", default=None)
    parser.add_argument("--md", default=None)
    args = parser.parse_args()
    command = "python bench/search_speed/iopddl.py " + " ".join(sys.argv[1:])
    best = best_costs(DATA / "iopddl_final_results.csv")
    rows = []
    for name in args.only:
        row = run_one(name, BENCHMARKS[name], best[name])
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "log_tail"}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"command": command, "rows": rows}, indent=1))
    if args.md:
        Path(args.md).write_text(markdown(rows, command))
    print(markdown(rows, command))


if __name__ == "__main__":
    main()
