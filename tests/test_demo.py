"""`jaxpar demo` end to end (docs/design.md, "Test tiers": api), as the README's setup command
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
