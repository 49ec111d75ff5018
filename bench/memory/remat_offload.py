"""Remat policies and host offloading at scale: what each keeps on the device.

Llama 3 8B (bf16 compute, fp32 master weights, AdamW), 256 x 4096 tokens, 64 H100s (node=8,
gpu=8, dgx-h100), planned abstractly with the default budget (80 GB less the reserve) for each
of MaxText's remat policies (`jaxpar_zoo.llama.REMAT_POLICIES`): none (no remat), ``full``
(nothing saved), ``minimal`` (the projections' results saved on the device),
``minimal_offloaded`` (those results offloaded to the host's pinned memory and brought back for
the backward pass), ``save_qkv_proj`` (the query, key and value projections, by checkpoint
name) and ``qkv_proj_offloaded`` (those offloaded). Per policy: auto's peak per device,
activations, predicted step and planning time, or "no fit" (`jaxpar.MemoryBudgetError`) with
the smallest peak it found; and the peak and step of the FSDP hand plan. Offloaded tensors
hold no device memory (docs/design.md, "Memory"); their copies run over the H100's 64 GB/s host
link (PCIe Gen5), on copy engines beside compute in the overlapped step (docs/design.md,
"Copies to and from host memory"): per policy, what auto's plan copies per device and the
copies' time t_H.

    python bench/memory/remat_offload.py --json bench/memory/results/remat_offload.json \\
        --md bench/memory/results/remat_offload.md
"""

import argparse
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import jax
from jaxpar_zoo.llama import llama_config, llama_example

import jaxpar

MESH = {"node": 8, "gpu": 8}
CLUSTER = "dgx-h100"
POLICIES = (None, "full", "minimal", "minimal_offloaded", "save_qkv_proj", "qkv_proj_offloaded")


def row(policy: str | None) -> dict:
    cfg = llama_config("llama3_8b", remat_policy=policy, batch=256, seq_len=4096)
    ex = llama_example("llama3_8b", cfg)
    out = {"policy": policy or "no remat"}
    t0 = time.perf_counter()
    try:
        plan = jaxpar.plan(ex.step, *ex.args, mesh=MESH, cluster=CLUSTER)
    except jaxpar.MemoryBudgetError as err:
        out["plan_s"] = time.perf_counter() - t0
        smallest = re.search(r"smallest peak the planner reached is ([\d.]+) GB", str(err))
        out["auto"] = {
            "no_fit": True,
            "smallest_gb": float(smallest.group(1)) if smallest else None,
        }
        plan = jaxpar.plan(ex.step, *ex.args, mesh=MESH, cluster=CLUSTER, strategy="data")
    else:
        out["plan_s"] = time.perf_counter() - t0
        m = plan.memory
        out["auto"] = {
            "no_fit": False,
            "peak_gb": m.peak / 1e9,
            "activations_gb": m.activations / 1e9,
            "step_ms": plan.cost.step_for(plan.objective) * 1e3,
            "eq1_ms": plan.cost.step_s * 1e3,
            "compute_ms": plan.cost.compute_s * 1e3,
            "host_gb": plan.cost.host_bytes / 1e9,
            "host_ms": plan.cost.host_s * 1e3,
        }
    fsdp = plan.variant("fsdp")
    out["fsdp"] = {
        "peak_gb": fsdp.memory.peak / 1e9,
        "activations_gb": fsdp.memory.activations / 1e9,
        "fits": bool(fsdp.memory.fits),
        "step_ms": fsdp.cost.step_for(plan.objective) * 1e3,
    }
    return out


def markdown(rows: list[dict]) -> str:
    lines = [
        "# Remat policies and host offloading: llama3_8b, 256 × 4096 tokens, 64 H100s",
        "",
        "`python bench/memory/remat_offload.py --json bench/memory/results/remat_offload.json "
        f"--md bench/memory/results/remat_offload.md` — jax {jax.__version__}",
        "",
        "| policy | auto peak GB | auto activations GB | auto step ms | auto host copies GB "
        "| auto t_H ms | plan s | fsdp peak GB | fsdp activations GB | fsdp step ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        a, f = r["auto"], r["fsdp"]
        auto = (
            f"no fit (smallest {a['smallest_gb']:.1f}) | – | – | – | –"
            if a["no_fit"]
            else f"{a['peak_gb']:.1f} | {a['activations_gb']:.1f} | {a['step_ms']:,.0f} | "
            f"{a['host_gb']:.1f} | {a['host_ms']:,.0f}"
        )
        lines.append(
            f"| {r['policy']} | {auto} | {r['plan_s']:.1f} | {f['peak_gb']:.1f}"
            f"{'' if f['fits'] else ' (over)'} | {f['activations_gb']:.1f} | {f['step_ms']:,.0f} |"
        )
    lines += [
        "",
        "Step: the overlapped step the plan was chosen by. Host copies: bytes each device copies "
        "to and from pinned host memory per step (both directions together); t_H: their time "
        "on the 64 GB/s host link, Eq. 1's term (the overlapped step runs the copies on a copy "
        "engine per direction, beside compute).",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--md")
    args = ap.parse_args()
    rows = []
    for policy in POLICIES:
        rows.append(row(policy))
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"jax": jax.__version__, "mesh": MESH, "cluster": CLUSTER, "rows": rows}, f,
                      indent=1)  # fmt: skip
    text = markdown(rows)
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
