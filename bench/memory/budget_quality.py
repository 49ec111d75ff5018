"""Plan quality under a memory budget: the budgeted search's step time against the free plan's.

For each case the free plan (``memory_budget=None``) is planned first, then the same step under
budgets of a few fractions of its predicted peak. Reported per budget: the budgeted plan's
predicted step, its peak and limit (budget less the model's margin), the Lagrangian solves, and
wall time. ``--before old.json`` adds the step of a run at another revision beside each row.

``--dense N`` adds, for the small GPT and the scanned Llamas, an independent yardstick: N
multipliers λ log-spaced over [1e-3, 1e2] × (the free plan's time / its peak), each solved with
the search's full budget twice, from the free plan and from the hand plans, the proxy growing
by every solution's peak; the fastest solution that fits each budget is reported.

    python bench/memory/budget_quality.py --dense 40 \
        --json bench/memory/results/budget_quality.json \
        --md bench/memory/results/budget_quality.md \
        --before bench/memory/results/budget_quality_before.json
"""

import argparse
import datetime
import json
import os
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import jax
import jaxpar_zoo as zoo
import numpy as np
from jaxpar_zoo.llama import llama_config, llama_example

import jaxpar
from jaxpar.cost.evaluation import evaluate
from jaxpar.search.memory_budget import _Proxy
from jaxpar.solver.descent import solve
from jaxpar.solver.problem import Problem

CASES = [
    ("gpt_small", (0.95, 0.9, 0.8, 0.7, 0.5)),
    ("cnn", (0.9, 0.7, 0.5)),
    ("mlp", (0.9, 0.7, 0.5)),
    ("lenet5", (0.9, 0.7)),
    ("gpt2_124m", (0.9, 0.7)),
    ("resnet18", (0.8,)),
    ("llama3_8b_scan", (0.8, 0.6, 0.4)),
    ("llama3_70b_scan", (0.4, 0.25)),
]


def setup(name: str):
    """(example, mesh, cluster) of a case."""
    if name == "llama3_8b_scan":
        cfg = llama_config("llama3_8b", remat=True, scan_layers=True)
        return llama_example("llama3_8b", cfg), {"node": 8, "gpu": 8}, "dgx-h100"
    if name == "llama3_70b_scan":
        cfg = llama_config("llama3_70b", remat=True, batch=64, seq_len=2048, scan_layers=True)
        return llama_example("llama3_70b", cfg), {"node": 8, "gpu": 8}, "dgx-h100"
    if name in ("gpt2_124m", "resnet18"):
        return zoo.get(name), {"a": 4, "b": 4}, "p100"
    return zoo.get(name, small=True), {"data": 2, "model": 4}, "p100"


DENSE = ("gpt_small", "llama3_8b_scan", "llama3_70b_scan")  # the cases ``--dense`` sweeps


def dense_sweep(free: jaxpar.Plan, count: int) -> list[tuple[float, float]]:
    """(objective, peak) of the full search's solutions at ``count`` λs, from the free plan and
    from the hand plans."""
    ctx, model, base = free.eval_context(), free.memory_model, free.tables.problem
    proxy = _Proxy(model, base.num_nodes)
    proxy.add(model.estimate_with_peak(free.assignment, None)[1])
    scale = free.evaluation.objective / free.memory.peak
    hands = [a for a, _ in free.choice.baselines.values()]
    out = []
    for lam in np.logspace(-3, 2, count) * scale:
        unary = [u + lam * b for u, b in zip(base.unary, proxy.nodes, strict=True)]
        problem = Problem(unary, base.edges, base.blocks, base.factors)
        for starts in ([free.assignment], hands):
            a = tuple(solve(problem, starts=starts, budget=free.options.budget).assignment)
            estimate, peak = model.estimate_with_peak(a, None)
            proxy.add(peak)
            out.append((evaluate(ctx, a).objective, estimate.peak))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--md", default=None)
    parser.add_argument("--before", default=None, help="a --json of another revision")
    parser.add_argument("--dense", type=int, default=0, help="λs of the dense sweeps (0: none)")
    parser.add_argument("--objective", default=None, help="time, overlap (default) or comm")
    args = parser.parse_args()
    given = {} if args.objective is None else {"objective": args.objective}
    before = {}
    if args.before:
        with open(args.before) as fh:
            before = json.load(fh)["rows"]
    rows: dict[str, dict] = {}
    for name, fractions in CASES:
        ex, mesh, cluster = setup(name)
        free = jaxpar.plan(
            ex.step, *ex.args, mesh=mesh, cluster=cluster, memory_budget=None, **given
        )
        swept = dense_sweep(free, args.dense) if args.dense and name in DENSE else None
        for f in fractions:
            budget = f * free.memory.peak
            t0 = time.perf_counter()
            plan = jaxpar.plan(
                ex.step, *ex.args, mesh=mesh, cluster=cluster, memory_budget=budget, **given
            )
            row = {  # the step the plans are chosen by: overlapped, or Eq. 1 under "time"
                "objective": plan.objective,
                "free_ms": free.cost.step_for(free.objective) * 1e3,
                "step_ms": plan.cost.step_for(plan.objective) * 1e3,
                "peak_gb": plan.memory.peak / 1e9,
                "limit_gb": plan.memory.limit / 1e9,
                "solves": plan.stats.get("budget_solves"),
                "wall_s": time.perf_counter() - t0,
            }
            if swept is not None:
                fits = [t for t, peak in swept if peak <= plan.memory.limit]
                row["dense_ms"] = min(fits) * 1e3 if fits else None
            rows[f"{name} {f}"] = row
            old = before.get(f"{name} {f}", {}).get("step_ms")
            print(
                f"{name:16} {f:5} step {row['step_ms']:10.3f} ms (free {row['free_ms']:10.3f}, "
                f"before {old if old is None else round(old, 3)}) peak {row['peak_gb']:.4g} GB "
                f"solves {row['solves']} {row['wall_s']:.2f} s",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"jax": jax.__version__, "rows": rows}, fh, indent=1)
    if args.md:
        write_md(args.md, rows, before, args)


def _objective(rows: dict) -> str:
    """The rows' objective ("time" in files written before rows said)."""
    return next(iter(rows.values()), {}).get("objective", "time")


def write_md(path: str, rows: dict, before: dict, args) -> None:
    dense = any("dense_ms" in r for r in rows.values())
    head = "| case | budget × free peak | free ms | before ms | step ms | peak GB | limit GB |"
    head += " solves | plan s |" + (" dense sweep ms |" if dense else "")
    lines = [
        "# Plan quality under a memory budget",
        "",
        "`python bench/memory/budget_quality.py"
        f"{' --dense ' + str(args.dense) if args.dense else ''}"
        f"{' --objective ' + args.objective if args.objective else ''}`"
        f" — jax {jax.__version__}, {datetime.date.today()}, 2-core CPU, shared",
        "",
        f"Predicted step of the budgeted plan (objective {_objective(rows)}: the step plans are "
        'chosen by, Eq. 1 under "time", else overlapped); the free plan is planned with no '
        "budget. "
        "`before`: the same at the revision of `--before`"
        + (" (`" + os.path.basename(args.before) + "`)." if args.before else "."),
        "",
        head,
        "|" + "---|" * (head.count("|") - 1),
    ]
    for key, r in rows.items():
        name, f = key.rsplit(" ", 1)
        old = before.get(key, {}).get("step_ms")
        cells = [
            name, f, f"{r['free_ms']:.3f}", "" if old is None else f"{old:.3f}",
            f"**{r['step_ms']:.3f}**", f"{r['peak_gb']:.4g}", f"{r['limit_gb']:.4g}",
            str(r["solves"]), f"{r['wall_s']:.2f}",
        ]  # fmt: skip
        if dense:
            d = r.get("dense_ms")
            cells.append("" if d is None else f"{d:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
