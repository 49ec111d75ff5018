"""Scanned against unrolled with the layouts swapped: is the gap the search or the program?

The zoo's GPT-2-wide decoder (d 768, 8 x 1024 tokens, AdamW) scanned (``gpt_scan_linen``) and
unrolled (``gpt_unrolled_linen``, the same shapes and math) on 64 H100s (node=8, gpu=8),
abstract. For each depth and objective, four plans:

* each version's own plan (searched);
* the unrolled step with every argument pinned to the scanned plan's layout (a stacked
  parameter's spec without its layer entry, for every layer:
  ``jaxpar_zoo.scanned.unstacked_specs``), the rest searched;
* the scanned step pinned to the unrolled plan's argument layouts (only where every layer got
  the same layout, as the tied search gives: ``jaxpar_zoo.scanned.stacked_specs``), the rest
  searched.

If a version's own plan is no worse than the other's layouts on its program, its search did not
miss them, and what is left between the two columns is how the two programs price the same
layouts (collectives per stacked parameter once, or once per layer).

    python bench/scale/scanned_layouts.py --json bench/scale/results/scanned_layouts.json \\
        --md bench/scale/results/scanned_layouts.md
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import jax
from jaxpar_zoo.scanned import scanned_config, scanned_example, stacked_specs, unstacked_specs

import jaxpar

DEPTHS = (4, 12)
OBJECTIVES = ("time", "overlap")
MESH = {"node": 8, "gpu": 8}


def row(plan) -> dict:
    c = plan.cost
    return {
        "eq1_ms": c.step_s * 1e3,
        "combined_ms": c.combined_step_s * 1e3,
        "overlapped_ms": c.overlapped_step_s * 1e3,
        "chosen_ms": c.step_for(plan.objective) * 1e3,
        "compute_ms": c.compute_s * 1e3,
        "reshard_ms": c.reshard_s * 1e3,
        "sync_ms": c.sync_s * 1e3,
        "collective_runs": sum(x.count for x in plan.collectives),
    }


def case(layers: int, objective: str) -> dict:
    exs = scanned_example("gpt_scan_linen", scanned_config("gpt_scan_linen", layers=layers))
    exu = scanned_example("gpt_unrolled_linen", scanned_config("gpt_unrolled_linen", layers=layers))
    kw = {"mesh": MESH, "cluster": "dgx-h100", "objective": objective}
    scanned = jaxpar.plan(exs.step, *exs.args, **kw)
    unrolled = jaxpar.plan(exu.step, *exu.args, **kw)
    out = {"layers": layers, "objective": objective}
    out["scanned"] = row(scanned)
    out["unrolled"] = row(unrolled)
    pins = unstacked_specs(scanned.partition_specs(), exu.args)
    pinned = jaxpar.plan(exu.step, *exu.args, **kw, in_specs=pins)
    out["unrolled_with_scanned_layouts"] = row(pinned)
    pins = stacked_specs(unrolled.partition_specs(), exs.args)
    out["scanned_with_unrolled_layouts"] = (
        None if pins is None else row(jaxpar.plan(exs.step, *exs.args, **kw, in_specs=pins))
    )
    print(out, flush=True)
    return out


def markdown(res: dict) -> str:
    out = [
        "# Scanned against unrolled, layouts swapped",
        "",
        f"`{res['command']}` — jax {res['jax']}",
        "",
        "GPT-2-wide decoder, 64 H100s (node=8, gpu=8), predicted (dgx-h100). Each row: one "
        "program under one set of argument layouts, the rest searched with the objective named. "
        "Eq. 1: t_C + t_X + t_S with latency per collective; combined: latency once per "
        "combined all-reduce; overlapped: the step timeline. Runs: collectives per step.",
        "",
        "| layers | objective | program | argument layouts | Eq. 1 ms | combined ms "
        "| overlapped ms | compute ms | reshard ms | sync ms | runs |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = (
        ("scanned", "scanned", "its own plan"),
        ("unrolled", "unrolled", "its own plan"),
        ("unrolled_with_scanned_layouts", "unrolled", "the scanned plan's"),
        ("scanned_with_unrolled_layouts", "scanned", "the unrolled plan's"),
    )
    for r in res["cases"]:
        for key, program, layouts in rows:
            x = r[key]
            if x is None:
                out.append(
                    f"| {r['layers']} | {r['objective']} | {program} | {layouts} | "
                    "(layers differ) | | | | | | |"
                )
                continue
            out.append(
                f"| {r['layers']} | {r['objective']} | {program} | {layouts} | "
                f"{x['eq1_ms']:.3f} | {x['combined_ms']:.3f} | {x['overlapped_ms']:.3f} | "
                f"{x['compute_ms']:.3f} | {x['reshard_ms']:.3f} | {x['sync_ms']:.3f} | "
                f"{x['collective_runs']} |"
            )
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--md", default=None)
    args = parser.parse_args()
    res: dict = {"command": "python bench/scale/scanned_layouts.py " + " ".join(sys.argv[1:])}
    res["jax"] = jax.__version__
    res["cases"] = [case(n, o) for n in DEPTHS for o in OBJECTIVES]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(res))


if __name__ == "__main__":
    main()
