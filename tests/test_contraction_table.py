"""Measured library calls (OptCNN's measured t_C): the per-device calls a plan's contractions
make, their table keys, the calibration file's table, pricing with it, and measuring it on the
simulated CPU devices end to end (`jaxpar.measure_contractions`, `jaxpar calibrate
--contractions-of`)."""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import jaxpar_zoo as zoo
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from test_calibrate import synthetic

import jaxpar
from jaxpar.cli.main import main
from jaxpar.cost.contraction_calls import (
    TABLE_PRIMITIVES,
    contraction_key,
    member_calls,
    member_shard_shapes,
    plan_calls,
)
from jaxpar.cost.kernels import node_kernels
from jaxpar.cost.node_costs import node_work
from jaxpar.hardware.calibration import load_calibration
from jaxpar.nodes.configs import dim_degrees, spec_of
from jaxpar.runtime.measure_contractions import call_kernel_ops


@pytest.fixture(scope="module")
def cnn_plan():
    """The small CNN (convolutions and a dense layer) planned on a 2 x 4 mesh."""
    ex = zoo.get("cnn", small=True)
    cal = synthetic(rate=1e12, kind=jax.devices()[0].device_kind)
    mesh = jaxpar.make_mesh({"a": 2, "b": 4})
    return jaxpar.plan(ex.step, *ex.args, mesh=mesh, cluster=cal, memory_budget=None), ex, cal


def contraction_members(plan):
    for node in plan.ng.nodes:
        for m in node.members:
            if m.eqn >= 0 and plan.program.eqns[m.eqn].primitive in TABLE_PRIMITIVES:
                yield node, m


# ---- keys and per-device calls ---------------------------------------------------------------


@pytest.mark.closed_form
def test_the_key_names_primitive_operands_and_geometry_in_plain_values():
    dn = lax.conv_dimension_numbers((8, 3, 32, 32), (16, 3, 3, 3), ("NCHW", "OIHW", "NCHW"))
    params = dict(
        window_strides=(1, 1), padding=((1, 1), (1, 1)), lhs_dilation=(1, 1),
        rhs_dilation=(1, 1), dimension_numbers=dn, feature_group_count=1, batch_group_count=1,
        precision=None, preferred_element_type=np.dtype("float32"),
    )  # fmt: skip
    shapes, dtypes = [(8, 3, 32, 32), (16, 3, 3, 3)], ["float32", "float32"]
    key = contraction_key("conv_general_dilated", params, shapes, dtypes)
    assert key.startswith("conv_general_dilated float32[8, 3, 32, 32] float32[16, 3, 3, 3] ")
    assert "dimension_numbers=((0, 1, 2, 3), (0, 1, 2, 3), (0, 1, 2, 3))" in key
    assert "preferred_element_type='float32'" in key and "precision" not in key
    # the named tuple and the numpy dtype key the same as their plain spellings
    plain = dict(params, dimension_numbers=tuple(tuple(s) for s in dn))
    plain["preferred_element_type"] = "float32"
    assert contraction_key("conv_general_dilated", plain, shapes, dtypes) == key
    # a different stride, shape or dtype is a different call
    assert contraction_key("conv_general_dilated", dict(params, window_strides=(2, 2)), shapes,
                           dtypes) != key  # fmt: skip
    assert contraction_key("conv_general_dilated", params, shapes, ["bfloat16"] * 2) != key


@pytest.mark.oracle
def test_per_device_shapes_are_the_shards_jax_lays_out(cnn_plan):
    """Every contraction member's operand shapes under every configuration equal the shard
    shape of its operand's layout (NamedSharding.shard_shape) on the plan's mesh."""
    plan, _, _ = cnn_plan
    sizes = plan.params.mesh.sizes
    checked = 0
    for node, m in contraction_members(plan):
        cfgs = plan.tables.configs[node.index]
        degrees = dim_degrees(cfgs, len(node.space.sizes), sizes)
        eqn = plan.program.eqns[m.eqn]
        for cfg, shapes in zip(cfgs, member_shard_shapes(plan.program, m, degrees), strict=True):
            for t, mp, shape in zip(eqn.inputs, m.in_maps, shapes, strict=True):
                sharding = NamedSharding(plan.mesh, plan.partition_spec(spec_of(mp, cfg)))
                assert shape == sharding.shard_shape(plan.program.tensors[t].shape)
                checked += 1
    assert checked > 500


@pytest.mark.oracle
def test_plan_calls_are_every_distinct_call_of_every_configuration(cnn_plan):
    """Brute force: the keys of every member's call under every configuration, one by one."""
    plan, _, _ = cnn_plan
    sizes = plan.params.mesh.sizes
    brute = set()
    for node, m in contraction_members(plan):
        degrees = dim_degrees(plan.tables.configs[node.index], len(node.space.sizes), sizes)
        for row in degrees:
            shards = np.prod([row[d] for d in m.used_dims]) if m.used_dims else 1.0
            (call,) = member_calls(plan.program, m, row[None, :], np.array([shards]))
            brute.add(call.key)
    calls = plan_calls(plan.ng, plan.tables.configs, sizes)
    assert {c.key for c in calls} == brute and len(calls) == len(brute)
    assert [c.flops for c in calls] == sorted((c.flops for c in calls), reverse=True)
    assert {c.primitive for c in calls} == {"dot_general", "conv_general_dilated"}


# ---- pricing with a table --------------------------------------------------------------------


@pytest.mark.closed_form
def test_a_measured_call_prices_its_kernel_and_a_missing_one_falls_back(cnn_plan):
    """With a table holding every call but one, each contraction kernel costs Σ of its calls'
    seconds (no kernel overhead) under every configuration whose calls are all there; under
    the others, and every other kernel, exactly what the calibration's curves give (with the
    overhead)."""
    plan, _, cal = cnn_plan
    sizes = plan.params.mesh.sizes
    calls = plan_calls(plan.ng, plan.tables.configs, sizes)
    seconds = {c.key: 1e-3 * (1 + i) for i, c in enumerate(calls)}
    missing = calls[len(calls) // 2].key
    del seconds[missing]
    overhead = 3e-6  # the other kernels pay it; a measured call's kernel is its measured time
    params = dataclasses.replace(plan.params, mesh=dataclasses.replace(
        plan.params.mesh, kernel_overhead=overhead))  # fmt: skip
    tabled = dataclasses.replace(params, mesh=dataclasses.replace(
        params.mesh, calibration=cal.with_contractions(seconds)))  # fmt: skip
    measured_kernels = fallbacks = 0
    for node in plan.ng.nodes:
        cfgs = plan.tables.configs[node.index]
        before = node_work(plan.ng, node, cfgs, params)
        after = node_work(plan.ng, node, cfgs, tabled)
        degrees = dim_degrees(cfgs, len(node.space.sizes), sizes)
        for k, kernel in enumerate(node_kernels(plan.ng, node, plan.params.fusion)):
            working = [node.members[i] for i in kernel.members if node.members[i].flops]
            contraction = [m for m in working if plan.program.eqns[m.eqn].primitive
                           in TABLE_PRIMITIVES]  # fmt: skip
            if not contraction or len(contraction) != len(working):
                np.testing.assert_array_equal(after.kernel_seconds[k], before.kernel_seconds[k])
                continue
            for c in range(len(cfgs)):
                keys = [member_calls(plan.program, m, degrees[c : c + 1], np.ones(1))[0].key
                        for m in contraction]  # fmt: skip
                if missing in keys:
                    assert after.kernel_seconds[k][c] == before.kernel_seconds[k][c]
                    fallbacks += 1
                else:
                    assert after.kernel_seconds[k][c] == pytest.approx(
                        sum(seconds[key] for key in keys), rel=1e-12)  # fmt: skip
                    measured_kernels += 1
    assert measured_kernels > 100 and fallbacks > 0


@pytest.mark.api
def test_the_table_round_trips_and_bad_entries_are_clear_errors(tmp_path):
    cal = synthetic().with_contractions({"dot_general float32[2, 3]": 2e-6, "b": 1e-3})
    assert cal.contractions == (("b", 1e-3), ("dot_general float32[2, 3]", 2e-6))
    assert cal.with_contractions({"b": 5e-3}).contraction_table["b"] == 5e-3
    path = tmp_path / "cal.json"
    cal.save(path)
    doc = json.loads(path.read_text())
    assert doc["version"] == 4  # 4 added the host link
    assert doc["contractions"][0] == {"call": "b", "seconds": 1e-3}
    assert load_calibration(path) == cal
    assert "2 library calls measured" in cal.source
    for bad, fragment in (
        ([{"call": "x", "seconds": -1}], "contractions[0].seconds must be > 0"),
        ([{"seconds": 1}], "missing field 'call'"),
        ([3], "contractions[0] must be an object"),
    ):
        doc["contractions"] = bad
        path.write_text(json.dumps(doc))
        with pytest.raises(ValueError, match="not a valid jaxpar calibration file") as err:
            load_calibration(path)
        assert fragment in str(err.value)
    with pytest.raises(ValueError, match="positive and finite"):
        synthetic().with_contractions({"x": float("nan")})


# ---- measuring on the simulated devices ------------------------------------------------------


@pytest.mark.api
def test_only_the_calls_own_instructions_are_timed():
    """A batched product whose batch dims are not leading needs layout copies of its
    parameters when compiled alone: `call_kernel_ops` keeps the product and leaves them out."""
    x = jax.ShapeDtypeStruct((4, 16, 2, 8), jnp.float32)

    def f(a, b):
        return lax.dot_general(a, b, (((3,), (3,)), ((0, 2), (0, 2))))

    text = jax.jit(f).lower(x, x).compile().as_text()
    ops = call_kernel_ops(text, "dot_general")
    assert ops
    entry = text[text.index("ENTRY") :]
    copies = [line.split("=")[0].strip().lstrip("%") for line in entry.splitlines()
              if "transpose" in line.split("=")[0] or "copy" in line.split("=")[0]]  # fmt: skip
    assert copies, entry  # XLA:CPU does copy the operands here
    assert not {c.replace(".", "_") for c in copies} & ops


@pytest.mark.slow
@pytest.mark.api
def test_measure_contractions_fills_the_table_the_plan_then_prices_with():
    ex = zoo.get("mlp", small=True)
    cal = synthetic(rate=1e12, kind=jax.devices()[0].device_kind)
    mesh = jaxpar.make_mesh({"a": 2})
    plan = jaxpar.plan(ex.step, *ex.args, mesh=mesh, cluster=cal, memory_budget=None)
    tabled = jaxpar.measure_contractions(plan, cal, quick=True)
    keys = {c.key for c in plan_calls(plan.ng, plan.tables.configs, plan.params.mesh.sizes)}
    assert set(tabled.contraction_table) == keys
    assert all(s > 0 for s in tabled.contraction_table.values())
    replanned = jaxpar.plan(ex.step, *ex.args, mesh=mesh, cluster=tabled, memory_budget=None)
    node = next(n for n in replanned.ng.nodes if n.anchor >= 0 and
                replanned.program.eqns[n.anchor].primitive == "dot_general")  # fmt: skip
    cfg = replanned.config(node.index)
    work = node_work(replanned.ng, node, [cfg], replanned.params)
    degrees = dim_degrees([cfg], len(node.space.sizes), replanned.params.mesh.sizes)
    anchor = next(m for m in node.members if m.eqn == node.anchor)
    (call,) = member_calls(replanned.program, anchor, degrees, np.ones(1))
    assert tabled.contraction_table[call.key] in [float(s[0]) for s in work.kernel_seconds]


@pytest.mark.api
def test_measuring_needs_the_calibrated_kind_and_a_calibration(cnn_plan):
    plan, _, _ = cnn_plan
    with pytest.raises(ValueError, match="calibrate this device first"):
        jaxpar.measure_contractions(plan, synthetic(kind="NVIDIA H100 80GB HBM3"))
    with pytest.raises(TypeError, match="must be a jaxpar Calibration"):
        jaxpar.measure_contractions(plan, "h100.json")
    with pytest.raises(TypeError, match="plan must be a jaxpar Plan"):
        jaxpar.measure_contractions(plan.tables, synthetic())


@pytest.mark.slow
@pytest.mark.api
def test_calibrate_adds_a_models_table_from_an_earlier_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))  # the command sets it
    first, second = tmp_path / "cal.json", tmp_path / "table.json"
    assert main(["calibrate", "--quick", "--out", str(first)]) == 0
    args = ["calibrate", "--quick", "--from", str(first), "--contractions-of", "mlp",
            "--plan-mesh", "a=2", "--batch", "4", "--out", str(second)]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "distinct library calls" in out and "library calls:" in out
    assert "--xla_gpu_enable_command_buffer=" in os.environ["XLA_FLAGS"]
    table = load_calibration(second)
    assert table.contractions and dataclasses.replace(table, contractions=()) == (
        load_calibration(first))  # fmt: skip
    for argv, fragment in (
        (["--batch", "4"], "--batch is an option of --contractions-of"),
        (["--from", str(first)], "--from FILE only makes sense with --contractions-of"),
        (["--contractions-of", "mlpp"], "unknown model 'mlpp'"),
    ):
        assert main(["calibrate", "--quick", "--out", str(tmp_path / "x.json"), *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and fragment in err, err


@pytest.mark.api
def test_a_call_the_device_rejects_keeps_the_model_price_and_is_reported(cnn_plan, monkeypatch):
    """A call XLA cannot run (here a convolution whose feature groups a split broke) is left
    out of the table with a warning naming it; the other calls are measured."""
    from jaxpar.runtime import measure_contractions as mc

    plan, _, cal = cnn_plan
    good = next(c for c in plan_calls(plan.ng, plan.tables.configs, plan.params.mesh.sizes)
                if c.primitive == "dot_general")  # fmt: skip
    conv = next(c for c in plan_calls(plan.ng, plan.tables.configs, plan.params.mesh.sizes)
                if c.primitive == "conv_general_dilated")  # fmt: skip
    broken = dataclasses.replace(conv, params={**conv.params, "feature_group_count": 7})
    monkeypatch.setattr(mc, "plan_calls", lambda *_: [good, broken])
    with pytest.warns(UserWarning, match="1 of 2 library calls could not run") as record:
        tabled = jaxpar.measure_contractions(plan, cal, quick=True)
    assert broken.key in str(record[0].message)
    assert set(tabled.contraction_table) == {good.key}
