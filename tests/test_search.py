"""Oracle tier (docs/testing.md, "Test tiers"): the elimination DP against brute-force
enumeration (pure, no jax)."""

import numpy as np
import pytest

from jaxpar.solver.descent import solve
from jaxpar.solver.elimination import solve_exact
from jaxpar.solver.problem import Problem, SearchBudget, assignment_cost, brute_force

pytestmark = pytest.mark.oracle


def random_problem(rng, n, edges, max_c=4):
    unary = [rng.random(rng.integers(1, max_c + 1)) for _ in range(n)]
    p = Problem(unary=unary, edges={})
    for i, j in edges:
        p.add_edge(i, j, rng.random((len(unary[i]), len(unary[j]))))
    return p


def chain(n):
    return [(i, i + 1) for i in range(n - 1)]


def diamond():
    return [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4)]


def inception(branches=4):
    # a fan-out node, parallel branches of length 2, a concat node, a tail
    edges, nxt = [], 1
    for _ in range(branches):
        edges += [(0, nxt), (nxt, nxt + 1), (nxt + 1, 2 * branches + 1)]
        nxt += 2
    return [*edges, (2 * branches + 1, 2 * branches + 2)]


def ladder(rungs):
    # forward chain 0..r-1, backward chain r..2r-1 in reverse, a rung per layer (saved activations)
    edges = chain(rungs) + [(rungs + i, rungs + i + 1) for i in range(rungs - 1)]
    edges += [(i, 2 * rungs - 1 - i) for i in range(rungs)]
    return edges


GRAPHS = {
    "chain": (7, chain(7)),
    "diamond": (5, diamond()),
    "inception": (11, inception(4)),
    "ladder": (8, ladder(4)),
    "parallel-edges": (3, [(0, 1), (0, 1), (1, 2), (0, 2)]),
}


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("seed", range(5))
def test_dp_matches_brute_force(name, seed):
    n, edges = GRAPHS[name]
    p = random_problem(np.random.default_rng(seed), n, edges)
    assignment, value, _ = solve_exact(p)
    _, best = brute_force(p)
    assert value == pytest.approx(best, rel=1e-12, abs=1e-12)
    assert assignment_cost(p, assignment) == pytest.approx(value, rel=1e-12)


def test_wide_graph_falls_back_and_never_worsens_a_start():
    rng = np.random.default_rng(0)
    n = 12
    edges = [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < 0.6]
    p = random_problem(rng, n, edges, max_c=5)
    p.blocks = [list(range(0, 6)), list(range(6, 12))]
    starts = [[0] * n, [len(u) - 1 for u in p.unary]]
    sol = solve(p, starts=starts, budget=SearchBudget(table=50, enum=50))
    assert not sol.optimal  # too wide for a 50-entry budget: not certified
    assert sol.objective <= min(assignment_cost(p, s) for s in starts) + 1e-12
    assert assignment_cost(p, sol.assignment) == pytest.approx(sol.objective)
    exact = solve(p, starts=starts)  # with the default budget the same graph is exact
    assert exact.optimal
    assert exact.objective == pytest.approx(brute_force(p)[1])


def _descent_without_reuse(p, starts, budget):
    """Block coordinate descent as `solve` runs it, every block solved afresh."""
    best_x, best_val = None, float("inf")
    for start in sorted(starts, key=lambda a: assignment_cost(p, a))[: budget.max_starts]:
        x, val = list(start), assignment_cost(p, start)
        for _ in range(budget.max_rounds):
            improved = False
            for block in p.blocks:
                fixed = {i: c for i, c in enumerate(x) if i not in block}
                y, v, _ = solve_exact(p, fixed, budget.block, budget.enum)
                if v < val - 1e-12 * max(1.0, abs(val)):
                    x, val, improved = y, v, True
            if not improved:
                break
        if val < best_val:
            best_x, best_val = x, val
    return best_x, best_val


@pytest.mark.parametrize("seed", range(4))
def test_descent_reuses_block_solutions_without_changing_them(seed):
    """`solve` solves a block once per assignment of the block and its neighbours: the same
    descent as solving every block afresh (overlapping blocks, repeated starts); the local
    search after it only ever lowers the objective."""
    from jaxpar.solver.descent import _block_descent

    rng = np.random.default_rng(seed)
    n = 14
    edges = [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < 0.5]
    p = random_problem(rng, n, edges, max_c=4)
    p.add_factor((0, 5, 9), rng.random((len(p.unary[0]), len(p.unary[5]), len(p.unary[9]))))
    p.blocks = [list(range(0, 7)), list(range(5, 12)), [*range(0, 3), *range(11, 14)]]
    starts = [[int(rng.integers(len(u))) for u in p.unary] for _ in range(3)]
    budget = SearchBudget(table=30, block=1e6, enum=30, max_starts=4)
    sol = solve(p, starts=[*starts, starts[0]], budget=budget)
    assert not sol.optimal  # too wide for the exact attempt: descent ran
    x, val = _descent_without_reuse(p, [*starts, starts[0]], budget)
    assert _block_descent(p, [*starts, starts[0]], budget, None, None)[0] == x
    assert sol.objective <= val * (1 + 1e-12)
    assert sol.objective == pytest.approx(assignment_cost(p, sol.assignment), rel=1e-12)
    solved = {}  # kept across calls on one problem: the second call reuses the first's
    for _ in range(2):
        again, value, _, _ = _block_descent(p, starts[1:], budget, None, solved)
        x, val = _descent_without_reuse(p, starts[1:], budget)
        assert again == x
        assert value == pytest.approx(val, rel=1e-12)
    assert solved


@pytest.mark.parametrize("seed", range(6))
def test_factors_over_several_nodes_are_exact(seed):
    """Tables over 3-4 nodes (a reshard shared by several readers) against enumeration, also
    with some nodes held fixed (block descent) and restricted (k-cut)."""
    from jaxpar.solver.kcut import restrict

    rng = np.random.default_rng(seed)
    n = 8
    p = random_problem(rng, n, chain(n), max_c=3)
    for _ in range(3):
        nodes = tuple(int(v) for v in rng.choice(n, size=int(rng.integers(3, 5)), replace=False))
        p.add_factor(nodes, rng.random(tuple(len(p.unary[v]) for v in nodes)))
    assert p.factors, "the sorted keys of 3+ nodes are kept as factors"
    assignment, value, _ = solve_exact(p)
    best_assign, best = brute_force(p)
    assert value == pytest.approx(best, rel=1e-12)
    assert assignment_cost(p, assignment) == pytest.approx(value, rel=1e-12)
    fixed = {0: best_assign[0], 5: best_assign[5]}
    _, fixed_value, _ = solve_exact(p, fixed)
    assert fixed_value == pytest.approx(best, rel=1e-12)
    keep = [list(range(len(u)))[: max(1, len(u) - 1)] for u in p.unary]
    sub = restrict(p, keep)
    assert solve_exact(sub)[1] == pytest.approx(brute_force(sub)[1], rel=1e-12)


def test_add_factor_orders_its_nodes():
    p = Problem(unary=[np.zeros(2), np.zeros(3), np.zeros(4)], edges={})
    table = np.arange(24.0).reshape(4, 2, 3)  # axes: node 2, node 0, node 1
    p.add_factor((2, 0, 1), table)
    assert p.factors[(0, 1, 2)].shape == (2, 3, 4)
    assert assignment_cost(p, [1, 2, 3]) == table[3, 1, 2]
    with pytest.raises(ValueError, match="distinct"):
        p.add_factor((0, 0, 1), np.zeros((2, 2, 3)))


@pytest.mark.parametrize("seed", range(8))
def test_graph_eliminates_decides_as_the_priced_problem(seed):
    """`graph_eliminates` (no tables) answers as `eliminates` on the problem with tables, for
    random graphs with fixed (one-configuration) nodes and budgets on both sides of the line;
    and the tied graph (`choose.narrow_graph`) as the tied problem (`Tying.reduce`)."""
    from jaxpar.nodes.repeated_blocks import Tying
    from jaxpar.search.candidates import narrow_graph
    from jaxpar.solver.elimination import eliminates, graph_eliminates

    rng = np.random.default_rng(seed)
    n = 14
    pairs = {tuple(sorted(rng.choice(n, 2, replace=False).tolist())) for _ in range(24)}
    p = random_problem(rng, n, sorted(pairs), max_c=5)
    sizes = [len(u) for u in p.unary]
    answers = set()
    for table in (4, 30, 300, 1e5):
        for enum in (1, 50, 1e6):
            want = eliminates(p, table, enum)[0]
            assert graph_eliminates(sizes, pairs, table, enum) == want
            answers.add(want)
    assert answers == {True, False}  # the budgets straddle the line
    # tie node k + 7 to node k (k < 7) where both have the same number of configurations
    var_of = list(range(n))
    for k in range(7):
        if sizes[k] == sizes[k + 7]:
            var_of[k + 7] = k
    reps = sorted(set(var_of))
    classes = tuple((r, *(v for v in range(n) if var_of[v] == r and v != r)) for r in reps)
    tying = Tying(classes, tuple(reps.index(var_of[v]) for v in range(n)), (("f", 2),))
    configs = [list(range(s)) for s in sizes]
    tied_sizes, tied_pairs = narrow_graph(pairs, configs, None, tying)
    reduced = tying.reduce(p)
    for table in (4, 30, 300):
        for enum in (1, 50):
            want = eliminates(reduced, table, enum)[0]
            assert graph_eliminates(tied_sizes, tied_pairs, table, enum) == want


@pytest.mark.oracle
def test_table_sizes_do_not_depend_on_set_order():
    """The log table size elimination orders nodes by is summed exactly: the graph-only
    decision (`eliminates`) walks copies of the adjacency sets, which yield their members in
    another order than the originals, and a plain float sum then broke ties another way (a
    MaxText-style 8B's k-cut was said to eliminate, then left 15 nodes)."""
    from jaxpar.solver.elimination import _table_log

    rng = np.random.default_rng(3)
    logs = dict(enumerate(np.log(rng.choice([2, 3, 4, 6, 12], 40)).tolist()))
    for _ in range(200):
        near = [int(u) for u in rng.choice(np.arange(1, 40), 12, replace=False)]
        values = {_table_log(logs, 0, set(near[k:] + near[:k])) for k in range(len(near))}
        values |= {_table_log(logs, 0, set(reversed(near)))}
        assert len(values) == 1
        plain = {logs[0] + sum(logs[u] for u in near[k:] + near[:k]) for k in range(len(near))}
        assert min(values) == pytest.approx(min(plain), rel=1e-15)
