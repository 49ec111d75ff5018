"""Calibration: the fits and curves against closed forms, the file format, the calibrated cost
model, and `jaxpar calibrate` end to end on the simulated CPU devices."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import jaxpar_zoo as zoo
import numpy as np
import pytest

import jaxpar
from jaxpar.cli.main import main
from jaxpar.cost.node_costs import compute_times
from jaxpar.hardware import Cluster, mesh_axes
from jaxpar.hardware.calibration import (
    AxisCalibration,
    Calibration,
    CollectiveFit,
    ThroughputCurve,
    fit_alpha_beta,
    fit_axis,
    load_calibration,
)
from jaxpar.hardware.collectives import KINDS, PERMUTE, result_bytes_sent, transfer_time
from jaxpar.trace.meshes import describe_mesh, resolve_cluster

ROOT = Path(__file__).resolve().parents[1]
H100 = "NVIDIA H100 80GB HBM3"


def synthetic(
    rate: float = 1e12,
    platform: str = "cpu",
    kind: str = "cpu",
    devices: int = 8,
    axes: tuple[AxisCalibration, ...] = (),
    kernel_overhead: float | None = 0.0,
    host_bandwidth: float | None = None,
) -> Calibration:
    """A calibration whose matmul and conv curves run at `rate` at every size."""
    flat = ThroughputCurve(((1e3, rate), (1e15, rate)))
    return Calibration(
        platform=platform,
        device_kind=kind,
        num_devices=devices,
        date="2026-01-02",
        jax_version="0.10.2",
        matmul=(("float32", flat),),
        conv=(("float32", flat),),
        memory_bandwidth=1e20,  # compute-bound everywhere: t_C = FLOPs / rate
        memory_points=((1e6, 1e20),),
        memory_bytes=64e9,
        axes=axes,
        kernel_overhead=kernel_overhead,
        host_bandwidth=host_bandwidth,
        host_points=()
        if host_bandwidth is None
        else ((1e6, host_bandwidth / 2), (1e8, host_bandwidth)),
    )


def axis(name: str, size: int, link: str, step_latency: float, bandwidth: float):
    fit = CollectiveFit(PERMUTE, step_latency, bandwidth, ((1e3, 1e-5), (1e6, 1e-4)))
    return AxisCalibration(name, size, link, (fit,), step_latency, bandwidth)


# ---- fits and curves: closed forms --------------------------------------------------------------


@pytest.mark.closed_form
def test_alpha_beta_fit_recovers_known_parameters():
    alpha, beta = 7e-6, 40e9
    sizes = np.geomspace(1e3, 1e9, 12)
    fit_a, fit_b = fit_alpha_beta(sizes, alpha + sizes / beta)
    assert fit_a == pytest.approx(alpha, rel=1e-6)
    assert fit_b == pytest.approx(beta, rel=1e-6)
    noise = 1 + 0.01 * np.random.default_rng(0).standard_normal(sizes.size)  # 1 % noise
    fit_a, fit_b = fit_alpha_beta(sizes, (alpha + sizes / beta) * noise)
    assert fit_b == pytest.approx(beta, rel=0.03)


@pytest.mark.closed_form
def test_alpha_beta_fit_stays_nonnegative():
    # times that fall with size (noise): no negative bandwidth, the best rate seen instead
    sizes, times = np.array([1e3, 1e4, 1e5]), np.array([3e-5, 2e-5, 1e-5])
    alpha, beta = fit_alpha_beta(sizes, times)
    assert alpha >= 0 and beta == pytest.approx(1e5 / 1e-5)
    # a line through a negative intercept: α clamps to 0, the slope through the origin
    sizes = np.array([1e6, 2e6, 3e6])
    alpha, beta = fit_alpha_beta(sizes, sizes / 1e9 - 1e-4)
    assert alpha == 0.0
    assert beta == pytest.approx(float(sizes @ sizes / (sizes @ (sizes / 1e9 - 1e-4))))


@pytest.mark.closed_form
def test_axis_fit_recovers_the_cost_models_link():
    """Samples made with the cost model's own formula give back its latency and bandwidth."""
    n, latency, bandwidth = 4, 3e-6, 25e9
    samples = {}
    for kind in KINDS:
        points = []
        for buffer in (4e3, 4e5, 4e7):
            sent = result_bytes_sent(kind, n, buffer)
            points.append((sent, transfer_time(kind, sent, n, bandwidth, latency)))
        samples[kind] = points
    fit_latency, fit_bandwidth = fit_axis(samples, n)
    assert fit_latency == pytest.approx(latency, rel=1e-6)
    assert fit_bandwidth == pytest.approx(bandwidth, rel=1e-6)


@pytest.mark.closed_form
def test_throughput_curve_interpolates_in_log_space():
    curve = ThroughputCurve(((1e6, 1e9), (1e10, 1e13), (1e8, 1e11)))  # sorted on construction
    assert [f for f, _ in curve.points] == [1e6, 1e8, 1e10]
    assert curve.peak == 1e13
    rates = curve.rate(np.array([1e6, 1e8, 1e10]))
    assert rates == pytest.approx([1e9, 1e11, 1e13])
    # halfway in log(FLOPs) between two points: the geometric mean of their rates
    assert curve.rate(1e9) == pytest.approx(math.sqrt(1e11 * 1e13))
    # above the largest size: its rate; below the smallest: the smallest's time (rate ∝ FLOPs)
    assert curve.rate(1e14) == pytest.approx(1e13)
    assert 1e3 / curve.rate(1e3) == pytest.approx(1e6 / 1e9)


@pytest.mark.closed_form
def test_calibrated_compute_is_flops_over_the_measured_rate():
    """Compute-bound calibration at rate R: every node's t_C is its FLOPs / R (the matmul
    curve for the contraction, the curve's peak, also R, for its elementwise followers)."""
    rate = 2e11
    ex = zoo.get("mlp", small=True)
    plan = jaxpar.plan(ex.step, *ex.args, mesh={"d": 1}, cluster=synthetic(rate, devices=1))
    assert plan.params.mesh.calibration is not None
    dots = 0
    for node, row in zip(plan.ng.nodes, plan.evaluation.node_rows, strict=True):
        if node.anchor < 0 or plan.program.eqns[node.anchor].primitive != "dot_general":
            continue
        dots += 1
        flops = sum(m.flops for m in node.members if m.eqn >= 0)
        assert row.t_C == pytest.approx(flops / rate, rel=1e-12)
        cfgs = [plan.config(node.index)]
        assert compute_times(plan.ng, node, cfgs, plan.params)[0] == pytest.approx(row.t_C)
    assert dots >= 3


@pytest.mark.closed_form
def test_measured_axes_replace_the_datasheet_links():
    measured = axis("gpu", 8, "nvlink", 2e-6, 300e9)
    cal = synthetic(platform="gpu", kind=H100, axes=(measured,))
    cluster = Cluster.from_calibration(cal, num_devices=16)
    assert cluster.name == "dgx-h100" and cluster.num_devices == 16
    assert cluster.device.peak_flops == tuple(
        sorted({**dict(Cluster.preset("dgx-h100").device.peak_flops), "float32": 1e12}.items())
    )
    assert cluster.source == "measured on NVIDIA H100 80GB HBM3, 2026-01-02"
    axes = mesh_axes(cluster, ("node", "gpu"), (2, 8), None)
    datasheet = mesh_axes(Cluster.preset("dgx-h100", nodes=2), ("node", "gpu"), (2, 8), None)
    assert axes.bandwidth == (datasheet.bandwidth[0], 300e9)
    assert axes.latency == (datasheet.latency[0], 2e-6)
    assert axes.measured_axes == (1,)
    assert axes.link_names[1] == "nvlink (measured)"
    assert axes.group((0, 1))[1] == min(datasheet.bandwidth[0], 300e9)  # slowest member axis
    # another name of the same size over the same link matches; another size does not
    assert mesh_axes(cluster, ("model",), (8,), None).measured_axes == (0,)
    assert mesh_axes(cluster, ("model",), (4,), None).measured_axes == ()


@pytest.mark.api
def test_an_abstract_mesh_gets_whole_nodes_of_the_calibrated_kind():
    cal = synthetic(platform="gpu", kind=H100, devices=1)
    cluster = resolve_cluster(cal, describe_mesh({"node": 3, "gpu": 8}))
    assert cluster.num_devices == 24 and len(cluster.levels) == 2
    assert cluster.calibration == cal


# ---- the file ---------------------------------------------------------------------------------


@pytest.mark.api
def test_json_round_trip(tmp_path):
    cal = synthetic(axes=(axis("a", 2, "shared-memory", 1e-5, 1e9),), host_bandwidth=5e10)
    path = tmp_path / "cal.json"
    cal.save(path)
    assert load_calibration(path) == cal
    doc = json.loads(path.read_text())
    assert doc["format"] == "jaxpar.calibration" and doc["version"] == 4
    assert doc["kernel_overhead"] == 0.0 and doc["host"]["bandwidth"] == 5e10


@pytest.mark.closed_form
def test_a_calibrated_gpu_prices_host_copies_at_the_measured_link():
    """A measured host link replaces the datasheet's (H100: 64 GB/s) on an accelerator; a
    calibration without one (version 3, or a device without pinned host memory) keeps the
    datasheet's; on XLA:CPU the moves are the identity, so its measured copy rate is unused."""
    measured = Cluster.from_calibration(synthetic(platform="gpu", kind=H100, host_bandwidth=5e10))
    assert measured.device.host_bandwidth == 5e10
    assert mesh_axes(measured, ("d",), (8,), None).host_bandwidth == 5e10
    assert Cluster.from_calibration(synthetic(platform="gpu", kind=H100)).device.host_bandwidth == (
        64e9
    )
    cpu = Cluster.from_calibration(synthetic(host_bandwidth=5e9))
    assert cpu.device.host_bandwidth == 0
    doc = synthetic(platform="gpu", kind=H100).to_dict()
    doc["version"] = 3
    del doc["host"]
    assert Calibration.from_dict(doc).host_bandwidth is None


@pytest.mark.api
def test_a_version_1_file_still_loads(tmp_path):
    """Version 1 had no kernel overhead: it loads, and the overhead is the time of its smallest
    measured product (launch-bound); version 2 files carry the measured one."""
    doc = synthetic(rate=1e12, kernel_overhead=None).to_dict()
    doc["version"] = 1
    del doc["kernel_overhead"]
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(doc))
    cal = load_calibration(path)
    assert cal.kernel_overhead is None
    assert cal.measured_kernel_overhead() == pytest.approx(1e3 / 1e12)  # smallest point: 1 kFLOP
    assert synthetic(kernel_overhead=3e-6).measured_kernel_overhead() == 3e-6


@pytest.mark.closed_form
def test_a_calibrated_mesh_prices_kernels_with_the_measured_overhead():
    cluster = Cluster.from_calibration(synthetic(platform="gpu", kind=H100, kernel_overhead=7e-6))
    assert mesh_axes(cluster, ("d",), (8,), None).kernel_overhead == 7e-6


@pytest.mark.closed_form
def test_kernel_count_reads_the_compiled_program():
    """Kernels: instructions outside fused computations and reducers, no parameters,
    constants, tuples or bitcasts."""
    from jaxpar.runtime.calibrate import kernel_count

    hlo = """HloModule m

%fused_computation (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %m = f32[4]{0} multiply(%p, %p)
}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (x: f32[4]) -> f32[] {
  %x = f32[4]{0} parameter(0)
  %f = f32[4]{0} fusion(%x), kind=kLoop, calls=%fused_computation
  %c = f32[] constant(0)
  %r = f32[] reduce(%f, %c), dimensions={0}, to_apply=%add
  ROOT %t = f32[] bitcast(%r)
}
"""
    assert kernel_count(hlo) == 2


@pytest.mark.api
def test_kernel_overhead_is_measured_and_small_on_the_cpu():
    """Two chains of tiny reductions: a positive per-kernel time, well under a millisecond."""
    import jax

    from jaxpar.runtime.calibrate import QUICK, kernel_chain, kernel_count, kernel_overhead

    x = jax.numpy.ones((32,), "float32")
    counts = [kernel_count(kernel_chain(n).lower(x).compile().as_text()) for n in (8, 64)]
    assert counts[1] > counts[0] >= 8
    assert 0 <= kernel_overhead(jax.devices()[0], QUICK) < 1e-3


@pytest.mark.api
@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (lambda d: d.update(version=99), "version 99 is not supported"),
        (lambda d: d.update(format="other"), "format is 'other'"),
        (lambda d: d.pop("matmul"), "missing field 'matmul'"),
        (lambda d: d["memory"].update(bandwidth=-1), "memory.bandwidth must be > 0"),
        (lambda d: d["matmul"].update(float32=[[1, "x"]]), "matmul.float32 must be a finite"),
        (lambda d: d["axes"][0]["collectives"].update(gossip={}), "unknown kind 'gossip'"),
    ],
)
def test_a_bad_file_is_a_clear_value_error(tmp_path, edit, fragment):
    doc = synthetic(axes=(axis("a", 2, "shared-memory", 1e-5, 1e9),)).to_dict()
    edit(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="not a valid jaxpar calibration file") as err:
        load_calibration(path)
    assert fragment in str(err.value)


@pytest.mark.api
def test_not_json_is_a_value_error(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="bad JSON"):
        load_calibration(path)


@pytest.mark.api
def test_calibration_module_imports_no_jax():
    stub = (
        "import sys, types; pkg = types.ModuleType('jaxpar'); "
        f"pkg.__path__ = [{str(ROOT / 'jaxpar')!r}]; sys.modules['jaxpar'] = pkg; "
        "import jaxpar.hardware.calibration; print('jax' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", stub], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# ---- end to end on the simulated devices --------------------------------------------------------


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """`calibrate(quick=True)` on a 2 x 4 mesh of the simulated devices, saved."""
    cal = jaxpar.calibrate({"a": 2, "b": 4}, quick=True)
    path = tmp_path_factory.mktemp("calibration") / "cpu.json"
    cal.save(path)
    return cal, path


@pytest.mark.api
def test_calibrate_measures_every_axis_and_kind(measured):
    cal, path = measured
    assert cal.platform == "cpu" and cal.num_devices == 8 and cal.quick
    assert [(a.name, a.size) for a in cal.axes] == [("a", 2), ("b", 4)]
    for ax in cal.axes:
        assert sorted(f.kind for f in ax.collectives) == sorted(KINDS)
        assert ax.bandwidth > 0 and ax.step_latency >= 0
    assert [d for d, _ in cal.matmul] == ["float32"] and cal.memory_bandwidth > 0
    assert cal.kernel_overhead is not None and cal.kernel_overhead >= 0
    assert len(cal.host_points) == 2 and cal.host_bandwidth == max(r for _, r in cal.host_points)
    assert load_calibration(path) == cal


@pytest.mark.api
def test_plan_with_a_calibration_file_says_measured(measured):
    cal, path = measured
    ex = zoo.get("mlp", small=True)
    plan = jaxpar.plan(ex.step, *ex.args, mesh={"a": 2, "b": 4}, cluster=str(path))
    assert plan.cluster.calibration == cal
    assert plan.mesh_axes.bandwidth == tuple(a.bandwidth for a in cal.axes)
    line = plan.report().splitlines()[1]
    assert line == f"cost numbers: compute: {cal.source}; links: measured (a, b)"
    datasheet = jaxpar.plan(ex.step, *ex.args, mesh={"a": 2, "b": 4}, cluster="cpu")
    assert "compute: datasheet; links: datasheet" in datasheet.report()


@pytest.mark.numerics
def test_auto_shard_runs_with_a_calibration_file(measured):
    _, path = measured
    ex = zoo.get("mlp", small=True)
    mesh = jaxpar.make_mesh({"a": 2, "b": 4})
    step = jaxpar.auto_shard(ex.step, mesh=mesh, cluster=str(path))
    state, batch = ex.make_args(0)
    _, metrics = step(state, batch)
    assert np.isfinite(float(metrics["loss"]))
    assert "measured" in step.plan.report().splitlines()[1]


@pytest.mark.api
def test_cli_calibrate_writes_a_file_plan_reads(tmp_path, capsys):
    out = tmp_path / "cal.json"
    assert main(["calibrate", "--quick", "--mesh", "a=2,b=4", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "axis a=2" in printed and f"wrote {out}" in printed
    assert load_calibration(out).axes[1].size == 4
    argv = ["plan", "mlp", "--small", "--mesh", "a=2,b=4", "--cluster", str(out), "--quiet"]
    assert main(argv) == 0
    assert "links: measured (a, b)" in capsys.readouterr().out


@pytest.mark.api
@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["calibrate", "--quick", "--mesh", "a=x"], "--mesh: mesh axis 'a' has size 'x'"),
        (["calibrate", "--quick", "--mesh", "a=64"], "needs 64 devices"),
        (["calibrate", "--quick", "--out", "/no/such/folder/c.json"], "does not exist"),
        (["plan", "mlp", "--mesh", "a=2", "--cluster", "missing.json"], "no such calibration"),
    ],
)
def test_cli_bad_input_is_one_error_line(argv, fragment, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("jaxpar ") and ": error: " in err[0]
    assert fragment in err[0]


@pytest.mark.api
def test_cli_bad_calibration_file_is_one_error_line(tmp_path, capsys):
    path = tmp_path / "bad.json"
    doc = dataclasses.replace(synthetic()).to_dict()
    doc["version"] = 0
    path.write_text(json.dumps(doc))
    assert main(["plan", "mlp", "--small", "--mesh", "a=2", "--cluster", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "version 0 is not supported" in err[0]
