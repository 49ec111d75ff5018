"""Bad input fails clearly, never obscurely; unknown primitives fall back with one warning."""

import logging

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import jaxpar
import models
from jaxpar.rules import _warned

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
    ex = models.get("mlp", small=True)
    step = jaxpar.auto_shard(ex.step, mesh=jaxpar.make_mesh({"data": 8}), donate_argnums=0)
    state, batch = ex.make_args(0)
    new_state, _ = step(state, batch)
    step(new_state, batch)  # fine: the fresh state
    with pytest.raises(ValueError, match=r"was donated to an earlier call"):
        step(state, batch)


def test_unknown_primitive_falls_back_replicated_with_one_warning(caplog):
    def step(x):
        y = jax.lax.top_k(x, 2)[0]  # no rule for top_k
        z = jax.lax.top_k(x * 2, 2)[0]
        return y + z

    _warned.discard("top_k")
    x = jnp.arange(64.0).reshape(8, 8)
    with caplog.at_level(logging.WARNING, logger="jaxpar"):
        sharded = jaxpar.auto_shard(step, mesh=jaxpar.make_mesh({"data": 8}))
        out = sharded(x)
    warnings = [r for r in caplog.records if "top_k" in r.getMessage()]
    assert len(warnings) == 1 and "replicated" in warnings[0].getMessage()
    assert jnp.allclose(out, jax.jit(step)(x))
    top_nodes = [
        n
        for n in sharded.plan.ng.nodes
        if n.anchor >= 0 and sharded.plan.program.eqns[n.anchor].primitive == "top_k"
    ]
    assert top_nodes and all(n.space.replicated for n in top_nodes)
