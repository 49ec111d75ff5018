"""``jaxpar clusters``: the cluster presets, every number with its source."""

from __future__ import annotations

import argparse
from typing import Any


def showcase_cluster(name: str) -> Any:
    """Preset `name` at a size that has every link level: 2 nodes of a multi-node preset (one
    node has no link between nodes), else the preset's default size."""
    from ..hardware.cluster import Cluster

    default = Cluster.preset(name)
    try:
        two = Cluster.preset(name, nodes=2)
    except ValueError:  # one host or one flat network: sized with devices=
        return default
    return two if len(two.levels) > len(default.levels) else default


def clusters_command(args: argparse.Namespace) -> int:
    """Every preset with its numbers and their sources, at a size that shows every link."""
    from ..hardware import presets

    print(
        "Cluster presets. 'jaxpar plan --cluster NAME' sizes one to the mesh (whole nodes); "
        "each is shown\nhere with 2 nodes where it has nodes, so that every link level is listed."
    )
    for name in presets.preset_names():
        print()
        print(f"== {name}: {presets.preset_summary(name)}")
        print(showcase_cluster(name).describe())
    return 0
