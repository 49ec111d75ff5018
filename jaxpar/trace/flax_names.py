"""Flax's logical axis names at trace time: the names of its logical constraints and of its
boxed (logically partitioned) parameters, which the jaxpr alone does not keep.

- ``nn.with_logical_constraint(x, names)`` becomes a ``sharding_constraint`` on mesh axes; its
  logical names are gone from the jaxpr. While tracing, `tagged_logical_constraints` wraps
  Flax's one entry point for them so that each constraint is traced inside a name scope
  carrying its names (`LOGICAL_SCOPE`); `logical_scope` reads them back from an equation's name
  stack and `without_logical_scope` removes the scope again (layer labels never see it).
- ``nn.with_logical_partitioning`` parameters arrive boxed (``nn.LogicallyPartitioned``, a
  subclass of ``flax.core.meta.Partitioned``): `boxed_names` gives the names of each array
  leaf inside such a box, keyed like `tracing.split_args` keys the leaves.
- `logical_rules_in_context`: the logical axis rules the step applied (or those in force).

Flax is looked up in ``sys.modules`` only: a step that never imported it has none of these.
"""

from __future__ import annotations

import contextlib
import functools
import re
import sys
from collections.abc import Iterator
from typing import Any

import jax
from jax import tree_util

LOGICAL_SCOPE = "jaxpar.logical"  # the name scope a logical constraint is traced in
_SCOPE_RE = re.compile(re.escape(LOGICAL_SCOPE) + r"\[([^\]]*)\]")
_NONE = "-"  # a dim without a logical name, in the scope's text


def _scope_name(names: Any) -> str | None:
    """The scope text of one logical spec (a tuple of names / None), or None when it is not
    a flat tuple of names (then the constraint is traced untagged)."""
    if not isinstance(names, (tuple, list)):
        return None
    parts = []
    for n in names:
        if n is None:
            parts.append(_NONE)
        elif isinstance(n, str) and re.fullmatch(r"[\w.]+", n):
            parts.append(n)
        else:  # UNCONSTRAINED, a nested tuple of names: not a plain name
            parts.append(_NONE)
    return f"{LOGICAL_SCOPE}[{','.join(parts)}]"


def _tagging(original: Any, rules_seen: list) -> Any:
    """Flax's per-array constraint function, traced inside a scope naming its logical axes;
    the rules it applies are appended to ``rules_seen`` (each set once)."""

    @functools.wraps(original)
    def tagged(axis_resources: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
        rules = kwargs.get("rules")
        if rules and not any(r is rules for r in rules_seen):
            rules_seen.append(rules)
        scope = _scope_name(axis_resources)
        if scope is None:
            return original(axis_resources, x, *args, **kwargs)
        with jax.named_scope(scope):
            return original(axis_resources, x, *args, **kwargs)

    tagged.__jaxpar_tagged__ = True
    return tagged


@contextlib.contextmanager
def tagged_logical_constraints() -> Iterator[list]:
    """While tracing: Flax's logical constraints traced inside a scope naming their axes.
    Yields the list of the logical axis rules they apply (filled while tracing).

    Flax applies ``nn.with_logical_constraint`` array by array through one module-level
    function of ``flax.linen.spmd``; it is wrapped for the duration and restored after. A
    Flax without that function is left alone (its constraints are then planned unnamed)."""
    rules_seen: list = []
    spmd = sys.modules.get("flax.linen.spmd")
    name = "_with_sharding_constraint_one_fallback"
    original = getattr(spmd, name, None) if spmd is not None else None
    if original is None or getattr(original, "__jaxpar_tagged__", False):
        yield rules_seen
        return
    setattr(spmd, name, _tagging(original, rules_seen))
    try:
        yield rules_seen
    finally:
        setattr(spmd, name, original)


def logical_scope(name_stack: str) -> tuple[str | None, ...] | None:
    """The logical names an equation was traced under (`tagged_logical_constraints`), or None."""
    found = _SCOPE_RE.findall(name_stack)
    if not found:
        return None
    return tuple(None if n == _NONE else n for n in found[-1].split(",")) if found[-1] else ()


def without_logical_scope(name_stack: str) -> str:
    """``name_stack`` without the scopes `tagged_logical_constraints` added."""
    if LOGICAL_SCOPE not in name_stack:
        return name_stack
    return re.sub(r"/?" + _SCOPE_RE.pattern, "", name_stack)


def _is_box(x: Any) -> bool:
    meta = sys.modules.get("flax.core.meta")
    return meta is not None and isinstance(x, meta.Partitioned)


def boxed_names(args: tuple) -> dict[str, tuple[str | None, ...]]:
    """Argument leaf path (`tree_util.keystr`, as `tracing.split_args` gives it) -> the
    logical names of a leaf held in a Flax ``Partitioned`` box (``nn.LogicallyPartitioned``:
    logical names; ``nn.Partitioned``: mesh axis names), one per dim."""
    if "flax.core.meta" not in sys.modules:
        return {}
    out: dict[str, tuple[str | None, ...]] = {}
    with_path, _ = tree_util.tree_flatten_with_path(args, is_leaf=lambda x: x is None or _is_box(x))
    for path, leaf in with_path:
        if not _is_box(leaf):
            continue
        for inner, value in tree_util.tree_flatten_with_path(leaf)[0]:
            names = tuple(leaf.names)
            if len(names) == len(getattr(value, "shape", ())):
                out[tree_util.keystr((*path, *inner))] = names
    return out


def logical_rules_in_context(rules_seen: list) -> tuple[tuple[str, Any], ...]:
    """The logical axis rules of a step: the first its constraints applied
    (`tagged_logical_constraints`), else the ``nn.logical_axis_rules`` in force now (empty
    without Flax or rules)."""
    if rules_seen:
        return tuple((str(n), a) for n, a in rules_seen[0])
    spmd = sys.modules.get("flax.linen.spmd")
    if spmd is None:
        return ()
    return tuple((str(n), a) for n, a in spmd.get_logical_axis_rules())
