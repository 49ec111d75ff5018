"""Reading optimized HLO text: shapes and their bytes, instructions (continuation lines joined,
tagged with their computation), and how many times one execution runs each computation.

Pure text parsing (no jax import); `verify` reads the collectives out of it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator

# Bits per element; sub-byte types are packed, so sizes are rounded up per array.
_ELEMENT_BITS: dict[str, int] = {
    "pred": 8, "s8": 8, "u8": 8,
    "s1": 1, "u1": 1, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "f4e2m1fn": 4,
    "f16": 16, "bf16": 16, "s16": 16, "u16": 16,
    "f32": 32, "s32": 32, "u32": 32,
    "f64": 64, "s64": 64, "u64": 64, "c64": 64,
    "c128": 128,
    # Tokens and opaque handles carry no data.
    "token": 0, "opaque": 0,
}  # fmt: skip


# --------------------------------------------------------------------------------------------
# Shapes
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Shape:
    """A parsed HLO shape: an array, or a tuple of shapes (``elements`` is not None)."""

    text: str
    nbytes: int
    elements: tuple[Shape, ...] | None = None


_ARRAY_RE = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\]")
_WS_RE = re.compile(r"\s*")


def _element_bits(dtype: str) -> int:
    """Bits per element of an HLO primitive type (every f8 variant is one byte)."""
    if dtype.startswith("f8"):
        return 8
    if dtype not in _ELEMENT_BITS:
        raise ValueError(f"unknown HLO element type {dtype!r}")
    return _ELEMENT_BITS[dtype]


def _dim_size(dim: str) -> int:
    """Size of one dimension; a bounded dynamic ``<=8`` is counted at its bound."""
    dim = dim.strip().removeprefix("<=")
    if not dim.isdigit():
        raise ValueError(f"cannot size HLO dimension {dim!r}")
    return int(dim)


def skip_ws(text: str, pos: int) -> int:
    match = _WS_RE.match(text, pos)
    return match.end() if match else pos


def matching_close(text: str, pos: int, open_ch: str, close_ch: str) -> int:
    """Index of the bracket closing the one at ``pos`` (brackets inside quotes are ignored)."""
    depth = 0
    in_quote = False
    for i in range(pos, len(text)):
        ch = text[i]
        if ch == '"' and (i == 0 or text[i - 1] != "\\"):
            in_quote = not in_quote
        elif in_quote:
            continue
        elif ch == open_ch:
            depth += 1
        elif ch == close_ch:
            depth -= 1
            if depth == 0:
                return i
    raise ValueError(f"unbalanced {open_ch!r} in HLO text: {text[pos : pos + 80]!r}")


def _parse_array(text: str, pos: int) -> tuple[Shape, int]:
    match = _ARRAY_RE.match(text, pos)
    if match is None:
        raise ValueError(f"expected an HLO shape at {text[pos : pos + 40]!r}")
    dtype, dims_text = match.groups()
    pos = match.end()
    # Skip the layout, e.g. {1,0} or {1,0:T(8,128)S(1)}; it does not change the byte count.
    if pos < len(text) and text[pos] == "{":
        pos = matching_close(text, pos, "{", "}") + 1
    dims = [_dim_size(d) for d in dims_text.split(",")] if dims_text.strip() else []
    nbytes = (math.prod(dims) * _element_bits(dtype) + 7) // 8
    return Shape(f"{dtype}[{dims_text.replace(' ', '')}]", nbytes), pos


def _parse_tuple(text: str, pos: int) -> tuple[Shape, int]:
    elements: list[Shape] = []
    pos = skip_ws(text, pos + 1)
    if text.startswith(")", pos):
        return Shape("()", 0, ()), pos + 1
    while True:
        element, pos = _parse_shape(text, pos)
        elements.append(element)
        pos = skip_ws(text, pos)
        if text.startswith(",", pos):
            pos += 1
        elif text.startswith(")", pos):
            pos += 1
            break
        else:
            raise ValueError(f"malformed HLO tuple shape near {text[pos : pos + 40]!r}")
    shape_text = "(" + ", ".join(e.text for e in elements) + ")"
    return Shape(shape_text, sum(e.nbytes for e in elements), tuple(elements)), pos


def _parse_shape(text: str, pos: int) -> tuple[Shape, int]:
    """Parse the shape starting at ``pos``; returns it and the index just past it."""
    pos = skip_ws(text, pos)
    if text.startswith("(", pos):
        return _parse_tuple(text, pos)
    return _parse_array(text, pos)


def shape_bytes(shape_text: str) -> int:
    """Bytes of an HLO shape text, tuples summed: ``shape_bytes("(f32[2], bf16[4])") == 16``."""
    return _parse_shape(_strip_comments(shape_text), 0)[0].nbytes


# --------------------------------------------------------------------------------------------
# Instructions and computations
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Instruction:
    name: str
    shape: Shape
    opcode: str
    attrs: str  # everything after the operand list
    line: str
    computation: str  # name of the enclosing computation ("" outside any)


_INSTR_RE = re.compile(r"^(?:ROOT\s+)?%?(?P<name>[^\s=(){}]+)\s*=\s*")
_OPCODE_RE = re.compile(r"\s*(?P<opcode>[a-z][a-z0-9\-]*)\(")
_HEADER_RE = re.compile(r"^(?:ENTRY\s+)?%?(?P<name>[^\s(){}]+)")
_INDEX_COMMENT_RE = re.compile(r"/\*index=\d+\*/")
QUOTED_RE = re.compile(r'"(?:[^"\\]|\\.)*"')
CALLS_RE = re.compile(r"\bcalls=%?(?P<name>[^\s,{}()]+)")
# Cheap filter on the unquoted text: an opcode follows the shape after a space, while operand
# names follow "%" or "(", so only lines that call a collective opcode are parsed in full.
_CANDIDATE_RE = re.compile(
    r"\s(?:all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?:-start)?\("
)
# Joining stops after this many physical lines, so that a stray bracket cannot swallow the
# rest of the module (and the collectives in it) into one "instruction".
_MAX_JOINED_LINES = 64


def _strip_comments(text: str) -> str:
    """Drop the ``/*index=5*/`` markers XLA inserts into long tuples and operand lists."""
    return _INDEX_COMMENT_RE.sub("", text)


def _bracket_depth(text: str) -> int:
    unquoted = QUOTED_RE.sub("", text)
    opens = sum(unquoted.count(ch) for ch in "({[")
    closes = sum(unquoted.count(ch) for ch in ")}]")
    return opens - closes


def logical_lines(hlo_text: str) -> Iterator[str]:
    """Stripped lines, with an instruction split over several lines joined back into one."""
    pending = ""
    joined = 0
    for raw in hlo_text.splitlines():
        line = raw.strip()
        pending = f"{pending} {line}" if pending else line
        joined += 1
        # An instruction goes on while a bracket is open or its last attribute ends in ",".
        unfinished = _bracket_depth(pending) > 0 or pending.endswith(",")
        if _INSTR_RE.match(pending) and unfinished and joined < _MAX_JOINED_LINES:
            continue
        if pending:
            yield pending
        pending = ""
        joined = 0
    if pending:
        yield pending


def _parse_instruction(line: str, computation: str) -> Instruction | None:
    """Parse ``%name = shape opcode(operands), attrs``; None for lines that are not one."""
    head = _INSTR_RE.match(line)
    if head is None:
        return None
    # The index comments come after the name, so the head ends at the same offset in ``text``.
    text = _strip_comments(line)
    shape, pos = _parse_shape(text, head.end())
    opcode_match = _OPCODE_RE.match(text, pos)
    if opcode_match is None:
        raise ValueError(f"no opcode after the shape in HLO line: {line!r}")
    close = matching_close(text, opcode_match.end() - 1, "(", ")")
    return Instruction(
        name=head.group("name"),
        shape=shape,
        opcode=opcode_match.group("opcode"),
        attrs=text[close + 1 :],
        line=line,
        computation=computation,
    )


def collective_instructions(hlo_text: str) -> Iterator[Instruction]:
    """Collective-looking instructions of the module, tagged with their computation."""
    computation = ""
    for line in logical_lines(hlo_text):
        if line.startswith("}"):
            computation = ""
            continue
        is_instruction = _INSTR_RE.match(line) is not None
        if not is_instruction and line.endswith("{"):
            header = _HEADER_RE.match(line)
            computation = header.group("name") if header else ""
            continue
        if is_instruction and _CANDIDATE_RE.search(QUOTED_RE.sub("", line)):
            instruction = _parse_instruction(line, computation)
            if instruction is not None:
                yield instruction


_ENTRY_RE = re.compile(r"^ENTRY\s+%?(?P<name>[^\s(){}]+)")
_CALLEE_RE = re.compile(
    r"\b(?P<key>calls|to_apply|condition|body|true_computation|false_computation)="
    r"%?(?P<name>[^\s,{}()]+)"
)
_BRANCHES_RE = re.compile(r"\bbranch_computations=\{(?P<names>[^}]*)\}")
_TRIP_COUNT_RE = re.compile(r'"known_trip_count":\{"n":"(?P<n>\d+)"\}')


def computation_runs(hlo_text: str) -> dict[str, int]:
    """Computation name -> how many times one execution of the module runs it: 1 for the entry,
    a while body its caller's runs times the loop's known trip count (1 when unknown), any
    other callee its caller's runs, summed over call sites."""
    callers: dict[str, list[tuple[str, int]]] = {}
    entry, computation = "", ""
    for line in logical_lines(hlo_text):
        if line.startswith("}"):
            computation = ""
            continue
        if _INSTR_RE.match(line) is None:
            if line.endswith("{"):
                header = _HEADER_RE.match(line)
                computation = header.group("name") if header else ""
                if (m := _ENTRY_RE.match(line)) is not None:
                    entry = m.group("name")
            continue
        unquoted = QUOTED_RE.sub("", line)
        trips = _TRIP_COUNT_RE.search(line)
        for m in _CALLEE_RE.finditer(unquoted):
            factor = int(trips.group("n")) if trips and m.group("key") == "body" else 1
            callers.setdefault(m.group("name"), []).append((computation, factor))
        for m in _BRANCHES_RE.finditer(unquoted):
            for name in m.group("names").split(","):
                callers.setdefault(name.strip().lstrip("%"), []).append((computation, 1))
    runs: dict[str, int] = {}

    def count(name: str, depth: int = 0) -> int:
        if name == entry or name not in callers or depth > 64:
            return 1
        if name not in runs:
            runs[name] = sum(count(c, depth + 1) * f for c, f in callers[name])
        return runs[name]

    return {name: count(name) for name in callers} | {entry: 1}
