"""Model zoo of Flax train steps for the jaxpar planner.

``NAMES`` are the paper models (full-size configs follow the published architectures; every
model also has a tiny ``small=True`` config with the same structure):

==============  ===========================================================  ==========
name            model                                                        parameters
==============  ===========================================================  ==========
lenet5          LeNet-5, 28x28x1                                             62K
alexnet         AlexNet (OptCNN/torchvision), 224x224x3, no LRN              61.1M
vgg11..vgg19    VGG configurations A/B/D/E, 224x224x3, no BatchNorm          133M-144M
inception_v3    Inception-v3, 299x299x3, BatchNorm, no auxiliary head        23.8M
resnet18/34/50  ImageNet ResNets, 224x224x3, BatchNorm                       11.7M-25.6M
soybean_mlp     SoyBean's 5 x Dense(320) MLP                                 0.5M
gpt2_124m       GPT-2 small, context 1024, batch 8x1024                      124M
gpt2_1b3        GPT 1.3B (24 x d2048), context 1024, batch 8x1024            1.3B
vit_b16         ViT-B/16, 224x224x3                                          86.5M
nnx_gpt         GPT-2 124M written with flax.nnx                             124M
==============  ===========================================================  ==========

``LARGE`` are Llama-3-style decoders (``models/llama.py``: RMSNorm, RoPE, grouped-query
attention, SwiGLU, untied LM head; ``gemma_7b`` has Gemma's shape with GeGLU and a tied head;
``mixtral_8x7b`` a dropless mixture of 8 SwiGLU experts, top-2, as grouped matmuls; float32
master weights computing in the ``dtype`` passed, e.g. bfloat16).  They are kept out
of ``NAMES`` because the suites over ``NAMES`` plan and compare every model; at full size use
them abstractly only (``ex.args``, never ``make_args``):

==============  ===========================================================  ==========
name            model                                                        parameters
==============  ===========================================================  ==========
llama3_8b       Llama 3 8B: 32 x d4096, 32 heads / 8 KV heads, FFN 14336     8.03B
llama3_70b      Llama 3 70B: 80 x d8192, 64 heads / 8 KV heads, FFN 28672    70.6B
gemma_7b        Gemma 7B shape: 28 x d3072, 16 heads x 256, GeGLU, tied      8.54B
mixtral_8x7b    Mixtral 8x7B: 32 x d4096, 32/8 heads, 8 experts of 14336     46.7B
==============  ===========================================================  ==========

CNNs train with SGD + momentum 0.9 (LeNet-5 and the Soybean MLP with plain SGD), the
transformers with AdamW.  Default full batches: 64 images for the ImageNet CNNs and ViT,
8 x 1024 tokens for the GPTs, 8 x 4096 for the Llamas.  ``EXTRA`` are small models kept for the
test suite (``cnn``, ``mlp``, ``gpt_small``, ``nnx_mlp``); ``LARGE_EXTRA`` holds the Llama test
model ``llama_small`` (tested in tests/test_llama.py, not by the suites over ``EXTRA``).  The
remat variant and batch/context overrides of a Llama: ``jaxpar_zoo.llama.llama_example(name,
jaxpar_zoo.llama.llama_config(name, remat=True, batch=256, seq_len=4096))``.  ``config["params"]``
of every example is its number of trainable parameters.

``MAXTEXT`` are MaxText-style decoders (``models/maxtext.py``, written from MaxText's structure:
logical axis names on every parameter and activation, ``nn.scan`` over ``nn.remat`` layers,
MaxText's 12-axis mesh from its ``ici_*``/``dcn_*`` settings and its default logical axis rules
as data; kept out of ``NAMES`` like the Llamas; at full size abstract use only):

==============  ===========================================================  ==========
name            model                                                        parameters
==============  ===========================================================  ==========
maxtext_8b      Llama 3 8B's dimensions, 32 scanned remat layers, AdamW      8.03B
maxtext_small   its 2-layer test size (d128, 16/8 heads of 8, MLP 256)       0.4M
==============  ===========================================================  ==========

``SCANNED`` are models whose repeated layers run inside one ``lax.scan``, and the unrolled twin
``gpt_unrolled_linen`` (``models/scanned.py``; kept out of ``NAMES`` and ``EXTRA`` like the
Llamas).  Full sizes below; the small configs are 4 layers at d64, batch 16 (``mlp_grad_accum``:
32-64-64-10 in 4 micro-batches of 4):

==================  =======================================================  ==========
name                model                                                    parameters
==================  =======================================================  ==========
gpt_scan_linen      GPT-2 124M shapes, blocks stacked with ``nn.scan``       124.4M
gpt_unrolled_linen  the same decoder, blocks unrolled (Python loop)          124.4M
gpt_scan_nnx        the same decoder in NNX (``nnx.vmap`` + ``nnx.scan``)    124.4M
mlp_scan_lax        residual MLP, 16 x d1024, one hand-written ``lax.scan``  17.6M
mlp_grad_accum      ``mlp`` (784-512-512-10), 8 micro-batches (fori_loop)    0.67M
==================  =======================================================  ==========

Their layer count and batch: ``jaxpar_zoo.scanned.scanned_example(name,
jaxpar_zoo.scanned.scanned_config(name, layers=64, batch=8))``.  A scanned Llama:
``jaxpar_zoo.llama.llama_example(name, jaxpar_zoo.llama.llama_config(name, scan_layers=True))``.

``models/kernels.py`` holds hand-written kernels as production JAX writes them, not registered
as examples: ``megatron_mlp_step(mesh)``, a custom VJP whose forward and backward are
shard_maps manual over ``model`` (MaxText's pattern), used by the shard_map tests and
``bench/plan_quality/shard_map_auto.py``.

Usage::

    import jaxpar_zoo
    ex = jaxpar_zoo.get("gpt_small", small=True)
    state_spec, batch_spec = ex.args          # jax.ShapeDtypeStruct pytrees, nothing allocated
    state, batch = ex.make_args(seed=0)       # concrete arrays, deterministic per seed
    new_state, metrics = jax.jit(ex.step)(state, batch)

Adding a model: write a builder ``(batch, small, dtype) -> Example`` decorated with
``@register("name")`` in a family module and import that module below.
"""

from __future__ import annotations

# Family modules register their builders on import.
from . import (  # noqa: F401
    cnn,
    convnets,
    inception,
    llama,
    maxtext,
    mlp,
    nnx_models,
    scanned,
    transformer,
)
from ._train import Example, get, register, registered_names

# The paper models, in the order the benchmarks report them.
NAMES: tuple[str, ...] = (
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
# Small test models kept for the suite (also registered; ``registered_names()`` lists all).
EXTRA: tuple[str, ...] = ("cnn", "mlp", "gpt_small", "nnx_mlp")
# Full-size Llamas (billions of parameters: abstract use only) and their small test model.
LARGE: tuple[str, ...] = ("llama3_8b", "llama3_70b", "gemma_7b", "mixtral_8x7b")
LARGE_EXTRA: tuple[str, ...] = ("llama_small",)
# MaxText-style decoders (tests/test_maxtext.py): full size and the test size.
MAXTEXT: tuple[str, ...] = ("maxtext_8b", "maxtext_small")
# Scanned-layer models (tests/test_scanned_models.py).
SCANNED: tuple[str, ...] = scanned.NAMES

assert set(NAMES + EXTRA + LARGE + LARGE_EXTRA + SCANNED + MAXTEXT) == set(registered_names()), (
    "NAMES/EXTRA/LARGE/LARGE_EXTRA/SCANNED/MAXTEXT out of sync with the registry"
)

__all__ = [
    "EXTRA",
    "LARGE",
    "LARGE_EXTRA",
    "MAXTEXT",
    "NAMES",
    "SCANNED",
    "Example",
    "get",
    "register",
    "registered_names",
]
