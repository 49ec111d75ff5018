"""OptCNN's Algorithm 1 generalized: exact minimization by variable elimination.

A node with one or two neighbours is eliminated by folding its cost into a table over its
neighbours (node elimination, Eq. 2); generalized to any degree, this is variable elimination:
eliminating node v replaces every table that mentions v by one table over v's neighbours,
``T(N(v)) = min_v Σ tables``, vectorized in numpy. Tables over three or more nodes (a reshard
shared by several readers, `cost.search_tables.SharedReshards`) are factors like any other.
Nodes are eliminated cheapest-table-first (which takes degree-1 and degree-2 nodes, OptCNN's
case, before anything else). When the cheapest next table would exceed the budget, the residual
graph is enumerated if it is small, as in the paper; the result is undone in reverse order. All
of this is exact. Pure: numpy only.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterable, Sequence

import numpy as np

from .problem import Problem

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
        return _table_log(logs, v, self.adj[v])

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


def _table_log(logs: dict[int, float], v: int, near: set[int]) -> float:
    """log of the table eliminating ``v`` makes, log|C_v| + Σ_{u ∈ N(v)} log|C_u|, summed
    exactly (`math.fsum`): a plain sum depends on the order a set yields its members, and the
    graph-only decision (`_fits`) must choose the order the elimination itself (`run`) does, or
    a problem it says eliminates can leave a residual (MaxText-style 8B's k-cut did)."""
    return math.fsum([logs[v], *(logs[u] for u in near)])


def _fits(
    adj: dict[int, set[int]], logs: dict[int, float], table_budget: float, enum_budget: float
) -> bool:
    """`_Eliminator.fits` on the graph ``adj`` (node -> neighbours; consumed: what remains is
    the residual) with ``logs[v]`` = log of v's configurations."""
    log_budget = math.log(table_budget)
    size_log = lambda v: _table_log(logs, v, adj[v])
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
