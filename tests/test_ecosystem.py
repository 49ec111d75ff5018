"""Hugging Face transformers' Flax models (the ``ecosystem`` extra and marker: skipped when
transformers is not installed), planned as written from small configs: the planned step equal
to the unsharded one in float64, the compiled collectives the predicted ones. Run the tier
with ``python -m pytest -m ecosystem``."""

import math

import jax
import jax.numpy as jnp
import pytest
from helpers import leaf_errors

import jaxpar
from jaxpar.verify import fidelity

pytest.importorskip("transformers", reason='the ecosystem extra: pip install -e ".[ecosystem]"')

from jaxpar_zoo.ecosystem import HF_MODELS, hf_flax

pytestmark = [pytest.mark.ecosystem, pytest.mark.numerics, pytest.mark.slow]


@pytest.mark.parametrize("name", HF_MODELS)
def test_hugging_face_flax_model_plans_runs_equal_and_compiles_as_predicted(name):
    mesh = jaxpar.make_mesh({"data": 2, "model": 4})
    with jax.enable_x64(True):
        ex = hf_flax(name, dtype=jnp.float64)
        step = jaxpar.auto_shard(ex.step, mesh=mesh, cluster="dgx-h100")
        out = step(*ex.args)
        errors = leaf_errors(out, jax.jit(ex.step)(*ex.args))
        compiled = step.lower(*ex.args).compile()
    # transformers' Llama computes its rotary tables in float32 whatever the dtype
    rtol = 1e-6 if name == "hf_llama" else 1e-12
    # BERT's key bias has a zero gradient in exact arithmetic (softmax ignores a shift per
    # row): its gradient is rounding noise, which Adam scales up to ±lr, so its value after a
    # step depends on the summation order; every other leaf must agree
    noise = [e for e in errors if "['key']['bias']" in e[1]] if name == "hf_bert" else []
    worst = max(e for e in errors if e not in noise)
    assert worst[0] <= rtol, f"sharded step differs from unsharded: {worst}"
    assert all(math.isfinite(err) for err, _ in noise), noise
    fid = fidelity(step.plan.collectives, compiled)
    assert fid.predicted_bytes == fid.hlo_bytes, fid.text
    assert fid.predicted_counts == fid.hlo_counts, fid.text
