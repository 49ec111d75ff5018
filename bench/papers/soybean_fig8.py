"""SoyBean Figure 8's MLP runs: communication of data, model, k-cut (SoyBean's hybrid) and auto.

A 4-layer MLP with 8192 x 8192 weights (input 8192), batch 512 and 2048, SGD, on 2, 4 and 8
devices (the paper's GPU counts), objective "comm" (SoyBean's problem: least bytes, every
contraction split over all devices). Meshes: 2 -> x=2; 4 -> x=2,y=2; 8 -> x=2,y=4 (k-cut needs
one axis per cut; data and model parallelism use every axis). Abstract planning, nothing
allocated; bytes are the plan's prediction, summed over devices (ring accounting), which matched
the compiled HLO exactly for auto, k-cut and data on the 16-device MLP
(bench/papers/soybean_mlp.py).

    python bench/papers/soybean_fig8.py --json bench/papers/results/soybean_fig8.json \
        --md bench/papers/results/soybean_fig8.md
"""

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import jax
import jax.numpy as jnp
import optax
from jaxpar_zoo.mlp import mlp_example

import jaxpar

MESHES = {2: {"x": 2}, 4: {"x": 2, "y": 2}, 8: {"x": 2, "y": 4}}
BATCHES = (512, 2048)


def example(batch: int):
    cfg = {"batch": batch, "in_features": 8192, "features": (8192,) * 4, "lr": 0.1}
    return mlp_example(f"mlp4x8192_b{batch}", cfg, jnp.float32, optax.sgd(cfg["lr"]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--md", default=None)
    args = parser.parse_args()
    rows = []
    for batch in BATCHES:
        ex = example(batch)
        for devices, mesh in MESHES.items():
            cluster = jaxpar.Cluster.preset("cpu", devices=devices)
            kw = dict(mesh=mesh, cluster=cluster, objective="comm")
            auto = jaxpar.plan(ex.step, *ex.args, **kw)
            kcut = jaxpar.plan(ex.step, *ex.args, search="kcut", **kw)
            row = {"batch": batch, "devices": devices, "mesh": mesh}
            for name, plan in (
                ("data", auto.variant("data")),
                ("model", auto.variant("model")),
                ("kcut", kcut),
                ("auto", auto),
            ):
                row[name] = plan.cost.comm_bytes * devices
            row["kcut_layers"] = [[r["layer"], r["config"]] for r in kcut.layer_rows()]
            rows.append(row)
            print(
                f"batch {batch:5d} {devices} devices: "
                + " ".join(
                    f"{k} {row[k] / 1e6:9.1f} MB" for k in ("data", "model", "kcut", "auto")
                ),
                flush=True,
            )
    command = "python bench/papers/soybean_fig8.py " + " ".join(sys.argv[1:])
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"command": command, "jax": jax.__version__, "rows": rows}, f, indent=1)
    if args.md:
        lines = [
            "# SoyBean Figure 8: 4-layer MLP, 8192 x 8192 weights",
            "",
            f"`{command}` — predicted bytes per step, summed over devices (objective 'comm').",
            "",
            "| batch | devices | data MB | model MB | k-cut MB | auto MB | data / auto |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            lines.append(
                f"| {r['batch']} | {r['devices']} | {r['data'] / 1e6:.1f} | "
                f"{r['model'] / 1e6:.1f} | {r['kcut'] / 1e6:.1f} | {r['auto'] / 1e6:.1f} | "
                f"{r['data'] / r['auto'] if r['auto'] else math.inf:.2f} |"
            )
        with open(args.md, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
