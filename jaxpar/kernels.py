"""The kernels XLA makes of a planning node, and the memory traffic each one makes.

`node_kernels` groups a node's equations the way the target backend's XLA fuses them
(`FusionRules`: GPU/TPU and CPU differ): a contraction's library call, fused elementwise
kernels, what each reads from and writes to device memory. `cost.node_work` prices them.

Pure: numpy only.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Sequence

from .graph import REGION_PRIMITIVES, SCAN_STACK, Equation, Program
from .hardware.calibration import CONV, MATMUL
from .nodes import Node, NodeGraph
from .operand_layouts import copied_operands
from .rules import ELEMENTWISE, DimMap

# primitives priced by a calibration's throughput curves, and the curve kind of each
MEASURED_PRIMITIVES = {
    "dot_general": MATMUL,
    "ragged_dot_general": MATMUL,
    "conv_general_dilated": CONV,
}
# Equations XLA runs as a library call of their own (cuBLAS/cuDNN, Eigen/oneDNN, the MXU), with
# their elementwise followers in a separate fused kernel.
CONTRACTION_PRIMITIVES = tuple(MEASURED_PRIMITIVES)
# Equations that move no data of their own: XLA makes a reshape a bitcast and fuses a broadcast
# or an iota into its readers. A kernel of these alone is no kernel.
FREE_PRIMITIVES = ("reshape", "squeeze", "expand_dims", "broadcast_in_dim", "iota")
# Loop-fusion consumers: XLA fuses an elementwise producer into them (recomputing it) rather
# than writing its result to memory (`node_kernels`).
FUSING_READERS = frozenset(
    (*ELEMENTWISE, *FREE_PRIMITIVES, "transpose", "reduce_sum", "reduce_max", "reduce_min",
     "reduce_prod", "argmax", "argmin", "select_n", "pad", "slice", "concatenate", "gather")
)  # fmt: skip
# Results that are bitcasts of their operand (never written; readers read the operand)
ALIASES = ("reshape", "squeeze", "expand_dims")
# Producers XLA recomputes inside fusing readers rather than writing their results (a
# transpose or a slice is an index map: a weight gradient's transpose runs inside the
# optimizer's update, a loss's shifted logits inside its reductions)
RECOMPUTED_PRODUCERS = frozenset((*ELEMENTWISE, *FREE_PRIMITIVES, "transpose", "slice"))
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
# Reductions XLA's multi-output fusion runs as one kernel when they are siblings (`shared_reads`)
REDUCTIONS = frozenset(("reduce_sum", "reduce_max", "reduce_min", "reduce_prod"))


@dataclasses.dataclass(frozen=True)
class FusionRules:
    """How the target backend's XLA fuses, where backends differ (docs/design.md, "Compute t_C").

    ``duplicate_producers``: an elementwise result read only by loop fusions is recomputed in
    each of them, however many (XLA:GPU duplicates the producer: softmax's masked, shifted
    exponentials are never written); without it, only a result with one reader is.
    ``sibling_reductions``: sibling reductions share their read (`shared_reads`).
    ``operand_copies``: a contraction reads its operands in one layout, and copies those it
    finds in another first (`copied_operands`; XLA:CPU), a kernel each.
    ``multi_output``: the tensors a node's elementwise members write come from one kernel
    (multi-output fusion), else from a loop fusion each (`_cones`; XLA:CPU).
    ``expand_select_and_scatter``: a max pool's gradient runs as XLA's select-and-scatter
    expansion (`expanded_select_and_scatter`; XLA:CPU), not as one kernel.
    """

    duplicate_producers: bool
    sibling_reductions: bool
    operand_copies: bool = False
    multi_output: bool = True
    expand_select_and_scatter: bool = False


ACCELERATOR_FUSION = FusionRules(duplicate_producers=True, sibling_reductions=True)
CPU_FUSION = FusionRules(
    duplicate_producers=False,
    sibling_reductions=False,
    operand_copies=True,
    multi_output=False,
    expand_select_and_scatter=True,
)
SELECT_AND_SCATTER = "select_and_scatter_add"
INDEX_ITEMSIZE = 4  # XLA's index arrays are s32


def fusion_for(platform: str) -> FusionRules:
    """The rules of a mesh's platform: XLA:CPU's for a CPU mesh (its compiled program is what
    `verify` checks), GPU/TPU rules for an accelerator or an abstract mesh."""
    return CPU_FUSION if platform == "cpu" else ACCELERATOR_FUSION


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


@dataclasses.dataclass
class _ProgramIndex:
    """What `node_kernels` asks of every tensor, computed once per program."""

    producer: dict[int, Equation]  # tensor -> the equation making it
    readers: dict[int, list[int]]  # tensor -> equations reading it
    results: frozenset[int]  # the program's results
    sources: dict[tuple[int, bool], tuple[int, ...]]  # memo of `_computed_from` per rule
    fusing: dict[int, bool]  # memo of `_fuses`
    recomputed: dict[tuple[int, bool], bool]  # memo of `recomputed` per rule
    siblings: dict[FusionRules, dict[int, tuple[tuple[int, int], ...]]]  # memo of `shared_reads`


_INDEX: dict[int, tuple[weakref.ref, _ProgramIndex]] = {}


def _index(program: Program) -> _ProgramIndex:
    key = id(program)
    hit = _INDEX.get(key)
    if hit is None or hit[0]() is not program:
        producer = {t: e for e in program.eqns for t in e.outputs}
        # what is written whoever reads it: the program's results, and what a loop body
        # returns to its next iteration (its carry)
        results = frozenset(t for t in program.outvars if t is not None) | frozenset(
            t for region in program.regions for t in region.carry_out if t is not None
        )
        index = _ProgramIndex(producer, program.consumers(), results, {}, {}, {}, {})
        hit = (weakref.ref(program), index)
        _INDEX[key] = hit
        weakref.finalize(program, _INDEX.pop, key, None)
    return hit[1]


def recomputed(program: Program, tid: int, rules: FusionRules = ACCELERATOR_FUSION) -> bool:
    """Whether tensor ``tid`` is never written to memory because XLA computes it inside the
    kernels that read it: a reshape's result is a bitcast of its operand (`ALIASES`), a dot's
    result transposed (`_folded_into_dot`) is the dot's; an elementwise or layout result
    (`RECOMPUTED_PRODUCERS`) that is no program result and whose reading equations all fuse
    it (`_fuses`) is computed in each of them (XLA's producer-consumer fusion). With one
    reader on every backend; with several only where the backend duplicates producers
    (`FusionRules.duplicate_producers`), else it is written once."""
    index = _index(program)
    key = (tid, rules.duplicate_producers)
    hit = index.recomputed.get(key)
    if hit is None:
        hit = index.recomputed[key] = _recomputed(program, index, tid, rules)
    return hit


def _recomputed(program: Program, index: _ProgramIndex, tid: int, rules: FusionRules) -> bool:
    eqn = index.producer.get(tid)
    if eqn is None or tid in index.results:
        return False
    if eqn.primitive in ALIASES or _folded_into_dot(index, eqn):
        return True
    readers = set(index.readers.get(tid, ()))
    if eqn.primitive not in RECOMPUTED_PRODUCERS or not readers:
        return False
    if len(readers) > 1 and not rules.duplicate_producers:
        return False
    if not all(_fuses(program, r) for r in readers):
        return False
    if len(readers) == 1:
        return True
    # duplicated into several readers: only where recomputing reads no more than writing it
    # once and reading it in each reader would (XLA:GPU's priority fusion weighs the same)
    again = sum(program.tensors[s].nbytes for s in _computed_from(program, tid, rules))
    return len(readers) * again <= (1 + len(readers)) * program.tensors[tid].nbytes


def _folded_into_dot(index: _ProgramIndex, eqn: Equation) -> bool:
    """Whether ``eqn`` transposes a dot's result that nothing else reads: XLA's algebraic
    simplifier makes transpose(dot(a, b)) one dot writing the transposed layout (a scanned
    weight gradient, transposed into its stack), so the transpose is never written."""
    if eqn.primitive != "transpose":
        return False
    src = eqn.inputs[0]
    made = index.producer.get(src)
    return (
        made is not None
        and made.primitive == "dot_general"
        and src not in index.results
        and index.readers.get(src) == [eqn.index]
    )


def _fuses(program: Program, reader: int) -> bool:
    """Whether equation ``reader`` runs in a loop fusion that can compute its operands'
    producers (`FUSING_READERS`); a reshape fuses when every reader of its result does."""
    index = _index(program)
    hit = index.fusing.get(reader)
    if hit is None:
        eqn = program.eqns[reader]
        hit = eqn.primitive in FUSING_READERS
        if hit and eqn.primitive in ALIASES:
            hit = all(_fuses(program, r) for t in eqn.outputs for r in index.readers.get(t, ()))
        index.fusing[reader] = hit
    return hit


def _sources(
    program: Program, tid: int, fusing: bool, rules: FusionRules = ACCELERATOR_FUSION
) -> tuple[int, ...]:
    """The tensors a kernel reads from memory to use ``tid``: through reshapes, their operand;
    for a loop fusion (``fusing``) reading a `recomputed` tensor, the sources of its
    producer's operands; else ``tid`` itself."""
    index = _index(program)
    eqn = index.producer.get(tid)
    if eqn is None or not recomputed(program, tid, rules):
        return (tid,)
    if eqn.primitive in ALIASES or _folded_into_dot(index, eqn):
        return _sources(program, eqn.inputs[0], fusing, rules)
    if not fusing:
        return (tid,)
    return _computed_from(program, tid, rules)


def _computed_from(program: Program, tid: int, rules: FusionRules) -> tuple[int, ...]:
    """What a loop fusion recomputing ``tid`` reads from memory: the sources (`_sources`) of
    its producer's operands (memo: `_recomputed` weighs them before `_sources` uses them)."""
    index = _index(program)
    key = (tid, rules.duplicate_producers)
    hit = index.sources.get(key)
    if hit is None:
        ops = [t for t in index.producer[tid].inputs if t is not None]
        hit = tuple(dict.fromkeys(s for t in ops for s in _sources(program, t, True, rules)))
        index.sources[key] = hit
    return hit


def shared_reads(
    program: Program, rules: FusionRules = ACCELERATOR_FUSION
) -> dict[int, tuple[tuple[int, int], ...]]:
    """Reduction equation -> (tensor, earlier sibling equation) for each tensor it reads from
    memory (`_sources` of its operand) that an earlier sibling reduction already reads.

    XLA's multi-output fusion runs reductions of the same operand shape over the same axes that
    read a common tensor and do not depend on each other as one kernel reading it once (a
    batch norm's Σx and Σx², the Σdy and Σdy·x̂ of its backward): the later sibling's kernel
    does not read it again.

    Only direct dependence is checked (the later reduction reading the earlier one's result
    through its fused producers, as softmax's Σexp(x - max x) does); a dependence through
    another kernel is not seen. Empty where the backend does not (`FusionRules`).
    """
    index = _index(program)
    if rules in index.siblings:
        return index.siblings[rules]
    if not rules.sibling_reductions:
        index.siblings[rules] = {}
        return {}
    first: dict[tuple, Equation] = {}  # (tensor read, operand shape, axes) -> first reduction
    shared: dict[int, tuple[tuple[int, int], ...]] = {}
    for eqn in program.eqns:
        op = eqn.inputs[0] if eqn.inputs else None
        if eqn.primitive not in REDUCTIONS or op is None:
            continue
        kind = (program.tensors[op].shape, tuple(eqn.params.get("axes", ())))
        reads = _sources(program, op, True, rules)
        mine = []
        for src in reads:
            earlier = first.get((src, *kind))
            if earlier is not None and earlier.outputs[0] not in reads:
                mine.append((src, earlier.index))
            else:
                first.setdefault((src, *kind), eqn)
        if mine:
            shared[eqn.index] = tuple(mine)
    index.siblings[rules] = shared
    return shared


def node_kernels(
    ng: NodeGraph, node: Node, rules: FusionRules = ACCELERATOR_FUSION
) -> tuple[Kernel, ...]:
    """The kernels XLA runs for ``node``, the way the target's XLA fuses (``rules``;
    docs/design.md, "Compute t_C").

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
      written; its readers read what it is computed from (`_sources`) instead. A kernel that
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
    (`_sources` of its operands; a contraction reads them as they are), once, less what an
    earlier sibling reduction outside the node's ``own`` equations reads for it."""
    eqns = program.eqns
    made = {t for i in members for t in eqns[node.members[i].eqn].outputs}
    reads: dict[int, tuple[int, DimMap]] = {}
    for i in members:
        m = node.members[i]
        for t, mp in zip(eqns[m.eqn].inputs, m.in_maps, strict=True):
            if t is None or mp is None or t in made:
                continue
            for s in _sources(program, t, not contraction, rules):
                if s not in made:
                    reads.setdefault(s, (t, mp))
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
    index = _index(program)
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
    producer = _index(program).producer
    made = set(maker)

    def span(members: set[int], ws: tuple) -> tuple[int, int]:
        """(last equation making what it reads from memory, first equation it writes from)."""
        ready = max(
            (
                producer[s].index
                for i in members
                for t in eqns[node.members[i].eqn].inputs
                if t is not None and t not in made
                for s in _sources(program, t, True, rules)
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
    index = _index(program)
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
            sources = _sources(program, t, fusing, rules)
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
    library call write the slice, is off by default; XLA:CPU copies the same way)."""
    if eqn.primitive != SCAN_STACK:
        return eqn.primitive not in REGION_PRIMITIVES
    if eqn.inputs[0] is None:
        return False
    index = _index(program)
    made = [index.producer.get(s) for s in _sources(program, eqn.inputs[0], False, rules)]
    return any(e is not None and e.primitive in CONTRACTION_PRIMITIVES for e in made)
