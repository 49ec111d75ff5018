"""`jaxpar calibrate`: measure the devices at hand and return a `Calibration`.

Every number is a median of timed device runs (jit, warm-up runs, `block_until_ready`):

- matrix products n x n x n and 3x3 convolutions per dtype, each timed as a chain of dependent
  ops in one program, long enough that the device and not the host's dispatch sets the time,
  largest first after a warm-up that brings an accelerator's clocks up -> achieved FLOP/s
  against the FLOPs of one op (`ThroughputCurve`);
- an elementwise op (y = 2x) over growing buffers -> memory bandwidth (bytes read + written / s);
- chains of tiny dependent reductions of two lengths -> the fixed time of one kernel (the
  difference in time over the difference in kernels the compiled programs run);
- for every mesh axis of size >= 2 and every collective kind, a `shard_map` program running the
  collective over that axis alone, over a sweep of message sizes -> α, β per kind
  (`calibration.fit_alpha_beta`) and the axis's joint fit in the cost model's form
  (`calibration.fit_axis`).

The tables, fits and file format are the pure `jaxpar.hardware.calibration`.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from ..hardware.calibration import (
    AxisCalibration,
    Calibration,
    CollectiveFit,
    ThroughputCurve,
    fit_alpha_beta,
    fit_axis,
)
from ..hardware.collectives import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    KINDS,
    PERMUTE,
    REDUCE_SCATTER,
    all_gather_bytes,
    all_reduce_bytes,
    all_to_all_bytes,
    reduce_scatter_bytes,
)
from ..hardware.mesh_model import mesh_axes
from ..trace.meshes import detect_cluster, make_mesh

DTYPES = ("float32", "bfloat16", "float16")  # dtypes calibrate measures on request
KiB, MiB = 1024, 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Sweep:
    """The sizes one calibration run measures and how it times them."""

    matmul_sizes: tuple[int, ...]  # n of the n x n x n matrix products
    conv_shapes: tuple[tuple[int, int, int], ...]  # (batch, height = width, channels), 3x3 SAME
    memory_elements: tuple[int, ...]  # float32 elements of the bandwidth sweep's buffers
    message_bytes: tuple[int, ...]  # bytes of each device's collective buffer
    chain: int  # dependent ops per timed program (matmul, conv), at least
    # FLOPs one timed program should do: small ops chain longer (up to MAX_CHAIN) so the device,
    # not the host's dispatch, sets the time. 0: always `chain`.
    chain_flops: float
    calls: int  # back-to-back calls per timed run (the last one is waited for)
    repeats: int  # timed runs; the median is kept
    warmup: int  # untimed runs first (compilation, caches)
    warm_up_s: float  # seconds of large products before the sweep (accelerator clocks ramp up)


QUICK = Sweep(
    matmul_sizes=(32, 64, 128),
    conv_shapes=((2, 8, 8), (2, 16, 16)),
    memory_elements=(1 << 14, 1 << 16),
    message_bytes=(4 * KiB, 64 * KiB),
    chain=2,
    chain_flops=0.0,
    calls=2,
    repeats=3,
    warmup=1,
    warm_up_s=0.0,
)
CPU = Sweep(
    matmul_sizes=(64, 128, 256, 512, 1024),
    conv_shapes=((4, 16, 16), (8, 28, 32), (8, 28, 64), (16, 28, 64)),
    memory_elements=(1 << 16, 1 << 20, 1 << 23),
    message_bytes=(4 * KiB, 64 * KiB, MiB, 8 * MiB),
    chain=2,
    chain_flops=0.0,
    calls=3,
    repeats=5,
    warmup=1,
    warm_up_s=0.0,
)
ACCELERATOR = Sweep(
    matmul_sizes=(128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192),
    conv_shapes=(
        (8, 14, 64),
        (8, 28, 64),
        (16, 28, 128),
        (32, 28, 128),
        (32, 56, 64),
        (64, 14, 256),
        (64, 28, 256),
        (64, 56, 128),
        (128, 56, 128),
        (64, 7, 512),
    ),
    memory_elements=(1 << 16, 1 << 20, 1 << 24, 1 << 26, 1 << 28),
    message_bytes=(4 * KiB, 64 * KiB, MiB, 16 * MiB, 128 * MiB),
    chain=8,
    chain_flops=2e10,
    calls=5,
    repeats=7,
    warmup=2,
    warm_up_s=2.0,
)
MAX_CHAIN = 64  # longest chain of dependent ops in one timed program
KERNEL_CHAINS = (8, 64)  # steps of the two tiny-kernel chains `kernel_overhead` times
KERNEL_ELEMENTS = 32  # float32 elements each step reads: no work beside the kernel itself
# HLO instructions that run no kernel of their own (`kernel_count`)
NOT_KERNELS = frozenset(
    ("parameter", "constant", "get-tuple-element", "tuple", "bitcast", "call", "while",
     "conditional", "opt-barrier", "after-all", "partition-id", "replica-id", "add-dependency")
)  # fmt: skip


def chain_length(flops: float, sweep: Sweep) -> int:
    """Dependent ops per timed program for ops of `flops` FLOPs: `sweep.chain`, or enough to do
    `sweep.chain_flops` FLOPs, at most `MAX_CHAIN`."""
    wanted = math.ceil(sweep.chain_flops / flops) if sweep.chain_flops > 0 else 0
    return max(sweep.chain, min(MAX_CHAIN, wanted))


def warm_up(device: Any, sweep: Sweep) -> None:
    """Run large float32 products for `sweep.warm_up_s` seconds, so an accelerator's clocks are
    up before anything is timed (an idle GPU starts at a fraction of its clock)."""
    if sweep.warm_up_s <= 0:
        return
    a = _normal((4096, 4096), "float32", 1.0 / 64, device)
    product = jax.jit(lambda a: a @ a)
    deadline = time.perf_counter() + sweep.warm_up_s
    while time.perf_counter() < deadline:
        jax.block_until_ready(product(a))


def sweep_for(platform: str, quick: bool) -> Sweep:
    """The sweep for a platform: `QUICK` (a few seconds, for tests), `CPU`, or `ACCELERATOR`."""
    if quick:
        return QUICK
    return CPU if platform == "cpu" else ACCELERATOR


def default_dtypes(platform: str) -> tuple[str, ...]:
    """float32 everywhere; bfloat16 too on accelerators (XLA:CPU computes it in float32)."""
    return ("float32",) if platform == "cpu" else ("float32", "bfloat16")


def median_seconds(fn: Callable[..., Any], args: Sequence[Any], sweep: Sweep) -> float:
    """Seconds per call of `fn(*args)`: the median over `sweep.repeats` runs of `sweep.calls`
    back-to-back calls (asynchronous dispatch overlaps the host's launches with the device's
    work; the last call is waited for), after `sweep.warmup` untimed calls."""
    for _ in range(sweep.warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(sweep.repeats):
        start = time.perf_counter()
        out = None
        for _ in range(sweep.calls):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - start) / sweep.calls)
    return float(np.median(times))


# ---- compute ----------------------------------------------------------------------------------


def matmul_point(n: int, dtype: str, device: Any, sweep: Sweep) -> tuple[float, float]:
    """(FLOPs, achieved FLOP/s) of an n x n x n product: 2n³ FLOPs, timed as a chain of
    `chain_length` dependent products a <- a @ b (b scaled by 1/√n so values stay bounded)."""
    a = _normal((n, n), dtype, 1.0, device)
    b = _normal((n, n), dtype, 1.0 / math.sqrt(n), device)
    flops = 2.0 * n**3
    length = chain_length(flops, sweep)

    def chain(a: jax.Array, b: jax.Array) -> jax.Array:
        for _ in range(length):
            a = a @ b
        return a

    seconds = median_seconds(jax.jit(chain), (a, b), sweep) / length
    return flops, flops / seconds


def conv_point(
    shape: tuple[int, int, int], dtype: str, device: Any, sweep: Sweep
) -> tuple[float, float]:
    """(FLOPs, achieved FLOP/s) of a 3x3 SAME convolution, NHWC (batch b, h = w = s, c in and
    out channels): 2 · b · s² · c² · 9 FLOPs, timed as a chain of `chain_length` dependent
    convolutions."""
    batch, side, channels = shape
    x = _normal((batch, side, side, channels), dtype, 1.0, device)
    w = _normal((3, 3, channels, channels), dtype, 1.0 / math.sqrt(9 * channels), device)
    flops = 2.0 * batch * side * side * channels * channels * 9
    length = chain_length(flops, sweep)

    def chain(x: jax.Array, w: jax.Array) -> jax.Array:
        for _ in range(length):
            x = lax.conv_general_dilated(
                x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
            )
        return x

    seconds = median_seconds(jax.jit(chain), (x, w), sweep) / length
    return flops, flops / seconds


def _normal(shape: tuple[int, ...], dtype: str, scale: float, device: Any) -> jax.Array:
    """A normal(0, scale²) array of `dtype` on `device` (drawn by numpy: no RNG program to
    compile)."""
    values = np.random.default_rng(sum(shape)).standard_normal(shape, dtype=np.float32)
    return jax.device_put(jnp.asarray(values * scale, dtype=dtype), device)


def memory_point(elements: int, device: Any, sweep: Sweep) -> tuple[float, float]:
    """(bytes, achieved bytes/s) of y = 2x over `elements` float32: 8 bytes per element (read x,
    write y)."""
    x = jax.device_put(jnp.ones((elements,), jnp.float32), device)
    seconds = median_seconds(jax.jit(lambda x: x * 2.0), (x,), sweep)
    nbytes = 8.0 * elements
    return nbytes, nbytes / seconds


def host_link_point(elements: int, device: Any, sweep: Sweep) -> tuple[float, float]:
    """(bytes, achieved bytes/s) of copying `elements` float32 from the device to its pinned
    host memory and back (a remat policy's offload): the slower direction's rate, as the
    planner prices a move either way at one rate (`DeviceSpec.host_bandwidth`)."""
    on_device = SingleDeviceSharding(device, memory_kind="device")
    on_host = SingleDeviceSharding(device, memory_kind="pinned_host")
    x = jax.device_put(jnp.ones((elements,), jnp.float32), on_device)
    out, back = (jax.jit(lambda a: a, out_shardings=s) for s in (on_host, on_device))
    seconds = max(median_seconds(out, (x,), sweep), median_seconds(back, (out(x),), sweep))
    nbytes = 4.0 * elements
    return nbytes, nbytes / seconds


def host_link(device: Any, sweep: Sweep) -> tuple[tuple[float, float], ...]:
    """`host_link_point` over the memory sweep's sizes, smallest first; () for a device
    without pinned host memory."""
    if "pinned_host" not in {m.kind for m in device.addressable_memories()}:
        return ()
    return tuple(host_link_point(e, device, sweep) for e in sweep.memory_elements)


def kernel_chain(steps: int) -> Callable[[jax.Array], jax.Array]:
    """A jitted chain of `steps` dependent tiny kernels: x <- x / (1 + ε · sum(x)). Each step
    waits for the previous reduction, so XLA cannot fuse the steps into one kernel."""

    def chain(x: jax.Array) -> jax.Array:
        for _ in range(steps):
            x = x / (1.0 + 1e-6 * jnp.sum(x))
        return x

    return jax.jit(chain)


def kernel_count(hlo_text: str) -> int:
    """Kernels a compiled program runs: instructions outside fused computations (fusion
    bodies, reducers), not counting parameters, tuples, bitcasts, calls and control flow."""
    computations: dict[str, list[tuple[str, str]]] = {}
    inner: set[str] = set()
    current = ""
    for line in hlo_text.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
        if head and not line.startswith(" "):
            current = head.group(1)
            computations[current] = []
            continue
        inst = re.match(r"^\s+(?:ROOT )?%?[\w.\-]+ = .*?\s([a-z][\w\-]*)\((.*)$", line)
        if not inst or not current:
            continue
        opcode, rest = inst.group(1), inst.group(2)
        computations[current].append((opcode, rest))
        for key, target in re.findall(r"(calls|to_apply)=%?([\w.\-]+)", rest):
            if key == "calls" or opcode != "call":
                inner.add(target)
    return sum(
        op not in NOT_KERNELS
        for name, insts in computations.items()
        if name not in inner
        for op, _ in insts
    )


def kernel_overhead(device: Any, sweep: Sweep) -> float:
    """Seconds one kernel costs beyond its work: two chains of tiny dependent reductions
    (`kernel_chain`, `KERNEL_CHAINS` steps), (time of the long one - time of the short one) /
    (kernels of the long one - kernels of the short one), kernels counted in the compiled
    programs (`kernel_count`). The difference cancels the per-call dispatch of the host."""
    x = jax.device_put(jnp.ones((KERNEL_ELEMENTS,), jnp.float32), device)
    times, kernels = [], []
    for steps in KERNEL_CHAINS:
        fn = kernel_chain(steps)
        kernels.append(kernel_count(fn.lower(x).compile().as_text()))
        times.append(median_seconds(fn, (x,), sweep))
    return max(0.0, (times[1] - times[0]) / max(1, kernels[1] - kernels[0]))


def merged_points(points: Sequence[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """Points with equal FLOPs merged into one (geometric mean of their rates), sorted."""
    by_size: dict[float, list[float]] = {}
    for flops, rate in points:
        by_size.setdefault(flops, []).append(rate)
    return tuple(
        (flops, float(np.exp(np.mean(np.log(rates))))) for flops, rates in sorted(by_size.items())
    )


# ---- collectives ------------------------------------------------------------------------------


def collective_program(mesh: Mesh, axis: str, kind: str) -> Callable[[jax.Array], jax.Array]:
    """A jitted `shard_map` program running one `kind` collective over mesh axis `axis` on each
    device's block of a 1-D float32 array sharded over every mesh axis."""
    n = mesh.shape[axis]
    everywhere = PartitionSpec(tuple(mesh.axis_names))

    def local(x: jax.Array) -> jax.Array:
        if kind == ALL_REDUCE:
            return lax.psum(x, axis)
        if kind == ALL_GATHER:
            return lax.all_gather(x, axis, tiled=True)
        if kind == REDUCE_SCATTER:
            return lax.psum_scatter(x, axis, tiled=True)
        if kind == ALL_TO_ALL:
            return lax.all_to_all(x, axis, 0, 0, tiled=True)
        if kind == PERMUTE:
            return lax.ppermute(x, axis, [(i, (i + 1) % n) for i in range(n)])
        raise ValueError(f"unknown collective kind {kind!r}; expected one of {KINDS}")

    mapped = jax.shard_map(local, mesh=mesh, in_specs=everywhere, out_specs=everywhere)
    return jax.jit(mapped)


def bytes_sent(kind: str, n: int, buffer_bytes: float) -> float:
    """Bytes sent per device (ring accounting, `collectives`) by `kind` over n devices when each
    device's input buffer holds `buffer_bytes` (an all-gather's output is n times that)."""
    if kind == ALL_REDUCE:
        return all_reduce_bytes(buffer_bytes, n)
    if kind == ALL_GATHER:
        return all_gather_bytes(n * buffer_bytes, n)
    if kind == REDUCE_SCATTER:
        return reduce_scatter_bytes(buffer_bytes, n)
    if kind == ALL_TO_ALL:
        return all_to_all_bytes(buffer_bytes, n)
    return float(buffer_bytes)


def collective_samples(
    mesh: Mesh, axis: str, kind: str, sweep: Sweep
) -> tuple[tuple[float, float], ...]:
    """(bytes sent per device, seconds) of `kind` over `axis` for each of the sweep's buffer
    sizes (rounded to whole float32 elements divisible by the axis size)."""
    n = mesh.shape[axis]
    program = collective_program(mesh, axis, kind)
    sharding = NamedSharding(mesh, PartitionSpec(tuple(mesh.axis_names)))
    out = []
    for size in sweep.message_bytes:
        elements = max(n, size // 4 // n * n)
        x = jax.device_put(jnp.ones((elements * mesh.size,), jnp.float32), sharding)
        out.append((bytes_sent(kind, n, 4.0 * elements), median_seconds(program, (x,), sweep)))
    return tuple(out)


def axis_calibration(mesh: Mesh, axis: str, link: str, sweep: Sweep) -> AxisCalibration:
    """Every collective kind over one mesh axis: per-kind α, β and the axis's joint fit."""
    samples = {kind: collective_samples(mesh, axis, kind, sweep) for kind in KINDS}
    fits = []
    for kind, points in samples.items():
        alpha, beta = fit_alpha_beta([b for b, _ in points], [s for _, s in points])
        fits.append(CollectiveFit(kind, alpha, beta, points))
    step_latency, bandwidth = fit_axis(samples, mesh.shape[axis])
    return AxisCalibration(axis, mesh.shape[axis], link, tuple(fits), step_latency, bandwidth)


# ---- the whole run ----------------------------------------------------------------------------


def calibrate(
    mesh: Mesh | dict[str, int] | None = None,
    *,
    quick: bool = False,
    dtypes: Sequence[str] | None = None,
) -> Calibration:
    """Measure the devices of `mesh` (default: one axis "devices" over all of `jax.devices()`).

    ``mesh``: a jax `Mesh` or a dict {axis name: size} (built with `make_mesh`); every axis of
    size >= 2 has its collectives measured. ``quick``: a few small sizes only (seconds; for
    tests: the numbers are rough). ``dtypes``: the matmul and conv dtypes (default float32, and
    bfloat16 on accelerators; float32 is always measured). Save the result with
    `Calibration.save` and plan with ``cluster=path`` (or ``cluster=calibration``).
    """
    if mesh is None:
        mesh = make_mesh({"devices": len(jax.devices())})
    elif isinstance(mesh, dict):
        mesh = make_mesh(mesh)
    elif not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax Mesh, a dict of axis sizes or None, not {mesh!r}")
    devices = mesh.devices.reshape(-1).tolist()
    first = devices[0]
    dtypes = _checked_dtypes(dtypes, first.platform)
    sweep = sweep_for(first.platform, quick)
    warm_up(first, sweep)
    matmul, conv = {}, {}
    for dtype in dtypes:  # largest first: the clocks stay up from the warm-up on
        points = [matmul_point(n, dtype, first, sweep) for n in sweep.matmul_sizes[::-1]]
        matmul[dtype] = ThroughputCurve(merged_points(points))
        points = [conv_point(s, dtype, first, sweep) for s in sweep.conv_shapes[::-1]]
        conv[dtype] = ThroughputCurve(merged_points(points))
    memory = tuple(memory_point(e, first, sweep) for e in sweep.memory_elements[::-1])
    overhead = kernel_overhead(first, sweep)
    host = host_link(first, sweep)
    return Calibration(
        platform=first.platform,
        device_kind=first.device_kind,
        num_devices=len(devices),
        date=datetime.date.today().isoformat(),
        jax_version=jax.__version__,
        quick=quick,
        matmul=tuple(matmul.items()),
        conv=tuple(conv.items()),
        memory_bandwidth=max(rate for _, rate in memory),
        memory_points=memory[::-1],
        memory_bytes=_memory_capacity(first),
        axes=_axes(mesh, devices, sweep),
        kernel_overhead=overhead,
        host_bandwidth=max((rate for _, rate in host), default=None),
        host_points=host,
    )


def summary(calibration: Calibration) -> str:
    """A short table of what was measured, for `jaxpar calibrate`."""
    c = calibration
    lines = [
        f"calibration: {c.num_devices} x {c.device_kind} ({c.platform}), {c.date}, jax "
        f"{c.jax_version}" + (" (quick: rough numbers)" if c.quick else ""),
        f"  memory bandwidth {c.memory_bandwidth / 1e9:.1f} GB/s"
        + (f", memory {c.memory_bytes / 1e9:.1f} GB" if c.memory_bytes else ""),
        f"  kernel overhead {c.measured_kernel_overhead() * 1e6:.2f} us per kernel"
        + ("" if c.kernel_overhead is not None else " (smallest product; not measured)"),
        "  host link "
        + (
            "not measured"
            if c.host_bandwidth is None
            else f"{c.host_bandwidth / 1e9:.1f} GB/s to pinned host memory and back (slower way)"
            + (": XLA:CPU's moves are no copies, not used" if c.platform == "cpu" else "")
        ),
    ]
    for label, table in (("matmul", c.matmul), ("conv", c.conv)):
        for dtype, curve in table:
            low, high = curve.points[0], curve.points[-1]
            lines.append(
                f"  {label:<6} {dtype:<9} {_rate(low[1])} at {low[0]:.3g} FLOP .. "
                f"{_rate(high[1])} at {high[0]:.3g} FLOP (best {_rate(curve.peak)})"
            )
    if c.contractions:
        total = sum(seconds for _, seconds in c.contractions)
        lines.append(
            f"  library calls: {len(c.contractions)} measured (jaxpar.measure_contractions), "
            f"{total * 1e3:.3f} ms in all"
        )
    if not c.axes:
        lines.append("  collectives: none measured (no mesh axis of 2 or more devices)")
    for axis in c.axes:
        lines.append(
            f"  axis {axis.name}={axis.size} ({axis.link}): {axis.step_latency * 1e6:.2f} us per "
            f"ring step, {axis.bandwidth / 1e9:.2f} GB/s"
        )
        for fit in axis.collectives:
            lines.append(
                f"    {fit.kind:<19} α {fit.latency * 1e6:9.2f} us  "
                f"β {fit.bandwidth / 1e9:9.2f} GB/s"
            )
    return "\n".join(lines)


def _rate(flops_per_s: float) -> str:
    """'412.30 TFLOP/s', or '50.0 GFLOP/s' below one TFLOP/s."""
    if flops_per_s >= 1e12:
        return f"{flops_per_s / 1e12:.2f} TFLOP/s"
    return f"{flops_per_s / 1e9:.1f} GFLOP/s"


def _checked_dtypes(dtypes: Sequence[str] | None, platform: str) -> tuple[str, ...]:
    """The dtypes to measure, float32 first; ValueError for one calibrate does not measure."""
    chosen = default_dtypes(platform) if dtypes is None else tuple(dtypes)
    bad = [d for d in chosen if d not in DTYPES]
    if bad:
        raise ValueError(f"calibrate measures dtypes {', '.join(DTYPES)}; got {bad}")
    return ("float32", *(d for d in dict.fromkeys(chosen) if d != "float32"))


def _memory_capacity(device: Any) -> float | None:
    """Bytes of device memory jax reports (`memory_stats()["bytes_limit"]`), or None."""
    try:
        stats = device.memory_stats()
    except (AttributeError, NotImplementedError, RuntimeError):
        return None
    limit = (stats or {}).get("bytes_limit")
    return float(limit) if limit else None


def _axes(mesh: Mesh, devices: list[Any], sweep: Sweep) -> tuple[AxisCalibration, ...]:
    """`axis_calibration` of every mesh axis of size >= 2, with the link level it crosses in the
    detected (datasheet) cluster of the mesh's devices."""
    names = tuple(mesh.axis_names)
    sizes = tuple(mesh.devices.shape)
    ids = np.vectorize(lambda d: d.id, otypes=[int])(mesh.devices)
    links = mesh_axes(detect_cluster(devices), names, sizes, ids).link_names
    return tuple(
        axis_calibration(mesh, name, link, sweep)
        for name, size, link in zip(names, sizes, links, strict=True)
        if size > 1
    )
