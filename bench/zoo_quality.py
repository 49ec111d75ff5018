"""Plan quality of the zoo: the auto plan's predicted step time per model, to compare revisions.

Plans every paper model (``models.NAMES``, full size, default batch) abstractly on a 2-node P100
mesh (node=2, gpu=4) and on 4x4, and writes the predicted step time, the data-parallel baseline's
and whether the plan is certified. Run it on two revisions and give both files to ``--compare``:

    python bench/zoo_quality.py --json /tmp/after.json
    (in a checkout of the older revision) python bench/zoo_quality.py --json /tmp/before.json
    python bench/zoo_quality.py --compare /tmp/before.json /tmp/after.json --md OUT.md
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

MESHES = [{"node": 2, "gpu": 4}, {"a": 4, "b": 4}]


def measure() -> list[dict]:
    import jaxpar
    import models

    rows = []
    for mesh in MESHES:
        for name in models.NAMES:
            ex = models.get(name)
            t0 = time.perf_counter()
            plan = jaxpar.plan(ex.step, *ex.args, mesh=mesh, cluster="p100", memory_budget=None)
            row = {
                "model": name,
                "mesh": ",".join(f"{k}={v}" for k, v in mesh.items()),
                "step_s": plan.cost.step_s,
                "data_step_s": plan.baselines["data"].step_s,
                "optimal": plan.optimal,
                "plan_s": time.perf_counter() - t0,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def compare(before: list[dict], after: list[dict]) -> str:
    old = {(r["model"], r["mesh"]): r for r in before}
    out = [
        "| model | mesh | before ms | after ms | after / before | plan s before | plan s after |",
        "|---|---|---|---|---|---|---|",
    ]
    worse = 0
    for r in after:
        b = old.get((r["model"], r["mesh"]))
        if b is None:
            continue
        ratio = r["step_s"] / b["step_s"]
        worse += ratio > 1 + 1e-9
        out.append(
            f"| {r['model']} | {r['mesh']} | {b['step_s'] * 1e3:.3f} | {r['step_s'] * 1e3:.3f} | "
            f"{ratio:.4f} | {b['plan_s']:.2f} | {r['plan_s']:.2f} |"
        )
    out += ["", f"{worse} of {len(after)} plans predicted slower after than before."]
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--compare", nargs=2, default=None)
    parser.add_argument("--md", default=None)
    args = parser.parse_args()
    if args.compare:
        loaded = []
        for path in args.compare:
            with open(path) as f:
                loaded.append(json.load(f))
        before, after = loaded
        text = compare(before, after)
        print(text)
        if args.md:
            with open(args.md, "w") as f:
                f.write(text)
        return
    rows = measure()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
