"""The trip count of a ``while`` loop, when tracing already knows it (`counted_trips`).

A ``fori_loop`` whose bounds are not Python ints (``jnp.int32(4)``, a closed-over array) and a
hand-written ``lax.while_loop(lambda c: c[0] < n, ...)`` lower to ``while``, not ``scan``, yet
run a count fixed before the step starts. The loop's *control* is the part of its carry the
condition reads, closed under the body's updates of it (a counter, a fori_loop's upper bound).
When that part starts from constants and the condition and its updates read nothing else but
constants, the count follows from running the control alone, here in numpy: the loop can then
be planned as a scan of that many iterations (`trace`). Anything else (a condition on data, an
unknown primitive, more than `MAX_TRIPS` iterations) gives None: the loop stays one replicated
node, with a warning.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from jax.extend import core as jex_core

MAX_TRIPS = 100_000  # longer loops are not simulated (their count stays unknown)
MAX_CONTROL_ELEMENTS = 64  # a control value larger than this is data, not a counter

# The integer and boolean arithmetic a loop's control uses, as numpy computes it (int32 wraps
# as XLA's does; "and"/"or"/"not" are bitwise on integers and logical on booleans, like numpy's).
_OPS: dict[str, Callable[..., Any]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "neg": np.negative,
    "max": np.maximum, "min": np.minimum, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal, "eq": np.equal, "ne": np.not_equal,
    "and": np.bitwise_and, "or": np.bitwise_or, "not": np.invert,
}  # fmt: skip


class _Unknown(Exception):
    """The control reads something tracing cannot know."""


def _needs(jaxpr: Any, outputs: list[int]) -> tuple[list[int], list[Any]]:
    """(positions of the invars ``jaxpr``'s ``outputs`` depend on, the equations computing
    them, in order)."""
    need = {v for i in outputs if not isinstance(v := jaxpr.outvars[i], jex_core.Literal)}
    eqns = []
    for eqn in reversed(jaxpr.eqns):
        if any(o in need for o in eqn.outvars):
            eqns.append(eqn)
            need.update(v for v in eqn.invars if not isinstance(v, jex_core.Literal))
    return [k for k, v in enumerate(jaxpr.invars) if v in need], eqns[::-1]


def _run(closed: Any, eqns: list[Any], inputs: dict[int, np.ndarray], outputs: list[int]) -> list:
    """``outputs`` of ``closed`` from the invars at the positions in ``inputs``, running only
    ``eqns`` (`_needs`) in numpy."""
    jaxpr = closed.jaxpr
    env: dict = {cv: np.asarray(c) for cv, c in zip(jaxpr.constvars, closed.consts, strict=True)}
    env.update({jaxpr.invars[k]: v for k, v in inputs.items()})

    def read(atom: Any) -> np.ndarray:
        if isinstance(atom, jex_core.Literal):
            return np.asarray(atom.val, dtype=atom.aval.dtype)
        return env[atom]

    for eqn in eqns:
        name = eqn.primitive.name
        args = [read(a) for a in eqn.invars]
        if name == "convert_element_type":
            out = args[0].astype(eqn.params["new_dtype"])
        elif name in _OPS:
            out = np.asarray(_OPS[name](*args), dtype=eqn.outvars[0].aval.dtype)
        else:
            raise _Unknown(name)
        env[eqn.outvars[0]] = out
    return [read(jaxpr.outvars[i]) for i in outputs]


def counted_trips(eqn: Any, known: Callable[[Any], np.ndarray | None]) -> int | None:
    """The iterations ``while`` equation ``eqn`` runs, or None when tracing cannot know them.

    ``known(atom)`` is the constant value of one of the equation's operands (a literal, a
    constant of the step), or None. A loop that never runs gives None too: it is left to run as
    written.
    """
    p = eqn.params
    cond, body = p["cond_jaxpr"], p["body_jaxpr"]
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    operands = list(eqn.invars)
    try:
        cond_in, cond_eqns = _needs(cond.jaxpr, [0])
        control = {k - cn for k in cond_in if k >= cn}
        while True:  # close the control under the body's updates of it
            body_in, body_eqns = _needs(body.jaxpr, sorted(control))
            more = {k - bn for k in body_in if k >= bn}
            if more <= control:
                break
            control |= more
        cond_consts = {k: _constant(known, operands[k]) for k in cond_in if k < cn}
        body_consts = {k: _constant(known, operands[cn + k]) for k in body_in if k < bn}
        order = sorted(control)
        values = [_constant(known, operands[cn + bn + k]) for k in order]
        for trips in range(MAX_TRIPS + 1):
            state = {cn + k: v for k, v in zip(order, values, strict=True)}
            if not bool(_run(cond, cond_eqns, {**cond_consts, **state}, [0])[0]):
                return trips or None
            state = {bn + k: v for k, v in zip(order, values, strict=True)}
            values = _run(body, body_eqns, {**body_consts, **state}, order)
    except (_Unknown, TypeError, ValueError, KeyError, OverflowError):
        return None  # a control tracing cannot run (an extended dtype, a non-scalar condition)
    return None


def _constant(known: Callable[[Any], np.ndarray | None], atom: Any) -> np.ndarray:
    value = known(atom)
    if value is None:
        raise _Unknown("an operand computed in the step")
    value = np.asarray(value)
    if value.size > MAX_CONTROL_ELEMENTS or value.dtype == object:
        raise _Unknown("a large operand")
    return value
