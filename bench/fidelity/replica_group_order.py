"""Combined all-reduces keyed by the order of their replica groups (issue 49's session 2,
`cost/evaluation.group_order`): predicted vs compiled all-reduce counts on 3-axis meshes of 8
simulated CPU devices, and the predicted step and combined all-reduces of llama3_8b on 3- and
4-axis meshes of 64 H100s, for this checkout and (``--before``) an older one.

    python bench/fidelity/replica_group_order.py --before /tmp/before \\
        --json bench/fidelity/results/replica_group_order.json \\
        --md bench/fidelity/results/replica_group_order.md

(``/tmp/before``: ``git worktree add /tmp/before 072bdc0``, main before the key.)
"""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
COMPILED = ["maxtext_small", "llama_small", "gpt_small", "gpt_scan_linen"]
PLANNED = [
    ("scan", "node=4,nvl=2,gpu=8"),
    ("scan", "pod=2,node=4,nvl=2,gpu=4"),
    ("unrolled", "node=8,gpu=8"),
]


def compiled_case(name: str) -> dict:
    """Predicted and compiled all-reduces after combining: the auto plan on {a: 2, b: 2, c: 2}
    priced for H100s (the MaxText-style decoder: its own 3 axes under MaxText's default rules,
    as tests/test_maxtext.py)."""
    import jaxpar_zoo as zoo

    import jaxpar
    from jaxpar.verify.compiled import fidelity

    if name == "maxtext_small":
        sys.path.insert(0, os.path.join(HERE, "tests"))
        import test_maxtext as mt_tests

        ex = mt_tests.mt.maxtext_example("maxtext_small", mt_tests.CFG)
        step = jaxpar.auto_shard(
            ex.step, mesh=jaxpar.make_mesh(mt_tests.MESH), cluster="dgx-h100",
            in_specs=mt_tests.fsdp_in_specs(ex),
            options=jaxpar.PlannerOptions(user_constraints="pin"),
        )  # fmt: skip
    else:
        ex = zoo.get(name)
        mesh = jaxpar.make_mesh({"a": 2, "b": 2, "c": 2})
        step = jaxpar.auto_shard(ex.step, mesh=mesh, cluster="dgx-h100")
    compiled = step.lower(*ex.args).compile()
    fid = fidelity(step.plan.collectives, compiled)
    return {
        "predicted": fid.predicted_counts.get("all-reduce", 0),
        "compiled": fid.hlo_counts.get("all-reduce", 0),
    }


def planned_case(layers: str, mesh_text: str) -> dict:
    """llama3_8b (bf16, per-block remat) planned on 64 H100s: predicted overlapped step and
    all-reduces after combining."""
    from jaxpar_zoo.llama import llama_config, llama_example

    import jaxpar

    mesh = {k: int(v) for k, v in (kv.split("=") for kv in mesh_text.split(","))}
    cfg = llama_config("llama3_8b", remat=True, scan_layers=layers == "scan")
    ex = llama_example("llama3_8b", cfg)
    plan = jaxpar.plan(ex.step, *ex.args, mesh=mesh, cluster="dgx-h100")
    return {"step_ms": plan.evaluation.objective * 1e3, "combined": plan.cost.combined_all_reduces}


def one(root: str, kind: str, args: list[str]) -> None:
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    sys.path.insert(0, root)
    import jaxpar

    if not jaxpar.__file__.startswith(os.path.abspath(root)):
        raise SystemExit(f"imported {jaxpar.__file__}, not the revision in {root}")
    row = compiled_case(*args) if kind == "compiled" else planned_case(*args)
    print(json.dumps(row))


def run(root: str, kind: str, *args: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--one", root, kind, *args],
        capture_output=True, text=True, check=True, cwd=HERE,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def markdown(rows: list[dict], command: str) -> str:
    lines = [
        "# All-reduces combined by the order of their replica groups",
        "",
        f"`{command}`",
        "",
        "Predicted vs compiled all-reduces after combining (8 simulated CPU devices, 3 axes):",
        "",
        "| model | revision | predicted | compiled | equal |",
        "|---|---|---:|---:|---|",
    ]
    for r in rows:
        if r["kind"] == "compiled":
            eq = "yes" if r["predicted"] == r["compiled"] else "no"
            lines.append(
                f"| {r['case']} | {r['revision']} | {r['predicted']} | {r['compiled']} | {eq} |"
            )
    lines += [
        "",
        "llama3_8b on 64 H100s, predicted (not compiled here):",
        "",
        "| layers | mesh | revision | overlapped step ms | combined all-reduces |",
        "|---|---|---|---:|---:|",
    ]
    for r in rows:
        if r["kind"] == "planned":
            lines.append(
                f"| {r['case']} | {r['mesh']} | {r['revision']} | {r['step_ms']:.4f} | "
                f"{r['combined']} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", nargs="+", metavar="ARG")
    parser.add_argument("--before", default=None, help="an older checkout to compare with")
    parser.add_argument("--json")
    parser.add_argument("--md")
    args = parser.parse_args()
    if args.one:
        one(args.one[0], args.one[1], args.one[2:])
        return
    roots = ([("before", args.before)] if args.before else []) + [("this", HERE)]
    rows = []
    for name in COMPILED:
        for label, root in roots:
            rows.append({"kind": "compiled", "case": name, "revision": label,
                         **run(root, "compiled", name)})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    for layers, mesh in PLANNED:
        for label, root in roots:
            rows.append({"kind": "planned", "case": layers, "mesh": mesh, "revision": label,
                         **run(root, "planned", layers, mesh)})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    command = "python bench/fidelity/replica_group_order.py " + " ".join(sys.argv[1:])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": command, "rows": rows}, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(rows, command))


if __name__ == "__main__":
    main()
