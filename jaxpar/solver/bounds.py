"""Lower bounds of a problem's minimum from the dual of its LP relaxation (the local polytope):
what a plan that the search cannot certify is at most away from optimal.

Variable elimination first removes, exactly, the nodes whose tables stay within a budget
(`elimination`, cheapest first): the residual's minimum plus the cost taken out is the whole's
minimum, so a lower bound of the residual's is one of the whole's. On the residual, block
coordinate ascent on the dual: every term t (an edge, a factor over three or more nodes) hands
each of its nodes i a function φ_{t,i} of i's configuration; the reparametrized problem

    θ'_i = θ_i + Σ_{t ∋ i} φ_{t,i},     θ'_t = θ_t − Σ_{i ∈ t} φ_{t,i}

has the same cost for every assignment, so ``Σ_i min θ'_i + Σ_t min θ'_t`` is below the cost of
every assignment, whatever φ is (that is the whole proof; the ascent only makes it larger). The
update at node i (MPLP's star update, Globerson & Jaakkola 2007) sets, from each incident term's
min-marginal μ_t(x_i) = min over the term's other nodes of θ_t − Σ_{j ≠ i} φ_{t,j}, and
δ = θ_i + Σ_t μ_t over the d terms at i, φ_{t,i} = μ_t − δ/(d + 1): each of the d + 1 terms then
holds δ/(d + 1), and the bound never decreases. Nodes are swept forward and backward until the
deadline, a sweep limit, or a sweep that gains less than a relative ``tolerance``.

Reduced-cost fixing: with bound L and a known plan of cost U, a configuration c of node i with
θ'_i(c) − min θ'_i > U − L is in no plan cheaper than U, and is dropped (the bound is then the
smaller of the dual's and U). Forbidden entries (`problem.forbidden`) are lowered to a finite
value above every plan's cost that avoids them: a relaxation, so the bound stays a bound.
Rounding: the reported value is lowered by a relative 1e-12 of the magnitudes summed
(`DualBound.value`). Pure: numpy only.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from .adjacency import Adjacency, build_adjacency
from .elimination import _condition, _Eliminator
from .problem import Problem, assignment_cost, forbidden

ROUNDING = 1e-12  # relative to the magnitudes summed into a bound
PRUNE_LEAST = 0.05  # prune only when at least this share of the configurations goes
CALL_ENTRIES = 2e4  # a numpy call's overhead, in table entries read (`DualBound.entries`)


@dataclasses.dataclass(frozen=True)
class BoundResult:
    """A proven lower bound of a problem's minimum and how it was reached."""

    value: float  # at most the cost of every assignment
    assignment: list[int]  # the best plan read off the dual (`DualBound.decode`)
    objective: float  # its cost
    sweeps: int
    time_s: float
    core_nodes: int  # nodes left after exact elimination
    pruned: float  # the share of the core's configurations pruned by reduced cost


class DualBound:
    """Star updates of the local polytope's dual on an (exactly reduced) problem; see the module
    docstring. ``value()`` is a lower bound of the minimum for any state of the updates."""

    def __init__(self, graph: Adjacency, offset: float = 0.0, expand=None, nodes=None):
        self.graph, self.offset = graph, offset
        # the problem's node of each node of ``graph`` (the others were eliminated)
        self.nodes = list(range(graph.num_nodes)) if nodes is None else list(nodes)
        # the whole problem's assignment from one of ``graph`` (identity when nothing reduced)
        self.expand = expand or (lambda x: [int(c) for c in x])
        n = graph.num_nodes
        self.nbrs = graph.nbrs
        self.unary = [np.asarray(u, dtype=np.float64) for u in graph.unary]
        self.mats = [list(row) for row in graph.mats]
        # the updates read single-precision copies (half the memory traffic): any φ gives a
        # valid bound, and `value` prices it on the float64 tables
        self.mats32 = [[m.astype(np.float32) for m in row] for row in graph.mats]
        self.index = [np.arange(len(u)) for u in self.unary]  # kept configurations of ``graph``
        where = [{j: k for k, j in enumerate(near)} for near in graph.nbrs]
        self.back = [[where[j][i] for j in graph.nbrs[i]] for i in range(n)]
        self.phi_edge = [[np.zeros(len(self.unary[i])) for _ in graph.nbrs[i]] for i in range(n)]
        self.factors = list(graph.factors.items())
        self.phi_fac = [[np.zeros(len(self.unary[v])) for v in key] for key, _ in self.factors]
        self.fac_at: list[list[tuple[int, int]]] = [[] for _ in range(n)]  # (factor, position)
        for f, (key, _) in enumerate(self.factors):
            for pos, v in enumerate(key):
                self.fac_at[v].append((f, pos))
        self.sweeps = 0
        self.cap = math.inf  # pruned configurations belong only to plans costing at least this

    @classmethod
    def of(cls, problem: Problem, table_budget: float = 1e6) -> DualBound:
        """Reduced first, exactly: variable elimination while its tables stay within
        ``table_budget`` entries; the bound of what is left plus the cost taken out."""
        return cls(*eliminated(_finite(problem), max(table_budget, 1.0)))

    def _factor_marginal(self, f: int, pos: int) -> np.ndarray:
        """min over the factor's other nodes of θ_f − Σ_{others} φ_{f,other}."""
        key, table = self.factors[f]
        t = table
        for p, phi in enumerate(self.phi_fac[f]):
            if p != pos:
                shape = [1] * len(key)
                shape[p] = len(phi)
                t = t - phi.reshape(shape)
        axes = tuple(p for p in range(len(key)) if p != pos)
        return t.min(axis=axes)

    def update(self, i: int) -> None:
        """The star update at node ``i``."""
        mus = [
            (self.mats32[i][k] - self.phi_edge[j][self.back[i][k]].astype(np.float32)).min(1)
            for k, j in enumerate(self.nbrs[i])
        ]
        fmus = [self._factor_marginal(f, pos) for f, pos in self.fac_at[i]]
        d = len(mus) + len(fmus)
        if not d:
            return
        share = (self.unary[i] + sum(mus) + sum(fmus)) / (d + 1)
        for k, mu in enumerate(mus):
            self.phi_edge[i][k] = mu - share
        for (f, pos), mu in zip(self.fac_at[i], fmus, strict=True):
            self.phi_fac[f][pos] = mu - share

    def sweep(self) -> None:
        """Every node once, alternately forward and backward."""
        n = self.graph.num_nodes
        order = range(n) if self.sweeps % 2 == 0 else range(n - 1, -1, -1)
        for i in order:
            self.update(i)
        self.sweeps += 1

    def reparametrized(self, i: int) -> np.ndarray:
        """θ'_i: node ``i``'s cost with every incident term's share."""
        return self.unary[i] + sum(self.phi_edge[i]) + sum(self.phi_fac_at(i))

    def value(self) -> float:
        """``Σ_i min θ'_i + Σ_t min θ'_t`` plus the eliminated offset, lowered by the rounding
        margin: at most the cost of every assignment (of every one costing less than
        ``cap``, once configurations were pruned)."""
        total, scale = self.offset, abs(self.offset)
        for i in range(self.graph.num_nodes):
            low = float(self.reparametrized(i).min())
            total, scale = total + low, scale + abs(low)
            for k, j in enumerate(self.nbrs[i]):
                if j > i:
                    m = self.mats[i][k]
                    rest = m - self.phi_edge[i][k][:, None] - self.phi_edge[j][self.back[i][k]]
                    low = float(rest.min())
                    total, scale = total + low, scale + abs(low) + float(np.abs(m).max())
        for f, (key, table) in enumerate(self.factors):
            t = table
            for p, phi in enumerate(self.phi_fac[f]):
                shape = [1] * len(key)
                shape[p] = len(phi)
                t = t - phi.reshape(shape)
            low = float(t.min())
            total, scale = total + low, scale + abs(low) + float(np.abs(table).max())
        return total - ROUNDING * scale

    def entries(self) -> float:
        """The work of a sweep, in table entries read: every edge from both ends, every factor
        (all of it) from each of its nodes, and `CALL_ENTRIES` for each of those reads (numpy's
        calls cost as much as reading that many entries)."""
        edges = sum(m.size for row in self.mats for m in row)
        ends = sum(len(row) for row in self.mats) + sum(len(key) for key, _ in self.factors)
        reads = sum(t.size * len(key) ** 2 for key, t in self.factors)  # each other's φ too
        return edges + reads + CALL_ENTRIES * ends

    def phi_fac_at(self, i: int) -> list[np.ndarray]:
        return [self.phi_fac[f][pos] for f, pos in self.fac_at[i]]

    def prune(self, upper: float, lower: float) -> int:
        """Reduced-cost fixing: with ``lower`` = `value` now, every plan whose node i takes c
        costs at least ``lower + θ'_i(c) − min θ'_i``; drop the configurations where that
        exceeds ``upper`` (the cost of a known plan), when at least `PRUNE_LEAST` of them go.
        Returns how many went."""
        slack = upper - lower + 1e-9 * max(abs(upper), 1e-300)
        keep = []
        for i in range(self.graph.num_nodes):
            r = self.reparametrized(i)
            keep.append(np.flatnonzero(r - r.min() <= slack))
        gone = sum(len(u) - len(k) for u, k in zip(self.unary, keep, strict=True))
        if gone < PRUNE_LEAST * sum(len(u) for u in self.unary):
            return 0  # slicing every table costs a sweep: not for a few configurations
        self.cap = min(self.cap, upper)
        for i, k in enumerate(keep):
            self.unary[i], self.index[i] = self.unary[i][k], self.index[i][k]
            self.phi_edge[i] = [phi[k] for phi in self.phi_edge[i]]
            for kk, j in enumerate(self.nbrs[i]):
                if i < j:
                    m = self.mats[i][kk][np.ix_(k, keep[j])]
                    self.mats[i][kk] = np.ascontiguousarray(m)
                    self.mats[j][self.back[i][kk]] = np.ascontiguousarray(m.T)
                    self.mats32[i][kk] = self.mats[i][kk].astype(np.float32)
                    self.mats32[j][self.back[i][kk]] = self.mats[j][self.back[i][kk]].astype(
                        np.float32
                    )
        for f, (key, table) in enumerate(self.factors):
            self.factors[f] = (key, table[np.ix_(*[keep[v] for v in key])])
            self.phi_fac[f] = [phi[keep[v]] for phi, v in zip(self.phi_fac[f], key, strict=True)]
        return gone

    def decode(self, sweeps: int = 20) -> list[int]:
        """A plan read off the dual: each node at its least reparametrized cost, improved by
        single-node moves on the true costs (at most ``sweeps`` passes), then expanded."""
        n = self.graph.num_nodes
        x = np.array([int(np.argmin(self.reparametrized(i))) for i in range(n)], dtype=np.int64)
        for _ in range(sweeps):
            moved = False
            for i in range(n):
                local = self.unary[i].copy()
                for k, j in enumerate(self.nbrs[i]):
                    local += self.mats[i][k][:, x[j]]
                for f, pos in self.fac_at[i]:
                    key, table = self.factors[f]
                    index = tuple(slice(None) if p == pos else x[v] for p, v in enumerate(key))
                    local += table[index]
                best = int(np.argmin(local))
                if local[best] < local[x[i]] - 1e-12 * max(1.0, abs(local[x[i]])):
                    x[i], moved = best, True
            if not moved:
                break
        return self.expand([int(self.index[i][c]) for i, c in enumerate(x)])


def dual_bound(
    problem: Problem,
    deadline: float = math.inf,
    max_sweeps: int = 200,
    tolerance: float = 1e-7,
    check_every: int = 5,
    table_budget: float = 1e6,
    upper: float = math.inf,
    work: float = math.inf,
) -> BoundResult:
    """A lower bound of ``problem``'s minimum (memory constraint ignored: a relaxation) and the
    best plan read off it: exact reduction (`DualBound.of`), then star updates until
    ``max_sweeps``, ``check_every`` sweeps gaining less than ``tolerance`` (relative), or
    ``work`` (table entries read by the sweeps, counted: deterministic), or ``deadline`` (a
    `time.perf_counter` instant: the only limit not counted, so the only one that may change
    the result; meant as a guard that never binds). At each check the plan read off the dual
    is priced, and configurations whose reduced cost puts every plan using them above the best
    known plan (it or ``upper``, the cost of a plan of ``problem``) are pruned: the sweeps then
    touch only what can still matter. The bound is then the smaller of the dual's value and
    that plan's cost."""
    t0 = time.perf_counter()
    dual = DualBound.of(problem, table_budget)
    start = sum(len(u) for u in dual.unary)
    best = dual.value()
    x = dual.decode()
    cost = assignment_cost(problem, x)
    spent = 0.0
    while dual.sweeps < max_sweeps and spent < work and time.perf_counter() < deadline:
        for _ in range(check_every):
            dual.sweep()
        spent += check_every * dual.entries()
        value = dual.value()
        gained = value - best
        best = max(best, value)
        y = dual.decode()
        if (c := assignment_cost(problem, y)) < cost:
            x, cost = y, c
        if min(cost, upper) <= best * (1 + 1e-9) or gained <= tolerance * max(abs(best), 1e-300):
            break
        dual.prune(min(cost, upper), value)
    left = sum(len(u) for u in dual.unary)
    return BoundResult(
        min(best, cost, dual.cap), x, cost, dual.sweeps, time.perf_counter() - t0,
        dual.graph.num_nodes, 1 - left / max(start, 1),
    )  # fmt: skip


def eliminated(
    problem: Problem, table_budget: float
) -> tuple[Adjacency, float, Callable, list[int]]:
    """What variable elimination leaves of ``problem`` while its tables stay within
    ``table_budget`` entries (cheapest first), with the cost it took out (the residual's minimum
    plus that offset is ``problem``'s minimum) and the expansion of a residual assignment to a
    whole one (each eliminated node at its best given its neighbours), and the residual's
    nodes."""
    fixed = {i: 0 for i, u in enumerate(problem.unary) if len(u) == 1}
    factors, offset, sizes = _condition(problem, fixed)
    elim = _Eliminator(factors, sizes)
    elim.run(table_budget)
    nodes = sorted(elim.adj)
    index = {v: k for k, v in enumerate(nodes)}
    unary = [np.zeros(sizes[v]) for v in nodes]
    edges: dict[tuple[int, int], np.ndarray] = {}
    higher: dict[tuple[int, ...], np.ndarray] = {}
    for key, table in elim.factors.items():
        table = np.broadcast_to(table, tuple(sizes[v] for v in key))
        if len(key) == 1:
            unary[index[key[0]]] = unary[index[key[0]]] + table
        elif len(key) == 2:
            i, j = index[key[0]], index[key[1]]
            t = table if i < j else table.T
            i, j = min(i, j), max(i, j)
            edges[(i, j)] = edges[(i, j)] + t if (i, j) in edges else np.asarray(t, np.float64)
        else:
            order = sorted(range(len(key)), key=lambda p: index[key[p]])
            k = tuple(index[key[p]] for p in order)
            t = np.ascontiguousarray(table.transpose(order), dtype=np.float64)
            higher[k] = higher[k] + t if k in higher else t

    def expand(x: Sequence[int]) -> list[int]:
        assign = dict(fixed)
        assign.update((v, int(c)) for v, c in zip(nodes, x, strict=True))
        elim.undo(assign)
        return [assign[i] for i in range(problem.num_nodes)]

    return build_adjacency(unary, edges, higher), offset + elim.offset, expand, nodes


def _finite(problem: Problem) -> Problem:
    """``problem`` with its forbidden entries lowered to a finite cost above every assignment
    that avoids them (a relaxation: every bound of it bounds ``problem``)."""
    tables: list[np.ndarray] = [*problem.unary, *problem.edges.values(), *problem.factors.values()]
    if not any(forbidden(t).any() for t in tables):
        return problem
    high = sum(float(np.max(t, initial=0.0, where=~forbidden(t))) for t in tables)
    big = 2.0 * abs(high) + 1.0

    def clip(t: np.ndarray) -> np.ndarray:
        return np.where(forbidden(t), np.minimum(np.nan_to_num(t, nan=np.inf), big), t)

    return Problem(
        [clip(u) for u in problem.unary],
        {k: clip(t) for k, t in problem.edges.items()},
        problem.blocks,
        {k: clip(t) for k, t in problem.factors.items()},
    )


def problem_with(problem: Problem, unary: Sequence[np.ndarray], scale: float) -> Problem:
    """``problem``'s pairwise and factor tables times ``scale`` with other ``unary`` costs."""
    return Problem(
        list(unary),
        {k: t * scale for k, t in problem.edges.items()},
        problem.blocks,
        {k: t * scale for k, t in problem.factors.items()},
    )
