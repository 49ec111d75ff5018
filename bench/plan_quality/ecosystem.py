"""Models from the ecosystem's libraries, planned as written (issue 47): a table per model.

For each model of `jaxpar_zoo.ecosystem` (Equinox, unrolled and scanned; Hugging Face
transformers' Flax Llama, GPT-2, BERT and T5; all built from small configs, random weights):

- numerics: the planned step against the unsharded one in float64, max |difference|;
- bytes: the collectives' bytes per device per step, predicted and in the compiled program, and
  whether the counts per kind agree;
- strategies: the predicted (overlapped) step of the plan beside the hand plans data, FSDP,
  FSDP + tensor parallel and Megatron-style model parallel (``model``), priced by the same
  cost model;
- planning time (trace + graph + costs + search).

A model whose library is not installed is reported as such (``pip install -e ".[ecosystem]"``
for transformers; Equinox is in the test extra).

    python bench/plan_quality/ecosystem.py --json bench/plan_quality/results/ecosystem.json \
        --md bench/plan_quality/results/ecosystem.md
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax
import jax.numpy as jnp
from jaxpar_zoo import ecosystem

import jaxpar
from jaxpar.verify.compiled import fidelity

MESH = {"data": 2, "model": 4}
CLUSTER = "dgx-h100"
HAND = ("data", "fsdp", "fsdp_tp", "model")
MODELS = {
    "equinox_lm": ("equinox", lambda dtype: ecosystem.equinox_lm(False, dtype=dtype)),
    "equinox_lm_scanned": ("equinox", lambda dtype: ecosystem.equinox_lm(True, dtype=dtype)),
    **{
        n: ("transformers", lambda dtype, n=n: ecosystem.hf_flax(n, dtype=dtype))
        for n in ecosystem.HF_MODELS
    },
}


def measure(name: str, build) -> dict:
    """One model's row: numerics, bytes, strategies, planning time."""
    mesh = jaxpar.make_mesh(MESH)
    with jax.enable_x64(True):
        ex = build(jnp.float64)
        step = jaxpar.auto_shard(ex.step, mesh=mesh, cluster=CLUSTER)
        out = step(*ex.args)
        ref = jax.jit(ex.step)(*ex.args)
        err = max(
            float(jnp.max(jnp.abs(a - b)))
            for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref), strict=True)
        )
        compiled = step.lower(*ex.args).compile()
    plan = step.plan
    fid = fidelity(plan.collectives, compiled)
    stats = plan.stats
    return {
        "model": name,
        "equations": stats["equations"],
        "max_abs_error_f64": err,
        "predicted_bytes": fid.predicted_bytes,
        "compiled_bytes": fid.hlo_bytes,
        "counts_agree": fid.predicted_counts == fid.hlo_counts,
        "auto_ms": plan.cost.overlapped_step_s * 1e3,
        **{f"{s}_ms": plan.baselines[s].overlapped_step_s * 1e3 for s in HAND},
        "plan_s": sum(stats.get(k, 0.0) for k in ("trace_s", "graph_s", "cost_s", "search_s")),
    }


def markdown(rows: list[dict], missing: dict[str, str]) -> str:
    """The rows as a markdown table (float64 plans, ms are the predicted overlapped step)."""
    head = (
        "| model | eqns | max abs err (f64) | predicted B | compiled B | counts | auto ms | "
        "data ms | fsdp ms | fsdp_tp ms | megatron ms | auto / best hand | plan s |"
    )
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        best = min(r[f"{s}_ms"] for s in HAND)
        lines.append(
            f"| {r['model']} | {r['equations']} | {r['max_abs_error_f64']:.1e} | "
            f"{r['predicted_bytes']:.0f} | {r['compiled_bytes']:.0f} | "
            f"{'equal' if r['counts_agree'] else 'differ'} | {r['auto_ms']:.4f} | "
            f"{r['data_ms']:.4f} | {r['fsdp_ms']:.4f} | {r['fsdp_tp_ms']:.4f} | "
            f"{r['model_ms']:.4f} | {r['auto_ms'] / best:.2f} | {r['plan_s']:.2f} |"
        )
    lines += [f"| {n} | not run: {why} |" + " |" * 11 for n, why in missing.items()]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--md")
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    args = ap.parse_args()
    rows, missing = [], {}
    for name in args.models:
        library, build = MODELS[name]
        if importlib.util.find_spec(library) is None:
            missing[name] = f"{library} is not installed"
            continue
        t0 = time.perf_counter()
        rows.append(measure(name, build))
        print(f"{name}: {time.perf_counter() - t0:.1f} s", flush=True)
    text = markdown(rows, missing)
    print(f"mesh {MESH}, cluster {CLUSTER}, batch 32-64 x 32 tokens\n{text}")
    if args.json:
        Path(args.json).write_text(json.dumps({"mesh": MESH, "cluster": CLUSTER, "rows": rows,
                                               "missing": missing}, indent=1))  # fmt: skip
    if args.md:
        Path(args.md).write_text(text + "\n")


if __name__ == "__main__":
    main()
