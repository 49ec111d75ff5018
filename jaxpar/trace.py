"""Trace a user function to a flat `Program`: one jaxpr, nested calls inlined.

Calls (jit/pjit, closed_call, custom_jvp_call, custom_vjp_call, checkpoint/remat) are inlined so
the planner sees every equation. Control flow (scan, while, cond) stays one equation; the rules
plan it as one replicated node (see `rules.py`).

Non-array leaves of the arguments (Python scalars, strings, None) are static: they are part of the
signature and are closed over, exactly as `jax.jit(static_argnums=...)` would treat them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import numpy as np
from jax import tree_util
from jax.extend import core as jex_core

from .graph import Equation, Program, Tensor

# Primitives whose body is inlined; the param that holds the body differs between them.
_INLINE_PARAMS = {
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
    "custom_lin": None,  # only appears under linearize, never in a traced step
}


_REMAT = ("checkpoint", "remat", "remat2")


@functools.cache
def _barrier_primitive() -> Any:
    """jax's optimization_barrier primitive (found through the public function)."""
    return jax.make_jaxpr(jax.lax.optimization_barrier)(np.float32(0)).eqns[0].primitive


class TraceError(ValueError):
    """The function could not be traced to a jaxpr."""


def is_array_leaf(x: Any) -> bool:
    """Leaves that become traced arguments; everything else is static."""
    return isinstance(x, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct))


@dataclasses.dataclass(frozen=True)
class Signature:
    """What a traced program depends on: tree structure, array shapes/dtypes, static leaves."""

    treedef: Any
    arrays: tuple[tuple[tuple[int, ...], str], ...]  # (shape, dtype) per array leaf
    static: tuple[tuple[int, Any], ...]  # (leaf index, value) of the static leaves

    @classmethod
    def of(cls, args: tuple) -> Signature:
        leaves, treedef = tree_util.tree_flatten(args, is_leaf=lambda x: x is None)
        arrays, static = [], []
        for i, leaf in enumerate(leaves):
            if is_array_leaf(leaf):
                arrays.append((tuple(leaf.shape), str(leaf.dtype)))
            else:
                try:
                    hash(leaf)
                except TypeError as err:
                    raise TraceError(
                        f"argument leaf {i} of type {type(leaf).__name__} is neither an array nor "
                        "hashable; pass arrays, ShapeDtypeStructs or hashable static values"
                    ) from err
                static.append((i, leaf))
        return cls(treedef, tuple(arrays), tuple(static))


def split_args(args: tuple) -> tuple[list[Any], list[str], Any]:
    """Flatten args into (array leaves, their paths, rebuild(array_leaves) -> args)."""
    with_path, treedef = tree_util.tree_flatten_with_path(args, is_leaf=lambda x: x is None)
    leaves = [leaf for _, leaf in with_path]
    idx = [i for i, leaf in enumerate(leaves) if is_array_leaf(leaf)]
    paths = [tree_util.keystr(with_path[i][0]) for i in idx]

    def rebuild(array_leaves: list[Any]) -> Any:
        full = list(leaves)
        for i, v in zip(idx, array_leaves, strict=True):
            full[i] = v
        return tree_util.tree_unflatten(treedef, full)

    return [leaves[i] for i in idx], paths, rebuild


def _dtype_info(aval: Any) -> tuple[str, int]:
    dt = aval.dtype
    try:
        itemsize = np.dtype(dt).itemsize
    except TypeError:
        itemsize = 0  # extended dtype (PRNG key)
    return str(dt), itemsize


class _Flattener:
    """Walks a jaxpr, inlining calls, numbering tensors, recording equations."""

    def __init__(self) -> None:
        self.tensors: list[Tensor] = []
        self.eqns: list[Equation] = []
        self.consts: dict[int, Any] = {}

    def new_tensor(self, aval: Any) -> int:
        dtype, itemsize = _dtype_info(aval)
        self.tensors.append(Tensor(tuple(int(d) for d in aval.shape), dtype, itemsize))
        return len(self.tensors) - 1

    def read(self, env: dict, atom: Any) -> tuple[int | None, Any]:
        if isinstance(atom, jex_core.Literal):
            return None, atom.val
        return env[atom], None

    def walk(self, jaxpr: Any, env: dict, prefix: str) -> None:
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            stack = str(eqn.source_info.name_stack)
            stack = f"{prefix}/{stack}" if prefix and stack else (prefix or stack)
            body_key = _INLINE_PARAMS.get(name)
            if body_key and body_key in eqn.params:
                if (
                    name in _REMAT
                    and eqn.params.get("prevent_cse")
                    and eqn.params.get("differentiated")
                ):
                    over = self.barrier(eqn, env, stack)
                else:
                    over = {}
                self.inline(eqn.params[body_key], eqn, env, stack, over)
                continue
            read = [self.read(env, a) for a in eqn.invars]
            ins, lits = [r[0] for r in read], [r[1] for r in read]
            outs = []
            for v in eqn.outvars:
                tid = self.new_tensor(v.aval)
                if not isinstance(v, jex_core.DropVar):
                    env[v] = tid
                outs.append(tid)
            self.eqns.append(
                Equation(
                    index=len(self.eqns),
                    primitive=name,
                    params=dict(eqn.params),
                    inputs=tuple(ins),
                    literals=tuple(lits),
                    outputs=tuple(outs),
                    name_stack=stack,
                    bind=eqn.primitive,
                )
            )

    def barrier(self, eqn: Any, env: dict, stack: str) -> dict:  # operand var -> barrier output
        """An `optimization_barrier` on each array operand of a rematerialized call, as jax
        lowers `jax.checkpoint(prevent_cse=True)`: without it XLA would merge the backward
        pass's recomputation with the forward pass and keep the activations remat frees."""
        over: dict = {}
        prim = _barrier_primitive()
        for atom in eqn.invars:
            if isinstance(atom, jex_core.Literal) or not hasattr(atom.aval, "shape"):
                continue
            src = env[atom]
            if self.tensors[src].opaque:
                continue
            out = self.new_tensor(atom.aval)
            self.eqns.append(
                Equation(
                    index=len(self.eqns), primitive="optimization_barrier", params={},
                    inputs=(src,), literals=(None,), outputs=(out,),
                    name_stack=f"{stack}/remat_barrier" if stack else "remat_barrier", bind=prim,
                )
            )  # fmt: skip
            over[atom] = out
        return over

    def inline(self, body: Any, eqn: Any, env: dict, stack: str, over: dict | None = None) -> None:
        if isinstance(body, jex_core.ClosedJaxpr):
            inner, consts = body.jaxpr, body.consts
        else:
            inner, consts = body, ()
        inner_env: dict = {}
        for cv, c in zip(inner.constvars, consts, strict=True):
            tid = self.new_tensor(cv.aval)
            self.consts[tid] = c
            inner_env[cv] = tid
        # custom_vjp_call_jaxpr-style calls may carry extra leading operands (consts)
        operands = list(eqn.invars)[-len(inner.invars) :] if inner.invars else []
        for iv, atom in zip(inner.invars, operands, strict=True):
            tid, lit = (over[atom], None) if over and atom in over else self.read(env, atom)
            if tid is None:
                tid = self.new_tensor(iv.aval)
                self.consts[tid] = lit
            inner_env[iv] = tid
        self.walk(inner, inner_env, stack)
        for ov, outer in zip(inner.outvars, eqn.outvars, strict=True):
            if isinstance(outer, jex_core.DropVar):
                continue
            tid, lit = self.read(inner_env, ov)
            if tid is None:
                tid = self.new_tensor(outer.aval)
                self.consts[tid] = lit
            env[outer] = tid


def trace(fn: Any, args: tuple) -> tuple[Program, Any]:
    """Trace ``fn(*args)`` to a flat Program; also return the output treedef."""
    Signature.of(args)  # validates the static leaves
    arrays, paths, rebuild = split_args(args)
    out_tree_box: list[Any] = []

    def flat_fn(*flat):
        out = fn(*rebuild(list(flat)))
        leaves, tree = tree_util.tree_flatten(out)
        out_tree_box.append(tree)
        return leaves

    abstract = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays]
    try:
        closed = jax.make_jaxpr(flat_fn)(*abstract)
    except Exception as err:
        raise TraceError(
            f"could not trace {getattr(fn, '__name__', fn)!r} to a jaxpr: "
            f"{type(err).__name__}: {err}. jaxpar plans functions that jax.jit can trace: "
            "no Python control flow on array values, no side effects on arrays."
        ) from err
    flat = _Flattener()
    env: dict = {}
    for cv, c in zip(closed.jaxpr.constvars, closed.consts, strict=True):
        tid = flat.new_tensor(cv.aval)
        flat.consts[tid] = c
        env[cv] = tid
    invars = []
    for v in closed.jaxpr.invars:
        tid = flat.new_tensor(v.aval)
        env[v] = tid
        invars.append(tid)
    flat.walk(closed.jaxpr, env, "")
    outvars, out_lits = [], []
    for v in closed.jaxpr.outvars:
        tid, lit = flat.read(env, v)
        outvars.append(tid)
        out_lits.append(lit)
    out_tree = out_tree_box[-1]
    out_paths = [
        tree_util.keystr(p)
        for p, _ in tree_util.tree_flatten_with_path(
            tree_util.tree_unflatten(out_tree, list(range(out_tree.num_leaves)))
        )[0]
    ]
    program = Program(
        tensors=flat.tensors,
        eqns=flat.eqns,
        invars=invars,
        outvars=outvars,
        out_literals=out_lits,
        consts=flat.consts,
        invar_paths=paths,
        outvar_paths=out_paths,
    )
    return program, out_tree
