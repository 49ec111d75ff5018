"""Incremental local search: per-node fields, single-node moves (ICM) and neighbourhoods solved
exactly with the rest of the plan held.

The field of node v is F_v(c) = u_v(c) + Σ_j E_vj[c, x_j] + the slices of v's factors at the
others' configurations: what the objective would be, up to a constant, with v at c. Changing
x_v updates only its neighbours' fields (O(deg · C)), so a move, and the conditioning of a
neighbourhood on the rest (`solve_region`: its nodes' fields less their edges inside), cost
what changes, never the whole problem.

Memory (optional, `MemoryLoad`): the usage per segment of program points is kept; with it a
move that would take a touched segment over the limit is refused, so a plan that fits keeps
fitting (the feasibility-preserving polish). Pure: numpy only.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterable, Sequence

import numpy as np

from .adjacency import Adjacency
from .cutset import minimize

ICM_CHECK = 512  # nodes between two looks at the clock in `LocalSearch.icm`


class MemoryLoad:
    """Usage per segment under the current plan (segments: `memory_prices.Segments`)."""

    def __init__(self, segments, x: Sequence[int]):
        self.segments = segments
        self.load = segments.load(x)

    def change(self, v: int, old: int, new: int) -> None:
        seg = self.segments
        d = seg.usage[v][new] - seg.usage[v][old]
        if d:
            self.load[seg.s0[v] : seg.s1[v]] += d

    def fits(self, v: int, old: int, new: int) -> bool:
        """Whether moving v from ``old`` to ``new`` keeps v's segments within the limit."""
        seg = self.segments
        d = seg.usage[v][new] - seg.usage[v][old]
        a, b = seg.s0[v], seg.s1[v]
        return d <= 0 or b <= a or self.load[a:b].max() + d <= seg.limit

    def within(self, nodes: Iterable[int]) -> bool:
        """Whether every segment of these nodes is within the limit."""
        seg = self.segments
        for v in nodes:
            a, b = seg.s0[v], seg.s1[v]
            if b > a and self.load[a:b].max() > seg.limit:
                return False
        return True


class LocalSearch:
    """A plan under improvement on ``graph`` with unary costs ``unary`` (default: the
    graph's; penalized ones under memory prices)."""

    def __init__(
        self,
        graph: Adjacency,
        x: Sequence[int],
        unary: Sequence[np.ndarray] | None = None,
        memory=None,
        seed: int = 0,
    ):
        self.graph = graph
        self.unary = graph.unary if unary is None else tuple(unary)
        self.x = np.array(x, dtype=np.int64)
        self.rng = random.Random(seed)
        self.memory = MemoryLoad(memory, self.x) if memory is not None else None
        self.fields = self._fields()
        self.value = float(sum(float(u[c]) for u, c in zip(self.unary, self.x, strict=True)))
        self.value += graph.cost(self.x, [np.zeros(len(u)) for u in self.unary])
        self.moves = self.region_tries = self.region_moves = self.region_refused = 0

    def _fields(self) -> list[np.ndarray]:
        graph, x = self.graph, self.x
        fields = [np.array(u, dtype=np.float64) for u in self.unary]
        for v, (near, mats) in enumerate(zip(graph.nbrs, graph.mats, strict=True)):
            for j, m in zip(near, mats, strict=True):
                fields[v] += m[:, x[j]]
        for key, t in graph.factors.items():
            for p, v in enumerate(key):
                fields[v] += t[tuple(slice(None) if q == p else x[u] for q, u in enumerate(key))]
        return fields

    def tolerance(self, value: float) -> float:
        """What counts as an improvement: relative 1e-9 (capped: values near the forbidden
        scale lose precision anyway)."""
        return 1e-9 * max(1.0, min(abs(value), 1e15))

    def set(self, v: int, c: int) -> None:
        """Move v to configuration c, updating fields, objective and memory load."""
        old = int(self.x[v])
        if old == c:
            return
        graph, fields = self.graph, self.fields
        self.value += float(fields[v][c] - fields[v][old])
        for j, m in zip(graph.nbrs[v], graph.mats[v], strict=True):
            fields[j] += m[c, :] - m[old, :]
        for key in graph.factor_of[v]:
            t = graph.factors[key]
            for p, u in enumerate(key):
                if u != v:
                    at = [slice(None) if q == p else self.x[w] for q, w in enumerate(key)]
                    before = t[tuple(at)]
                    at[key.index(v)] = c
                    fields[u] += t[tuple(at)] - before
        self.x[v] = c
        if self.memory is not None:
            self.memory.change(v, old, c)

    def best_move(self, v: int) -> int | None:
        """v's best configuration if it improves (and fits the memory), else None."""
        f = self.fields[v]
        cur = f[self.x[v]]
        bar = cur - self.tolerance(cur)
        if len(f) < 2 or f.min() >= bar:
            return None
        for c in np.argsort(f, kind="stable"):
            if f[c] >= bar:
                return None
            if self.memory is None or self.memory.fits(v, int(self.x[v]), int(c)):
                return int(c)
        return None

    def regrets(self, top: int) -> np.ndarray:
        """The ``top`` nodes that lose most to their best configuration (a neighbourhood
        around them most likely pays: where memory or neighbours hold them back)."""
        lost = np.array([f[c] - f.min() for f, c in zip(self.fields, self.x, strict=True)])
        top = min(top, len(lost))
        return np.argpartition(-lost, top - 1)[:top] if top else np.zeros(0, np.int64)

    def icm(
        self, nodes: Iterable[int] | None = None, sweeps: int = 50, deadline: float = math.inf
    ) -> int:
        """Single-node moves until none improves (at most ``sweeps`` passes, none started after
        ``deadline``, checked every `ICM_CHECK` nodes); returns moves."""
        graph = self.graph
        active = list(range(graph.num_nodes)) if nodes is None else list(nodes)
        moved = 0
        for _ in range(sweeps):
            changed: set[int] = set()
            for k, v in enumerate(active):
                if k % ICM_CHECK == 0 and time.perf_counter() > deadline:
                    break
                c = self.best_move(v)
                if c is not None:
                    self.set(v, c)
                    moved += 1
                    changed.add(v)
                    changed.update(graph.nbrs[v])
            if not changed:
                break
            active = sorted(changed)
        self.moves += moved
        return moved

    def region_factors(self, region: Sequence[int]) -> tuple[dict, float]:
        """The problem over ``region`` with the rest held: factors over local indices, and
        the current plan's value of it (the part of the objective the region changes)."""
        graph, x = self.graph, self.x
        local = {v: k for k, v in enumerate(region)}
        factors: dict[tuple[int, ...], np.ndarray] = {}
        current = 0.0
        for k, v in enumerate(region):
            unary = self.fields[v].copy()
            for j, m in zip(graph.nbrs[v], graph.mats[v], strict=True):
                kj = local.get(j)
                if kj is not None:
                    unary -= m[:, x[j]]
                    if k < kj:
                        factors[(k, kj)] = m
                        current += float(m[x[v], x[j]])
            factors[(k,)] = unary
        current += self._inner_factors(local, factors)
        for k, v in enumerate(region):
            current += float(factors[(k,)][x[v]])
        return factors, current

    def _inner_factors(self, local: dict[int, int], factors: dict) -> float:
        """Factors with two or more nodes in the region: their slices at the outside nodes'
        configurations join ``factors`` (taken out of the fields); returns their value."""
        graph, x = self.graph, self.x
        seen, value = set(), 0.0
        for v in local:
            for key in graph.factor_of[v]:
                inside = [u for u in key if u in local]
                if key in seen or len(inside) < 2:
                    continue
                seen.add(key)
                t = graph.factors[key]
                sub = t[tuple(slice(None) if u in local else x[u] for u in key)]
                for p, u in enumerate(inside):  # the field holds this factor's slice at x
                    at = tuple(slice(None) if q == p else x[w] for q, w in enumerate(inside))
                    factors[(local[u],)] = factors[(local[u],)] - sub[at]
                order = sorted(range(len(inside)), key=lambda q: local[inside[q]])
                loc_key = tuple(local[inside[q]] for q in order)
                sub = sub.transpose(order)
                factors[loc_key] = factors[loc_key] + sub if loc_key in factors else sub
                value += float(t[tuple(x[u] for u in key)])
        return value

    def solve_region(self, region: Sequence[int], budget: float = 1e5) -> float:
        """Re-optimize ``region`` exactly with the rest held (cutset conditioning past
        ``budget``); applies it when it improves (and fits the memory). Returns the gain."""
        self.region_tries += 1
        factors, current = self.region_factors(region)
        sizes = [len(self.unary[v]) for v in region]
        assign, value, _ = minimize(sizes, factors, [int(self.x[v]) for v in region], budget)
        gain = current - value
        if gain <= self.tolerance(current):
            return 0.0
        changes = [(v, c) for v, c in zip(region, assign, strict=True) if c != self.x[v]]
        old = [(v, int(self.x[v])) for v, _ in changes]
        for v, c in changes:
            self.set(v, c)
        if self.memory is not None and not self.memory.within(v for v, _ in changes):
            for v, c in old:
                self.set(v, c)
            self.region_refused += 1  # better, but over the memory limit
            return 0.0
        self.region_moves += 1
        return gain
