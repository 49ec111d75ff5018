"""Multi-process (multi-host) execution: one plan on every process, and global batches.

Under ``jax.distributed.initialize()`` every process runs the same program on its own devices;
`auto_shard` needs nothing else: `make_mesh` over ``jax.devices()`` spans every process's
devices (jax lists them process by process, so with ``make_mesh({"data": hosts, "model":
per_host})`` each row of the mesh is one process's devices and the inner axis stays on a host),
and the step takes global ``jax.Array``\\ s (`global_batch` builds the batch from each process's
local shard).

Planning is deterministic, so every process arrives at the same plan, but only if every process
traced the same arguments with the same jaxpar/jax and the same mesh. If one did not, its
collectives would not match the others' and the job would hang. `check_plan` (called by
`AutoSharded` after each planning, when the mesh spans more than one process) therefore compares
a `Fingerprint` of (versions, argument signature, mesh, plan) across the mesh's processes through
the coordination service's key-value store, with a timeout, and raises `MultiHostMismatch` on
every process, naming the part that differs and the processes, instead of hanging.

The exchange, for the n-th planning of a mesh's process set (the key is a planning counter, not
the signature, so processes that planned different signatures still meet):

1. the reference process (the lowest process index in the mesh) publishes its fingerprint
   (part hashes) and the readable items behind them;
2. every other process reads the reference's fingerprint (blocking, until the deadline), compares,
   and publishes a report: ok, or the differing parts with the first differing item of each;
3. the reference reads every report (until the deadline; a process that never reports is
   "arrival"), publishes the verdict, and every process raises if the verdict is not clean.

Traffic is O(processes) per planning; nothing is exchanged on later calls of a cached signature.

Limit: only planning is checked. If one process calls with a signature it has not planned while
the others call one they have (a ragged last batch on one host), the others run their cached step
and wait in its first collective; the planning process raises ``"arrival"`` after the timeout.
Let that error end the process (and the job).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import threading
import time
from typing import Any, NoReturn

import jax
import numpy as np
from jax import tree_util
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .._version import __version__
from ..trace.tracing import is_array_leaf

PARTS = ("version", "signature", "mesh", "plan")  # compared in this order
ARRIVAL = "arrival"  # MultiHostMismatch.part when a process never reached the check
DEFAULT_TIMEOUT_S = 300.0  # how long a process waits for the others to finish planning
TIMEOUT_ENV = "JAXPAR_PLAN_CHECK_TIMEOUT_S"  # overrides DEFAULT_TIMEOUT_S
_KEY_ROOT = "jaxpar/plan_check"
_GRACE_S = 5.0  # extra wait for the verdict: the reference publishes it after its own deadline
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")  # object addresses in reprs differ per process


class MultiHostMismatch(RuntimeError):
    """Processes of one multi-process job planned a step differently (or one never planned it).

    Raised on every process of the mesh, within the check's timeout, instead of hanging in a
    collective. ``part``: the first part that differs, in the order of `PARTS` (``"version"``,
    ``"signature"``, ``"mesh"``, ``"plan"``), or ``"arrival"`` when a process did not reach the
    check in time. ``processes``: {process index: the parts it differs in from the reference
    process (or ``("arrival",)``)}. ``check``: the planning counter of the exchange.
    After an ``"arrival"`` failure the processes' counters disagree: end the job.
    """

    def __init__(self, message: str, *, part: str, processes: dict[int, tuple[str, ...]], check):
        super().__init__(message)
        self.part = part
        self.processes = processes
        self.check = check


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    """What every process of a job must agree on before running a planned step.

    ``items``: per part of `PARTS`, the canonical lines it hashes (readable: a mismatch message
    quotes the first differing line); ``parts``: per part, its sha256 (hex); ``digest``: one
    short hash of all parts, to log or compare by eye.
    """

    items: dict[str, tuple[str, ...]]

    @property
    def parts(self) -> dict[str, str]:
        return {p: _sha("\n".join(self.items[p])) for p in PARTS}

    @property
    def digest(self) -> str:
        return _sha("\n".join(f"{p}={h}" for p, h in self.parts.items()))[:16]


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _canon(value: Any) -> str:
    return _ADDRESS.sub(" at 0x…", repr(value))


def fingerprint(plan: Any, args: tuple) -> Fingerprint:
    """The `Fingerprint` of ``plan``, planned for the step arguments ``args``.

    - version: jaxpar, jax and jaxlib versions;
    - signature: the arguments' tree structure, each array leaf's shape and dtype and each static
      leaf's value (what `trace.Signature` caches on; reprs without object addresses);
    - mesh: axis names and sizes, the device ids and their processes;
    - plan: strategy, objective, each node's configuration, each argument's and result's
      PartitionSpec.
    """
    version = (f"jaxpar {__version__}", f"jax {jax.__version__}", f"jaxlib {_jaxlib_version()}")

    with_path, treedef = tree_util.tree_flatten_with_path(args, is_leaf=lambda x: x is None)
    signature = [f"tree {_canon(treedef)}"]
    array_paths = []
    for path, leaf in with_path:
        key = tree_util.keystr(path)
        if is_array_leaf(leaf):
            signature.append(f"{key}: {leaf.dtype}{list(leaf.shape)}")
            array_paths.append(key)
        else:
            signature.append(f"{key} = {_canon(leaf)}")

    mesh_lines = [f"axes {plan.mesh_shape}"]
    if isinstance(plan.mesh, Mesh):
        devices = plan.mesh.devices
        ids = np.vectorize(lambda d: d.id, otypes=[int])(devices)
        procs = np.vectorize(lambda d: d.process_index, otypes=[int])(devices)
        mesh_lines += [f"device ids {ids.tolist()}", f"processes {procs.tolist()}"]
    else:
        mesh_lines.append("abstract mesh")

    plan_lines = [f"strategy {plan.strategy}", f"objective {plan.options.objective}"]
    for k, index in enumerate(plan.assignment):
        plan_lines.append(f"node {k} ({plan.labels[k]}): #{index} {_canon(plan.config(k))}")
    if len(array_paths) == len(plan.invar_specs):
        in_names = array_paths
    else:  # args given do not match the plan's flat arguments: fall back to indices
        in_names = [f"argument {i}" for i in range(len(plan.invar_specs))]
    for name, spec in zip(in_names, plan.invar_specs, strict=True):
        plan_lines.append(f"in {name}: {plan.partition_spec(spec)}")
    for i, spec in enumerate(plan.outvar_specs):
        plan_lines.append(f"out {i}: {plan.partition_spec(spec)}")

    return Fingerprint(
        {
            "version": version,
            "signature": tuple(signature),
            "mesh": tuple(mesh_lines),
            "plan": tuple(plan_lines),
        }
    )


def _jaxlib_version() -> str:
    try:
        import jaxlib

        return str(jaxlib.__version__)
    except Exception:  # pragma: no cover - jaxlib always ships with jax
        return "unknown"


def first_difference(
    mine: tuple[str, ...], theirs: tuple[str, ...], names: tuple[str, str] = ("here", "there")
) -> str:
    """A one-line description of where two parts' item lists first differ."""
    me, them = names
    for i, (a, b) in enumerate(zip(mine, theirs, strict=False)):
        if a != b:
            return f"line {i}: {me} has {_short(a)}; {them} has {_short(b)}"
    if len(mine) != len(theirs):
        i = min(len(mine), len(theirs))
        extra, who = (mine[i], me) if len(mine) > i else (theirs[i], them)
        return f"{len(mine)} lines on {me}, {len(theirs)} on {them}; {who} also has {_short(extra)}"
    return "same lines, different hash (should not happen)"


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def compare(
    mine: Fingerprint,
    ref_parts: dict[str, str],
    ref_items: dict | None = None,
    names: tuple[str, str] = ("here", "there"),
) -> dict:
    """{part: description} of the parts of ``mine`` whose hash differs from the reference's.

    ``ref_items`` (the reference's `Fingerprint.items`), when given, lets each description quote
    the first differing line; ``names`` name the two sides in it.
    """
    out = {}
    my_parts = mine.parts
    for part in PARTS:
        if my_parts[part] != ref_parts.get(part):
            if ref_items is not None and part in ref_items:
                out[part] = first_difference(mine.items[part], tuple(ref_items[part]), names)
            else:
                out[part] = "hash differs"
    return out


# ---- the exchange ------------------------------------------------------------------------------

_counter_lock = threading.Lock()
_counters: dict[tuple[int, ...], int] = {}


def mesh_processes(mesh: Any) -> tuple[int, ...]:
    """The sorted process indices of a mesh's devices (``()`` for an abstract mesh)."""
    if not isinstance(mesh, Mesh):
        return ()
    return tuple(sorted({int(d.process_index) for d in mesh.devices.flat}))


def _client() -> Any:
    """The coordination service client of ``jax.distributed`` (None if not initialized).

    jax has no public accessor; `jax.experimental.multihost_utils` reads the same object.
    """
    from jax._src import distributed as _distributed

    return _distributed.global_state.client


def timeout_s() -> float:
    """The check's timeout: ``$JAXPAR_PLAN_CHECK_TIMEOUT_S`` or `DEFAULT_TIMEOUT_S` (300 s)."""
    value = os.environ.get(TIMEOUT_ENV)
    return float(value) if value else DEFAULT_TIMEOUT_S


def check_plan(
    plan: Any,
    args: tuple,
    *,
    timeout: float | None = None,
    client: Any = None,
    process_index: int | None = None,
) -> Fingerprint | None:
    """Check that every process of ``plan``'s mesh planned the same; raise `MultiHostMismatch`.

    A no-op returning None unless the plan's mesh has devices of more than one process. Otherwise
    exchanges `fingerprint(plan, args)` through the ``jax.distributed`` key-value store (see the
    module docstring) and returns it when every process agrees. Every process of the mesh must
    call this once per planning, in the same order (`AutoSharded` does, after each `make_plan`).
    ``timeout`` (seconds, default `timeout_s()`) bounds the wait for the slowest process;
    ``client`` / ``process_index`` default to ``jax.distributed``'s and ``jax.process_index()``
    (tests pass an in-memory store).
    """
    procs = mesh_processes(plan.mesh)
    if len(procs) < 2:
        return None
    client = _client() if client is None else client
    if client is None:
        raise RuntimeError(
            "the mesh spans several processes but jax.distributed is not initialized; call "
            "jax.distributed.initialize() first"
        )
    me = jax.process_index() if process_index is None else process_index
    fp = fingerprint(plan, args)
    with _counter_lock:
        n = _counters.get(procs, 0)
        _counters[procs] = n + 1
    exchange(client, fp, me, procs, n, timeout_s() if timeout is None else timeout)
    return fp


def _group_tag(procs: tuple[int, ...]) -> str:
    text = ",".join(map(str, procs))
    return text if len(text) <= 40 else _sha(text)[:16]


def _is_timeout(err: Exception) -> bool:
    text = str(err)
    return "DEADLINE_EXCEEDED" in text or "timed out" in text.lower()


def _get(client: Any, key: str, deadline: float) -> str | None:
    """The value at ``key``, waiting until ``deadline`` (time.monotonic); None on timeout."""
    ms = max(1, int((deadline - time.monotonic()) * 1000))
    try:
        return client.blocking_key_value_get(key, ms)
    except Exception as err:
        if _is_timeout(err):
            return None
        raise


def exchange(
    client: Any, fp: Fingerprint, me: int, procs: tuple[int, ...], n: int, timeout: float
) -> None:
    """Run one check (number ``n``) among ``procs`` through ``client``; raise on disagreement.

    ``client`` needs ``key_value_set(key, value)`` and ``blocking_key_value_get(key, timeout_ms)``
    (raising an error whose text says DEADLINE_EXCEEDED or "timed out" on timeout), as
    ``jax.distributed``'s client has.
    """
    start = time.monotonic()
    deadline = start + timeout
    root = f"{_KEY_ROOT}/{_group_tag(procs)}/{n}"
    ref = procs[0]
    label = f"plan check #{n} among processes {list(procs)}"
    if me == ref:
        client.key_value_set(f"{root}/items", json.dumps(fp.items))  # before the fingerprint
        client.key_value_set(f"{root}/fingerprint", json.dumps(fp.parts))
        processes: dict[int, tuple[str, ...]] = {}
        lines = []
        for other in procs[1:]:
            got = _get(client, f"{root}/report/{other}", deadline)
            if got is None:
                processes[other] = (ARRIVAL,)
                lines.append(f"process {other} did not reach the check within {timeout:g} s")
                continue
            report = json.loads(got)
            if report:
                processes[other] = tuple(report)
                lines += [f"process {other} differs in the {p}: {d}" for p, d in report.items()]
        verdict = {"processes": {str(k): list(v) for k, v in processes.items()}, "lines": lines}
        client.key_value_set(f"{root}/verdict", json.dumps(verdict))
    else:
        got = _get(client, f"{root}/fingerprint", deadline)
        if got is None:
            _raise(
                label,
                ref,
                {ref: (ARRIVAL,)},
                [f"process {ref} (the reference) did not reach the check within {timeout:g} s"],
                n,
            )
        ref_parts = json.loads(got)
        report = compare(fp, ref_parts)
        if report:  # fetch the readable lines only on a mismatch
            items = _get(client, f"{root}/items", deadline + _GRACE_S)
            names = (f"process {me}", f"process {ref}")
            report = compare(fp, ref_parts, json.loads(items) if items else None, names)
        client.key_value_set(f"{root}/report/{me}", json.dumps(report))
        got = _get(client, f"{root}/verdict", deadline + _GRACE_S)
        if got is None:
            _raise(
                label,
                ref,
                {ref: (ARRIVAL,)},
                [f"process {ref} (the reference) published no verdict within {timeout:g} s"],
                n,
            )
        verdict = json.loads(got)
        processes = {int(k): tuple(v) for k, v in verdict["processes"].items()}
        lines = verdict["lines"]
    if processes:
        _raise(label, ref, processes, lines, n)


def _raise(label: str, ref: int, processes: dict, lines: list[str], n: int) -> NoReturn:
    order = (*PARTS, ARRIVAL)
    part = min((p for parts in processes.values() for p in parts), key=order.index)
    what = {
        "version": "disagree on the jaxpar/jax versions",
        "signature": "disagree on the argument signature (tree structure, shapes, dtypes, "
        "static values)",
        "mesh": "disagree on the mesh (axes or device order)",
        "plan": "disagree on the plan",
        ARRIVAL: "did not all plan this step in time (a process called it with a signature it "
        "had already planned, called something else, or is still busy)",
    }[part]
    raise MultiHostMismatch(
        f"{label}: the processes {what}; running the step would hang in a collective. "
        f"Compared with process {ref} (the reference):\n  "
        + "\n  ".join(lines)
        + "\nEvery process must call the step with the same global arrays (shapes, dtypes) and "
        "static values, with the same jaxpar/jax versions and mesh.",
        part=part,
        processes=processes,
        check=n,
    )


# ---- global batches ----------------------------------------------------------------------------


def global_batch(local_data: Any, mesh: Mesh, spec: Any = None) -> Any:
    """Global ``jax.Array``\\ s from each process's local shard of the batch.

    Wraps ``jax.make_array_from_process_local_data``: every process passes the rows it loaded
    (a pytree of numpy/jax arrays, the same structure and per-process shapes on every process);
    the global batch is their concatenation along the sharded dimension, in process order.
    ``spec``: a PartitionSpec (or a pytree prefix of them) for the global arrays; default:
    dimension 0 split over every mesh axis (``P(mesh.axis_names)``). The usual pattern::

        per_process = global_batch_size // jax.process_count()
        lo = jax.process_index() * per_process
        batch = jaxpar.distributed.global_batch(
            {"tokens": tokens[lo : lo + per_process]}, mesh
        )
        state, metrics = train_step(state, batch)

    On a single process this is just ``jax.device_put`` with that sharding.
    """
    if not isinstance(mesh, Mesh):
        raise TypeError(f"global_batch needs a jax Mesh (jaxpar.make_mesh), not {type(mesh)}")
    if spec is None:
        spec = PartitionSpec(tuple(mesh.axis_names))

    def make(x: Any, s: PartitionSpec) -> jax.Array:
        return jax.make_array_from_process_local_data(NamedSharding(mesh, s), np.asarray(x))

    def under(s: PartitionSpec | None, subtree: Any) -> Any:
        return tree_util.tree_map(lambda x: make(x, s or PartitionSpec()), subtree)

    if isinstance(spec, PartitionSpec):
        return under(spec, local_data)
    return tree_util.tree_map(under, spec, local_data, is_leaf=_is_spec)


def _is_spec(x: Any) -> bool:
    return isinstance(x, PartitionSpec) or x is None


__all__ = [
    "ARRIVAL",
    "DEFAULT_TIMEOUT_S",
    "PARTS",
    "TIMEOUT_ENV",
    "Fingerprint",
    "MultiHostMismatch",
    "check_plan",
    "compare",
    "exchange",
    "fingerprint",
    "global_batch",
    "mesh_processes",
    "timeout_s",
]
