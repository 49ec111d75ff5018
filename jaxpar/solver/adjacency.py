"""A problem in adjacency form, for the searches that walk a graph: per node its neighbours and
the edge tables oriented from it, plus the tables over three or more nodes (factors) each node
is in. Built once; the searches read it and never change it. Pure: numpy only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from .problem import Problem


@dataclasses.dataclass(frozen=True)
class Adjacency:
    """Unary costs, both orientations of every edge table, and the factors by node."""

    unary: tuple[np.ndarray, ...]  # node -> cost of each configuration
    nbrs: tuple[tuple[int, ...], ...]  # node -> its neighbours (one entry per neighbour)
    mats: tuple[tuple[np.ndarray, ...], ...]  # mats[v][k]: [C_v, C_nbrs[v][k]], contiguous
    factors: dict[tuple[int, ...], np.ndarray]  # as `Problem.factors`
    factor_of: tuple[tuple[tuple[int, ...], ...], ...]  # node -> keys of its factors

    @property
    def num_nodes(self) -> int:
        return len(self.unary)

    @property
    def sizes(self) -> np.ndarray:
        return np.array([len(u) for u in self.unary], dtype=np.int64)

    def edges(self):
        """Each edge once: (i, j, table [C_i, C_j]) with i < j."""
        for i, (near, mats) in enumerate(zip(self.nbrs, self.mats, strict=True)):
            for j, m in zip(near, mats, strict=True):
                if i < j:
                    yield i, j, m

    def cost(self, x: Sequence[int], unary: Sequence[np.ndarray] | None = None) -> float:
        """The objective of assignment ``x`` (``unary``: other unary costs to use)."""
        unary = self.unary if unary is None else unary
        total = sum(float(u[c]) for u, c in zip(unary, x, strict=True))
        total += sum(float(m[x[i], x[j]]) for i, j, m in self.edges())
        for key, t in self.factors.items():
            total += float(t[tuple(x[v] for v in key)])
        return total

    def with_unary(self, unary: Sequence[np.ndarray]) -> Adjacency:
        """The same graph with other unary costs."""
        return dataclasses.replace(self, unary=tuple(unary))


def adjacency(problem: Problem) -> Adjacency:
    """``problem`` in adjacency form (edges of the dict, both orientations)."""
    return build_adjacency(problem.unary, problem.edges, problem.factors)


def build_adjacency(
    unary: Sequence[np.ndarray],
    edges: dict[tuple[int, int], np.ndarray],
    factors: dict[tuple[int, ...], np.ndarray] | None = None,
) -> Adjacency:
    """An `Adjacency` from unary costs, edge tables ((i, j), i < j, one per pair) and factors."""
    n = len(unary)
    nbrs: list[list[int]] = [[] for _ in range(n)]
    mats: list[list[np.ndarray]] = [[] for _ in range(n)]
    for (i, j), t in edges.items():
        nbrs[i].append(j)
        mats[i].append(np.ascontiguousarray(t))
        nbrs[j].append(i)
        mats[j].append(np.ascontiguousarray(t.T))
    factors = dict(factors or {})
    factor_of: list[list[tuple[int, ...]]] = [[] for _ in range(n)]
    for key in factors:
        for v in key:
            factor_of[v].append(key)
    return Adjacency(
        tuple(np.asarray(u, dtype=np.float64) for u in unary),
        tuple(tuple(x) for x in nbrs),
        tuple(tuple(x) for x in mats),
        factors,
        tuple(tuple(x) for x in factor_of),
    )
