"""Predicted vs compiled vs measured memory of one-device train steps on the device at hand.

Issue 9 sets the planner's safety margin per platform (`memory_estimate.MODEL_MARGIN` 10 % on
GPU/TPU, `CPU_MODEL_MARGIN` 32 % on CPU meshes); the CPU figure comes from simulated devices,
the GPU one had no measurement. Here each case is planned by ``auto_shard`` on a one-device
mesh (state donated, the cluster preset of the platform: ``dgx-h100`` on a GPU, ``cpu`` else),
compiled, and run once for real. Beside the plan's predicted peak (`MemoryEstimate.peak`) it
records:

- ``compiled``: the compiled program's ``memory_analysis()``, arguments + outputs - aliases +
  temporaries (XLA's own buffer assignment: what issue 9's fidelity check compares against);
- ``measured``: the device allocator's ``peak_bytes_in_use`` over the run (``memory_stats()``,
  reset by running in a fresh process per case), less what was in use before the state was
  made; only where the backend reports it (GPU/TPU).

    python bench/memory/memory_device.py --json memory_device.json --md memory_device.md
    python bench/memory/memory_device.py --cases gpt2_124m --json /tmp/m.json   # one case
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

# The objective the committed results were planned with: OptCNN Eq. 1 ("time", the planner's
# default until 2026-11-24; the default is now "overlap").
OBJECTIVE = "time"

# name -> (zoo model or llama config, layers kept, batch, seq, remat)
CASES: dict[str, tuple[str, int | None, int | None, int | None, bool]] = {
    "gpt2_124m": ("gpt2_124m", None, None, None, False),
    "resnet50": ("resnet50", None, None, None, False),
    "llama3_8b_4l": ("llama3_8b", 4, 4, 2048, False),
    "llama3_8b_4l_remat": ("llama3_8b", 4, 4, 2048, True),
    "gemma_7b_2l": ("gemma_7b", 2, 4, 2048, False),
}


def example(case: str) -> Any:
    import jaxpar_zoo as zoo
    from jaxpar_zoo.llama import llama_config, llama_example

    name, layers, batch, seq, remat = CASES[case]
    if layers is None:
        return zoo.get(name)
    cfg = llama_config(name, remat=remat, batch=batch, seq_len=seq)
    cfg["num_layers"] = layers
    return llama_example(name, cfg)


def run_case(case: str) -> dict[str, Any]:
    """Plan, compile and run one case in this process (call it in a fresh one)."""
    import jax

    import jaxpar

    device = jax.devices()[0]
    cluster = "dgx-h100" if device.platform == "gpu" else "cpu"
    ex = example(case)
    mesh = jaxpar.make_mesh({"data": 1})
    step = jaxpar.auto_shard(
        ex.step,
        mesh=mesh,
        cluster=cluster,
        donate_argnums=(0,),
        memory_budget=None,
        objective=OBJECTIVE,
    )
    t0 = time.perf_counter()
    compiled = step.lower(*ex.args).compile()
    compile_s = time.perf_counter() - t0
    parts = jaxpar.verify.compiled_memory(compiled)
    xla = parts["peak"]
    pred = step.plan.memory
    out: dict[str, Any] = {
        "case": case,
        "device": f"{device.device_kind} ({device.platform})",
        "cluster": cluster,
        "predicted": pred.as_dict(),
        "compiled": parts,
        "predicted_over_compiled": pred.peak / xla,
        "compile_s": compile_s,
    }
    stats = device.memory_stats() or {}
    before = stats.get("bytes_in_use")
    state, batch = ex.make_args(0)
    jax.block_until_ready((state, batch))
    made = (device.memory_stats() or {}).get("bytes_in_use")
    jax.block_until_ready(step(state, batch))  # the state is donated
    after = device.memory_stats() or {}
    if before is not None and "peak_bytes_in_use" in after:
        measured = after["peak_bytes_in_use"] - before
        out["measured"] = {"peak": measured, "state_and_batch": made - before}
        out["predicted_over_measured"] = pred.peak / measured
    return out


def markdown(rows: list[dict[str, Any]], command: str) -> str:
    lines = [
        "# Memory per device: predicted vs compiled vs measured (one device)",
        "",
        f"Device: {rows[0]['device']}; command: `{command}`",
        "",
        "Predicted: the plan's peak (`MemoryEstimate.peak`, no margin). Compiled: "
        "`memory_analysis()`, arguments + outputs - aliases + temporaries. Measured: the "
        "allocator's peak bytes in use over the process (state creation and one step), less "
        "what was in use before the state was made: an upper bound of the step's peak.",
        "",
        "| case | predicted GB | compiled GB | measured GB | predicted / compiled | "
        "predicted / measured | args GB (pred / compiled) | temporaries GB (compiled) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p, c = r["predicted"], r["compiled"]
        meas = r.get("measured", {}).get("peak")
        args = p["params"] + p["optimizer"] + p["batch"] + p["other_args"]
        lines.append(
            f"| {r['case']} | {p['peak'] / 1e9:.2f} | {c['peak'] / 1e9:.2f} | "
            f"{'' if meas is None else f'{meas / 1e9:.2f}'} | {r['predicted_over_compiled']:.3f} | "
            f"{r.get('predicted_over_measured', float('nan')):.3f} | "
            f"{args / 1e9:.2f} / {c['arguments'] / 1e9:.2f} | {c['temporaries'] / 1e9:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # run one case here, print its JSON
    args = ap.parse_args()
    if args.one:
        print("RESULT " + json.dumps(run_case(args.one)))
        return 0
    rows = []
    for case in args.cases:
        proc = subprocess.run(
            [sys.executable, __file__, "--one", case], capture_output=True, text=True
        )
        found = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not found:
            print(f"{case}: failed\n{proc.stderr[-2000:]}", flush=True)
            continue
        row = json.loads(found[-1][len("RESULT ") :])
        rows.append(row)
        print(
            f"{case}: predicted {row['predicted']['peak'] / 1e9:.2f} GB, compiled "
            f"{row['compiled']['peak'] / 1e9:.2f} GB ({row['predicted_over_compiled']:.3f}), "
            f"measured {row.get('measured', {}).get('peak', float('nan')) / 1e9:.2f} GB "
            f"({row.get('predicted_over_measured', float('nan')):.3f})",
            flush=True,
        )
    command = "python bench/memory/memory_device.py " + " ".join(sys.argv[1:])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": command, "rows": rows}, f, indent=1)
    if args.md and rows:
        with open(args.md, "w") as f:
            f.write(markdown(rows, command))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
