"""Baseline strategies, costed by the same model as the search.

- ``data``: every node splits its batch dimension over the whole mesh (parameters replicated;
  gradients all-reduced: the partial sums of the weight-gradient contractions).
- ``model``: every node splits its output channel / feature dimension (the last dimension) over
  the whole mesh — OptCNN's "model parallelism", Megatron-style column splits.
- ``owt``: Krizhevsky's "one weird trick": data parallelism for convolutional layers, model
  parallelism for dense layers.
- ``fsdp``: data parallelism over the whole mesh, with parameters and optimizer state stored
  sharded over the whole mesh on their largest dim (ZeRO-3 / FSDP): gathered before use. Nodes
  without a batch dim (the reduced weight gradients' transposes and casts, the optimizer
  update) take the state's layout, so gradients are sliced as soon as they are reduced.
- ``fsdp_tp``: FSDP over the outer mesh axes and tensor parallelism over the innermost one
  (MaxText / torchtitan style): nodes split the batch over the outer axes and their output
  feature over the inner axis; state is sharded over the outer axes on its largest dim and over
  the inner axis on its last dim.
- ``hypar``: HyPar (Song et al., HPCA 2019), as AccPar §3.5 describes it: per layer, a choice
  between data parallelism and model parallelism only, i.e. AccPar's Type-I (split the batch B)
  and Type-II (split the layer's input features D_i), never Type-III (split D_o), with a binary
  hierarchical partition (every level splits the devices in two). Unlike the other baselines it is
  a *search*: the planner's search (elimination or k-cut) over a restricted space, built by
  `hypar_space`. In jaxpar terms, for every contraction node (dot_general / conv) each mesh axis
  goes to a batch dim (Type-I) or to the node's Type-II dim (`type2_dims`); every axis is used,
  as every HyPar level splits (an axis of size 2^j stands for j levels that take the same type).
  The data-parallel configuration of the node is always kept (it leaves an axis unused only when
  the batch does not divide), so HyPar is never worse than ``data``. Other nodes (elementwise,
  reductions, optimizer updates, inputs) keep their whole space: HyPar types layers, and the
  layouts between layers are priced by the same inter-layer conversion costs, which our search
  minimizes over. Equal partitioning (no heterogeneity ratio α) holds throughout the planner.

Pure.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from ..nodes.configs import Config
from ..nodes.layer_labels import layer_kinds
from ..nodes.planning_nodes import NodeGraph
from ..program.graph import BACKWARD, FORWARD, phase_of
from ..rules.table import CONTRACTIONS

STRATEGIES = ("auto", "data", "model", "owt", "fsdp", "fsdp_tp", "hypar")
BASELINES = ("data", "model", "owt", "fsdp", "fsdp_tp")  # fixed rules, computed while planning


def _best_on_dim(configs: list[Config], dims: Sequence[int], sizes: Sequence[int]) -> int:
    """Index of the config putting the most devices on one of ``dims`` and nothing elsewhere
    (the first such; with no such config, the first replicated one, else 0)."""
    return _best_on_dim_cached(tuple(configs), tuple(dims), tuple(sizes))


@functools.lru_cache(maxsize=1024)  # repeated layers ask the same question thousands of times
def _best_on_dim_cached(
    configs: tuple[Config, ...], dims: tuple[int, ...], sizes: tuple[int, ...]
) -> int:
    if not configs:
        return 0
    table = np.asarray(configs, dtype=np.int64).reshape(len(configs), len(sizes))
    unused = table == -1
    replicated = np.nonzero(unused.all(axis=1))[0]
    fallback = int(replicated[0]) if len(replicated) else 0
    best = np.zeros(len(configs), dtype=np.int64)
    for dim in dims:
        on = table == dim
        degree = np.where(on, np.asarray(sizes, dtype=np.int64), 1).prod(axis=1)
        best = np.maximum(best, np.where((unused | on).all(axis=1), degree, 0))
    return int(np.argmax(best)) if best.max() > 0 else fallback


def baseline_assignment(
    strategy: str,
    ng: NodeGraph,
    configs: list[list[Config]],
    batch: Sequence[set[int]],
    labels: Sequence[str],
    sizes: Sequence[int],
    state_nodes: frozenset[int] = frozenset(),
) -> list[int]:
    """One configuration index per node for a baseline strategy (``labels``: `node_labels`;
    ``state_nodes``: the input nodes of parameters and optimizer state)."""
    if strategy not in BASELINES:
        raise ValueError(f"unknown baseline {strategy!r}; choose one of {BASELINES}")
    if strategy in ("fsdp", "fsdp_tp"):
        return _sharded_state(strategy, ng, configs, batch, sizes, state_nodes)
    kinds = layer_kinds(ng)
    out = []
    for node, cfgs in zip(ng.nodes, configs, strict=True):
        style = strategy
        if strategy == "owt":
            kind = kinds.get(labels[node.index], "")
            style = "model" if kind == "dense" else "data"
        if style == "data":
            dims = sorted(batch[node.index], key=lambda d: -node.space.sizes[d])
        else:
            out_map = node.space.out_maps[0] if node.space.out_maps else ()
            dims = [out_map[-1]] if out_map and out_map[-1] is not None else []
        out.append(_best_on_dim(cfgs, dims, sizes))
    return out


def _index_of(cfgs: list[Config], *wanted: Config) -> int | None:
    """Index of the first of ``wanted`` among ``cfgs``."""
    index = _positions(tuple(cfgs))
    return next((index[w] for w in wanted if w in index), None)


@functools.lru_cache(maxsize=1024)  # repeated layers have the same configurations
def _positions(cfgs: tuple[Config, ...]) -> dict[Config, int]:
    return {c: i for i, c in enumerate(cfgs)}


def _sharded_state(
    strategy: str,
    ng: NodeGraph,
    configs: list[list[Config]],
    batch: Sequence[set[int]],
    sizes: Sequence[int],
    state_nodes: frozenset[int],
) -> list[int]:
    """The ``fsdp`` and ``fsdp_tp`` hand plans (module docstring)."""
    k = len(sizes)
    inner = strategy == "fsdp_tp" and k > 1
    outer = k - 1 if inner else k
    out = []
    for node, cfgs in zip(ng.nodes, configs, strict=True):
        by_size = sorted(range(len(node.space.sizes)), key=lambda d: -node.space.sizes[d])
        if node.index in state_nodes or not batch[node.index]:
            # state, and what has no batch: weight gradients after their reduction (a
            # transpose, a cast), the optimizer update; in the state's layout, the reduced
            # gradient is sliced where it is produced (a reduce-scatter on GPU/TPU)
            dims = [d for d in by_size if node.space.splittable[d]]
            last = len(node.space.sizes) - 1
            wanted = [(d,) * outer + ((last,) if inner else ()) for d in dims]
            wanted += [(d,) * outer + ((-1,) if inner else ()) for d in dims]
            i = _index_of(cfgs, *wanted)
            out.append(i if i is not None else _best_on_dim(cfgs, dims, sizes))
            continue
        bdims = [d for d in by_size if d in batch[node.index]]
        out_map = node.space.out_maps[0] if node.space.out_maps else ()
        feature = out_map[-1] if out_map and out_map[-1] is not None else -1
        wanted = []
        for b in bdims:
            wanted += [(b,) * outer + ((feature,) if inner else ())]
            wanted += [(b,) * outer + ((-1,) if inner else ())]
        i = _index_of(cfgs, *wanted) if wanted else None
        out.append(i if i is not None else _best_on_dim(cfgs, bdims, sizes))
    return out


# ---------------------------------------------------------------- HyPar (AccPar §3.5)


def forward_reads(ng: NodeGraph) -> set[int]:
    """Tensors read by forward-pass contractions (the layers' inputs F_l and weights W_l)."""
    out: set[int] = set()
    for eqn in ng.program.eqns:
        if eqn.primitive in CONTRACTIONS and phase_of(eqn.name_stack) == FORWARD:
            out.update(t for t in eqn.inputs if t is not None)
    return out


def type2_dims(
    ng: NodeGraph, node_index: int, batch: set[int], fwd_reads: set[int] | None = None
) -> set[int]:
    """Iteration dims of a contraction node that carry the layer's input features D_i (Type-II).

    AccPar Table 3 (rotational symmetry), for ``F_{l+1} = F_l W_l``:

    - forward ``F_l × W_l``: D_i is contracted: the non-batch reduced dims;
    - backward ``E_{l+1} × W_l^T`` (the operand without a batch dim is the weight): D_i is the
      weight's dim that is not contracted, i.e. the result's feature dim;
    - weight gradient ``F_l^T × E_{l+1}`` (the batch is contracted): D_i is the result dim that
      comes from the forward activation F_l, the operand a forward contraction also reads
    (``fwd_reads``: `forward_reads`, computed when not given).

    Contractions that are not layers (attention scores, ...) take the forward rule.
    """
    node = ng.nodes[node_index]
    eqn = ng.program.eqns[node.anchor]
    member = next(m for m in node.members if m.eqn == node.anchor)
    reduce = set(node.space.reduce_dims)
    operands = [
        (t, {d for d in mp if d is not None})
        for t, mp in zip(eqn.inputs, member.in_maps, strict=True)
        if t is not None and mp is not None
    ]
    if phase_of(eqn.name_stack) == BACKWARD and len(operands) == 2:
        weights = [dims for _, dims in operands if not dims & batch]
        if len(weights) == 1:
            return weights[0] - reduce
        if batch & reduce:  # weight gradient: the free dims of the forward activation
            if fwd_reads is None:
                fwd_reads = forward_reads(ng)
            for t, dims in operands:
                if t in fwd_reads:
                    return dims - reduce - batch
            return operands[0][1] - reduce - batch
    return reduce - batch


def hypar_space(
    ng: NodeGraph,
    configs: list[list[Config]],
    batch: list[set[int]],
    data: Sequence[int],
) -> list[list[int]]:
    """Per node, the configuration indices HyPar may use (see the module docstring).

    ``data``: the data-parallel baseline assignment, whose configuration every node keeps.
    """
    keep = []
    fwd = forward_reads(ng)
    for node, cfgs in zip(ng.nodes, configs, strict=True):
        contraction = node.anchor >= 0 and ng.program.eqns[node.anchor].primitive in CONTRACTIONS
        if not contraction or len(cfgs) == 1:
            keep.append(list(range(len(cfgs))))
            continue
        dims = batch[node.index] | type2_dims(ng, node.index, batch[node.index], fwd)
        ok = [i for i, c in enumerate(cfgs) if all(d in dims for d in c)]
        if data[node.index] not in ok:
            ok = sorted({*ok, data[node.index]})
        keep.append(ok)
    return keep
