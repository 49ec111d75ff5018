"""The memory budget in the search: the fastest plan found whose predicted peak fits.

The search minimizes time; memory is a constraint. `fit_budget` keeps the dynamic program by
pricing memory into it (docs/memory.md, "Memory budget"):

1. If the searched plan fits (`MemoryEstimate.fits`: its exact liveness peak is at most the
   budget less its margin, `memory_estimate.MODEL_MARGIN` or on CPU meshes
   `memory_estimate.CPU_MODEL_MARGIN`, kept for the model's error), it stands, certificate and all.
2. Otherwise solve the Lagrangian problem ``time + λ · bytes`` on the same tables. ``bytes``
   is a linear proxy added to every node's unary table: `held.HeldBytes.node_bytes` (arguments,
   buffers read in a later phase or through a loop) plus the tensors live at the peak of the
   searched plan and of every over-budget solution (constraint generation: a peak the proxy
   missed is priced from then on, and the same λ is retried when that makes the proxy see the
   excess). The first λ is where the fastest fitting plan seen (a hand plan) breaks even with
   the searched plan under the proxy. λ grows ×8 until a solution fits (or until two growth
   steps lower the peak by less than 1 %: nothing will fit). Then, at most 4 steps: the λ where
   the bracket's over-budget and fitting solutions tie under the proxy (`_tie`: a plan of the
   Lagrangian hull between them wins there), descending from both; once such a step returns
   one of the two, geometric bisection while the bracket's λs are more than 3× apart; stopping
   early once the over-budget solution at the low end is within 1 % of the fastest fitting
   plan's time. Each other solve is block descent from the best of the latest solution, the
   fastest fitting plan and the searched plan (warm starts),
   one start and at most 3 rounds. Descent keeps to the basin it starts in, and at large λ the
   best start is a fitting plan, where it stays; so each growth, bisection and tie step also
   descends one round from the searched plan (unless its own descent started there), and that
   plan is a candidate too (it finds the
   plans between: the small GPT at 0.7 × its free peak 1.604 -> 1.322 ms). Then one more
   solve at the smallest λ that fit, with the
   search's own rounds from the two best of those starts and from every hand plan that fits
   (llama3_70b unrolled over 1,024 H100s: 2.61 s per step at 18 GB, where the two starts
   alone end at 3.16 s and 25 GB). It does not re-cut the mesh axes (`kcut.recut_and_descend`):
   that gives this case 2.43 s at 20 GB, but puts scanned llama3_70b over 64 H100s at 2.2x the
   planning time without the budget (docs/memory.md). Under ``objective="overlap"`` two
   more solves, at 4 and 64 × that λ (`OVERLAP_PROBES`): the hull's plans past it hold
   less memory and more communication, which the overlapped step may hide while Eq. 1 charges
   it (scanned llama3_8b over 64 H100s at 0.8 × its free peak: 218.6 -> 202.3 ms, the plan at
   4 ×; scanned llama3_70b at 0.25: 2,393 -> 2,330 ms, at 64 ×).
3. Every plan seen — the solutions along λ and the hand plans (`baselines`), with the
   evaluations `choose` already made — is priced exactly (time by `evaluate`, memory by
   liveness, estimated lazily in order of time; not at all for a plan whose arguments alone
   pass the budget), and the fastest that fits is returned. A hand plan is evaluated only
   when that order reaches its floor (`plan_floor`) and its arguments may fit.

The plan is then *not certified*: Lagrangian relaxation bounds the constrained optimum only
under the linear proxy, and the exact peak is not linear. `Choice.optimal` is False and the
report says the budget bound the plan. When nothing fits, `MemoryBudgetError` says the smallest
peak found, its biggest parts and what would help.

Pure: numpy only.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
from collections.abc import Callable

from ..cost.evaluation import EvalContext, Evaluation, evaluate
from ..memory.estimate import MemoryBudgetError, MemoryEstimate, gb
from ..memory.held_bytes import HeldBytes
from ..memory.model import MemoryModel
from ..solver.descent import solve
from ..solver.problem import Problem, assignment_cost
from .candidates import Choice, plan_floor
from .options import PlannerOptions

GROWTH = 8.0  # λ grows by this factor until a solution fits
BISECTIONS = 4  # then at most this many geometric bisection steps
MAX_SOLVES = 14  # Lagrangian solves in all
STALL_STEPS = 2  # stop growing λ after this many steps that lower the peak by < 1 %
TIME_GAIN = 0.01  # stop bisecting once the bracket's plans are within this of each other
RESOLUTION = 3.0  # or once the bracket's λs are within this factor
# under "overlap": λs past the smallest that fit, × these (`fit_budget`)
OVERLAP_PROBES = (4.0, 64.0)


@dataclasses.dataclass(frozen=True)
class BudgetFit:
    """How the budget was met."""

    estimate: MemoryEstimate
    bound: bool  # the budget changed the plan (the fastest plan found did not fit)
    multiplier: float | None  # the λ of the chosen solution (None: not a Lagrangian solution)
    solves: int  # Lagrangian problems solved


class _Proxy:
    """The per-node bytes priced by λ: `HeldBytes.node_bytes`, plus the tensors live at the
    peaks seen so far (constraint generation: a peak the proxy missed is priced next time)."""

    def __init__(self, model: MemoryModel, n: int):
        self.model, self.held, self.extra = model, HeldBytes(model), frozenset()
        self.nodes = [self.held.node_bytes(v) for v in range(n)]

    def total(self, a) -> float:
        return sum(float(b[x]) for b, x in zip(self.nodes, a, strict=True))

    def add(self, tensors: frozenset[int]) -> bool:
        """Price ``tensors`` too; whether any node's proxy changed."""
        new = tensors - self.extra
        if not new:
            return False
        self.extra = self.extra | new
        owners = {
            self.model.inp.ng.node_of_tensor[t]
            for t in new
            if t in self.model.inp.ng.node_of_tensor
        }
        changed = False
        for v in owners:
            b = self.held.node_bytes(v, self.extra)
            changed = changed or not (b == self.nodes[v]).all()
            self.nodes[v] = b
        return changed


class _Seen:
    """Every plan seen: its evaluation (given or by `evaluate`), its memory estimate (computed
    when first needed: a hand plan slower than a fitting plan is never estimated) and the λ
    that found it. A hand plan is ``pending`` (not evaluated) until `best_fit` needs its time:
    when its `choose.plan_floor` comes before every faster fitting plan, and its arguments
    alone do not pass the budget."""

    def __init__(self, ctx: EvalContext, model: MemoryModel, budget: float):
        self.ctx, self.model, self.budget = ctx, model, budget
        self.evaluations: dict[tuple[int, ...], Evaluation] = {}
        self.estimates: dict[tuple[int, ...], MemoryEstimate] = {}
        self.peaks: dict[tuple[int, ...], frozenset[int]] = {}  # tensors live at the peak
        self.lam: dict[tuple[int, ...], float | None] = {}
        self.order: dict[tuple[int, ...], int] = {}  # when first seen: ties go to the earlier
        # hand plans not evaluated yet: their floor, and how to evaluate them
        self.pending: dict[tuple[int, ...], tuple[float, Callable[[], Evaluation]]] = {}

    def add(self, a, lam: float | None = None, evaluation: Evaluation | None = None):
        a = tuple(int(x) for x in a)
        if a in self.pending:
            _, evaluated = self.pending.pop(a)
            evaluation = evaluation or evaluated()
        if a not in self.evaluations:
            self.evaluations[a] = evaluation or evaluate(self.ctx, a)
            self.lam.setdefault(a, lam)
            self.order.setdefault(a, len(self.order))
        return a

    def add_later(self, a, evaluated: Callable[[], Evaluation]) -> None:
        """A hand plan, evaluated (``evaluated()``) only when `best_fit` needs its time."""
        a = tuple(int(x) for x in a)
        floor = plan_floor(self.ctx, a)
        if floor is None:
            self.add(a, None, evaluated())
        elif a not in self.evaluations and a not in self.pending:
            self.pending[a] = (floor, evaluated)
            self.lam[a] = None
            self.order[a] = len(self.order)

    def estimate(self, a: tuple[int, ...]) -> MemoryEstimate:
        if a not in self.estimates:
            self.estimates[a], self.peaks[a] = self.model.estimate_with_peak(a, self.budget)
        return self.estimates[a]

    def fits(self, a: tuple[int, ...]) -> bool:
        """``estimate(a).fits``, without the walk when the arguments alone pass the budget
        (`MemoryModel.arguments_exceed`: replicated state on a large model)."""
        if a not in self.estimates and self.model.arguments_exceed(a, self.budget):
            return False
        return bool(self.estimate(a).fits)

    def searched(self, a: tuple[int, ...]) -> float:
        """What the Lagrangian problems price of ``a`` besides λ · bytes: the search's own
        objective (Eq. 1 under "overlap", whose step the plan is then chosen by)."""
        ev = self.evaluations[a]
        return ev.cost.step_s if self.ctx.params.objective == "overlap" else ev.objective

    def best_fit(self) -> tuple[int, ...] | None:
        """The fastest plan seen that fits (estimating in order of time until one fits). A
        pending hand plan comes in at its floor, and is evaluated there unless it cannot fit."""
        queue = [(ev.objective, self.order[a], a) for a, ev in self.evaluations.items()]
        queue += [(floor, self.order[a], a) for a, (floor, _) in self.pending.items()]
        heapq.heapify(queue)
        while queue:
            _, k, a = heapq.heappop(queue)
            if a in self.pending:
                if self.model.arguments_exceed(a, self.budget):
                    continue  # it never fits: its time is not needed
                self.add(a)
                heapq.heappush(queue, (self.evaluations[a].objective, k, a))
            elif self.fits(a):
                return a
        return None

    def smallest(self) -> MemoryEstimate:
        seen = [*self.evaluations, *self.pending]
        return min((self.estimate(a) for a in seen), key=lambda e: e.peak)


def fit_budget(
    ctx: EvalContext,
    options: PlannerOptions,
    model: MemoryModel,
    budget: float | None,
    choice: Choice,
    tick: Callable[[str], None] | None = None,
) -> tuple[Choice, BudgetFit]:
    """``choice`` if its peak fits ``budget``; else the fastest plan found that fits."""
    first, first_peak = model.estimate_with_peak(choice.assignment, budget)
    if budget is None or first.fits or choice.strategy not in ("auto", "hypar"):
        return choice, BudgetFit(first, False, None, 0)
    search = _MultiplierSearch(ctx, options, model, budget, choice, tick)
    search.start(first, first_peak)
    hi = search.bracket()
    if hi is not None:
        search.polish(hi)
    best = search.seen.best_fit()
    if best is None:
        raise MemoryBudgetError(_no_fit_message(search.seen.smallest(), budget, model))
    evaluation, estimate = search.seen.evaluations[best], search.seen.estimate(best)
    chosen = dataclasses.replace(choice, assignment=best, evaluation=evaluation, optimal=False)
    return chosen, BudgetFit(estimate, True, search.seen.lam[best], search.solves)


class _MultiplierSearch:
    """The Lagrangian search for the budget: the problem with λ · bytes held (`_Proxy`) added
    to each node's cost, solved at growing λ until a solution fits, then bisected between the
    largest λ over and the smallest that fits; every solution seen is a candidate (`_Seen`)."""

    def __init__(self, ctx, options, model, budget, choice: Choice, tick) -> None:
        self.ctx, self.options, self.choice = ctx, options, choice
        self.tick = tick or (lambda _detail: None)
        self.seen = _Seen(ctx, model, budget)
        self.base, self.tying = ctx.tables.problem, choice.tying
        if self.tying is not None:  # search the tied space, as `choose` did
            self.base = self.tying.reduce(self.base, choice.tied_tables)
        self.proxy = _Proxy(model, ctx.tables.problem.num_nodes)
        # descent from the best start only: the starts are the latest λ's solution and the
        # fastest plan that fits, already near the optimum of the next λ; the last solve (at
        # the smallest λ that fit) runs the search's own rounds from two starts, since a short
        # descent snaps to its start (a third start cost 40 % of the budget's solve time and
        # changed no plan measured)
        self.search_budget = dataclasses.replace(options.budget, max_starts=1, max_rounds=3)
        self.both_ends = dataclasses.replace(self.search_budget, max_starts=2)
        self.one_round = dataclasses.replace(self.search_budget, max_starts=1, max_rounds=1)
        self.solves = 0
        self.last: list[tuple[int, ...]] = []  # the latest solution (a warm start for the next)
        self.solved: dict[tuple, dict] = {}  # (λ, priced tensors) -> block solutions

    def start(self, first: MemoryEstimate, first_peak: frozenset[int]) -> None:
        """Every plan the search stage found, and the hand plans (evaluated when needed)."""
        seen, choice = self.seen, self.choice
        self.free = seen.add(choice.assignment, None, choice.evaluation)
        seen.estimates[self.free], seen.peaks[self.free] = first, first_peak
        for name, a in choice.baselines.assignments.items():
            seen.add_later(a, functools.partial(choice.baselines.evaluation, name))
        for run in choice.runs.values():
            seen.add(run.assignment, None, run.evaluation)
        self.proxy.add(first_peak)

    def lagrangian(self, lam: float) -> Problem:
        """The search problem with λ · the bytes each node holds added to its cost."""
        node_bytes = self.proxy.nodes
        if self.tying is not None:
            node_bytes = [sum(node_bytes[v] for v in c) for c in self.tying.classes]
        base = self.base
        return Problem(
            unary=[u + lam * b for u, b in zip(base.unary, node_bytes, strict=True)],
            edges=base.edges,
            blocks=base.blocks,
            factors=base.factors,
        )

    def expand(self, x) -> tuple[int, ...]:
        return self.tying.expand(x) if self.tying is not None else x

    def solve_at(
        self, lam: float, search_budget=None, more=(), from_free: bool = True
    ) -> tuple[int, ...]:
        """The solution at ``lam`` from ``more`` and the warm starts; ``from_free``: also one
        round from the searched plan, unless the solve started there."""
        search_budget = search_budget or self.search_budget
        seen, tying = self.seen, self.tying
        self.solves += 1
        problem = self.lagrangian(lam)
        starts = [a for a in (*more, seen.best_fit(), *self.last, self.free) if a is not None]
        if tying is not None:
            starts = [tying.restrict(a) for a in starts]
        memo = self.solved.setdefault((lam, self.proxy.extra), {})
        # block descent alone: the λ search is tuned to its solutions (with the local search
        # after it the small GPT's budgeted plan moved 1.122 -> 1.076 or 1.236 ms by its effort)
        sol = solve(problem, starts=starts, budget=search_budget, solved=memo, local_search=False)
        found = seen.add(self.expand(sol.assignment), lam)
        self.last[:] = [found]
        # descent keeps to the basin it starts in: from a fitting plan it stays there, from the
        # searched plan (``starts[-1]``) it finds plans between (faster, fitting, though the
        # Lagrangian may prefer the other), so one round from there gives a candidate too
        if from_free and starts[-1] not in _best(problem, starts, search_budget):
            y = solve(
                problem, starts=starts[-1:], budget=self.one_round, solved=memo, local_search=False
            ).assignment
            seen.add(self.expand(y), lam)
        estimate = seen.estimate(found)
        self.tick(
            f"memory budget: λ={lam:.3g}, peak {gb(estimate.peak)}, objective "
            f"{seen.evaluations[found].objective:.4g}, {'fits' if estimate.fits else 'over'}"
        )
        return found

    def bracket(self) -> float | None:
        """Grow λ until a solution fits, then bisect; the smallest λ that fit (None: none)."""
        seen, proxy = self.seen, self.proxy
        lam = _first_multiplier(seen, self.free, proxy)
        lo, hi = 0.0, None  # the largest λ whose solution is over, the smallest whose fits
        at_lo, at_hi = self.free, None  # their solutions
        t_lo = self.choice.evaluation.objective  # objective of the solution at lo
        peaks: list[float] = []  # peak of each growth step's solution
        bisections, tie = 0, True
        step_budget, step_starts = self.search_budget, ()  # how the next λ is solved
        while self.solves < MAX_SOLVES:
            ends = (at_lo, at_hi)
            found = self.solve_at(lam, step_budget, step_starts)
            estimate = seen.estimate(found)
            if bisections and found in ends:  # no plan of the hull between the bracket's two,
                tie = False  # or descent missed it: the λs between are bisected to RESOLUTION
            if estimate.fits:
                hi, at_hi = lam, found
            else:
                if self.proxy_grew(found, estimate) and hi is None:
                    continue
                lo, at_lo, t_lo = lam, found, seen.evaluations[found].objective
            if hi is None:
                peaks.append(estimate.peak)
                if _stalled(peaks):
                    break  # a larger λ no longer lowers the peak: nothing will fit
                lam *= GROWTH
                continue
            fit = seen.best_fit()
            if (
                bisections >= BISECTIONS
                or (not tie and lo > 0 and hi <= lo * RESOLUTION)
                or (fit and t_lo >= seen.evaluations[fit].objective * (1 - TIME_GAIN))
            ):
                break  # λ is bracketed, or the bracket's plans are within TIME_GAIN
            bisections += 1
            tied = _tie(seen, proxy, at_lo, at_hi, lo, hi) if tie else lam
            tie = tie and abs(tied - lam) > 1e-3 * lam  # the same λ again: its answer is known
            if tie:  # descent from both ends: the plans between tie with them there
                lam = tied
                step_budget, step_starts = self.both_ends, (at_lo, at_hi)
            else:
                lam = math.sqrt(lo * hi) if lo > 0 else hi / GROWTH
                step_budget, step_starts = self.search_budget, ()
        return hi

    def proxy_grew(self, found: tuple[int, ...], estimate: MemoryEstimate) -> bool:
        """Price what is live at ``found``'s peak too; whether that made the proxy see the
        excess (then the same λ is solved again)."""
        before = self.proxy.total(found)
        return (
            self.proxy.add(self.seen.peaks[found])
            and self.proxy.total(found) - before >= estimate.peak - estimate.limit
        )

    def polish(self, hi: float) -> None:
        """The smallest λ that fit: the search's rounds from two starts and from every hand
        plan that fits; under "overlap", a few larger λs too."""
        hand = self.choice.baselines.assignments.values()
        fitting = [tuple(a) for a in hand if self.seen.fits(tuple(a))]
        polish = dataclasses.replace(self.options.budget, max_starts=2 + len(fitting))
        self.solve_at(hi, polish, fitting, from_free=False)
        if self.ctx.params.objective == "overlap":
            # the hull's plans past it hold less memory and more communication, which the
            # overlapped step may hide: Eq. 1 ranks them lower, the overlapped step need not
            for factor in OVERLAP_PROBES:
                self.solve_at(hi * factor, from_free=False)


def _stalled(peaks: list[float]) -> bool:
    """Whether the last `STALL_STEPS` growth steps lowered the peak by less than 1 %."""
    return len(peaks) > STALL_STEPS and min(peaks[-STALL_STEPS:]) >= 0.99 * min(
        peaks[:-STALL_STEPS]
    )


def _best(problem: Problem, starts: list, budget) -> list:
    """The starts `search.solve` descends from: the ``budget.max_starts`` best."""
    return sorted(starts, key=lambda a: assignment_cost(problem, a))[: budget.max_starts]


def _tie(
    seen: _Seen, proxy: _Proxy, over: tuple[int, ...], fits: tuple[int, ...], lo: float, hi: float
) -> float:
    """The next λ inside (lo, hi): where the bracket's two solutions tie under the proxy,
    ``Δtime / Δbytes`` (a plan of the hull between them wins there, and no other λ finds it
    with fewer solves); the geometric mean when that is outside the bracket."""
    slower = seen.searched(fits) - seen.searched(over)
    saved = proxy.total(over) - proxy.total(fits)
    if slower > 0 and saved > 0 and lo < slower / saved < hi:
        return slower / saved
    return math.sqrt(lo * hi) if lo > 0 else hi / GROWTH


def _first_multiplier(seen: _Seen, free: tuple[int, ...], proxy: _Proxy) -> float:
    """The first λ: where the fastest fitting plan seen (a hand plan, say) breaks even with the
    searched plan under the proxy, ``Δtime / Δbytes``; with none, time per byte of the peak."""
    t0 = seen.searched(free)
    fit = seen.best_fit()
    if fit is not None:
        saved = proxy.total(free) - proxy.total(fit)
        slower = seen.searched(fit) - t0
        if saved > 0 and slower > 0:
            return slower / saved
    return t0 / max(seen.estimate(free).peak, 1.0)


def _no_fit_message(smallest: MemoryEstimate, budget: float, model: MemoryModel) -> str:
    """The smallest peak reached, its biggest parts, and what would help."""
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
        f"{top}), and a plan's predicted peak must be at most {gb(smallest.limit)} "
        f"({smallest.margin:.0%} of the budget is kept for the memory model's error). To fit: "
        "use more devices, rematerialize blocks (jax.checkpoint / nn.remat), "
        "lower the per-device batch, or keep parameters and optimizer state in bfloat16"
    )
