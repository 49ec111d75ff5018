"""Per-device speeds on a heterogeneous mesh: AccPar's ratio (uneven) split, priced.

AccPar (Song et al., HPCA 2020, §4-§5.3) gives every accelerator i a computation density c_i
(FLOP/s) and lets the work of a layer be split unevenly: device i takes a share s_i of it. Its
computation time is (Eq. 8)

    E_cp,i = s_i · F / c_i                          (F = the layer's FLOPs)

and the partition ratio α of Eq. 10 makes both sides of a cut finish together:

    α · E(p_i) = β · E(p_j),  β = 1 − α   ->   α = c_i / (c_i + c_j)   (compute only)

On a mesh, a configuration splits the work over some mesh axes; devices that differ only on
the other axes hold the same shard (replicas) and the slowest of them sets its pace. With k
shards of rates c_1 .. c_k (each the minimum over its replicas):

    even split    (XLA's NamedSharding, every shard W / k):  t_even  = W / (k · min_j c_j)
    ratio split   (shard j gets c_j / Σ c, AccPar Eq. 10):  t_ratio = W / Σ_j c_j
    ratio factor  t_ratio / t_even = k · min_j c_j / Σ_j c_j

Applied cut by cut (AccPar's hierarchical partition), Eq. 10 reaches the same shares
s_j = c_j / Σ c, so the factor is the whole of the ratio split's compute gain. It is 1 on a
homogeneous mesh and for splits that stay inside one device kind. `MeshSpeeds` holds the c_i
laid out like the mesh and caches the factor per (dtype, split axes); the planner multiplies
each configuration's even-split compute time t_C by it to report the ratio split.

Pure module: numpy only, no jax import.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np


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

    def __init__(
        self,
        rate_of: Callable[[str], np.ndarray],
        groups: np.ndarray,
        group_names: tuple[str, ...],
    ):
        self._rate_of = rate_of  # dtype -> mesh-shaped array of c_i
        self.groups = np.asarray(groups)  # group index of every mesh position
        self.group_names = group_names  # names of all the cluster's groups, by index
        self._rates: dict[str, np.ndarray] = {}
        self._factors: dict[tuple[str, tuple[int, ...]], float] = {}

    def rates(self, dtype: str) -> np.ndarray:
        """The c_i of every mesh position for `dtype`, shaped like the mesh (cached)."""
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
