"""Memory per device of a train step under a plan: arguments, results, and live buffers.

The model (docs/memory.md, "Memory"), per device:

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
- A shard_map's body makes and frees buffers of its own while it runs, on fixed per-device
  shapes (`body_buffers.body_workspace`); they count at its position, with the temporaries. A
  per-device stack its readers recompute (`body_buffers.recomputed_results`) holds no buffer.
- A tensor offloaded to the host's memory (`Tensor.host`: a remat policy's
  ``offload_dst="pinned_host"``, ``jax.device_put`` to a host memory kind) holds no device
  buffer, except on XLA:CPU, where host and device memory are one (measured: a step offloading
  a residual compiles to the same peak as one saving it).
- Arguments are live for the whole step; a donated state argument's buffer holds its new value.
- A result not aliased to a donated argument has an allocation of its own for the whole step;
  buffers that die before it is written live inside it, as XLA assigns them
  (`hosted_in_results`).

`MemoryModel` builds what does not depend on the assignment once (`buffer_reads.BufferReads`),
so the budget search can price many assignments. The Lagrangian proxy
(`held.HeldBytes.node_bytes`) is linear in the node configurations: argument bytes plus the
buffers that cross the forward→backward boundary, hold gradients or live through a loop, and
any tensors the budget search adds (those live at the peaks it saw: `estimate_with_peak`). A
plan fits a budget when its predicted peak is at most the budget less `MODEL_MARGIN`. Pure:
numpy only.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..hardware.collectives import ALL_GATHER
from ..nodes.configs import Config, shard_count, spec_of
from ..program.graph import BACKWARD, FORWARD, UPDATE
from ..rules.shard_map import automatic_dims, inner_jaxpr
from ..rules.table import DimMap
from ..xla.buffer_assignment import (
    FUSIBLE,
    HALF_FLOATS,
    UPCAST_READERS,
    YNN_MIN_ELEMENTS,
    Buffer,
    after_sync,
    combined_all_reduces,
    hosted_in_results,
    merged_reshard_steps,
    reshard_in_flight,
)  # fmt: skip
from ..xla.reshard_paths import SLICE, reshard_path
from .buffer_reads import BufferReads
from .estimate import ARG_KINDS, CPU_MODEL_MARGIN, MODEL_MARGIN, MemoryEstimate
from .shard_map_buffers import body_value_bytes, body_workspace, recomputed_results

COMBINE_COUNT = 256  # operands per combined all-reduce on the CPU backend
# Positions in the liveness walk: equation i at i, a combined all-reduce after it at
# i + SYNC_AFTER, the equations reading its results (moved after it) at i + 2 * SYNC_AFTER
STEPS = 3
SYNC_AFTER = 1 / STEPS


class MemoryModel(BufferReads):
    """Liveness of a program's buffers (`BufferReads`); `estimate` prices one assignment."""

    def no_device_buffer(self, t: int) -> bool:
        """Whether tensor ``t`` holds no device memory whatever its layout: opaque (a key), a
        per-device stack its readers recompute, or offloaded to the host's memory (except on
        XLA:CPU, whose one memory holds it: a remat policy's offload compiles to the peak of
        saving it)."""
        tensor = self.inp.ng.program.tensors[t]
        return tensor.opaque or t in self._recomputed or (tensor.host and not self.cpu)

    def _bytes(self, t: int, spec) -> float:
        if t not in self._nbytes:
            none = self.no_device_buffer(t)
            self._nbytes[t] = 0 if none else self.inp.ng.program.tensors[t].nbytes
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

    def arguments_exceed(self, assignment: Sequence[int], budget: float) -> bool:
        """Whether the arguments alone (every estimate's peak holds them whole) pass
        ``budget`` less the margin: ``assignment`` cannot fit, and no walk is needed. The
        same sum as `estimate`'s, so a peak it counts is never below it."""
        configs = self.inp.configs
        spec = {t: spec_of(m, configs[v][assignment[v]]) for t, (v, m) in self._arg_maps.items()}
        margin = CPU_MODEL_MARGIN if self.cpu else MODEL_MARGIN
        return sum(self._arguments(spec).values()) > budget * (1 - margin)

    @functools.cached_property
    def _recomputed(self) -> frozenset[int]:
        """Per-device stacks (`Tensor.hand_split`) their readers recompute rather than XLA
        store (`body_buffers.recomputed_results`): no buffer."""
        out: set[int] = set()
        for e in self.inp.ng.program.eqns:
            if e.primitive == "shard_map":
                tensors = self.inp.ng.program.tensors
                cheap = recomputed_results(inner_jaxpr(e.params["jaxpr"]))
                out.update(
                    t for k, t in enumerate(e.outputs) if k in cheap and tensors[t].hand_split
                )
        return frozenset(out)

    @functools.cached_property
    def _workspace(self) -> np.ndarray:
        """Per grid position, the bytes a shard_map's body makes and frees inside it while it
        runs (`body_buffers.body_workspace`), unsplit by automatic axes (`_workspace_under`)."""
        out = np.zeros(STEPS * (self.n_eqns + 2))
        for e in self.inp.ng.program.eqns:
            if e.primitive == "shard_map":
                at = round(STEPS * self.position[e.index])
                out[at] += body_workspace(inner_jaxpr(e.params["jaxpr"]))
        return out

    @functools.cached_property
    def _automatic(self) -> list[tuple[Any, int, Any]]:
        """(equation, its node, `body_dims.BodyDims`) of each shard_map whose automatic axes
        may split its body."""
        ng = self.inp.ng
        out = []
        for e in ng.program.eqns:
            if e.primitive == "shard_map" and e.index in ng.node_of_eqn:
                dims = automatic_dims(e, ng.program)
                if dims is not None:
                    out.append((e, ng.node_of_eqn[e.index], dims))
        return out

    def _workspace_under(self, cfg: Sequence[Config]) -> np.ndarray:
        """`_workspace` with each body's values split as ``cfg`` puts automatic axes on the
        dims they carry: a value's bytes / the product of those axes' sizes."""
        if not self._automatic:
            return self._workspace
        out = self._workspace.copy()
        sizes = self.inp.sizes
        for e, v, dims in self._automatic:
            space = self.inp.ng.nodes[v].space
            first = space.automatic[0]
            deg = [1] * len(dims.sizes)
            for a, d in enumerate(cfg[v]):
                if d >= first:
                    deg[d - first] *= sizes[a]
            if all(k == 1 for k in deg):
                continue
            key = ("split workspace", e.index, tuple(deg))
            memo = self.inp.ng.program.memo
            if key not in memo:
                jaxpr = inner_jaxpr(e.params["jaxpr"])
                whole = body_workspace(jaxpr)
                split = body_workspace(jaxpr, _split_bytes(dims, tuple(deg)))
                memo[key] = split - whole
            out[round(STEPS * self.position[e.index])] += memo[key]
        return out

    @functools.cached_property
    def _arg_maps(self) -> dict[int, tuple[int, DimMap]]:
        """Each argument's node and dim map: the last node mapping it, as `_walk` takes it."""
        invars = set(self.inp.ng.program.invars)
        return {
            t: (node.index, m)
            for node in self.inp.ng.nodes
            for t, m in node.tensor_maps.items()
            if t in invars
        }

    def _arguments(self, spec: dict[int, tuple]) -> dict[str, float]:
        """Per argument kind (`ARG_KINDS`), the bytes per device of the arguments."""
        args = dict.fromkeys(ARG_KINDS, 0.0)
        for t in self.inp.ng.program.invars:
            args[self.inp.arg_kinds.get(t, "other")] += self._bytes(t, spec.get(t, ()))
        return args

    def _walk(
        self, assignment: Sequence[int], budget: float | None, record: list | None
    ) -> tuple[MemoryEstimate, int]:
        """The estimate and the equation at its peak; ``record`` (if given) receives
        (tensor, born, dies) of every buffer."""
        cfg, spec, out_specs = self._layouts(assignment)
        args = self._arguments(spec)
        combine_at, scattered, delayed = self._sync_schedule(cfg, spec)
        buffers, in_flight = self._all_buffers(cfg, spec, out_specs, combine_at, scattered, delayed)
        results = self._results(out_specs, delayed)
        outputs = sum(size for size, _ in results)
        hosted = hosted_in_results(buffers, results)
        at, live_at, peak_live = self._peak(buffers, hosted, in_flight, cfg, record)
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

    def _layouts(self, assignment: Sequence[int]) -> tuple[list, dict, dict]:
        """Each node's configuration, every tensor's layout, and each result's (a state result
        takes the layout of the argument it becomes)."""
        inp, ng = self.inp, self.inp.ng
        cfg = [inp.configs[v][a] for v, a in enumerate(assignment)]
        spec: dict[int, tuple] = {}
        for node in ng.nodes:
            for t, m in node.tensor_maps.items():
                spec[t] = spec_of(m, cfg[node.index])
        out_specs = {}
        for t in ng.program.outvars:
            if t is not None:
                out_specs[t] = spec[inp.feedback[t]] if t in inp.feedback else spec.get(t, ())
        return cfg, spec, out_specs

    def _sync_schedule(self, cfg: list, spec: dict) -> tuple[dict, set, dict]:
        """Where the gradient all-reduces run: (tensor -> the combined all-reduce it waits
        for, the reduced tensors reduce-scattered, equation -> where its result is delayed
        to); selects the reads (`_select_reads`) of this assignment first."""
        inp, ng = self.inp, self.inp.ng
        program, tensors = ng.program, ng.program.tensors
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
        return combine_at, scattered, delayed

    def _all_buffers(self, cfg, spec, out_specs, combine_at, scattered, delayed):
        """Every tensor's buffers (`_tensor_buffers`), and a reshard's in-flight bytes per grid
        position: reshards run one at a time, so the largest counts there, not their sum."""
        buffers: list[Buffer] = []
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
        return buffers, in_flight

    def _results(self, out_specs: dict, delayed: dict) -> list[tuple[float, int]]:
        """(bytes, equation writing it) of each result with an allocation of its own: a node's
        results are one (multi-output) fusion, all written by its first one."""
        inp, ng = self.inp, self.inp.ng
        own = [t for t in out_specs if not (t in inp.feedback and inp.feedback[t] in inp.donated)]
        first: dict[int, int] = {}
        for t in own:
            if t in self.producer_eqn:
                v = ng.node_of_eqn[self.producer_eqn[t]]
                made = self.producer_eqn[t]
                first[v] = min(first.get(v, self.end), delayed.get(made, self._made_at(t)))
        return [
            (self._bytes(t, out_specs[t]),
             first[ng.node_of_eqn[self.producer_eqn[t]]] if t in self.producer_eqn else 0)
            for t in own
        ]  # fmt: skip

    def _peak(self, buffers, hosted, in_flight, cfg, record) -> tuple[int, dict, float]:
        """The grid position of the peak, the bytes live there per phase, and the peak's live
        bytes. Positions are equations' and the combined all-reduces' between them: a grid of
        STEPS points per equation."""
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
        workspace = self._workspace_under(cfg)
        profile = (np.cumsum(delta) + in_flight + workspace)[: STEPS * (self.n_eqns + 1)]
        at = int(np.argmax(profile)) if len(profile) else 0
        live_at = {k: float(np.cumsum(v)[at]) for k, v in kinds.items()}
        live_at[UPDATE] += float(in_flight[at] + workspace[at])  # with the temporaries
        peak_live = float(profile[at]) if len(profile) else 0.0
        return at, live_at, peak_live

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
        if not (external or fused or (self.cpu and t in self.producer_eqn and self._half(t))):
            return  # read only where it is made, and no copy of it: no buffer of its own
        born = delayed.get(made_by, born)
        have = self._made_layout(t, external, cfg, spec)
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
        direct, copies = self._split_reads(t, external, have, cfg, delayed, is_arg)
        scatter = (
            t in scattered
            and copies
            and max([born] + [at for at, _, _ in direct]) == born
            and all(self._slices_only(t, have, want) for want in copies)
        )
        self._copy_buffers(t, have, copies, born, phase, scatter, live)
        if t in self.producer_eqn and self.cpu and self._half(t):
            e = self.inp.ng.program.eqns[self.producer_eqn[t]]
            if e.primitive in UPCAST_READERS:  # the float32 result, converted back at once
                live(2 * self._bytes(t, have), born, born, phase)
        if is_arg:
            self._argument_copies(t, have, direct, born, phase, live)
            return
        if not external:
            return  # a tensor read only in its node is fused
        if self._fused_where_made(t, direct, copies, external, born):
            return
        if t in self.outvar_set and out_specs.get(t) == have:
            return  # the produced buffer is the result (counted as an output)
        self._produced_buffer(
            t, have, direct, spec, born, synced_at, in_place, phase, inherited, live
        )

    def _made_layout(self, t: int, external, cfg, spec) -> tuple:
        """The layout ``t`` is made in: its own, but a tensor computed from no data is made in
        its readers' layout when they agree on one."""
        have = spec.get(t, ())
        if t in self.generated:  # computed from no data: XLA makes it in its readers' layout
            wants = {spec_of(dst_map, cfg[dst]) for _, dst, dst_map, *_ in external}
            if len(wants) == 1:
                have = wants.pop()
        return have

    def _split_reads(self, t, external, have, cfg, delayed, is_arg) -> tuple[list, dict]:
        """The reads of ``t`` in its own layout, (at, upcast, transposed copy), and the others
        per layout wanted. A transposed copy for a convolution is made of a stored buffer: an
        argument, an unfused result or a resharded copy (XLA fuses it into an elementwise
        producer)."""
        copies: dict[tuple, list[tuple[int, bool, bool]]] = {}
        direct: list[tuple[int, bool, bool]] = []
        stored = is_arg or self.unfused.get(t, False)
        for at, dst, dst_map, upcast, turned, eqn in external:
            at = delayed.get(eqn, at)
            want = spec_of(dst_map, cfg[dst])
            if want == have or at >= self.end:
                direct.append((at, upcast, turned and stored))
            else:
                copies.setdefault(want, []).append((at, upcast, turned))
        return direct, copies

    def _copy_buffers(self, t, have, copies, born, phase, scatter, live) -> None:
        """The resharded copies of ``t``, one per layout its readers want."""
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
            self._buffer(self._bytes(t, want), first, reads, phase, live)
            if t in self.prefetched and self._gathers_only(t, have, want):
                live(self._bytes(t, want), *self.prefetched[t], phase)  # the next iteration's
            if self.cpu and not scatter:
                in_flight = reshard_in_flight(nbytes, have, want, self.inp.sizes)
                live(max(in_flight - self._bytes(t, want), 0.0), first, first, phase, flying=True)

    def _argument_copies(self, t, have, direct, born, phase, live) -> None:
        """An argument is counted whole; on XLA:CPU a float32 copy for 16-bit dots, and the
        transposed copies made at the step's start, as XLA:CPU makes a parameter's layouts."""
        dots = [at for at, up, turned in direct if up and not turned]
        if dots:
            live(2 * self._bytes(t, have), min(dots), max(dots), phase)
        turned = [at for at, _, tr in direct if tr]
        if turned:
            live(self._bytes(t, have), born, max(turned), phase)

    def _produced_buffer(
        self, t, have, direct, spec, born, synced_at, in_place, phase, inherited, live
    ) -> None:
        """The buffer ``t`` is produced in, until its last direct read: a view's, when ``t`` is
        a same-sized view read once (the view inherits it); a partial sum until its combined
        all-reduce, then the reduced sum."""
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


def _split_bytes(dims: Any, deg: tuple[int, ...]) -> Callable[[Any], float]:
    """A body value's bytes on one device when automatic dim d is split ``deg[d]`` ways."""
    return lambda x: body_value_bytes(x) / math.prod(deg[d] for d in dims.dims_of(x))
