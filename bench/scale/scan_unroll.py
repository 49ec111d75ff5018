"""Scans unrolled by k (``nn.scan(..., unroll=k)``): what the copies' combined all-reduces buy.

(a) The zoo's GPT-2-wide decoder (d 768, 12 layers, 8 x 1024 tokens, AdamW) with its blocks under
    linen ``nn.scan`` unrolled by 1, 2, 3, 4, 6 and 12 (12: no loop, every block in line), on 64
    H100s (node=8, gpu=8): per plan (auto, data parallel) the all-reduces per step after XLA's
    combiner, the step with latency once per combined all-reduce and the overlapped step
    (predicted, dgx-h100; abstract, nothing allocated).
(b) The same decoder at its small config (4 layers, d 64) on 8 simulated CPU devices (2 x 4):
    the predicted all-reduces per step (after combining) against the compiled program's, and
    the largest difference of the sharded step from the unsharded one.

    python bench/scale/scan_unroll.py --json bench/scale/results/scan_unroll.json \\
        --md bench/scale/results/scan_unroll.md
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
import numpy as np
from jaxpar_zoo.scanned import scanned_config, scanned_example

import jaxpar
from jaxpar.verify.compiled import fidelity

UNROLLS = (1, 2, 3, 4, 6, 12)
SMALL_UNROLLS = (1, 2, 4)
MESH = {"node": 8, "gpu": 8}


def predicted(unroll: int) -> dict:
    ex = scanned_example("gpt_scan_linen", scanned_config("gpt_scan_linen", unroll=unroll))
    plan = jaxpar.plan(ex.step, *ex.args, mesh=MESH, cluster="dgx-h100")
    out = {"unroll": unroll}
    for name, cost in (("auto", plan.cost), ("data", plan.baselines["data"])):
        out[name] = {
            "all_reduces": cost.combined_all_reduces,
            "combined_step_s": cost.combined_step_s,
            "overlapped_step_s": cost.overlapped_step_s,
        }
    print(out, flush=True)
    return out


def compiled(unroll: int, strategy: str) -> dict:
    cfg = scanned_config("gpt_scan_linen", small=True, unroll=unroll)
    ex = scanned_example("gpt_scan_linen", cfg)
    args = ex.make_args(0)
    step = jaxpar.auto_shard(ex.step, mesh=jaxpar.make_mesh({"a": 2, "b": 4}), strategy=strategy)
    out, ref = step(*args), jax.jit(ex.step)(*args)
    diff = max(
        float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
        for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref), strict=True)
    )
    check = fidelity(step.plan.collectives, step.lower(*args).compile())
    r = {
        "unroll": unroll, "strategy": strategy, "max_abs_diff": diff,
        "predicted": check.predicted_counts.get("all-reduce", 0),
        "compiled": check.hlo_counts.get("all-reduce", 0),
    }  # fmt: skip
    print(r, flush=True)
    return r


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--md", default=None)
    args = parser.parse_args()
    res: dict = {"command": "python bench/scale/scan_unroll.py " + " ".join(sys.argv[1:])}
    res["jax"] = jax.__version__
    res["predicted"] = [predicted(u) for u in UNROLLS]
    res["compiled"] = [compiled(u, s) for u in SMALL_UNROLLS for s in ("auto", "data")]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(res))


def markdown(res: dict) -> str:
    out = [
        "# Scans unrolled by k",
        "",
        f"`{res['command']}` — jax {res['jax']}",
        "",
        "GPT-2-wide, 12 layers under `nn.scan(..., unroll=k)`, 64 H100s (node=8, gpu=8), "
        "predicted: all-reduces per step after XLA's combiner, the step with latency once per "
        "combined all-reduce (ms) and the overlapped step (ms).",
        "",
        "| unroll | auto all-reduces | auto combined ms | auto overlapped ms "
        "| data all-reduces | data combined ms | data overlapped ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in res["predicted"]:
        a, d = r["auto"], r["data"]
        out.append(
            f"| {r['unroll']} | {a['all_reduces']} | {a['combined_step_s'] * 1e3:.3f} | "
            f"{a['overlapped_step_s'] * 1e3:.3f} | {d['all_reduces']} | "
            f"{d['combined_step_s'] * 1e3:.3f} | {d['overlapped_step_s'] * 1e3:.3f} |"
        )
    out += [
        "",
        "The small config (4 layers, d 64) on 8 simulated CPU devices (2 x 4): all-reduces per "
        "step after combining, predicted and in the compiled program, and the largest "
        "difference of the sharded step's results from the unsharded step's (float32).",
        "",
        "| unroll | plan | predicted | compiled | max abs diff |",
        "|---|---|---|---|---|",
    ]
    for r in res["compiled"]:
        out.append(
            f"| {r['unroll']} | {r['strategy']} | {r['predicted']} | {r['compiled']} | "
            f"{r['max_abs_diff']:.1e} |"
        )
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
