"""OptCNN Figures 7-8 under three step models: Eq. 1, combined all-reduces, overlapped streams.

Reads the JSON of `bench/papers/strategies.py` (every plan's `PlanCost` fields are in it) and
tabulates, per model, auto against the best other strategy at 16 GPUs (and the maximum over GPU
counts) and the scaling from 1 to 16 GPUs, with each of `step_s` (OptCNN Eq. 1),
`combined_step_s` (latency once per combined all-reduce) and `overlapped_step_s` (communication
on its own stream). The plans are the same in these three rows: the search minimizes Eq. 1. With
``--chosen`` (a run of `bench/papers/strategies.py --objective overlap`) a fourth row gives the
overlapped step of the plans chosen for it (`objective="overlap"`).

    python bench/papers/strategies.py --json bench/papers/results/strategies_overlap.json \\
        --md bench/papers/results/strategies_overlap_full.md
    python bench/papers/strategies.py --objective overlap --no-sensitivity \\
        --json bench/papers/results/strategies_overlap_objective.json \\
        --md bench/papers/results/strategies_overlap_objective_full.md
    python bench/papers/strategies_overlap.py bench/papers/results/strategies_overlap.json \\
        --chosen bench/papers/results/strategies_overlap_objective.json \\
        --md bench/papers/results/strategies_overlap.md
"""

import argparse
import json

STEPS = {"step_s": "Eq. 1", "combined_step_s": "combined", "overlapped_step_s": "overlapped"}
PAPER = {  # OptCNN §6: auto vs best other (max), scaling 1 -> 16 GPUs auto / best other
    "alexnet": ("up to 2.2x", "12.2x / 6.1x"),
    "vgg16": ("1.5x", "14.8x / 10.2x"),
    "inception_v3": ("1.4x", "15.5x / 11.2x"),
}
OTHERS = ("data", "model", "owt")


def summarize(cases: dict, key: str) -> tuple[float, str, float, float, float]:
    """(auto vs best other at 16, that strategy, max over GPU counts, scaling auto, best)."""
    ratios = []
    for case in cases.values():
        st = case["strategies"]
        best = min(OTHERS, key=lambda s: st[s][key])
        ratios.append(st[best][key] / st["auto"][key])
    one, top = cases["1"]["strategies"], cases["16"]["strategies"]
    best16 = min(OTHERS, key=lambda s: top[s][key])

    def scaling(s: str) -> float:  # throughput at 16 GPUs over throughput at 1 (16x the batch)
        return 16 * one[s][key] / top[s][key]

    at16 = top[best16][key] / top["auto"][key]
    return at16, best16, max(ratios), scaling("auto"), scaling(best16)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("json_path")
    parser.add_argument("--md", default=None)
    parser.add_argument("--chosen", default=None, help="JSON of a --objective overlap run")
    args = parser.parse_args()
    with open(args.json_path) as f:
        data = json.load(f)
    chosen = {"models": {}}
    if args.chosen:
        with open(args.chosen) as f:
            chosen = json.load(f)
    lines = [
        "# OptCNN Figures 7-8 under Eq. 1, combined and overlapped step models",
        "",
        f"From `{args.json_path}` (bench/papers/strategies.py). Auto vs the best other strategy "
        "at 16",
        "GPUs (max over 1-16 GPUs), and throughput scaling 1 -> 16 GPUs, auto / best other.",
        "",
        "| model | step model | auto vs best other at 16 (max) | scaling auto / best other "
        "| paper |",
        "|---|---|---|---|---|",
    ]
    for model, entry in data["models"].items():
        rows = [(entry, key, label) for key, label in STEPS.items()]
        if model in chosen["models"]:
            rows.append((chosen["models"][model], "overlapped_step_s", "overlapped, chosen for it"))
        for cases, key, label in rows:
            at16, best, peak, sa, sb = summarize(cases["cases"], key)
            paper = f"{PAPER[model][0]}; {PAPER[model][1]}" if model in PAPER else ""
            lines.append(
                f"| {model} | {label} | {at16:.2f}x vs {best} ({peak:.2f}x) | "
                f"{sa:.2f}x / {sb:.2f}x | {paper} |"
            )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
