"""Trace a user function to a flat `Program`: one jaxpr, nested calls inlined.

Calls (jit/pjit, closed_call, custom_jvp_call, custom_vjp_call, checkpoint/remat) are inlined so
the planner sees every equation; a ``custom_linear_solve`` (``jnp.linalg.solve``) is its solve's
body, inlined the same way. A ``scan`` (``lax.scan``, ``nn.scan``, ``nnx.scan``, a
``fori_loop`` with static bounds) has its body inlined once, between the `graph.SCAN_CARRY` /
`graph.SCAN_SLICE` equations that bring in the carry and the per-iteration slices and the
`graph.SCAN_STACK` equations that stack the ys, and is recorded as a `graph.Region`: the planner
plans the body once and prices it per iteration. A ``cond`` has every branch inlined, each
result merged by a `graph.COND_MERGE` equation into one layout. A ``while`` whose trip count tracing
can know (`while_trips`: a ``fori_loop`` with array bounds, a counter against a constant) is
inlined as a scan of that count over its carry; any other ``while`` stays one equation, planned
as one replicated node (see `rules.py`).

``checkpoint_name`` (the ``name`` primitive) is dropped: JAX has applied the remat policy that
reads it by the time the step is a jaxpr, and XLA never sees it. So is a ``reduce_precision``
that keeps every bit of its type (what ``save_only_these_names`` puts on each saved name; XLA's
simplifier removes it).

Non-array leaves of the arguments (Python scalars, strings, None) are static: they are part of the
signature and are closed over, exactly as `jax.jit(static_argnums=...)` would treat them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util
from jax.extend import core as jex_core
from jax.sharding import AbstractMesh, AxisType, PartitionSpec

try:  # JAX's own dead-code elimination (internal: absent in some version, we skip it)
    from jax._src.interpreters.partial_eval import dce_jaxpr as _dce_jaxpr
except ImportError:  # pragma: no cover - depends on the installed JAX
    _dce_jaxpr = None

from ..program.graph import (
    CALL_BODIES,
    COND,
    COND_MERGE,
    SCAN,
    SCAN_CARRY,
    SCAN_SLICE,
    SCAN_STACK,
    Equation,
    Program,
    Region,
    Tensor,
    UserConstraint,
)
from ..program.shard_map_stacks import per_device_stacks
from .flax_names import (
    LOGICAL_SCOPE,
    boxed_names,
    logical_rules_in_context,
    logical_scope,
    tagged_logical_constraints,
    without_logical_scope,
)
from .while_trips import counted_trips

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
    # (shape, dtype, host memory kind or None: `host_memory_kind`) per array leaf
    arrays: tuple[tuple[tuple[int, ...], str, str | None], ...]
    static: tuple[tuple[int, Any], ...]  # (leaf index, value) of the static leaves

    @classmethod
    def of(cls, args: tuple) -> Signature:
        leaves, treedef = tree_util.tree_flatten(args, is_leaf=lambda x: x is None)
        arrays, static = [], []
        for i, leaf in enumerate(leaves):
            if is_array_leaf(leaf):
                arrays.append((tuple(leaf.shape), str(leaf.dtype), host_memory_kind(leaf)))
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


def host_memory_kind(leaf: Any) -> str | None:
    """The host memory kind an array argument is held in (``"pinned_host"``, an offloaded
    optimizer state), or None for device memory."""
    kind = getattr(getattr(leaf, "sharding", None), "memory_kind", None)
    return kind if kind in _HOST_KINDS else None


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


def _argument_names(args: tuple, paths: list[str], invars: list[int]) -> dict:
    """Argument tensor -> the logical names of its Flax box (`flax_names.boxed_names`)."""
    names = boxed_names(args)
    return {t: names[p] for p, t in zip(paths, invars, strict=True) if p in names}


def _dtype_info(aval: Any) -> tuple[str, int]:
    return _dtype_name_and_size(aval.dtype)


@functools.lru_cache(maxsize=256)
def _dtype_name_and_size(dt: Any) -> tuple[str, int]:
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
        self.regions: list[Region] = []
        self.region = -1  # the region whose body is being walked
        self.constraints: list[UserConstraint] = []
        self.logical: dict[int, tuple[str | None, ...]] = {}  # tensor -> logical names

    def new_tensor(self, aval: Any) -> int:
        dtype, itemsize = _dtype_info(aval)
        host = getattr(aval, "memory_space", None) == jax.memory.Space.Host
        self.tensors.append(Tensor(tuple(int(d) for d in aval.shape), dtype, itemsize, host=host))
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
            logical = None
            if LOGICAL_SCOPE in stack:  # a Flax logical constraint (`flax_names`)
                logical, stack = logical_scope(stack), without_logical_scope(stack)
            if name in ("scan", "cond"):
                getattr(self, name)(eqn, env, stack)
                continue
            if name == "name" and not isinstance(eqn.invars[0], jex_core.Literal):
                # `checkpoint_name`: an identity once JAX has applied the remat policy, and
                # nothing in the compiled program
                env[eqn.outvars[0]] = env[eqn.invars[0]]
                continue
            if name == "reduce_precision" and _keeps_precision(eqn):
                # what `save_only_these_names` puts on each name it saves: the identity, which
                # XLA's simplifier removes (no buffer, no kernel)
                env[eqn.outvars[0]] = env[eqn.invars[0]]
                continue
            if name == "while" and (trips := counted_trips(eqn, self.constant(env))) is not None:
                self.counted_while(eqn, env, stack, trips)
                continue
            if name == "device_put":
                self.device_put(eqn, env, stack)
                continue
            if name == "custom_linear_solve":
                self.linear_solve(eqn, env, stack)
                continue
            body_key = CALL_BODIES.get(name)
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
            self.add(name, dict(eqn.params), ins, lits, outs, stack, eqn.primitive)
            if name == "sharding_constraint" and ins[0] is not None:
                self.user_constraint(self.eqns[-1], logical)

    def user_constraint(self, eqn: Equation, logical: tuple[str | None, ...] | None) -> None:
        """Record a ``sharding_constraint`` the user's step makes (`graph.UserConstraint`)."""
        tid = eqn.outputs[0]
        ndim = len(self.tensors[tid].shape)
        spec, sizes = constraint_spec(
            eqn.params.get("sharding"), eqn.params.get("unconstrained_dims", ()), ndim
        )
        if logical is not None and len(logical) != ndim:
            logical = None
        if logical is not None:
            self.logical[tid] = logical
        self.constraints.append(
            UserConstraint(
                eqn=eqn.index, tensor=tid, spec=spec or (None,) * ndim, axis_sizes=sizes,
                logical=logical, name_stack=eqn.name_stack, readable=spec is not None,
            )
        )  # fmt: skip

    def linear_solve(self, eqn: Any, env: dict, stack: str) -> None:
        """``custom_linear_solve`` (``jnp.linalg.solve``): its value is its solve body's, read
        from the solve's consts and the right-hand sides (operands: the consts of matvec,
        vecmat, solve and transpose_solve in turn, then b)."""
        lengths = eqn.params["const_lengths"]
        start = lengths.matvec + lengths.vecmat
        consts = list(eqn.invars)[start : start + lengths.solve]
        b = list(eqn.invars)[sum(lengths) :]
        self.inline(eqn.params["jaxprs"].solve, eqn, env, stack, operands=consts + b)

    def device_put(self, eqn: Any, env: dict, stack: str) -> None:
        """``jax.device_put`` inside the step, one array at a time. A move between memory
        spaces (a remat policy's offload to ``pinned_host`` and back, a sharding with a host
        memory kind) stays, as a ``device_put`` to that space alone; a move to a layout or a
        device in the same memory is the identity: the plan's layouts replace it, as they
        replace a sharding constraint."""
        p = eqn.params
        for k, (atom, out) in enumerate(zip(eqn.invars, eqn.outvars, strict=True)):
            if isinstance(out, jex_core.DropVar):
                continue
            tid, lit = self.read(env, atom)
            if tid is None:
                tid = self.const_tensor(out.aval, lit)
            space = _memory_move(p["devices"][k], self.tensors[tid].host)
            if space is None:
                env[out] = tid
                continue
            env[out] = self.new_tensor(out.aval)
            params = {"devices": (space,), "srcs": (p["srcs"][k],)}
            params["copy_semantics"] = (p["copy_semantics"][k],)
            self.add("device_put", params, [tid], [None], [env[out]], stack, eqn.primitive)

    def add(self, primitive, params, ins, lits, outs, stack: str, bind: Any = None) -> None:
        self.eqns.append(
            Equation(
                index=len(self.eqns), primitive=primitive, params=params, inputs=tuple(ins),
                literals=tuple(lits), outputs=tuple(outs), name_stack=stack, bind=bind,
                region=self.region,
            )
        )  # fmt: skip

    def const_tensor(self, aval: Any, value: Any) -> int:
        tid = self.new_tensor(aval)
        self.consts[tid] = value
        return tid

    def enter(self) -> tuple[int, int]:
        """Open a region: (its index, its parent); equations added now belong to it."""
        index = len(self.regions)
        self.regions.append(None)  # type: ignore[arg-type]  # filled in when it closes
        parent, self.region = self.region, index
        return index, parent

    def body(self, closed: Any, inner_env: dict, stack: str) -> tuple[tuple[int, int], list[int]]:
        """Walk one body: ([start, stop) of its equations, its result tensors)."""
        inner = closed.jaxpr
        for cv, c in zip(inner.constvars, closed.consts, strict=True):
            inner_env[cv] = self.const_tensor(cv.aval, c)
        start = len(self.eqns)
        self.walk(inner, inner_env, stack)
        results = []
        for ov in inner.outvars:
            tid, lit = self.read(inner_env, ov)
            results.append(self.const_tensor(ov.aval, lit) if tid is None else tid)
        return (start, len(self.eqns)), results

    def operand(self, env: dict, atom: Any, aval: Any) -> int:
        """A loop-invariant operand, read by the body as the outer tensor."""
        tid, lit = self.read(env, atom)
        return self.const_tensor(aval, lit) if tid is None else tid

    def loop_entry(
        self, closed: Any, operands: list, n_consts: int, n_carry: int, env: dict, stack: str
    ) -> dict:
        """A loop body's environment: its ``n_consts`` loop invariants read as the outer
        tensors, then one `SCAN_CARRY` per carry and one `SCAN_SLICE` per sliced operand."""
        invars = closed.jaxpr.invars
        inner_env = {
            iv: self.operand(env, atom, iv.aval)
            for iv, atom in zip(invars[:n_consts], operands[:n_consts], strict=True)
        }
        for k, (iv, atom) in enumerate(zip(invars[n_consts:], operands[n_consts:], strict=True)):
            tid, lit = self.read(env, atom)
            inner_env[iv] = self.new_tensor(iv.aval)
            prim = SCAN_CARRY if k < n_carry else SCAN_SLICE
            self.add(prim, {}, [tid], [lit], [inner_env[iv]], stack)
        return inner_env

    def scan(self, eqn: Any, env: dict, stack: str) -> None:
        """Inline a scan's body once as a `Region` (see the module docstring)."""
        p = eqn.params
        closed, n_consts, n_carry = p["jaxpr"], p["num_consts"], p["num_carry"]
        first = len(self.eqns)
        index, parent = self.enter()
        inner_env = self.loop_entry(closed, list(eqn.invars), n_consts, n_carry, env, stack)
        span, results = self.body(closed, inner_env, stack)
        for outer, tid in zip(eqn.outvars[:n_carry], results[:n_carry], strict=True):
            if not isinstance(outer, jex_core.DropVar):
                env[outer] = tid
        for outer, tid in zip(eqn.outvars[n_carry:], results[n_carry:], strict=True):
            out = self.new_tensor(outer.aval)
            self.add(SCAN_STACK, {}, [tid], [None], [out], stack)
            if not isinstance(outer, jex_core.DropVar):
                env[outer] = out
        self.regions[index] = Region(
            index=index, kind=SCAN, parent=parent, trips=int(p["length"]), first=first,
            bodies=(span,), end=len(self.eqns), carry_out=tuple(results[:n_carry]),
            reverse=bool(p["reverse"]), unroll=p.get("unroll", 1),
        )  # fmt: skip
        self.region = parent

    def constant(self, env: dict) -> Any:
        """The value of an operand known when tracing (a literal, a constant), or None."""

        def value(atom: Any) -> Any:
            tid, lit = self.read(env, atom)
            return lit if tid is None else self.consts.get(tid)

        return value

    def counted_while(self, eqn: Any, env: dict, stack: str, trips: int) -> None:
        """Inline a ``while`` of a known trip count (`while_trips`) as a scan `Region` over its
        body: the carry is the loop's, nothing is sliced or stacked, and the condition, which
        only counts, is dropped (the body still updates the counter)."""
        p = eqn.params
        body, cn, bn = p["body_jaxpr"], p["cond_nconsts"], p["body_nconsts"]
        # JAX keeps a while body's dead equations (a loss value only its gradient's trace
        # computed); XLA drops them, as it does a scan body's
        closed = jex_core.ClosedJaxpr(_without_dead_code(body.jaxpr), body.consts)
        operands = list(eqn.invars)[cn:]
        first = len(self.eqns)
        index, parent = self.enter()
        inner_env = self.loop_entry(closed, operands, bn, len(operands) - bn, env, stack)
        span, results = self.body(closed, inner_env, stack)
        for outer, tid in zip(eqn.outvars, results, strict=True):
            if not isinstance(outer, jex_core.DropVar):
                env[outer] = tid
        self.regions[index] = Region(
            index=index, kind=SCAN, parent=parent, trips=trips, first=first, bodies=(span,),
            end=len(self.eqns), carry_out=tuple(results),
        )  # fmt: skip
        self.region = parent

    def cond(self, eqn: Any, env: dict, stack: str) -> None:
        """Inline every branch of a cond as a `Region`; its results merge in one layout."""
        branch_index, literal = self.read(env, eqn.invars[0])
        operands = list(eqn.invars[1:])
        first = len(self.eqns)
        index, parent = self.enter()
        spans, results = [], []
        for closed in eqn.params["branches"]:
            inner_env = {
                iv: self.operand(env, atom, iv.aval)
                for iv, atom in zip(closed.jaxpr.invars, operands, strict=True)
            }
            span, outs = self.body(closed, inner_env, stack)
            spans.append(span)
            results.append(outs)
        for k, outer in enumerate(eqn.outvars):
            out = self.new_tensor(outer.aval)
            self.add(COND_MERGE, {}, [r[k] for r in results], [None] * len(results), [out], stack)
            if not isinstance(outer, jex_core.DropVar):
                env[outer] = out
        self.regions[index] = Region(
            index=index, kind=COND, parent=parent, trips=1, first=first, bodies=tuple(spans),
            end=len(self.eqns), branch_index=branch_index, branch_literal=literal,
        )  # fmt: skip
        self.region = parent

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
            where = f"{stack}/remat_barrier" if stack else "remat_barrier"
            self.add("optimization_barrier", {}, [src], [None], [out], where, prim)
            over[atom] = out
        return over

    def inline(
        self,
        body: Any,
        eqn: Any,
        env: dict,
        stack: str,
        over: dict | None = None,
        operands: list | None = None,
    ) -> None:
        """Walk ``body`` in place of ``eqn``, its invars read from ``operands`` (default: the
        last of ``eqn``'s operands, one per invar), its outvars bound to ``eqn``'s."""
        if isinstance(body, jex_core.ClosedJaxpr):
            inner, consts = body.jaxpr, body.consts
        else:
            inner, consts = body, ()
        inner_env: dict = {}
        for cv, c in zip(inner.constvars, consts, strict=True):
            tid = self.new_tensor(cv.aval)
            self.consts[tid] = c
            inner_env[cv] = tid
        if operands is None:  # custom_vjp_call_jaxpr-style calls may lead with extra consts
            operands = list(eqn.invars)[-len(inner.invars) :] if inner.invars else []
        for iv, atom in zip(inner.invars, operands, strict=True):
            barred = over and not isinstance(atom, jex_core.Literal) and atom in over
            tid, lit = (over[atom], None) if barred else self.read(env, atom)
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


_HOST_KINDS = ("pinned_host", "unpinned_host")


def _keeps_precision(eqn: Any) -> bool:
    """Whether a ``reduce_precision`` keeps every exponent and mantissa bit of its operand's
    float type (a non-literal operand): the identity."""
    atom = eqn.invars[0]
    if isinstance(atom, jex_core.Literal):
        return False
    info = jnp.finfo(atom.aval.dtype)
    p = eqn.params
    return p["exponent_bits"] >= info.nexp and p["mantissa_bits"] >= info.nmant


def _memory_move(dst: Any, on_host: bool) -> Any:
    """The memory space a ``device_put`` to ``dst`` moves an array held on the host
    (``on_host``) or not into (`jax.memory.Space`), or None when it stays where it is."""
    if isinstance(dst, jax.memory.Space):
        to_host = None if dst == jax.memory.Space.Any else dst == jax.memory.Space.Host
    elif isinstance(dst, jax.sharding.Sharding):
        to_host = dst.memory_kind in _HOST_KINDS
    else:  # a device, or None: its default memory
        to_host = False
    if to_host is None or to_host == on_host:
        return None
    return jax.memory.Space.Host if to_host else jax.memory.Space.Device


def constraint_spec(
    sharding: Any, unconstrained: Any, ndim: int
) -> tuple[tuple[tuple[str, ...] | None, ...] | None, tuple[tuple[str, int], ...]]:
    """(per dim: the mesh axes a constraint's sharding splits it over, () replicated, None
    free; the sharding's mesh as (name, size) pairs). (None, ()) for a sharding that is not a
    `NamedSharding` (it names no mesh axes)."""
    spec = getattr(sharding, "spec", None)
    mesh = getattr(sharding, "mesh", None)
    if spec is None or mesh is None:
        return None, ()
    sizes = tuple((str(n), int(s)) for n, s in zip(mesh.axis_names, mesh.axis_sizes, strict=True))
    free = set(unconstrained or ())
    out: list[tuple[str, ...] | None] = []
    for d in range(ndim):
        entry = spec[d] if d < len(spec) else None
        if d in free or entry is PartitionSpec.UNCONSTRAINED:
            out.append(None)
        elif entry is None:
            out.append(())
        else:
            out.append((entry,) if isinstance(entry, str) else tuple(entry))
    return tuple(out), sizes


def planning_abstract_mesh(names: tuple[str, ...], sizes: tuple[int, ...]) -> AbstractMesh:
    """The mesh a step is traced under: the planning mesh's axes, all `AxisType.Auto`, with no
    devices. Inside it, Flax's logical constraints become real ``sharding_constraint``
    equations (Flax emits none without a mesh in context) and bare-PartitionSpec constraints
    resolve."""
    return AbstractMesh(tuple(sizes), tuple(names), axis_types=(AxisType.Auto,) * len(names))


def _jaxpr_of(flat_fn: Any, abstract: list, mesh: AbstractMesh | None) -> tuple[Any, tuple]:
    """The closed jaxpr of ``flat_fn`` and the logical axis rules its Flax constraints applied.

    Traced as it is first. When Flax's logical constraints asked for rules and no mesh is in
    context (Flax then constrains nothing), traced again under ``mesh``, so that they become
    ``sharding_constraint`` equations. Other steps are traced without a mesh in context, as
    ``jax.jit`` traces them (a ``shard_map`` over a concrete mesh refuses an abstract one)."""
    with _traced_under(None) as rules_seen:
        closed = jax.make_jaxpr(flat_fn)(*abstract)
        rules = logical_rules_in_context(rules_seen)
    if rules_seen and mesh is not None and jax.sharding.get_abstract_mesh().empty:
        with _traced_under(mesh) as rules_seen:
            closed = jax.make_jaxpr(flat_fn)(*abstract)
            rules = logical_rules_in_context(rules_seen)
    return closed, rules


@contextlib.contextmanager
def _traced_under(mesh: AbstractMesh | None) -> Iterator[list]:
    """Flax's logical constraints tagged with their names, and ``mesh`` in context unless the
    user set one (`jax.set_mesh`, `jax.sharding.use_abstract_mesh`): theirs then rules.
    Yields the list of the logical axis rules Flax applied (`flax_names`)."""
    with contextlib.ExitStack() as stack:
        rules_seen = stack.enter_context(tagged_logical_constraints())
        if mesh is not None and jax.sharding.get_abstract_mesh().empty:
            stack.enter_context(jax.sharding.use_abstract_mesh(mesh))
        yield rules_seen


def _without_dead_code(jaxpr: Any) -> Any:
    """``jaxpr`` without the equations no result depends on (every argument kept), as XLA
    drops them: differentiation traces primal values only a tangent reads, and a tangent
    stopped by ``stop_gradient`` leaves them dead (a log-softmax's row-maximum mask, ``sign``
    of an ``abs``). Planned, they were priced as compute and their reshards as collectives
    the compiled program does not run."""
    if _dce_jaxpr is None:
        return jaxpr
    return _dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars), instantiate=True)[0]


def trace(fn: Any, args: tuple, mesh: AbstractMesh | None = None) -> tuple[Program, Any]:
    """Trace ``fn(*args)`` to a flat Program; also return the output treedef.

    ``mesh`` (`planning_abstract_mesh`): when the step's Flax logical constraints need a mesh
    in context and none is set, traced again under it (`_jaxpr_of`). The program records the user's
    sharding constraints and the logical names Flax gives (`flax_names`)."""
    Signature.of(args)  # validates the static leaves
    arrays, paths, rebuild = split_args(args)
    out_tree_box: list[Any] = []

    def flat_fn(*flat):
        out = fn(*rebuild(list(flat)))
        leaves, tree = tree_util.tree_flatten(out)
        out_tree_box.append(tree)
        return leaves

    # an argument in host memory keeps its sharding: its aval is in the host's memory space
    abstract = [
        jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding if host_memory_kind(a) else None)
        for a in arrays
    ]
    try:
        closed, rules = _jaxpr_of(flat_fn, abstract, mesh)
    except Exception as err:
        raise TraceError(
            f"could not trace {getattr(fn, '__name__', fn)!r} to a jaxpr: "
            f"{type(err).__name__}: {err}. jaxpar plans functions that jax.jit can trace: "
            "no Python control flow on array values, no side effects on arrays."
        ) from err
    jaxpr = _without_dead_code(closed.jaxpr)
    flat = _Flattener()
    env: dict = {}
    for cv, c in zip(jaxpr.constvars, closed.consts, strict=True):
        tid = flat.new_tensor(cv.aval)
        flat.consts[tid] = c
        env[cv] = tid
    invars = []
    for v in jaxpr.invars:
        tid = flat.new_tensor(v.aval)
        env[v] = tid
        invars.append(tid)
    flat.walk(jaxpr, env, "")
    outvars, out_lits = [], []
    for v in jaxpr.outvars:
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
        regions=flat.regions,
        threefry_partitionable=bool(jax.config.jax_threefry_partitionable),
        user_constraints=flat.constraints,
        logical_names=_argument_names(args, paths, invars) | flat.logical,
        logical_rules=rules,
    )
    for tid, block in per_device_stacks(program).items():
        program.tensors[tid] = block  # a differentiated shard_map's residuals
    return program, out_tree
