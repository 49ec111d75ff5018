"""The planned step on two streams (`overlap`): which node runs when, which collectives wait.

`evaluate` prices an assignment's terms; `schedule_step` lays them out as XLA's scheduler runs
them (docs/cost.md, "Overlapped step"): nodes list-scheduled in program order on the compute
stream, their reshards and collectives on the communication stream, the all-reduces XLA's
combiner merges as one collective, and the loops whose iterations overlap one another's
collectives (XLA's collective pipeliner, or a scan run in line: `pipelining`, `_rounds`).
``ctx`` is an `evaluate.EvalContext` and ``colls`` are `evaluate.Collective` records (not
imported: evaluate imports this module).

Pure: no jax import.
"""

from __future__ import annotations

from ..hardware.collectives import ALL_REDUCE
from ..program.graph import SCAN_SLICE, SCAN_STACK
from .node_costs import host_moves
from .overlap import COMM, COMPUTE, FROM_HOST, TO_HOST, Timeline, list_schedule

# Nodes that only change a tensor's shape, order or type: XLA's collective pipeliner moves an
# all-reduce across iterations through them (`pipelining`)
FORMATTING = frozenset(
    ("reshape", "squeeze", "expand_dims", "transpose", "convert_element_type", "copy")
)


def schedule_step(ctx, t_c, t_h, colls, own_of, riding, paths, gathered, top: bool) -> Timeline:
    """The step on a compute and a communication stream and two copy engines (`overlap`): nodes
    list-scheduled in program order (`overlap.list_schedule`), each after the reshards it reads
    through; deferred reads (the state into the next step's layout, a scan's carry) at the end.

    A node's moves between device and host memory (``t_h``) run on the copy engine of their
    direction: a move to the host once its operand is ready, its results ready when the copy
    ends; a move back issued ahead of its use by as much compute as the copy takes
    (`_prefetch_after`), as XLA's latency-hiding scheduler starts an asynchronous copy early
    enough to hide it, and no earlier (the copy's buffer is live from its start).

    In a pipelined loop (``ctx.pipelined``, `pipelining`) a loop body's node reads its
    gathered slices without waiting (they were gathered during the previous iteration), and
    the all-reduces of a node whose results are only stacked are the previous iteration's:
    all iterations' but the last run during the loop, the last after the loop's last run of
    their producer, and what reads the stacked results after the loop waits for both. The
    pipeliner puts them at the top of the next iteration's body, and XLA's scheduler may move
    them down it: ``top`` issues them on the communication stream where the loop starts, ahead
    of the iteration's own collectives (`_behind_seconds`), else after those, where their
    producer has run. `evaluate` takes the shorter schedule, and the unpipelined one if that
    is shorter still: moving collectives earlier can reorder the greedy list schedule for the
    worse (a list-scheduling anomaly, which XLA's scheduler, free to keep the collectives where
    they were, does not suffer).

    A scan XLA runs in line is scheduled as a pipelined loop whose rounds are its all-reduces'
    combined runs (`_rounds`, `_lags`); one all-reduce combining every copy is issued where the
    scan's nodes have all run (``at_end``), since its last copy's gradient comes last."""
    return _StepSchedule(ctx, t_c, t_h, colls, own_of, riding, paths, gathered, top).schedule()


class _StepSchedule:
    """The state of one `schedule_step`: the timeline, what each node reads through, the
    combined all-reduce groups still open, and the loops' pipelined all-reduces."""

    def __init__(self, ctx, t_c, t_h, colls, own_of, riding, paths, gathered, top: bool):
        self.ctx, self.t_c, self.t_h, self.colls = ctx, t_c, t_h, colls
        self.own_of, self.riding, self.paths, self.gathered, self.top = (
            own_of, riding, paths, gathered, top
        )  # fmt: skip
        self.uses, self.nodes, self.program = ctx.tables.uses, ctx.ng.nodes, ctx.ng.program
        self.line = line = Timeline()
        self.ready = line.ready
        self.order, self.into, self.deferred, self.srcs, self.producers = _stream_order(ctx)
        self.moves = _host_nodes(ctx)  # node -> whether it moves to the host (else from it)
        self.prefetch = _prefetch_after(ctx.ng, self.order, t_c, t_h, self.moves)
        self.behind, self.ahead = pipelining(ctx)
        self.late: dict[int, int] = {}  # node -> its all-reduce run an iteration behind (last)
        self.started: dict[int, int] = {}  # pipelined loop -> a marker where its compute starts
        self.early: dict[int, int] = {}  # ``top``: loop -> its all-reduces run behind, but last
        self.groups, self.member_of = _combined_groups(self.order, colls, own_of)
        self.owner = {k: v for v, ks in enumerate(own_of) for k in ks}  # collective -> node
        self.moved = (
            _behind_seconds(ctx, colls, self.owner, riding, self.groups, self.behind) if top else {}
        )
        self.left = {g: len(members) for g, (members, _) in self.groups.items()}  # not yet run
        # nodes run before a group's collective that read its members' results, directly or
        # not (a weight gradient's transpose): their results are ready only once it finished
        self.waits: dict[int, set[int]] = {}  # node -> the open groups it waits for
        self.waiting: dict[int, list[int]] = {g: [] for g in self.groups}  # group -> waiters
        # scan run in line -> what waits for its end: (combined group, None) or (node, seconds)
        self.at_end: dict[int, list[tuple[int, float | None]]] = {}

    def schedule(self) -> Timeline:
        """List-schedule the nodes in program order, then the scans' ends and deferred reads."""
        prefetch, producers, nodes = self.prefetch, self.producers, self.nodes
        list_schedule(
            self.line,
            self.order,
            lambda v: (
                (*producers.get(v, ()), prefetch[v]) if v in prefetch else producers.get(v, ())
            ),
            lambda v: nodes[v].region,
            self.issue,
            self.scheduled,
        )
        for loop in list(self.at_end):
            self.ended(loop)
        for u in self.deferred:
            self.read(u)
        return self.line

    def read(self, u: int) -> int | None:
        """The reshards of read ``u`` on the communication stream; the task it waits for."""
        line, uses = self.line, self.uses
        last = None
        steps = self.paths.get(u, ())
        share = 1.0
        if u in self.ahead and u in self.gathered:  # the first iteration's gathers, waited on
            share = 1.0 / _rounds(self.program, self.nodes[uses[u].dst].region)
        for key, seconds in steps:
            last = line.reshard(key, uses[u].src, last, seconds * share)
        if share < 1.0:  # the rest, each during the iteration before its own
            rest = None
            for key, seconds in steps:
                rest = line.reshard((*key, "ahead"), uses[u].src, rest, seconds * (1 - share))
        return last if last is not None else line.ready.get(uses[u].src)

    def issue(self, v: int) -> list[int | None]:
        """The tasks node ``v`` waits for: its reads, a lagging stack's all-reduces, a
        prefetched move back from the host."""
        into, srcs, nodes = self.into, self.srcs, self.nodes
        tasks = [
            self.read(u) if u in self.paths else self.ready.get(srcs[u]) for u in into.get(v, ())
        ]
        if self.late:  # outside the loop, a stack waits for its all-reduces run a round behind
            loop = nodes[v].region
            tasks += [
                self.late.get(srcs[u]) for u in into.get(v, ()) if nodes[srcs[u]].region != loop
            ]
        if self.moves.get(v) is False:  # a move back from the host: prefetched
            if v in self.prefetch:
                tasks.append(self.line.computed[self.prefetch[v]])
            tasks = [self.line.add(FROM_HOST, self.t_h[v], tasks)]
        return tasks

    def behind_task(self, loop: int, seconds: float, deps: list, runs: int) -> int:
        """An all-reduce run an iteration behind: all rounds' but the last (at the top, or here
        where its producer has run), the last after ``deps``; the later of the two (``runs``:
        of its combined all-reduce, `_rounds`)."""
        line = self.line
        rounds = _rounds(self.program, loop, runs)
        if self.top:
            rest = self.early[loop]
        else:
            rest = line.add(COMM, seconds * (rounds - 1) / rounds, [self.started[loop]])
        last = line.add(COMM, seconds / rounds, deps)
        return last if line.finish[last] >= line.finish[rest] else rest

    def start_loop(self, loop: int) -> None:
        """A pipelined loop's first node: mark where its compute starts (and, ``top``, issue
        the all-reduces run an iteration behind there)."""
        if loop in self.ctx.pipelined and loop not in self.started:
            self.started[loop] = self.line.add(COMPUTE, 0.0)
            if loop in self.moved:
                self.early[loop] = self.line.add(COMM, self.moved[loop], [self.started[loop]])

    def own_collectives(self, v: int) -> tuple[list, list, list]:
        """Node ``v``'s own collectives not combined with others' (seconds): those before its
        results are ready, the all-reduces after, and those run an iteration behind (with the
        runs of their combined all-reduce); all-reduces of a scan run in line's copies wait for
        the scan's end (``at_end``)."""
        program, loop = self.program, self.nodes[v].region
        before, after, later = [], [], []
        for k in self.own_of[v]:
            c = self.colls[k]
            if c.group in self.groups:
                continue  # runs with its combined all-reduce, after the group's last member
            seconds = c.time_s - self.riding.get(k, 0.0)
            if c.kind != ALL_REDUCE:
                before.append(seconds)
            elif v in self.behind and _lags(program, loop, c.group_runs):
                later.append((seconds, c.group_runs))
            elif _in_line_copies(program, loop) > 1 and _rounds(program, loop, c.group_runs) == 1:
                self.at_end.setdefault(loop, []).append((v, seconds))  # the copies' in one
            else:
                after.append(seconds)
        return before, after, later

    def run(self, v: int, reads: list[int | None]) -> None:
        """Node ``v`` on the streams, after ``reads``; then the groups it closes."""
        line, ready, late, into, srcs = self.line, self.ready, self.late, self.into, self.srcs
        loop = self.nodes[v].region
        self.start_loop(loop)
        before, after, later = self.own_collectives(v)
        if self.moves.get(v):  # a move to the host: after its operand, on the to-host engine
            reads = [line.add(TO_HOST, self.t_h[v], reads)]
        if v in self.moves and not (self.t_c[v] or before or after):  # a copy and nothing else
            ready[v] = reads[0]
        else:
            line.node(v, self.t_c[v], reads, before, after)
        for seconds, runs in later:
            _latest(line, late, v, self.behind_task(loop, seconds, [ready[v]], runs))
        if late:  # formatting and stacking results reduced an iteration behind
            for u in into.get(v, ()):
                _latest(line, late, v, late.get(srcs[u]))
        pending = self.member_of.get(v, set()).union(
            *(self.waits.get(srcs[u], ()) for u in into.get(v, ()))
        )
        pending = {g for g in pending if g in self.waiting}
        if pending:
            self.waits[v] = pending
            for g in pending:
                self.waiting[g].append(v)
        # a combined group's collective, once its last member has run: one collective takes
        # every operand
        for g in self.member_of.get(v, ()):
            self.left[g] -= 1
            if not self.left[g]:
                self.issue_group(g, loop)

    def issue_group(self, g: int, loop: int, end: int | None = None) -> None:
        """A combined group's collective, once its last member has run (in ``loop``); one that
        combines the copies of a scan run in line waits for the scan's ``end``: its last copy
        runs last (the body's nodes run once for all copies here)."""
        colls, nodes, riding = self.colls, self.nodes, self.riding
        members, ks = self.groups[g]
        runs = colls[ks[0]].group_runs
        lagging = _moved_members(self.program, nodes, members, self.behind, runs)
        if end is None and len(lagging) < len(members) and _in_line_copies(self.program, loop) > 1:
            self.at_end.setdefault(loop, []).append((g, None))
            return
        for part, tasks in ((lagging, self.late), (set(members) - lagging, self.ready)):
            if not part:
                continue
            seconds = sum(colls[k].time_s - riding.get(k, 0.0) for k in ks if self.owner[k] in part)
            deps = [self.ready[m] for m in members if m in part]
            if part is lagging:
                task = self.behind_task(nodes[next(iter(part))].region, seconds, deps, runs)
            else:
                task = self.line.add(COMM, seconds, [*deps, end])
            for t in self.waiting[g]:
                _latest(self.line, tasks, t, task)
        del self.waiting[g]

    def ended(self, loop: int) -> None:
        """A scan run in line has run all its nodes: the all-reduces combining its copies."""
        line = self.line
        end = line.add(COMPUTE, 0.0)
        for g, seconds in self.at_end.pop(loop):
            if seconds is None:
                self.issue_group(g, loop, end)
            else:  # a node's own all-reduce of every copy
                _latest(line, self.ready, g, line.add(COMM, seconds, [self.ready[g], end]))

    def scheduled(self, v: int, reads: list[int | None]) -> None:
        """List scheduling's callback: close the in-line scans ``v`` leaves, then run ``v``."""
        for loop in [r for r in self.at_end if r != self.nodes[v].region]:
            self.ended(loop)
        self.run(v, reads)


def _host_nodes(ctx) -> dict[int, bool]:
    """Node -> whether its move between device and host memory goes to the host, for the nodes
    that make one (`cost.host_moves`; kept in ``ctx.memo``)."""
    if "host nodes" not in ctx.memo:
        ng = ctx.ng  # the nodes with a t_H table are those making a move
        ctx.memo["host nodes"] = {
            v: host_moves(ng, ng.nodes[v])[0][1]
            for v, t_h in enumerate(ctx.tables.host)
            if t_h is not None
        }
    return ctx.memo["host nodes"]


def _prefetch_after(ng, order, t_c, t_h, moves: dict[int, bool]) -> dict[int, int]:
    """Per move back from the host, the node whose compute it is issued after: walking back in
    program order from the move over the nodes of its loop body (or of the top level), the
    last one before compute of at least the copy's time t_H; the node before the body where
    the body has less (a copy cannot start in an earlier iteration). Absent: no such node
    (issued once its operand is on the host)."""
    out: dict[int, int] = {}
    if False not in moves.values():  # no move back (most steps)
        return out
    for k, v in enumerate(order):
        if moves.get(v) is not False:
            continue
        region, covered = ng.nodes[v].region, 0.0
        for j in range(k - 1, -1, -1):
            w = order[j]
            if ng.nodes[w].region != region or (covered >= t_h[v] and t_c[w]):
                if w in moves and not t_c[w]:
                    continue  # a copy alone runs no compute to be issued after
                out[v] = w
                break
            covered += t_c[w]
    return out


def _in_line_copies(program, region: int) -> int:
    """Copies of a scan run in line per run of the computation around it (1 elsewhere)."""
    if region < 0 or program.regions[region].iterations:
        return 1
    return program.trips(region) // program.trips(program.computation(region))


def _rounds(program, region: int, runs: int = 0) -> int:
    """The rounds a pipelined region's moved collectives spread over: its loop's iterations;
    where XLA runs the scan in line, the runs of their combined all-reduce per run of the
    computation around it (the copies combine: one all-reduce of them all waits for the last
    copy), or with none (``runs`` 0: gathers) the scan's steps."""
    r = program.regions[region]
    if r.iterations:
        return r.iterations
    if not runs:
        return r.trips
    return max(1, runs // program.trips(program.computation(region)))


def _behind_seconds(ctx, colls, owner, riding, groups, behind) -> dict[int, float]:
    """Per pipelined loop, the seconds of the all-reduces it runs behind, all rounds' but the
    last (`_rounds`): the behind nodes' own all-reduces, and their share of the combined
    groups whose members all are (`pipelining`) or which join a scan run in line to the step
    around it (`_moved_members`)."""
    nodes, program = ctx.ng.nodes, ctx.ng.program
    out: dict[int, float] = {}

    def add(k: int) -> None:
        loop, c = nodes[owner[k]].region, colls[k]
        rounds = _rounds(program, loop, c.group_runs)
        out[loop] = out.get(loop, 0.0) + (c.time_s - riding.get(k, 0.0)) * (1 - 1 / rounds)

    for k, c in enumerate(colls):
        v = owner.get(k)
        lone = v in behind and c.kind == ALL_REDUCE and c.group not in groups
        if lone and _lags(program, nodes[v].region, c.group_runs):
            add(k)
    for members, ks in groups.values():
        moved = _moved_members(program, nodes, members, behind, colls[ks[0]].group_runs)
        for k in ks:
            if owner[k] in moved:
                add(k)
    return out


def _moved_members(program, nodes, members: list[int], behind, runs: int) -> set[int]:
    """The members of a combined all-reduce (of ``runs`` per step) that run behind their
    iteration (`_lags`): all of them when all are behind (one collective takes them all); the
    behind ones when the group joins a scan run in line to the step around it (members of
    several regions: each copy's share runs behind its copy)."""
    inside = {m for m in members if m in behind}
    if not inside or not _lags(program, nodes[next(iter(inside))].region, runs):
        return set()
    if len(inside) == len(members) or len({nodes[m].region for m in members}) > 1:
        return inside
    return set()


def _lags(program, region: int, runs: int) -> bool:
    """Whether an all-reduce of a pipelined region (of ``runs`` per step) runs behind its
    round: always in a loop; in a scan run in line, when its copies make more than one
    all-reduce (one of them all waits for the last copy: `schedule_step` issues it where the
    scan ends)."""
    return bool(program.regions[region].iterations) or _rounds(program, region, runs) > 1


def _latest(line: Timeline, tasks: dict[int, int], v: int, task: int | None) -> None:
    """``tasks[v]``: ``task`` if it finishes after the one there."""
    if task is not None and (v not in tasks or line.finish[task] > line.finish[tasks[v]]):
        tasks[v] = task


def pipelining(ctx) -> tuple[frozenset[int], frozenset[int]]:
    """What XLA's collective pipeliner moves in the loops of ``ctx.pipelined`` (kept in
    ``ctx.memo``; empty sets when none is):

    - the nodes whose every reader stacks their results into the loop's ys, directly or
      through `FORMATTING` nodes (a weight gradient, transposed): their all-reduces run an
      iteration behind, beside the next iteration (XLA:GPU's forward pipelining of
      all-reduce);
    - the reads of an xs slice by a node of the same loop (a layer's weights): their
      all-gathers run an iteration ahead (backward pipelining of all-gather), so the reader
      does not wait for them (`schedule_step` checks that a read only gathers)."""
    if not ctx.pipelined:
        return frozenset(), frozenset()
    if "pipelining" not in ctx.memo:
        nodes, eqns = ctx.ng.nodes, ctx.ng.program.eqns
        primitive = [eqns[n.anchor].primitive if n.anchor >= 0 else "" for n in nodes]
        readers: dict[int, set[int]] = {}
        ahead = set()
        for u, use in enumerate(ctx.tables.uses):
            if use.src == use.dst:
                continue
            readers.setdefault(use.src, set()).add(use.dst)
            loop = nodes[use.src].region
            if (
                loop in ctx.pipelined
                and nodes[use.dst].region == loop
                and primitive[use.src] == SCAN_SLICE
            ):
                ahead.add(u)
        behind: set[int] = set()
        for v in sorted(readers, key=lambda v: -max(m.eqn for m in nodes[v].members)):
            loop = nodes[v].region  # readers first: in reverse program order
            if loop in ctx.pipelined and all(
                nodes[d].region == loop
                and (primitive[d] == SCAN_STACK or (d in behind and primitive[d] in FORMATTING))
                for d in readers[v]
            ):
                behind.add(v)
        ctx.memo["pipelining"] = (frozenset(behind), frozenset(ahead))
    return ctx.memo["pipelining"]


def _combined_groups(order: list[int], colls: list, own_of) -> tuple[dict, dict]:
    """The combined all-reduces of more than one member, as group -> (its members' nodes, its
    collectives), and node -> its groups. One collective takes every operand, so it starts
    once its last member has run."""
    nodes: dict[int, list[int]] = {}
    members: dict[int, list[int]] = {}
    for v in order:
        for k in own_of[v]:
            g = colls[k].group
            if g >= 0:
                nodes.setdefault(g, []).append(v)
                members.setdefault(g, []).append(k)
    groups, member_of = {}, {}
    for g, ks in members.items():
        if len(ks) > 1:
            groups[g] = (list(dict.fromkeys(nodes[g])), ks)
            for v in groups[g][0]:
                member_of.setdefault(v, set()).add(g)
    return groups, member_of


def _stream_order(ctx) -> tuple[list, dict, list, list, dict]:
    """What the timeline of every assignment shares (kept in ``ctx.memo``): the nodes that run,
    in program order (an argument's node is ready at the start; the optimizer updates that
    joined it run where its last member does), the reads each waits on, the deferred reads
    (of a producer that runs later), each read's producing node, and each node's producers
    that run."""
    if "stream order" not in ctx.memo:
        ng = ctx.ng
        position = [max((m.eqn for m in n.members), default=-1) if n.anchor < 0 else n.anchor
                    for n in ng.nodes]  # fmt: skip
        order = sorted(range(len(ng.nodes)), key=lambda v: position[v])
        place = {v: i for i, v in enumerate(order)}
        into: dict[int, list[int]] = {}
        deferred = []
        for u, use in enumerate(ctx.tables.uses):
            if use.src != use.dst and place[use.src] < place[use.dst]:
                into.setdefault(use.dst, []).append(u)
            elif use.src != use.dst:
                deferred.append(u)
        running = [v for v in order if position[v] >= 0]
        sources = [use.src for use in ctx.tables.uses]
        runs = set(running)
        producers = {  # per node, the nodes that run whose results it waits on
            v: list(dict.fromkeys(sources[u] for u in us if sources[u] in runs))
            for v, us in into.items()
        }
        ctx.memo["stream order"] = (running, into, deferred, sources, producers)
    return ctx.memo["stream order"]
