"""Plan quality of the zoo: the auto plan's predicted step time per model, to compare revisions.

Plans every paper model (``zoo.NAMES``, full size, default batch) abstractly on a 2-node P100
mesh (node=2, gpu=4) and on 4x4, and writes the predicted step time, the data-parallel baseline's
and whether the plan is certified. Run it on two revisions and give both files to ``--compare``:

    python bench/plan_quality/zoo_quality.py --json /tmp/after.json
    (in a checkout of the older revision)
    python bench/plan_quality/zoo_quality.py --json /tmp/before.json
    python bench/plan_quality/zoo_quality.py --compare /tmp/before.json /tmp/after.json --md OUT.md

``--objective`` plans with that objective instead of the planner's default. Rows carry both the
Eq. 1 step and the overlapped step (and data parallelism's); ``--compare`` compares the step
the after file's plans were chosen by (``--key`` to choose: step_s or overlapped_step_s).
Files written before rows carried the overlapped step compare by the Eq. 1 step.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

MESHES = [{"node": 2, "gpu": 4}, {"a": 4, "b": 4}]


def measure(objective: str | None) -> list[dict]:
    import jaxpar_zoo as zoo

    import jaxpar

    given = {} if objective is None else {"objective": objective}
    rows = []
    for mesh in MESHES:
        for name in zoo.NAMES:
            ex = zoo.get(name)
            t0 = time.perf_counter()
            plan = jaxpar.plan(
                ex.step, *ex.args, mesh=mesh, cluster="p100", memory_budget=None, **given
            )
            data = plan.baselines["data"]
            row = {
                "model": name,
                "mesh": ",".join(f"{k}={v}" for k, v in mesh.items()),
                "objective": plan.objective,
                "step_s": plan.cost.step_s,
                "overlapped_step_s": plan.cost.overlapped_step_s,
                "data_step_s": data.step_s,
                "data_overlapped_step_s": data.overlapped_step_s,
                "optimal": plan.optimal,
                "plan_s": time.perf_counter() - t0,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def compare(before: list[dict], after: list[dict], key: str | None = None) -> str:
    """A markdown table of ``key`` (default: the step the after file's plans were chosen by)
    before and after, with data parallelism's and the planning times."""
    if key is None:
        chosen_by_overlap = after and after[0].get("objective") == "overlap"
        key = "overlapped_step_s" if chosen_by_overlap else "step_s"
    if any(key not in r for r in [*before, *after]):
        key = "step_s"
    data_key = "data_" + key
    old = {(r["model"], r["mesh"]): r for r in before}
    what = "overlapped step" if key == "overlapped_step_s" else "Eq. 1 step"
    out = [
        f"Predicted {what} (ms) of the auto plan, before and after; data parallel's after.",
        "",
        "| model | mesh | before ms | after ms | after / before | data ms | "
        "plan s before | plan s after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    worse = slower_than_data = 0
    for r in after:
        b = old.get((r["model"], r["mesh"]))
        if b is None:
            continue
        ratio = r[key] / b[key]
        worse += ratio > 1 + 1e-9
        slower_than_data += r[key] > r[data_key] * (1 + 1e-9)
        out.append(
            f"| {r['model']} | {r['mesh']} | {b[key] * 1e3:.3f} | {r[key] * 1e3:.3f} | "
            f"{ratio:.4f} | {r[data_key] * 1e3:.3f} | {b['plan_s']:.2f} | {r['plan_s']:.2f} |"
        )
    out += [
        "",
        f"{worse} of {len(after)} plans predicted slower after than before; "
        f"{slower_than_data} slower than data parallel after.",
    ]
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--compare", nargs=2, default=None)
    parser.add_argument("--md", default=None)
    parser.add_argument("--objective", default=None, help="time, overlap or comm")
    parser.add_argument("--key", default=None, choices=("step_s", "overlapped_step_s"))
    args = parser.parse_args()
    if args.compare:
        loaded = []
        for path in args.compare:
            with open(path) as f:
                loaded.append(json.load(f))
        before, after = loaded
        text = compare(before, after, args.key)
        print(text)
        if args.md:
            with open(args.md, "w") as f:
                f.write(text)
        return
    rows = measure(args.objective)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
