"""The memory budget in the search: the fastest plan found whose predicted peak fits.

The search minimizes time; memory is a constraint. `fit_budget` keeps the dynamic program by
pricing memory into it (docs/design.md, "Memory budget"):

1. If the searched plan's peak (`memory.MemoryModel.estimate`, exact liveness) fits, it stands,
   certificate and all.
2. Otherwise solve the Lagrangian problem ``time + λ · bytes`` (``bytes``: the linear proxy
   `MemoryModel.node_bytes`, added to every node's unary table) for growing λ until a solution
   fits (or until two growth steps lower the peak by less than 1 %: nothing will fit), then
   bisect λ between the last that did not fit and the first that did.
3. Every plan seen — the solutions along λ and the hand plans (`baselines`) — is priced
   exactly (time by `evaluate`, memory by liveness), and the fastest that fits is returned.

The plan is then *not certified*: Lagrangian relaxation bounds the constrained optimum only
under the linear proxy, and the exact peak is not linear. `Choice.optimal` is False and the
report says the budget bound the plan. When nothing fits, `MemoryBudgetError` says the smallest
peak found, its biggest parts and what would help.

Pure: numpy only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from .choose import Choice
from .evaluate import EvalContext, Evaluation, evaluate
from .memory import MemoryBudgetError, MemoryEstimate, MemoryModel, gb
from .options import PlannerOptions
from .search import Problem, solve

GROWTH = 8.0  # λ grows by this factor until a solution fits
BISECTIONS = 4  # then this many geometric bisection steps
MAX_GROWTH_STEPS = 14
STALL_STEPS = 2  # stop growing λ after this many steps that lower the peak by < 1 %


@dataclasses.dataclass(frozen=True)
class BudgetFit:
    """How the budget was met."""

    estimate: MemoryEstimate
    bound: bool  # the budget changed the plan (the fastest plan found did not fit)
    multiplier: float | None  # the λ of the chosen solution (None: not a Lagrangian solution)
    solves: int  # Lagrangian problems solved


def fit_budget(
    ctx: EvalContext,
    options: PlannerOptions,
    model: MemoryModel,
    budget: float | None,
    choice: Choice,
    tick: Callable[[str], None] | None = None,
) -> tuple[Choice, BudgetFit]:
    """``choice`` if its peak fits ``budget``; else the fastest plan found that fits."""
    tick = tick or (lambda _detail: None)
    first = model.estimate(choice.assignment, budget)
    if budget is None or first.fits or choice.strategy not in ("auto", "hypar"):
        return choice, BudgetFit(first, False, None, 0)
    seen: dict[tuple[int, ...], tuple[Evaluation, MemoryEstimate, float | None]] = {}

    def consider(a, lam: float | None) -> MemoryEstimate:
        a = tuple(int(x) for x in a)
        if a not in seen:
            seen[a] = (evaluate(ctx, a), model.estimate(a, budget), lam)
        return seen[a][1]

    consider(choice.assignment, None)
    for a, _ in choice.baselines.values():
        consider(a, None)
    for run in choice.runs.values():
        consider(run.assignment, None)
    base, tying = ctx.tables.problem, choice.tying
    proxy = [model.node_bytes(v) for v in range(base.num_nodes)]
    if tying is not None:  # search the tied space, as `choose` did
        base = tying.reduce(base)
        proxy = [sum(proxy[v] for v in c) for c in tying.classes]
    solves = 0
    peaks: list[float] = []  # peak of each λ's solution

    def solve_at(lam: float) -> bool:
        nonlocal solves
        solves += 1
        problem = Problem(
            unary=[u + lam * b for u, b in zip(base.unary, proxy, strict=True)],
            edges=base.edges,
            blocks=base.blocks,
            factors=base.factors,
        )
        fitting = sorted((v[0].objective, a) for a, v in seen.items() if v[1].fits)
        starts = [a for _, a in fitting[:1]] + [choice.assignment]
        if tying is not None:
            starts = [tying.restrict(a) for a in starts]
        sol = solve(problem, starts=starts, budget=options.budget)
        found = tying.expand(sol.assignment) if tying is not None else sol.assignment
        estimate = consider(found, lam)
        peaks.append(estimate.peak)
        ok = bool(estimate.fits)
        tick(f"memory budget: λ={lam:.3g}, {'fits' if ok else 'over budget'}")
        return ok

    scale = choice.evaluation.objective / max(first.peak, 1.0)
    lo, hi, lam = 0.0, None, scale
    for _ in range(MAX_GROWTH_STEPS):
        if solve_at(lam):
            hi = lam
            break
        lo, lam = lam, lam * GROWTH
        if len(peaks) >= STALL_STEPS + 1 and min(peaks[-STALL_STEPS:]) >= 0.99 * min(
            peaks[:-STALL_STEPS]
        ):
            break  # a larger λ no longer lowers the peak: nothing will fit
    if hi is not None:
        for _ in range(BISECTIONS):
            mid = math.sqrt(lo * hi) if lo > 0 else hi / GROWTH
            if solve_at(mid):
                hi = mid
            else:
                lo = mid
    fitting = [(v[0].objective, a) for a, v in seen.items() if v[1].fits]
    if not fitting:
        raise MemoryBudgetError(_no_fit_message(seen, budget, model))
    _, best = min(fitting)
    evaluation, estimate, lam = seen[best]
    chosen = dataclasses.replace(choice, assignment=best, evaluation=evaluation, optimal=False)
    return chosen, BudgetFit(estimate, True, lam, solves)


def _no_fit_message(seen, budget: float, model: MemoryModel) -> str:
    """The smallest peak reached, its biggest parts, and what would help."""
    smallest = min((v[1] for v in seen.values()), key=lambda e: e.peak)
    parts = [
        ("parameters", smallest.params),
        ("optimizer state", smallest.optimizer),
        ("activations", smallest.activations),
        ("gradients", smallest.gradients),
        ("temporaries", smallest.temporaries),
        ("outputs", smallest.outputs),
        ("batch", smallest.batch),
    ]
    top = ", ".join(f"{name} {gb(v)}" for name, v in sorted(parts, key=lambda p: -p[1])[:3])
    devices = math.prod(model.inp.sizes)
    return (
        f"no plan fits the memory budget of {gb(budget)} per device on {devices} devices: the "
        f"smallest peak the planner reached is {gb(smallest.peak)} per device (largest parts: "
        f"{top}). To fit: use more devices, rematerialize blocks (jax.checkpoint / nn.remat), "
        "lower the per-device batch, or keep parameters and optimizer state in bfloat16"
    )
