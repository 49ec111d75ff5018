"""No recursion proportional to program size (issue 47): programs far deeper than Python's
default recursion limit plan with it.

Importing the zoo (flax.nnx imports IPython, whose jedi raises the limit to 3000) hides such
recursion, so each test sets Python's default, 1000, after its imports and restores it after.
"""

from __future__ import annotations

import contextlib
import sys

import jax
import jax.numpy as jnp
import pytest
from jaxpar_zoo.llama import llama_config, llama_example

import jaxpar
from jaxpar.xla.fusion import ACCELERATOR_FUSION, read_sources, recomputed, whole_sources

DEFAULT_LIMIT = 1000


@contextlib.contextmanager
def default_recursion_limit():
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(DEFAULT_LIMIT)
    try:
        yield
    finally:
        sys.setrecursionlimit(before)


def chain(n: int):
    """``n`` fusible elementwise equations, each reading the one before."""

    def step(x):
        y = x
        for i in range(n):
            y = jnp.sin(y) if i % 2 else y * 1.0001 + 0.5
        return y

    return step


@pytest.mark.api
def test_a_5000_equation_elementwise_chain_plans_forward_and_under_grad():
    """A chain of 5,000 fusible elementwise operations, and the same chain under `jax.grad`
    (whose backward asks the fusion rules about the chain end-first: every `sin` is recomputed
    in the kernel reading it, so what one kernel reads reaches back along the whole chain)."""
    step = chain(5000)

    def grad_step(x):
        return jax.grad(lambda x: jnp.sum(step(x)))(x)

    x = jax.ShapeDtypeStruct((64, 128), jnp.float32)
    with default_recursion_limit():
        forward = jaxpar.plan(step, x, mesh={"data": 8}, cluster="p100")
        backward = jaxpar.plan(grad_step, x, mesh={"data": 8}, cluster="p100")
        program = backward.program
        # the walk the old recursion took: from the gradient back to the input
        out = program.outvars[0]
        sources = read_sources(program, out, True, ACCELERATOR_FUSION)
        whole = whole_sources(program, out, ACCELERATOR_FUSION)
    assert forward.stats["equations"] >= 5000 and backward.stats["equations"] >= 10000
    assert not recomputed(program, out, ACCELERATOR_FUSION)  # a result is written
    assert sources == (out,) and whole == frozenset()
    # every link of the forward chain is recomputed (never written): XLA fuses it whole
    links = [t for e in forward.program.eqns for t in e.outputs]
    assert sum(recomputed(forward.program, t, ACCELERATOR_FUSION) for t in links) >= 4999


@pytest.mark.api
@pytest.mark.slow
def test_an_unrolled_160_layer_decoder_with_remat_plans_abstractly():
    """A small-dimension Llama of 160 unrolled layers, each block rematerialized, planned from
    ShapeDtypeStructs (about 70,000 equations; 20 s on 2 cores)."""
    cfg = llama_config("llama3_8b", small=True, remat=True)
    cfg["num_layers"] = 160
    ex = llama_example("llama3_8b", cfg)
    with default_recursion_limit():
        plan = jaxpar.plan(ex.step, *ex.args, mesh={"data": 2, "model": 4}, cluster="p100")
    assert plan.stats["equations"] > 60_000
    assert plan.cost.overlapped_step_s > 0
