"""Where XLA keeps a step's buffers: what it fuses instead of storing, and which allocation
holds what it stores. The rules `memory.MemoryModel` follows, each measured against XLA's
buffer assignment (docs/memory.md, "Memory").

Pure: numpy only.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from ..nodes.configs import shard_count
from ..program.graph import BACKWARD, FORWARD, UPDATE, phase_of
from ..rules.table import ELEMENTWISE
from .fusion import REDUCTIONS
from .operand_layouts import copied_operands
from .reshard_paths import ALL_TO_ALL, reshard_path

FUSIBLE = frozenset(ELEMENTWISE) | {"broadcast_in_dim", "convert_element_type"}
# layout changes XLA turns into bitcasts of their operand (or folds into the producer's layout)
VIEWS = frozenset({"transpose", "reshape", "squeeze", "expand_dims"})
# updates XLA runs in place: the result takes over the operand's buffer when nothing else reads
# it (a cross-entropy gradient scattered into zeros)
IN_PLACE = frozenset({"scatter", "scatter-add", "scatter-mul", "dynamic_update_slice"})
# readers XLA fuses a broadcast or iota into (it recomputes the value inside each of them); a
# reduction or dot (on XLA:CPU a library call) needs its operands stored
FUSING_READERS = FUSIBLE | VIEWS | {"pad", "slice", "concatenate", "rev"}
GENERATORS = frozenset({"broadcast_in_dim", "iota"})
# elementwise ops XLA's fusion does not duplicate into several consumers (its `IsExpensive`):
# a value computed by one is stored for the backward pass rather than recomputed there
EXPENSIVE = frozenset(
    {"exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "div", "rsqrt", "sqrt",
     "pow", "erf", "erf_inv", "sin", "cos", "tan", "atan2", "cbrt", "rem"}
)  # fmt: skip
# On XLA:CPU a dot or convolution of 16-bit floats runs in float32: its operands are converted
# (the conversion fused into their producer) and its result is float32 until converted back.
UPCAST_READERS = frozenset({"dot_general", "ragged_dot_general", "conv_general_dilated"})
HALF_FLOATS = frozenset({"bfloat16", "float16"})
# XLA:CPU hands a reduction over at least this many elements (per device) to YNNPACK, whose
# fusion reads from memory an operand computed for other readers too; a smaller reduction is
# a loop fusion that recomputes it (XLA's `IsInstructionPreferredByYnn`)
YNN_MIN_ELEMENTS = 4096


class Buffer(NamedTuple):
    """A buffer of the step: its bytes per device and life, in equation indices."""

    size: float
    born: int
    dies: int  # its last reader
    phase: str
    tensor: int
    # whether its last reader may write its result in place over it: not an all-reduced weight
    # gradient that its update reads transposed (XLA keeps it in the heap)
    in_place: bool = True


def hosted_in_results(buffers: Sequence[Buffer], results: Sequence[tuple[float, int]]) -> set[int]:
    """The buffers XLA places in the allocations of the step's results instead of its heap.

    XLA's buffer assignment gives each result not aliased to a donated argument an allocation
    of its own for the whole step, and lets a smaller buffer reuse such an allocation when their
    live ranges do not interfere (`BufferAssigner::MaybeAssignBuffer`): buffers in decreasing
    size, each into the smallest allocation it fits whose occupants it does not overlap. A
    result is written where it is produced (near the step's end, by the update; a node's
    results by its first), so gradients and activations that die by then live in it at no cost.
    A buffer read last by the result's producer shares with it (an elementwise update in
    place), as a gradient's partial sum does with its all-reduced sum, unless it is not
    `Buffer.in_place` (XLA all-reduces a dense kernel's gradient before its transpose, and the
    update that reads it transposed keeps it in the heap). ``results``: (bytes, equation
    writing it).
    Returns indices into ``buffers``. Measured against XLA:CPU's assignment on steps whose
    state is not donated: tests/test_memory.py.
    """
    if not results:
        return set()
    # XLA tries the smallest allocation first, of equal ones the one made last (results are
    # made in program order)
    slots = sorted(range(len(results)), key=lambda r: (results[r][0], -results[r][1]))
    sizes = [results[r][0] for r in slots]
    taken: list[list[tuple[int, int, int]]] = [[] for _ in slots]  # occupied [born, dies]
    free_until = [results[r][1] for r in slots]  # the result itself from there on
    latest = max(free_until)
    hosted = set()
    order = sorted(range(len(buffers)), key=lambda i: (-buffers[i][0], buffers[i][1]))
    for i in order:
        size, born, dies, _, t, in_place = buffers[i]
        if dies > latest:
            continue
        for j in range(bisect.bisect_left(sizes, size * (1 - 1e-12)), len(slots)):
            if (
                dies > free_until[j]
                or (dies == free_until[j] and not in_place)
                or any(
                    b <= dies and born <= d and not (u == t and (d == born or b == dies))
                    for b, d, u in taken[j]
                )
            ):
                continue
            taken[j].append((born, dies, t))
            hosted.add(i)
            break
    return hosted


def generated_tensors(program) -> frozenset[int]:
    """Tensors computed from no data: iotas, broadcasts of literals or constants, and
    elementwise functions of those, such as a causal mask broadcast to [b, h, s, s]. XLA fuses
    their computation into each elementwise reader and never stores them for it. (A broadcast
    of a parameter or of a computed value is stored: XLA:CPU reads it in reductions.)"""
    out: set[int] = set()
    for e in program.eqns:
        if e.primitive not in GENERATORS and e.primitive not in FUSIBLE | VIEWS:
            continue
        if any(program.tensors[t].opaque for t in e.outputs):
            continue
        source = [t is None or t in out or t in program.consts for t in e.inputs]
        if all(source) and (e.primitive in GENERATORS or any(t in out for t in e.inputs)):
            out.update(e.outputs)
    return frozenset(out)


def uniform_tensors(program) -> frozenset[int]:
    """Tensors holding one value in every element, known without data: broadcasts of a scalar
    computed from literals or constants (``zeros_like``, a loss's seed gradient ``1 / n``),
    their views, and elementwise functions of only those and literals. XLA's algebraic
    simplifier folds such a tensor into a broadcast of one constant, and turns an all-gather
    of a broadcast into a broadcast of the gathered operand: gathering it runs no collective
    (`reshard.priced_steps`; its all-to-alls stay). A loop's input (a carry's first value, a
    scanned operand) is left out: the loop reads it through its operand tuple, and its
    gathers stay (tests/test_loops.py)."""
    out: set[int] = set()
    scalars: set[int] = set()  # scalar values computed from literals and constants alone
    for e in program.eqns:
        if any(program.tensors[t].opaque for t in e.outputs) or len(e.outputs) != 1:
            continue
        known = [t is None or t in out or t in scalars or t in program.consts for t in e.inputs]
        if not all(known) or e.primitive not in FUSIBLE | VIEWS:
            continue
        t = e.outputs[0]
        if not program.tensors[t].shape:
            scalars.add(t)
        elif e.primitive == "broadcast_in_dim":
            operand = e.inputs[0]
            if operand is None or not program.tensors[operand].shape or operand in out:
                out.add(t)
        elif any(x in out for x in e.inputs):
            out.add(t)
    # a loop's input keeps its reshards (the docstring)
    entering = {
        t
        for loop in program.regions
        for e in (*loop.carry_eqns, *loop.slice_eqns)
        for t in program.eqns[e].inputs
    }
    return frozenset(out - entering)


def transposed_operands(program) -> frozenset[tuple[int, int]]:
    """(equation, operand) of the contraction operands XLA:CPU reads through a transposed
    copy (`operand_layouts.copied_operands`)."""
    return frozenset((e.index, pos) for e in program.eqns for pos in copied_operands(program, e))


def scheduled_updates(
    program, phases: Sequence[str], last_read: Mapping[int, int], writes: Mapping[int, int]
) -> tuple[list[int], dict[int, int], dict[int, list[int]]]:
    """Where XLA:CPU runs the optimizer's equations, as equation indices.

    Each parameter's update is one fusion (`update_fusions`) that runs as soon as its gradient
    exists (so that the gradient dies there), and not before the last forward or backward
    read of the donated argument it overwrites (``last_read``: argument -> equation;
    ``writes``: equation -> the argument its result becomes). What reads no computed value (a
    learning rate, a decayed moment) is fused into its readers. Measured on the small models'
    steps: the update fusions follow their gradients in XLA:CPU's schedule.

    Returns (position of every equation, update equation -> its fusion, update equation
    fused into its readers -> those readers).
    """
    position = list(range(len(program.eqns)))
    fusions, free = update_fusions(program, phases)
    producer = {t: e.index for e in program.eqns for t in e.outputs}
    members = {i for group in fusions for i in group} | free
    for group in fusions:
        at = 0
        for i in group:
            at = max(at, last_read.get(writes.get(i, -1), 0))
            for t in program.eqns[i].inputs:
                j = producer.get(t, -1) if t is not None else -1
                if j >= 0 and j not in members:
                    at = max(at, j)
        for i in group:
            position[i] = at
    readers: dict[int, list[int]] = {}
    for e in program.eqns:
        for t in e.inputs:
            if t is not None:
                readers.setdefault(t, []).append(e.index)
    fused_into: dict[int, list[int]] = {}
    for i in sorted(free, reverse=True):
        fused_into[i] = [j for t in program.eqns[i].outputs for j in readers.get(t, ())]
        position[i] = min((position[j] for j in fused_into[i]), default=i)
    group_of = {i: g for g, group in enumerate(fusions) for i in group}
    return position, group_of, fused_into


def combined_all_reduces(
    program, syncs: Mapping[int, int], limit: int, after: float
) -> dict[int, float]:
    """Where XLA:CPU's combiner runs each gradient all-reduce: tensor -> ``after`` past the
    equation making the last of its group (that equation's operands are dead by then).
    ``syncs``: reduced tensor -> the equation making its partial sum.

    The combiner merges all-reduces that do not depend on each other: a group takes the syncs
    in program order until one reads (through any chain) a reduced result of the group, as a
    batch norm's input gradient reads its reduced statistics; that one starts the next group.
    At most ``limit`` operands a group."""
    if not syncs:
        return {}
    made_at: dict[int, list[int]] = {}
    for t, i in syncs.items():
        made_at.setdefault(i, []).append(t)
    out: dict[int, float] = {}
    group: list[int] = []
    tainted: set[int] = set()  # tensors computed from the group's reduced results

    def close() -> None:
        out.update(dict.fromkeys(group, max(syncs[t] for t in group) + after))

    for i in range(min(made_at), max(made_at) + 1):
        e = program.eqns[i]
        depends = any(t in tainted for t in e.inputs if t is not None)
        if i in made_at:
            if depends or len(group) + len(made_at[i]) > limit:
                close()
                group, tainted = [], set()
            group.extend(made_at[i])
            tainted.update(e.outputs)
        elif depends:
            tainted.update(e.outputs)
    close()
    return out


def after_sync(
    ng,
    producer: Mapping[int, int],
    position: Sequence[int],
    fused_into: Mapping[int, Sequence[int]],
    combine_at: Mapping[int, float],
    ready_after: float,
    group_of: Mapping[int, int],
) -> dict[int, float]:
    """Equations that read a reduced gradient (directly or through a chain: its transpose, a
    cast, the optimizer's update) -> their position after the combined all-reduce, where XLA:CPU
    runs them: ``ready_after`` past the all-reduce (``combine_at``: gradient -> where its
    combined all-reduce runs), in program order; a parameter's update fusion (``group_of``:
    equation -> its fusion, from `scheduled_updates`) runs whole at its first equation's place.
    What `scheduled_updates` fused into a moved update goes with it. ``producer``: tensor ->
    the equation making it. Runs on every assignment priced."""
    if not combine_at:
        return {}
    eqns = ng.program.eqns
    # node -> where its reduced results are ready: after the all-reduce, which runs between
    # equations (``combine_at`` holds fractional positions)
    synced = {ng.node_of_tensor[t]: at + ready_after for t, at in combine_at.items()}
    ready: dict[int, float] = {}  # tensor -> where it is ready, where later than made
    out: dict[int, float] = {}
    first: dict[int, int] = {}  # update fusion -> its first equation
    for i, g in group_of.items():
        first[g] = min(first.get(g, i), i)
    for i in range(min(producer[t] for t in combine_at), len(eqns)):
        at = position[i]
        for t in eqns[i].inputs:
            if t is not None:
                at = max(at, synced.get(ng.node_of_tensor.get(t), -1), ready.get(t, -1))
        if at > position[i]:
            ready.update(dict.fromkeys(eqns[i].outputs, at))
            out[i] = max(at, first[group_of[i]] if i in group_of else i)
    for i in sorted(fused_into, reverse=True):
        if any(j in out for j in fused_into[i]):
            out[i] = min(out.get(j, position[j]) for j in fused_into[i])
    return out


def update_fusions(program, phases: Sequence[str]) -> tuple[list[list[int]], frozenset[int]]:
    """The optimizer's equations (after the backward pass begins, outside loops), as XLA
    fuses them: groups connected through computed values (one parameter's update: its
    moments, their corrections, the new value; a global norm joins them all), and those that
    read no computed value (``free``). ``phases``: each equation's phase from its name stack."""
    start = next((i for i, ph in enumerate(phases) if ph == BACKWARD), None)
    if start is None:
        return [], frozenset()
    producer = {t: e.index for e in program.eqns for t in e.outputs}
    update = [
        i for i in range(start, len(program.eqns))
        if phases[i] == UPDATE and program.eqns[i].region < 0
    ]  # fmt: skip
    members = set(update)
    free: set[int] = set()
    parent = {i: i for i in update}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in update:
        sources = [producer[t] for t in program.eqns[i].inputs if t is not None and t in producer]
        if all(j in free for j in sources):
            free.add(i)
            continue
        for j in sources:
            if j in members and j not in free:
                parent[root(j)] = root(i)
    groups: dict[int, list[int]] = {}
    for i in update:
        if i not in free:
            groups.setdefault(root(i), []).append(i)
    return list(groups.values()), frozenset(free)


def recomputed_in_backward(
    program,
    node_of: Mapping[int, int],
    readers: Mapping[int, Sequence[int]],
    generated: frozenset[int],
    small: frozenset[int] = frozenset(),
) -> tuple[set[int], dict[int, tuple[set[int], set[int]]]]:
    """Which forward values XLA:CPU keeps for the backward pass, and which it recomputes there:
    (kept, {value: (the tensors its elementwise chain starts from, which the backward then
    reads instead; the backward equations that read it)}). ``readers``: tensor -> the
    equations reading it; ``node_of``: tensor -> its planning node; ``generated``: the
    program's `generated_tensors`; ``small``: the `spreading_values` under YNN_MIN_ELEMENTS
    per device in the plan priced.

    XLA does not fuse across the forward/backward boundary, while `nodes` gives forward nodes
    elementwise followers from the backward pass (batch norm's gradient of ``mean(x**2)``
    reads ``2 * x``). XLA duplicates a cheap elementwise value into every reader that fuses
    it, so a forward value that backward equations read is recomputed when they all fuse it
    and its chain holds no op XLA does not duplicate (`EXPENSIVE`); the backward then reads
    the tensors its chain starts from. A chain that broadcasts a statistic (batch norm's
    ``x - mean``) is also read by a reduction of the backward pass (the scale's gradient): a
    YNNPACK fusion that reads it from memory, unless it is small. Otherwise the value is kept.
    Measured against XLA:CPU's buffer assignment (docs/memory.md, "Memory"): GELU's
    ``1 + tanh`` is recomputed from its kept ``tanh``; batch norm's ``2 * x`` from the
    convolution's result, its ``x - mean`` kept at 16 images per device and recomputed at 2.
    Values are decided in program order, each after those it is computed from."""
    kept, recomputed, _ = _decide_recompute(
        program, node_of, readers, generated, _statistics(program), small
    )
    return kept, recomputed


def spreading_values(
    program,
    node_of: Mapping[int, int],
    readers: Mapping[int, Sequence[int]],
    generated: frozenset[int],
) -> frozenset[int]:
    """The values `recomputed_in_backward` keeps or recomputes by their size per device: cheap,
    read by fusing backward equations, their chain broadcasting a statistic. A value's chain
    reaches further back where the values it starts from are recomputed, so these are the
    values of the decisions with all of them small (a fixed point)."""
    statistics = _statistics(program)
    out: frozenset[int] = frozenset()
    while True:
        more = out | _decide_recompute(program, node_of, readers, generated, statistics, out)[2]
        if more == out:
            return out
        out = more


def _decide_recompute(program, node_of, readers, generated, statistics, small):
    """(kept, recomputed, spreading) for one set of ``small`` values."""
    producer = {t: e for e in program.eqns for t in e.outputs}
    forward = [phase_of(e.name_stack) == FORWARD for e in program.eqns]
    invars = set(program.invars)
    kept: set[int] = set()
    recomputed: dict[int, tuple[set[int], set[int]]] = {}
    spreading: set[int] = set()
    for t in sorted(readers, key=lambda t: producer[t].index if t in producer else -1):
        e = producer.get(t)
        if e is None or t in generated or not forward[e.index]:
            continue
        late = {at for at in readers[t] if not forward[at]}
        if not late:
            continue
        if e.primitive not in FUSIBLE or t not in node_of:
            kept.add(t)
            continue
        roots, chain = _chain_roots(program, t, node_of, producer, generated, kept)
        fused = all(program.eqns[at].primitive in FUSING_READERS for at in late)
        cheap = not any(producer[x].primitive in EXPENSIVE for x in chain)
        spread = {v for x in chain for v in _spread(program, producer[x], generated)}
        if fused and cheap and spread:
            if spread & statistics:  # a mean, not a bias
                spreading.add(t)
            fused = t in small
        if fused and cheap:
            recomputed[t] = (roots - invars, late)
        else:
            kept.add(t)
    return kept, recomputed, frozenset(spreading)


def _spread(program, e, generated) -> list[int]:
    """The computed values ``e`` broadcasts (explicitly, or as an operand with fewer elements
    than its result): XLA:CPU materializes values computed so rather than recompute them."""
    tensors = program.tensors
    computed = [t for t in e.inputs if t is not None and t not in generated and tensors[t].shape]
    if e.primitive == "broadcast_in_dim":
        return computed
    return [t for t in computed if tensors[t].size < tensors[e.outputs[0]].size]


def _statistics(program) -> frozenset[int]:
    """Reductions' results and what elementwise ops and views compute from them (a mean, a
    variance's reciprocal square root; not a bias reshaped for its add)."""
    out: set[int] = set()
    for e in program.eqns:
        if e.primitive in REDUCTIONS or (
            e.primitive in FUSIBLE | VIEWS and any(t in out for t in e.inputs)
        ):
            out.update(e.outputs)
    return frozenset(out)


def _chain_roots(program, t, node_of, producer, generated, kept) -> tuple[set[int], set[int]]:
    """Where the elementwise chain in ``t``'s node that ends at ``t`` starts (tensors from
    other nodes or arguments, unfused results, kept values), and the chain's computed tensors.
    Generated tensors and constants start nothing: XLA recomputes them in their readers."""
    node = node_of[t]
    roots, seen, stack = set(), {t}, [t]
    while stack:
        x = stack.pop()
        if x in generated or x in program.consts:
            continue
        e = producer.get(x)
        outside = e is None or node_of.get(x) != node
        if x != t and (outside or e.primitive not in FUSIBLE or x in kept):
            roots.add(x)
            continue
        for y in e.inputs:
            if y is not None and y not in seen:
                seen.add(y)
                stack.append(y)
    return roots, (seen - roots - generated) & producer.keys()


def reshard_in_flight(nbytes: int, have, want, sizes: Sequence[int]) -> float:
    """Bytes per device a reshard of a ``nbytes`` tensor from layout ``have`` to ``want`` holds
    beside its source at its busiest point (its result included), as XLA:CPU's buffer
    assignment holds them: a step's output, beside its input when an earlier step made it; an
    all-to-all its operand beside the pieces cut from it, then the pieces received beside
    their concatenation (the same bytes); a path whose last collective moves a dim other than
    the first ends with a copy back to row-major beside that collective's output
    (`reshard.local_kernels`; the producer writes the collective's layout itself)."""
    peak = 0.0
    steps = reshard_path(nbytes, have, want, tuple(sizes)) if nbytes else ()
    for k, step in enumerate(steps):
        before = nbytes / shard_count(step.before, sizes)
        after = nbytes / shard_count(step.after, sizes)
        if step.kind == ALL_TO_ALL:
            held = 2 * before
        else:
            held = (before if k else 0.0) + after
            if k == len(steps) - 1 and step.kernels:
                held = max(held, 2 * after)
        peak = max(peak, held)
    return peak


def merged_reshard_steps(
    nbytes: int, have, wants: Sequence, late: set, sizes: Sequence[int]
) -> dict:
    """Of the copies in layouts ``wants`` of one tensor in layout ``have``, those only the
    backward pass reads (``late``) whose reshard path starts with steps of the path of a copy
    the forward pass reads, ending short of that copy -> the layout those steps make. XLA's CSE
    merges the shared steps, keeps their result from the forward pass to the backward read and
    runs the rest there (the small GPT's OWT plan keeps its layer norms' outputs gathered on
    one axis); where the shared steps make the forward copy itself, it does not keep it."""
    paths = {w: [s.after for s in reshard_path(nbytes, have, w, tuple(sizes))] for w in wants}
    out = {}
    for w in late:
        best = 0
        for v in wants:
            if v in late:
                continue
            k = 0
            while k < min(len(paths[w]), len(paths[v])) and paths[w][k] == paths[v][k]:
                k += 1
            if k < len(paths[v]):  # an intermediate of that reshard, not its copy
                best = max(best, k)
        if best and paths[w][best - 1] != w:
            out[w] = paths[w][best - 1]
    return out


BARRIER = "optimization_barrier"


def cse_after_barriers(program) -> dict[int, int]:
    """XLA:CPU's undoing of rematerialization: recomputed tensor -> the tensor of the same value
    computed first.

    `jax.checkpoint` recomputes a block in the backward pass from its inputs passed through an
    optimization barrier, so that XLA's common-subexpression elimination cannot merge the
    recomputation with the forward pass. GPU and TPU keep the barrier until after CSE and the
    recomputation runs (measured on an H100: bench/memory/results/memory_device_h100.md). XLA:CPU
    drops it first: CSE merges every recomputed value with its forward twin, and the backward
    pass reads the forward pass's buffers as if there were no remat (a remat'd Llama on one CPU
    device: the same temporary bytes with and without remat). Here the barrier is transparent,
    and an equation whose primitive, params, literals and (transparent) inputs equal an
    earlier one's, with an input that came through a barrier or a merged tensor, is merged
    (duplicates made from no data, such as a mask's iotas, are followed but not returned: XLA
    fuses them anyway). A barrier's outputs are returned too: XLA:CPU has removed it. So are a
    ``device_put``'s: XLA:CPU lowers a move to host memory and back to the identity.
    """
    same: dict[int, int] = {}  # tensor -> its earlier twin (barriers: their operand)
    seen: dict[tuple, tuple[int, ...]] = {}
    for t, value in program.consts.items():  # XLA merges equal constants
        try:
            array = np.asarray(value)
            first = seen.setdefault(("const", _frozen(array)), (t,))
        except (TypeError, ValueError):
            continue
        if first[0] != t:
            same[t] = first[0]
    merged: dict[int, int] = {}
    for e in program.eqns:
        if e.primitive in (BARRIER, "device_put") and len(e.inputs) == len(e.outputs):
            for src, out in zip(e.inputs, e.outputs, strict=True):
                if src is not None:
                    same[out] = merged[out] = same.get(src, src)  # the barrier is gone
            continue
        inputs = tuple(None if t is None else same.get(t, t) for t in e.inputs)
        try:
            key = (e.primitive, inputs, _frozen(e.literals), _frozen(e.params))
            hash(key)
        except TypeError:  # params XLA would compare and we cannot: no merge
            continue
        first = seen.setdefault(key, e.outputs)
        if first is e.outputs:
            continue
        derived = inputs != e.inputs  # reads a barrier's output or a merged tensor
        if derived or not any(t is not None for t in e.inputs):  # or made from no data
            for out, twin in zip(e.outputs, first, strict=True):
                same[out] = twin
                if derived:
                    merged[out] = twin
    return merged


def _frozen(value):
    """A hashable stand-in for an equation's params or literals (arrays by content)."""
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if hasattr(value, "tobytes") and hasattr(value, "shape"):  # numpy arrays and scalars
        return ("array", value.shape, str(value.dtype), value.tobytes())
    return value
