"""The IOPDDL contest's problem files (ASPLOS/EuroSys 2025; google/iopddl): read one into a
`Problem`, check its shapes, and score an answer exactly as the contest's evaluator does.

The format (JSON, optionally gzipped)::

    {"problem": {"name": ...,
      "nodes": {"intervals": [[start, end], ...],   # half-open; [0, 0] uses no memory
                "costs": [[c_0, c_1, ...], ...],    # per node, per strategy
                "usages": [[u_0, u_1, ...], ...]},  # per node, per strategy
      "edges": {"nodes": [[a, b], ...],             # a > b allowed; parallel edges add up
                "costs": [[...], ...]},             # row-major over the listed nodes
      "usage_limit": L}}                            # optional

A cost of 1e18 forbids a strategy or a pair (`problem.FORBIDDEN`). The contest's cost is the
integer sum of the chosen node and edge costs; an answer is infeasible when the usage at some
program point exceeds the limit. Pure: numpy (and orjson, when installed, to parse faster).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .problem import MemoryConstraint, Problem

try:  # optional: parses the contest's 30-65k-node files about twice as fast
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None


@dataclasses.dataclass(frozen=True)
class ContestProblem:
    """A contest problem: its name, the `Problem` (costs as floats, memory attached) and the
    file's own data (exact integers, for `score`)."""

    name: str
    problem: Problem
    data: dict


@dataclasses.dataclass(frozen=True)
class Score:
    """An answer scored as the contest does: the exact integer cost, whether it meets the
    usage limit, and its peak usage."""

    cost: int
    feasible: bool
    peak: int


def read_contest(path: str | Path) -> ContestProblem:
    """Read a contest file (``.json`` or ``.json.gz``); ValueError when it is malformed."""
    path = Path(path)
    if path.name.endswith(".gz"):
        with gzip.open(path) as f:
            raw = f.read()
    else:
        raw = path.read_bytes()
    try:
        data = _orjson.loads(raw) if _orjson is not None else json.loads(raw)
    except ValueError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("problem"), dict):
        raise ValueError(f'{path}: no "problem" object at the top level')
    return parse_contest(data["problem"])


def parse_contest(data: dict) -> ContestProblem:
    """A contest problem from its ``"problem"`` object; ValueError naming what is malformed."""
    try:
        nodes, edges = data["nodes"], data.get("edges", {"nodes": [], "costs": []})
        costs, usages, intervals = nodes["costs"], nodes["usages"], nodes["intervals"]
    except (KeyError, TypeError) as err:
        raise ValueError(f"contest problem: missing field {err}") from None
    n = len(costs)
    if len(usages) != n or len(intervals) != n:
        raise ValueError(
            f"contest problem: {n} cost lists, {len(usages)} usage lists, "
            f"{len(intervals)} intervals (one of each per node)"
        )
    unary = [_vector(c, f"node {v} costs") for v, c in enumerate(costs)]
    usage = [_vector(u, f"node {v} usages") for v, u in enumerate(usages)]
    for v, (c, u) in enumerate(zip(unary, usage, strict=True)):
        if len(c) != len(u):
            raise ValueError(f"contest problem: node {v} has {len(c)} costs, {len(u)} usages")
    try:
        spans = np.asarray(intervals, dtype=np.int64) if n else np.zeros((0, 2), np.int64)
    except (TypeError, ValueError):
        spans = None
    if spans is None or spans.shape != (n, 2):
        raise ValueError("contest problem: each interval must be [start, end]")
    problem = Problem(unary=unary, edges={})
    _add_edges(problem, edges)
    limit = data.get("usage_limit")
    if limit is not None:
        problem.memory = MemoryConstraint(spans, tuple(usage), float(limit))
    return ContestProblem(str(data.get("name", "")), problem, data)


def _vector(values, what: str) -> np.ndarray:
    """One node's list of numbers as floats; ValueError when it is empty or not numbers."""
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"contest problem: {what} are not numbers") from None
    if arr.ndim != 1 or not len(arr):
        raise ValueError(f"contest problem: {what} must be a non-empty list of numbers")
    return arr


def _add_edges(problem: Problem, edges: dict) -> None:
    """The contest's edges into ``problem`` (parallel edges add up; three or more nodes make
    a factor)."""
    try:
        ends, tables = edges["nodes"], edges["costs"]
    except (KeyError, TypeError) as err:
        raise ValueError(f"contest problem: edges lack {err}") from None
    if len(ends) != len(tables):
        raise ValueError(f"contest problem: {len(ends)} edges but {len(tables)} cost tables")
    sizes = [len(u) for u in problem.unary]
    for e, (key, costs) in enumerate(zip(ends, tables, strict=True)):
        if not isinstance(key, list) or not all(
            isinstance(v, int) and 0 <= v < len(sizes) for v in key
        ):
            raise ValueError(f"contest problem: edge {e} names nodes outside 0..{len(sizes) - 1}")
        shape = [sizes[v] for v in key]
        table = np.asarray(costs, dtype=np.float64)
        if table.shape != (math.prod(shape),):
            raise ValueError(
                f"contest problem: edge {e} {key} has {table.size} costs; "
                f"expected {math.prod(shape)}"
            )
        if len(key) == 2:  # a pair (a == b: its diagonal adds to the node's costs)
            problem.add_edge(key[0], key[1], table.reshape(shape))
        elif len(set(key)) == len(key) and key:
            problem.add_factor(tuple(key), table.reshape(shape))
        else:
            raise ValueError(f"contest problem: edge {e} {key} repeats a node")


def score(data: dict, assignment: Sequence[int]) -> Score:
    """The contest's evaluator in exact integers: cost, feasibility and peak usage of
    ``assignment`` (one strategy index per node) on the file's ``"problem"`` object."""
    nodes, edges = data["nodes"], data.get("edges", {"nodes": [], "costs": []})
    costs = nodes["costs"]
    total = sum(int(c[assignment[v]]) for v, c in enumerate(costs))
    for key, table in zip(edges["nodes"], edges["costs"], strict=True):
        flat = 0
        for v in key:
            flat = flat * len(costs[v]) + int(assignment[v])
        total += int(table[flat])
    points = max((int(end) for _, end in nodes["intervals"]), default=0)
    diff = [0] * (points + 1)
    for v, (start, end) in enumerate(nodes["intervals"]):
        if end > start:
            used = int(nodes["usages"][v][assignment[v]])
            diff[start] += used
            diff[end] -= used
    peak = running = 0
    for t in range(points):
        running += diff[t]
        peak = max(peak, running)
    limit = data.get("usage_limit")
    return Score(total, limit is None or peak <= limit, peak)
