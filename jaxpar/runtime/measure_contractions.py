"""Timing a plan's library calls on the device at hand: OptCNN's measured t_C.

`contraction_calls.plan_calls` lists every matrix product and convolution a plan's nodes call on
one device under any of their configurations (per-device operand shapes). Each distinct call is
bound as the traced equation was (same primitive and parameters) on random operands of its
shapes, compiled alone and timed: ``copies`` independent calls on distinct operands in one
program (XLA cannot merge them as it merges products sharing an operand). On an accelerator the
program runs under the profiler and the call's seconds are its own kernels' device time (the
kernels of the instructions that carry the primitive's name, a gemm fusion whole), per call:
the layout copies a program of one call needs for operands it gets as parameters are left out,
since in a train step XLA folds them into the operands' producers or into the gemm fusion, and
the cost model prices those producers already. On the CPU (no device trace) it is the median
wall time of the program over repeats, divided by the copies. The seconds go
into a calibration's table (`Calibration.with_contractions`), which `cost.node_work` prefers to
the throughput curve. One device stands for every device of the mesh, as in OptCNN: a
configuration's per-device work is what the table times.
"""

from __future__ import annotations

import glob
import math
import os
import re
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from ..cost.contraction_calls import ContractionCall, plan_calls
from ..hardware.calibration import Calibration
from ..planner.plan import Plan
from .calibrate import Sweep, median_seconds

ACCELERATOR = Sweep(
    matmul_sizes=(), conv_shapes=(), memory_elements=(), message_bytes=(), chain=1,
    chain_flops=0.0, calls=3, repeats=5, warmup=1, warm_up_s=0.0,
)  # fmt: skip
QUICK = Sweep(
    matmul_sizes=(), conv_shapes=(), memory_elements=(), message_bytes=(), chain=1,
    chain_flops=0.0, calls=1, repeats=1, warmup=1, warm_up_s=0.0,
)  # fmt: skip
MAX_COPIES = 8  # independent calls per timed program
COPY_BYTES = 2 * 2**30  # at most this many bytes of operands and results across the copies


def _operands(call: ContractionCall, copies: int, device: Any, seed: int) -> list[jax.Array]:
    """``copies`` × the call's operands, normal(0, 1) (ones for integer dtypes), on device."""
    out = []
    for c in range(copies):
        for i, (shape, dtype) in enumerate(zip(call.shapes, call.dtypes, strict=True)):
            if jnp.issubdtype(dtype, jnp.floating):
                key = jax.random.key(seed * 1009 + c * 31 + i)
                value = jax.random.normal(key, shape, jnp.float32).astype(dtype)
            else:
                value = jnp.ones(shape, dtype)
            out.append(jax.device_put(value, device))
    return out


def _bound(call: ContractionCall, *operands: jax.Array) -> jax.Array:
    """The call's primitive on ``operands``, bound as the traced equation was."""
    primitive = call.bind
    return primitive.bind(*operands, **primitive.get_bind_params(dict(call.params)))


def _program(call: ContractionCall, copies: int) -> Callable[..., Any]:
    n = len(call.shapes)

    def run(*operands: jax.Array) -> list[jax.Array]:
        return [_bound(call, *operands[c * n : (c + 1) * n]) for c in range(copies)]

    return jax.jit(run)


def _copies(call: ContractionCall, quick: bool) -> int:
    """Copies of the call that fit `COPY_BYTES` of operands and results (at most `MAX_COPIES`;
    2 when ``quick``)."""
    operands = [jax.ShapeDtypeStruct(s, d) for s, d in zip(call.shapes, call.dtypes, strict=True)]
    result = jax.eval_shape(lambda *xs: _bound(call, *xs), *operands)
    nbytes = sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in (*operands, result))
    return max(1, min(2 if quick else MAX_COPIES, int(COPY_BYTES // max(nbytes, 1))))


def call_seconds(
    call: ContractionCall, device: Any, quick: bool = False, seed: int = 0
) -> tuple[float, bool]:
    """Seconds of one ``call`` on ``device`` (module docstring), and whether they are the
    call's own kernels alone: False where the profile named no kernel's HLO instruction (XLA
    ran the program as a CUDA graph), so the program's whole device time is taken, its layout
    copies included."""
    copies = _copies(call, quick)
    operands = _operands(call, copies, device, seed)
    program = _program(call, copies)
    sweep = QUICK if quick else ACCELERATOR
    if device.platform != "cpu":
        ops = call_kernel_ops(program.lower(*operands).compile().as_text(), call.primitive)
        for _ in range(sweep.warmup):
            jax.block_until_ready(program(*operands))
        runs = sweep.calls * sweep.repeats
        kernels, _ = profiled_kernels(program, operands, runs)
        own = [seconds for op, seconds in kernels if _hlo_name(op) in ops]
        if own:
            return sum(own) / (runs * copies), True
        if kernels:
            return sum(seconds for _, seconds in kernels) / (runs * copies), False
    return median_seconds(program, operands, sweep) / copies, device.platform == "cpu"


def _hlo_name(op: str) -> str:
    """An HLO instruction name as profiles and HLO text both spell it (``.``/``-`` as ``_``)."""
    return re.sub(r"[.\-]", "_", op)


def call_kernel_ops(hlo_text: str, primitive: str) -> set[str]:
    """Names (`_hlo_name`) of the compiled instructions that run ``primitive``: those whose
    ``op_name`` metadata ends in it, and the fusions whose fused computation holds one."""
    own, holders, called = set(), set(), {}
    computation = ""
    for line in hlo_text.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            computation = header.group(1)
            continue
        instruction = _INSTRUCTION.match(line)
        if not instruction:
            continue
        name = instruction.group(1)
        op_name = _OP_NAME.search(line)
        if op_name and op_name.group(1).rsplit("/", 1)[-1] == primitive:
            own.add(name)
            holders.add(computation)
        callee = _CALLS.search(line)
        if callee:
            called[name] = callee.group(1)
    own.update(name for name, comp in called.items() if comp in holders)
    return {_hlo_name(n) for n in own}


def profiled_kernels(
    fn: Callable[..., Any], args: Sequence[Any], runs: int
) -> tuple[list[tuple[str, float]], str]:
    """(HLO op, device seconds) of every kernel the device ran over ``runs`` calls of ``fn``,
    and where they were read: an accelerator's device planes (each kernel named by its
    ``hlo_op`` stat, else by its own name), or on the CPU the host's thunk events (those with
    an ``hlo_op``)."""
    with tempfile.TemporaryDirectory() as where:
        with jax.profiler.trace(where):
            for _ in range(runs):
                jax.block_until_ready(fn(*args))
        (path,) = glob.glob(os.path.join(where, "**", "*.xplane.pb"), recursive=True)
        data = jax.profiler.ProfileData.from_file(path)
    devices = [p for p in data.planes if p.name.startswith("/device:") and "CPU" not in p.name]
    out = []
    for plane in devices or data.planes:
        for line in plane.lines:
            if devices and not line.name.startswith("Stream"):
                continue  # derived lines ("XLA Ops", "XLA Modules") repeat the kernels
            for event in line.events:
                op = dict(event.stats).get("hlo_op")
                if op is not None or devices:
                    out.append((str(op or event.name), event.duration_ns * 1e-9))
    return out, "device planes" if devices else "host thunks"


_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([^\s(]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([^\s=]+) = ")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_CALLS = re.compile(r"calls=%?([^\s,)}]+)")


def contraction_table(
    calls: Sequence[ContractionCall],
    *,
    device: Any = None,
    quick: bool = False,
    progress: Callable[[str], None] | None = None,
) -> tuple[dict[str, float], dict[str, str], set[str]]:
    """Measured seconds per call key; the calls that could not run (key -> why: a call the
    device's compiler rejects, e.g. a grouped convolution whose groups a split breaks); and
    the calls timed with their layout copies (`call_seconds`)."""
    device = device or jax.devices()[0]
    measured, failed, with_copies = {}, {}, set()
    started = time.perf_counter()
    for i, call in enumerate(calls):
        try:
            measured[call.key], alone = call_seconds(call, device, quick, seed=i)
            if not alone:
                with_copies.add(call.key)
        except Exception as err:  # a call XLA rejects keeps the modelled price
            failed[call.key] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
        if progress and (i + 1) % 25 == 0:
            progress(f"{i + 1} / {len(calls)} calls, {time.perf_counter() - started:.1f} s")
    return measured, failed, with_copies


def measure_contractions(
    plan: Plan,
    calibration: Calibration,
    *,
    quick: bool = False,
    max_calls: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> Calibration:
    """``calibration`` with the measured seconds of every library call ``plan``'s nodes make
    under any of their configurations (the largest ``max_calls`` when given) added to its
    table. Run it on a device of the kind ``calibration`` measured; then plan with
    ``cluster=`` the result (or save it and pass its path).

    Raises ValueError when this device is not the kind the calibration measured (a table
    measured on one device would price another).
    """
    if not isinstance(plan, Plan):
        raise TypeError(
            f"plan must be a jaxpar Plan (jaxpar.plan(step, *args, mesh=...)), not "
            f"{type(plan).__name__}: its configurations say which calls to measure"
        )
    if not isinstance(calibration, Calibration):
        raise TypeError(
            f"calibration must be a jaxpar Calibration (jaxpar.calibrate() or "
            f"jaxpar.load_calibration(path)), not {type(calibration).__name__}"
        )
    device = jax.devices()[0]
    if device.device_kind != calibration.device_kind:
        raise ValueError(
            f"this device is a {device.device_kind!r} but the calibration measured "
            f"{calibration.device_kind!r}; measure contractions on the calibrated kind, or "
            "calibrate this device first (jaxpar.calibrate())"
        )
    calls = plan_calls(plan.ng, plan.tables.configs, plan.params.mesh.sizes)
    if max_calls is not None:
        calls = calls[:max_calls]
    measured, failed, with_copies = contraction_table(
        calls, device=device, quick=quick, progress=progress
    )
    if failed:
        key, why = next(iter(failed.items()))
        warnings.warn(
            f"{len(failed)} of {len(calls)} library calls could not run on this device and keep "
            f"the cost model's price; the first, {key}: {why}",
            stacklevel=2,
        )
    if with_copies:
        warnings.warn(
            f"{len(with_copies)} of {len(calls)} library calls were timed with their operands' "
            "layout copies: the profile named none of their kernels (XLA ran them as CUDA "
            "graphs). Set XLA_FLAGS=--xla_gpu_enable_command_buffer= before jax starts to time "
            "the calls alone ('jaxpar calibrate --contractions-of' does)",
            stacklevel=2,
        )
    return calibration.with_contractions(measured)
