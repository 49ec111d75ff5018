"""Tests for the ``models`` zoo: abstract args, concrete args and a few real training steps."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jaxpar_zoo as zoo
import numpy as np
import pytest

ALL = zoo.NAMES + zoo.EXTRA

# Published trainable-parameter counts of the full-size configs (torchvision for the CNNs,
# Hugging Face GPT-2, timm ViT-B/16, the GPT-3 paper's "1.3B"); the zoo must be within 3%.
# LeNet-5 (SAME-padded first conv) and the Soybean MLP are counted from their definitions.
PUBLISHED_PARAMS = {
    "lenet5": 61_706,
    "alexnet": 61_100_840,
    "vgg11": 132_863_336,
    "vgg13": 133_047_848,
    "vgg16": 138_357_544,
    "vgg19": 143_667_240,
    "inception_v3": 23_834_568,  # without the auxiliary classifier
    "resnet18": 11_689_512,
    "resnet34": 21_797_672,
    "resnet50": 25_557_032,
    "soybean_mlp": 5 * (320 * 320 + 320),
    "gpt2_124m": 124_439_808,
    "gpt2_1b3": 1_300_000_000,
    "vit_b16": 86_567_656,
    "nnx_gpt": 124_439_808,
}


DEFAULT_LEVEL = {"xla_backend_optimization_level": 2}  # XLA's default


def _leaf_signature(tree) -> list[tuple[tuple[int, ...], np.dtype, bool]]:
    return [
        (tuple(x.shape), jnp.dtype(x.dtype), bool(getattr(x, "weak_type", False)))
        for x in jax.tree.leaves(tree)
    ]


@pytest.fixture(scope="module", params=ALL)
def small_example(request) -> zoo.Example:
    # Module scope: building (and tracing init for) an example once per name keeps tests fast.
    return zoo.get(request.param, small=True)


@pytest.mark.api
def test_names_registered():
    assert zoo.NAMES == (
        "lenet5",
        "alexnet",
        "vgg11",
        "vgg13",
        "vgg16",
        "vgg19",
        "inception_v3",
        "resnet18",
        "resnet34",
        "resnet50",
        "soybean_mlp",
        "gpt2_124m",
        "gpt2_1b3",
        "vit_b16",
        "nnx_gpt",
    )
    assert zoo.EXTRA == ("cnn", "mlp", "gpt_small", "nnx_mlp")
    assert len(set(ALL)) == len(ALL)
    registered = set(zoo.registered_names())
    assert registered == set(ALL + zoo.LARGE + zoo.LARGE_EXTRA + zoo.SCANNED + zoo.MAXTEXT)


@pytest.mark.api
def test_unknown_name_raises():
    with pytest.raises(KeyError, match="unknown model"):
        zoo.get("no_such_model")


@pytest.mark.api
def test_args_are_abstract(small_example):
    for leaf in jax.tree.leaves(small_example.args):
        assert isinstance(leaf, jax.ShapeDtypeStruct)
    assert small_example.name in ALL


@pytest.mark.api
def test_default_small_batch_divisible_by_8(small_example):
    for leaf in jax.tree.leaves(small_example.args[1]):
        assert leaf.shape[0] % 8 == 0


@pytest.mark.api
@pytest.mark.slow
def test_make_args_matches_args(small_example):
    concrete = small_example.make_args(0)
    assert jax.tree.structure(concrete) == jax.tree.structure(small_example.args)
    assert _leaf_signature(concrete) == _leaf_signature(small_example.args)


@pytest.mark.api
@pytest.mark.slow
def test_make_args_deterministic(small_example):
    a = small_example.make_args(3)
    b = small_example.make_args(3)
    c = small_example.make_args(4)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert any(
        not np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(jax.tree.leaves(a[1]), jax.tree.leaves(c[1]), strict=True)
    )


@pytest.mark.numerics
@pytest.mark.parametrize("name", ["lenet5", "gpt_small"])
def test_make_args_equals_default_jit(name):
    # make_args compiles init at a lower XLA:CPU optimization level; values must not change
    # from a user's jax.jit at XLA's default level 2 (the suite's own default is 0: conftest.py)
    ex = zoo.get(name, small=True)
    state, batch = ex.make_args(5)
    init_key, data_key = jax.random.split(jax.random.PRNGKey(5))

    def default_jit(fn, key):
        return jax.jit(fn).lower(key).compile(compiler_options=DEFAULT_LEVEL)(key)

    ref = (default_jit(ex.init_state, init_key), default_jit(ex.sample_batch, data_key))
    for x, y in zip(jax.tree.leaves((state, batch)), jax.tree.leaves(ref), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.api
def test_get_returns_fresh_config():
    a = zoo.get("mlp", small=True)
    a.config["lr"] = -1.0
    b = zoo.get("mlp", small=True)
    assert b.config["lr"] != -1.0
    assert b.step is a.step and b.init_state is a.init_state


@pytest.mark.numerics
@pytest.mark.slow
def test_step_trains(small_example):
    device = jax.devices()[0]
    state, batch = jax.device_put(small_example.make_args(0), device)
    step = jax.jit(small_example.step)
    state0 = state
    losses = []
    for _ in range(4):
        state, metrics = step(state, batch)
        loss = metrics["loss"]
        assert loss.shape == () and loss.dtype == jnp.float32
        assert loss.devices() == {device}
        losses.append(float(loss))
    assert np.all(np.isfinite(losses))
    # losses[i] is measured before update i, so 3 updates separate losses[0] and losses[3].
    assert losses[3] < losses[0], losses
    # The step must return a state of the same structure/shapes it was given.
    assert jax.tree.structure(state) == jax.tree.structure(state0)
    assert _leaf_signature(state) == _leaf_signature(state0)
    changed = [
        not np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(jax.tree.leaves(state0), jax.tree.leaves(state), strict=True)
    ]
    assert any(changed)


@pytest.mark.api
def test_step_traces_abstractly(small_example):
    jaxpr = jax.make_jaxpr(small_example.step)(*small_example.args)
    assert len(jaxpr.jaxpr.eqns) > 0
    out_state, out_metrics = jax.eval_shape(small_example.step, *small_example.args)
    assert _leaf_signature(out_state) == _leaf_signature(small_example.args[0])
    assert out_metrics["loss"].shape == () and out_metrics["loss"].dtype == jnp.float32


@pytest.mark.api
@pytest.mark.parametrize("name", ALL)
def test_batch_override(name):
    ex = zoo.get(name, batch=24, small=True)
    for leaf in jax.tree.leaves(ex.args[1]):
        assert leaf.shape[0] == 24


@pytest.mark.api
@pytest.mark.parametrize("name", ALL)
def test_full_config_is_abstract(name):
    # Full-size configs must be describable without allocating parameters (eval_shape only).
    ex = zoo.get(name)
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(ex.args))
    small = zoo.get(name, small=True)
    assert jax.tree.leaves(ex.args[1])[0].shape[0] % 8 == 0
    n_full = sum(x.size for x in jax.tree.leaves(ex.args[0]))
    n_small = sum(x.size for x in jax.tree.leaves(small.args[0]))
    assert n_full >= n_small
    assert small.config["params"] <= n_small  # params only: no optimizer state / statistics
    assert ex.config["params"] >= small.config["params"]


@pytest.mark.closed_form
@pytest.mark.parametrize("name", zoo.NAMES)
def test_full_param_counts(name):
    # Abstract only: counted from the ShapeDtypeStructs of ``args``, nothing is allocated.
    ex = zoo.get(name)
    params = ex.args[0][0] if isinstance(ex.args[0], tuple) else ex.args[0].params
    n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    assert n == ex.config["params"]
    assert abs(n / PUBLISHED_PARAMS[name] - 1) <= 0.03, (name, n, PUBLISHED_PARAMS[name])


@pytest.mark.closed_form
def test_soybean_full_batch():
    ex = zoo.get("soybean_mlp")
    assert ex.args[1]["x"].shape == (400, 320)
    assert ex.args[1]["y"].shape == (400,)


@pytest.mark.numerics
@pytest.mark.parametrize("name", ["mlp", "gpt_small"])
def test_bfloat16_loss_is_f32(name):
    ex = zoo.get(name, small=True, dtype=jnp.bfloat16)
    state, batch = ex.make_args(0)
    _, metrics = jax.jit(ex.step)(state, batch)
    assert metrics["loss"].dtype == jnp.float32
    assert np.isfinite(float(metrics["loss"]))
