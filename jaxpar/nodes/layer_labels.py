"""Per-node labels the planner and its reports need: the batch dims and the layer.

- `batch_dims`: which iteration dims of each node carry the batch, propagated from dim 0 of the
  batch arguments through every equation's dimension maps (and back into batch-less producers
  such as a ReLU's broadcast zero).
- `node_labels`: the layer each node belongs to (module name stack, parameter paths, optimizer
  state following its parameter), and `layer_kinds`: whether a layer is convolutional or dense.

Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..program.graph import UPDATE, Program, layer_from_param_path, param_labels
from ..rules.table import CONTRACTIONS
from .planning_nodes import Node, NodeGraph


def batch_dims(ng: NodeGraph, batch_tensors: Sequence[int]) -> list[set[int]]:
    """Per node, the iteration dims that carry the batch (propagated from dim 0 of the batch)."""
    program = ng.program
    tensor_batch: dict[int, set[int]] = {t: {0} for t in batch_tensors if program.tensors[t].shape}
    node_dims: list[set[int]] = [set() for _ in ng.nodes]
    for t in batch_tensors:
        if t in tensor_batch:
            node_dims[ng.node_of_tensor[t]].add(ng.nodes[ng.node_of_tensor[t]].tensor_maps[t][0])
    member_of = {m.eqn: m for node in ng.nodes for m in node.members if m.eqn >= 0}
    for eqn in program.eqns:
        node = ng.nodes[ng.node_of_eqn[eqn.index]]
        m = member_of[eqn.index]
        dims: set[int] = set()
        for t, mp in zip(eqn.inputs, m.in_maps, strict=True):
            if t is None or mp is None:
                continue
            dims |= {mp[d] for d in tensor_batch.get(t, ()) if mp[d] is not None}
        if not dims:
            continue
        node_dims[node.index] |= dims
        for t, mp in zip(eqn.outputs, m.out_maps, strict=True):
            tb = {i for i, d in enumerate(mp) if d in dims}
            if tb:
                tensor_batch[t] = tb
    # Backward: a computed tensor with no batch of its own (the broadcast zero of a ReLU, a
    # constant mask) that feeds a batch dim takes the batch there too, so data parallelism
    # splits it instead of computing it whole on every device. Parameters (input nodes) stay.
    for eqn in reversed(program.eqns):
        reader = ng.nodes[ng.node_of_eqn[eqn.index]]
        rdims = node_dims[reader.index]
        if not rdims:
            continue
        m = member_of[eqn.index]
        for t, mp in zip(eqn.inputs, m.in_maps, strict=True):
            if t is None or mp is None or t not in ng.node_of_tensor:
                continue
            producer = ng.nodes[ng.node_of_tensor[t]]
            if producer.anchor < 0 or node_dims[producer.index] or producer.fixed:
                continue
            tmap = producer.tensor_maps.get(t)
            if tmap is None:
                continue
            dims = {tmap[i] for i, d in enumerate(mp) if d in rdims and tmap[i] is not None}
            node_dims[producer.index] |= dims
    return node_dims


def node_labels(ng: NodeGraph) -> list[str]:
    """Layer label per node.

    From the name stack where it names modules (linen). Contractions without one (Flax NNX
    records only ``jvp()``) are labelled by the parameter path feeding them. Optimizer nodes take
    the label of the parameter or gradient they update; input nodes and remat's barriers that of
    their first labelled reader; optimizer state that of the parameter whose path it ends with.
    """
    labels = [n.label for n in ng.nodes]
    consumers = ng.program.consumers()
    _label_contractions_by_parameter(ng, labels)
    _spread_update_labels(ng, labels, consumers)
    _label_inputs_by_reader(ng, labels, consumers)
    _label_state_by_parameter(ng, labels)
    return labels


def _label_contractions_by_parameter(ng: NodeGraph, labels: list[str]) -> None:
    """A contraction with no module in its name stack (Flax NNX) takes the layer of the
    parameter path feeding it."""
    origin = param_labels(ng.program)
    for node in ng.nodes:
        if labels[node.index] or node.anchor < 0:
            continue
        eqn = ng.program.eqns[node.anchor]
        if eqn.primitive in CONTRACTIONS:
            for t in eqn.inputs:
                if t is not None and t in origin:
                    labels[node.index] = layer_from_param_path(origin[t])
                    break


def _update_neighbours(ng: NodeGraph, consumers: dict[int, list[int]]) -> dict[int, set[int]]:
    """Per update-phase node, the nodes it reads from and (its own) that read it."""
    program = ng.program
    neighbours: dict[int, set[int]] = {}
    for node in ng.nodes:
        if node.anchor < 0 or node.phase != UPDATE:
            continue
        for m in node.members:
            if m.eqn < 0:
                continue
            eqn = program.eqns[m.eqn]
            for t in eqn.inputs:
                src = ng.node_of_tensor.get(t) if t is not None else None
                if src is not None and src != node.index:
                    neighbours.setdefault(node.index, set()).add(src)
                    neighbours.setdefault(src, set()).add(node.index)
            for t in eqn.outputs:
                for e in consumers.get(t, []):
                    dst = ng.node_of_eqn[e]
                    if dst != node.index:
                        neighbours.setdefault(node.index, set()).add(dst)
    return neighbours


def _spread_update_labels(ng: NodeGraph, labels: list[str], consumers: dict) -> None:
    """Optimizer nodes (no module in their name stack) belong to the layer whose gradient or
    parameter they read: OWT then keeps a dense layer's momentum with its weights. Labels
    spread along update-phase edges both ways (momentum * b1 reads no gradient, but its
    consumer does), until nothing changes."""
    neighbours = _update_neighbours(ng, consumers)
    changed = True
    while changed:
        changed = False
        for v, near in neighbours.items():
            node = ng.nodes[v]
            if labels[v] or node.anchor < 0 or node.phase != UPDATE:
                continue
            found = next((labels[u] for u in sorted(near) if labels[u]), "")
            if found:
                labels[v], changed = found, True


def _label_inputs_by_reader(ng: NodeGraph, labels: list[str], consumers: dict) -> None:
    """Input nodes, and the barriers jax puts before a rematerialized layer (named for the
    stack around it), take the label of their first labelled reader in program order. A
    parameter's node also holds its cast to the compute dtype, so the readers of all its
    tensors count: without them a bf16 model's weights had no layer, and their copies in
    repeated layers were not tied."""
    program = ng.program
    for node in ng.nodes:
        if (node.anchor >= 0 or labels[node.index]) and not _is_barrier(program, node):
            continue
        readers = sorted(
            e
            for t in node.tensor_maps
            for e in consumers.get(t, [])
            if ng.node_of_eqn[e] != node.index
        )
        found = next((labels[r] for e in readers if labels[r := ng.node_of_eqn[e]]), "")
        if found:
            labels[node.index] = found


def _label_state_by_parameter(ng: NodeGraph, labels: list[str]) -> None:
    """Optimizer state (momentum, Adam moments) mirrors the parameter tree: a state leaf whose
    path ends like a labelled parameter's belongs to that parameter's layer."""
    program = ng.program
    paths = dict(zip(program.invars, program.invar_paths, strict=True))
    by_suffix: dict[str, str] = {}
    for node in ng.nodes:
        if node.anchor < 0 and labels[node.index] and ".params" in paths[node.invar]:
            by_suffix[paths[node.invar].split(".params", 1)[1]] = labels[node.index]
    for node in ng.nodes:
        if node.anchor < 0 and not labels[node.index]:
            hits = [x for x in by_suffix if x and paths[node.invar].endswith(x)]
            if hits:
                labels[node.index] = by_suffix[max(hits, key=len)]


def layer_kinds(ng: NodeGraph) -> dict[str, str]:
    """Layer label -> "conv" if it holds a convolution, "dense" if a dot_general."""
    kinds: dict[str, str] = {}
    for node in ng.nodes:
        if node.anchor < 0 or not node.label:
            continue
        prim = ng.program.eqns[node.anchor].primitive
        if prim == "conv_general_dilated":
            kinds[node.label] = "conv"
        elif prim in CONTRACTIONS and kinds.get(node.label) != "conv":
            kinds[node.label] = "dense"
    return kinds


def _is_barrier(program: Program, node: Node) -> bool:
    """Whether ``node`` is only the `optimization_barrier` before a rematerialized call."""
    return all(
        m.eqn >= 0 and program.eqns[m.eqn].primitive == "optimization_barrier" for m in node.members
    )
