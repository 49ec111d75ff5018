"""Hugging Face transformers' Flax models (the ``ecosystem`` extra and marker: skipped when
transformers is not installed), planned as written from small configs: the planned step equal
to the unsharded one in float64, the compiled collectives the predicted ones. Run the tier
with ``python -m pytest -m ecosystem``."""

import jax
import jax.numpy as jnp
import pytest
from helpers import assert_equivalent

import jaxpar
from jaxpar.verify.compiled import fidelity

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
        # transformers' Llama computes its rotary tables in float32 whatever the dtype
        assert_equivalent(
            out, jax.jit(ex.step)(*ex.args), rtol=1e-6 if name == "hf_llama" else 1e-12
        )
        compiled = step.lower(*ex.args).compile()
    fid = fidelity(step.plan.collectives, compiled)
    assert fid.predicted_bytes == fid.hlo_bytes, fid.text
    assert fid.predicted_counts == fid.hlo_counts, fid.text
