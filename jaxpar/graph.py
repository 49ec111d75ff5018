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

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
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
