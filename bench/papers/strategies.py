"""OptCNN Figures 7-8: throughput and communication of data / model / OWT / layer-wise (auto).

AlexNet, VGG-16 and Inception-v3 on the p100 cluster (OptCNN §6: nodes of 4 P100 on NVLink,
EDR InfiniBand between nodes) with 1, 2, 4 GPUs (one node), 8 (2 nodes) and 16 (4 nodes),
32 samples per GPU, float32. One `jaxpar.plan` per (model, GPUs) with strategy auto; the three
baselines are `plan.variant(...)` of the same planning run. Every number is the cost model's
prediction (OptCNN Eq. 1: t_C + t_X + t_S summed, no overlap); nothing runs on a GPU.

Besides the plain results it records, to explain the differences from the paper:

- per strategy, communication split by reason (gradient sync, reshard, partial sums, halos,
  state feedback) with the latency share of each;
- "replicated activation compute" of the baselines: nodes the data / OWT baselines leave
  replicated although their tensors carry the batch (constant broadcasts such as ReLU's zeros,
  which have no batch input and so get no batch dimension), and the step time with that
  compute split n ways (exact for these memory-bound nodes);
- "owt-pinned": OWT with the momentum buffers pinned to the layout of their dense weights
  (the OWT baseline leaves them replicated because optimizer state has no layer label);
- "owt-layouts best": the search run with OWT's parameter and momentum layouts pinned (and
  the batch split over all devices): the best program that keeps OWT's parameter placement, a
  lower bound on what a faithful OWT implementation costs under this model;
- "weight-gradient reshards": backward reshards of whole kernel gradients that the model / OWT
  baselines ask for (they split "the last dim" of the weight-gradient contraction, whose output
  is the transposed kernel); a faithful model-parallel layer has none. "Repaired" baselines
  drop them and split the replicated activation compute;
- "full-mesh repriced": every plan re-priced with collectives over *all* mesh axes at one
  ring's bandwidth (12.5 GB/s across nodes, as `Cluster.axis_bandwidths((16,))` rates it),
  instead of the node axis's shared-card 3.125 GB/s that `MeshAxes.group` gives them;
- a sensitivity run at 8 and 16 GPUs with the InfiniBand card not shared (``shared_by=1``),
  i.e. every collective across nodes at 12.5 GB/s per device.

    python bench/papers/strategies.py --json bench/papers/results/strategies.json \
        --md bench/papers/results/strategies.md --png bench/papers/results/strategies.png \
        --plots bench/papers/results
"""

import argparse
import dataclasses
import json
import math
import os
import re
import sys
import time
import types
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import jax
import jaxpar_zoo as zoo
from jax.sharding import PartitionSpec

import jaxpar
from jaxpar.cli.main import layer_table
from jaxpar.hardware.collectives import ring_steps

MODELS = ("alexnet", "vgg16", "inception_v3")
TITLES = {"alexnet": "AlexNet", "vgg16": "VGG-16", "inception_v3": "Inception-v3"}
GPUS = (1, 2, 4, 8, 16)
MESHES = {
    1: {"gpu": 1},
    2: {"gpu": 2},
    4: {"gpu": 4},
    8: {"node": 2, "gpu": 4},
    16: {"node": 4, "gpu": 4},
}
PER_GPU_BATCH = 32
STRATS = ("data", "model", "owt", "auto")
BASELINES = ("data", "model", "owt")

# What the paper's text states (the bar values of Figures 7-8 are images, not in the text).
PAPER = {
    "alexnet": {"auto_vs_best_other": 2.2, "scaling_auto": 12.2, "scaling_best_other": 6.1},
    "vgg16": {"auto_vs_best_other": 1.5, "scaling_auto": 14.8, "scaling_best_other": 10.2},
    "inception_v3": {"auto_vs_best_other": 1.4, "scaling_auto": 15.5, "scaling_best_other": 11.2},
}
PAPER_COMM = (
    "OWT reduces communication 1.1-23.0x vs data and model parallelism; layer-wise a further "
    "1.2-2.5x vs OWT"
)


def log(msg: str) -> None:
    print(msg, flush=True)


# ---------------------------------------------------------------------------- per-plan figures


def comm_by_reason(plan) -> dict:
    """Bytes per device, time and its latency part, per collective reason."""
    mesh = plan.mesh_axes
    out: dict[str, dict] = defaultdict(lambda: {"count": 0, "bytes": 0.0, "time_s": 0.0})
    for c in plan.collectives:
        lat = max((mesh.latency[mesh.names.index(a)] for a in c.axes), default=0.0)
        row = out[c.reason]
        row["count"] += 1
        row["bytes"] += c.bytes
        row["time_s"] += c.time_s
        row["latency_s"] = row.get("latency_s", 0.0) + lat * ring_steps(c.kind, c.group_size)
        cross = "node" in c.axes
        key = "inter_node_time_s" if cross else "intra_node_time_s"
        row[key] = row.get(key, 0.0) + c.time_s
    return dict(out)


def replicated_activation_compute(plan, global_batch: int) -> float:
    """t_C of non-input nodes left fully replicated whose result carries the batch dimension.

    A data-parallel program computes these on 1/n of the batch; the baselines replicate them
    when the node has no batch input (e.g. ``broadcast_in_dim`` of ReLU's zero). Memory-bound
    nodes, so their t_C split n ways is exactly t_C / n.
    """
    n = plan.mesh_axes.num_devices
    if n == 1:
        return 0.0
    total = 0.0
    for node, row in zip(plan.ng.nodes, plan.evaluation.node_rows, strict=True):
        if node.anchor < 0:
            continue
        cfg = plan.configs[node.index][plan.assignment[node.index]]
        if any(d >= 0 for d in cfg):
            continue
        out = plan.program.tensors[plan.program.eqns[node.anchor].outputs[0]]
        if out.shape and out.shape[0] == global_batch and len(out.shape) >= 2:
            total += row.t_C
    return total


def degrees(config: str) -> dict[str, int]:
    """``{n=4, h=1, w=1, c=1, k=1}`` -> {"n": 4, ...}."""
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", config)}


def contraction_rows(plan) -> list[dict]:
    """Every conv / dot_general node: layer, phase, output shape, config, its costs."""
    out = []
    for node, row in zip(plan.ng.nodes, plan.evaluation.node_rows, strict=True):
        if node.anchor < 0:
            continue
        eqn = plan.program.eqns[node.anchor]
        if eqn.primitive not in ("conv_general_dilated", "dot_general"):
            continue
        cfg = plan.configs[node.index][plan.assignment[node.index]]
        out.append(
            {
                "layer": plan.labels[node.index],
                "phase": node.phase,
                "primitive": eqn.primitive,
                "shape": list(plan.program.tensors[eqn.outputs[0]].shape),
                "config": plan.paper_notation(node.index, cfg),
                **{k: getattr(row, k) for k in ("t_C", "t_X", "t_S", "bytes")},
            }
        )
    return out


def layer_summary(plan) -> dict:
    """Forward contractions of the plan: how many use fewer devices, h/w, k (contraction) splits."""
    n = plan.mesh_axes.num_devices
    fwd = [r for r in contraction_rows(plan) if r["phase"] == "forward"]
    summary = {"layers": len(fwd), "fewer_devices": [], "spatial": [], "contraction_split": []}
    for r in fwd:
        deg = degrees(r["config"])
        used = math.prod(deg.values())
        if used < n:
            summary["fewer_devices"].append(f"{r['layer']} {r['config']}")
        if deg.get("h", 1) > 1 or deg.get("w", 1) > 1:
            summary["spatial"].append(f"{r['layer']} {r['config']}")
        if deg.get("k", 1) > 1:
            summary["contraction_split"].append(f"{r['layer']} {r['config']}")
    return summary


def _shape(tensor: str) -> tuple[int, ...]:
    """``float32[4096,9216]`` -> (4096, 9216)."""
    inner = tensor[tensor.index("[") + 1 : -1] if "[" in tensor else ""
    return tuple(int(x) for x in inner.split(",") if x)


def weight_gradient_reshards(plan, global_batch: int) -> float:
    """Time of backward reshards of weight-shaped tensors (kernel gradients and transposes).

    A model-parallel layer computes its kernel gradient in the kernel's own layout, with no
    communication. The baselines pick "the last dimension" of every node, which for the
    weight-gradient contraction (output: the transposed kernel) is the wrong one, so XLA is told
    to all-gather / all-to-all whole kernel gradients. Tensors with a batch-sized dimension are
    activations and never counted.
    """
    shapes = set()
    for shape in plan_state_shapes(plan):
        if len(shape) >= 2:
            shapes.add(tuple(sorted(shape)))
    total = 0.0
    for c in plan.collectives:
        shape = _shape(c.tensor)
        if c.reason != "reshard" or c.phase != "backward" or global_batch in shape:
            continue
        if tuple(sorted(shape)) in shapes:
            total += c.time_s
    return total


def plan_state_shapes(plan) -> list[tuple[int, ...]]:
    """Shapes of the state (argument 0) leaves of a plan's program."""
    return [
        tuple(plan.program.tensors[t].shape)
        for t, p in zip(plan.program.invars, plan.program.invar_paths, strict=True)
        if p.startswith("[0]")
    ]


def full_mesh_reprice(plan) -> float:
    """Seconds saved if collectives over *all* mesh axes ran at a single ring's bandwidth.

    `MeshAxes.group` prices a collective over several axes at the slowest axis's bandwidth, and
    the node axis's bandwidth assumes its 4 groups share each node's InfiniBand card (12.5/4 GB/s).
    A collective over every axis is one ring, which the cluster itself rates at 12.5 GB/s
    (`Cluster.axis_bandwidths((16,))`).
    """
    mesh = plan.mesh_axes
    if len(mesh.names) < 2:
        return 0.0
    flat = plan.cluster.axis_bandwidths((mesh.num_devices,))[0]
    saved = 0.0
    for c in plan.collectives:
        if set(c.axes) != set(mesh.names):
            continue
        used = min(mesh.bandwidth[mesh.names.index(a)] for a in c.axes)
        if flat > used:
            saved += c.bytes * (1 / used - 1 / flat)
    return saved


def cost_entry(plan, global_batch: int) -> dict:
    c = plan.cost
    n = plan.mesh_axes.num_devices
    rep = replicated_activation_compute(plan, global_batch)
    wgr = weight_gradient_reshards(plan, global_batch)
    inter = sum(x.bytes for x in plan.collectives if "node" in x.axes)
    contraction_c = sum(
        row.t_C
        for node, row in zip(plan.ng.nodes, plan.evaluation.node_rows, strict=True)
        if node.anchor >= 0
        and plan.program.eqns[node.anchor].primitive in ("conv_general_dilated", "dot_general")
    )
    return {
        **c.as_dict(),
        "throughput": global_batch / c.step_s,
        "comm_bytes_total": c.comm_bytes * n,
        "inter_node_bytes": inter,  # per device, collectives whose groups cross nodes
        "contraction_compute_s": contraction_c,  # t_C of conv / dot_general nodes alone
        "collectives": len(plan.collectives),
        "comm_by_reason": comm_by_reason(plan),
        "replicated_activation_compute_s": rep,
        "weight_gradient_reshard_s": wgr,
        "full_mesh_reprice_saving_s": full_mesh_reprice(plan),
        "step_s_activations_split": c.step_s - rep * (1 - 1 / n),
        # both baseline artifacts removed (what a faithful baseline would cost)
        "step_s_repaired": c.step_s - rep * (1 - 1 / n) - wgr,
        # perfect overlap of communication with computation (what Legion approaches)
        "step_s_overlap_bound": max(c.compute_s, c.comm_s),
    }


# ---------------------------------------------------------------------------- runs


OBJECTIVE = ["time"]  # --objective: the planner's objective for every plan of the run


def plan_case(ex, n: int, cluster=None, strategy: str = "auto", in_specs=None):
    cluster = cluster or jaxpar.Cluster.preset("p100", devices=n)
    return jaxpar.plan(
        ex.step, *ex.args, mesh=MESHES[n], cluster=cluster, strategy=strategy, in_specs=in_specs,
        objective=OBJECTIVE[0],
    )  # fmt: skip


def owt_pins(owt_plan, state_spec):
    """in_specs pinning every parameter and its momentum to the OWT plan's parameter layout."""
    specs = {
        path: owt_plan.partition_spec(s)
        for path, s in zip(owt_plan.program.invar_paths, owt_plan.invar_specs, strict=True)
    }

    def pick(path, _leaf):
        key = "[0]" + jax.tree_util.keystr(path)
        key = re.sub(r"\.opt_state\[0\]\.trace", ".params", key)
        spec = specs.get(key)
        return spec if isinstance(spec, PartitionSpec) and key.startswith("[0].params") else None

    state_specs = jax.tree_util.tree_map_with_path(pick, state_spec)
    return (state_specs, None)


def unshared_ib(n: int) -> jaxpar.Cluster:
    """The p100 cluster with one InfiniBand port per GPU (no sharing): 12.5 GB/s per device."""
    c = jaxpar.Cluster.preset("p100", devices=n)
    levels = tuple(dataclasses.replace(lv, shared_by=1) for lv in c.levels)
    return dataclasses.replace(c, name="p100-ib-unshared", levels=levels)


def run(args) -> dict:
    results: dict = {
        "cluster": "p100",
        "per_gpu_batch": PER_GPU_BATCH,
        "dtype": "float32",
        "objective": OBJECTIVE[0],
        "meshes": {str(n): m for n, m in MESHES.items()},
        "paper": PAPER,
        "models": {},
    }
    t_all = time.perf_counter()
    for name in args.models:
        mres: dict = {"cases": {}, "layers_16": {}, "contractions_16": {}}
        results["models"][name] = mres
        for n in args.gpus:
            batch = PER_GPU_BATCH * n
            ex = zoo.get(name, batch=batch)
            t0 = time.perf_counter()
            plan = plan_case(ex, n)
            wall = time.perf_counter() - t0
            plans = {s: plan.variant(s) for s in STRATS}
            case = {
                "gpus": n,
                "mesh": MESHES[n],
                "batch": batch,
                "plan_wall_s": wall,
                "optimal": plan.optimal,
                "search": {k: v for k, v in plan.stats.items() if isinstance(v, (int, float, str))},
                "strategies": {s: cost_entry(p, batch) for s, p in plans.items()},
                "auto_layers": layer_summary(plan),
            }
            # OWT with momentum pinned like its dense weights
            if n > 1:
                pinned = plan_case(
                    ex, n, strategy="owt", in_specs=owt_pins(plans["owt"], ex.args[0])
                )
                case["owt_pinned"] = cost_entry(pinned, batch)
                # the best program with OWT's parameter layouts: a lower bound on a faithful OWT
                pins = owt_pins(plans["owt"], ex.args[0])
                axes = tuple(MESHES[n])
                pins = (pins[0], {k: PartitionSpec(axes) for k in ex.args[1]})
                best = plan_case(ex, n, strategy="auto", in_specs=pins)
                case["owt_layouts_best"] = cost_entry(best, batch) | {"optimal": best.optimal}
            if n >= 8 and not args.no_sensitivity:
                cl = unshared_ib(n)
                sens = plan_case(ex, n, cluster=cl)
                case["ib_unshared"] = {s: cost_entry(sens.variant(s), batch) for s in STRATS}
                case["ib_unshared"]["optimal"] = sens.optimal
                pinned = plan_case(
                    ex,
                    n,
                    cluster=cl,
                    strategy="owt",
                    in_specs=owt_pins(sens.variant("owt"), ex.args[0]),
                )
                case["ib_unshared"]["owt_pinned"] = cost_entry(pinned, batch)
            if n == 1:
                case["flops"] = sum(
                    m.flops for node in plan.ng.nodes for m in node.members if m.eqn >= 0
                )
            if n == 16:
                # the same data-parallel program on a 1-D mesh of the same 16 GPUs
                flat = jaxpar.plan(
                    ex.step,
                    *ex.args,
                    mesh={"dev": 16},
                    cluster=jaxpar.Cluster.preset("p100", devices=16),
                    strategy="data",
                )
                case["data_flat_mesh"] = cost_entry(flat, batch)
            mres["cases"][str(n)] = case
            st = case["strategies"]
            best = min(BASELINES, key=lambda s: st[s]["step_s"])
            log(
                f"{name:<13} {n:>2} GPUs  plan {wall:5.1f}s  "
                + "  ".join(f"{s} {st[s]['throughput']:8.0f}/s" for s in STRATS)
                + f"  auto/best({best}) {st[best]['step_s'] / st['auto']['step_s']:.2f}x"
                + ("" if plan.optimal else "  (auto not certified)")
            )
            if n == 16:
                mres["layers_16"] = {s: p.layer_rows() for s, p in plans.items()}
                mres["contractions_16"] = {s: contraction_rows(p) for s, p in plans.items()}
                mres["layer_table_16"] = layer_table({s: plans[s] for s in STRATS[::-1]})
                if args.plots:
                    log(f"  wrote {plot_model(name, plans, batch, args.plots)}")
        derive(mres)
    results["wall_s"] = time.perf_counter() - t_all
    return results


def repaired_baselines(st: dict, owt_pinned: dict | None) -> dict[str, float]:
    """Baseline step times with the baseline artifacts removed (see the module docstring):
    replicated activation compute split n ways, whole-kernel-gradient reshards dropped, and
    OWT's momentum pinned like its weights."""
    out = {s: st[s]["step_s_repaired"] for s in ("data", "model")}
    owt = owt_pinned if owt_pinned is not None else st["owt"]
    out["owt"] = owt["step_s_repaired"]
    return out


def derive(mres: dict) -> None:
    """Speedups: auto vs best other per GPU count, and scaling over 1 GPU."""
    cases = mres["cases"]
    one = cases.get("1")
    for case in cases.values():
        st = case["strategies"]
        best = min(BASELINES, key=lambda s: st[s]["step_s"])
        case["best_other"] = best
        case["auto_vs_best_other"] = st[best]["step_s"] / st["auto"]["step_s"]
        least = min(BASELINES, key=lambda s: st[s]["comm_bytes"])
        case["least_comm_other"] = least
        case["comm_reduction_vs_least_other"] = (
            st[least]["comm_bytes"] / st["auto"]["comm_bytes"]
            if st["auto"]["comm_bytes"] > 0
            else None
        )
        rep = repaired_baselines(st, case.get("owt_pinned"))
        case["repaired_baselines_step_s"] = rep
        best_rep = min(rep, key=rep.get)
        case["best_other_repaired"] = best_rep
        case["auto_vs_best_other_repaired"] = rep[best_rep] / st["auto"]["step_s"]
        if "owt_layouts_best" in case:
            case["auto_vs_owt_layouts_best"] = (
                case["owt_layouts_best"]["step_s"] / st["auto"]["step_s"]
            )
        # repaired baselines and auto, all with full-mesh collectives at one ring's bandwidth
        # (auto's plan re-priced, not re-planned: an upper bound on its step)
        sav = {s: st[s]["full_mesh_reprice_saving_s"] for s in STRATS}
        if case.get("owt_pinned"):
            sav["owt"] = case["owt_pinned"]["full_mesh_reprice_saving_s"]
        rr = {s: rep[s] - sav[s] for s in rep}
        case["repaired_repriced_step_s"] = rr | {"auto": st["auto"]["step_s"] - sav["auto"]}
        case["auto_vs_best_other_repaired_repriced"] = min(rr.values()) / (
            st["auto"]["step_s"] - sav["auto"]
        )
        if "ib_unshared" in case:
            ib = case["ib_unshared"]
            rep_ib = repaired_baselines(ib, ib.get("owt_pinned"))
            best_ib = min(rep_ib, key=rep_ib.get)
            ib["auto_vs_best_other"] = (
                min(ib[s]["step_s"] for s in BASELINES) / ib["auto"]["step_s"]
            )
            ib["auto_vs_best_other_repaired"] = rep_ib[best_ib] / ib["auto"]["step_s"]
            ib["best_other_repaired"] = best_ib
        if one is not None:
            base = one["strategies"]["auto"]["throughput"]
            case["scaling"] = {s: st[s]["throughput"] / base for s in STRATS}
            case["scaling_best_other"] = max(case["scaling"][s] for s in BASELINES)
            case["scaling_best_other_repaired"] = case["batch"] / min(rep.values()) / base


# ---------------------------------------------------------------------------- report

COMMAND = (
    "python bench/papers/strategies.py --json bench/papers/results/strategies.json "
    "--md bench/papers/results/strategies.md --png bench/papers/results/strategies.png "
    "--plots bench/papers/results"
)


def _ms(x: float) -> str:
    return f"{x * 1e3:.1f}"


def _x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def summary_table(res: dict) -> list[str]:
    lines = [
        "| model | auto vs best other: ours, max over GPUs (where) | at 16 GPUs | paper (up to) "
        "| baselines repaired: max (where) | at 16 | scaling 1→16, auto: ours / paper "
        "| best other: ours / repaired / paper |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, m in res["models"].items():
        cases = m["cases"]
        paper = res["paper"][name]
        multi = {k: c for k, c in cases.items() if c["gpus"] > 1}
        if not multi:
            continue
        kmax = max(multi, key=lambda k: multi[k]["auto_vs_best_other"])
        rmax = max(multi, key=lambda k: multi[k]["auto_vs_best_other_repaired"])
        c16 = cases.get("16", {})
        lines.append(
            f"| {TITLES[name]} | {_x(multi[kmax]['auto_vs_best_other'])} ({kmax} GPUs, vs "
            f"{multi[kmax]['best_other']}) | {_x(c16.get('auto_vs_best_other'))} "
            f"| {paper['auto_vs_best_other']:.1f}x "
            f"| {_x(multi[rmax]['auto_vs_best_other_repaired'])} ({rmax} GPUs, vs "
            f"{multi[rmax]['best_other_repaired']}) | {_x(c16.get('auto_vs_best_other_repaired'))} "
            f"| {_x(c16.get('scaling', {}).get('auto'))} / {paper['scaling_auto']:.1f}x "
            f"| {_x(c16.get('scaling_best_other'))} / {_x(c16.get('scaling_best_other_repaired'))}"
            f" / {paper['scaling_best_other']:.1f}x |"
        )
    return lines


def model_tables(name: str, m: dict) -> list[str]:
    cases = m["cases"]
    lines = [
        f"### {TITLES[name]}",
        "",
        "Throughput (samples/s, predicted) and auto's step split (ms):",
        "",
        "| GPUs (nodes) | data | model | OWT | auto | auto vs best other "
        "| over 1 GPU: auto / best other | auto t_C | t_X | t_S | auto optimal |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for k, c in cases.items():
        st = c["strategies"]
        a = st["auto"]
        lines.append(
            f"| {gpu_label(int(k))} | "
            + " | ".join(f"{st[s]['throughput']:.0f}" for s in ("data", "model", "owt", "auto"))
            + f" | {_x(c['auto_vs_best_other'])} ({c['best_other']}) "
            f"| {_x(c.get('scaling', {}).get('auto'))} / {_x(c.get('scaling_best_other'))} "
            f"| {_ms(a['compute_s'])} "
            f"| {_ms(a['reshard_s'])} | {_ms(a['sync_s'])} | {'yes' if c['optimal'] else 'no'} |"
        )
    lines += [
        "",
        "Communication per step: GB sent by all devices together (ring accounting; per device "
        "= total / GPUs), and the ratios the paper quotes:",
        "",
        "| GPUs | data | model | OWT | auto | data / OWT | model / OWT | OWT / auto "
        "| least other / auto |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for k, c in cases.items():
        if c["gpus"] == 1:
            continue
        st = c["strategies"]
        gb = {s: st[s]["comm_bytes_total"] / 1e9 for s in STRATS}
        lines.append(
            f"| {gpu_label(int(k))} | "
            + " | ".join(f"{gb[s]:.2f}" for s in ("data", "model", "owt", "auto"))
            + f" | {gb['data'] / gb['owt']:.2f} | {gb['model'] / gb['owt']:.2f} "
            f"| {gb['owt'] / gb['auto']:.2f} | {_x(c['comm_reduction_vs_least_other'])} |"
        )
    return lines


def breakdown_table(res: dict, n: str = "16") -> list[str]:
    lines = [
        "| model | strategy | step ms | t_C | t_X | t_S | gradient sync ms (latency) "
        "| BN/partial sums ms (latency) | reshards ms | state feedback ms "
        "| replicated activation t_C | collectives |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in res["models"].items():
        c = m["cases"].get(n)
        if c is None:
            continue
        for s in STRATS:
            e = c["strategies"][s]
            r = e["comm_by_reason"]

            def part(key, r=r):
                v = r.get(key)
                return "0" if v is None else f"{_ms(v['time_s'])} ({_ms(v['latency_s'])})"

            lines.append(
                f"| {TITLES[name]} | {s} | {_ms(e['step_s'])} | {_ms(e['compute_s'])} "
                f"| {_ms(e['reshard_s'])} | {_ms(e['sync_s'])} | {part('gradient-sync')} "
                f"| {part('partial-sum')} | {_ms(r.get('reshard', {}).get('time_s', 0.0))} "
                f"| {_ms(r.get('state-feedback', {}).get('time_s', 0.0))} "
                f"| {_ms(e['replicated_activation_compute_s'])} | {e['collectives']} |"
            )
    return lines


def sensitivity_table(res: dict) -> list[str]:
    lines = [
        "| model | GPUs | as planned | baselines repaired | vs best program on OWT's layouts "
        "| repaired + full-mesh collectives repriced "
        "| IB unshared (re-planned) | IB unshared + repaired "
        "| scaling with perfect overlap: auto / best other |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in res["models"].items():
        one = m["cases"].get("1")
        for k, c in m["cases"].items():
            if c["gpus"] < 2:
                continue
            ib = c.get("ib_unshared", {})
            ov = "-"
            if one is not None:
                base = one["strategies"]["auto"]["step_s"]
                st = c["strategies"]
                auto_ov = base / st["auto"]["step_s_overlap_bound"] * c["gpus"]
                best_ov = max(base / st[s]["step_s_overlap_bound"] * c["gpus"] for s in BASELINES)
                ov = f"{auto_ov:.1f}x / {best_ov:.1f}x"
            lines.append(
                f"| {TITLES[name]} | {k} | {_x(c['auto_vs_best_other'])} ({c['best_other']}) "
                f"| {_x(c['auto_vs_best_other_repaired'])} ({c['best_other_repaired']}) "
                f"| {_x(c.get('auto_vs_owt_layouts_best'))} "
                f"| {_x(c['auto_vs_best_other_repaired_repriced'])} "
                f"| {_x(ib.get('auto_vs_best_other'))} "
                f"| {_x(ib.get('auto_vs_best_other_repaired'))} | {ov} |"
            )
    return lines


def baseline_artifacts_table(res: dict, n: str = "16") -> list[str]:
    lines = [
        "| model | strategy | step ms | replicated activation t_C ms | weight-gradient "
        "reshards ms | OWT momentum feedback ms | repaired step ms | full-mesh reprice saves ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, m in res["models"].items():
        c = m["cases"].get(n)
        if c is None:
            continue
        for s in STRATS:
            e = c["strategies"][s]
            fb = e["comm_by_reason"].get("state-feedback", {}).get("time_s", 0.0)
            rep = c["repaired_baselines_step_s"].get(s, e["step_s"])
            lines.append(
                f"| {TITLES[name]} | {s} | {_ms(e['step_s'])} "
                f"| {_ms(e['replicated_activation_compute_s'])} "
                f"| {_ms(e['weight_gradient_reshard_s'])} | {_ms(fb)} | {_ms(rep)} "
                f"| {_ms(e['full_mesh_reprice_saving_s'])} |"
            )
    return lines


def inception_config_counts(m: dict) -> list[str]:
    from collections import Counter

    rows = m.get("contractions_16", {}).get("auto", [])
    cnt = Counter((r["phase"], r["primitive"], r["config"]) for r in rows)
    lines = ["| phase | primitive | auto config (16 GPUs) | nodes |", "|---|---|---|---|"]
    for (phase, prim, cfg), v in sorted(cnt.items()):
        lines.append(f"| {phase} | {prim} | `{cfg}` | {v} |")
    return lines


def markdown(res: dict) -> str:
    out = [
        "# OptCNN Figures 7-8 with jaxpar: data / model / OWT / layer-wise (auto)",
        "",
        "```bash",
        COMMAND,
        "```",
        "",
        f"AlexNet, VGG-16, Inception-v3 (full size, float32, SGD + momentum), "
        f"{res['per_gpu_batch']} samples per GPU, p100 cluster preset (4 × P100 per node on "
        "NVLink 20 GB/s/direction, 1 µs; nodes on 100 Gb/s EDR InfiniBand, 12.5 GB/s, 5 µs, one "
        "card per node shared by its 4 GPUs). Meshes: 1/2/4 GPUs `{gpu: n}`, 8 GPUs "
        "`{node: 2, gpu: 4}`, 16 GPUs `{node: 4, gpu: 4}`. Every figure is jaxpar's *prediction* "
        "(OptCNN Eq. 1, t_C + t_X + t_S summed); the paper's are measurements on the real "
        "cluster. One `jaxpar.plan(..., strategy='auto')` per case; the baselines are "
        f"`plan.variant(...)`. Whole run: {res.get('wall_s', 0):.0f} s on this 2-core machine.",
        "",
        "The paper's Figures 7-8 are images; their text gives only the numbers in the "
        "'paper' columns below. " + PAPER_COMM + ".",
        "",
        "![strategies](strategies.png)",
        "",
        "## Summary against the paper",
        "",
        *summary_table(res),
        "",
        "'Repaired' baselines remove three artifacts of jaxpar's baseline strategies "
        "(explanation 1): data/OWT replicate activation-sized constant broadcasts, OWT "
        "replicates the momentum of its model-parallel dense layers, and model/OWT reshard "
        "whole kernel gradients. 'Scaling' is throughput at 16 GPUs over auto's (= every "
        "strategy's) throughput on 1 GPU.",
        "",
        "## Per model",
        "",
    ]
    for name, m in res["models"].items():
        out += model_tables(name, m)
        out.append("")
    out += [
        "## Where the time goes at 16 GPUs (ms per step; latency = α part of the α-β times)",
        "",
        *breakdown_table(res),
        "",
        "## Baseline artifacts at 16 GPUs",
        "",
        *baseline_artifacts_table(res),
        "",
        "'Repaired step' for OWT is the momentum-pinned OWT plan with the other two artifacts "
        "removed; auto is never repaired.",
        "",
        "## Sensitivity: auto vs best other under repaired baselines and other link numbers",
        "",
        *sensitivity_table(res),
        "",
        "'IB unshared': the p100 cluster with `shared_by=1` on InfiniBand, so every collective "
        "crossing nodes gets 12.5 GB/s per device (the preset's docstring says a single "
        "16-device ring does; see explanation 2). 'Perfect overlap': step = max(t_C, t_X + t_S), "
        "a bound on what Legion's overlap of communication with computation could reach.",
        "",
        "## Per-layer configurations at 16 GPUs (forward contraction of each layer)",
        "",
    ]
    for name, m in res["models"].items():
        if name == "inception_v3":
            out += [
                f"### {TITLES[name]} (counts of conv / dot_general nodes per configuration)",
                "",
                *inception_config_counts(m),
                "",
            ]
        elif "layer_table_16" in m:
            out += [
                f"### {TITLES[name]}",
                "",
                "```",
                m["layer_table_16"],
                "```",
                "",
            ]
        if "layer_table_16" in m:
            out.append(f"Per-layer times and configs: `strategies_{name}_16.png`.")
            out.append("")
    out += explanations(res)
    return "\n".join(out) + "\n"


def explanations(res: dict) -> list[str]:
    """The differences from the paper, each with the numbers of this run that support it."""
    ms = res["models"]
    need = ("alexnet", "vgg16", "inception_v3")
    if not all(m in ms and {"1", "2", "4", "16"} <= set(ms[m]["cases"]) for m in need):
        return ["## Differences from the paper", "", "(needs all three models at 1-16 GPUs)"]
    if not all("ib_unshared" in ms[m]["cases"]["16"] for m in need):
        return ["## Differences from the paper", "", "(needs the sensitivity runs)"]

    def case(m, n="16"):
        return ms[m]["cases"][n]

    def e(m, s, n="16"):
        return case(m, n)["strategies"][s]

    def r(m, s, reason, key="time_s", n="16"):
        return e(m, s, n)["comm_by_reason"].get(reason, {}).get(key, 0.0)

    a16, v16, i16 = case("alexnet"), case("vgg16"), case("inception_v3")
    inc_data_lat = r("inception_v3", "data", "gradient-sync", "latency_s") + r(
        "inception_v3", "data", "partial-sum", "latency_s"
    )
    inc_data_comm = e("inception_v3", "data")["comm_s"]
    inc_partial = e("inception_v3", "data")["comm_by_reason"].get("partial-sum", {})
    inc_grad = e("inception_v3", "data")["comm_by_reason"].get("gradient-sync", {})

    def overlap_scaling(m, s):
        c, one = case(m), case(m, "1")["strategies"]["auto"]["step_s"]
        return one / c["strategies"][s]["step_s_overlap_bound"] * c["gpus"]

    ov = {
        m: (overlap_scaling(m, "auto"), max(overlap_scaling(m, s) for s in BASELINES)) for m in need
    }
    ab = {m: e(m, "auto") for m in need}
    spatial = sum(len(c["auto_layers"]["spatial"]) for m in need for c in ms[m]["cases"].values())
    fewer = [
        f"{x} at {c['gpus']} GPUs"
        for m in need
        for c in ms[m]["cases"].values()
        for x in c["auto_layers"]["fewer_devices"]
    ]
    one = {m: case(m, "1")["strategies"]["auto"] for m in need}
    a2 = case("alexnet", "2")["strategies"]["data"]
    return [
        "## Differences from the paper, explained",
        "",
        "Our numbers are predictions of jaxpar's cost model; the paper's are measurements in "
        "Legion. Each point below names the mechanism and the evidence in this run.",
        "",
        "**1. Three artifacts of jaxpar's baseline strategies inflate auto's advantage.** "
        "(a) *Replicated constant broadcasts.* The data/OWT baselines give a node the batch "
        "dimension only if a batch input flows into it; `broadcast_in_dim` of ReLU's zero (and "
        "its backward twin) has none, so it is left fully replicated and every device "
        "materializes the whole 512-sample activation. At 16 GPUs that is "
        f"{_ms(e('vgg16', 'data')['replicated_activation_compute_s'])} ms of VGG-16's data-"
        f"parallel t_C ({_ms(e('vgg16', 'data')['compute_s'])} ms vs auto's "
        f"{_ms(ab['vgg16']['compute_s'])} ms) and "
        f"{_ms(e('inception_v3', 'data')['replicated_activation_compute_s'])} ms of "
        "Inception-v3's (the `VGG` / `AlexNet` rows of the per-layer tables show it: "
        "`{d0=1, ...}` under data and OWT). (b) *OWT's momentum is replicated.* Optimizer state "
        "has no layer label, so OWT's rule 'model parallel for dense layers' misses the "
        "momentum of fc1-fc3; the update is computed column-split and the new momentum is "
        "all-gathered back to its replicated input layout every step ('state feedback': "
        f"{_ms(r('alexnet', 'owt', 'state-feedback'))} ms for AlexNet, "
        f"{_ms(r('vgg16', 'owt', 'state-feedback'))} ms for VGG-16 at 16 GPUs, e.g. an "
        "all-gather of float32[9216,4096] over the node axis). (c) *Weight-gradient "
        "reshards.* 'Model parallel' splits the last dimension of every node; for the "
        "weight-gradient contraction (output: the transposed kernel) that is the input-feature "
        "dimension, so whole kernel gradients are all-gathered / all-to-all'd "
        f"({_ms(e('alexnet', 'owt')['weight_gradient_reshard_s'])} ms in AlexNet's OWT, "
        f"{_ms(e('vgg16', 'owt')['weight_gradient_reshard_s'])} ms in VGG-16's at 16 GPUs); "
        "a faithful model-parallel layer computes its gradient in place. Removing (a)-(c) "
        "('repaired') brings auto vs best other at 16 GPUs from "
        f"{_x(a16['auto_vs_best_other'])} / {_x(v16['auto_vs_best_other'])} / "
        f"{_x(i16['auto_vs_best_other'])} down to {_x(a16['auto_vs_best_other_repaired'])} / "
        f"{_x(v16['auto_vs_best_other_repaired'])} / {_x(i16['auto_vs_best_other_repaired'])} "
        "(AlexNet / VGG-16 / Inception-v3). Cross-check: the search run with OWT's parameter "
        "and momentum layouts pinned (the best program that keeps OWT's placement) is within "
        f"{_x(a16['auto_vs_owt_layouts_best'])} / {_x(v16['auto_vs_owt_layouts_best'])} / "
        f"{_x(i16['auto_vs_owt_layouts_best'])} of auto. Under this cost model, then, "
        "layer-wise parallelism gains 1.0-1.4x over a faithful OWT, against the paper's "
        "measured 1.4-2.2x.",
        "",
        "**2. Collectives over the whole 2-D mesh are priced at a quarter of the InfiniBand "
        "bandwidth (suspected jaxpar bug), which makes data parallelism much dearer across nodes "
        "than on the paper's cluster.** The p100 preset assumes one EDR card per node shared by "
        "4 GPUs, so the node axis of `{node: 4, gpu: 4}` gets 12.5/4 = 3.125 GB/s per device "
        "(4 concurrent groups per card). `MeshAxes.group` prices a collective over several axes "
        "at the slowest axis's bandwidth, so the data-parallel gradient all-reduce over "
        "`(node, gpu)` — one 16-device ring, which `Cluster.axis_bandwidths((16,))` itself rates "
        "at 12.5 GB/s — also gets 3.125 GB/s. The same data-parallel step costs "
        + "; ".join(
            f"{TITLES[m]} {_ms(e(m, 'data')['step_s'])} ms on the 4×4 mesh vs "
            f"{_ms(case(m)['data_flat_mesh']['step_s'])} ms on a 1-D 16-device mesh (t_S "
            f"{_ms(e(m, 'data')['sync_s'])} vs {_ms(case(m)['data_flat_mesh']['sync_s'])} ms, "
            f"same {e(m, 'data')['comm_bytes'] / 1e6:.0f} MB/device)"
            for m in need
        )
        + ". Consequences: data parallelism at 8 GPUs is slower "
        "than at 4 (AlexNet "
        f"{case('alexnet', '8')['strategies']['data']['throughput']:.0f} vs "
        f"{case('alexnet', '4')['strategies']['data']['throughput']:.0f} samples/s); and auto "
        "wins partly by building a hierarchical all-reduce out of layer configurations: for "
        "AlexNet's conv3-5 weight gradients it picks configurations such as "
        "`{n=1, h=1, w=1, c=4, n=4}` (one channel dimension of the kernel over the 4 GPUs of a "
        "node, the batch over nodes), all-reduces a quarter of each "
        "gradient over the node axis (0.88 MB instead of 4.4 MB for conv5) and all-gathers the "
        "updated weights over NVLink. Auto sends "
        f"{ab['alexnet']['inter_node_bytes'] / 1e6:.0f} MB per device across nodes vs data's "
        f"{e('alexnet', 'data')['inter_node_bytes'] / 1e6:.0f} MB. Re-pricing every plan's "
        "full-mesh collectives at 12.5 GB/s (repaired baselines, auto not re-planned) gives "
        f"{_x(a16['auto_vs_best_other_repaired_repriced'])} / "
        f"{_x(v16['auto_vs_best_other_repaired_repriced'])} / "
        f"{_x(i16['auto_vs_best_other_repaired_repriced'])}; re-planning on a cluster whose "
        "card is not shared at all gives "
        f"{_x(a16['ib_unshared']['auto_vs_best_other_repaired'])} / "
        f"{_x(v16['ib_unshared']['auto_vs_best_other_repaired'])} / "
        f"{_x(i16['ib_unshared']['auto_vs_best_other_repaired'])} (repaired).",
        "",
        "**3. NVLink is priced conservatively, so data parallelism does not 'scale well on a "
        "single node' as in the paper.** One 20 GB/s link per ring step: AlexNet's 61M "
        f"parameters (244 MB) cost {_ms(a2['sync_s'])} ms of all-reduce per step at 2 GPUs "
        f"against {_ms(a2['compute_s'])} ms of compute, so data parallelism reaches only "
        f"{case('alexnet', '2')['scaling']['data']:.2f}x at 2 GPUs and "
        f"{case('alexnet', '4')['scaling']['data']:.2f}x at 4. NCCL can drive several NVLinks "
        "per GPU and Legion overlaps the all-reduce with the backward pass; neither is in the "
        "model. OWT and auto avoid syncing the dense layers (fc1-fc3 hold 96% of AlexNet's "
        "parameters), which is why, once repaired, OWT equals auto inside a node "
        f"({_x(case('alexnet', '4')['auto_vs_best_other_repaired'])} at 4 GPUs).",
        "",
        "**4. Eq. 1 sums communication with computation and charges every collective its own "
        "latency; Legion overlaps them.** Inception-v3 has 284 parameter tensors (94 conv + BN "
        "layers): at 16 GPUs data parallelism issues "
        f"{int(inc_grad.get('count', 0))} gradient-sync all-reduces (weights, BN scale/bias, "
        f"BN's backward batch reductions) and {int(inc_partial.get('count', 0))} forward "
        "partial-sum all-reduces (BN statistics, the loss), each with 30 "
        f"ring steps × 5 µs; {_ms(inc_data_lat)} of its {_ms(inc_data_comm)} ms of "
        "communication is latency. XLA's all-reduce combiner merges them (the compiled "
        "data-parallel step at 16 GPUs has 122 all-reduces, not 567: `fidelity_paper.md`), "
        "as NCCL bucketing does in frameworks; Legion hides them behind the backward pass. "
        "With "
        "perfect overlap (step = max(t_C, t_X + t_S)) the 1→16 GPU scaling would be "
        f"{ov['alexnet'][0]:.1f}x / {ov['vgg16'][0]:.1f}x / {ov['inception_v3'][0]:.1f}x for "
        f"auto and {ov['alexnet'][1]:.1f}x / {ov['vgg16'][1]:.1f}x / {ov['inception_v3'][1]:.1f}x "
        "for the best other (paper: 12.2x / 14.8x / 15.5x and 6.1x / 10.2x / 11.2x): "
        "overlap, not layer-wise configurations, closes most of Inception-v3's gap to the "
        f"paper's 15.5x (ours as planned: {case('inception_v3')['scaling']['auto']:.1f}x). "
        "AlexNet can exceed 16x here because auto also shards the optimizer update of the "
        "dense layers (see 7).",
        "",
        "**5. Our Inception-v3 step uses global-batch BatchNorm.** The train step normalizes "
        "over the whole batch, so splitting the batch costs an all-reduce of each BN layer's "
        f"statistics in the forward pass ({_ms(inc_partial.get('time_s', 0.0))} ms at 16 GPUs "
        "for data parallelism, all of it latency) and the matching reductions backward. "
        "Frameworks in 2018 (and, presumably, the paper) kept per-GPU statistics, which cost "
        "nothing.",
        "",
        "**6. t_C is a roofline at datasheet peak, independent of the layer's shape.** OptCNN "
        "measures t_C of each configuration with cuDNN/cuBLAS; we take max(FLOPs / 10.6 "
        "TFLOP/s, bytes / 732 GB/s) of each per-device shard. Three consequences. (i) Splitting "
        "h or w never computes faster than splitting n and adds halo exchanges, so auto never "
        f"chooses a spatial split ({spatial} spatially split layers over all 15 cases; the "
        "paper's Table 5 uses h=w=2 for VGG-16's last conv groups, see "
        "`vgg16_table5.md`). (ii) Using fewer devices rarely pays: over all 15 cases the "
        "layers whose forward computation uses fewer devices than available are "
        f"{'; '.join(fewer) or 'none'}. "
        + (
            "AlexNet's fc1 (output spec `P(None, 'gpu')`) runs on the 4 GPUs of each node, "
            "replicated across nodes, so its 151 MB of weights never cross InfiniBand. "
            if any(x.startswith("AlexNet/fc1") for x in fewer)
            else ""
        )
        + (
            "Inception-v3's mixed7 `b3x3_1` 1×1 convolutions (output spec `P('node')`) split "
            "the batch over nodes only and are replicated over a node's GPUs, which feeds the "
            "channel-split BatchNorm after them without a reshard. "
            if any("b3x3_1" in x for x in fewer)
            else ""
        )
        + "The paper's 'fewer devices for deeper layers' thus appears only where the "
        "communication saved outweighs the multiplied compute. For VGG-16's deepest "
        "convolutions "
        "(9.4 MB of weights each) a plain 16-way gradient all-reduce costs ~6 ms per layer "
        "(auto's hybrid weight-gradient configuration, as in 2, gets it to 3.6 ms) while "
        "computing the layer on 4 instead of 16 GPUs would add ~25 ms (its t_C is 8.5 ms "
        "16-way), so the paper's 'reduce the devices of deeper layers' never wins here. "
        "(iii) Elementwise members are separate "
        "memory-bound passes (no fusion): predicted 1-GPU throughputs are "
        f"{one['alexnet']['throughput']:.0f} / {one['vgg16']['throughput']:.0f} / "
        f"{one['inception_v3']['throughput']:.0f} samples/s (FLOPs at peak alone: "
        + " / ".join(_ms(case(m, "1")["flops"] / 10.6e12) for m in need)
        + " ms of the "
        f"{_ms(one['alexnet']['compute_s'])} / {_ms(one['vgg16']['compute_s'])} / "
        f"{_ms(one['inception_v3']['compute_s'])} ms steps). VGG-16 is dominated by "
        "compute, so no strategy can gain much on it once the baselines are faithful.",
        "",
        "**7. Our search space is larger than OptCNN's for dense layers and the optimizer.** "
        "Auto splits the contraction (input-feature) dimension k of dense layers (AccPar's "
        "Type-II, partial sums finished by an all-reduce), e.g. VGG-16 fc2/fc3 `{n=1, c=4, k=4}` "
        "at 16 GPUs, and shards the dense layers' momentum update with their weights (auto's "
        f"t_C at 2 GPUs, {_ms(case('alexnet', '2')['strategies']['auto']['compute_s'])} ms, is "
        f"below 1 GPU's {_ms(one['alexnet']['compute_s'])} ms). OptCNN's dense layers have only "
        "n and c; its Table 5 FC layers are `{n=1, c=4}`.",
        "",
        "**8. Communication volume: the time objective does not minimize bytes.** The paper "
        "reports layer-wise moving 1.2-2.5x fewer bytes than OWT. Ours: OWT / auto = "
        + ", ".join(
            f"{TITLES[m]} "
            + "-".join(
                f"{v:.1f}"
                for v in (
                    min(
                        c["strategies"]["owt"]["comm_bytes"] / c["strategies"]["auto"]["comm_bytes"]
                        for c in ms[m]["cases"].values()
                        if c["gpus"] > 1
                    ),
                    max(
                        c["strategies"]["owt"]["comm_bytes"] / c["strategies"]["auto"]["comm_bytes"]
                        for c in ms[m]["cases"].values()
                        if c["gpus"] > 1
                    ),
                )
            )
            + "x"
            for m in need
        )
        + ". AlexNet and VGG-16 exceed the paper's range because our OWT carries artifacts "
        "1(b)-(c) (OWT with pinned momentum sends "
        f"{a16['owt_pinned']['comm_bytes'] / 1e6:.0f} instead of "
        f"{e('alexnet', 'owt')['comm_bytes'] / 1e6:.0f} MB per device for AlexNet at 16 GPUs). "
        "Inception-v3's auto sends *more* bytes than data parallelism at 8-16 GPUs "
        f"({ab['inception_v3']['comm_bytes'] / 1e6:.0f} vs "
        f"{e('inception_v3', 'data')['comm_bytes'] / 1e6:.0f} MB per device at 16) but fewer "
        f"across nodes ({ab['inception_v3']['inter_node_bytes'] / 1e6:.0f} vs "
        f"{e('inception_v3', 'data')['inter_node_bytes'] / 1e6:.0f} MB): it moves traffic onto "
        "NVLink, which the time objective rightly prefers. Our bytes are ring-accounting "
        "bytes sent per device, summed over devices for the figure; the paper does not say how "
        "Figure 8 counts.",
        "",
        "**9. Model parallelism collapses across nodes** ("
        f"{e('vgg16', 'model')['throughput']:.0f} samples/s for VGG-16 at 16 GPUs, "
        f"{e('vgg16', 'model')['comm_bytes'] / 1e9:.1f} GB per device per step). Splitting "
        "every conv's output channels 16 ways means all-gathering each full 512-sample "
        "activation before the next layer; jaxpar emits it as an all-gather over `gpu` then "
        "one over `node` at the shared 3.125 GB/s. The paper's text, too, says model and "
        "data parallelism 'show limited scalability in distributed training'; its figure's "
        "values are not in the text to compare magnitudes.",
        "",
        "**10. Not everything is certified.** Inception-v3 at 8 and 16 GPUs is planned by "
        "block coordinate descent (the whole-step elimination exceeds the table budget), so "
        "its auto plans are the best found, not a certified optimum under Eq. 1; AlexNet and "
        "VGG-16 are certified at every size. OptCNN's elimination reduces these networks to "
        "K = 2 nodes because it plans one node per layer; we plan every equation of the step "
        "(forward, backward and update), where the forward-backward ladder is wider.",
        "",
        "**Oddities noticed on the way** (no effect on the numbers): `Plan.layer_rows` shows "
        "for module-level rows such as `VGG` (pools, reshape) the configuration of the first "
        "forward node, a `broadcast_in_dim`, not of the pool; `paper_notation` prints "
        "weight-gradient convolutions with two `n` entries (`{n=1, h=1, w=1, c=1, n=16}`: the "
        "conv template's lhs-batch name, which holds the input channels in this convolution, "
        "and the real batch dim). The per-layer figures show auto, OWT and data (each panel "
        "has its own scale since issue 11; model parallelism is in the comparison bars).",
    ]


# ---------------------------------------------------------------------------- figure

COLORS = {"data": "#4C72B0", "model": "#DD8452", "owt": "#55A868", "auto": "#8172B3"}
LABELS = {"data": "data", "model": "model", "owt": "OWT", "auto": "layer-wise (auto)"}


def gpu_label(n: int) -> str:
    nodes = math.prod(MESHES[n].values()) // MESHES[n]["gpu"]
    return f"{n} ({nodes})"


def plot_model(name: str, plans: dict, batch: int, folder: str) -> str:
    """strategies_<model>_16.png: `jaxpar.figures.plot_strategies` of the 16-GPU plans."""
    from jaxpar.planner.figures import plot_strategies

    path = os.path.join(folder, f"strategies_{name}_16.png")
    os.makedirs(folder, exist_ok=True)
    return plot_strategies(
        {s: plans[s] for s in ("auto", "owt", "data")},
        path,
        title=f"{TITLES[name]}, 16 P100 (4 nodes), batch {batch}, p100 cluster",
    )


class StoredPlan:
    """A plan as the --json results store it (cost entry, `layer_rows`): what
    `plot_strategies` reads, so --from-json can redraw the per-model figures."""

    def __init__(self, cost: dict, layers: list[dict]):
        self.cost = types.SimpleNamespace(**cost)
        self.layers = layers

    def layer_rows(self) -> list[dict]:
        return self.layers


def plot_stored(results: dict, folder: str) -> list[str]:
    """strategies_<model>_16.png of every model with 16-GPU results in --json's output."""
    paths = []
    for name, m in results["models"].items():
        case = m["cases"].get("16")
        if case is None or not m.get("layers_16"):
            continue
        plans = {s: StoredPlan(case["strategies"][s], m["layers_16"][s]) for s in STRATS}
        paths.append(plot_model(name, plans, case["batch"], folder))
    return paths


def draw(results: dict, path: str) -> None:
    """Fig. 7 (throughput, linear-scaling line) over Fig. 8 (communication, log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["models"])
    fig, axes = plt.subplots(2, len(names), figsize=(5.2 * len(names), 8.2), squeeze=False)
    width = 0.2
    for col, name in enumerate(names):
        cases = results["models"][name]["cases"]
        gpus = sorted(int(k) for k in cases)
        x = range(len(gpus))
        ax = axes[0, col]
        for i, s in enumerate(STRATS):
            ys = [cases[str(n)]["strategies"][s]["throughput"] for n in gpus]
            ax.bar([j + (i - 1.5) * width for j in x], ys, width, color=COLORS[s], label=LABELS[s])
        if "1" in cases:
            one = cases["1"]["strategies"]["auto"]["throughput"]
            ax.plot(list(x), [one * n for n in gpus], "r-", lw=1.5, label="linear scaling")
        ax.set_xticks(list(x))
        ax.set_xticklabels([gpu_label(n) for n in gpus])
        ax.set_title(f"{TITLES[name]}: predicted throughput", fontsize=10)
        ax.set_ylabel("samples / s")
        ax.set_xlabel("GPUs (nodes)")
        ax.grid(axis="y", alpha=0.3)
        ax = axes[1, col]
        multi = [n for n in gpus if n > 1]
        for i, s in enumerate(STRATS):
            ys = [cases[str(n)]["strategies"][s]["comm_bytes_total"] / 1e9 for n in multi]
            ax.bar(
                [j + (i - 1.5) * width for j in range(len(multi))],
                ys,
                width,
                color=COLORS[s],
                label=LABELS[s],
            )
        ax.set_yscale("log")
        ax.set_xticks(list(range(len(multi))))
        ax.set_xticklabels([gpu_label(n) for n in multi])
        ax.set_title(f"{TITLES[name]}: communication per step", fontsize=10)
        ax.set_ylabel("GB sent per step, all devices (ring)")
        ax.set_xlabel("GPUs (nodes)")
        ax.grid(axis="y", alpha=0.3, which="both")
    axes[0, 0].legend(fontsize=8, loc="upper left")
    fig.suptitle(
        "OptCNN Figs. 7-8 with jaxpar's cost model: p100 cluster (4 P100/node, NVLink; EDR IB), "
        f"{results['per_gpu_batch']} samples/GPU, float32",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--md", default=None)
    parser.add_argument("--png", default=None)
    parser.add_argument("--plots", default=None, help="folder for strategies_<model>_16.png")
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--gpus", nargs="+", type=int, default=list(GPUS))
    parser.add_argument("--no-sensitivity", action="store_true")
    parser.add_argument(
        "--objective", default="time", help="time (OptCNN Eq. 1, the paper's) or overlap"
    )
    parser.add_argument(
        "--from-json",
        default=None,
        help="redraw the figures (--png, --plots) and .md from an earlier --json",
    )
    args = parser.parse_args()
    OBJECTIVE[0] = args.objective
    if args.from_json:
        with open(args.from_json) as f:
            results = json.load(f)
    else:
        results = run(args)
    if args.json and not args.from_json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.png:
        draw(results, args.png)
        log(f"wrote {args.png}")
    if args.plots and args.from_json:
        for path in plot_stored(results, args.plots):
            log(f"wrote {path}")
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(results))
        log(f"wrote {args.md}")


if __name__ == "__main__":
    main()
