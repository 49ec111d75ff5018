"""Command-line input: parsing and checking what the user typed, before anything slow runs, and
building the zoo model it names (`zoo_example`, for ``jaxpar plan`` and ``jaxpar calibrate``).

Every function raises ValueError (or argparse.ArgumentTypeError inside argparse) with one line
that says what is wrong and how to fix it; `cli.main` prints it as ``jaxpar <command>: error:``.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import os
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def arg_type(parse: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    """An argparse ``type=`` that keeps `parse`'s ValueError message (argparse would replace
    it with "invalid <function> value")."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from err

    convert.__name__ = name
    return convert


def did_you_mean(word: str, options: Sequence[str]) -> str:
    """`` (did you mean 'vgg16'?)`` for a near miss (case and spelling), else ``""``."""
    folded = {o.lower(): o for o in options}
    key = unicodedata.normalize("NFKC", word).strip().lower()  # full-width letters too
    match = folded.get(key)
    if match is None:
        close = difflib.get_close_matches(key, list(folded), n=1, cutoff=0.6)
        match = folded[close[0]] if close else None
    return f" (did you mean {match!r}?)" if match is not None and match != word else ""


def positive_steps(text: str) -> int:
    """``--steps``: a whole number from 1 to 1000."""
    if not text.strip().isdigit() or not 1 <= int(text) <= 1000:
        raise argparse.ArgumentTypeError(f"--steps {text!r}: give a whole number from 1 to 1000")
    return int(text)


STRATEGY_CHOICES = ("auto", "data", "model", "owt", "fsdp", "fsdp_tp", "hypar", "all")
OBJECTIVE_CHOICES = ("time", "comm", "overlap")
SEARCH_CHOICES = ("elimination", "kcut")
# --strategy all: the search and the baselines, side by side
ALL_STRATEGIES = ("auto", "data", "model", "owt", "fsdp", "fsdp_tp")


def parse_memory_budget(text: str) -> float | str | None:
    """``--memory-budget``: a size ("80GB", "75GiB", bytes), "device" or "none"."""
    from ..memory.estimate import parse_bytes

    if text.strip().lower() in ("none", "off"):
        return None
    if text.strip().lower() == "device":
        return "device"
    try:
        return parse_bytes(text)
    except ValueError as err:
        raise ValueError(
            f"--memory-budget {text!r}: give a size such as 80GB or 75GiB, 'device' (the "
            "device's memory less a reserve) or 'none'"
        ) from err


# The dtypes the zoo models train in (parameters and activations), and common spellings.
DTYPES = ("float32", "bfloat16", "float16", "float64")
DTYPE_ALIASES = {
    "fp32": "float32",
    "f32": "float32",
    "single": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "f16": "float16",
    "half": "float16",
    "fp64": "float64",
    "f64": "float64",
    "double": "float64",
}

# A mesh axis multiplies every operation's configurations ((dims + 1)^axes): with 5 axes the
# cost tables of even LeNet-5 take minutes to price, so the command line stops at 4.
MAX_MESH_AXES = 4
# Abstract meshes cost O(devices) to describe; 2^20 devices plan in seconds, 10^9 exhaust memory.
MAX_DEVICES = 1 << 20


def parse_mesh(text: str) -> dict[str, int]:
    """``"node=4,gpu=4"`` -> ``{"node": 4, "gpu": 4}``, with errors that show the expected form.

    Axis names are identifiers, sizes ASCII digits >= 1; at most `MAX_MESH_AXES` axes larger
    than 1 (axes of size 1 cost nothing: MaxText's 12-axis meshes) and
    `MAX_DEVICES` devices.
    """
    mesh: dict[str, int] = {}
    example = "e.g. --mesh node=4,gpu=4"
    for part in text.split(","):
        name, sep, size = (s.strip() for s in part.partition("="))
        if not sep or not name or not size:
            raise ValueError(
                f"bad mesh axis {part!r} in --mesh {text!r}: expected NAME=SIZE pairs separated "
                f"by commas, {example}"
            )
        if not name.isidentifier():
            raise ValueError(
                f"mesh axis name {name!r} in --mesh {text!r} is not a name: use letters, digits "
                f"and '_', not starting with a digit, {example}"
            )
        if not (size.isascii() and size.isdigit()):
            raise ValueError(
                f"mesh axis {name!r} has size {size!r} in --mesh {text!r}: sizes are whole "
                f"numbers in digits 0-9, {example}"
            )
        if int(size) < 1:
            raise ValueError(
                f"mesh axis {name!r} has size {int(size)} in --mesh {text!r}: every axis needs "
                f"at least 1 device"
            )
        if name in mesh:
            raise ValueError(f"mesh axis {name!r} appears twice in --mesh {text!r}")
        mesh[name] = int(size)
    split = [name for name, size in mesh.items() if size > 1]
    if len(split) > MAX_MESH_AXES:
        raise ValueError(
            f"mesh {text!r} has {len(split)} axes larger than 1; jaxpar plan takes at most "
            f"{MAX_MESH_AXES}: every such axis multiplies each operation's configurations, and "
            f"pricing them takes too long. Merge axes that cross the same link, e.g. "
            f"node=2,gpu=8 for 2 nodes of 8 GPUs (axes of size 1 cost nothing)"
        )
    devices = math.prod(mesh.values())
    if devices > MAX_DEVICES:
        raise ValueError(
            f"mesh {text!r} has {devices:,} devices; jaxpar plan takes at most "
            f"{MAX_DEVICES:,} (2^20)"
        )
    return mesh


def mesh_text(mesh: dict[str, int]) -> str:
    """``{"node": 4, "gpu": 4}`` -> ``"node=4,gpu=4"`` (the form --mesh takes)."""
    return ",".join(f"{name}={size}" for name, size in mesh.items())


def parse_dtype(text: str, allowed: tuple[str, ...] = (), purpose: str = "") -> str:
    """A dtype name in ``allowed`` (default `DTYPES`, what the models train in), or an alias
    such as ``bf16``; ``purpose`` says what the dtype is for in the error."""
    allowed = allowed or DTYPES
    key = text.strip().lower()
    name = DTYPE_ALIASES.get(key, key)
    if name not in allowed:
        raise ValueError(
            f"unknown dtype {text!r}{did_you_mean(text, allowed)}: "
            f"{purpose or 'the models train in'} {', '.join(allowed)} "
            f"(aliases: {', '.join(DTYPE_ALIASES)})"
        )
    return name


CALIBRATION_DTYPES = ("float32", "bfloat16", "float16")  # what jaxpar calibrate measures


def parse_calibration_dtype(text: str) -> str:
    """``jaxpar calibrate --dtype``: one of `CALIBRATION_DTYPES` (or an alias such as ``bf16``)."""
    return parse_dtype(text, CALIBRATION_DTYPES, "calibrate measures")


def parse_batch(text: str) -> int:
    """A positive whole number of samples (the global batch)."""
    try:
        batch = int(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is not a whole number; give the global batch in samples, e.g. --batch 64"
        ) from None
    if batch < 1:
        raise ValueError(
            f"{batch} is not a batch: the global batch must be at least 1 sample (and a "
            f"multiple of the mesh's device count), e.g. --batch 64"
        )
    return batch


def choice_type(option: str, options: Sequence[str]) -> Callable[[str], str]:
    """An argparse ``type=`` for one of `options`, suggesting the nearest on a typo."""

    def parse(text: str) -> str:
        if text not in options:
            raise ValueError(
                f"invalid choice {text!r}{did_you_mean(text, options)}; choose one of "
                f"{', '.join(options)}"
            )
        return text

    return arg_type(parse, option)


def check_output_path(option: str, path: str, example: str) -> None:
    """Raise ValueError unless `path` can be written: a file name in an existing folder."""
    if not path:
        raise ValueError(f"{option} needs a file name, e.g. {option} {example}")
    if os.path.isdir(path):
        raise ValueError(
            f"{option} {path!r} is a folder; give a file name, e.g. "
            f"{option} {os.path.join(path, example)}"
        )
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(
            f"{option} {path!r}: the folder {folder!r} does not exist; create it first or write "
            f"somewhere else"
        )
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ValueError(f"{option} {path!r}: no permission to write there")


def check_plot(path: str) -> None:
    """Raise ValueError unless matplotlib imports and can write `path`'s format."""
    try:
        import matplotlib  # noqa: F401
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        raise ValueError(
            '--plot needs matplotlib, which is not installed: pip install -e ".[plot]" (or '
            "pip install matplotlib), or leave out --plot"
        ) from None
    formats = sorted(FigureCanvasBase.get_supported_filetypes())
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if ext not in formats:
        what = f"'.{ext}'" if ext else "a file name without an extension"
        raise ValueError(
            f"--plot {path!r}: matplotlib cannot write {what}; end the name with one of "
            f"{', '.join('.' + f for f in formats)}, e.g. --plot plan.png"
        )
    check_output_path("--plot", path, "plan.png")


def check_model(name: str) -> str:
    """The zoo model `name`, or ValueError listing the models (and suggesting the nearest)."""
    import jaxpar_zoo as zoo

    known = zoo.registered_names()
    if name not in known:
        raise ValueError(
            f"unknown model {name!r}{did_you_mean(name, known)}; models: "
            f"{', '.join(zoo.NAMES)}; large decoders: {', '.join(zoo.LARGE)}; small test "
            f"models: {', '.join(zoo.EXTRA)}"
        )
    return name


@dataclasses.dataclass(frozen=True)
class DecoderBuild:
    """How a large decoder is built: ``remat`` (each block rematerialized in the backward
    pass), ``scan`` (the blocks stacked under one ``nn.scan``), ``capacity`` (a mixture of
    experts dispatched by capacity, GShard's way; None: dropless), ``seq_len``."""

    remat: bool = False
    scan: bool = False
    capacity: float | None = None
    seq_len: int | None = None  # tokens per sequence (None: the model's)
    remat_policy: str | None = None  # what remat keeps (`jaxpar_zoo.llama.REMAT_POLICIES`)

    def words(self) -> tuple[str, ...]:
        """For the title line: ``("remat", "scanned layers", "capacity 1.25", "8192 tokens
        per sequence")`` or fewer; ``"remat (minimal_offloaded)"`` with a policy."""
        remat = f"remat ({self.remat_policy})" if self.remat_policy else "remat"
        words = [w for w, on in ((remat, self.remat), ("scanned layers", self.scan)) if on]
        if self.capacity is not None:
            words.append(f"capacity {self.capacity:g}")
        if self.seq_len is not None:
            words.append(f"{self.seq_len} tokens per sequence")
        return tuple(words)


def parse_seq_len(text: str) -> int:
    """A positive whole number of tokens per sequence."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(
            f"{text!r} is not a sequence length: give the tokens per sequence as a whole number "
            "of at least 1, e.g. --seq-len 8192"
        )
    return value


def parse_capacity(text: str) -> float:
    """A positive capacity factor (an expert's slots per group, relative to an even share)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"{text!r} is not a positive number: an expert takes at most factor x its even "
            "share of a sequence's token copies, e.g. --capacity-factor 1.25"
        )
    return value


def check_decoder_build(
    name: str,
    remat: bool,
    scan: bool,
    capacity: float | None = None,
    seq_len: int | None = None,
    remat_policy: str | None = None,
) -> DecoderBuild:
    """`DecoderBuild` for --remat / --remat-policy / --scan-layers / --capacity-factor /
    --seq-len, or ValueError when ``name`` is not one of the large decoders (the Llama family:
    only they build their blocks either way), has no mixture of experts for --capacity-factor,
    or the policy is not one of `jaxpar_zoo.llama.REMAT_POLICIES` (a policy turns remat on)."""
    import jaxpar_zoo as zoo
    from jaxpar_zoo.llama import CONFIGS, REMAT_POLICIES

    if remat_policy is not None and remat_policy not in REMAT_POLICIES:
        raise ValueError(
            f"unknown --remat-policy {remat_policy!r}{did_you_mean(remat_policy, REMAT_POLICIES)}"
            f"; choose one of {', '.join(REMAT_POLICIES)}"
        )
    layers = DecoderBuild(remat or remat_policy is not None, scan, capacity, seq_len, remat_policy)
    given = [f for f, on in (("--remat", remat), ("--scan-layers", scan)) if on]
    given += [f for f, v in (("--capacity-factor", capacity), ("--seq-len", seq_len)) if v]
    given += ["--remat-policy"] if remat_policy is not None else []
    if given and name not in CONFIGS:
        flags = " and ".join(given)
        raise ValueError(
            f"{flags} {'apply' if len(given) > 1 else 'applies'} to the large decoders "
            f"({', '.join(zoo.LARGE)}); {name!r} is built one way only: drop "
            f"{'them' if len(given) > 1 else 'the flag'}"
        )
    if capacity is not None and not CONFIGS[name][1].get("num_experts"):
        moes = [n for n in zoo.LARGE if CONFIGS[n][1].get("num_experts")]
        raise ValueError(
            f"--capacity-factor applies to a mixture of experts ({', '.join(moes)}); {name!r} "
            "has none: drop the flag"
        )
    return layers


def check_cluster(name: str) -> str:
    """The cluster preset `name`, or a calibration file (`jaxpar calibrate`) that loads; else
    ValueError listing the presets (and suggesting the nearest) or saying what is wrong with the
    file."""
    from ..hardware.calibration import load_calibration, looks_like_calibration_path
    from ..hardware.cluster import Cluster

    known = Cluster.presets()
    if name not in known and looks_like_calibration_path(name):
        if not os.path.isfile(name):
            raise ValueError(
                f"--cluster {name!r}: no such calibration file; write one with jaxpar calibrate "
                f"--out {name}, or name a preset ({', '.join(known)})"
            )
        load_calibration(name)  # a bad file fails here, before anything slow
        return name
    if name not in known:
        raise ValueError(
            f"unknown cluster preset {name!r}{did_you_mean(name, known)}; presets: "
            f"{', '.join(known)} (jaxpar clusters prints their numbers)"
        )
    return name


def data_parallel_devices(strategy: str, sizes: Sequence[int], convolutions: bool) -> int:
    """The devices a strategy's data parallelism splits the global batch over (1: none).

    ``data`` and ``fsdp`` split it over the whole mesh, ``fsdp_tp`` over every axis but the
    last (the tensor-parallel one), ``owt`` over the whole mesh where the model has
    convolutions (its dense layers are model parallel); ``auto``, ``hypar`` and ``model`` need
    nothing of the batch. Axes of size 1 split nothing.
    """
    axes = [s for s in sizes if s > 1]
    if strategy in ("data", "fsdp") or (strategy == "owt" and convolutions):
        return math.prod(axes)
    if strategy == "fsdp_tp":
        return math.prod(axes[:-1] if len(axes) > 1 else axes)
    return 1


def batch_shortfall(strategy: str, batch: int, sizes: Sequence[int], convolutions: bool) -> str:
    """Why ``strategy`` cannot run at ``batch`` on a mesh of axis ``sizes`` ("" if it can): its
    data parallelism needs the batch to split over its devices (`data_parallel_devices`);
    planned anyway it would run on a sub-mesh, a different strategy than its name says."""
    devices = data_parallel_devices(strategy, sizes, convolutions)
    if batch % devices == 0:
        return ""
    return (
        f"batch {batch} does not split over the {plural(devices, 'device')} its data "
        "parallelism spans"
    )


def check_strategy_batch(strategy: str, batch: int, mesh: dict[str, int]) -> None:
    """Raise ValueError, before planning, when the one strategy asked for cannot run at
    ``batch`` (a strategy whose batch split is known without the model: ``data``, ``fsdp``,
    ``fsdp_tp``); ``auto`` plans any batch, and ``all`` marks the baselines that cannot run."""
    why = batch_shortfall(strategy, batch, list(mesh.values()), convolutions=False)
    if not why:
        return
    devices = data_parallel_devices(strategy, list(mesh.values()), False)
    below = batch // devices * devices
    fits = f"--batch {below} or {below + devices}" if below else f"--batch {devices}"
    raise ValueError(
        f"--strategy {strategy} cannot run at batch {batch}: {why}; pass --batch a multiple of "
        f"{devices}, e.g. {fits}, or --strategy auto (any batch) or all (the baselines that "
        "cannot run are marked)"
    )


def zoo_example(
    name: str,
    batch: int | None,
    small: bool,
    dtype: Any,
    devices: int,
    build: DecoderBuild | None = None,
) -> tuple[Any, int, str]:
    """The zoo example, its global batch, and how the batch was chosen (``""``: --batch).

    Without --batch: the model's default batch, rounded up to a multiple of the device count
    so that it splits over the mesh (GPT's default of 8 sequences would not split over 16).
    ``build``: how a large decoder is built (--remat, --remat-policy, --scan-layers,
    --seq-len, --capacity-factor).
    """
    import jax

    build = build or DecoderBuild()

    def example(batch: int | None) -> Any:
        if build == DecoderBuild():
            import jaxpar_zoo as zoo

            return zoo.get(name, batch=batch, small=small, dtype=dtype)
        from jaxpar_zoo.llama import llama_config, llama_example

        cfg = llama_config(
            name, small, remat=build.remat, batch=batch, seq_len=build.seq_len,
            scan_layers=build.scan, capacity_factor=build.capacity,
            remat_policy=build.remat_policy,
        )  # fmt: skip
        return llama_example(name, cfg, dtype)

    if batch is not None:
        return example(batch), batch, ""
    ex = example(None)
    default = int(jax.tree.leaves(ex.args[1])[0].shape[0])
    batch = -(-default // devices) * devices
    if batch == default:
        return ex, batch, "the model's default"
    note = f"the model's default {default}, rounded up to a multiple of the {devices} devices"
    return example(batch), batch, note
