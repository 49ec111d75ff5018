"""The computation graph: a flat program of equations, their tensors, phases and layer labels.

Pure (no jax import). `trace` turns a JAX function into a `Program`; this module answers the
questions the planner asks of it: who produces and who consumes each tensor, which phase
(forward / backward / update) an equation belongs to, which layer it is part of.

Phases and labels come from the name stack JAX records on each equation: linen modules appear as
``jvp(MLP)/Dense_0`` in the forward pass and ``transpose(jvp(MLP))/Dense_0`` in the backward pass;
optimizer equations carry no ``jvp``. Flax NNX records only ``jvp()``, so layers there are labelled
by the parameter path that feeds their contraction (see `param_labels`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Sequence
from typing import Any

FORWARD = "forward"
BACKWARD = "backward"
UPDATE = "update"
PHASES = (FORWARD, BACKWARD, UPDATE)


@dataclasses.dataclass(frozen=True)
class Tensor:
    """One value of the program (a jaxpr variable)."""

    shape: tuple[int, ...]  # static shape
    dtype: str  # numpy-style dtype name ("float32", "int32", "key<fry>", ...)
    itemsize: int  # bytes per element (0 for opaque dtypes such as PRNG keys)
    # A shard_map's per-device stack (`rules_manual.per_device_stacks`): the mesh axes whose
    # devices' blocks it concatenates. Its shape is then one device's block, planned as held
    # whole on every device (each device holds its own), and never constrained.
    hand_split: tuple[str, ...] = ()
    # Held in the host's memory (``jax.device_put`` to ``pinned_host``, a remat policy's
    # offloaded residual): no device buffer on an accelerator (`memory`).
    host: bool = False

    # cached: the cost and memory models ask for them millions of times on a 70B model
    @functools.cached_property
    def size(self) -> int:
        return math.prod(self.shape)

    @functools.cached_property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    @property
    def opaque(self) -> bool:
        """Extended dtypes (PRNG keys) cannot carry a sharding constraint: keep them replicated."""
        return self.itemsize == 0


@dataclasses.dataclass(frozen=True)
class Equation:
    """One primitive application of the flattened program."""

    index: int  # position in `Program.eqns`
    primitive: str  # primitive name ("dot_general", "add", ...)
    params: dict[str, Any]  # the primitive's params, as JAX gives them
    inputs: tuple[int | None, ...]  # tensor ids; None where the input is a literal
    literals: tuple[Any, ...]  # literal values, aligned with `inputs` (None where a tensor)
    outputs: tuple[int, ...]  # tensor ids
    name_stack: str  # e.g. "transpose(jvp(MLP))/Dense_0"
    bind: Any = dataclasses.field(default=None, compare=False, repr=False)  # opaque: for apply
    region: int = -1  # the innermost planned region holding it (`Program.regions`), or -1


@dataclasses.dataclass(frozen=True)
class UserConstraint:
    """A layout the user's step asks for: a ``with_sharding_constraint`` (plain, or made by
    Flax's ``nn.with_logical_constraint``) on one tensor, as traced."""

    eqn: int  # the ``sharding_constraint`` equation
    tensor: int  # the tensor it constrains (its result)
    # per tensor dim: the mesh axis names splitting it, () replicated, None unconstrained (free)
    spec: tuple[tuple[str, ...] | None, ...]
    axis_sizes: tuple[tuple[str, int], ...]  # the constraint's mesh: (axis name, size)
    logical: tuple[str | None, ...] | None  # Flax's logical names per dim, when it had them
    name_stack: str  # where in the step (the equation's name stack)
    readable: bool = True  # False: a sharding that names no mesh axes (left to the plan)


# Primitives whose body `trace` inlines into the flat program (and `body_buffers` into a
# shard_map's body), each with the param that holds the body.
CALL_BODIES = {
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
    "checkpoint": "jaxpr",
    "remat": "jaxpr",
    "remat2": "jaxpr",
    # `jax.lax.composite`: a named op with its decomposition, which XLA inlines (no backend
    # here implements one itself)
    "composite": "jaxpr",
    "custom_lin": None,  # only appears under linearize, never in a traced step
}

# Equations a planned region adds around its bodies (rules in `rules_loops`; never bound).
SCAN_CARRY = "scan_carry"  # init (outside) -> the carry an iteration reads
SCAN_SLICE = "scan_slice"  # stacked xs (outside) -> the slice an iteration reads
SCAN_STACK = "scan_stack"  # an iteration's y -> the stacked ys (outside)
COND_MERGE = "cond_merge"  # each branch's k-th result -> the cond's k-th result
REGION_PRIMITIVES = (SCAN_CARRY, SCAN_SLICE, SCAN_STACK, COND_MERGE)
SCAN, COND = "scan", "cond"


@dataclasses.dataclass(frozen=True)
class Region:
    """A control-flow equation whose bodies are planned; its equations are
    ``eqns[first:end]`` (nested regions inline).

    - ``scan``: one `SCAN_CARRY` per carry, one `SCAN_SLICE` per xs, the body, one `SCAN_STACK`
      per ys. The body is planned once and priced ``trips`` times; the scan's final carry is the
      body's ``carry_out`` tensor, its ys the stacks' results.
    - ``cond``: each branch's body in turn (``bodies``), then one `COND_MERGE` per result,
      reading that result of every branch in one layout. Every branch is priced (an upper bound:
      one runs); ``index`` is the branch index tensor.
    """

    index: int  # position in `Program.regions`
    kind: str  # SCAN or COND
    parent: int  # the enclosing region, or -1
    trips: int  # runs of a body per run of the region (the scan's length; 1 for a cond)
    first: int  # first equation
    bodies: tuple[tuple[int, int], ...]  # [start, stop) of each body (a scan has one)
    end: int  # one past the last equation
    carry_out: tuple[int, ...] = ()  # scan: per carry, the body tensor an iteration returns
    reverse: bool = False  # scan
    unroll: Any = 1  # scan: its unroll param, re-emitted as given
    branch_index: int | None = None  # cond: the tensor choosing the branch (None: a literal)
    branch_literal: Any = None  # cond: the literal index when ``branch_index`` is None

    @property
    def copies(self) -> int:
        """Body copies per iteration of the while loop XLA runs (a scan's ``unroll``: JAX's
        `_scan_impl` runs ``trips // unroll`` iterations of ``unroll`` copies and the remainder
        after the loop)."""
        if self.kind != SCAN:
            return 1
        unroll = self.trips if self.unroll is True else int(self.unroll)
        return max(1, min(unroll, self.trips) if unroll > 0 else self.trips)

    @property
    def iterations(self) -> int:
        """Iterations of the while loop XLA runs per run of the region; 0 when there is no
        loop: every copy of the body in line, as JAX emits a scan unrolled whole and XLA's
        while-loop simplifier inlines a loop of one iteration (a cond: 1)."""
        if self.kind != SCAN:
            return 1
        loops = self.trips // self.copies
        return 0 if loops == 1 else loops

    @property
    def carry_eqns(self) -> range:
        return range(self.first, self.first + len(self.carry_out))

    @property
    def slice_eqns(self) -> range:
        return range(self.first + len(self.carry_out), self.bodies[0][0])

    @property
    def result_eqns(self) -> range:
        """The `SCAN_STACK` or `COND_MERGE` equations."""
        return range(self.bodies[-1][1], self.end)


@dataclasses.dataclass
class Program:
    """A flat (fully inlined) program: what the planner plans and the applier re-emits."""

    tensors: list[Tensor]  # indexed by tensor id
    eqns: list[Equation]
    invars: list[int]  # tensor ids of the flat arguments
    outvars: list[int | None]  # tensor ids of the flat results (None: a literal result)
    out_literals: list[Any]  # literal values of results, aligned with outvars
    consts: dict[int, Any]  # tensor id -> constant value (closed-over arrays: replicated)
    invar_paths: list[str]  # pytree path of each flat argument, e.g. "[0].params['Dense_0']"
    outvar_paths: list[str]  # pytree path of each flat result
    regions: list[Region] = dataclasses.field(default_factory=list)  # planned, outer first
    # jax_threefry_partitionable when traced: each threefry random bit depends on the key and
    # its own index alone, so XLA partitions `random_bits` like an elementwise op
    threefry_partitionable: bool = False
    # the user's own sharding constraints, in program order (`UserConstraint`)
    user_constraints: list[UserConstraint] = dataclasses.field(default_factory=list)
    # logical axis names per dim of tensors that have them: arguments boxed in Flax's
    # ``LogicallyPartitioned`` and the results of Flax's logical constraints
    logical_names: dict[int, tuple[str | None, ...]] = dataclasses.field(default_factory=dict)
    # the ``nn.logical_axis_rules`` in force when the step was traced
    logical_rules: tuple[tuple[str, Any], ...] = ()
    # analyses of the program other modules keep for it (`tables.gathers_free`), by key
    memo: dict[Any, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def region_chain(self, region: int) -> list[int]:
        """``region`` and the regions enclosing it, innermost first ([] for -1)."""
        chain = []
        while region >= 0:
            chain.append(region)
            region = self.regions[region].parent
        return chain

    def trips(self, region: int) -> int:
        """How many times per step an equation of ``region`` runs (1 outside regions)."""
        if region < 0:
            return 1
        return math.prod(self.regions[i].trips for i in self.region_chain(region))

    def computation(self, region: int) -> int:
        """The innermost region enclosing ``region`` (itself included) that XLA runs as a
        computation of its own, a loop's body or a cond's branch; -1 for the step's own. A scan
        XLA runs in line (`Region.iterations` 0) belongs to the computation around it."""
        while (
            region >= 0
            and self.regions[region].kind == SCAN
            and not self.regions[region].iterations
        ):
            region = self.regions[region].parent
        return region

    def scan_loops(self) -> frozenset[int]:
        """The scans that XLA runs as loops of more than one iteration: the loops its collective
        pipeliner works on."""
        return frozenset(r.index for r in self.regions if r.kind == SCAN and r.iterations > 1)

    def inline_scans(self) -> frozenset[int]:
        """The scans of more than one step that XLA runs with no loop, every copy of the body in
        line (`Region.iterations` 0): their steps overlap as unrolled layers do."""
        return frozenset(
            r.index for r in self.regions if r.kind == SCAN and r.trips > 1 and not r.iterations
        )

    def body_of(self, region: int, eqn: int) -> int:
        """Which body of ``region`` holds equation ``eqn``: a cond's branch (each its own
        computation in XLA), 0 for a scan's body or outside regions."""
        if region < 0:
            return 0
        bodies = self.regions[region].bodies
        return next((b for b, (lo, hi) in enumerate(bodies) if lo <= eqn < hi), 0)

    def common_region(self, a: int, b: int) -> int:
        """The innermost region enclosing both ``a`` and ``b`` (-1: none)."""
        if a < 0 or b < 0:
            return -1
        chain = set(self.region_chain(b))
        return next((i for i in self.region_chain(a) if i in chain), -1)

    def producers(self) -> dict[int, int]:
        """Tensor id -> index of the equation producing it."""
        return {t: e.index for e in self.eqns for t in e.outputs}

    def consumers(self) -> dict[int, list[int]]:
        """Tensor id -> indices of the equations reading it (with repetition)."""
        out: dict[int, list[int]] = {}
        for e in self.eqns:
            for t in e.inputs:
                if t is not None:
                    out.setdefault(t, []).append(e.index)
        return out


_WRAPPER = re.compile(r"(transpose|jvp|vmap|remat|checkpoint|jit|pjit)\(")


def phase_of(name_stack: str) -> str:
    """Phase from the name stack: ``transpose(`` marks the backward pass, ``jvp(`` the forward."""
    if "transpose(" in name_stack:
        return BACKWARD
    if "jvp(" in name_stack:
        return FORWARD
    return UPDATE


def layer_of(name_stack: str) -> str:
    """Layer label: the module path with AD wrappers stripped.

    ``transpose(jvp(MLP))/Dense_0`` and ``jvp(MLP)/Dense_0`` both give ``MLP/Dense_0``; a stack
    with no module name (``jvp()``, optimizer code) gives "".
    """
    parts = []
    for part in name_stack.split("/"):
        inner = part
        while True:
            m = _WRAPPER.match(inner)
            if not m or not inner.endswith(")"):
                break
            inner = inner[m.end() : -1]
        if inner and "(" not in inner:
            parts.append(inner)
    return "/".join(parts)


def param_labels(program: Program, state_argnum_prefix: str = "[0]") -> dict[int, str]:
    """Tensor id -> parameter path for tensors derived from one state leaf by unary ops.

    Used to label NNX layers (whose name stack is only ``jvp()``): a contraction reading a tensor
    derived from ``[0][0]['layers'][0]['kernel']`` belongs to layer ``[0][0]['layers'][0]``.
    """
    origin: dict[int, str] = {}
    for tid, path in zip(program.invars, program.invar_paths, strict=True):
        if path.startswith(state_argnum_prefix) and len(program.tensors[tid].shape) >= 1:
            origin[tid] = path
    unary = {"convert_element_type", "transpose", "reshape", "copy", "broadcast_in_dim"}
    for e in program.eqns:
        if e.primitive in unary and len(e.outputs) == 1:
            src = e.inputs[0]
            if src is not None and src in origin:
                origin[e.outputs[0]] = origin[src]
    return origin


def layer_from_param_path(path: str) -> str:
    """``[0][0]['layers'][0]['kernel']`` -> ``layers/0`` (drop the argument index and leaf name)."""
    keys = re.findall(r"\['?([^'\]]+)'?\]|\.(\w+)", path)
    names = [a or b for a, b in keys]
    # drop leading positional indices of the argument tuple and the leaf (kernel/bias/scale...)
    while names and names[0].isdigit():
        names = names[1:]
    for drop in ("params", "value"):
        names = [n for n in names if n != drop]
    return "/".join(names[:-1]) if len(names) > 1 else "/".join(names)


def shape_str(shape: Sequence[int]) -> str:
    return "[" + ",".join(str(s) for s in shape) + "]"
