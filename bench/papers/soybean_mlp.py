"""SoyBean's problem on its MLP: least communication with every contraction split over all
devices (objective="comm"), 5 x Dense 320, batch 400, SGD, 16 devices as a 4x4 mesh.

Plans auto (joint elimination), kcut (SoyBean's k-cut search: one exact DP per mesh axis), data
and model, compiles each on 16 simulated CPU devices and reads the collectives from the compiled
HLO. Prints a table (and JSON with --json FILE). SoyBean's own accounting of its worked example
(§3, 16 devices): data parallel 57.6 MB, model parallel 76.8 MB, its 4x4 hybrid 33.6 MB.

    python bench/papers/soybean_mlp.py --json bench/papers/results/soybean_mlp.json
"""

import argparse
import json
import os
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=16"
).strip()
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import jax
import jaxpar_zoo as zoo

import jaxpar
from jaxpar.verify.compiled import compiled_collectives


def flops_of(compiled) -> float:
    ca = compiled.cost_analysis()
    ca = ca[0] if isinstance(ca, (list, tuple)) else ca
    return float(ca.get("flops", 0.0))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    ex = zoo.get("soybean_mlp")
    step_args = ex.make_args(0)
    mesh = jaxpar.make_mesh({"x": 4, "y": 4})
    unsharded = flops_of(jax.jit(ex.step).lower(*step_args).compile())
    results = {"unsharded_flops": unsharded, "devices": 16, "strategies": {}}
    print(f"{'strategy':<8} {'predicted MB':>13} {'HLO MB':>9} {'flops/device':>14} {'x 1/16':>7}")
    runs = {
        "auto": ("auto", "elimination"),
        "kcut": ("auto", "kcut"),
        "data": ("data", "elimination"),
        "model": ("model", "elimination"),
    }
    for name, (strategy, search) in runs.items():
        step = jaxpar.auto_shard(
            ex.step, mesh=mesh, objective="comm", strategy=strategy, search=search
        )
        compiled = step.lower(*step_args).compile()
        hlo = compiled_collectives(compiled)
        hlo_total = sum(c.bytes_per_device for c in hlo) * 16
        pred_total = sum(c.bytes for c in step.plan.collectives) * 16
        per_device = flops_of(compiled)
        results["strategies"][name] = {
            "predicted_total_bytes": pred_total,
            "hlo_total_bytes": hlo_total,
            "flops_per_device": per_device,
            "optimal": step.plan.optimal,
            "hlo_kinds": sorted({c.kind for c in hlo}),
            "layers": [[r["layer"], r["config"]] for r in step.plan.layer_rows()],
        }
        print(
            f"{name:<8} {pred_total / 1e6:13.2f} {hlo_total / 1e6:9.2f} {per_device:14.0f} "
            f"{per_device / (unsharded / 16):7.3f}"
        )
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
