"""How to plan: the user's choices, validated once."""

from __future__ import annotations

import dataclasses

from ..cost.node_costs import OBJECTIVES
from ..memory.estimate import parse_bytes
from ..program.graph import Program
from ..solver.problem import SearchBudget
from .baselines import STRATEGIES

SEARCHES = ("elimination", "kcut")  # joint elimination (OptCNN) / one DP per mesh axis (SoyBean)
# what the plan does with the step's own sharding constraints (`PlannerOptions.user_constraints`)
USER_CONSTRAINTS = ("hint", "pin")
# The step as XLA runs it: gradient syncs and prefetched gathers behind compute (docs/cost.md,
# "Overlapped step"). "time" (OptCNN Eq. 1) stays for the paper benchmarks and its certificate.
DEFAULT_OBJECTIVE = "overlap"
# XLA:GPU's collective pipeliner, on (`PlannerOptions.pipelined_loops`); off by default in XLA
PIPELINER_FLAGS = (
    "--xla_gpu_enable_pipelined_all_gather=true",
    "--xla_gpu_enable_pipelined_all_reduce=true",
    "--xla_gpu_enable_pipelined_reduce_scatter=true",
)


@dataclasses.dataclass(frozen=True)
class PlannerOptions:
    """How to plan.

    - ``strategy``: "auto" (the search), "hypar" (the search over HyPar's Type-I/II space), or a
      fixed baseline "data", "model", "owt".
    - ``objective``: "overlap" (default: the step with communication on its own stream,
      `overlap`): the searches minimize Eq. 1, its certified upper bound, and Eq. 1 with
      gradient syncs combined as XLA combines them; the plan is the candidate (each search's
      plans, their bounds' minimizers, the baselines) with the shortest overlapped step, and
      ``optimal`` compares it with `choose.overlap_lower_bound`. "time": OptCNN Eq. 1, exact
      (the search's certificate speaks about it). "comm": SoyBean's bytes moved.
    - ``search``: "elimination" (joint DP over all mesh axes, OptCNN Alg. 1) or "kcut"
      (SoyBean's k-cut: one exact DP per mesh axis, slowest link first). The other search runs
      too on the same tables, and `Plan.comparison()` shows both, unless ``compare_searches``
      is False.
    - ``batch_argnums``: the arguments whose leaves carry the batch on dim 0; None: every
      argument but the first (the state), or the only argument.
    - ``budget``: how hard the search may work (`SearchBudget`).
    - ``memory_budget``: bytes per device the plan must fit (`budget.fit_budget`): "device"
      (default) for the smallest device's memory less `memory_estimate.RESERVE_FRACTION`, a
      number of bytes, a size such as "60GB", or None for no limit (memory is still
      predicted). A plan fits when its predicted peak is within the budget less
      `memory_estimate.MODEL_MARGIN`.
    - ``donate_argnums``: the arguments whose buffers the step donates (their results reuse
      them); None: the state, i.e. every argument that is not a batch argument.
    - ``share_blocks``: give structurally identical layers the same configurations and search
      one representative (`blocks.find_repeats`): a restriction of the space, which the
      certificate then speaks about. None (default): when the repeated layers hold at least
      `blocks.MIN_TIED_NODES` nodes (large steps, where search time matters; a small stack may
      gain from alternating layouts); True: whenever layers repeat; False: never.
    - ``pipelined_loops``: the target compiles with XLA:GPU's collective pipeliner
      (`PIPELINER_FLAGS` in ``XLA_FLAGS``, as MaxText sets them; off by default in XLA): a scan's
      all-gathers of its stacked inputs' slices run an iteration ahead and its all-reduces of
      what it stacks an iteration behind, beside the next iteration's compute, and each
      prefetched gather holds one more buffer through the loop (docs/cost.md, "Pipelined
      loops"). False (default): a loop's collectives overlap only their own iteration.
    - ``user_constraints``: what the plan does with the step's own sharding constraints
      (``jax.lax.with_sharding_constraint``, Flax's ``nn.with_logical_constraint`` under
      ``nn.logical_axis_rules``). "hint" (default): the search runs twice, free and with every
      constraint pinned, and the plan is the faster of the two under the objective, the user's
      when they tie: never slower than the user's annotations, and `Plan.report` lists each
      constraint, kept or overridden, with both plans' step. "pin": every constrained tensor
      keeps the user's layout (its node's configurations are restricted, as ``in_specs``
      restricts an argument's), one search; an impossible constraint is an error.
    """

    strategy: str = "auto"
    objective: str = DEFAULT_OBJECTIVE
    search: str = "elimination"
    compare_searches: bool = True
    batch_argnums: tuple[int, ...] | None = None
    budget: SearchBudget = dataclasses.field(default_factory=SearchBudget)
    memory_budget: float | str | None = "device"
    donate_argnums: tuple[int, ...] | None = None
    share_blocks: bool | None = None
    pipelined_loops: bool = False
    user_constraints: str = "hint"

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy={self.strategy!r}; choose one of {STRATEGIES}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective={self.objective!r}; choose one of {OBJECTIVES}")
        if self.search not in SEARCHES:
            raise ValueError(
                f"search={self.search!r}; choose one of {SEARCHES} (joint elimination, or "
                "SoyBean's k-cut: one cut per mesh axis, slowest interconnect first)"
            )
        if self.user_constraints not in USER_CONSTRAINTS:
            raise ValueError(
                f"user_constraints={self.user_constraints!r}; choose 'hint' (the search may "
                "override the step's own sharding constraints when that is faster) or 'pin' "
                "(every constrained tensor keeps the layout the step asks for)"
            )
        if self.memory_budget not in (None, "device"):
            object.__setattr__(self, "memory_budget", parse_bytes(self.memory_budget))
        if not isinstance(self.budget, SearchBudget):
            raise TypeError(f"budget must be a SearchBudget, not {type(self.budget).__name__}")

    def searches(self) -> tuple[str, ...]:
        """The searches to run, k-cut first: its plan is one more start for block descent."""
        names = [self.search]
        if self.compare_searches:
            names += [s for s in SEARCHES if s != self.search]
        return tuple(sorted(names, key=lambda n: n != "kcut"))

    def pipelined_regions(self, program: Program) -> frozenset[int]:
        """The loops of ``program`` whose collectives XLA's collective pipeliner moves across
        iterations: every iterating scan when ``pipelined_loops``, else none."""
        return program.scan_loops() if self.pipelined_loops else frozenset()

    def overlapped_regions(self, program: Program) -> frozenset[int]:
        """The scans whose steps overlap one another's collectives: the pipelined loops
        (`pipelined_regions`) and, always, the scans XLA runs in line (`Program.inline_scans`:
        unrolled whole, or one loop iteration, which XLA inlines)."""
        return self.pipelined_regions(program) | program.inline_scans()

    def donated_args(self, num_args: int) -> tuple[int, ...]:
        """`donate_argnums`, defaulted: the arguments that are not batch arguments."""
        if self.donate_argnums is not None:
            return tuple(self.donate_argnums)
        batch = self.batch_args(num_args)
        return tuple(i for i in range(num_args) if i not in batch)

    def batch_args(self, num_args: int) -> tuple[int, ...]:
        """`batch_argnums`, defaulted for a call with ``num_args`` arguments."""
        if self.batch_argnums is not None:
            return tuple(self.batch_argnums)
        return tuple(range(1, num_args)) if num_args > 1 else (0,)
