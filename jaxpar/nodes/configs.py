"""Configurations: which iteration dim of a node each mesh axis splits, and the layouts they give.

A configuration (`Config`) assigns each mesh axis an iteration dim of the node's space, or -1
(the axis replicates the work). A layout (`Spec`) is a tuple, one entry per tensor dim, of the
mesh-axis indices splitting that dim in mesh order: a PartitionSpec over axis indices.

Pure: numpy only.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence

import numpy as np

from ..rules.table import CONTRACTIONS, DimMap, OpSpace
from .planning_nodes import Node, NodeGraph

Spec = tuple[tuple[int, ...], ...]
Config = tuple[int, ...]


def enumerate_configs(space: OpSpace, sizes: Sequence[int], tensor_sizes) -> list[Config]:
    """All assignments of mesh axes to splittable iteration dims that divide every tensor dim.

    ``tensor_sizes``: (tensor dim size, iteration dim) pairs of every tensor the node touches; a
    configuration is valid when each such dim is divisible by the product of the axes on it.
    """
    choices = (-1, *(d for d in range(len(space.sizes)) if space.splittable[d]))
    return list(_valid_configs(choices, tuple(sizes), frozenset(tensor_sizes)))


# bounded: a plan asks for ~100 distinct ones (llama3_70b unrolled: 111)
@functools.lru_cache(maxsize=1 << 10)
def _valid_configs(
    choices: tuple[int, ...], sizes: tuple[int, ...], tensor_sizes: frozenset[tuple[int, int]]
) -> tuple[Config, ...]:
    """`enumerate_configs` of one (choices, mesh, tensor dims): layers repeat, and so do these.

    Built one mesh axis at a time, each partial configuration kept only while every tensor
    dim stays divisible by the axes placed on it so far (a degree only grows, so a pruned
    prefix has no valid completion): the work is the valid configurations times the axes,
    not (dims + 1)^axes. In `itertools.product`'s order (the last axis varies fastest).
    """
    by_dim: dict[int, tuple[int, ...]] = {}
    for size, d in tensor_sizes:
        by_dim[d] = (*by_dim.get(d, ()), size)
    partial: list[tuple[Config, dict[int, int]]] = [((), {})]
    for size in sizes:
        grown = []
        for cfg, deg in partial:
            for d in choices:
                if d < 0:
                    grown.append(((*cfg, d), deg))
                    continue
                k = deg.get(d, 1) * size
                if all(n % k == 0 for n in by_dim.get(d, ())):
                    grown.append(((*cfg, d), {**deg, d: k}))
        partial = grown
    return tuple(cfg for cfg, _ in partial)


def _divides(cfg: Config, sizes: Sequence[int], tensor_sizes) -> bool:
    """Whether every (tensor dim size, iteration dim) pair of ``tensor_sizes`` is divisible by
    the product of the mesh axes ``cfg`` puts on that iteration dim."""
    deg: dict[int, int] = {}
    for a, d in enumerate(cfg):
        if d >= 0:
            deg[d] = deg.get(d, 1) * sizes[a]
    return all(size % deg.get(d, 1) == 0 for size, d in tensor_sizes)


# bounded: a plan asks for ~1,000 distinct ones (llama3_70b unrolled on 1,024 devices: 860)
@functools.lru_cache(maxsize=1 << 16)
def spec_of(dim_map: DimMap | None, cfg: Config) -> Spec:
    """The layout of a tensor whose dims map to iteration dims ``dim_map`` under ``cfg``
    (cached: evaluating a plan asks for the same few layouts hundreds of thousands of times)."""
    if dim_map is None:
        return ()
    return tuple(
        tuple(a for a, d in enumerate(cfg) if d >= 0 and d == m) if m is not None else ()
        for m in dim_map
    )


def shard_count(spec: Spec, sizes: Sequence[int]) -> int:
    """Number of shards of a tensor in layout ``spec``: the product of the axes splitting it."""
    return math.prod(sizes[a] for axes in spec for a in axes)


def degree(cfg: Config, dims: frozenset[int], sizes: Sequence[int]) -> int:
    """Degree of parallelism of work split over ``dims``: product of the axes assigned to them."""
    return math.prod(sizes[a] for a, d in enumerate(cfg) if d in dims)


def split_axes(cfg: Config) -> tuple[int, ...]:
    """Mesh axes a configuration splits work over (the rest replicate it)."""
    return tuple(a for a, d in enumerate(cfg) if d >= 0)


def dim_degrees(cfgs: Sequence[Config], ndims: int, sizes: Sequence[int]) -> np.ndarray:
    """``D[c, d]``: degree of iteration dim ``d`` under configuration ``c`` (product of its axes).

    The vectorized form of `degree`: every per-config quantity of a node is a product of
    columns of this table.
    """
    table = np.ones((len(cfgs), ndims + 1))  # last column: "no dim" (-1), ignored
    arr = np.asarray(cfgs, dtype=np.int64).reshape(len(cfgs), len(sizes))
    for a, size in enumerate(sizes):
        np.multiply.at(table, (np.arange(len(cfgs)), arr[:, a]), size)
    return table[:, :ndims]


def is_contraction(ng: NodeGraph, node: Node) -> bool:
    """Whether the node's anchor is a dot_general or a convolution."""
    return node.anchor >= 0 and ng.program.eqns[node.anchor].primitive in CONTRACTIONS


def tensor_dims(ng: NodeGraph, node: Node) -> list[tuple[int, int]]:
    """(tensor dim size, iteration dim) of every tensor dim the node's members touch."""
    out: list[tuple[int, int]] = []
    tensors = ng.program.tensors
    for m in node.members:
        if m.eqn < 0:
            pairs = [(node.invar, node.tensor_maps[node.invar])]
        else:
            eqn = ng.program.eqns[m.eqn]
            pairs = list(zip(eqn.inputs, m.in_maps, strict=True))
            pairs += list(zip(eqn.outputs, m.out_maps, strict=True))
        for t, mp in pairs:
            if t is None or mp is None:
                continue
            out += [(s, d) for s, d in zip(tensors[t].shape, mp, strict=True) if d is not None]
    return out


def manual_config(space: OpSpace, names: Sequence[str], trivial: Sequence[str] = ()) -> Config:
    """The one configuration of code partitioned by hand (`OpSpace.manual`) on a mesh with axes
    ``names``; a ValueError when the mesh lacks an axis it names. ``trivial``: the user's axes
    of size 1 the planning mesh leaves out; a shard_map over one of them splits nothing."""
    dims = dict(space.manual)
    missing = sorted(set(dims) - set(names) - set(trivial))
    if missing:
        raise ValueError(
            f"a shard_map names mesh axes {missing} that the planning mesh {tuple(names)} lacks; "
            "plan on the mesh the shard_map runs on"
        )
    return tuple(dims.get(name, -1) for name in names)


def automatic_configs(
    manual: Config, space: OpSpace, sizes: Sequence[int], names: Sequence[str], tensor_sizes
) -> list[Config]:
    """The configurations of code partitioned by hand over some mesh axes: ``manual`` on
    those, and on each automatic axis (`OpSpace.automatic_axes`, by name) no split or one of
    the dims it may split (`OpSpace.automatic`), where every tensor dim stays divisible
    (`enumerate_configs`)."""
    if not space.automatic:
        return [manual]
    options = [
        (-1, *space.automatic) if name in space.automatic_axes else (d,)
        for d, name in zip(manual, names, strict=True)
    ]
    pairs = frozenset(tensor_sizes)
    return [cfg for cfg in itertools.product(*options) if _divides(cfg, sizes, pairs)]


def node_configs(
    ng: NodeGraph,
    node: Node,
    sizes: Sequence[int],
    full_contractions: bool = False,
    names: Sequence[str] = (),
    trivial: Sequence[str] = (),
) -> list[Config]:
    """Candidate configurations of a node (at least the replicated one).

    ``full_contractions`` (SoyBean's problem, ``objective="comm"``): dot_general /
    conv_general_dilated nodes keep only configurations that split over every mesh axis.
    ``names``: the mesh's axis names, which code partitioned by hand names (`manual_config`);
    ``trivial``: the user's size-1 axes, left out of ``names``.
    """
    replicated = (-1,) * len(sizes)
    if node.fixed:
        return [replicated]
    if node.space.manual:  # partitioned by hand: its own layouts (and its automatic axes')
        manual = manual_config(node.space, names, trivial)
        return automatic_configs(manual, node.space, sizes, names, tensor_dims(ng, node))
    cfgs = enumerate_configs(node.space, sizes, tensor_dims(ng, node))
    if full_contractions and is_contraction(ng, node):
        cfgs = [c for c in cfgs if all(d >= 0 for d in c)] or cfgs
    return cfgs or [replicated]
