"""Every test carries a tier marker, so `-m TIER` selections (and `-m "not slow"`) are complete.

The tiers are registered in pyproject.toml ([tool.pytest.ini_options] markers) next to `slow`,
which is added to a tier, never instead of one.
"""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.api

ROOT = Path(__file__).resolve().parent.parent
TIERS = ("oracle", "closed_form", "golden", "numerics", "api")


def test_every_test_has_a_tier(pytestconfig):
    registered = {line.split(":", 1)[0].strip() for line in pytestconfig.getini("markers")}
    assert {*TIERS, "slow"} <= registered, sorted(registered)
    untiered = "not (" + " or ".join(TIERS) + ")"
    argv = ["-p", "no:cacheprovider", "--collect-only", "-q", "-m", untiered, "tests"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    # exit status 5: nothing left once every tier is deselected
    assert proc.returncode == 5, (
        f"tests without a tier marker (add one of {TIERS}):\n{proc.stdout}\n{proc.stderr}"
    )
