"""The planner's result: a `Plan` (frozen), what it costs, and how to read its shardings.

Reports (tables, comparison, JSON) are in `report`; `Plan`'s report methods call them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from jax import tree_util
from jax.sharding import NamedSharding, PartitionSpec

from . import report
from .choose import Choice, SearchRun
from .combine import combiner_for
from .configs import Config, Spec, spec_of
from .cost import CostParams
from .evaluate import Collective, EvalContext, Evaluation, PlanCost
from .graph import Program
from .hardware import Cluster
from .hardware.mesh_model import MeshAxes
from .hardware.speeds import MeshSpeeds
from .memory import MemoryModel
from .memory_estimate import MemoryEstimate
from .nodes import NodeGraph
from .options import PlannerOptions
from .search import Problem
from .tables import CostTables, EdgeUse

# what a tensor the step holds in host memory is given as (JAX's host memory space)
HOST_MEMORY_KIND = "pinned_host"


@dataclasses.dataclass(frozen=True)
class ArgLayout:
    """How the step's flat arrays map back to its argument and result pytrees."""

    arg_treedef: Any
    arg_is_array: tuple[bool, ...]  # per argument leaf: an array (planned) or static
    out_tree: Any


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
    """The plan of one train-step signature: layouts, predicted cost and collectives.

    ``optimal`` is True only when the plan's reported cost (``cost``, under the planning
    objective) equals the exact minimum of a lower bound of every plan's reported cost
    (``lower_bound``), i.e. no plan in the configuration space costs less.
    """

    strategy: str
    options: PlannerOptions
    program: Program
    arg_layout: ArgLayout
    mesh: Any  # jax Mesh or AbstractMesh (what NamedSharding takes)
    mesh_axes: MeshAxes
    params: CostParams  # the cost model's parameters (mesh links, device rates, objective)
    cluster: Cluster
    platform: str  # "cpu", "gpu", "tpu", or "abstract"
    ng: NodeGraph
    batch: tuple[set[int], ...]  # per node, iteration dims carrying the batch
    labels: tuple[str, ...]  # per node, its layer
    tables: CostTables
    speeds: MeshSpeeds | None
    assignment: tuple[int, ...]  # per node, its configuration index
    evaluation: Evaluation
    optimal: bool
    lower_bound: float | None
    choice: Choice  # the search stage's result (runs, baselines)
    stats: Mapping[str, Any]  # stage times, graph sizes, search statistics
    tensor_specs: Mapping[int, Spec]  # layout of every tensor the plan produces
    invar_specs: tuple[Spec, ...]  # per flat array argument
    outvar_specs: tuple[Spec, ...]  # per flat result
    feedback: Mapping[int, int]  # state result tensor -> argument tensor it becomes
    memory: MemoryEstimate  # predicted bytes per device, with the budget it was planned for
    memory_model: MemoryModel  # prices the memory of other assignments (variants)

    # ---- what it costs ---------------------------------------------------------------------

    @property
    def cost(self) -> PlanCost:
        return self.evaluation.cost

    @property
    def collectives(self) -> tuple[Collective, ...]:
        return self.evaluation.collectives

    @property
    def objective(self) -> str:
        return self.options.objective

    @property
    def baselines(self) -> dict[str, PlanCost]:
        return {s: ev.cost for s, (_, ev) in self.choice.baselines.items()}

    @property
    def searches(self) -> dict[str, SearchRun]:
        """Each search that ran (elimination, k-cut), with its own plan's evaluation."""
        return dict(self.choice.runs)

    @property
    def configs(self) -> tuple[list[Config], ...]:
        return self.tables.configs

    @property
    def problem(self) -> Problem:
        return self.tables.problem

    @property
    def uses(self) -> tuple[EdgeUse, ...]:
        return self.tables.uses

    def config(self, node_index: int) -> Config:
        """The configuration the plan gives a node."""
        return self.tables.configs[node_index][self.assignment[node_index]]

    def eval_context(self) -> EvalContext:
        """What `evaluate.evaluate` needs to price another assignment of this plan's tables."""
        combiner = combiner_for(self.platform, self.cluster.device.name)
        return EvalContext(
            self.ng, self.tables, self.params, self.batch, self.labels,
            frozenset(self.feedback), self.speeds, combiner,
            self.options.overlapped_regions(self.program),
        )  # fmt: skip

    # ---- shardings -------------------------------------------------------------------------

    def partition_spec(self, spec: Spec) -> PartitionSpec:
        names = self.mesh_axes.names
        entries = []
        for axes in spec:
            if not axes:
                entries.append(None)
            elif len(axes) == 1:
                entries.append(names[axes[0]])
            else:
                entries.append(tuple(names[a] for a in axes))
        while entries and entries[-1] is None:
            entries.pop()
        return PartitionSpec(*entries)

    def named(self, spec: Spec, memory_kind: str | None = None) -> NamedSharding:
        return NamedSharding(self.mesh, self.partition_spec(spec), memory_kind=memory_kind)

    def flat_shardings(self, tids: Sequence[int | None], specs: Sequence[Spec]) -> list:
        """NamedShardings of flat arguments or results: each tensor's layout, in the host's
        pinned memory where the step holds it there (an offloaded optimizer state)."""
        tensors = self.program.tensors
        return [
            self.named(spec, HOST_MEMORY_KIND if t is not None and tensors[t].host else None)
            for t, spec in zip(tids, specs, strict=True)
        ]

    @property
    def in_shardings(self) -> Any:
        """Pytree (like the arguments) of NamedSharding; None at static leaves."""
        it = iter(self.flat_shardings(self.program.invars, self.invar_specs))
        leaves = [next(it) if arr else None for arr in self.arg_layout.arg_is_array]
        return tree_util.tree_unflatten(self.arg_layout.arg_treedef, leaves)

    @property
    def out_shardings(self) -> Any:
        """Pytree (like the results) of NamedSharding."""
        return tree_util.tree_unflatten(
            self.arg_layout.out_tree, self.flat_shardings(self.program.outvars, self.outvar_specs)
        )

    def variant(self, strategy: str) -> Plan:
        """The plan of a baseline on the same trace and cost tables (no re-planning)."""
        if strategy == self.strategy:
            return self
        if strategy not in self.choice.baselines:
            raise ValueError(
                f"no {strategy!r} variant: this plan holds {self.strategy!r} and the baselines "
                f"{sorted(self.choice.baselines)}; plan with strategy={strategy!r} instead"
            )
        assignment, evaluation = self.choice.baselines[strategy]
        choice = dataclasses.replace(
            self.choice, strategy=strategy, assignment=assignment, evaluation=evaluation,
            optimal=False, runs={}, fell_back_to=None,
        )  # fmt: skip
        stats = {k: v for k, v in self.stats.items() if k in SHARED_STATS}
        stats["objective"] = evaluation.objective
        return with_assignment(self, choice, stats)

    # ---- reports (see `report`) -----------------------------------------------------------

    def report(self) -> str:
        """Per layer: configuration, layout, t_C / t_X / t_S, bytes; totals; baselines."""
        return report.plan_report(self)

    def comparison(self) -> str:
        """Predicted step time and communication beside the baselines (and both searches)."""
        return report.comparison(self)

    def layer_rows(self) -> list[dict]:
        return report.layer_rows(self)

    def phase_rows(self) -> list[dict]:
        return report.phase_rows(self)

    def heterogeneity_report(self) -> str:
        return report.heterogeneity_report(self)

    def paper_notation(self, node_index: int, cfg: Config) -> str:
        return report.paper_notation(self, node_index, cfg)

    def as_dict(self) -> dict[str, Any]:
        return report.plan_dict(self)

    def to_json(self) -> str:
        return report.plan_json(self)

    # ---- plans as artifacts (see `plan_file`) ---------------------------------------------

    def save(self, path: Any) -> None:
        """Write the plan as a plan file (versioned JSON); ``jaxpar.load_plan`` reads it and
        ``auto_shard(fn, mesh=mesh, plan=...)`` applies it without planning again."""
        from . import plan_file

        plan_file.save(self, path)

    def partition_specs(self) -> Any:
        """Pytree (like the arguments) of PartitionSpec; None at static leaves."""
        from . import plan_export

        return plan_export.partition_specs(self)

    def export_specs(self) -> Any:
        """Argument and result PartitionSpec pytrees, a path -> spec listing, and logical-axis
        rules where expressible (`plan_export.ExportedSpecs`): to run the plan without jaxpar."""
        from . import plan_export

        return plan_export.export_specs(self)

    def __repr__(self) -> str:
        c = self.cost
        return (
            f"Plan(strategy={self.strategy!r}, step_s={c.step_s:.3e}, "
            f"comm_bytes={c.comm_bytes:.3e}, optimal={self.optimal})"
        )


# stats that describe the trace and tables, shared by every variant of a plan
SHARED_STATS = (
    "trace_s", "graph_s", "cost_s", "search_s", "equations", "nodes", "free_nodes", "edges",
    "max_configs",
)  # fmt: skip


def with_assignment(plan: Plan, choice: Choice, stats: Mapping[str, Any]) -> Plan:
    """``plan`` with another assignment: its layouts, evaluation and stats."""
    tensor_specs, invar_specs, outvar_specs = layouts(
        plan.program, plan.ng, plan.tables.configs, choice.assignment, plan.feedback
    )
    memory = plan.memory_model.estimate(choice.assignment, plan.memory.budget)
    return dataclasses.replace(
        plan, strategy=choice.strategy, assignment=choice.assignment,
        evaluation=choice.evaluation, optimal=choice.optimal, choice=choice, stats=dict(stats),
        tensor_specs=tensor_specs, invar_specs=invar_specs, outvar_specs=outvar_specs,
        memory=memory,
    )  # fmt: skip


def layouts(program: Program, ng: NodeGraph, configs, assignment, feedback: Mapping[int, int]):
    """(every tensor's layout, each flat argument's, each flat result's) under an assignment.

    A state result takes the layout of the argument it becomes (the next call's input).
    """
    tensor_specs: dict[int, Spec] = {}
    for node in ng.nodes:
        cfg = configs[node.index][assignment[node.index]]
        for t, m in node.tensor_maps.items():
            tensor_specs[t] = spec_of(m, cfg)
    invar_specs = tuple(tensor_specs.get(t, ()) for t in program.invars)
    outvar_specs = []
    for t in program.outvars:
        if t is None:
            outvar_specs.append(())
        elif t in feedback:
            outvar_specs.append(tensor_specs[feedback[t]])
        else:
            outvar_specs.append(tensor_specs.get(t, ()))
    return tensor_specs, invar_specs, tuple(outvar_specs)
