"""Shared checks: numerical equivalence, plan-vs-HLO fidelity, and that a model trains; the
environment README blocks run in."""

import itertools
import os
import sys
from pathlib import Path

import jax
import numpy as np

from jaxpar.verify.compiled import fidelity

# XLA:CPU's LLVM code generation at -O0 for the suite and the processes it starts (conftest.py)
FAST_CODEGEN = "--xla_backend_optimization_level=0"

ROOT = Path(__file__).resolve().parent.parent
# The README's setup command runs this after installing. test_demo runs it as test_readme
# runs a bash line (`readme_env`, a fresh directory) and checks what it prints; test_readme
# skips it rather than run the demo twice.
README_DEMO = "jaxpar demo"


def readme_env(*, simulated_devices: bool) -> dict[str, str]:
    """The environment of a README block's process (test_readme.py's docstring)."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = FAST_CODEGEN  # code generation only (conftest.py)
    if simulated_devices:
        env["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
    env["JAX_PLATFORMS"] = "cpu"
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def leaf_errors(out, ref):
    """Per-leaf ||out - ref|| / ||ref|| (float64), with the leaf paths.

    Norm-relative: Adam's first step is lr·sign(g), so an element whose gradient is at rounding
    level may flip between two equally valid summation orders; the leaf norm does not care.
    """
    errs = []
    flat_out = jax.tree_util.tree_flatten_with_path(out)[0]
    for (path, a), r in zip(flat_out, jax.tree.leaves(ref), strict=True):
        a = np.asarray(a, np.float64)
        r = np.asarray(r, np.float64)
        denom = np.linalg.norm(r)
        err = np.linalg.norm(a - r) / denom if denom > 0 else np.linalg.norm(a - r)
        errs.append((float(err), jax.tree_util.keystr(path)))
    return errs


def assert_trains(ex, steps: int = 4) -> None:
    """``steps`` jitted train steps of an example from its own arguments: a float32 loss that is
    finite and falls at every step."""
    state, batch = ex.make_args(0)
    step = jax.jit(ex.step)
    losses = []
    for _ in range(steps):
        state, metrics = step(state, batch)
        assert metrics["loss"].dtype == np.float32
        losses.append(float(metrics["loss"]))
    assert np.all(np.isfinite(losses))
    assert all(b < a for a, b in itertools.pairwise(losses)), losses


def assert_equivalent(out, ref, rtol=1e-5):
    worst = max(leaf_errors(out, ref))
    assert worst[0] <= rtol, f"sharded step differs from unsharded: {worst}"


def assert_fidelity(plan, compiled, tolerance=0.10):
    fid = fidelity(plan.collectives, compiled)
    assert fid.ok(tolerance), (
        f"predicted vs compiled collectives: error {fid.relative_error:.1%}, unexpected kinds "
        f"{sorted(fid.unexpected_kinds)}\n{fid.text}"
    )
    return fid
