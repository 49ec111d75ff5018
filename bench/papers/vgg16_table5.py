"""OptCNN Table 5: VGG-16's per-layer configuration on 4 GPUs of one node, ours beside the paper's.

VGG-16 (full size, float32, SGD + momentum), batch 128 (32 per GPU), p100 cluster, one node.
Planned with the time objective (OptCNN Eq. 1) and SoyBean's "comm" objective, on the mesh
``{gpu: 4}`` and on ``{a: 2, b: 2}`` (the same 4 GPUs as a 2 x 2 mesh: jaxpar's configurations
assign whole mesh axes to dimensions, so degree-2 splits such as Table 5's ``h=2, w=2`` and
FC3's ``c=2`` exist only on the 2 x 2 mesh). Layers are grouped as in Table 5, and Table 5
itself is costed under our model: its forward conv / dense configurations are fixed and the
rest of the step (pools, loss, backward, update) gets the best completion (exact elimination).

    python bench/papers/vgg16_table5.py --json bench/papers/results/vgg16_table5.json \
        --md bench/papers/results/vgg16_table5.md
"""

import argparse
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import jaxpar_zoo as zoo
import numpy as np

import jaxpar
from jaxpar.cost.evaluation import evaluate
from jaxpar.planner.plan import with_assignment
from jaxpar.search.candidates import Choice
from jaxpar.solver.elimination import solve_exact
from jaxpar.solver.problem import Problem

BATCH = 128
MESHES = {"1x4": {"gpu": 4}, "2x2": {"a": 2, "b": 2}}
COMMAND = (
    "python bench/papers/vgg16_table5.py --json bench/papers/results/vgg16_table5.json "
    "--md bench/papers/results/vgg16_table5.md"
)

# Table 5 as intended (the text rendering is garbled): group, our layers, paper configuration.
GROUPS = [
    ("2×Conv+Pool", ("conv0_0", "conv0_1"), {"n": 4}),
    ("2×Conv+Pool", ("conv1_0", "conv1_1"), {"n": 4}),
    ("3×Conv+Pool", ("conv2_0", "conv2_1", "conv2_2"), {"n": 4}),
    ("3×Conv+Pool", ("conv3_0", "conv3_1", "conv3_2"), {"h": 2, "w": 2}),
    ("3×Conv+Pool", ("conv4_0", "conv4_1", "conv4_2"), {"h": 2, "w": 2}),
    ("FC1", ("fc1",), {"c": 4}),
    ("FC2", ("fc2",), {"c": 4}),
    ("FC3", ("fc3",), {"c": 2}),
    ("Softmax", ("(forward)",), {}),
]
# The paper's §6.3 text says h/w parallelism accelerates "the last three convolutional
# layers": the variant with only group 5 spatially split.
TEXT_VARIANT = {"conv3_0": {"n": 4}, "conv3_1": {"n": 4}, "conv3_2": {"n": 4}}


def log(msg: str) -> None:
    print(msg, flush=True)


def degrees(config: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for k, v in re.findall(r"(\w+)=(\d+)", config):
        out[k] = out.get(k, 1) * int(v)
    return out


def paper_str(target: dict[str, int], dense: bool) -> str:
    keys = ("n", "c") if dense else ("n", "h", "w", "c")
    return "{" + ", ".join(f"{k}={target.get(k, 1)}" for k in keys) + "}"


def matches(config: str, target: dict[str, int]) -> bool:
    deg = degrees(config)
    return all(deg.get(k, 1) == target.get(k, 1) for k in set(deg) | set(target))


def short(layer: str) -> str:
    return layer.split("/")[-1]


def forward_contractions(plan) -> dict[str, int]:
    """Layer (short name) -> node index of its forward conv / dot_general."""
    out = {}
    for node in plan.ng.nodes:
        if node.anchor < 0 or node.phase != "forward":
            continue
        if plan.program.eqns[node.anchor].primitive in ("conv_general_dilated", "dot_general"):
            out[short(plan.labels[node.index])] = node.index
    return out


def weight_gradient_configs(plan) -> dict[str, str]:
    """Layer -> configuration of its weight-gradient contraction (output shaped like a kernel)."""
    kernels = {
        tuple(sorted(plan.program.tensors[t].shape))
        for t, p in zip(plan.program.invars, plan.program.invar_paths, strict=True)
        if p.startswith("[0]") and len(plan.program.tensors[t].shape) >= 2
    }
    out = {}
    for node in plan.ng.nodes:
        if node.anchor < 0 or node.phase != "backward":
            continue
        eqn = plan.program.eqns[node.anchor]
        if eqn.primitive not in ("conv_general_dilated", "dot_general"):
            continue
        if tuple(sorted(plan.program.tensors[eqn.outputs[0]].shape)) not in kernels:
            continue
        cfg = plan.configs[node.index][plan.assignment[node.index]]
        out[short(plan.labels[node.index])] = plan.paper_notation(node.index, cfg)
    return dict(sorted(out.items()))


def fixed_completion(plan, targets: dict[str, dict[str, int]], name: str):
    """The plan with the given forward configurations fixed and the rest solved exactly."""
    fwd = forward_contractions(plan)
    unary = [u.copy() for u in plan.problem.unary]
    for layer, target in targets.items():
        i = fwd[layer]
        ok = np.array([matches(plan.paper_notation(i, c), target) for c in plan.configs[i]])
        if not ok.any():
            return None  # not representable on this mesh
        unary[i][~ok] += 1e3  # seconds: never chosen
    problem = Problem(unary=unary, edges=plan.problem.edges, blocks=plan.problem.blocks)
    assign, _value, stats = solve_exact(problem, None, table_budget=4e6, enum_budget=2e6)
    for layer, target in targets.items():
        i = fwd[layer]
        assert matches(plan.paper_notation(i, plan.configs[i][assign[i]]), target), layer
    ev = evaluate(plan.eval_context(), assign)
    choice = Choice(name, tuple(assign), ev, False, None, {}, plan.choice.baselines, None)
    return with_assignment(plan, choice, dict(stats))


def summary(plan) -> dict:
    c = plan.cost
    return {
        **c.as_dict(),
        "throughput": BATCH / c.step_s,
        "optimal": plan.optimal,
        "layers": {short(r["layer"]): r for r in plan.layer_rows()},
        "weight_gradient": weight_gradient_configs(plan),
    }


def run() -> dict:
    cluster = jaxpar.Cluster.preset("p100", devices=4)
    ex = zoo.get("vgg16", batch=BATCH)
    res: dict = {"batch": BATCH, "cluster": "p100", "meshes": MESHES, "plans": {}}
    t_all = time.perf_counter()
    for mname, mesh in MESHES.items():
        for objective in ("time", "comm"):
            t0 = time.perf_counter()
            plan = jaxpar.plan(ex.step, *ex.args, mesh=mesh, cluster=cluster, objective=objective)
            key = f"auto-{objective} {mname}"
            res["plans"][key] = summary(plan) | {"plan_s": time.perf_counter() - t0}
            log(
                f"{key:<18} step {plan.cost.step_s * 1e3:8.2f} ms  "
                f"{plan.cost.comm_bytes / 1e6:8.1f} MB"
            )
            if objective == "time":
                for s in ("data", "owt"):
                    res["plans"][f"{s} {mname}"] = summary(plan.variant(s))
                targets = {layer: target for _, layers, target in GROUPS[:-1] for layer in layers}
                for label, tg in (("table5", targets), ("table5-text", targets | TEXT_VARIANT)):
                    fixed = fixed_completion(plan, tg, label)
                    k = f"{label} {mname}"
                    if fixed is None:
                        res["plans"][k] = None
                        log(f"{k:<18} not representable on mesh {mesh}")
                    else:
                        res["plans"][k] = summary(fixed)
                        log(
                            f"{k:<18} step {fixed.cost.step_s * 1e3:8.2f} ms  "
                            f"{fixed.cost.comm_bytes / 1e6:8.1f} MB"
                        )
    res["wall_s"] = time.perf_counter() - t_all
    return res


# ---------------------------------------------------------------------------- report


def group_config(entry: dict | None, layers) -> str:
    if entry is None:
        return "not representable"
    cfgs = [entry["layers"].get(layer, {}).get("config", "-") for layer in layers]
    distinct = list(dict.fromkeys(cfgs))
    if len(distinct) == 1:
        return f"`{distinct[0]}`"
    return " ".join(f"`{c}`" for c in cfgs)


def markdown(res: dict) -> str:
    P = res["plans"]
    cols = ["auto-time 1x4", "auto-comm 1x4", "auto-time 2x2", "auto-comm 2x2"]
    lines = [
        "# OptCNN Table 5: VGG-16 on 4 GPUs (one p100 node), ours beside the paper's",
        "",
        "```bash",
        COMMAND,
        "```",
        "",
        f"VGG-16, batch {res['batch']} (32 per GPU), float32, SGD + momentum, p100 cluster "
        "(4 × P100 on NVLink). Meshes: `1x4` = `{gpu: 4}`, `2x2` = `{a: 2, b: 2}` (the same "
        "4 GPUs; both axes on NVLink). Configurations are the forward conv / dense node of each "
        "layer, in OptCNN notation over all of our dimensions (convolution: n, h, w, c = output "
        "channels, k = input channels, the contraction; dense: n, c = output features, k = "
        "input features). The paper's configurations have no k (it is always 1 there). "
        f"Whole run: {res['wall_s']:.0f} s.",
        "",
        "| Table 5 layers | our layers | paper | " + " | ".join(cols) + " |",
        "|---|---|---|" + "---|" * len(cols),
    ]
    for group, layers, target in GROUPS:
        dense = group.startswith(("FC", "Soft"))
        cells = [group_config(P.get(c), layers) for c in cols]
        lines.append(
            f"| {group} | {', '.join(layers)} | `{paper_str(target, dense)}` | "
            + " | ".join(cells)
            + " |"
        )
    lines += [
        "",
        "Predicted step (time objective's cost model for every row):",
        "",
        "| plan | step ms | t_C | t_X | t_S | comm MB/device | samples/s | certified |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, e in P.items():
        if e is None:
            lines.append(f"| {key} | not representable | | | | | | |")
            continue
        lines.append(
            f"| {key} | {e['step_s'] * 1e3:.2f} | {e['compute_s'] * 1e3:.2f} "
            f"| {e['reshard_s'] * 1e3:.2f} | {e['sync_s'] * 1e3:.2f} "
            f"| {e['comm_bytes'] / 1e6:.1f} | {e['throughput']:.1f} "
            f"| {'yes' if e['optimal'] else 'no'} |"
        )
    lines += [
        "",
        "`table5` = Table 5's forward configurations fixed (conv groups 4-5 at h=2, w=2), "
        "the rest of the step solved exactly; `table5-text` = the §6.3 text's reading "
        "('height and width for the last three convolutional layers': group 5 only).",
        "",
        "Weight-gradient configurations of auto-time (the backward contraction producing each "
        "kernel gradient; its batch dimension is the contraction, printed as the last `n`. The "
        "first `n` of the conv rows is a jaxpar notation oddity: the conv template's "
        "lhs-batch name, which in this convolution holds the input channels):",
        "",
        "| layer | 1x4 | 2x2 |",
        "|---|---|---|",
    ]
    wg1 = P["auto-time 1x4"]["weight_gradient"]
    wg2 = P["auto-time 2x2"]["weight_gradient"]
    for layer in wg1:
        lines.append(f"| {layer} | `{wg1[layer]}` | `{wg2.get(layer, '-')}` |")
    lines += ["", *explanations(res)]
    return "\n".join(lines) + "\n"


def explanations(res: dict) -> list[str]:
    P = res["plans"]
    a1, a2 = P["auto-time 1x4"], P["auto-time 2x2"]
    c1, c2 = P["auto-comm 1x4"], P["auto-comm 2x2"]
    t5, t5t = P.get("table5 2x2"), P.get("table5-text 2x2")
    d1 = P["data 1x4"]

    def ms(x):
        return f"{x * 1e3:.1f}"

    def layer_ms(e, layer, key):
        return e["layers"][layer][key] * 1e3

    conv4 = sum(layer_ms(a2, f"conv4_{i}", "t_C") for i in range(3))
    conv4_t5 = sum(layer_ms(t5, f"conv4_{i}", "t_C") for i in range(3)) if t5 else float("nan")
    conv4_x5 = sum(layer_ms(t5, f"conv4_{i}", "t_X") for i in range(3)) if t5 else float("nan")
    same_obj = all(
        a["layers"][k]["config"] == c["layers"][k]["config"]
        for a, c in ((a1, c1), (a2, c2))
        for k in a["layers"]
        if k.startswith(("conv", "fc"))
    )
    out = [
        "## Differences, explained",
        "",
        "**Convolution groups 1-3: same as the paper.** Every conv layer is `{n=4}` (sample "
        "parallelism over all 4 GPUs) under both objectives and both meshes.",
        "",
        "**Convolution groups 4-5: we keep n=4 where the paper splits h and w.** Under our "
        "cost model t_C of a shard is a roofline of its FLOPs and bytes, the same whichever "
        "dimension is split, so a spatial split can never compute faster than a sample split, "
        "and it adds a halo exchange (and a reshard from the n-split layout of the layers "
        "before). With Table 5's h=2, w=2 fixed on the 2x2 mesh, conv4's three layers cost "
        f"{conv4_t5:.2f} ms of t_C (auto: {conv4:.2f} ms) plus {conv4_x5:.2f} ms of t_X "
        "(halos and reshards); the whole Table 5 plan is "
        + (
            f"{ms(t5['step_s'])} ms against auto's {ms(a2['step_s'])} ms "
            f"({t5['step_s'] / a2['step_s']:.3f}x), the text's variant {ms(t5t['step_s'])} ms"
            if t5 and t5t
            else "not representable"
        )
        + ". OptCNN measures t_C per configuration with cuDNN, where a 14x14 or 28x28 "
        "feature map split 2x2 over 4 GPUs (each computing all 32·4 samples at 7x7 / 14x14) "
        "and the same layer split by samples run at different efficiencies; that measured "
        "difference is what makes h/w win in the paper, and our model cannot see it. Also, on "
        "the `{gpu: 4}` mesh an axis of size 4 goes to one dimension, so h=2, w=2 (and FC3's "
        "c=2) cannot even be expressed; the 2x2 mesh is needed for them.",
        "",
        "**FC layers: we split the contraction (k) as well as, or instead of, the output "
        "features (c).** On 1x4, auto-time chooses fc1 "
        f"`{a1['layers']['fc1']['config']}`, fc2 `{a1['layers']['fc2']['config']}`, fc3 "
        f"`{a1['layers']['fc3']['config']}`; on 2x2, `{a2['layers']['fc1']['config']}` for "
        "each. The paper's notation has only n and c for dense layers (k is not among "
        "OptCNN's parallelizable dimensions); our search also has AccPar's Type-II split "
        "(input features, finished by an all-reduce of the partial sums). Splitting fc1's "
        "input features (25088) over 4 GPUs lets each GPU read a quarter of the pooled "
        "activation (no all-gather of the [128, 25088] input) and own a quarter of the "
        "103M-parameter weight; its output [128, 4096] is then all-reduced "
        f"({a1['layers']['fc1']['t_X'] * 1e3:.2f} ms). The paper's c=4 needs the input "
        "all-gathered instead. Both keep every FC weight off the gradient all-reduce, the "
        "point of the paper's FC choice. The paper decreases the degree to c=2 at FC3; with a "
        "roofline t_C, using fewer devices never lowers compute, and FC3 is too small "
        f"({a1['layers']['fc3']['t_C'] * 1e3:.2f} ms) for its communication to matter.",
        "",
        "**Softmax: same as the paper.** The loss (our `(forward)` row: log-softmax and "
        f"cross-entropy) is `{a1['layers'].get('(forward)', {}).get('config', '-')}`, "
        "replicated, as Table 5's {n=1, c=1}: fc3's [128, 1000] output is tiny, so "
        "computing the loss on every GPU costs less than splitting it "
        f"({a1['layers'].get('(forward)', {}).get('t_X', 0.0) * 1e3:.2f} ms of t_X).",
        "",
        "**Time vs comm objective.** "
        + (
            "Both objectives choose the same conv and FC configurations on each mesh. "
            if same_obj
            else "The objectives differ on some layers (see the table). "
        )
        + "The comm objective ignores t_C, so it leaves nodes without communication (the "
        "constant broadcasts of the `VGG` row, pools) wherever it likes, including fully "
        f"replicated: its step is {ms(c1['step_s'])} / {ms(c2['step_s'])} ms (1x4 / 2x2) "
        f"against the time objective's {ms(a1['step_s'])} / {ms(a2['step_s'])} ms, with "
        f"{c1['comm_bytes'] / 1e6:.1f} / {c2['comm_bytes'] / 1e6:.1f} MB per device against "
        f"{a1['comm_bytes'] / 1e6:.1f} / {a2['comm_bytes'] / 1e6:.1f} MB.",
        "",
        "**How much it matters here.** VGG-16's auto step is "
        f"{a1['compute_s'] / a1['step_s']:.0%} compute under our model. Table 5's plan has "
        "the same t_C as auto's"
        + (
            f" ({ms(t5['compute_s'])} vs {ms(a2['compute_s'])} ms); all of its extra "
            f"{ms(t5['step_s'] - a2['step_s'])} ms is t_X of layout changes between the "
            f"n-split and h/w-split layers and halos ({t5['comm_bytes'] / 1e6:.0f} vs "
            f"{a2['comm_bytes'] / 1e6:.0f} MB per device)"
            if t5
            else ""
        )
        + f". Data parallelism is {ms(d1['step_s'])} ms on 1x4: "
        f"{ms(d1['sync_s'] - a1['sync_s'])} ms more t_S (all-reducing the 123M dense "
        f"parameters over NVLink) and {ms(d1['compute_s'] - a1['compute_s'])} ms more t_C "
        "(the replicated constant broadcasts, an artifact of jaxpar's data baseline; see "
        "`strategies.md`, point 1).",
    ]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--md", default=None)
    args = parser.parse_args()
    res = run()
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(res))
        log(f"wrote {args.md}")


if __name__ == "__main__":
    main()
