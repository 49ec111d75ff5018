"""The pipeline's stage results (typed, frozen) and the clock that times the stages.

    trace    fn, args                    -> Traced     (flat program, argument layout)
    target   mesh, cluster, objective    -> Target     (cost parameters of the mesh's links)
    graph    Traced                      -> Analysis   (planning nodes, batch dims, layers)

`pipeline` calls the stages; `plan.Plan` keeps these results whole, each fact once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..cost.node_costs import CostParams
from ..hardware import Cluster
from ..hardware.speeds import MeshSpeeds
from ..nodes.planning_nodes import NodeGraph
from ..program.graph import Program
from ..trace.meshes import MeshDescription
from ..xla.allreduce_combiner import Combiner

Progress = Callable[[str, str], None]  # progress(stage, detail) after each planning stage


@dataclasses.dataclass(frozen=True)
class ArgLayout:
    """How the step's flat arrays map back to its argument and result pytrees."""

    arg_treedef: Any
    arg_is_array: tuple[bool, ...]  # per argument leaf: an array (planned) or static
    out_tree: Any


@dataclasses.dataclass(frozen=True)
class Traced:
    """Stage result: the step as a flat program, and how its pytrees flatten."""

    program: Program
    arg_layout: ArgLayout
    batch_tensors: tuple[int, ...]  # argument tensors whose dim 0 is the batch
    arg_kinds: Mapping[int, str]  # argument tensor -> params / optimizer / batch / other
    donated: frozenset[int]  # argument tensors whose buffers the step donates


@dataclasses.dataclass(frozen=True)
class Target:
    """Stage result: the mesh, the cluster it runs on, and the cost model's parameters."""

    mesh: MeshDescription
    cluster: Cluster
    params: CostParams
    speeds: MeshSpeeds | None  # per-device rates on a heterogeneous mesh
    device_memory: float  # bytes of the mesh's smallest device
    combiner: Combiner  # how the target backend combines all-reduces


@dataclasses.dataclass(frozen=True)
class Analysis:
    """Stage result: the planning nodes and what each one is."""

    ng: NodeGraph
    batch: tuple[set[int], ...]  # per node, iteration dims carrying the batch
    labels: tuple[str, ...]  # per node, its layer
    feedback: tuple[tuple[int, int], ...]  # (state result, argument it becomes)


class StageClock:
    """Times the stages and reports progress: at each stage end, and every ``every`` seconds
    from inside long loops."""

    def __init__(self, progress: Progress | None, every: float = 2.0) -> None:
        self.progress, self.every = progress, every
        self.times: dict[str, float] = {}
        self.last = time.perf_counter()

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Add the time spent inside the block to stage ``name``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - t0

    def done(self, stage: str, detail: str) -> None:
        if self.progress is not None:
            self.progress(stage, detail)
        self.last = time.perf_counter()

    def ticker(self, stage: str, every: float | None = None) -> Callable[[str], None]:
        """A progress callback for a stage's inner loop (throttled)."""
        gap = self.every if every is None else every

        def tick(detail: str) -> None:
            if self.progress is not None and time.perf_counter() - self.last >= gap:
                self.done(stage, detail + " ...")

        return tick
