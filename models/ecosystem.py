"""Train steps of models from the ecosystem's own libraries, built from config (random
initialization, no downloaded weights), for the tests and ``bench/plan_quality/ecosystem.py``:

* Equinox (``equinox``, in the ``test`` extra): a small causal language model written the
  Equinox way (``eqx.nn`` modules acting on one sequence, ``jax.vmap`` over the batch),
  unrolled (a list of blocks) or scanned (the blocks stacked by ``eqx.filter_vmap`` and run
  by ``jax.lax.scan``, Equinox's idiom for deep stacks);
* Hugging Face transformers' Flax models (``transformers`` 4.x, the ``ecosystem`` extra):
  Llama, GPT-2, BERT (masked LM) and T5, each from a small config.

Every builder returns an `EcosystemStep`: ``step(params, opt_state, batch) -> (params,
opt_state, loss)`` over arrays only (the model's static parts closed over, as ``jax.jit``
needs) and the arguments. ``dtype`` float64 (under ``jax.enable_x64``) for numerics checks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax


@dataclasses.dataclass(frozen=True)
class EcosystemStep:
    """A library model's AdamW train step and concrete arguments."""

    name: str
    step: Callable[..., Any]  # (params, opt_state, batch) -> (params, opt_state, loss)
    args: tuple[Any, Any, Any]  # (params, opt_state, batch)


def _cast(tree: Any, dtype: Any) -> Any:
    """Floating leaves of ``tree`` cast to ``dtype``."""
    floating = lambda a: hasattr(a, "dtype") and jnp.issubdtype(a.dtype, jnp.floating)
    return jax.tree.map(lambda a: a.astype(dtype) if floating(a) else a, tree)


def lm_loss(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """Next-token cross-entropy (position t predicts token t + 1), float32 or wider."""
    logits = logits.astype(jnp.promote_types(jnp.float32, logits.dtype))
    return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:]).mean()


def adamw_step(loss_of: Callable[[Any, Any], jax.Array], lr: float = 1e-3) -> tuple[Any, Any]:
    """(``step(params, opt_state, batch)``, the optimizer) for a ``loss_of(params, batch)``."""
    tx = optax.adamw(lr, weight_decay=0.01)

    def step(params: Any, opt_state: Any, batch: Any) -> tuple[Any, Any, jax.Array]:
        loss, grads = jax.value_and_grad(loss_of)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step, tx


# ---- Equinox ---------------------------------------------------------------------------


def _equinox_block(eqx: Any, d: int, heads: int, key: jax.Array) -> Any:
    """A pre-LayerNorm decoder block on one sequence ``[seq, d]``: causal attention, GELU MLP."""

    class Block(eqx.Module):
        norm1: Any
        attn: Any
        norm2: Any
        mlp: Any

        def __init__(self, key: jax.Array):
            k1, k2 = jax.random.split(key)
            self.norm1, self.norm2 = eqx.nn.LayerNorm(d), eqx.nn.LayerNorm(d)
            self.attn = eqx.nn.MultiheadAttention(heads, d, key=k1)
            self.mlp = eqx.nn.MLP(d, d, 4 * d, 1, activation=jax.nn.gelu, key=k2)

        def __call__(self, x: jax.Array) -> jax.Array:
            mask = jnp.tril(jnp.ones((x.shape[0], x.shape[0]), bool))
            h = jax.vmap(self.norm1)(x)
            x = x + self.attn(h, h, h, mask=mask)
            return x + jax.vmap(self.mlp)(jax.vmap(self.norm2)(x))

    return Block(key)


def equinox_lm(
    scanned: bool = False, batch: int = 64, seq: int = 32, d: int = 64, layers: int = 2,
    vocab: int = 256, heads: int = 4, dtype: Any = jnp.float32,
) -> EcosystemStep:  # fmt: skip
    """An Equinox causal LM and its AdamW step (``scanned``: blocks under ``lax.scan``)."""
    import equinox as eqx

    keys = jax.random.split(jax.random.key(0), layers + 3)
    embed = eqx.nn.Embedding(vocab, d, key=keys[0])
    head = eqx.nn.Linear(d, vocab, use_bias=False, key=keys[1])
    if scanned:
        blocks = eqx.filter_vmap(lambda k: _equinox_block(eqx, d, heads, k))(keys[2:-1])
    else:
        blocks = [_equinox_block(eqx, d, heads, k) for k in keys[2:-1]]
    model = _cast((embed, blocks, head), dtype)
    params, static = eqx.partition(model, eqx.is_array)

    def forward(p: Any, tokens: jax.Array) -> jax.Array:  # one sequence
        embed, blocks, head = eqx.combine(p, static)
        x = jax.vmap(embed)(tokens)
        if scanned:
            block_params, block_static = eqx.partition(blocks, eqx.is_array)

            def body(x: jax.Array, bp: Any) -> tuple[jax.Array, None]:
                return eqx.combine(bp, block_static)(x), None

            x, _ = jax.lax.scan(body, x, block_params)
        else:
            for block in blocks:
                x = block(x)
        return jax.vmap(head)(x)

    step, tx = adamw_step(lambda p, b: lm_loss(jax.vmap(forward, (None, 0))(p, b), b))
    tokens = jax.random.randint(keys[-1], (batch, seq), 0, vocab)
    name = "equinox_lm_scanned" if scanned else "equinox_lm"
    return EcosystemStep(name, step, (params, tx.init(params), tokens))


# ---- Hugging Face transformers (Flax) ----------------------------------------------------

HF_MODELS = ("hf_llama", "hf_gpt2", "hf_bert", "hf_t5")


class _ClipShim:
    """``jax.numpy`` for transformers' Flax T5, whose ``jnp.clip(a_min=, a_max=)`` this JAX
    no longer takes (it takes ``min=``/``max=``): every other name is jax.numpy's."""

    def __getattr__(self, name: str) -> Any:
        return getattr(jnp, name)

    @staticmethod
    def clip(a: Any, a_min: Any = None, a_max: Any = None, **kw: Any) -> Any:
        return jnp.clip(a, kw.pop("min", a_min), kw.pop("max", a_max), **kw)


def _hf_config(name: str, seq: int) -> tuple[Any, Any]:
    """(config, Flax model class) of a small model of the family ``name``."""
    import transformers as tf

    small = {"vocab_size": 256}
    if name == "hf_llama":
        cfg = tf.LlamaConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=seq, **small,
        )  # fmt: skip
        return cfg, tf.FlaxLlamaForCausalLM
    if name == "hf_gpt2":
        return tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=seq, **small), (
            tf.FlaxGPT2LMHeadModel
        )
    if name == "hf_bert":
        cfg = tf.BertConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            max_position_embeddings=seq, **small,
        )  # fmt: skip
        return cfg, tf.FlaxBertForMaskedLM
    if name == "hf_t5":
        from transformers.models.t5 import modeling_flax_t5

        modeling_flax_t5.jnp = _ClipShim()
        cfg = tf.T5Config(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, **small)
        return cfg, tf.FlaxT5ForConditionalGeneration
    raise KeyError(f"unknown Hugging Face model {name!r}; known: {', '.join(HF_MODELS)}")


def hf_flax(name: str, batch: int = 32, seq: int = 32, dtype: Any = jnp.float32) -> EcosystemStep:
    """A Hugging Face Flax model (a key of `HF_MODELS`) from a small config, random weights,
    and its AdamW step: causal LM loss (Llama, GPT-2), masked-LM loss on every position
    (BERT), or the decoder's next-token loss with the tokens as both sides (T5)."""
    cfg, cls = _hf_config(name, seq)
    model = cls(cfg, seed=0, dtype=dtype)
    params = _cast(model.params, dtype)

    def loss_of(p: Any, tokens: jax.Array) -> jax.Array:
        if name == "hf_t5":
            logits = model(input_ids=tokens, decoder_input_ids=tokens, params=p).logits
        else:
            logits = model(input_ids=tokens, params=p).logits
        if name == "hf_bert":
            logits = logits.astype(jnp.promote_types(jnp.float32, logits.dtype))
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens).mean()
        return lm_loss(logits, tokens)

    step, tx = adamw_step(loss_of)
    tokens = jax.random.randint(jax.random.key(1), (batch, seq), 0, cfg.vocab_size)
    return EcosystemStep(name, step, (params, tx.init(params), tokens))
