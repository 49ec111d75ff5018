"""Oracle tier: the LP dual bound (`solver/bounds`) against brute force on small random
problems (edges, factors over three nodes, forbidden entries), and the search stage's bounds
(`search/lower_bounds`) against every plan on small zoo steps: never above a plan's reported
cost, the Eq. 1 one never above the exact minimum elimination finds."""

import math

import numpy as np
import pytest
from test_solver_oracle import random_problem

from jaxpar.solver.bounds import DualBound, dual_bound
from jaxpar.solver.problem import FORBIDDEN, Problem, assignment_cost, brute_force

pytestmark = pytest.mark.oracle


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("budget", [0.0, 50.0, 1e6])
def test_dual_bound_is_below_the_minimum_and_its_plan_is_priced(seed, budget):
    """Whatever exact reduction precedes it (folding, elimination within a budget or all of
    it), the bound is at most the enumerated minimum; the decoded plan costs what it says,
    at least the minimum."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 9))
    p = random_problem(rng, n, forbid=seed % 3 == 0, factor=seed % 2 == 0)
    _, best = brute_force(p)
    res = dual_bound(p, table_budget=budget)
    assert res.value <= best + 1e-9 * max(1.0, abs(best))
    assert res.objective == assignment_cost(p, res.assignment)
    assert res.objective >= best - 1e-9 * max(1.0, abs(best))
    if budget >= 1e6 and best < FORBIDDEN:  # all eliminated: the bound is the minimum itself
        assert res.value == pytest.approx(best, rel=1e-9)


@pytest.mark.parametrize("seed", range(10))
def test_every_state_of_the_updates_bounds_every_assignment(seed):
    """The bound holds for any messages, not only at convergence: after each sweep, below the
    cost of every assignment (enumerated), and it never decreases."""
    rng = np.random.default_rng(100 + seed)
    p = random_problem(rng, 6, p_edge=0.7, factor=True)
    _, best = brute_force(p)
    dual = DualBound.of(p, table_budget=1.0)
    last = -math.inf
    for _ in range(8):
        dual.sweep()
        value = dual.value()
        assert value <= best + 1e-9 * max(1.0, abs(best))
        assert value >= last - 1e-9 * max(1.0, abs(last))
        last = value


def test_dual_bound_is_exact_on_a_cycle_with_no_frustration_and_low_on_a_frustrated_one():
    """A 4-cycle whose edges all prefer agreement: the LP is tight and the bound is the
    minimum. A frustrated K4 (every edge prefers disagreement over 2 labels; no node folds)
    leaves the LP's gap: the bound is strictly lower but still a bound."""
    agree = np.array([[0.0, 1.0], [1.0, 0.0]])
    p = Problem([np.array([0.0, 0.5]) for _ in range(4)], {})
    for i, j in [(0, 1), (1, 2), (2, 3), (0, 3)]:
        p.add_edge(i, j, agree)
    res = dual_bound(p, table_budget=1.0)
    assert res.value == pytest.approx(brute_force(p)[1], abs=1e-9)
    k4 = Problem([np.zeros(2) for _ in range(4)], {})
    for i in range(4):
        for j in range(i + 1, 4):
            k4.add_edge(i, j, 1.0 - agree)
    res = dual_bound(k4, table_budget=1.0)  # nothing eliminated: the LP alone
    _, best = brute_force(k4)
    assert best == 2.0  # two of the six edges agree at best
    assert res.value < 1.0  # the LP's half-integral optimum is 0


def test_forbidden_entries_are_relaxed_never_tightened():
    """A problem whose cheap pairs are forbidden: the bound stays below the least cost of the
    plans that avoid them, and the decoded plan avoids them."""
    t = np.array([[FORBIDDEN, 5.0], [3.0, np.inf]])
    p = Problem([np.array([0.0, 1.0]), np.array([0.0, 2.0])], {(0, 1): t})
    _, best = brute_force(p)
    res = dual_bound(p)
    assert best == 4.0  # (1, 0): 1 + 0 + 3
    assert res.value <= best
    assert res.objective == best


def _zoo_plan(name, objective):
    import jaxpar_zoo as zoo

    import jaxpar

    ex = zoo.get(name, small=True)
    return jaxpar.plan(
        ex.step, *ex.args, mesh={"node": 2, "gpu": 4}, cluster="p100", objective=objective
    )


def _samples(plan, count, seed=0):
    """``count`` random assignments, the baselines' and the searches'."""
    rs = np.random.RandomState(seed)
    sizes = [len(c) for c in plan.tables.configs]
    out = [[int(rs.randint(n)) for n in sizes] for _ in range(count)]
    out += [list(a) for a, _ in plan.choice.baselines.values()]
    out += [list(r.assignment) for r in plan.choice.runs.values()]
    return out


@pytest.mark.parametrize("name", ["gpt_small", pytest.param("resnet18", marks=pytest.mark.slow)])
def test_the_dual_bound_of_a_step_too_wide_to_eliminate_holds(name):
    """Block descent's plan: the LP dual bound of the ``bound`` problem is at most the reported
    Eq. 1 cost of 150 random plans, the baselines and every search's plan, and (ResNet-18,
    whose ``bound`` problem eliminates with a larger budget) at most its exact minimum. The
    plan's bound is the better of it and the pairwise bound's exact minimum; the report and
    the stats give the gap to it."""
    from jaxpar.cost.evaluation import evaluate
    from jaxpar.solver.elimination import solve_exact

    plan = _zoo_plan(name, "time")
    run = plan.choice.runs["elimination"]
    assert plan.choice.tying is None and not run.exact
    dual, lower = run.stats["dual_bound"], plan.lower_bound
    assert dual is not None and lower is not None and lower >= dual
    assert plan.choice.bound_method == ("dual" if lower == dual else "elimination")
    assert plan.stats["bound_gap"] == pytest.approx(1 - lower / plan.evaluation.objective)
    if name == "resnet18":
        _, least, _ = solve_exact(plan.tables.bound, None, 1e8, 1e6)
        assert dual <= least * (1 + 1e-12)
    else:  # the LP is tight here: the dual certifies descent's plan
        assert plan.choice.bound_method == "dual" and plan.optimal
        assert "optimal: certified (reported cost = proven lower bound" in plan.report()
    ctx = plan.eval_context()
    for a in _samples(plan, 150):
        assert lower <= evaluate(ctx, a).objective * (1 + 1e-12)


@pytest.mark.parametrize("name", ["gpt_small", pytest.param("resnet18", marks=pytest.mark.slow)])
def test_the_streams_bound_of_the_overlapped_step_holds(name):
    """Under "overlap": the compute stream (Σ t_C) and the communication stream's lower bound
    X (`lower_bounds.streams_problems`) are each at most the overlapped step of 150 random
    plans, the baselines and the searches' plans, and so is the plan's lower bound (the best of
    the compute bound and the streams' duals)."""
    from jaxpar.cost.evaluation import evaluate
    from jaxpar.search.lower_bounds import streams_problems

    plan = _zoo_plan(name, "overlap")
    ctx = plan.eval_context()
    compute, comm = streams_problems(ctx, plan.tables.bound)
    lower = plan.lower_bound
    assert plan.choice.bound_method in ("streams", "compute stream")
    assert plan.choice.runs["elimination"].stats["streams_bound"] is not None
    for a in _samples(plan, 150, seed=1):
        step = evaluate(ctx, a).objective
        c = sum(float(compute[v][x]) for v, x in enumerate(a))
        assert c <= step * (1 + 1e-12)
        assert assignment_cost(comm, a) <= step * (1 + 1e-12)
        assert lower <= step * (1 + 1e-12)


@pytest.mark.parametrize("seed", range(20))
def test_pruning_by_reduced_cost_keeps_every_plan_cheaper_than_the_known_one(seed):
    """With a known plan's cost as ``upper`` (here a random plan's), the dual prunes
    configurations; the bound stays at most the minimum, and the plan it returns is never worse
    than what it would find without pruning by more than the known plan allows."""
    rng = np.random.default_rng(300 + seed)
    p = random_problem(rng, 7, p_edge=0.6, max_c=6, factor=seed % 2 == 1)
    best_x, best = brute_force(p)
    known = assignment_cost(p, [int(rng.integers(len(u))) for u in p.unary])
    res = dual_bound(p, table_budget=1.0, upper=known)
    assert res.value <= best + 1e-9 * max(1.0, abs(best))
    dual = DualBound.of(p, table_budget=1.0)
    for _ in range(10):
        dual.sweep()
    dual.prune(best, dual.value())  # pruned against the optimum: the optimum stays reachable
    free = [v for v, u in enumerate(p.unary) if len(u) > 1]  # the residual's nodes, in order
    assert len(free) == len(dual.index)
    assert all(best_x[v] in dual.index[k] for k, v in enumerate(free))
