"""Every test carries a tier marker, so `-m TIER` selections (and `-m "not slow"`) are complete.

The tiers are registered in pyproject.toml ([tool.pytest.ini_options] markers) next to `slow`,
which is added to a tier, never instead of one.
"""

import pytest

pytestmark = pytest.mark.api

TIERS = ("oracle", "closed_form", "golden", "numerics", "api")


def test_every_test_has_a_tier(pytestconfig, request):
    """Of the tests this run collected (every test on a whole run, each xdist worker included),
    none lacks a tier marker."""
    registered = {line.split(":", 1)[0].strip() for line in pytestconfig.getini("markers")}
    assert {*TIERS, "slow"} <= registered, sorted(registered)
    untiered = [
        item.nodeid
        for item in request.session.items
        if not any(item.get_closest_marker(tier) for tier in TIERS)
    ]
    assert request.session.items and not untiered, (
        f"tests without a tier marker (add one of {TIERS}):\n" + "\n".join(untiered)
    )
