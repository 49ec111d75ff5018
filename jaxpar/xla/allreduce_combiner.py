"""How XLA's all-reduce combiner merges the predicted all-reduces.

XLA's combiner passes (`all-reduce-combiner`, and on CPU `cpu-all-reduce-combiner`) merge
all-reduces of one key — same reduction, element type and replica groups (the same lists in the
same order), in the same computation — into one collective, walking the program in order: the
first all-reduce left opens a group; later ones of its key join until one depends on a member
(a data path from it), the group's bytes would pass the threshold, or it holds the maximum
count; then the group is combined (its members now depend on what any member depended on) and
the walk starts over. Bytes are unchanged; latency is paid once per group. `group_all_reduces`
replays that on the planned program (`docs/cost.md`, "Combined collectives"). A scan unrolled
by k (``lax.scan(..., unroll=k)``) runs k copies of its body per loop iteration, in one
computation: the copies of a group combine too unless one copy's all-reduce feeds the next
copy's through the carry (`combined_runs`).

Pure: no jax import.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from ..program.graph import SCAN, Program


@dataclasses.dataclass(frozen=True)
class Combiner:
    """The target backend's all-reduce combiner thresholds."""

    backend: str
    max_bytes: float  # per combined all-reduce (result bytes per device)
    max_count: int  # operands per combined all-reduce

    def latency_share(self, buffer_bytes: float) -> float:
        """The share of one collective's latency an all-reduce of ``buffer_bytes`` (result bytes
        per device) pays when the combiner packs it with independent others into groups of at
        most ``max_bytes`` and ``max_count`` operands: max(min(1, b / max_bytes), 1 / max_count).
        A group's latency spread over its members by their bytes; exact for groups filled to
        the threshold."""
        return max(min(1.0, buffer_bytes / self.max_bytes), 1.0 / self.max_count)


# XLA:CPU runs cpu-all-reduce-combiner with no byte limit and at most 256 operands (measured on
# jax 0.10: 28 gradient all-reduces of a data-parallel GPT step become one). XLA:GPU's default
# xla_gpu_all_reduce_combine_threshold_bytes is 30 MiB; TPU is assumed to combine like GPU.
COMBINERS = {
    "cpu": Combiner("cpu", math.inf, 256),
    "gpu": Combiner("gpu", 30 * 2**20, 256),
    "tpu": Combiner("tpu", 30 * 2**20, 256),
}


def combiner_for(platform: str, device_kind: str) -> Combiner:
    """The combiner of a mesh's platform; an abstract mesh takes its cluster's device kind."""
    if platform in COMBINERS:
        return COMBINERS[platform]
    return COMBINERS["tpu" if "tpu" in device_kind.lower() else "gpu"]


@dataclasses.dataclass(frozen=True)
class AllReduceItem:
    """One predicted all-reduce, as the combiner sees it."""

    eqn: int  # the equation whose result it reduces (its place in program order)
    # what must match to combine: reduction, dtype, mesh axes, the order the replica groups
    # are listed in (`cost.evaluation.group_order`), computation, body (XLA's computation:
    # `graph.Program.computation`, a region or -1)
    key: tuple
    buffer_bytes: float  # result bytes per device
    region: int = -1  # the region of its equation (a scan run in line, inside the computation)
    # the equation's results computed from it (None: all): a shard_map's body all-reduces a
    # weight gradient that leaves by one result, and what reads the others does not wait on it
    feeds: tuple[int, ...] | None = None


def item_dependencies(program: Program, items: Sequence[AllReduceItem]) -> list[int]:
    """Per item, the bitmask over ``items`` of those whose equations' results its equation reads,
    directly or through other equations: one walk in program order (a topological order), each
    tensor carrying the mask of the items upstream of it. Kept in ``program.memo`` per sequence
    of the items' equations: plans alike all-reduce at the same equations."""
    key = ("item dependencies", tuple((it.eqn, it.feeds) for it in items))
    if key not in program.memo:
        program.memo[key] = tuple(_item_dependencies(program, items))
    return list(program.memo[key])


def _item_dependencies(program: Program, items: Sequence[AllReduceItem]) -> list[int]:
    items_of: dict[int, int] = {}  # per equation, the bitmask of its items
    for i, it in enumerate(items):
        items_of[it.eqn] = items_of.get(it.eqn, 0) | 1 << i
    of_tensor: dict[int, int] = {}
    reads: dict[int, int] = {}
    for e in program.eqns:
        mask = 0
        for t in e.inputs:
            if t is not None:
                mask |= of_tensor.get(t, 0)
        own = items_of.get(e.index)
        if own is not None:
            reads[e.index] = mask
        for t in e.outputs:
            bits = mask
            if own is not None:
                for i in _bits(own):
                    if items[i].feeds is None or t in items[i].feeds:
                        bits |= 1 << i
            if bits:
                of_tensor[t] = bits
    return [reads[it.eqn] for it in items]


def _bits(mask: int) -> list[int]:
    """The positions of the set bits of ``mask``."""
    return [i for i in range(mask.bit_length()) if mask >> i & 1]


def group_all_reduces(
    items: Sequence[AllReduceItem], depends: Sequence[int], combiner: Combiner
) -> list[int]:
    """Group index per item, as the combiner forms them. ``depends[i]``: bitmask over ``items``
    of the items item i depends on (transitively)."""
    order = sorted(range(len(items)), key=lambda i: items[i].eqn)
    deps = list(depends)
    group = [-1] * len(items)
    left = list(order)
    n_groups = 0
    while left:
        first = items[left[0]]
        members, mask, needs, size = [], 0, 0, 0.0  # needs: what the members depend on
        for i in left:
            it = items[i]
            if it.key != first.key:
                continue
            if it.buffer_bytes > combiner.max_bytes:
                if not members:  # too large to combine with anything: alone
                    members.append(i)
                    break
                continue
            # either direction: after earlier merges program order need not be topological
            dependent = deps[i] & mask or needs >> i & 1
            if size + it.buffer_bytes > combiner.max_bytes or dependent:
                break
            members.append(i)
            mask |= 1 << i
            needs |= deps[i]
            size += it.buffer_bytes
            if len(members) >= combiner.max_count:
                break
        for i in members:
            group[i] = n_groups
        n_groups += 1
        merged = mask
        for i in members:
            merged |= deps[i]
        taken = set(members)
        left = [i for i in left if i not in taken]
        for j in left:  # the combined op depends on what any member depended on (only the
            if deps[j] & mask:  # items left are asked again)
                deps[j] |= merged
    return group


def carried(program: Program, region: int) -> tuple[frozenset[int], frozenset[int]]:
    """Of a scan body's equations: those that read the iteration's carry, directly or not, and
    those whose results the next iteration's carry holds, directly or not (kept in
    ``program.memo``). An all-reduce of the second kind feeds every one of the first kind in the
    next copy of an unrolled body."""
    key = ("carried", region)
    if key not in program.memo:
        r = program.regions[region]
        lo, hi = r.bodies[0]
        tainted = {t for e in r.carry_eqns for t in program.eqns[e].outputs}
        reads = set()
        for e in program.eqns[lo:hi]:
            if any(t in tainted for t in e.inputs if t is not None):
                reads.add(e.index)
                tainted.update(e.outputs)
        needed = set(r.carry_out)
        feeds = set()
        for e in reversed(program.eqns[lo:hi]):
            if any(t in needed for t in e.outputs):
                feeds.add(e.index)
                needed.update(t for t in e.inputs if t is not None)
        program.memo[key] = (frozenset(reads), frozenset(feeds))
    return program.memo[key]


def combined_runs(program: Program, members: Sequence[AllReduceItem], combiner: Combiner) -> int:
    """Runs per step of one combined all-reduce of ``members`` (their key's computation,
    `graph.Program.computation`).

    Per run of the computation's body, member m appears n_m = k · (its region's runs / the
    body's) times: k copies of a scan unrolled by k (`graph.Region.copies`), and once per step
    of a scan XLA runs in line. The appearances combine into ⌈n / b⌉ all-reduces when every
    member appears n times, b = min(max_bytes // group bytes, max_count // members); into
    max(⌈Σ n_m bytes_m / max_bytes⌉, ⌈Σ n_m / max_count⌉) when they differ; into max n_m (no
    two copies together) when a member's result reaches the carry of a repeated scan and a
    member reads that carry (`carried`: a forward partial sum on the residual stream). A scan
    unrolled by k runs I iterations of k copies, then r copies in line (`Region.iterations`;
    counted apart): runs = outer · (I · per(k) + per(r)), outer the runs of the enclosing
    regions."""
    comp = members[0].key[-2]
    body = program.trips(comp)  # runs of the computation's body per step
    inline = [program.trips(m.region) // body for m in members]
    loop = program.regions[comp] if comp >= 0 else None
    if loop is not None and loop.kind == SCAN and loop.copies > 1:
        rest = loop.trips - loop.iterations * loop.copies
        per = loop.iterations * _per_run(program, members, inline, loop.copies, comp, combiner)
        if rest:
            per += _per_run(program, members, inline, rest, comp, combiner)
        return body // loop.trips * per
    if all(n == 1 for n in inline):
        return body
    return body * _per_run(program, members, inline, 1, comp, combiner)


def _per_run(
    program: Program, members: Sequence[AllReduceItem], inline: list[int], copies: int,
    comp: int, combiner: Combiner,
) -> int:  # fmt: skip
    """All-reduces per run of ``copies`` copies of the computation's body (`combined_runs`)."""
    n = [copies * k for k in inline]
    repeated = {comp} if copies > 1 else set()
    for m in members:  # the scans run in line between a member and its computation
        r = m.region
        while r != comp and r >= 0:
            repeated.add(r)
            r = program.regions[r].parent
    eqns = {m.eqn for m in members}
    for r in repeated:
        reads, feeds = carried(program, r)
        if eqns & reads and eqns & feeds:
            return max(n)
    if len(set(n)) == 1:
        size = sum(m.buffer_bytes for m in members)
        by_count = combiner.max_count // len(members)
        by_bytes = by_count if size <= 0 or math.isinf(combiner.max_bytes) else 0
        per_bin = int(max(1, min(by_bytes or combiner.max_bytes // size, by_count)))
        return -(-n[0] // per_bin)
    total = sum(k * m.buffer_bytes for k, m in zip(n, members, strict=True))
    by_bytes = 1 if math.isinf(combiner.max_bytes) else math.ceil(total / combiner.max_bytes)
    return max(1, by_bytes, -(-sum(n) // combiner.max_count))
