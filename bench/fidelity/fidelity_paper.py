"""Fidelity of the OptCNN-benchmark plans: predicted vs compiled-HLO communication.

For the plans of ``bench/papers/strategies.py`` (AlexNet, VGG-16, Inception-v3 on the p100 cluster,
2 / 4 GPUs in one node, 8 = 2 x 4, 16 = 4 x 4; 32 samples per GPU; data / model / OWT / auto)
each step is planned by `jaxpar.auto_shard` on a mesh of simulated CPU devices with the same axis
names and cluster, lowered with the abstract (ShapeDtypeStruct) arguments and compiled (nothing
is allocated or run), and the bytes each device sends per step (ring accounting) are compared:
the plan's prediction (``plan.collectives``) against the collectives XLA emitted
(`jaxpar.verify.fidelity`), also per collective kind. 1 GPU is skipped (no communication).

    python bench/fidelity/fidelity_paper.py --json bench/fidelity/results/fidelity_paper.json \
        --md bench/fidelity/results/fidelity_paper.md
"""

import argparse
import json
import os
import sys
import time
from collections import defaultdict

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=16"
).strip()
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import jax
import jaxpar_zoo as zoo

import jaxpar
from jaxpar.verify.compiled import compiled_collectives, fidelity

# The objective the committed results were planned with: OptCNN Eq. 1 ("time", the planner's
# default until 2026-11-24; the default is now "overlap").
OBJECTIVE = "time"

MODELS = ("alexnet", "vgg16", "inception_v3")
TITLES = {"alexnet": "AlexNet", "vgg16": "VGG-16", "inception_v3": "Inception-v3"}
GPUS = (2, 4, 8, 16)
MESHES = {2: {"gpu": 2}, 4: {"gpu": 4}, 8: {"node": 2, "gpu": 4}, 16: {"node": 4, "gpu": 4}}
STRATS = ("auto", "data", "model", "owt")
PER_GPU_BATCH = 32
TARGET = 0.05
COMMAND = (
    "python bench/fidelity/fidelity_paper.py --json bench/fidelity/results/fidelity_paper.json "
    "--md bench/fidelity/results/fidelity_paper.md"
)


def log(msg: str) -> None:
    print(msg, flush=True)


def by_kind(pred, hlo) -> dict:
    """Per collective kind: count and bytes per device, predicted and in the HLO."""
    out: dict = defaultdict(lambda: {"pred_n": 0, "pred_bytes": 0.0, "hlo_n": 0, "hlo_bytes": 0.0})
    for c in pred:
        out[c.kind]["pred_n"] += 1
        out[c.kind]["pred_bytes"] += c.bytes
    for h in hlo:
        out[h.kind]["hlo_n"] += 1
        out[h.kind]["hlo_bytes"] += h.bytes_per_device
    return dict(out)


def by_kind_group(pred, hlo) -> dict:
    """Per (kind, group size): bytes per device, predicted and in the HLO."""
    out: dict = defaultdict(lambda: {"pred_bytes": 0.0, "hlo_bytes": 0.0})
    for c in pred:
        out[f"{c.kind} n={c.group_size}"]["pred_bytes"] += c.bytes
    for h in hlo:
        out[f"{h.kind} n={h.group_size}"]["hlo_bytes"] += h.bytes_per_device
    return dict(out)


def run_case(name: str, n: int, strategy: str, batch: int) -> dict:
    ex = zoo.get(name, batch=batch)
    mesh = jaxpar.make_mesh(MESHES[n], devices=jax.devices()[:n])
    step = jaxpar.auto_shard(
        ex.step,
        mesh=mesh,
        cluster=jaxpar.Cluster.preset("p100", devices=n),
        strategy=strategy,
        objective=OBJECTIVE,
    )
    t0 = time.perf_counter()
    lowered = step.lower(*ex.args)  # plans, then lowers with the abstract arguments
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    plan = step.plan
    fid = fidelity(plan.collectives, compiled)
    hlo = compiled_collectives(compiled)
    planning = sum(plan.stats.get(k, 0.0) for k in ("trace_s", "graph_s", "cost_s", "search_s"))
    return {
        "model": name,
        "gpus": n,
        "mesh": MESHES[n],
        "strategy": strategy,
        "batch": batch,
        "predicted_step_s": plan.cost.step_s,
        "predicted_bytes": fid.predicted_bytes,
        "hlo_bytes": fid.hlo_bytes,
        "relative_error": fid.relative_error,
        "signed_error": (fid.predicted_bytes - fid.hlo_bytes) / fid.hlo_bytes
        if fid.hlo_bytes
        else 0.0,
        "predicted_kinds": sorted(fid.predicted_kinds),
        "hlo_kinds": sorted(fid.hlo_kinds),
        "unexpected_kinds": sorted(fid.unexpected_kinds),
        "predicted_collectives": len(plan.collectives),
        "hlo_collectives": len(hlo),
        "by_kind": by_kind(plan.collectives, hlo),
        "by_kind_group": by_kind_group(plan.collectives, hlo),
        "plan_s": planning,
        "lower_s": t1 - t0 - planning,
        "compile_s": t2 - t1,
        "optimal": plan.optimal,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--md", default=None)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--gpus", nargs="+", type=int, default=list(GPUS))
    parser.add_argument(
        "--budget-s", type=float, default=1500.0, help="skip cases once this much time is spent"
    )
    parser.add_argument("--from-json", default=None, help="rewrite the .md from an earlier --json")
    args = parser.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            old = json.load(f)
        with open(args.md, "w") as f:
            f.write(markdown(old["rows"], old["skipped"], old["wall_s"]))
        return
    rows, skipped = [], []
    t_all = time.perf_counter()
    log(
        f"{'model':<13} {'GPUs':>4} {'strategy':<8} {'pred MB':>9} {'HLO MB':>9} {'error':>8} "
        f"{'plan s':>7} {'compile s':>9}"
    )
    # smallest first, so a time budget drops the largest cases
    for name in args.models:
        for n in args.gpus:
            for strategy in STRATS:
                if time.perf_counter() - t_all > args.budget_s:
                    skipped.append({"model": name, "gpus": n, "strategy": strategy})
                    continue
                row = run_case(name, n, strategy, PER_GPU_BATCH * n)
                rows.append(row)
                log(
                    f"{name:<13} {n:>4} {strategy:<8} {row['predicted_bytes'] / 1e6:9.2f} "
                    f"{row['hlo_bytes'] / 1e6:9.2f} {row['signed_error']:+8.2%} "
                    f"{row['plan_s']:7.1f} {row['compile_s']:9.1f}"
                    + (f"  unexpected {row['unexpected_kinds']}" if row["unexpected_kinds"] else "")
                )
                if args.json:
                    write_json(args.json, rows, skipped, time.perf_counter() - t_all)
    wall = time.perf_counter() - t_all
    for strategy in STRATS:
        sel = [r for r in rows if r["strategy"] == strategy]
        if sel:
            w = max(sel, key=lambda r: r["relative_error"])
            log(
                f"worst {strategy}: {w['relative_error']:.2%} ({w['model']}, {w['gpus']} GPUs); "
                f"{sum(r['relative_error'] > TARGET for r in sel)}/{len(sel)} above {TARGET:.0%}"
            )
    log(f"total {wall:.0f} s; skipped {len(skipped)} cases")
    if args.json:
        write_json(args.json, rows, skipped, wall)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(rows, skipped, wall))
        log(f"wrote {args.md}")


def write_json(path: str, rows: list, skipped: list, wall: float) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump({"rows": rows, "skipped": skipped, "wall_s": wall}, f, indent=1)


# ---------------------------------------------------------------------------- report


def markdown(rows: list, skipped: list, wall: float) -> str:
    lines = [
        "# Fidelity of the OptCNN-benchmark plans: predicted vs compiled communication",
        "",
        "```bash",
        COMMAND,
        "```",
        "",
        "The plans of `strategies.md` (p100 cluster, 32 samples per GPU, full-size models), "
        "planned by `jaxpar.auto_shard` on meshes of simulated CPU devices with the same axis "
        "names, lowered with `ShapeDtypeStruct` arguments and compiled (nothing allocated or "
        "run). Bytes sent per device per step, ring accounting: the plan's prediction vs the "
        "collectives in the compiled HLO (`jaxpar.verify.fidelity`). Error = (predicted − "
        f"HLO) / HLO; target ≤ {TARGET:.0%}. Whole run {wall:.0f} s on this 2-core machine"
        + (f"; skipped for time: {len(skipped)} cases" if skipped else "; nothing skipped")
        + ".",
        "",
        "| model | GPUs | strategy | predicted MB | HLO MB | error | kinds (HLO) "
        "| collectives pred / HLO | plan s | compile s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        flag = " **!**" if r["relative_error"] > TARGET else ""
        lines.append(
            f"| {TITLES[r['model']]} | {r['gpus']} | {r['strategy']} "
            f"| {r['predicted_bytes'] / 1e6:.2f} | {r['hlo_bytes'] / 1e6:.2f} "
            f"| {r['signed_error']:+.2%}{flag} | {', '.join(r['hlo_kinds'])} "
            f"| {r['predicted_collectives']} / {r['hlo_collectives']} "
            f"| {r['plan_s']:.1f} | {r['compile_s']:.1f} |"
        )
    lines += [
        "",
        "## Worst error per strategy",
        "",
        f"| strategy | plans | worst error | where | plans above {TARGET:.0%} | unexpected kinds |",
        "|---|---|---|---|---|---|",
    ]
    for s in STRATS:
        sel = [r for r in rows if r["strategy"] == s]
        if not sel:
            continue
        w = max(sel, key=lambda r: r["relative_error"])
        over = [f"{TITLES[r['model']]} {r['gpus']}" for r in sel if r["relative_error"] > TARGET]
        unexpected = sum(bool(r["unexpected_kinds"]) for r in sel)
        lines.append(
            f"| {s} | {len(sel)} | {w['signed_error']:+.2%} | {TITLES[w['model']]}, "
            f"{w['gpus']} GPUs | {len(over)}{': ' + ', '.join(over) if over else ''} "
            f"| {unexpected} |"
        )
    bad = [r for r in rows if r["relative_error"] > TARGET]
    lines += ["", "## Cases above the target, per collective kind", ""]
    if not bad:
        lines.append("None.")
    for r in bad:
        lines += [
            f"**{TITLES[r['model']]}, {r['gpus']} GPUs, {r['strategy']}** "
            f"({r['signed_error']:+.2%}):",
            "",
            "| kind (group size) | predicted MB | HLO MB |",
            "|---|---|---|",
        ]
        for k, v in sorted(r["by_kind_group"].items()):
            lines.append(f"| {k} | {v['pred_bytes'] / 1e6:.2f} | {v['hlo_bytes'] / 1e6:.2f} |")
        lines.append("")
    lines += ["", *explanation(rows)]
    return "\n".join(lines) + "\n"


def same_plans_as_strategies(rows: list) -> str:
    """Whether each plan here is the plan of strategies.json (same predicted step time)."""
    path = os.path.join(os.path.dirname(__file__), "..", "papers", "results", "strategies.json")
    if not os.path.exists(path):
        return "strategies.json not found: plans not cross-checked"
    with open(path) as f:
        strat = json.load(f)
    same = 0
    for r in rows:
        case = strat["models"].get(r["model"], {}).get("cases", {}).get(str(r["gpus"]))
        if case is None:
            continue
        ref = case["strategies"][r["strategy"]]["step_s"]
        same += abs(ref - r["predicted_step_s"]) <= 1e-9 * ref
    return (
        f"{same} of {len(rows)} plans have exactly the predicted step time of the same case in "
        "`strategies.json` (the abstract-mesh plans of `strategies.py`)"
    )


def explanation(rows: list) -> list[str]:
    if not rows:
        return []
    worst = {
        s: max((r for r in rows if r["strategy"] == s), key=lambda r: r["relative_error"])
        for s in STRATS
        if any(r["strategy"] == s for r in rows)
    }
    over = [r for r in rows if r["relative_error"] > TARGET]
    unexpected = [r for r in rows if r["unexpected_kinds"]]

    def ar(r, key):
        return r["by_kind"].get("all-reduce", {}).get(key, 0)

    def pick(model, n, s):
        return next(
            (r for r in rows if r["model"] == model and r["gpus"] == n and r["strategy"] == s),
            None,
        )

    combine = [
        (m, n, pick(m, n, "data"))
        for m, n in (("alexnet", 16), ("vgg16", 16), ("inception_v3", 16))
        if pick(m, n, "data")
    ]
    compile_by_model = {
        m: (
            min(r["compile_s"] for r in rows if r["model"] == m),
            max(r["compile_s"] for r in rows if r["model"] == m),
        )
        for m in dict.fromkeys(r["model"] for r in rows)
    }
    out = [
        "## Findings",
        "",
        (
            f"**All {len(rows)} plans are within the target**"
            if not over
            else f"**{len(over)} of {len(rows)} plans exceed the target**"
        )
        + " (worst: "
        + "; ".join(
            f"{s} {w['signed_error']:+.2%} ({TITLES[w['model']]}, {w['gpus']} GPUs)"
            for s, w in worst.items()
        )
        + f"), and {len(unexpected)} compiled programs contain a collective kind the plan did "
        "not predict. Auto and data parallelism are exact to the byte or within 0.001 %. "
        + same_plans_as_strategies(rows)
        + ".",
        "",
        "**Where the small over-predictions come from.** Only the model and OWT baselines "
        "miss by more than a few kilobytes, always by less than 0.4 %, and always on the "
        "tensors of the loss: XLA emits fewer reshards of the [batch, 1000] logits (and their "
        "gradient) than the chain of sharding constraints for the 1000-class layer implies. "
        "In every (kind, group size) that differs in any of the plans, the predicted excess is "
        "(n−1)/n of a float32 [rows, 1000] buffer, or of a [batch]-sized vector of the loss "
        "(a few hundred bytes, also in data / auto); the same excess recurs for all three "
        "models, whose heads are identical. AlexNet at 4 GPUs, model "
        "parallel: the HLO has one all-gather of 3/4 × float32[128, 1000] (384 KB, plus a "
        "[128] vector) and one all-to-all of 3/4 × a quarter of it (96 KB) less than "
        "predicted, nothing else differs; Inception-v3 at 8 GPUs, OWT: 385 KB of all-gather "
        "over 4 devices "
        "(a [128, 1000] half-batch of logits plus a [256] vector) and 256 KB of all-to-all "
        "over 2. The per-kind, per-group-size split of every case is in the JSON "
        "(`by_kind_group`).",
        "",
        "**XLA combines collectives; the cost model charges each one its latency.** Bytes "
        "agree, counts do not: "
        + "; ".join(
            f"data-parallel {TITLES[m]} at {n} GPUs has {ar(r, 'pred_n')} predicted "
            f"all-reduces and {ar(r, 'hlo_n')} in the HLO"
            for m, n, r in combine
        )
        + ". XLA's all-reduce combiner merges independent gradient all-reduces (the BN "
        "statistics of successive layers depend on each other and stay separate). Eq. 1 as "
        "jaxpar evaluates it charges α (latency × ring steps) per predicted collective, so "
        "for Inception-v3 the latency part of t_S is over-estimated several times (see "
        "`strategies.md`, point 4). This is a time error, invisible to a bytes check.",
        "",
        "**Cost.** Lowering takes the abstract `ShapeDtypeStruct` arguments "
        "(`AutoSharded.lower` re-wraps them with the planned shardings), so nothing is "
        "allocated: full-size models at the benchmark's batch (32 per GPU, up to 512) "
        "compile on 16 simulated CPU devices in "
        + ", ".join(
            f"{lo:.0f}-{hi:.0f} s ({TITLES[m]})" for m, (lo, hi) in compile_by_model.items()
        )
        + " per case on this shared 2-core machine; no case had to be dropped or reduced. "
        "The HLO is the CPU backend's; the GPU backend partitions the same sharding "
        "constraints, so bytes should carry over, while combiner thresholds and async "
        "scheduling (time, not bytes) differ.",
    ]
    return out


if __name__ == "__main__":
    main()
