"""The anytime search, for problems that do not eliminate exactly: as good a plan as the time
allows, memory constraint included, and never a plan that breaks the memory limit while one that
fits is known.

Phases (each timed in the solution's ``stats["phases_s"]``):

1. ``reduce``: forbidden, unsupported and dominated configurations out (`domains`).
2. ``safe_start`` (memory only): usage priced far above any cost, so the solve returns the plan
   of least usage among the allowed configurations; greedily repaired when it still does not fit
   (`memory_prices.repair`). The first plan that fits, kept from then on.
3. ``solve``: the problem with usage unpriced: series folding (`series`) leaves a core; min-sum
   message passing (`message_passing`) proposes plans on it, the starts given too; single-node
   moves and exact neighbourhoods (`local_search`, `neighbourhoods`) improve the best.
4. ``prices`` (memory only, while the plans overflow): Lagrangian rounds, each the same solve
   with usage priced (`memory_prices.PriceSchedule`); an overflowing plan near the limit is
   repaired and polished, so every round may give a plan that fits.
5. ``polish``: from the best plan, exact neighbourhoods and single-node moves that keep memory
   within the limit, with perturbation and restarts when they stall, until the time or the
   effort bound (``stall``) ends it.

Pure: numpy only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import time
from collections.abc import Callable, Sequence

import numpy as np

from .adjacency import adjacency
from .domains import BIG, reduce_domains
from .local_search import LocalSearch
from .memory_prices import PriceSchedule, Segments, repair
from .message_passing import MessagePassing, SequentialMessagePassing
from .neighbourhoods import Neighbourhoods
from .problem import Problem, Solution, assignment_cost
from .series import fold_series

Log = Callable[[str], None]
PlanHook = Callable[[list[int]], None]  # a plan that became the answer, original indices
EFFORT = 4  # improve_plan solves at most this many times ``stall`` neighbourhoods
REGRET_SEEDS = 256  # polish seeds a share of its neighbourhoods at the nodes losing most
MAX_PRICE_ROUNDS = 40  # Lagrangian rounds at most
STALL_ROUNDS = 8  # and none once this many in a row (probes aside) found no better plan


@dataclasses.dataclass(frozen=True)
class AnytimeOptions:
    """How the anytime search works (sizes in nodes and table entries)."""

    seed: int = 0
    region_size: int = 60  # nodes of a typical neighbourhood
    region_budget: float = 1e5  # largest table when solving one
    message_iterations: int = 30  # message passing per solve
    dominance: bool = False  # remove dominated configurations (slow on 30k nodes, rarely helps)
    price_share: float = 0.65  # of the time left, at most this much for priced rounds
    stall: int | None = None  # stop polishing after this many neighbourhoods without gain


class _Clock:
    """Time per phase."""

    def __init__(self):
        self.phases: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - t0


class _Run:
    """One search: the reduced problem, the best plans found, the clock."""

    def __init__(
        self, problem: Problem, deadline: float, options: AnytimeOptions, log: Log,
        on_plan: PlanHook | None = None,
    ):  # fmt: skip
        self.options, self.deadline, self.log = options, deadline, log
        self.on_plan = on_plan
        self.clock = _Clock()
        self.rng = random.Random(options.seed)
        with self.clock.phase("reduce"):
            self.domains = reduce_domains(problem, options.dominance)
            self.graph = adjacency(self.domains.problem)
        memory = self.domains.problem.memory
        self.segments = Segments(memory) if memory is not None else None
        self.best: np.ndarray | None = None  # best plan that fits
        self.best_cost = math.inf
        self.closest: np.ndarray | None = None  # the plan overflowing least, while none fits
        self.closest_over = math.inf
        self.last_solve_s = 0.0  # how long the latest solve took (a price round costs as much)
        self.counts = {"solves": 0, "price_rounds": 0, "repairs": 0, "restarts": 0}
        self.wins: dict[str, int] = {}  # which proposals ended best, by method
        self.lower_bound = -math.inf  # of the optimum, from TRW-S's messages

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def consider(self, x: np.ndarray, label: str) -> tuple[float, float]:
        """Keep ``x`` if it is the best plan that fits (or, while none does, the least
        overflowing); returns its cost and overflow (<= 0: fits)."""
        cost = self.graph.cost(x)
        over = self.segments.overflow(x) if self.segments is not None else -1.0
        if over <= 0 and cost < self.best_cost:
            self.best, self.best_cost = np.array(x), cost
            self.log(f"{label}: cost {cost:.10g}")
        elif over > 0 and self.best is None and over < self.closest_over:
            self.closest, self.closest_over = np.array(x), over
        else:
            return cost, over
        if self.on_plan is not None:
            self.on_plan(self.domains.to_original(x))
        return cost, over

    def solve(
        self,
        unary,
        warm: Sequence[np.ndarray],
        seconds: float,
        damping: float = 0.5,
        relief: float | None = 0.0,
        methods: tuple[str, ...] | None = None,
    ) -> np.ndarray:
        """A plan for ``unary`` (penalized or not): fold, message passing on the core (the
        method that has won so far, now and then the other), the best of its plans and the
        ``warm`` ones improved by single moves, then by neighbourhoods. ``relief``: what the
        prices in ``unary`` can add at most to a plan that fits (None: no bound from it)."""
        self.counts["solves"] += 1
        t0 = time.perf_counter()
        end = min(self.deadline, t0 + seconds)
        core = fold_series(self.graph.with_unary(unary))
        graph = core.graph
        if not graph.num_nodes:
            return core.expand([])
        nodes = list(core.nodes)
        # every proposal is a plan of the true problem too: the best that fits is kept even
        # when the penalized objective prefers another
        best = _Best(graph, self.rng, lambda xc, label: self.consider(core.expand(xc), label))
        for w in warm:
            best.offer(np.asarray(w)[nodes], "warm")
        for method in methods or self._methods():
            if method == "parallel":
                passing = MessagePassing(graph)
                stop = lambda: time.perf_counter() > self.deadline  # its iterations in full
                x, _ = passing.run(self.options.message_iterations, damping, stop=stop)
                best.offer(x, method)
            else:
                passing = _sequential(best, graph, min(end, time.perf_counter() + 0.5 * seconds))
                if relief is not None and not graph.factors:
                    self.bound(passing.lower_bound() + core.offset - relief)
        self.wins[best.source] = self.wins.get(best.source, 0) + 1
        search = best.search
        lns_end = min(end, time.perf_counter() + 4 * (time.perf_counter() - t0))
        _improve(search, Neighbourhoods(graph, search.rng, self.options.region_size),
                 lns_end, self.options.region_budget)  # fmt: skip
        return core.expand(search.x)

    def bound(self, value: float) -> None:
        """Keep the best lower bound of the optimum (over plans without forbidden
        configurations) found so far."""
        if value > self.lower_bound:
            self.lower_bound = value
            self.log(f"lower bound {value:.10g}")

    def _methods(self) -> tuple[str, ...]:
        """Which message passing proposes: both at first and every fourth solve, else the
        one whose plans won more often."""
        solves = self.counts["solves"]
        parallel, sequential = self.wins.get("parallel", 0), self.wins.get("sequential", 0)
        if solves <= 2 or solves % 4 == 0 or parallel == sequential:
            return ("parallel", "sequential")
        return ("parallel",) if parallel > sequential else ("sequential",)


class _Best:
    """The best plan offered so far on a core, after single-node moves; each proposal (not
    the warm plans) is also shown to ``consider``."""

    def __init__(self, graph, rng: random.Random, consider: Callable[[np.ndarray, str], object]):
        self.graph, self.rng, self.consider = graph, rng, consider
        self.search: LocalSearch | None = None
        self.source = ""

    def offer(self, x: np.ndarray, source: str) -> float:
        """Improve ``x`` by single moves; keep it if best. Returns its value."""
        candidate = LocalSearch(self.graph, x, seed=self.rng.randrange(1 << 30))
        candidate.icm(sweeps=20)
        if source != "warm":
            self.consider(candidate.x, source)
        if self.search is None or candidate.value < self.search.value - candidate.tolerance(
            self.search.value
        ):
            self.search, self.source = candidate, source
        return candidate.value


def _sequential(
    best: _Best, graph, end: float, patience: int = 6, most: int = 40
) -> SequentialMessagePassing:
    """TRW-S proposals until ``end``, ``most`` iterations, or ``patience`` without a better
    plan; returns the message passing (its messages give a lower bound)."""
    passing = SequentialMessagePassing(graph)
    since, record = 0, math.inf
    for k, x in enumerate(passing.run(most, stop=lambda: time.perf_counter() > end)):
        value = best.offer(x, "sequential")
        since = 0 if value < record else since + 1
        record = min(record, value)
        if since >= patience or (k >= 2 and record >= BIG):
            break  # stalled, or its plans keep forbidden pairs (A: decoding runs into them)
    return passing


def _improve(search: LocalSearch, hoods: Neighbourhoods, end: float, budget: float) -> int:
    """Exact neighbourhoods until ``end``; returns how many improved."""
    gains = 0
    while time.perf_counter() < end:
        region = hoods.draw()
        if not region:
            break
        gains += search.solve_region(region, budget) > 0
    return gains


def anytime_search(
    problem: Problem,
    deadline: float,
    starts: Sequence[Sequence[int]] = (),
    options: AnytimeOptions | None = None,
    log: Log | None = None,
    on_plan: PlanHook | None = None,
) -> Solution:
    """The best plan found by ``deadline`` (a `time.perf_counter` instant), never one that
    breaks the memory limit while one that fits is known. ``starts``: plans to start from
    (original indices). ``on_plan`` is handed each plan that becomes the answer (original
    indices), so a caller can answer even if the search is cut short. Never claims
    optimality."""
    options = options or AnytimeOptions()
    run = _Run(problem, deadline, options, log or (lambda _message: None), on_plan)
    warm = [w for w in (run.domains.from_original(s) for s in starts) if w is not None]
    warm = [np.asarray(w, dtype=np.int64) for w in warm]
    for w in warm:
        run.consider(w, "start")
    if run.segments is not None:
        with run.clock.phase("safe_start"):
            _safe_start(run)
    with run.clock.phase("solve"):
        t0 = time.perf_counter()
        x = run.solve(run.graph.unary, [*warm, *_known(run)], max(0.05, 0.15 * run.left()))
        run.last_solve_s = time.perf_counter() - t0
        run.consider(x, "solve")
    if run.segments is not None and run.best_cost > run.graph.cost(x):
        with run.clock.phase("prices"):
            _price_rounds(run, x)
    with run.clock.phase("polish"):
        _polish(run)
    return _solution(run)


def improve_plan(
    problem: Problem,
    start: Sequence[int],
    stall: int,
    seed: int = 0,
    region_size: int = 40,
    deadline: float = math.inf,
) -> Solution:
    """``start`` improved by single-node moves and exact neighbourhoods (`neighbourhoods`)
    until ``stall`` neighbourhoods in a row bring nothing, ``EFFORT`` × ``stall`` in all (or
    ``deadline``). Deterministic for
    a given ``seed`` (the effort is counted, not timed, unless the deadline hits); never worse
    than ``start``. Memory, if the problem has it, is kept within the limit by every move.
    Block descent's plans go through it (`descent.solve`)."""
    t0 = time.perf_counter()
    graph = adjacency(problem)
    segments = Segments(problem.memory) if problem.memory is not None else None
    search = LocalSearch(graph, start, memory=segments, seed=seed)
    moves = search.icm(sweeps=20)
    hoods = Neighbourhoods(graph, search.rng, region_size)
    stalled = 0
    while (
        stalled < stall and search.region_tries < EFFORT * stall and time.perf_counter() < deadline
    ):
        region = hoods.draw()
        if not region:
            break
        if search.solve_region(region) > 0:
            stalled = 0
            moves += search.icm(sorted(set(region).union(*(graph.nbrs[v] for v in region))))
        else:
            stalled += 1
    stats = {
        "method": "local search",
        "neighbourhoods": search.region_tries,
        "improving_neighbourhoods": search.region_moves,
        "moves": moves,
        "time_s": time.perf_counter() - t0,
    }
    x = [int(c) for c in search.x]
    return Solution(x, assignment_cost(problem, x), False, stats)


def _known(run: _Run) -> list[np.ndarray]:
    return [run.best] if run.best is not None else []


def _safe_start(run: _Run) -> None:
    """The plan of least usage among allowed configurations, repaired to fit if needed."""
    seg, graph = run.segments, run.graph
    costs = sum(float(np.max(np.where(u < BIG, u, 0.0))) for u in graph.unary) + 1.0
    spread = float(max((float(u.max() - u.min()) for u in seg.usage), default=0.0))
    if spread <= 0:
        run.consider(np.zeros(graph.num_nodes, np.int64), "safe start")
        return
    mu = np.full(seg.count, 1e3 * costs / spread)
    unary = seg.penalized(graph.unary, mu)
    # parallel min-sum only: any plan that fits will do here, and TRW-S costs seconds on A
    x = run.solve(unary, [], max(0.05, 0.05 * run.left()), relief=None, methods=("parallel",))
    _, over = run.consider(x, "safe start")
    if over > 0:
        search = LocalSearch(graph, x, memory=seg, seed=run.options.seed)
        run.counts["repairs"] += 1
        repair(search, deadline=time.perf_counter() + 0.3 * run.left())
        run.consider(search.x, "safe start repaired")


def _price_rounds(run: _Run, x: np.ndarray) -> None:
    """Lagrangian rounds while time is left for them: price, solve, repair near misses."""
    seg, graph = run.segments, run.graph
    end = time.perf_counter() + run.options.price_share * run.left()
    schedule = PriceSchedule(seg, _first_scale(run, x), seg.load(x))
    last, stalled = x, 0
    while time.perf_counter() < end and schedule.rounds < MAX_PRICE_ROUNDS:
        if stalled >= STALL_ROUNDS or run.left() < run.last_solve_s:
            break  # stalled, or the round would run past the deadline (a loaded machine)
        run.counts["price_rounds"] += 1
        before, probe = run.best_cost, schedule.probing
        unary = seg.penalized(graph.unary, schedule.prices())
        seconds = max(0.05, 0.1 * (end - time.perf_counter()))
        relief = float(schedule.prices() @ np.maximum(seg.limit - seg.least_load, 0.0))
        t0 = time.perf_counter()
        last = run.solve(unary, [last, x, *_known(run)], seconds, relief=relief)
        run.last_solve_s = time.perf_counter() - t0
        cost, over = run.consider(last, f"price round {schedule.rounds + 1}")
        run.log(f"price round {schedule.rounds + 1}: scale {schedule.scale:.3g} on "
                f"{int(schedule.shape.sum())} segments: cost {cost:.6g} over "
                f"{over / seg.limit:+.2%}")  # fmt: skip
        if 0 < over < 0.2 * seg.limit and cost < run.best_cost:
            _repair_and_polish(run, last, end)
        schedule.update(seg.load(last))
        if not probe:  # probes are a side trip: they neither stall the rounds nor restart them
            stalled = stalled + 1 if run.best_cost >= before else 0


def _first_scale(run: _Run, x: np.ndarray) -> float:
    """The price at which the unpriced plan ``x`` and the best fitting plan break even on
    the overflowed segments' usage (or a small one without a fitting plan)."""
    seg = run.segments
    load, over = seg.load(x), seg.load(x) > seg.limit
    cost = run.graph.cost(x)
    if run.best is None or not over.any():
        return 1e-3 * max(abs(cost), 1.0) / max(float(seg.limit), 1.0)
    saved = float((load[over] - seg.load(run.best)[over]).sum())
    gap = max(run.best_cost - cost, 1e-9 * max(abs(cost), 1.0))
    return gap / max(saved, 1e-9) / 4.0


def _repair_and_polish(run: _Run, x: np.ndarray, end: float) -> None:
    """Repair an overflowing plan greedily, then single moves that keep it fitting."""
    run.counts["repairs"] += 1
    search = LocalSearch(run.graph, x, memory=run.segments, seed=run.options.seed)
    fits = repair(search, deadline=min(end, time.perf_counter() + 0.1 * max(run.left(), 0)))
    if fits:
        search.icm(sweeps=5)
        run.consider(search.x, "repaired")
    run.log(f"repair {'fits' if fits else 'ran out of time'}: cost {run.graph.cost(search.x):.6g}")


def _polish(run: _Run) -> None:
    """Exact neighbourhoods and moves from the best plan, within memory, with restarts."""
    start = run.best if run.best is not None else run.closest
    if start is None:
        return
    if run.best is None:  # nothing fits yet: repair the closest plan first
        search = LocalSearch(run.graph, start, memory=run.segments, seed=run.options.seed)
        repair(search, deadline=run.deadline)
        run.consider(search.x, "repaired")
        start = run.best if run.best is not None else start
    search = LocalSearch(run.graph, start, memory=run.segments, seed=run.options.seed + 1)
    search.icm(sweeps=10, deadline=run.deadline)
    run.consider(search.x, "polish")
    hoods = Neighbourhoods(run.graph, search.rng, run.options.region_size)
    _iterated(run, search, hoods)
    run.consider(search.x, "polish")
    run.counts["polish_neighbourhoods"] = search.region_tries
    run.counts["polish_improving"] = search.region_moves
    run.counts["polish_refused_for_memory"] = search.region_refused


def _iterated(run: _Run, search: LocalSearch, hoods: Neighbourhoods) -> None:
    """Neighbourhoods until they stall, then a perturbation (a region at random
    configurations that fit) followed by more; a perturbed plan that ends worse is undone."""
    stall_limit = run.options.stall
    patience = 300 if stall_limit is None else stall_limit
    saved, saved_value, stalled, total_stalled = search.x.copy(), search.value, 0, 0
    expensive, draws = search.regrets(REGRET_SEEDS), 0
    while time.perf_counter() < run.deadline:
        draws += 1
        if draws % 100 == 0:
            expensive = search.regrets(REGRET_SEEDS)
        region = hoods.draw(expensive)
        if not region:
            return
        if search.solve_region(region, run.options.region_budget) > 0:
            stalled = 0
            continue
        stalled, total_stalled = stalled + 1, total_stalled + 1
        if stall_limit is not None and total_stalled >= stall_limit:
            return
        if stalled < patience:
            continue
        if search.value < saved_value - search.tolerance(saved_value):
            saved, saved_value = search.x.copy(), search.value
            run.consider(search.x, "polish")
        else:  # back to the best plan before perturbing again
            for v in np.flatnonzero(search.x != saved):
                search.set(int(v), int(saved[v]))
        _perturb(search, hoods)
        run.counts["restarts"] += 1
        stalled = 0


def _perturb(search: LocalSearch, hoods: Neighbourhoods) -> None:
    """Random configurations (that fit) on a neighbourhood, then single moves around it."""
    region = hoods.draw()[:12]
    for v in region:
        c = search.rng.randrange(len(search.unary[v]))
        if search.memory is None or search.memory.fits(v, int(search.x[v]), c):
            search.set(v, c)
    around = set(region).union(*(search.graph.nbrs[v] for v in region))
    search.icm(sorted(around), sweeps=5)


def _solution(run: _Run) -> Solution:
    """The answer in the original indices, with its statistics."""
    x = run.best if run.best is not None else run.closest
    if x is None:
        x = np.zeros(run.graph.num_nodes, np.int64)
    assignment = run.domains.to_original(x)
    stats = {
        "method": "anytime",
        "fits_memory": run.best is not None or run.segments is None,
        "objective": run.graph.cost(x),
        "phases_s": dict(run.clock.phases),
        **run.counts,
        "best_proposals": dict(run.wins),
        "lower_bound": run.lower_bound if math.isfinite(run.lower_bound) else None,
        "reduction": run.domains.stats,
    }
    return Solution(assignment, stats["objective"], False, stats)
