"""SoyBean's k-cut search (Wang et al. §4.2-4.3, Algorithm 1) over the planner's cost tables.

A configuration assigns each mesh axis an iteration dimension (or none). k-cut decides it one
mesh axis at a time: one *cut* per axis, slowest interconnect first (SoyBean §5.1 maps the first
cut to the slowest link; ties: the larger axis, then mesh order). At cut k every node chooses
which iteration dim axis a_k splits, or none, with the axes of earlier cuts held at their chosen
dims and the axes of later cuts unused (replicated). Each cut is an exact DP over the whole graph:
the full problem's tables are already indexed by each node's configuration list, so a cut is the
same `Problem` restricted, per node, to the few configurations consistent with that state
(`restrict`: unary vectors and edge matrices sub-indexed), solved by `search.solve_exact`. When
a cut is too wide even so, block coordinate descent (`search.solve`) from the projected starting
points takes over and the cut is recorded as not exact.

Composition (Theorem 2, flattening). SoyBean's k-cut tiling ``P_1 ∘ … ∘ P_k`` equals the one
tiling ``R^{k_r} C^{k_c} r^{k_rep}``, whatever the order of the cuts. A configuration here *is*
such a flattened tiling: per tensor dim, the product of the mesh axes assigned to it. Composing
the cuts is therefore just filling in each axis's entry, and the cost of the composition is the
cost model evaluated on the combined configuration (`search.evaluate`). That replaces the paper's
Theorem 1 (``c_k = Σ 2^{k-i} δ_i``, total bytes across binary cuts) by the model's own accounting
of every collective on the composed layouts.

What differs from the paper:

- Cuts are mesh axes of any size (a 4-way axis is one cut), not binary splits; the number of
  cuts is the mesh rank.
- The DP is our elimination over the whole graph (exact for a cut: few choices per node), not
  the DP over BFS levels.
- A cut minimizes the cost model's value of the *partial* configuration (later axes replicated),
  which includes compute and the earlier axes' collectives re-priced on the newly split tensors,
  not only the new cut's conversion cost δ_k.
- SoyBean's objective is bytes moved with every operator split at every cut; under
  ``objective="comm"`` the planner keeps contractions at full degree, and `kcut` takes the final
  configurations (``final``) separately from the ones a cut may pass through, so a contraction
  splits on every cut there as well. Under ``objective="time"`` nothing forces a split.
- Theorem 3 (greediness ⇒ optimality) needs SoyBean's pure-bytes cost; under this model k-cut
  is a heuristic. Its result is certified only when its reported cost reaches the exact lower
  bound that elimination computes (`choose`).

`recut` re-makes one cut at a time with the other axes held, from a full assignment: the
planner alternates it with block descent (`choose._run_elimination`).

Pure: numpy only.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np

from .descent import solve
from .elimination import eliminates, solve_exact
from .problem import Problem, SearchBudget, assignment_cost, improves

Config = tuple[int, ...]


@dataclasses.dataclass
class Cut:
    """One cut: the axis it decides and how its DP went."""

    axis: int  # mesh axis index
    size: int
    bandwidth: float  # bytes/s of the link the axis spans
    exact: bool  # the cut's restricted problem was solved exactly (elimination)
    objective: float  # cost model value of the partial configuration after this cut
    time_s: float
    max_choices: int  # largest number of choices a node had in this cut
    relaxed_nodes: int  # nodes with no choice leaving later axes unused (kept their finals)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class KCutResult:
    assignment: list[int]  # configuration index per node (into ``configs``)
    objective: float  # `evaluate` of the assignment
    cuts: list[Cut]  # in the order they were made

    @property
    def exact_cuts(self) -> bool:
        return all(c.exact for c in self.cuts)


def cut_order(sizes: Sequence[int], bandwidth: Sequence[float]) -> list[int]:
    """Mesh axes, slowest link first; ties: larger axis first, then mesh order."""
    return sorted(range(len(sizes)), key=lambda a: (bandwidth[a], -sizes[a], a))


def restrict(problem: Problem, keep: Sequence[Sequence[int]]) -> Problem:
    """The problem over ``keep[v]`` (configuration indices) of each node: sub-indexed tables."""
    idx = [np.asarray(k, dtype=np.int64) for k in keep]
    for v, k in enumerate(idx):
        if k.size == 0:
            raise ValueError(f"node {v} keeps no configuration")
    unary = [np.asarray(u)[k] for u, k in zip(problem.unary, idx, strict=True)]
    edges = {(i, j): t[np.ix_(idx[i], idx[j])] for (i, j), t in problem.edges.items()}
    factors = {key: t[np.ix_(*(idx[v] for v in key))] for key, t in problem.factors.items()}
    blocks = [list(b) for b in problem.blocks]
    return Problem(unary=unary, edges=edges, blocks=blocks, factors=factors)


def project(assignment: Sequence[int], keep: Sequence[Sequence[int]]) -> list[int] | None:
    """``assignment`` as indices into ``keep``; None when some node's choice is not kept."""
    out = []
    for a, k in zip(assignment, keep, strict=True):
        pos = {c: i for i, c in enumerate(k)}.get(a)
        if pos is None:
            return None
        out.append(pos)
    return out


def kcut(
    problem: Problem,
    configs: Sequence[Sequence[Config]],
    sizes: Sequence[int],
    bandwidth: Sequence[float],
    final: Sequence[Sequence[int]] | None = None,
    starts: Sequence[Sequence[int]] = (),
    budget: SearchBudget | None = None,
) -> KCutResult:
    """One exact DP per mesh axis, slowest first (see module docstring).

    ``configs[v]``: node v's configurations, which ``problem`` indexes. ``final[v]``: the indices
    a result may end on (default all); a cut only offers a node choices that some final
    configuration extends. ``starts``: full assignments (indices into ``configs``), projected
    onto a cut when it has to fall back to coordinate descent.
    """
    budget = budget or SearchBudget()
    n = problem.num_nodes
    k = len(sizes)
    arrs = [np.asarray(c, dtype=np.int64).reshape(len(c), k) for c in configs]
    finals = (
        [np.arange(len(c)) for c in configs] if final is None else [np.asarray(f) for f in final]
    )
    order = cut_order(sizes, bandwidth)
    chosen = np.full((n, k), -1, dtype=np.int64)  # per node, the dim of each decided axis
    assignment = [0] * n
    cuts: list[Cut] = []
    for pos, axis in enumerate(order):
        t0 = time.perf_counter()
        earlier, later = order[:pos], order[pos + 1 :]
        keep: list[np.ndarray] = []
        relaxed = 0
        for v in range(n):
            arr = arrs[v]
            ok = np.all(arr[:, earlier] == chosen[v, earlier], axis=1)
            fin = finals[v][ok[finals[v]]]
            allowed = np.isin(arr[:, axis], arr[fin, axis])
            cand = np.flatnonzero(ok & allowed & np.all(arr[:, later] == -1, axis=1))
            if cand.size == 0:  # e.g. a pinned node: keep its consistent final configurations
                cand, relaxed = fin, relaxed + 1
            if cand.size == 0:
                raise ValueError(f"k-cut: node {v} has no configuration left at axis {axis}")
            keep.append(cand)
        sub = restrict(problem, keep)
        exact = eliminates(sub, budget.table, budget.enum)[0]
        if exact:
            local, value, _ = solve_exact(sub, None, budget.table, budget.enum)
        else:
            sub_starts = [_nearest(s, keep, arrs, axis) for s in starts]
            sub_starts.append([0] * n)
            if pos:
                sub_starts.append(_nearest(assignment, keep, arrs, axis))
            sol = solve(sub, sub_starts, budget)
            local, value, exact = sol.assignment, sol.objective, False
        assignment = [int(keep[v][local[v]]) for v in range(n)]
        for v in range(n):
            chosen[v, axis] = arrs[v][assignment[v], axis]
        cuts.append(
            Cut(
                axis=axis,
                size=int(sizes[axis]),
                bandwidth=float(bandwidth[axis]),
                exact=exact,
                objective=float(value),
                time_s=time.perf_counter() - t0,
                max_choices=max(len(c) for c in keep),
                relaxed_nodes=relaxed,
            )
        )
    return KCutResult(assignment, assignment_cost(problem, assignment), cuts)


def recut(
    problem: Problem,
    configs: Sequence[Sequence[Config]],
    start: Sequence[int],
    budget: SearchBudget | None = None,
    max_rounds: int = 8,
) -> tuple[list[int], float]:
    """Re-make one cut at a time with the others held: descent over mesh axes.

    For each mesh axis in turn, every node may change the iteration dim that axis splits (or
    leave it unused) while its other axes keep their dims in ``start``: the problem restricted
    to those configurations has a few choices per node and is solved exactly (block descent from
    the current assignment when too wide). Rounds over the axes repeat until none improves (at
    most ``max_rounds``). Block descent changes every axis of a few nodes; this changes one axis
    of every node, so each escapes the other's local minima. Never worse than ``start``.
    """
    budget = budget or SearchBudget()
    n = problem.num_nodes
    k = len(configs[0][0]) if configs and configs[0] else 0
    arrs = [np.asarray(c, dtype=np.int64).reshape(len(c), k) for c in configs]
    x, val = [int(a) for a in start], assignment_cost(problem, start)
    settled: set[int] = set()  # axes solved since the assignment last changed
    for _ in range(max_rounds):
        for axis in range(k):
            if axis in settled:
                continue
            others = [a for a in range(k) if a != axis]
            keep = [
                np.flatnonzero(np.all(arrs[v][:, others] == arrs[v][x[v], others], axis=1))
                for v in range(n)
            ]
            sub = restrict(problem, keep)
            if eliminates(sub, budget.table, budget.enum)[0]:
                local = solve_exact(sub, None, budget.table, budget.enum)[0]
            else:
                here = [int(np.flatnonzero(keep[v] == x[v])[0]) for v in range(n)]
                local = solve(sub, [here], budget).assignment
            y = [int(keep[v][local[v]]) for v in range(n)]
            value = assignment_cost(problem, y)
            if improves(value, val):
                x, val, settled = y, value, set()
            settled.add(axis)
        if len(settled) == k:
            break
    return x, val


def recut_and_descend(
    problem: Problem,
    configs: Sequence[Sequence[Config]],
    start: Sequence[int],
    budget: SearchBudget | None = None,
    rounds: int = 4,
) -> tuple[list[int], float]:
    """`recut`, then block descent from its result (`search.solve`), alternating until descent
    keeps the re-cut plan or nothing improves (at most ``rounds`` times). Never worse than
    ``start``."""
    x, value = list(start), assignment_cost(problem, start)
    for _ in range(rounds):
        y, cut_value = recut(problem, configs, x, budget)
        if not improves(cut_value, value):
            break
        # block descent alone: the local search ran on the plan this alternation starts from
        again = solve(problem, starts=[y], budget=budget, local_search=False)  # no worse than y
        x, value = list(again.assignment), again.objective
        if x == y:
            break  # descent kept the re-cut plan: re-cutting it again changes nothing
    return x, value


def _nearest(
    start: Sequence[int], keep: Sequence[np.ndarray], arrs: Sequence[np.ndarray], axis: int
) -> list[int]:
    """Per node, the kept choice splitting ``axis`` as ``start`` does (else the first kept)."""
    out = []
    for v, cand in enumerate(keep):
        want = arrs[v][start[v], axis]
        hits = np.flatnonzero(arrs[v][cand, axis] == want)
        out.append(int(hits[0]) if hits.size else 0)
    return out
