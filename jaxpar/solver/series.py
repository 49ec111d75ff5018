"""Series folding: exact elimination of the nodes whose tables stay over two nodes.

A node with one configuration conditions its neighbours; a leaf folds into its neighbour's unary
costs; a node of degree two folds into an edge between its two neighbours (OptCNN's node
elimination, Eq. 2, and edge elimination, Eq. 3). Repeated until none is left, this leaves a
*core* whose optimum, expanded, is the optimum of the whole (contest graphs: 80-95 % of the
nodes fold: A 34,932 -> ~6,600 nodes, M 32,894 -> ~1,900). Nodes in a factor over three or more
nodes, and ``protect``ed ones, stay. Vectorized per folded node; rerun whenever unary costs
change (memory prices). Pure: numpy only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import numpy as np

from .adjacency import Adjacency, build_adjacency


@dataclasses.dataclass(frozen=True)
class Core:
    """What series folding leaves, and how to undo it."""

    nodes: tuple[int, ...]  # core node -> node of the folded graph
    graph: Adjacency  # the core problem (nodes 0..len(nodes)-1)
    offset: float  # cost folded out as a constant
    steps: tuple  # folding records, replayed backwards by `expand`
    num_nodes: int  # nodes of the folded graph

    def expand(self, core_assignment: Sequence[int]) -> np.ndarray:
        """The whole graph's assignment from the core's: each folded node takes its best
        configuration given its neighbours, in reverse order of folding."""
        x = np.full(self.num_nodes, -1, dtype=np.int64)
        x[list(self.nodes)] = np.asarray(core_assignment, dtype=np.int64)
        for step in reversed(self.steps):
            if len(step) == 2:  # (v, configuration): alone or with one configuration
                x[step[0]] = step[1]
            elif len(step) == 3:  # (v, a, best configuration of v per configuration of a)
                x[step[0]] = step[2][x[step[1]]]
            else:  # (v, a, b, best of v per pair of configurations of a and b)
                x[step[0]] = step[3][x[step[1]], x[step[2]]]
        return x


def fold_series(
    graph: Adjacency, unary: Sequence[np.ndarray] | None = None, protect: Iterable[int] = ()
) -> Core:
    """Fold nodes of degree at most two (and nodes with one configuration) of ``graph`` under
    ``unary`` (default: the graph's own costs); ``protect``: nodes that stay."""
    n = graph.num_nodes
    un = [np.array(u, dtype=np.float64) for u in (graph.unary if unary is None else unary)]
    adj: list[dict[int, np.ndarray]] = [
        dict(zip(near, mats, strict=True))
        for near, mats in zip(graph.nbrs, graph.mats, strict=True)
    ]
    keep = np.zeros(n, bool)
    keep[[v for v in range(n) if graph.factor_of[v]]] = True
    keep[list(protect)] = True
    alive = np.ones(n, bool)
    steps: list[tuple] = []
    offset = _fold_single(un, adj, keep, alive, steps)
    stack = [v for v in range(n) if alive[v] and not keep[v] and len(adj[v]) <= 2]
    while stack:
        v = stack.pop()
        if not alive[v] or len(adj[v]) > 2:
            continue
        offset += _fold(v, un, adj, steps)
        alive[v] = False
        stack.extend(u for u in steps[-1][1:-1] if not keep[u] and len(adj[u]) <= 2)
    return _core(graph, un, adj, alive, steps, offset)


def _fold_single(un, adj, keep, alive, steps) -> float:
    """Condition the neighbours of every node with one configuration on it; returns the cost
    folded out."""
    offset = 0.0
    for v in range(len(un)):
        if len(un[v]) == 1 and not keep[v]:
            offset += float(un[v][0])
            for j, m in adj[v].items():
                un[j] += m[0, :]
                del adj[j][v]
            adj[v] = {}
            alive[v] = False
            steps.append((v, 0))
    return offset


def _fold(v: int, un, adj, steps) -> float:
    """Fold node v (degree 0, 1 or 2) into its neighbours; returns the cost folded out."""
    near = adj[v]
    adj[v] = {}
    if not near:
        k = int(np.argmin(un[v]))
        steps.append((v, k))
        return float(un[v][k])
    if len(near) == 1:
        ((a, m),) = near.items()  # m: [C_v, C_a]
        t = m + un[v][:, None]
        arg = t.argmin(0)
        un[a] += t[arg, np.arange(t.shape[1])]
        del adj[a][v]
        steps.append((v, a, arg))
        return 0.0
    (a, ma), (b, mb) = near.items()  # [C_v, C_a], [C_v, C_b]
    t = ma[:, :, None] + mb[:, None, :] + un[v][:, None, None]
    arg = t.argmin(0)  # [C_a, C_b]
    best = np.take_along_axis(t, arg[None], 0)[0]
    del adj[a][v], adj[b][v]
    if b in adj[a]:
        adj[a][b] = adj[a][b] + best
        adj[b][a] = adj[b][a] + best.T
    else:
        adj[a][b] = best
        adj[b][a] = np.ascontiguousarray(best.T)
    steps.append((v, a, b, arg))
    return 0.0


def _core(graph: Adjacency, un, adj, alive, steps, offset: float) -> Core:
    """The `Core` of what is left alive."""
    nodes = [int(v) for v in np.flatnonzero(alive)]
    index = {v: k for k, v in enumerate(nodes)}
    edges = {}
    for v in nodes:
        for j, m in adj[v].items():
            if v < j:
                edges[(index[v], index[j])] = m
    factors = {tuple(index[v] for v in key): t for key, t in graph.factors.items()}
    core = build_adjacency([un[v] for v in nodes], edges, factors)
    return Core(tuple(nodes), core, offset, tuple(steps), graph.num_nodes)
