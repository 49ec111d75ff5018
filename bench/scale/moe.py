"""A mixture of experts planned two ways: Mixtral 8x7B's dropless grouped matmuls against
GShard's capacity dispatch, on DGX H100 meshes.

``mixtral_8x7b`` (``models/llama.py``, 46.7 B parameters: 32 blocks, each MLP 8 SwiGLU experts
of 14,336, top 2), per-block remat, blocks scanned, 64 x 4,096 tokens per step (bfloat16
compute, float32 master weights, AdamW). Two ways to run the experts, with the same parameters
(`jaxpar_zoo.llama.MixtureOfExperts`):

- dropless: tokens sorted by expert, grouped matmuls (``jax.lax.ragged_dot``), whose token and
  expert dims XLA's partitioner keeps whole;
- capacity 1.25: GShard's dispatch and combine einsums over ``[group, token, expert, slot]``,
  every dim splittable, copies past an expert's capacity dropped.

Per mesh and dispatch: planning wall time, the auto plan's overlapped step, bytes sent per
device, whether the experts' dim of their weights is split (expert parallelism) and the
all-to-alls in the MoE layers, and the fastest hand plan that fits. Everything is abstract
(nothing allocated); wall time on this machine, one process.

    python bench/scale/moe.py --json bench/scale/results/moe.json --md bench/scale/results/moe.md
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import jax
from jaxpar_zoo.llama import llama_config, llama_example

import jaxpar

sys.path.insert(0, os.path.dirname(__file__))
from scanned import best_fitting_hand_plan

MESHES = [{"node": 8, "gpu": 8}, {"node": 32, "gpu": 8}]
DISPATCHES = [("dropless", None), ("capacity 1.25", 1.25)]
BATCH = 64


def row(mesh: dict, dispatch: str, capacity: float | None) -> dict:
    cfg = llama_config(
        "mixtral_8x7b", remat=True, batch=BATCH, scan_layers=True, capacity_factor=capacity
    )  # fmt: skip
    ex = llama_example("mixtral_8x7b", cfg)
    t0 = time.perf_counter()
    plan = jaxpar.plan(ex.step, *ex.args, mesh=mesh, cluster="dgx-h100")
    wall = time.perf_counter() - t0
    paths = zip(plan.program.invars, plan.program.invar_paths, strict=True)
    (gate,) = [t for t, p in paths if p.startswith("[0].params") and "['moe']['gate']" in p]
    expert_axes = plan.tensor_specs[gate][1]  # [layers, experts, d, ffn]
    moe = [c for c in plan.collectives if "moe" in c.layer]
    hand, hand_s = best_fitting_hand_plan(plan)
    return {
        "mesh": mesh,
        "dispatch": dispatch,
        "wall_s": wall,
        "step_s": plan.cost.overlapped_step_s,
        "compute_s": plan.cost.compute_s,
        "comm_gb": plan.cost.comm_bytes / 1e9,
        "peak_gb": plan.memory.peak / 1e9,
        "fits": bool(plan.memory.fits),
        "experts_over": [plan.mesh_axes.names[a] for a in expert_axes],
        "moe_all_to_alls": sum(c.count for c in moe if c.kind == "all-to-all"),
        "best_hand": hand,
        "best_hand_s": hand_s,
    }


def markdown(res: dict) -> str:
    out = [
        "# A mixture of experts, dropless or dispatched by capacity (Mixtral 8x7B, dgx-h100)",
        "",
        f"`{res['command']}` — jax {res['jax']}",
        "",
        f"Scanned, per-block remat, {BATCH} x 4,096 tokens per step; predicted overlapped "
        "steps; planning wall time on this 2-core machine.",
        "",
        "| mesh | dispatch | plan s | step ms | compute ms | GB sent / device | peak GB | "
        "experts split over | all-to-alls in MoE layers | fastest fitting hand plan ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        mesh = ",".join(f"{k}={v}" for k, v in r["mesh"].items())
        hand = f"{r['best_hand_s'] * 1e3:.1f} ({r['best_hand']})" if r["best_hand"] else "none fits"
        out.append(
            f"| {mesh} | {r['dispatch']} | {r['wall_s']:.2f} | **{r['step_s'] * 1e3:.1f}** | "
            f"{r['compute_s'] * 1e3:.1f} | {r['comm_gb']:.1f} | {r['peak_gb']:.1f} | "
            f"{', '.join(r['experts_over']) or '-'} | {r['moe_all_to_alls']} | {hand} |"
        )
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--md", default=None)
    args = parser.parse_args()
    res: dict = {
        "command": "python bench/scale/moe.py " + " ".join(sys.argv[1:]),
        "jax": jax.__version__,
    }
    res["rows"] = []
    for mesh in MESHES:
        for dispatch, capacity in DISPATCHES:
            r = row(mesh, dispatch, capacity)
            res["rows"].append(r)
            print(r, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(res))


if __name__ == "__main__":
    main()
