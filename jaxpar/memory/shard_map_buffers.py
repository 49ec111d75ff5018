"""A shard_map's body as XLA runs it once partitioned: the buffers it makes and frees inside
(`body_workspace`) and the residuals its readers recompute rather than XLA store
(`recomputed_results`). Its layouts are fixed, so no plan changes either; `memory.MemoryModel`
reads them once per program. The fusion rules are `buffers`'s (docs/memory.md, "Memory").

Pure: numpy only; JAX's jaxprs are read by attribute.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ..program.graph import CALL_BODIES
from ..rules.shard_map import inner_jaxpr, sub_jaxprs
from ..xla.buffer_assignment import EXPENSIVE, FUSIBLE, FUSING_READERS, GENERATORS, VIEWS

# Annotations a shard_map body's walk passes through: their result is their operand
BODY_ANNOTATIONS = frozenset({"pvary", "name", "stop_gradient", "optimization_barrier"})


class _BodyEqn(NamedTuple):
    """One equation of a shard_map body with its calls inlined: its primitive, operand and
    result values (JAX's variables), and the workspace of the loops or branches it runs."""

    name: str
    ins: list[Any]
    outs: list[Any]
    nested: float


def _is_literal(atom: Any) -> bool:
    return hasattr(atom, "val")  # a jax Literal has a value, a variable none


def body_value_bytes(v: Any) -> int:
    return math.prod(v.aval.shape) * getattr(v.aval.dtype, "itemsize", 0)


def _inlined(jaxpr: Any, rename: dict, out: list[_BodyEqn]) -> None:
    """Append ``jaxpr``'s equations to ``out`` with calls inlined (`CALL_BODIES`) and
    annotations passed through; ``rename`` maps a variable to the value it stands for."""

    def value(atom: Any) -> Any:
        return None if _is_literal(atom) else rename.get(atom, atom)

    for e in jaxpr.eqns:
        name = e.primitive.name
        body = CALL_BODIES.get(name)
        if body is not None and body in e.params:
            sub = inner_jaxpr(e.params[body])
            for v, atom in zip(sub.invars, e.invars, strict=True):
                rename[v] = value(atom)
            _inlined(sub, rename, out)
            for v, atom in zip(e.outvars, sub.outvars, strict=True):
                rename[v] = value(atom)
        elif name in BODY_ANNOTATIONS:
            for v, atom in zip(e.outvars, e.invars, strict=True):
                rename[v] = value(atom)
        else:
            nested = max((body_workspace(sub) for sub in sub_jaxprs(e)), default=0.0)
            ins = [value(a) for a in e.invars]
            out.append(_BodyEqn(name, [v for v in ins if v is not None], list(e.outvars), nested))


def body_workspace(jaxpr: Any, value_bytes: Callable[[Any], float] | None = None) -> float:
    """Peak bytes, on one device, of the buffers a shard_map's body makes and frees inside it
    (its operands and results are the step's tensors, held outside). Calls are inlined and
    annotations passed through, as XLA does; then XLA's fusion as the planning nodes
    approximate it: an equation that is not fusible (`FUSIBLE`, `VIEWS`) starts a kernel and a
    fusible one joins the kernel making its largest operand (in bytes) computed from data; a
    value is stored when another kernel reads it (a value computed from no data only when a
    reader that cannot recompute it does), from its equation to its last reader, in program
    order. While a loop or
    a branch runs, its own workspace counts too. ``jaxpr`` is JAX's, read by attribute.
    ``value_bytes``: a value's bytes on one device (default: its whole size; where automatic
    axes split the body, its shard's)."""
    value_bytes = value_bytes or body_value_bytes
    rename: dict[Any, Any] = {}
    eqns: list[_BodyEqn] = []
    _inlined(jaxpr, rename, eqns)
    results = {rename.get(v, v) for v in jaxpr.outvars if not _is_literal(v)}
    kernel_of: dict[Any, int] = {}  # a value made in the body -> the kernel making it
    kernel = list(range(len(eqns)))
    readers: dict[Any, list[int]] = {}
    generated: set[Any] = set()  # values computed from no data: recomputed where read
    for i, e in enumerate(eqns):
        made = [v for v in e.ins if v in kernel_of]
        data = [v for v in made if v not in generated]
        if e.name in FUSIBLE | VIEWS | GENERATORS and not data and len(made) == len(e.ins):
            generated.update(e.outs)
        if e.name in FUSIBLE | VIEWS and data:
            kernel[i] = kernel_of[max(data, key=body_value_bytes)]
        for v in made:
            readers.setdefault(v, []).append(i)
        for v in e.outs:
            kernel_of[v] = kernel[i]
    delta = np.zeros(len(eqns) + 1)
    for i, e in enumerate(eqns):
        for v in e.outs:
            reads = readers.get(v, [])
            if v in results or all(
                kernel[r] == kernel[i] or (v in generated and eqns[r].name in FUSING_READERS)
                for r in reads
            ):
                continue
            size = value_bytes(v)
            delta[i] += size
            delta[max(reads) + 1] -= size
    nested = np.array([e.nested for e in eqns] + [0.0])
    return float((np.cumsum(delta) + nested).max(initial=0.0))


def recomputed_results(jaxpr: Any) -> frozenset[int]:
    """The positions of a shard_map body's results that XLA need not store: computed from its
    operands and its other results by annotations (a ``pvary`` of an operand is the operand's
    own buffer) and cheap fusible equations (not `EXPENSIVE`), so a reader recomputes them
    inside its own fusion once the shard_map's boundary is gone, as XLA:CPU does with a
    differentiated GELU's ``1 - tanh`` and ``0.5 (1 + tanh)``; but not one the body stores
    anyway, for a reader that cannot fuse it (a matrix product's operand). ``jaxpr`` is
    JAX's."""
    rename: dict[Any, Any] = {}
    eqns: list[_BodyEqn] = []
    _inlined(jaxpr, rename, eqns)
    results = [None if _is_literal(v) else rename.get(v, v) for v in jaxpr.outvars]
    stored = {v for v in results if v is not None}
    operands = {rename.get(v, v) for v in jaxpr.invars}
    cheap = set(operands)
    made = set()  # values the body stores anyway: a reader that cannot fuse them reads them
    for e in eqns:
        if e.name not in FUSING_READERS:
            made.update(e.ins)
        if (
            e.name in FUSIBLE | VIEWS | GENERATORS
            and e.name not in EXPENSIVE
            and all(v in cheap or v in stored for v in e.ins)
        ):
            cheap.update(e.outs)
    return frozenset(
        k
        for k, v in enumerate(results)
        if v is not None and v in cheap and (v in operands or v not in made)
    )
