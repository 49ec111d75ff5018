"""The command line end to end: `jaxpar plan` (report, JSON schema, figure), `jaxpar clusters`."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from jaxpar.cli.main import JSON_SCHEMA, main, parse_dtype, parse_mesh
from jaxpar.hardware.cluster import Cluster

pytestmark = pytest.mark.api

STRATEGY_NAMES = ("auto", "data", "model", "owt", "fsdp", "fsdp_tp")


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
    assert conv.count("{n=") == len(STRATEGY_NAMES)
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


def test_strategy_all_places_the_report_tables(monkeypatch, capsys):
    """`--strategy all` prints jaxpar.report's phase and state tables, in that order, between
    the comparison and the per-layer table (stand-ins here: their content is report's)."""
    from jaxpar.planner import report

    monkeypatch.setattr(report, "phase_table", lambda plans: "PHASES " + ",".join(plans))
    monkeypatch.setattr(report, "state_table", lambda plans: "STATES " + ",".join(plans))
    argv = ["plan", "lenet5", "--small", "--mesh", "data=2", "--strategy", "all", "--quiet"]
    rc, out, err = run_cli(argv, capsys)
    assert rc == 0, err
    order = ["auto vs best other", "PHASES auto,data,model,owt", "STATES auto,data,model,owt"]
    positions = [out.index(text) for text in [*order, "LeNet5/conv1"]]
    assert positions == sorted(positions)


def test_plan_single_strategy_report(capsys):
    argv = ["plan", "lenet5", "--mesh", "data=4", "--cluster", "p100", "--strategy", "owt"]
    assert main([*argv, "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "jaxpar plan: strategy=owt" in out
    assert "t_C ms" in out and "LeNet5/fc1" in out and "samples/s" in out
    assert err == ""


def test_plan_large_decoder_with_remat_and_scanned_layers(tmp_path, capsys):
    """--remat --scan-layers build a large decoder's blocks rematerialized under one scan, and
    --seq-len sets its tokens per sequence: the title says so, the stacked parameters are
    planned (one ``blocks`` subtree) and the report shows the recomputed blocks.
    --pipelined-loops prices the scan as XLA's collective pipeliner runs it, and says so."""
    import json

    out_json = tmp_path / "plan.json"
    argv = ["plan", "llama3_8b", "--small", "--mesh", "a=2,b=4", "--cluster", "dgx-h100"]
    flags = ["--remat", "--scan-layers", "--seq-len", "32", "--json", str(out_json), "--quiet"]
    rc, out, _ = run_cli([*argv, *flags, "--pipelined-loops"], capsys)
    assert rc == 0
    assert "pipelined loops: each scan's weight gathers run an iteration ahead" in out
    title = "llama3_8b (small), remat, scanned layers, 32 tokens per sequence, batch 16"
    assert out.startswith(title)
    auto = json.loads(out_json.read_text())["strategies"]["auto"]
    assert any("['blocks']" in path for path in auto["in_specs"])
    assert not any("['block0']" in path for path in auto["in_specs"])
    assert any("rematted_computation" in row["layer"] for row in auto["layers"])
    # what was planned: 16 sequences of 32 tokens (16 by default), the blocks scanned
    from jaxpar.cli.arguments import DecoderBuild, zoo_example

    build = DecoderBuild(remat=True, scan=True, seq_len=32)
    ex, batch, _ = zoo_example("llama3_8b", None, True, "float32", 8, build)
    assert batch == 16 and ex.args[1]["tokens"].shape == (16, 32)
    assert ex.config["remat"] and ex.config["scan_layers"]


def test_plan_large_decoder_with_an_offloading_remat_policy(capsys, caplog):
    """--remat-policy builds the blocks rematerialized with one of MaxText's policies (it turns
    --remat on): the title says which; the offloading one plans its moves to the host with no
    replicated fallback."""
    from jaxpar.cli.arguments import DecoderBuild, zoo_example

    argv = ["plan", "llama3_8b", "--small", "--mesh", "a=2,b=4", "--cluster", "dgx-h100"]
    flags = ["--remat-policy", "minimal_offloaded", "--seq-len", "32", "--quiet"]
    import logging

    with caplog.at_level(logging.WARNING, logger="jaxpar"):
        rc, out, _ = run_cli([*argv, *flags], capsys)
    assert rc == 0 and not caplog.records, [r.getMessage() for r in caplog.records]
    assert out.startswith("llama3_8b (small), remat (minimal_offloaded), 32 tokens per sequence")
    build = DecoderBuild(remat=True, seq_len=32, remat_policy="minimal_offloaded")
    ex, _, _ = zoo_example("llama3_8b", None, True, "float32", 8, build)
    assert ex.config["remat"] and ex.config["remat_policy"] == "minimal_offloaded"


def test_plan_mixture_of_experts_by_capacity(capsys):
    """--capacity-factor dispatches a mixture of experts GShard's way: the title says so and
    the experts' layers are dispatch einsums, not grouped matmuls."""
    argv = ["plan", "mixtral_8x7b", "--small", "--mesh", "a=2,b=4", "--cluster", "dgx-h100"]
    rc, out, _ = run_cli([*argv, "--capacity-factor", "1.25", "--quiet"], capsys)
    assert rc == 0
    assert out.startswith("mixtral_8x7b (small), capacity 1.25, batch 16")
    assert "gsec,gsd->egcd" in out


def test_plan_abstract_4096_devices(capsys):
    """No accelerator and no allocation: a 1,024-node P100 cluster, three mesh axes."""
    argv = ["plan", "lenet5", "--mesh", "pod=16,node=64,gpu=4", "--cluster", "p100"]
    assert main([*argv, "--batch", "4096", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "(4096 devices)" in out
    assert "cluster=p100" in out


@pytest.mark.api
def test_plan_for_the_overlapped_step(capsys):
    """``--objective overlap``: the strategies compared by their overlapped steps."""
    rc, out, _ = run_cli(
        ["plan", "lenet5", "--mesh", "node=2,gpu=2", "--objective", "overlap"], capsys
    )
    assert rc == 0
    assert "objective=overlap" in out
    assert "overlap ms" in out and "the plan is the candidate with the shortest one" in out
    argv = [
        "plan",
        "lenet5",
        "--mesh",
        "node=2,gpu=2",
        "--objective",
        "overlap",
        "--strategy",
        "all",
    ]
    rc, out, _ = run_cli(argv, capsys)
    head = [line for line in out.splitlines() if line.startswith("strategy ")]
    assert rc == 0 and head and "overlap ms" in head[0]


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """`main(argv)` in this process: exit status, stdout, stderr."""
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_error_line(argv: list[str], capsys, command: str = "plan") -> str:
    """Bad input: exit status 2, nothing on stdout (nothing was planned), and exactly one line
    on stderr, ``jaxpar <command>: error: ...``, no traceback. Returns that line."""
    rc, out, err = run_cli(argv, capsys)
    assert rc == 2, (rc, err)
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"jaxpar {command}: error: "), err
    assert "Traceback" not in err
    return lines[0]


ZERO_WIDTH_SPACE = "\u200b"

BAD_PLAN_INPUT = [
    # model and cluster names: listed, with the nearest one suggested
    (["no_such_net", "--mesh", "a=2"], ["unknown model 'no_such_net'", "vgg16", "gpt2_124m"]),
    (["VGG16", "--mesh", "a=2"], ["unknown model 'VGG16' (did you mean 'vgg16'?)"]),
    (["vgg16" + ZERO_WIDTH_SPACE, "--mesh", "a=2"], ["unknown model", "did you mean 'vgg16'"]),
    (["ｖｇｇ16", "--mesh", "a=2"], ["unknown model 'ｖｇｇ16' (did you mean 'vgg16'?)"]),
    (["lenet5", "--mesh", "a=2", "--cluster", "tpu-v9"], ["tpu-v9", "p100, dgx-h100"]),
    (["lenet5", "--mesh", "a=2", "--cluster", "P100"], ["did you mean 'p100'?"]),
    # malformed meshes
    (["lenet5", "--mesh", "a2"], ["expected NAME=SIZE"]),
    (["lenet5", "--mesh", ""], ["expected NAME=SIZE"]),
    (["lenet5", "--mesh", "a=4,"], ["expected NAME=SIZE"]),
    (["lenet5", "--mesh", "a=0"], ["mesh axis 'a' has size 0", "at least 1 device"]),
    (["lenet5", "--mesh", "a=2,b=0"], ["mesh axis 'b' has size 0"]),
    (["lenet5", "--mesh", "a=x"], ["mesh axis 'a' has size 'x'", "digits"]),
    (["lenet5", "--mesh", "a=-2"], ["mesh axis 'a' has size '-2'"]),
    (["lenet5", "--mesh", "a=\u0664"], ["digits 0-9"]),  # ARABIC-INDIC DIGIT FOUR
    (["lenet5", "--mesh", "my axis=4"], ["'my axis'", "is not a name"]),
    (["lenet5", "--mesh", "a=2,a=2"], ["appears twice"]),
    (["lenet5", "--mesh", "a=2,b=2,c=2,d=2,e=2,f=1"], ["5 axes larger than 1", "at most 4"]),
    (["lenet5", "--mesh", "a=1000000000"], ["1,000,000,000 devices", "at most 1,048,576"]),
    (["lenet5", "--mesh", "a=2048,b=1024"], ["2,097,152 devices"]),
    # batch
    (
        ["lenet5", "--mesh", "a=8", "--batch", "12", "--strategy", "data"],
        ["--strategy data cannot run at batch 12", "over the 8 devices", "--batch 8 or 16"],
    ),
    (
        ["lenet5", "--mesh", "a=4,b=2", "--batch", "2", "--strategy", "fsdp_tp"],
        ["fsdp_tp cannot run at batch 2", "over the 4 devices", "--batch 4", "--strategy auto"],
    ),
    (["lenet5", "--mesh", "a=4", "--batch", "0"], ["0 is not a batch", "at least 1"]),
    (["lenet5", "--mesh", "a=4", "--batch", "-8"], ["-8 is not a batch"]),
    (["lenet5", "--mesh", "a=4", "--batch", "4.5"], ["'4.5' is not a whole number"]),
    # dtype
    (["lenet5", "--mesh", "a=4", "--dtype", "float17"], ["unknown dtype 'float17'", "bfloat16"]),
    (["lenet5", "--mesh", "a=4", "--dtype", "int32"], ["unknown dtype 'int32'", "float32"]),
    # choices, with the nearest one suggested
    (["lenet5", "--mesh", "a=4", "--strategy", "daat"], ["'daat' (did you mean 'data'?)"]),
    (["lenet5", "--mesh", "a=4", "--strategy", "fast"], ["'fast'", "auto, data, model, owt"]),
    (["lenet5", "--mesh", "a=4", "--objective", "speed"], ["'speed'", "time, comm, overlap"]),
    (["lenet5", "--mesh", "a=4", "--search", "kcuts"], ["did you mean 'kcut'?"]),
    # outputs that cannot be written: found before planning, not after
    (["lenet5", "--mesh", "a=4", "--json", "/no/such/dir/p.json"], ["'/no/such/dir' does not"]),
    (["lenet5", "--mesh", "a=4", "--json", "."], ["is a folder"]),
    (["lenet5", "--mesh", "a=4", "--plot", "/no/such/dir/p.png"], ["'/no/such/dir' does not"]),
    (["lenet5", "--mesh", "a=4", "--plot", "plan.txt"], ["cannot write '.txt'", ".png"]),
    (["lenet5", "--mesh", "a=4", "--plot", "plan"], ["without an extension"]),
    # --remat / --scan-layers: the large decoders only
    (
        ["vgg16", "--mesh", "a=2", "--remat"],
        ["--remat applies to the large decoders", "llama3_8b", "drop the flag"],
    ),
    (
        ["gpt2_124m", "--mesh", "a=2", "--remat", "--scan-layers"],
        ["--scan-layers apply", "drop them"],
    ),
    (
        ["llama3_8b", "--mesh", "a=2", "--capacity-factor", "1.25"],
        ["a mixture of experts", "mixtral_8x7b"],
    ),
    (
        ["mixtral_8x7b", "--mesh", "a=2", "--capacity-factor", "0"],
        ["'0' is not a positive", "--capacity-factor 1.25"],
    ),
    (["mixtral_8x7b", "--mesh", "a=2", "--capacity-factor", "nan"], ["'nan' is not a positive"]),
    (["vgg16", "--mesh", "a=2", "--seq-len", "128"], ["--seq-len applies to the large decoders"]),
    (
        ["llama3_8b", "--mesh", "a=2", "--remat-policy", "minimal_offload"],
        ["unknown --remat-policy 'minimal_offload'", "did you mean 'minimal_offloaded'?"],
    ),
    (["vgg16", "--mesh", "a=2", "--remat-policy", "minimal"], ["--remat-policy applies"]),
    (["llama3_8b", "--mesh", "a=2", "--seq-len", "0"], ["'0' is not a sequence length"]),
    # usage errors: one line too, no usage block
    (["lenet5"], ["required: --mesh", "jaxpar plan --help"]),
    (["lenet5", "--mesh", "a=4", "--bogus"], ["unrecognized arguments: --bogus"]),
]


@pytest.mark.parametrize(
    ("argv", "fragments"), BAD_PLAN_INPUT, ids=[" ".join(argv) for argv, _ in BAD_PLAN_INPUT]
)
def test_plan_bad_input_is_one_clear_line(argv, fragments, capsys):
    line = assert_one_error_line(["plan", *argv, "--quiet"], capsys)
    for fragment in fragments:
        assert fragment in line, (fragment, line)


def test_bad_input_is_one_line_even_with_progress_on(capsys):
    """Without --quiet the checks still run before any progress line is printed."""
    argv = ["plan", "lenet5", "--mesh", "a=8", "--batch", "12", "--strategy", "fsdp"]
    line = assert_one_error_line(argv, capsys)
    assert "does not split" in line


@pytest.mark.parametrize(
    ("argv", "prefix", "fragment"),
    [
        ([], "jaxpar: error:", "required: COMMAND"),
        (["plna"], "jaxpar: error:", "invalid choice: 'plna'"),
        (["clusters", "--bogus"], "jaxpar clusters: error:", "unrecognized arguments"),
        (["demo", "--steps", "0"], "jaxpar demo: error:", "whole number from 1 to 1000"),
        (["demo", "--steps", "-3"], "jaxpar demo: error:", "whole number from 1 to 1000"),
        (["demo", "--models", "cnn"], "jaxpar demo: error:", "unrecognized arguments"),
    ],
)
def test_usage_errors_are_one_line(argv, prefix, fragment, capsys):
    rc, out, err = run_cli(argv, capsys)
    assert rc == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith(prefix) and fragment in err, err


def test_plot_without_matplotlib_fails_before_planning(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises
    png = tmp_path / "out.png"
    argv = ["plan", "vgg16", "--mesh", "gpu=4", "--plot", str(png)]
    line = assert_one_error_line(argv, capsys)  # no --quiet: nothing was started
    assert "matplotlib" in line and 'pip install -e ".[plot]"' in line
    assert not png.exists()


def test_plot_without_matplotlib_in_a_fresh_process(tmp_path):
    """The real program (console entry point's `main`), with matplotlib unimportable."""
    png = tmp_path / "out.png"
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from jaxpar.cli.main import main\n"
        f"sys.exit(main(['plan', 'vgg16', '--mesh', 'gpu=4', '--plot', {str(png)!r}]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""  # the check runs before planning: no table was printed
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("jaxpar plan: error: --plot needs matplotlib")
    assert 'pip install -e ".[plot]"' in proc.stderr
    assert not png.exists()


def test_default_batch_splits_over_the_mesh(tmp_path, capsys):
    """GPT's default batch (8 sequences) cannot split over 16 devices: without --batch the
    command rounds it up to 16 and says so in the title."""
    out_json = tmp_path / "gpt.json"
    argv = ["plan", "gpt2_124m", "--mesh", "data=16", "--json", str(out_json), "--quiet"]
    rc, out, err = run_cli(argv, capsys)
    assert rc == 0, err
    title = out.splitlines()[0]
    assert title.startswith("gpt2_124m, batch 16 (the model's default 8, rounded up to a ")
    assert "throughput" in out and "at batch 16" in out
    assert json.loads(out_json.read_text())["batch"] == 16


def test_default_batch_that_already_splits_is_kept(capsys):
    rc, out, err = run_cli(["plan", "lenet5", "--small", "--mesh", "data=4", "--quiet"], capsys)
    assert rc == 0, err
    assert out.startswith("lenet5 (small), batch 16 (the model's default), mesh data=4")


def test_float64_plans_in_64_bit_mode_and_restores_it(capsys):
    """float64 needs jax's x64 mode (else arrays would silently be float32, with warnings,
    which the test configuration turns into errors); the mode is restored afterwards."""
    import jax

    argv = ["plan", "lenet5", "--small", "--mesh", "data=2", "--dtype", "fp64", "--quiet"]
    rc, out, err = run_cli(argv, capsys)
    assert rc == 0, err
    assert "dtype float64" in out.splitlines()[0]
    assert not jax.config.jax_enable_x64


@pytest.mark.parametrize("dtype", ["bfloat16", "bf16", "float16"])
def test_low_precision_dtypes(dtype, capsys):
    argv = ["plan", "mlp", "--small", "--mesh", "data=2", "--dtype", dtype, "--quiet"]
    rc, out, err = run_cli(argv, capsys)
    assert rc == 0, err
    assert f"dtype {parse_dtype(dtype)}" in out.splitlines()[0]


def test_parse_dtype():
    assert parse_dtype("float32") == "float32" and parse_dtype(" BF16 ") == "bfloat16"
    for bad in ("float17", "int32", "", "complex64"):
        with pytest.raises(ValueError, match="float32, bfloat16, float16, float64"):
            parse_dtype(bad)


SINGULAR_NOUNS = "device|cut|collective|node|equation|edge|configuration|layer|tensor|sample"


def test_counts_of_one_are_singular(capsys):
    """No "1 devices", "1 cuts", "1 collectives": a one-device mesh, k-cut over one axis."""
    rc, out, err = run_cli(["plan", "mlp", "--small", "--mesh", "data=1"], capsys)
    assert rc == 0, err
    assert "(1 device)" in out
    assert "k-cut: 1 cut" in err  # the progress line this test would catch as "1 cuts"
    plural_after_one = re.compile(rf"(?<![\d.,/])1 ({SINGULAR_NOUNS})s\b")
    assert not plural_after_one.findall(out + err), plural_after_one.findall(out + err)


def test_help_is_plain_text_and_lists_commands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "``" not in out and "`" not in out
    for command in ("jaxpar demo", "jaxpar plan", "jaxpar clusters"):
        assert command in out


def test_plan_help_lists_models_presets_and_remat_policies(capsys):
    import jaxpar_zoo as zoo

    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "``" not in out
    words = set(re.findall(r"[\w-]+", out))
    from jaxpar_zoo.llama import REMAT_POLICIES

    listed = (*zoo.NAMES, *zoo.EXTRA, *zoo.LARGE, *Cluster.presets(), *REMAT_POLICIES)
    missing = [n for n in listed if n not in words]
    assert not missing, missing
    assert "float32" in out and "bfloat16" in out  # the dtypes


def clusters_output(capsys) -> dict[str, str]:
    """`jaxpar clusters`, split into one text per preset."""
    rc, out, err = run_cli(["clusters"], capsys)
    assert rc == 0 and err == ""
    blocks = out.split("\n== ")[1:]
    return {block.split(":", 1)[0]: block for block in blocks}


def level_rows(text: str) -> list[str]:
    """The rows of a describe() link-level table."""
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.strip().startswith("level "))
    return [line for line in lines[head + 1 :] if line.startswith("    ") and line.strip()]


def test_clusters_lists_presets_with_sources(capsys):
    shown = clusters_output(capsys)
    assert list(shown) == Cluster.presets()
    for name, text in shown.items():
        assert f"cluster {name!r}" in text
        assert "FLOP/s" in text and "GB/s" in text
        # every link level carries a source (the last column), latency included
        for row in level_rows(text):
            assert len(row.split("us", 1)[1].split()) >= 2, row
    assert "datasheet" in shown["p100"] and "NCCL" in shown["p100"]


@pytest.mark.parametrize(
    ("name", "node_gbs", "network_gbs"),
    [("p100", "20.00", "12.50"), ("dgx-h100", "450.00", "50.00"), ("mixed-gpu", "450.00", "50.00")],
)
def test_clusters_shows_every_link_level(name, node_gbs, network_gbs, capsys):
    """Multi-node presets are shown with 2 nodes: the link between nodes is listed with its
    numbers, and the layout says how many nodes there are."""
    text = clusters_output(capsys)[name]
    rows = level_rows(text)
    assert [row.split()[0] for row in rows] == ["nvlink", "infiniband"]
    assert node_gbs in rows[0] and "inside a node of" in rows[0]
    assert network_gbs in rows[1] and "between 2 nodes" in rows[1]
    assert "nodes of" in text and "infiniband between nodes" in text


def test_mixed_gpu_says_how_many_nodes_it_has(capsys):
    text = clusters_output(capsys)["mixed-gpu"]
    assert "16 devices in 2 nodes of 8 (one device kind per node)" in text
    assert "(nodes=1 of each kind, heterogeneous)" in text
    assert "(nodes=1," not in text and "(nodes=1)" not in text


def test_one_node_describe_still_lists_the_link_between_nodes():
    text = Cluster.preset("p100").describe()  # 4 devices, one node: no infiniband level
    (row,) = [r for r in level_rows(text) if r.split()[0] == "infiniband"]
    assert "none here" in row and "12.50" in row and "OptCNN" in row
    assert "a cluster of 2 or more nodes adds infiniband" in text
    assert "infiniband" not in level_rows(Cluster.preset("cpu").describe())[0]


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


def test_a_batch_smaller_than_the_mesh_plans_and_marks_the_baselines_that_cannot_run(
    tmp_path, capsys
):
    """A batch of 4 on 8 devices (2 nodes of 4): auto plans it; data parallelism and FSDP
    split the batch over all 8 devices and cannot run, so they are marked, not run on a
    sub-mesh and compared; fsdp_tp splits it over the 2 nodes only and runs."""
    out_json = tmp_path / "plan.json"
    argv = ["plan", "llama3_8b", "--small", "--mesh", "node=2,gpu=4", "--cluster", "dgx-h100"]
    argv += ["--batch", "4", "--strategy", "all", "--json", str(out_json), "--quiet"]
    rc, out, _ = run_cli(argv, capsys)
    assert rc == 0
    comparison = out.split("auto vs best other")[0].splitlines()
    rows = {line.split()[0]: line for line in comparison if line.split()[:1]}
    why = "cannot run at batch 4: batch 4 does not split over the 8 devices its data parallelism"
    assert why in rows["data"] and why in rows["fsdp"]
    for name in ("auto", "model", "owt", "fsdp_tp"):
        assert "cannot run" not in rows[name] and " n/a " in rows[name], rows[name]
    assert "auto vs best other (" in out and "(data)" not in out and "(fsdp)" not in out
    doc = json.loads(out_json.read_text())["strategies"]
    assert doc["data"]["cannot_run"] and doc["fsdp"]["cannot_run"]
    assert doc["auto"]["cannot_run"] is None and doc["auto"]["speedup_vs_data"] is None
    # the tables below the comparison hold the plans that run
    phase_head = next(line for line in out.splitlines() if line.startswith("phase "))
    assert phase_head.split()[1:] == ["auto", "model", "owt", "fsdp_tp"]


@pytest.mark.slow
def test_llama3_8b_batch_16_on_64_devices_plans():
    """The issue's command: Llama 3 8B, batch 16 on 8 DGX H100 nodes (PyTorch AutoParallel's
    tensor-parallel example), in a process of its own as a user runs it."""
    cmd = [sys.executable, "-m", "jaxpar", "plan", "llama3_8b", "--mesh", "node=8,gpu=8"]
    cmd += ["--cluster", "dgx-h100", "--batch", "16", "--strategy", "all", "--quiet"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    comparison = done.stdout.split("auto vs best other")[0].splitlines()
    rows = {line.split()[0]: line for line in comparison if line.split()[:1]}
    assert "cannot run at batch 16" in rows["data"] and "cannot run at batch 16" in rows["fsdp"]
    assert "cannot run" not in rows["auto"]
