"""`jaxpar demo` end to end (docs/testing.md, "Test tiers": api), as the README's setup command
runs it: part 1 trains a plan that really shards and passes its fidelity check; part 2 prints
time and memory for auto and three hand plans.

The command runs as test_readme.py runs a README bash line (`helpers.readme_env`, a fresh
directory); test_readme skips that line, so the demo runs once in the suite."""

from __future__ import annotations

import re
import subprocess

import pytest
from helpers import README_DEMO, ROOT, readme_env

pytestmark = [pytest.mark.api, pytest.mark.slow]

DEMO_STEPS = 3  # the demo's default (`jaxpar demo --steps`)


@pytest.fixture(scope="module")
def demo_output(tmp_path_factory) -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"pip install -e . && {README_DEMO}\n" in readme, "the README's setup command changed"
    out = subprocess.run(
        ["bash", "-e", "-c", README_DEMO],
        cwd=tmp_path_factory.mktemp("demo"), env=readme_env(simulated_devices=False),
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert out.returncode == 0, f"$ {README_DEMO}\n{out.stdout[-6000:]}\n{out.stderr[-6000:]}"
    return out.stdout


def test_small_part_shards_and_matches_the_compiled_program(demo_output):
    part1 = demo_output.split("== 2.")[0]
    losses = re.findall(r"loss ([\d.]+)\s+unsharded ([\d.]+)", part1)
    assert len(losses) == DEMO_STEPS
    for sharded, unsharded in losses:
        assert abs(float(sharded) - float(unsharded)) < 1e-4
    compiled = {
        m.group(1): int(m.group(2))
        for m in re.finditer(
            r"^\s+(all-\w+|collective-permute)\s+\d+\s+[\d.]+\s+(\d+)", part1, re.M
        )
    }
    assert sum(compiled.values()) > 0, part1  # the compiled program communicates
    # bytes equal and, per kind, the count after combining the compiled program's
    assert re.search(r"total bytes/device: .*counts per kind within .*: ok$", part1, re.M), part1
    row = r"^\s+(all-\w+|collective-permute)\s+(\d+)\s+[\d.]+\s+\d+"
    predicted = {m.group(1): int(m.group(2)) for m in re.finditer(row, part1, re.M)}
    assert predicted == compiled, part1


def test_big_part_prices_auto_and_three_hand_plans(demo_output):
    part2 = demo_output.split("== 2.")[1]
    for name in ("auto", "data", "model", "owt"):
        row = re.search(
            rf"^\s+{name}\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+[\d.]+x\s+([\d.]+) GB", part2, re.M
        )
        assert row, (name, part2)
        assert float(row.group(1)) > 0 and float(row.group(2)) > 0
    assert "gradient" in part2 and "largest state tensors" in part2


def _agrees(quoted: str, printed: str) -> bool:
    """Whether the README's ``quoted`` figure is the demo's ``printed`` one at the README's
    precision (``15.3`` quotes ``15.27``, ``393`` quotes ``392.6``)."""
    decimals = len(quoted.split(".")[1]) if "." in quoted else 0
    return abs(float(quoted) - float(printed)) <= 0.5 * 10**-decimals + 1e-9


def test_readme_quotes_the_figures_the_demo_prints(demo_output):
    """The README's account of the demo quotes its figures as the demo prints them now (a
    cost-model change that moves them must update the README too)."""
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    part1, part2 = demo_output.split("== 2.")
    table = {
        m.group(1): m.groups()[1:]
        for m in re.finditer(
            r"^\s+(auto|data)\s+([\d.]+)\s+[\d.]+\s+([\d.]+)\s+[\d.]+x\s+([\d.]+) GB\s+([\d.]+) GB",
            part2,
            re.M,
        )
    }
    speedup = re.search(r"auto is ([\d.]+)x faster than the best hand plan \(data\)", part2)
    gradient = re.search(r"^\s+gradient\s+[\d.]+ \+\s+([\d.]+)\s+[\d.]+ \+\s+([\d.]+)", part2, re.M)
    step = {k: re.search(rf"^\s+{k} ms\s+([\d.]+)", part1, re.M) for k in ("Eq. 1", "overlap")}
    assert speedup and gradient and all(step.values()) and set(table) == {"auto", "data"}
    (auto_ms, auto_gb, auto_state, auto_peak), (data_ms, data_gb, data_state, data_peak) = (
        table["auto"],
        table["data"],
    )
    quotes = [
        (r"the step is ([\d.]+) ms against ([\d.]+) ms", (step["overlap"][1], step["Eq. 1"][1])),
        (
            r"auto is ([\d.]+)× faster than data parallel \(([\d.]+) vs ([\d.]+) ms per step",
            (speedup[1], auto_ms, data_ms),
        ),
        (r"moving \*more\* bytes \(([\d.]+) vs ([\d.]+) GB per step\)", (auto_gb, data_gb)),
        (
            r"costs (\d+) ms, auto's gradient communication (\d+) ms",
            (gradient[2], gradient[1]),
        ),
        (
            r"State per device \(([\d.]+) vs ([\d.]+) GB\) and the predicted peak per device "
            r"\(([\d.]+) vs ([\d.]+) GB",
            (auto_state, data_state, auto_peak, data_peak),
        ),
    ]
    for pattern, printed in quotes:
        found = re.search(pattern, readme)
        assert found, pattern
        assert all(map(_agrees, found.groups(), printed)), (found[0], printed)
