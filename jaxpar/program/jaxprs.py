"""Reading JAX's own jaxprs and specs by attribute: the jaxprs inside an equation, the axes a
PartitionSpec entry names. Pure: no jax import.
"""

from __future__ import annotations

from typing import Any

_SUB_JAXPRS = ("jaxpr", "call_jaxpr", "fun_jaxpr")


def spec_axes(entry: Any) -> tuple[str, ...]:
    """The mesh axes one entry of a PartitionSpec names (None: none)."""
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def inner_jaxpr(jaxpr: Any) -> Any:
    return getattr(jaxpr, "jaxpr", jaxpr)  # a ClosedJaxpr's jaxpr, or the jaxpr itself


def sub_jaxprs(eqn: Any) -> list[Any]:
    """The jaxprs a (JAX) equation runs inside: a call's, a loop's body and condition, a
    cond's branches."""
    subs = [inner_jaxpr(eqn.params[k]) for k in _SUB_JAXPRS if k in eqn.params]
    subs += [inner_jaxpr(b) for b in eqn.params.get("branches", ())]
    for k in ("body_jaxpr", "cond_jaxpr"):
        if k in eqn.params:
            subs.append(inner_jaxpr(eqn.params[k]))
    return subs
