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

from collections.abc import Callable

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
