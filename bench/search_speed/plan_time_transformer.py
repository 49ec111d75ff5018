"""Planning time of a ~2,400-equation transformer train step (issue 2's target: seconds).

A 4-layer, d=256 GPT-style decoder + AdamW step (2,374 equations when this benchmark was
written), planned on 8 simulated CPU devices for several meshes; the time is split into
trace / graph / costs / search, and set beside XLA's compile time of the same sharded step.

    python bench/search_speed/plan_time_transformer.py \
        --json bench/search_speed/results/plan_time_transformer.json
"""

import argparse
import json
import os
import sys
import time

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import jax
from jaxpar_zoo.transformer import gpt_example

import jaxpar

# The objective the committed results were planned with: OptCNN Eq. 1 ("time", the planner's
# default until 2026-11-24; the default is now "overlap").
OBJECTIVE = "time"

CONFIG = {
    "batch": 16,
    "seq_len": 64,
    "vocab_size": 512,
    "num_layers": 4,
    "d_model": 256,
    "num_heads": 8,
    "lr": 1e-3,
    "weight_decay": 0.1,
}


def example():
    return gpt_example("gpt_4x256", CONFIG)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    ex = example()
    meshes = [{"data": 8}, {"data": 2, "model": 4}, {"a": 2, "b": 2, "c": 2}]
    rows = []
    print(
        f"{'mesh':<28} {'eqns':>5} {'nodes':>5} {'trace':>6} {'graph':>6} {'costs':>6} "
        f"{'search':>6} {'total':>6} {'XLA':>6} {'ratio':>6} optimal method"
    )
    for mesh_axes in meshes:
        mesh = jaxpar.make_mesh(mesh_axes)
        for cluster in ("p100", "cpu"):
            t0 = time.perf_counter()
            step = jaxpar.auto_shard(ex.step, mesh=mesh, cluster=cluster, objective=OBJECTIVE)
            lowered = step.lower(*ex.args)
            plan = step.plan
            t1 = time.perf_counter()
            lowered.compile()
            xla = time.perf_counter() - t1
            s = plan.stats
            total = s["trace_s"] + s["graph_s"] + s["cost_s"] + s["search_s"]
            row = {
                "mesh": mesh_axes,
                "cluster": cluster,
                "equations": s["equations"],
                "nodes": s["nodes"],
                "free_nodes": s["free_nodes"],
                "max_configs": s["max_configs"],
                "trace_s": s["trace_s"],
                "graph_s": s["graph_s"],
                "cost_s": s["cost_s"],
                "search_s": s["search_s"],
                "plan_s": total,
                "xla_compile_s": xla,
                "optimal": plan.optimal,
                "method": s.get("method", ""),
                "step_s": plan.cost.step_s,
                "data_step_s": plan.baselines["data"].step_s,
                "wall_s": t1 - t0,
            }
            rows.append(row)
            print(
                f"{str(mesh_axes) + ' ' + cluster:<28} {s['equations']:5d} {s['nodes']:5d} "
                f"{s['trace_s']:6.2f} {s['graph_s']:6.2f} {s['cost_s']:6.2f} "
                f"{s['search_s']:6.2f} {total:6.2f} {xla:6.2f} {total / xla:6.2f} "
                f"{plan.optimal} {row['method']}",
                flush=True,
            )
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"config": CONFIG, "jax": jax.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
