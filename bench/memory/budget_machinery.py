"""The memory budget by today's Lagrangian loop (`search/memory_budget.fit_budget`) against the
solver's memory machinery (`solver/descent.solve_within`: the anytime search with memory as a
constraint, `solver/memory_prices`), on the budget cases of budget_quality.py and budget_time.py
(issue 49, item 2, jaxpar's side).

The machinery needs memory as usages over intervals of program points (`MemoryConstraint`).
From jaxpar's memory model: node v under configuration c uses its held bytes
(`memory/held_bytes.HeldBytes.node_bytes`, the Lagrangian loop's proxy) over the interval from
the first to the last program point any of its held tensors is live (made to last read; an
argument from the start, a result to the end). The exact peak (`MemoryModel`, a liveness walk)
also holds what no proxy prices (transients, copies in flight), so the limit is the budget's
(less its margin) less that rest, measured on the free plan, and lowered by every excess the
exact peak shows (at most 4 rounds, as the loop's constraint generation). It is given the time
the Lagrangian loop took on the same case (its search stage less the free search's), started
from the free plan and the hand plans; its plan is priced exactly like the loop's.
Repeated layers searched as one (a tied variable stands for nodes with different intervals)
cannot be written as one interval per variable: every plan here is searched untied
(``share_blocks=False``, `UNTIED`), both ways.

    python bench/memory/budget_machinery.py --json bench/memory/results/budget_machinery.json \\
        --md bench/memory/results/budget_machinery.md
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))

import numpy as np
from budget_quality import setup  # the same cases, planned the same way

import jaxpar
from jaxpar.cost.evaluation import evaluate
from jaxpar.memory.estimate import MODEL_MARGIN, gb
from jaxpar.memory.held_bytes import HeldBytes
from jaxpar.solver.descent import solve_within
from jaxpar.solver.problem import MemoryConstraint, Problem

CASES = [
    ("gpt_small", (0.9, 0.7, 0.5)),
    ("cnn", (0.7, 0.5)),
    ("mlp", (0.7,)),
    ("gpt2_124m", (0.7,)),
    ("llama3_8b_scan", (0.8, 0.6)),
    ("llama3_70b_scan", (0.4,)),
]
ROUNDS = 4
UNTIED = jaxpar.PlannerOptions(share_blocks=False)


def intervals(plan) -> tuple[np.ndarray, list[np.ndarray]]:
    """Per node the program points its held bytes are live over, and the bytes per config."""
    model = plan.memory_model
    held = HeldBytes(model)
    end = model.end
    spans, usage = [], []
    for v, node in enumerate(model.inp.ng.nodes):
        lo, hi = end + 1, 0
        for t in node.tensor_maps:
            if not held._counted(v, t):
                continue
            born = max(model.producer_eqn.get(t, 0), 0)
            reads = model.reads.get(t, [])
            dies = max([model.read_at[u] for u in reads], default=born)
            if t in model.outvar_set or t in model.inp.feedback:
                dies = end
            lo, hi = min(lo, born), max(hi, dies + 1)
        spans.append((lo, hi) if lo < hi else (0, 0))
        usage.append(held.node_bytes(v))
    return np.array(spans, dtype=np.int64), usage


def machinery(plan, free, budget: float, limit: float, seconds: float) -> dict:
    """The anytime search with memory as a constraint, its limit lowered by the exact peak's
    excess; the fastest plan that fits, priced exactly."""
    model, ctx, problem = plan.memory_model, plan.eval_context(), plan.tables.problem
    spans, usage = intervals(plan)
    proxy_free = MemoryConstraint(spans, usage, 0.0).peak(free.assignment)
    rest = max(0.0, free.memory.peak - proxy_free)  # what the proxy does not price
    cap = limit - rest
    starts = [free.assignment, *[a for a, _ in free.choice.baselines.values()]]
    t0 = time.perf_counter()
    best, tries = None, []
    for r in range(ROUNDS):
        left = seconds - (time.perf_counter() - t0)
        if left <= 0.05 or cap <= 0:
            break
        constrained = Problem(
            problem.unary, problem.edges, problem.blocks, problem.factors,
            MemoryConstraint(spans, usage, cap),
        )  # fmt: skip
        # half of what is left (all of it in the last round): a plan that fits ends the rounds
        share = left if r == ROUNDS - 1 else left / 2
        sol = solve_within(constrained, time.perf_counter() + share, starts)
        a = tuple(sol.assignment)
        est = model.estimate(a, budget)
        ev = evaluate(ctx, a)
        tries.append({"cap_gb": cap / 2**30, "peak_gb": gb(est.peak), "fits": est.fits})
        if est.fits and (best is None or ev.objective < best[1]):
            best = (a, ev.objective, est.peak)
        if est.fits:
            break
        cap -= est.peak - limit
        starts = [a, *starts]
    out = {"time_s": time.perf_counter() - t0, "rounds": tries}
    if best is not None:
        out.update(step_s=best[1], peak_gb=best[2] / 2**30)
    return out


def run(name: str, fraction: float) -> dict:
    ex, mesh, cluster = setup(name)
    t0 = time.perf_counter()
    free = jaxpar.plan(
        ex.step, *ex.args, mesh=mesh, cluster=cluster, memory_budget=None, options=UNTIED
    )
    free_wall = time.perf_counter() - t0
    budget = fraction * free.memory.peak
    t0 = time.perf_counter()
    limit = budget * (1 - MODEL_MARGIN)
    try:
        plan = jaxpar.plan(
            ex.step, *ex.args, mesh=mesh, cluster=cluster, memory_budget=budget, options=UNTIED
        )
        loop = {"step_s": plan.evaluation.objective, "peak_gb": plan.memory.peak / 2**30,
                "fits": plan.memory.fits, "solves": plan.stats.get("budget_solves", 0)}  # fmt: skip
        search_s = plan.stats["search_s"]
    except jaxpar.MemoryBudgetError as err:  # the machinery may still find one: same tables
        plan, loop, search_s = free, {"fits": False, "error": str(err)}, None
    wall = time.perf_counter() - t0
    assert plan.choice.tying is None, "a tied search: no interval per variable"
    # the loop's time: its search stage less the free plan's (all of planning less the free
    # planning's, when it gave up)
    loop_s = (search_s - free.stats["search_s"]) if search_s is not None else wall - free_wall
    loop_s = max(loop_s, 0.05)
    loop.update(time_s=loop_s, plan_s=wall)
    row = {
        "case": name, "fraction": fraction, "budget_gb": budget / 2**30,
        "limit_gb": limit / 2**30, "free_step_s": free.evaluation.objective,
        "free_peak_gb": free.memory.peak / 2**30, "free_plan_s": free_wall, "loop": loop,
    }  # fmt: skip
    row["machinery"] = machinery(plan, free, budget, limit, loop_s)
    return row


def markdown(rows: list[dict], command: str) -> str:
    lines = [
        "# The memory budget: today's Lagrangian loop against the solver's memory machinery",
        "",
        f"`{command}`",
        "",
        "Each case planned free and under budget (a fraction of the free plan's peak);"
        " step: the plan's objective (overlapped step), ms; time: the budget's search time "
        "(the loop: search stage less the free plan's; the machinery was given the same).",
        "",
        "| case | budget (of free peak) | limit GB | loop step ms | loop peak GB | loop s "
        "| machinery step ms | machinery peak GB | machinery s | machinery vs loop |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lo, ma = r["loop"], r["machinery"]
        ms = ma.get("step_s")
        if ms is None:
            vs = "no plan that fits"
        elif "step_s" not in lo:
            vs = "only the machinery fits"
        else:
            vs = f"{ms / lo['step_s'] - 1:+.2%}"
        lstep = f"{lo['step_s'] * 1e3:.4f}" if "step_s" in lo else "none fits"
        lpeak = f"{lo['peak_gb']:.3f}" if "peak_gb" in lo else "-"
        mstep = "-" if ms is None else f"{ms * 1e3:.4f}"
        mpeak = "-" if ms is None else f"{ma['peak_gb']:.3f}"
        lines.append(
            f"| {r['case']} | {r['fraction']:.2f} | {r['limit_gb']:.3f} | "
            f"{lstep} | {lpeak} | {lo['time_s']:.2f} | "
            f"{mstep} | {mpeak} | {ma['time_s']:.2f} | {vs} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--md")
    parser.add_argument("--cases", nargs="*", default=None)
    args = parser.parse_args()
    rows = []
    for name, fractions in CASES:
        if args.cases and name not in args.cases:
            continue
        for fraction in fractions:
            rows.append(run(name, fraction))
            print(json.dumps(rows[-1]), flush=True)
    command = "python bench/memory/budget_machinery.py " + " ".join(sys.argv[1:])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": command, "rows": rows}, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(rows, command))


if __name__ == "__main__":
    main()
