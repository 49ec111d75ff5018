"""Scanned-layer zoo models (models/scanned.py) and the scanned Llama: a layer (or micro-batch)
``scan`` in the train step's program, closed-form parameter counts, training, and float64
equality of scanned and unrolled models given the same (stacked) parameters."""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import jaxpar_zoo as zoo
import numpy as np
import optax
import pytest
from flax import nnx
from helpers import assert_trains
from jaxpar_zoo.llama import llama_config, llama_example
from jaxpar_zoo.scanned import residual_mlp, scanned_config, scanned_example, stack_layers
from test_llama import closed_form_params

SCANNED_GPTS = ("gpt_scan_linen", "gpt_scan_nnx")


def _gpt_params(cfg: dict) -> int:
    """Tied embedding + positions + layers (2 LNs, QKV without bias, out, 4x MLP) + final LN."""
    d = cfg["d_model"]
    layer = 4 * d + 3 * d * d + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
    return cfg["padded_vocab_size"] * d + cfg["seq_len"] * d + cfg["num_layers"] * layer + 2 * d


def _residual_mlp_params(cfg: dict) -> int:
    d, classes = cfg["d_model"], cfg["num_classes"]
    return (cfg["in_features"] + 1) * d + cfg["num_layers"] * (d + 1) * d + (d + 1) * classes


def _dense_stack_params(cfg: dict) -> int:
    widths = (cfg["in_features"], *cfg["features"])
    return sum((a + 1) * b for a, b in itertools.pairwise(widths))


CLOSED_FORM = {
    "gpt_scan_linen": _gpt_params,
    "gpt_unrolled_linen": _gpt_params,
    "gpt_scan_nnx": _gpt_params,
    "mlp_scan_lax": _residual_mlp_params,
    "mlp_grad_accum": _dense_stack_params,
}


def _params(state):
    """Trainable parameters of a state: ``(params, opt_state)`` or a ``TrainState``."""
    return state[0] if isinstance(state, tuple) else state.params


def _scan_lengths(jaxpr) -> list[int]:
    """Lengths of the scans at the top level of ``jaxpr`` (not inside another equation)."""
    return [int(e.params["length"]) for e in jaxpr.eqns if e.primitive.name == "scan"]


def _count(jaxpr, primitive: str) -> int:
    """Equations named ``primitive`` in ``jaxpr`` and all its sub-jaxprs."""
    count = 0
    for eqn in jaxpr.eqns:
        count += eqn.primitive.name == primitive
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    count += _count(inner, primitive)
    return count


def _step_jaxpr(ex: zoo.Example):
    return jax.jit(ex.step).trace(*ex.args).jaxpr.jaxpr


@pytest.mark.api
@pytest.mark.parametrize("name", zoo.SCANNED)
def test_train_step_has_a_top_level_scan(name):
    ex = zoo.get(name, small=True)
    jaxpr = _step_jaxpr(ex)
    lengths = _scan_lengths(jaxpr)
    if name == "gpt_unrolled_linen":
        assert _count(jaxpr, "scan") == 0
    elif name == "mlp_grad_accum":  # the static-bound fori_loop lowers to one scan
        assert lengths == [ex.config["n_micro"]] and _count(jaxpr, "while") == 0
    else:  # the forward scan and its transpose, over the layers
        assert lengths == [ex.config["num_layers"]] * 2, lengths


@pytest.mark.api
def test_llama_scan_layers_step_has_a_top_level_scan():
    saved, backward_dots = {}, {}
    for remat in (False, True):
        cfg = llama_config("llama_small", remat=remat, scan_layers=True)
        jaxpr = _step_jaxpr(llama_example("llama_small", cfg, jnp.float32))
        assert _scan_lengths(jaxpr) == [cfg["num_layers"]] * 2
        forward, backward = (e for e in jaxpr.eqns if e.primitive.name == "scan")
        # the activations the forward scan stacks for the backward one
        residuals = forward.outvars[forward.params["num_carry"] :]
        saved[remat] = sum(math.prod(v.aval.shape) for v in residuals)
        backward_dots[remat] = _count(backward.params["jaxpr"].jaxpr, "dot_general")
    # remat inside the scan: the forward scan keeps only each block's input (batch x seq x d),
    # the backward scan recomputes the block's projections
    assert saved[True] == cfg["num_layers"] * cfg["batch"] * cfg["seq_len"] * cfg["d_model"]
    assert saved[True] < saved[False] / 10
    assert backward_dots[True] > backward_dots[False]


@pytest.mark.closed_form
@pytest.mark.parametrize(
    ("name", "size"),
    [
        (name, size)
        for name in zoo.SCANNED
        for size in ("small", "full", "layers64")
        if size != "layers64" or name != "mlp_grad_accum"  # scans micro-batches, not layers
    ],
)
def test_param_counts(name, size):
    if size == "layers64":
        ex = scanned_example(name, scanned_config(name, layers=64))
    else:
        ex = zoo.get(name, small=size == "small")
    params = _params(ex.args[0])
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(ex.args))
    assert ex.config["params"] == CLOSED_FORM[name](ex.config)
    if name in SCANNED_GPTS or name == "mlp_scan_lax":
        stacked = params["blocks"] if "blocks" in params else params["layers"]
        assert {x.shape[0] for x in jax.tree.leaves(stacked)} == {ex.config["num_layers"]}
    if size == "full" and name.startswith("gpt"):
        assert ex.config["params"] == 124_448_256


@pytest.mark.closed_form
def test_llama_scan_layers_param_count():
    for name in zoo.LARGE:  # abstract, full size
        cfg = llama_config(name, scan_layers=True)
        cfg["num_layers"] = 4  # keeps the unrolled comparison's abstract trace short
        scanned = llama_example(name, cfg)
        unrolled = llama_example(name, {**cfg, "scan_layers": False})
        assert scanned.config["params"] == unrolled.config["params"] == closed_form_params(cfg)
        blocks = scanned.args[0].params["blocks"]
        assert {x.shape[0] for x in jax.tree.leaves(blocks)} == {4}
    llama3_8b = llama_example("llama3_8b", llama_config("llama3_8b", scan_layers=True))
    assert llama3_8b.config["params"] == 8_030_261_248


@pytest.mark.numerics
@pytest.mark.parametrize("name", [n for n in zoo.SCANNED if n != "gpt_unrolled_linen"])
def test_trains(name):
    assert_trains(zoo.get(name, small=True))


def _lm_loss(logits, tokens):
    """Next-token cross-entropy in the logits' dtype (float64 here: no float32 cast)."""
    return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:]).mean()


def _linen_loss_and_grads(ex, params, tokens):
    return jax.value_and_grad(lambda p: _lm_loss(ex.model.apply({"params": p}, tokens), tokens))(
        params
    )


def _assert_trees_close(got, want, rtol=1e-10, atol=1e-13):
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert a.dtype == b.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


@pytest.mark.numerics
@pytest.mark.slow
def test_gpt_scanned_linen_and_nnx_match_unrolled_in_float64():
    with jax.enable_x64(True):
        unrolled = zoo.get("gpt_unrolled_linen", small=True, dtype=jnp.float64)
        scanned = zoo.get("gpt_scan_linen", small=True, dtype=jnp.float64)
        nnx_scanned = zoo.get("gpt_scan_nnx", small=True, dtype=jnp.float64)
        layers = unrolled.config["num_layers"]
        state, batch = unrolled.make_args(0)
        stacked = stack_layers(state.params, layers)
        tokens = batch["tokens"]
        # the three models share one parameter layout once the unrolled blocks are stacked
        assert jax.tree.structure(stacked) == jax.tree.structure(scanned.args[0].params)
        assert jax.tree.structure(stacked) == jax.tree.structure(nnx_scanned.args[0][0])

        def nnx_loss(params):
            return _lm_loss(nnx.merge(nnx_scanned.model, params)(tokens), tokens)

        @jax.jit
        def all_three(params, stacked):
            return (
                _linen_loss_and_grads(unrolled, params, tokens),
                _linen_loss_and_grads(scanned, stacked, tokens),
                jax.value_and_grad(nnx_loss)(stacked),
            )

        (want_loss, want), (scan_loss, scan_grads), (nnx_loss_value, nnx_grads) = all_three(
            state.params, stacked
        )
        want = stack_layers(want, layers)
    assert want_loss.dtype == jnp.float64
    np.testing.assert_allclose(scan_loss, want_loss, rtol=1e-12)
    np.testing.assert_allclose(nnx_loss_value, want_loss, rtol=1e-12)
    _assert_trees_close(scan_grads, want)
    _assert_trees_close(nnx_grads, want)


@pytest.mark.numerics
@pytest.mark.slow
def test_llama_scan_layers_matches_unrolled_in_float64():
    with jax.enable_x64(True):
        unrolled = llama_example("llama_small", llama_config("llama_small"), jnp.float64)
        scanned = [
            llama_example(
                "llama_small", llama_config("llama_small", remat=remat, scan_layers=True), "float64"
            )
            for remat in (False, True)
        ]
        layers = unrolled.config["num_layers"]
        state, batch = unrolled.make_args(0)
        stacked = stack_layers(state.params, layers)
        tokens = batch["tokens"]
        assert jax.tree.structure(stacked) == jax.tree.structure(scanned[0].args[0].params)

        @jax.jit
        def all_three(params, stacked):
            return (
                _linen_loss_and_grads(unrolled, params, tokens),
                *(_linen_loss_and_grads(ex, stacked, tokens) for ex in scanned),
            )

        (want_loss, want), *got = all_three(state.params, stacked)
        want = stack_layers(want, layers)
    for loss, grads in got:
        np.testing.assert_allclose(loss, want_loss, rtol=1e-12)
        _assert_trees_close(grads, want)


@pytest.mark.numerics
def test_grad_accum_matches_full_batch_step_in_float64():
    with jax.enable_x64(True):
        accum = zoo.get("mlp_grad_accum", small=True, dtype=jnp.float64)
        plain = zoo.get("mlp", small=True, dtype=jnp.float64)
        assert accum.config["features"] == plain.config["features"]
        state, batch = plain.make_args(0)
        assert jax.tree.structure(state.params) == jax.tree.structure(accum.args[0].params)
        both = jax.jit(lambda s, b: (plain.step(s, b), accum.step(s, b)))
        (want, want_metrics), (got, got_metrics) = both(state, batch)
    np.testing.assert_allclose(got_metrics["loss"], want_metrics["loss"], rtol=1e-6)
    _assert_trees_close(got.params, want.params, rtol=1e-9, atol=1e-12)


@pytest.mark.numerics
def test_mlp_scan_lax_matches_a_python_loop():
    ex = zoo.get("mlp_scan_lax", small=True)
    (params, _), batch = ex.make_args(0)
    h = batch["x"] @ params["embed"]["kernel"] + params["embed"]["bias"]
    for kernel, bias in zip(params["layers"]["kernel"], params["layers"]["bias"], strict=True):
        h = h + jax.nn.gelu(h @ kernel + bias)
    want = h @ params["head"]["kernel"] + params["head"]["bias"]
    np.testing.assert_allclose(residual_mlp(params, batch["x"]), want, rtol=1e-5, atol=1e-6)


@pytest.mark.api
def test_config_overrides():
    cfg = scanned_config("gpt_scan_linen", layers=64, batch=4, seq_len=128)
    assert (cfg["num_layers"], cfg["batch"], cfg["seq_len"]) == (64, 4, 128)
    assert scanned_config("gpt_scan_linen")["num_layers"] == 12  # the stored config untouched
    assert scanned_config("gpt_scan_linen", small=True)["num_layers"] == 4
    assert zoo.get("mlp_grad_accum", batch=32, small=True).args[1]["x"].shape == (32, 32)
    with pytest.raises(KeyError, match="no config keys"):
        scanned_config("mlp_grad_accum", layers=2)
    with pytest.raises(KeyError, match="unknown scanned model"):
        scanned_config("gpt_scan_jax")
    with pytest.raises(ValueError, match="not divisible"):
        scanned_example("mlp_grad_accum", scanned_config("mlp_grad_accum", batch=18))
    assert llama_config("llama_small")["scan_layers"] is False
    assert "block0" in zoo.get("llama_small", small=True).args[0].params
