"""Command line: ``jaxpar demo`` (also ``python -m jaxpar demo``)."""

from __future__ import annotations

import argparse
import sys
import time


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jaxpar", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_demo = sub.add_parser("demo", help="train small models auto-sharded on 8 simulated devices")
    p_demo.add_argument("--models", nargs="+", default=["cnn", "gpt_small"])
    p_demo.add_argument("--steps", type=int, default=3)
    p_demo.add_argument(
        "--cluster", default="dgx-h100", help="cost model target (default: dgx-h100)"
    )
    p_demo.set_defaults(func=demo)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
