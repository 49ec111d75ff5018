"""The public contract: plan(), auto_shard, Plan fields, report, JSON, caching, lowering."""

import json

import jax
import jax.numpy as jnp
import jaxpar_zoo as zoo
import optax
import pytest
from flax import linen as nn
from flax.training import train_state
from jax.sharding import NamedSharding, PartitionSpec

import jaxpar
from jaxpar.program.graph import phase_of
from jaxpar.solver.problem import assignment_cost, brute_force


@pytest.mark.api
def test_abstract_plan_needs_no_devices():
    ex = zoo.get("mlp", small=True)
    plan = jaxpar.plan(ex.step, *ex.args, mesh={"node": 4, "gpu": 4}, cluster="p100")
    assert plan.cluster.num_devices == 16  # 4 nodes of 4 P100
    assert plan.mesh_axes.link_names == ("infiniband", "nvlink")
    c = plan.cost
    assert c.step_s == pytest.approx(c.compute_s + c.comm_s)
    assert c.comm_bytes == pytest.approx(sum(x.bytes for x in plan.collectives))
    leaves = jax.tree.leaves(plan.in_shardings)
    assert leaves and all(isinstance(s, NamedSharding) for s in leaves)
    assert jax.tree.structure(plan.out_shardings).num_leaves == len(plan.program.outvars)
    report = plan.report()
    assert "MLP/dense_0" in report and "t_C ms" in report and "{n=" in report
    for name in ("auto", "data", "model", "owt"):
        assert name in plan.comparison()
    data = json.loads(plan.to_json())
    assert data["mesh"] == {"node": 4, "gpu": 4}
    assert {"step_s", "compute_s", "comm_s", "comm_bytes"} <= set(data["cost"])
    assert data["layers"] and data["collectives"] is not None


@pytest.mark.api
def test_strategies_and_objectives_are_costed_by_one_model():
    ex = zoo.get("lenet5", small=True)
    plans = {
        s: jaxpar.plan(ex.step, *ex.args, mesh={"data": 2, "model": 4}, strategy=s)
        for s in ("auto", "data", "model", "owt")
    }
    for s in ("data", "model", "owt"):
        assert plans[s].cost.step_s == pytest.approx(plans["auto"].baselines[s].step_s)
        assert plans["auto"].cost.step_s <= plans[s].cost.step_s * (1 + 1e-9)


@pytest.mark.api
def test_bare_decorator_caches_per_signature():
    ex = zoo.get("mlp", small=True)
    step = jaxpar.auto_shard(ex.step)
    args = ex.make_args(0)
    state, _metrics = step(*args)
    first = step.plan
    assert set(first.mesh_axes.names) == {"data"}
    step(state, args[1])  # same signature: no re-plan
    assert step.plan is first
    bigger = jax.tree.map(lambda x: jnp.concatenate([x, x]), args[1])
    step(state, bigger)  # new batch shape: re-plan
    assert step.plan is not first
    lowered = step.lower(*args)
    assert isinstance(lowered, jax.stages.Lowered)
    assert step.plan is first


@pytest.mark.api
def test_labels_and_phases_for_nnx():
    ex = zoo.get("nnx_mlp", small=True)
    plan = jaxpar.plan(ex.step, *ex.args, mesh={"data": 8})
    labels = {r["layer"] for r in plan.layer_rows()}
    assert any("layers" in label for label in labels), labels  # parameter-path labels
    phases = {phase_of(e.name_stack) for e in plan.program.eqns}
    assert phases == {"forward", "backward", "update"}


def _tiny_mlp_step():
    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(4, use_bias=False)(nn.relu(nn.Dense(8, use_bias=False)(x)))

    m = MLP()
    params = jax.eval_shape(lambda: m.init(jax.random.PRNGKey(0), jnp.ones((4, 6))))
    state = jax.eval_shape(
        lambda p: train_state.TrainState.create(apply_fn=m.apply, params=p, tx=optax.sgd(0.1)),
        params,
    )

    def step(state, batch):
        def loss_fn(p):
            return jnp.mean((state.apply_fn(p, batch["x"]) - batch["y"]) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        return state.apply_gradients(grads=grads), {"loss": loss}

    batch = {
        "x": jax.ShapeDtypeStruct((4, 6), jnp.float32),
        "y": jax.ShapeDtypeStruct((4, 4), jnp.float32),
    }
    return step, state, batch


@pytest.mark.oracle
def test_mlp_step_dp_equals_brute_force():
    """Optimality on a whole train step, against enumeration of both search problems."""
    step, state, batch = _tiny_mlp_step()
    pins = (None, {"x": PartitionSpec("data"), "y": PartitionSpec("data")})
    plan = jaxpar.plan(
        step, state, batch, mesh={"data": 2}, cluster="p100", in_specs=pins, objective="time"
    )
    assert plan.optimal
    free = sum(1 for u in plan.problem.unary if len(u) > 1)
    assert free >= 10  # the whole step: forward, backward and update nodes
    _, upper = brute_force(plan.problem)  # every read pays its reshard: >= reported cost
    _, lower = brute_force(plan.tables.bound)  # each read pays 1/k of it: <= reported cost
    assert plan.lower_bound == pytest.approx(lower, rel=1e-12)
    # certified: the reported cost reaches the enumerated minimum of a bound of every plan's cost
    assert plan.stats["objective"] == pytest.approx(lower, rel=1e-9)
    assert plan.stats["objective"] <= upper * (1 + 1e-12)
    assert assignment_cost(plan.problem, plan.assignment) >= plan.stats["objective"] * (1 - 1e-12)


@pytest.mark.api
def test_prng_and_static_leaves():
    """Non-array leaves are static (part of the signature); PRNG keys stay replicated."""

    def step(params, batch, key, scale, name, nothing):
        noise = jax.random.normal(key, (8, 4))
        loss = jnp.mean((batch @ params * scale + 0.01 * noise) ** 2)
        del name, nothing
        g = jax.grad(lambda p: jnp.mean((batch @ p * scale) ** 2))(params)
        return params - 0.1 * g, loss

    params = jnp.ones((8, 4))
    batch = jnp.arange(64.0).reshape(8, 8) / 64
    key = jax.random.key(0)
    sharded = jaxpar.auto_shard(step, mesh=jaxpar.make_mesh({"data": 8}))
    out = sharded(params, batch, key, 2.0, "run", None)
    ref = jax.jit(step, static_argnums=(3, 4, 5))(params, batch, key, 2.0, "run", None)
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref), strict=True):
        assert jnp.allclose(a, b, rtol=1e-5, atol=1e-6)
    first = sharded.plan
    sharded(params, batch, key, 3.0, "run", None)  # another static value: another signature
    assert sharded.plan is not first


@pytest.mark.api
def test_control_flow_is_one_replicated_node():
    """A while loop whose condition reads computed values stays one equation, planned
    replicated (documented); a scan's body and a while loop of a fixed count are planned
    (`graph.Region`); all of them run."""

    def step(w, x):
        def body(carry, row):
            return carry + jnp.tanh(row @ w), None

        total, _ = jax.lax.scan(body, jnp.zeros(w.shape[1]), x)
        _, total = jax.lax.while_loop(
            lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 0.5), (0, total)
        )
        total = jax.lax.while_loop(lambda c: c.sum() > 1.0, lambda c: c * 0.5, total)
        g = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)
        return w - 0.1 * g, total

    w = jnp.ones((8, 4)) / 8
    x = jnp.arange(128.0).reshape(16, 8) / 128
    sharded = jaxpar.auto_shard(step, mesh=jaxpar.make_mesh({"data": 8}))
    out = sharded(w, x)
    ref = jax.jit(step)(w, x)
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref), strict=True):
        assert jnp.allclose(a, b, rtol=1e-5, atol=1e-6)
    plan = sharded.plan
    anchored = [(plan.program.eqns[n.anchor].primitive, n) for n in plan.ng.nodes if n.anchor >= 0]
    loops = [n for prim, n in anchored if prim == "while"]
    assert len(loops) == 1 and loops[0].space.replicated  # the loop on data alone
    assert not any(prim == "scan" for prim, _ in anchored)
    assert [loop.trips for loop in plan.program.regions] == [16, 3]


@pytest.mark.api
def test_baselines_split_batchless_tensors_and_keep_optimizer_state_with_weights():
    """data: a ReLU's broadcast zero is split on the batch like the activation it meets;
    owt: a dense layer's momentum takes its kernel's (model-parallel) layout, no regathering."""
    import jaxpar_zoo as zoo

    ex = zoo.get("vgg11", small=True)
    plan = jaxpar.plan(ex.step, *ex.args, mesh={"data": 8}, cluster="p100")
    data = plan.variant("data")
    for node in data.ng.nodes:
        cfg = data.configs[node.index][data.assignment[node.index]]
        eqn = data.program.eqns[node.anchor] if node.anchor >= 0 else None
        if eqn is not None and eqn.primitive == "broadcast_in_dim" and data.batch[node.index]:
            assert any(d in data.batch[node.index] for d in cfg), eqn
    owt = plan.variant("owt")
    paths = owt.program.invar_paths
    for path, spec in zip(paths, owt.invar_specs, strict=True):
        if "opt_state" in path and "fc" in path and "kernel" in path:
            param = path.split("opt_state", 1)[0] + "params" + path.rsplit("trace", 1)[1]
            assert spec == owt.invar_specs[paths.index(param)], path
    assert not [c for c in owt.collectives if c.reason == "state-feedback"]


@pytest.mark.api
def test_public_api_is_declared_and_versioned():
    """`__all__` is the public API, every name in it resolves, `jaxpar.verify` is reachable after
    `import jaxpar`, and `__version__` is the package's version."""
    import re
    from pathlib import Path

    assert sorted(jaxpar.__all__) == sorted(set(jaxpar.__all__))
    for name in jaxpar.__all__:
        assert getattr(jaxpar, name) is not None, name
    assert callable(jaxpar.verify.fidelity)
    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1)
    assert jaxpar.__version__ == version
    # no module is named like a public function (jaxpar.plan is the function)
    assert callable(jaxpar.plan) and not hasattr(jaxpar.plan, "__path__")
