"""The search: exact when the graph eliminates, else block coordinate descent.

When the residual graph is too wide (a train step's forward→backward ladder: measured treewidth
≈ 7), `solve` falls back to block coordinate descent: the problem's blocks
(`cost.search_tables.phase_blocks`: forward + inputs; backward + update; inputs + update) are
each solved exactly with the rest fixed, from several starting points, until no block improves.
Each step is exact given the rest, the objective never increases, and the result is marked not
certified optimal. Pure: numpy only.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence

from .anytime import AnytimeOptions, anytime_search, improve_plan
from .elimination import TooWide, eliminates, solve_exact
from .problem import (
    Problem,
    SearchBudget,
    Solution,
    assignment_cost,
    brute_force,
    fits_memory,
    improves,
)

# `solve_within` tries exact elimination on problems up to this many nodes
EXACT_CHECK_NODES = 5000
# a problem whose eliminated plan breaks the memory limit is solved by trying every plan
# (`brute_force`, vectorized) when it has at most this many (the contest's example: 12)
ENUMERATED_PLANS = 1 << 18


def _solve_block(problem, x, block, table_budget, enum_budget):
    """Exact over ``block`` with the rest of ``x`` fixed; conditions on hubs when too wide."""
    inside = set(block)
    fixed = {i: x[i] for i in range(problem.num_nodes) if i not in inside}
    for _ in range(64):
        try:  # blocks mostly eliminate: attempting beats deciding first (`eliminates`)
            return solve_exact(problem, fixed, table_budget, enum_budget)
        except TooWide as wide:
            # condition on the most connected tenth of the residual (cutset conditioning)
            adjacency = wide.adjacency
            hubs = sorted(wide.nodes, key=lambda v: -len(adjacency.get(v, ())))
            for v in hubs[: max(1, len(hubs) // 10)]:
                fixed[v] = x[v]
    raise RuntimeError("block solve did not converge")


def solve(
    problem: Problem,
    starts: Sequence[Sequence[int]] = (),
    budget: SearchBudget | None = None,
    on_round: Callable[[int, int, int, float], None] | None = None,
    solved: dict | None = None,
    local_search: bool = True,
) -> Solution:
    """Exact when the graph eliminates within budget; else block coordinate descent, then
    (``local_search``) single moves and exact neighbourhoods from its plan (`improve_plan`).

    ``on_round(start, starts, round, objective)``, if given, is called when each descent round
    ends (progress reports). ``solved``, if given, keeps the block solutions for later calls on
    a problem with the same tables and blocks (the memory budget solves a λ twice).
    Descent runs from the ``budget.max_starts`` best starting assignments: on the zoo's wide
    steps (Inception-v3, ResNet-50, GPT-2 on 4×4) the worse starts never ended best, and they
    cost half the search time (bench/search_speed/search_time.py).
    Three, not two: on scanned llama3_70b over
    1,024 H100s the third start (a sharded-state hand plan) ends at 2.32 s per step and 29 GB
    where the two best end at 2.54 s and 146 GB; no other case measured changed.

    Blocks are solved with a smaller table budget (conditioning on hubs past it): measured on a
    2,031-equation transformer step, 2.5e5 gives the same objective as 2e7 at 5-11x less time.
    """
    budget = budget or SearchBudget()
    t0 = time.perf_counter()
    exact, residual_graph = eliminates(problem, budget.table, budget.enum)
    residual, residual_s = len(residual_graph), time.perf_counter() - t0
    if exact:  # decided on the graph first: a failed attempt would build tables for nothing
        assignment, value, stats = solve_exact(problem, None, budget.table, budget.enum)
        stats.update(time_s=time.perf_counter() - t0, method="elimination")
        return Solution(assignment, value, True, stats)
    if not starts:
        raise ValueError("solve needs at least one starting assignment when the graph is wide")
    best_x, best_val, rounds_total, starts = _block_descent(
        problem, starts, budget, on_round, solved
    )
    descent_s = time.perf_counter() - t0
    # then single moves and exact neighbourhoods chosen by graph structure, from its plan
    local = {"neighbourhoods": 0, "improving_neighbourhoods": 0, "moves": 0, "time_s": 0.0}
    if local_search:
        polished = improve_plan(problem, best_x, stall=local_stall(problem), deadline=math.inf)
        local = polished.stats
        if improves(polished.objective, best_val):
            best_x, best_val = polished.assignment, polished.objective
    stats = {
        "method": "block coordinate descent + local search",
        "residual": residual,
        "rounds": rounds_total,
        "starts": starts,
        "neighbourhoods": local["neighbourhoods"],
        "local_search_gain": local["improving_neighbourhoods"] + local["moves"],
        "phases_s": {"exact_check": residual_s, "descent": descent_s - residual_s,
                     "local_search": local["time_s"]},
        "time_s": time.perf_counter() - t0,
    }  # fmt: skip
    return Solution(best_x, best_val, False, stats)


def local_stall(problem: Problem) -> int:
    """How many neighbourhoods in a row without gain end the local search after block
    descent: a thirtieth of the nodes, within [12, 120]. Measured (2026-11-29): unrolled
    llama3_8b over 64 H100s finds its gains in the first 60; more only adds planning time
    (Inception-v3 on 4×4: 320 cost 0.56 s for nothing; the small GPT's memory budget, 10
    solves: 25 each cost 1.1 s)."""
    return max(12, min(120, problem.num_nodes // 30))


def _block_descent(problem, starts, budget, on_round, solved) -> tuple[list[int], float, int, int]:
    """Block coordinate descent from the ``budget.max_starts`` best ``starts``: returns the
    best plan, its objective, the rounds run and the starts used."""
    blocks = [b for b in problem.blocks if b] or [list(range(problem.num_nodes))]
    closures = _closures(problem, blocks)
    # a block's solution depends only on the assignment of the block and its neighbours: the
    # same inputs recur (starts that converge alike, a confirming round), so solve each once
    solved = {} if solved is None else solved
    best_x, best_val = None, math.inf
    rounds_total = 0
    starts = sorted(starts, key=lambda a: assignment_cost(problem, a))[: budget.max_starts]
    for k, start in enumerate(starts):
        x = list(start)
        val = assignment_cost(problem, x)
        for _ in range(budget.max_rounds):
            rounds_total += 1
            improved = False
            for b, (block, closure) in enumerate(zip(blocks, closures, strict=True)):
                key = (b, tuple(x[i] for i in closure))
                if key in solved:
                    y = list(x)
                    for i, c in zip(block, solved[key], strict=True):
                        y[i] = c
                    v = assignment_cost(problem, y)
                else:
                    y, v, _ = _solve_block(problem, x, block, budget.block, budget.enum)
                    solved[key] = tuple(y[i] for i in block)
                if improves(v, val):
                    x, val, improved = y, v, True
            if on_round is not None:
                on_round(k + 1, len(starts), rounds_total, val)
            if not improved:
                break
        if val < best_val:
            best_x, best_val = x, val
    return best_x, best_val, rounds_total, len(starts)


def _closures(problem: Problem, blocks: list[list[int]]) -> list[list[int]]:
    """Each block with the nodes that share an edge or factor with it, in order."""
    adjacent: list[set[int]] = [set() for _ in range(problem.num_nodes)]
    for key in itertools.chain(problem.edges, problem.factors):
        for v in key:
            adjacent[v].update(key)
    return [sorted(set(block).union(*(adjacent[v] for v in block))) for block in blocks]


def solve_within(
    problem: Problem,
    deadline: float,
    starts: Sequence[Sequence[int]] = (),
    budget: SearchBudget | None = None,
    log: Callable[[str], None] | None = None,
    options: AnytimeOptions | None = None,
    on_plan: Callable[[list[int]], None] | None = None,
) -> Solution:
    """The best plan by ``deadline`` (a `time.perf_counter` instant), memory constraint
    included: exact elimination when the graph eliminates within ``budget`` (optimal, and
    certified so when its plan also fits the memory limit; when it does not, a problem of at
    most `ENUMERATED_PLANS` plans is solved by trying them all), else the anytime search
    (`anytime.anytime_search`) from ``starts``; never a plan over the memory limit while one
    that fits is known; ``on_plan``: see `anytime.anytime_search`. ``jaxpar solve`` runs
    this."""
    budget = budget or SearchBudget()
    t0 = time.perf_counter()
    # the exact check costs seconds on 30k-node graphs with hubs, which never eliminate
    small = problem.num_nodes <= EXACT_CHECK_NODES
    exact = small and eliminates(problem, budget.table, budget.enum)[0]
    if exact:
        assignment, value, stats = solve_exact(problem, None, budget.table, budget.enum)
        stats.update(time_s=time.perf_counter() - t0, method="elimination")
        if fits_memory(problem, assignment):
            return Solution(assignment, value, True, stats)
        plans = math.prod(len(u) for u in problem.unary)
        if plans <= ENUMERATED_PLANS:
            best, _ = brute_force(problem)
            if best is not None:  # the cheapest plan that fits: optimal
                elapsed = time.perf_counter() - t0
                stats = {"method": "enumeration", "plans": plans, "time_s": elapsed}
                return Solution(best, assignment_cost(problem, best), True, stats)
        starts = [*starts, assignment]
    if log is not None:
        why = "breaks the memory limit" if exact else "too wide" if small else "not tried"
        log(f"exact elimination {why}; anytime search")
    solution = anytime_search(problem, deadline, starts, options, log, on_plan)
    solution.stats["phases_s"] = {"exact_check": time.perf_counter() - t0 - sum(
        solution.stats["phases_s"].values()), **solution.stats["phases_s"]}  # fmt: skip
    return solution
