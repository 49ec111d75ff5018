"""Measured device numbers: what `jaxpar calibrate` writes and a calibrated `Cluster` prices with.

A calibration file replaces datasheet numbers with numbers measured on the devices at hand:

- per dtype, the FLOP/s that matrix products (and convolutions) actually reach as a function of
  their size (`ThroughputCurve`: (FLOPs of one call, achieved FLOP/s) points, interpolated in
  log-log space);
- the memory bandwidth of a large elementwise op;
- the fixed time of one kernel (a chain of tiny unfusable ops: seconds per kernel);
- optionally, the measured seconds of individual library calls (a matrix product or convolution
  of given operand shapes, `contraction_calls.contraction_key`): OptCNN's measured t_C, written by
  `jaxpar.measure_contractions` for the calls one model's plans make, and preferred to the curve;
- per mesh axis and collective kind, the latency α and bandwidth β fitted to a message-size
  sweep (`CollectiveFit`: t = α + bytes sent per device / β), and one joint fit of the axis in
  the cost model's own form (`AxisCalibration`: t = latency · ring_steps(kind, n) + bytes / bw).

The measuring is `jaxpar.measure` (it runs jax); this module holds the tables, the fits and the
JSON format (`Calibration.save`, `load_calibration`), and imports no jax.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .collectives import KINDS, ring_steps

FORMAT = "jaxpar.calibration"  # the file's "format" field
# the file's "version" field written; 2 added "kernel_overhead", 3 "contractions", 4 "host"
VERSION = 4
READ_VERSIONS = (1, 2, 3, 4)  # versions load accepts (before 3: no contraction table)
MATMUL = "matmul"  # ThroughputCurve kinds: dot_general ...
CONV = "conv"  # ... and conv_general_dilated


@dataclass(frozen=True)
class ThroughputCurve:
    """Achieved FLOP/s of one op kind in one dtype as a function of the FLOPs of one call."""

    # (FLOPs of one call, achieved FLOP/s) measured points, FLOPs strictly increasing.
    points: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        points = tuple(sorted((float(f), float(r)) for f, r in self.points))
        object.__setattr__(self, "points", points)
        if not points:
            raise ValueError("a throughput curve needs at least one measured point")
        if any(not (f > 0 and r > 0 and math.isfinite(f) and math.isfinite(r)) for f, r in points):
            raise ValueError(f"throughput points must be positive and finite, got {points}")
        flops = [f for f, _ in points]
        if len(set(flops)) != len(flops):
            raise ValueError(f"throughput points repeat a size: {flops}")

    @property
    def peak(self) -> float:
        """The highest FLOP/s measured."""
        return max(r for _, r in self.points)

    def rate(self, flops: np.ndarray | float) -> np.ndarray:
        """Achieved FLOP/s of calls of `flops` FLOPs (vectorized).

        Between measured sizes: linear in log(FLOPs) -> log(rate). Below the smallest size f_0
        the time stays that of f_0 (a launch-bound call): rate = r_0 · f / f_0. Above the
        largest, its rate.
        """
        f = np.maximum(np.asarray(flops, dtype=float), 1.0)
        xs = np.log([p[0] for p in self.points])
        ys = np.log([p[1] for p in self.points])
        inside = np.exp(np.interp(np.log(f), xs, ys))
        f0, r0 = self.points[0]
        return np.where(f < f0, r0 * f / f0, inside)


@dataclass(frozen=True)
class CollectiveFit:
    """One collective kind over one mesh axis: t = α + bytes sent per device / β."""

    kind: str  # one of collectives.KINDS
    latency: float  # α: seconds of a call moving no bytes (least squares, >= 0)
    bandwidth: float  # β: bytes sent per device per second (ring accounting, > 0)
    # (bytes sent per device, measured seconds) of the sweep the fit was made from
    samples: tuple[tuple[float, float], ...]

    def time(self, nbytes: float) -> float:
        """Predicted seconds of one call sending `nbytes` per device: α + nbytes / β."""
        return self.latency + nbytes / self.bandwidth


@dataclass(frozen=True)
class AxisCalibration:
    """The measured collectives of one mesh axis, and the axis's link in the cost model's form."""

    name: str  # the mesh axis name at calibration time
    size: int  # its size
    link: str  # the link level of the datasheet cluster its groups crossed ("nvlink", ...)
    collectives: tuple[CollectiveFit, ...]  # one fit per kind measured
    # Joint least-squares fit over every sample of every kind, in the form the cost model
    # prices with (`collectives.transfer_time`): t = step_latency · ring_steps(kind, n) + b / bw
    step_latency: float  # seconds per ring step
    bandwidth: float  # bytes sent per device per second

    def fit(self, kind: str) -> CollectiveFit:
        """The fit of collective `kind`; KeyError if it was not measured."""
        for fit in self.collectives:
            if fit.kind == kind:
                return fit
        raise KeyError(f"axis {self.name!r}: {kind} was not measured")


@dataclass(frozen=True)
class Calibration:
    """Everything `jaxpar calibrate` measured on one set of devices."""

    platform: str  # jax platform of the devices ("cpu", "gpu", "tpu")
    device_kind: str  # jax's device_kind, e.g. "NVIDIA H100 80GB HBM3"
    num_devices: int  # devices in the calibration mesh
    date: str  # ISO date of the measurement
    jax_version: str  # jax that ran it (XLA's kernels change between versions)
    # (dtype name, curve) pairs for matrix products (dot_general), sorted by dtype
    matmul: tuple[tuple[str, ThroughputCurve], ...]
    # (dtype name, curve) pairs for convolutions (conv_general_dilated); may be empty
    conv: tuple[tuple[str, ThroughputCurve], ...]
    memory_bandwidth: float  # bytes/s read + written by a large elementwise op (best size)
    # (bytes read + written, achieved bytes/s) of the bandwidth sweep
    memory_points: tuple[tuple[float, float], ...]
    memory_bytes: float | None  # device memory capacity jax reported; None if it reports none
    axes: tuple[AxisCalibration, ...]  # mesh axes of size >= 2, mesh order
    quick: bool = False  # the few-sizes smoke run (tests); its numbers are rough
    # Seconds one kernel costs beyond its work (launch, ramp-up): the slope of a chain of tiny
    # ops per kernel (`measure.kernel_overhead`). None: not measured (a version 1 file).
    kernel_overhead: float | None = None
    # (call key, seconds) of measured library calls (`contraction_calls.contraction_key`),
    # sorted by key; empty unless `jaxpar.measure_contractions` filled it
    contractions: tuple[tuple[str, float], ...] = ()
    # bytes/s of the link to pinned host memory: the slower direction's best rate over the
    # sweep (`measure.host_link_point`); None: not measured (before version 4, or a device
    # without pinned host memory)
    host_bandwidth: float | None = None
    # (bytes copied, bytes/s of the slower direction) of the host-link sweep
    host_points: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        for field_name in ("matmul", "conv"):
            pairs = getattr(self, field_name)
            pairs = pairs.items() if isinstance(pairs, Mapping) else pairs
            object.__setattr__(self, field_name, tuple(sorted(pairs)))
        if not dict(self.matmul).get("float32"):
            raise ValueError("a calibration needs a float32 matmul curve")
        if not self.memory_bandwidth > 0 or self.num_devices < 1:
            raise ValueError("a calibration needs memory_bandwidth > 0 and num_devices >= 1")
        if self.kernel_overhead is not None and not self.kernel_overhead >= 0:
            raise ValueError("a calibration's kernel_overhead must be >= 0")
        if self.host_bandwidth is not None and not self.host_bandwidth > 0:
            raise ValueError("a calibration's host_bandwidth must be > 0 (None: not measured)")
        table = dict(self.contractions)
        if len(table) != len(self.contractions):
            raise ValueError("a calibration's contraction table repeats a call")
        if any(not (s > 0 and math.isfinite(s)) for s in table.values()):
            raise ValueError("a calibration's measured call seconds must be positive and finite")
        object.__setattr__(self, "contractions", tuple(sorted(table.items())))

    @functools.cached_property
    def contraction_table(self) -> dict[str, float]:
        """Measured seconds per library call key (empty when none were measured)."""
        return dict(self.contractions)

    def with_contractions(self, measured: Mapping[str, float]) -> Calibration:
        """This calibration with ``measured`` calls added to its table (replacing equal keys)."""
        return dataclasses.replace(
            self, contractions=tuple({**self.contraction_table, **measured}.items())
        )

    @property
    def source(self) -> str:
        """Where the numbers come from, for reports: "measured on <device kind>, <date>"."""
        calls = f", {len(self.contractions)} library calls measured" if self.contractions else ""
        quick = " (quick)" if self.quick else ""
        return f"measured on {self.device_kind}, {self.date}{calls}{quick}"

    def curve(self, kind: str, dtype: str) -> ThroughputCurve:
        """The curve of op `kind` (MATMUL or CONV) in `dtype`; a conv falls back to the matmul
        curve, an unmeasured dtype to float32's."""
        tables = [dict(self.conv), dict(self.matmul)] if kind == CONV else [dict(self.matmul)]
        for table in tables:
            if dtype in table:
                return table[dtype]
        return dict(self.matmul)["float32"]

    def measured_kernel_overhead(self) -> float:
        """Seconds per kernel: the measured `kernel_overhead`, else (a version 1 file) the time
        of the smallest measured product or convolution, which is all launch and ramp-up."""
        if self.kernel_overhead is not None:
            return self.kernel_overhead
        firsts = [c.points[0] for _, c in (*self.matmul, *self.conv)]
        return min(f / r for f, r in firsts)

    def peak_flops(self) -> dict[str, float]:
        """The best matmul rate measured per dtype (the calibrated cluster's peak)."""
        return {dtype: curve.peak for dtype, curve in self.matmul}

    def axis_for(self, name: str, size: int, link: str) -> AxisCalibration | None:
        """The measurement that prices a mesh axis: the calibrated axis with the same name and
        size, else one of the same size that crossed the same link level; None if none."""
        same_size = [a for a in self.axes if a.size == size]
        for axis in same_size:
            if axis.name == name:
                return axis
        return next((a for a in same_size if a.link == link), None)

    # ---- JSON ----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The file's content (plain JSON types; `from_dict` reads it back)."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "platform": self.platform,
            "device_kind": self.device_kind,
            "num_devices": self.num_devices,
            "date": self.date,
            "jax_version": self.jax_version,
            "quick": self.quick,
            "matmul": {d: [list(p) for p in c.points] for d, c in self.matmul},
            "conv": {d: [list(p) for p in c.points] for d, c in self.conv},
            "kernel_overhead": self.kernel_overhead,
            "contractions": [{"call": k, "seconds": v} for k, v in self.contractions],
            "memory": {
                "bandwidth": self.memory_bandwidth,
                "points": [list(p) for p in self.memory_points],
                "capacity": self.memory_bytes,
            },
            "host": None
            if self.host_bandwidth is None
            else {"bandwidth": self.host_bandwidth, "points": [list(p) for p in self.host_points]},
            "axes": [
                {
                    "name": a.name,
                    "size": a.size,
                    "link": a.link,
                    "step_latency": a.step_latency,
                    "bandwidth": a.bandwidth,
                    "collectives": {
                        f.kind: {
                            "latency": f.latency,
                            "bandwidth": f.bandwidth,
                            "samples": [list(s) for s in f.samples],
                        }
                        for f in a.collectives
                    },
                }
                for a in self.axes
            ],
        }

    def save(self, path: str | os.PathLike) -> None:
        """Write the calibration as JSON (`load_calibration` reads it)."""
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)
            f.write("\n")

    @classmethod
    def from_dict(cls, doc: Any, where: str = "calibration") -> Calibration:
        """Read `to_dict`'s content; ValueError naming the field for anything wrong."""
        try:
            return _parse(doc)
        except (KeyError, TypeError, ValueError) as err:
            message = f"missing field {err}" if isinstance(err, KeyError) else str(err)
            raise ValueError(f"{where}: not a valid jaxpar calibration file: {message}") from None


def load_calibration(path: str | os.PathLike) -> Calibration:
    """Read a calibration file; ValueError for a file that is not one (bad JSON, wrong format
    or version, missing or bad fields), FileNotFoundError for a missing one."""
    with open(path) as f:
        text = f.read()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not a valid jaxpar calibration file: bad JSON ({err})") from None
    return Calibration.from_dict(doc, where=str(path))


def looks_like_calibration_path(text: str) -> bool:
    """True when a cluster argument names a file rather than a preset: it ends in ".json",
    holds a path separator, or exists."""
    return text.endswith(".json") or os.sep in text or os.path.exists(text)


# ---- fits -------------------------------------------------------------------------------------


def nonnegative_fit(columns: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The least-squares x >= 0 of columns @ x ≈ y for two columns (exact two-variable NNLS).

    The unconstrained solution when both coefficients are >= 0; else the better of the two
    one-column fits (each clamped at 0).
    """
    a, y = np.asarray(columns, dtype=float), np.asarray(y, dtype=float)
    x, *_ = np.linalg.lstsq(a, y, rcond=None)
    if (x >= 0).all():
        return x
    best, best_err = np.zeros(2), float(np.sum(y**2))
    for k in range(2):
        col = a[:, k]
        denom = float(col @ col)
        coef = max(0.0, float(col @ y) / denom) if denom > 0 else 0.0
        trial = np.zeros(2)
        trial[k] = coef
        err = float(np.sum((a @ trial - y) ** 2))
        if err < best_err:
            best, best_err = trial, err
    return best


def fit_alpha_beta(nbytes: Sequence[float], seconds: Sequence[float]) -> tuple[float, float]:
    """(α, β) of t = α + bytes / β by least squares with α >= 0 and 1/β >= 0.

    When the times do not grow with size (1/β fits to 0: noise, or sizes too small to leave the
    latency regime), β is the largest bytes / time seen: a bandwidth the sweep did reach.
    """
    x, t = np.asarray(nbytes, dtype=float), np.asarray(seconds, dtype=float)
    alpha, inv_beta = nonnegative_fit(np.stack([np.ones_like(x), x], axis=1), t)
    return float(alpha), _bandwidth(inv_beta, x, t)


def fit_axis(samples: Mapping[str, Sequence[tuple[float, float]]], n: int) -> tuple[float, float]:
    """(step latency, bandwidth) of one axis of `n` devices from every kind's samples, in the cost
    model's form t = latency · ring_steps(kind, n) + bytes / bandwidth (non-negative least
    squares over all (kind, bytes, seconds) samples; bandwidth as in `fit_alpha_beta`)."""
    rows = [(ring_steps(kind, n), b, s) for kind, pts in samples.items() for b, s in pts]
    if not rows:
        raise ValueError("fit_axis needs at least one sample")
    steps, x, t = (np.asarray(col, dtype=float) for col in zip(*rows, strict=True))
    latency, inv_bw = nonnegative_fit(np.stack([steps, x], axis=1), t)
    return float(latency), _bandwidth(inv_bw, x, t)


def _bandwidth(inv_beta: float, x: np.ndarray, t: np.ndarray) -> float:
    """1 / inv_beta, or when that fitted to 0 the best bytes / seconds of the samples."""
    if inv_beta > 0:
        return 1.0 / float(inv_beta)
    return float(np.max(x / np.maximum(t, 1e-12)))


# ---- reading the file -------------------------------------------------------------------------


def _parse(doc: Any) -> Calibration:
    if not isinstance(doc, dict):
        raise ValueError(f"the top level must be an object, not {type(doc).__name__}")
    if doc.get("format") != FORMAT:
        raise ValueError(f"format is {doc.get('format')!r}, expected {FORMAT!r}")
    if doc.get("version") not in READ_VERSIONS:
        raise ValueError(
            f"version {doc.get('version')!r} is not supported (this jaxpar reads "
            f"{', '.join(map(str, READ_VERSIONS))})"
        )
    overhead = doc.get("kernel_overhead")
    host = doc.get("host")
    host = None if host is None else _obj(host, "host")
    memory = _obj(doc["memory"], "memory")
    capacity = memory.get("capacity")
    return Calibration(
        platform=_text(doc["platform"], "platform"),
        device_kind=_text(doc["device_kind"], "device_kind"),
        num_devices=_count(doc["num_devices"], "num_devices"),
        date=_text(doc["date"], "date"),
        jax_version=_text(doc["jax_version"], "jax_version"),
        quick=bool(doc.get("quick", False)),
        matmul=_curves(doc["matmul"], "matmul"),
        conv=_curves(doc.get("conv", {}), "conv"),
        memory_bandwidth=_positive(memory["bandwidth"], "memory.bandwidth"),
        memory_points=_pairs(memory.get("points", []), "memory.points"),
        memory_bytes=None if capacity is None else _positive(capacity, "memory.capacity"),
        axes=tuple(_axis(a, f"axes[{i}]") for i, a in enumerate(_list(doc["axes"], "axes"))),
        kernel_overhead=None if overhead is None else _nonnegative(overhead, "kernel_overhead"),
        contractions=_table(doc.get("contractions", [])),
        host_bandwidth=None if host is None else _positive(host["bandwidth"], "host.bandwidth"),
        host_points=() if host is None else _pairs(host.get("points", []), "host.points"),
    )


def _table(doc: Any) -> tuple[tuple[str, float], ...]:
    rows = []
    for i, row in enumerate(_list(doc, "contractions")):
        row = _obj(row, f"contractions[{i}]")
        where = f"contractions[{i}]"
        rows.append(
            (_text(row["call"], f"{where}.call"), _positive(row["seconds"], f"{where}.seconds"))
        )
    return tuple(rows)


def _axis(doc: Any, where: str) -> AxisCalibration:
    doc = _obj(doc, where)
    fits = []
    for kind, entry in _obj(doc["collectives"], f"{where}.collectives").items():
        if kind not in KINDS:
            raise ValueError(f"{where}.collectives: unknown kind {kind!r}; expected one of {KINDS}")
        entry = _obj(entry, f"{where}.collectives.{kind}")
        fits.append(
            CollectiveFit(
                kind=kind,
                latency=_nonnegative(entry["latency"], f"{where}.{kind}.latency"),
                bandwidth=_positive(entry["bandwidth"], f"{where}.{kind}.bandwidth"),
                samples=_pairs(entry.get("samples", []), f"{where}.{kind}.samples"),
            )
        )
    return AxisCalibration(
        name=_text(doc["name"], f"{where}.name"),
        size=_count(doc["size"], f"{where}.size"),
        link=_text(doc["link"], f"{where}.link"),
        collectives=tuple(fits),
        step_latency=_nonnegative(doc["step_latency"], f"{where}.step_latency"),
        bandwidth=_positive(doc["bandwidth"], f"{where}.bandwidth"),
    )


def _curves(doc: Any, where: str) -> tuple[tuple[str, ThroughputCurve], ...]:
    return tuple(
        (str(dtype), ThroughputCurve(_pairs(points, f"{where}.{dtype}")))
        for dtype, points in _obj(doc, where).items()
    )


def _pairs(doc: Any, where: str) -> tuple[tuple[float, float], ...]:
    out = []
    for item in _list(doc, where):
        if not (isinstance(item, list) and len(item) == 2):
            raise ValueError(f"{where}: expected [number, number] pairs, got {item!r}")
        out.append((_number(item[0], where), _number(item[1], where)))
    return tuple(out)


def _obj(doc: Any, where: str) -> dict:
    if not isinstance(doc, dict):
        raise ValueError(f"{where} must be an object, not {type(doc).__name__}")
    return doc


def _list(doc: Any, where: str) -> list:
    if not isinstance(doc, list):
        raise ValueError(f"{where} must be a list, not {type(doc).__name__}")
    return doc


def _text(doc: Any, where: str) -> str:
    if not isinstance(doc, str) or not doc:
        raise ValueError(f"{where} must be a non-empty string, got {doc!r}")
    return doc


def _number(doc: Any, where: str) -> float:
    if isinstance(doc, bool) or not isinstance(doc, (int, float)) or not math.isfinite(doc):
        raise ValueError(f"{where} must be a finite number, got {doc!r}")
    return float(doc)


def _positive(doc: Any, where: str) -> float:
    value = _number(doc, where)
    if value <= 0:
        raise ValueError(f"{where} must be > 0, got {value}")
    return value


def _nonnegative(doc: Any, where: str) -> float:
    value = _number(doc, where)
    if value < 0:
        raise ValueError(f"{where} must be >= 0, got {value}")
    return value


def _count(doc: Any, where: str) -> int:
    if isinstance(doc, bool) or not isinstance(doc, int) or doc < 1:
        raise ValueError(f"{where} must be a whole number >= 1, got {doc!r}")
    return doc
