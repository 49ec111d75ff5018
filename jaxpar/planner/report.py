"""Reports of a `Plan`: per-layer and per-phase rows, the text report, the comparison, JSON.

Times are printed in ms, bytes in MB (10^6), per device per step.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import TYPE_CHECKING, Any

from ..cost.node_costs import node_dtype
from ..hardware.mesh_model import cost_sources
from ..memory.held_bytes import HeldBytes
from ..nodes.configs import Config, split_axes
from ..program.graph import BACKWARD, FORWARD, UPDATE
from ..rules.table import CONTRACTIONS
from ..search.baselines import STRATEGIES
from ..search.options import PIPELINER_FLAGS

if TYPE_CHECKING:
    from ..cost.evaluation import PlanCost
    from .plan import Plan

_ROW_TERMS = ("t_C", "t_C_ratio", "t_X", "t_S", "bytes")
_CONSTANT_LIKE = ("broadcast_in_dim", "iota")  # nodes that make constants, not a layer's work


def layer_name(plan: Plan, node_index: int) -> str:
    """A node's layer label, or its phase in parentheses when it has none."""
    node = plan.ng.nodes[node_index]
    phase = {UPDATE: "optimizer", BACKWARD: "backward", FORWARD: "forward"}.get(
        node.phase, node.phase
    )
    return plan.labels[node_index] or f"({phase})"


def layer_rows(plan: Plan) -> list[dict]:
    """Per layer (program order): summed t_C / t_X / t_S / bytes, the bytes per device it holds
    for long (``held``: state shards, saved activations, gradients; `HeldBytes.per_node`),
    and the configuration and layout of its representative node (its heaviest forward
    contraction)."""
    rows: dict[str, dict] = {}
    first: dict[str, int] = {}  # a layer sits where its first computation does
    held = HeldBytes(plan.memory_model).per_node(plan.assignment)
    for node, r in zip(plan.ng.nodes, plan.evaluation.node_rows, strict=True):
        key = layer_name(plan, node.index)
        row = rows.setdefault(
            key, {"layer": key, "rep": None, "held": 0.0, **dict.fromkeys(_ROW_TERMS, 0.0)}
        )
        for k in _ROW_TERMS:
            row[k] += getattr(r, k)
        row["held"] += held[node.index]
        prim = plan.program.eqns[node.anchor].primitive if node.anchor >= 0 else ""
        flops = sum(m.flops for m in node.members)
        # ties (pools, reshapes: no FLOPs counted) go to real work over constant-like nodes
        # (a ReLU's broadcast zero), then to the largest result
        size = plan.program.tensors[plan.program.eqns[node.anchor].outputs[0]].size if prim else 0
        score = (
            prim in CONTRACTIONS,
            node.phase == FORWARD,
            flops,
            prim not in _CONSTANT_LIKE,
            size,
        )
        if row["rep"] is None or score > row["score"]:
            row["rep"], row["score"] = node.index, score
        if node.anchor >= 0:
            first[key] = min(first.get(key, node.anchor), node.anchor)
    out = []
    for row in sorted(rows.values(), key=lambda r: first.get(r["layer"], -1)):
        node = plan.ng.nodes[row.pop("rep")]
        row.pop("score")
        row["config"] = paper_notation(plan, node.index, plan.config(node.index))
        tensor = plan.program.eqns[node.anchor].outputs[0] if node.anchor >= 0 else node.invar
        row["spec"] = str(plan.partition_spec(plan.tensor_specs[tensor]))
        out.append(row)
    return out


def node_phase(plan: Plan, node_index: int) -> str:
    """AccPar's phases: "forward", "backward" (error propagation), "gradient" (contractions
    over the batch: weight gradients and their synchronization), "update" (optimizer)."""
    node = plan.ng.nodes[node_index]
    if node.phase == BACKWARD:
        red = set(node.space.reduce_dims) & set(plan.batch[node_index])
        return "gradient" if red else "backward"
    return {FORWARD: "forward", UPDATE: "update"}.get(node.phase, "input")


def phase_rows(plan: Plan) -> list[dict]:
    """Per (layer, phase): t_C even and with ratios, t_X, t_S, and on heterogeneous meshes
    each device group's busy time (even split) and its ratio share α of the layer's work."""
    speeds = plan.speeds
    rows: dict[tuple[str, str], dict] = {}
    for node, r in zip(plan.ng.nodes, plan.evaluation.node_rows, strict=True):
        layer, phase = layer_name(plan, node.index), node_phase(plan, node.index)
        row = rows.setdefault(
            (layer, phase),
            {"layer": layer, "phase": phase, **dict.fromkeys(_ROW_TERMS[:4], 0.0), "groups": {},
             "alpha": {}},
        )  # fmt: skip
        for k in _ROW_TERMS[:4]:
            row[k] += getattr(r, k)
        if speeds is None or not r.t_C:
            continue
        cfg = plan.config(node.index)
        dtype = node_dtype(plan.ng, node)
        for g, busy in speeds.slowdown(dtype).items():
            row["groups"][g] = row["groups"].get(g, 0.0) + r.t_C * busy
        shares = speeds.shares(dtype, split_axes(cfg))
        if len(shares) > 1:  # only splits that cross groups have a ratio
            for g, share in shares.items():  # α weighted by compute: a layer's shares sum to 1
                row["alpha"][g] = row["alpha"].get(g, 0.0) + share * r.t_C
    for row in rows.values():
        total = sum(row["alpha"].values())
        row["alpha"] = {g: a / total for g, a in row["alpha"].items()} if total else {}
    return [r for r in rows.values() if r["t_C"] or r["t_X"] or r["t_S"]]


def heterogeneity_report(plan: Plan) -> str:
    """Per layer and phase: each device group's compute time under the even split, the ratio
    split's time and shares (AccPar Eq. 10). Empty on homogeneous meshes."""
    if plan.speeds is None:
        return ""
    rows = phase_rows(plan)
    groups = list(plan.speeds.slowdown("float32"))
    w = max([len(r["layer"]) for r in rows] + [5])
    head = (
        f"{'layer':<{w}}  {'phase':<8} "
        + " ".join(f"{'t_C ' + g:>16}" for g in groups)
        + f" {'t_C ratio':>10}  alpha ({', '.join(groups)})"
    )
    lines = [
        "heterogeneous mesh: even split (what XLA runs) vs ratio split (uneven, AccPar Eq. 10);"
        " times in ms",
        head,
        "-" * len(head),
    ]
    for r in rows:
        busy = " ".join(f"{r['groups'].get(g, 0.0) * 1e3:16.4f}" for g in groups)
        alpha = "/".join(f"{r['alpha'].get(g, 0.0):.2f}" for g in groups) if r["alpha"] else "-"
        lines.append(
            f"{r['layer']:<{w}}  {r['phase']:<8} {busy} {r['t_C_ratio'] * 1e3:10.4f}  {alpha}"
        )
    c = plan.cost
    lines.append(
        f"step: even split {c.step_s * 1e3:.4f} ms, ratio split {c.ratio_step_s * 1e3:.4f} ms "
        f"(compute {c.compute_s * 1e3:.4f} -> {c.ratio_compute_s * 1e3:.4f} ms)"
    )
    return "\n".join(lines)


def paper_notation(plan: Plan, node_index: int, cfg: Config) -> str:
    """Degrees per iteration dim in OptCNN's notation, e.g. ``{n=4, c=2, k=1}``."""
    node = plan.ng.nodes[node_index]
    sizes = plan.mesh_axes.sizes
    names = list(node.space.names)
    out_map = node.space.out_maps[0] if node.space.out_maps else ()
    if out_map and out_map[-1] is not None and names[out_map[-1]].startswith(("d", "m")):
        names[out_map[-1]] = "c"
    batch = sorted(plan.batch[node_index], key=lambda d: -node.space.sizes[d])
    if batch:  # the largest batch dim is n (a weight gradient also contracts one)
        names[batch[0]] = "n"
    parts = []
    for d, name in enumerate(names):
        deg = math.prod(sizes[a] for a, x in enumerate(cfg) if x == d)
        parts.append(f"{name}={deg}")
    return "{" + ", ".join(parts) + "}"


def host_term(c) -> str:
    """Eq. 1's term for the copies to and from host memory, when the plan makes any."""
    return f" + host copies {c.host_s * 1e3:.4f}" if c.host_s else ""


def host_line(plan) -> str:
    """What the plan copies between device and host memory, and at what speed."""
    c, bandwidth = plan.cost, plan.mesh_axes.host_bandwidth
    head = f"host offload: {_bytes_text(c.host_bytes)} copied per device per step (both ways)"
    if bandwidth:
        return (
            f"{head}, {c.host_s * 1e3:.4f} ms on its {bandwidth / 1e9:g} GB/s host link "
            f"(copy engines beside compute in the overlapped step)"
        )
    if plan.platform == "cpu":
        return f"{head}: XLA:CPU has one memory, the copies are no copies (not priced)"
    return (
        f"{head}: not priced, {plan.cluster.device.name}'s host link speed is not known "
        f"(DeviceSpec.host_bandwidth)"
    )


def certificate_line(plan: Plan) -> str:
    """What ``optimal`` means for this plan, in one line: certified, or its gap to the best
    proven lower bound and the space that bound speaks about (every plan, or, when repeated
    layers were searched as one, every plan giving them equal layouts)."""
    tying = plan.choice.tying if plan.strategy in ("auto", "hypar") else None
    method = plan.choice.bound_method
    copies = sum(n for _, n in tying.families) if tying is not None else 0
    tied = f"giving repeated layers ({copies} copies) equal layouts"
    space = "every plan's cost" if tying is None else f"the cost of every plan {tied}"
    searched = ""
    if plan.objective == "overlap":
        if method == "streams":  # `lower_bounds.overlap_bound`: over the searched space
            of = "every plan's" if tying is None else f"the overlapped step of every plan {tied}"
            space = (
                f"{of} overlapped step (the larger of its compute and communication streams)"
                if tying is None
                else f"{of} (the larger of its compute and communication streams)"
            )
        else:  # `choose.overlap_lower_bound`: over every plan, tied or not
            space = "every plan's overlapped step (its compute stream alone)"
            if tying is not None:
                searched = f"; repeated layers ({copies} copies) were searched with equal layouts"
    if plan.optimal:
        return f"optimal: certified (reported cost = proven lower bound of {space})"
    if plan.strategy not in ("auto", "hypar"):
        return f"optimal: not claimed ({plan.strategy} is a fixed rule)"
    if plan.lower_bound is None:
        wide = "the step is too wide for exact elimination"
        if tying is not None:
            wide += f", searched with repeated layers ({copies} copies) sharing layouts"
        return f"optimal: not certified ({wide})"
    gap = plan.evaluation.objective - plan.lower_bound
    rel = gap / max(plan.evaluation.objective, 1e-30)
    how = {"elimination": "exact", "dual": "LP dual"}.get(method or "", "")
    proof = f"a proven lower bound ({how})" if how else "a proven lower bound"
    return f"optimal: not certified (within {rel:.2%} of {proof} of {space}{searched})"


def plan_report(plan: Plan) -> str:
    """A table: one row per layer, then totals and the comparison with the baselines."""
    rows = layer_rows(plan)
    w = max([len(r["layer"]) for r in rows] + [5])
    cw = max([len(r["config"]) for r in rows] + [6])
    sw = max([len(r["spec"]) for r in rows] + [4])
    head = (
        f"{'layer':<{w}}  {'config':<{cw}}  {'spec':<{sw}}  {'t_C ms':>9} {'t_X ms':>9} "
        f"{'t_S ms':>9} {'MB':>9} {'held MB':>9}"
    )
    mesh = plan.mesh_shape
    lines = [
        f"jaxpar plan: strategy={plan.strategy} objective={plan.objective} mesh={mesh} "
        f"cluster={plan.cluster.name} optimal={plan.optimal}",
        f"cost numbers: {cost_sources(plan.mesh_axes, plan.cluster)}",
        head,
        "-" * len(head),
    ]
    for r in rows:
        lines.append(
            f"{r['layer']:<{w}}  {r['config']:<{cw}}  {r['spec']:<{sw}}  "
            f"{r['t_C'] * 1e3:9.4f} {r['t_X'] * 1e3:9.4f} {r['t_S'] * 1e3:9.4f} "
            f"{r['bytes'] / 1e6:9.4f} {r['held'] / 1e6:9.3f}"
        )
    c = plan.cost
    n = sum(x.count for x in plan.collectives)
    ars = sum(x.count for x in plan.collectives if x.group >= 0)
    lines += [
        "-" * len(head),
        f"{'total':<{w}}  {'':<{cw}}  {'':<{sw}}  {c.compute_s * 1e3:9.4f} "
        f"{c.reshard_s * 1e3:9.4f} {c.sync_s * 1e3:9.4f} {c.comm_bytes / 1e6:9.4f}",
        f"step {c.step_s * 1e3:.4f} ms = compute {c.compute_s * 1e3:.4f} + comm "
        f"{c.comm_s * 1e3:.4f}{host_term(c)}; {c.comm_bytes / 1e6:.4f} MB sent per device; "
        f"{n} collective{'s' if n != 1 else ''}",
    ]
    if c.host_bytes:
        lines.append(host_line(plan))
    if ars > c.combined_all_reduces:
        lines.append(
            f"combined: {ars} all-reduces run as {c.combined_all_reduces} (XLA's combiner): "
            f"step {c.combined_step_s * 1e3:.4f} ms with latency once per combined all-reduce"
        )
    if c.overlapped_step_s < c.combined_step_s * (1 - 1e-9) or plan.objective == "overlap":
        why = (
            "the plan is the candidate with the shortest one"
            if plan.objective == "overlap"
            else "the search minimizes the Eq. 1 step, its upper bound"
        )
        lines.append(
            f"overlapped: step {c.overlapped_step_s * 1e3:.4f} ms with communication on its own "
            f"stream beside compute ({why})"
        )
    if plan.options.pipelined_regions(plan.program):
        lines.append(
            "pipelined loops: each scan's weight gathers run an iteration ahead and its "
            "stacked gradients' all-reduces an iteration behind (XLA:GPU's collective "
            f"pipeliner: XLA_FLAGS={' '.join(PIPELINER_FLAGS)})"
        )
    lines += [
        certificate_line(plan),
        memory_lines(plan),
        comparison(plan),
    ]
    if plan.program.user_constraints:
        lines.append(constraint_lines(plan))
    hetero = heterogeneity_report(plan)
    if hetero:
        lines.append(hetero)
    return "\n".join(lines)


def constraint_lines(plan: Plan) -> str:
    """The step's own sharding constraints: each one's place, the layout asked and the one
    planned; with ``user_constraints="hint"``, the plan keeping them all beside the search's."""
    rows = plan.user_constraints()
    n_kept = sum(1 for r in rows if r["kept"])
    mode = plan.options.user_constraints
    head = f"user constraints ({mode}): {n_kept} of {len(rows)} kept"
    lines = [head + hint_text(plan)]
    w = max(len(r["asked"]) for r in rows)
    for r in rows:
        what = {True: "kept", False: "overridden", None: "not on this mesh"}[r["kept"]]
        names = f"  logical {tuple(r['logical'])}" if r["logical"] else ""
        lines.append(
            f"  eqn {r['equation']:<5} {r['phase']:<8} {r['asked']:<{w}} -> {r['planned']:<{w}} "
            f"{what:<10} {r['where'] or '(top level)'}{names}"
        )
    return "\n".join(lines)


def hint_text(plan: Plan) -> str:
    """With ``user_constraints="hint"``: what keeping every constraint costs beside the plan
    chosen (empty in "pin" mode: every constraint is kept)."""
    h = plan.hint
    if h is None:
        return ""
    unit = "ms" if plan.objective != "comm" else "ms (Eq. 1)"
    if h.kept_step_s is None:
        return f"; no plan keeps them all ({h.why})"
    verdict = "the plan keeps them" if h.chose_kept else "the search's own plan is faster"
    return (
        f"; keeping them all: {h.kept_step_s * 1e3:.4f} {unit} ({h.kept_peak / 1e9:.3f} GB peak), "
        f"the search's own plan: {h.free_step_s * 1e3:.4f} {unit} ({h.free_peak / 1e9:.3f} GB "
        f"peak; {verdict})"
    )


def memory_lines(plan: Plan) -> str:
    """Predicted memory per device, part by part, against the budget."""
    m = plan.memory
    head = "memory per device (predicted peak: arguments + results + live buffers)"
    if plan.stats.get("budget_bound"):
        head += "; the budget bound the plan: the fastest plan found that fits, not certified"
    return head + "\n" + m.breakdown()


def comparison(plan: Plan) -> str:
    """Predicted step time, communication and peak memory of this plan beside the baselines."""

    def step(c: PlanCost) -> float:
        return c.step_for(plan.objective)

    title = "overlap ms" if plan.objective == "overlap" else "step ms"
    lines = [f"{'strategy':<9} {title:>10} {'comm MB':>10} {'vs data':>8} {'peak GB':>9}  fits"]
    assignments = {s: a for s, (a, _) in plan.choice.baselines.items()}
    assignments[plan.strategy] = plan.assignment
    entries = dict(plan.baselines)
    entries[plan.strategy] = plan.cost
    data = entries.get("data")
    for name in STRATEGIES:
        if name not in entries:
            continue
        c = entries[name]
        speed = (step(data) / step(c)) if data and step(c) > 0 else float("nan")
        mark = "*" if name == plan.strategy else " "
        mem = plan.memory_model.estimate(assignments[name], plan.memory.budget)
        fits = "-" if mem.fits is None else ("yes" if mem.fits else "NO")
        lines.append(
            f"{name + mark:<9} {step(c) * 1e3:10.4f} {c.comm_bytes / 1e6:10.4f} {speed:7.2f}x "
            f"{mem.peak / 1e9:9.3f}  {fits}"
        )
    if len(plan.choice.runs) > 1:
        lines.append(search_line(plan))
    return "\n".join(lines)


def search_line(plan: Plan) -> str:
    """Both searches' results on the same tables, and which one wins by how much."""
    runs = plan.choice.runs
    units = {
        "comm": lambda c: f"{c.comm_bytes / 1e6:.4f} MB",
        "overlap": lambda c: f"{c.overlapped_step_s * 1e3:.4f} ms overlapped",
    }
    unit = units.get(plan.objective, lambda c: f"{c.step_s * 1e3:.4f} ms")
    chosen = plan.options.search
    parts = [f"{n}{'*' if n == chosen else ''} {unit(r.evaluation.cost)}" for n, r in runs.items()]
    elim, kc = runs["elimination"].evaluation.objective, runs["kcut"].evaluation.objective
    if math.isclose(elim, kc, rel_tol=1e-9, abs_tol=1e-15):
        verdict = "same cost"
    elif elim < kc:
        verdict = f"joint elimination wins by {(kc - elim) / kc:.1%}"
    else:
        verdict = f"k-cut wins by {(elim - kc) / elim:.1%}"
    return f"search ({plan.strategy}): " + ", ".join(parts) + f"; {verdict}"


def plan_dict(plan: Plan) -> dict[str, Any]:
    """Everything a report needs, as plain JSON-able data."""
    return {
        "strategy": plan.strategy,
        "objective": plan.objective,
        "mesh": plan.mesh_shape,
        "cluster": plan.cluster.name,
        "optimal": plan.optimal,
        "lower_bound": plan.lower_bound,
        "cost": plan.cost.as_dict(),
        "baselines": {k: v.as_dict() for k, v in plan.baselines.items()},
        "search": {k: v for k, v in plan.stats.items() if isinstance(v, (int, float, str))},
        "layers": layer_rows(plan),
        "collectives": [dataclasses.asdict(c) for c in plan.collectives],
        "in_specs": {
            p: str(plan.partition_spec(s))
            for p, s in zip(plan.program.invar_paths, plan.invar_specs, strict=True)
        },
        "user_constraints": {
            "mode": plan.options.user_constraints,
            "constraints": plan.user_constraints(),
            "hint": None if plan.hint is None else dataclasses.asdict(plan.hint),
        },
    }


def plan_json(plan: Plan) -> str:
    """`plan_dict` as indented JSON."""
    return json.dumps(plan_dict(plan), indent=1, default=str)


# ---------------------------------------------------------------- explaining a comparison

PHASES = ("forward", "backward", "gradient", "update")


def phase_totals(plan: Plan) -> dict[str, dict[str, float]]:
    """Per AccPar phase (`node_phase`): summed t_C, t_X, t_S (seconds) and bytes. Input nodes
    count as "update": the optimizer's elementwise updates join the state they update."""
    out = {p: dict.fromkeys(("t_C", "t_X", "t_S", "bytes"), 0.0) for p in PHASES}
    for node, row in zip(plan.ng.nodes, plan.evaluation.node_rows, strict=True):
        phase = node_phase(plan, node.index)
        totals = out["update" if phase == "input" else phase]
        for k in totals:
            totals[k] += getattr(row, k)
    return out


def phase_table(plans: dict[str, Plan]) -> str:
    """Where each strategy's step goes, per phase: compute + communication (ms), and MB sent.

    Communication is reshards and partial sums (t_X) plus gradient synchronization (t_S);
    "gradient" holds the weight gradients and their all-reduces, "update" the optimizer. The
    step is their sum (OptCNN Eq. 1) and, under objective "overlap", the step with
    communication beside compute, which the plan was chosen by.
    """
    totals = {name: phase_totals(p) for name, p in plans.items()}
    w = 21
    dec = 1 if max(p.cost.step_s for p in plans.values()) >= 0.01 else 3  # ms shown with 1 or 3
    cell = lambda c, x: f"{c * 1e3:9.{dec}f} +{x * 1e3:9.{dec}f}"
    lines = [
        "ms per step: compute + communication",
        f"{'phase':<10}" + "".join(f"{n:>{w}}" for n in plans),
    ]
    for phase in PHASES:
        t = {n: totals[n][phase] for n in plans}
        if any(v["t_C"] or v["t_X"] or v["t_S"] for v in t.values()):
            row = "".join(f"{cell(v['t_C'], v['t_X'] + v['t_S']):>{w}}" for v in t.values())
            lines.append(f"{phase:<10}{row}")
    total = "".join(f"{cell(p.cost.compute_s, p.cost.comm_s):>{w}}" for p in plans.values())
    step = "".join(f"{p.cost.step_s * 1e3:>{w}.{dec}f}" for p in plans.values())
    sent = "".join(f"{p.cost.comm_bytes / 1e6:>{w}.1f}" for p in plans.values())
    lines += [f"{'total':<10}{total}", f"{'Eq. 1 ms':<10}{step}"]
    if any(p.objective == "overlap" for p in plans.values()):
        ovl = "".join(f"{p.cost.overlapped_step_s * 1e3:>{w}.{dec}f}" for p in plans.values())
        lines.append(f"{'overlap ms':<10}{ovl}")
    return "\n".join([*lines, f"{'MB sent':<10}{sent}"])


def state_layouts(plan: Plan, argnum: int = 0) -> list[dict[str, Any]]:
    """The state argument's leaves (parameters, optimizer state) as the plan lays them out:
    path, shape, bytes, PartitionSpec and bytes per device."""
    rows = []
    prefix = f"[{argnum}]"
    sizes = plan.mesh_axes.sizes
    for path, tid, spec in zip(
        plan.program.invar_paths, plan.program.invars, plan.invar_specs, strict=True
    ):
        if not path.startswith(prefix):
            continue
        tensor = plan.program.tensors[tid]
        shards = math.prod(sizes[a] for axes in spec for a in axes)
        rows.append(
            {
                "path": path[len(prefix) :],
                "shape": tensor.shape,
                "bytes": tensor.nbytes,
                "spec": _spec_text(plan.partition_spec(spec)),
                "sharded": shards > 1,
                "bytes_per_device": tensor.nbytes / shards,
            }
        )
    return rows


def state_table(plans: dict[str, Plan], largest: int = 4) -> str:
    """Per strategy: the state's bytes per device and how many leaves are sharded; then the
    layouts of the largest state tensors side by side.

    Bytes per device count the step's state argument only (parameters and optimizer state),
    not activations or temporaries.
    """
    layouts = {name: state_layouts(p) for name, p in plans.items()}
    first = next(iter(plans.values()))
    memory = min(
        first.cluster.device_spec(i).memory_bytes for i in range(first.cluster.num_devices)
    )
    lines = [
        f"{'state per device':<18} {'bytes':>10} {'of device':>10} {'sharded leaves':>16}",
    ]
    for name, rows in layouts.items():
        per_device = sum(r["bytes_per_device"] for r in rows)
        sharded = sum(r["sharded"] for r in rows)
        lines.append(
            f"{name:<18} {_bytes_text(per_device):>10} {per_device / memory:>10.1%} "
            f"{f'{sharded} of {len(rows)}':>16}"
        )
    top = sorted(next(iter(layouts.values())), key=lambda r: -r["bytes"])[:largest]
    if top:
        w = max(len(r["path"]) for r in top)
        lines.append("")
        spec = {
            (r["path"], n): next(x["spec"] for x in layouts[n] if x["path"] == r["path"])
            for r in top
            for n in plans
        }
        cw = {n: max([len(n)] + [len(spec[(r["path"], n)]) for r in top]) for n in plans}
        head = "  ".join(f"{n:<{cw[n]}}" for n in plans)
        lines.append(f"{'largest state tensors':<{w}}  {head}")
        for r in top:
            cells = "  ".join(f"{spec[(r['path'], n)]:<{cw[n]}}" for n in plans)
            lines.append(f"{r['path']:<{w}}  {cells}")
    return "\n".join(lines)


def _spec_text(spec: Any) -> str:
    """``P('gpu', None)``: a PartitionSpec as people write it."""
    parts = ", ".join(repr(p) if p is not None else "None" for p in spec)
    return f"P({parts})"


def _bytes_text(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"
