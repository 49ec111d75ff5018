"""Predicted vs compiled-HLO communication for every (model, mesh, strategy) the tests apply.

Bytes sent per device per step, predicted by the plan and read from the compiled HLO on 8
simulated CPU devices, with the collective kinds of each.

    python bench/fidelity.py --json bench/results/fidelity.json
"""

import argparse
import json
import os
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jaxpar
import models
from jaxpar.verify import fidelity

MESHES = [{"data": 8}, {"data": 2, "model": 4}, {"a": 2, "b": 2, "c": 2}]
MODELS = ["mlp", "cnn", "lenet5", "gpt_small", "nnx_mlp"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = []
    print(f"{'model':<10} {'mesh':<26} {'strategy':<8} {'pred KB':>10} {'HLO KB':>10} {'error':>7}")
    for name in MODELS:
        ex = models.get(name, small=True)
        for mesh_axes in MESHES:
            mesh = jaxpar.make_mesh(mesh_axes)
            for strategy in ("auto", "data", "model", "owt"):
                step = jaxpar.auto_shard(ex.step, mesh=mesh, strategy=strategy)
                compiled = step.lower(*ex.args).compile()
                fid = fidelity(step.plan.collectives, compiled)
                row = {
                    "model": name,
                    "mesh": mesh_axes,
                    "strategy": strategy,
                    "predicted_bytes": fid.predicted_bytes,
                    "hlo_bytes": fid.hlo_bytes,
                    "relative_error": fid.relative_error,
                    "predicted_kinds": sorted(fid.predicted_kinds),
                    "hlo_kinds": sorted(fid.hlo_kinds),
                    "unexpected_kinds": sorted(fid.unexpected_kinds),
                }
                rows.append(row)
                print(
                    f"{name:<10} {mesh_axes!s:<26} {strategy:<8} "
                    f"{fid.predicted_bytes / 1e3:10.1f} {fid.hlo_bytes / 1e3:10.1f} "
                    f"{fid.relative_error:7.2%}"
                    + (
                        f" unexpected {sorted(fid.unexpected_kinds)}"
                        if fid.unexpected_kinds
                        else ""
                    ),
                    flush=True,
                )
    worst = max(rows, key=lambda r: r["relative_error"])
    unexpected = sum(bool(r["unexpected_kinds"]) for r in rows)
    print(
        f"worst: {worst['relative_error']:.2%} ({worst['model']}, {worst['mesh']}, "
        f"{worst['strategy']}); unexpected kinds in {unexpected} plans"
    )
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
