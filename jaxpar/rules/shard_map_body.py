"""Which dims of a shard_map's body its automatic mesh axes can split: the dim flow of the body.

A shard_map that names only some mesh axes manual (``axis_names``) leaves the others to the
compiler: XLA partitions the body over them, as it partitions any code, from the layouts of the
operands and results. The planner can then choose those layouts, but only along dims that a
split passes through untouched. `body_dims` follows each dim of the body's values through its
equations (a union-find of (value, dim) pairs):

- an elementwise equation, a cast, a collective over manual axes (``psum``, ``ppermute``,
  ``pvary``, ...) and a call (``pjit``, ``custom_jvp_call``, ``remat``: into its body and back)
  join each dim of an operand to the same dim of its result; ``broadcast_in_dim``,
  ``transpose``, ``squeeze``, ``dot_general``'s batch and free dims, a reduction's kept dims,
  and the dims a slice, pad, concatenation, cumulative op, reversal or gather-like collective
  leaves whole join the dims they carry over; a reshape joins the leading dims it keeps;
- a contraction (``dot_general``) and a ``reduce_sum`` / ``reduce_max`` / ``reduce_min`` end a
  dim: split, it leaves partial results, which XLA completes with an all-reduce over the axes
  splitting it, of the reduction's result (`Reduction`);
- anything else (a loop, a cond, a sort along the dim, an unknown primitive) *blocks* the dims it
  touches, and so does a manual axis: an operand or result dim the specs split by hand.

A class of joined dims that nothing blocks and that some operand or result of the shard_map
carries is an iteration dim the automatic axes may split (`BodyDims.sizes`); its split divides
the body's work, and the bytes of its collectives that carry it.

Pure (no jax import): jaxpr equations are read by attribute.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ..program.jaxprs import spec_axes, sub_jaxprs
from ..program.primitives import ELEMENTWISE

# Calls the flow follows into their body: operand k is the body's input k, result k its output k
CALLS = frozenset(
    ("pjit", "jit", "closed_call", "core_call", "remat", "checkpoint", "custom_jvp_call",
     "custom_vjp_call")
)  # fmt: skip
# Results are their operands position by position (a collective over manual axes, a cast)
POSITIONAL = frozenset(
    ("psum", "psum_invariant", "pmax", "pmin", "pbroadcast", "pvary", "ppermute",
     "optimization_barrier", "copy", "copy_p", "reduce_precision", "convert_element_type")
)  # fmt: skip
# Reductions XLA completes with an all-reduce when the reduced dim is split: primitive -> its op
REDUCTIONS = {"reduce_sum": "sum", "reduce_max": "max", "reduce_min": "min"}
# Ops along one dim (param name): the others follow position by position, that one is blocked
ALONG_ONE = {
    "cumsum": "axis", "cumprod": "axis", "cummax": "axis", "cummin": "axis",
    "cumlogsumexp": "axis", "concatenate": "dimension", "sort": "dimension",
    "argsort": "dimension",
}  # fmt: skip
NO_OPERANDS = frozenset(("iota", "empty", "empty2"))


def _is_literal(v: Any) -> bool:
    return hasattr(v, "val")  # a Literal has a value, a variable none


def _shape(v: Any) -> tuple[int, ...]:
    return tuple(getattr(v.aval, "shape", ()))


@dataclasses.dataclass(frozen=True)
class Reduction:
    """A reduction whose reduced dim an automatic axis may split: XLA all-reduces ``value`` (a
    body value) over the axes splitting ``dim``."""

    dim: int  # the iteration dim (of `BodyDims.sizes`) it reduces
    value: Any  # the body value the all-reduce completes (its shape and dtype are priced)
    op: str  # "sum", "max" or "min"
    at: int  # the index of the top-level body equation it runs in (what it feeds)


@dataclasses.dataclass(frozen=True)
class BodyDims:
    """The iteration dims a shard_map's automatic axes may split, and where the body's values
    carry them."""

    sizes: tuple[int, ...]  # per automatic iteration dim, its size
    invars: tuple[tuple[int | None, ...], ...]  # per body input, per dim: its dim, or None
    outvars: tuple[tuple[int | None, ...], ...]  # per body output, likewise
    reductions: tuple[Reduction, ...]
    _dims_of: Any = dataclasses.field(repr=False, compare=False, default=None)

    def dims_of(self, value: Any) -> tuple[int, ...]:
        """The automatic dims body value ``value`` carries (none for one the flow never saw)."""
        return self._dims_of(value)


class _Flow:
    """Union-find over (body value, dim); blocked keys and reductions found while walking."""

    def __init__(self) -> None:
        self.parent: dict[tuple[Any, int], tuple[Any, int]] = {}
        self.blocked: list[tuple[Any, int]] = []
        self.reductions: list[tuple[tuple[Any, int], Any, str, int]] = []

    def find(self, k: tuple[Any, int]) -> tuple[Any, int]:
        parent = self.parent
        root = k
        while parent.get(root, root) != root:
            root = parent[root]
        while k != root:  # path compression
            parent[k], k = root, parent.get(k, k)
        return root

    def union(self, a: Any, i: int, b: Any, j: int) -> None:
        if _is_literal(a) or _is_literal(b):
            return
        ra, rb = self.find((a, i)), self.find((b, j))
        if ra != rb:
            self.parent[ra] = rb

    def block(self, v: Any, dims: Sequence[int] | None = None) -> None:
        if not _is_literal(v):
            self.blocked += [(v, d) for d in (range(len(_shape(v))) if dims is None else dims)]

    def same(self, a: Any, b: Any) -> None:
        """Join ``a`` and ``b`` dim by dim (equal shapes), else block both."""
        if _is_literal(a) or _is_literal(b):
            return
        if _shape(a) == _shape(b):
            for d in range(len(_shape(a))):
                self.union(a, d, b, d)
        else:
            self.block(a)
            self.block(b)

    def block_all(self, eqn: Any) -> None:
        for v in (*eqn.invars, *eqn.outvars):
            self.block(v)

    def walk(self, jaxpr: Any, top: int | None = None) -> None:
        elementwise = frozenset(ELEMENTWISE)
        for i, eqn in enumerate(jaxpr.eqns):
            at = i if top is None else top
            name = eqn.primitive.name
            if name in CALLS:
                self._call(eqn, at)
            elif name in elementwise:
                out = eqn.outvars[0]
                for v in eqn.invars:
                    if not _is_literal(v) and _shape(v):
                        self.same(v, out)
            elif name in POSITIONAL:
                for a, b in zip(eqn.invars, eqn.outvars, strict=False):
                    self.same(a, b)
            elif name in REDUCTIONS or name == "dot_general":
                self._reduce(eqn, at)
            elif name in _CARRY:
                _CARRY[name](self, eqn)
            elif name in ALONG_ONE:
                along = eqn.params[ALONG_ONE[name]]
                for a in eqn.invars:
                    for b in eqn.outvars:
                        self._all_but(a, b, {along})
            elif name not in NO_OPERANDS:
                self.block_all(eqn)

    def _call(self, eqn: Any, at: int) -> None:
        subs = sub_jaxprs(eqn)
        body = subs[0] if len(subs) == 1 else None
        if body is None or len(body.invars) != len(eqn.invars):
            self.block_all(eqn)
            return
        if len(body.outvars) != len(eqn.outvars):
            self.block_all(eqn)
            return
        for a, b in zip(eqn.invars, body.invars, strict=True):
            self.same(a, b)
        self.walk(body, at)
        for a, b in zip(body.outvars, eqn.outvars, strict=True):
            self.same(a, b)

    def _reduce(self, eqn: Any, at: int) -> None:
        out = eqn.outvars[0]
        if eqn.primitive.name == "dot_general":
            (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
            lhs, rhs = eqn.invars[:2]
            n_l, n_r = len(_shape(lhs)), len(_shape(rhs))
            lf = [d for d in range(n_l) if d not in lc and d not in lb]
            rf = [d for d in range(n_r) if d not in rc and d not in rb]
            for k, (a, b) in enumerate(zip(lb, rb, strict=True)):
                self.union(lhs, a, out, k)
                self.union(rhs, b, out, k)
            for k, d in enumerate(lf):
                self.union(lhs, d, out, len(lb) + k)
            for k, d in enumerate(rf):
                self.union(rhs, d, out, len(lb) + len(lf) + k)
            for a, b in zip(lc, rc, strict=True):
                self.union(lhs, a, rhs, b)
                if not _is_literal(lhs):
                    self.reductions.append(((lhs, a), out, "sum", at))
                else:
                    self.block(rhs, [b])
            return
        (operand,) = eqn.invars
        axes = set(eqn.params["axes"])
        kept = [d for d in range(len(_shape(operand))) if d not in axes]
        for k, d in enumerate(kept):
            self.union(operand, d, out, k)
        for d in axes:
            self.reductions.append(((operand, d), out, REDUCTIONS[eqn.primitive.name], at))

    def _all_but(self, a: Any, b: Any, dims: set[int]) -> None:
        """Join ``a`` and ``b`` dim by dim except ``dims`` (blocked), equal ranks and sizes."""
        if _is_literal(a) or _is_literal(b):
            return
        sa, sb = _shape(a), _shape(b)
        if len(sa) != len(sb):
            self.block(a)
            self.block(b)
            return
        for d in range(len(sa)):
            if d in dims or sa[d] != sb[d]:
                self.block(a, [d])
                self.block(b, [d])
            else:
                self.union(a, d, b, d)


def _broadcast(flow: _Flow, eqn: Any) -> None:
    op, out = eqn.invars[0], eqn.outvars[0]
    for i, d in enumerate(eqn.params["broadcast_dimensions"]):
        if _shape(op)[i] == _shape(out)[d]:
            flow.union(op, i, out, d)
        else:
            flow.block(op, [i])


def _transpose(flow: _Flow, eqn: Any) -> None:
    op, out = eqn.invars[0], eqn.outvars[0]
    for i, d in enumerate(eqn.params["permutation"]):
        flow.union(op, d, out, i)


def _squeeze(flow: _Flow, eqn: Any) -> None:
    op, out = eqn.invars[0], eqn.outvars[0]
    gone = set(eqn.params["dimensions"])
    kept = [d for d in range(len(_shape(op))) if d not in gone]
    for i, d in enumerate(kept):
        flow.union(op, d, out, i)


def _reshape(flow: _Flow, eqn: Any) -> None:
    """The leading dims a reshape keeps carry over; the others are blocked."""
    op, out = eqn.invars[0], eqn.outvars[0]
    so, sr = _shape(op), _shape(out)
    k = 0
    while k < min(len(so), len(sr)) and so[k] == sr[k]:
        flow.union(op, k, out, k)
        k += 1
    if tuple(so[k:]) != tuple(sr[k:]):
        flow.block(op, range(k, len(so)))
        flow.block(out, range(k, len(sr)))
    else:
        for d in range(k, len(so)):
            flow.union(op, d, out, d)


def _whole_dims(flow: _Flow, eqn: Any) -> None:
    """Slices, pads and dynamic slices: the dims they leave whole carry over."""
    op, out = eqn.invars[0], eqn.outvars[0]
    p = eqn.params
    whole = set()
    for d, (so, sr) in enumerate(zip(_shape(op), _shape(out), strict=False)):
        same = so == sr
        if eqn.primitive.name == "pad":
            same = same and tuple(p["padding_config"][d]) == (0, 0, 0)
        if same:
            whole.add(d)
    flow._all_but(op, out, set(range(len(_shape(op)))) - whole)


def _update_slice(flow: _Flow, eqn: Any) -> None:
    op, update, out = eqn.invars[0], eqn.invars[1], eqn.outvars[0]
    diff = {d for d, (a, b) in enumerate(zip(_shape(op), _shape(update), strict=False)) if a != b}
    flow._all_but(op, out, diff)
    flow._all_but(update, out, diff)


def _gathered(flow: _Flow, eqn: Any) -> None:
    """``all_gather`` / ``psum_scatter`` / ``all_to_all`` over manual axes: the dims they do not
    gather, scatter or exchange carry over."""
    p = eqn.params
    dims = {p.get(k) for k in ("all_gather_dimension", "scatter_dimension", "split_axis",
                               "concat_axis")} - {None}  # fmt: skip
    if not p.get("tiled", True) and eqn.primitive.name != "all_to_all":
        flow.block_all(eqn)  # a dim appears or disappears
        return
    flow._all_but(eqn.invars[0], eqn.outvars[0], dims)


_CARRY = {
    "broadcast_in_dim": _broadcast,
    "transpose": _transpose,
    "squeeze": _squeeze,
    "reshape": _reshape,
    "slice": _whole_dims,
    "pad": _whole_dims,
    "dynamic_slice": _whole_dims,
    "dynamic_update_slice": _update_slice,
    "rev": lambda flow, eqn: flow._all_but(
        eqn.invars[0], eqn.outvars[0], set(eqn.params["dimensions"])
    ),
    "all_gather": _gathered,
    "all_gather_invariant": _gathered,
    "psum_scatter": _gathered,
    "reduce_scatter": _gathered,
    "all_to_all": _gathered,
}


def body_dims(jaxpr: Any, in_specs: Sequence[Any], out_specs: Sequence[Any], whole: Sequence[bool],
              outputs_whole: Sequence[bool]) -> BodyDims:  # fmt: skip
    """The automatic iteration dims of a shard_map body ``jaxpr`` (see the module docstring).
    ``in_specs`` / ``out_specs``: the shard_map's; ``whole`` / ``outputs_whole``: per operand /
    result, whether none of its dims may be split (a literal, a per-device stack)."""
    flow = _Flow()
    for vs, specs, fixed in ((jaxpr.invars, in_specs, whole), (jaxpr.outvars, out_specs,
                                                                 outputs_whole)):  # fmt: skip
        for v, spec, stuck in zip(vs, specs, fixed, strict=True):
            if stuck:
                flow.block(v)
            else:
                flow.block(v, [d for d, entry in enumerate(spec) if spec_axes(entry)])
    flow.walk(jaxpr)
    blocked = {flow.find(k) for k in flow.blocked}
    index: dict[tuple[Any, int], int] = {}
    sizes: list[int] = []

    def dims(v: Any, named: bool) -> tuple[int | None, ...]:
        if _is_literal(v):
            return ()
        out: list[int | None] = []
        for d, size in enumerate(_shape(v)):
            root = flow.find((v, d))
            if root in blocked or (root not in index and not named):
                out.append(None)
                continue
            if root not in index:
                index[root] = len(sizes)
                sizes.append(size)
            out.append(index[root])
        return tuple(out)

    invars = tuple(dims(v, True) for v in jaxpr.invars)
    outvars = tuple(dims(v, True) for v in jaxpr.outvars)
    reductions = []
    for key, value, op, at in flow.reductions:
        root = flow.find(key)
        if root in index and root not in blocked:
            reductions.append(Reduction(index[root], value, op, at))

    def dims_of(value: Any) -> tuple[int, ...]:
        return tuple(d for d in dims(value, False) if d is not None)

    return BodyDims(tuple(sizes), invars, outvars, tuple(reductions), dims_of)
