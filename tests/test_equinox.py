"""Equinox models planned as written (models/ecosystem.py): an unrolled and a scanned causal
LM, their planned step equal to the unsharded one in float64, the compiled collectives the
predicted ones."""

import jax
import pytest
from helpers import assert_equivalent

import jaxpar
from jaxpar.verify.compiled import fidelity

pytest.importorskip("equinox")

from jaxpar_zoo.ecosystem import equinox_lm


@pytest.mark.numerics
@pytest.mark.slow
@pytest.mark.parametrize("scanned", [False, True], ids=["unrolled", "scanned"])
def test_equinox_lm_plans_runs_equal_and_compiles_as_predicted(scanned):
    mesh = jaxpar.make_mesh({"data": 2, "model": 4})
    with jax.enable_x64(True):
        ex = equinox_lm(scanned=scanned, dtype=jax.numpy.float64)
        step = jaxpar.auto_shard(ex.step, mesh=mesh, cluster="dgx-h100")
        out = step(*ex.args)
        assert_equivalent(out, jax.jit(ex.step)(*ex.args), rtol=1e-12)
        compiled = step.lower(*ex.args).compile()
    plan = step.plan
    assert plan.program.regions if scanned else not plan.program.regions  # the scan is planned
    fid = fidelity(plan.collectives, compiled)
    assert fid.predicted_bytes == fid.hlo_bytes > 0, fid.text
    assert fid.predicted_counts == fid.hlo_counts, fid.text
