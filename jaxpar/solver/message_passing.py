"""Min-sum message passing on the pairwise part of a problem, vectorized (no Python loop over
edges per iteration).

Directed edges are grouped by table shape (C_src, C_dst); one iteration is a few numpy calls per
group, messages kept flat on their destination's configurations. `MessagePassing.run` iterates
damped parallel min-sum and keeps the best plan decoded along the way (per node the argmin of
its belief, and every few iterations a sequential decode that replaces the messages of decoded
neighbours by their actual edge costs). Factors over three or more nodes are not passed
messages: the plans it proposes are priced and improved on the whole problem by the local
search. It proposes, it proves nothing. Pure: numpy only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from .adjacency import Adjacency


class MessagePassing:
    """Damped parallel min-sum over an `Adjacency`'s edges."""

    def __init__(self, graph: Adjacency):
        self.graph = graph
        sizes = graph.sizes
        self.sizes = sizes
        self.off = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.deg = np.array([len(x) for x in graph.nbrs], dtype=np.int64)
        self.src = np.repeat(np.arange(graph.num_nodes), self.deg)
        self.dst = np.array([j for near in graph.nbrs for j in near], dtype=np.int64)
        self.start = np.concatenate([[0], np.cumsum(self.deg)]).astype(np.int64)
        self.rev = self._reverse_edges()
        width = sizes[self.dst] if len(self.dst) else np.zeros(0, np.int64)
        self.moff = (np.cumsum(width) - width).astype(np.int64)
        # the node-configuration slot of every message entry
        self.pos = np.repeat(self.off[self.dst], width) + _ranges(width)
        self.msg = np.zeros(int(width.sum()))
        self.groups = self._groups()
        cmax = int(sizes.max()) if len(sizes) else 1
        self.pad = self.off[:-1, None] + np.minimum(np.arange(cmax)[None, :], sizes[:, None] - 1)
        self.pad_mask = np.arange(cmax)[None, :] >= sizes[:, None]
        self.u = np.concatenate(graph.unary) if graph.num_nodes else np.zeros(0)

    def _reverse_edges(self) -> np.ndarray:
        """For each directed edge (i -> j), the index of (j -> i)."""
        pairs = list(zip(self.src.tolist(), self.dst.tolist(), strict=True))
        where = {pair: e for e, pair in enumerate(pairs)}
        return np.array([where[(b, a)] for a, b in pairs], np.int64)

    def _groups(self) -> list[tuple]:
        """Directed edges grouped by table shape, with their tables stacked and the flat
        indices an iteration reads and writes."""
        mats = [m for row in self.graph.mats for m in row]
        by_shape: dict[tuple[int, int], list[int]] = {}
        for e, m in enumerate(mats):
            by_shape.setdefault(m.shape, []).append(e)
        groups = []
        for (a, b), es in by_shape.items():
            es = np.array(es, dtype=np.int64)
            tables = np.stack([mats[e] for e in es])
            src_idx = self.off[self.src[es]][:, None] + np.arange(a)[None, :]
            rev_idx = self.moff[self.rev[es]][:, None] + np.arange(a)[None, :]
            out_idx = self.moff[es][:, None] + np.arange(b)[None, :]
            groups.append((es, tables, src_idx, rev_idx, out_idx))
        return groups

    def beliefs(self) -> np.ndarray:
        """Unary cost plus incoming messages, per node configuration (flat)."""
        return self.u + np.bincount(self.pos, weights=self.msg, minlength=len(self.u))

    def decode(self, belief: np.ndarray) -> np.ndarray:
        """Per node the configuration of least belief."""
        padded = belief[self.pad]
        padded[self.pad_mask] = np.inf
        return padded.argmin(1)

    def iterate(self, damping: float = 0.5) -> None:
        """One damped parallel update of every message (normalized to minimum 0)."""
        belief = self.beliefs()
        new = np.empty_like(self.msg)
        for _es, tables, src_idx, rev_idx, out_idx in self.groups:
            into = belief[src_idx] - self.msg[rev_idx]  # [G, a]
            m = (into[:, :, None] + tables).min(1)  # [G, b]
            new[out_idx] = m - m.min(1, keepdims=True)
        self.msg = (1 - damping) * self.msg + damping * new

    def decode_sequential(self, belief: np.ndarray) -> np.ndarray:
        """Decode node by node in BFS order from the highest-degree node: a node's messages
        from decoded neighbours are replaced by the edge costs to their configurations."""
        graph, x = self.graph, np.full(self.graph.num_nodes, -1, dtype=np.int64)
        seen = np.zeros(graph.num_nodes, bool)
        for root in np.argsort(-self.deg):
            if seen[root]:
                continue
            queue, seen[root] = [int(root)], True
            for v in queue:  # grows while walked
                c = self.sizes[v]
                score = belief[self.off[v] : self.off[v] + c].copy()
                for k, (j, m) in enumerate(zip(graph.nbrs[v], graph.mats[v], strict=True)):
                    if x[j] >= 0:
                        into = self.moff[self.rev[self.start[v] + k]]
                        score += m[:, x[j]] - self.msg[into : into + c]
                    elif not seen[j]:
                        seen[j] = True
                        queue.append(j)
                x[v] = int(np.argmin(score))
        return x

    def pairwise_cost(self, x: np.ndarray) -> float:
        """The objective of ``x`` on the unary and pairwise tables (factors left out)."""
        total = float(self.u[self.off[:-1] + x].sum())
        for es, tables, *_ in self.groups:
            picked = tables[np.arange(len(es)), x[self.src[es]], x[self.dst[es]]]
            total += 0.5 * float(picked.sum())  # each edge is in two directions
        return total

    def run(
        self,
        iterations: int,
        damping: float = 0.5,
        sequential_every: int = 10,
        stop: Callable[[], bool] | None = None,
    ) -> tuple[np.ndarray, float]:
        """Iterate; returns the best decoded plan and its pairwise objective."""
        best_x, best = None, np.inf
        for k in range(iterations):
            self.iterate(damping)
            belief = self.beliefs()
            x = self.decode(belief)
            if sequential_every and (k % sequential_every == sequential_every - 1):
                xs = self.decode_sequential(belief)
                if self.pairwise_cost(xs) < self.pairwise_cost(x):
                    x = xs
            value = self.pairwise_cost(x)
            if value < best:
                best_x, best = x.copy(), value
            if stop is not None and stop():
                break
        if best_x is None:
            best_x = self.decode(self.beliefs())
            best = self.pairwise_cost(best_x)
        return best_x, best


def _ranges(width: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(w)`` for each w of ``width``."""
    if not len(width):
        return np.zeros(0, np.int64)
    total = int(width.sum())
    starts = np.cumsum(width) - width
    return np.arange(total) - np.repeat(starts, width)


class SequentialMessagePassing:
    """TRW-S (Kolmogorov 2006): sequential tree-reweighted min-sum over a node order.

    Every edge is a monotonic chain; node i weighs its belief by
    gamma_i = 1 / max(earlier neighbours, later neighbours). A forward pass updates the
    messages from each node to its later neighbours, a backward pass those to its earlier
    ones. Unlike parallel min-sum it does not oscillate, and on graphs with heavy clusters of
    hubs its plans are much better (IOPDDL M: 5.3e10 against 6.7e10 in 4 s). Decoding takes
    the nodes in order, each given its decoded neighbours' actual edge costs.
    """

    def __init__(self, graph: Adjacency):
        self.graph = graph
        n = graph.num_nodes
        self.incoming = [np.zeros((len(graph.nbrs[i]), len(graph.unary[i]))) for i in range(n)]
        where = [{j: k for k, j in enumerate(near)} for near in graph.nbrs]
        self.back = [[where[j][i] for j in graph.nbrs[i]] for i in range(n)]
        self.later = [[k for k, j in enumerate(near) if j > i] for i, near in enumerate(graph.nbrs)]
        self.earlier = [
            [k for k, j in enumerate(near) if j < i] for i, near in enumerate(graph.nbrs)
        ]
        sides = zip(self.later, self.earlier, strict=True)
        self.gamma = [1.0 / max(len(a), len(b), 1) for a, b in sides]

    def sweep(self, forward: bool) -> None:
        """One pass over the nodes, forward (messages to later neighbours) or backward."""
        graph, incoming = self.graph, self.incoming
        nodes = range(graph.num_nodes) if forward else range(graph.num_nodes - 1, -1, -1)
        for i in nodes:
            out = self.later[i] if forward else self.earlier[i]
            if not out:
                continue
            weighted = self.gamma[i] * (graph.unary[i] + incoming[i].sum(0))
            for k in out:
                m = ((weighted - incoming[i][k])[:, None] + graph.mats[i][k]).min(0)
                incoming[graph.nbrs[i][k]][self.back[i][k]] = m - m.min()

    def decode(self) -> np.ndarray:
        """Nodes in order, each at its best configuration given the decoded neighbours' edge
        costs and the other neighbours' messages."""
        graph = self.graph
        x = np.full(graph.num_nodes, -1, dtype=np.int64)
        for i in range(graph.num_nodes):
            score = graph.unary[i] + self.incoming[i].sum(0)
            for k in self.earlier[i]:
                score = score + graph.mats[i][k][:, x[graph.nbrs[i][k]]] - self.incoming[i][k]
            x[i] = int(np.argmin(score))
        return x

    def lower_bound(self) -> float:
        """A lower bound of the pairwise problem's minimum, valid for any messages (the
        reparametrization they define, LP dual of the local polytope)."""
        graph = self.graph
        bound = sum(
            float((u + inc.sum(0)).min()) for u, inc in zip(graph.unary, self.incoming, strict=True)
        )
        for i, near in enumerate(graph.nbrs):
            for k in self.later[i]:
                j = near[k]
                into_j = self.incoming[j][self.back[i][k]]
                rest = graph.mats[i][k] - self.incoming[i][k][:, None] - into_j[None, :]
                bound += float(rest.min())
        return bound

    def run(self, iterations: int, stop: Callable[[], bool] | None = None) -> Iterator[np.ndarray]:
        """Forward and backward passes; yields the decoded plan after each iteration."""
        for _ in range(iterations):
            self.sweep(True)
            self.sweep(False)
            yield self.decode()
            if stop is not None and stop():
                return
