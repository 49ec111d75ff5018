"""jaxpar: a sharding planner for JAX train steps.

Pipeline (modules in pipeline order; docs/design.md walks through them)::

    trace    fn + example args  -> Program (flat jaxpr, calls inlined)   trace, graph
    rules    primitive          -> iteration space (einsum-like maps)    rules, body_dims
    nodes    Program + rules    -> planning nodes (ops + followers)      nodes, labels
    configs  node + mesh        -> configurations and layouts            configs
    cost     cluster + nodes    -> kernels, t_C, node collectives (α-β)  hardware, collectives,
                                                                       fusion, kernels, cost,
                                                                       contraction_calls
    tables   nodes + reads      -> the two search problems               reshard, tables
    search   tables             -> elimination / descent, k-cut          search, kcut, baselines
    choose   searches           -> the plan, certified against a bound   choose, evaluate
    memory   plan               -> peak bytes per device; fit a budget   buffers, buffer_reads,
                                                                             memory, budget,
                                                                             memory_estimate
    plan     assignment         -> Plan: layouts, cost, collectives      planner, result, pins
    save     Plan               -> JSON file; PartitionSpecs to export   plan_file, plan_export
    report   Plan               -> text, JSON, figures                   report, figures
    apply    Plan               -> jitted step with constraints          apply, meshes
    verify   compiled HLO       -> the collectives XLA emitted           verify

The pure core (`graph`, `opspace`, `rules`, `rules_contractions`, `rules_indexing`, `body_dims`,
`nodes`, `labels`, `configs`, `collectives`, `reshard`, `fusion`, `kernels`, `contraction_calls`,
`cost`, `tables`, `search`, `kcut`, `baselines`, `evaluate`, `verify`, `buffers`, `buffer_reads`,
`memory_estimate`, `memory`, `budget`, `hardware`) imports no jax.
"""

from . import distributed, verify
from .apply import AutoSharded, auto_shard
from .distributed import MultiHostMismatch, global_batch
from .evaluate import Collective, PlanCost
from .hardware import Cluster, DeviceGroup, DeviceSpec, LinkLevel
from .hardware.calibration import Calibration, load_calibration
from .measure import calibrate
from .measure_contractions import measure_contractions
from .memory_estimate import MemoryBudgetError, MemoryEstimate
from .meshes import detect_cluster, make_hardware_mesh, make_mesh
from .options import PlannerOptions
from .plan_file import PlanFile, PlanFileError, load_plan
from .planner import plan
from .result import Plan
from .search import SearchBudget
from .trace import TraceError

__all__ = [
    "AutoSharded",
    "Calibration",
    "Cluster",
    "Collective",
    "DeviceGroup",
    "DeviceSpec",
    "LinkLevel",
    "MemoryBudgetError",
    "MemoryEstimate",
    "MultiHostMismatch",
    "Plan",
    "PlanCost",
    "PlanFile",
    "PlanFileError",
    "PlannerOptions",
    "SearchBudget",
    "TraceError",
    "auto_shard",
    "calibrate",
    "detect_cluster",
    "distributed",
    "global_batch",
    "load_calibration",
    "load_plan",
    "make_hardware_mesh",
    "make_mesh",
    "measure_contractions",
    "plan",
    "verify",
]

__version__ = "0.3.0"
