"""A shard_map's automatic axes: what planning them is worth (issue 10).

MaxText's kernel pattern: a custom VJP whose forward and backward are shard_maps, a Megatron
MLP (column- then row-parallel, ``psum`` over ``model``) manual over ``model`` with ``data``
left automatic (``axis_names``). bf16, 65,536 tokens, d 4,096, ff 16,384, on a (2, 4) mesh,
planned abstractly (nothing allocated). For each cluster: the auto plan's predicted step, and
the same plan with ``data`` unused inside the shard_maps (how they were planned before).

    python bench/plan_quality/shard_map_auto.py \\
        --json bench/plan_quality/results/shard_map_auto.json \\
        --md bench/plan_quality/results/shard_map_auto.md
"""

import argparse
import json
import os
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import jax
import jax.numpy as jnp
from jaxpar_zoo.kernels import megatron_mlp_step

import jaxpar
from jaxpar.cost.evaluation import evaluate

TOKENS, D, FF = 65536, 4096, 16384
CLUSTERS = ["dgx-h100", "p100"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--md", default=None)
    args = parser.parse_args()
    mesh = jaxpar.make_mesh({"data": 2, "model": 4})
    step = megatron_mlp_step(mesh)
    params = {
        "w1": jax.ShapeDtypeStruct((D, FF), jnp.bfloat16),
        "w2": jax.ShapeDtypeStruct((FF, D), jnp.bfloat16),
    }
    x = jax.ShapeDtypeStruct((TOKENS, D), jnp.bfloat16)
    rows = []
    for cluster in CLUSTERS:
        plan = jaxpar.plan(step, params, x, x, mesh=mesh, cluster=cluster)
        unused = list(plan.assignment)
        chosen = []
        for node in plan.ng.nodes:
            if node.anchor >= 0 and plan.program.eqns[node.anchor].primitive == "shard_map":
                cfgs = plan.configs[node.index]
                cfg = cfgs[plan.assignment[node.index]]
                data = cfg[0]
                chosen.append(node.space.names[data] if data >= 0 else "-")
                chosen[-1] += f" (size {node.space.sizes[data]})" if data >= 0 else ""
                unused[node.index] = cfgs.index((-1, *cfg[1:]))
        before = evaluate(plan.eval_context(), tuple(unused)).cost
        rows.append(
            {
                "cluster": cluster,
                "data_splits": chosen,
                "auto_step_ms": plan.cost.overlapped_step_s * 1e3,
                "data_unused_step_ms": before.overlapped_step_s * 1e3,
            }
        )
        print(rows[-1], flush=True)
    command = "python bench/plan_quality/shard_map_auto.py " + " ".join(sys.argv[1:])
    result = {"command": command, "jax": jax.__version__, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.md:
        out = [
            "# A shard_map's automatic axes",
            "",
            f"`{command}` — jax {jax.__version__}",
            "",
            f"Custom-VJP Megatron MLP kernel (shard_maps manual over `model`, `data` automatic), "
            f"bf16, {TOKENS:,} tokens, d {D:,}, ff {FF:,}, mesh data=2, model=4. Overlapped step "
            "predicted for the auto plan, and for the same plan with `data` unused in the "
            "shard_maps (as they were planned before).",
            "",
            "| cluster | `data` splits (fwd, bwd) | auto ms | `data` unused ms | speedup |",
            "|---|---|---|---|---|",
        ]
        for r in rows:
            out.append(
                f"| {r['cluster']} | {', '.join(r['data_splits'])} | {r['auto_step_ms']:.3f} | "
                f"{r['data_unused_step_ms']:.3f} | "
                f"{r['data_unused_step_ms'] / r['auto_step_ms']:.2f}x |"
            )
        with open(args.md, "w") as f:
            f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
