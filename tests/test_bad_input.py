"""Bad input fails clearly, never obscurely; unknown primitives fall back with one warning."""

import logging

import jax
import jax.numpy as jnp
import jaxpar_zoo as zoo
import pytest
from jax.sharding import PartitionSpec as P

import jaxpar

pytestmark = pytest.mark.api


def simple_step(w, x):
    g = jax.grad(lambda w: jnp.mean((x @ w) ** 2))(w)
    return w - 0.1 * g, jnp.mean(x @ w)


W = jax.ShapeDtypeStruct((6, 3), jnp.float32)
X = jax.ShapeDtypeStruct((12, 6), jnp.float32)


def test_mesh_axis_that_does_not_exist():
    with pytest.raises(ValueError, match=r"mesh axis 'model'.*does not exist.*\('data',\)"):
        jaxpar.plan(simple_step, W, X, mesh={"data": 4}, in_specs=(P("model"), None))


def test_undivisible_dimension_is_skipped_by_rules():
    # w is (6, 3): no axis of size 4 divides either dim, so no node may split them
    plan = jaxpar.plan(simple_step, W, X, mesh={"data": 4})
    w_spec = plan.tensor_specs[plan.program.invars[0]]
    assert all(not axes for axes in w_spec)
    for t, spec in plan.tensor_specs.items():
        shape = plan.program.tensors[t].shape
        for size, axes in zip(shape, spec, strict=False):
            assert size % (4 ** len(axes)) == 0


def test_user_requested_impossible_sharding_errors():
    with pytest.raises(ValueError, match=r"dimension 1 has size 3.*do not divide"):
        jaxpar.plan(simple_step, W, X, mesh={"data": 4}, in_specs=(P(None, "data"), None))
    with pytest.raises(ValueError, match=r"rank 2"):
        jaxpar.plan(simple_step, W, X, mesh={"data": 4}, in_specs=(P(None, None, "data"), None))


def test_cluster_with_fewer_devices_than_the_mesh():
    small = jaxpar.Cluster.preset("p100", nodes=1)  # 4 devices
    with pytest.raises(ValueError, match=r"has 4 devices but the mesh needs 8"):
        jaxpar.plan(simple_step, W, X, mesh={"data": 2, "model": 4}, cluster=small)


def test_make_mesh_needs_enough_devices():
    with pytest.raises(ValueError, match=r"needs 64 devices.*xla_force_host_platform_device_count"):
        jaxpar.make_mesh({"data": 8, "model": 8})


def test_function_that_cannot_be_traced():
    def bad(x):
        if x.sum() > 0:  # Python control flow on a traced value
            return x
        return -x

    with pytest.raises(jaxpar.TraceError, match=r"could not trace 'bad'"):
        jaxpar.plan(bad, X, mesh={"data": 4})


def test_unhashable_static_leaf():
    with pytest.raises(jaxpar.TraceError, match=r"neither an array nor hashable"):
        jaxpar.plan(lambda x, cfg: x * 2, X, {1, 2}, mesh={"data": 4})


def test_bad_options():
    with pytest.raises(ValueError, match=r"strategy='fast'"):
        jaxpar.plan(simple_step, W, X, mesh={"data": 4}, strategy="fast")
    with pytest.raises(ValueError, match=r"objective='speed'"):
        jaxpar.plan(simple_step, W, X, mesh={"data": 4}, objective="speed")
    with pytest.raises(ValueError, match=r"unknown|preset"):
        jaxpar.plan(simple_step, W, X, mesh={"data": 4}, cluster="tpu-v9000")


def test_donated_arguments_reused():
    ex = zoo.get("mlp", small=True)
    step = jaxpar.auto_shard(ex.step, mesh=jaxpar.make_mesh({"data": 8}), donate_argnums=0)
    state, batch = ex.make_args(0)
    new_state, _ = step(state, batch)
    step(new_state, batch)  # fine: the fresh state
    with pytest.raises(ValueError, match=r"was donated to an earlier call"):
        step(state, batch)


def test_unknown_primitive_falls_back_replicated_with_one_warning(caplog):
    def step(x):
        y = jax.lax.linalg.hessenberg(x)[0]  # no rule: a CPU-only reduction
        z = jax.lax.linalg.hessenberg(x * 2)[0]
        return y + z

    x = jnp.arange(64.0).reshape(8, 8)
    with caplog.at_level(logging.WARNING, logger="jaxpar"):
        sharded = jaxpar.auto_shard(step, mesh=jaxpar.make_mesh({"data": 8}))
        out = sharded(x)
    warnings = [r for r in caplog.records if "'hessenberg'" in r.getMessage()]
    assert len(warnings) == 1 and "replicated" in warnings[0].getMessage()
    assert jnp.allclose(out, jax.jit(step)(x))
    top_nodes = [
        n
        for n in sharded.plan.ng.nodes
        if n.anchor >= 0 and sharded.plan.program.eqns[n.anchor].primitive == "hessenberg"
    ]
    assert top_nodes and all(n.space.replicated for n in top_nodes)


# ---- public API argument checking: what is wrong, and how to fix it ---------------------------


@pytest.mark.parametrize(
    ("mesh", "error", "match"),
    [
        ({"data": 0}, ValueError, r"mesh entry 'data': 0; axes are name -> positive int"),
        ({"data": -2}, ValueError, r"mesh entry 'data': -2; axes are name -> positive int"),
        ({"data": "2"}, ValueError, r"mesh entry 'data': '2'; axes are name -> positive int"),
        ({"data": 2.0}, ValueError, r"mesh entry 'data': 2.0; axes are name -> positive int"),
        ({1: 4}, ValueError, r"mesh entry 1: 4; axes are name -> positive int"),
        ({}, ValueError, r"mesh=\{\} has no axes; give .*e\.g\. \{'data': 2, 'model': 4\}"),
        (["data", 4], TypeError, r"mesh must be a dict of axis sizes .* not list"),
        ((4,), TypeError, r"mesh must be a dict of axis sizes .* not tuple"),
        ("data=4", TypeError, r"mesh must be a dict of axis sizes .* not str"),
    ],
)
def test_plan_with_a_bad_mesh(mesh, error, match):
    with pytest.raises(error, match=match):
        jaxpar.plan(simple_step, W, X, mesh=mesh)


@pytest.mark.parametrize(
    ("option", "value"),
    [("strategy", "fast"), ("strategy", None), ("objective", "speed"), ("search", "bfs")],
)
def test_bad_option_names_fail_in_plan_and_auto_shard(option, value):
    match = rf"{option}={value!r}; choose one of \("
    with pytest.raises(ValueError, match=match):
        jaxpar.plan(simple_step, W, X, mesh={"data": 4}, **{option: value})
    with pytest.raises(ValueError, match=match):  # at decoration, not at the first call
        jaxpar.auto_shard(simple_step, mesh=jaxpar.make_mesh({"data": 4}), **{option: value})


def test_cluster_of_the_wrong_type():
    with pytest.raises(TypeError, match=r"cluster must be a Cluster, a preset name \(p100, "):
        jaxpar.plan(simple_step, W, X, mesh={"data": 4}, cluster=4)


def test_function_that_is_not_callable():
    with pytest.raises(ValueError, match=r"could not trace 3 .*'int' object is not callable"):
        jaxpar.plan(3, W, X, mesh={"data": 4})


@pytest.mark.parametrize(
    "in_specs",
    [(P(), None, None), {"w": P()}, [P(), None]],
    ids=["too-many-entries", "dict-for-tuple", "list-for-tuple"],
)
def test_in_specs_that_is_not_a_prefix(in_specs):
    with pytest.raises(ValueError, match=r"in_specs must be a pytree prefix of the arguments"):
        jaxpar.plan(simple_step, W, X, mesh={"data": 4}, in_specs=in_specs)


# Argument checks of the public API (jaxpar/meshes.py, jaxpar/apply.py, jaxpar/pins.py)


def test_boolean_mesh_size_is_rejected():
    # True is an int in Python: it must not plan a mesh of size 1
    with pytest.raises(ValueError, match=r"mesh entry 'data': True"):
        jaxpar.plan(simple_step, W, X, mesh={"data": True})


def test_auto_shard_of_a_non_callable_fails_at_decoration():
    with pytest.raises(TypeError, match=r"callable"):
        jaxpar.auto_shard(3, mesh=jaxpar.make_mesh({"data": 4}))


def test_auto_shard_with_a_dict_mesh_runs_or_says_to_use_make_mesh():
    # today: jax's "is_fully_addressable is not implemented for AbstractMesh" at the first call
    try:
        step = jaxpar.auto_shard(simple_step, mesh={"data": 4})
        step(jnp.ones((6, 3)), jnp.ones((12, 6)))
    except (TypeError, ValueError) as err:
        assert "make_mesh" in str(err), err


def test_in_specs_string_instead_of_partition_spec():
    # today: "in_specs for argument [0] ([6,3]) has 4 entries" (the letters of "data")
    with pytest.raises((TypeError, ValueError), match=r"PartitionSpec"):
        jaxpar.plan(simple_step, W, X, mesh={"data": 4}, in_specs="data")


@pytest.mark.parametrize("axes", [{"data": 0}, {"data": "2"}])
def test_make_mesh_with_bad_sizes(axes):
    # today: {"data": 0} builds an empty mesh; {"data": "2"} fails inside numpy
    with pytest.raises(ValueError, match=r"positive int"):
        jaxpar.make_mesh(axes)


def test_donate_argnums_of_the_wrong_type():
    with pytest.raises(TypeError, match=r"donate_argnums"):
        jaxpar.auto_shard(simple_step, donate_argnums="0")
