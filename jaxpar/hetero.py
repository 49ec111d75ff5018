"""AccPar's heterogeneous cost formulas: per-device times and the partition ratio α.

AccPar (Song et al., HPCA 2020, §4-§5.3) gives every accelerator i a computation density c_i
(FLOP/s) and a network bandwidth b_i (bytes/s), and lets the work of a layer be split unevenly:
device i takes a share s_i of it (two groups: α and β = 1 − α). Then::

    computation     E_cp,i = s_i · F / c_i          (Eq. 8; F = the layer's FLOPs, Table 6)
    communication   E_cm,i = A_i / b_i              (Eq. 7; A_i = what device i moves)
    configuration   max_i (E_cp,i + E_cm,i)         (the slowest device sets the pace)
    ratio           α·(E_cp(p_i) + E_cm(p_i)) = β·(E_cp(p_j) + E_cm(p_j)),  β = 1 − α   (Eq. 10)

Communication comes in two parts here. `share_bytes` is what a device moves at share 1, scaled
by its share: the inter-layer conversions of Table 5 and the assumption of §5.3 that E_cm is
linear in α. `fixed_bytes` is moved whatever the share: the partial-sum tensors of Table 4,
which the paper notes are "not dependable on the partitioning ratio α". With no fixed bytes,
every function below is Eq. 10 verbatim; with them, the balance point shifts (`partition_ratio`).

An *even split* is what XLA's NamedSharding runs (every shard the same size); a *ratio split* is
an uneven partition sized by `balanced_shares`. `even_split_time` and `ratio_split_time` give
both, so a planner can report what heterogeneity costs and what uneven partitioning would win.

Units: FLOPs, FLOP/s, bytes and bytes/s (AccPar's A(T) counts elements; multiply by the dtype's
size). Per-device inputs come from the cluster: `Cluster.device_flops(dtype)` (c_i) and
`Cluster.device_bandwidth()` (b_i). Pure module: numpy only, no jax import.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

_SHARE_TOLERANCE = 1e-9  # how far from 1 a list of shares may sum


def compute_times(flops: float, rates: ArrayLike, shares: ArrayLike | None = None) -> np.ndarray:
    """Eq. 8 for every device: E_cp,i = s_i · F / c_i.

    `flops` is F, the layer's total FLOPs; `rates` are the c_i in FLOP/s; `shares` the s_i,
    non-negative and summing to 1 (None: the even split s_i = 1/n).
    """
    c = _positive("rates", rates)
    s = _shares(shares, c.size)
    return s * _non_negative("flops", flops) / c


def comm_times(nbytes: ArrayLike, bandwidths: ArrayLike) -> np.ndarray:
    """Eq. 7 for every device: E_cm,i = A_i / b_i.

    `nbytes` is A_i in bytes, one number for all devices or one per device; `bandwidths` the
    b_i in bytes/s (infinity allowed: such a device never waits on the network).
    """
    b = _positive("bandwidths", bandwidths)
    a = _non_negative("nbytes", nbytes)
    return np.broadcast_to(a, b.shape) / b


def unit_costs(
    flops: float,
    rates: ArrayLike,
    *,
    bandwidths: ArrayLike | None = None,
    share_bytes: ArrayLike = 0.0,
) -> np.ndarray:
    """Every device's time for the *whole* layer (share 1): a_i = F / c_i + S_i / b_i.

    These are Eq. 10's E_cp(p_i) + E_cm(p_i): a device given share s takes s · a_i.
    `share_bytes` S_i is what device i moves at share 1 (scaled by the share).
    """
    c = _positive("rates", rates)
    return _non_negative("flops", flops) / c + _comm(share_bytes, bandwidths, c.size)


def device_times(
    flops: float,
    rates: ArrayLike,
    shares: ArrayLike | None = None,
    *,
    bandwidths: ArrayLike | None = None,
    share_bytes: ArrayLike = 0.0,
    fixed_bytes: ArrayLike = 0.0,
) -> np.ndarray:
    """Every device's time: t_i = s_i · (F / c_i + S_i / b_i) + M_i / b_i, and 0 where s_i = 0.

    Eq. 8 plus Eq. 7, with S_i = `share_bytes` (moved at share 1, scaled by the share) and
    M_i = `fixed_bytes` (moved whatever the share). A device with share 0 sits the layer out.
    `shares` None means the even split.
    """
    c = _positive("rates", rates)
    s = _shares(shares, c.size)
    times = s * unit_costs(flops, c, bandwidths=bandwidths, share_bytes=share_bytes)
    times = times + _comm(fixed_bytes, bandwidths, c.size)
    return np.where(s > 0, times, 0.0)


def partition_ratio(
    cost_i: float, cost_j: float, fixed_i: float = 0.0, fixed_j: float = 0.0
) -> float:
    """Eq. 10: the share α of side i (β = 1 − α to side j) that makes both finish together.

    Solves α · a_i + f_i = (1 − α) · a_j + f_j for the whole-layer costs a (`unit_costs`, one
    per side: a device, or a group balanced inside, see `combined_cost`) and the fixed costs f
    (e.g. Table 4's partial sums, M / b):

        α = (a_j + f_j − f_i) / (a_i + a_j),   clipped to [0, 1]

    With f = 0 this is Eq. 10 as printed, α = a_j / (a_i + a_j); for pure compute
    (a = F / c) it is α = c_i / (c_i + c_j): TPU-v2 (180) against TPU-v3 (420) gives 0.3.
    """
    a_i = _positive_scalar("cost_i", cost_i)
    a_j = _positive_scalar("cost_j", cost_j)
    if not math.isfinite(a_i + a_j):
        raise ValueError("partition_ratio needs finite costs")
    alpha = (a_j + float(fixed_j) - float(fixed_i)) / (a_i + a_j)
    return min(1.0, max(0.0, alpha))


def combined_cost(costs: ArrayLike) -> float:
    """Whole-layer cost of a group of devices that splits its work by `balanced_shares`.

    With no fixed costs the balanced group finishes in 1 / Σ_k (1 / a_k): the devices act as
    one of summed speed. This is how `hierarchical_shares` treats each half at a cut.
    """
    a = _positive("costs", costs)
    return float(1.0 / np.sum(1.0 / a))


def balanced_shares(costs: ArrayLike, fixed: ArrayLike | None = None) -> np.ndarray:
    """Shares s_k (summing to 1) that minimise the slowest device's time max_k (s_k a_k + f_k).

    The k-group form of Eq. 10: every device that takes part finishes at the same time t,

        s_k = (t − f_k) / a_k,   t = (1 + Σ f_k / a_k) / Σ 1 / a_k   (over the devices taking part)

    and a device whose fixed cost f_k alone reaches t takes no share (water-filling; it sits
    the layer out, see `device_times`). With no fixed costs, s_k ∝ 1 / a_k: for pure compute
    shares are proportional to speed, s_k = c_k / Σ c.
    """
    a = _positive("costs", costs)
    if not np.all(np.isfinite(a)):
        raise ValueError("balanced_shares needs finite costs (a device with no speed?)")
    f = np.zeros_like(a) if fixed is None else _non_negative("fixed", fixed, a.size)
    active = np.ones(a.size, dtype=bool)
    while True:
        level = (1.0 + np.sum(f[active] / a[active])) / np.sum(1.0 / a[active])
        drop = active & (f >= level)
        if not drop.any() or drop.sum() == active.sum():
            break
        active &= ~drop
    shares = np.where(active, (level - f) / a, 0.0)
    return np.clip(shares, 0.0, None) / np.sum(np.clip(shares, 0.0, None))


def hierarchical_shares(costs: ArrayLike) -> np.ndarray:
    """AccPar's hierarchical (recursive) partition: split the devices in two, Eq. 10, recurse.

    The devices (in order) are cut into a first and a second half; each half counts as one
    side of cost `combined_cost`; `partition_ratio` gives the first half its share α; each
    half then splits its share the same way. With costs linear in the share this reaches the
    same shares as `balanced_shares` (s_k ∝ 1 / a_k), cut by cut, as AccPar's h levels do.
    """
    a = _positive("costs", costs)
    if a.size == 1:
        return np.ones(1)
    half = a.size // 2
    alpha = partition_ratio(combined_cost(a[:half]), combined_cost(a[half:]))
    first, second = hierarchical_shares(a[:half]), hierarchical_shares(a[half:])
    return np.concatenate([alpha * first, (1.0 - alpha) * second])


def even_split_time(
    flops: float,
    rates: ArrayLike,
    *,
    bandwidths: ArrayLike | None = None,
    share_bytes: ArrayLike = 0.0,
    fixed_bytes: ArrayLike = 0.0,
) -> float:
    """Time of the even split (s_i = 1/n, XLA's NamedSharding): max_i t_i of `device_times`."""
    times = device_times(
        flops, rates, None, bandwidths=bandwidths, share_bytes=share_bytes, fixed_bytes=fixed_bytes
    )
    return float(times.max())


def ratio_split_time(
    flops: float,
    rates: ArrayLike,
    *,
    bandwidths: ArrayLike | None = None,
    share_bytes: ArrayLike = 0.0,
    fixed_bytes: ArrayLike = 0.0,
) -> float:
    """Time of the balanced uneven split (`ratio_shares`): max_i t_i, never above the even one."""
    shares = ratio_shares(
        flops, rates, bandwidths=bandwidths, share_bytes=share_bytes, fixed_bytes=fixed_bytes
    )
    times = device_times(
        flops,
        rates,
        shares,
        bandwidths=bandwidths,
        share_bytes=share_bytes,
        fixed_bytes=fixed_bytes,
    )
    return float(times.max())


def ratio_shares(
    flops: float,
    rates: ArrayLike,
    *,
    bandwidths: ArrayLike | None = None,
    share_bytes: ArrayLike = 0.0,
    fixed_bytes: ArrayLike = 0.0,
) -> np.ndarray:
    """The balanced shares of a layer: `balanced_shares` of its `unit_costs` and fixed costs."""
    c = _positive("rates", rates)
    costs = unit_costs(flops, c, bandwidths=bandwidths, share_bytes=share_bytes)
    if np.all(costs == 0):  # nothing to do: any split is as good; keep the even one
        return np.full(c.size, 1.0 / c.size)
    return balanced_shares(costs, _comm(fixed_bytes, bandwidths, c.size))


def split_sizes(length: int, shares: ArrayLike, multiple: int = 1) -> np.ndarray:
    """Integer sizes summing to `length` that follow `shares` (largest-remainder rounding).

    Each size is a multiple of `multiple` (a tile or a per-device batch granule), so `length`
    must be one too. Ties in the remainders go to the lower index. Example: a batch of 512 at
    shares (0.3, 0.7) -> (154, 358); with multiple=8 -> (152, 360).
    """
    if length < 0 or multiple < 1 or length % multiple:
        raise ValueError(
            f"split_sizes needs length >= 0 divisible by multiple >= 1, got {length}, {multiple}"
        )
    s = _shares(shares, None)
    units = length // multiple
    raw = s * units
    sizes = np.floor(raw).astype(int)
    remainder = units - int(sizes.sum())
    order = np.argsort(-(raw - sizes), kind="stable")
    sizes[order[:remainder]] += 1
    return sizes * multiple


# ---- validation ------------------------------------------------------------------------------


def _comm(nbytes: ArrayLike, bandwidths: ArrayLike | None, n: int) -> np.ndarray:
    """nbytes / b per device; no bandwidths is fine only when nothing moves."""
    a = _non_negative("bytes", nbytes)
    if bandwidths is None:
        if np.any(a > 0):
            raise ValueError("bytes to move need bandwidths (b_i, bytes/s per device)")
        return np.zeros(n)
    b = _positive("bandwidths", bandwidths, n)
    return np.broadcast_to(a, (n,)) / b


def _positive(name: str, values: ArrayLike, n: int | None = None) -> np.ndarray:
    array = np.atleast_1d(np.asarray(values, dtype=float))
    if array.ndim != 1 or array.size == 0 or (n is not None and array.size not in (1, n)):
        expected = "a non-empty 1-D array" if n is None else f"one value or {n} values"
        raise ValueError(f"{name} must be {expected}, got shape {array.shape}")
    if not np.all(array > 0):  # also rejects NaN
        raise ValueError(f"{name} must all be > 0, got {array.tolist()}")
    return np.broadcast_to(array, (n,)).copy() if n is not None else array


def _non_negative(name: str, values: ArrayLike, n: int | None = None) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if not np.all(array >= 0):
        raise ValueError(f"{name} must all be >= 0, got {array.tolist()}")
    if n is not None:
        try:
            return np.broadcast_to(array, (n,)).copy()
        except ValueError:
            raise ValueError(f"{name} must be one value or {n} values") from None
    return array


def _positive_scalar(name: str, value: float) -> float:
    if not float(value) > 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return float(value)


def _shares(shares: ArrayLike | None, n: int | None) -> np.ndarray:
    if shares is None:
        if n is None:
            raise ValueError("shares are required here")
        return np.full(n, 1.0 / n)
    s = np.atleast_1d(np.asarray(shares, dtype=float))
    if s.ndim != 1 or s.size == 0 or (n is not None and s.size != n):
        raise ValueError(f"shares must be {n or 'some'} values, got shape {s.shape}")
    if not np.all(s >= 0) or abs(float(s.sum()) - 1.0) > _SHARE_TOLERANCE:
        raise ValueError(f"shares must be >= 0 and sum to 1, got {s.tolist()}")
    return s


# ---------------------------------------------------------------- a configuration on a mesh


def _by_shard(values: np.ndarray, split_axes: tuple[int, ...]) -> np.ndarray:
    """``values`` (mesh-shaped) as a (shards, replicas) table for a split over ``split_axes``."""
    values = np.asarray(values)
    lead = np.moveaxis(values, split_axes, tuple(range(len(split_axes))))
    shards = math.prod(values.shape[a] for a in split_axes)
    return lead.reshape(shards, -1)


def shard_rates(speeds: np.ndarray, split_axes: tuple[int, ...]) -> np.ndarray:
    """Rate of each shard when the mesh axes ``split_axes`` split the work.

    ``speeds`` holds c_i shaped like the mesh. Devices that differ only on the other axes hold
    the same shard (replicas), all compute it, and the slowest of them sets its pace: a shard's
    rate is the minimum over its replicas. Returns one rate per shard.
    """
    return _by_shard(np.asarray(speeds, dtype=float), split_axes).min(axis=1)


def ratio_factor(speeds: np.ndarray, split_axes: tuple[int, ...]) -> float:
    """t_ratio / t_even of one configuration's compute (AccPar Eq. 8 + Eq. 10 on a mesh).

    Even split (NamedSharding): every shard is 1/k of the work W, so the slowest shard rate
    c_min sets the time W / (k · c_min). Ratio split: shard j gets a share c_j / Σ c, so every
    shard finishes together at W / Σ_j c_j. The factor is k · c_min / Σ_j c_j (1 when every
    shard is as fast: homogeneous clusters, or splits that do not cross device groups).
    """
    rates = shard_rates(speeds, split_axes)
    return float(rates.size * rates.min() / rates.sum())


def group_shares(
    speeds: np.ndarray, groups: np.ndarray, split_axes: tuple[int, ...]
) -> dict[int, float]:
    """Share of the work each device group's shards take in the ratio split (α per group).

    A shard belongs to the group of its slowest replica. Two groups of one device each, rates
    c_0 and c_1, split over the axis joining them: {0: c_0 / (c_0 + c_1), 1: c_1 / (...)}.
    """
    table = _by_shard(np.asarray(speeds, dtype=float), split_axes)
    owners = _by_shard(np.asarray(groups), split_axes)
    slowest = table.argmin(axis=1)
    rates = table[np.arange(len(table)), slowest]
    owner = owners[np.arange(len(table)), slowest]
    out: dict[int, float] = {}
    for g, r in zip(owner.tolist(), (rates / rates.sum()).tolist(), strict=True):
        out[int(g)] = out.get(int(g), 0.0) + r
    return out


class MeshSpeeds:
    """Per-device compute rates laid out like the mesh, for the ratio (uneven split) costs.

    Built by the planner from `Cluster.device_flops` and the mesh's device positions; the
    factors depend only on which mesh axes a configuration splits, so they are cached per
    (dtype, split axes): at most 2^axes entries per dtype.
    """

    def __init__(self, rate_of: object, groups: np.ndarray, group_names: tuple[str, ...]):
        self._rate_of = rate_of  # dtype -> mesh-shaped array of c_i
        self.groups = np.asarray(groups)  # group index of every mesh position
        self.group_names = group_names  # names of all the cluster's groups, by index
        self._rates: dict[str, np.ndarray] = {}
        self._factors: dict[tuple[str, tuple[int, ...]], float] = {}

    def rates(self, dtype: str) -> np.ndarray:
        if dtype not in self._rates:
            self._rates[dtype] = np.asarray(self._rate_of(dtype), dtype=float)
        return self._rates[dtype]

    def factor(self, dtype: str, split_axes: tuple[int, ...]) -> float:
        """`ratio_factor` of a configuration splitting ``split_axes`` (cached)."""
        key = (dtype, split_axes)
        if key not in self._factors:
            self._factors[key] = ratio_factor(self.rates(dtype), split_axes)
        return self._factors[key]

    def shares(self, dtype: str, split_axes: tuple[int, ...]) -> dict[str, float]:
        """`group_shares` by group name: α of each group in the ratio split."""
        raw = group_shares(self.rates(dtype), self.groups, split_axes)
        return {self.group_names[g]: share for g, share in sorted(raw.items())}

    def slowdown(self, dtype: str) -> dict[str, float]:
        """Per group present in the mesh: c_min / c_group, the part of an even-split step's
        compute time that group's devices are busy (1 for the slowest group)."""
        rates = self.rates(dtype)
        slowest = float(rates.min())
        out: dict[str, float] = {}
        for g in sorted(set(self.groups.reshape(-1).tolist())):
            out[self.group_names[g]] = slowest / float(rates[self.groups == g].min())
        return out
