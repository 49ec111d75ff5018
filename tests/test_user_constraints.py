"""The step's own sharding constraints (`PlannerOptions.user_constraints`): pinned or hints,
listed in the report; Flax's logical constraints and boxed parameters traced with their names;
the plan's logical-axis rules fed back to plain ``jax.jit`` compile to its collectives."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_equivalent
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxpar
from jaxpar.verify.compiled import fidelity

MESH = {"data": 2, "model": 4}


def assert_same_collectives(plan, compiled):
    """The compiled program's collectives are the plan's: bytes per device and count per kind."""
    fid = fidelity(plan.collectives, compiled)
    assert fid.predicted_bytes == fid.hlo_bytes, fid.text
    assert fid.predicted_counts == fid.hlo_counts, fid.text
    return fid


def mlp_step(mesh, spec):
    """A two-matmul step whose hidden activation the user constrains to ``spec``."""

    def step(w1, w2, x):
        def loss(w1, w2):
            h = jnp.tanh(x @ w1)
            h = jax.lax.with_sharding_constraint(h, NamedSharding(mesh, spec))
            return jnp.mean((h @ w2) ** 2)

        g1, g2 = jax.grad(loss, argnums=(0, 1))(w1, w2)
        return w1 - 0.1 * g1, w2 - 0.1 * g2

    return step


def mlp_args(b=64, d=64, h=256, dtype=jnp.float32):
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    return (
        jax.random.normal(k1, (d, h), dtype) * 0.1,
        jax.random.normal(k2, (h, d), dtype) * 0.1,
        jax.random.normal(k3, (b, d), dtype),
    )


def constrained_spec(plan, eqn_index=0):
    c = plan.program.user_constraints[eqn_index]
    return plan.partition_spec(plan.tensor_specs[c.tensor])


@pytest.mark.numerics
def test_pinned_constraint_keeps_the_users_layout_and_runs_equal():
    """Pinned, the constrained activation keeps ``P(None, "model")`` (the search alone puts it
    elsewhere), the report lists both of its equations as kept, the float64 step equals the
    unsharded one and the compiled collectives are the predicted ones."""
    mesh = jaxpar.make_mesh(MESH)
    step = mlp_step(mesh, P(None, "model"))
    args = mlp_args()
    opts = jaxpar.PlannerOptions(user_constraints="pin")
    free = jaxpar.plan(mlp_step(mesh, P(None, None)), *args, mesh=MESH, cluster="p100")
    assert constrained_spec(free) != P(None, "model")  # the search alone would not choose it
    with jax.enable_x64(True):
        args64 = mlp_args(dtype=jnp.float64)
        f = jaxpar.auto_shard(step, mesh=mesh, cluster="p100", options=opts)
        out = f(*args64)
        assert_equivalent(out, step(*args64), rtol=1e-12)
        compiled = f.lower(*args64).compile()
    plan = f.plan
    rows = plan.user_constraints()
    assert [r["phase"] for r in rows] == ["forward", "backward"]  # the transpose constrains too
    assert all(r["kept"] and r["asked"] == "P(None, 'model')" for r in rows)
    assert constrained_spec(plan) == P(None, "model")
    assert "user constraints (pin): 2 of 2 kept" in plan.report()
    assert plan.as_dict()["user_constraints"]["constraints"] == rows
    assert_same_collectives(plan, compiled)


@pytest.mark.api
def test_hint_is_the_faster_plan_and_prices_keeping():
    """A constraint that costs time (the (2048, 2048) activation replicated): "hint" plans the
    search's own plan, says the constraint was overridden, and prices keeping it exactly as
    "pin" plans it; a constraint the search agrees with is kept."""
    args = mlp_args(b=2048, d=512, h=2048)
    mesh = jaxpar.make_mesh(MESH)
    step = mlp_step(mesh, P())
    pinned = jaxpar.plan(
        step,
        *args,
        mesh=MESH,
        cluster="p100",
        options=jaxpar.PlannerOptions(user_constraints="pin"),
    )
    hinted = jaxpar.plan(step, *args, mesh=MESH, cluster="p100")  # "hint" is the default
    h = hinted.hint
    assert hinted.options.user_constraints == "hint" and pinned.hint is None
    assert not h.chose_kept and h.free_step_s < h.kept_step_s
    assert h.kept_step_s == pytest.approx(pinned.cost.overlapped_step_s, rel=1e-12)
    assert h.free_step_s == pytest.approx(hinted.cost.overlapped_step_s, rel=1e-12)
    assert [r["kept"] for r in hinted.user_constraints()] == [False, False]
    assert "overridden" in hinted.report() and "keeping them all" in hinted.report()
    agreeing = mlp_step(mesh, constrained_spec(hinted))
    again = jaxpar.plan(agreeing, *args, mesh=MESH, cluster="p100")
    assert again.hint.chose_kept and all(r["kept"] for r in again.user_constraints())
    assert again.cost.overlapped_step_s == pytest.approx(hinted.cost.overlapped_step_s, rel=1e-9)


@pytest.mark.api
def test_impossible_pins_say_why_and_hints_plan_anyway():
    """A split the shape does not allow (dim 1 of size 6 over 4 devices) and a mesh axis the
    planning mesh lacks: "pin" raises a ValueError naming the constraint and the fix; "hint"
    plans and says no plan keeps them."""
    mesh = jaxpar.make_mesh(MESH)
    args = mlp_args(b=64, d=64, h=6)
    for spec, why in ((P(None, "model"), "no split"), (P("expert"), "lacks")):
        named = jax.sharding.AbstractMesh((2, 4, 2), ("data", "model", "expert"))
        target = mesh if spec != P("expert") else named
        step = mlp_step(target, spec)
        opts = jaxpar.PlannerOptions(user_constraints="pin")
        with pytest.raises(ValueError, match=why) as err:
            jaxpar.plan(step, *args, mesh=MESH, cluster="p100", options=opts)
        assert "user_constraints='hint'" in str(err.value)
        plan = jaxpar.plan(step, *args, mesh=MESH, cluster="p100")
        assert plan.hint.kept_step_s is None and why in plan.hint.why
        assert "no plan keeps them all" in plan.report()


RULES = (
    ("activation_batch", "data"),
    ("activation_embed", None),
    ("activation_mlp", "model"),
    ("embed", None),
    ("mlp", "model"),
)


class Block(nn.Module):
    """Two dense layers in Flax's logical-axis style: boxed parameters, named activations."""

    d: int = 64
    h: int = 256

    @nn.compact
    def __call__(self, x):
        init = nn.initializers.normal(0.05)
        w1 = self.param(
            "w1", nn.with_logical_partitioning(init, ("embed", "mlp")), (self.d, self.h)
        )
        w2 = self.param(
            "w2", nn.with_logical_partitioning(init, ("mlp", "embed")), (self.h, self.d)
        )
        x = nn.with_logical_constraint(x, ("activation_batch", "activation_embed"))
        h = nn.with_logical_constraint(jnp.tanh(x @ w1), ("activation_batch", "activation_mlp"))
        return nn.with_logical_constraint(h @ w2, ("activation_batch", "activation_embed"))


def block_step(model, unbox=False):
    """SGD on the boxed parameters: applied boxed (Flax constrains each parameter by its
    names) or, with ``unbox``, their values taken out of the boxes first (no constraint)."""
    is_box = lambda b: isinstance(b, nn.LogicallyPartitioned)

    def step(params, x):
        p = jax.tree.map(lambda b: b.value, params, is_leaf=is_box) if unbox else params
        grads = jax.grad(lambda p: jnp.mean(model.apply({"params": p}, x) ** 2))(p)
        if not unbox:
            return jax.tree.map(lambda a, g: a - 0.1 * g, params, grads)
        return jax.tree.map(
            lambda b, g: b.replace_boxed(b.value - 0.1 * g), params, grads, is_leaf=is_box
        )

    return step


@pytest.mark.closed_form
def test_flax_logical_names_are_traced_and_rules_round_trip_under_plain_jit():
    """Flax's logical constraints reach the plan (traced under the planning mesh) with their
    names, boxed parameters' names are recorded, and the exported rules (the model's names)
    fed back under plain ``jax.jit`` with ``nn.logical_axis_rules`` compile to exactly the
    plan's collectives."""
    model, x = Block(), jnp.ones((512, 64))
    with nn.logical_axis_rules(RULES):
        boxed = model.init(jax.random.key(0), x)["params"]
    mesh = jaxpar.make_mesh(MESH)
    opts = jaxpar.PlannerOptions(user_constraints="pin")
    step = block_step(model)
    without = jaxpar.plan(step, boxed, x, mesh=MESH, cluster="p100")
    assert not without.program.user_constraints  # no rules in context: Flax constrains nothing
    with nn.logical_axis_rules(RULES):
        plan = jaxpar.plan(step, boxed, x, mesh=mesh, cluster="p100", options=opts)
    program = plan.program
    names = [c.logical for c in program.user_constraints if c.logical]
    assert ("activation_batch", "activation_mlp") in names and len(names) == 5  # 3 fwd, 2 bwd
    boxes = {
        p: program.logical_names.get(t)
        for p, t in zip(program.invar_paths, program.invars, strict=True)
    }
    assert boxes["[0]['w1'].value"] == ("embed", "mlp") and boxes["[1]"] is None
    assert dict(program.logical_rules) == dict(RULES)
    exported = plan.export_specs()
    rules = dict(exported.logical_rules)
    assert rules["activation_mlp"] == "model" and rules["mlp"] == "model"
    assert not exported.not_expressible
    assert exported.maxtext_rules()[0] == ["activation_batch", ["data"]]
    with jax.set_mesh(mesh), nn.logical_axis_rules(exported.logical_rules):
        shardings = nn.logical_to_mesh_sharding(
            nn.get_partition_spec(boxed), mesh, exported.logical_rules
        )
        x_sharding = NamedSharding(mesh, exported.in_specs[1])
        plain = jax.jit(step, in_shardings=(shardings, x_sharding), out_shardings=shardings)
        compiled = plain.lower(boxed, x).compile()
    assert_same_collectives(plan, compiled)


@pytest.mark.api
def test_export_lists_names_the_plan_splits_two_ways():
    """A name the plan splits differently in two tensors is left out of the rules and listed
    with the layouts it has; every other name keeps its rule."""
    model, x = Block(), jnp.ones((512, 64))
    with nn.logical_axis_rules(RULES):
        boxed = model.init(jax.random.key(0), x)["params"]
    # the parameters unboxed in the step (no constraint on them), pinned by in_specs: "mlp"
    # split over model in w1, over nothing in w2
    in_specs = ({"w1": P(None, "model"), "w2": P()}, None)
    with nn.logical_axis_rules(RULES):
        plan = jaxpar.plan(
            block_step(model, unbox=True), boxed, x, mesh=MESH, cluster="p100",
            in_specs=in_specs, options=jaxpar.PlannerOptions(user_constraints="pin"),
        )  # fmt: skip
    exported = plan.export_specs()
    assert "mlp" in exported.not_expressible and "mlp" not in dict(exported.logical_rules)
    assert "('model',)" in exported.not_expressible["mlp"]
    assert "activation_batch" in dict(exported.logical_rules)
    assert "not expressible" in exported.text()
    program = plan.program
    np.testing.assert_equal(len(exported.listing), len(program.invars) + len(program.outvars))
