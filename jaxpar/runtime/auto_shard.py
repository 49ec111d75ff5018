"""Apply a plan: re-emit the step with sharding constraints, jit it, cache per signature.

The interpreter walks the flat program. Before an equation it reshards each operand to the layout
the plan's configuration reads, one `with_sharding_constraint` per step of the modeled reshard
path (so XLA runs the collectives the cost model priced, and nothing cleverer or worse); after it,
each result is constrained to the planned layout. Reshard steps are cached per (tensor, before,
after): a step is emitted once however many equations need it, as `evaluate` prices it.
Parameters and optimizer state are pinned by in/out shardings, so gradients really are reduced.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import warnings
from collections.abc import Sequence
from typing import Any

import jax
from jax import tree_util
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ..nodes.configs import Spec, spec_of
from ..planner.pipeline import make_plan, merge_options
from ..planner.plan import Plan
from ..planner.reuse import as_plan_file, check_mesh
from ..program.graph import SCAN, Region
from ..search.options import DEFAULT_OBJECTIVE, PIPELINER_FLAGS, PlannerOptions
from ..trace.meshes import make_mesh, resolve_mesh
from ..trace.tracing import Signature, is_array_leaf, split_args
from ..xla.reshard_paths import reshard_path


class _Runner:
    """The interpreter of `run_program`: one environment (tensor id -> value) and one reshard
    cache ((tensor, before, after) -> value) per region body being traced."""

    def __init__(self, plan: Plan, mesh: Any = None):
        self.plan, self.program = plan, plan.program
        # the mesh the constraints name: the plan's, or inside `jax.sharding.auto_axes` (a mesh
        # with Explicit axes) the abstract mesh where those axes are Auto
        self.mesh = plan.mesh if mesh is None else mesh
        self.member_of = {m.eqn: m for node in plan.ng.nodes for m in node.members if m.eqn >= 0}
        self.starts: dict[int, list[Region]] = {}  # first equation -> the regions starting there
        for region in self.program.regions:
            self.starts.setdefault(region.first, []).append(region)

    def constrain(self, value: Any, spec: Spec) -> Any:
        sharding = NamedSharding(self.mesh, self.plan.partition_spec(spec))
        return jax.lax.with_sharding_constraint(value, sharding)

    def plain(self, tid: int) -> bool:
        """Whether ``tid`` goes unconstrained: opaque, scalar, empty, or a shard_map's per-device
        stack (its shard_maps place it)."""
        t = self.program.tensors[tid]
        return t.opaque or not t.shape or not t.nbytes or bool(t.hand_split)

    def read(self, env: dict, produced: dict, tid: int, spec: Spec) -> Any:
        """``tid`` in layout ``spec``: one constraint per step of its reshard path, each step
        taken once per cache."""
        if self.plain(tid) or not spec:
            return env[tid]
        have = self.plan.tensor_specs.get(tid)
        value = env[tid]
        if have is None:
            return value
        for step in reshard_path(
            self.program.tensors[tid].nbytes, have, spec, self.plan.mesh_axes.sizes
        ):
            key = (tid, step.before, step.after)
            if key not in produced:
                produced[key] = self.constrain(value, step.after)
            value = produced[key]
        return value

    def in_specs(self, index: int) -> list[Spec | None]:
        """The layouts equation ``index`` reads its operands in (None: a literal)."""
        m = self.member_of[index]
        cfg = self.plan.config(self.plan.ng.node_of_eqn[index])
        return [None if mp is None else spec_of(mp, cfg) for mp in m.in_maps]

    def run(self, start: int, stop: int, level: int, env: dict, produced: dict) -> None:
        """Equations ``[start, stop)`` of region ``level`` (-1: the step's top level)."""
        i = start
        while i < stop:
            region = next((r for r in self.starts.get(i, ()) if r.parent == level), None)
            if region is not None:
                self.hoist(region, env, produced)
                (self.run_scan if region.kind == SCAN else self.run_cond)(region, env, produced)
                i = region.end
                continue
            eqn = self.program.eqns[i]
            invals = [
                lit if tid is None else self.read(env, produced, tid, spec)
                for tid, lit, spec in zip(eqn.inputs, eqn.literals, self.in_specs(i), strict=True)
            ]
            if eqn.primitive in ("sharding_constraint", "reshard"):  # the plan's layouts rule
                outs = [invals[0]]
            else:
                outs = eqn.bind.bind(*invals, **eqn.bind.get_bind_params(eqn.params))
                if not eqn.bind.multiple_results:
                    outs = [outs]
            self.write(env, eqn.outputs, outs)
            i += 1

    def write(self, env: dict, tids: Sequence[int], values: Sequence[Any]) -> None:
        for tid, value in zip(tids, values, strict=True):
            env[tid] = (
                value if self.plain(tid) else self.constrain(value, self.plan.tensor_specs[tid])
            )

    def hoist(self, region: Region, env: dict, produced: dict) -> None:
        """Reshard, before the region, what its equations read from outside it (once, as
        `tables.edge_uses` prices them): loop invariants, a scan's init and stacked xs."""
        program = self.program
        eqns = range(region.first, region.end)
        inside = {t for i in eqns for t in program.eqns[i].outputs}
        for i in eqns:
            for tid, spec in zip(program.eqns[i].inputs, self.in_specs(i), strict=True):
                if tid is not None and tid not in inside:
                    self.read(env, produced, tid, spec)
        for out_t, spec in zip(region.carry_out, self.carry_specs(region), strict=True):
            if out_t not in inside and spec is not None:
                self.read(env, produced, out_t, spec)

    def carry_specs(self, region: Region) -> list[Spec | None]:
        """The layout each iteration of a scan reads its carry in."""
        specs = self.plan.tensor_specs
        return [specs.get(self.program.eqns[i].outputs[0]) for i in region.carry_eqns]

    def operand(self, env: dict, produced: dict, i: int, k: int = 0) -> Any:
        """Operand ``k`` of equation ``i`` in the layout it reads (a literal as it is)."""
        eqn = self.program.eqns[i]
        tid, lit = eqn.inputs[k], eqn.literals[k]
        return lit if tid is None else self.read(env, produced, tid, self.in_specs(i)[k])

    def run_scan(self, region: Region, env: dict, produced: dict) -> None:
        """Re-emit a planned scan with the plan's constraints inside its body; the carry an
        iteration returns is resharded to the layout the next one reads."""
        program, carry_specs = self.program, self.carry_specs(region)

        def body(carry: list, xs: list) -> tuple[list, list]:
            benv, bproduced = dict(env), dict(produced)
            entries = [*region.carry_eqns, *region.slice_eqns]
            for i, value in zip(entries, [*carry, *xs], strict=True):
                self.write(benv, program.eqns[i].outputs, [value])
            self.run(*region.bodies[0], region.index, benv, bproduced)
            new_carry = [
                benv[t] if spec is None else self.read(benv, bproduced, t, spec)
                for t, spec in zip(region.carry_out, carry_specs, strict=True)
            ]
            ys = [self.operand(benv, bproduced, i) for i in region.result_eqns]
            return new_carry, ys

        final, ys = jax.lax.scan(
            body,
            [self.operand(env, produced, i) for i in region.carry_eqns],
            [self.operand(env, produced, i) for i in region.slice_eqns],
            length=region.trips,
            reverse=region.reverse,
            unroll=region.unroll,
        )
        self.write(env, region.carry_out, final)
        self.write(env, [program.eqns[i].outputs[0] for i in region.result_eqns], ys)

    def run_cond(self, region: Region, env: dict, produced: dict) -> None:
        """Re-emit a planned cond: each branch with the plan's constraints, returning its
        results in the merged layouts."""
        program = self.program

        def branch(b: int):
            def run() -> list:
                benv, bproduced = dict(env), dict(produced)
                self.run(*region.bodies[b], region.index, benv, bproduced)
                return [self.operand(benv, bproduced, i, b) for i in region.result_eqns]

            return run

        index = region.branch_literal if region.branch_index is None else env[region.branch_index]
        outs = jax.lax.switch(index, [branch(b) for b in range(len(region.bodies))])
        self.write(env, [program.eqns[i].outputs[0] for i in region.result_eqns], outs)


def run_program(plan: Plan, flat_args: list[Any], mesh: Any = None) -> list[Any]:
    """Evaluate the flat program with the plan's sharding constraints (traced under jit);
    ``mesh``: the mesh the constraints name (default the plan's)."""
    program = plan.program
    runner = _Runner(plan, mesh)
    env: dict[int, Any] = dict(program.consts)
    produced: dict[tuple[int, Spec, Spec], Any] = {}
    env.update(zip(program.invars, flat_args, strict=True))
    runner.run(0, len(program.eqns), -1, env, produced)
    return [
        lit if tid is None else runner.read(env, produced, tid, spec)
        for tid, lit, spec in zip(
            program.outvars, program.out_literals, plan.outvar_specs, strict=True
        )
    ]


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
        self._cache: dict[tuple[Signature, Any], _Compiled] = {}  # per (signature, mesh)
        self._last: _Compiled | None = None

    @property
    def plan(self) -> Plan:
        """The plan of the last signature called or lowered."""
        if self._last is None:
            raise RuntimeError("no plan yet: call the function (or .lower) with arguments first")
        return self._last.plan

    def _mesh(self) -> Mesh:
        """The mesh of this call: the one given, else the one set around the call
        (``jax.set_mesh``), else a 1-D "data" mesh over all devices (`meshes.resolve_mesh`)."""
        mesh = resolve_mesh(self.mesh, "auto_shard", need_devices=True)
        return make_mesh({"data": len(jax.devices())}) if mesh is None else mesh

    def _compiled(self, args: tuple) -> _Compiled:
        mesh = self._mesh()
        key = (Signature.of(args), mesh)
        if key in self._cache:
            self._last = self._cache[key]
            return self._last
        if self.given_plan is not None:
            saved = self.given_plan
            plan = make_plan(self.fn, args, mesh, self.cluster, saved.options, saved=saved)
        else:
            plan = make_plan(self.fn, args, mesh, self.cluster, self.options, self.in_specs)
        warn_unpipelined(plan)
        from .distributed import check_plan  # mesh over several processes: all planned the same

        check_plan(plan, args)  # else raises MultiHostMismatch (a no-op on one process)
        in_sh = plan.flat_shardings(plan.program.invars, plan.invar_specs)
        out_sh = plan.flat_shardings(plan.program.outvars, plan.outvar_specs)
        flat_donate = self._flat_donate(args)
        jitted = jax.jit(
            step_body(plan, out_sh),
            in_shardings=in_sh,
            out_shardings=out_sh,
            donate_argnums=flat_donate,
        )
        compiled = _Compiled(plan, jitted, plan.arg_layout.out_tree, in_sh)
        self._cache[key] = compiled
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
        return [_placed(a, s) for a, s in zip(arrays, compiled.in_shardings, strict=True)]

    def __call__(self, *args: Any) -> Any:
        compiled = self._compiled(args)
        flat = self._flat_inputs(args, compiled)
        with call_context(compiled.plan):
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
        with call_context(compiled.plan):
            return compiled.jitted.lower(*abstract)


def _placed(a: Any, sharding: NamedSharding) -> Any:
    """Argument ``a`` in the planned ``sharding``: as it is when it already lies so on the same
    mesh; else moved there. An array on the same devices in the same layout but on a mesh of
    other axis types (the Explicit mesh `jax.make_mesh` gives, planned on its Auto twin) is
    relabelled, not copied: the jit needs every input on its one mesh."""
    if not isinstance(a, jax.Array) or a.sharding == sharding:
        return a
    same_mesh = getattr(a.sharding, "mesh", None) == sharding.mesh
    if same_mesh and a.sharding.is_equivalent_to(sharding, a.ndim):
        return a
    return jax.device_put(a, sharding)


def step_body(plan: Plan, out_shardings: list[NamedSharding]) -> Any:
    """The function of flat arrays the jit runs: the program with the plan's constraints.

    On a mesh with Explicit axes (`jax.make_mesh`'s default) JAX accepts sharding constraints
    over Auto axes only, so the program runs inside `jax.sharding.auto_axes` over those axes,
    its constraints on the abstract mesh there (every axis Auto), its results given back on
    the user's mesh in the planned layouts.
    """
    explicit = plan.target.mesh.explicit_names
    if not explicit:
        return lambda *flat: run_program(plan, list(flat))

    def inside(*flat: Any) -> list[Any]:
        return run_program(plan, list(flat), jax.sharding.get_abstract_mesh())

    # auto_axes gives results back on the Explicit axes only; the jit's out_shardings lay
    # them out over the Auto axes of a mixed mesh
    out = [_over(s, frozenset(explicit)) for s in out_shardings]
    return jax.sharding.auto_axes(inside, axes=explicit, out_sharding=out)


def _over(sharding: NamedSharding, axes: frozenset[str]) -> NamedSharding:
    """``sharding`` with its spec keeping only the mesh axes ``axes``."""
    entries = []
    for entry in sharding.spec:
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        kept = tuple(n for n in names if n in axes)
        entries.append(None if not kept else kept[0] if len(kept) == 1 else kept)
    return NamedSharding(sharding.mesh, PartitionSpec(*entries), memory_kind=sharding.memory_kind)


def call_context(plan: Plan) -> Any:
    """The mesh context a plan's step runs in: the plan's mesh when the caller set another
    (`jax.set_mesh` of the same devices with other axis types: `meshes.resolve_mesh` refuses
    any other difference), so JAX reads the shardings on the mesh they name."""
    ambient = jax.sharding.get_mesh()
    if ambient.empty or ambient == plan.mesh or not isinstance(plan.mesh, Mesh):
        return contextlib.nullcontext()
    return jax.sharding.set_mesh(plan.mesh)


def warn_unpipelined(plan: Plan) -> None:
    """Warn when a GPU plan assumes XLA's collective pipeliner (``pipelined_loops``) that this
    process's ``XLA_FLAGS`` does not turn on: the compiled loops will not pipeline."""
    if plan.platform != "gpu" or not plan.options.pipelined_regions(plan.program):
        return
    given = os.environ.get("XLA_FLAGS", "").split()
    missing = [f for f in PIPELINER_FLAGS if f not in given]
    if missing:
        warnings.warn(
            f"jaxpar: the plan assumes XLA's collective pipeliner (pipelined_loops=True), but "
            f"XLA_FLAGS lacks {' '.join(missing)}: the compiled loops will not pipeline and the "
            "step will be slower than predicted. Set them before jax starts, or plan with "
            "pipelined_loops=False",
            stacklevel=3,
        )


def auto_shard(
    fn: Any = None,
    *,
    mesh: Mesh | None = None,
    cluster: Any = None,
    strategy: str = "auto",
    objective: str = DEFAULT_OBJECTIVE,
    search: str = "elimination",
    donate_argnums: tuple[int, ...] | int = (),
    in_specs: Any = None,
    memory_budget: float | str | None = "device",
    options: PlannerOptions | None = None,
    plan: Any = None,
) -> Any:
    """Decorate a train step: plan it per input signature and run it sharded on ``mesh``.

    Usable bare (``@jaxpar.auto_shard``: the mesh set around the call with ``jax.set_mesh``, else
    a 1-D "data" mesh over all devices; cluster detected) or with arguments. ``mesh``: a jax
    `Mesh` with Auto, Explicit (`jax.make_mesh`'s default) or mixed axes; a mesh given inside
    ``jax.set_mesh`` must agree with the one set. Results carry shardings on that mesh.
    ``in_specs``: optional pytree prefix of PartitionSpecs pinning argument layouts (None
    leaves free). ``search``: "elimination" (joint, default) or "kcut" (SoyBean's
    one cut per mesh axis, slowest interconnect first); see `PlannerOptions`.

    ``plan``: a `Plan`, a loaded plan file (`jaxpar.load_plan`) or a plan file's path: apply it
    instead of planning (`planner.reuse`: re-trace, check, pin every node; nothing searched).
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
