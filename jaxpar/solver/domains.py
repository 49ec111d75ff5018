"""Domain reduction: the configurations no good plan uses, removed before the search.

1. A configuration whose own cost is forbidden (`problem.forbidden`) is removed.
2. Arc consistency on forbidden pairs: configuration a of node i is removed when, for some
   neighbour j, every configuration j still has makes a forbidden pair with a.
3. Dominance: a of i is removed when another configuration b of i is no worse in its own cost,
   its memory usage and every row of every incident edge (then any plan with a is matched or
   beaten by the same plan with b, memory included). Identical rows keep the lowest index.

Every step keeps every plan free of forbidden entries that is optimal, so a search over what is
left loses nothing. A node left with no configuration keeps them all (no plan avoids a forbidden
entry there). Forbidden entries that survive become `BIG`: finite, so differences of costs stay
defined, and far above any real cost. Pure: numpy only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from .problem import FORBIDDEN, MemoryConstraint, Problem, forbidden

BIG = 1e20  # a forbidden entry that reduction could not remove
DOMINANCE_WORK = 4e6  # largest comparison (configurations² × row length) dominance makes


@dataclasses.dataclass(frozen=True)
class Domains:
    """A problem over the configurations reduction kept, and the way back."""

    problem: Problem  # over the kept configurations; forbidden entries at BIG
    keep: tuple[np.ndarray, ...]  # node -> the original indices of its kept configurations
    stats: dict

    def to_original(self, assignment: Sequence[int]) -> list[int]:
        """An assignment of the reduced problem in the original problem's indices."""
        return [int(k[c]) for k, c in zip(self.keep, assignment, strict=True)]

    def from_original(self, assignment: Sequence[int]) -> list[int] | None:
        """An original assignment in the reduced indices; None when it uses a removed
        configuration."""
        out = []
        for k, c in zip(self.keep, assignment, strict=True):
            hit = np.flatnonzero(k == c)
            if not len(hit):
                return None
            out.append(int(hit[0]))
        return out


def reduce_domains(problem: Problem, dominance: bool = True) -> Domains:
    """Remove forbidden, unsupported and (with ``dominance``) dominated configurations."""
    alive = [~forbidden(u) for u in problem.unary]
    relaxed = [v for v, a in enumerate(alive) if not a.any()]
    for v in relaxed:
        alive[v] = np.ones(len(problem.unary[v]), bool)
    allowed = _allowed_pairs(problem)
    removed_arc = _arc_consistency(problem, alive, set(relaxed), allowed)
    keep = [np.flatnonzero(a) for a in alive]
    reduced = restrict_domains(problem, keep, set(allowed))
    removed_dominated = 0
    if dominance:
        removed_dominated = _remove_dominated(reduced, keep)
    stats = {
        "configurations_before": int(sum(len(u) for u in problem.unary)),
        "configurations_after": int(sum(len(u) for u in reduced.unary)),
        "removed_by_arc_consistency": removed_arc,
        "removed_dominated": removed_dominated,
        "nodes_without_allowed_configuration": len(relaxed),
    }
    return Domains(reduced, tuple(keep), stats)


def _allowed_pairs(problem: Problem) -> dict[tuple[int, int], np.ndarray]:
    """For each edge with a forbidden entry, where its pairs are allowed."""
    allowed = {}
    for key, table in problem.edges.items():
        if not table.max() < FORBIDDEN:  # one pass; NaN fails it too
            allowed[key] = ~forbidden(table)
    return allowed


def _arc_consistency(
    problem: Problem,
    alive: list[np.ndarray],
    relaxed: set[int],
    allowed: dict[tuple[int, int], np.ndarray],
) -> int:
    """Remove (in ``alive``, in place) configurations every allowed configuration of some
    neighbour forbids in pair (``allowed``: the edges with forbidden pairs); returns how many.
    A queue of nodes whose domain shrank."""
    n = problem.num_nodes
    touching: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for key in allowed:
        touching[key[0]].append(key)
        touching[key[1]].append(key)
    queue = [v for v in range(n) if touching[v]]
    queued = set(queue)
    removed = 0
    while queue:
        j = queue.pop()
        queued.discard(j)
        for key in touching[j]:
            i = key[0] if key[1] == j else key[1]
            if i in relaxed:
                continue
            ok = allowed[key]
            support = ok[:, alive[j]].any(1) if key[0] == i else ok[alive[j], :].any(0)
            new = alive[i] & support
            lost = int(alive[i].sum() - new.sum())
            if lost and new.any():  # an empty domain stays as it is (no plan avoids it)
                removed += lost
                alive[i] = new
                if i not in queued:
                    queued.add(i)
                    queue.append(i)
    return removed


def restrict_domains(
    problem: Problem, keep: Sequence[np.ndarray], with_forbidden: set | None = None
) -> Problem:
    """``problem`` over the configurations ``keep[v]`` of each node, forbidden entries at BIG
    (blocks kept; memory restricted alike). ``with_forbidden``: the edges that may hold a
    forbidden entry (None: any)."""
    unary = [np.where(forbidden(u[k]), BIG, u[k]) for u, k in zip(problem.unary, keep, strict=True)]
    full = [len(k) == len(u) for k, u in zip(keep, problem.unary, strict=True)]
    edges = {}
    for (i, j), table in problem.edges.items():
        sub = table if full[i] and full[j] else table[np.ix_(keep[i], keep[j])]
        if with_forbidden is None or (i, j) in with_forbidden:
            sub = np.where(forbidden(sub), BIG, sub)
        edges[(i, j)] = sub
    factors = {}
    for key, table in problem.factors.items():
        sub = table[np.ix_(*[keep[v] for v in key])]
        factors[key] = np.where(forbidden(sub), BIG, sub)
    memory = None
    if problem.memory is not None:
        usage = tuple(u[k] for u, k in zip(problem.memory.usage, keep, strict=True))
        memory = MemoryConstraint(problem.memory.intervals, usage, problem.memory.limit)
    return Problem(unary, edges, [list(b) for b in problem.blocks], factors, memory)


def _remove_dominated(problem: Problem, keep: list[np.ndarray]) -> int:
    """Remove dominated configurations from ``problem`` (and ``keep``) in place, node by node;
    returns how many."""
    n = problem.num_nodes
    incident: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for key in problem.edges:
        incident[key[0]].append(key)
        incident[key[1]].append(key)
    in_factor = {v for key in problem.factors for v in key}
    memory = problem.memory
    usage = list(memory.usage) if memory is not None else None
    removed = 0
    for v in range(n):
        c = len(problem.unary[v])
        if c < 2 or v in in_factor:
            continue
        rows = _rows(problem, v, incident[v], usage)
        if c * c * rows.shape[1] > DOMINANCE_WORK:
            continue
        sel = _undominated(rows)
        if len(sel) == c:
            continue
        removed += c - len(sel)
        keep[v] = keep[v][sel]
        problem.unary[v] = problem.unary[v][sel]
        for key in incident[v]:
            t = problem.edges[key]
            problem.edges[key] = t[sel, :] if key[0] == v else t[:, sel]
        if usage is not None:
            usage[v] = usage[v][sel]
    if memory is not None and removed:
        problem.memory = MemoryConstraint(memory.intervals, tuple(usage), memory.limit)
    return removed


def _rows(
    problem: Problem, v: int, incident: list[tuple[int, int]], usage: list[np.ndarray] | None
) -> np.ndarray:
    """Per configuration of v, everything a plan pays for it: own cost, usage, edge rows."""
    parts = [problem.unary[v][:, None]]
    if usage is not None:
        parts.append(usage[v][:, None])
    for key in incident:
        t = problem.edges[key]
        parts.append(t if key[0] == v else t.T)
    return np.concatenate(parts, axis=1)


def _undominated(rows: np.ndarray) -> np.ndarray:
    """Indices of the rows no other row dominates (no worse everywhere and better somewhere,
    or identical with a lower index)."""
    no_worse = (rows[None, :, :] <= rows[:, None, :]).all(2)  # [a, b]: b no worse than a
    same = no_worse & no_worse.T
    index = np.arange(len(rows))
    dominated = no_worse & (~same | (index[None, :] < index[:, None]))
    np.fill_diagonal(dominated, False)
    return np.flatnonzero(~dominated.any(1))
