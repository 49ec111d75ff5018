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

In step: the whole step is also profiled (`jax.profiler`, ``--calls`` steps) and every kernel the
device ran is attributed to a layer by its HLO instruction's ``op_name`` metadata (the JAX name
stack; `hlo_op_names`, `op_layer`). That side is predicted per equation layer: each kernel of
the model is split among its equations' layers by the elements they write
(`predicted_by_equation_layer`), and both are also summed per repeated block (`block_rows`).
On a GPU run it with ``XLA_FLAGS=--xla_gpu_enable_command_buffer=`` (kernels in a CUDA graph
carry no ``hlo_op``).

    python bench/fidelity/layer_compute.py \\
        --calibration bench/fidelity/results/calibration_h100.json \\
        --datasheet dgx-h100 --json bench/fidelity/results/layer_compute.json \\
        --md bench/fidelity/results/layer_compute.md
    python bench/fidelity/layer_compute.py --small --models mlp --calibration cal.json \\
        --datasheet cpu

Ratios are predicted / measured; "within 10 %" means 0.9 <= ratio <= 1.1. Each layer runs as a
program of its own, so a small layer's measured time is the host's per-call dispatch, not the
device's work (in the whole step there is no such call per layer): the per-call floor of a
trivial program is measured too, and layers measured under twice that floor are counted apart
("device-bound" layers are the others).
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import gzip
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import jax
import jax.numpy as jnp
import jaxpar_zoo as zoo
import numpy as np

import jaxpar
from jaxpar.cost.contraction_calls import plan_calls
from jaxpar.cost.kernels import node_kernels
from jaxpar.cost.node_costs import node_work
from jaxpar.nodes.repeated_blocks import block_of
from jaxpar.planner.report import layer_name
from jaxpar.program.graph import BACKWARD, FORWARD, UPDATE, Program, layer_of, phase_of
from jaxpar.runtime.calibrate import Sweep, median_seconds
from jaxpar.runtime.measure_contractions import profiled_kernels

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


def predicted_by_equation_layer(plan: Any, known: set[str]) -> dict[str, float]:
    """The plan's Σ t_C of the forward and backward nodes, per layer label of the *equations*
    (the label XLA's op metadata carries), not of the nodes: a planning node gathers the
    elementwise followers of its anchor, which may sit in other layers (a ResNet stage's
    residual adds and ReLUs join the projection's node, an optimizer's update its gradient's),
    so each kernel's t_k is shared among its members' layers in proportion to the elements
    they write, each member labelled from its name stack as the profile's ops are (`op_layer`:
    optimizer work goes to "(optimizer)", which the comparison leaves out). Checks that the
    kernels add up to each node's t_C."""
    program = plan.program
    out: dict[str, float] = {}
    for node in plan.ng.nodes:
        if node.phase not in (FORWARD, BACKWARD) or node.anchor < 0:
            continue
        kernels = node_kernels(plan.ng, node, plan.params.fusion)
        work = node_work(plan.ng, node, [plan.config(node.index)], plan.params)
        times = [float(t[0]) * plan.program.trips(node.region) for t in work.kernel_seconds]
        t_c = plan.evaluation.node_rows[node.index].t_C
        assert abs(sum(times) - t_c) <= 1e-6 * max(t_c, 1e-9) + 1e-12, (node.index, times, t_c)
        for kernel, seconds in zip(kernels, times, strict=True):
            weights: dict[str, float] = {}
            for i in kernel.members:
                eqn = program.eqns[node.members[i].eqn]
                label = op_layer("step/" + eqn.name_stack + "/" + eqn.primitive, known)
                size = sum(program.tensors[t].size for t in eqn.outputs) or 1
                weights[label] = weights.get(label, 0.0) + size
            total = sum(weights.values())
            for label, w in weights.items():
                out[label] = out.get(label, 0.0) + seconds * w / total
    return out


def dispatch_floor() -> float:
    """Seconds per call of a trivial jitted program (x + 1 on 1,024 floats), timed like the
    layers: what a layer program costs however little the device does."""
    x = jnp.ones((1024,), jnp.float32)
    return median_seconds(jax.jit(lambda x: x + 1.0), (x,), TIMING)


def group_kernels(plan: Any, group: LayerGroup) -> int:
    """Kernels the cost model prices for the group's nodes (`kernels.node_kernels`)."""
    return sum(len(node_kernels(plan.ng, plan.ng.nodes[n])) for n in group.nodes)


# ---- in-step: the whole step profiled, kernel time attributed to layers ----------------------

_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%?([^\s=]+) = ")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([^\s(]+)\s.*\{\s*$")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_CALLS = re.compile(r"calls=%?([^\s,)}]+)")
_OPERAND = re.compile(r"%([^\s,)}]+)")


def hlo_op_names(hlo_text: str) -> tuple[dict[str, str], set[str]]:
    """Instruction name -> its ``op_name`` metadata (the JAX name stack and primitive) in a
    compiled module's text, and which names were inferred. A fusion without metadata of its
    own takes its fused root's; an instruction a pass created without any (XLA:CPU's rewritten
    backward convolutions, layout copies) takes its nearest operand's that has one."""
    own: dict[str, str] = {}
    calls: dict[str, str] = {}
    operands: dict[str, list[str]] = {}
    root_of: dict[str, str] = {}
    computation = ""
    for line in hlo_text.splitlines():
        m = _INSTRUCTION.match(line)
        if not m:
            c = _COMPUTATION.match(line)
            if c:
                computation = c.group(1)
            continue
        name = m.group(2)
        op = _OP_NAME.search(line)
        if op:
            own[name] = op.group(1)
        called = _CALLS.search(line)
        if called:
            calls[name] = called.group(1)
        body = line[m.end() :].split("metadata=")[0]
        operands[name] = [o for o in _OPERAND.findall(body) if o != name]
        if m.group(1):
            root_of[computation] = name
    names = dict(own)
    for name, comp in calls.items():
        if name not in names and root_of.get(comp) in own:
            names[name] = own[root_of[comp]]
    inferred: set[str] = set()
    for name in operands:
        if name in names:
            continue
        frontier, seen = list(operands[name]), {name}
        for _ in range(8):  # breadth-first over operands, a few steps deep
            found = next((names[o] for o in frontier if o in names), None)
            if found is not None:
                names[name] = found
                inferred.add(name)
                break
            seen.update(frontier)
            frontier = [p for o in frontier for p in operands.get(o, ()) if p not in seen]
    return names, inferred


def _stats(event: Any) -> dict[str, Any]:
    return {k: v for k, v in event.stats}


def profile_kernels(
    fn: Any, args: Sequence[Any], calls: int
) -> tuple[list[tuple[str, float]], str]:
    """(HLO op, device seconds) of every kernel the device ran over ``calls`` profiled calls of
    ``fn`` (after one warm call), and where they were read (`measure_contractions.
    profiled_kernels`: an accelerator's device planes, or on CPU the host's thunk events)."""
    jax.block_until_ready(fn(*args))
    return profiled_kernels(fn, args, calls)


def profile_layout(fn: Any, args: Sequence[Any]) -> list[dict[str, Any]]:
    """Planes, lines and a few events with their stats of one profiled call: what a device's
    profile holds, saved beside the results so the attribution can be checked."""
    jax.block_until_ready(fn(*args))
    with tempfile.TemporaryDirectory() as where:
        with jax.profiler.trace(where):
            jax.block_until_ready(fn(*args))
        (path,) = glob.glob(os.path.join(where, "**", "*.xplane.pb"), recursive=True)
        data = jax.profiler.ProfileData.from_file(path)
        return [
            {
                "plane": plane.name,
                "lines": [
                    {
                        "line": line.name,
                        "events": [
                            {"name": e.name, "ns": e.duration_ns, "stats": repr(_stats(e))[:400]}
                            for e in list(line.events)[:6]
                        ],
                    }
                    for line in plane.lines
                ],
            }
            for plane in data.planes
        ]


def op_layer(op_name: str, known: set[str]) -> str:
    """The layer an HLO op belongs to from its ``op_name`` (``jit(step)/<name stack>/<primitive>``):
    the longest known layer label that prefixes its module path; "(optimizer)" for the update,
    "(forward)" / "(backward)" when no label matches (as `report.layer_name` names nodes
    without one)."""
    stack = "/".join(op_name.split("/")[1:-1])
    phase = phase_of(stack)
    if phase == UPDATE:
        return "(optimizer)"
    label = layer_of(stack)
    while label and label not in known:
        label = label.rpartition("/")[0]
    return label or ("(backward)" if phase == BACKWARD else "(forward)")


def in_step_layer_seconds(
    fn: Any, args: Sequence[Any], known: set[str], calls: int, hlo_path: str | None = None
) -> tuple[dict[str, float], dict[str, Any]]:
    """Per layer label, device seconds per step spent in its kernels inside the whole compiled
    step (kernels attributed by their HLO op's name stack), and a summary: total kernel time per
    step, what could not be attributed, and where the kernels were read. ``hlo_path``: write
    the compiled step's HLO text there, gzipped (the device's fusions, for later study)."""
    jitted = jax.jit(fn)
    hlo_text = jitted.lower(*args).compile().as_text()
    if hlo_path:
        with gzip.open(hlo_path, "wt") as f:
            f.write(hlo_text)
    names, inferred = hlo_op_names(hlo_text)
    norm = {re.sub(r"[.\-]", "_", n): n for n in names}
    kernels, source = profile_kernels(jitted, args, calls)
    per_layer: dict[str, float] = {}
    per_op: dict[str, list] = {}  # HLO op -> [op_name, layer, seconds per step, kernels]
    unknown = guessed = 0.0
    for op, seconds in kernels:
        hlo = op if op in names else norm.get(re.sub(r"[.\-]", "_", op))
        if hlo is None:
            unknown += seconds
            continue
        if hlo in inferred:
            guessed += seconds
        layer = op_layer(names[hlo], known)
        per_layer[layer] = per_layer.get(layer, 0.0) + seconds / calls
        entry = per_op.setdefault(hlo, [names[hlo], layer, 0.0, 0])
        entry[2] += seconds / calls
        entry[3] += 1
    total = sum(s for _, s in kernels) / calls
    return per_layer, {
        "kernel_ms_per_step": total * 1e3,
        "unmatched_ms_per_step": unknown / calls * 1e3,
        "inferred_ms_per_step": guessed / calls * 1e3,
        "kernels_per_step": len(kernels) / calls,
        "read_from": source,
        "ops": sorted(
            (
                {"op": k, "op_name": v[0], "layer": v[1], "ms": v[2] * 1e3, "kernels": v[3] / calls}
                for k, v in per_op.items()
            ),
            key=lambda d: -d["ms"],
        ),
        "optimizer_ms": per_layer.get("(optimizer)", 0.0) * 1e3,
        "unlabelled_ms": (per_layer.get("(forward)", 0.0) + per_layer.get("(backward)", 0.0)) * 1e3,
    }


def measure_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Plan `name` twice (datasheet, calibration), time every layer group and the whole step."""
    ex = zoo.get(name, small=args.small)
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
    contractions = {}
    if args.measure_contractions:
        started_calls = time.perf_counter()
        args.tabled = jaxpar.measure_contractions(plans["calibrated"], args.tabled)
        plans["measured_calls"] = jaxpar.plan(
            ex.step, *ex.args, mesh=mesh, cluster=args.tabled, memory_budget=None
        )
        print(
            f"{name}: {len(args.tabled.contractions)} library calls measured in "
            f"{time.perf_counter() - started_calls:.1f} s",
            flush=True,
        )
        if args.save_calibration:
            args.tabled.save(args.save_calibration)
        table = args.tabled.contraction_table
        for call in plan_calls(plan.ng, plan.tables.configs, plan.params.mesh.sizes):
            if call.key in table:
                contractions[call.key] = table[call.key]
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
    known = {row["layer"] for row in rows}
    hlo_path = os.path.join(args.hlo_dir, f"{name}.hlo.gz") if args.hlo_dir else None
    in_step, profile = in_step_layer_seconds(
        ex.step, (state, batch), known, calls=args.calls, hlo_path=hlo_path
    )
    by_equation = {s: predicted_by_equation_layer(p, known) for s, p in plans.items()}
    for row in rows:
        row["in_step_ms"] = in_step.get(row["layer"], 0.0) * 1e3
        for source in plans:
            row[f"{source}_eqn_ms"] = by_equation[source].get(row["layer"], 0.0) * 1e3
            row[f"{source}_in_step_ratio"] = row[f"{source}_eqn_ms"] / max(row["in_step_ms"], 1e-9)
    whole["profile"] = profile
    units = block_rows(rows, list(plans))
    brief = {k: v for k, v in profile.items() if k != "ops"}
    print(f"{name}: in-step profile {brief}", flush=True)
    return {
        "model": name,
        "small": args.small,
        "batch": int(jax.tree.leaves(ex.args[1])[0].shape[0]),
        "layers": rows,
        "dispatch_floor_ms": floor_s * 1e3,
        "step": whole,
        "summary": {s: summarize(rows, s) for s in plans},
        "summary_in_step": {s: summarize(rows, s, "in_step") for s in plans},
        "blocks": units,
        "summary_blocks": {s: summarize(units, s, "in_step") for s in plans},
        "contractions": contractions,
    }


def block_unit(label: str) -> str:
    """The repeated block a layer label sits in (``ResNet/stage1_block2/conv1`` ->
    ``ResNet/stage1_block2``, ``GPT/block3/attn/qkv`` -> ``GPT/block3``), else the label."""
    found = block_of(label)
    if found is None:
        return label
    family, index = found
    return family.replace("#", str(index))


def block_rows(rows: list[dict], sources: list[str]) -> list[dict]:
    """Layers summed per block (`block_unit`): predicted and in-step measured. A fusion that
    XLA forms across two layers of a block is timed under one of them and priced under the
    other; within the block it is one term on both sides."""
    units: dict[str, dict] = {}
    for r in rows:
        u = units.setdefault(
            block_unit(r["layer"]),
            {"layer": block_unit(r["layer"]), "layers": 0, "gflop": 0.0, "in_step_ms": 0.0},
        )
        u["layers"] += 1
        u["gflop"] += r["gflop"]
        u["in_step_ms"] += r.get("in_step_ms", 0.0)
        for source in sources:
            u[f"{source}_ms"] = u.get(f"{source}_ms", 0.0) + r[f"{source}_eqn_ms"]
    for u in units.values():
        for source in sources:
            u[f"{source}_eqn_ms"] = u[f"{source}_ms"]
            u[f"{source}_in_step_ratio"] = u[f"{source}_ms"] / max(u["in_step_ms"], 1e-9)
    return list(units.values())


def summarize(rows: list[dict], source: str, measure: str = "") -> dict[str, Any]:
    """Within 10 %, median ratio, and the worst layers, for one prediction source against one
    measurement: the layer run on its own (``measure=""``) or its kernels in the whole step
    (``"in_step"``; layers that ran no kernel of their own there are left out)."""
    key = f"{source}_{measure}_ratio" if measure else f"{source}_ratio"
    measured = f"{measure}_ms" if measure else "measured_ms"
    rows = [r for r in rows if r.get(measured, 0.0) > 0.0]
    ratios = [r[key] for r in rows]
    within = [r for r in rows if 0.9 <= r[key] <= 1.1]
    by_error = sorted(rows, key=lambda r: -abs(np.log(max(r[key], 1e-9))))
    bound = [r for r in rows if measure or r.get("device_bound", True)]
    return {
        "layers": len(rows),
        "within_10pct": len(within),
        "within_25pct": sum(0.75 <= r[key] <= 1.25 for r in rows),
        "median_ratio": statistics.median(ratios) if ratios else None,
        "device_bound_layers": len(bound),
        "device_bound_within_10pct": sum(0.9 <= r[key] <= 1.1 for r in bound),
        "device_bound_median_ratio": (statistics.median(r[key] for r in bound) if bound else None),
        "sum_ratio": sum(r[f"{source}_eqn_ms" if measure else f"{source}_ms"] for r in rows)
        / sum(r[measured] for r in rows),
        "worst": [(r["layer"], r[key]) for r in by_error[:5]],
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
        summaries = [(f"{k} vs layer alone", v) for k, v in res["summary"].items()]
        summaries += [(f"{k} vs in step", v) for k, v in res.get("summary_in_step", {}).items()]
        summaries += [
            (f"{k} vs in step, per block", v) for k, v in res.get("summary_blocks", {}).items()
        ]
        for source, s in summaries:
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
            f"calibrated {w['calibrated_ms']:.3f} ms ({w['calibrated_ratio']:.2f})"
            + (
                f", with the measured calls {w['measured_calls_ms']:.3f} ms "
                f"({w['measured_calls_ratio']:.2f})."
                if "measured_calls_ms" in w
                else "."
            ),
        ]
        tabled = "measured_calls_ms" in w
        if res.get("blocks"):
            profile = w.get("profile", {})
            lines += [
                "",
                f"In-step profile ({profile.get('read_from')}): kernel time "
                f"{profile.get('kernel_ms_per_step', 0):.3f} ms per step, of which optimizer "
                f"{profile.get('optimizer_ms', 0):.3f} ms, unlabelled "
                f"{profile.get('unlabelled_ms', 0):.3f} ms, attributed through an operand "
                f"{profile.get('inferred_ms_per_step', 0):.3f} ms, unmatched "
                f"{profile.get('unmatched_ms_per_step', 0):.3f} ms.",
                "",
                "| block | layers | GFLOP | in step ms | datasheet ms (ratio) | calibrated ms "
                "(ratio) |" + (" measured calls ms (ratio) |" if tabled else ""),
                "|---|---|---|---|---|---|" + ("---|" if tabled else ""),
            ]
            for u in res["blocks"]:
                lines.append(
                    f"| {u['layer']} | {u['layers']} | {u['gflop']:.3f} | {u['in_step_ms']:.4f} | "
                    f"{u['datasheet_ms']:.4f} ({u['datasheet_in_step_ratio']:.2f}) | "
                    f"{u['calibrated_ms']:.4f} ({u['calibrated_in_step_ratio']:.2f}) |"
                    + (
                        f" {u['measured_calls_ms']:.4f} ({u['measured_calls_in_step_ratio']:.2f}) |"
                        if tabled
                        else ""
                    )
                )
        lines += [
            "",
            "| layer | GFLOP | kernels | alone ms | in step ms | datasheet: nodes ms (ratio "
            "alone); equations ms (ratio in step) | calibrated: the same |"
            + (" measured calls: the same |" if tabled else ""),
            "|---|---|---|---|---|---|---|" + ("---|" if tabled else ""),
        ]
        for r in res["layers"]:
            bound = "" if r.get("device_bound", True) else " (floor)"
            lines.append(
                f"| {r['layer']} | {r['gflop']:.3f} | {r.get('kernels', '')} | "
                f"{r['measured_ms']:.4f}{bound} | {r.get('in_step_ms', float('nan')):.4f} | "
                f"{r['datasheet_ms']:.4f} ({r['datasheet_ratio']:.2f}); "
                f"{r.get('datasheet_eqn_ms', float('nan')):.4f} "
                f"({r.get('datasheet_in_step_ratio', float('nan')):.2f}) | "
                f"{r['calibrated_ms']:.4f} ({r['calibrated_ratio']:.2f}); "
                f"{r.get('calibrated_eqn_ms', float('nan')):.4f} "
                f"({r.get('calibrated_in_step_ratio', float('nan')):.2f}) |"
                + (
                    f" {r['measured_calls_ms']:.4f} ({r['measured_calls_ratio']:.2f}); "
                    f"{r.get('measured_calls_eqn_ms', float('nan')):.4f} "
                    f"({r.get('measured_calls_in_step_ratio', float('nan')):.2f}) |"
                    if tabled
                    else ""
                )
            )
        lines.append("")
    return "\n".join(lines)


def before_after(before: list[dict], after: list[dict]) -> str:
    """A table per model: each prediction source of an earlier run (``before``, e.g. the
    committed results of an older cost model) beside this run's."""
    lines = [
        "## Before and after",
        "",
        "Before: each layer run as a program of its own, priced by its nodes' t_C. After: the "
        'same, and ("in step") each layer\'s kernels timed inside the whole profiled step, '
        "priced by its equations' share of their kernels' t_k (`predicted_by_equation_layer`); "
        '"blocks": summed per repeated block.',
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
            for key, what in (
                ("summary_in_step", "in step"),
                ("summary_blocks", "in step, blocks"),
            ):
                for source, sm in doc.get(key, {}).items():
                    lines.append(
                        f"| {res['model']} | {source} ({label}, {what}) | "
                        f"{sm['within_10pct']} / {sm['layers']} | {sm['within_25pct']} | "
                        f"{sm['median_ratio']:.2f} | {sm['sum_ratio']:.2f} | |"
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
    parser.add_argument("--calls", type=int, default=5, help="profiled steps (in-step timing)")
    parser.add_argument("--layout", help="write the profile's planes/lines of one step here")
    parser.add_argument("--json", default=None)
    parser.add_argument("--md", default=None)
    parser.add_argument(
        "--merge", nargs="+", metavar="JSON", help="combine earlier --json outputs (no runs)"
    )
    parser.add_argument("--before", help="with --merge: an earlier merged --json to compare")
    parser.add_argument(
        "--measure-contractions",
        action="store_true",
        help="also time every library call of the plans on this device (measure_contractions) "
        'and price a third way with that table ("measured_calls")',
    )
    parser.add_argument("--save-calibration", help="write the calibration with the table here")
    parser.add_argument("--hlo-dir", help="write each model's compiled step here (MODEL.hlo.gz)")
    args = parser.parse_args()
    if args.merge:
        merge(args.merge, args.json, args.md, args.before)
        return
    if not args.calibration:
        parser.error("--calibration FILE is needed (write one with jaxpar calibrate)")
    args.tabled = jaxpar.load_calibration(args.calibration)
    device = jax.devices()[0]
    header = {
        "device": f"{device.device_kind} ({device.platform})",
        "jax": jax.__version__,
        "command": "python bench/fidelity/layer_compute.py " + " ".join(sys.argv[1:]),
        "calibration": args.calibration,
        "datasheet": args.datasheet,
    }
    if args.layout:
        x = jnp.ones((256, 256), jnp.float32)
        with open(args.layout, "w") as f:
            json.dump(profile_layout(jax.jit(lambda x: jnp.tanh(x @ x) + 1.0), (x,)), f, indent=1)
    results = []
    for name in args.models:
        res = measure_model(name, args)
        results.append(res)
        summaries = [(f"{k} alone", v) for k, v in res["summary"].items()]
        summaries += [(f"{k} in step", v) for k, v in res["summary_in_step"].items()]
        summaries += [(f"{k} per block", v) for k, v in res["summary_blocks"].items()]
        for source, s in summaries:
            worst = ", ".join(f"{w} {r:.2f}" for w, r in s["worst"][:3])
            print(
                f"  {source:<18} within 10 %: {s['within_10pct']}/{s['layers']}, median ratio "
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
