"""Exact minimization of a small factor graph that always returns: variable elimination,
cheapest table first, with cutset conditioning past a table budget.

When the cheapest next elimination would build a table over ``budget`` entries, the remaining
variable with the most neighbours is held at its ``default`` configuration (conditioned) and
elimination goes on. The result is the exact minimum over the variables that were not held,
given the held ones: with ``default`` a current plan, never worse than it. Local search solves
its neighbourhoods with it (`local_search.LocalSearch.solve_region`). Pure: numpy only.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

import numpy as np

from .elimination import _view


class _Cutset:
    """Elimination state: factors by variable, the graph, and what was done (for undo)."""

    def __init__(self, sizes: Sequence[int], factors: dict[tuple[int, ...], np.ndarray]):
        self.sizes = list(sizes)
        self.factors = dict(factors)
        r = len(self.sizes)
        self.var_factors: list[set[tuple[int, ...]]] = [set() for _ in range(r)]
        self.adj: list[set[int]] = [set() for _ in range(r)]
        for key in self.factors:
            for v in key:
                self.var_factors[v].add(key)
                self.adj[v].update(u for u in key if u != v)
        self.logs = [math.log(max(s, 1)) for s in self.sizes]
        self.records: list[tuple] = []  # (v, rest, argmin table) or (v, None, held value)
        self.offset = 0.0
        self.held = 0

    def table_log(self, v: int) -> float:
        return self.logs[v] + sum(self.logs[u] for u in self.adj[v])

    def _add(self, key: tuple[int, ...], arr: np.ndarray) -> None:
        if not key:
            self.offset += float(arr)
        elif key in self.factors:
            self.factors[key] = self.factors[key] + arr
        else:
            self.factors[key] = arr
            for u in key:
                self.var_factors[u].add(key)

    def _detach(self, v: int) -> list[tuple[tuple[int, ...], np.ndarray]]:
        """Remove v's factors (returned) and v from the graph."""
        taken = []
        for key in list(self.var_factors[v]):
            taken.append((key, self.factors.pop(key)))
            for u in key:
                if u != v:
                    self.var_factors[u].discard(key)
        for u in self.adj[v]:
            self.adj[u].discard(v)
        self.var_factors[v] = set()
        return taken

    def hold(self, v: int, value: int) -> list[int]:
        """Condition v on ``value``; returns its former neighbours."""
        near = sorted(self.adj[v])
        for key, arr in self._detach(v):
            rest = tuple(u for u in key if u != v)
            self._add(rest, arr[tuple(value if u == v else slice(None) for u in key)])
        self.adj[v] = set()
        self.records.append((v, None, value))
        self.held += 1
        return near

    def eliminate(self, v: int) -> list[int]:
        """Min out v: one table over its neighbours; returns them."""
        rest = sorted(self.adj[v])
        pos = {u: k for k, u in enumerate(rest)}
        pos[v] = len(rest)
        full = (*(self.sizes[u] for u in rest), self.sizes[v])
        joint = np.zeros(full)
        for key, arr in self._detach(v):
            joint = joint + _view(arr, key, pos, len(pos), self.sizes)
        arg = joint.argmin(axis=-1)
        best = np.take_along_axis(joint, arg[..., None], axis=-1)[..., 0]
        self.records.append((v, rest, arg))
        for u in rest:
            self.adj[u].update(w for w in rest if w != u)
        self.adj[v] = set()
        self._add(tuple(rest), np.asarray(best))
        return rest

    def undo(self) -> list[int]:
        """The assignment: held values, and each eliminated variable's best given the rest."""
        assign = [-1] * len(self.sizes)
        for v, rest, arg in reversed(self.records):
            if rest is None:
                assign[v] = arg
            else:
                assign[v] = int(arg[tuple(assign[u] for u in rest)]) if rest else int(arg)
        return assign


def minimize(
    sizes: Sequence[int],
    factors: dict[tuple[int, ...], np.ndarray],
    default: Sequence[int],
    budget: float = 2e5,
) -> tuple[list[int], float, int]:
    """Minimize the sum of ``factors`` (key: sorted variables 0..r-1; one axis per variable)
    over variables with ``sizes[v]`` configurations. Returns (assignment, value, how many
    variables were held at ``default``)."""
    state = _Cutset(sizes, factors)
    alive = set(range(len(sizes)))
    log_budget = math.log(budget)
    version = [0] * len(sizes)
    heap = [(state.table_log(v), v, 0) for v in alive]
    heapq.heapify(heap)
    while alive:
        cost, v, ver = heapq.heappop(heap)
        if v not in alive or ver != version[v]:
            continue
        if cost > log_budget:  # too wide: hold the most connected variable instead
            heapq.heappush(heap, (cost, v, ver))
            v = max(alive, key=lambda u: len(state.adj[u]))
            touched = state.hold(v, int(default[v]))
        else:
            touched = state.eliminate(v)
        alive.discard(v)
        for u in touched:
            version[u] += 1
            heapq.heappush(heap, (state.table_log(u), u, version[u]))
    return state.undo(), state.offset, state.held
