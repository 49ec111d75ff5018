"""Plans as artifacts: save / load / apply without re-planning, validation, export."""

import json
import random
import time

import jax
import jaxpar_zoo as zoo
import numpy as np
import pytest
from helpers import assert_equivalent
from jax.sharding import NamedSharding, PartitionSpec

import jaxpar
from jaxpar.planner import plan_file
from jaxpar.planner.pipeline import make_plan
from jaxpar.planner.plan_file import PlanFileError, load_plan, loads
from jaxpar.verify.compiled import compiled_collectives

MESH = {"data": 2, "model": 4}


def _collectives(lowered):
    return sorted(
        (c.kind, c.group_size, c.bytes_per_device) for c in compiled_collectives(lowered.compile())
    )


@pytest.fixture(scope="module")
def mlp_file():
    ex = zoo.get("mlp", small=True)
    plan = jaxpar.plan(ex.step, *ex.args, mesh=MESH, cluster="p100", strategy="model")
    assert plan.collectives and any(any(s) for s in plan.invar_specs)  # not all replicated
    return ex, plan, plan_file.dumps(plan)


@pytest.mark.numerics
@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt_small", "cnn"])
def test_saved_plan_applies_like_a_fresh_one(name, tmp_path):
    ex = zoo.get(name, small=True)
    mesh = jaxpar.make_mesh(MESH)
    fresh = jaxpar.auto_shard(ex.step, mesh=mesh, cluster="p100")
    fresh_lowered = fresh.lower(*ex.args)
    fresh.plan.save(tmp_path / "plan.json")
    data = json.loads((tmp_path / "plan.json").read_text())  # plain JSON
    assert data["schema"] == "jaxpar.planfile/2" and data["mesh"]["axes"] == ["data", "model"]
    loaded = load_plan(tmp_path / "plan.json")
    applied = jaxpar.auto_shard(ex.step, mesh=mesh, cluster="p100", plan=loaded)
    lowered = applied.lower(*ex.args)
    plan = applied.plan
    assert "search" not in plan.stats and plan.stats["loaded_plan"]  # nothing searched
    assert plan.invar_specs == fresh.plan.invar_specs
    assert plan.outvar_specs == fresh.plan.outvar_specs
    assert plan.tensor_specs == fresh.plan.tensor_specs
    assert plan.cost.step_s == pytest.approx(fresh.plan.cost.step_s)
    assert plan.cost.comm_bytes == pytest.approx(loaded.predicted["cost"]["comm_bytes"])
    assert _collectives(lowered) == _collectives(fresh_lowered)
    args = ex.make_args(0)
    ref = fresh(*args)
    out = applied(*ex.make_args(0))
    assert_equivalent(out, ref, rtol=1e-6)
    by_path = jaxpar.auto_shard(ex.step, mesh=mesh, cluster="p100", plan=tmp_path / "plan.json")
    by_path.lower(*ex.args)
    assert by_path.plan.invar_specs == fresh.plan.invar_specs


@pytest.mark.api
def test_plan_object_applies_without_search(mlp_file):
    ex, plan, _ = mlp_file
    step = jaxpar.auto_shard(ex.step, mesh=jaxpar.make_mesh(MESH), plan=plan)
    step.lower(*ex.args)
    assert step.plan.invar_specs == plan.invar_specs and step.plan.optimal is False
    assert step.plan.stats["saved"]["optimal"] == plan.optimal
    assert "jaxpar plan" in step.plan.report() and step.plan.comparison()


@pytest.mark.api
def test_other_signature_mesh_or_program_fails_clearly(mlp_file):
    ex, _, text = mlp_file
    loaded = loads(text)
    mesh = jaxpar.make_mesh(MESH)
    with pytest.raises(PlanFileError, match=r"mesh \{'model': 4, 'data': 2\}"):
        jaxpar.auto_shard(ex.step, mesh=jaxpar.make_mesh({"model": 4, "data": 2}), plan=loaded)
    with pytest.raises(PlanFileError, match=r"made for mesh .* applied on mesh \{'data': 8\}"):
        jaxpar.auto_shard(ex.step, mesh=jaxpar.make_mesh({"data": 8}), plan=loaded)
    bare = jaxpar.auto_shard(plan=loaded)(ex.step)  # default 1-D mesh: checked at the call
    with pytest.raises(PlanFileError, match="applied on mesh"):
        bare.lower(*ex.args)
    step = jaxpar.auto_shard(ex.step, mesh=mesh, plan=loaded)
    state, batch = ex.args
    other = jax.tree.map(
        lambda s: jax.ShapeDtypeStruct((s.shape[0] * 2, *s.shape[1:]), s.dtype), batch
    )
    with pytest.raises(PlanFileError, match=r"signature.*argument \[1\].*float32\[.*the plan's is"):
        step.lower(state, other)
    with pytest.raises(PlanFileError, match="leaves"):
        step.lower(state)

    def other_step(state, batch):  # same signature, another program
        state, metrics = ex.step(state, batch)
        return state, jax.tree.map(lambda m: m * 2, metrics)

    with pytest.raises(PlanFileError, match="another program"):
        jaxpar.auto_shard(other_step, mesh=mesh, plan=loaded).lower(*ex.args)
    with pytest.raises(ValueError, match="not both"):
        jaxpar.auto_shard(ex.step, mesh=mesh, plan=loaded, in_specs=(None, PartitionSpec()))
    with pytest.raises(TypeError, match="plan= takes"):
        jaxpar.auto_shard(ex.step, mesh=mesh, plan=3)


def _paths(node, prefix=()):
    """Every (path, value) in a JSON tree."""
    yield prefix, node
    items = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node)
        if isinstance(node, list)
        else ()
    )
    for k, v in items:
        yield from _paths(v, (*prefix, k))


def _set(data, path, value):
    for k in path[:-1]:
        data = data[k]
    data[path[-1]] = value


def _mutants(text, rng):
    """Corrupted and adversarial variants of a plan file (bytes)."""
    raw = text.encode()
    for cut in sorted(rng.sample(range(len(raw)), 150)):
        yield raw[:cut]
    for _ in range(60):
        b = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        yield bytes(b)
    yield raw[:100] + b"\xff\xfe\x80" + raw[100:]
    yield b"[" * 100_000 + b"]" * 100_000
    yield b'{"a":' * 50_000
    yield b"1" * 10_000
    yield b"1e999"
    yield raw.replace(b'"schema": "jaxpar.planfile/2"', b'"schema": "jaxpar.planfile/3"')
    data = json.loads(text)
    paths = [p for p, _ in _paths(data) if p]
    bad_values = [None, True, "x", 1.5, -1, 2**70, 10**400, [], {}, [[["deep"]]], "é" * 70_000]
    for path in rng.sample(paths, min(len(paths), 250)):
        d = json.loads(text)
        _set(d, path, rng.choice(bad_values))
        yield json.dumps(d).encode()
    for path in [p for p, v in _paths(data) if isinstance(v, dict)][:40]:
        d = json.loads(text)
        _set(d, (*path, "unexpected"), 1) if path else d.update(unexpected=1)
        yield json.dumps(d).encode()
    for i in range(len(data["arguments"])):
        d = json.loads(text)
        d["arguments"][i]["spec"] = [["nonexistent"], *d["arguments"][i]["spec"][1:]]
        yield json.dumps(d).encode()
    d = json.loads(text)
    fake = dict(kind="all-reduce", axes=["gpu"], group_size=2, bytes=8.0, time_s=0.0)
    fake.update(tensor="f32[2]", reason="reshard", phase="forward", layer="x")
    d["predicted"]["collectives"] = [fake]
    yield json.dumps(d).encode()
    d = json.loads(text)
    d["mesh"]["sizes"] = [2**20, 2**20]
    yield json.dumps(d).encode()
    yield text.replace('"schema"', '"schema": 1, "schema"', 1).encode()  # duplicate field


@pytest.mark.api
def test_corrupted_files_raise_only_plan_file_error(mlp_file):
    _, _, text = mlp_file
    rng = random.Random(1234)
    t0, failures, total = time.perf_counter(), 0, 0
    for raw in _mutants(text, rng):
        total += 1
        try:
            loads(raw)
        except PlanFileError as err:
            failures += 1
            assert str(err).startswith("plan file")
    assert failures >= total * 0.9  # nearly every mutant is refused; the rest are valid files
    with pytest.raises(PlanFileError, match=r"planfile/3.*not supported"):
        loads(text.replace("jaxpar.planfile/2", "jaxpar.planfile/3"))
    with pytest.raises(PlanFileError, match="mesh axis 'nonexistent' does not exist"):
        d = json.loads(text)
        arg = next(a for a in d["arguments"] if a["spec"])
        arg["spec"][0] = ["nonexistent"]
        loads(json.dumps(d))
    assert time.perf_counter() - t0 < 60


@pytest.mark.api
def test_bad_assignments_are_refused_at_application(mlp_file):
    ex, _, text = mlp_file
    mesh = jaxpar.make_mesh(MESH)
    rng = random.Random(7)
    data = json.loads(text)
    checked = 0
    for _ in range(12):
        d = json.loads(text)
        node = rng.randrange(len(d["assignment"]))
        d["assignment"][node] = [rng.randint(-1, 9), rng.randint(-1, 9)]
        pf = loads(json.dumps(d))  # structurally valid: caught when applied
        try:
            make_plan(ex.step, ex.args, mesh, None, pf.options, saved=pf)
        except PlanFileError as err:
            checked += 1
            assert "assignment" in str(err) or "arguments" in str(err) or "results" in str(err)
    assert checked >= 6
    d = dict(data, arguments=[dict(a, spec=[[] for _ in a["spec"]]) for a in data["arguments"]])
    with pytest.raises(PlanFileError, match="does not match its assignment"):
        pf = loads(json.dumps(d))
        make_plan(ex.step, ex.args, mesh, None, pf.options, saved=pf)
    with pytest.raises(PlanFileError, match="cannot read"):
        load_plan("/nonexistent/plan.json")


@pytest.mark.numerics
@pytest.mark.slow
def test_exported_specs_run_with_plain_jit():
    ex = zoo.get("gpt_small", small=True, batch=256)  # smaller, it runs best replicated
    mesh = jaxpar.make_mesh(MESH)
    step = jaxpar.auto_shard(ex.step, mesh=mesh, cluster="p100")
    step.lower(*ex.args)
    plan = step.plan
    exported = plan.export_specs()
    assert jax.tree.structure(
        plan.partition_specs(), is_leaf=lambda x: isinstance(x, PartitionSpec)
    ) == jax.tree.structure(exported.in_specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
    to_sharding = lambda tree: jax.tree.map(
        lambda s: NamedSharding(mesh, s), tree, is_leaf=lambda x: isinstance(x, PartitionSpec)
    )
    in_sh, out_sh = to_sharding(exported.in_specs), to_sharding(exported.out_specs)
    plain = jax.jit(ex.step, in_shardings=in_sh, out_shardings=out_sh)  # no jaxpar at run time
    args = jax.device_put(ex.make_args(0), in_sh)
    out = plain(*args)
    for arr, want in zip(jax.tree.leaves(args), jax.tree.leaves(plan.in_shardings), strict=True):
        assert arr.sharding.is_equivalent_to(want, arr.ndim)
    for arr, want in zip(jax.tree.leaves(out), jax.tree.leaves(plan.out_shardings), strict=True):
        assert arr.sharding.is_equivalent_to(want, arr.ndim)
    assert any(s != PartitionSpec() for _, s in exported.listing)
    assert_equivalent(out, step(*ex.make_args(0)), rtol=1e-5)
    text = exported.text()
    assert "['kernel']" in text or "kernel" in text
    assert "logical-axis rules" in text


@pytest.mark.api
def test_logical_rules_and_listing(mlp_file):
    ex, plan, text = mlp_file
    exported = plan.export_specs()
    rules, axes = exported.logical_rules, exported.logical_axes
    assert set(axes) == set(plan.program.invar_paths)
    table = dict(rules)
    assert len(table) == len(rules)  # one rule per expressible name
    assert not set(table) & set(exported.not_expressible)
    for (path, spec), (_, names) in zip(exported.listing, axes.items(), strict=False):
        entries = tuple(spec) + (None,) * (len(names) - len(spec))
        for n, entry in zip(names, entries, strict=True):  # each dim follows its name's rule
            assert table[n] == entry if n in table else n in exported.not_expressible, path
    replicated = jaxpar.plan(ex.step, *ex.args, mesh=MESH, strategy="data")
    exported = replicated.export_specs()  # data parallel: one layout per role
    assert ("kernel.0", None) in exported.logical_rules and not exported.not_expressible
    assert ["kernel.0", []] in exported.maxtext_rules()
    listing = loads(text).listing()
    assert listing.count("\n") + 1 == len(plan.program.invars) + len(plan.program.outvars)
    assert np.all([line.split(":")[0] for line in listing.splitlines()])
