"""Lower bounds of every plan's reported cost where exact elimination proves none, and the
plans read off them (docs/search.md, "Bounds where elimination cannot reach").

- **Eq. 1 and bytes** ("time", "comm"): the LP dual bound (`solver/bounds.dual_bound`) of the
  ``bound`` problem (`CostTables.bound`: every plan's reported cost is at least its cost), over
  the searched space (tied layers, HyPar's space).
- **The overlapped step** ("overlap"): its compute stream runs every node's t_C, so the step is
  at least C(a) = Σ t_C; its communication stream runs every reshard step, partial sum, halo
  and gradient all-reduce one after another, so the step is at least their total. The combiner
  merges all-reduces, and a merged one pays one latency for all: an all-reduce's latency is
  taken off (`combinable_latency`), which leaves X(a) = ``bound``'s unary tables less t_C, t_H
  and that latency, with ``bound``'s reshard tables: a lower bound of the communication
  stream's busy time. For every λ in [0, 1], step ≥ max(C, X) ≥ λ C + (1 − λ) X, one more
  problem whose dual bound bounds every plan's step; λ is searched by the supergradient's sign
  (C − X of the plan read off the dual) from 1/2, a few steps, and the best bound is kept.

Each dual's decoded plan is one more candidate of the search. The certificate compares the
plan's reported cost with the best bound; ``optimal`` only where they meet (within 1e-9).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from ..cost.evaluation import EvalContext
from ..cost.node_costs import node_collectives
from ..hardware.collectives import ALL_REDUCE, ring_steps
from ..solver.bounds import dual_bound
from ..solver.problem import Problem, assignment_cost

# variable elimination before the dual, within tables of this many entries (exact: it only
# makes what the dual sees smaller and its bound tighter)
BOUND_TABLE = 1e6
BOUND_SWEEPS = 150  # star updates per dual at most (counted, so plans stay deterministic)
# and at most this much work (table entries read, `DualBound.entries`) in one dual's sweeps
# (counted too: about 1 s on this machine; it binds on 4-axis meshes, 52 M entries a sweep
# before pruning, and on untied steps with many shared reshards); a λ dual gets half
BOUND_WORK = 5e8
LAMBDA_STEPS = 4  # duals of λ C + (1 − λ) X tried under "overlap"
BELOW_FLOOR = 2  # stop after this many in a row below the compute stream's bound


@dataclasses.dataclass(frozen=True)
class Bounded:
    """A lower bound over the searched space and the plans read off its duals."""

    value: float | None  # every plan of the space reports at least this (None: no bound)
    plans: list[list[int]]  # decoded plans, as assignments of the searched (narrowed) problem
    stats: dict


def search_bound(problem: Problem, deadline: float = math.inf, upper: float = math.inf) -> Bounded:
    """The dual bound of ``problem`` (a lower bound of the reported cost of every plan of its
    space) and the plan read off it; ``upper``: the cost of a known plan of ``problem`` (what
    the dual prunes against)."""
    res = dual_bound(
        problem, deadline, BOUND_SWEEPS, table_budget=BOUND_TABLE, upper=upper, work=BOUND_WORK
    )
    stats = {
        "sweeps": res.sweeps, "core_nodes": res.core_nodes, "time_s": res.time_s,
        "pruned": res.pruned,
    }  # fmt: skip
    return Bounded(res.value, [res.assignment], stats)


def combinable_latency(ctx: EvalContext) -> list[np.ndarray]:
    """Per node and configuration, the latency of its all-reduces over two or more devices,
    all iterations: at most what XLA's combiner can save them (`evaluate._combine` takes off
    at most this per all-reduce)."""
    ng, tables, mesh = ctx.ng, ctx.tables, ctx.params.mesh
    out, memo = [], {}
    for node, cfgs in zip(ng.nodes, tables.configs, strict=True):
        trips = ng.program.trips(node.region)
        row = np.zeros(len(cfgs))
        for i, cfg in enumerate(cfgs):
            for c in node_collectives(ng, node, cfg, mesh):
                if c.kind == ALL_REDUCE and c.group_size > 1:
                    if c.axes not in memo:
                        n, _, latency = mesh.group(c.axes)
                        memo[c.axes] = latency * ring_steps(ALL_REDUCE, n)
                    row[i] += memo[c.axes] * trips
        out.append(row)
    return out


def streams_problems(ctx: EvalContext, bound: Problem) -> tuple[list[np.ndarray], Problem]:
    """C (t_C per node and configuration) and the problem X whose cost bounds below the
    communication stream's busy time of every plan (see the module docstring)."""
    tables = ctx.tables
    compute = [np.asarray(c, dtype=np.float64) for c in tables.compute]
    latency = combinable_latency(ctx)
    comm = []
    for u, c, h, lat in zip(bound.unary, compute, tables.host, latency, strict=True):
        comm.append(u - c - (0.0 if h is None else h) - lat)
    return compute, Problem(comm, bound.edges, bound.blocks, bound.factors)


def overlap_bound(
    compute: Sequence[np.ndarray],
    comm: Problem,
    evaluate_streams: Callable[[list[int]], tuple[float, float]],
    deadline: float = math.inf,
    floor: float = -math.inf,
    known: Sequence[Sequence[int]] = (),
) -> Bounded:
    """The best bound of max(C, X) over the λ tried (see the module docstring): ``compute``
    and ``comm`` over the searched space, ``evaluate_streams(x)`` = (C(x), X(x)) of a plan of
    it (to steer λ); ``known``: plans of the space (each dual prunes against the cheapest).
    ``floor``: a bound already proven (the compute stream's); after
    `BELOW_FLOOR` duals in a row below it the search stops (where communication can all but
    vanish, as on Inception-v3, no λ < 1 beats the compute stream)."""
    lo, hi, lam = 0.0, 1.0, 0.5
    best, plans, tried, below = -math.inf, [], [], 0
    t0 = time.perf_counter()
    for _ in range(LAMBDA_STEPS):
        unary = [lam * c + (1 - lam) * x for c, x in zip(compute, comm.unary, strict=True)]
        mixed = Problem(
            unary,
            {k: t * (1 - lam) for k, t in comm.edges.items()},
            [],
            {k: t * (1 - lam) for k, t in comm.factors.items()},
        )
        upper = min((assignment_cost(mixed, x) for x in [*known, *plans]), default=math.inf)
        res = dual_bound(
            mixed, deadline, BOUND_SWEEPS, table_budget=BOUND_TABLE, upper=upper,
            work=BOUND_WORK / 2,
        )  # fmt: skip
        tried.append((lam, res.value))
        best = max(best, res.value)
        plans.append(res.assignment)
        c, x = evaluate_streams(res.assignment)
        if c > x:  # the supergradient C - X > 0: a larger λ bounds more
            lo = lam
        else:
            hi = lam
        lam = 0.5 * (lo + hi)
        below = below + 1 if res.value <= floor else 0
        if time.perf_counter() > deadline or below >= BELOW_FLOOR:
            break
    stats = {"lambdas": tried, "time_s": time.perf_counter() - t0}
    return Bounded(best if math.isfinite(best) else None, plans, stats)
