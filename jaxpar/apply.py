"""Apply a plan: re-emit the step with sharding constraints, jit it, cache per signature.

The interpreter walks the flat program. Before an equation it reshards each operand to the layout
the plan's configuration reads, one `with_sharding_constraint` per step of the modeled reshard
path (so XLA runs the collectives the cost model priced, and nothing cleverer or worse); after it,
each result is constrained to the planned layout. Reshards are cached per (tensor, layout): a
layout is produced once however many equations read it, as the cost report counts it.
Parameters and optimizer state are pinned by in/out shardings, so gradients really are reduced.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import numpy as np
from jax import tree_util
from jax.sharding import AxisType, Mesh, NamedSharding

from .cluster import Cluster
from .cost import Spec, reshard_path, spec_of
from .plan import Plan, PlannerOptions, Progress, make_plan
from .trace import Signature, is_array_leaf, split_args


def make_mesh(axes: dict[str, int], devices: Any = None) -> Mesh:
    """A mesh with `AxisType.Auto` axes (what sharding-constraint propagation wants).

    ``axes``: ordered {name: size}; ``devices``: defaults to ``jax.devices()``.
    """
    if not isinstance(axes, dict) or not axes:
        raise ValueError(
            "make_mesh takes a non-empty dict of axis sizes, e.g. {'data': 2, 'model': 4}"
        )
    devices = list(jax.devices() if devices is None else devices)
    need = int(np.prod(list(axes.values())))
    if need > len(devices):
        raise ValueError(
            f"mesh {axes} needs {need} devices but only {len(devices)} are available; on CPU set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={need} (or "
            f"jax.config.update('jax_num_cpu_devices', {need})) before jax initializes"
        )
    arr = np.array(devices[:need], dtype=object).reshape(tuple(axes.values()))
    return Mesh(arr, tuple(axes), axis_types=(AxisType.Auto,) * len(axes))


def resolve_cluster(cluster: Any, mesh: Any) -> Cluster:
    """A Cluster from a Cluster, a preset name, or None (detected from the mesh's devices)."""
    if isinstance(cluster, Cluster):
        return cluster
    if isinstance(cluster, str):
        n = int(np.prod(mesh.devices.shape)) if isinstance(mesh, Mesh) else None
        if cluster == "cpu":
            return Cluster.preset("cpu", devices=n or _abstract_size(mesh))
        return Cluster.preset(cluster, devices=n) if n else _preset_for(cluster, mesh)
    if cluster is None:
        if isinstance(mesh, Mesh):
            devs = mesh.devices.reshape(-1)
            return Cluster.from_device_kind(
                devs[0].platform, devs[0].device_kind, len(devs), devices_per_node=len(devs)
            )
        return Cluster.preset("cpu", devices=_abstract_size(mesh))
    raise TypeError(
        f"cluster must be a Cluster, a preset name or None, not {type(cluster).__name__}"
    )


def _abstract_size(mesh: Any) -> int:
    if isinstance(mesh, dict):
        return int(np.prod(list(mesh.values()))) if mesh else 1
    return int(np.prod(mesh.axis_sizes))


def _preset_for(name: str, mesh: Any) -> Cluster:
    """The smallest whole number of nodes of preset ``name`` that holds the mesh."""
    need = _abstract_size(mesh)
    one = Cluster.preset(name)
    nodes = max(1, -(-need // one.num_devices))
    return Cluster.preset(name, nodes=nodes)


def run_program(plan: Plan, flat_args: list[Any]) -> list[Any]:
    """Evaluate the flat program with the plan's sharding constraints (traced under jit)."""
    program = plan.program
    mesh_sizes = plan.mesh_axes.sizes
    env: dict[int, Any] = {}
    layouts: dict[tuple[int, Spec], Any] = {}

    def constrain(value: Any, spec: Spec) -> Any:
        return jax.lax.with_sharding_constraint(value, plan.named(spec))

    def plain(tid: int) -> bool:
        t = program.tensors[tid]
        return t.opaque or not t.shape

    def read(tid: int, spec: Spec) -> Any:
        if plain(tid) or not spec:
            return env[tid]
        have = plan.tensor_specs.get(tid)
        if have is None or (tid, spec) in layouts:
            return layouts.get((tid, spec), env[tid])
        value = layouts.get((tid, have), env[tid])
        for step in reshard_path(program.tensors[tid].nbytes, have, spec, mesh_sizes):
            key = (tid, step.after)
            if key not in layouts:
                layouts[key] = constrain(value, step.after)
            value = layouts[key]
        return value

    for tid, value in program.consts.items():
        env[tid] = value
    for tid, value in zip(program.invars, flat_args, strict=True):
        env[tid] = value
        if not plain(tid):
            layouts[(tid, plan.tensor_specs[tid])] = value
    member_of = {m.eqn: m for node in plan.ng.nodes for m in node.members if m.eqn >= 0}
    node_of = plan.ng.node_of_eqn
    for eqn in program.eqns:
        m = member_of[eqn.index]
        cfg = plan.configs[node_of[eqn.index]][plan.assignment[node_of[eqn.index]]]
        invals = []
        for tid, lit, mp in zip(eqn.inputs, eqn.literals, m.in_maps, strict=True):
            if tid is None:
                invals.append(lit)
            else:
                invals.append(read(tid, spec_of(mp, cfg)))
        if eqn.primitive == "sharding_constraint":  # the plan's layouts replace user constraints
            outs = [invals[0]]
        else:
            outs = eqn.bind.bind(*invals, **eqn.bind.get_bind_params(eqn.params))
            if not eqn.bind.multiple_results:
                outs = [outs]
        for tid, value in zip(eqn.outputs, outs, strict=True):
            if not plain(tid):
                value = constrain(value, plan.tensor_specs[tid])
                layouts[(tid, plan.tensor_specs[tid])] = value
            env[tid] = value
    results = []
    for tid, lit, spec in zip(
        program.outvars, program.out_literals, plan.outvar_specs, strict=True
    ):
        results.append(lit if tid is None else read(tid, spec))
    return results


@dataclasses.dataclass
class _Compiled:
    plan: Plan
    jitted: Any
    rebuild_out: Any
    in_shardings: list[NamedSharding]  # per flat argument; built once, read on every call


class AutoSharded:
    """A train step planned and sharded per input signature. See `auto_shard`."""

    def __init__(self, fn, mesh, cluster, options: PlannerOptions, donate_argnums, in_specs):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.mesh = mesh
        self.cluster = cluster
        self.options = options
        self.donate_argnums = tuple(donate_argnums)
        self.in_specs = in_specs
        self._cache: dict[Signature, _Compiled] = {}
        self._last: _Compiled | None = None

    @property
    def plan(self) -> Plan:
        """The plan of the last signature called or lowered."""
        if self._last is None:
            raise RuntimeError("no plan yet: call the function (or .lower) with arguments first")
        return self._last.plan

    def _mesh(self) -> Mesh:
        if self.mesh is None:
            self.mesh = make_mesh({"data": len(jax.devices())})
        return self.mesh

    def _compiled(self, args: tuple) -> _Compiled:
        sig = Signature.of(args)
        if sig in self._cache:
            self._last = self._cache[sig]
            return self._last
        mesh = self._mesh()
        cluster = resolve_cluster(self.cluster, mesh)
        platform = mesh.devices.reshape(-1)[0].platform
        plan = make_plan(self.fn, args, mesh, cluster, self.options, self.in_specs, platform)
        in_sh = [plan.named(s) for s in plan.invar_specs]
        out_sh = [plan.named(s) for s in plan.outvar_specs]
        flat_donate = self._flat_donate(args)
        jitted = jax.jit(
            lambda *flat: run_program(plan, list(flat)),
            in_shardings=in_sh,
            out_shardings=out_sh,
            donate_argnums=flat_donate,
        )
        compiled = _Compiled(plan, jitted, plan.out_tree, in_sh)
        self._cache[sig] = compiled
        self._last = compiled
        return compiled

    def _flat_donate(self, args: tuple) -> tuple[int, ...]:
        if not self.donate_argnums:
            return ()
        out, pos = [], 0
        for i, a in enumerate(args):
            n = sum(
                1 for x in tree_util.tree_leaves(a, is_leaf=lambda x: x is None) if is_array_leaf(x)
            )
            if i in self.donate_argnums:
                out.extend(range(pos, pos + n))
            pos += n
        return tuple(out)

    def _flat_inputs(self, args: tuple, compiled: _Compiled) -> list[Any]:
        arrays, paths, _ = split_args(args)
        for a, p in zip(arrays, paths, strict=True):
            if isinstance(a, jax.Array) and a.is_deleted():
                raise ValueError(
                    f"argument {p} of {getattr(self.fn, '__name__', 'the step')} was donated to an "
                    "earlier call (donate_argnums) and its buffer is gone; pass the new value that "
                    "call returned instead of reusing the old one"
                )
            if isinstance(a, jax.ShapeDtypeStruct):
                raise TypeError(
                    f"argument {p} is a ShapeDtypeStruct; calling needs real arrays "
                    "(use jaxpar.plan or .lower for abstract arguments)"
                )
        out = []
        for a, s in zip(arrays, compiled.in_shardings, strict=True):
            if (
                isinstance(a, jax.Array)
                and a.sharding != s
                and not a.sharding.is_equivalent_to(s, a.ndim)
            ):
                a = jax.device_put(a, s)
            out.append(a)
        return out

    def __call__(self, *args: Any) -> Any:
        compiled = self._compiled(args)
        flat = self._flat_inputs(args, compiled)
        outs = compiled.jitted(*flat)
        return tree_util.tree_unflatten(compiled.rebuild_out, list(outs))

    def lower(self, *args: Any) -> jax.stages.Lowered:
        """Like ``jax.jit(fn).lower(*args)``: plan (or reuse the plan) and lower, no execution."""
        compiled = self._compiled(args)
        arrays, _, _ = split_args(args)
        abstract = [
            jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
            for a, s in zip(arrays, compiled.in_shardings, strict=True)
        ]
        return compiled.jitted.lower(*abstract)


def auto_shard(
    fn: Any = None,
    *,
    mesh: Mesh | None = None,
    cluster: Any = None,
    strategy: str = "auto",
    objective: str = "time",
    search: str = "elimination",
    donate_argnums: tuple[int, ...] | int = (),
    in_specs: Any = None,
    options: PlannerOptions | None = None,
) -> Any:
    """Decorate a train step: plan it per input signature and run it sharded on ``mesh``.

    Usable bare (``@jaxpar.auto_shard``: a 1-D "data" mesh over all devices, cluster detected) or
    with arguments. ``in_specs``: optional pytree prefix of PartitionSpecs pinning argument
    layouts (None leaves free). ``search``: "elimination" (joint, default) or "kcut" (SoyBean's
    one cut per mesh axis, slowest interconnect first); see `PlannerOptions`.
    """
    if isinstance(donate_argnums, int):
        donate_argnums = (donate_argnums,)
    opts = options or PlannerOptions(strategy=strategy, objective=objective, search=search)
    if options is not None and (strategy != "auto" or objective != "time"):
        opts = dataclasses.replace(options, strategy=strategy, objective=objective)
    if options is not None and search != "elimination":
        opts = dataclasses.replace(opts, search=search)

    def wrap(f: Any) -> AutoSharded:
        return AutoSharded(f, mesh, cluster, opts, donate_argnums, in_specs)

    return wrap(fn) if fn is not None else wrap


def plan(
    fn: Any,
    *args: Any,
    mesh: Any,
    cluster: Any = None,
    strategy: str = "auto",
    objective: str = "time",
    search: str = "elimination",
    in_specs: Any = None,
    options: PlannerOptions | None = None,
    progress: Progress | None = None,
) -> Plan:
    """Plan ``fn(*args)`` without running it. Arguments may be arrays or ShapeDtypeStructs; the
    mesh may be a dict ``{"node": 4, "gpu": 4}`` (no devices needed) or a jax Mesh.
    ``progress(stage, detail)``, if given, is called as each planning stage finishes.
    ``search``: "elimination" (joint, default) or "kcut" (SoyBean); see `PlannerOptions`."""
    opts = options or PlannerOptions(strategy=strategy, objective=objective, search=search)
    if options is not None and (strategy != "auto" or objective != "time"):
        opts = dataclasses.replace(options, strategy=strategy, objective=objective)
    if options is not None and search != "elimination":
        opts = dataclasses.replace(opts, search=search)
    cl = resolve_cluster(cluster, mesh)
    platform = mesh.devices.reshape(-1)[0].platform if isinstance(mesh, Mesh) else "abstract"
    return make_plan(fn, args, mesh, cl, opts, in_specs, platform, progress)
