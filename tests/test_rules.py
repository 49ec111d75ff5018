"""Rules for primitives Flax code emits (docs/design.md, "Test tiers": numerics + api): bit casts,
key clones and the scatter family have real rules; replicated fallbacks, loops included, warn
once naming the primitive and the layer."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpar
from jaxpar.rules import space_of

pytestmark = pytest.mark.numerics


@pytest.fixture(scope="module")
def mesh():
    return jaxpar.make_mesh({"data": 2, "model": 4})


def _spaces(step, primitive):
    plan = step.plan
    return [space_of(e, plan.program) for e in plan.program.eqns if e.primitive == primitive]


def test_bitcast_convert_type_has_a_rule_and_keeps_the_numbers(mesh):
    def f(x):
        same = jax.lax.bitcast_convert_type(x, jnp.int32)  # same width: elementwise
        narrow = jax.lax.bitcast_convert_type(x, jnp.uint8)  # adds a trailing dim of 4
        return (same & 0xFF).astype(jnp.float32) + narrow.astype(jnp.float32).sum(-1)

    x = jnp.arange(256.0, dtype=jnp.float32).reshape(16, 16) / 7
    step = jaxpar.auto_shard(f, mesh=mesh)
    np.testing.assert_array_equal(np.asarray(step(x)), np.asarray(jax.jit(f)(x)))
    spaces = _spaces(step, "bitcast_convert_type")
    assert len(spaces) == 2 and not any(s.replicated for s in spaces)
    narrow = next(s for s in spaces if len(s.sizes) == 3)
    assert narrow.splittable == (True, True, False)  # the byte dim stays whole


def test_scatter_set_splits_windows_but_never_scattered_dims(mesh):
    def g(x, idx, v):
        return x.at[idx].set(v) * 2.0

    x = jnp.arange(16 * 8, dtype=jnp.float32).reshape(16, 8)
    idx, v = jnp.array([1, 3, 5, 7]), jnp.ones((4, 8))
    step = jaxpar.auto_shard(g, mesh=mesh)
    np.testing.assert_array_equal(np.asarray(step(x, idx, v)), np.asarray(jax.jit(g)(x, idx, v)))
    (space,) = _spaces(step, "scatter")
    assert not space.replicated
    operand_dims = len(x.shape)
    scattered = range(operand_dims, len(space.sizes))
    assert scattered and not any(space.splittable[d] for d in scattered)
    assert space.splittable[1]  # the window (feature) dim follows the operand and may split


def test_scatter_add_still_splits_scattered_dims(mesh):
    def seg(data, ids):
        return jax.ops.segment_sum(data, ids, num_segments=4)

    data = jnp.arange(32.0).reshape(16, 2)
    ids = jnp.arange(16) % 4
    step = jaxpar.auto_shard(seg, mesh=mesh)
    np.testing.assert_allclose(np.asarray(step(data, ids)), np.asarray(jax.jit(seg)(data, ids)))
    (space,) = _spaces(step, "scatter-add")
    assert any(space.splittable[d] for d in range(2, len(space.sizes)))  # partial sums allowed


@pytest.mark.api
def test_loops_warn_once_naming_the_layer(mesh, caplog):
    import flax.linen as nn

    class Cumulative(nn.Module):
        @nn.compact
        def __call__(self, x):
            # a while loop whose trip count depends on the values is not planned inside
            def grow(c):
                return jax.lax.while_loop(lambda c: c.sum() < 1e4, lambda c: c * 2 + x[0], c)

            c = grow(x[1])
            return c.sum() + grow(c + 1).sum()

    model = Cumulative()
    x = jnp.arange(64.0).reshape(8, 8)
    params = model.init(jax.random.key(0), x)
    f = lambda p, x: model.apply(p, x)
    with caplog.at_level(logging.WARNING, logger="jaxpar"):
        step = jaxpar.auto_shard(f, mesh=mesh)
        out = step(params, x)
    np.testing.assert_allclose(np.asarray(out), np.asarray(jax.jit(f)(params, x)))
    messages = [r.getMessage() for r in caplog.records if "'while'" in r.getMessage()]
    assert len(messages) == 1, messages  # two loops, one warning per planning run
    assert "Cumulative" in messages[0] and "replicated" in messages[0]
