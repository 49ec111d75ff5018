"""The H100 layer timings of `bench/fidelity/layer_compute.py`, priced again by the current cost
model.

`bench/fidelity/results/layer_compute.json` holds what a lent H100 measured: every layer's
kernels inside the profiled train step (``in_step_ms``, attributed by their HLO ``op_name``). No
GPU is needed to price them again: each model is planned on an abstract one-device mesh (the
accelerator's fusion rules, as on the GPU) twice, with the H100 calibration's curves
(`bench/fidelity/results/calibration_h100.json`, "curves") and with its measured library calls
too (`bench/fidelity/results/calibration_h100_calls.json`, "calls": every matrix product and
convolution of the five models timed alone on the H100, `jaxpar.measure_contractions`). The
predicted compute is split per equation layer as the bench does
(`layer_compute.predicted_by_equation_layer`) and set beside the stored measurement: per layer,
per block (`layer_compute.block_rows`), for the layers that hold a library call and for the
others, and for the whole step (OptCNN Table 4 compares the
whole step: Σ t_C against the measured step time). The stored curves prediction of the device
run is shown as "then" (the cost model of that session).

    python bench/fidelity/layer_compute_repriced.py \\
        --json bench/fidelity/results/layer_compute_repriced.json \\
        --md bench/fidelity/results/layer_compute_repriced.md
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))

import jaxpar_zoo as zoo
from layer_compute import block_rows, op_layer, predicted_by_equation_layer, summarize

import jaxpar
from jaxpar.cost.contraction_calls import TABLE_PRIMITIVES
from jaxpar.cost.kernels import node_kernels
from jaxpar.cost.node_costs import node_work

RESULTS = os.path.join(os.path.dirname(__file__), "results")
MEASURED = os.path.join(RESULTS, "layer_compute.json")
CALIBRATION = os.path.join(RESULTS, "calibration_h100.json")
CALLS = os.path.join(RESULTS, "calibration_h100_calls.json")
SOURCES = {"curves": CALIBRATION, "calls": CALLS}
# OptCNN Table 4, 1 GPU: (estimated - actual) / actual per-step time
PAPER_1GPU = {"alexnet": 0.01, "vgg16": 0.00, "inception_v3": 0.01}


def reprice(result: dict) -> dict:
    """The stored layers of one model with the current model's in-step predictions."""
    ex = zoo.get(result["model"], small=result["small"])
    known = {r["layer"] for r in result["layers"]}
    rows = [
        {k: r[k] for k in ("layer", "gflop", "in_step_ms")} | {"then_ms": r["calibrated_eqn_ms"]}
        for r in result["layers"]
    ]
    step = {
        "measured_ms": result["step"]["measured_ms"],
        "then_ms": result["step"]["calibrated_ms"],
    }
    library = set()
    for source, path in SOURCES.items():
        plan = jaxpar.plan(ex.step, *ex.args, mesh={"data": 1}, cluster=path, memory_budget=None)
        by_layer = predicted_by_equation_layer(plan, known)
        for r in rows:
            ms = by_layer.get(r["layer"], 0.0) * 1e3
            r[f"{source}_eqn_ms"] = ms
            r[f"{source}_in_step_ratio"] = ms / max(r["in_step_ms"], 1e-9)
        step[f"{source}_ms"] = plan.cost.compute_s * 1e3
        step[f"{source}_ratio"] = plan.cost.compute_s * 1e3 / step["measured_ms"]
        step[f"{source}_kernels"] = kernel_split(plan)
        library = library_layers(plan, known)
    step["in_step_kernels"] = profile_split(result["step"]["profile"]["ops"])
    holding = [r for r in rows if r["layer"] in library]
    others = [r for r in rows if r["layer"] not in library]
    out = {"model": result["model"], "step": step, "layers": rows}
    for source in SOURCES:
        out[source] = summarize(rows, source, "in_step")
        out[f"{source}_blocks"] = summarize(block_rows(rows, [source]), source, "in_step")
        out[f"{source}_library"] = summarize(holding, source, "in_step")
        out[f"{source}_others"] = summarize(others, source, "in_step")
    out["then"] = result["summary_in_step"]["calibrated"]
    return out


# XLA:GPU's library-call kernels in a profile: cuBLAS, cuDNN and Triton gemm fusions
LIBRARY_OP = re.compile(r"^(custom-call|cublas|gemm_fusion|triton_gemm|cudnn)")


def kernel_split(plan) -> dict[str, float]:
    """The plan's Σ t_k (ms) and kernel count, split into kernels that run a library call and
    the others (fused elementwise work, reductions, copies)."""
    out = {"library_ms": 0.0, "library_kernels": 0, "other_ms": 0.0, "other_kernels": 0}
    for node in plan.ng.nodes:
        work = node_work(plan.ng, node, [plan.config(node.index)], plan.params)
        kernels = node_kernels(plan.ng, node, plan.params.fusion)
        for kernel, seconds in zip(kernels, work.kernel_seconds, strict=True):
            library = any(
                node.members[i].flops
                and plan.program.eqns[node.members[i].eqn].primitive in TABLE_PRIMITIVES
                for i in kernel.members
            )
            part = "library" if library else "other"
            out[f"{part}_ms"] += float(seconds[0]) * plan.program.trips(node.region) * 1e3
            out[f"{part}_kernels"] += kernel.runs
    return out


def profile_split(ops: list[dict]) -> dict[str, float]:
    """The same split of the kernels the device ran in the step (by HLO op, `LIBRARY_OP`)."""
    out = {"library_ms": 0.0, "library_kernels": 0, "other_ms": 0.0, "other_kernels": 0}
    for op in ops:
        part = "library" if LIBRARY_OP.match(op["op"]) else "other"
        out[f"{part}_ms"] += op["ms"]
        out[f"{part}_kernels"] += round(op["kernels"])
    return out


def library_layers(plan, known: set[str]) -> set[str]:
    """The layers (labelled as the profile labels kernels, `layer_compute.op_layer`) that hold
    a matrix product or convolution."""
    return {
        op_layer("step/" + e.name_stack + "/" + e.primitive, known)
        for e in plan.program.eqns
        if e.primitive in TABLE_PRIMITIVES
    }


def markdown(doc: dict) -> str:
    lines = [
        "# H100 layer timings priced again (no GPU needed)",
        "",
        f"`{doc['command']}`; measured on {doc['device']} (jax {doc['measured_jax']}), priced "
        f"with jax {doc['jax']}. Ratio = predicted / measured in the step; within 10 % means "
        "0.9 <= ratio <= 1.1. curves: the H100 calibration's throughput curves; calls: the same "
        "with every library call measured alone on the H100 (`jaxpar.measure_contractions`).",
        "",
        "## Whole step, one H100 (OptCNN Table 4's comparison)",
        "",
        "Σ t_C of the plan against the measured step time (forward, backward and update; the "
        "step's wall time, kernel gaps included).",
        "",
        "| model | measured ms | curves ms (difference) | calls ms (difference) "
        "| OptCNN Table 4, 1 GPU |",
        "|---|---|---|---|---|",
    ]
    for r in doc["results"]:
        w = r["step"]
        paper = PAPER_1GPU.get(r["model"])
        lines.append(
            f"| {r['model']} | {w['measured_ms']:.2f} | {w['curves_ms']:.2f} "
            f"({w['curves_ratio'] - 1:+.1%}) | {w['calls_ms']:.2f} ({w['calls_ratio'] - 1:+.1%}) "
            f"| {'' if paper is None else f'{paper:+.0%}'} |"
        )
    lines += [
        "",
        "## Library calls and the other kernels",
        "",
        "Σ t_k of the kernels that run a matrix product or convolution (cuBLAS, cuDNN, Triton "
        "gemm fusions on the device) and of the others, predicted with the measured calls "
        "beside the profiled step (kernel time, gaps left out). The step's library kernels also "
        "run what XLA fuses into them (cuDNN's bias and activation epilogues); the model prices "
        "that work among the others.",
        "",
        "| model | library: predicted ms (kernels) | in step ms (kernels) | ratio "
        "| others: predicted ms (kernels) | in step ms (kernels) | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in doc["results"]:
        p, m = r["step"]["calls_kernels"], r["step"]["in_step_kernels"]
        lines.append(
            f"| {r['model']} | {p['library_ms']:.2f} ({p['library_kernels']}) | "
            f"{m['library_ms']:.2f} ({m['library_kernels']}) | "
            f"{p['library_ms'] / m['library_ms']:.3f} | {p['other_ms']:.2f} "
            f"({p['other_kernels']}) | {m['other_ms']:.2f} ({m['other_kernels']}) | "
            f"{p['other_ms'] / m['other_ms']:.3f} |"
        )
    lines += [
        "",
        "## Per layer, in the step",
        "",
        "| model | layers | within 10 %: then / curves / calls | median: curves / calls "
        "| Σ ratio: curves / calls | layers with a library call: within 10 % curves / calls "
        "(median calls) | other layers: within 10 % curves / calls (median calls) "
        "| blocks within 10 %: curves / calls |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["results"]:
        c, m = r["curves"], r["calls"]
        cl, ml, co, mo = (
            r["curves_library"],
            r["calls_library"],
            r["curves_others"],
            r["calls_others"],
        )
        lines.append(
            f"| {r['model']} | {c['layers']} | {r['then']['within_10pct']} / {c['within_10pct']} / "
            f"{m['within_10pct']} | {c['median_ratio']:.3f} / {m['median_ratio']:.3f} | "
            f"{c['sum_ratio']:.3f} / {m['sum_ratio']:.3f} | {cl['within_10pct']} / "
            f"{ml['within_10pct']} of {ml['layers']} ({ml['median_ratio']:.3f}) | "
            f"{co['within_10pct']} / {mo['within_10pct']} of {mo['layers']} "
            f"({mo['median_ratio']:.3f}) | {r['curves_blocks']['within_10pct']} / "
            f"{r['calls_blocks']['within_10pct']} of {r['calls_blocks']['layers']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--md", default=None)
    args = parser.parse_args()
    import jax

    with open(MEASURED) as f:
        measured = json.load(f)
    doc = {
        "command": "python bench/fidelity/layer_compute_repriced.py " + " ".join(sys.argv[1:]),
        "device": measured["device"],
        "measured_jax": measured["jax"],
        "jax": jax.__version__,
        "results": [reprice(r) for r in measured["results"]],
    }
    for r in doc["results"]:
        print(r["model"], {s: r[s]["within_10pct"] for s in SOURCES}, r["step"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1, default=str)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(doc))


if __name__ == "__main__":
    main()
