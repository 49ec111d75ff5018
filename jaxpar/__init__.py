"""jaxpar: a sharding planner for JAX train steps.

The packages are the pipeline, each importing only the ones below it (docs/architecture.md,
enforced by tests/test_layering.py)::

    cli       the commands: plan, clusters, calibrate, demo, solve
    runtime   auto_shard and the applier, multi-process runs, measuring devices
    planner   the pipeline driver, Plan, reports, figures, plan files, export, reuse
    search    the searches run and certified, baselines, the memory budget, options
    memory    liveness, buffer reads, the estimate, bytes held
    cost      node costs, kernels, reshard tables, the search problems, the evaluation
    xla       models of XLA's passes: fusion, buffer assignment, combiner, reshard paths
    nodes     planning nodes, configurations, layer labels, repeated blocks
    trace     (jax) the step traced to a Program; the user's mesh described
    rules     the rule of each primitive: its iteration space
    verify    the compiled program's collectives and memory
    solver    pure combinatorial optimization (imports nothing else of jaxpar)
    program   the traced program's graph and jaxpr helpers
    hardware  clusters, presets, datasheets, calibration data, collective prices

Only `trace`, `planner`, `runtime` and `cli` import jax; the rest is the pure core. The public
API is `__all__` below; each name is imported on first use, so importing a pure package
imports no jax.
"""

import importlib
from typing import Any

from ._version import __version__ as __version__

# Public name -> the module that defines it (imported on first use, so that importing a pure
# package such as `jaxpar.solver` does not import jax).
_HOMES = {
    "AutoSharded": "runtime.auto_shard",
    "Calibration": "hardware.calibration",
    "Cluster": "hardware.cluster",
    "Collective": "cost.evaluation",
    "DeviceGroup": "hardware.devices",
    "DeviceSpec": "hardware.devices",
    "LinkLevel": "hardware.devices",
    "MemoryBudgetError": "memory.estimate",
    "MemoryEstimate": "memory.estimate",
    "MultiHostMismatch": "runtime.distributed",
    "Plan": "planner.plan",
    "PlanCost": "cost.evaluation",
    "PlanFile": "planner.plan_file",
    "PlanFileError": "planner.plan_file",
    "PlannerOptions": "search.options",
    "SearchBudget": "solver.problem",
    "TraceError": "trace.tracing",
    "auto_shard": "runtime.auto_shard",
    "calibrate": "runtime.calibrate",
    "detect_cluster": "trace.meshes",
    "distributed": "runtime.distributed",
    "global_batch": "runtime.distributed",
    "load_calibration": "hardware.calibration",
    "load_plan": "planner.plan_file",
    "make_hardware_mesh": "trace.meshes",
    "make_mesh": "trace.meshes",
    "measure_contractions": "runtime.measure_contractions",
    "plan": "planner.pipeline",
    "verify": "verify",
}
_MODULES = {"distributed", "verify"}  # public names that are modules

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use (PEP 562)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'jaxpar' has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}.{home}")
    value = module if name in _MODULES else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
