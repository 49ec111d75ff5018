"""The search: minimize Σ node costs + Σ edge costs (+ Σ tables over several nodes) over one
configuration per node.

`solve_exact` is OptCNN's Algorithm 1 generalized. Parallel edges are summed when the tables are
built (edge elimination, Eq. 3). A node with one or two neighbours is eliminated by folding its
cost into a table over its neighbours (node elimination, Eq. 2); generalized to any degree, this
is variable elimination: eliminating node v replaces every table that mentions v by one table over
v's neighbours, ``T(N(v)) = min_v Σ tables``, vectorized in numpy. Tables over three or more
nodes (a reshard shared by several readers, `tables.SharedReshards`) are factors like any other.
Nodes are eliminated cheapest-table-first (which takes degree-1 and degree-2 nodes, OptCNN's
case, before anything else). When the cheapest next table would exceed the budget, the residual
graph is enumerated if it is small, as in the paper; the result is undone in reverse order. All
of this is exact.

When the residual graph is too wide (a train step's forward→backward ladder: measured treewidth
≈ 7), `solve` falls back to block coordinate descent: the problem's blocks (`tables.phase_blocks`:
forward + inputs; backward + update; inputs + update) are each solved exactly with the rest
fixed, from several starting points, until no block improves. Each step is exact given the rest,
the objective never increases, and the result is marked not certified optimal.

Pure: numpy only.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import time
from collections.abc import Callable, Iterable, Sequence

import numpy as np


@dataclasses.dataclass
class Problem:
    """One configuration per node; unary costs per node, pairwise costs per edge, and cost
    tables over three or more nodes (a reshard shared by several readers, priced once)."""

    unary: list[np.ndarray]  # node -> cost of each of its configurations
    edges: dict[tuple[int, int], np.ndarray]  # (i, j), i < j -> cost matrix [C_i, C_j]
    blocks: list[list[int]] = dataclasses.field(default_factory=list)  # decomposition fallback
    factors: dict[tuple[int, ...], np.ndarray] = dataclasses.field(default_factory=dict)
    # (v1 < v2 < v3 ...) -> cost array [C_v1, C_v2, C_v3, ...]

    @property
    def num_nodes(self) -> int:
        return len(self.unary)

    def add_edge(self, i: int, j: int, table: np.ndarray) -> None:
        """Add a pairwise table; parallel edges sum (edge elimination, OptCNN Eq. 3)."""
        if i == j:
            self.unary[i] = self.unary[i] + np.diag(table)
            return
        if i > j:
            i, j, table = j, i, table.T
        if (i, j) in self.edges:
            self.edges[(i, j)] = self.edges[(i, j)] + table
        else:
            self.edges[(i, j)] = np.asarray(table, dtype=np.float64)

    def add_factor(self, nodes: tuple[int, ...], table: np.ndarray) -> None:
        """Add a cost table over distinct ``nodes`` (axis k of ``table`` is nodes[k])."""
        if len(set(nodes)) != len(nodes):
            raise ValueError(f"add_factor needs distinct nodes, got {nodes}")
        order = sorted(range(len(nodes)), key=lambda k: nodes[k])
        key = tuple(nodes[k] for k in order)
        table = np.asarray(table, dtype=np.float64).transpose(order)
        if len(key) == 1:
            self.unary[key[0]] = self.unary[key[0]] + table
        elif len(key) == 2:
            self.add_edge(key[0], key[1], table)
        elif key in self.factors:
            self.factors[key] = self.factors[key] + table
        else:
            self.factors[key] = table


@dataclasses.dataclass(frozen=True)
class SearchBudget:
    """How hard the search may work (sizes in table entries / assignments)."""

    table: float = 4e6  # largest elimination table for the exact attempt
    block: float = 2.5e5  # largest table inside a decomposition block
    enum: float = 2e6  # largest residual graph enumerated exhaustively
    max_rounds: int = 6  # coordinate-descent rounds per starting point
    max_starts: int = 3  # descent runs from this many of the best starting assignments

    def __post_init__(self) -> None:
        for name in ("table", "block", "enum", "max_rounds", "max_starts"):
            if not getattr(self, name) >= 1:
                raise ValueError(f"SearchBudget.{name}={getattr(self, name)!r}; must be >= 1")


@dataclasses.dataclass(frozen=True)
class Solution:
    """A search result: an assignment, its objective, and whether the search certified it."""

    assignment: list[int]  # configuration index per node
    objective: float
    optimal: bool  # exact minimum of the problem it solved
    stats: dict  # search statistics (eliminations, residual size, time, rounds)


# Elimination takes each row's minimum by a second pass over tables up to this many entries and
# by gathering at the argmins above it (numpy's gather costs ~10 µs of overhead, a pass ~1 ns an
# entry); both give the same floats.
GATHER_ABOVE = 8192


class TooWide(Exception):
    """Elimination would exceed the table budget and the residual is too large to enumerate."""

    def __init__(self, nodes: list[int], adjacency: dict[int, set[int]]):
        super().__init__(f"{len(nodes)} nodes remain after elimination")
        self.nodes = nodes
        self.adjacency = adjacency


def evaluate(problem: Problem, assignment: Sequence[int]) -> float:
    """Objective of a complete assignment (Eq. 1)."""
    total = sum(float(u[assignment[i]]) for i, u in enumerate(problem.unary))
    for (i, j), t in problem.edges.items():
        total += float(t[assignment[i], assignment[j]])
    for key, t in problem.factors.items():
        total += float(t[tuple(assignment[v] for v in key)])
    return total


def improves(new: float, old: float) -> bool:
    """Whether objective ``new`` is lower than ``old`` by more than float noise (relative 1e-12):
    descents stop on a step that only rounds differently."""
    return new < old - 1e-12 * max(1.0, abs(old))


def _expand(arr: np.ndarray, vars_: tuple[int, ...], order: list[int], sizes: dict) -> np.ndarray:
    """View a factor over ``vars_`` as an array broadcastable over ``order``."""
    where = {v: k for k, v in enumerate(order)}
    return _view(arr, vars_, where, len(order), sizes)


def _view(arr: np.ndarray, vars_: tuple[int, ...], where: dict, ndim: int, sizes: dict):
    """`_expand` with ``order`` given as its position map ``where`` (v -> axis)."""
    pos = [where[v] for v in vars_]
    if any(a > b for a, b in itertools.pairwise(pos)):  # out of order: transpose first
        arr = arr.transpose(sorted(range(len(pos)), key=pos.__getitem__))
    shape = [1] * ndim
    for v, k in zip(vars_, pos, strict=True):
        shape[k] = sizes[v]
    return arr.reshape(shape)


def _condition(problem: Problem, fixed: dict[int, int]) -> tuple[dict, float, dict]:
    """Factors over the free nodes with ``fixed`` nodes folded in: (factors, offset, sizes)."""
    n = problem.num_nodes
    offset = sum(float(problem.unary[i][c]) for i, c in fixed.items())
    unary = {i: problem.unary[i].astype(np.float64) for i in range(n) if i not in fixed}
    factors: dict[tuple[int, ...], np.ndarray] = {}
    for (i, j), t in problem.edges.items():
        if i in fixed and j in fixed:
            offset += float(t[fixed[i], fixed[j]])
        elif i in fixed:
            unary[j] = unary[j] + t[fixed[i], :]
        elif j in fixed:
            unary[i] = unary[i] + t[:, fixed[j]]
        else:
            factors[(i, j)] = t
    for key, t in problem.factors.items():
        free = tuple(v for v in key if v not in fixed)
        sliced = t[tuple(fixed.get(v, slice(None)) for v in key)]
        if not free:
            offset += float(sliced)
        elif len(free) == 1:
            unary[free[0]] = unary[free[0]] + sliced
        else:
            factors[free] = factors[free] + sliced if free in factors else sliced
    for i, u in unary.items():
        factors[(i,)] = u
    return factors, offset, {i: len(problem.unary[i]) for i in range(n)}


class _Eliminator:
    """Variable elimination over factor tables, cheapest table first (a lazy heap)."""

    def __init__(self, factors: dict[tuple[int, ...], np.ndarray], sizes: dict[int, int]):
        self.factors, self.sizes = factors, sizes
        free = {v for key in factors for v in key}
        self.log_sizes = {v: math.log(sizes[v]) for v in free}
        self.adj: dict[int, set[int]] = {v: set() for v in free}
        self.var_factors: dict[int, set[tuple[int, ...]]] = {v: set() for v in free}
        for key in factors:
            for v in key:
                self.var_factors[v].add(key)
                self.adj[v].update(u for u in key if u != v)
        self.eliminated: list[tuple[int, list[int], np.ndarray]] = []
        self.offset = 0.0
        self.max_table = 0.0

    def fits(self, table_budget: float, enum_budget: float) -> tuple[bool, dict[int, set[int]]]:
        """Whether elimination would succeed, decided on the graph alone (no tables): the same
        cheapest-table-first order as `run`, then the residual's size against ``enum_budget``.
        Also returns the residual graph (node -> neighbours)."""
        adj = {v: set(near) for v, near in self.adj.items()}
        return _fits(adj, self.log_sizes, table_budget, enum_budget), adj

    def table_log(self, v: int) -> float:
        """log of the size of the table eliminating ``v`` would create."""
        logs = self.log_sizes
        return logs[v] + sum(logs[u] for u in self.adj[v])

    def run(self, table_budget: float) -> None:
        """Eliminate while the cheapest next table fits the budget."""
        log_budget = math.log(table_budget)
        version = dict.fromkeys(self.adj, 0)
        heap = [(self.table_log(v), len(self.adj[v]), v, 0) for v in self.adj]
        heapq.heapify(heap)
        while heap:
            tl, _, v, ver = heapq.heappop(heap)
            if v not in self.adj or ver != version[v]:
                continue
            if tl > log_budget:
                break
            rest = self.eliminate(v)
            for u in rest:
                version[u] += 1
                heapq.heappush(heap, (self.table_log(u), len(self.adj[u]), u, version[u]))

    def eliminate(self, v: int) -> list[int]:
        """Fold every factor mentioning ``v`` into one over its neighbours: min over v (Eq. 2)."""
        sizes, factors = self.sizes, self.factors
        rest = sorted(self.adj[v])
        where = {u: k for k, u in enumerate(rest)}
        where[v] = len(rest)
        joint = None
        for key in list(self.var_factors[v]):
            term = _view(factors.pop(key), key, where, len(where), sizes)
            joint = term if joint is None else joint + term
            for u in key:
                if u != v:
                    self.var_factors[u].discard(key)
        full = (*(sizes[u] for u in rest), sizes[v])
        if joint.shape != full:
            joint = np.broadcast_to(joint, full)
        self.max_table = max(self.max_table, float(joint.size))
        arg = joint.argmin(axis=-1)
        if joint.size <= GATHER_ABOVE:
            best = joint.min(axis=-1)  # the value at ``arg``: a second pass, cheap when small
        else:  # gather the values at ``arg`` (one per row) instead of a second pass
            best = np.take_along_axis(joint, arg[..., None], axis=-1)[..., 0]
        self.eliminated.append((v, rest, arg))
        del self.adj[v], self.var_factors[v]
        for u in rest:
            self.adj[u].discard(v)
            self.adj[u].update(w for w in rest if w != u)
        if not rest:
            self.offset += float(best)
        elif tuple(rest) in factors:
            factors[tuple(rest)] = factors[tuple(rest)] + best
        else:
            factors[tuple(rest)] = np.asarray(best)
            for u in rest:
                self.var_factors[u].add(tuple(rest))
        return rest

    def enumerate_residual(self, assign: dict[int, int], enum_budget: float) -> list[int]:
        """Enumerate what could not be eliminated as one joint table (Algorithm 1, line 14)."""
        residual = sorted(self.adj)
        if not residual:
            return residual
        if sum(math.log(self.sizes[v]) for v in residual) > math.log(enum_budget):
            raise TooWide(residual, self.adj)
        joint = np.zeros(tuple(self.sizes[v] for v in residual))
        for key, arr in self.factors.items():
            joint = joint + _expand(arr, key, residual, self.sizes)
        flat = int(np.argmin(joint))
        self.offset += float(joint.reshape(-1)[flat])
        for v, c in zip(residual, np.unravel_index(flat, joint.shape), strict=True):
            assign[v] = int(c)
        return residual

    def undo(self, assign: dict[int, int]) -> None:
        """Choose each eliminated node given its neighbours, in reverse order."""
        for v, rest, arg in reversed(self.eliminated):
            assign[v] = int(arg[tuple(assign[u] for u in rest)]) if rest else int(arg)


def _fits(
    adj: dict[int, set[int]], logs: dict[int, float], table_budget: float, enum_budget: float
) -> bool:
    """`_Eliminator.fits` on the graph ``adj`` (node -> neighbours; consumed: what remains is
    the residual) with ``logs[v]`` = log of v's configurations."""
    log_budget = math.log(table_budget)
    size_log = lambda v: logs[v] + sum(logs[u] for u in adj[v])
    version = dict.fromkeys(adj, 0)
    heap = [(size_log(v), len(adj[v]), v, 0) for v in adj]
    heapq.heapify(heap)
    while heap:
        tl, _, v, ver = heapq.heappop(heap)
        if v not in adj or ver != version[v]:
            continue
        if tl > log_budget:
            break
        rest = adj.pop(v)
        for u in rest:
            adj[u].discard(v)
            adj[u].update(w for w in rest if w != u)
        for u in rest:
            version[u] += 1
            heapq.heappush(heap, (size_log(u), len(adj[u]), u, version[u]))
    return sum(logs[v] for v in adj) <= math.log(enum_budget)


def graph_eliminates(
    sizes: Sequence[int],
    pairs: Iterable[tuple[int, int]],
    table_budget: float,
    enum_budget: float,
) -> bool:
    """`eliminates` for a pairwise problem given by its graph alone (no tables): ``sizes[v]``
    configurations of node v, ``pairs`` its edges. Nodes with one configuration are held
    fixed, as `solve_exact` holds them, and edges to them leave the graph."""
    free = [v for v, n in enumerate(sizes) if n > 1]
    adj: dict[int, set[int]] = {v: set() for v in free}
    for i, j in pairs:
        if i != j and sizes[i] > 1 and sizes[j] > 1:
            adj[i].add(j)
            adj[j].add(i)
    logs = {v: math.log(sizes[v]) for v in free}
    return _fits(adj, logs, table_budget, enum_budget)


def eliminates(
    problem: Problem, table_budget: float, enum_budget: float, fixed: dict[int, int] | None = None
) -> tuple[bool, dict[int, set[int]]]:
    """Whether `solve_exact` would succeed (no `TooWide`), decided without building tables, and
    the residual graph elimination leaves (node -> neighbours)."""
    fixed = dict(fixed or {})
    for i, u in enumerate(problem.unary):
        if len(u) == 1:
            fixed.setdefault(i, 0)
    factors, _, sizes = _condition(problem, fixed)
    return _Eliminator(factors, sizes).fits(table_budget, enum_budget)


def solve_exact(
    problem: Problem,
    fixed: dict[int, int] | None = None,
    table_budget: float = 2e7,
    enum_budget: float = 2e6,
) -> tuple[list[int], float, dict]:
    """Exact minimum with ``fixed`` nodes held at given configurations; raises TooWide."""
    fixed = dict(fixed or {})
    for i, u in enumerate(problem.unary):
        if len(u) == 1:
            fixed.setdefault(i, 0)
    factors, offset, sizes = _condition(problem, fixed)
    elim = _Eliminator(factors, sizes)
    elim.run(table_budget)
    assign: dict[int, int] = dict(fixed)
    residual = elim.enumerate_residual(assign, enum_budget)
    elim.undo(assign)
    result = [assign[i] for i in range(problem.num_nodes)]
    stats = {
        "eliminated": len(elim.eliminated),
        "residual": len(residual),
        "max_table": elim.max_table,
    }
    return result, offset + elim.offset, stats


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
) -> Solution:
    """Exact when the graph eliminates within budget; else block coordinate descent.

    ``on_round(start, starts, round, objective)``, if given, is called when each descent round
    ends (progress reports). ``solved``, if given, keeps the block solutions for later calls on
    a problem with the same tables and blocks (the memory budget solves a λ twice).
    Descent runs from the ``budget.max_starts`` best starting assignments: on the zoo's wide
    steps (Inception-v3, ResNet-50, GPT-2 on 4×4) the worse starts never ended best, and they
    cost half the search time (bench/search_time.py). Three, not two: on scanned llama3_70b over
    1,024 H100s the third start (a sharded-state hand plan) ends at 2.32 s per step and 29 GB
    where the two best end at 2.54 s and 146 GB; no other case measured changed.

    Blocks are solved with a smaller table budget (conditioning on hubs past it): measured on a
    2,031-equation transformer step, 2.5e5 gives the same objective as 2e7 at 5-11x less time.
    """
    budget = budget or SearchBudget()
    t0 = time.perf_counter()
    exact, residual_graph = eliminates(problem, budget.table, budget.enum)
    residual = len(residual_graph)
    if exact:  # decided on the graph first: a failed attempt would build tables for nothing
        assignment, value, stats = solve_exact(problem, None, budget.table, budget.enum)
        stats.update(time_s=time.perf_counter() - t0, method="elimination")
        return Solution(assignment, value, True, stats)
    if not starts:
        raise ValueError("solve needs at least one starting assignment when the graph is wide")
    blocks = [b for b in problem.blocks if b] or [list(range(problem.num_nodes))]
    closures = _closures(problem, blocks)
    # a block's solution depends only on the assignment of the block and its neighbours: the
    # same inputs recur (starts that converge alike, a confirming round), so solve each once
    solved = {} if solved is None else solved
    best_x, best_val = None, math.inf
    rounds_total = 0
    starts = sorted(starts, key=lambda a: evaluate(problem, a))[: budget.max_starts]
    for k, start in enumerate(starts):
        x = list(start)
        val = evaluate(problem, x)
        for _ in range(budget.max_rounds):
            rounds_total += 1
            improved = False
            for b, (block, closure) in enumerate(zip(blocks, closures, strict=True)):
                key = (b, tuple(x[i] for i in closure))
                if key in solved:
                    y = list(x)
                    for i, c in zip(block, solved[key], strict=True):
                        y[i] = c
                    v = evaluate(problem, y)
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
    stats = {
        "method": "block coordinate descent",
        "residual": residual,
        "rounds": rounds_total,
        "starts": len(starts),
        "time_s": time.perf_counter() - t0,
    }
    return Solution(best_x, best_val, False, stats)


def _closures(problem: Problem, blocks: list[list[int]]) -> list[list[int]]:
    """Each block with the nodes that share an edge or factor with it, in order."""
    adjacent: list[set[int]] = [set() for _ in range(problem.num_nodes)]
    for key in itertools.chain(problem.edges, problem.factors):
        for v in key:
            adjacent[v].update(key)
    return [sorted(set(block).union(*(adjacent[v] for v in block))) for block in blocks]


def brute_force(problem: Problem, chunk: int = 1 << 18) -> tuple[list[int], float]:
    """Enumerate every assignment, vectorized in chunks (tests only: exponential)."""
    sizes = [len(u) for u in problem.unary]
    total = math.prod(sizes)
    best, best_val = None, math.inf
    for start in range(0, total, chunk):
        flat = np.arange(start, min(total, start + chunk))
        idx = np.unravel_index(flat, sizes)
        cost = np.zeros(len(flat))
        for i, u in enumerate(problem.unary):
            cost += u[idx[i]]
        for (i, j), t in problem.edges.items():
            cost += t[idx[i], idx[j]]
        for key, t in problem.factors.items():
            cost += t[tuple(idx[v] for v in key)]
        k = int(np.argmin(cost))
        if cost[k] < best_val:
            best_val = float(cost[k])
            best = [int(x[k]) for x in idx]
    return best, best_val
