"""Repeated blocks: structurally identical layers share one configuration per position.

A transformer's 32 decoder layers are the same equations on the same shapes, wired the same way;
planning them separately repeats the same work 32 times and, in an exact search, rarely pays:
the layers of a homogeneous stack want the same layouts. `find_repeats` finds such layers and
`Tying` solves one representative: node ``p`` of every copy takes the configuration of node
``p`` of the first. This *restricts* the search space, so a certificate from a tied search says
"optimal among plans that give repeated layers the same layouts" (`Choice.tied`).

Layers are found from the node labels (`labels.node_labels`: the module path, which optimizer
and input nodes inherit from the layer they serve). The first path component that carries an
index (``layers_5``, ``Block_3``, NNX's ``layers/5``) names the copy; copies of one family whose
nodes, in program order, have equal signatures (phase, loop, iteration space, members'
primitives, maps and FLOPs, configurations) are tied position by position.

Pure: numpy only.
"""

from __future__ import annotations

import dataclasses
import re
import string
from collections.abc import Sequence

import numpy as np

from ..solver.problem import Problem
from .configs import Config
from .planning_nodes import Node, NodeGraph

# Below this many tied nodes the untied search is fast and keeps layouts that alternate between
# identical layers (SoyBean's MLP: row/column tiling in turn), so `PlannerOptions.share_blocks`
# None does not tie.
MIN_TIED_NODES = 1000

_INDEXED = re.compile(r"^(?P<name>.*?[A-Za-z]_?)(?P<index>\d+)$")


def block_of(label: str) -> tuple[str, int] | None:
    """(family, index) of the first indexed path component: ``"M/layers_5/attn"`` ->
    ``("M/layers_#", 5)``, ``"M/block5"`` -> ``("M/block#", 5)``, ``"layers/5/mlp"`` ->
    ``("layers/#", 5)``; None when there is none."""
    parts = label.split("/")
    for k, part in enumerate(parts):
        if part.isdigit() and k > 0:
            return "/".join([*parts[:k], "#"]), int(part)
        m = _INDEXED.match(part)
        if m is not None:
            return "/".join([*parts[:k], m.group("name") + "#"]), int(m.group("index"))
    return None


def _signature(ng: NodeGraph, node: Node, configs: Sequence[Config]) -> tuple:
    """What must agree for two nodes to be copies of each other."""
    program = ng.program
    members = tuple(
        (
            program.eqns[m.eqn].primitive if m.eqn >= 0 else "input",
            m.in_maps,
            m.out_maps,
            m.flops,
        )
        for m in node.members
    )
    tensors = tuple(
        (program.tensors[t].shape, program.tensors[t].dtype, mp)
        for t, mp in sorted(node.tensor_maps.items())
    )
    space = node.space
    return (
        node.phase, node.region, node.fixed, space.sizes, space.splittable, space.reduce_op,
        space.halo, members, tensors, tuple(configs),
    )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Tying:
    """Classes of nodes that share one configuration: the variables of the reduced problem."""

    classes: tuple[tuple[int, ...], ...]  # per variable, its nodes (the first: representative)
    var_of: tuple[int, ...]  # per node, its variable
    families: tuple[tuple[str, int], ...]  # (family, copies tied) per repeated family

    @property
    def tied_nodes(self) -> int:
        """Nodes that follow another node's configuration (not representatives)."""
        return sum(len(c) - 1 for c in self.classes)

    def restrict(self, assignment: Sequence[int]) -> list[int]:
        """The reduced assignment: each variable takes its representative's configuration."""
        return [assignment[c[0]] for c in self.classes]

    def expand(self, reduced: Sequence[int]) -> list[int]:
        """The full assignment of a reduced one."""
        return [reduced[v] for v in self.var_of]

    def reduce(self, problem: Problem, tables: ReducedTables | None = None) -> Problem:
        """The problem over the variables: tables of tied nodes summed (a table between two
        nodes of one class contributes its diagonal). ``tables``: `reduce_tables` of a problem
        with the same edges, factors and blocks as ``problem`` (only the unary tables differ),
        reused instead of summed again."""
        tables = tables or self.reduce_tables(problem)
        unary = [np.array(sum(problem.unary[v] for v in c), dtype=np.float64) for c in self.classes]
        for v, extra in tables.unary_terms:
            unary[v] = unary[v] + extra
        return Problem(
            unary, dict(tables.edges), [list(b) for b in tables.blocks], dict(tables.factors)
        )

    def reduce_tables(self, problem: Problem) -> ReducedTables:
        """What `reduce` makes of ``problem``'s edges, factors and blocks, which its unary
        tables do not change."""
        # edges and factors only: what they add to a variable's unary table goes to ``terms``
        out = Problem([], {}, [])
        terms: list[tuple[int, np.ndarray]] = []
        # per variable pair (a < b), its tables with their multiplicities: the copies of a layer
        # mostly share one table object (`tables.ReshardTables` caches reads alike), and the
        # tables are large (1.6 G entries for unrolled llama3_8b on four mesh axes)
        parts: dict[tuple[int, int], dict[tuple[int, bool], list]] = {}
        for (i, j), table in problem.edges.items():
            a, b = self.var_of[i], self.var_of[j]
            if a == b:
                terms.append((a, np.diag(table)))
                continue
            flip = a > b
            seen = parts.setdefault((b, a) if flip else (a, b), {})
            seen.setdefault((id(table), flip), [0, table.T if flip else table])[0] += 1
        for key, seen in parts.items():
            (count, table), *rest = seen.values()
            if count == 1 and not rest:  # shared, as `Problem.add_edge` shares it
                out.edges[key] = np.asarray(table, dtype=np.float64)
                continue
            total = np.multiply(table, float(count))  # a buffer of its own
            for count, table in rest:
                total += table if count == 1 else count * table
            out.edges[key] = total
        for key, table in problem.factors.items():
            variables = [self.var_of[v] for v in key]
            if len(set(variables)) == len(variables):
                out.add_factor(tuple(variables), table)
                continue
            distinct = list(dict.fromkeys(variables))
            letters = string.ascii_letters
            spec = "".join(letters[distinct.index(x)] for x in variables)
            target = "".join(letters[k] for k in range(len(distinct)))
            if len(distinct) == 1:  # a unary table of the variable
                terms.append((distinct[0], np.einsum(f"{spec}->{target}", table)))
            else:
                out.add_factor(tuple(distinct), np.einsum(f"{spec}->{target}", table))
        seen_blocks: set[tuple[int, ...]] = set()
        for block in problem.blocks:
            reduced = tuple(sorted({self.var_of[v] for v in block}))
            if reduced and reduced not in seen_blocks:
                seen_blocks.add(reduced)
                out.blocks.append(list(reduced))
        return ReducedTables(out.edges, out.factors, tuple(out.blocks), tuple(terms))


@dataclasses.dataclass(frozen=True)
class ReducedTables:
    """`Tying.reduce_tables`: a reduced problem's edges, factors and blocks, and what its
    edges within one class and factors over one variable add to the unary tables, in order."""

    edges: dict[tuple[int, int], np.ndarray]
    factors: dict[tuple[int, ...], np.ndarray]
    blocks: tuple[list[int], ...]
    unary_terms: tuple[tuple[int, np.ndarray], ...]


def find_repeats(
    ng: NodeGraph,
    configs: Sequence[Sequence[Config]],
    labels: Sequence[str],
    min_tied: int = 0,
) -> Tying | None:
    """The tying of the repeated layers of ``ng``, or None when no layer repeats or fewer than
    ``min_tied`` nodes would be tied."""
    copies: dict[str, dict[int, list[int]]] = {}
    for node in ng.nodes:
        if len(configs[node.index]) <= 1:
            continue  # fixed nodes gain nothing from tying
        found = block_of(labels[node.index])
        if found is not None:
            copies.setdefault(found[0], {}).setdefault(found[1], []).append(node.index)
    var_of = list(range(len(ng.nodes)))
    families = []
    for family, by_index in copies.items():
        groups: dict[tuple, list[list[int]]] = {}
        for index in sorted(by_index):
            nodes = by_index[index]
            key = tuple(_signature(ng, ng.nodes[v], configs[v]) for v in nodes)
            groups.setdefault(key, []).append(nodes)
        for group in groups.values():
            if len(group) < 2:
                continue
            families.append((family, len(group)))
            for position in zip(*group, strict=True):
                for v in position[1:]:
                    var_of[v] = position[0]
    if not families or sum(v != rep for v, rep in enumerate(var_of)) < max(min_tied, 1):
        return None
    members: dict[int, list[int]] = {}
    for v, rep in enumerate(var_of):
        members.setdefault(rep, []).append(v)
    classes = tuple((rep, *(v for v in members[rep] if v != rep)) for rep in sorted(members))
    index = {c[0]: k for k, c in enumerate(classes)}
    return Tying(classes, tuple(index[var_of[v]] for v in range(len(var_of))), tuple(families))
