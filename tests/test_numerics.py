"""Numerics and closed-form tiers (docs/testing.md, "Test tiers"): the auto-sharded step equals
the unsharded one, and the compiled program's collectives are the plan's (bytes, and per kind
the count after XLA's combiner), for every model, mesh and strategy planned here."""

import functools

import jax
import jaxpar_zoo as zoo
import pytest
from helpers import assert_equivalent, assert_fidelity

import jaxpar
from jaxpar.verify.compiled import compiled_memory

pytestmark = pytest.mark.numerics

MESHES = {
    "8": {"data": 8},
    "2x4": {"data": 2, "model": 4},
    "2x2x2": {"a": 2, "b": 2, "c": 2},
}
MODELS = ["mlp", "cnn", "lenet5", "gpt_small", "nnx_mlp"]


@functools.cache
def reference(name):
    ex = zoo.get(name, small=True)
    args = ex.make_args(0)
    return ex, args, jax.jit(ex.step)(*args)


# Predicted / compiled peak memory of these plans (docs/memory.md, "Memory"): 0.906-1.094
MEMORY_BAND = (0.90, 1.10)


def run_and_check(name, mesh_axes, **kw):
    ex, args, ref = reference(name)
    step = jaxpar.auto_shard(ex.step, mesh=jaxpar.make_mesh(mesh_axes), **kw)
    out = step(*args)
    assert_equivalent(out, ref)
    plan = step.plan
    compiled = step.lower(*args).compile()
    check = assert_fidelity(plan, compiled)
    # per kind, the predicted count after combining is the compiled program's (within 10 % or
    # ±1): data parallelism's gradient all-reduces, which XLA merges (test_combine: 28 become
    # 1 in the GPT), and the hand plans' gathers of small tensors (no dead equations, no
    # gathers of uniform tensors)
    assert check.counts_ok(), check.text
    assert plan.cost.combined_all_reduces == check.predicted_counts.get("all-reduce", 0)
    assert plan.cost.combined_step_s <= plan.cost.step_s
    # the mesh's devices are CPUs, so the memory model follows XLA:CPU whatever the cluster
    parts = compiled_memory(compiled)
    lo, hi = MEMORY_BAND
    assert lo <= plan.memory.peak / parts["peak"] <= hi, (
        f"predicted:\n{plan.memory.breakdown()}\ncompiled: {parts}"
    )
    return plan


@pytest.mark.slow
@pytest.mark.parametrize("mesh", sorted(MESHES))
@pytest.mark.parametrize("name", MODELS)
def test_auto_numerics_fidelity_quality(name, mesh):
    plan = run_and_check(name, MESHES[mesh])
    # quality (a): the search is never worse than a baseline under the step it is chosen by
    step = plan.cost.step_for(plan.objective)
    for base, cost in plan.baselines.items():
        assert step <= cost.step_for(plan.objective) * (1 + 1e-9), (base, plan.comparison())


@pytest.mark.parametrize("strategy", ["data", "model", "owt"])
@pytest.mark.parametrize("name", MODELS)
def test_baselines_numerics_fidelity(name, strategy):
    plan = run_and_check(name, MESHES["2x4"], strategy=strategy)
    assert plan.strategy == strategy


@pytest.mark.parametrize("cluster", ["p100", "dgx-h100"])
@pytest.mark.parametrize("name", ["gpt_small", "cnn"])
def test_auto_on_gpu_clusters(name, cluster):
    """Fast links make sharding pay even for small models: exercise real model/hybrid plans."""
    plan = run_and_check(name, MESHES["2x4"], cluster=cluster)
    assert plan.cluster.name.startswith(cluster)
    for cost in plan.baselines.values():  # by the step the plan was chosen by
        assert plan.cost.step_for(plan.objective) <= cost.step_for(plan.objective) * (1 + 1e-9)


def test_comm_objective_plans_apply():
    plan = run_and_check("mlp", MESHES["2x4"], objective="comm")
    assert plan.objective == "comm"
    for cost in plan.baselines.values():
        assert plan.cost.comm_bytes <= cost.comm_bytes * (1 + 1e-9)


def test_overlap_objective_plans_apply():
    """Plans chosen for the overlapped step run like any other: equal to the unsharded step,
    the compiled collectives as predicted, never longer overlapped than a baseline."""
    plan = run_and_check("gpt_small", MESHES["2x4"], objective="overlap", cluster="dgx-h100")
    assert plan.objective == "overlap"
    for cost in plan.baselines.values():
        assert plan.cost.overlapped_step_s <= cost.overlapped_step_s * (1 + 1e-9)
