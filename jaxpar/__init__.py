"""jaxpar: a sharding planner for JAX train steps.

Pipeline (one module per stage)::

    trace      user fn + example args            -> Program (flat jaxpr, calls inlined)
    graph      Program                           -> tensors, consumers, phases, layer labels
    rules      primitive                         -> iteration space (einsum-like dim maps)
    merge      Program + rules                   -> planning nodes (ops + elementwise followers)
    cost       Cluster + nodes                   -> t_C / t_S per config, t_X per edge (α-β)
    search     tables                            -> elimination DP (exact) or decomposition
    plan       search result                     -> Plan: shardings, cost, collectives, report
    apply      Plan                              -> jitted step with sharding constraints
    verify     compiled HLO                      -> collectives XLA actually emitted

`graph`, `rules`, `merge`, `cost`, `search` and `cluster` are pure (numpy/networkx).
"""

from .apply import AutoSharded, auto_shard, make_mesh, plan
from .cluster import Cluster, DeviceGroup, DeviceSpec, LinkLevel
from .plan import Collective, Plan, PlanCost, PlannerOptions
from .trace import TraceError

__all__ = [
    "AutoSharded",
    "Cluster",
    "Collective",
    "DeviceGroup",
    "DeviceSpec",
    "LinkLevel",
    "Plan",
    "PlanCost",
    "PlannerOptions",
    "TraceError",
    "auto_shard",
    "make_mesh",
    "plan",
]

__version__ = "0.1.0"
