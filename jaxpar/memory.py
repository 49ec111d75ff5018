"""Memory per device of a train step under a plan: arguments, results, and live buffers.

The model (docs/design.md, "Memory"), per device:

    peak = arguments + results not aliased to a donated argument + max over program points of
           the bytes of live intermediate buffers

as XLA's `memory_analysis()` reports it (argument + output − alias + temp). Buffers:

- A tensor is a buffer when a node other than its producer reads it, or it is a result: the
  members of one node (an anchor and its elementwise followers) fuse, as XLA fuses them. Its
  bytes are its size over the shard count of its producer's layout.
- A resharded copy is a buffer from its first reader to its last: `apply` emits each reshard
  once per (tensor, before, after) and XLA's CSE merges repeated ones, so a parameter gathered
  for the forward pass stays gathered until the backward pass reads it, unless remat
  recomputes it behind an optimization barrier (`trace` keeps `jax.checkpoint`'s barrier).
  XLA:CPU (``cpu``) schedules each reshard as soon as its source exists (every all-gather of
  a 2-layer llama3_70b-width step within 8 instructions of its operand, though read hundreds
  later): there a forward tensor's copy that only the backward pass reads lives from the
  tensor's production, and a parameter's copies, casts, transposes and reversals from the
  step's start, where XLA:CPU makes them (`_eager`, `from_params`). XLA:CPU also drops the
  barrier and merges remat's recomputation with the forward pass (`buffers.cse_after_barriers`).
- A buffer lives from the equation producing it to its last reader, in program order. A view
  (transpose, reshape) of a buffer whose only reader it is takes that buffer over (XLA makes it
  a bitcast, or folds it into the producer's layout), as does an in-place update (scatter,
  dynamic_update_slice) of its operand.
- Tensors computed from no data (iotas, broadcast literals, masks made of them) are recomputed
  inside each elementwise reader, as XLA fuses them; only non-fusing readers store them.
- XLA:CPU (``cpu``) does not fuse across the forward/backward boundary: a forward elementwise
  value the backward pass reads is kept until then, or recomputed there when its chain is cheap
  (`buffers.recomputed_in_backward`; a chain broadcasting a statistic only where it is under
  `buffers.YNN_MIN_ELEMENTS` per device, so each plan's sizes select its reads).
- XLA:CPU (``cpu``) runs a convolution on (batch, spatial..., feature) inputs and (spatial...,
  in, out) kernels: a kernel gradient reads transposed copies of its stored activation and
  output gradient, made with them (an argument's at the step's start), an input gradient one
  of its kernel (`buffers.transposed_operands`).
- XLA:CPU (``cpu``) runs each parameter's update as soon as its gradient exists, and one
  that overwrites a donated argument not before that argument's last read
  (`buffers.scheduled_updates`); an update of an all-reduced gradient runs after the
  combined all-reduce, in program order, as does everything else reading a reduced gradient
  (`buffers.after_sync`).
- XLA:CPU (``cpu``) runs dots and convolutions of 16-bit floats in float32: a bfloat16 buffer
  (or resharded copy) read by a dot is stored as float32 (twice the bytes; beside the bfloat16
  one when other readers need that), and the dot's float32 result lives until converted back.
- Gradient synchronization: where partial sums over the batch are all-reduced, the CPU backend
  combines them (`cpu-all-reduce-combiner`, no byte limit, 256 operands), so all of a group's
  reduced gradients and their inputs are live at the group's last one (``combine_syncs``). A
  GPU/TPU backend reduce-scatters a gradient that is only read in slices (sharded state) where
  it is produced.
- In a loop XLA's collective pipeliner runs (``pipelined``), the gathered copy of an xs slice
  (a layer's weights) is made an iteration ahead: the next iteration's copy lives through the
  whole body beside the current one.
- Arguments are live for the whole step; a donated state argument's buffer holds its new value.
- A result not aliased to a donated argument has an allocation of its own for the whole step;
  buffers that die before it is written live inside it, as XLA assigns them
  (`hosted_in_results`).

`MemoryModel` precomputes what does not depend on the assignment, so the budget search can price
many assignments. The Lagrangian proxy (`held.HeldBytes.node_bytes`) is linear in the node
configurations: argument bytes plus the buffers that cross the forward→backward boundary, hold
gradients or live through a loop, and any tensors the budget search adds (those live at the
peaks it saw: `estimate_with_peak`). A plan fits a budget when its predicted peak is at most the
budget less `MODEL_MARGIN`. Pure: numpy only.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from .buffers import (
    FUSIBLE,
    FUSING_READERS,
    HALF_FLOATS,
    IN_PLACE,
    UPCAST_READERS,
    VIEWS,
    YNN_MIN_ELEMENTS,
    Buffer,
    after_sync,
    combined_all_reduces,
    cse_after_barriers,
    generated_tensors,
    hosted_in_results,
    merged_reshard_steps,
    recomputed_in_backward,
    reshard_in_flight,
    scheduled_updates,
    spreading_values,
    transposed_operands,
)  # fmt: skip
from .collectives import ALL_GATHER
from .configs import Config, shard_count, spec_of
from .graph import BACKWARD, FORWARD, SCAN_SLICE, UPDATE, phase_of
from .memory_estimate import ARG_KINDS, CPU_MODEL_MARGIN, MODEL_MARGIN, MemoryEstimate
from .nodes import NodeGraph
from .reshard import SLICE, reshard_path
from .tables import EdgeUse

COMBINE_COUNT = 256  # operands per combined all-reduce on the CPU backend
# Positions in the liveness walk: equation i at i, a combined all-reduce after it at
# i + SYNC_AFTER, the equations reading its results (moved after it) at i + 2 * SYNC_AFTER
STEPS = 3
SYNC_AFTER = 1 / STEPS
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


class MemoryModel:
    """Liveness of a program's buffers; `estimate` prices one assignment."""

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

    def _bytes(self, t: int, spec) -> float:
        if t not in self._nbytes:
            tensor = self.inp.ng.program.tensors[t]
            self._nbytes[t] = 0 if tensor.opaque else tensor.nbytes
        nbytes = self._nbytes[t]
        return nbytes / shard_count(spec, self.inp.sizes) if nbytes else 0.0

    def estimate(self, assignment: Sequence[int], budget: float | None = None) -> MemoryEstimate:
        """Per-device memory of ``assignment`` (indices into each node's configurations)."""
        return self._walk(assignment, budget, None)[0]

    def estimate_with_peak(
        self, assignment: Sequence[int], budget: float | None = None
    ) -> tuple[MemoryEstimate, frozenset[int]]:
        """`estimate`, and the tensors with a buffer (or a resharded copy) live at its peak."""
        record: list[tuple[int, int, int]] = []
        estimate, at = self._walk(assignment, budget, record)
        live = frozenset(t for t, born, dies in record if max(born, 0) <= at <= max(dies, born))
        return estimate, live

    def _walk(
        self, assignment: Sequence[int], budget: float | None, record: list | None
    ) -> tuple[MemoryEstimate, int]:
        """The estimate and the equation at its peak; ``record`` (if given) receives
        (tensor, born, dies) of every buffer."""
        inp, ng = self.inp, self.inp.ng
        program = ng.program
        cfg = [inp.configs[v][a] for v, a in enumerate(assignment)]
        spec: dict[int, tuple] = {}
        for node in ng.nodes:
            for t, m in node.tensor_maps.items():
                spec[t] = spec_of(m, cfg[node.index])
        args = dict.fromkeys(ARG_KINDS, 0.0)
        for t in program.invars:
            args[inp.arg_kinds.get(t, "other")] += self._bytes(t, spec.get(t, ()))
        out_specs = {}
        for t in program.outvars:
            if t is not None:
                out_specs[t] = spec[inp.feedback[t]] if t in inp.feedback else spec.get(t, ())
        tensors = program.tensors
        self._select_reads(
            frozenset(
                t
                for t in self.spreading
                if tensors[t].size < YNN_MIN_ELEMENTS * shard_count(spec.get(t, ()), inp.sizes)
            )
        )
        syncs, sync_produced = self._sync_tensors(cfg)
        combine_at = (
            combined_all_reduces(program, syncs, COMBINE_COUNT, SYNC_AFTER)
            if inp.combine_syncs
            else {}
        )
        scattered = set() if inp.combine_syncs else sync_produced
        delayed = after_sync(
            ng, self.producer_eqn, self.position, self.fused_into, combine_at, SYNC_AFTER,
            self.update_group,
        )  # fmt: skip
        buffers: list[Buffer] = []

        # a reshard's in-flight bytes, per grid position: reshards run one at a time, so the
        # largest counts there, not their sum
        in_flight = np.zeros(STEPS * (self.n_eqns + 2))

        def registers(t: int) -> Callable[..., None]:
            def live(
                size: float, born: int, dies: int, phase: str, in_place: bool = True,
                flying: bool = False,
            ) -> None:  # fmt: skip
                if flying:  # held only while a reshard runs at ``born``
                    b = round(STEPS * max(born, 0))
                    in_flight[b] = max(in_flight[b], size)
                elif size > 0:
                    born = max(born, 0)
                    buffers.append(Buffer(size, born, max(dies, born), phase, t, in_place))

            return live

        inherited: dict[int, tuple[int, int | None]] = {}
        for t in self.order:
            self._tensor_buffers(
                t, self.reads[t], cfg, spec, out_specs, combine_at, scattered, inherited,
                delayed, registers(t),
            )  # fmt: skip
        own = [t for t in out_specs if not (t in inp.feedback and inp.feedback[t] in inp.donated)]
        # a node's results are one (multi-output) fusion: all written by its first one
        first: dict[int, int] = {}
        for t in own:
            if t in self.producer_eqn:
                v = ng.node_of_eqn[self.producer_eqn[t]]
                made = self.producer_eqn[t]
                first[v] = min(first.get(v, self.end), delayed.get(made, self._made_at(t)))
        results = [  # (bytes, equation writing it): an allocation of its own
            (self._bytes(t, out_specs[t]),
             first[ng.node_of_eqn[self.producer_eqn[t]]] if t in self.producer_eqn else 0)
            for t in own
        ]  # fmt: skip
        outputs = sum(size for size, _ in results)
        hosted = hosted_in_results(buffers, results)
        # positions are equations' and the combined all-reduces' between them: a grid of
        # STEPS points per equation
        n = STEPS * (self.n_eqns + 2)
        delta = np.zeros(n)
        kinds = {FORWARD: np.zeros(n), BACKWARD: np.zeros(n), UPDATE: np.zeros(n)}
        for i, (size, born, dies, phase, t, _) in enumerate(buffers):
            if i in hosted:
                continue
            b, d = round(STEPS * born), round(STEPS * dies) + 1
            delta[b] += size
            delta[d] -= size
            k = kinds.get(phase, kinds[UPDATE])
            k[b] += size
            k[d] -= size
            if record is not None:
                record.append((t, born, dies))
        profile = (np.cumsum(delta) + in_flight)[: STEPS * (self.n_eqns + 1)]
        at = int(np.argmax(profile)) if len(profile) else 0
        live_at = {k: float(np.cumsum(v)[at]) for k, v in kinds.items()}
        live_at[UPDATE] += float(in_flight[at])  # reported with the temporaries
        peak_live = float(profile[at]) if len(profile) else 0.0
        eq = min(at // STEPS, self.n_eqns - 1)
        estimate = MemoryEstimate(
            params=args["params"], optimizer=args["optimizer"], batch=args["batch"],
            other_args=args["other"], outputs=outputs, activations=live_at[FORWARD],
            gradients=live_at[BACKWARD], temporaries=live_at[UPDATE],
            peak=sum(args.values()) + outputs + peak_live,
            peak_phase=self.phase_of_eqn[eq] if self.n_eqns else "",
            peak_layer=self.label_of_eqn[eq] if self.n_eqns else "", budget=budget,
            margin=CPU_MODEL_MARGIN if self.cpu else MODEL_MARGIN,
        )  # fmt: skip
        return estimate, at / STEPS

    def _sync_tensors(self, cfg: Sequence[Config]) -> tuple[dict[int, int], set[int]]:
        """Of the gradient-sync nodes: their anchors' reduced results -> producing equation,
        and every tensor they produce (their followers too: a cast to fp32)."""
        anchors: dict[int, int] = {}
        produced: set[int] = set()
        for node in self.inp.ng.nodes:
            if node.anchor >= 0 and self.inp.grad_sync(node.index, cfg[node.index]):
                anchors.update(
                    dict.fromkeys(self.inp.ng.program.eqns[node.anchor].outputs, node.anchor)
                )
                produced.update(node.tensor_maps)
        return anchors, produced

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

    def _tensor_buffers(
        self, t, reads, cfg, spec, out_specs, combine_at, scattered, inherited, delayed, live
    ) -> None:
        """Register the buffers of tensor ``t``: the produced one and its resharded copies.

        A reduced gradient whose every reader takes a slice of it (the update of sharded
        state) is reduce-scattered where it is produced on GPU/TPU (XLA forms reduce-scatter
        from all-reduce + dynamic-slice): only the slices outlive the producing equation."""
        static = self._static(t, reads)
        if static is None:
            return
        is_arg, born, phase, external, made_by, fused = static
        born = delayed.get(made_by, born)
        have = spec.get(t, ())
        if t in self.generated:  # computed from no data: XLA makes it in its readers' layout
            wants = {spec_of(dst_map, cfg[dst]) for _, dst, dst_map, *_ in external}
            if len(wants) == 1:
                have = wants.pop()
        # an update of arguments alone (a decayed moment) read in another layout: XLA:CPU
        # computes and reshards it at the step's start, as it gathers parameters
        for at, dst, dst_map, eqn in fused:
            want = spec_of(dst_map, cfg[dst])
            if want != have and not self._slices_only(t, have, want):
                live(self._bytes(t, want), -1, delayed.get(eqn, at), phase)
        # XLA all-reduces a weight gradient before its transpose, and the update reads the
        # transpose: it cannot write its result in place over the reduced sum
        in_place = t not in inherited or made_by < 0
        in_place = in_place or self.inp.ng.program.eqns[made_by].primitive != "transpose"
        if t in inherited:  # a view of a buffer that ends at the view: that buffer goes on
            born, synced_at = inherited.pop(t)
        else:
            synced_at = combine_at.get(t)
        copies: dict[tuple, list[tuple[int, bool, bool]]] = {}
        direct: list[tuple[int, bool, bool]] = []
        # a transposed copy for a convolution is made of a stored buffer: an argument, an
        # unfused result or a resharded copy (XLA fuses it into an elementwise producer)
        stored = is_arg or self.unfused.get(t, False)
        for at, dst, dst_map, upcast, turned, eqn in external:
            at = delayed.get(eqn, at)
            want = spec_of(dst_map, cfg[dst])
            if want == have or at >= self.end:
                direct.append((at, upcast, turned and stored))
            else:
                copies.setdefault(want, []).append((at, upcast, turned))
        last_direct = max([born] + [at for at, _, _ in direct])
        scatter = (
            t in scattered
            and copies
            and last_direct == born
            and all(self._slices_only(t, have, want) for want in copies)
        )
        nbytes, shared = self.inp.ng.program.tensors[t].nbytes, {}
        if self.cpu and len(copies) > 1:
            late = {w for w, reads in copies.items() if self._backward_only(reads)}
            shared = merged_reshard_steps(nbytes, have, list(copies), late, self.inp.sizes)
        for want, reads in copies.items():
            # XLA:CPU reshards eagerly, right after the source (module docstring)
            eager = scatter or self._eager(t, phase, reads)
            first = born if eager else min(r[0] for r in reads)
            if eager and want in shared and not scatter:
                # XLA merges the steps this reshard shares with a forward one and keeps their
                # result until this copy's first read, where it runs the rest
                first = min(r[0] for r in reads)
                live(self._bytes(t, shared[want]), born, first, phase)
            last_direct = max(last_direct, first)  # the copy is made from the original
            self._buffer(self._bytes(t, want), first, reads, phase, live)
            if t in self.prefetched and self._gathers_only(t, have, want):
                live(self._bytes(t, want), *self.prefetched[t], phase)  # the next iteration's
            if self.cpu and not scatter:
                in_flight = reshard_in_flight(nbytes, have, want, self.inp.sizes)
                live(max(in_flight - self._bytes(t, want), 0.0), first, first, phase, flying=True)
        if t in self.producer_eqn and self.cpu and self._half(t):
            e = self.inp.ng.program.eqns[self.producer_eqn[t]]
            if e.primitive in UPCAST_READERS:  # the float32 result, converted back at once
                live(2 * self._bytes(t, have), born, born, phase)
        if is_arg:  # counted whole; a float32 copy for 16-bit dots on XLA:CPU
            dots = [at for at, up, turned in direct if up and not turned]
            if dots:
                live(2 * self._bytes(t, have), min(dots), max(dots), phase)
            turned = [at for at, _, tr in direct if tr]
            if turned:  # made at the step's start, as XLA:CPU makes a parameter's layouts
                live(self._bytes(t, have), born, max(turned), phase)
            return
        if not external:
            return  # a tensor read only in its node is fused
        if self._fused_where_made(t, direct, copies, external, born):
            return
        if t in self.outvar_set and out_specs.get(t) == have:
            return  # the produced buffer is the result (counted as an output)
        size = self._bytes(t, have)
        view = self.view_of.get(t)
        if (
            view is not None
            and len(direct) == 1
            and not (direct[0][1] or direct[0][2])
            and self._bytes(view, spec.get(view, ())) == size
        ):
            inherited[view] = (born, synced_at)  # the view's buffer is this one
            return
        if synced_at is not None:
            at = synced_at
            live(size, born, at, phase)  # the partial sum, until the combined all-reduce
            reduced = functools.partial(live, in_place=in_place)  # the reduced sum
            self._buffer(size, at, [(max(a, at), *r) for a, *r in direct], phase, reduced)
        else:
            self._buffer(size, born, direct, phase, live)

    def _fused_where_made(self, t: int, direct, copies, external, born: float) -> bool:
        """Whether XLA fuses elementwise ``t`` into its readers: every read is elementwise, in
        its own layout, where ``t`` is made (a learning rate's product, made with the weight
        gradient, into the weight update scheduled there)."""
        eqns = self.inp.ng.program.eqns
        return (
            self.cpu
            and not self.unfused.get(t, True)
            and not copies
            and all(at == born and not up and not tr for at, up, tr in direct)
            and all(eqns[r[-1]].primitive in FUSIBLE for r in external if r[-1] < self.end)
            and len(direct) == len(external)
        )

    def _eager(self, t: int, phase: str, reads) -> bool:
        """Whether XLA:CPU makes this copy of ``t`` right after ``t``, not at its first
        reader: a parameter's (or its cast's, transpose's...) at the step's start, as it
        gathers every weight there; a forward tensor's that only the backward pass reads (its
        scheduler hoists the reshard into the forward pass)."""
        if not self.cpu:
            return False
        if t in self.from_params or self.inp.arg_kinds.get(t) == "params":
            return True
        return phase == FORWARD and self._backward_only(reads)

    def _backward_only(self, reads) -> bool:
        """Whether no read of ``reads`` ((at, ...) tuples) is in the forward pass."""
        return all(at >= self.end or self.phase_of_eqn[int(at)] != FORWARD for at, *_ in reads)

    def _half(self, t: int) -> bool:
        return self.inp.ng.program.tensors[t].dtype in HALF_FLOATS

    @staticmethod
    def _buffer(size: float, born: int, reads, phase: str, live, wide: float = -1.0) -> None:
        """A buffer of ``size`` bytes from ``born`` to its last read. On XLA:CPU the reads by
        16-bit dots (``reads``: (at, upcast, transposed)) take a float32 copy of ``wide`` bytes
        (default twice ``size``): made with the buffer when only dots read it, else at the
        first dot. Convolutions reading it transposed read a copy made with the buffer (of
        ``wide`` bytes where they upcast): the buffer itself lives to its other reads."""
        wide = 2 * size if wide < 0 else wide
        turned = [(at, up) for at, up, tr in reads if tr]
        if turned:
            copy = wide if any(up for _, up in turned) else size
            live(copy, born, max(at for at, _ in turned), phase)
            reads = [r for r in reads if not r[2]]
        plain = [at for at, up, _ in reads if not up]
        dots = [at for at, up, _ in reads if up]
        if not dots:
            live(size, born, max(plain, default=born), phase)
        elif not plain:
            live(wide, born, max(dots), phase)
        else:
            live(size, born, max(plain), phase)
            live(wide, min(dots), max(dots), phase)

    def _gathers_only(self, t: int, have, want) -> bool:
        """Whether resharding ``t`` from ``have`` to ``want`` gathers (and slices) only: what
        XLA's collective pipeliner moves an iteration ahead."""
        nbytes = self.inp.ng.program.tensors[t].nbytes
        kinds = {step.kind for step in reshard_path(nbytes, have, want, self.inp.sizes)}
        return ALL_GATHER in kinds and kinds <= {ALL_GATHER, SLICE}

    def _slices_only(self, t: int, have, want) -> bool:
        """Whether resharding ``t`` from ``have`` to ``want`` only slices (sends nothing)."""
        nbytes = self.inp.ng.program.tensors[t].nbytes
        path = reshard_path(nbytes, have, want, self.inp.sizes)
        return all(step.kind == SLICE for step in path)


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
