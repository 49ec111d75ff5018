"""The MaxText-style decoder (models/maxtext.py): its mesh from ici/dcn parallelism, its rules,
its logical names reaching the plan, the planned step equal to the unsharded one in float64
with the predicted collectives, and MaxText's default rules (FSDP) priced and compiled beside
it."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import jaxpar_zoo as zoo
import pytest
from helpers import assert_equivalent
from jax.sharding import PartitionSpec as P
from jaxpar_zoo import maxtext as mt

import jaxpar
from jaxpar.verify.compiled import fidelity

MESH = {"data": 2, "fsdp": 2, "tensor": 2}  # three of MaxText's axes (12: see the last test)
# large enough that splitting pays on H100s (at 16 x 16 the plan replicates everything)
CFG = dataclasses.replace(mt.SMALL, batch=64, seq_len=64)


@pytest.mark.api
def test_mesh_from_parallelism_settings():
    """MaxText's defaults: fsdp takes a slice's devices, data the slices; one -1 fills the
    rest; anything else is an error that says what."""
    assert mt.mesh_shape(8)["fsdp"] == 8 and sum(mt.mesh_shape(8).values()) == 8 + 11
    two = mt.mesh_shape(8, num_slices=2)
    assert (two["data"], two["fsdp"]) == (2, 4) and list(two) == list(mt.MESH_AXES)
    tp = mt.mesh_shape(8, ici={"fsdp": -1, "tensor": 2})
    assert (tp["fsdp"], tp["tensor"]) == (4, 2)
    with pytest.raises(ValueError, match="all -1"):
        mt.mesh_shape(8, ici={"fsdp": -1, "tensor": -1})
    with pytest.raises(ValueError, match="covers 4 devices"):
        mt.mesh_shape(8, ici={"fsdp": 4})
    with pytest.raises(ValueError, match="unknown ici"):
        mt.mesh_shape(8, ici={"fsdpp": -1})
    mesh = mt.maxtext_mesh(ici={"fsdp": -1}, dcn={"data": -1}, num_slices=2)
    assert mesh.axis_names == mt.MESH_AXES and mesh.shape["data"] == 2
    ids = [[d.id for d in row] for row in mesh.devices.reshape(2, 4)]
    assert ids == [[0, 1, 2, 3], [4, 5, 6, 7]]  # slices outermost


@pytest.mark.api
def test_default_rules_are_maxtexts_fsdp_and_restrict_to_a_mesh():
    rules = dict(mt.rules_for_axes(mt.LOGICAL_AXIS_RULES, tuple(MESH)))  # first rule per name
    assert rules["embed"] == ("fsdp",) and rules["activation_batch"] == ("data", "fsdp")
    assert rules["mlp"] == ("tensor",) and rules["kv"] is None and rules["layers"] is None
    names = [n for n, _ in mt.LOGICAL_AXIS_RULES]
    assert names.count("embed") == 4 and len(mt.LOGICAL_AXIS_RULES) == 59
    assert "maxtext_8b" in zoo.registered_names()
    full = zoo.get("maxtext_8b").config
    assert full["params"] == 8_030_261_248  # Llama 3 8B's count


@pytest.mark.api
def test_logical_names_reach_the_plan():
    """Traced under the planning mesh, the step's logical constraints (forward and backward)
    and the boxed state's names (the scan's ``layers`` at dim 1) reach the program."""
    ex = mt.maxtext_example("maxtext_small", mt.SMALL)
    opts = jaxpar.PlannerOptions(user_constraints="pin")  # one search
    plan = jaxpar.plan(ex.step, *ex.args, mesh=MESH, cluster="dgx-h100", options=opts)
    program = plan.program
    names = {
        p: program.logical_names.get(t)
        for p, t in zip(program.invar_paths, program.invars, strict=True)
    }
    wi = "[0]['params']['layers']['mlp']['wi_0'].value"
    assert names[wi] == ("embed", "layers", "mlp")
    assert names[wi.replace("['params']", "['opt_state'][0].mu")] == ("embed", "layers", "mlp")
    logical = {c.logical for c in program.user_constraints if c.logical}
    assert ("activation_batch", "activation_length", "activation_mlp") in logical
    phases = {r["phase"] for r in plan.user_constraints()}
    assert phases == {"forward", "backward", "update"}  # the state's unbox constraints: update
    assert dict(program.logical_rules)["embed"] == ("fsdp",)


def fsdp_in_specs(ex):
    """MaxText's default rules as argument pins: the state by its names, tokens by batch."""
    rules = mt.rules_for_axes(mt.LOGICAL_AXIS_RULES, tuple(MESH))
    state = nn.logical_to_mesh(nn.get_partition_spec(ex.args[0]), rules)
    return (state, {"tokens": P(("data", "fsdp"))})


@pytest.mark.numerics
@pytest.mark.slow
def test_planned_step_equals_unsharded_in_float64_with_the_predicted_collectives():
    """The planned step ("hint": the search's own plan against MaxText's rules kept) equals
    the unsharded one in float64 and compiles to exactly the predicted collectives."""
    mesh = jaxpar.make_mesh(MESH)
    with jax.enable_x64(True):
        ex = mt.maxtext_example("maxtext_small", CFG, jnp.float64)
        step = jaxpar.auto_shard(ex.step, mesh=mesh, cluster="dgx-h100")
        state, batch = ex.make_args(0)
        ref = jax.jit(lambda s, b: ex.step(s, b))(state, batch)
        out = step(state, batch)
        assert_equivalent(out, ref, rtol=1e-12)
        compiled = step.lower(state, batch).compile()
    plan = step.plan
    fid = fidelity(plan.collectives, compiled)
    assert fid.predicted_bytes == fid.hlo_bytes > 0, fid.text
    assert fid.predicted_counts == fid.hlo_counts, fid.text
    assert plan.hint is not None and plan.hint.kept_step_s is not None


@pytest.mark.closed_form
@pytest.mark.slow
def test_maxtext_default_rules_priced_and_compiled_beside_the_plan():
    """MaxText's default rules (FSDP: the state by its names, activations by theirs), pinned
    and priced by the same cost model: every state leaf has the rules' layout, the compiled
    program moves the predicted bytes, and the planned step is no slower."""
    mesh = jaxpar.make_mesh(MESH)
    ex = mt.maxtext_example("maxtext_small", CFG)
    pins = fsdp_in_specs(ex)
    opts = jaxpar.PlannerOptions(user_constraints="pin")
    fsdp = jaxpar.auto_shard(ex.step, mesh=mesh, cluster="dgx-h100", in_specs=pins, options=opts)
    compiled = fsdp.lower(*ex.args).compile()
    plan = fsdp.plan
    is_spec = lambda x: isinstance(x, P)
    wanted = jax.tree.leaves(pins[0], is_leaf=is_spec)
    planned = jax.tree.leaves(plan.partition_specs()[0], is_leaf=is_spec)
    leaves = jax.tree.leaves(ex.args[0])
    for want, got, leaf in zip(wanted, planned, leaves, strict=True):  # the rules' layouts
        sharding = jax.sharding.NamedSharding(mesh, got)
        assert sharding.is_equivalent_to(jax.sharding.NamedSharding(mesh, want), leaf.ndim)
    assert all(r["kept"] for r in plan.user_constraints())
    fid = fidelity(plan.collectives, compiled)
    assert fid.predicted_bytes == fid.hlo_bytes > 0, fid.text
    assert not fid.unexpected_kinds, fid.text
    assert fid.predicted_counts.keys() == fid.hlo_counts.keys(), fid.text
    auto = jaxpar.plan(ex.step, *ex.args, mesh=MESH, cluster="dgx-h100")
    assert auto.cost.overlapped_step_s <= plan.cost.overlapped_step_s * (1 + 1e-9)


@pytest.mark.closed_form
@pytest.mark.slow
def test_maxtext_default_rules_combined_all_reduces_counted():
    """The counts per kind after XLA's combiner, under MaxText's default rules, exactly: the
    loop's gradient all-reduces over `data` in two groups, as XLA lists their replica groups
    in two orders (`cost.evaluation.group_order`)."""
    mesh = jaxpar.make_mesh(MESH)
    ex = mt.maxtext_example("maxtext_small", CFG)
    opts = jaxpar.PlannerOptions(user_constraints="pin")
    fsdp = jaxpar.auto_shard(
        ex.step, mesh=mesh, cluster="dgx-h100", in_specs=fsdp_in_specs(ex), options=opts
    )
    compiled = fsdp.lower(*ex.args).compile()  # plans first
    fid = fidelity(fsdp.plan.collectives, compiled)
    assert fid.counts_ok(tolerance=0.0, slack=0), fid.text


@pytest.mark.api
@pytest.mark.slow
def test_planned_on_maxtexts_twelve_axis_mesh():
    """On MaxText's own 12-axis mesh (its defaults on 8 devices: fsdp 8) the step plans as on
    the one-axis mesh of its non-trivial axis, and runs with the predicted collectives."""
    mesh = mt.maxtext_mesh()
    ex = mt.maxtext_example("maxtext_small", CFG)
    step = jaxpar.auto_shard(ex.step, mesh=mesh, cluster="dgx-h100")
    compiled = step.lower(*ex.args).compile()
    plan = step.plan
    flat_mesh = jaxpar.make_mesh({"fsdp": 8})  # the same devices, on CPU: the same prices
    flat = jaxpar.plan(ex.step, *ex.args, mesh=flat_mesh, cluster="dgx-h100")
    assert plan.cost.overlapped_step_s == pytest.approx(flat.cost.overlapped_step_s, rel=1e-9)
    fid = fidelity(plan.collectives, compiled)
    assert fid.predicted_bytes == fid.hlo_bytes, fid.text
    rules = dict(plan.export_specs().logical_rules)
    assert "activation_batch" in rules
