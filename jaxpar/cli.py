"""Command line (also ``python -m jaxpar``).

``jaxpar demo``      train small models auto-sharded on 8 simulated devices
``jaxpar plan M``    plan a zoo model on any (abstract) mesh and cluster; report, JSON, figure
``jaxpar clusters``  the cluster presets with their numbers and sources
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any


def _setup_devices(n: int) -> None:
    """Simulate ``n`` CPU devices; must run before any JAX backend initializes."""
    import jax

    jax.config.update("jax_num_cpu_devices", n)


def demo(args: argparse.Namespace) -> int:
    """Train a small CNN and a small transformer with auto_shard on a 2x4 mesh."""
    _setup_devices(8)
    import jax
    import numpy as np

    import jaxpar
    import models
    from jaxpar.verify import fidelity

    devices = jax.devices()
    if len(devices) < 8:
        devices = jax.devices("cpu")
    print(f"jaxpar demo: {len(devices)} {devices[0].platform} devices; mesh data=2 x model=4\n")
    mesh = jaxpar.make_mesh({"data": 2, "model": 4}, devices=devices[:8])
    for name in args.models:
        ex = models.get(name, small=True)
        state, batch = ex.make_args(0)
        ref_state = state
        step = jaxpar.auto_shard(ex.step, mesh=mesh, cluster=args.cluster)
        reference = jax.jit(ex.step)
        t0 = time.perf_counter()
        print(f"== {name}: {args.steps} training steps, auto-sharded vs unsharded")
        for i in range(args.steps):
            state, metrics = step(state, batch)
            ref_state, ref_metrics = reference(ref_state, batch)
            a, b = float(metrics["loss"]), float(ref_metrics["loss"])
            print(f"   step {i}: loss {a:.6f}  unsharded {b:.6f}  |diff| {abs(a - b):.1e}")
        worst = max(
            float(np.linalg.norm(np.asarray(x, np.float64) - np.asarray(y, np.float64)))
            / max(float(np.linalg.norm(np.asarray(y, np.float64))), 1e-30)
            for x, y in zip(jax.tree.leaves(state), jax.tree.leaves(ref_state), strict=True)
        )
        print(f"   final state: max per-leaf relative difference {worst:.1e}")
        plan = step.plan
        fid = fidelity(plan.collectives, step.lower(state, batch).compile())
        planning = sum(plan.stats[k] for k in ("trace_s", "graph_s", "cost_s", "search_s"))
        print(
            f"   plan: {plan.stats['equations']} equations -> {plan.stats['nodes']} nodes, "
            f"planned in {planning:.2f} s; certified optimal: {plan.optimal}"
        )
        print(
            f"   compiled HLO moves {fid.hlo_bytes / 1e3:.1f} KB/device; predicted "
            f"{fid.predicted_bytes / 1e3:.1f} KB ({fid.relative_error:.1%} off); kinds "
            f"{sorted(fid.hlo_kinds)}; {time.perf_counter() - t0:.1f} s\n"
        )
        print(plan.report())
        print()
    return 0


STRATEGY_CHOICES = ("auto", "data", "model", "owt", "hypar", "all")


def parse_mesh(text: str) -> dict[str, int]:
    """``"node=4,gpu=4"`` -> ``{"node": 4, "gpu": 4}``, with errors that show the expected form."""
    mesh: dict[str, int] = {}
    for part in text.split(","):
        name, sep, size = part.partition("=")
        name = name.strip()
        if not sep or not name or not size.strip().isdigit() or int(size) < 1:
            raise ValueError(
                f"bad mesh axis {part!r} in --mesh {text!r}: expected NAME=SIZE pairs separated "
                f"by commas, e.g. --mesh node=4,gpu=4"
            )
        if name in mesh:
            raise ValueError(f"mesh axis {name!r} appears twice in --mesh {text!r}")
        mesh[name] = int(size)
    return mesh


class _Progress:
    """Stage lines on stderr with the elapsed time: planning big models takes seconds."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.t0 = time.perf_counter()

    def __call__(self, stage: str, detail: str) -> None:
        if not self.quiet:
            elapsed = time.perf_counter() - self.t0
            print(f"[{elapsed:6.1f}s] {stage:<7} {detail}", file=sys.stderr, flush=True)


def comparison_table(plans: dict[str, Any], batch: int) -> str:
    """Step time, throughput, communication and speedup over data parallel, per strategy."""
    data = plans.get("data")
    head = (
        f"{'strategy':<9} {'step ms':>11} {'samples/s':>12} {'comm MB/step':>13} "
        f"{'vs data':>8}  optimal"
    )
    lines = [head, "-" * len(head)]
    for name, plan in plans.items():
        c = plan.cost
        speed = data.cost.step_s / c.step_s if data is not None and c.step_s > 0 else math.nan
        lines.append(
            f"{name:<9} {c.step_s * 1e3:11.4f} {batch / c.step_s:12.1f} "
            f"{c.comm_bytes / 1e6:13.3f} {speed:7.2f}x  {plan.optimal}"
        )
    if "auto" in plans and len(plans) > 1:
        others = {k: p for k, p in plans.items() if k != "auto"}
        best = min(others, key=lambda k: others[k].cost.step_s)
        ratio = others[best].cost.step_s / plans["auto"].cost.step_s
        lines.append(f"auto vs best other ({best}): {ratio:.2f}x faster")
    return "\n".join(lines)


def layer_table(plans: dict[str, Any]) -> str:
    """Per layer, each strategy's configuration (OptCNN notation: degree per dimension)."""
    rows = {name: {r["layer"]: r["config"] for r in p.layer_rows()} for name, p in plans.items()}
    layers = list(next(iter(rows.values())))
    w = max([len(x) for x in layers] + [5])
    cw = {n: max([len(c) for c in r.values()] + [len(n)]) for n, r in rows.items()}
    head = f"{'layer':<{w}}  " + "  ".join(f"{n:<{cw[n]}}" for n in rows)
    lines = [head, "-" * len(head)]
    for lay in layers:
        cells = "  ".join(f"{rows[n].get(lay, '-'):<{cw[n]}}" for n in rows)
        lines.append(f"{lay:<{w}}  {cells}")
    return "\n".join(lines)


def plan_command(args: argparse.Namespace) -> int:
    """Plan a zoo model on an abstract mesh: no accelerator and no parameters allocated."""
    say = _Progress(args.quiet)
    mesh = parse_mesh(args.mesh)
    devices = math.prod(mesh.values())
    import jax.numpy as jnp

    import jaxpar
    import models
    from jaxpar.meshes import describe_mesh, resolve_cluster

    cluster = resolve_cluster(args.cluster, describe_mesh(mesh))

    known = models.registered_names()
    if args.model not in known:
        raise ValueError(f"unknown model {args.model!r}; choose one of: {', '.join(known)}")
    ex = models.get(args.model, batch=args.batch, small=args.small, dtype=jnp.dtype(args.dtype))
    batch = int(ex.args[1][next(iter(ex.args[1]))].shape[0])
    if batch % devices:
        raise ValueError(
            f"batch {batch} does not split over the mesh's {devices} devices, so data "
            f"parallelism (the baseline every comparison is against) cannot run; pass --batch "
            f"a multiple of {devices}"
        )
    say("model", f"{args.model} ({'small' if args.small else 'full size'}), batch {batch}")
    strategy = "auto" if args.strategy == "all" else args.strategy
    plan = jaxpar.plan(
        ex.step,
        *ex.args,
        mesh=mesh,
        cluster=cluster,
        strategy=strategy,
        objective=args.objective,
        search=args.search,
        progress=say,
    )
    names = ("auto", "data", "model", "owt") if args.strategy == "all" else (strategy,)
    plans = {n: plan.variant(n) for n in names}
    title = (
        f"{args.model}, batch {batch}, mesh {args.mesh} ({devices} devices), "
        f"cluster {cluster.name}, objective {args.objective}"
    )
    print(title)
    if args.strategy == "all":
        print()
        print(comparison_table(plans, batch))
        print()
        print(layer_table(plans))
    else:
        print(plan.report())
        print(f"throughput {batch / plan.cost.step_s:.1f} samples/s at batch {batch}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(plan_document(args.model, batch, mesh, cluster, plans), f, indent=1)
        say("json", args.json)
    if args.plot:
        from jaxpar.figures import plot_strategies

        plot_strategies(plans, args.plot, title=title)
        say("plot", args.plot)
    return 0


JSON_SCHEMA = "jaxpar.plan/1"


def plan_document(
    model: str, batch: int, mesh: dict[str, int], cluster: Any, plans: dict[str, Any]
) -> dict[str, Any]:
    """What ``--json`` writes (``schema: jaxpar.plan/1``): one entry per strategy."""
    data = plans.get("data")
    out: dict[str, Any] = {
        "schema": JSON_SCHEMA,
        "model": model,
        "batch": batch,
        "mesh": mesh,
        "devices": math.prod(mesh.values()),
        "cluster": cluster.name,
        "strategies": {},
    }
    for name, plan in plans.items():
        entry = plan.as_dict()
        c = plan.cost
        entry["throughput"] = batch / c.step_s if c.step_s > 0 else math.inf
        entry["speedup_vs_data"] = (
            data.cost.step_s / c.step_s if data is not None and c.step_s > 0 else None
        )
        out["strategies"][name] = entry
    return json.loads(json.dumps(out, default=str))


def clusters_command(args: argparse.Namespace) -> int:
    """Every preset with its numbers and their sources."""
    from jaxpar import Cluster

    for i, name in enumerate(Cluster.presets()):
        if i:
            print()
        print(Cluster.preset(name).describe())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="jaxpar", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_demo = sub.add_parser("demo", help="train small models auto-sharded on 8 simulated devices")
    p_demo.add_argument("--models", nargs="+", default=["cnn", "gpt_small"])
    p_demo.add_argument("--steps", type=int, default=3)
    p_demo.add_argument(
        "--cluster", default="dgx-h100", help="cost model target (default: dgx-h100)"
    )
    p_demo.set_defaults(func=demo)

    p_plan = sub.add_parser(
        "plan",
        help="plan a zoo model on an abstract mesh (any size, no accelerator needed)",
        description="Plan a model of the zoo (models.NAMES) on an abstract mesh for a cluster "
        "preset and print the predicted cost; parameters are never allocated.",
    )
    p_plan.add_argument("model", help="zoo model name, e.g. vgg16, inception_v3, gpt2_124m")
    p_plan.add_argument("--mesh", required=True, help="axes as NAME=SIZE,...: node=4,gpu=4")
    p_plan.add_argument("--cluster", default="p100", help="preset (jaxpar clusters); default p100")
    p_plan.add_argument("--batch", type=int, default=None, help="global batch (default: model's)")
    p_plan.add_argument("--strategy", choices=STRATEGY_CHOICES, default="auto")
    p_plan.add_argument("--objective", choices=("time", "comm"), default="time")
    p_plan.add_argument(
        "--search",
        choices=("elimination", "kcut"),
        default="elimination",
        help="joint elimination (OptCNN) or SoyBean's k-cut; the report shows both",
    )
    p_plan.add_argument("--dtype", default="float32", help="parameter/activation dtype")
    p_plan.add_argument("--small", action="store_true", help="the reduced (test) model")
    p_plan.add_argument("--json", metavar="FILE", help="write the plan(s) as JSON")
    p_plan.add_argument("--plot", metavar="FILE.png", help="draw per-layer configs and times")
    p_plan.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p_plan.set_defaults(func=plan_command)

    p_cl = sub.add_parser("clusters", help="list the cluster presets with numbers and sources")
    p_cl.set_defaults(func=clusters_command)

    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, KeyError) as err:
        # bad input: one clear line, not a traceback
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"jaxpar {args.command}: error: {message}", file=sys.stderr)
        return 2
