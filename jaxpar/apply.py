"""Apply a plan: re-emit the step with sharding constraints, jit it, cache per signature.

The interpreter walks the flat program. Before an equation it reshards each operand to the layout
the plan's configuration reads, one `with_sharding_constraint` per step of the modeled reshard
path (so XLA runs the collectives the cost model priced, and nothing cleverer or worse); after it,
each result is constrained to the planned layout. Reshard steps are cached per (tensor, before,
after): a step is emitted once however many equations need it, as `evaluate` prices it.
Parameters and optimizer state are pinned by in/out shardings, so gradients really are reduced.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
from jax import tree_util
from jax.sharding import Mesh, NamedSharding

from .configs import Spec, spec_of
from .meshes import make_mesh
from .options import PlannerOptions
from .plan_file import as_plan_file
from .plan_reuse import bind, check_mesh
from .planner import make_plan, merge_options
from .reshard import reshard_path
from .result import Plan
from .trace import Signature, is_array_leaf, split_args


def run_program(plan: Plan, flat_args: list[Any]) -> list[Any]:
    """Evaluate the flat program with the plan's sharding constraints (traced under jit)."""
    program = plan.program
    mesh_sizes = plan.mesh_axes.sizes
    env: dict[int, Any] = {}
    produced: dict[tuple[int, Spec, Spec], Any] = {}  # (tensor, before, after) -> value

    def constrain(value: Any, spec: Spec) -> Any:
        return jax.lax.with_sharding_constraint(value, plan.named(spec))

    def plain(tid: int) -> bool:
        t = program.tensors[tid]
        return t.opaque or not t.shape or not t.nbytes

    def read(tid: int, spec: Spec) -> Any:
        if plain(tid) or not spec:
            return env[tid]
        have = plan.tensor_specs.get(tid)
        value = env[tid]
        if have is None:
            return value
        for step in reshard_path(program.tensors[tid].nbytes, have, spec, mesh_sizes):
            key = (tid, step.before, step.after)
            if key not in produced:
                produced[key] = constrain(value, step.after)
            value = produced[key]
        return value

    for tid, value in program.consts.items():
        env[tid] = value
    for tid, value in zip(program.invars, flat_args, strict=True):
        env[tid] = value
    member_of = {m.eqn: m for node in plan.ng.nodes for m in node.members if m.eqn >= 0}
    node_of = plan.ng.node_of_eqn
    for eqn in program.eqns:
        m = member_of[eqn.index]
        cfg = plan.config(node_of[eqn.index])
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

    def __init__(
        self, fn, mesh, cluster, options: PlannerOptions, donate_argnums, in_specs, plan=None
    ):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.mesh = mesh
        self.cluster = cluster
        self.options = options
        self.donate_argnums = tuple(donate_argnums)
        self.in_specs = in_specs
        self.given_plan = plan  # a PlanFile to apply (no planning), or None
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
        if self.given_plan is not None:
            plan = bind(self.given_plan, self.fn, args, self._mesh(), self.cluster)
        else:
            plan = make_plan(self.fn, args, self._mesh(), self.cluster, self.options, self.in_specs)
        from .distributed import check_plan  # mesh over several processes: all planned the same

        check_plan(plan, args)  # else raises MultiHostMismatch (a no-op on one process)
        in_sh = [plan.named(s) for s in plan.invar_specs]
        out_sh = [plan.named(s) for s in plan.outvar_specs]
        flat_donate = self._flat_donate(args)
        jitted = jax.jit(
            lambda *flat: run_program(plan, list(flat)),
            in_shardings=in_sh,
            out_shardings=out_sh,
            donate_argnums=flat_donate,
        )
        compiled = _Compiled(plan, jitted, plan.arg_layout.out_tree, in_sh)
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
    memory_budget: float | str | None = "device",
    options: PlannerOptions | None = None,
    plan: Any = None,
) -> Any:
    """Decorate a train step: plan it per input signature and run it sharded on ``mesh``.

    Usable bare (``@jaxpar.auto_shard``: a 1-D "data" mesh over all devices, cluster detected) or
    with arguments. ``in_specs``: optional pytree prefix of PartitionSpecs pinning argument
    layouts (None leaves free). ``search``: "elimination" (joint, default) or "kcut" (SoyBean's
    one cut per mesh axis, slowest interconnect first); see `PlannerOptions`.

    ``plan``: a `Plan`, a loaded plan file (`jaxpar.load_plan`) or a plan file's path: apply it
    instead of planning (`plan_reuse.bind`: re-trace, check, pin every node; nothing searched).
    A call whose arguments have another signature, or a mesh with other axis names or sizes,
    raises `PlanFileError` saying what differs; ``strategy``/``objective``/``search`` are then
    the plan's, and ``in_specs`` cannot be given.

    ``memory_budget``: bytes per device the plan must fit (see `jaxpar.plan`); the plan assumes
    the ``donate_argnums`` arguments are donated, as the jitted step does.
    """
    if isinstance(donate_argnums, int):
        donate_argnums = (donate_argnums,)
    if not isinstance(donate_argnums, (tuple, list)) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in donate_argnums
    ):
        raise TypeError(f"donate_argnums must be an int or a tuple of ints, not {donate_argnums!r}")
    if isinstance(mesh, dict):
        raise TypeError(
            f"auto_shard runs on devices: pass mesh=jaxpar.make_mesh({mesh!r}) (a dict mesh is "
            f"abstract; jaxpar.plan takes one)"
        )
    opts = merge_options(options, strategy, objective, search, memory_budget)
    opts = dataclasses.replace(opts, donate_argnums=tuple(donate_argnums))
    if plan is not None:
        if in_specs is not None:
            raise ValueError("give plan= or in_specs=, not both: a given plan fixes every layout")
        plan = as_plan_file(plan)  # a path is read and validated now
        if mesh is not None:
            check_mesh(plan, mesh)

    def wrap(f: Any) -> AutoSharded:
        if not callable(f):
            raise TypeError(
                f"auto_shard decorates a callable (the train step), got {type(f).__name__} {f!r}"
            )
        return AutoSharded(f, mesh, cluster, opts, donate_argnums, in_specs, plan)

    return wrap(fn) if fn is not None else wrap
