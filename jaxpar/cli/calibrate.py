"""``jaxpar calibrate``: measure the devices at hand and write a cluster file.

Without ``--contractions-of`` it measures the throughput curves, the memory bandwidth, the kernel
overhead and every mesh axis's collectives (`jaxpar.calibrate`). With it, it also plans a zoo
model on ``--plan-mesh`` and times every library call (matrix product, convolution) that model's
nodes make on one device under any of their configurations (`jaxpar.measure_contractions`,
OptCNN's measured t_C); ``--from FILE`` adds that table to an earlier calibration instead of
measuring the curves again.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from typing import Any

from .arguments import (
    arg_type,
    check_model,
    check_output_path,
    parse_batch,
    parse_calibration_dtype,
    parse_dtype,
    parse_mesh,
    zoo_example,
)

DESCRIPTION = """\
Measure the devices jax sees: matrix-product and convolution throughput over sizes per dtype,
memory bandwidth, and for every mesh axis of 2 or more devices the latency and bandwidth of each
collective kind over message sizes. Writes a calibration file that 'jaxpar plan --cluster FILE'
(and jaxpar.plan / auto_shard with cluster=FILE) prices plans with instead of datasheet numbers.

With --contractions-of MODEL it also times, on one device, every matrix product and convolution
MODEL's plans on --plan-mesh call under any configuration (OptCNN's measured per-layer costs);
plans price those calls at the measured times. --from FILE adds them to an earlier calibration.

examples:
  jaxpar calibrate --out h100.json
  jaxpar calibrate --from h100.json --contractions-of gpt2_124m --plan-mesh data=8 --out t.json
"""


def calibrate_command(args: argparse.Namespace) -> int:
    """Measure (or load ``--from``), optionally add a model's contraction table, write ``--out``."""
    check_output_path("--out", args.out, "calibration.json")
    if args.contractions_of is None:
        for option in ("plan_mesh", "batch", "model_dtype"):
            if getattr(args, option) is not None:
                flag = "--" + option.replace("_", "-")
                raise ValueError(f"{flag} is an option of --contractions-of MODEL; give a model")
        if args.source is not None:
            raise ValueError("--from FILE only makes sense with --contractions-of MODEL")
    model = None if args.contractions_of is None else check_model(args.contractions_of)
    plan_mesh = args.plan_mesh or {"data": 1}  # any batch plans (a smaller one too)
    if model is not None:
        _name_graph_kernels()
    from ..hardware.calibration import load_calibration
    from ..runtime.calibrate import calibrate, summary

    started = time.perf_counter()
    if args.source is not None:
        calibration = load_calibration(args.source)
    else:
        calibration = calibrate(args.mesh, quick=args.quick, dtypes=args.dtype)
    if model is not None:
        calibration = _with_model_table(calibration, model, plan_mesh, args)
    calibration.save(args.out)
    print(summary(calibration))
    seconds = time.perf_counter() - started
    print(f"wrote {args.out} in {seconds:.1f} s; plan with --cluster {args.out}")
    return 0


COMMAND_BUFFERS_OFF = "--xla_gpu_enable_command_buffer="


def _name_graph_kernels() -> None:
    """Turn XLA:GPU's command buffers (CUDA graphs) off for this process, before jax starts a
    backend: kernels inside a graph carry no HLO instruction name in the profile, and the
    library calls are timed by their instructions' kernels (`measure_contractions`)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_gpu_enable_command_buffer" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {COMMAND_BUFFERS_OFF}".strip()


def _with_model_table(calibration: Any, model: str, mesh: dict[str, int], args: Any) -> Any:
    """``calibration`` with the calls of ``model``'s plans on ``mesh`` measured."""
    import jax.numpy as jnp

    import jaxpar

    from ..cost.contraction_calls import plan_calls

    dtype = jnp.dtype(args.model_dtype or "float32")
    ex, batch, _ = zoo_example(model, args.batch, False, dtype, math.prod(mesh.values()))
    plan = jaxpar.plan(ex.step, *ex.args, mesh=mesh, cluster=calibration, memory_budget=None)
    calls = plan_calls(plan.ng, plan.tables.configs, plan.params.mesh.sizes)
    print(f"{model} (batch {batch}) on {mesh}: {len(calls)} distinct library calls", flush=True)
    before = len(calibration.contractions)
    calibration = jaxpar.measure_contractions(
        plan, calibration, quick=args.quick, progress=lambda line: print("  " + line, flush=True)
    )
    added = len(calibration.contractions) - before
    print(f"measured {added} new calls ({len(calls) - added} measured before or not run)")
    return calibration


def add_calibrate(sub: Any) -> None:
    """``jaxpar calibrate``."""
    p_cal = sub.add_parser(
        "calibrate",
        help="measure the devices at hand; write a cluster file for --cluster FILE",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p_cal.add_argument(
        "--mesh",
        type=arg_type(parse_mesh, "mesh"),
        default=None,
        metavar="NAME=SIZE,...",
        help="the mesh whose axes' collectives are measured, e.g. node=2,gpu=4 (default: every "
        "device on one axis 'devices')",
    )
    p_cal.add_argument(
        "--out",
        default="calibration.json",
        metavar="FILE",
        help="where to write the calibration (default calibration.json)",
    )
    p_cal.add_argument(
        "--dtype",
        type=arg_type(parse_calibration_dtype, "dtype"),
        action="append",
        default=None,
        help="a matmul/conv dtype to measure, repeatable: float32, bfloat16, float16 (default "
        "float32, and bfloat16 on accelerators; float32 is always measured)",
    )
    p_cal.add_argument(
        "--quick", action="store_true", help="a few small sizes only (seconds; rough numbers)"
    )
    p_cal.add_argument(
        "--contractions-of",
        default=None,
        metavar="MODEL",
        help="also time every matrix product and convolution MODEL's plans call on one device",
    )
    p_cal.add_argument(
        "--plan-mesh",
        type=arg_type(parse_mesh, "mesh"),
        default=None,
        metavar="NAME=SIZE,...",
        help="with --contractions-of: the mesh MODEL is planned on (default one device); every "
        "configuration's per-device calls are timed",
    )
    p_cal.add_argument(
        "--batch",
        type=arg_type(parse_batch, "batch"),
        default=None,
        help="with --contractions-of: MODEL's global batch (default: as 'jaxpar plan' picks it)",
    )
    p_cal.add_argument(
        "--model-dtype",
        type=arg_type(parse_dtype, "dtype"),
        default=None,
        metavar="DTYPE",
        help="with --contractions-of: MODEL's parameter dtype (default float32)",
    )
    p_cal.add_argument(
        "--from",
        dest="source",
        default=None,
        metavar="FILE",
        help="with --contractions-of: add the table to this calibration instead of measuring "
        "the curves again",
    )
    p_cal.set_defaults(func=calibrate_command)
