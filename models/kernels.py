"""Hand-written kernels as production JAX writes them: a custom VJP whose forward and backward
are shard_maps (MaxText's pattern), manual over some mesh axes and automatic over the rest.

* :func:`megatron_mlp_step`: a Megatron MLP (column- then row-parallel, ``psum`` over
  ``model``) with ``model`` manual and every other axis automatic (``axis_names``); the
  backward recomputes ``x @ w1`` from the saved operands. One SGD step on the squared error,
  computed in ``promote_types(float32, dtype)``.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P


def megatron_mlp_step(mesh: jax.sharding.Mesh, lr: float = 0.1) -> Callable:
    """``step(params, x, y) -> params`` with ``params = {"w1": [d, ff], "w2": [ff, d]}``."""

    def fwd_body(x, w1, w2):
        return jax.lax.psum(jax.nn.relu(x @ w1) @ w2, "model")

    def bwd_body(x, w1, w2, g):
        h = x @ w1
        dh = (g @ w2.T) * (h > 0)
        return jax.lax.psum(dh @ w1.T, "model"), x.T @ dh, jax.nn.relu(h).T @ g

    specs = (P(), P(None, "model"), P("model", None))
    fwd = jax.shard_map(fwd_body, mesh=mesh, in_specs=specs, out_specs=P(), axis_names={"model"})
    bwd = jax.shard_map(
        bwd_body, mesh=mesh, in_specs=(*specs, P()), out_specs=specs, axis_names={"model"}
    )

    @jax.custom_vjp
    def mlp(x, w1, w2):
        return fwd(x, w1, w2)

    mlp.defvjp(lambda x, w1, w2: (fwd(x, w1, w2), (x, w1, w2)), lambda res, g: bwd(*res, g))

    def step(params, x, y):
        def loss(p):
            err = mlp(x, p["w1"], p["w2"]) - y
            return (err.astype(jnp.promote_types(jnp.float32, err.dtype)) ** 2).mean()

        grad = jax.grad(loss)(params)
        return jax.tree.map(lambda a, b: a - lr * b, params, grad)

    return step
