"""Bounded planning memory (issue 47): what planning caches across plans is bounded, and a
plan dropped leaves nothing of itself behind. The peaks at scale:
bench/memory/planning_memory.py."""

from __future__ import annotations

import gc
import importlib
import inspect
import pkgutil
import weakref

import jaxpar_zoo as zoo
import pytest

import jaxpar

pytestmark = pytest.mark.api


def cached_functions():
    """(qualified name, function) of every functools cache in jaxpar: module functions and
    methods."""
    for info in pkgutil.walk_packages(jaxpar.__path__, "jaxpar."):
        if info.name.endswith("__main__"):  # runs the command line
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            owners = [(name, obj)]
            if inspect.isclass(obj) and obj.__module__ == module.__name__:
                owners = [(f"{name}.{k}", v) for k, v in vars(obj).items()]
            for qual, fn in owners:
                if hasattr(fn, "cache_info") and getattr(fn, "__module__", "") == module.__name__:
                    yield f"{module.__name__}.{qual}", fn


def test_every_cache_is_bounded():
    """A cache kept across plans has a size bound (or no arguments: one entry), and no method
    has one (it would hold every instance, and what it holds, across plans)."""
    found = dict(cached_functions())
    assert "jaxpar.xla.reshard_paths.reshard_path" in found and len(found) >= 8
    for name, fn in found.items():
        takes_arguments = bool(inspect.signature(fn).parameters)
        assert fn.cache_info().maxsize is not None or not takes_arguments, name
        assert "self" not in inspect.signature(fn).parameters, f"{name}: a method's cache"


def test_a_dropped_plan_is_freed():
    """Nothing planning keeps across plans refers to a plan's program, nodes or tables: they
    go with the plan (a method's cache once held each run's reshard tables, and through them
    its whole program, until 65,536 other entries pushed it out)."""
    ex = zoo.get("gpt_small", small=True)
    plan = jaxpar.plan(ex.step, *ex.args, mesh={"data": 2, "model": 4}, cluster="p100")
    refs = {
        "program": weakref.ref(plan.program),
        "nodes": weakref.ref(plan.ng),
        "tables": weakref.ref(plan.tables),
    }
    del plan
    gc.collect()
    assert {k: r() is None for k, r in refs.items()} == dict.fromkeys(refs, True)
