"""The planner's result: a `Plan` (frozen), what it costs, and how to read its shardings.

Reports (tables, comparison, JSON) are in `report`; `Plan`'s report methods call them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from jax import tree_util
from jax.sharding import NamedSharding, PartitionSpec

from ..cost.evaluation import Collective, EvalContext, PlanCost
from ..cost.search_tables import CostTables, EdgeUse
from ..memory.estimate import MemoryEstimate
from ..memory.model import MemoryModel
from ..nodes.configs import Config, Spec, spec_of
from ..nodes.planning_nodes import NodeGraph
from ..program.graph import Program
from ..search.candidates import Choice, SearchRun
from ..search.options import PlannerOptions
from ..solver.problem import Problem
from . import export, plan_file, report
from .stages import Analysis, Target, Traced
from .user_constraints import HintOutcome, constraint_rows

# what a tensor the step holds in host memory is given as (JAX's host memory space)
HOST_MEMORY_KIND = "pinned_host"


@dataclasses.dataclass(frozen=True)
class Layouts:
    """The layouts an assignment gives: every tensor's, each flat argument's and result's."""

    tensors: Mapping[int, Spec]  # layout of every tensor the plan produces
    invars: tuple[Spec, ...]  # per flat array argument
    outvars: tuple[Spec, ...]  # per flat result


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
    """The plan of one train-step signature: the stages' results it was made from, the chosen
    assignment (``choice``), its layouts and predicted memory. Each fact is held once; the
    properties below read them.

    ``optimal`` is True only when the plan's reported cost (``cost``, under the planning
    objective) equals the exact minimum of a lower bound of every plan's reported cost
    (``lower_bound``), i.e. no plan in the configuration space costs less.
    """

    options: PlannerOptions
    traced: Traced  # the program and how its pytrees flatten
    target: Target  # the mesh, the cluster and the cost model's parameters
    analysis: Analysis  # planning nodes, batch dims, layers, state feedback
    tables: CostTables
    choice: Choice  # the search stage's result: assignment, evaluation, certificate, baselines
    stats: Mapping[str, Any]  # stage times, graph sizes, search statistics
    layouts: Layouts  # of the chosen assignment
    memory: MemoryEstimate  # predicted bytes per device, with the budget it was planned for
    memory_model: MemoryModel  # prices the memory of other assignments (variants)
    # user_constraints="hint": the plan keeping every user constraint beside the search's own
    hint: HintOutcome | None = None

    # ---- the stages' facts -----------------------------------------------------------------

    program = property(lambda self: self.traced.program)
    arg_layout = property(lambda self: self.traced.arg_layout)
    mesh = property(lambda self: self.target.mesh.mesh)  # jax Mesh or AbstractMesh
    params = property(lambda self: self.target.params)  # mesh links, device rates, objective
    mesh_axes = property(lambda self: self.target.params.mesh)  # the planning mesh: axes > 1
    cluster = property(lambda self: self.target.cluster)
    platform = property(lambda self: self.target.mesh.platform)  # cpu/gpu/tpu/abstract
    speeds = property(lambda self: self.target.speeds)
    ng = property(lambda self: self.analysis.ng)
    batch = property(lambda self: self.analysis.batch)  # per node, dims carrying the batch
    labels = property(lambda self: self.analysis.labels)  # per node, its layer
    strategy = property(lambda self: self.choice.strategy)
    assignment = property(lambda self: self.choice.assignment)  # per node, config index
    evaluation = property(lambda self: self.choice.evaluation)
    optimal = property(lambda self: self.choice.optimal)
    lower_bound = property(lambda self: self.choice.lower_bound)
    tensor_specs = property(lambda self: self.layouts.tensors)
    invar_specs = property(lambda self: self.layouts.invars)
    outvar_specs = property(lambda self: self.layouts.outvars)

    @property
    def mesh_shape(self) -> dict[str, int]:
        """The user's mesh, {axis name: size} in mesh order, its size-1 axes included (the
        planner plans on the others: `mesh_axes`)."""
        return dict(zip(self.target.mesh.names, self.target.mesh.sizes, strict=True))

    @property
    def feedback(self) -> dict[int, int]:
        """State result tensor -> the argument tensor it becomes."""
        return dict(self.analysis.feedback)

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
        return eval_context(self.analysis, self.target, self.tables, self.options, self.program)

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

    def user_constraints(self) -> list[dict[str, Any]]:
        """The step's own sharding constraints, one row each: where, the layout asked, the one
        planned, kept or not (`user_constraints.constraint_rows`)."""
        return constraint_rows(self)

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
        plan_file.save(self, path)

    def partition_specs(self) -> Any:
        """Pytree (like the arguments) of PartitionSpec; None at static leaves."""
        return export.partition_specs(self)

    def export_specs(self) -> Any:
        """Argument and result PartitionSpec pytrees, a path -> spec listing, and logical-axis
        rules in MaxText's format, with the model's own logical names where it has them, for
        every name the plan splits one way (`export.ExportedSpecs`): to run the plan without
        jaxpar."""
        return export.export_specs(self)

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
    return dataclasses.replace(
        plan, choice=choice, stats=dict(stats),
        layouts=layouts(
            plan.program, plan.ng, plan.tables.configs, choice.assignment, plan.feedback
        ),
        memory=plan.memory_model.estimate(choice.assignment, plan.memory.budget),
    )  # fmt: skip


def eval_context(
    analysis: Analysis, target: Target, tables: CostTables, options: PlannerOptions,
    program: Program,
) -> EvalContext:  # fmt: skip
    """What `evaluation.evaluate` needs to price any assignment of ``tables``."""
    return EvalContext(
        analysis.ng, tables, target.params, analysis.batch, analysis.labels,
        frozenset(t for t, _ in analysis.feedback), target.speeds, target.combiner,
        options.overlapped_regions(program),
    )  # fmt: skip


def layouts(
    program: Program, ng: NodeGraph, configs, assignment, feedback: Mapping[int, int]
) -> Layouts:
    """Every tensor's, each flat argument's and each flat result's layout under an assignment.

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
    return Layouts(tensor_specs, invar_specs, tuple(outvar_specs))
