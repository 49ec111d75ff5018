"""Shared pieces of the model zoo: the ``Example`` record, the registry, batches and train steps.

Every model family module builds an :class:`Example` from three ingredients:

* ``init_state(key) -> state``: allocates the train state (parameters + optimizer state);
* ``batch_spec``: a dict of ``jax.ShapeDtypeStruct`` describing one batch;
* ``step(state, batch) -> (state, metrics)``: an ordinary optax train step.

``Example.args`` is obtained with ``jax.eval_shape`` so that no parameter is ever allocated just
to describe a model (full-size configs can be far larger than host memory), while
``Example.make_args(seed)`` runs the very same ``init_state`` for real.  Because both paths go
through the same function and the same ``TrainState`` static fields (``apply_fn``, ``tx``), their
tree structures compare equal.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import weakref
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax.training import train_state

PyTree = Any
Batch = dict[str, jax.Array]
StepFn = Callable[[PyTree, Batch], tuple[PyTree, dict[str, jax.Array]]]
Builder = Callable[[int | None, bool, Any], "Example"]


@dataclasses.dataclass(frozen=True)
class Example:
    """One ready-to-plan train step.

    Attributes:
      name: registry name.
      model: the Flax module (linen ``Module`` instance, or NNX ``GraphDef`` for NNX models).
      step: pure ``step(state, batch) -> (new_state, metrics)``; ``metrics["loss"]`` is f32.
      args: ``(state, batch)`` as a pytree of ``jax.ShapeDtypeStruct`` (nothing allocated).
      init_state: ``key -> state`` used both for ``args`` (abstractly) and ``make_args``.
      sample_batch: ``key -> batch`` drawing a random batch matching ``args[1]``.
      config: the hyper-parameters the example was built from (informational).
    """

    name: str
    model: Any
    step: StepFn
    args: tuple[PyTree, Batch]
    init_state: Callable[[jax.Array], PyTree] = dataclasses.field(repr=False)
    sample_batch: Callable[[jax.Array], Batch] = dataclasses.field(repr=False)
    config: dict[str, Any] = dataclasses.field(default_factory=dict)

    def make_args(self, seed: int = 0) -> tuple[PyTree, Batch]:
        """Concrete ``(state, batch)`` with the structure of ``args``; deterministic per seed."""
        init_key, data_key = jax.random.split(jax.random.PRNGKey(seed))
        # jit keeps initialization of the larger configs fast.
        state = _run_compiled(self.init_state, init_key)
        batch = _run_compiled(self.sample_batch, data_key)
        return state, batch


# Initialization programs are dominated by RNG code (a threefry hash and an inverse-erf per
# parameter) that XLA:CPU compiles about 3x faster at backend optimization level 1 than at the
# default level 2, with bitwise-identical results (checked for every zoo model, f32 and bf16,
# small and full size); they run once, so the faster compile is all that matters.
_CPU_INIT_OPTIONS = {"xla_backend_optimization_level": 1}
_COMPILED: weakref.WeakKeyDictionary[Callable[..., Any], dict[Any, Any]] = (
    weakref.WeakKeyDictionary()
)


def _run_compiled(fn: Callable[[jax.Array], PyTree], key: jax.Array) -> PyTree:
    """``jax.jit(fn)(key)``, compiled once per function (with the CPU options above on CPU)."""
    if jax.default_backend() != "cpu":
        return jax.jit(fn)(key)
    try:
        per_fn = _COMPILED.setdefault(fn, {})
    except TypeError:  # not weak-referenceable: compile without the cache
        per_fn = {}
    sig = (key.shape, key.dtype)
    if sig not in per_fn:
        per_fn[sig] = jax.jit(fn).lower(key).compile(compiler_options=_CPU_INIT_OPTIONS)
    return per_fn[sig](key)


def build_example(
    name: str,
    model: Any,
    step: StepFn,
    init_state: Callable[[jax.Array], PyTree],
    batch_spec: Batch,
    config: dict[str, Any] | None = None,
    params_of: Callable[[PyTree], PyTree] = lambda state: state.params,
) -> Example:
    """Assemble an :class:`Example`, deriving ``args`` abstractly with ``jax.eval_shape``.

    ``params_of(state)`` selects the trainable parameters inside the train state (default:
    ``state.params`` of a ``TrainState``); their element count is stored as
    ``config["params"]`` (optimizer state and BatchNorm statistics are not counted).
    """
    state_spec = jax.eval_shape(init_state, jax.random.PRNGKey(0))
    config = dict(config or {})
    config["params"] = count_params(params_of(state_spec))
    return Example(
        name=name,
        model=model,
        step=step,
        args=(state_spec, batch_spec),
        init_state=init_state,
        sample_batch=lambda key: random_batch(key, batch_spec, config),
        config=config,
    )


def count_params(tree: PyTree) -> int:
    """Total number of elements over the leaves of ``tree`` (arrays or ShapeDtypeStructs)."""
    return int(sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(tree)))


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------

_REGISTRY: dict[str, Builder] = {}


def register(name: str) -> Callable[[Builder], Builder]:
    """Decorator registering ``builder(batch, small, dtype) -> Example`` under ``name``."""

    def deco(builder: Builder) -> Builder:
        if name in _REGISTRY:
            raise ValueError(f"model {name!r} registered twice")
        _REGISTRY[name] = builder
        return builder

    return deco


def registered_names() -> tuple[str, ...]:
    """Names in registration order."""
    return tuple(_REGISTRY)


_BUILT: dict[tuple[str, int | None, bool, Any], Example] = {}


def get(
    name: str, batch: int | None = None, small: bool = False, dtype: Any = jnp.float32
) -> Example:
    """Build the example ``name``; ``batch=None`` picks the config's default batch size.

    Examples are memoized per ``(name, batch, small, dtype)``: repeated calls share the same
    ``step`` / ``init_state`` functions, so JAX's compilation caches (``make_args`` jits
    ``init_state``; callers jit ``step``) are reused across callers.  Each call returns its own
    :class:`Example` with its own copy of ``config``.
    """
    if name not in _REGISTRY:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(_REGISTRY)}")
    key = (name, batch, bool(small), jnp.dtype(dtype))
    if key not in _BUILT:
        _BUILT[key] = _REGISTRY[name](batch, small, jnp.dtype(dtype))
    example = _BUILT[key]
    return dataclasses.replace(example, config=copy.deepcopy(example.config))


# --------------------------------------------------------------------------------------------
# Batches
# --------------------------------------------------------------------------------------------


def classification_batch_spec(batch: int, in_shape: tuple[int, ...], dtype: Any) -> Batch:
    """``{"x": [batch, *in_shape] dtype, "y": [batch] int32}``."""
    return {
        "x": jax.ShapeDtypeStruct((batch, *in_shape), jnp.dtype(dtype)),
        "y": jax.ShapeDtypeStruct((batch,), jnp.int32),
    }


def token_batch_spec(batch: int, seq_len: int) -> Batch:
    """``{"tokens": [batch, seq_len] int32}`` for next-token prediction."""
    return {"tokens": jax.ShapeDtypeStruct((batch, seq_len), jnp.int32)}


def random_batch(key: jax.Array, spec: Batch, config: dict[str, Any]) -> Batch:
    """Random batch matching ``spec``: normal floats, integer labels/tokens in range.

    Integer leaves draw from ``[0, config["num_classes"])`` for ``"y"`` and
    ``[0, config["vocab_size"])`` for ``"tokens"``.
    """
    out: Batch = {}
    for i, (k, s) in enumerate(sorted(spec.items())):
        sub = jax.random.fold_in(key, i)
        if jnp.issubdtype(s.dtype, jnp.integer):
            high = config["vocab_size"] if k == "tokens" else config["num_classes"]
            out[k] = jax.random.randint(sub, s.shape, 0, high, dtype=s.dtype)
        else:
            out[k] = jax.random.normal(sub, s.shape, s.dtype)
    return out


# --------------------------------------------------------------------------------------------
# Losses and train steps
# --------------------------------------------------------------------------------------------


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy; computed in f32 so low-precision models report an f32 loss."""
    return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), labels
    ).mean()


def create_train_state(
    state_cls: type[train_state.TrainState], **kwargs: Any
) -> train_state.TrainState:
    """``state_cls.create`` with a strongly typed int32 ``step``.

    ``TrainState.create`` stores the Python int ``0``, which traces as a weakly typed scalar;
    a strong dtype keeps ``args`` and concrete states identical for the planner.
    """
    state = state_cls.create(**kwargs)
    return state.replace(step=jnp.zeros((), jnp.int32))


class BatchNormTrainState(train_state.TrainState):
    """``TrainState`` that also carries BatchNorm running statistics."""

    batch_stats: PyTree


def linen_classifier_step(
    state: train_state.TrainState, batch: Batch
) -> tuple[train_state.TrainState, dict[str, jax.Array]]:
    """Plain optax/linen classification step (no mutable collections)."""

    def loss_fn(params: PyTree) -> jax.Array:
        logits = state.apply_fn({"params": params}, batch["x"])
        return cross_entropy(logits, batch["y"])

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    state = state.apply_gradients(grads=grads)
    return state, {"loss": loss}


def linen_batchnorm_classifier_step(
    state: BatchNormTrainState, batch: Batch
) -> tuple[BatchNormTrainState, dict[str, jax.Array]]:
    """Classification step for models with BatchNorm: updates ``batch_stats`` too."""

    def loss_fn(params: PyTree) -> tuple[jax.Array, PyTree]:
        logits, updates = state.apply_fn(
            {"params": params, "batch_stats": state.batch_stats},
            batch["x"],
            train=True,
            mutable=["batch_stats"],
        )
        return cross_entropy(logits, batch["y"]), updates["batch_stats"]

    (loss, batch_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    state = state.apply_gradients(grads=grads).replace(batch_stats=batch_stats)
    return state, {"loss": loss}


def linen_lm_step(
    state: train_state.TrainState, batch: Batch
) -> tuple[train_state.TrainState, dict[str, jax.Array]]:
    """Next-token language-model step: position ``t`` predicts token ``t + 1``.

    The model sees the full sequence (keeping every activation at length ``L``, which is
    friendlier to sharding than ``L - 1``); the last position's logits are simply dropped.
    """

    def loss_fn(params: PyTree) -> jax.Array:
        tokens = batch["tokens"]
        logits = state.apply_fn({"params": params}, tokens)
        return cross_entropy(logits[:, :-1], tokens[:, 1:])

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    state = state.apply_gradients(grads=grads)
    return state, {"loss": loss}


def linen_init_state(
    model: Any,
    tx: optax.GradientTransformation,
    sample_input: jax.ShapeDtypeStruct,
    *,
    batch_norm: bool = False,
    init_kwargs: dict[str, Any] | None = None,
) -> Callable[[jax.Array], train_state.TrainState]:
    """``key -> TrainState`` for a linen model, initialized on a batch-1 dummy input.

    A batch of one is enough for shape inference and keeps init cheap for big batches.
    """
    dummy_shape = (1, *sample_input.shape[1:])

    def init_state(key: jax.Array) -> train_state.TrainState:
        variables = model.init(
            key, jnp.zeros(dummy_shape, sample_input.dtype), **(init_kwargs or {})
        )
        if batch_norm:
            return create_train_state(
                BatchNormTrainState,
                apply_fn=model.apply,
                params=variables["params"],
                tx=tx,
                batch_stats=variables["batch_stats"],
            )
        return create_train_state(
            train_state.TrainState, apply_fn=model.apply, params=variables["params"], tx=tx
        )

    return init_state


def pick(
    small: bool, small_cfg: dict[str, Any], full_cfg: dict[str, Any], batch: int | None
) -> dict[str, Any]:
    """Select a config and override its batch size when one is given."""
    cfg = dict(small_cfg if small else full_cfg)
    if batch is not None:
        cfg["batch"] = int(batch)
    return cfg
