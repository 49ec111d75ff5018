"""Read the collectives XLA actually emitted out of compiled HLO text, with their ring traffic.

Pure (no jax import; `hlo_text` reads the text itself): `parse_collectives` takes the text of
an optimized HLO module (``jax.stages.Compiled.as_text()``) and returns one `HloCollective` per
collective instruction, with its group size and the bytes each device sends under ring
accounting. The planner's predictions are checked against these.

Ring accounting, for one collective over a group of n devices (S = per-device buffer bytes):

* all-reduce:          2(n-1)/n * S        (S = result bytes)
* all-gather:          (n-1)/n * S_out     (S = result bytes)
* reduce-scatter:      (n-1)/n * S_in = (n-1) * S_out   (S = result bytes)
* all-to-all:          (n-1)/n * S         (S = result bytes, tuple elements summed)
* collective-permute:  S * (fraction of devices whose source differs from their target)

A group of one device sends nothing. A collective inside a ``while`` body runs once per
iteration: `HloCollective.count` is the product of the known trip counts
(``backend_config={"known_trip_count":{"n":"4"}}``) of the loops around it, and byte totals
(`collective_summary`, `fidelity`) count every run.

Formats handled (as printed by jax 0.10 / XLA with the Shardy partitioner):

* replica groups: explicit ``{{0,1,2,3},{4,5,6,7}}`` (``{}`` = one group of every device),
  iota ``[2,4]<=[8]`` / ``[4,2]<=[2,4]T(1,0)``, and mesh axes
  ``mesh['axis_0'=2,'axis_1'=4], device_ids=([2,4]T(1,0)) {'axis_1'}`` with sub-axes
  ``{'axis_0':(2)2}`` (size = the number after the parenthesis) and several axes multiplying.
* async pairs: ``all-gather-start``/``-done``, ``all-reduce-start``/``-done``,
  ``collective-permute-start``/``-done`` and the sugared generic async ops
  (``reduce-scatter-start``, ``all-to-all-start``) are counted once, at the start; an
  un-sugared ``async-start(..), calls=%wrapped`` is counted through the collective inside the
  wrapped computation.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from ..hardware.collectives import ALL_REDUCE, result_bytes_sent
from ..hardware.collectives import KINDS as COLLECTIVE_KINDS
from ..hardware.collectives import PERMUTE as COLLECTIVE_PERMUTE
from .hlo_text import (
    CALLS_RE,
    QUOTED_RE,
    Instruction,
    Shape,
    collective_instructions,
    computation_runs,
    matching_close,
    skip_ws,
)

_ASYNC_SUFFIX = "-start"


@dataclasses.dataclass(frozen=True)
class HloCollective:
    """One collective instruction of a compiled HLO module."""

    kind: str  # one of COLLECTIVE_KINDS
    group_size: int  # devices per replica group (collective-permute: devices in the module)
    buffer_bytes: int  # the S of the ring accounting (per-device result, tuples summed)
    bytes_per_device: float  # bytes each device sends
    shape: str  # result shape without layouts, e.g. "f32[8,64]" or "(f32[1,4], f32[1,4])"
    op_name: str  # metadata op_name, "" when absent
    line: str  # the raw HLO instruction (stripped; continuation lines joined)
    count: int = 1  # runs per execution of the module (known trip counts of enclosing loops)

    @property
    def total_bytes(self) -> float:
        """Bytes each device sends over all runs."""
        return self.bytes_per_device * self.count


def _collective_kind(opcode: str) -> tuple[str, bool] | None:
    """(kind, is_async_start) for a collective opcode; None for anything else (incl. -done)."""
    if opcode in COLLECTIVE_KINDS:
        return opcode, False
    base = opcode.removesuffix(_ASYNC_SUFFIX)
    if opcode.endswith(_ASYNC_SUFFIX) and base in COLLECTIVE_KINDS:
        return base, True
    return None


def _result_shape(kind: str, is_start: bool, shape: Shape) -> Shape:
    """The collective's result part of its printed shape.

    ``all-reduce-start`` has the all-reduce's own shape. Every other ``-start`` prints a tuple
    whose element 1 is the result: ``(operand, result)`` for all-gather, ``(operand, result,
    u32[], u32[])`` for collective-permute, ``((operands), result, ...)`` for the generic async
    wrappers of reduce-scatter and all-to-all.
    """
    if not is_start or kind == ALL_REDUCE:
        return shape
    if shape.elements is not None and len(shape.elements) >= 2:
        return shape.elements[1]
    return shape


# --------------------------------------------------------------------------------------------
# Replica groups
# --------------------------------------------------------------------------------------------

_REPLICA_GROUPS_RE = re.compile(r"(?:^|[\s,])replica_groups=")
_IOTA_RE = re.compile(r"\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")
_MESH_RE = re.compile(r"mesh\[(?P<axes>[^\]]*)\]")
_MAXIMAL_MESH_RE = re.compile(r"maximal_mesh\[[^\]]*\]")
_DEVICE_IDS_RE = re.compile(r"\s*,?\s*device_ids=\(")
_MESH_AXIS_REF_RE = re.compile(r"^'?(?P<name>[^':]+)'?(?::\((?P<pre>\d+)\)(?P<size>\d+))?$")
_PAIRS_RE = re.compile(r"source_target_pairs=\{")
_PAIR_RE = re.compile(r"\{\s*(\d+)\s*,\s*(\d+)\s*\}")
_OP_NAME_RE = re.compile(r'\bop_name="(?P<name>(?:[^"\\]|\\.)*)"')


def _explicit_group_size(text: str, num_devices: int) -> int:
    """``{{0,1},{2,3}}``: size of the first group (all must match); ``{}`` is every device."""
    body = text[1 : matching_close(text, 0, "{", "}")]
    groups = re.findall(r"\{([^{}]*)\}", body)
    if not groups:
        return num_devices
    sizes = {len([d for d in g.split(",") if d.strip()]) for g in groups}
    if len(sizes) != 1:
        raise ValueError(f"replica groups of unequal sizes {sorted(sizes)}: {text[:120]!r}")
    return sizes.pop()


def _iota_group_size(text: str) -> int:
    """``[groups,size]<=[dims]T(perm)``: the second number of the first bracket."""
    match = _IOTA_RE.match(text)
    if match is None:
        raise ValueError(f"malformed iota replica groups: {text[:80]!r}")
    num_groups, size = int(match.group(1)), int(match.group(2))
    total = math.prod(int(d) for d in match.group(3).split(","))
    if num_groups * size != total:
        raise ValueError(f"iota replica groups {num_groups}x{size} do not cover {total} devices")
    return size


def _mesh_axis_sizes(axes_text: str) -> dict[str, int]:
    """``'axis_0'=2,'axis_1'=4`` (names quoted or not) -> {"axis_0": 2, "axis_1": 4}."""
    sizes: dict[str, int] = {}
    for item in axes_text.split(","):
        name, _, size = item.rpartition("=")
        sizes[name.strip().strip("'")] = int(size)
    return sizes


def _mesh_group_size(text: str) -> int:
    """``mesh[...] [, device_ids=(...)] {axes}``: product of the selected (sub-)axis sizes."""
    maximal = _MAXIMAL_MESH_RE.match(text)
    if maximal is not None:
        return 1  # a single-device mesh: every group is one device
    match = _MESH_RE.match(text)
    if match is None:
        raise ValueError(f"malformed mesh replica groups: {text[:80]!r}")
    axis_sizes = _mesh_axis_sizes(match.group("axes"))
    pos = match.end()
    # The device order (iota or a list) only permutes devices; it cannot change group sizes.
    device_ids = _DEVICE_IDS_RE.match(text, pos)
    if device_ids is not None:
        pos = matching_close(text, device_ids.end() - 1, "(", ")") + 1
    pos = skip_ws(text, pos)
    if not text.startswith("{", pos):
        raise ValueError(f"mesh replica groups without an axis list: {text[:120]!r}")
    selected = text[pos + 1 : matching_close(text, pos, "{", "}")]
    size = 1
    for ref in filter(None, (r.strip() for r in selected.split(","))):
        size *= _mesh_axis_ref_size(ref, axis_sizes)
    return size


def _mesh_axis_ref_size(ref: str, axis_sizes: dict[str, int]) -> int:
    """``'axis_1'`` -> full axis size; ``'axis_0':(2)2`` -> sub-axis size (after the paren)."""
    match = _MESH_AXIS_REF_RE.match(ref)
    if match is None or match.group("name") not in axis_sizes:
        raise ValueError(f"unknown mesh axis reference {ref!r} (mesh axes {axis_sizes})")
    if match.group("size") is not None:
        return int(match.group("size"))
    return axis_sizes[match.group("name")]


def replica_group_size(attrs: str, num_devices: int) -> int:
    """Devices per replica group named by the ``replica_groups=`` attribute in ``attrs``.

    With no attribute at all the collective spans every device.
    """
    match = _REPLICA_GROUPS_RE.search(attrs)
    if match is None:
        return num_devices
    text = attrs[match.end() :]
    if text.startswith("{"):
        return _explicit_group_size(text, num_devices)
    if text.startswith("["):
        return _iota_group_size(text)
    if text.startswith(("mesh[", "maximal_mesh[")):
        return _mesh_group_size(text)
    raise ValueError(f"unrecognised replica_groups format: {text[:80]!r}")


def _moving_fraction(attrs: str, num_devices: int) -> float:
    """Fraction of devices that send to a *different* device in ``source_target_pairs``."""
    match = _PAIRS_RE.search(attrs)
    if match is None:
        raise ValueError(f"collective-permute without source_target_pairs: {attrs[:120]!r}")
    body = attrs[match.end() - 1 : matching_close(attrs, match.end() - 1, "{", "}") + 1]
    pairs = [(int(s), int(t)) for s, t in _PAIR_RE.findall(body)]
    if num_devices <= 0:
        return 0.0
    return sum(1 for s, t in pairs if s != t) / num_devices


# --------------------------------------------------------------------------------------------
# Accounting and public API
# --------------------------------------------------------------------------------------------


def ring_bytes_per_device(kind: str, group_size: int, buffer_bytes: int) -> float:
    """Bytes each device sends for one collective with result ``buffer_bytes`` per device.

    `collectives.result_bytes_sent`; for collective-permute the full buffer, which the caller
    scales by the fraction of devices that actually move data (`_moving_fraction`).
    """
    return result_bytes_sent(kind, group_size, buffer_bytes)


def _to_collective(instruction: Instruction, num_devices: int) -> HloCollective | None:
    kind_info = _collective_kind(instruction.opcode)
    if kind_info is None:
        return None
    kind, is_start = kind_info
    result = _result_shape(kind, is_start, instruction.shape)
    if kind == COLLECTIVE_PERMUTE:
        group_size = num_devices
        fraction = _moving_fraction(instruction.attrs, num_devices) if num_devices > 1 else 0.0
        sent = ring_bytes_per_device(kind, group_size, result.nbytes) * fraction
    else:
        group_size = replica_group_size(instruction.attrs, num_devices)
        sent = ring_bytes_per_device(kind, group_size, result.nbytes)
    op_name = _OP_NAME_RE.search(instruction.attrs)
    return HloCollective(
        kind=kind,
        group_size=group_size,
        buffer_bytes=result.nbytes,
        bytes_per_device=sent,
        shape=result.text,
        op_name=op_name.group("name") if op_name else "",
        line=instruction.line,
    )


def _sugared_async_bodies(instructions: list[Instruction]) -> set[str]:
    """Computations wrapped by a collective ``X-start`` that is itself counted.

    XLA normally hides such a wrapped computation when it prints the sugared ``X-start``; if
    it is printed anyway, the collective inside must not be counted a second time.
    """
    bodies: set[str] = set()
    for instruction in instructions:
        kind_info = _collective_kind(instruction.opcode)
        if kind_info is not None and kind_info[1]:
            bodies.update(m.group("name") for m in CALLS_RE.finditer(instruction.attrs))
    return bodies


def parse_collectives(hlo_text: str, num_devices: int) -> list[HloCollective]:
    """Every collective instruction of an HLO module's text, in textual order.

    ``num_devices`` is the number of devices the module runs on (``num_partitions`` times
    ``replica_count``); it sizes ``replica_groups={}`` and collective-permutes.
    """
    instructions = list(collective_instructions(hlo_text))
    skipped = _sugared_async_bodies(instructions)
    runs = computation_runs(hlo_text) if "known_trip_count" in hlo_text else {}
    collectives = []
    for instruction in instructions:
        if instruction.computation in skipped:
            continue
        collective = _to_collective(instruction, num_devices)
        if collective is not None:
            count = runs.get(instruction.computation, 1)
            collectives.append(dataclasses.replace(collective, count=count))
    return collectives


def collective_summary(colls: list[HloCollective]) -> dict[str, dict]:
    """kind -> {"count": int, "bytes_per_device": float} over every run, for the kinds present,
    sorted."""
    summary: dict[str, dict] = {}
    for coll in sorted(colls, key=lambda c: c.kind):
        entry = summary.setdefault(coll.kind, {"count": 0, "bytes_per_device": 0.0})
        entry["count"] += coll.count
        entry["bytes_per_device"] += coll.total_bytes
    return summary


_MODULE_HEADER_RE = re.compile(r"^\s*HloModule\b.*$", re.MULTILINE)


def module_device_count(hlo_text: str) -> int:
    """Devices of a module: ``num_partitions`` x ``replica_count`` from its header (default 1)."""
    header = _MODULE_HEADER_RE.search(hlo_text)
    if header is None:
        raise ValueError("no HloModule header line in the HLO text")
    line = QUOTED_RE.sub("", header.group(0))
    partitions = re.search(r"\bnum_partitions=(\d+)", line)
    replicas = re.search(r"\breplica_count=(\d+)", line)
    return (int(partitions.group(1)) if partitions else 1) * (
        int(replicas.group(1)) if replicas else 1
    )


def compiled_collectives(compiled: Any) -> list[HloCollective]:
    """Collectives of a ``jax.stages.Compiled``, sized by the device count in its HLO header."""
    hlo_text = compiled.as_text()
    if not hlo_text:
        raise ValueError("the compiled object has no HLO text (as_text() returned nothing)")
    return parse_collectives(hlo_text, module_device_count(hlo_text))


def compiled_memory(compiled: Any) -> dict[str, int]:
    """Per-device bytes of a ``jax.stages.Compiled`` as XLA's buffer assignment reports them
    (`memory_analysis()`): arguments, outputs, aliases, temporaries, and their peak."""
    m = compiled.memory_analysis()
    parts = {
        "arguments": m.argument_size_in_bytes,
        "outputs": m.output_size_in_bytes,
        "aliases": m.alias_size_in_bytes,
        "temporaries": m.temp_size_in_bytes,
    }
    parts["peak"] = parts["arguments"] + parts["outputs"] - parts["aliases"] + parts["temporaries"]
    return parts


def compiled_peak_bytes(compiled: Any) -> int:
    """arguments + outputs - aliases + temporaries (`compiled_memory`): what
    `MemoryEstimate.peak` predicts."""
    return compiled_memory(compiled)["peak"]


def predicted_counts(predicted: list) -> dict[str, int]:
    """Collectives per step by kind, as the compiled program should hold them: every run of a
    loop body counted, and all-reduces counted once per combined group (`Collective.group`)."""
    counts: dict[str, int] = {}
    groups: dict[int, int] = {}
    for c in predicted:
        if c.group_size <= 1:
            continue  # a group of one device: no collective
        if c.group >= 0:
            groups[c.group] = c.group_runs or c.count
        else:
            counts[c.kind] = counts.get(c.kind, 0) + c.count
    if groups:
        counts[ALL_REDUCE] = counts.get(ALL_REDUCE, 0) + sum(groups.values())
    return dict(sorted(counts.items()))


@dataclasses.dataclass(frozen=True)
class Fidelity:
    """Predicted collectives of a plan against those in its compiled HLO."""

    predicted_bytes: float  # bytes sent per device, predicted
    hlo_bytes: float  # bytes sent per device, read from the HLO
    predicted_kinds: frozenset[str]
    hlo_kinds: frozenset[str]
    text: str  # both lists, for failure messages
    predicted_counts: dict[str, int] = dataclasses.field(default_factory=dict)  # after combining
    hlo_counts: dict[str, int] = dataclasses.field(default_factory=dict)  # runs per step

    @property
    def relative_error(self) -> float:
        if self.hlo_bytes == 0:
            return 0.0 if self.predicted_bytes == 0 else math.inf
        return abs(self.predicted_bytes - self.hlo_bytes) / self.hlo_bytes

    @property
    def unexpected_kinds(self) -> frozenset[str]:
        """Collective kinds XLA emitted that the plan did not predict."""
        return self.hlo_kinds - self.predicted_kinds

    def ok(self, tolerance: float = 0.10) -> bool:
        close = self.relative_error <= tolerance or abs(self.predicted_bytes - self.hlo_bytes) < 64
        return close and not self.unexpected_kinds

    def counts_ok(self, tolerance: float = 0.10, slack: int = 1) -> bool:
        """Every kind's predicted count (after combining) within ``tolerance`` or ``slack`` of
        the compiled program's."""
        kinds = set(self.predicted_counts) | set(self.hlo_counts)
        for k in kinds:
            p, h = self.predicted_counts.get(k, 0), self.hlo_counts.get(k, 0)
            if abs(p - h) > max(slack, tolerance * h):
                return False
        return True


def fidelity(predicted: list, compiled) -> Fidelity:
    """Compare a plan's predicted collectives (``plan.collectives``) with the compiled program:
    bytes per device per step, and per kind the number of collectives (all-reduces after
    combining)."""
    hlo = compiled_collectives(compiled)
    pred_lines = [
        f"  {c.kind:<18} {c.bytes:>12.0f} B  axes={','.join(c.axes)} {c.tensor} ({c.reason}, "
        f"{c.layer or c.phase})" + (f" [group {c.group}]" if c.group >= 0 else "")
        for c in predicted
    ]
    hlo_lines = [
        f"  {h.kind:<18} {h.total_bytes:>12.0f} B  n={h.group_size} {h.shape} {h.op_name}"
        + (f" (x{h.count})" if h.count > 1 else "")
        for h in hlo
    ]
    pb = sum(c.bytes for c in predicted)
    hb = sum(h.total_bytes for h in hlo)
    pc = predicted_counts(predicted)
    hc = {k: v["count"] for k, v in collective_summary(hlo).items()}
    text = "\n".join(
        [
            f"predicted ({len(predicted)}, {pb:.0f} B/device; per kind after combining {pc}):",
            *pred_lines,
            f"compiled HLO ({len(hlo)}, {hb:.0f} B/device; per kind {hc}):",
            *hlo_lines,
        ]
    )
    return Fidelity(
        pb, hb, frozenset(c.kind for c in predicted), frozenset(h.kind for h in hlo), text, pc, hc
    )
