"""The command line end to end: `jaxpar plan` (report, JSON schema, figure), `jaxpar clusters`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from jaxpar import Cluster
from jaxpar.cli import JSON_SCHEMA, main, parse_mesh

pytestmark = pytest.mark.api

STRATEGY_NAMES = ("auto", "data", "model", "owt")


def test_parse_mesh():
    assert parse_mesh("node=4,gpu=4") == {"node": 4, "gpu": 4}
    assert parse_mesh(" data = 8 ") == {"data": 8}
    for bad in ("node4", "node=0", "=4", "a=2,a=2", "a=x"):
        with pytest.raises(ValueError, match="mesh"):
            parse_mesh(bad)


@pytest.fixture(scope="module")
def lenet_all(tmp_path_factory):
    """One `--strategy all` run with JSON and figure, shared by the checks below."""
    out = tmp_path_factory.mktemp("cli")
    json_path, png_path = out / "plan.json", out / "plan.png"
    argv = ["plan", "lenet5", "--mesh", "node=2,gpu=4", "--cluster", "p100", "--batch", "64"]
    argv += ["--strategy", "all", "--json", str(json_path), "--plot", str(png_path)]
    return argv, json_path, png_path


def test_plan_all_prints_comparison_and_layers(lenet_all, capsys):
    argv, json_path, png_path = lenet_all
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "lenet5, batch 64, mesh node=2,gpu=4 (8 devices), cluster p100" in out
    assert "samples/s" in out and "comm MB/step" in out and "vs data" in out
    for name in STRATEGY_NAMES:
        assert any(line.startswith(name) for line in out.splitlines()), name
    assert "auto vs best other" in out
    # the per-layer table has one configuration column per strategy
    conv = next(line for line in out.splitlines() if line.startswith("LeNet5/conv1"))
    assert conv.count("{n=") == 4
    # progress goes to stderr, one line per stage
    for stage in ("model", "trace", "graph", "costs", "search", "json", "plot"):
        assert f"] {stage}" in err, stage

    doc = json.loads(json_path.read_text())
    assert doc["schema"] == JSON_SCHEMA
    assert doc["model"] == "lenet5" and doc["batch"] == 64 and doc["devices"] == 8
    assert doc["mesh"] == {"node": 2, "gpu": 4} and doc["cluster"] == "p100"
    assert set(doc["strategies"]) == set(STRATEGY_NAMES)
    data_step = doc["strategies"]["data"]["cost"]["step_s"]
    for name, entry in doc["strategies"].items():
        cost = entry["cost"]
        assert entry["strategy"] == name
        assert cost["step_s"] > 0 and cost["comm_bytes"] >= 0
        assert cost["step_s"] == pytest.approx(cost["compute_s"] + cost["comm_s"])
        assert entry["throughput"] == pytest.approx(64 / cost["step_s"])
        assert entry["speedup_vs_data"] == pytest.approx(data_step / cost["step_s"])
        assert {"layer", "config", "spec", "t_C", "t_X", "t_S", "bytes"} <= set(entry["layers"][0])
        for c in entry["collectives"]:
            assert {"kind", "axes", "bytes", "reason", "layer"} <= set(c)
        total = sum(c["bytes"] for c in entry["collectives"])
        assert total == pytest.approx(cost["comm_bytes"])
    # the search never loses to a baseline under the cost it reports
    auto = doc["strategies"]["auto"]["cost"]["step_s"]
    assert auto <= min(doc["strategies"][n]["cost"]["step_s"] for n in STRATEGY_NAMES) + 1e-15

    data = png_path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_plan_single_strategy_report(capsys):
    argv = ["plan", "lenet5", "--mesh", "data=4", "--cluster", "p100", "--strategy", "owt"]
    assert main([*argv, "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "jaxpar plan: strategy=owt" in out
    assert "t_C ms" in out and "LeNet5/fc1" in out and "samples/s" in out
    assert err == ""


def test_plan_abstract_4096_devices(capsys):
    """No accelerator and no allocation: a 1,024-node P100 cluster, three mesh axes."""
    argv = ["plan", "lenet5", "--mesh", "pod=16,node=64,gpu=4", "--cluster", "p100"]
    assert main([*argv, "--batch", "4096", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "(4096 devices)" in out
    assert "cluster=p100" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "no_such_net", "--mesh", "a=2"], "unknown model 'no_such_net'"),
        (["plan", "lenet5", "--mesh", "a2"], "expected NAME=SIZE"),
        (["plan", "lenet5", "--mesh", "a=6", "--cluster", "p100"], "6"),
        (["plan", "lenet5", "--mesh", "a=2", "--cluster", "tpu-v9"], "tpu-v9"),
        (["plan", "lenet5", "--mesh", "a=8", "--batch", "12"], "batch 12 does not split"),
    ],
)
def test_plan_bad_input_is_one_clear_line(argv, message, capsys):
    assert main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxpar plan: error:") and message in err
    assert "Traceback" not in err


def test_clusters_lists_presets_with_sources(capsys):
    assert main(["clusters"]) == 0
    out = capsys.readouterr().out
    for name in Cluster.presets():
        assert f"cluster {name!r}" in out
    assert "datasheet" in out and "TFLOP/s" in out and "GB/s" in out


def test_console_module_entry_point():
    """`python -m jaxpar` is the same program (the console script calls the same `main`)."""
    proc = subprocess.run(
        [sys.executable, "-m", "jaxpar", "plan", "lenet5", "--mesh", "data=2", "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "jaxpar plan: strategy=auto" in proc.stdout
