"""``jaxpar solve PROBLEM.json[.gz] [TIMEOUT_S]``: solve a problem in the IOPDDL contest's format
with the search `jaxpar.plan` runs (`solver.descent.solve_within`).

It finishes within TIMEOUT_S seconds (default `DEFAULT_TIMEOUT_S`, the contest's shortest)
counted from the process's start, reading the file included; progress goes to stderr, and the
last line on stdout is the answer, one strategy index per node: ``[0, 2, 1, ...]``. Bad input
(a missing file, malformed JSON, wrong shapes, a timeout that is not a positive number) is one
line on stderr, ``jaxpar solve: error: ...``, and exit status 2.

Kept light: `cli.main.main` hands ``solve`` here before parsing anything else, and nothing
here imports jax.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

DEFAULT_TIMEOUT_S = 60.0
# what the answer's printing and the interpreter's exit may take, kept free before the timeout
EXIT_MARGIN_S = 0.6
EXIT_SHARE = 0.02  # and this share of the timeout
# the hard stop, this long before the timeout: the best plan so far is printed and the process
# exits (`exit_now`; the CI run's loaded machine took 0.27 s from the stop to the exit)
HARD_STOP_S = 0.5

_IMPORTED = time.perf_counter()


def process_elapsed() -> float:
    """Seconds since this process started (Linux: /proc; elsewhere since this module was
    imported)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _IMPORTED


def _timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"TIMEOUT_S must be a number of seconds, got {text!r}"
        ) from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"TIMEOUT_S must be positive and finite, got {text!r}")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        print(f"jaxpar solve: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def solve_command(argv: list[str], exit_at_stop: bool = False) -> int:
    """Run ``jaxpar solve``; returns the exit status. ``exit_at_stop``: at the hard stop,
    end the process as soon as the answer is written (`jaxpar solve` as a program)."""
    started = time.perf_counter() - process_elapsed()
    parser = _Parser(
        prog="jaxpar solve",
        description="Solve an IOPDDL contest problem (JSON or JSON.gz); the answer is the "
        "last line on stdout.",
    )
    parser.add_argument("problem", metavar="PROBLEM.json[.gz]")
    parser.add_argument(
        "timeout", metavar="TIMEOUT_S", nargs="?", type=_timeout, default=DEFAULT_TIMEOUT_S,
        help=f"seconds from the process's start to its exit (default {DEFAULT_TIMEOUT_S:g})",
    )  # fmt: skip
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:
        return int(done.code or 0)
    from ..solver.contest_format import read_contest
    from ..solver.descent import solve_within

    deadline = started + args.timeout - EXIT_MARGIN_S - EXIT_SHARE * args.timeout

    def progress(message: str) -> None:
        print(f"{time.perf_counter() - started:7.2f}s {message}", file=sys.stderr, flush=True)

    try:
        contest = read_contest(args.problem)
    except (OSError, ValueError) as err:
        print(f"jaxpar solve: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    problem = contest.problem
    progress(f"read {contest.name or args.problem}: {problem.num_nodes} nodes, "
             f"{len(problem.edges)} edges")  # fmt: skip
    latest: list[list[int]] = []  # the answer so far, for a search cut short
    stop = _Stop(latest, started, exit_at_stop)
    try:
        with _hard_stop(started + args.timeout - HARD_STOP_S, stop):
            solution = solve_within(problem, deadline, log=progress, on_plan=_keep(latest))
    except _OutOfTime:
        if not latest:
            raise
        return 0
    _report(solution, progress)
    _answer(solution.assignment)
    return 0


class _OutOfTime(Exception):
    """The hard stop: a phase ran past the search's deadline (a loaded machine)."""


class _Stop:
    """What the hard stop does: write the best plan so far as the answer (raw writes: the
    signal may land inside a buffered write), then end the process (``exit_at_stop``) or raise
    `_OutOfTime`; with no plan yet, raise."""

    def __init__(self, latest: list, started: float, exit_at_stop: bool):
        self.latest, self.started, self.exit_at_stop = latest, started, exit_at_stop

    def __call__(self) -> None:
        if self.latest:
            elapsed = time.perf_counter() - self.started
            _write(2, f"{elapsed:7.2f}s out of time: the best plan found so far\n")
            sys.stdout.flush()
            _write(1, "[" + ", ".join(str(int(c)) for c in self.latest[-1]) + "]\n")
            if self.exit_at_stop:  # at once: unwinding the search frees its objects first
                os._exit(0)
        raise _OutOfTime


def _write(fd: int, text: str) -> None:
    data = text.encode()
    while data:
        data = data[os.write(fd, data) :]


@contextlib.contextmanager
def _hard_stop(at: float, stop: Callable[[], None]):
    """Call ``stop`` at ``at`` (a `time.perf_counter` instant) wherever the search is: its
    phases look at the clock between steps, and on a loaded machine one step can outlast the
    margin. Only in the main thread (signals); elsewhere nothing."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(
        signal, "setitimer"
    ):
        yield
        return

    def ring(_signum, _frame):
        stop()

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, max(at - time.perf_counter(), 1e-3))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _keep(latest: list):
    def keep(plan: list[int]) -> None:
        latest[:] = [plan]

    return keep


def _report(solution, progress) -> None:
    stats = solution.stats
    phases = ", ".join(f"{k} {v:.2f}s" for k, v in stats.get("phases_s", {}).items())
    proved = ", optimal (proved)" if solution.optimal else ""
    phases = f"; {phases}" if phases else ""
    progress(f"{stats.get('method')}: objective {solution.objective:.10g}, fits memory "
             f"{stats.get('fits_memory', True)}{proved}{phases}")  # fmt: skip
    counts = {k: v for k, v in stats.items() if isinstance(v, (int, float)) and k != "objective"}
    progress(f"stats: {counts}")


def run_solve(argv: list[str], as_program: bool) -> int:
    """`solve_command`; as a program (``as_program``), the process ends right after the answer:
    the timeout counts to its exit, and the teardown is not needed."""
    status = solve_command(argv, exit_at_stop=as_program)
    if as_program:
        exit_now(status)
    return status


def exit_now(status: int) -> None:
    """End the process at once, streams flushed: freeing a 65k-node problem's objects at the
    interpreter's exit took 0.3 s on a loaded machine, counted against the timeout."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _answer(assignment) -> None:
    print("[" + ", ".join(str(int(c)) for c in assignment) + "]", flush=True)
