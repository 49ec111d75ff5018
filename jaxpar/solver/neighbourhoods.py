"""Neighbourhoods chosen by graph structure, for the local search to solve exactly.

- a BFS ball around a seed node, frontier taken in random order (a hub's neighbours sampled);
- a star: a hub and a random part of its neighbours (the moves that need a hub and many of its
  neighbours to change at once);
- a sparse ball: nodes join only while they have at most two neighbours already inside, so the
  neighbourhood stays tree-like and eliminates exactly even when large.

Seeds are drawn among the nodes with a choice, half of them (when given) among the nodes whose
current configuration loses most to their best one (where a better plan most likely differs).
Pure: numpy only.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from .adjacency import Adjacency

HUB_SAMPLE = 64  # neighbours of a hub looked at when a region grows through it


def bfs_region(
    graph: Adjacency, rng: random.Random, seed: int, size: int, max_inside: int | None = None
) -> list[int]:
    """Up to ``size`` nodes around ``seed`` in random BFS order (nodes with one configuration
    left out). With ``max_inside``, a node joins only with at most that many neighbours
    already inside."""
    inside, order, frontier = {seed}, [seed], [seed]
    while frontier and len(order) < size:
        k = rng.randrange(len(frontier))
        v = frontier[k]
        frontier[k] = frontier[-1]
        frontier.pop()
        near = graph.nbrs[v]
        if len(near) > HUB_SAMPLE:
            near = rng.sample(near, HUB_SAMPLE)
        for u in near:
            if u in inside or len(graph.unary[u]) < 2:
                continue
            if max_inside is not None and _inside_count(graph, u, inside) > max_inside:
                continue
            inside.add(u)
            order.append(u)
            frontier.append(u)
            if len(order) >= size:
                break
    return order


def _inside_count(graph: Adjacency, u: int, inside: set[int]) -> int:
    near = graph.nbrs[u]
    if len(near) > HUB_SAMPLE:
        return HUB_SAMPLE  # a hub never joins a sparse ball through its neighbours
    return sum(w in inside for w in near)


def star_region(graph: Adjacency, rng: random.Random, hub: int, size: int) -> list[int]:
    """``hub`` and up to ``size - 1`` of its neighbours (random, with a choice)."""
    near = [u for u in graph.nbrs[hub] if len(graph.unary[u]) > 1]
    if len(near) > size - 1:
        near = rng.sample(near, size - 1)
    return [hub, *near]


class Neighbourhoods:
    """Draws neighbourhoods of a graph: balls, stars around hubs and sparse balls in turn."""

    def __init__(self, graph: Adjacency, rng: random.Random, size: int = 60):
        self.graph, self.rng, self.size = graph, rng, size
        self.movable = [v for v in range(graph.num_nodes) if len(graph.unary[v]) > 1]
        deg = np.array([len(graph.nbrs[v]) for v in self.movable], dtype=np.int64)
        cut = np.quantile(deg, 0.95) if len(deg) else 0
        self.hubs = [v for v, d in zip(self.movable, deg, strict=True) if d >= max(cut, 3)]
        self.turn = 0

    def draw(self, expensive: Sequence[int] = ()) -> list[int]:
        """The next neighbourhood; seeds from ``expensive`` (nodes losing most) half the
        time."""
        if not self.movable:
            return []
        rng, self.turn = self.rng, self.turn + 1
        if len(expensive) and rng.random() < 0.5:
            seed = int(expensive[rng.randrange(len(expensive))])
        else:
            seed = self.movable[rng.randrange(len(self.movable))]
        kind = self.turn % 4
        if kind == 1 and self.hubs:
            return star_region(self.graph, rng, self.hubs[rng.randrange(len(self.hubs))], 24)
        if kind == 3:
            return bfs_region(self.graph, rng, seed, 3 * self.size, max_inside=2)
        size = max(8, int(self.size * rng.uniform(0.5, 1.5)))
        return bfs_region(self.graph, rng, seed, size)
