"""Where each tensor of a train step is made and read: the memory model's per-program part.

`BufferReads` holds what the liveness walk (`memory.MemoryModel`) needs that no assignment
changes: each tensor's reads and where they end (a read inside a loop of a tensor made outside
it lasts the loop), where XLA:CPU schedules each equation (`buffers.scheduled_updates`), which
forward values it keeps for the backward pass or recomputes there
(`buffers.recomputed_in_backward`, per set of small values), views that take their operand's
buffer over, and per tensor its birth, phase and outside reads (`BufferReads._static`). The
rules themselves are in docs/memory.md, "Memory", and `memory`'s docstring.

Pure: numpy only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from ..cost.search_tables import EdgeUse
from ..nodes.configs import Config
from ..nodes.planning_nodes import NodeGraph
from ..program.graph import BACKWARD, FORWARD, SCAN_SLICE, UPDATE, phase_of
from ..xla.buffer_assignment import (
    FUSIBLE,
    FUSING_READERS,
    HALF_FLOATS,
    IN_PLACE,
    UPCAST_READERS,
    VIEWS,
    cse_after_barriers,
    generated_tensors,
    recomputed_in_backward,
    scheduled_updates,
    spreading_values,
    transposed_operands,
)  # fmt: skip

# the layout changes and casts of a parameter XLA:CPU makes at the step's start
PARAM_LAYOUTS = frozenset({"transpose", "rev", "convert_element_type", "reshape", "squeeze"})


@dataclasses.dataclass(frozen=True)
class MemoryInputs:
    """What the model needs besides the assignment."""

    ng: NodeGraph
    configs: Sequence[Sequence[Config]]
    uses: Sequence[EdgeUse]
    sizes: Sequence[int]
    feedback: Mapping[int, int]  # state result -> argument it becomes
    arg_kinds: Mapping[int, str]  # argument tensor -> one of ARG_KINDS
    donated: frozenset[int]  # argument tensors whose buffers the step may reuse
    grad_sync: Callable[[int, Config], bool]  # node, config -> reduces gradients over the batch
    combine_syncs: bool  # the backend combines gradient all-reduces (CPU)
    # XLA:CPU's buffers (16-bit dots in float32); None: the same as ``combine_syncs``
    cpu: bool | None = None
    # loops whose gathers of xs slices XLA's collective pipeliner runs an iteration ahead
    pipelined: frozenset[int] = frozenset()


class BufferReads:
    """Where each tensor of a program is made and read, and what of its buffers no assignment
    changes: the part of the memory model built once per program (`MemoryModel` walks it for
    each assignment)."""

    # what `_reads_for` builds for one set of small values, which `_select_reads` swaps in
    _READ_STATE = (
        "reads", "read_at", "reads_twin", "kept_for_backward", "long_lived", "_statics",
        "view_of", "order",
    )  # fmt: skip

    def __init__(self, inputs: MemoryInputs):
        self.inp = inputs
        ng = inputs.ng
        program = ng.program
        self.n_eqns = len(program.eqns)
        self.end = self.n_eqns  # results are read "after all"
        self.producer_eqn: dict[int, int] = {}
        for e in program.eqns:
            for t in e.outputs:
                self.producer_eqn[t] = e.index
        self.cpu = inputs.combine_syncs if inputs.cpu is None else inputs.cpu
        self.outvar_set = {t for t in program.outvars if t is not None}
        self.phase_of_eqn = [ng.nodes[ng.node_of_eqn[e.index]].phase for e in program.eqns]
        self.label_of_eqn = [ng.nodes[ng.node_of_eqn[e.index]].label for e in program.eqns]
        self.fused_into: dict[int, list[int]] = {}  # update equation reading no computed value
        self.update_group: dict[int, int] = {}  # update equation -> its fusion (on CPU)
        self.position = self._schedule() if self.cpu else list(range(self.n_eqns))
        # XLA:CPU merges remat's recomputations with the forward pass (`cse_after_barriers`):
        # their readers read the forward tensor, and the merged equations' own reads go
        merged = cse_after_barriers(program) if self.cpu else {}
        self._merged = {t: f for t, f in merged.items() if t not in self.outvar_set}
        # results of contractions, reductions, gathers...: XLA fuses elementwise chains
        # (`nodes` groups them) but not into these producers, so they are buffers
        self.unfused = {t: e.primitive not in FUSIBLE for e in program.eqns for t in e.outputs}
        self.generated = generated_tensors(program)
        self.transposed = transposed_operands(program) if self.cpu else frozenset()
        self._nbytes: dict[int, int] = {}
        self.invar_set = set(program.invars)
        # xs slices of pipelined loops -> the loop's first and last positions: a gathered copy
        # of one is made an iteration ahead, so the next iteration's lives through the body
        self.prefetched: dict[int, tuple[int, int]] = {}
        for node in ng.nodes:  # the slice's node: with its followers (a cast)
            anchor = program.eqns[node.anchor].primitive if node.anchor >= 0 else None
            if node.region in inputs.pipelined and anchor == SCAN_SLICE:
                region = program.regions[node.region]
                span = (self.position[region.first], self.position[region.end - 1])
                self.prefetched.update(dict.fromkeys(node.tensor_maps, span))
        # XLA:CPU makes the casts, transposes and reversals of parameters (a kernel reversed
        # for the backward convolution) at the step's start
        self.from_params: set[int] = set()
        if self.cpu:
            ready = {t for t in program.invars if inputs.arg_kinds.get(t) == "params"}
            ready |= set(program.consts)
            for e in program.eqns:
                if (
                    e.primitive in PARAM_LAYOUTS
                    and self.phase_of_eqn[e.index] != UPDATE
                    and e.inputs[0] in ready
                ):
                    ready.update(e.outputs)
                    self.from_params.update(e.outputs)
        # the reads XLA's fusion leaves, per set of values small enough that a reduction
        # recomputes them (`buffers.recomputed_in_backward`); the walk selects its plan's
        self._read_sets: dict[frozenset[int], dict] = {}
        self._small: frozenset[int] | None = None
        self.spreading: frozenset[int] = frozenset()
        self._select_reads(frozenset())

    def _select_reads(self, small: frozenset[int]) -> None:
        """Point the model at the reads (and what follows from them: which forward values are
        kept, which buffers are long-lived, views, order) of a plan in which the values in
        ``small`` are below `YNN_MIN_ELEMENTS` per device. Built once per set."""
        if small == self._small:
            return
        if small not in self._read_sets:
            self._read_sets[small] = self._reads_for(small)
        vars(self).update(self._read_sets[small])
        self._small = small

    def _reads_for(self, small: frozenset[int]) -> dict:
        ng, program, merged = self.inp.ng, self.inp.ng.program, self._merged
        gone = {e.index for e in program.eqns if e.outputs and all(t in merged for t in e.outputs)}
        self.reads: dict[int, list[EdgeUse]] = {}
        self.read_at: dict[EdgeUse, int] = {}
        self.reads_twin: set[int] = set()  # forward tensors read in place of a recomputation
        for u in self.inp.uses:
            if u.order[0] in gone:
                continue
            self.read_at[u] = self._read_position(u)
            if u.tensor in merged:
                self.reads_twin.add(merged[u.tensor])
            self.reads.setdefault(merged.get(u.tensor, u.tensor), []).append(u)
        self.kept_for_backward = self._recompute_in_backward(small) if self.cpu else set()
        # buffers read in a later phase, or inside a loop from outside it (live through it)
        kept = [u for us in self.reads.values() for u in us]
        self.long_lived = (
            long_lived_tensors(ng, kept)
            | {u.tensor for u in kept if self.read_at[u] > u.order[0]}
            | {t for t in self.reads_twin if self._phase_of(t) == FORWARD}
        )
        self._statics: dict[int, tuple | None] = {}
        # tensor -> the view of it that takes over its buffer (its only reader is the view)
        self.view_of: dict[int, int] = {}
        for e in program.eqns:
            src, out = (e.inputs[0] if e.inputs else None), e.outputs[0]
            if e.primitive not in VIEWS | IN_PLACE or src is None or src in self.invar_set:
                continue
            reads = self.reads.get(src, [])
            only = reads and all(u.order[0] == e.index for u in reads)
            if only and out in self.reads and out not in self.outvar_set:
                self.view_of[src] = out
        # tensors in the order of their producing equations (a view after its operand)
        self.order = sorted(self.reads, key=lambda t: self.producer_eqn.get(t, -1))
        return {k: getattr(self, k) for k in self._READ_STATE}

    def _schedule(self) -> list[int]:
        """Where each equation runs (`buffers.scheduled_updates`): the optimizer's as their
        gradients exist, forward convolutions as their operands exist, the rest in program
        order."""
        inp, program = self.inp, self.inp.ng.program
        phases = [phase_of(e.name_stack) for e in program.eqns]
        last_read: dict[int, int] = {}
        for u in inp.uses:
            at = u.order[0]
            if u.tensor in inp.donated and at < self.n_eqns and phases[at] != UPDATE:
                last_read[u.tensor] = max(last_read.get(u.tensor, 0), at)
        made = self.producer_eqn
        writes = {made[t]: arg for t, arg in inp.feedback.items() if t in made}
        position, self.update_group, self.fused_into = scheduled_updates(
            program, phases, last_read, writes
        )
        # XLA's scheduler runs a forward convolution as soon as its operands exist: a residual
        # block's projection beside the block's first convolution, so that the block's input
        # (or its gathered copy) dies there (the small CNN's model-parallel plan: 1.102 -> 1.065)
        for e in program.eqns:
            if e.primitive == "conv_general_dilated" and phases[e.index] == FORWARD:
                ready = [position[made[t]] for t in e.inputs if t is not None and t in made]
                position[e.index] = min(position[e.index], max(ready, default=0))
        return position

    def _recompute_in_backward(self, small: frozenset[int]) -> set[int]:
        """The forward values XLA:CPU keeps for the backward pass (`recomputed_in_backward`);
        the backward reads of those it recomputes become reads of their chains' roots."""
        ng = self.inp.ng
        end = self.end
        readers = {t: [u.order[0] for u in us if u.order[0] < end] for t, us in self.reads.items()}
        if not small:  # the base reads: which values each plan's sizes decide
            self.spreading = spreading_values(
                ng.program, ng.node_of_tensor, readers, self.generated
            )
        kept, recomputed = recomputed_in_backward(
            ng.program, ng.node_of_tensor, readers, self.generated, small
        )
        for t, (roots, late_eqns) in recomputed.items():
            late = [u for u in self.reads[t] if u.order[0] in late_eqns]
            self.reads[t] = [u for u in self.reads[t] if u.order[0] not in late_eqns]
            for r in roots:
                for u in late:
                    read = self._read_of_root(r, t, u)
                    if read is not None:
                        self.read_at[read] = self._read_position(read)
                        self.reads.setdefault(r, []).append(read)
        return kept

    def _read_of_root(self, r: int, t: int, u: EdgeUse) -> EdgeUse | None:
        """The read ``u`` of the recomputed ``t`` as a read of ``r``, a root of its chain: in
        the reader's layout when the two have one shape, else in the layout ``t``'s node
        reads ``r`` in."""
        ng = self.inp.ng
        node = ng.node_of_tensor[t]
        own = next((v for v in self.reads.get(r, ()) if v.dst == node), None)
        if ng.program.tensors[r].shape == ng.program.tensors[t].shape and r in ng.node_of_tensor:
            src_map = own.src_map if own is not None else u.src_map
            return dataclasses.replace(u, src=ng.node_of_tensor[r], tensor=r, src_map=src_map)
        return dataclasses.replace(own, order=u.order) if own is not None else None

    def _made_at(self, t: int) -> int:
        """Where ``t`` is produced (its equation's position; -1 for an argument)."""
        return self.position[self.producer_eqn[t]] if t in self.producer_eqn else -1

    def _phase_of(self, t: int) -> str:
        """The phase of the node producing ``t`` (update for tensors of no node)."""
        node = self.inp.ng.node_of_tensor.get(t)
        return self.inp.ng.nodes[node].phase if node is not None else UPDATE

    def _read_position(self, u: EdgeUse) -> int:
        """Where a read ends the tensor's life: its equation, or, for a read inside a loop of a
        tensor made outside it, the loop's last equation (every iteration reads it)."""
        program = self.inp.ng.program
        at = self.position[u.order[0]] if u.order[0] < self.n_eqns else u.order[0]
        for loop in program.region_chain(self.inp.ng.nodes[u.dst].region):
            if loop == u.context:
                break
            at = max(at, program.regions[loop].end - 1)
        return at

    def _static(self, t: int, reads: Sequence[EdgeUse]) -> tuple | None:
        """What of ``t``'s buffers does not depend on the assignment (cached): None when it
        has none, else (is_arg, born, phase, reads outside its node as (at, reader, map))."""
        if t in self._statics:
            return self._statics[t]
        ng = self.inp.ng
        tensor = ng.program.tensors[t]
        out = None
        if not (tensor.opaque or not tensor.nbytes or not tensor.shape or t in ng.program.consts):
            is_arg = t in self.invar_set
            born = -1 if is_arg or t in self.from_params else self._made_at(t)
            src = ng.node_of_tensor.get(t)
            phase = self._phase_of(t)
            own = src is not None and (
                self.unfused.get(t, False)
                or len({self.read_at[u] for u in reads}) > 1
                or t in self.reads_twin
                or t in self.kept_for_backward
            )
            external = tuple(
                self._external_read(t, u)
                for u in reads
                if (u.dst != src or u.order[0] >= self.end or own)
                and not (t in self.generated and self._fuses(u))
                and not self._fused_update(t, u)
            )
            fused = tuple(  # computed inside the reader, unless it reads a resharded copy
                (self.read_at[u], u.dst, u.dst_map, u.order[0])
                for u in reads
                if self._fused_update(t, u) and u.order[0] < self.end
            )
            made_by = self.producer_eqn.get(t, -1) if born >= 0 else -1
            out = (is_arg, born, phase, external, made_by, fused)
        self._statics[t] = out
        return out

    def _external_read(self, t: int, u: EdgeUse) -> tuple:
        """(where, reader node, its map, upcast, transposed, reading equation)."""
        at = min(self.read_at[u], self.end)
        return (at, u.dst, u.dst_map, self._upcast(t, u), u.order in self.transposed, u.order[0])

    def _fused_update(self, t: int, u: EdgeUse) -> bool:
        """Whether ``u`` reads an update's value of no computed input (a decayed moment),
        which XLA computes inside its readers."""
        made = self.producer_eqn.get(t, -1)
        return not self.unfused.get(t, True) and u.order[0] in self.fused_into.get(made, ())

    def _fuses(self, u: EdgeUse) -> bool:
        """Whether XLA fuses the computation of a broadcast or iota into the reader ``u``."""
        eqns = self.inp.ng.program.eqns
        return u.order[0] < self.end and eqns[u.order[0]].primitive in FUSING_READERS

    def _upcast(self, t: int, u: EdgeUse) -> bool:
        """Whether the read ``u`` of ``t`` takes a float32 copy (a 16-bit dot on XLA:CPU)."""
        program = self.inp.ng.program
        return (
            self.cpu
            and program.tensors[t].dtype in HALF_FLOATS
            and u.order[0] < self.end
            and program.eqns[u.order[0]].primitive in UPCAST_READERS
        )


def long_lived_tensors(ng: NodeGraph, uses: Sequence[EdgeUse]) -> frozenset[int]:
    """Tensors read in a later phase than the one producing them (forward -> backward,
    backward -> update): the buffers that pile up towards the peak."""
    rank = {FORWARD: 0, BACKWARD: 1, UPDATE: 2}
    out = set()
    for u in uses:
        src, dst = ng.nodes[u.src], ng.nodes[u.dst]
        if src.anchor >= 0 and rank.get(dst.phase, 2) > rank.get(src.phase, 2):
            out.add(u.tensor)
    return frozenset(out)
