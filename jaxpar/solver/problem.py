"""The search problem: one configuration per node minimizing unary costs, pairwise cost
matrices (parallel edges summed: OptCNN's edge elimination, Eq. 3) and tables over three or
more nodes, optionally under a memory constraint (`MemoryConstraint`: each configuration uses
memory over an interval of program points, and the total at every point has a limit); the
budget a search works within and what it returns. A cost at or above `FORBIDDEN` (or infinite)
forbids a configuration or a pair. Pure: numpy only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

# a cost at or above this (or infinite, or NaN) forbids a configuration or a pair of them (the
# IOPDDL contest's files mark forbidden strategies with exactly 1e18)
FORBIDDEN = 1e18


@dataclasses.dataclass(frozen=True)
class MemoryConstraint:
    """Memory as a constraint: node v under configuration c uses ``usage[v][c]`` over the
    half-open interval ``[intervals[v, 0], intervals[v, 1])`` of program points (an empty
    interval uses nothing), and at every point the total over the nodes is at most ``limit``
    (equality allowed, as the contest's evaluator)."""

    intervals: np.ndarray  # int64 [n, 2]: start, end (exclusive)
    usage: tuple[np.ndarray, ...]  # node -> usage of each configuration
    limit: float

    def __post_init__(self) -> None:
        intervals = np.asarray(self.intervals, dtype=np.int64).reshape(-1, 2)
        if len(intervals) != len(self.usage):
            raise ValueError(
                f"MemoryConstraint: {len(intervals)} intervals for {len(self.usage)} nodes"
            )
        if len(intervals) and intervals.min() < 0:
            raise ValueError("MemoryConstraint: negative program point")
        empty = intervals[:, 1] <= intervals[:, 0]
        usage = tuple(
            np.zeros(len(u)) if dead else np.asarray(u, dtype=np.float64)
            for u, dead in zip(self.usage, empty, strict=True)
        )
        object.__setattr__(self, "intervals", intervals)
        object.__setattr__(self, "usage", usage)
        object.__setattr__(self, "limit", float(self.limit))

    @property
    def points(self) -> int:
        """Number of program points (one past the last interval's end)."""
        return int(self.intervals[:, 1].max()) if len(self.intervals) else 0

    def profile(self, assignment: Sequence[int]) -> np.ndarray:
        """Total usage at every program point under ``assignment``."""
        used = np.array([u[c] for u, c in zip(self.usage, assignment, strict=True)])
        diff = np.zeros(self.points + 1)
        np.add.at(diff, self.intervals[:, 0], used)
        np.add.at(diff, self.intervals[:, 1], -used)
        return np.cumsum(diff)[: self.points]

    def peak(self, assignment: Sequence[int]) -> float:
        """The largest total usage over the program points."""
        prof = self.profile(assignment)
        return float(prof.max()) if len(prof) else 0.0

    def fits(self, assignment: Sequence[int]) -> bool:
        """Whether ``assignment`` stays within the limit at every program point."""
        return self.peak(assignment) <= self.limit


def forbidden(values: np.ndarray | float) -> np.ndarray:
    """Where costs forbid (at or above `FORBIDDEN`, infinite or NaN)."""
    return ~(np.asarray(values) < FORBIDDEN)


@dataclasses.dataclass
class Problem:
    """One configuration per node; unary costs per node, pairwise costs per edge, and cost
    tables over three or more nodes (a reshard shared by several readers, priced once)."""

    unary: list[np.ndarray]  # node -> cost of each of its configurations
    edges: dict[tuple[int, int], np.ndarray]  # (i, j), i < j -> cost matrix [C_i, C_j]
    blocks: list[list[int]] = dataclasses.field(default_factory=list)  # decomposition fallback
    factors: dict[tuple[int, ...], np.ndarray] = dataclasses.field(default_factory=dict)
    # (v1 < v2 < v3 ...) -> cost array [C_v1, C_v2, C_v3, ...]
    memory: MemoryConstraint | None = None  # a limit on the usage at every program point

    @property
    def num_nodes(self) -> int:
        return len(self.unary)

    def add_edge(self, i: int, j: int, table: np.ndarray) -> None:
        """Add a pairwise table; parallel edges sum (edge elimination, OptCNN Eq. 3)."""
        if i == j:
            self.unary[i] = self.unary[i] + np.diag(table)
            return
        if i > j:
            i, j, table = j, i, table.T
        if (i, j) in self.edges:
            self.edges[(i, j)] = self.edges[(i, j)] + table
        else:
            self.edges[(i, j)] = np.asarray(table, dtype=np.float64)

    def add_factor(self, nodes: tuple[int, ...], table: np.ndarray) -> None:
        """Add a cost table over distinct ``nodes`` (axis k of ``table`` is nodes[k])."""
        if len(set(nodes)) != len(nodes):
            raise ValueError(f"add_factor needs distinct nodes, got {nodes}")
        order = sorted(range(len(nodes)), key=lambda k: nodes[k])
        key = tuple(nodes[k] for k in order)
        table = np.asarray(table, dtype=np.float64).transpose(order)
        if len(key) == 1:
            self.unary[key[0]] = self.unary[key[0]] + table
        elif len(key) == 2:
            self.add_edge(key[0], key[1], table)
        elif key in self.factors:
            self.factors[key] = self.factors[key] + table
        else:
            self.factors[key] = table


@dataclasses.dataclass(frozen=True)
class SearchBudget:
    """How hard the search may work (sizes in table entries / assignments)."""

    table: float = 4e6  # largest elimination table for the exact attempt
    block: float = 2.5e5  # largest table inside a decomposition block
    enum: float = 2e6  # largest residual graph enumerated exhaustively
    max_rounds: int = 6  # coordinate-descent rounds per starting point
    max_starts: int = 3  # descent runs from this many of the best starting assignments

    def __post_init__(self) -> None:
        for name in ("table", "block", "enum", "max_rounds", "max_starts"):
            if not getattr(self, name) >= 1:
                raise ValueError(f"SearchBudget.{name}={getattr(self, name)!r}; must be >= 1")


@dataclasses.dataclass(frozen=True)
class Solution:
    """A search result: an assignment, its objective, and whether the search certified it."""

    assignment: list[int]  # configuration index per node
    objective: float
    optimal: bool  # exact minimum of the problem it solved
    stats: dict  # search statistics (eliminations, residual size, time, rounds)


def assignment_cost(problem: Problem, assignment: Sequence[int]) -> float:
    """Objective of a complete assignment (Eq. 1)."""
    total = sum(float(u[assignment[i]]) for i, u in enumerate(problem.unary))
    for (i, j), t in problem.edges.items():
        total += float(t[assignment[i], assignment[j]])
    for key, t in problem.factors.items():
        total += float(t[tuple(assignment[v] for v in key)])
    return total


def improves(new: float, old: float) -> bool:
    """Whether objective ``new`` is lower than ``old`` by more than float noise (relative 1e-12):
    descents stop on a step that only rounds differently."""
    return new < old - 1e-12 * max(1.0, abs(old))


def fits_memory(problem: Problem, assignment: Sequence[int]) -> bool:
    """Whether ``assignment`` meets the problem's memory constraint (True when it has none)."""
    return problem.memory is None or problem.memory.fits(assignment)


def brute_force(problem: Problem, chunk: int = 1 << 18) -> tuple[list[int], float]:
    """Enumerate every assignment, vectorized in chunks (exponential: tests, and
    `descent.solve_within` on tiny problems over the memory limit). Under a memory constraint
    only the assignments that fit count; (None, inf) when none does."""
    sizes = [len(u) for u in problem.unary]
    total = math.prod(sizes)
    best, best_val = None, math.inf
    for start in range(0, total, chunk):
        flat = np.arange(start, min(total, start + chunk))
        idx = np.unravel_index(flat, sizes)
        cost = np.zeros(len(flat))
        for i, u in enumerate(problem.unary):
            cost += u[idx[i]]
        for (i, j), t in problem.edges.items():
            cost += t[idx[i], idx[j]]
        for key, t in problem.factors.items():
            cost += t[tuple(idx[v] for v in key)]
        if problem.memory is not None:
            cost[_over_limit(problem.memory, idx)] = math.inf
        k = int(np.argmin(cost))
        if cost[k] < best_val:
            best_val = float(cost[k])
            best = [int(x[k]) for x in idx]
    return best, best_val


def _over_limit(memory: MemoryConstraint, idx: Sequence[np.ndarray]) -> np.ndarray:
    """Which of the enumerated assignments (``idx[v]``: node v's configuration in each) break
    the memory limit at some program point."""
    profile = np.zeros((len(idx[0]), memory.points + 1))
    for v, (start, end) in enumerate(memory.intervals):
        if end > start:
            profile[:, start:end] += memory.usage[v][idx[v]][:, None]
    return (profile > memory.limit).any(axis=1)
