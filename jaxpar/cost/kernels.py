"""The kernels XLA makes of a planning node, and the memory traffic each one makes.

`node_kernels` groups a node's equations the way the target backend's XLA fuses them (`fusion`:
what XLA computes inside its readers instead of writing it; `FusionRules`: GPU/TPU and CPU
differ): a contraction's library call, fused elementwise kernels, what each reads from and
writes to device memory. `cost.node_work` prices them.

Pure: numpy only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..hardware.calibration import CONV, MATMUL
from ..nodes.planning_nodes import Node, NodeGraph
from ..program.graph import REGION_PRIMITIVES, SCAN_STACK, Equation, Program
from ..rules.table import DimMap
from ..xla.fusion import (
    ACCELERATOR_FUSION,
    FusionRules,
    program_index,
    read_sources,
    recomputed,
    shared_reads,
    whole_sources,
)
from ..xla.operand_layouts import copied_operands

# primitives priced by a calibration's throughput curves, and the curve kind of each
MEASURED_PRIMITIVES = {
    "dot_general": MATMUL,
    "ragged_dot_general": MATMUL,
    "conv_general_dilated": CONV,
}
# Equations XLA runs as a library call of their own (cuBLAS/cuDNN, Eigen/oneDNN, the MXU), with
# their elementwise followers in a separate fused kernel.
CONTRACTION_PRIMITIVES = tuple(MEASURED_PRIMITIVES)
# Indexing that touches part of a tensor (`node_kernels`): equation -> (operand position read
# only where the result or update lands, operand position bounding that part, whether the
# result is written in place over the operand: a scatter updates its operand's buffer)
PARTIAL_ACCESS = {
    "gather": (0, -1, False),  # -1: the result
    "dynamic_slice": (0, -1, False),
    "slice": (0, -1, False),
    "scatter-add": (0, 2, True),
    "scatter_add": (0, 2, True),
    "scatter": (0, 2, True),
    "dynamic_update_slice": (0, 1, True),
    SCAN_STACK: (0, 0, True),  # an iteration's slice of the stack (`_moves_data`)
}
SELECT_AND_SCATTER = "select_and_scatter_add"
INDEX_ITEMSIZE = 4  # XLA's index arrays are s32


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One kernel XLA runs for (part of) a node, and the memory traffic it makes.

    Tensors made and read inside the kernel stay in registers or on chip: only what it reads
    from outside and what it writes for others cross device memory.
    """

    members: tuple[int, ...]  # positions in `Node.members`
    # (tensor read from memory, the operand tensor it is read for, that operand's map in node
    # dims), each tensor read once; the two differ where the operand is `recomputed`
    reads: tuple[tuple[int, int, DimMap], ...]
    writes: tuple[tuple[int, DimMap], ...]  # tensors read after it (or program results), once
    contraction: bool  # a library call (dot_general / conv), priced by its FLOP-rate curve
    # tensor read or written only in part (`PARTIAL_ACCESS`) -> (the tensor whose shard bounds
    # the bytes, its map): a gather reads what it gathers, a scatter writes what it updates
    partial: tuple[tuple[int, int, DimMap], ...] = ()
    # traffic in tensors the program does not hold (an expansion's index arrays): (tensor, its
    # map, bytes as a multiple of that tensor's shard), `expanded_select_and_scatter`
    extra: tuple[tuple[int, DimMap, float], ...] = ()

    @property
    def runs(self) -> bool:
        """Whether it is a kernel of its own: one that writes nothing is computed inside the
        kernels reading its results (its reads are theirs)."""
        return bool(self.writes or self.extra)


def node_kernels(
    ng: NodeGraph, node: Node, rules: FusionRules = ACCELERATOR_FUSION
) -> tuple[Kernel, ...]:
    """The kernels XLA runs for ``node``, the way the target's XLA fuses (``rules``;
    docs/cost.md, "Compute t_C").

    - A contraction anchor (`CONTRACTION_PRIMITIVES`) is a kernel of its own (a library call):
      it reads its operands and writes its results.
    - The other members (the elementwise followers and absorbed broadcasts; the anchor when it
      is no contraction) fuse into the kernels that write their results (`_cones`): one per
      written result on XLA:CPU, merged into multi-output kernels on GPU/TPU where neither
      depends on the other; members computing nothing written run in their readers' kernels.
    - XLA:CPU expands a max pool's gradient into several kernels
      (`expanded_select_and_scatter`).
    - A kernel reads each tensor it uses that is made outside it once, and writes each tensor it
      makes that is read outside it (directly, or by a reader recomputing a result made from
      it: `_read_outside`), or is a program result, once; tensors made and read inside it are
      not memory traffic, nor are dead results (XLA removes them).
    - XLA fuses elementwise producers into loop-fusion readers: a `recomputed` tensor is not
      written; its readers read what it is computed from (`read_sources`) instead. A kernel that
      writes nothing runs inside its readers' kernels: it keeps its FLOPs but reads nothing
      and costs no launch (`Kernel.runs`).
    - Scan carries, slices, stacks and cond merges (`graph.REGION_PRIMITIVES`) move no data.
    - A kernel holding a reduction with an earlier sibling in another kernel (`shared_reads`)
      does not read the tensors they share: the sibling's kernel reads them for both.
    - Indexing touches part of a tensor (`PARTIAL_ACCESS`, `Kernel.partial`): a gather, slice
      or dynamic slice reads its result's worth of its operand; a scatter or dynamic update
      updates its operand in place, reading and writing its update's worth (XLA reuses the
      operand's buffer). A tensor the kernel also reads whole keeps its whole read.
    """
    program = ng.program
    eqns = program.eqns
    siblings = shared_reads(program, rules)
    live = [
        i
        for i, m in enumerate(node.members)
        if m.eqn >= 0 and _moves_data(program, eqns[m.eqn], rules)
    ]
    if not live:
        return ()
    groups = [live]
    anchor_first = node.members[live[0]].eqn == node.anchor >= 0
    if anchor_first and eqns[node.anchor].primitive in CONTRACTION_PRIMITIVES:
        groups = [[live[0]], live[1:]]
    kernels = []
    if rules.expand_select_and_scatter:
        for i in live:
            if eqns[node.members[i].eqn].primitive == SELECT_AND_SCATTER:
                kernels += expanded_select_and_scatter(program, node, i)
        groups = [
            [i for i in g if eqns[node.members[i].eqn].primitive != SELECT_AND_SCATTER]
            for g in groups
        ]
    for k, group in enumerate(groups):
        if not group:
            continue
        contraction = len(groups) == 2 and k == 0
        own = {node.members[i].eqn for i in group}
        writes = _writes(program, node, group, own, rules)
        if not writes:  # computed inside its readers' kernels
            kernels.append(Kernel(tuple(group), (), (), contraction))
            continue
        cones = _cones(program, node, group, writes, rules)
        computed = set().union(*(cone for cone, _ in cones))
        rest = tuple(i for i in group if i not in computed)
        if rest:  # members computing no write run inside their readers' kernels
            kernels.append(Kernel(rest, (), (), False))
        counted: set[int] = set()  # a member shared by two cones counts its FLOPs once
        for cone, cone_writes in cones:
            members = [i for i in group if i in cone]
            if contraction and rules.operand_copies:
                kernels += _operand_copies(program, node, members[0])
            reads = _cone_reads(program, node, members, contraction, own, siblings, rules)
            partial = _partial_access(program, node, members, rules, not contraction)
            flops = tuple(i for i in members if i not in counted)
            kernels.append(Kernel(flops, reads, cone_writes, contraction, partial))
            counted.update(members)
    return tuple(kernels)


def _cone_reads(
    program: Program,
    node: Node,
    members: Sequence[int],
    contraction: bool,
    own: set[int],
    siblings: dict[int, tuple[tuple[int, int], ...]],
    rules: FusionRules,
) -> tuple[tuple[int, int, DimMap], ...]:
    """`Kernel.reads` of a kernel of ``members``: what each reads from outside the kernel
    (`read_sources` of its operands; a contraction reads them as they are), once, less what an
    earlier sibling reduction outside the node's ``own`` equations reads for it. A source read
    through a recomputed row reduction (`whole_sources`) is read whole: its read is bounded by
    itself, sharded like the operand (whose dims are its rows')."""
    eqns = program.eqns
    made = {t for i in members for t in eqns[node.members[i].eqn].outputs}
    reads: dict[int, tuple[int, DimMap]] = {}
    for i in members:
        m = node.members[i]
        for t, mp in zip(eqns[m.eqn].inputs, m.in_maps, strict=True):
            if t is None or mp is None or t in made:
                continue
            whole = () if contraction else whole_sources(program, t, rules)
            for s in read_sources(program, t, not contraction, rules):
                if s not in made:
                    reads.setdefault(s, (s if s in whole else t, mp))
    skip = {
        src
        for i in members
        for src, earlier in siblings.get(node.members[i].eqn, ())
        if earlier not in own
    }
    return tuple((s, t, mp) for s, (t, mp) in reads.items() if s not in skip)


def _operand_copies(program: Program, node: Node, anchor: int) -> list[Kernel]:
    """The copy kernels of a contraction member's operands (`copied_operands`): each reads
    the operand and writes its copy."""
    m = node.members[anchor]
    eqn = program.eqns[m.eqn]
    return [
        Kernel((), ((eqn.inputs[pos], eqn.inputs[pos], m.in_maps[pos]),),
               ((eqn.inputs[pos], m.in_maps[pos]),), False)
        for pos in copied_operands(program, eqn)
        if m.in_maps[pos] is not None
    ]  # fmt: skip


def expanded_select_and_scatter(program: Program, node: Node, i: int) -> tuple[Kernel, ...]:
    """The kernels of XLA:CPU's select-and-scatter expansion of member ``i`` (a max pool's
    gradient: operand x of rank r, window maxima's cotangent g, result shaped as x).

    XLA rewrites it as: r iotas over x's shape (s32) and the zeros of the result, each a
    kernel writing its tensor; a variadic reduce-window over x and the iotas, writing each
    window's maximum and its r indices; the indices concatenated; g copied; a scatter-add of g
    into the zeros at the indices. In shards of x (|x|) and of g (|g|), itemsize b, index
    itemsize 4::

        iotas, zeros:   r · 4|x|  +  b|x|                       (written)
        reduce-window:  (b + 4r)|x|  read,  (b + 4r)|g|  written
        concatenate:    4r|g|  read and written;  copy of g: b|g| read and written
        scatter:        b|x| read (zeros) and written,  (b + 4r)|g| read

    The member's FLOPs run in the reduce-window. The result is written by the scatter.
    """
    m = node.members[i]
    eqn = program.eqns[m.eqn]
    g, x = eqn.inputs
    (out,) = eqn.outputs
    g_map, x_map = m.in_maps
    rank = len(program.tensors[x].shape)
    idx_x = INDEX_ITEMSIZE / program.tensors[x].itemsize  # an s32 array shaped as x, in x's
    idx_g = INDEX_ITEMSIZE / program.tensors[g].itemsize
    index_kernels = [Kernel((), (), (), False, extra=((x, x_map, idx_x),)) for _ in range(rank)]
    zeros = Kernel((), (), (), False, extra=((out, m.out_maps[0], 1.0),))
    window = Kernel(
        (i,), (), (), False, extra=((x, x_map, 1 + rank * idx_x), (g, g_map, 1 + rank * idx_g))
    )
    concat = Kernel((), (), (), False, extra=((g, g_map, 2 * rank * idx_g),))
    copy = Kernel((), (), (), False, extra=((g, g_map, 2.0),))
    scatter = Kernel(
        (),
        (),
        ((out, m.out_maps[0]),),
        False,
        extra=((out, m.out_maps[0], 1.0), (g, g_map, 1 + rank * idx_g)),
    )
    return (*index_kernels, zeros, window, concat, copy, scatter)


def _writes(
    program: Program, node: Node, group: Sequence[int], own: set[int], rules: FusionRules
) -> dict[int, DimMap]:
    """The tensors the members ``group`` (equations ``own``) write: program results, and what
    is read outside them and not recomputed there (`_read_outside`)."""
    index = program_index(program)
    writes: dict[int, DimMap] = {}
    for i in group:
        m = node.members[i]
        for t, mp in zip(program.eqns[m.eqn].outputs, m.out_maps, strict=True):
            if t in index.results or (
                not recomputed(program, t, rules) and _read_outside(program, t, own, rules)
            ):
                writes.setdefault(t, mp)
    return writes


def _cones(
    program: Program,
    node: Node,
    group: Sequence[int],
    writes: dict[int, DimMap],
    rules: FusionRules,
) -> list[tuple[set[int], tuple[tuple[int, DimMap], ...]]]:
    """The kernels of the members ``group`` that write ``writes``: (members, their writes).

    Each written tensor is computed by the members feeding it through the group's members,
    up to what another of them writes (`_feeding`); members feeding none run inside their
    readers' kernels elsewhere (a loss's forward exponentials and its backward gradient in one
    elementwise node). Without multi-output fusion (XLA:CPU) each written tensor is a loop
    fusion of its own that reads what it needs, a tensor another one writes included (Adam's
    two moments each read the gradient). With it (`FusionRules.multi_output`: XLA:GPU/TPU)
    they merge into one kernel, reading a shared operand once, where neither can depend on the
    other's results: each reads from memory only tensors made before the other writes
    (program order). A node's forward result and its backward gradient (attention's softmax,
    a GELU) stay two kernels: the gradient reads a backward product made after the forward
    one writes.
    """
    eqns = program.eqns
    maker = {t: i for i in group for t in eqns[node.members[i].eqn].outputs}
    by_member: dict[int, list[tuple[int, DimMap]]] = {}
    for t, mp in writes.items():
        by_member.setdefault(maker[t], []).append((t, mp))
    stop = set(writes)
    cones = [
        (_feeding(program, node, maker, {t for t, _ in ws}, stop), tuple(ws))
        for ws in by_member.values()
    ]
    if not rules.multi_output or len(cones) == 1:
        return cones
    producer = program_index(program).producer
    made = set(maker)

    def span(members: set[int], ws: tuple) -> tuple[int, int]:
        """(last equation making what it reads from memory, first equation it writes from)."""
        ready = max(
            (
                producer[s].index
                for i in members
                for t in eqns[node.members[i].eqn].inputs
                if t is not None and t not in made
                for s in read_sources(program, t, True, rules)
                if s in producer
            ),
            default=-1,
        )
        return ready, min(producer[t].index for t, _ in ws)

    merged: list[tuple[set[int], tuple, int, int]] = []
    for members, ws in sorted(cones, key=lambda c: min(c[0])):
        ready, first = span(members, ws)
        for k, (m, w, r, f) in enumerate(merged):
            if ready < f and r < first:
                merged[k] = (m | members, w + ws, max(r, ready), min(f, first))
                break
        else:
            merged.append((members, ws, ready, first))
    return [(m, w) for m, w, _, _ in merged]


def _feeding(
    program: Program, node: Node, maker: dict[int, int], targets: set[int], stop: set[int]
) -> set[int]:
    """The members (``maker``: tensor -> the group member making it) that compute a tensor in
    ``targets``, directly or through the group's other members, not through a tensor in
    ``stop`` (read from memory)."""
    eqns = program.eqns
    stack = [maker[t] for t in targets if t in maker]
    needed = set(stack)
    while stack:
        for t in eqns[node.members[stack.pop()].eqn].inputs:
            i = maker.get(t)
            if i is not None and i not in needed and t not in stop:
                needed.add(i)
                stack.append(i)
    return needed


def _read_outside(program: Program, tid: int, own: set[int], rules: FusionRules) -> bool:
    """Whether an equation outside ``own`` (a kernel's equations) reads ``tid``: directly, or
    by recomputing a `recomputed` tensor made from it (a layer norm's mean, read through the
    division and subtraction its readers recompute), which reads ``tid`` from memory."""
    index = program_index(program)
    stack, seen = [tid], {tid}
    while stack:
        for r in index.readers.get(stack.pop(), ()):
            if r not in own:
                return True
            for out in program.eqns[r].outputs:
                if out not in seen and recomputed(program, out, rules):
                    seen.add(out)
                    stack.append(out)
    return False


def _partial_access(
    program: Program, node: Node, group: Sequence[int], rules: FusionRules, fusing: bool
) -> tuple[tuple[int, int, DimMap], ...]:
    """`Kernel.partial` of the members ``group``: for each indexing member (`PARTIAL_ACCESS`),
    the tensors it reads for its operand, and in place its result, bounded by the result's or
    the update's shard; not where another member of the kernel reads the tensor whole."""
    bounded: dict[int, tuple[int, DimMap]] = {}
    whole: set[int] = set()
    for i in group:
        m = node.members[i]
        eqn = program.eqns[m.eqn]
        access = PARTIAL_ACCESS.get(eqn.primitive)
        for k, (t, mp) in enumerate(zip(eqn.inputs, m.in_maps, strict=True)):
            if t is None or mp is None:
                continue
            sources = read_sources(program, t, fusing, rules)
            if access is not None and k == access[0]:
                if access[1] < 0:
                    bound = (eqn.outputs[0], m.out_maps[0])
                else:
                    bound = (eqn.inputs[access[1]], m.in_maps[access[1]])
                if bound[0] is None or bound[1] is None:
                    whole.update(sources)
                    continue
                for src in sources:
                    bounded.setdefault(src, bound)
                if access[2]:
                    bounded.setdefault(eqn.outputs[0], bound)
            else:
                whole.update(sources)
    return tuple((t, b, mp) for t, (b, mp) in bounded.items() if t not in whole)


def _moves_data(program: Program, eqn: Equation, rules: FusionRules) -> bool:
    """Whether ``eqn`` is memory traffic: not a region equation (`graph.REGION_PRIMITIVES`: XLA
    indexes a scan's stacks in place), except a stack of a contraction's result. A library call
    writes its own buffer, and XLA copies it into the stack's slice with a dynamic-update-slice
    kernel (reading and writing the slice: XLA:GPU's dynamic-slice fusion, which would let the
    library call write the slice, is off by default; XLA:CPU copies the same way). A move
    between memory spaces (``device_put``) is no kernel: a copy engine's DMA on an accelerator
    (`cost.host_move_seconds`), the identity on XLA:CPU."""
    if eqn.primitive == "device_put":
        return False
    if eqn.primitive != SCAN_STACK:
        return eqn.primitive not in REGION_PRIMITIVES
    if eqn.inputs[0] is None:
        return False
    index = program_index(program)
    made = [index.producer.get(s) for s in read_sources(program, eqn.inputs[0], False, rules)]
    return any(e is not None and e.primitive in CONTRACTION_PRIMITIVES for e in made)
