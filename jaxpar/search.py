"""The search: minimize Σ node costs + Σ edge costs over one configuration per node.

`solve_exact` is OptCNN's Algorithm 1 generalized. Parallel edges are summed when the tables are
built (edge elimination, Eq. 3). A node with one or two neighbours is eliminated by folding its
cost into a table over its neighbours (node elimination, Eq. 2); generalized to any degree, this
is variable elimination: eliminating node v replaces every table that mentions v by one table over
v's neighbours, ``T(N(v)) = min_v Σ tables``, vectorized in numpy. Nodes are eliminated
cheapest-table-first (which takes degree-1 and degree-2 nodes, OptCNN's case, before anything
else). When the cheapest next table would exceed the budget, the residual graph is enumerated if
it is small, as in the paper; the result is undone in reverse order. All of this is exact.

When the residual graph is too wide (a train step's forward→backward ladder: measured treewidth
≈ 7), `solve` falls back to block coordinate descent: blocks (forward; backward + update) are each
solved exactly with the rest held fixed, from several starting points, until no block improves.
Each step is exact given the rest, the objective never increases, and the result is marked
not certified optimal.

Pure: numpy only.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
from collections.abc import Callable, Sequence

import numpy as np


@dataclasses.dataclass
class Problem:
    """One configuration per node; unary costs per node, pairwise costs per edge."""

    unary: list[np.ndarray]  # node -> cost of each of its configurations
    edges: dict[tuple[int, int], np.ndarray]  # (i, j), i < j -> cost matrix [C_i, C_j]
    blocks: list[list[int]] = dataclasses.field(default_factory=list)  # decomposition fallback

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


@dataclasses.dataclass
class Solution:
    assignment: list[int]  # configuration index per node
    objective: float
    optimal: bool  # certified optimal under the cost model
    stats: dict  # search statistics (eliminations, residual size, time, rounds)


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
    return total


def _expand(arr: np.ndarray, vars_: tuple[int, ...], order: list[int], sizes: dict) -> np.ndarray:
    """View a factor over ``vars_`` (sorted) as an array broadcastable over ``order``."""
    pos = [order.index(v) for v in vars_]
    perm = np.argsort(pos)
    shape = [1] * len(order)
    for v in vars_:
        shape[order.index(v)] = sizes[v]
    return arr.transpose(perm).reshape(shape)


def solve_exact(
    problem: Problem,
    fixed: dict[int, int] | None = None,
    table_budget: float = 2e7,
    enum_budget: float = 2e6,
) -> tuple[list[int], float, dict]:
    """Exact minimum with ``fixed`` nodes held at given configurations; raises TooWide."""
    fixed = dict(fixed or {})
    n = problem.num_nodes
    for i, u in enumerate(problem.unary):
        if len(u) == 1:
            fixed.setdefault(i, 0)
    offset = 0.0
    unary = {i: problem.unary[i].astype(np.float64) for i in range(n) if i not in fixed}
    for i, c in fixed.items():
        offset += float(problem.unary[i][c])
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
    for i, u in unary.items():
        factors[(i,)] = u
    sizes = {i: len(problem.unary[i]) for i in range(n)}
    adj: dict[int, set[int]] = {i: set() for i in unary}
    var_factors: dict[int, set[tuple[int, ...]]] = {i: set() for i in unary}
    for key in factors:
        for v in key:
            var_factors[v].add(key)
            adj[v].update(u for u in key if u != v)

    def table_log(v: int) -> float:
        return math.log(sizes[v]) + sum(math.log(sizes[u]) for u in adj[v])

    log_budget = math.log(table_budget)
    eliminated: list[tuple[int, list[int], np.ndarray]] = []
    max_table = 0.0
    # cheapest-table-first order, with a lazily invalidated heap
    version = dict.fromkeys(adj, 0)
    heap = [(table_log(v), len(adj[v]), v, 0) for v in adj]
    heapq.heapify(heap)
    while heap:
        tl, _, v, ver = heapq.heappop(heap)
        if v not in adj or ver != version[v]:
            continue
        if tl > log_budget:
            heapq.heappush(heap, (tl, len(adj[v]), v, ver))
            break
        rest = sorted(adj[v])
        order = [*rest, v]
        keys = list(var_factors[v])
        joint = None
        for key in keys:
            term = _expand(factors.pop(key), key, order, sizes)
            joint = term if joint is None else joint + term
            for u in key:
                if u != v:
                    var_factors[u].discard(key)
        joint = np.broadcast_to(joint, tuple(sizes[u] for u in order))
        max_table = max(max_table, float(joint.size))
        arg = joint.argmin(axis=-1)
        best = np.take_along_axis(joint, arg[..., None], axis=-1)[..., 0]
        eliminated.append((v, rest, arg))
        del adj[v], var_factors[v]
        for u in rest:
            adj[u].discard(v)
            adj[u].update(w for w in rest if w != u)
        for u in rest:
            version[u] += 1
            heapq.heappush(heap, (table_log(u), len(adj[u]), u, version[u]))
        if rest:
            key = tuple(rest)
            if key in factors:
                factors[key] = factors[key] + best
            else:
                factors[key] = np.asarray(best)
                for u in rest:
                    var_factors[u].add(key)
        else:
            offset += float(best)

    assign: dict[int, int] = dict(fixed)
    residual = sorted(adj)
    if residual:
        if sum(math.log(sizes[v]) for v in residual) > math.log(enum_budget):
            raise TooWide(residual, adj)
        # enumerate the residual graph (Algorithm 1, line 14) as one joint table
        joint = np.zeros(tuple(sizes[v] for v in residual))
        for key, arr in factors.items():
            joint = joint + _expand(arr, key, residual, sizes)
        flat = int(np.argmin(joint))
        offset += float(joint.reshape(-1)[flat])
        for v, c in zip(residual, np.unravel_index(flat, joint.shape), strict=True):
            assign[v] = int(c)
    for v, rest, arg in reversed(eliminated):  # undo in reverse order
        assign[v] = int(arg[tuple(assign[u] for u in rest)]) if rest else int(arg)
    result = [assign[i] for i in range(n)]
    stats = {"eliminated": len(eliminated), "residual": len(residual), "max_table": max_table}
    return result, offset, stats


def _solve_block(problem, x, block, table_budget, enum_budget):
    """Exact over ``block`` with the rest of ``x`` fixed; conditions on hubs when too wide."""
    inside = set(block)
    fixed = {i: x[i] for i in range(problem.num_nodes) if i not in inside}
    for _ in range(64):
        try:
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
    table_budget: float = 4e6,
    enum_budget: float = 2e6,
    max_rounds: int = 6,
    block_budget: float = 2.5e5,
    on_round: Callable[[str], None] | None = None,
    max_starts: int = 2,
) -> Solution:
    """Exact when the graph eliminates within budget; else block coordinate descent.

    ``on_round(detail)``, if given, is told when each descent round ends (progress reports).
    Descent runs from the ``max_starts`` best starting assignments: on the zoo's wide steps
    (Inception-v3, ResNet-50, GPT-2 on 4×4) the worse starts never ended best, and they cost
    half the search time (bench/search_time.py).

    Blocks are solved with a smaller table budget (conditioning on hubs past it): measured on a
    2,031-equation transformer step, 2.5e5 gives the same objective as 2e7 at 5-11x less time.
    """
    t0 = time.perf_counter()
    try:
        assignment, value, stats = solve_exact(problem, None, table_budget, enum_budget)
        stats.update(time_s=time.perf_counter() - t0, method="elimination")
        return Solution(assignment, value, True, stats)
    except TooWide as wide:
        residual = len(wide.nodes)
    blocks = [b for b in problem.blocks if b] or [list(range(problem.num_nodes))]
    best: Solution | None = None
    rounds_total = 0
    seen: list[float] = []  # objective reached from each start
    starts = sorted(starts, key=lambda a: evaluate(problem, a))[: max(1, max_starts)]
    for start in starts:
        x = list(start)
        val = evaluate(problem, x)
        for _ in range(max_rounds):
            rounds_total += 1
            improved = False
            for block in blocks:
                y, v, _ = _solve_block(problem, x, block, block_budget, enum_budget)
                if v < val - 1e-12 * max(1.0, abs(val)):
                    x, val, improved = y, v, True
            if on_round is not None:
                on_round(f"start {len(seen) + 1}/{len(starts)}, round {rounds_total}: {val:.6g}")
            if not improved:
                break
        seen.append(val)
        if best is None or val < best.objective:
            best = Solution(x, val, False, {})
    assert best is not None, "solve needs at least one starting assignment when the graph is wide"
    best.stats = {
        "method": "block coordinate descent",
        "residual": residual,
        "rounds": rounds_total,
        "starts": len(starts),
        "time_s": time.perf_counter() - t0,
    }
    return best


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
        k = int(np.argmin(cost))
        if cost[k] < best_val:
            best_val = float(cost[k])
            best = [int(x[k]) for x in idx]
    return best, best_val
