"""Planning speed-ups that must not change any result."""

import random

import pytest

from jaxpar.hardware import Cluster
from jaxpar.hardware.mesh_model import mesh_axes
from jaxpar.reshard import _reshard_linear, reshard_linear


def _random_spec(rng: random.Random, rank: int, axes: int):
    dims = [[] for _ in range(rank)]
    for a in rng.sample(range(axes), axes):
        d = rng.randrange(rank + 1)
        if d < rank:
            dims[d].append(a)
    return tuple(tuple(x) for x in dims)


@pytest.mark.closed_form
@pytest.mark.parametrize("objective", ["time", "comm"])
def test_reshard_cost_ignores_dims_whole_in_both_layouts(objective):
    """`reshard_linear` drops dims unsharded in both layouts before pricing (one cache entry for
    many ranks); the price is the one of the full layouts."""
    mesh = mesh_axes(Cluster.preset("dgx-h100", devices=64), ("a", "b", "c"), (4, 2, 8), None)
    rng = random.Random(0)
    for _ in range(3000):
        rank = rng.randint(1, 5)
        src, dst = _random_spec(rng, rank, 3), _random_spec(rng, rank, 3)
        assert reshard_linear(src, dst, mesh, objective) == pytest.approx(
            _reshard_linear(src, dst, mesh, objective), rel=1e-12, abs=1e-18
        )
