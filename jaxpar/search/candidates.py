"""The search stage: run the searches on the cost tables, certify, and choose the plan.

Searches (`PlannerOptions.searches`): SoyBean's k-cut (`kcut.kcut`) and joint elimination
(`search.solve`, which falls back to block descent from the baselines and k-cut's plan when the
step is too wide). Both minimize ``tables.problem`` (a reshard per read); the reported cost
(`evaluate`) produces a reshard shared by several readers once, so it can be lower.

The certificate (docs/search.md, "The optimality certificate"): when elimination is exact, the
``tables.bound`` problem (a read pays 1/k of its reshard, k = reads of the tensor; a lower bound
of the reported cost of *every* assignment) is solved exactly too. Its minimizer is one more
candidate, and a plan is ``optimal`` exactly when its reported cost reaches that lower bound, so
``optimal=True`` holds for the cost the user is shown. Strategies "data", "model", "owt" are
fixed rules and never claim optimality.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

from ..cost.evaluation import EvalContext, Evaluation, evaluate
from ..cost.search_tables import (
    ReshardTables,
    add_read,
    combined_sync_problem,
    node_tables,
    pairwise_bound,
    pairwise_graph,
)  # fmt: skip
from ..nodes.configs import Config, node_configs
from ..nodes.repeated_blocks import MIN_TIED_NODES, ReducedTables, Tying, find_repeats
from ..solver.descent import solve
from ..solver.elimination import eliminates, graph_eliminates, solve_exact
from ..solver.kcut import cut_order, kcut, project, recut_and_descend, restrict
from ..solver.problem import Problem, SearchBudget, Solution, assignment_cost
from .baselines import BASELINES, baseline_assignment, hypar_space
from .lower_bounds import overlap_bound, search_bound, streams_problems
from .options import PlannerOptions

Tick = Callable[[str], None]
# after block descent: at most this many alternations of re-cutting the mesh axes (`kcut.recut`)
# and descent again
RECUT_ROUNDS = 4
# each LP dual of an uncertified search (`lower_bounds`) stops after this long, or after 3x as
# long as the search took if that is longer: a guard only (their work is counted,
# `lower_bounds.BOUND_WORK`, so plans stay deterministic)
BOUND_SECONDS = 20.0


@dataclasses.dataclass(frozen=True)
class SearchRun:
    """One search's result, priced by `evaluate`."""

    name: str  # "elimination" or "kcut"
    assignment: tuple[int, ...]
    evaluation: Evaluation
    exact: bool  # the search solved its problem exactly
    certified: bool  # its reported cost reaches the exact lower bound
    time_s: float
    stats: dict  # search statistics (method, rounds, cuts, ...)


class Baselines(Mapping[str, tuple[tuple[int, ...], Evaluation]]):
    """The hand plans (`BASELINES`): name -> (assignment, evaluation), each evaluated when
    first read. `choose` reads only those whose `plan_floor` leaves them a chance to beat
    the search; a report or a memory budget reads them all. It keeps every evaluation
    `choose` makes (`evaluated`): a search's plan is often a hand plan."""

    def __init__(
        self,
        assignments: dict[str, tuple[int, ...]],
        ctx: EvalContext,
        evaluations: dict[tuple[int, ...], Evaluation] | None = None,
    ):
        self.assignments = assignments
        self._ctx = ctx
        self._evaluations = {} if evaluations is None else evaluations

    def evaluated(self, a: Sequence[int]) -> Evaluation:
        """`evaluate` of any assignment of these tables, once."""
        key = tuple(a)
        if key not in self._evaluations:
            self._evaluations[key] = evaluate(self._ctx, key)
        return self._evaluations[key]

    def evaluation(self, name: str) -> Evaluation:
        return self.evaluated(self.assignments[name])

    def __getitem__(self, name: str) -> tuple[tuple[int, ...], Evaluation]:
        return self.assignments[name], self.evaluation(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.assignments)

    def __len__(self) -> int:
        return len(self.assignments)

    def for_plan(self) -> Baselines:
        """These hand plans without the search's `EvalContext.memo` (12 MB on unrolled
        llama3_8b), to keep with the plan: one read later builds a memo of its own."""
        ctx = dataclasses.replace(self._ctx, memo={})
        return Baselines(self.assignments, ctx, self._evaluations)


def plan_floor(ctx: EvalContext, assignment: Sequence[int]) -> float | None:
    """A lower bound of ``assignment``'s objective without evaluating it. Under "time" the
    cost of ``tables.bound`` (Eq. 1, or below it where tables fell back); under "overlap"
    max(C, X): the compute stream runs every node's t_C (C = Σ_v t_C), the communication
    stream at least X (`lower_bounds.streams_problems`); under "comm" (bytes) None."""
    objective = ctx.params.objective
    if objective == "comm":
        return None
    if objective == "time":
        return assignment_cost(ctx.tables.bound, list(assignment))
    compute = sum(float(comp[a]) for comp, a in zip(ctx.tables.compute, assignment, strict=True))
    _, comm = plan_streams(ctx)
    return max(compute, assignment_cost(comm, list(assignment)))


def plan_streams(ctx: EvalContext) -> tuple[list, Problem]:
    """`lower_bounds.streams_problems` of ``ctx``'s tables over every node, built once (kept
    in ``ctx.memo``)."""
    if "streams" not in ctx.memo:
        ctx.memo["streams"] = streams_problems(ctx, ctx.tables.bound)
    return ctx.memo["streams"]


def cheapest(
    candidates: Sequence[Sequence[int]],
    priced: Callable[[Sequence[int]], Evaluation],
    floor: Callable[[Sequence[int]], float | None],
) -> tuple[tuple[int, ...], Evaluation]:
    """The first candidate of least objective; a candidate whose ``floor`` is already above
    the best one evaluated (by a relative 1e-12) cannot be it and is not evaluated."""
    best: tuple[tuple[int, ...], Evaluation] | None = None
    for a in candidates:
        if best is not None:
            low = floor(a)
            if low is not None and low >= best[1].objective * (1 + 1e-12):
                continue
        ev = priced(a)
        if best is None or ev.objective < best[1].objective:
            best = (tuple(a), ev)
    if best is None:
        raise ValueError("no candidate plan to choose from")
    return best


@dataclasses.dataclass(frozen=True)
class Choice:
    """Stage result: the chosen assignment, its evaluation and certificate, the alternatives."""

    strategy: str
    assignment: tuple[int, ...]
    evaluation: Evaluation
    optimal: bool  # certified: reported objective == exact lower bound (within 1e-9)
    # a proven lower bound of every plan's reported cost (over the searched space: see
    # ``bound_method``), when one was found: an exact minimum or an LP dual bound
    lower_bound: float | None
    runs: dict[str, SearchRun]  # every search that ran
    baselines: Baselines  # the hand plans, evaluated when read
    fell_back_to: str | None  # a baseline that beat the search under the reported cost
    tying: Tying | None = None  # repeated layers searched as one (`optimal` is within that space)
    # objective "overlap": the exact lower bound of OptCNN Eq. 1 the searches found (their
    # certificate; `lower_bound` is then `overlap_lower_bound`). The chosen plan's overlapped step
    # is at most the Eq. 1 plan's, which is at most that plan's Eq. 1 step.
    step_lower_bound: float | None = None
    # with a tying: the tied problem's tables (`Tying.reduce_tables` of ``tables.problem``)
    tied_tables: ReducedTables | None = None
    # how ``lower_bound`` was proved: "elimination" (an exact minimum), "dual" (the LP dual of
    # the search's bound problem, `lower_bounds`), "compute stream" (Σ min t_C, "overlap"),
    # "streams" (max of the compute and communication streams, "overlap"); None: no bound.
    # Only "compute stream" speaks of every plan; the others of the searched space (tied
    # layers, HyPar's)
    bound_method: str | None = None


def reaches(value: float, lower_bound: float | None) -> bool:
    """Whether a reported objective meets the lower bound (relative tolerance 1e-9)."""
    return lower_bound is not None and value <= lower_bound * (1 + 1e-9) + 1e-300


def choose(
    ctx: EvalContext,
    options: PlannerOptions,
    sizes: Sequence[int],
    tick: Tick | None = None,
) -> Choice:
    """Baselines always; the searches for "auto" / "hypar"; the best plan, certified or not."""
    tick = tick or (lambda _detail: None)
    ng, tables = ctx.ng, ctx.tables
    after_all = len(ng.program.eqns)
    state = frozenset(u.dst for u in tables.uses if u.order[0] >= after_all)  # state inputs
    base = {
        s: tuple(
            baseline_assignment(s, ng, list(tables.configs), ctx.batch, ctx.labels, sizes, state)
        )
        for s in BASELINES
    }
    baselines = Baselines(base, ctx)
    priced = baselines.evaluated  # searches often return a hand plan
    if options.strategy not in ("auto", "hypar"):
        a = base[options.strategy]
        return Choice(options.strategy, a, priced(a), False, None, {}, baselines, None)
    space = None  # per node, the configuration indices the strategy may use
    tying = None
    if options.strategy == "hypar":
        space = hypar_space(ng, list(tables.configs), ctx.batch, base["data"])
    elif options.share_blocks is not False:
        least = MIN_TIED_NODES if options.share_blocks is None else 0
        tying = find_repeats(ng, tables.configs, ctx.labels, least)
    # the tied problem's tables, summed once for every problem with ``tables.problem``'s edges
    shared = tying.reduce_tables(tables.problem) if tying is not None else None
    runs: dict[str, SearchRun] = {}
    lower = None
    for name in options.searches():
        t0 = time.perf_counter()
        if name == "kcut":
            assignment, exact, stats = _run_kcut(
                ctx, options, space, tying, shared, list(base.values()), tick
            )
            candidates = [assignment]
        else:
            extra = [runs["kcut"].assignment] if "kcut" in runs else []
            candidates, exact, lower, stats = _run_elimination(
                ctx, options, space, tying, shared, [*base.values(), *extra], tick
            )
            candidates += extra  # k-cut's plan: elimination reports nothing worse
        a, ev = cheapest(candidates, priced, lambda x: plan_floor(ctx, x))
        runs[name] = SearchRun(name, a, ev, exact, False, time.perf_counter() - t0, stats)
    step_lower = None
    elim = runs.get("elimination")
    method = elim.stats.get("bound_method") if elim is not None else None
    if options.objective == "overlap":  # the searches certified Eq. 1, an upper bound of it
        step_lower, lower, method = lower, overlap_lower_bound(ctx, space), "compute stream"
        streams = elim.stats.get("streams_bound") if elim is not None else None
        if streams is not None and streams > lower:
            lower, method = streams, "streams"
    runs = {
        n: dataclasses.replace(r, certified=reaches(r.evaluation.objective, lower))
        for n, r in runs.items()
    }
    chosen = runs[options.search]
    assignment, evaluation, fell_back = chosen.assignment, chosen.evaluation, None
    # never report a plan worse than a baseline under the reported cost (hypar: only baselines
    # inside its space, i.e. data parallel)
    allowed = [s for s in BASELINES if space is None or project(base[s], space) is not None]
    for name in allowed:
        below = evaluation.objective * (1 - 1e-12)
        floor = plan_floor(ctx, base[name])
        if floor is not None and floor >= below:
            continue  # it cannot beat the plan: no evaluation needed
        if (ev := priced(base[name])).objective < below:
            assignment, evaluation, fell_back = base[name], ev, name
    optimal = reaches(evaluation.objective, lower)
    return Choice(
        options.strategy, assignment, evaluation, optimal, lower, runs, baselines, fell_back,
        tying, step_lower, tied_tables=shared, bound_method=method,
    )  # fmt: skip


def overlap_lower_bound(ctx: EvalContext, space: list[list[int]] | None) -> float:
    """An exact lower bound of every plan's overlapped step: its compute stream alone runs every
    node's t_C, so the step is at least Σ_v min over v's configurations of t_C."""
    total = 0.0
    for v, comp in enumerate(ctx.tables.compute):
        allowed = comp if space is None else comp[space[v]]
        total += float(allowed.min())
    return total


def _run_elimination(
    ctx: EvalContext,
    options: PlannerOptions,
    space: list[list[int]] | None,
    tying: Tying | None,
    shared: ReducedTables | None,
    starts: list[Sequence[int]],
    tick: Tick,
) -> tuple[list[list[int]], bool, float | None, dict]:
    """Joint elimination over the whole space (or HyPar's ``space``).

    Returns the candidate assignments, whether the search was exact, a proven lower bound of
    every plan's reported cost (None when none was found), and stats. The bound
    (`_exact_bound`): the problem's own minimum when its tables are exact; else the minimum of
    ``bound`` (exact tables, 1/k of each read's path where they fell back); when the problem
    is too wide to eliminate, the pairwise bound's exact minimum (`tables.pairwise_bound`: no
    tables over several nodes) or the LP dual bound of ``bound`` (`_dual_bounds`), the
    larger. A bound descent approaches certifies nothing. With a ``tying`` every problem is
    reduced to its variables first: the bound is then a bound over the tied space.
    """
    tables, budget = ctx.tables, options.budget
    t_search = time.perf_counter()

    def narrow(p: Problem, same_edges: bool = False) -> Problem:
        """``p`` over the searched variables (``same_edges``: ``p`` has ``tables.problem``'s
        edges, factors and blocks, so the tied tables are ``shared``)."""
        if space is not None:
            return restrict(p, space)
        return tying.reduce(p, shared if same_edges else None) if tying is not None else p

    if space is not None:
        starts = [p for p in (project(s, space) for s in starts) if p is not None]
    elif tying is not None:
        starts = [tying.restrict(s) for s in starts]

    def on_round(start: int, starts: int, rounds: int, value: float) -> None:
        unit = f"{value / 1e6:.3f} MB" if options.objective == "comm" else f"{value * 1e3:.4f} ms"
        tick(f"descent from start {start}/{starts}, round {rounds}: {unit}")

    problem = narrow(tables.problem, same_edges=True)
    sol = solve(problem, starts=starts, budget=budget, on_round=on_round)
    found, lower, stats = [sol.assignment], None, dict(sol.stats)
    stats["objective"] = sol.objective
    if not sol.optimal:  # descent: alternate with re-cutting one mesh axis at a time
        x, value = recut_and_descend(
            problem, narrow_configs(tables.configs, space, tying), sol.assignment, budget,
            RECUT_ROUNDS,
        )  # fmt: skip
        if x != list(sol.assignment):
            found.append(x)
        stats["recut_objective"] = value
    if ctx.params.objective == "overlap":  # one more candidate: gradient syncs combined
        combined = combined_sync_problem(ctx.ng, tables, ctx.params, ctx.batch, ctx.combiner)
        alt = solve(
            narrow(combined, same_edges=True), starts=[*starts, sol.assignment], budget=budget
        )
        found.append(alt.assignment)
        stats["combined_sync_objective"] = alt.objective
    t0 = time.perf_counter()
    lower, method = _exact_bound(ctx, narrow, sol, space, tying, budget, found)
    stats["bound_time_s"] = time.perf_counter() - t0
    if not sol.optimal:  # too wide to eliminate: the LP dual bound, and the plans read off it
        lower, method = _dual_bounds(ctx, problem, narrow, lower, method, found, stats, t_search)
    stats["bound_method"] = method
    if space is not None:
        found = [[space[v][i] for v, i in enumerate(a)] for a in found]
    elif tying is not None:
        found = [tying.expand(a) for a in found]
    return found, sol.optimal, lower, stats


def _exact_bound(
    ctx: EvalContext,
    narrow: Callable[..., Problem],
    sol: Solution,
    space: list[list[int]] | None,
    tying: Tying | None,
    budget: SearchBudget,
    found: list,
) -> tuple[float | None, str | None]:
    """The exact minimum of a lower bound of every plan's reported cost, where elimination
    solves one (`_run_elimination`); its minimizer is appended to ``found``."""
    tables = ctx.tables
    if sol.optimal and tables.exact:
        return sol.objective, "elimination"
    if sol.optimal:  # the same graph: it eliminates too
        bound = narrow(tables.bound)
    elif graph_eliminates(
        *narrow_graph(pairwise_graph(ctx.ng, tables), tables.configs, space, tying),
        budget.table, budget.enum,
    ):  # fmt: skip
        bound = narrow(pairwise_bound(ctx.ng, tables))  # priced only if useful
    else:
        return None, None
    if not eliminates(bound, budget.table, budget.enum)[0]:
        return None, None
    low, lower, _ = solve_exact(bound, None, budget.table, budget.enum)
    found.append(low)
    return lower, "elimination"


def _dual_bounds(
    ctx: EvalContext,
    problem: Problem,
    narrow: Callable[..., Problem],
    lower: float | None,
    method: str | None,
    found: list,
    stats: dict,
    t_search: float,
) -> tuple[float | None, str | None]:
    """`lower_bounds`: the LP dual bound of the searched ``bound`` problem (Eq. 1 or bytes),
    kept if it beats ``lower``, and under "overlap" the streams' bound (in ``stats``); where
    ``bound`` is not the search's ``problem`` (fallback tables), that problem's dual too, for
    its plan (on 4-axis meshes block descent's basins are deep: unrolled llama3_8b 249.3 ms,
    the dual's plan 223.9 ms, optimal). The plans read off the duals are appended to
    ``found``. Returns the bound and its method."""
    tables = ctx.tables
    t1 = time.perf_counter()
    guard = max(BOUND_SECONDS, 3 * (t1 - t_search))  # each dual's, from its start

    def deadline() -> float:
        return time.perf_counter() + guard

    if not tables.exact:  # the search's own problem first: its dual's plan is a candidate
        own = search_bound(problem, deadline(), min(assignment_cost(problem, x) for x in found))
        found += own.plans
        stats["search_dual_bound"] = own.value  # of the search's problem, not of `R`
    low_problem = narrow(tables.bound, same_edges=tables.exact)
    upper = min(assignment_cost(low_problem, x) for x in found)  # plans of the searched space
    dual = search_bound(low_problem, deadline(), upper)
    found += dual.plans
    if dual.value is not None and (lower is None or dual.value > lower):
        lower, method = dual.value, "dual"
    stats["dual_bound"] = dual.value
    if ctx.params.objective == "overlap":
        compute, comm = plan_streams(ctx)
        compute = narrow(Problem(compute, {}, [])).unary
        comm = narrow(comm, same_edges=tables.exact)

        def streams(x: list[int]) -> tuple[float, float]:
            return sum(float(compute[v][c]) for v, c in enumerate(x)), assignment_cost(comm, x)

        floor = sum(float(c.min()) for c in compute)  # `overlap_lower_bound` of the space
        mixed = overlap_bound(compute, comm, streams, deadline(), floor, list(found))
        found += mixed.plans
        stats["streams_bound"] = mixed.value
        stats["streams_lambdas"] = mixed.stats["lambdas"]
    stats["dual_time_s"] = time.perf_counter() - t1
    return lower, method


def narrow_graph(
    pairs: set[tuple[int, int]],
    configs: Sequence[Sequence[Config]],
    space: list[list[int]] | None,
    tying: Tying | None,
) -> tuple[list[int], set[tuple[int, int]]]:
    """A problem's graph (``pairs`` over nodes) as its narrowed problem's (`narrow`):
    configurations per variable, and the edges between variables (a tied class's own edges
    fold into its unary table)."""
    sizes = [len(c) for c in narrow_configs(configs, space, tying)]
    if tying is None:
        return sizes, pairs
    var = tying.var_of
    return sizes, {(var[i], var[j]) for i, j in pairs if var[i] != var[j]}


def narrow_configs(
    configs: Sequence[Sequence[Config]], space: list[list[int]] | None, tying: Tying | None
) -> list[Sequence[Config]]:
    """The configurations of each variable of the searched problem: HyPar's ``space`` of each
    node, or a tied class's representative's."""
    if space is not None:
        return [[configs[v][i] for i in space[v]] for v in range(len(space))]
    if tying is not None:
        return [configs[c[0]] for c in tying.classes]
    return list(configs)


def _run_kcut(
    ctx: EvalContext,
    options: PlannerOptions,
    space: list[list[int]] | None,
    tying: Tying | None,
    shared: ReducedTables | None,
    starts: list[Sequence[int]],
    tick: Tick,
) -> tuple[list[int], bool, dict]:
    """SoyBean's k-cut, one cut per mesh axis, slowest interconnect first.

    Under ``objective="comm"`` contractions only have full-degree configurations, which a cut
    that leaves later axes unused cannot pass through: k-cut then runs on tables over every
    configuration (`_unfiltered`) and may only end on the planner's own ones.
    """
    tables, mesh = ctx.tables, ctx.params.mesh
    configs = list(tables.configs)
    final = space if space is not None else [list(range(len(c))) for c in configs]
    starts = [list(s) for s in starts]
    ext_configs, ext, tables_s = configs, tables.problem, 0.0
    if ctx.params.objective == "comm":
        t0 = time.perf_counter()
        ext_configs, ext = _unfiltered(ctx)
        tables_s = time.perf_counter() - t0
        index = [{c: i for i, c in enumerate(e)} for e in ext_configs]
        final = [[index[v][configs[v][i]] for i in final[v]] for v in range(len(configs))]
        starts = [[index[v][configs[v][a]] for v, a in enumerate(s)] for s in starts]
    problem, cut_configs = ext, ext_configs
    if tying is not None:  # one variable per class of repeated nodes
        problem = tying.reduce(ext, shared if ext is tables.problem else None)
        cut_configs = [ext_configs[c[0]] for c in tying.classes]
        final = [final[c[0]] for c in tying.classes]
        starts = [tying.restrict(s) for s in starts]
    res = kcut(problem, cut_configs, mesh.sizes, mesh.bandwidth, final, starts, options.budget)
    tick(f"k-cut: {len(res.cuts)} cut{'s' if len(res.cuts) != 1 else ''}")
    assignment = tying.expand(res.assignment) if tying is not None else res.assignment
    if ext is not tables.problem:
        back = [{c: i for i, c in enumerate(cf)} for cf in configs]
        assignment = [back[v][ext_configs[v][a]] for v, a in enumerate(assignment)]
    stats = {
        "method": "k-cut",
        "order": [mesh.names[a] for a in cut_order(mesh.sizes, mesh.bandwidth)],
        "cuts": [dict(c.as_dict(), axis_name=mesh.names[c.axis]) for c in res.cuts],
        "exact": res.exact_cuts,
        "tables_s": tables_s,  # building tables over every configuration ("comm" only)
    }
    return assignment, False, stats


def _unfiltered(ctx: EvalContext) -> tuple[list[list], Problem]:
    """Tables over every configuration (no full-degree filter for contractions)."""
    ng, params, tables = ctx.ng, ctx.params, ctx.tables
    ext_configs = []
    for node, cfgs in zip(ng.nodes, tables.configs, strict=True):
        every = node_configs(
            ng, node, params.mesh.sizes, names=params.mesh.names, trivial=params.mesh.trivial
        )
        ext_configs.append(every if set(cfgs) <= set(every) else cfgs)
    unary = [
        node_tables(ng, node, cfgs, params)[2]
        for node, cfgs in zip(ng.nodes, ext_configs, strict=True)
    ]
    ext = Problem(unary=unary, edges={}, blocks=tables.problem.blocks)
    reshards = ReshardTables(ng, ext_configs, params)
    for use in tables.uses:
        add_read(ext, reshards, use)
    return ext_configs, ext
