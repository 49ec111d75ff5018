"""The paper model zoo under the planner.

* every model (small config) auto-shards on a 2x4 mesh of the 8 fake devices, with the planner's
  choice and with a forced hybrid strategy; two sharded steps equal two unsharded ones
  (per-model tolerance: RTOL);
* every primitive of every model has a sharding rule (nothing falls back to replicated);
* every full-size model plans on an abstract 4x4 mesh (no devices, nothing allocated).
"""

import functools
import math

import jax
import jaxpar_zoo as zoo
import pytest
from helpers import assert_equivalent

import jaxpar

MESH = {"data": 2, "model": 4}

# Per-leaf tolerance (helpers.assert_equivalent) of two sharded steps against two unsharded
# ones in float32.  Summation order differs once the batch or a contraction is split, and some
# models amplify that rounding more than others (measured over seeds 0-2, forced "owt" and
# "data" strategies): plain CNNs and MLPs stay below 1e-6; the AdamW transformers reach 1e-5
# (Adam normalizes tiny gradients); the deep BatchNorm networks reach 5e-5 (BatchNorm's backward
# pass subtracts batch means).  Run in float64 (loss included), the sharded CNN/MLP steps equal
# the unsharded ones to 1e-13 (the transformers to 1e-6: their softmax stays float32), so these
# are rounding effects, while sharding bugs show up as errors of 1e-2 and more.
RTOL = {
    "gpt2_124m": 5e-5,
    "gpt2_1b3": 5e-5,
    "vit_b16": 5e-5,
    "nnx_gpt": 5e-5,
    "inception_v3": 2e-4,
    "resnet18": 2e-4,
    "resnet50": 2e-4,
}


@functools.cache
def _small(name):
    return zoo.get(name, small=True)


def _two_steps(step, state, batch):
    state, _ = step(state, batch)
    return step(state, batch)


@functools.cache
def _reference(name):
    """Concrete args and the unsharded (plain jit) result of two steps."""
    ex = _small(name)
    args = ex.make_args(0)
    return args, _two_steps(jax.jit(ex.step), *args)


# One model per family: VGG-11/13/19 and ResNet-34 repeat VGG-16's and ResNet-18's layers at
# another depth (same primitives, same rules; their plans are in the goldens, and the full-size
# ones plan below), and cost the suite minutes of compiling.
NUMERICS_NAMES = tuple(n for n in zoo.NAMES if n not in ("vgg11", "vgg13", "vgg19", "resnet34"))


# "auto": the planner's own choice (on these tiny models mostly replicated, i.e. no
# collectives); "owt": forced data-parallel convolutions / model-parallel Dense layers, which
# exercises all-reduces, all-gathers and all-to-alls in every model.
@pytest.mark.numerics
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["auto", "owt"])
@pytest.mark.parametrize("name", NUMERICS_NAMES)
def test_small_auto_shard_matches_unsharded(name, strategy):
    ex = _small(name)
    (state, batch), ref = _reference(name)
    step = jaxpar.auto_shard(
        ex.step, mesh=jaxpar.make_mesh(MESH), cluster="p100", strategy=strategy
    )
    out = _two_steps(step, state, batch)
    assert_equivalent(out, ref, rtol=RTOL.get(name, 1e-5))
    assert step.plan.stats["equations"] > 0
    if strategy == "owt":
        assert step.plan.collectives, "the forced strategy should communicate"


@pytest.mark.api
@pytest.mark.slow
@pytest.mark.parametrize("name", zoo.NAMES)
def test_full_size_plans_abstractly(name):
    ex = zoo.get(name)
    plan = jaxpar.plan(ex.step, *ex.args, mesh={"data": 4, "model": 4}, cluster="p100")
    assert plan.stats["equations"] > 0
    assert math.isfinite(plan.cost.step_s) and plan.cost.step_s > 0


@pytest.mark.api
@pytest.mark.parametrize("name", zoo.NAMES)
def test_every_primitive_has_a_sharding_rule(name):
    # No equation may fall back to the replicated rule (unknown primitive, scan, custom call...).
    from jaxpar.rules import table as rules
    from jaxpar.trace.tracing import trace

    ex = _small(name)
    program, _ = trace(ex.step, ex.args)
    fallback = {
        e.primitive
        for e in program.eqns
        if rules.RULES.get(e.primitive, rules.replicated_space) is rules.replicated_space
    }
    assert not fallback, f"{name}: no sharding rule for {sorted(fallback)}"


@pytest.mark.api
@pytest.mark.parametrize("name", ["mlp", "cnn", "gpt_small", "lenet5"])
def test_traced_steps_hold_no_dead_equations(name):
    """Every traced equation feeds a result (`trace._without_dead_code`): differentiation
    leaves primal values that only a stopped tangent read (the row maximum's mask of a
    log-softmax under ``stop_gradient``: 19 of the MLP step's 201 equations), which XLA drops
    and the planner used to price."""
    from jaxpar.trace.tracing import trace

    ex = _small(name)
    program, _ = trace(ex.step, ex.args)
    live = {t for t in program.outvars if t is not None}
    dead = []
    for e in reversed(program.eqns):
        if any(t in live for t in e.outputs):
            live.update(t for t in e.inputs if t is not None)
        else:
            dead.append(e.primitive)
    assert not dead, f"{name}: {len(dead)} equations feed no result: {sorted(set(dead))}"
