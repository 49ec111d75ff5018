"""Scanned layers with XLA:GPU's collective pipeliner (`PlannerOptions.pipelined_loops`).

Each scanned model planned twice on 64 H100s (node=8, gpu=8), without and with the option;
per strategy, the overlapped step (what the plans are chosen by) and the predicted peak. The
unrolled twin, where there is one, beside it (the layers the pipeliner makes a loop behave
like). Everything is abstract (nothing allocated); step times predicted (dgx-h100).

(a) a tanh MLP scanned over stacked weights [4, 512, 512], 64 rows, on 8 H100s (the model of
    tests/test_pipelined_loops.py);
(b) the zoo's GPT-2-wide decoder (d 768, 8 x 1024 tokens, AdamW) at 4, 12 and 64 layers;
(c) Llama 3 8B / 70B and Mixtral 8x7B, scanned with per-block remat, 8 x 4096 tokens.

    python bench/scale/scanned_pipelined.py --json bench/scale/results/scanned_pipelined.json \\
        --md bench/scale/results/scanned_pipelined.md
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))

import jax
from jaxpar_zoo.llama import llama_config, llama_example
from jaxpar_zoo.scanned import scanned_config, scanned_example
from test_pipelined_loops import MESH as MLP_MESH
from test_pipelined_loops import _args, _scanned_step, _unrolled_step

import jaxpar

MESH = {"node": 8, "gpu": 8}
SHOWN = ("auto", "data", "fsdp", "fsdp_tp")


def steps(step, args, mesh: dict, pipelined: bool, budget) -> dict:
    plan = jaxpar.plan(
        step, *args, mesh=mesh, cluster="dgx-h100", memory_budget=budget,
        options=jaxpar.PlannerOptions(pipelined_loops=pipelined),
    )  # fmt: skip
    out = {"auto": (plan.cost.overlapped_step_s, plan.memory.peak)}
    for name in SHOWN[1:]:
        assignment = plan.choice.baselines[name][0]
        out[name] = (
            plan.baselines[name].overlapped_step_s,
            plan.memory_model.estimate(assignment).peak,
        )
    return out


def row(model: str, scanned, unrolled, mesh: dict, budget="device") -> dict:
    r = {"model": model, "mesh": mesh}
    r["off"] = steps(*scanned, mesh, False, budget)
    r["on"] = steps(*scanned, mesh, True, budget)
    if unrolled is not None:
        r["unrolled"] = steps(*unrolled, mesh, False, budget)
    print(model, {k: {s: round(v[s][0] * 1e3, 3) for s in SHOWN} for k, v in r.items()
                  if k not in ("model", "mesh")}, flush=True)  # fmt: skip
    return r


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--md", default=None)
    args = parser.parse_args()
    out: dict = {"command": "python bench/scale/scanned_pipelined.py " + " ".join(sys.argv[1:])}
    out["jax"] = jax.__version__
    rows = [
        row("tanh MLP, 4 x 512", (_scanned_step, _args(True)), (_unrolled_step, _args(False)),
            MLP_MESH, None),
    ]  # fmt: skip
    for layers in (4, 12, 64):
        pair = []
        for name in ("gpt_scan_linen", "gpt_unrolled_linen"):
            ex = scanned_example(name, scanned_config(name, layers=layers))
            pair.append((ex.step, ex.args))
        rows.append(row(f"GPT-2-wide, {layers} layers", pair[0], pair[1], MESH))
    for name in ("llama3_8b", "llama3_70b", "mixtral_8x7b"):
        ex = llama_example(name, llama_config(name, remat=True, scan_layers=True))
        rows.append(row(name, (ex.step, ex.args), None, MESH))
    out["rows"] = rows
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(out))


def markdown(res: dict) -> str:
    out = [
        "# Scanned layers with XLA's collective pipeliner",
        "",
        f"`{res['command']}` — jax {res['jax']}",
        "",
        "Overlapped step per strategy (ms, predicted, dgx-h100; the step the plans are chosen "
        "by) and predicted peak per device (GB): the scan priced as XLA:GPU runs it by default "
        "(off), with `pipelined_loops=True` (on: `XLA_FLAGS` with "
        "`--xla_gpu_enable_pipelined_{all_gather,all_reduce,reduce_scatter}=true`), and the "
        "unrolled twin where there is one. Meshes: data=8 for the MLP, else node=8, gpu=8.",
        "",
        "| model | strategy | off ms | on ms | on / off | unrolled ms | on / unrolled "
        "| peak off GB | peak on GB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        for s in SHOWN:
            off, on = r["off"][s], r["on"][s]
            unrolled = r.get("unrolled", {}).get(s)
            u = f"{unrolled[0] * 1e3:.3f} | {on[0] / unrolled[0]:.3f}" if unrolled else "– | –"
            out.append(
                f"| {r['model']} | {s} | {off[0] * 1e3:.3f} | {on[0] * 1e3:.3f} | "
                f"{on[0] / off[0]:.3f} | {u} | {off[1] / 1e9:.3f} | {on[1] / 1e9:.3f} |"
            )
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
