"""Resharding: the fixed path of collectives that turns one layout of a tensor into another.

Pricing (`cost`, `tables`) and applying (`apply`) both walk `reshard_path`, so XLA runs the
collectives the model priced. Pure: no jax import.
"""

from __future__ import annotations

import dataclasses
import functools

from .collectives import (
    ALL_GATHER,
    ALL_TO_ALL,
    all_gather_bytes,
    all_to_all_bytes,
    ring_steps,
    transfer_time,
)
from .configs import Spec, shard_count
from .hardware.mesh_model import MeshAxes

SLICE = "slice"  # a free local slice: no communication


@dataclasses.dataclass(frozen=True)
class Step:
    """One collective (or free local slice) of a reshard path."""

    kind: str  # SLICE, ALL_GATHER or ALL_TO_ALL
    axis: int  # mesh axis index
    before: Spec
    after: Spec
    nbytes: float  # bytes sent per device (ring accounting)


def _is_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) <= len(b) and b[: len(a)] == a


def _free_slices(cur: list[tuple[int, ...]], dst: Spec, steps: list[Step]) -> bool:
    """Append the free slices available now (an unused axis the target puts next on a dim)."""
    used = {a for axes in cur for a in axes}
    progressed = False
    for d in range(len(dst)):
        while _is_prefix(cur[d], dst[d]) and len(cur[d]) < len(dst[d]):
            a = dst[d][len(cur[d])]
            if a in used:
                break
            before = tuple(cur)
            cur[d] = cur[d] + (a,)
            used.add(a)
            steps.append(Step(SLICE, a, before, tuple(cur), 0.0))
            progressed = True
    return progressed


def _axis_to_move(cur: list[tuple[int, ...]], dst: Spec) -> tuple[int, int, int | None]:
    """(dim, axis, target dim or None): the axis that leaves a dim next, preferring one the
    target wants next on another dim (an all-to-all) over one that is gathered."""
    n_dims = len(dst)
    movable = None
    for d in range(n_dims):
        if cur[d] and not _is_prefix(cur[d], dst[d]):
            a = cur[d][-1]
            to = next(
                (
                    d2
                    for d2 in range(n_dims)
                    if d2 != d
                    and _is_prefix(cur[d2], dst[d2])
                    and len(cur[d2]) < len(dst[d2])
                    and dst[d2][len(cur[d2])] == a
                ),
                None,
            )
            if movable is None or (to is not None and movable[2] is None):
                movable = (d, a, to)
    if movable is None:  # an axis must leave a dim that is a prefix (dst puts others first)
        for d in range(n_dims):
            if cur[d] and cur[d] != dst[d][: len(cur[d])]:
                return (d, cur[d][-1], None)
        raise AssertionError(f"reshard_path stuck at {tuple(cur)} -> {dst}")
    return movable


@functools.lru_cache(maxsize=1 << 21)
def reshard_path(nbytes: int, src: Spec, dst: Spec, sizes: tuple[int, ...]) -> tuple[Step, ...]:
    """The sequence of collectives that turns layout ``src`` into ``dst``.

    Cheapest-first order: free slices first (an axis replicated in the current layout that the
    target puts next on a dim), then one axis at a time leaves a dim — an all-to-all when the
    target wants it next on another dim, else an all-gather — keeping buffers small. The applier
    emits exactly this chain of sharding constraints, so XLA runs these collectives.
    """
    if src == dst or not dst:
        return ()
    cur = [tuple(x) for x in src]
    steps: list[Step] = []
    for _ in range(4 * len(sizes) + 2):
        if tuple(cur) == dst:
            break
        if _free_slices(cur, dst, steps):
            continue
        d, a, to = _axis_to_move(cur, dst)
        before = tuple(cur)
        buf = nbytes / shard_count(before, sizes)
        cur[d] = cur[d][:-1]
        if to is not None:
            cur[to] = cur[to] + (a,)
            steps.append(Step(ALL_TO_ALL, a, before, tuple(cur), all_to_all_bytes(buf, sizes[a])))
        else:
            out = nbytes / shard_count(tuple(cur), sizes)
            steps.append(Step(ALL_GATHER, a, before, tuple(cur), all_gather_bytes(out, sizes[a])))
    if tuple(cur) != dst:
        raise AssertionError(f"reshard_path did not converge: {src} -> {dst}")
    return tuple(steps)


def step_time(step: Step, mesh: MeshAxes) -> float:
    """t_X of one step: `transfer_time` on its mesh axis's link (0 for a free slice)."""
    if step.kind == SLICE:
        return 0.0
    a = step.axis
    return transfer_time(step.kind, step.nbytes, mesh.sizes[a], mesh.bandwidth[a], mesh.latency[a])


@functools.lru_cache(maxsize=1 << 21)
def reshard_linear(src: Spec, dst: Spec, mesh: MeshAxes, objective: str) -> tuple[float, float]:
    """`_reshard_linear` of the layouts with the dims whole in both dropped: they change neither
    the path nor any buffer's size, and many layout pairs of different ranks then share one
    cache entry."""
    if len(src) == len(dst):
        kept = [d for d in range(len(src)) if src[d] or dst[d]]
        if len(kept) < len(src):
            src, dst = tuple(src[d] for d in kept), tuple(dst[d] for d in kept)
    return _reshard_linear(src, dst, mesh, objective)


@functools.lru_cache(maxsize=1 << 21)
def _reshard_linear(src: Spec, dst: Spec, mesh: MeshAxes, objective: str) -> tuple[float, float]:
    """(fixed, per_byte): a reshard of a B-byte tensor costs fixed + B · per_byte.

    The same sum as `step_time` over `reshard_path`, split into its α and β terms (every step's
    bytes are proportional to B): under "time" fixed = Σ latency · ring_steps and per_byte =
    Σ fraction / bandwidth; under "comm" only bytes count (fixed = 0, per_byte = Σ fraction).
    """
    steps = [s for s in reshard_path(1, src, dst, mesh.sizes) if s.kind != SLICE]
    if objective == "comm":
        return 0.0, sum(s.nbytes for s in steps)
    fixed = sum(mesh.latency[s.axis] * ring_steps(s.kind, mesh.sizes[s.axis]) for s in steps)
    return fixed, sum(s.nbytes / mesh.bandwidth[s.axis] for s in steps)
