"""Golden plans: each small zoo model × mesh × cluster, planned and compared with a stored JSON.

A change to rules, costs or search that changes any plan fails here, with the differing layers.
When the change is intended, regenerate the goldens and commit them with the change:

    JAXPAR_UPDATE_GOLDENS=1 python -m pytest tests/test_goldens.py

Planning is abstract (dict meshes, ShapeDtypeStruct arguments): no devices, no compilation.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from pathlib import Path

import jaxpar_zoo as zoo
import pytest

import jaxpar

pytestmark = pytest.mark.golden

GOLDEN_DIR = Path(__file__).parent / "goldens"
UPDATE = os.environ.get("JAXPAR_UPDATE_GOLDENS") == "1"
SETUPS = [({"node": 2, "gpu": 4}, "p100"), ({"data": 2, "model": 4}, "dgx-h100")]
MODEL_NAMES = (*zoo.NAMES, *zoo.EXTRA)


def fingerprint(plan: jaxpar.Plan) -> dict:
    """What must not change by accident: per-layer configs and layouts, argument layouts,
    predicted totals and the collectives by kind."""
    return {
        "layers": [[r["layer"], r["config"], r["spec"]] for r in plan.layer_rows()],
        "in_specs": {
            path: str(plan.partition_spec(spec))
            for path, spec in zip(plan.program.invar_paths, plan.invar_specs, strict=True)
        },
        "step_s": plan.cost.step_s,
        "comm_bytes": plan.cost.comm_bytes,
        "collectives": dict(sorted(Counter(c.kind for c in plan.collectives).items())),
        "optimal": plan.optimal,
    }


def _golden_path(name: str, mesh: dict[str, int], cluster: str) -> Path:
    mesh_text = "_".join(f"{k}{v}" for k, v in mesh.items())
    return GOLDEN_DIR / f"{name}__{mesh_text}__{cluster}.json"


@pytest.mark.parametrize(("mesh", "cluster"), SETUPS, ids=lambda x: str(x))
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_plan_matches_golden(name, mesh, cluster):
    ex = zoo.get(name, small=True)
    plan = jaxpar.plan(ex.step, *ex.args, mesh=mesh, cluster=cluster)
    got = fingerprint(plan)
    path = _golden_path(name, mesh, cluster)
    if UPDATE:
        GOLDEN_DIR.mkdir(exist_ok=True)
        path.write_text(json.dumps(got, indent=1) + "\n")
    assert path.exists(), (
        f"no golden for {name} on {mesh} / {cluster}; create it with "
        f"JAXPAR_UPDATE_GOLDENS=1 python -m pytest tests/test_goldens.py"
    )
    want = json.loads(path.read_text())
    changed = [
        f"  {w[0]}: golden {w[1]} {w[2]} -> now {g[1]} {g[2]}"
        for w, g in zip(want["layers"], got["layers"], strict=False)
        if w != g
    ]
    if len(want["layers"]) != len(got["layers"]):
        changed.append(f"  layer count {len(want['layers'])} -> {len(got['layers'])}")
    assert not changed, "plan changed per layer:\n" + "\n".join(changed)
    assert got["in_specs"] == want["in_specs"]
    assert got["collectives"] == want["collectives"]
    assert got["optimal"] == want["optimal"]
    for key in ("step_s", "comm_bytes"):
        assert math.isclose(got[key], want[key], rel_tol=1e-6, abs_tol=1e-12), (
            key,
            want[key],
            got[key],
        )
