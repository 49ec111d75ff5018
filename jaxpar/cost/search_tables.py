"""Cost tables: the search problem built from the priced nodes and the reads between them.

How reshards are shared (`evaluate`, `apply`, and these tables alike): each read of a tensor
walks its `reshard_path` from the producer's layout, and a step — (before, after) layouts — that
another read of the tensor already took is not run again. A tensor read once gets a pairwise
table (producer × reader configurations); a tensor read by several nodes gets one table over the
producer and all its readers: the cost of the *union* of their paths' steps (`SharedReshards`).
Then the search's objective is the reported cost, and an exact search certifies its plan.

Where such a table would be too large (`FACTOR_BUDGET` entries), the tensor falls back to two
pairwise approximations, so the planner holds two problems:

- ``problem`` charges each such read its whole path: an *upper* bound of the union's cost;
- ``bound`` charges each read 1/k of its path (k = distinct reads): the union costs at least the
  dearest path, at least the mean: a *lower* bound.

With no fallback the two are the same problem (``exact``). `pairwise_bound` prices every shared
tensor that way (no tables over several nodes: a graph no wider than the reads), for steps too
wide to eliminate with the exact tables. Pure: numpy only.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ..hardware.collectives import ALL_REDUCE, all_reduce_buffer, ring_steps
from ..nodes.configs import Config, Spec, node_configs, spec_of
from ..nodes.planning_nodes import Node, NodeGraph
from ..program.graph import BACKWARD, FORWARD, UPDATE, Program
from ..rules.table import DimMap
from ..solver.problem import Problem
from ..xla.allreduce_combiner import Combiner
from ..xla.buffer_assignment import uniform_tensors
from ..xla.reshard_paths import local_priced, priced_steps, reshard_linear, reshard_path, step_terms
from .node_costs import (
    CostParams,
    compute_times,
    host_move_seconds,
    is_grad_sync,
    may_communicate,
    node_collectives,
    unary_costs,
)  # fmt: skip
from .reshard_tables import linear_tables


@dataclasses.dataclass(frozen=True)
class EdgeUse:
    """One read of a tensor (inside its producer's node too: `Problem.add_edge` folds those into
    the node's own table), or a state output's feedback into the next step's argument."""

    src: int  # producing node
    dst: int  # reading node
    tensor: int  # tensor id
    src_map: DimMap  # the tensor's dims -> src node iteration dims
    dst_map: DimMap  # the layout the reader needs, in dst node iteration dims
    order: tuple[int, int] = (0, 0)  # (reading equation, operand) or (after all, result index)
    context: int = -1  # the innermost loop enclosing producer and reader: where `apply` reshards


def gathers_free(program: Program, t: int, devices: int) -> bool:
    """Whether ``t``'s all-gathers are free on a mesh of ``devices``: it is one of the
    program's `buffers.uniform_tensors` (kept in its memo), which XLA gathers as a broadcast,
    and has more elements than the mesh has devices. A shard of one element is not gathered
    that way: XLA folds its broadcast into a one-element constant and all-gathers that (a
    bincount's zeros[4] split four ways; tests/test_combine.py)."""
    if "uniform" not in program.memo:
        program.memo["uniform"] = uniform_tensors(program)
    return t in program.memo["uniform"] and program.tensors[t].size > devices


def edge_uses(ng: NodeGraph, feedback: Sequence[tuple[int, int]]) -> list[EdgeUse]:
    """Every read, plus state feedback edges (new state -> next step's input) and each planned
    loop's carry edges (the carry an iteration returns -> the layout the next one reads), in the
    order `apply` serves them: equations in program order, then the step's results.

    A read runs in its ``context``, the innermost loop enclosing producer and reader (`apply`
    hoists the reshards of loop-invariant tensors out of a loop), so it is priced
    ``program.trips(context)`` times.
    """
    program = ng.program
    uses = []

    def use(src: int, dst: int, tensor: int, src_map, dst_map, order) -> EdgeUse:
        context = program.common_region(ng.nodes[src].region, ng.nodes[dst].region)
        return EdgeUse(src, dst, tensor, src_map, dst_map, order, context)

    for node in ng.nodes:
        for m in node.members:
            if m.eqn < 0:
                continue
            eqn = ng.program.eqns[m.eqn]
            for k, (t, mp) in enumerate(zip(eqn.inputs, m.in_maps, strict=True)):
                if t is None or mp is None or t not in ng.node_of_tensor:
                    continue
                src = ng.node_of_tensor[t]
                src_map = ng.nodes[src].tensor_maps[t]
                uses.append(use(src, node.index, t, src_map, mp, (m.eqn, k)))
    for loop in program.regions:
        for k, (e, out_t) in enumerate(zip(loop.carry_eqns, loop.carry_out, strict=True)):
            in_t = program.eqns[e].outputs[0]
            if out_t not in ng.node_of_tensor:
                continue
            src, dst = ng.node_of_tensor[out_t], ng.node_of_tensor[in_t]
            src_map, dst_map = ng.nodes[src].tensor_maps[out_t], ng.nodes[dst].tensor_maps[in_t]
            uses.append(use(src, dst, out_t, src_map, dst_map, (loop.bodies[0][1], -1 - k)))
    after_all = len(program.eqns)
    for out_t, in_t in feedback:
        src, dst = ng.node_of_tensor[out_t], ng.node_of_tensor[in_t]
        src_map, dst_map = ng.nodes[src].tensor_maps[out_t], ng.nodes[dst].tensor_maps[in_t]
        position = (after_all, program.outvars.index(out_t))
        uses.append(use(src, dst, out_t, src_map, dst_map, position))
    return sorted(uses, key=lambda u: u.order)


class ReshardTables:
    """t_X tables of reads, cached per (producer layouts, reader layouts) pattern.

    Layers repeat, and so do their tables; a reshard's cost is linear in the tensor's bytes
    (`reshard.reshard_linear`), so one pattern serves every tensor size.
    """

    def __init__(self, ng: NodeGraph, configs: Sequence[list[Config]], params: CostParams):
        self.ng, self.configs, self.params = ng, configs, params
        self.devices = math.prod(params.mesh.sizes)
        self.tables: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self.specs: dict[tuple[int, DimMap], tuple[list[Spec], np.ndarray]] = {}
        # a read's table is fixed by its layouts' pattern, the configs' layout indices, its bytes
        # and trip count: reads alike (a layer's copies, a scan body's twins) share one array
        self.ids: dict[tuple[int, DimMap], int] = {}
        self.interned: dict[tuple[tuple[Spec, ...], bytes], int] = {}
        self.done: dict[tuple, np.ndarray] = {}
        # every layout met, numbered: per (node, map), each config's layout number
        self.spec_number: dict[Spec, int] = {}
        self.numbers: dict[tuple[int, DimMap], np.ndarray] = {}
        self.by_content: dict[tuple, tuple] = {}  # (configs, map) -> (specs, id, numbers)
        # per node, the number of its configuration list's content (hashing up to 1,275
        # configurations once per node, not once per read)
        self.config_lists: dict[tuple[Config, ...], int] = {}
        self.config_list_of: dict[int, int] = {}

    def layouts(self, node: int, dim_map: DimMap) -> tuple[list[Spec], np.ndarray]:
        """Distinct layouts of a tensor over a node's configs, and each config's layout index."""
        key = (node, dim_map)
        if key not in self.specs:
            if node not in self.config_list_of:
                content = tuple(self.configs[node])
                self.config_list_of[node] = self.config_lists.setdefault(
                    content, len(self.config_lists)
                )
            alike = (self.config_list_of[node], dim_map)  # a layer's copies: the same answer
            if alike not in self.by_content:
                index: dict[Spec, int] = {}
                inverse = [
                    index.setdefault(spec_of(dim_map, c), len(index)) for c in self.configs[node]
                ]
                specs, inv = list(index), np.array(inverse, dtype=np.int64)
                content = (tuple(specs), inv.tobytes())
                number = [self.spec_number.setdefault(s, len(self.spec_number)) for s in specs]
                self.by_content[alike] = (
                    (specs, inv),
                    self.interned.setdefault(content, len(self.interned)),
                    np.array(number, dtype=np.int64)[inv],
                )
            self.specs[key], self.ids[key], self.numbers[key] = self.by_content[alike]
        return self.specs[key]

    def layout_numbers(self, node: int, dim_map: DimMap) -> np.ndarray:
        """Per config of ``node``, the number of the tensor's layout (`spec_number`): two reads
        see one layout exactly when their numbers are equal."""
        self.layouts(node, dim_map)
        return self.numbers[(node, dim_map)]

    def table(self, use: EdgeUse) -> np.ndarray:
        """t_X of one read for every (producer config, reader config) pair."""
        read = self._read(use)
        if read is None:
            return np.zeros((len(self.configs[use.src]), len(self.configs[use.dst])))
        if read not in self.done:
            small, si, di = self._layout_table(use, read)
            # rows, then columns: a sixth of the time of one gather at ``np.ix_(si, di)``
            out = small.take(si, axis=0).take(di, axis=1)
            out.flags.writeable = False  # shared by every read alike
            self.done[read] = out
        return self.done[read]

    def diagonal(self, use: EdgeUse) -> np.ndarray:
        """``np.diag(table(use))`` of a read by the node making the tensor (``use.src ==
        use.dst``: both ends take the node's configuration), without building the table."""
        read = self._read(use)
        if read is None:
            return np.zeros(len(self.configs[use.src]))
        if read in self.done:
            return np.diag(self.done[read])
        key = ("diagonal", *read)
        if key not in self.done:
            small, si, di = self._layout_table(use, read)
            self.done[key] = small[si, di]
        return self.done[key]

    def _read(self, use: EdgeUse) -> tuple | None:
        """The read's key, (source layouts, reader layouts, bytes, trips, whether its gathers
        are free), for a read that moves bytes; None for an opaque, scalar or empty tensor.
        Reads with one key have one table."""
        tensor = self.ng.program.tensors[use.tensor]
        if tensor.opaque or not tensor.shape or not tensor.nbytes:
            return None
        self.layouts(use.src, use.src_map)
        self.layouts(use.dst, use.dst_map)
        free = gathers_free(self.ng.program, use.tensor, self.devices)
        trips = self.ng.program.trips(use.context)
        return (
            self.ids[(use.src, use.src_map)], self.ids[(use.dst, use.dst_map)], tensor.nbytes,
            trips, free,
        )  # fmt: skip

    def _layout_table(self, use: EdgeUse, read: tuple) -> tuple[np.ndarray, ...]:
        """(t_X per (source layout, reader layout) of the read, each config's source layout,
        each config's reader layout)."""
        _, _, nbytes, trips, free = read
        src_specs, si = self.layouts(use.src, use.src_map)
        dst_specs, di = self.layouts(use.dst, use.dst_map)
        key = (tuple(src_specs), tuple(dst_specs), free)
        pair = self.tables.get(key)
        if pair is None:
            mesh, objective = self.params.mesh, self.params.objective
            pair = linear_tables(mesh, objective, free).pattern(src_specs, dst_specs)
            if pair is None:  # layouts without a dense table: pair by pair
                lin = [
                    [reshard_linear(a, b, mesh, objective, free) for b in dst_specs]
                    for a in src_specs
                ]
                pair = (
                    np.array([[x[0] for x in row] for row in lin]),
                    np.array([[x[1] for x in row] for row in lin]),
                )
            self.tables[key] = pair
        return (pair[0] + float(nbytes) * pair[1]) * trips, si, di


FACTOR_BUDGET = 2e5  # largest shared-reshard table (entries) priced exactly
PATTERN_BUDGET = 2e4  # largest number of layout combinations priced per pattern


class SharedReshards:
    """Tables over a producer and all readers of one tensor: the cost of the union of the
    readers' reshard steps, each (before, after) step once, as `apply` emits them.

    Computed per layout combination (source layout, each reader's layout) and cached per
    pattern, linear in the tensor's bytes like `reshard.reshard_linear`, then gathered onto the
    nodes' configurations.
    """

    def __init__(self, reshards: ReshardTables):
        self.reshards = reshards
        self.patterns: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        # tensors read alike (a layer's copies) share one table: see `ReshardTables.ids`
        self.done: dict[tuple, np.ndarray] = {}
        # `_step_parts` per (src, dst, gathers_free): this planning run's, dropped with it (a
        # method's lru_cache would hold every run's instance, and its tables, across plans)
        self.step_parts: dict[tuple, dict[tuple[Spec, Spec], tuple[float, float]]] = {}

    def _step_parts(
        self, src: Spec, dst: Spec, gathers_free: bool
    ) -> dict[tuple[Spec, Spec], tuple[float, float]]:
        """(before, after) -> (fixed, per-byte) cost of each priced step of the path src -> dst
        (`reshard.step_terms`: the α and β terms of `reshard.step_time`, bytes only under "comm");
        ``gathers_free``: of a uniform tensor (`reshard.priced_steps`)."""
        key = (src, dst, gathers_free)
        hit = self.step_parts.get(key)
        if hit is not None:
            return hit
        mesh, objective = self.reshards.params.mesh, self.reshards.params.objective
        local = local_priced(mesh, objective)
        hit = self.step_parts[key] = {
            (step.before, step.after): step_terms(step, mesh, objective == "comm", local)
            for step in priced_steps(reshard_path(1, src, dst, mesh.sizes), gathers_free, local)
        }
        return hit

    def _pattern(self, src_specs: list[Spec], dst_specs: list[list[Spec]], gathers_free: bool):
        """(fixed, per_byte) arrays over (source layout, reader 1 layout, ...).

        Per source layout, each reader's path is a boolean mask over the distinct steps; the
        union over readers is the OR of the masks, broadcast over every layout combination.
        """
        key = (tuple(src_specs), tuple(tuple(d) for d in dst_specs), gathers_free)
        if key in self.patterns:
            return self.patterns[key]
        m = len(dst_specs)
        shape = (len(src_specs), *(len(d) for d in dst_specs))
        fixed, per_byte = np.zeros(shape), np.zeros(shape)
        for s, src in enumerate(src_specs):
            paths = [
                [self._step_parts(src, dst, gathers_free) for dst in specs] for specs in dst_specs
            ]
            steps = {k: v for reader in paths for path in reader for k, v in path.items()}
            if not steps:
                continue
            index = {k: i for i, k in enumerate(steps)}
            union = np.zeros((*shape[1:], len(steps)), dtype=bool)
            for r, reader in enumerate(paths):
                mask = np.zeros((len(reader), len(steps)), dtype=bool)
                for d, path in enumerate(reader):
                    mask[d, [index[k] for k in path]] = True
                union |= mask.reshape([-1 if q == r else 1 for q in range(m)] + [len(steps)])
            parts = np.array(list(steps.values()))
            fixed[s], per_byte[s] = union @ parts[:, 0], union @ parts[:, 1]
        self.patterns[key] = (fixed, per_byte)
        return fixed, per_byte

    def table(self, reads: Sequence[EdgeUse]) -> tuple[tuple[int, ...], np.ndarray] | None:
        """(nodes, table over their configurations), or None when it would exceed the budgets.

        ``reads``: the distinct reads of one tensor in one context (same producer; readers may
        share a node).
        """
        configs = self.reshards.configs
        nodes = tuple(sorted({reads[0].src, *(r.dst for r in reads)}))
        if math.prod(len(configs[v]) for v in nodes) > FACTOR_BUDGET:
            return None
        src_specs, si = self.reshards.layouts(reads[0].src, reads[0].src_map)
        dsts = [self.reshards.layouts(r.dst, r.dst_map) for r in reads]
        if len(src_specs) * math.prod(len(d[0]) for d in dsts) > PATTERN_BUDGET:
            return None
        program = self.reshards.ng.program
        free = gathers_free(program, reads[0].tensor, self.reshards.devices)
        tensor = program.tensors[reads[0].tensor]
        trips = program.trips(reads[0].context)
        ids = self.reshards.ids
        alike = (
            ids[(reads[0].src, reads[0].src_map)], tuple(ids[(r.dst, r.dst_map)] for r in reads),
            tuple(nodes.index(v) for v in (reads[0].src, *(r.dst for r in reads))),
            tensor.nbytes, trips, free,
        )  # fmt: skip
        if alike in self.done:
            return nodes, self.done[alike]
        fixed, per_byte = self._pattern(src_specs, [d[0] for d in dsts], free)
        small = (fixed + float(tensor.nbytes) * per_byte) * trips
        # index grids over the nodes' configurations, one axis per node
        axes = [[-1 if k == i else 1 for k in range(len(nodes))] for i in range(len(nodes))]
        grid = {v: np.arange(len(configs[v])).reshape(axes[i]) for i, v in enumerate(nodes)}
        index = (
            si[grid[reads[0].src]],
            *(d[1][grid[r.dst]] for d, r in zip(dsts, reads, strict=True)),
        )
        full = np.array(np.broadcast_to(small[index], tuple(len(configs[v]) for v in nodes)))
        full.flags.writeable = False  # shared by every tensor read alike
        self.done[alike] = full
        return nodes, full


@dataclasses.dataclass(frozen=True)
class CostTables:
    """Stage result: every node's configurations and prices, and the two search problems."""

    configs: tuple[list[Config], ...]  # per node
    compute: tuple[np.ndarray, ...]  # per node, t_C of each configuration (all its iterations)
    # per node, t_H of each configuration (all its iterations: `cost.host_move_seconds`), or
    # None for the nodes that move nothing between device and host memory (most)
    host: tuple[np.ndarray | None, ...]
    uses: tuple[EdgeUse, ...]
    problem: Problem  # the reported cost, or an upper bound of it where tables fell back
    # the shared tensors priced by the upper/lower pair: their reads (none: ``exact``)
    fallback: tuple[tuple[EdgeUse, ...], ...]
    # the read tables and the layouts of every read under each configuration (a cache the
    # bounds and the evaluations share)
    reshards: ReshardTables = dataclasses.field(compare=False, repr=False)
    # every term but the fallback tensors' reads (``problem`` itself when there are none)
    exact_part: Problem = dataclasses.field(compare=False, repr=False)

    @property
    def exact(self) -> bool:
        """Whether ``problem``'s objective is the reported cost of every assignment."""
        return not self.fallback

    @functools.cached_property
    def bound(self) -> Problem:
        """The reported cost, or a lower bound of it where tables fell back: each read of a
        ``fallback`` tensor at 1/k of its path (k: its reads). Built on first use (only an
        eliminable problem's bound is solved), as its tables are as large as ``problem``'s."""
        if self.exact:
            return self.problem
        part = self.exact_part
        out = Problem(list(self.bound_unary), dict(part.edges), part.blocks, dict(part.factors))
        shares: dict = {}
        for reads in self.fallback:
            for use in reads:
                if use.src != use.dst:  # a read by its own node: in ``bound_unary``
                    table = _share(self.reshards.table(use), len(reads), shares)
                    out.add_edge(use.src, use.dst, table)
        return out

    @functools.cached_property
    def bound_unary(self) -> list[np.ndarray]:
        """``bound``'s unary tables, without its edges: a fallback tensor read by the node
        making it adds its diagonal at 1/k."""
        unary = list(self.exact_part.unary)
        for reads in self.fallback:
            for use in reads:
                if use.src == use.dst:
                    unary[use.src] = unary[use.src] + self.reshards.diagonal(use) / len(reads)
        return unary


Tick = Callable[[str], None]  # progress inside long loops


def node_tables(
    ng: NodeGraph, node: Node, cfgs: Sequence[Config], params: CostParams, memo: dict | None = None
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """(t_C, t_H or None, unary price) of every configuration over one step: a loop body's
    node runs ``program.trips(node.region)`` times (``memo``: see `cost.node_work`,
    `cost.own_comm_costs`)."""
    trips = ng.program.trips(node.region)
    once = compute_times(ng, node, cfgs, params, memo)
    host = host_move_seconds(ng, node, cfgs, params)
    unary = unary_costs(ng, node, cfgs, params, once, memo, host) * trips
    return once * trips, None if host is None else host * trips, unary


def build_tables(
    ng: NodeGraph,
    params: CostParams,
    feedback: Sequence[tuple[int, int]],
    pinned: dict[int, Config],
    tick: Tick | None = None,
    allowed: Mapping[int, Sequence[Config]] | None = None,
) -> CostTables:
    """Configurations (``pinned`` nodes forced, ``allowed`` nodes restricted to those given),
    compute and unary tables, and the reshard tables of every read, summed into both
    problems."""
    tick = tick or (lambda _detail: None)
    sizes, comm = params.mesh.sizes, params.objective == "comm"
    configs, compute, host, unary = [], [], [], []
    memo: dict = {}  # nodes alike share their collectives' prices
    for node in ng.nodes:
        if allowed and node.index in allowed:
            cfgs = list(allowed[node.index])
        elif node.index in pinned:
            cfgs = [pinned[node.index]]
        else:
            cfgs = node_configs(ng, node, sizes, comm, params.mesh.names, params.mesh.trivial)
        configs.append(cfgs)
        node_compute, node_host, node_unary = node_tables(ng, node, cfgs, params, memo)
        compute.append(node_compute)
        host.append(node_host)
        unary.append(node_unary)
        tick(f"compute/sync tables of {len(unary)}/{len(ng.nodes)} nodes")
    uses = edge_uses(ng, feedback)
    blocks = phase_blocks(ng)
    exact = Problem(list(unary), {}, blocks)  # every term priced exactly
    reshards = ReshardTables(ng, configs, params)
    shared = SharedReshards(reshards)
    fallback: list[list[EdgeUse]] = []
    groups = reads_by_tensor(ng, uses)
    for i, reads in enumerate(groups):
        if len(reads) == 1:
            add_read(exact, reshards, reads[0])
        elif (table := shared.table(reads)) is not None:
            exact.add_factor(*table)
        else:
            fallback.append(reads)
        tick(f"reshard tables of {i + 1}/{len(groups)} tensors")
    problem = exact
    if fallback:  # the upper pricing of the tensors without an exact table (`CostTables.bound`
        # the lower, built when used)
        problem = Problem(list(unary), dict(exact.edges), blocks, dict(exact.factors))
        for reads in fallback:
            for use in reads:
                add_read(problem, reshards, use)
    return CostTables(
        tuple(configs), tuple(compute), tuple(host), tuple(uses), problem,
        tuple(tuple(reads) for reads in fallback), reshards, exact,
    )  # fmt: skip


def add_read(problem: Problem, reshards: ReshardTables, use: EdgeUse) -> None:
    """Add one read's reshard table to ``problem``: an edge, or for a read by the node
    making the tensor its diagonal to that node's unary table (`Problem.add_edge`)."""
    if use.src == use.dst:
        problem.unary[use.src] = problem.unary[use.src] + reshards.diagonal(use)
    else:
        problem.add_edge(use.src, use.dst, reshards.table(use))


def pairwise_bound(ng: NodeGraph, tables: CostTables) -> Problem:
    """A lower bound of the reported cost with no tables over several nodes: every shared
    tensor's reads at 1/k of their paths (see the module docstring). Its graph is the read
    graph, so it may eliminate where the exact tables are too wide."""
    out = Problem(list(tables.bound_unary), {}, tables.problem.blocks)
    shares: dict = {}  # the copies of a layer read alike: one table, so one share of it
    for reads in reads_by_tensor(ng, tables.uses):
        for use in reads:
            if use.src == use.dst:  # its diagonal, at 1/k
                out.unary[use.src] = out.unary[use.src] + _share(
                    tables.reshards.diagonal(use), len(reads), shares
                )
            else:
                out.add_edge(
                    use.src, use.dst, _share(tables.reshards.table(use), len(reads), shares)
                )
    return out


def _share(table: np.ndarray, k: int, memo: dict) -> np.ndarray:
    """``table / k``, computed once per (table, k) in ``memo`` (which keeps ``table`` alive,
    so its id names it)."""
    if k == 1:
        return table
    key = (id(table), k)
    if key not in memo:
        memo[key] = (table, table / k)
    return memo[key][1]


def pairwise_graph(ng: NodeGraph, tables: CostTables) -> set[tuple[int, int]]:
    """`pairwise_bound`'s graph, (reader's producer, reader) per read, without pricing it: to
    decide whether it would eliminate (`search.graph_eliminates`) before building its tables."""
    return {(use.src, use.dst) for reads in reads_by_tensor(ng, tables.uses) for use in reads}


def phase_blocks(ng: NodeGraph) -> list[list[int]]:
    """Blocks for coordinate descent: forward (+ inputs), backward + update, inputs + update."""
    fwd = [n.index for n in ng.nodes if n.phase in (FORWARD, "input")]
    bwd = [n.index for n in ng.nodes if n.phase in (BACKWARD, UPDATE)]
    upd = [n.index for n in ng.nodes if n.phase in (UPDATE, "input")]
    return [fwd, bwd, upd]


def reads_by_tensor(ng: NodeGraph, uses: Sequence[EdgeUse]) -> list[list[EdgeUse]]:
    """The distinct reads of each priced tensor per context (an identical read shares every
    step; reads in different loop contexts share none, as `apply` emits them apart)."""
    groups: dict[tuple[int, int], dict[tuple, EdgeUse]] = {}
    for use in uses:
        tensor = ng.program.tensors[use.tensor]
        if tensor.opaque or not tensor.shape or not tensor.nbytes:
            continue
        key = (use.tensor, use.context)
        groups.setdefault(key, {}).setdefault((use.dst, use.dst_map), use)
    return [list(g.values()) for g in groups.values()]


def combined_sync_problem(
    ng: NodeGraph,
    tables: CostTables,
    params: CostParams,
    batch: Sequence[set[int]],
    combiner: Combiner,
) -> Problem:
    """``tables.problem`` with each gradient all-reduce's latency charged as XLA's all-reduce
    combiner spreads it (`Combiner.latency_share`), searched under ``objective="overlap"``.

    OptCNN's Eq. 1 charges every predicted collective its latency, so an unrolled step's
    per-layer gradient all-reduces pay it once per layer and a scanned step's stacked gradient
    once per loop, while XLA combines the independent gradient all-reduces of the unrolled step
    (bench/scale/README.md, issue 10). Per configuration the unary cost drops by
    α · ring_steps · (1 − share) for each gradient all-reduce (× the node's trips); reshards
    and other partial sums keep their latency (they are on the critical path, one after the
    other). Every term is at most Eq. 1's, so a lower bound of this problem bounds Eq. 1 too.
    """
    problem = tables.problem
    unary = []
    memo: dict[tuple, np.ndarray] = {}  # a layer's copies save alike
    for node, cfgs, u in zip(ng.nodes, tables.configs, problem.unary, strict=True):
        if node.phase != BACKWARD or not set(node.space.reduce_dims) & batch[node.index]:
            unary.append(u)  # never a gradient all-reduce (`is_grad_sync`)
            continue
        space = node.space  # what the saving reads of the node (`node_collectives`)
        outputs = ng.program.eqns[node.anchor].outputs if node.anchor >= 0 else ()
        key = (
            node.anchor >= 0, space.out_maps, space.reduce_dims, space.communicating_dims,
            frozenset(batch[node.index]), tuple(ng.program.tensors[t].nbytes for t in outputs),
            tuple(cfgs),
        )  # fmt: skip
        if key not in memo:
            memo[key] = _latency_saved(ng, node, cfgs, params, batch[node.index], combiner)
        unary.append(u - memo[key] * ng.program.trips(node.region))
    return Problem(unary, dict(problem.edges), list(problem.blocks), dict(problem.factors))


def _latency_saved(
    ng: NodeGraph,
    node: Node,
    cfgs: Sequence[Config],
    params: CostParams,
    batch: set[int],
    combiner: Combiner,
) -> np.ndarray:
    """Per configuration of a backward node, α · ring_steps · (1 − share) summed over its
    gradient all-reduces: the latency the combiner saves them (`combined_sync_problem`)."""
    saved = np.zeros(len(cfgs))
    for i, cfg in enumerate(cfgs):
        if not may_communicate(node, cfg) or not is_grad_sync(node, cfg, batch):
            continue
        for c in node_collectives(ng, node, cfg, params.mesh):
            if c.kind != ALL_REDUCE or c.group_size < 2:  # one device: nothing to send
                continue
            n, _, latency = params.mesh.group(c.axes)
            share = combiner.latency_share(all_reduce_buffer(c.nbytes, n))
            saved[i] += latency * ring_steps(ALL_REDUCE, n) * (1 - share)
    return saved
