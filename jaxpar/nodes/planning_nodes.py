"""Planning nodes: equations merged with their elementwise followers.

A node owns one configuration for several equations, like an OptCNN layer owns one for its
convolution, bias and activation. Merging keeps the search small (a transformer step has ~2,400
equations, mostly elementwise) and is exact over the space it defines: a follower's sharding *is*
its node's sharding.

- An elementwise equation whose operand of the same shape comes from node G joins G (the first such
  operand decides); its other operands become edges into G.
- A ``broadcast_in_dim`` whose only reader is such an elementwise equation joins that reader's
  node (the bias of ``x @ W + b`` is read through its broadcast).
- Every flat argument is an input node; followers may join it (optimizer updates join the state
  they update, so parameters and their optimizer state share a sharding unless it pays not to).
- Nodes whose tensors are all scalars (or opaque PRNG keys) are fixed to replicated.
- Equations join only nodes of the same loop body (`graph.Region`): a node runs as often as its
  loop iterates.
"""

from __future__ import annotations

import dataclasses

from ..program.graph import Program, layer_of, phase_of
from ..rules.table import ELEMENTWISE, DimMap, OpSpace, space_of

_FOLLOWERS = set(ELEMENTWISE)


@dataclasses.dataclass
class Member:
    """One equation inside a node, with its maps expressed in the node's iteration dims."""

    eqn: int  # equation index (-1 for the input pseudo-member of an input node)
    in_maps: tuple[DimMap | None, ...]  # per input: tensor dim -> node iteration dim
    out_maps: tuple[DimMap, ...]  # per output
    flops: float  # FLOPs of the unsharded equation
    used_dims: frozenset[int]  # iteration dims this equation's work is split over


@dataclasses.dataclass
class Node:
    """A planning node: one configuration shared by its members."""

    index: int
    space: OpSpace  # the anchor's iteration space
    members: list[Member]
    phase: str  # forward / backward / update (of the anchor; inputs are "input")
    label: str  # layer label ("" when unknown)
    anchor: int  # anchor equation index, or -1 for an input node
    invar: int | None = None  # the tensor id for input nodes
    tensor_maps: dict[int, DimMap] = dataclasses.field(default_factory=dict)  # produced tensors
    fixed: bool = False  # only the replicated configuration
    region: int = -1  # the planned loop whose body holds its equations (`graph.Region`), or -1


@dataclasses.dataclass
class NodeGraph:
    """The nodes of a program and where each tensor lives."""

    program: Program
    nodes: list[Node]
    node_of_tensor: dict[int, int]  # tensor id -> node producing it (inputs included)
    node_of_eqn: dict[int, int]


def _is_tiny(program: Program, tids: list[int]) -> bool:
    return all(program.tensors[t].size <= 1 or program.tensors[t].opaque for t in tids)


def _absorbable_broadcasts(program: Program) -> dict[int, int]:
    """broadcast_in_dim equation -> the single elementwise reader it will be merged into."""
    consumers = program.consumers()
    out: dict[int, int] = {}
    for e in program.eqns:
        if e.primitive != "broadcast_in_dim" or e.inputs[0] is None:
            continue
        readers = consumers.get(e.outputs[0], [])
        if len(readers) != 1:
            continue
        reader = program.eqns[readers[0]]
        same = program.tensors[reader.outputs[0]].shape == program.tensors[e.outputs[0]].shape
        same = same and reader.region == e.region
        if reader.primitive in _FOLLOWERS and same and len(set(reader.outputs)) == 1:
            out[e.index] = reader.index
    return out


def _broadcast_member(program: Program, eqn_index: int, out_map: DimMap) -> Member:
    e = program.eqns[eqn_index]
    src = program.tensors[e.inputs[0]].shape
    dst = program.tensors[e.outputs[0]].shape
    bd = e.params["broadcast_dimensions"]
    op_map = tuple(out_map[bd[j]] if src[j] == dst[bd[j]] else None for j in range(len(src)))
    return Member(
        e.index, (op_map,), (out_map,), 0.0, frozenset(d for d in out_map if d is not None)
    )


def _input_node(program: Program, index: int, tid: int) -> Node:
    """The planning node of a flat argument (its layout is the node's configuration)."""
    shape = program.tensors[tid].shape
    n = len(shape)
    ident = tuple(range(n))
    space = OpSpace(shape, (True,) * n, tuple(f"d{i}" for i in range(n)), (), (ident,), 0.0)
    node = Node(index, space, [Member(-1, (), (ident,), 0.0, frozenset())], "input", "", -1)
    node.invar = tid
    node.tensor_maps[tid] = ident
    node.fixed = _is_tiny(program, [tid])
    return node


def _anchor_member(e, space: OpSpace) -> Member:
    """The member of an equation that anchors its own node."""
    used = frozenset(d for m in space.in_maps + space.out_maps if m for d in m if d is not None)
    return Member(e.index, space.in_maps, space.out_maps, space.flops, used)


def _follower_member(e, program: Program, space: OpSpace, out_map: DimMap) -> Member:
    """The member of an elementwise equation joining a node whose dims its result maps to:
    operands of the result's shape read through the same map; broadcast operands map the dims
    they share with the result, others none."""
    out_shape = program.tensors[e.outputs[0]].shape
    in_maps = []
    for t in e.inputs:
        shp = () if t is None else program.tensors[t].shape
        if t is None:
            in_maps.append(None)
        elif shp == out_shape:
            in_maps.append(out_map)
        elif len(shp) == len(out_shape):
            in_maps.append(
                tuple(out_map[i] if s == out_shape[i] else None for i, s in enumerate(shp))
            )
        else:
            in_maps.append((None,) * len(shp))
    used = frozenset(d for d in out_map if d is not None)
    return Member(e.index, tuple(in_maps), tuple(out_map for _ in e.outputs), space.flops, used)


def _join_target(e, program, space, nodes, node_of_tensor) -> tuple[Node | None, DimMap | None]:
    """The node an elementwise equation joins (the first same-shape operand's), and the map."""
    if e.primitive not in _FOLLOWERS or space.replicated:
        return None, None
    out_shape = program.tensors[e.outputs[0]].shape
    for t in e.inputs:
        if t is None or t not in node_of_tensor or program.tensors[t].shape != out_shape:
            continue
        g = nodes[node_of_tensor[t]]
        if g.region != e.region:  # a node's equations run together: never across a loop's edge
            continue
        tmap = g.tensor_maps.get(t)
        if tmap is not None and all(d is not None for d in tmap):
            return g, tmap
    return None, None


def build_nodes(program: Program) -> NodeGraph:
    """Group the program's equations into planning nodes (see module docstring)."""
    nodes: list[Node] = []
    node_of_tensor: dict[int, int] = {}
    node_of_eqn: dict[int, int] = {}
    absorbed = _absorbable_broadcasts(program)
    absorbed_out = {program.eqns[b].outputs[0]: b for b in absorbed}
    for tid in program.invars:
        nodes.append(_input_node(program, len(nodes), tid))
        node_of_tensor[tid] = nodes[-1].index
    warned: set[str] = set()  # primitives without a rule: one warning each per program

    for e in program.eqns:
        if e.index in absorbed:
            continue
        space = space_of(e, program, warned)
        target, out_map = _join_target(e, program, space, nodes, node_of_tensor)
        if target is None:
            stack = e.name_stack
            target = Node(len(nodes), space, [], phase_of(stack), layer_of(stack), e.index)
            target.region = e.region
            nodes.append(target)
            member = _anchor_member(e, space)
        else:
            member = _follower_member(e, program, space, out_map)
        target.members.append(member)
        node_of_eqn[e.index] = target.index
        for t, m in zip(e.outputs, member.out_maps, strict=True):
            target.tensor_maps[t] = m
            node_of_tensor[t] = target.index
        # broadcasts read only by this equation join its node, mapped through its operand maps
        for t, m in zip(e.inputs, member.in_maps, strict=True):
            if t is not None and t in absorbed_out and m is not None:
                b = absorbed_out[t]
                target.members.insert(len(target.members) - 1, _broadcast_member(program, b, m))
                node_of_eqn[b] = target.index
                target.tensor_maps[t] = m
                node_of_tensor[t] = target.index

    for node in nodes:
        if node.anchor >= 0:
            tids = [t for m in node.members for t in program.eqns[m.eqn].outputs]
            tids += [t for m in node.members for t in program.eqns[m.eqn].inputs if t is not None]
            node.fixed = node.space.replicated or _is_tiny(program, tids)
    return NodeGraph(program, nodes, node_of_tensor, node_of_eqn)
