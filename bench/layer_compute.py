"""Predicted vs measured per-layer compute on one device (OptCNN Table 4: within 10 %).

For each model, the train step is planned on a one-device mesh twice: with the datasheet
cluster (`--datasheet`, e.g. dgx-h100) and with a calibration file (`jaxpar calibrate`). A
layer is the planning nodes of one layer label in the forward and backward passes (the
optimizer's update is left out); its predicted compute is Σ t_C of those nodes. Its measured
compute is the same equations cut out of the traced program and run on their own: inputs are
the tensors the group reads from outside (random values of their shapes and dtypes), outputs
what the rest of the step reads from it, jitted as one program and timed (`measure.
median_seconds`: warm-up, back-to-back calls, median of repeats). Groups with identical
equations, shapes and wiring (the repeated blocks of a ResNet stage or a GPT) are timed once.
The whole jitted step is timed too, beside Σ t_C of every node.

    python bench/layer_compute.py --calibration bench/results/calibration_h100.json \\
        --datasheet dgx-h100 --json bench/results/layer_compute.json \\
        --md bench/results/layer_compute.md
    python bench/layer_compute.py --small --models mlp --calibration cal.json --datasheet cpu

Ratios are predicted / measured; "within 10 %" means 0.9 <= ratio <= 1.1. Each layer runs as a
program of its own, so a small layer's measured time is the host's per-call dispatch, not the
device's work (in the whole step there is no such call per layer): the per-call floor of a
trivial program is measured too, and layers measured under twice that floor are counted apart
("device-bound" layers are the others).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax
import jax.numpy as jnp
import numpy as np

import jaxpar
import models
from jaxpar.cost import node_kernels
from jaxpar.graph import BACKWARD, FORWARD, Program
from jaxpar.measure import Sweep, median_seconds
from jaxpar.report import layer_name

TIMING = Sweep(
    matmul_sizes=(),
    conv_shapes=(),
    memory_elements=(),
    message_bytes=(),
    chain=1,
    chain_flops=0.0,
    calls=5,  # back-to-back calls per timed run
    repeats=7,  # timed runs; the median is kept
    warmup=2,
    warm_up_s=0.0,
)


@dataclasses.dataclass(frozen=True)
class LayerGroup:
    """The forward and backward equations of one layer label, cut out of the step."""

    label: str  # the report's layer name
    eqns: tuple[int, ...]  # equation indices, program order
    nodes: tuple[int, ...]  # the planning nodes they belong to
    inputs: tuple[int, ...]  # tensors read from outside the group (not constants)
    outputs: tuple[int, ...]  # tensors produced here and read after it (or step results)


def layer_groups(plan: Any) -> list[LayerGroup]:
    """Per layer label, the forward/backward nodes' equations, inputs and outputs."""
    program: Program = plan.program
    nodes_of: dict[str, list[int]] = {}
    for node in plan.ng.nodes:
        if node.phase in (FORWARD, BACKWARD) and node.anchor >= 0:
            nodes_of.setdefault(layer_name(plan, node.index), []).append(node.index)
    readers = program.consumers()
    results = {t for t in program.outvars if t is not None}
    groups = []
    for label, nodes in nodes_of.items():
        eqns = sorted(m.eqn for n in nodes for m in plan.ng.nodes[n].members if m.eqn >= 0)
        inside = set(eqns)
        made = {t for e in eqns for t in program.eqns[e].outputs}
        reads = [t for e in eqns for t in program.eqns[e].inputs if t is not None]
        inputs = tuple(dict.fromkeys(t for t in reads if t not in made and t not in program.consts))
        outputs = tuple(
            t
            for e in eqns
            for t in program.eqns[e].outputs
            if t in results or any(r not in inside for r in readers.get(t, ()))
        )
        groups.append(LayerGroup(label, tuple(eqns), tuple(nodes), inputs, outputs))
    return groups


def group_key(program: Program, group: LayerGroup) -> tuple:
    """What makes two groups the same program: per equation its primitive, params, operand
    shapes/dtypes and where each operand comes from (an input position or an earlier output;
    a constant by its shape and dtype, as its values do not change the time)."""
    where: dict[int, tuple] = {t: ("in", i) for i, t in enumerate(group.inputs)}
    key = []
    for k, e in enumerate(group.eqns):
        eqn = program.eqns[e]
        sources = []
        for t, lit in zip(eqn.inputs, eqn.literals, strict=True):
            if t is None:
                sources.append(("lit", repr(lit)))
            else:
                tensor = program.tensors[t]
                sources.append((where.get(t), tensor.shape, tensor.dtype))
        for j, t in enumerate(eqn.outputs):
            where[t] = ("eqn", k, j)
        key.append((eqn.primitive, str(eqn.params), tuple(sources)))
    key.append(tuple(where[t] for t in group.outputs))
    return tuple(key)


def group_program(program: Program, group: LayerGroup):
    """The group's equations as a function of its inputs returning its outputs (jit it)."""

    def run(*values: Any) -> list[Any]:
        env = dict(program.consts)
        env.update(zip(group.inputs, values, strict=True))
        for e in group.eqns:
            eqn = program.eqns[e]
            pairs = zip(eqn.inputs, eqn.literals, strict=True)
            args = [lit if t is None else env[t] for t, lit in pairs]
            if eqn.primitive == "sharding_constraint":
                outs = [args[0]]
            else:
                outs = eqn.bind.bind(*args, **eqn.bind.get_bind_params(eqn.params))
                if not eqn.bind.multiple_results:
                    outs = [outs]
            env.update(zip(eqn.outputs, outs, strict=True))
        return [env[t] for t in group.outputs]

    return run


NOISE = np.random.default_rng(0).standard_normal(1 << 20, dtype=np.float32) * 0.1


def example_inputs(program: Program, group: LayerGroup) -> list[Any] | None:
    """Values of the group's input shapes and dtypes: floats from a fixed block of normal(0,
    0.1²) noise repeated to size (cheap for gigabyte inputs), integers and booleans 0; None when
    an input has an opaque dtype (PRNG keys)."""
    values = []
    for t in group.inputs:
        tensor = program.tensors[t]
        if tensor.opaque:
            return None
        dtype = jnp.dtype(tensor.dtype)
        if jnp.issubdtype(dtype, jnp.floating):
            values.append(jnp.asarray(np.resize(NOISE, tensor.shape), dtype=dtype))
        else:
            values.append(jnp.zeros(tensor.shape, dtype))
    return values


def group_flops(plan: Any, group: LayerGroup) -> float:
    return float(sum(m.flops for n in group.nodes for m in plan.ng.nodes[n].members))


def predicted(plan: Any, nodes: tuple[int, ...]) -> float:
    """Σ t_C of the nodes under the plan."""
    rows = plan.evaluation.node_rows
    return float(sum(rows[n].t_C for n in nodes))


def dispatch_floor() -> float:
    """Seconds per call of a trivial jitted program (x + 1 on 1,024 floats), timed like the
    layers: what a layer program costs however little the device does."""
    x = jnp.ones((1024,), jnp.float32)
    return median_seconds(jax.jit(lambda x: x + 1.0), (x,), TIMING)


def group_kernels(plan: Any, group: LayerGroup) -> int:
    """Kernels the cost model prices for the group's nodes (`cost.node_kernels`)."""
    return sum(len(node_kernels(plan.ng, plan.ng.nodes[n])) for n in group.nodes)


def measure_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Plan `name` twice (datasheet, calibration), time every layer group and the whole step."""
    ex = models.get(name, small=args.small)
    mesh = jaxpar.make_mesh({"data": 1})
    started = time.perf_counter()
    plans = {
        "datasheet": jaxpar.plan(
            ex.step, *ex.args, mesh=mesh, cluster=args.datasheet, memory_budget=None
        ),
        "calibrated": jaxpar.plan(
            ex.step, *ex.args, mesh=mesh, cluster=args.calibration, memory_budget=None
        ),
    }
    plan = plans["calibrated"]
    assert len(plan.ng.nodes) == len(plans["datasheet"].ng.nodes)
    print(f"{name}: planned twice in {time.perf_counter() - started:.1f} s", flush=True)
    groups = layer_groups(plan)
    floor_s = dispatch_floor()
    timed: dict[tuple, float] = {}
    rows = []
    started = time.perf_counter()
    for group in groups:
        key = group_key(plan.program, group)
        if key not in timed:
            values = example_inputs(plan.program, group)
            if values is None:
                continue
            fn = jax.jit(group_program(plan.program, group))
            timed[key] = median_seconds(fn, values, TIMING)
        measured_s = timed[key]
        row = {
            "layer": group.label,
            "equations": len(group.eqns),
            "gflop": group_flops(plan, group) / 1e9,
            "kernels": group_kernels(plan, group),
            "measured_ms": measured_s * 1e3,
            "device_bound": measured_s >= 2 * floor_s,
        }
        for source, p in plans.items():
            row[f"{source}_ms"] = predicted(p, group.nodes) * 1e3
            row[f"{source}_ratio"] = row[f"{source}_ms"] / row["measured_ms"]
        rows.append(row)
    print(
        f"{name}: {len(rows)} layers, {len(timed)} distinct programs timed in "
        f"{time.perf_counter() - started:.1f} s",
        flush=True,
    )
    state, batch = ex.make_args(0)
    step = jax.jit(ex.step)
    step_s = median_seconds(step, (state, batch), TIMING)
    whole = {"measured_ms": step_s * 1e3}
    for source, p in plans.items():
        whole[f"{source}_ms"] = p.cost.compute_s * 1e3
        whole[f"{source}_ratio"] = p.cost.compute_s / step_s
    return {
        "model": name,
        "small": args.small,
        "batch": int(jax.tree.leaves(ex.args[1])[0].shape[0]),
        "layers": rows,
        "dispatch_floor_ms": floor_s * 1e3,
        "step": whole,
        "summary": {s: summarize(rows, s) for s in plans},
    }


def summarize(rows: list[dict], source: str) -> dict[str, Any]:
    """Within 10 %, median ratio, and the worst layers, for one prediction source."""
    ratios = [r[f"{source}_ratio"] for r in rows]
    within = [r for r in rows if 0.9 <= r[f"{source}_ratio"] <= 1.1]
    by_error = sorted(rows, key=lambda r: -abs(np.log(max(r[f"{source}_ratio"], 1e-9))))
    bound = [r for r in rows if r.get("device_bound", True)]
    return {
        "layers": len(rows),
        "within_10pct": len(within),
        "within_25pct": sum(0.75 <= r[f"{source}_ratio"] <= 1.25 for r in rows),
        "median_ratio": statistics.median(ratios) if ratios else None,
        "device_bound_layers": len(bound),
        "device_bound_within_10pct": sum(0.9 <= r[f"{source}_ratio"] <= 1.1 for r in bound),
        "device_bound_median_ratio": (
            statistics.median(r[f"{source}_ratio"] for r in bound) if bound else None
        ),
        "sum_ratio": sum(r[f"{source}_ms"] for r in rows) / sum(r["measured_ms"] for r in rows),
        "worst": [(r["layer"], r[f"{source}_ratio"]) for r in by_error[:5]],
    }


def markdown(results: list[dict], header: dict[str, Any]) -> str:
    lines = [
        "# Per-layer compute: predicted vs measured (one device)",
        "",
        f"Device: {header['device']}; jax {header['jax']}; command: `{header['command']}`",
        "",
        "Ratio = predicted / measured; within 10 % means 0.9 <= ratio <= 1.1 (OptCNN Table 4).",
        "",
    ]
    for res in results:
        lines += [
            f"## {res['model']}{' (small)' if res['small'] else ''}, batch {res['batch']}",
            "",
            f"Per-call floor of a trivial program: {res.get('dispatch_floor_ms', 0):.3f} ms; "
            "device-bound layers: measured at least twice that.",
            "",
            "| prediction | layers within 10 % | within 25 % | median ratio | Σ pred / Σ meas "
            "| device-bound layers within 10 % | their median ratio | worst (ratio) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for source, s in res["summary"].items():
            worst = ", ".join(f"{w} ({r:.2f})" for w, r in s["worst"][:3])
            lines.append(
                f"| {source} | {s['within_10pct']} / {s['layers']} | {s.get('within_25pct')} | "
                f"{s['median_ratio']:.2f} | {s.get('sum_ratio', float('nan')):.2f} | "
                f"{s.get('device_bound_within_10pct')} / {s.get('device_bound_layers')} | "
                f"{s.get('device_bound_median_ratio') or float('nan'):.2f} | {worst} |"
            )
        w = res["step"]
        lines += [
            "",
            f"Whole step (forward, backward and update): measured {w['measured_ms']:.3f} ms; "
            f"Σ t_C datasheet {w['datasheet_ms']:.3f} ms ({w['datasheet_ratio']:.2f}), "
            f"calibrated {w['calibrated_ms']:.3f} ms ({w['calibrated_ratio']:.2f}).",
            "",
            "| layer | GFLOP | kernels | measured ms | datasheet ms (ratio) | calibrated ms "
            "(ratio) |",
            "|---|---|---|---|---|---|",
        ]
        for r in res["layers"]:
            bound = "" if r.get("device_bound", True) else " (floor)"
            lines.append(
                f"| {r['layer']} | {r['gflop']:.3f} | {r.get('kernels', '')} | "
                f"{r['measured_ms']:.4f}{bound} | "
                f"{r['datasheet_ms']:.4f} ({r['datasheet_ratio']:.2f}) | "
                f"{r['calibrated_ms']:.4f} ({r['calibrated_ratio']:.2f}) |"
            )
        lines.append("")
    return "\n".join(lines)


def before_after(before: list[dict], after: list[dict]) -> str:
    """A table per model: each prediction source of an earlier run (``before``, e.g. the
    committed results of an older cost model) beside this run's."""
    lines = [
        "## Before and after",
        "",
        "| model | prediction | layers within 10 % | within 25 % | median ratio | Σ pred / Σ meas "
        "| whole step Σ t_C / measured |",
        "|---|---|---|---|---|---|---|",
    ]
    old = {res["model"]: res for res in before}
    for res in after:
        for label, doc in (("before", old.get(res["model"])), ("after", res)):
            if doc is None:
                continue
            rows = doc["layers"]
            for source in doc["summary"]:
                ratios = [r[f"{source}_ratio"] for r in rows]
                total = sum(r[f"{source}_ms"] for r in rows) / sum(r["measured_ms"] for r in rows)
                lines.append(
                    f"| {res['model']} | {source} ({label}) | "
                    f"{sum(0.9 <= x <= 1.1 for x in ratios)} / {len(rows)} | "
                    f"{sum(0.75 <= x <= 1.25 for x in ratios)} | "
                    f"{statistics.median(ratios):.2f} | {total:.2f} | "
                    f"{doc['step'][f'{source}_ms']:.1f} / {doc['step']['measured_ms']:.1f} ms "
                    f"({doc['step'][f'{source}_ratio']:.2f}) |"
                )
    return "\n".join(lines) + "\n\n"


def merge(
    paths: list[str], json_path: str | None, md_path: str | None, before: str | None = None
) -> None:
    """One --json / --md from several runs' --json files (the header of the first, every run's
    command); ``before``: an earlier merged --json to compare with in the markdown."""
    docs = []
    for path in paths:
        with open(path) as f:
            docs.append(json.load(f))
    header = {k: v for k, v in docs[0].items() if k != "results"}
    header["command"] = "; ".join(doc["command"] for doc in docs)
    results = [res for doc in docs for res in doc["results"]]
    if json_path:
        with open(json_path, "w") as f:
            json.dump({**header, "results": results}, f, indent=1)
    if md_path:
        text = markdown(results, header)
        if before:
            with open(before) as f:
                old = json.load(f)["results"]
            head, _, rest = text.partition("\n## ")
            text = head + "\n" + before_after(old, results) + "## " + rest
        with open(md_path, "w") as f:
            f.write(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calibration", help="a jaxpar calibrate file")
    parser.add_argument("--datasheet", default="dgx-h100", help="the datasheet preset")
    parser.add_argument("--models", nargs="+", default=["resnet50", "gpt2_124m"])
    parser.add_argument("--small", action="store_true", help="the small test configs")
    parser.add_argument("--json", default=None)
    parser.add_argument("--md", default=None)
    parser.add_argument(
        "--merge", nargs="+", metavar="JSON", help="combine earlier --json outputs (no runs)"
    )
    parser.add_argument("--before", help="with --merge: an earlier merged --json to compare")
    args = parser.parse_args()
    if args.merge:
        merge(args.merge, args.json, args.md, args.before)
        return
    if not args.calibration:
        parser.error("--calibration FILE is needed (write one with jaxpar calibrate)")
    device = jax.devices()[0]
    header = {
        "device": f"{device.device_kind} ({device.platform})",
        "jax": jax.__version__,
        "command": "python bench/layer_compute.py " + " ".join(sys.argv[1:]),
        "calibration": args.calibration,
        "datasheet": args.datasheet,
    }
    results = []
    for name in args.models:
        res = measure_model(name, args)
        results.append(res)
        for source, s in res["summary"].items():
            worst = ", ".join(f"{w} {r:.2f}" for w, r in s["worst"][:3])
            print(
                f"  {source:<10} within 10 %: {s['within_10pct']}/{s['layers']}, median ratio "
                f"{s['median_ratio']:.3f}; worst: {worst}"
            )
        w = res["step"]
        print(
            f"  whole step: measured {w['measured_ms']:.3f} ms, Σ t_C datasheet "
            f"{w['datasheet_ms']:.3f} ms, calibrated {w['calibrated_ms']:.3f} ms",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**header, "results": results}, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(results, header))


if __name__ == "__main__":
    main()
