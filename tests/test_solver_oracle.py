"""Oracle tier: the solver's pieces and its searches against brute-force enumeration on small
random problems: forbidden entries, parallel edges (one reversed), factors over three nodes and
memory limits (pure, no jax)."""

import time

import numpy as np
import pytest

from jaxpar.solver.adjacency import adjacency
from jaxpar.solver.anytime import AnytimeOptions, anytime_search, improve_plan
from jaxpar.solver.cutset import minimize
from jaxpar.solver.descent import ENUMERATED_PLANS, _block_descent, solve, solve_within
from jaxpar.solver.domains import reduce_domains
from jaxpar.solver.problem import (
    FORBIDDEN,
    MemoryConstraint,
    Problem,
    SearchBudget,
    assignment_cost,
    brute_force,
    fits_memory,
)
from jaxpar.solver.series import fold_series

pytestmark = pytest.mark.oracle


def random_problem(rng, n, p_edge=0.45, max_c=4, forbid=False, memory=False, factor=False):
    """Integer costs; with ``forbid`` some node and pair entries at FORBIDDEN; with ``memory`` a
    limit between the least-usage and the most-usage peaks."""
    unary = [rng.integers(0, 100, rng.integers(1, max_c + 1)).astype(float) for _ in range(n)]
    p = Problem(unary=unary, edges={})
    for i in range(n):
        for j in range(i + 1, n):
            if rng.random() < p_edge:
                t = rng.integers(0, 100, (len(unary[i]), len(unary[j]))).astype(float)
                if forbid:
                    t[rng.random(t.shape) < 0.2] = FORBIDDEN
                p.add_edge(i, j, t)
                if rng.random() < 0.3:  # a parallel edge, listed the other way round
                    p.add_edge(j, i, rng.integers(0, 50, (len(unary[j]), len(unary[i]))))
    if forbid:
        for u in unary:
            if len(u) > 1 and rng.random() < 0.3:
                u[rng.integers(len(u))] = FORBIDDEN
    if factor and n >= 3:
        key = (0, n // 2, n - 1)
        p.add_factor(key, rng.integers(0, 60, [len(unary[v]) for v in key]).astype(float))
    if memory:
        starts = rng.integers(0, 12, n)
        spans = np.stack([starts, np.minimum(12, starts + rng.integers(0, 6, n))], 1)
        usage = tuple(rng.integers(1, 20, len(u)).astype(float) for u in unary)
        low = MemoryConstraint(spans, usage, 0).peak([int(np.argmin(u)) for u in usage])
        high = MemoryConstraint(spans, usage, 0).peak([int(np.argmax(u)) for u in usage])
        p.memory = MemoryConstraint(spans, usage, low + rng.random() * 0.5 * (high - low))
    return p


@pytest.mark.parametrize("seed", range(40))
def test_series_folding_then_elimination_is_exact(seed):
    """Fold the leaves and degree-2 nodes, enumerate the core, expand: the optimum."""
    rng = np.random.default_rng(seed)
    p = random_problem(rng, int(rng.integers(2, 8)), p_edge=0.35)
    _, best = brute_force(p)
    core = fold_series(adjacency(p))
    cg = core.graph
    factors = {(v,): u for v, u in enumerate(cg.unary)}
    factors.update({(i, j): m for i, j, m in cg.edges()})
    assign, value, held = minimize(list(cg.sizes), factors, [0] * cg.num_nodes, budget=1e9)
    assert held == 0
    x = core.expand(assign)
    assert value + core.offset == pytest.approx(best, rel=1e-12)
    assert assignment_cost(p, x) == pytest.approx(best, rel=1e-12)


@pytest.mark.parametrize("seed", range(20))
def test_cutset_minimize_never_worse_than_its_default(seed):
    """With a table budget too small to eliminate, held variables stay at the default and the
    result is exact over the rest: never worse than the default, exact with a large budget."""
    rng = np.random.default_rng(seed)
    p = random_problem(rng, 7, p_edge=0.8, factor=True)
    factors = {(v,): u for v, u in enumerate(p.unary)}
    factors.update(p.edges)
    factors.update(p.factors)
    sizes = [len(u) for u in p.unary]
    default = [int(rng.integers(s)) for s in sizes]
    x, value, held = minimize(sizes, factors, default, budget=4)
    assert value == pytest.approx(assignment_cost(p, x), rel=1e-12)
    assert value <= assignment_cost(p, default) + 1e-9
    assert all(x[v] == default[v] for v in range(len(sizes))) or held < len(sizes)
    _, exact, none_held = minimize(sizes, factors, default, budget=1e9)
    assert none_held == 0 and exact == pytest.approx(brute_force(p)[1], rel=1e-12)


@pytest.mark.parametrize("seed", range(30))
def test_domain_reduction_keeps_an_optimum(seed):
    """Forbidden, unsupported and dominated configurations out: the reduced problem's optimum
    is the original's whenever a plan without forbidden entries fits."""
    rng = np.random.default_rng(seed)
    p = random_problem(rng, int(rng.integers(3, 7)), forbid=True, memory=seed % 2 == 0)
    _, best = brute_force(p)
    domains = reduce_domains(p, dominance=True)
    x, value = brute_force(domains.problem)
    if best < FORBIDDEN:
        assert value == pytest.approx(best, rel=1e-12)
        back = domains.to_original(x)
        assert assignment_cost(p, back) == pytest.approx(best, rel=1e-12)
        assert fits_memory(p, back)


@pytest.mark.parametrize("seed", range(30))
def test_solve_within_fits_and_avoids_forbidden_whenever_a_plan_does(seed):
    """Memory limits, forbidden entries, parallel edges: the answer fits the limit and has no
    forbidden entry whenever such a plan exists, and is optimal where it claims to be."""
    rng = np.random.default_rng(100 + seed)
    p = random_problem(rng, int(rng.integers(3, 8)), forbid=seed % 2 == 0, memory=True)
    _, best = brute_force(p)
    options = AnytimeOptions(seed=seed, stall=150)
    within = solve_within(p, time.perf_counter() + 5.0, options=options)
    searched = anytime_search(p, time.perf_counter() + 5.0, options=options)  # not enumerated
    for sol in (within, searched):
        value = assignment_cost(p, sol.assignment)
        assert sol.objective == pytest.approx(value, rel=1e-9)
        if best < FORBIDDEN:  # a plan that fits without forbidden entries exists
            assert fits_memory(p, sol.assignment)
            assert value < FORBIDDEN
            bound = sol.stats.get("lower_bound")
            assert bound is None or bound <= best + 1e-6 * abs(best)
        if sol.optimal:
            assert value == pytest.approx(best, rel=1e-12)


@pytest.mark.parametrize("seed", range(12))
def test_small_problems_over_the_limit_are_solved_by_trying_every_plan(seed):
    """Where the eliminated optimum breaks the memory limit and the problem has at most
    `ENUMERATED_PLANS` plans, `solve_within` tries them all (`brute_force`): the cheapest plan
    that fits, certified (and fast: no anytime search to its deadline)."""
    rng = np.random.default_rng(300 + seed)
    p = random_problem(rng, int(rng.integers(4, 8)), forbid=seed % 3 == 0, memory=True)
    free = Problem(p.unary, p.edges, p.blocks, p.factors)
    x_free, _ = brute_force(free)
    _, best = brute_force(p)
    t0 = time.perf_counter()
    sol = solve_within(p, t0 + 30.0)
    if fits_memory(p, x_free):  # the limit does not bind: elimination's plan stands
        assert sol.stats["method"] == "elimination"
    else:
        assert sol.stats["method"] == "enumeration" and sol.stats["plans"] <= ENUMERATED_PLANS
    assert sol.optimal and time.perf_counter() - t0 < 5.0
    assert fits_memory(p, sol.assignment)
    assert sol.objective == pytest.approx(best, rel=1e-12)  # sums near FORBIDDEN round
    assert assignment_cost(p, sol.assignment) == pytest.approx(best, rel=1e-12)


def test_solve_within_finds_most_optima_of_small_problems():
    """Small problems with memory limits: the anytime search finds the optimum on most."""
    found = total = 0
    for seed in range(20):
        rng = np.random.default_rng(200 + seed)
        p = random_problem(rng, 7, p_edge=0.5, forbid=seed % 2 == 0, memory=True)
        _, best = brute_force(p)
        if best >= FORBIDDEN:
            continue
        sol = anytime_search(p, time.perf_counter() + 5.0, options=AnytimeOptions(stall=150))
        total += 1
        found += assignment_cost(p, sol.assignment) <= best * (1 + 1e-12)
    assert total >= 10 and found >= 0.8 * total, (found, total)


@pytest.mark.parametrize("seed", range(8))
def test_local_search_after_block_descent_is_never_worse(seed):
    """Planner-style problems (factors over three nodes, blocks): `solve` (block descent, then
    the local search) ends at most at block descent's objective, priced exactly."""
    rng = np.random.default_rng(300 + seed)
    n = 14
    p = random_problem(rng, n, p_edge=0.5, factor=True)
    p.blocks = [list(range(0, 7)), list(range(5, 12)), [*range(0, 3), *range(11, 14)]]
    starts = [[int(rng.integers(len(u))) for u in p.unary] for _ in range(3)]
    budget = SearchBudget(table=30, block=1e6, enum=30)
    sol = solve(p, starts=starts, budget=budget)
    _, descent_value, _, _ = _block_descent(p, starts, budget, None, None)
    assert not sol.optimal
    assert sol.objective <= descent_value * (1 + 1e-12)
    assert sol.objective == pytest.approx(assignment_cost(p, sol.assignment), rel=1e-12)
    assert sol.objective >= brute_force(p)[1] - 1e-9


@pytest.mark.parametrize("seed", range(10))
def test_improve_plan_keeps_a_fitting_plan_fitting(seed):
    """From a plan that fits, every move of the local search keeps memory within the limit."""
    rng = np.random.default_rng(400 + seed)
    p = random_problem(rng, 9, p_edge=0.5, memory=True)
    start = [int(np.argmin(u)) for u in p.memory.usage]
    assert fits_memory(p, start)  # the limit is at least the least-usage peak
    sol = improve_plan(p, start, stall=60, seed=seed)
    assert fits_memory(p, sol.assignment)
    assert sol.objective <= assignment_cost(p, start) + 1e-9
