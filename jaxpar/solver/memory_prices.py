"""Memory inside the search: Lagrangian prices on segments of program points, their tuning, and
a greedy repair that makes a plan fit.

Program points are compressed to *segments*, the runs between consecutive interval endpoints
(the set of live nodes is constant on each). Segment k carries a price mu_k >= 0; node v then
pays lambda_v = Σ_{k in v's interval} mu_k per unit of usage above its least usage: the
penalized unary cost is u_v(c) + lambda_v (usage_v(c) - min usage_v). Segments that cannot
overflow (even every node at its largest usage fits) are never priced.

`PriceSchedule` tunes the prices: one scale on a set of segments (first those the unpriced plan
overflows), probed above the first price that fits, bracketed by geometric steps and bisected
(a fitting solution lowers it, an overflowing one raises it); then refined per segment.
Pure: numpy only.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np

from .problem import MemoryConstraint

MAX_SCALE = 1e30  # prices stay finite (and positive)
PROBES = (4.0, 16.0, 64.0)  # scales probed above the first fitting one (× it)
ALLOWED_BELOW = 1e19  # a field at or above this holds a forbidden entry (`domains.BIG`)


class Segments:
    """A `MemoryConstraint` over segments of program points."""

    def __init__(self, memory: MemoryConstraint):
        spans = memory.intervals
        live = spans[:, 1] > spans[:, 0]
        points = np.unique(np.concatenate([spans[live, 0], spans[live, 1]]))
        self.count = max(len(points) - 1, 0)  # segment k = [points[k], points[k+1])
        self.s0 = np.where(live, np.searchsorted(points, spans[:, 0]), 0)
        self.s1 = np.where(live, np.searchsorted(points, spans[:, 1]), 0)
        self.usage = memory.usage
        self.limit = memory.limit
        self.least = np.array([u.min() for u in self.usage])
        self.most = np.array([u.max() for u in self.usage])
        self.can_overflow = self._sum_over_segments(self.most) > self.limit
        self.least_load = self._sum_over_segments(self.least)  # every node at its least

    def _sum_over_segments(self, per_node: np.ndarray) -> np.ndarray:
        diff = np.zeros(self.count + 1)
        np.add.at(diff, self.s0, per_node)
        np.add.at(diff, self.s1, -per_node)
        return np.cumsum(diff)[: self.count]

    def load(self, x: Sequence[int]) -> np.ndarray:
        """Usage per segment under assignment ``x``."""
        return self._sum_over_segments(np.array([u[c] for u, c in zip(self.usage, x, strict=True)]))

    def overflow(self, x: Sequence[int]) -> float:
        """How far ``x``'s peak is over the limit (<= 0: it fits)."""
        load = self.load(x)
        return float(load.max() - self.limit) if len(load) else -self.limit

    def node_prices(self, mu: np.ndarray) -> np.ndarray:
        """lambda_v = Σ of mu over v's segments (prefix sums)."""
        total = np.concatenate([[0.0], np.cumsum(mu)])
        return total[self.s1] - total[self.s0]

    def penalized(self, unary: Sequence[np.ndarray], mu: np.ndarray) -> list[np.ndarray]:
        """Unary costs with usage above each node's least priced at its lambda."""
        lam = self.node_prices(mu)
        return [
            u + lam[v] * (self.usage[v] - self.least[v]) if lam[v] > 0 else u
            for v, u in enumerate(unary)
        ]

    def live_at(self, k: int) -> np.ndarray:
        """The nodes live on segment k."""
        return np.flatnonzero((self.s0 <= k) & (self.s1 > k))


class PriceSchedule:
    """Segment prices for the next Lagrangian solve, from the solutions so far.

    One scale on the segments the unpriced plan overflows. As soon as a scale gives a plan that
    fits, probes at 4, 16 and 64 times it (message passing is no exact solver: on IOPDDL A the plan
    that fits at the lowest fitting price costs 7.20e9, at 16-64 times it 6.92e9); then the
    scale is bracketed by ×8 steps and bisected to within 1.5×; then, at the bracket's top,
    per-segment factors go up (×1.6) where the latest plan overflows and down (×0.85) where it
    leaves 3 % slack, so the prices settle where plans near the limit are found (the rounds'
    caller repairs those)."""

    def __init__(self, segments: Segments, scale: float, unpriced_load: np.ndarray):
        """``scale``: the first price; ``unpriced_load``: usage per segment of the unpriced
        plan (its overflowing segments are priced first)."""
        self.segments = segments
        # the price on every segment of the shape
        self.scale = min(max(scale, 1 / MAX_SCALE), MAX_SCALE) if math.isfinite(scale) else 1.0
        self.low: float | None = None  # largest scale seen overflowing
        self.high: float | None = None  # smallest scale seen fitting
        over = (unpriced_load > segments.limit) & segments.can_overflow
        self.shape = over.astype(float)  # 1 on the priced segments
        self.refine = np.ones(segments.count)  # per-segment factors once bisected
        self.rounds = 0
        self.pending: list[float] = []  # probe scales still to try
        self.probed = self.probing = False  # probes scheduled on this shape; this round's

    def prices(self) -> np.ndarray:
        return self.scale * self.shape * self.refine

    def bisected(self) -> bool:
        """Whether the scale is bracketed within a factor of 1.5."""
        return self.low is not None and self.high is not None and self.high < 1.5 * self.low

    def update(self, load: np.ndarray) -> None:
        """Next prices after a solution with usage ``load`` per segment."""
        seg = self.segments
        over = (load > seg.limit) & seg.can_overflow
        self.rounds += 1
        if not self.probing:  # probes above the bracket leave it as it is
            self._bracket(over)
        self.probing = False
        if self.high is not None and not self.probed:
            # message passing is no exact solver: a higher price may give a cheaper plan
            # that fits (A: 6.92e9 at 64x the lowest fitting price, 7.20e9 at it); probe
            # above the first price that fits, then go on bracketing
            self.pending, self.probed = [self.high * p for p in PROBES], True
        if self.pending:
            self.scale, self.probing = self.pending.pop(0), True
        elif self.bisected():  # per segment: up where the plan overflows, down where slack
            self.scale = self.high
            self.refine[over] *= 1.6
            self.refine[load < 0.97 * seg.limit] *= 0.85
        elif self.low is not None and self.high is not None:
            self.scale = math.sqrt(self.low * self.high)
        elif self.high is None:
            self.scale = min(self.scale * 8.0, MAX_SCALE)
        else:
            self.scale = max(self.scale / 8.0, 1 / MAX_SCALE)

    def _bracket(self, over: np.ndarray) -> None:
        """Record the latest scale as overflowing (``over``: where) or fitting."""
        if over.any():
            if not self.shape.any():
                self.shape = over.astype(float)
            if self.low is None or self.scale >= self.low:
                self.low = self.scale
        elif self.high is None or self.scale < self.high:
            self.high = self.scale


def repair(search, deadline: float | None = None, max_steps: int = 1_000_000) -> bool:
    """Make the plan of ``search`` (a `local_search.LocalSearch` with memory) fit: while some
    segment is over the limit, at the worst one take the usage-lowering move with the least
    cost per unit of usage saved (moves to forbidden entries last). Returns whether it fits."""
    seg, load = search.memory.segments, search.memory.load
    for _ in range(max_steps):
        if not len(load):
            return True
        k = int(np.argmax(load))
        over = load[k] - seg.limit
        if over <= 0:
            return True
        if deadline is not None and time.perf_counter() > deadline:
            return False
        move = _cheapest_relief(search, seg, k, over, False)
        move = move or _cheapest_relief(search, seg, k, over, True)
        if move is None:
            return False
        search.set(*move)
    return False


def _cheapest_relief(search, seg: Segments, k: int, over: float, forbidden_ok: bool):
    """The move lowering usage on segment k at the least cost per unit saved: (node,
    configuration), or None."""
    best, best_score = None, math.inf
    for v in seg.live_at(k):
        usage, cur = seg.usage[v], int(search.x[v])
        field = search.fields[v]
        lower = np.flatnonzero((usage < usage[cur]) & ((field < ALLOWED_BELOW) | forbidden_ok))
        if not len(lower):
            continue
        dc = field[lower] - field[cur]
        score = np.maximum(dc, 0) / np.minimum(usage[cur] - usage[lower], over) + 1e-12 * dc
        j = int(np.argmin(score))
        if score[j] < best_score:
            best, best_score = (int(v), int(lower[j])), float(score[j])
    return best
