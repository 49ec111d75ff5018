"""Multi-host execution (jaxpar/distributed.py): two processes x 4 CPU devices under
jax.distributed (loopback coordinator, gloo) equal one 8-device process, every process holds the
same plan, and processes that plan differently raise MultiHostMismatch on all of them instead of
hanging. The slow tests run tests/multihost_worker.py in subprocesses (each with its own process
group, killed on timeout); the quick ones check the fingerprint and the exchange in one process
with an in-memory key-value store."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import jax
import jaxpar_zoo as zoo
import numpy as np
import pytest
from helpers import FAST_CODEGEN
from jax.sharding import NamedSharding, PartitionSpec

import jaxpar
from jaxpar.runtime import distributed
from jaxpar.runtime.distributed import MultiHostMismatch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "multihost_worker.py")
RUN_TIMEOUT_S = 100  # all three subprocesses together; the whole run takes ~20 s on 2 cores
CHECK_TIMEOUT_S = 8  # JAXPAR_PLAN_CHECK_TIMEOUT_S in the workers (the "arrival" scenario waits)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill(proc: subprocess.Popen) -> None:
    # SIGKILL the whole group: jax.distributed installs a SIGTERM handler that does not exit
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Run the 2-process job (with the mismatch scenarios) and the 1-process reference."""
    out = tmp_path_factory.mktemp("multihost")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    env.update(
        XLA_FLAGS=FAST_CODEGEN,  # code generation only (conftest.py); the worker adds its devices
        PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""),
        JAXPAR_PLAN_CHECK_TIMEOUT_S=str(CHECK_TIMEOUT_S),
    )
    port = _free_port()
    commands = [
        ["--num-processes", "2", "--process-id", str(i), "--port", str(port), "--mismatch"]
        for i in range(2)
    ] + [["--num-processes", "1"]]
    procs, logs = [], []
    start = time.monotonic()
    try:
        for i, cmd in enumerate(commands):
            log = open(out / f"log_{i}.txt", "w")  # noqa: SIM115 - closed below
            logs.append(log)
            full = [sys.executable, WORKER, *cmd, "--out", str(out)]
            full += ["--watchdog", str(RUN_TIMEOUT_S - 5)]  # a stack dump if a worker hangs
            procs.append(
                subprocess.Popen(
                    full,
                    cwd=ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        for p in procs:
            p.wait(timeout=max(1.0, RUN_TIMEOUT_S - (time.monotonic() - start)))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p in procs:
            if p.poll() is None:
                _kill(p)
        for log in logs:
            log.close()
    elapsed = time.monotonic() - start
    codes = [p.returncode for p in procs]
    if codes != [0, 0, 0]:
        tails = "\n".join(
            f"--- worker {i} (exit {c}):\n" + _tail(out / f"log_{i}.txt")
            for i, c in enumerate(codes)
        )
        pytest.fail(f"multi-host workers failed after {elapsed:.0f} s: exit codes {codes}\n{tails}")
    results = {
        name: json.loads((out / f"result_{name}.json").read_text())
        for name in ("0_of_2", "1_of_2", "0_of_1")
    }
    return results, out, elapsed


def _tail(path, lines=40) -> str:
    text = [
        line
        for line in path.read_text(errors="replace").splitlines()
        if not line.startswith(("I0000", "W0000", "[Gloo]"))
    ]
    return "\n".join(text[-lines:])


@pytest.mark.numerics
@pytest.mark.slow
def test_two_processes_equal_one_process(runs):
    results, out, elapsed = runs
    assert elapsed < RUN_TIMEOUT_S
    p0, p1, single = results["0_of_2"], results["1_of_2"], results["0_of_1"]
    assert p0["process_count"] == p1["process_count"] == 2
    # make_mesh over jax.devices(): each mesh row is one process's devices
    assert p0["mesh_processes"] == [[0, 0, 0, 0], [1, 1, 1, 1]]
    np.testing.assert_allclose(p0["losses"], single["losses"], rtol=1e-5)
    np.testing.assert_allclose(p1["losses"], p0["losses"], rtol=0)
    multi = np.load(out / "params_2.npz")
    ref = np.load(out / "params_1.npz")
    assert sorted(multi.files) == sorted(ref.files) and multi.files
    for key in ref.files:
        a, r = multi[key].astype(np.float64), ref[key].astype(np.float64)
        err = np.linalg.norm(a - r) / max(np.linalg.norm(r), 1e-30)
        assert err <= 1e-5, f"parameter {key}: 2-process run differs from 1-process by {err:.2e}"


@pytest.mark.numerics
@pytest.mark.slow
def test_every_process_holds_the_same_plan(runs):
    results, _, _ = runs
    p0, p1, single = results["0_of_2"], results["1_of_2"], results["0_of_1"]
    assert p0["digest"] == p1["digest"]
    assert p0["parts"] == p1["parts"]
    # the same plan as one 8-device process (the mesh part differs: other device ids)
    assert p0["parts"]["plan"] == single["parts"]["plan"]
    assert p0["parts"]["signature"] == single["parts"]["signature"]
    assert p0["parts"]["mesh"] != single["parts"]["mesh"]


@pytest.mark.numerics
@pytest.mark.slow
def test_mismatched_arguments_raise_on_every_process(runs):
    results, _, _ = runs
    for me in ("0_of_2", "1_of_2"):
        got = results[me]["mismatch"]
        # a different static value in process 1: signature differs, the plan does not
        static = got["static"]
        assert static["part"] == "signature", static
        assert static["processes"] == {"1": ["signature"]}
        assert "'run-1'" in static["message"] and "'run-0'" in static["message"]
        # a different batch shape in process 1: signature (and here the plan) differ
        shape = got["shape"]
        assert shape["part"] == "signature", shape
        assert "signature" in shape["processes"]["1"]
        assert "int32[8, 16]" in shape["message"] and "int32[16, 16]" in shape["message"]
        for case in (static, shape):
            assert case["seconds"] < 5, case  # both processes arrive: no timeout involved
    # the same step afterwards agrees and runs on both
    assert results["0_of_2"]["after_mismatch_loss"] == results["1_of_2"]["after_mismatch_loss"]
    # process 1 never plans: process 0 gives up after the check's timeout
    arrival = results["0_of_2"]["mismatch"]["arrival"]
    assert arrival["part"] == "arrival" and arrival["processes"] == {"1": ["arrival"]}
    assert CHECK_TIMEOUT_S - 1 < arrival["seconds"] < CHECK_TIMEOUT_S + 5


# ---- one process: fingerprints and the exchange over an in-memory store ----------------------


class MemoryStore:
    """The two methods of jax.distributed's client that the exchange uses."""

    def __init__(self):
        self.values: dict[str, str] = {}
        self.cond = threading.Condition()

    def key_value_set(self, key, value, allow_overwrite=False):
        with self.cond:
            assert allow_overwrite or key not in self.values, key
            self.values[key] = value
            self.cond.notify_all()

    def blocking_key_value_get(self, key, timeout_in_ms):
        with self.cond:
            if not self.cond.wait_for(lambda: key in self.values, timeout_in_ms / 1000):
                raise RuntimeError(f"DEADLINE_EXCEEDED: GetKeyValue() timed out with key: {key}")
            return self.values[key]


def _run_exchange(fps: dict[int, distributed.Fingerprint | None], timeout=5.0):
    """Run the exchange in one thread per process (None: that process never arrives)."""
    store, outcome = MemoryStore(), {}
    procs = tuple(sorted(fps))

    def one(me):
        t = time.monotonic()
        try:
            distributed.exchange(store, fps[me], me, procs, 0, timeout)
            outcome[me] = (None, time.monotonic() - t)
        except MultiHostMismatch as err:
            outcome[me] = (err, time.monotonic() - t)

    threads = [threading.Thread(target=one, args=(p,)) for p in procs if fps[p] is not None]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 30)
        assert not t.is_alive()
    return outcome


@pytest.fixture(scope="module")
def mlp_plans():
    ex = zoo.get("mlp", small=True)
    mesh = {"data": 2, "model": 4}
    plan = jaxpar.plan(ex.step, *ex.args, mesh=mesh, cluster="p100")
    again = jaxpar.plan(ex.step, *ex.args, mesh=mesh, cluster="p100")
    return ex, plan, again


@pytest.mark.api
def test_fingerprint_is_deterministic_and_names_the_part(mlp_plans):
    ex, plan, again = mlp_plans
    fp = distributed.fingerprint(plan, ex.args)
    assert fp.parts == distributed.fingerprint(again, ex.args).parts
    assert len(fp.digest) == 16
    # the same plan with other arguments: only the signature differs
    state, batch = ex.args
    wider = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct((x.shape[0] * 2, *x.shape[1:]), x.dtype), batch
    )
    other = distributed.fingerprint(plan, (state, wider))
    assert distributed.compare(other, fp.parts) == {"signature": "hash differs"}
    diff = distributed.compare(other, fp.parts, fp.items, ("process 1", "process 0"))
    assert diff["signature"].startswith("line ") and "process 1 has" in diff["signature"]
    # a baseline plan of the same step: the plan part differs
    data = distributed.fingerprint(plan.variant("data"), ex.args)
    assert set(distributed.compare(data, fp.parts)) == {"plan"}
    # object addresses in static reprs do not count
    assert distributed._canon(lambda: 0).count("0x…") == 1


@pytest.mark.api
def test_exchange_agrees_and_disagrees_on_every_process(mlp_plans):
    ex, plan, _ = mlp_plans
    fp = distributed.fingerprint(plan, ex.args)
    other = distributed.fingerprint(plan.variant("data"), ex.args)
    ok = _run_exchange({0: fp, 1: fp, 2: fp})
    assert all(err is None for err, _ in ok.values())
    bad = _run_exchange({0: fp, 1: fp, 2: other})
    assert set(bad) == {0, 1, 2}
    for err, seconds in bad.values():
        assert isinstance(err, MultiHostMismatch) and isinstance(err, RuntimeError)
        assert err.part == "plan" and err.processes == {2: ("plan",)}
        assert "process 2 differs in the plan" in str(err) and seconds < 2
    # the reference itself differs from everyone: every other process is reported
    ref_bad = _run_exchange({0: other, 1: fp, 2: fp})
    assert all(err.processes == {1: ("plan",), 2: ("plan",)} for err, _ in ref_bad.values())


@pytest.mark.api
def test_exchange_times_out_when_a_process_never_arrives(mlp_plans):
    ex, plan, _ = mlp_plans
    fp = distributed.fingerprint(plan, ex.args)
    missing_other = _run_exchange({0: fp, 1: fp, 2: None}, timeout=0.5)
    for err, seconds in missing_other.values():
        assert err.part == "arrival" and err.processes == {2: ("arrival",)} and seconds < 3
    missing_ref = _run_exchange({0: None, 1: fp, 2: fp}, timeout=0.5)
    for err, seconds in missing_ref.values():
        assert err.part == "arrival" and err.processes == {0: ("arrival",)} and seconds < 3


@pytest.mark.api
def test_single_process_is_unchanged():
    mesh = jaxpar.make_mesh({"data": 2, "model": 4})
    assert distributed.mesh_processes(mesh) == (0,)
    ex = zoo.get("mlp", small=True)
    step = jaxpar.auto_shard(ex.step, mesh=mesh, cluster="p100")
    state, batch = ex.make_args(0)
    step.lower(state, batch)
    assert distributed.check_plan(step.plan, (state, batch)) is None  # one process: no exchange
    local = {"x": np.arange(32, dtype=np.float32).reshape(8, 4)}
    got = distributed.global_batch(local, mesh)
    assert got["x"].sharding == NamedSharding(mesh, PartitionSpec(("data", "model")))
    np.testing.assert_array_equal(np.asarray(got["x"]), local["x"])
    got = distributed.global_batch(local, mesh, {"x": PartitionSpec("data")})
    assert got["x"].sharding.spec == PartitionSpec("data")
