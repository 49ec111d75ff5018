"""Command line (also ``python -m jaxpar``).

``jaxpar demo``      train small models auto-sharded on 8 simulated devices
``jaxpar plan M``    plan a zoo model on any (abstract) mesh and cluster; report, JSON, figure
``jaxpar clusters``  the cluster presets with their numbers and sources
``jaxpar calibrate`` measure the devices at hand; write a cluster file for ``--cluster FILE``

Bad input is one line on stderr, ``jaxpar <command>: error: ...``, and exit status 2: usage
errors (`_Parser`), the checks of `plan_command` (run before anything slow: output paths,
matplotlib for ``--plot``, model, cluster, batch), and the ValueErrors of the library.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..search.options import DEFAULT_OBJECTIVE
from .arguments import (
    ALL_STRATEGIES,
    DTYPES,
    MAX_MESH_AXES,
    OBJECTIVE_CHOICES,
    SEARCH_CHOICES,
    STRATEGY_CHOICES,
    arg_type,
    batch_shortfall,
    check_cluster,
    check_decoder_build,
    check_model,
    check_output_path,
    check_plot,
    check_strategy_batch,
    choice_type,
    mesh_text,
    parse_batch,
    parse_capacity,
    parse_dtype,
    parse_memory_budget,
    parse_mesh,
    parse_seq_len,
    plural,
    positive_steps,
    zoo_example,
)
from .calibrate import add_calibrate
from .clusters import clusters_command

# What `jaxpar --help` prints above the commands (plain text: argparse shows it as written).
DESCRIPTION = """\
jaxpar plans how a JAX train step is sharded over a device mesh: for every operation, which
mesh axis splits which dimension (data, model, contraction or hybrid splits), chosen by a
search over a cost model of compute and communication.

commands:
  jaxpar demo             train small models auto-sharded on 8 simulated CPU devices
  jaxpar plan MODEL ...   plan a zoo model on any mesh and cluster (no accelerator needed)
  jaxpar clusters         the cluster presets, every number with its source
  jaxpar calibrate        measure the devices at hand; write a file for --cluster FILE
  jaxpar solve FILE [S]   solve an IOPDDL contest problem (JSON) within S seconds

examples:
  jaxpar plan vgg16 --mesh node=4,gpu=4 --cluster p100 --strategy all
  jaxpar plan gpt2_124m --mesh data=4,model=4 --cluster dgx-h100 --dtype bfloat16
  jaxpar plan --help      the models, the cluster presets and every option

'python -m jaxpar' is the same program; 'jaxpar COMMAND --help' describes a command.
"""

PLAN_DESCRIPTION = """\
Plan a model of the zoo on an abstract mesh for a cluster preset and print the predicted cost:
per layer the configuration chosen (OptCNN's notation: the degree of parallelism of each
dimension) and its compute / transfer / gradient-sync times. Nothing is allocated and no
accelerator is needed: a mesh of 4,096 devices plans on a laptop.
"""

CLUSTERS_DESCRIPTION = """\
Print every cluster preset with its numbers (peak FLOP/s per dtype, memory, and per link level
bandwidth, latency and port sharing) and where each number comes from. Multi-node presets are
shown with 2 nodes, so that the link between nodes is listed too.
"""


class UsageError(Exception):
    """Bad command-line input, reported by `main` as one ``PROG: error: ...`` line."""

    def __init__(self, prog: str, message: str) -> None:
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block) and an epilog built only for --help.

    ``epilog_fn``: called the first time the help is formatted (the plan epilog imports the
    model zoo, which `jaxpar clusters` should not pay for).
    """

    def __init__(self, *args: Any, epilog_fn: Callable[[], str] | None = None, **kw: Any):
        super().__init__(*args, **kw)
        self.epilog_fn = epilog_fn
        self.commands: dict[str, argparse.ArgumentParser] = {}  # set by build_parser

    def format_help(self) -> str:
        if self.epilog_fn is not None and self.epilog is None:
            self.epilog = self.epilog_fn()
        return super().format_help()

    def error(self, message: str) -> Any:  # argparse's hook: must not return
        raise UsageError(self.prog, f"{message} (see '{self.prog} --help')")


def demo(args: argparse.Namespace) -> int:
    """The demo (`jaxpar.demo`): what a planner decides and why, on simulated devices."""
    from .demo import run_demo

    return run_demo(args)


class _Progress:
    """Stage lines on stderr with the elapsed time: planning big models takes seconds."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.t0 = time.perf_counter()

    def __call__(self, stage: str, detail: str) -> None:
        if not self.quiet:
            elapsed = time.perf_counter() - self.t0
            print(f"[{elapsed:6.1f}s] {stage:<7} {detail}", file=sys.stderr, flush=True)


def comparison_table(
    plans: dict[str, Any], batch: int, blocked: dict[str, str] | None = None
) -> str:
    """Step time, throughput, communication and speedup over data parallel, per strategy.

    ``blocked``: strategy -> why it cannot run at ``batch`` (`blocked_strategies`): shown as
    such, not as its plan on a sub-mesh, and left out of every comparison.
    """
    blocked = blocked or {}
    step = {n: p.cost.step_for(p.objective) for n, p in plans.items() if n not in blocked}
    overlap = any(p.objective == "overlap" for p in plans.values())
    head = (
        f"{'strategy':<9} {'overlap ms' if overlap else 'step ms':>11} {'samples/s':>12} "
        f"{'comm MB/step':>13} {'vs data':>8} {'peak GB/dev':>12}  fits  optimal"
    )
    lines = [head, "-" * len(head)]
    for name, plan in plans.items():
        if name in blocked:
            lines.append(f"{name:<9} cannot run at batch {batch}: {blocked[name]}")
            continue
        speed = f"{step['data'] / step[name]:7.2f}x" if "data" in step and step[name] > 0 else ""
        fits = {None: "-", True: "yes", False: "NO"}[plan.memory.fits]
        lines.append(
            f"{name:<9} {step[name] * 1e3:11.4f} {batch / step[name]:12.1f} "
            f"{plan.cost.comm_bytes / 1e6:13.3f} {speed or 'n/a':>8} "
            f"{plan.memory.peak / 1e9:12.3f}  {fits:<4}  {plan.optimal}"
        )
    others = [k for k in step if k != "auto"]
    if "auto" in step and others:
        best = min(others, key=step.__getitem__)
        lines.append(f"auto vs best other ({best}): {step[best] / step['auto']:.2f}x faster")
    return "\n".join(lines)


def blocked_strategies(plans: dict[str, Any], batch: int) -> dict[str, str]:
    """Strategy -> why it cannot run at ``batch`` (`arguments.batch_shortfall`), for the plans
    whose data parallelism the batch does not split over."""
    from ..nodes.layer_labels import layer_kinds

    out = {}
    for name, plan in plans.items():
        convolutions = name == "owt" and "conv" in layer_kinds(plan.ng).values()
        why = batch_shortfall(name, batch, plan.mesh_axes.sizes, convolutions)
        if why:
            out[name] = why
    return out


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


def explanatory_tables(plans: dict[str, Any]) -> list[str]:
    """The tables `jaxpar.report` has for strategies side by side, in order: where each step's
    time goes per phase (`report.phase_table`), and how the state is laid out
    (`report.state_table`). Each is printed when the report module has it."""
    from ..planner import report

    names = ("phase_table", "state_table")
    return [getattr(report, name)(plans) for name in names if hasattr(report, name)]


# ---- checks that run before anything slow ------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _PlanInput:
    """What ``jaxpar plan`` was asked, checked (`checked_plan_input`)."""

    model: str
    build: Any  # arguments.DecoderBuild
    preset: str  # a cluster preset or calibration file
    mesh: dict[str, int]
    devices: int


def checked_plan_input(args: argparse.Namespace) -> _PlanInput:
    """Everything that can be wrong with the input, checked before the (slow) planning."""
    mesh: dict[str, int] = args.mesh
    if args.json is not None:
        check_output_path("--json", args.json, "plan.json")
    if args.plot is not None:
        check_plot(args.plot)
    if args.batch is not None:
        check_strategy_batch(args.strategy, args.batch, mesh)
    model = check_model(args.model)
    build = check_decoder_build(
        model, args.remat, args.scan_layers, args.capacity_factor, args.seq_len, args.remat_policy
    )  # fmt: skip
    return _PlanInput(model, build, check_cluster(args.cluster), mesh, math.prod(mesh.values()))


def plan_command(args: argparse.Namespace) -> int:
    """Plan a zoo model on an abstract mesh: no accelerator and no parameters allocated."""
    given = checked_plan_input(args)
    say = _Progress(args.quiet)

    import jax
    import jax.numpy as jnp

    from ..trace.meshes import describe_mesh, resolve_cluster

    cluster = resolve_cluster(given.preset, describe_mesh(given.mesh))
    # float64 needs jax's 64-bit mode, or the arrays would silently be float32
    wide = jax.enable_x64(True) if args.dtype == "float64" else contextlib.nullcontext()
    with wide:
        ex, batch, note = zoo_example(
            given.model, args.batch, args.small, jnp.dtype(args.dtype), given.devices, given.build
        )  # fmt: skip
        size = ", ".join(("small" if args.small else "full size", *given.build.words()))
        say("model", f"{given.model} ({size}), batch {batch}" + (f" ({note})" if note else ""))
        plans = plan_strategies(args, ex, given.mesh, cluster, say)
        title = plan_title(args, given, batch, note, cluster.name)
        print(title)
        blocked = blocked_strategies(plans, batch)
        print_plans(args, plans, batch, blocked)
        if args.json:
            document = plan_document(given.model, batch, given.mesh, cluster, plans, blocked)
            with open(args.json, "w") as f:
                json.dump(document, f, indent=1)
            say("json", args.json)
        if args.plot:
            from ..planner.figures import plot_strategies

            plot_strategies(plans, args.plot, title=title)
            say("plot", args.plot)
    return 0


def plan_strategies(
    args: argparse.Namespace, ex: Any, mesh: dict[str, int], cluster: Any, say: _Progress
) -> dict[str, Any]:
    """The plan of each strategy asked for (``--strategy all``: auto and the baselines, as
    variants of one planning run)."""
    import jaxpar

    strategy = "auto" if args.strategy == "all" else args.strategy
    plan = jaxpar.plan(
        ex.step,
        *ex.args,
        mesh=mesh,
        cluster=cluster,
        strategy=strategy,
        objective=args.objective,
        search=args.search,
        memory_budget=args.memory_budget,
        options=jaxpar.PlannerOptions(pipelined_loops=args.pipelined_loops),
        progress=say,
    )
    names = ALL_STRATEGIES if args.strategy == "all" else (strategy,)
    return {n: plan.variant(n) for n in names}


def plan_title(
    args: argparse.Namespace, given: _PlanInput, batch: int, note: str, cluster: str
) -> str:
    """The first line of the output: model, batch, mesh, cluster, objective, dtype."""
    return (
        f"{given.model}{' (small)' if args.small else ''}"
        + "".join(f", {w}" for w in given.build.words())
        + f", batch {batch}"
        f"{f' ({note})' if note else ''}, mesh {mesh_text(given.mesh)} "
        f"({plural(given.devices, 'device')}), cluster {cluster}, objective "
        f"{args.objective}, dtype {args.dtype}"
    )


def print_plans(
    args: argparse.Namespace, plans: dict[str, Any], batch: int, blocked: dict[str, str]
) -> None:
    """The comparison and the tables (``--strategy all``), or the one plan's report."""
    if args.strategy == "all":
        print()
        print(comparison_table(plans, batch, blocked))
        # What the comparison does not show: per phase where each step goes, and the state's
        # layout (jaxpar.report's tables for strategies side by side), of the plans that run.
        runnable = {n: p for n, p in plans.items() if n not in blocked}
        for table in explanatory_tables(runnable):
            print()
            print(table)
        print()
        print(layer_table(runnable))
        return
    ((name, plan),) = plans.items()
    print(plan.report())
    step_s = plan.cost.step_for(plan.objective)
    print(f"throughput {batch / step_s:.1f} samples/s at batch {batch}")
    if name in blocked:
        print(
            f"note: {name} cannot run at batch {batch}: {blocked[name]}; the plan above splits "
            "the batch over fewer devices"
        )


JSON_SCHEMA = "jaxpar.plan/1"


def plan_document(
    model: str, batch: int, mesh: dict[str, int], cluster: Any, plans: dict[str, Any],
    blocked: dict[str, str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """What ``--json`` writes (``schema: jaxpar.plan/1``): one entry per strategy; a strategy
    that cannot run at the batch (``blocked``) says why in ``cannot_run`` (else null) and has
    no speedup, nor is it the reference of the others'."""
    blocked = blocked or {}
    data = plans.get("data") if "data" not in blocked else None
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
            data.cost.step_s / c.step_s
            if data is not None and c.step_s > 0 and name not in blocked
            else None
        )
        entry["cannot_run"] = blocked.get(name)
        out["strategies"][name] = entry
    return json.loads(json.dumps(out, default=str))


def _plan_epilog() -> str:
    """`jaxpar plan --help`'s list of models and presets (imports the zoo: only for --help)."""
    import jaxpar_zoo as zoo

    from ..hardware import presets

    def names(items: Sequence[str]) -> str:
        return textwrap.fill(
            ", ".join(items), width=96, initial_indent="  ", subsequent_indent="  "
        )

    width = max(len(n) for n in presets.preset_names()) + 2
    lines = [
        "models (MODEL; --small plans the reduced version):",
        names(zoo.NAMES),
        "small test models:",
        names(zoo.EXTRA),
        "large decoders (--remat, --scan-layers, --seq-len; --capacity-factor for a mixture of "
        "experts):",
        names((*zoo.LARGE, *zoo.LARGE_EXTRA)),
        "",
        "cluster presets (--cluster; 'jaxpar clusters' prints every number and its source):",
        *[f"  {n:<{width}}{presets.preset_summary(n)}" for n in presets.preset_names()],
        "",
        "examples:",
        "  jaxpar plan vgg16 --mesh node=4,gpu=4 --cluster p100 --batch 512 --strategy all \\",
        "      --json vgg16.json --plot vgg16.png",
        "  jaxpar plan gpt2_124m --mesh data=4,model=4 --cluster dgx-h100 --dtype bfloat16",
        "  jaxpar plan lenet5 --mesh pod=16,node=64,gpu=4 --batch 4096 --quiet",
        "  jaxpar plan llama3_8b --mesh node=8,gpu=8 --cluster dgx-h100 --dtype bfloat16 \\",
        "      --remat --scan-layers",
    ]
    return "\n".join(lines)


def build_parser() -> _Parser:
    """The `jaxpar` argument parser: demo, plan, clusters."""
    parser = _Parser(
        prog="jaxpar",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_demo(sub)
    _add_plan(sub)
    _add_clusters(sub)
    add_calibrate(sub)
    parser.commands = dict(sub.choices)  # command name -> its parser
    return parser


def _add_demo(sub: Any) -> None:
    """``jaxpar demo`` (jaxpar/demo.py)."""
    p_demo = sub.add_parser(
        "demo",
        help="what the planner decides and why, on 8 simulated devices (about 20 s)",
        description="Train a small GPT auto-sharded on 8 simulated CPU devices beside the "
        "unsharded step (losses, layouts, predicted vs compiled collectives), then plan GPT-2 "
        "1.3B for 64 H100s beside the hand plans and explain the difference.",
    )
    p_demo.add_argument(
        "--steps", type=positive_steps, default=3, help="training steps of part 1 (default 3)"
    )
    p_demo.add_argument(
        "--small-only", action="store_true", help="skip part 2 (GPT-2 1.3B on 64 H100s)"
    )
    p_demo.set_defaults(func=demo)


def _add_plan(sub: Any) -> None:
    """``jaxpar plan MODEL``: the options, each parsed and checked by `cli_input`."""
    p_plan = sub.add_parser(
        "plan",
        help="plan a zoo model on an abstract mesh (any size, no accelerator needed)",
        description=PLAN_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog_fn=_plan_epilog,
    )
    p_plan.add_argument("model", metavar="MODEL", help="zoo model name (listed below)")
    p_plan.add_argument(
        "--mesh",
        required=True,
        type=arg_type(parse_mesh, "mesh"),
        metavar="NAME=SIZE,...",
        help=(
            f"mesh axes, outermost first, e.g. node=4,gpu=4 (at most {MAX_MESH_AXES} axes "
            "larger than 1)"
        ),
    )
    p_plan.add_argument(
        "--cluster",
        default="p100",
        metavar="PRESET|FILE",
        help="cluster preset (listed below), sized to the mesh in whole nodes, or a calibration "
        "file written by 'jaxpar calibrate'; default p100",
    )
    p_plan.add_argument(
        "--batch",
        type=arg_type(parse_batch, "batch"),
        default=None,
        help="global batch (default: the model's batch, rounded up to a multiple of the device "
        "count); any batch plans, one smaller than the mesh too: --strategy all marks the "
        "baselines whose data parallelism it does not split over",
    )
    _add_plan_choices(p_plan)
    _add_plan_decoder_options(p_plan)
    _add_plan_outputs(p_plan)
    p_plan.set_defaults(func=plan_command)


def _add_plan_choices(p_plan: Any) -> None:
    """``jaxpar plan``'s choices: strategy, objective, search, dtype, memory budget."""
    choices = (
        ("strategy", STRATEGY_CHOICES, "auto", "auto: the search (default); data, model, owt: the "
         "baselines; hypar: HyPar's space; all: auto and the three baselines side by side"),
        ("objective", OBJECTIVE_CHOICES, DEFAULT_OBJECTIVE, "overlap: the step with "
         "communication overlapped with compute, as XLA schedules it (default); time: OptCNN "
         "Eq. 1, compute plus every collective (the papers'); comm: bytes moved (SoyBean's)"),
        ("search", SEARCH_CHOICES, "elimination", "joint elimination (OptCNN, default) or "
         "SoyBean's k-cut; the report shows both"),
    )  # fmt: skip
    for option, values, default, text in choices:
        p_plan.add_argument(
            f"--{option}",
            type=choice_type(option, values),
            default=default,
            metavar="{" + ",".join(values) + "}",
            help=text,
        )
    p_plan.add_argument(
        "--dtype",
        type=arg_type(parse_dtype, "dtype"),
        default="float32",
        help=f"parameter/activation dtype: {', '.join(DTYPES)} (default float32)",
    )
    p_plan.add_argument(
        "--memory-budget",
        type=arg_type(parse_memory_budget, "memory-budget"),
        default="device",
        metavar="SIZE",
        help="bytes per device the plan must fit, e.g. 80GB (default 'device': the device's "
        "memory less 10%%; 'none': no limit)",
    )


def _add_plan_decoder_options(p_plan: Any) -> None:
    """``jaxpar plan``'s model options: --small, and how a large decoder is built."""
    p_plan.add_argument("--small", action="store_true", help="the reduced (test) model")
    p_plan.add_argument(
        "--remat",
        action="store_true",
        help="large decoders: rematerialize each block in the backward pass (nn.remat)",
    )
    p_plan.add_argument(
        "--remat-policy",
        metavar="NAME",
        help="large decoders: what remat keeps, by MaxText's names: full (nothing; --remat's), "
        "minimal, minimal_offloaded, save_qkv_proj, qkv_proj_offloaded (the *_offloaded ones "
        "keep it in the host's memory); implies --remat",
    )
    p_plan.add_argument(
        "--scan-layers",
        action="store_true",
        help="large decoders: stack the blocks under one nn.scan (planned once, run per layer)",
    )
    p_plan.add_argument(
        "--seq-len",
        type=arg_type(parse_seq_len, "seq-len"),
        default=None,
        metavar="N",
        help="large decoders: tokens per sequence (default: the model's, 4,096 at full size)",
    )
    p_plan.add_argument(
        "--capacity-factor",
        type=arg_type(parse_capacity, "capacity-factor"),
        default=None,
        metavar="F",
        help="mixtures of experts: GShard's capacity dispatch, F x an expert's even share of "
        "slots (copies past it dropped; expert parallelism can split it); default dropless",
    )
    p_plan.add_argument(
        "--pipelined-loops",
        action="store_true",
        help="the target compiles with XLA:GPU's collective pipeliner (XLA_FLAGS "
        "--xla_gpu_enable_pipelined_{all_gather,all_reduce,reduce_scatter}=true): a scan's "
        "weight gathers and gradient all-reduces overlap the neighbouring iteration",
    )


def _add_plan_outputs(p_plan: Any) -> None:
    """``jaxpar plan``'s outputs: --json, --plot, --quiet."""
    p_plan.add_argument("--json", metavar="FILE", help="write the plan(s) as JSON")
    p_plan.add_argument(
        "--plot",
        metavar="FILE.png",
        help='draw per-layer configs and times (needs matplotlib: pip install -e ".[plot]")',
    )
    p_plan.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def _add_clusters(sub: Any) -> None:
    """``jaxpar clusters``."""
    p_cl = sub.add_parser(
        "clusters",
        help="list the cluster presets with numbers and sources",
        description=CLUSTERS_DESCRIPTION,
    )
    p_cl.set_defaults(func=clusters_command)


def _one_line(message: object) -> str:
    """An error message on one line (library messages may hold newlines)."""
    return " ".join(str(message).split())


def main(argv: list[str] | None = None) -> int:
    """Run `jaxpar`; returns the exit status (2: bad input, reported as one line)."""
    as_program, argv = argv is None, sys.argv[1:] if argv is None else argv
    if argv[:1] == ["solve"]:  # light: no parser, nothing heavy imported (cli/solve.py)
        from .solve import run_solve

        return run_solve(argv[1:], as_program)
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # reported by the command's parser, so the line names the command
            parser.commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    except UsageError as err:
        print(f"{err.prog}: error: {_one_line(err)}", file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except BrokenPipeError:  # stdout closed early (jaxpar clusters | head): not an error of ours
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (ValueError, KeyError, OSError) as err:
        # bad input: one clear line, not a traceback
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"jaxpar {args.command}: error: {_one_line(message)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"jaxpar {args.command}: interrupted", file=sys.stderr)
        return 130
