"""Meshes of any shape (docs/meshes.md): axes of size 1 cost nothing, and the mesh idioms of
today's JAX (`jax.make_mesh`'s Explicit axes, mixed axis types, `AbstractMesh`, the mesh set with
`jax.set_mesh`) plan and run on the user's mesh (issue 47)."""

from __future__ import annotations

import itertools
import json
import math

import jax
import jax.numpy as jnp
import jaxpar_zoo as zoo
import numpy as np
import pytest
from helpers import assert_equivalent, assert_fidelity
from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec
from jaxpar_zoo.llama import llama_config, llama_example

import jaxpar
from jaxpar.nodes.configs import _divides, _valid_configs, enumerate_configs
from jaxpar.rules.table import OpSpace
from jaxpar.trace.meshes import MAX_PLANNED_AXES

# MaxText's mesh (MaxText/configs/base.yml, mesh_axes): every axis named, most of size 1
MAXTEXT_AXES = (
    "data", "stage", "fsdp", "fsdp_transpose", "sequence", "context", "context_autoregressive",
    "tensor", "tensor_transpose", "tensor_sequence", "expert", "autoregressive",
)  # fmt: skip
Ex, Au = AxisType.Explicit, AxisType.Auto


def maxtext_mesh(**sizes: int) -> dict[str, int]:
    return {a: sizes.get(a, 1) for a in MAXTEXT_AXES}


def leaf_specs(plan) -> list:
    return jax.tree.leaves(plan.partition_specs(), is_leaf=lambda x: isinstance(x, PartitionSpec))


# ---- size-1 axes ------------------------------------------------------------------------------


@pytest.mark.api
@pytest.mark.parametrize(
    ("model", "sizes"), [("gpt_small", {"fsdp": 8}), ("mlp", {"data": 2, "fsdp": 4})]
)
def test_size_one_axes_plan_as_the_mesh_without_them(model, sizes):
    """MaxText's 12-axis mesh plans the plan of the mesh of its axes larger than 1 (same
    assignment, cost, specs, configurations), and still shows all 12 axes: plan.mesh, the
    report, the plan file (whose assignment names every axis)."""
    ex = zoo.get(model, small=True)
    full = jaxpar.plan(ex.step, *ex.args, mesh=maxtext_mesh(**sizes), cluster="dgx-h100")
    small = jaxpar.plan(ex.step, *ex.args, mesh=sizes, cluster="dgx-h100")
    assert full.assignment == small.assignment and full.cost == small.cost
    assert leaf_specs(full) == leaf_specs(small)
    for key in ("nodes", "max_configs", "edges"):
        assert full.stats[key] == small.stats[key], key
    assert tuple(full.mesh.axis_names) == MAXTEXT_AXES
    assert full.mesh_shape == maxtext_mesh(**sizes)
    assert full.mesh_axes.names == tuple(sizes)  # planned on
    assert f"mesh={maxtext_mesh(**sizes)}" in full.report()
    saved = json.loads(full.to_json())["mesh"]
    assert saved == maxtext_mesh(**sizes)


@pytest.mark.api
def test_plan_files_name_the_whole_mesh(tmp_path):
    ex = zoo.get("mlp", small=True)
    plan = jaxpar.plan(ex.step, *ex.args, mesh=maxtext_mesh(data=2, fsdp=4), cluster="cpu")
    path = tmp_path / "plan.json"
    plan.save(path)
    loaded = jaxpar.load_plan(path)
    assert loaded.mesh == maxtext_mesh(data=2, fsdp=4)
    assert {len(cfg) for cfg in loaded.assignment} == {len(MAXTEXT_AXES)}
    trivial = [a for a, n in enumerate(MAXTEXT_AXES) if n not in ("data", "fsdp")]
    assert all(cfg[a] == -1 for cfg in loaded.assignment for a in trivial)


def float64_example(model: str):
    if model == "llama_small":
        return llama_example("llama_small", llama_config("llama_small"), jnp.float64)
    return zoo.get(model, small=True, dtype=jnp.float64)


@pytest.mark.numerics
@pytest.mark.parametrize(
    ("model", "rtol"), [("mlp", 1e-9), pytest.param("llama_small", 1e-5, marks=pytest.mark.slow)]
)
def test_twelve_axis_mesh_runs_like_the_unsharded_step_in_float64(model, rtol):
    """auto_shard on a concrete 12-axis mesh (data=2, fsdp=4, ten axes of size 1): the step
    equals the unsharded one in float64, its results lie on the user's 12-axis mesh, and the
    compiled program's collectives are the predicted ones. (The Llama's tolerance is the other
    float64 Llama tests': Adam's first step is lr·sign(g), and a gradient at rounding level
    may flip.)"""
    mesh = jaxpar.make_mesh(maxtext_mesh(data=2, fsdp=4))
    with jax.enable_x64(True):
        ex = float64_example(model)
        args = ex.make_args(0)
        ref = jax.jit(ex.step)(*args)
        step = jaxpar.auto_shard(ex.step, mesh=mesh, cluster="cpu")
        out = step(*args)
        assert_equivalent(out, ref, rtol=rtol)
        assert_fidelity(step.plan, step.lower(*args).compile())
    assert {leaf.sharding.mesh for leaf in jax.tree.leaves(out)} == {mesh}
    assert step.plan.mesh_axes.names == ("data", "fsdp")


@pytest.mark.api
def test_in_specs_may_name_size_one_axes():
    """A pin over a size-1 axis splits nothing: accepted, and the plan is the one without it."""
    ex = zoo.get("mlp", small=True)
    pins = jax.tree.map(lambda _: None, ex.args[0])
    pins = (pins, {"x": PartitionSpec(("data", "expert")), "y": None})
    plan = jaxpar.plan(
        ex.step, *ex.args, mesh=maxtext_mesh(data=2, fsdp=4), cluster="cpu", in_specs=pins
    )
    assert plan.in_shardings[1]["x"].spec == PartitionSpec("data")
    with pytest.raises(ValueError, match="'nope', which does not exist"):
        bad = (pins[0], {"x": PartitionSpec("nope"), "y": None})
        jaxpar.plan(ex.step, *ex.args, mesh=maxtext_mesh(data=2), cluster="cpu", in_specs=bad)


@pytest.mark.api
def test_more_axes_than_the_planner_handles_is_an_error_before_planning():
    def never_traced(x):
        raise AssertionError("traced: the mesh should have been refused first")

    mesh = {f"a{i}": 2 for i in range(MAX_PLANNED_AXES + 1)}
    with pytest.raises(ValueError, match=r"5 axes larger than 1 .*'a4': 2.*at most 4.*Merge"):
        jaxpar.plan(never_traced, jax.ShapeDtypeStruct((64,), jnp.float32), mesh=mesh)
    # as many axes of size 1 as one likes beside them
    ok = {**{f"one{i}": 1 for i in range(20)}, **{f"a{i}": 2 for i in range(MAX_PLANNED_AXES)}}
    plan = jaxpar.plan(lambda x: x * 2, jax.ShapeDtypeStruct((64,), jnp.float32), mesh=ok)
    assert len(plan.mesh.axis_names) == 24 and len(plan.mesh_axes.names) == MAX_PLANNED_AXES


@pytest.mark.oracle
def test_configurations_are_enumerated_axis_by_axis():
    """The pruned enumeration is the filtered product (random cases), in the product's order;
    on 12 axes of size 2 it lists the valid configurations without the 4^12 product."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        ndims = int(rng.integers(1, 4))
        dims = [d for d in range(ndims) if rng.random() < 0.7]
        choices = (-1, *dims)
        sizes = tuple(int(x) for x in rng.choice([1, 2, 3, 4, 8], size=int(rng.integers(1, 5))))
        pairs = frozenset(
            (int(rng.choice([1, 2, 4, 6, 8, 12, 16])), int(rng.integers(ndims))) for _ in range(4)
        )
        product = itertools.product(choices, repeat=len(sizes))
        expect = tuple(c for c in product if _divides(c, sizes, pairs))
        assert _valid_configs(choices, sizes, pairs) == expect
    # three dims of size 4 (two factors of 2 each) on 12 axes of size 2: each dim takes at most
    # two of the axes, the rest replicate
    space = OpSpace((4, 4, 4), (True,) * 3, ("a", "b", "c"), (), ((0, 1, 2),), 64.0)
    configs = enumerate_configs(space, (2,) * 12, [(4, 0), (4, 1), (4, 2)])
    expect = sum(
        math.comb(12, a) * math.comb(12 - a, b) * math.comb(12 - a - b, c)
        for a, b, c in itertools.product(range(3), repeat=3)
    )
    assert len(configs) == expect == len(set(configs))


# ---- today's mesh idioms ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def mlp64():
    """The small MLP in float64, its arguments and its unsharded step's result."""
    with jax.enable_x64(True):
        ex = zoo.get("mlp", small=True, dtype=jnp.float64)
        args = ex.make_args(0)
        return ex, args, jax.jit(ex.step)(*args)


def run64(step, args, ref):
    with jax.enable_x64(True):
        out = step(*args)
    assert_equivalent(out, ref, rtol=1e-9)
    return out


def on_mesh(out, mesh) -> bool:
    return {leaf.sharding.mesh for leaf in jax.tree.leaves(out)} == {mesh}


@pytest.mark.numerics
def test_jax_make_mesh_explicit_axes(mlp64):
    """`jax.make_mesh` (Explicit axes): planned and run on it; results on it; the compiled
    program's collectives are the predicted ones."""
    ex, args, ref = mlp64
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    assert mesh.axis_types == (Ex, Ex)
    step = jaxpar.auto_shard(ex.step, mesh=mesh, cluster="cpu")
    assert on_mesh(run64(step, args, ref), mesh)
    assert step.plan.mesh == mesh
    with jax.enable_x64(True):
        assert_fidelity(step.plan, step.lower(*args).compile())


@pytest.mark.numerics
@pytest.mark.parametrize("types", [(Ex, Ex), (Au, Au), (Ex, Au)], ids=["explicit", "auto", "mixed"])
def test_bare_auto_shard_uses_the_mesh_set_with_set_mesh(mlp64, types):
    ex, args, ref = mlp64
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=types)
    step = jaxpar.auto_shard(ex.step, cluster="cpu")
    with jax.set_mesh(mesh):
        out = run64(step, args, ref)
    assert step.plan.mesh == mesh and step.plan.mesh_shape == {"data": 2, "model": 4}
    assert on_mesh(out, mesh)
    # outside the context the same decorated step plans anew, on its default mesh
    run64(step, args, ref)
    assert step.plan.mesh_shape == {"data": len(jax.devices())}


@pytest.mark.numerics
@pytest.mark.parametrize("types", [(Au, Ex), (Ex, Au)], ids=["auto-explicit", "explicit-auto"])
def test_mixed_axis_types_given_as_mesh(mlp64, types):
    """Both axes split something (the batch over data, the first kernel over model, pinned),
    one Auto and one Explicit."""
    ex, args, ref = mlp64
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=types)
    params = jax.tree.map(lambda _: None, args[0])
    first = next(iter(args[0].params))
    params.params[first]["kernel"] = PartitionSpec(None, "model")
    pins = (params, {"x": PartitionSpec("data"), "y": None})
    step = jaxpar.auto_shard(ex.step, mesh=mesh, cluster="cpu", in_specs=pins)
    out = run64(step, args, ref)
    assert on_mesh(out, mesh)
    named = {a for s in leaf_specs(step.plan) for e in s if e for a in np.atleast_1d(e)}
    assert named == {"data", "model"}


@pytest.mark.numerics
def test_abstract_explicit_mesh_planned_then_applied(mlp64):
    ex, args, ref = mlp64
    abstract = AbstractMesh((2, 4), ("data", "model"), axis_types=(Ex, Ex))
    with jax.enable_x64(True):
        plan = jaxpar.plan(ex.step, *args, mesh=abstract, cluster="cpu")
    assert plan.mesh == abstract
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    step = jaxpar.auto_shard(ex.step, mesh=mesh, plan=plan)
    assert on_mesh(run64(step, args, ref), mesh)


@pytest.mark.numerics
def test_arguments_placed_on_an_explicit_mesh(mlp64):
    """Arguments already on `jax.make_mesh`'s Explicit mesh, run on that mesh or on its Auto
    twin (same devices): accepted either way."""
    ex, args, ref = mlp64
    explicit = jax.make_mesh((2, 4), ("data", "model"))
    twin = jaxpar.make_mesh({"data": 2, "model": 4})
    with jax.enable_x64(True):
        placed = jax.device_put(args, NamedSharding(explicit, PartitionSpec()))
    for mesh in (explicit, twin):
        step = jaxpar.auto_shard(ex.step, mesh=mesh, cluster="cpu")
        assert on_mesh(run64(step, placed, ref), mesh)
    # the twin given inside set_mesh of the Explicit mesh: the same devices, so it agrees
    step = jaxpar.auto_shard(ex.step, mesh=twin, cluster="cpu")
    with jax.set_mesh(explicit):
        assert on_mesh(run64(step, placed, ref), twin)


@pytest.mark.api
def test_plan_without_mesh_uses_the_mesh_set():
    ex = zoo.get("mlp", small=True)
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    with jax.set_mesh(mesh):
        plan = jaxpar.plan(ex.step, *ex.args, cluster="cpu")
    assert plan.mesh == mesh
    abstract = AbstractMesh((4, 2), ("data", "model"))
    with jax.sharding.use_abstract_mesh(abstract):
        plan = jaxpar.plan(ex.step, *ex.args, cluster="cpu")
    assert plan.mesh == abstract
    with pytest.raises(TypeError, match=r"needs a mesh: pass mesh=.*jax.set_mesh"):
        jaxpar.plan(ex.step, *ex.args)


@pytest.mark.api
def test_combinations_that_cannot_work_are_errors_before_planning():
    def never_traced(*_):
        raise AssertionError("traced: the combination should have been refused first")

    x = jax.ShapeDtypeStruct((16, 8), jnp.float32)
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    with jax.set_mesh(mesh), pytest.raises(ValueError, match=r"given mesh \{'data': 8\}.*set"):
        jaxpar.plan(never_traced, x, mesh={"data": 8})
    other = jax.make_mesh((2, 4), ("data", "model"), devices=jax.devices()[::-1])
    step = jaxpar.auto_shard(never_traced, mesh=other)
    with jax.set_mesh(mesh), pytest.raises(ValueError, match="another set of devices"):
        step(jnp.ones((16, 8)))
    step = jaxpar.auto_shard(never_traced)
    ones = jnp.ones((16, 8))
    abstract = jax.sharding.use_abstract_mesh(mesh.abstract_mesh)
    with abstract, pytest.raises(ValueError, match=r"runs on devices.*abstract.*jax.set_mesh"):
        step(ones)
    manual = AbstractMesh((2, 4), ("data", "model"), axis_types=(AxisType.Manual, Au))
    with pytest.raises(ValueError, match=r"\['data'\] are Manual"):
        jaxpar.plan(never_traced, x, mesh=manual)
