"""Plans as artifacts: save a `Plan` as plain JSON, load it back, apply it, export its specs.

**Format** (``"schema": "jaxpar.planfile/2"``; plain JSON, UTF-8, never pickle: loading a file
only parses and validates data, it cannot run code). Top-level fields, all required:

- ``schema``, ``jaxpar_version``, ``jax_version``, ``function`` (the step's name, for reference);
- ``options``: ``strategy``, ``objective``, ``search``, ``batch_argnums`` (null or ints), and
  optionally ``pipelined_loops`` (bool; absent: false, as files written before it);
- ``mesh``: ``axes`` (names, mesh order) and ``sizes``;
- ``signature``: ``treedef`` (``str`` of the arguments' treedef, memory addresses blanked) and
  ``leaves``, per flat argument leaf ``{path, kind: "array", shape, dtype}`` or
  ``{path, kind: "static"}`` (a `Plan` does not keep static values; their effect on the traced
  program is covered by the fingerprint);
- ``program``: ``equations``, ``tensors``, ``nodes`` and ``fingerprint`` (sha256 over every
  equation's primitive, operands, results, literals and simple params, tensor shapes/dtypes, and
  the planning nodes);
- ``assignment``: per planning node, its configuration (per mesh axis, the iteration dim it
  splits or -1; -1 on every axis of size 1, which the planner leaves out);
- ``arguments`` / ``results``: per flat array argument / flat result, ``{path, spec}``, ``spec``
  a list per tensor dim of the mesh-axis names splitting it (what `export_specs` gives);
- ``predicted``: ``cost`` (`PlanCost` fields, null for NaN), ``objective``, ``optimal``,
  ``lower_bound``, ``collectives`` (`Collective` fields) and ``cluster`` (its name), for
  reference.

**Applying** a saved plan (``auto_shard(fn, mesh=..., plan=plan_or_file_or_path)``) is
`plan_reuse`: re-traced, checked against the file, every node pinned, nothing searched.

**Validation**: every problem with a file (not JSON, not UTF-8, truncated, too deep, duplicate
or unknown fields, wrong types, numbers out of range, unknown axis names, inconsistent counts)
and every mismatch at application raises `PlanFileError` (a ValueError) with what is wrong.

Exporting a plan for running without jaxpar is `plan_export`.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import os
import re
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from jax import tree_util
from jax.sharding import PartitionSpec

from .._version import __version__
from ..cost.evaluation import PlanCost
from ..cost.node_costs import OBJECTIVES
from ..nodes.planning_nodes import NodeGraph
from ..program.graph import Program
from ..search.baselines import STRATEGIES
from ..search.options import SEARCHES, PlannerOptions

if TYPE_CHECKING:
    from .plan import Plan

SCHEMA = "jaxpar.planfile/2"
MAX_FILE_BYTES = 256 << 20
MAX_INT = 2**53  # larger integers are not exact in most JSON readers
MAX_AXES, MAX_DEVICES, MAX_DIM = 16, 2**20, 1023
MAX_STR, MAX_TREEDEF = 1 << 16, 1 << 24
MAX_NUMBER = 1e300
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_FINGERPRINT = re.compile(r"sha256:[0-9a-f]{64}")
_COST_FIELDS = tuple(f.name for f in dataclasses.fields(PlanCost))
_COLLECTIVE_FIELDS = {
    "kind": str, "axes": list, "group_size": int, "bytes": float, "time_s": float,
    "tensor": str, "reason": str, "phase": str, "layer": str, "count": int, "group": int,
}  # fmt: skip


class PlanFileError(ValueError):
    """A plan file that cannot be read or applied: malformed, another schema or version, or
    made for another mesh, signature or program than the one it is applied to."""


# ---- writing ---------------------------------------------------------------------------------


def _spec_names(plan: Plan, spec) -> list[list[str]]:
    return [[plan.mesh_axes.names[a] for a in axes] for axes in spec]


def _full_config(plan: Plan, cfg) -> list[int]:
    """A configuration over the planning mesh's axes as one over every axis of the user's mesh
    (-1 on the size-1 axes the planner leaves out): the file's ``assignment`` names the mesh
    the file names."""
    desc = plan.target.mesh
    full = [-1] * len(desc.names)
    for d, a in zip(cfg, desc.planned, strict=True):
        full[a] = d
    return full


def _number(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _leaf_paths(treedef: Any) -> list[str]:
    dummy = tree_util.tree_unflatten(treedef, list(range(treedef.num_leaves)))
    flat = tree_util.tree_flatten_with_path(dummy, is_leaf=lambda x: x is None)[0]
    return [tree_util.keystr(p) for p, _ in flat]


def treedef_text(treedef: Any) -> str:
    """The treedef as text, memory addresses blanked (they differ between processes)."""
    return _ADDRESS.sub("0x?", str(treedef))


def plan_dict(plan: Plan) -> dict[str, Any]:
    """The plan file's content (see the module docstring), as plain JSON data."""
    program, layout = plan.program, plan.arg_layout
    arrays = iter(zip(program.invar_paths, program.invars, strict=True))
    leaves = []
    for path, is_arr in zip(_leaf_paths(layout.arg_treedef), layout.arg_is_array, strict=True):
        if is_arr:
            _, t = next(arrays)
            tensor = program.tensors[t]
            leaves.append(
                {"path": path, "kind": "array", "shape": list(tensor.shape), "dtype": tensor.dtype}
            )
        else:
            leaves.append({"path": path, "kind": "static"})
    opts = plan.options
    cost = plan.cost
    return {
        "schema": SCHEMA, "jaxpar_version": __version__, "jax_version": jax.__version__,
        "function": str(plan.stats.get("function", "")),
        "options": {
            "strategy": opts.strategy, "objective": opts.objective, "search": opts.search,
            "batch_argnums": None if opts.batch_argnums is None else list(opts.batch_argnums),
            "pipelined_loops": opts.pipelined_loops,
        },
        "mesh": {"axes": list(plan.target.mesh.names), "sizes": list(plan.target.mesh.sizes)},
        "signature": {"treedef": treedef_text(layout.arg_treedef), "leaves": leaves},
        "program": {
            "equations": len(program.eqns), "tensors": len(program.tensors),
            "nodes": len(plan.ng.nodes), "fingerprint": fingerprint(program, plan.ng),
        },
        "assignment": [_full_config(plan, plan.config(i)) for i in range(len(plan.ng.nodes))],
        "arguments": [
            {"path": p, "spec": _spec_names(plan, s)}
            for p, s in zip(program.invar_paths, plan.invar_specs, strict=True)
        ],
        "results": [
            {"path": p, "spec": _spec_names(plan, s)}
            for p, s in zip(program.outvar_paths, plan.outvar_specs, strict=True)
        ],
        "predicted": {
            "cost": {k: _number(getattr(cost, k)) for k in _COST_FIELDS},
            "objective": _number(plan.evaluation.objective), "optimal": bool(plan.optimal),
            "lower_bound": _number(plan.lower_bound), "cluster": plan.cluster.name,
            "collectives": [
                {k: (list(v) if k == "axes" else v) for k, v in dataclasses.asdict(c).items()}
                for c in plan.collectives
            ],
        },
    }  # fmt: skip


def _simple(value: Any) -> bool:
    if isinstance(value, (bool, int, float, str, type(None), np.dtype)):
        return True
    if isinstance(value, (tuple, list)):
        return all(_simple(v) for v in value)
    return False


def fingerprint(program: Program, ng: NodeGraph) -> str:
    """sha256 of what the plan's configurations refer to: equations, tensors, planning nodes."""
    h = hashlib.sha256()

    def put(*parts: Any) -> None:
        h.update(repr(parts).encode())

    for t in program.tensors:
        put("T", t.shape, t.dtype)
    put("I", tuple(program.invars), "O", tuple(program.outvars))
    for e in program.eqns:
        params = sorted((k, repr(v)) for k, v in e.params.items() if _simple(v))
        lits = tuple(repr(x) if np.ndim(x) == 0 else "array" for x in e.literals)
        put("E", e.primitive, e.inputs, lits, e.outputs, params)
    for n in ng.nodes:
        put("N", n.anchor, tuple(m.eqn for m in n.members), n.space.sizes, n.space.splittable)
    return "sha256:" + h.hexdigest()


def dumps(plan: Plan) -> str:
    """The plan file's text."""
    return json.dumps(plan_dict(plan), indent=1, allow_nan=False)


def _write(path: str | os.PathLike, text: str) -> None:
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def save(plan: Plan, path: str | os.PathLike) -> None:
    """Write ``plan`` to ``path`` as a plan file (JSON; atomic replace)."""
    _write(path, dumps(plan))


# ---- reading and validating -----------------------------------------------------------------


def _fail(where: str, msg: str) -> None:
    raise PlanFileError(f"plan file: {where}: {msg}")


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind(v: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(v), "null" if v is None else "a number"
    )


def _obj(v: Any, where: str, fields: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
    if not isinstance(v, dict):
        _fail(where, f"expected an object, got {_kind(v)}")
    unknown = sorted(set(v) - set(fields) - set(optional))
    if unknown:
        _fail(where, f"unknown field(s) {[_short(k) for k in unknown[:5]]}; expected {fields}")
    missing = [k for k in fields if k not in v]
    if missing:
        _fail(where, f"missing field(s) {missing}")
    return v


def _int(v: Any, where: str, lo: int = 0, hi: int = MAX_INT) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        _fail(where, f"expected an integer, got {_kind(v)} {_short(v)}")
    if not lo <= v <= hi:
        _fail(where, f"{_short(v)} is out of range [{lo}, {hi}]")
    return v


def _num(v: Any, where: str, nullable: bool = False) -> float | None:
    if v is None and nullable:
        return None
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        _fail(where, f"expected a number, got {_kind(v)} {_short(v)}")
    if not (-MAX_NUMBER <= v <= MAX_NUMBER):  # also NaN; exact for huge integers
        _fail(where, f"{_short(v)} is out of range")
    return float(v)


def _str(v: Any, where: str, maxlen: int = MAX_STR, choices: tuple = ()) -> str:
    if not isinstance(v, str):
        _fail(where, f"expected a string, got {_kind(v)} {_short(v)}")
    if len(v) > maxlen:
        _fail(where, f"string of {len(v)} characters; at most {maxlen}")
    if choices and v not in choices:
        _fail(where, f"{_short(v)} is not one of {choices}")
    return v


def _list(v: Any, where: str, length: int | None = None, maxlen: int = MAX_INT) -> list:
    if not isinstance(v, list):
        _fail(where, f"expected an array, got {_kind(v)}")
    if length is not None and len(v) != length:
        _fail(where, f"expected {length} entries, got {len(v)}")
    if len(v) > maxlen:
        _fail(where, f"{len(v)} entries; at most {maxlen}")
    return v


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise PlanFileError(f"plan file: duplicate field {_short(k)}")
        out[k] = v
    return out


def _finite(text: str) -> float:  # also refuses NaN and Infinity, which JSON does not allow
    x = float(text)
    if not math.isfinite(x):
        raise PlanFileError(f"plan file: number {_short(text)} is out of range")
    return x


SpecNames = tuple[tuple[str, ...], ...]


@dataclasses.dataclass(frozen=True, eq=False)
class PlanFile:
    """A validated plan file: what applying a plan needs, without the function it was made for.

    ``data`` is the file's JSON content; the other fields are parsed views of it.
    """

    data: dict[str, Any]
    options: PlannerOptions
    mesh_names: tuple[str, ...]
    mesh_sizes: tuple[int, ...]
    treedef: str
    leaves: tuple[tuple[str, str, tuple[int, ...] | None, str | None], ...]  # path, kind, ...
    counts: tuple[int, int, int]  # equations, tensors, nodes
    fingerprint: str
    assignment: tuple[tuple[int, ...], ...]
    arguments: tuple[tuple[str, SpecNames], ...]  # (path, spec) per flat array argument
    results: tuple[tuple[str, SpecNames], ...]  # (path, spec) per flat result

    @classmethod
    def from_plan(cls, plan: Plan) -> PlanFile:
        return parse(plan_dict(plan))

    @property
    def mesh(self) -> dict[str, int]:
        return dict(zip(self.mesh_names, self.mesh_sizes, strict=True))

    @property
    def predicted(self) -> dict[str, Any]:
        """The saved cost, collectives, certificate and cluster (for reference)."""
        return copy.deepcopy(self.data["predicted"])

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.data)

    def dumps(self) -> str:
        return json.dumps(self.data, indent=1, allow_nan=False)

    def save(self, path: str | os.PathLike) -> None:
        _write(path, self.dumps())

    def listing(self) -> str:
        """path -> PartitionSpec of every argument and result, one a line."""
        rows = [("argument", p, s) for p, s in self.arguments]
        rows += [("result", p, s) for p, s in self.results]
        return "\n".join(f"{k:8s} {p}: {names_to_pspec(s)}" for k, p, s in rows)


def names_to_pspec(spec: SpecNames) -> PartitionSpec:
    """A spec (per dim, the mesh-axis names splitting it) as a PartitionSpec."""
    entries: list[Any] = [None if not a else a[0] if len(a) == 1 else tuple(a) for a in spec]
    while entries and entries[-1] is None:
        entries.pop()
    return PartitionSpec(*entries)


def _parse_options(v: Any) -> PlannerOptions:
    o = _obj(
        v, "options", ("strategy", "objective", "search", "batch_argnums"), ("pipelined_loops",)
    )
    pipelined = o.get("pipelined_loops", False)
    if not isinstance(pipelined, bool):
        _fail("options.pipelined_loops", f"expected true or false, got {_kind(pipelined)}")
    argnums = o["batch_argnums"]
    if argnums is not None:
        items = _list(argnums, "options.batch_argnums", maxlen=1 << 16)
        argnums = tuple(
            _int(x, f"options.batch_argnums[{i}]", 0, 1 << 16) for i, x in enumerate(items)
        )
    return PlannerOptions(
        strategy=_str(o["strategy"], "options.strategy", choices=STRATEGIES),
        objective=_str(o["objective"], "options.objective", choices=OBJECTIVES),
        search=_str(o["search"], "options.search", choices=SEARCHES),
        compare_searches=False,
        batch_argnums=argnums,
        pipelined_loops=pipelined,
    )


def _parse_mesh(v: Any) -> tuple[tuple[str, ...], tuple[int, ...]]:
    m = _obj(v, "mesh", ("axes", "sizes"))
    names = _list(m["axes"], "mesh.axes", maxlen=MAX_AXES)
    names = tuple(_str(x, f"mesh.axes[{i}]", 256) for i, x in enumerate(names))
    if not names or any(not n for n in names) or len(set(names)) != len(names):
        _fail("mesh.axes", f"{list(names)}: axis names must be non-empty, distinct, at least one")
    sizes = _list(m["sizes"], "mesh.sizes", length=len(names))
    sizes = tuple(_int(x, f"mesh.sizes[{i}]", 1, MAX_DEVICES) for i, x in enumerate(sizes))
    if math.prod(sizes) > MAX_DEVICES:
        _fail("mesh.sizes", f"{math.prod(sizes)} devices; at most {MAX_DEVICES}")
    return names, sizes


def _parse_leaves(v: Any) -> tuple[str, tuple]:
    s = _obj(v, "signature", ("treedef", "leaves"))
    treedef = _str(s["treedef"], "signature.treedef", MAX_TREEDEF)
    leaves = []
    for i, leaf in enumerate(_list(s["leaves"], "signature.leaves")):
        where = f"signature.leaves[{i}]"
        if not isinstance(leaf, dict):
            _fail(where, f"expected an object, got {_kind(leaf)}")
        kind = _str(leaf.get("kind"), f"{where}.kind", choices=("array", "static"))
        if kind == "static":
            leaf = _obj(leaf, where, ("path", "kind"))
            leaves.append((_str(leaf["path"], f"{where}.path"), kind, None, None))
            continue
        leaf = _obj(leaf, where, ("path", "kind", "shape", "dtype"))
        shape = _list(leaf["shape"], f"{where}.shape", maxlen=64)
        shape = tuple(_int(d, f"{where}.shape[{j}]") for j, d in enumerate(shape))
        path, dtype = _str(leaf["path"], f"{where}.path"), _str(leaf["dtype"], f"{where}.dtype", 64)
        leaves.append((path, kind, shape, dtype))
    return treedef, tuple(leaves)


def _parse_spec(v: Any, where: str, rank: int | None, names: tuple[str, ...]) -> SpecNames:
    dims = _list(v, where, length=rank, maxlen=64)
    out, used = [], set()
    for d, axes in enumerate(dims):
        axes = _list(axes, f"{where}[{d}]", maxlen=MAX_AXES)
        for j, a in enumerate(axes):
            _str(a, f"{where}[{d}][{j}]", 256)
            if a not in names:
                _fail(f"{where}[{d}][{j}]", f"mesh axis {_short(a)} does not exist; the mesh "
                      f"axes are {list(names)}")  # fmt: skip
            if a in used:
                _fail(f"{where}[{d}][{j}]", f"mesh axis {a!r} splits two dims of one tensor")
            used.add(a)
        out.append(tuple(axes))
    return tuple(out)


def _parse_path_specs(v: Any, where: str, names, ranks: list[int] | None) -> tuple:
    items = _list(v, where, length=None if ranks is None else len(ranks))
    out = []
    for i, item in enumerate(items):
        item = _obj(item, f"{where}[{i}]", ("path", "spec"))
        rank = None if ranks is None else ranks[i]
        spec = _parse_spec(item["spec"], f"{where}[{i}].spec", rank, names)
        out.append((_str(item["path"], f"{where}[{i}].path"), spec))
    return tuple(out)


def _parse_program(v: Any, assignment: Any, n_axes: int) -> tuple[tuple, str, tuple]:
    p = _obj(v, "program", ("equations", "tensors", "nodes", "fingerprint"))
    counts = tuple(_int(p[k], f"program.{k}") for k in ("equations", "tensors", "nodes"))
    fp = _str(p["fingerprint"], "program.fingerprint", 80)
    if not _FINGERPRINT.fullmatch(fp):
        _fail("program.fingerprint", f"{_short(fp)} is not 'sha256:' and 64 hex digits")
    rows = _list(assignment, "assignment", length=counts[2])
    configs = tuple(
        tuple(_int(d, f"assignment[{i}][{a}]", -1, MAX_DIM)
              for a, d in enumerate(_list(row, f"assignment[{i}]", length=n_axes)))
        for i, row in enumerate(rows)
    )  # fmt: skip
    return counts, fp, configs


def _parse_predicted(v: Any, names: tuple[str, ...]) -> None:
    fields = ("cost", "objective", "optimal", "lower_bound", "cluster", "collectives")
    p = _obj(v, "predicted", fields)
    cost = _obj(p["cost"], "predicted.cost", _COST_FIELDS)
    for k in _COST_FIELDS:
        _num(cost[k], f"predicted.cost.{k}", nullable=True)
    _num(p["objective"], "predicted.objective", nullable=True)
    _num(p["lower_bound"], "predicted.lower_bound", nullable=True)
    if not isinstance(p["optimal"], bool):
        _fail("predicted.optimal", f"expected true or false, got {_kind(p['optimal'])}")
    _str(p["cluster"], "predicted.cluster")
    for i, c in enumerate(_list(p["collectives"], "predicted.collectives")):
        where = f"predicted.collectives[{i}]"
        c = _obj(c, where, tuple(_COLLECTIVE_FIELDS), optional=("group_runs",))
        if "group_runs" in c:  # written since the eighteenth session
            _int(c["group_runs"], f"{where}.group_runs")
        for k, kind in _COLLECTIVE_FIELDS.items():
            if k == "group":  # -1: not an all-reduce
                _int(c[k], f"{where}.{k}", -1)
                continue
            check = {str: _str, int: _int, float: _num, list: _list}[kind]
            check(c[k], f"{where}.{k}")
        for j, a in enumerate(c["axes"]):
            if _str(a, f"{where}.axes[{j}]", 256) not in names:
                _fail(f"{where}.axes[{j}]", f"mesh axis {_short(a)} does not exist")


TOP_FIELDS = (
    "schema", "jaxpar_version", "jax_version", "function", "options", "mesh", "signature",
    "program", "assignment", "arguments", "results", "predicted",
)  # fmt: skip


def parse(data: Any) -> PlanFile:
    """Validate a plan file's JSON data (see the module docstring); `PlanFileError` if bad."""
    if not isinstance(data, dict):
        _fail("top level", f"expected an object, got {_kind(data)}")
    schema = _str(data.get("schema"), "schema", 256)
    if schema != SCHEMA:
        hint = "a newer or older jaxpar" if schema.startswith("jaxpar.planfile/") else "not jaxpar"
        _fail("schema", f"{_short(schema)} is not supported ({hint}); this jaxpar reads {SCHEMA}")
    _obj(data, "top level", TOP_FIELDS)
    for k in ("jaxpar_version", "jax_version", "function"):
        _str(data[k], k, 1024)
    options = _parse_options(data["options"])
    names, sizes = _parse_mesh(data["mesh"])
    treedef, leaves = _parse_leaves(data["signature"])
    counts, fp, configs = _parse_program(data["program"], data["assignment"], len(names))
    ranks = [len(shape) for _, kind, shape, _ in leaves if kind == "array"]
    arguments = _parse_path_specs(data["arguments"], "arguments", names, ranks)
    array_paths = [p for p, kind, _, _ in leaves if kind == "array"]
    for i, ((path, _), expect) in enumerate(zip(arguments, array_paths, strict=True)):
        if path != expect:
            _fail(f"arguments[{i}].path", f"{_short(path)} but the signature says {_short(expect)}")
    results = _parse_path_specs(data["results"], "results", names, None)
    _parse_predicted(data["predicted"], names)
    return PlanFile(
        copy.deepcopy(data), options, names, sizes, treedef, leaves, counts, fp, configs,
        arguments, results,
    )  # fmt: skip


def loads(text: str | bytes) -> PlanFile:
    """Parse and validate a plan file's text (or bytes, which must be UTF-8)."""
    if isinstance(text, (bytes, bytearray)):
        if len(text) > MAX_FILE_BYTES:
            _fail("file", f"{len(text)} bytes; at most {MAX_FILE_BYTES}")
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as err:
            raise PlanFileError(f"plan file: not UTF-8 text ({err})") from None
    if not isinstance(text, str):
        raise PlanFileError(f"plan file: expected text or bytes, got {type(text).__name__}")
    try:
        data = json.loads(
            text, object_pairs_hook=_no_duplicates, parse_float=_finite,
            parse_constant=_finite,
        )  # fmt: skip
    except RecursionError:
        raise PlanFileError("plan file: JSON nested too deeply") from None
    except PlanFileError:
        raise
    except ValueError as err:  # JSONDecodeError, integers of too many digits
        raise PlanFileError(f"plan file: not valid JSON (truncated or corrupted?): {err}") from None
    return parse(data)


def load_plan(path: str | os.PathLike) -> PlanFile:
    """Read and validate a plan file written by `Plan.save`; apply it with
    ``auto_shard(fn, mesh=mesh, plan=loaded)``. Raises `PlanFileError` for a bad file."""
    try:
        with open(os.fspath(path), "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise PlanFileError(f"plan file {os.fspath(path)!r}: cannot read it: {err}") from None
    try:
        return loads(raw)
    except PlanFileError as err:
        raise PlanFileError(f"{os.fspath(path)}: {err}") from None
