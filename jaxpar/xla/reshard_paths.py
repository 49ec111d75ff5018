"""Resharding: the fixed path of collectives that turns one layout of a tensor into another.

Pricing (`cost`, `tables`) and applying (`apply`) both walk `reshard_path`, so XLA runs the
collectives the model priced. Pure: no jax import.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

from ..hardware.collectives import (
    ALL_GATHER,
    ALL_TO_ALL,
    all_gather_bytes,
    all_to_all_bytes,
    ring_steps,
    transfer_time,
)
from ..hardware.mesh_model import MeshAxes
from ..nodes.configs import Spec, shard_count

SLICE = "slice"  # a local slice: no communication, one kernel (`local_priced`)


@dataclasses.dataclass(frozen=True)
class Step:
    """One collective (or local slice) of a reshard path, and the local kernels it runs."""

    kind: str  # SLICE, ALL_GATHER or ALL_TO_ALL
    axis: int  # mesh axis index
    before: Spec
    after: Spec
    nbytes: float  # bytes sent per device (ring accounting; 0 for a slice)
    local: float = 0.0  # bytes its local kernels read and write (`local_kernels`)
    kernels: int = 0  # its local kernels


def local_kernels(kind: str, dim: int, n: int, before: float, after: float) -> tuple[float, int]:
    """(bytes read and written, kernels) of the local kernels of a step over ``n`` devices
    that takes a tensor from a ``before``-byte shard to an ``after``-byte one, on tensor dim
    ``dim`` (none when n = 1: nothing moves):

    - a slice: XLA cuts the shard out with a dynamic slice that reads and writes it, 2·after
      (a contraction reading it cannot fuse it);
    - a collective on a dim other than the first: the collective runs on the dim it moves
      made the most major, so XLA copies the shard into that layout before it and the result
      back after it, 2·before + 2·after, two kernels (`bench/fidelity/results/compute_fidelity.md`:
      XLA:CPU's layout copies around gathers; NCCL too gathers flat buffers, so on GPU the
      moved dim must be the major one as well: assumed, not measured);
    - a collective on the first dim: none.
    """
    if n == 1:
        return 0.0, 0
    if kind == SLICE:
        return 2 * after, 1
    if dim > 0:
        return 2 * before + 2 * after, 2
    return 0.0, 0


def _is_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) <= len(b) and b[: len(a)] == a


def _free_slices(
    cur: list[tuple[int, ...]], dst: Spec, steps: list[Step], nbytes: float, sizes: tuple[int, ...]
) -> bool:
    """Append the local slices available now (an unused axis the target puts next on a dim)."""
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
            after = nbytes / shard_count(tuple(cur), sizes)
            local, kernels = local_kernels(
                SLICE, d, sizes[a], nbytes / shard_count(before, sizes), after
            )
            steps.append(Step(SLICE, a, before, tuple(cur), 0.0, local, kernels))
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


# Kept across plans, bounded: a plan walks a few thousand distinct paths (llama3_70b unrolled on
# 1,024 devices: 1,724), so 65,536 entries hold many plans' (tens of MB at most).
@functools.lru_cache(maxsize=1 << 16)
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
        if _free_slices(cur, dst, steps, nbytes, sizes):
            continue
        d, a, to = _axis_to_move(cur, dst)
        before = tuple(cur)
        buf = nbytes / shard_count(before, sizes)
        cur[d] = cur[d][:-1]
        if to is not None:
            cur[to] = cur[to] + (a,)
            local, kernels = local_kernels(ALL_TO_ALL, d, sizes[a], buf, buf)
            sent = all_to_all_bytes(buf, sizes[a])
            steps.append(Step(ALL_TO_ALL, a, before, tuple(cur), sent, local, kernels))
        else:
            out = nbytes / shard_count(tuple(cur), sizes)
            local, kernels = local_kernels(ALL_GATHER, d, sizes[a], buf, out)
            sent = all_gather_bytes(out, sizes[a])
            steps.append(Step(ALL_GATHER, a, before, tuple(cur), sent, local, kernels))
    if tuple(cur) != dst:
        raise AssertionError(f"reshard_path did not converge: {src} -> {dst}")
    return tuple(steps)


def local_priced(mesh: MeshAxes, objective: str) -> bool:
    """Whether a reshard's local kernels (`local_kernels`) cost time: under "time"/"overlap"
    on a mesh whose memory bandwidth is known (they send nothing)."""
    return objective != "comm" and mesh.mem_bandwidth > 0


def local_time(step: Step, mesh: MeshAxes) -> float:
    """Seconds of a step's local kernels: kernels · overhead + bytes / memory bandwidth."""
    if not step.kernels:
        return 0.0
    return step.kernels * mesh.kernel_overhead + step.local / mesh.mem_bandwidth


def step_time(step: Step, mesh: MeshAxes) -> float:
    """t_X of one step's collective: `transfer_time` on its mesh axis's link (0 for a slice;
    its local kernels apart: `local_time`)."""
    if step.kind == SLICE:
        return 0.0
    a = step.axis
    return transfer_time(step.kind, step.nbytes, mesh.sizes[a], mesh.bandwidth[a], mesh.latency[a])


@functools.lru_cache(maxsize=1 << 16)
def reshard_linear(
    src: Spec, dst: Spec, mesh: MeshAxes, objective: str, gathers_free: bool = False
) -> tuple[float, float]:
    """`_reshard_linear` of the layouts with the dims whole in both dropped: they change neither
    the path nor any buffer's size, and many layout pairs of different ranks then share one
    cache entry."""
    if len(src) == len(dst):  # the first dim stays: collectives on it need no layout copies
        kept = [d for d in range(len(src)) if d == 0 or src[d] or dst[d]]
        if len(kept) < len(src):
            src, dst = tuple(src[d] for d in kept), tuple(dst[d] for d in kept)
    return _reshard_linear(src, dst, mesh, objective, gathers_free)


def priced_steps(
    steps: Sequence[Step], gathers_free: bool = False, local: bool = False
) -> list[Step]:
    """The steps of a path that cost: its collectives, and its slices where ``local``
    (`local_priced`). With ``gathers_free`` (a uniform tensor, `buffers.uniform_tensors`: one
    constant in every element) neither its all-gathers, which XLA turns into broadcasts, nor
    its slices (a smaller broadcast); its all-to-alls stay."""
    return [
        s
        for s in steps
        if not (s.kind == SLICE and (gathers_free or not local))
        and not (gathers_free and s.kind == ALL_GATHER)
    ]


def step_terms(step: Step, mesh: MeshAxes, comm: bool, local: bool) -> tuple[float, float]:
    """(fixed, per-byte) of one priced step of a 1-byte tensor's path: the α and β terms of
    `step_time`, then those of `local_time` where ``local`` (bytes sent alone under "comm")."""
    if comm:
        return 0.0, step.nbytes
    fixed, per_byte = 0.0, 0.0
    if step.kind != SLICE:
        a = step.axis
        fixed = mesh.latency[a] * ring_steps(step.kind, mesh.sizes[a])
        per_byte = step.nbytes / mesh.bandwidth[a]
    if local and step.kernels:
        fixed = fixed + step.kernels * mesh.kernel_overhead
        per_byte = per_byte + step.local / mesh.mem_bandwidth
    return fixed, per_byte


@functools.lru_cache(maxsize=1 << 16)
def _reshard_linear(
    src: Spec, dst: Spec, mesh: MeshAxes, objective: str, gathers_free: bool = False
) -> tuple[float, float]:
    """(fixed, per_byte): a reshard of a B-byte tensor costs fixed + B · per_byte.

    The same sum as `step_time` over `reshard_path` (its `priced_steps`), split into its α and
    β terms (every step's bytes are proportional to B, `step_terms`): under "time" fixed = Σ
    latency · ring_steps (+ overhead per local kernel) and per_byte = Σ fraction / bandwidth
    (+ local bytes / memory bandwidth, `local_kernels`); under "comm" only bytes count
    (fixed = 0, per_byte = Σ fraction).
    """
    local = local_priced(mesh, objective)
    steps = priced_steps(reshard_path(1, src, dst, mesh.sizes), gathers_free, local)
    terms = [step_terms(s, mesh, objective == "comm", local) for s in steps]
    fixed, per_byte = 0.0, 0.0
    for f, b in terms:
        fixed, per_byte = fixed + f, per_byte + b
    return fixed, per_byte
