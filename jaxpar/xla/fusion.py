"""How XLA fuses: which results it never writes, and what a fused kernel reads for them.

XLA computes an elementwise producer (and, on GPU, a short row reduction) inside the fused
kernels that read it instead of writing it to memory; their readers then read what it is
computed from (`read_sources`). Sibling reductions share their read (`shared_reads`). Where
backends differ, `FusionRules` says how (`fusion_for`: XLA:CPU, or XLA:GPU/TPU).
`kernels.node_kernels` builds a node's kernels on these answers.

Pure: numpy only.
"""

from __future__ import annotations

import dataclasses
import math
import weakref

from ..program.graph import Equation, Program
from ..rules.table import ELEMENTWISE

# Equations that move no data of their own: XLA makes a reshape a bitcast and fuses a broadcast
# or an iota into its readers. A kernel of these alone is no kernel.
FREE_PRIMITIVES = ("reshape", "squeeze", "expand_dims", "broadcast_in_dim", "iota")
# Loop-fusion consumers: XLA fuses an elementwise producer into them (recomputing it) rather
# than writing its result to memory (`node_kernels`).
FUSING_READERS = frozenset(
    (*ELEMENTWISE, *FREE_PRIMITIVES, "transpose", "reduce_sum", "reduce_max", "reduce_min",
     "reduce_prod", "argmax", "argmin", "select_n", "pad", "slice", "concatenate", "gather")
)  # fmt: skip
# Results that are bitcasts of their operand (never written; readers read the operand). A
# remat's `optimization_barrier` only orders the program: XLA passes its operand's buffer on.
ALIASES = ("reshape", "squeeze", "expand_dims", "optimization_barrier")
# Producers XLA recomputes inside fusing readers rather than writing their results (a
# transpose or a slice is an index map: a weight gradient's transpose runs inside the
# optimizer's update, a loss's shifted logits inside its reductions)
RECOMPUTED_PRODUCERS = frozenset((*ELEMENTWISE, *FREE_PRIMITIVES, "transpose", "slice"))
# Reductions XLA's multi-output fusion runs as one kernel when they are siblings (`shared_reads`)
REDUCTIONS = frozenset(("reduce_sum", "reduce_max", "reduce_min", "reduce_prod"))
# The longest row (elements reduced over trailing dims) a row reduction fuses into its readers
# with (`FusionRules.row_reductions`): on an H100 XLA:GPU fused GPT-2's 1,024-wide softmax rows
# this way and kept the loss's 50,304-wide rows in kernels of their own.
ROW_REDUCTION_LIMIT = 8192


@dataclasses.dataclass(frozen=True)
class FusionRules:
    """How the target backend's XLA fuses, where backends differ (docs/cost.md, "Compute t_C").

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
    ``row_reductions``: a reduction over its operand's trailing dims, rows of at most
    `ROW_REDUCTION_LIMIT` elements, is recomputed inside the loop fusions that read it like an
    elementwise producer (XLA:GPU's normalization fusions: a softmax's max is computed in the
    kernels that read its rows, never written; `_row_reduction`).
    """

    duplicate_producers: bool
    sibling_reductions: bool
    operand_copies: bool = False
    multi_output: bool = True
    expand_select_and_scatter: bool = False
    row_reductions: bool = False


ACCELERATOR_FUSION = FusionRules(
    duplicate_producers=True, sibling_reductions=True, row_reductions=True
)
CPU_FUSION = FusionRules(
    duplicate_producers=False,
    sibling_reductions=False,
    operand_copies=True,
    multi_output=False,
    expand_select_and_scatter=True,
)


def fusion_for(platform: str) -> FusionRules:
    """The rules of a mesh's platform: XLA:CPU's for a CPU mesh (its compiled program is what
    `verify` checks), GPU/TPU rules for an accelerator or an abstract mesh."""
    return CPU_FUSION if platform == "cpu" else ACCELERATOR_FUSION


@dataclasses.dataclass
class _ProgramIndex:
    """What `node_kernels` asks of every tensor, computed once per program."""

    producer: dict[int, Equation]  # tensor -> the equation making it
    readers: dict[int, list[int]]  # tensor -> equations reading it
    results: frozenset[int]  # the program's results
    sources: dict[tuple[int, bool, bool], tuple[int, ...]]  # memo of `_computed_from` per rule
    fusing: dict[int, bool]  # memo of `_fuses`
    recomputed: dict[tuple[int, bool, bool], bool]  # memo of `recomputed` per rule
    siblings: dict[FusionRules, dict[int, tuple[tuple[int, int], ...]]]  # memo of `shared_reads`
    whole: dict[tuple[int, bool, bool], frozenset[int]]  # memo of `whole_sources` per rule


_INDEX: dict[int, tuple[weakref.ref, _ProgramIndex]] = {}


def program_index(program: Program) -> _ProgramIndex:
    key = id(program)
    hit = _INDEX.get(key)
    if hit is None or hit[0]() is not program:
        producer = {t: e for e in program.eqns for t in e.outputs}
        # what is written whoever reads it: the program's results, and what a loop body
        # returns to its next iteration (its carry)
        results = frozenset(t for t in program.outvars if t is not None) | frozenset(
            t for region in program.regions for t in region.carry_out if t is not None
        )
        index = _ProgramIndex(producer, program.consumers(), results, {}, {}, {}, {}, {})
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
    index = program_index(program)
    hit = index.recomputed.get((tid, rules.duplicate_producers, rules.row_reductions))
    return _evaluate(program, index, rules, (_RECOMPUTED, tid)) if hit is None else hit


def _row_reduction(program: Program, eqn: Equation) -> bool:
    """Whether ``eqn`` reduces its operand's trailing dims, rows of at most
    `ROW_REDUCTION_LIMIT` elements (`FusionRules.row_reductions`)."""
    if eqn.primitive not in REDUCTIONS:
        return False
    shape = program.tensors[eqn.inputs[0]].shape
    axes = tuple(sorted(eqn.params.get("axes", ())))
    trailing = tuple(range(len(shape) - len(axes), len(shape)))
    return (
        bool(axes)
        and axes == trailing
        and math.prod(shape[d] for d in axes) <= (ROW_REDUCTION_LIMIT)
    )


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
    index = program_index(program)
    hit = index.fusing.get(reader)
    return _evaluate(program, index, ACCELERATOR_FUSION, (_FUSES, reader)) if hit is None else hit


def read_sources(
    program: Program, tid: int, fusing: bool, rules: FusionRules = ACCELERATOR_FUSION
) -> tuple[int, ...]:
    """The tensors a kernel reads from memory to use ``tid``: through reshapes, their operand;
    for a loop fusion (``fusing``) reading a `recomputed` tensor, the sources of its
    producer's operands; else ``tid`` itself."""
    index = program_index(program)
    while True:  # along a chain of aliases (a loop: chains are as long as programs)
        eqn = index.producer.get(tid)
        if eqn is None or not recomputed(program, tid, rules):
            return (tid,)
        if not (eqn.primitive in ALIASES or _folded_into_dot(index, eqn)):
            return _computed_from(program, tid, rules) if fusing else (tid,)
        tid = eqn.inputs[0]


def whole_sources(program: Program, tid: int, rules: FusionRules) -> frozenset[int]:
    """The sources (`read_sources`) a loop fusion using ``tid`` reads whole rows of: those it
    reaches through a recomputed row reduction (`FusionRules.row_reductions`), which reads
    every element of its rows however small its result."""
    index = program_index(program)
    hit = index.whole.get((tid, rules.duplicate_producers, rules.row_reductions))
    return _evaluate(program, index, rules, (_WHOLE, tid)) if hit is None else hit


def _computed_from(program: Program, tid: int, rules: FusionRules) -> tuple[int, ...]:
    """What a loop fusion recomputing ``tid`` reads from memory: the sources (`read_sources`) of
    its producer's operands (memo: `_recomputed` weighs them before `read_sources` uses them)."""
    index = program_index(program)
    hit = index.sources.get((tid, rules.duplicate_producers, rules.row_reductions))
    return _evaluate(program, index, rules, (_COMPUTED_FROM, tid)) if hit is None else hit


# ---- the walks, without recursion --------------------------------------------------------------
# `recomputed`, `_computed_from`, `whole_sources` and `_fuses` are memoized functions of each
# other along producer chains (and `_fuses` along chains of aliases' readers), as deep as the
# program is long: an unrolled decoder with remat nests two levels per layer, a chain of
# elementwise operations under `jax.grad` one per operation. `_evaluate` computes them on an
# explicit stack: each step (`_STEPS`) reads the memos of what it depends on, and lists what is
# missing in ``need``; the missing are computed first, then the step is run again.

_RECOMPUTED, _COMPUTED_FROM, _WHOLE, _FUSES = range(4)


def _memo(index: _ProgramIndex, kind: int) -> dict:
    return (index.recomputed, index.sources, index.whole, index.fusing)[kind]


def _evaluate(program: Program, index: _ProgramIndex, rules: FusionRules, goal: tuple) -> object:
    """The value of ``goal`` (a (kind, tensor or equation) pair), with every value it depends
    on computed and memoized first, depth first on a list."""
    rule_key = (rules.duplicate_producers, rules.row_reductions)
    stack = [goal]
    while stack:
        kind, x = stack[-1]
        memo = _memo(index, kind)
        key = x if kind == _FUSES else (x, *rule_key)
        if key in memo:
            stack.pop()
            continue
        need: list[tuple[int, int]] = []
        value = _STEPS[kind](program, index, rules, x, need)
        if need:
            stack.extend(need)
        else:
            memo[key] = value
            stack.pop()
    kind, x = goal
    return _memo(index, kind)[x if kind == _FUSES else (x, *rule_key)]


def _known(index: _ProgramIndex, rules: FusionRules, kind: int, x: int, need: list) -> object:
    """The memoized value of (kind, x), or None after adding it to ``need``."""
    key = x if kind == _FUSES else (x, rules.duplicate_producers, rules.row_reductions)
    value = _memo(index, kind).get(key)
    if value is None:
        need.append((kind, x))
    return value


def _fuses_step(program: Program, index: _ProgramIndex, rules, reader: int, need: list):
    eqn = program.eqns[reader]
    if eqn.primitive not in FUSING_READERS:
        return False
    if eqn.primitive not in ALIASES:
        return True
    found = [
        _known(index, rules, _FUSES, r, need) for t in eqn.outputs for r in index.readers.get(t, ())
    ]
    return None if need else all(found)


def _recomputed_step(program: Program, index: _ProgramIndex, rules, tid: int, need: list):
    eqn = index.producer.get(tid)
    if eqn is None or tid in index.results:
        return False
    if eqn.primitive in ALIASES or _folded_into_dot(index, eqn):
        return True
    readers = set(index.readers.get(tid, ()))
    producer = eqn.primitive in RECOMPUTED_PRODUCERS or (
        rules.row_reductions and _row_reduction(program, eqn)
    )
    if not producer or not readers:
        return False
    if len(readers) > 1 and not rules.duplicate_producers:
        return False
    fusing = [_known(index, rules, _FUSES, r, need) for r in sorted(readers)]
    if need:
        return None
    if not all(fusing):
        return False
    if len(readers) == 1:
        return True
    # duplicated into several readers: only where recomputing reads no more than writing it
    # once and reading it in each reader would (XLA:GPU's priority fusion weighs the same)
    sources = _known(index, rules, _COMPUTED_FROM, tid, need)
    if sources is None:
        return None
    again = sum(program.tensors[s].nbytes for s in sources)
    return len(readers) * again <= (1 + len(readers)) * program.tensors[tid].nbytes


def _sources_known(index: _ProgramIndex, rules, tid: int, need: list) -> tuple[int, ...] | None:
    """`read_sources` (fusing) of ``tid`` from the memos, or None with what is missing added
    to ``need``."""
    while True:
        eqn = index.producer.get(tid)
        if eqn is None:
            return (tid,)
        again = _known(index, rules, _RECOMPUTED, tid, need)
        if again is None:
            return None
        if not again:
            return (tid,)
        if not (eqn.primitive in ALIASES or _folded_into_dot(index, eqn)):
            return _known(index, rules, _COMPUTED_FROM, tid, need)
        tid = eqn.inputs[0]


def _computed_from_step(program: Program, index: _ProgramIndex, rules, tid: int, need: list):
    ops = [t for t in index.producer[tid].inputs if t is not None]
    found = [_sources_known(index, rules, t, need) for t in ops]
    if need:
        return None
    return tuple(dict.fromkeys(s for sources in found for s in sources))


def _whole_step(program: Program, index: _ProgramIndex, rules, tid: int, need: list):
    eqn = index.producer.get(tid)
    if eqn is None or not rules.row_reductions:
        return frozenset()
    again = _known(index, rules, _RECOMPUTED, tid, need)
    if not again:  # not recomputed, or not known yet (then ``need`` says so)
        return frozenset()
    if eqn.primitive in REDUCTIONS:
        sources = _known(index, rules, _COMPUTED_FROM, tid, need)
        return None if sources is None else frozenset(sources)
    found = [_known(index, rules, _WHOLE, t, need) for t in eqn.inputs if t is not None]
    return None if need else frozenset().union(*found)


_STEPS = (_recomputed_step, _computed_from_step, _whole_step, _fuses_step)


def shared_reads(
    program: Program, rules: FusionRules = ACCELERATOR_FUSION
) -> dict[int, tuple[tuple[int, int], ...]]:
    """Reduction equation -> (tensor, earlier sibling equation) for each tensor it reads from
    memory (`read_sources` of its operand) that an earlier sibling reduction already reads.

    XLA's multi-output fusion runs reductions of the same operand shape over the same axes that
    read a common tensor and do not depend on each other as one kernel reading it once (a
    batch norm's Σx and Σx², the Σdy and Σdy·x̂ of its backward): the later sibling's kernel
    does not read it again.

    Only direct dependence is checked (the later reduction reading the earlier one's result
    through its fused producers, as softmax's Σexp(x - max x) does); a dependence through
    another kernel is not seen. Empty where the backend does not (`FusionRules`).
    """
    index = program_index(program)
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
        if recomputed(program, eqn.outputs[0], rules):
            continue  # a row reduction its readers recompute runs in their kernels
        kind = (program.tensors[op].shape, tuple(eqn.params.get("axes", ())))
        reads = read_sources(program, op, True, rules)
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
