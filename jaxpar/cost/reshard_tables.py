"""Reshard prices of every layout pair of one rank at once: the dense tables the cost tables
gather from (`LinearTables`, `linear_tables`).

`reshard.reshard_linear` prices one pair by walking `reshard.reshard_path`; on 3-4 mesh axes a
rank has hundreds of layouts and the tables ask for most pairs, so they are walked in bulk
(`_walk_batch`, numpy over every missing pair) into one table per rank, shared by every tensor
of that rank. Pure: no jax import.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..hardware.mesh_model import MeshAxes
from ..nodes.configs import Spec
from ..xla.reshard_paths import local_priced

# Dense tables of `reshard_linear` over every layout of a given rank, shared by every tensor of
# that rank (`LinearTables`): the layout sets the cost tables ask for repeat across tensors and
# nodes, and on 3-4 mesh axes they hold hundreds of layouts each.
DENSE_LAYOUTS = 1296  # largest number of layouts of one rank kept as a dense table (6^4)


def _walk_linear(
    src: Spec,
    dst: Spec,
    sizes: tuple[int, ...],
    mesh: MeshAxes,
    comm: bool,
    gathers_free: bool = False,
) -> tuple[float, float]:
    """`_reshard_linear` of ``src`` -> ``dst`` without building the path's steps: the same walk
    as `reshard_path` (free slices first, then one axis leaves a dim: an all-to-all when the
    target wants it next on another dim, else an all-gather), summing each collective's α and β
    terms in path order, so the floats are those of `_reshard_linear` (``gathers_free``: of its
    `priced_steps` with free gathers)."""
    cur = [list(x) for x in src]
    tgt = [list(x) for x in dst]
    n_dims = len(tgt)
    used, prod = 0, 1
    for axes in cur:
        for a in axes:
            used |= 1 << a
            prod *= sizes[a]
    fixed: float = 0
    per_byte: float = 0
    latency, bandwidth = mesh.latency, mesh.bandwidth
    local = not comm and local_priced(mesh, "time")  # `local_kernels`, in `step_terms`' order
    for _ in range(4 * len(sizes) + 2):
        if cur == tgt:
            break
        progressed = False
        for d in range(n_dims):  # free slices
            c, t = cur[d], tgt[d]
            lc = len(c)
            if lc < len(t) and c == t[:lc]:
                while lc < len(t):
                    a = t[lc]
                    if used >> a & 1:
                        break
                    c.append(a)
                    used |= 1 << a
                    prod *= sizes[a]
                    lc += 1
                    progressed = True
                    if local and not gathers_free and sizes[a] > 1:
                        fixed = fixed + (0.0 + mesh.kernel_overhead)
                        per_byte = per_byte + (0.0 + 2 * (1 / prod) / mesh.mem_bandwidth)
        if progressed:
            continue
        d, to = _next_move(cur, tgt)
        a = cur[d].pop()
        n = sizes[a]
        before = 1 / prod
        if to is not None:  # all-to-all of the current buffer
            cur[to].append(a)
            nbytes = (n - 1) / n * (1 / prod) if n > 1 else 0.0
        else:  # all-gather into a buffer `n` times larger
            used &= ~(1 << a)
            prod //= n
            nbytes = (n - 1) / n * (1 / prod) if n > 1 else 0.0
            if gathers_free:
                continue
        if comm:
            per_byte = per_byte + nbytes
        else:
            f, b = latency[a] * ((n - 1) if n > 1 else 0), nbytes / bandwidth[a]
            if local and d > 0 and n > 1:  # layout copies around it
                f = f + 2 * mesh.kernel_overhead
                b = b + (2 * before + 2 * (1 / prod)) / mesh.mem_bandwidth
            fixed, per_byte = fixed + f, per_byte + b
    if cur != tgt:
        raise AssertionError(f"reshard_path did not converge: {src} -> {dst}")
    return (0.0 if comm else fixed), per_byte


def _next_move(cur: list[list[int]], tgt: list[list[int]]) -> tuple[int, int | None]:
    """The dim whose last axis leaves next (no free slice left), and the dim that wants it
    next (None: it is gathered): a dim whose axes are not a prefix of its target's, the
    first whose last axis another dim wants, else the first."""
    want: dict[int, int] = {}  # axis -> first dim that wants it next
    for d, (c, t) in enumerate(zip(cur, tgt, strict=True)):
        lc = len(c)
        if lc < len(t) and c == t[:lc]:
            want.setdefault(t[lc], d)
    pick = None
    for d, (c, t) in enumerate(zip(cur, tgt, strict=True)):
        if c and not (len(c) <= len(t) and c == t[: len(c)]):
            to = want.get(c[-1])
            if to is not None:
                return d, to
            if pick is None:
                pick = (d, None)
    if pick is None:
        raise AssertionError(f"reshard_path stuck at {cur} -> {tgt}")
    return pick


WALK_BATCH = 2000  # missing pairs from which `_walk_batch` beats `_walk_linear` pair by pair


def _walk_batch(
    src: np.ndarray,
    dst: np.ndarray,
    rank: int,
    mesh: MeshAxes,
    comm: bool,
    held: np.ndarray,
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """`_walk_linear` of many pairs of coded layouts at once (`LinearTables.codes`), in numpy:
    the same walk, step by step, each pair's α and β terms summed in its path's order (so the
    floats are those of `_walk_linear`). Each dim's axes are held as one integer, axis + 1 per
    base-(k + 1) digit, first axis lowest. ``held``: per pair, the product of the sizes of axes
    split in the tensor besides the coded ones, which the walk never moves (`_canonical`).

    Returns (fixed, per_byte) twice: without and with ``gathers_free``. The path does not
    depend on it (only what its steps are charged), so one walk prices both."""
    walk = _BatchWalk(src, dst, rank, mesh, comm, held)
    for _ in range(4 * walk.k + 2):
        walk.retire_done()
        if not len(walk.ids):
            break
        progressed = walk.free_slices()
        mv = np.nonzero(~progressed)[0]
        if len(mv):
            walk.move_one_axis(mv)
    if len(walk.ids):
        raise AssertionError("reshard_path did not converge")
    out = walk.out
    if comm:
        out["fixed"], out["free_fixed"] = np.zeros(len(src)), np.zeros(len(src))
    return (out["fixed"], out["per"]), (out["free_fixed"], out["free_per"])


class _BatchWalk:
    """The state of `_walk_batch`: per pair still walking (``ids``), the current and target
    layouts (each dim's axes coded as base-(k + 1) digits, axis + 1 each, first axis lowest),
    their lengths, the axes in use, the product of the split axes' sizes, and the terms summed
    so far with gathers charged and free; ``out`` holds the finished pairs' terms."""

    def __init__(self, src, dst, rank: int, mesh: MeshAxes, comm: bool, held) -> None:
        self.sizes = np.asarray(mesh.sizes, dtype=np.int64)
        self.latency = np.asarray(mesh.latency, dtype=np.float64)
        self.bandwidth = np.asarray(mesh.bandwidth, dtype=np.float64)
        self.mesh, self.comm, self.rank = mesh, comm, rank
        self.local = not comm and local_priced(mesh, "time")  # `local_kernels`, as `_walk_linear`
        self.k = k = len(self.sizes)
        total = len(src)
        # int32 where a dim's code fits it: less memory traffic, faster division
        dtype = np.int32 if (k + 1) ** (k + 1) < 2**31 else np.int64
        self.pw = (k + 1) ** np.arange(k + 1, dtype=dtype)
        self.out = {key: np.zeros(total) for key in ("fixed", "per", "free_fixed", "free_per")}
        self.cc = np.zeros((total, rank), dtype=dtype)  # current layout, per dim
        self.tc = np.zeros((total, rank), dtype=dtype)  # target layout
        self.lc = np.zeros((total, rank), dtype=dtype)
        self.lt = np.zeros((total, rank), dtype=dtype)
        self.used = np.zeros(total, dtype=dtype)
        self.prod = np.array(held, dtype=np.int64)
        self._encode(src, dst)
        self.fixed, self.per_byte = np.zeros(total), np.zeros(total)
        self.free_fixed, self.free_per = np.zeros(total), np.zeros(total)  # ``gathers_free``
        self.ids = np.arange(total)

    def _encode(self, src, dst) -> None:
        """Each dim's axes as one integer, in mesh order: each dim's axes ascending."""
        base, pw = self.rank + 1, self.pw
        for a in range(self.k):
            for codes, lay, lens, is_src in (
                (src, self.cc, self.lc, True), (dst, self.tc, self.lt, False)
            ):  # fmt: skip
                dim = codes // base**a % base - 1
                idx = np.nonzero(dim >= 0)[0]
                d = dim[idx]
                lay[idx, d] += (a + 1) * pw[lens[idx, d]]
                lens[idx, d] += 1
                if is_src:
                    self.used[idx] |= 1 << a
                    self.prod[idx] *= self.sizes[a]

    def retire_done(self) -> None:
        """Pairs whose layout reached the target: their terms out, their rows dropped."""
        done = (self.cc == self.tc).all(axis=1)
        if not done.any():
            return
        out, ids = self.out, self.ids[done]
        out["fixed"][ids], out["per"][ids] = self.fixed[done], self.per_byte[done]
        out["free_fixed"][ids], out["free_per"][ids] = self.free_fixed[done], self.free_per[done]
        keep = ~done
        for name in (
            "cc", "tc", "lc", "lt", "used", "prod", "fixed", "per_byte", "ids", "free_fixed",
            "free_per",
        ):  # fmt: skip
            setattr(self, name, getattr(self, name)[keep])

    def free_slices(self) -> np.ndarray:
        """Per pair, slice every axis a dim's target wants next and no dim holds (free);
        whether the pair progressed. Local copies are charged only with gathers charged."""
        cc, tc, lc, lt, pw, k = self.cc, self.tc, self.lc, self.lt, self.pw, self.k
        sizes, mesh = self.sizes, self.mesh
        progressed = np.zeros(len(self.ids), dtype=bool)
        for d in range(self.rank):
            go = (lc[:, d] <= lt[:, d]) & (tc[:, d] % pw[lc[:, d]] == cc[:, d])
            for _ in range(k):
                go &= lc[:, d] < lt[:, d]
                idx = np.nonzero(go)[0]
                if not len(idx):
                    break
                ln = lc[idx, d]
                a = tc[idx, d] // pw[ln] % (k + 1) - 1
                free = (self.used[idx] >> a) & 1 == 0
                go[idx[~free]] = False
                idx, a, ln = idx[free], a[free], ln[free]
                if not len(idx):
                    break
                cc[idx, d] += (a + 1) * pw[ln]
                lc[idx, d] = ln + 1
                self.used[idx] |= np.left_shift(1, a)
                self.prod[idx] *= sizes[a]
                progressed[idx] = True
                if self.local:  # not charged with ``gathers_free``
                    big = idx[sizes[a] > 1]
                    prod = self.prod[big]
                    self.fixed[big] = self.fixed[big] + (0.0 + mesh.kernel_overhead)
                    self.per_byte[big] = self.per_byte[big] + (
                        0.0 + 2 * (1 / prod) / mesh.mem_bandwidth
                    )
        return progressed

    def _chosen_move(self, mv: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per pair ``mv``, the dim whose last axis leaves (one a target dim wants next comes
        first), the dim it goes to (-1: gathered) and the axis."""
        k, pw = self.k, self.pw
        c, lcm, t, ltm = self.cc[mv], self.lc[mv], self.tc[mv], self.lt[mv]
        rows = np.arange(len(mv))
        pre = (lcm <= ltm) & (t % pw[lcm] == c)
        last = np.where(lcm > 0, c // pw[np.maximum(lcm - 1, 0)] - 1, -1)
        want = np.where(pre & (lcm < ltm), t // pw[lcm] % (k + 1) - 1, -2)
        movable = (lcm > 0) & ~pre
        wanting = np.full((len(mv), k), -1, dtype=np.int64)  # axis -> first dim wanting it
        for d2 in reversed(range(self.rank)):
            ok = np.nonzero(want[:, d2] >= 0)[0]
            wanting[ok, want[ok, d2]] = d2
        to = np.where(last >= 0, wanting[rows[:, None], np.maximum(last, 0)], -1)
        pick_to = np.full(len(mv), -1, dtype=np.int64)
        pick_any = np.full(len(mv), -1, dtype=np.int64)
        for d in reversed(range(self.rank)):
            pick_to = np.where(movable[:, d] & (to[:, d] >= 0), d, pick_to)
            pick_any = np.where(movable[:, d], d, pick_any)
        chosen = np.where(pick_to >= 0, pick_to, pick_any)
        if (chosen < 0).any():
            raise AssertionError("reshard_path stuck")
        dest = np.where(pick_to >= 0, to[rows, chosen], -1)
        return chosen, dest, last[rows, chosen]

    def move_one_axis(self, mv: np.ndarray) -> None:
        """Pairs ``mv`` (no free slice left): one axis leaves a dim, by an all-to-all when a
        target dim wants it next, else an all-gather; each collective's α and β terms added."""
        cc, lc, pw, sizes, mesh = self.cc, self.lc, self.pw, self.sizes, self.mesh
        chosen, dest, a = self._chosen_move(mv)
        rows = np.arange(len(mv))
        before = 1 / self.prod[mv]
        ln = lc[mv][rows, chosen] - 1
        cc[mv, chosen] = cc[mv][rows, chosen] % pw[ln]
        lc[mv, chosen] = ln
        n = sizes[a]
        moved = dest >= 0
        i2, d2, a2 = mv[moved], dest[moved], a[moved]
        cc[i2, d2] += (a2 + 1) * pw[lc[i2, d2]]
        lc[i2, d2] += 1
        i3, a3 = mv[~moved], a[~moved]
        self.used[i3] &= ~np.left_shift(1, a3)
        self.prod[i3] //= sizes[a3]
        charged = n > 1
        nbytes = np.where(charged, (n - 1) / n * (1 / self.prod[mv]), 0.0)
        f = self.latency[a] * np.where(charged, n - 1, 0)
        b = nbytes / self.bandwidth[a]
        if self.local:  # layout copies around a priced collective on a dim past the first
            copied = charged & (chosen > 0)
            f = np.where(copied, f + 2 * mesh.kernel_overhead, f)
            b = np.where(copied, b + (2 * before + 2 * (1 / self.prod[mv])) / mesh.mem_bandwidth, b)
        if self.comm:
            self.per_byte[mv] = self.per_byte[mv] + nbytes
        else:
            self.fixed[mv] = self.fixed[mv] + f
            self.per_byte[mv] = self.per_byte[mv] + b
        # with free gathers only the all-to-alls are charged, the same terms (adding nothing
        # to the other pairs leaves their floats as they are)
        alltoall = np.nonzero(charged & moved)[0]
        if len(alltoall):
            i = mv[alltoall]
            if self.comm:
                self.free_per[i] = self.free_per[i] + nbytes[alltoall]
            else:
                self.free_fixed[i] = self.free_fixed[i] + f[alltoall]
                self.free_per[i] = self.free_per[i] + b[alltoall]


def _canonical(
    src: np.ndarray, dst: np.ndarray, rank: int, sizes: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs of coded layouts reduced to what their walk depends on: (source, target, held).

    A dim with the same axes in both layouts is never touched by the walk (nothing leaves or
    enters it), and its axes are wanted nowhere else: they are dropped, their sizes' product
    kept as ``held`` (buffer sizes). Dims then empty in both are dropped, the others renumbered
    in order (as `reshard_linear` drops dims whole in both). The first dim (code dim 1: the
    tensor's first, kept by every caller) stays: a collective on another dim copies layouts
    (`local_kernels`). Works on each dim's axes as a bitmask (`_dim_masks`)."""
    masks = _dim_masks(rank, len(sizes))
    weight, held_of = _mask_tables(rank, tuple(sizes))
    ms, mt = masks[src], masks[dst]  # (pairs, dims): each dim's axes
    inert = (ms == mt) & (ms != 0)
    if rank:
        inert[:, 1] = False
    held = held_of[np.bitwise_or.reduce(np.where(inert, ms, 0), axis=1)]
    occupied = ((ms | mt) != 0) & ~inert
    if rank:
        occupied[:, 1] = True
    number = np.cumsum(occupied, axis=1) * occupied  # a kept dim's new number, from 1
    return (number * weight[ms]).sum(axis=1), (number * weight[mt]).sum(axis=1), held


@functools.lru_cache(maxsize=16)
def _dim_masks(rank: int, k: int) -> np.ndarray:
    """Per layout code of ``rank`` dims on ``k`` axes, per dim 1..rank, the bitmask of its axes
    (column 0, "whole", is 0)."""
    base = rank + 1
    codes = np.arange(base**k)
    masks = np.zeros((base**k, base), dtype=np.int64)
    for a in range(k):
        masks[codes, codes // base**a % base] |= 1 << a
    masks[:, 0] = 0
    return masks


@functools.lru_cache(maxsize=16)
def _mask_tables(rank: int, sizes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Per bitmask of axes: Σ (rank + 1)^a over its axes (their digits in a code, for a dim
    numbered 1), and the product of their sizes."""
    k, base = len(sizes), rank + 1
    bits = (np.arange(2**k)[:, None] >> np.arange(k)) & 1
    weight = (bits * base ** np.arange(k)).sum(axis=1)
    held = np.where(bits == 1, np.asarray(sizes), 1).prod(axis=1)
    return weight, held


class Walked:
    """`_walk_batch` of every canonical pair walked so far on one mesh (`_canonical`, keyed as
    `LinearTables._walk_canonical` keys them): sorted keys, and per key (fixed, per_byte) with
    gathers charged, then (fixed, per_byte) with them free (one walk prices both)."""

    def __init__(self) -> None:
        self.keys = np.zeros(0, dtype=np.int64)
        self.values = np.zeros((4, 0))


class LinearTables:
    """`reshard_linear` of every pair of layouts of one mesh, as dense arrays per rank.

    A layout whose axes each split one dim, in mesh order (what `configs.spec_of` gives), is
    coded by the dim of each axis: code = Σ_a (dim(a) + 1) · (rank + 1)^a. Dims whole in every
    layout of a pattern are dropped first (they change neither the path nor any buffer, as in
    `reshard_linear`), so patterns of different ranks share entries. Entries are computed on
    first use (`_walk_linear`, the same floats as `_reshard_linear`; with ``gathers_free``, of a
    uniform tensor's paths).
    """

    def __init__(
        self,
        mesh: MeshAxes,
        objective: str,
        gathers_free: bool = False,
        walked: Walked | None = None,
    ):
        self.mesh, self.comm, self.gathers_free = mesh, objective == "comm", gathers_free
        self.sizes = tuple(mesh.sizes)
        self.dense: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        # walks of canonical pairs (`_canonical`), shared by every rank, and by the table of
        # the other ``gathers_free`` (`linear_tables`)
        self.walked = Walked() if walked is None else walked
        self.unit = 1  # dims per axis in a key: every rank a dense table can have, + 1
        while self.sizes and (self.unit + 1) ** len(self.sizes) <= DENSE_LAYOUTS:
            self.unit += 1

    def codes(self, specs: list[Spec], kept: list[int]) -> np.ndarray | None:
        """Each layout's code over the ``kept`` dims, or None when one is not codable."""
        k, base = len(self.sizes), len(kept) + 1
        out = np.empty(len(specs), dtype=np.int64)
        for i, spec in enumerate(specs):
            code, seen = 0, 0
            for j, d in enumerate(kept):
                last = -1
                for a in spec[d]:
                    if a <= last or seen >> a & 1:
                        return None  # not in mesh order, or an axis on two dims
                    last = a
                    seen |= 1 << a
                    code += (j + 1) * base**a
            if any(spec[d] for d in range(len(spec)) if d not in kept):
                return None
            out[i] = code
        return out if k else None

    def _layout(self, code: int, rank: int) -> Spec:
        base = rank + 1
        dims: list[list[int]] = [[] for _ in range(rank)]
        for a in range(len(self.sizes)):
            d = code // base**a % base
            if d:
                dims[d - 1].append(a)
        return tuple(tuple(x) for x in dims)

    def _walk_canonical(
        self, s_codes: np.ndarray, t_codes: np.ndarray, r: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """`_walk_batch` of pairs of rank-``r`` codes: each canonical pair (`_canonical`) walked
        once per mesh. A canonical pair's walk does not depend on the rank it came from, so
        patterns of every rank share them (keyed by each axis's source and target dim)."""
        cs, cd, held = _canonical(s_codes, t_codes, r, self.sizes)
        k, base, unit = len(self.sizes), r + 1, self.unit
        key = np.zeros(len(cs), dtype=np.int64)
        for a in reversed(range(k)):
            key = key * unit * unit + (cs // base**a % base) * unit + cd // base**a % base
        key = key * (math.prod(self.sizes) + 1) + held
        uniq, first, back = np.unique(key, return_index=True, return_inverse=True)
        keys, values = self.walked.keys, self.walked.values
        v = 2 if self.gathers_free else 0  # this table's rows of ``values``
        at = np.minimum(np.searchsorted(keys, uniq), max(len(keys) - 1, 0))
        hit = keys[at] == uniq if len(keys) else np.zeros(len(uniq), dtype=bool)
        f, b = np.empty(len(uniq)), np.empty(len(uniq))
        f[hit], b[hit] = values[v, at[hit]], values[v + 1, at[hit]]
        new = first[~hit]
        if len(new):
            plain, free = _walk_batch(cs[new], cd[new], r, self.mesh, self.comm, held[new])
            walked = np.stack([*plain, *free])
            f[~hit], b[~hit] = walked[v], walked[v + 1]
            merged = np.concatenate([keys, uniq[~hit]])
            order = np.argsort(merged, kind="stable")
            self.walked.keys = merged[order]
            self.walked.values = np.concatenate([values, walked], axis=1)[:, order]
        back = back.reshape(-1)
        return f[back], b[back]

    def pattern(
        self, src_specs: list[Spec], dst_specs: list[Spec]
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """(fixed, per_byte) over (source layout, reader layout), or None when the layouts
        cannot be coded or their rank has too many layouts for a dense table."""
        if not src_specs or not dst_specs:
            return None
        rank = len(src_specs[0])
        if any(len(s) != rank for s in (*src_specs, *dst_specs)):
            return None
        kept = [d for d in range(rank) if d == 0 or any(s[d] for s in (*src_specs, *dst_specs))]
        size = (len(kept) + 1) ** len(self.sizes)
        if size > DENSE_LAYOUTS:
            return None
        cs, cd = self.codes(src_specs, kept), self.codes(dst_specs, kept)
        if cs is None or cd is None:
            return None
        r = len(kept)
        if r not in self.dense:
            self.dense[r] = (
                np.zeros((size, size)), np.zeros((size, size)), np.zeros((size, size), bool)
            )  # fmt: skip
        fixed, per_byte, known = self.dense[r]
        grid = np.ix_(cs, cd)
        missing = np.nonzero(~known[grid])
        if len(missing[0]):
            s_codes, t_codes = cs[missing[0]], cd[missing[1]]
            if len(s_codes) >= WALK_BATCH:
                f, b = self._walk_canonical(s_codes, t_codes, r)
            else:
                pairs = [
                    _walk_linear(self._layout(int(s), r), self._layout(int(t), r), self.sizes,
                                 self.mesh, self.comm, self.gathers_free)
                    for s, t in zip(s_codes, t_codes, strict=True)
                ]  # fmt: skip
                f, b = np.array([x[0] for x in pairs]), np.array([x[1] for x in pairs])
            fixed[s_codes, t_codes], per_byte[s_codes, t_codes] = f, b
            known[s_codes, t_codes] = True
        return fixed[grid], per_byte[grid]


@functools.lru_cache(maxsize=8)
def linear_tables(mesh: MeshAxes, objective: str, gathers_free: bool = False) -> LinearTables:
    """The `LinearTables` of a mesh (kept across planning runs, like `reshard_linear`'s cache);
    ``gathers_free``: the uniform tensors' tables. The two share their walks (`Walked`)."""
    return LinearTables(mesh, objective, gathers_free, _walked(mesh, objective))


@functools.lru_cache(maxsize=8)
def _walked(mesh: MeshAxes, objective: str) -> Walked:
    """The walks the two `linear_tables` of a mesh and objective share."""
    return Walked()
