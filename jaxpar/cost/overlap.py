"""The step with communication overlapped: compute on one stream, collectives on another, copies
to and from host memory on the copy engines.

OptCNN's Eq. 1 adds every collective to compute. XLA's GPU/TPU schedulers run collectives
asynchronously: gradient all-reduces behind the rest of the backward pass, all-gathers of
parameters ahead of their use. `evaluate` schedules the planned step on these streams and takes
its makespan:

- the compute stream runs the nodes as a list scheduler whose priority is program order
  (`list_schedule`): when it is free, the first node in program order whose inputs are ready
  runs, so a node waiting on communication (a weight gradient's transpose on its all-reduce)
  lets independent later nodes (the layers below's backward) run first, as XLA's scheduler
  does; a node runs for its t_C, and a loop body's nodes all run before the next region's;
- the communication stream runs, in the order they are issued, the reshard steps a node reads
  through (issued with the node's inputs, once its producers have run; each after the data it
  moves is ready) and each node's own collectives (partial sums after its compute; a halo
  exchange before it);
- two copy engines, one per direction, run the moves between device and host memory (a remat
  policy's offloaded residuals) in the order they are issued (`step_timeline`: a move to the
  host after its operand is ready; a move back issued ahead of its use, by the compute its
  transfer takes);
- a task starts when its stream is free and the tasks it depends on have finished:
  ``start = max(stream free, max finish of its dependencies)`` (`schedule`, one pass: every
  dependency is issued before its dependents).

A node's results are ready when its compute (and its own all-reduce) has finished. A loop body's
tasks run ``trips`` times as long (iterations are not overlapped with each other). Reshards of
the state into the next step's layout and a scan's carry edges are issued at the end of their
producer and waited on by nobody. All-reduces that XLA's combiner merges (`combine`) run as one
collective, which takes every operand: it is issued after the group's last member, pays its
latency once, and every member's results are ready when it finishes, as are the results of the
nodes run before it that read them, directly or not (`step_timeline.schedule_step`).

The schedule is never longer than Eq. 1's sum (no stream idles while the other has nothing
running), so Eq. 1 is an upper bound of the overlapped step, and that bound is what the search
minimizes (docs/cost.md, "Overlapped step").

Pure: no jax import.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Sequence

COMPUTE, COMM, TO_HOST, FROM_HOST = 0, 1, 2, 3  # streams


@dataclasses.dataclass(frozen=True)
class Task:
    """One unit of work on a stream."""

    stream: int  # COMPUTE, COMM, TO_HOST or FROM_HOST
    duration: float  # seconds
    deps: tuple[int, ...] = ()  # tasks (indices, all earlier) that must finish first


def schedule(tasks: Sequence[Task]) -> list[float]:
    """Finish time of every task: in-order streams, ``start = max(stream free, deps done)``."""
    line = Timeline()
    for task in tasks:
        line.add(task.stream, task.duration, task.deps)
    return line.finish


class Timeline:
    """Schedules the tasks of a planned step as they are added (see the module docstring):
    every dependency is added before its dependents, so one pass is the whole schedule."""

    def __init__(self) -> None:
        self.finish: list[float] = []  # per task added, its finish time (`schedule`)
        self.free = [0.0, 0.0, 0.0, 0.0]  # per stream, when its last task finishes
        self.ready: dict[int, int] = {}  # node -> the task after which its results are ready
        self.computed: dict[int, int] = {}  # node -> its compute task
        self.steps: dict[tuple, int] = {}  # reshard step key -> its task

    def add(self, stream: int, duration: float, deps: Sequence[int | None] = ()) -> int:
        """A task on ``stream``; returns its index. ``start = max(stream free, deps done)``."""
        start = self.free[stream]
        for d in deps:
            if d is not None and self.finish[d] > start:
                start = self.finish[d]
        self.finish.append(start + duration)
        self.free[stream] = start + duration
        return len(self.finish) - 1

    def reshard(self, key: tuple, src: int, previous: int | None, duration: float) -> int:
        """A reshard step (each key once), after its source data: the previous step of the
        path, else the producing node's results."""
        if key not in self.steps:
            after = previous if previous is not None else self.ready.get(src)
            self.steps[key] = self.add(COMM, duration, [after])
        return self.steps[key]

    def node(
        self, index: int, compute_s: float, reads: Sequence[int | None],
        before: Sequence[float], after: Sequence[float],
    ) -> None:  # fmt: skip
        """A node: collectives ``before`` its compute (halos), its compute after ``reads``
        (tasks its inputs wait on), collectives ``after`` it (partial sums)."""
        deps = list(reads)
        for d in before:
            deps.append(self.add(COMM, d, deps))
        last = self.computed[index] = self.add(COMPUTE, compute_s, deps)
        for d in after:
            last = self.add(COMM, d, [last])
        self.ready[index] = last

    def makespan(self) -> float:
        return max(self.finish, default=0.0)


def list_schedule(
    line: Timeline,
    order: Sequence[int],
    producers: Callable[[int], Sequence[int]],
    region: Callable[[int], int],
    issue: Callable[[int], list[int | None]],
    run: Callable[[int, list[int | None]], None],
) -> None:
    """Run the nodes of ``order`` (program order) on ``line``'s compute stream: whenever the
    stream is free, the first node in program order that can start then, else the node that
    can start first (ties: program order). A node's inputs are issued (``issue(v)``: the tasks
    it waits on, reshards added to the communication stream) once every node of
    ``producers(v)`` has run; ``run(v, tasks)`` adds its compute and its own collectives. The
    nodes of one ``region`` (a loop body) all run before a node of the next."""
    position = {v: k for k, v in enumerate(order)}
    waiting: dict[int, list[int | None]] = {}  # issued, not run: the tasks each waits on
    later: list[tuple[float, int, int]] = []  # (ready at, position, node) of issued nodes
    now: list[tuple[int, int]] = []  # (position, node): issued and ready when the stream is
    missing: dict[int, int] = {}  # node -> its producers not yet run
    blocked: dict[int, list[int]] = {}  # node -> the nodes its run unblocks
    done: set[int] = set()

    def issued(v: int) -> None:
        tasks = issue(v)
        waiting[v] = tasks
        ready = max((line.finish[t] for t in tasks if t is not None), default=0.0)
        heapq.heappush(later, (ready, position[v], v))

    def start(v: int, tasks: list[int | None]) -> None:
        run(v, tasks)
        done.add(v)
        for w in blocked.pop(v, ()):
            missing[w] -= 1
            if not missing[w]:
                del missing[w]
                issued(w)

    def run_first(flush: bool) -> bool:
        """Run the first ready node; with ``flush``, wait for the earliest when none is."""
        free = line.free[COMPUTE]
        while later and later[0][0] <= free:
            _, k, v = heapq.heappop(later)
            heapq.heappush(now, (k, v))
        if not now and flush and later:
            ready = later[0][0]
            while later and later[0][0] <= ready:
                _, k, v = heapq.heappop(later)
                heapq.heappush(now, (k, v))
        if not now:
            return False
        _, v = heapq.heappop(now)
        start(v, waiting.pop(v))
        return True

    current = None
    for v in order:
        if region(v) != current:
            while run_first(flush=True):  # a region's nodes run before the next region's
                pass
            current = region(v)
        absent = [p for p in producers(v) if p not in done]
        if absent:
            missing[v] = len(absent)
            for p in absent:
                blocked.setdefault(p, []).append(v)
        else:
            issued(v)
        while run_first(flush=False):
            pass
    while run_first(flush=True):
        pass
