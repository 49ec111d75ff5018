"""Closed forms (docs/design.md, "Test tiers"): collective formulas, reshard paths, rules, the
one pricing function shared by the search and the report; the pure core imports no jax."""

import subprocess
import sys
from pathlib import Path

import pytest

from jaxpar.collectives import (
    ALL_GATHER,
    ALL_TO_ALL,
    all_gather_bytes,
    all_reduce_bytes,
    all_to_all_bytes,
    reduce_scatter_bytes,
    transfer_time,
)
from jaxpar.reshard import reshard_path
from jaxpar.rules import reshape_map

pytestmark = pytest.mark.closed_form

ROOT = Path(__file__).resolve().parent.parent


def test_ring_formulas():
    assert all_reduce_bytes(1000, 4) == pytest.approx(2 * 3 / 4 * 1000)
    assert all_gather_bytes(1000, 4) == pytest.approx(750)
    assert reduce_scatter_bytes(1000, 4) == pytest.approx(750)
    assert all_to_all_bytes(1000, 8) == pytest.approx(875)
    assert all_reduce_bytes(1000, 1) == 0
    # alpha-beta: 2(n-1) steps for an all-reduce
    assert transfer_time("all-reduce", 1500, 4, 1e9, 1e-6) == pytest.approx(6e-6 + 1.5e-6)


SIZES = (2, 4)  # axis 0 of size 2, axis 1 of size 4


def test_reshard_free_slice():
    assert [s.kind for s in reshard_path(1024, ((), ()), ((0,), (1,)), SIZES)] == ["slice"] * 2


def test_reshard_gather_and_move():
    # (axis1 on dim0) -> (axis1 on dim1): one all-to-all of the 1/4 shard
    steps = reshard_path(1024, ((1,), ()), ((), (1,)), SIZES)
    assert [s.kind for s in steps] == [ALL_TO_ALL]
    assert steps[0].nbytes == pytest.approx(3 / 4 * 256)
    # (axis0, axis1 on dim0) -> replicated: gather axis1 (to 1/2), then axis0 (to full)
    steps = reshard_path(1024, ((0, 1), ()), ((), ()), SIZES)
    assert [s.kind for s in steps] == [ALL_GATHER, ALL_GATHER]
    assert [s.axis for s in steps] == [1, 0]
    assert steps[0].nbytes == pytest.approx(3 / 4 * 512)
    assert steps[1].nbytes == pytest.approx(1 / 2 * 1024)


def test_reshard_never_permutes_layouts():
    # axis1 -> (axis0, axis1) on the same dim changes which chunk each device holds: the path
    # gathers then slices rather than relying on a collective-permute
    kinds = [s.kind for s in reshard_path(1024, ((1,),), ((0, 1),), SIZES)]
    assert kinds == [ALL_GATHER, "slice", "slice"]


def test_reshape_maps_major_dims():
    op_map, _ = reshape_map((8, 16, 64), (8, 16, 4, 16))  # split the last dim into heads
    assert op_map == (0, 1, 2)
    op_map, _ = reshape_map((8, 16, 4, 16), (128, 64))  # merge batch and length
    assert op_map == (0, None, 1, None)


PURE_CORE = (
    "graph", "opspace", "rules", "rules_indexing", "rules_loops", "nodes", "labels", "configs",
    "collectives", "reshard", "cost", "tables", "blocks", "combine", "overlap",
    "search", "kcut", "baselines", "evaluate", "memory", "budget", "verify", "hardware",
    "hardware.devices",
    "hardware.presets", "hardware.datasheets", "hardware.cluster", "hardware.mesh_model",
    "hardware.speeds", "hardware.calibration",
)  # fmt: skip


def test_pure_core_imports_no_jax():
    code = "import sys; " + "; ".join(f"import jaxpar.{m}" for m in PURE_CORE)
    code += "; print('jax' in sys.modules)"
    # import the modules without the package __init__ (which exposes the jax-facing API)
    stub = (
        "import importlib.util, sys, types, os; pkg = types.ModuleType('jaxpar'); "
        f"pkg.__path__ = [{str(ROOT / 'jaxpar')!r}]; sys.modules['jaxpar'] = pkg; "
    )
    out = subprocess.run([sys.executable, "-c", stub + code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("objective", ["time", "comm"])
@pytest.mark.parametrize(
    ("name", "mesh"),
    [("mlp", {"a": 2, "b": 4}), ("cnn", {"a": 2, "b": 4}), ("gpt_small", {"a": 2, "b": 2, "c": 2})],
)
def test_reported_cost_lies_between_the_two_search_problems(name, mesh, objective):
    """For any assignment: bound objective <= reported cost <= problem objective (equal when
    every shared reshard has its exact table), and the reported cost is Eq. 1's sum (step_s,
    or bytes under "comm")."""
    import numpy as np

    import jaxpar
    import models
    from jaxpar.evaluate import evaluate
    from jaxpar.search import evaluate as search_objective

    ex = models.get(name, small=True)
    plan = jaxpar.plan(ex.step, *ex.args, mesh=mesh, cluster="p100", objective=objective)
    from jaxpar.tables import pairwise_bound

    ctx = plan.eval_context()
    pairwise = pairwise_bound(plan.ng, plan.tables, plan.params)
    rng = np.random.default_rng(0)
    sizes = [len(c) for c in plan.configs]
    assignments = [plan.assignment, *(a for a, _ in plan.choice.baselines.values())]
    assignments += [tuple(int(rng.integers(n)) for n in sizes) for _ in range(8)]
    strict = 0
    for a in assignments:
        ev = evaluate(ctx, a)
        low = search_objective(plan.tables.bound, a)
        high = search_objective(plan.problem, a)
        tol = 1e-9 * max(1.0, abs(high))
        assert low <= ev.objective + tol and ev.objective <= high + tol
        strict += ev.objective < high - tol  # only where shared tables fell back to pairs
        if plan.tables.exact:  # every shared reshard priced exactly: search objective = report
            assert high == pytest.approx(ev.objective, rel=1e-9)
        assert search_objective(pairwise, a) <= low + tol
        total = ev.cost.comm_bytes if objective == "comm" else ev.cost.step_s
        assert total == pytest.approx(ev.objective, rel=1e-9)
    assert plan.tables.problem.factors  # tensors with several readers got one exact table
    if plan.tables.exact:
        assert name == "mlp"  # the case that checks the exact tables against the evaluation
    else:
        assert strict > 0


def test_collective_over_merged_axes_gets_the_merged_ring_bandwidth():
    """4 P100 nodes as node=4 x gpu=4: the 4 node-axis rings share each node's one InfiniBand
    card (12.5/4 GB/s each); one 16-device ring over both axes crosses each card once."""
    from jaxpar import Cluster
    from jaxpar.hardware.mesh_model import mesh_axes

    mesh = mesh_axes(Cluster.preset("p100", nodes=4), ("node", "gpu"), (4, 4), None)
    assert mesh.bandwidth == pytest.approx((12.5e9 / 4, 20e9))
    n, bw, lat = mesh.group((0, 1))
    assert n == 16 and bw == pytest.approx(12.5e9) and lat == pytest.approx(5e-6)
    assert mesh.group((1,))[1] == pytest.approx(20e9)
