"""The overlapped step (`jaxpar.overlap`): compute and communication on two in-order streams."""

import numpy as np
import pytest

import jaxpar
import models
from jaxpar.overlap import COMM, COMPUTE, Task, Timeline, schedule


def _event_simulation(tasks: list[Task]) -> list[int]:
    """Brute force: advance time one unit at a time; a stream that is idle starts its next
    task (in list order) once every dependency has finished."""
    queues = {s: [i for i, t in enumerate(tasks) if t.stream == s] for s in (COMPUTE, COMM)}
    finish: dict[int, int] = {}
    running: dict[int, tuple[int, int]] = {}  # stream -> (task, end)
    t = 0
    while len(finish) < len(tasks):
        changed = True
        while changed:  # at time t: retire what has ended, start what may start, repeat
            changed = False
            for s in (COMPUTE, COMM):
                if s in running and running[s][1] <= t:
                    finish[running[s][0]] = running[s][1]
                    del running[s]
                    changed = True
                if s not in running and queues[s]:
                    i = queues[s][0]
                    if all(d in finish for d in tasks[i].deps):
                        queues[s].pop(0)
                        running[s] = (i, t + int(tasks[i].duration))
                        changed = True
        t += 1
    return [finish[i] for i in range(len(tasks))]


@pytest.mark.oracle
@pytest.mark.parametrize("seed", range(20))
def test_one_pass_schedule_equals_an_event_simulation(seed):
    rs = np.random.RandomState(seed)
    tasks = []
    for i in range(rs.randint(2, 25)):
        deps = tuple(sorted(set(rs.randint(0, i, size=rs.randint(0, 3))))) if i else ()
        tasks.append(Task(int(rs.randint(2)), float(rs.randint(0, 6)), deps))
    assert schedule(tasks) == pytest.approx(_event_simulation(tasks))


@pytest.mark.closed_form
def test_a_gradient_all_reduce_hides_behind_independent_compute():
    """Node A computes 2 then all-reduces 3; node B (4) does not read A: the all-reduce runs
    beside B, 6 in all instead of Eq. 1's 9; a node reading A waits for the all-reduce."""
    line = Timeline()
    line.node(0, 2.0, [], [], [3.0])
    line.node(1, 4.0, [], [], [])
    assert line.makespan() == 6.0
    line.node(2, 1.0, [line.ready[0]], [], [])
    assert line.makespan() == 7.0


@pytest.mark.closed_form
@pytest.mark.parametrize("name", ["gpt_small", "cnn"])
def test_overlapped_step_lies_between_compute_and_eq1(name):
    """compute ≤ overlapped ≤ combined ≤ Eq. 1 for every strategy; data parallelism overlaps
    part of its gradient synchronization with the backward pass."""
    ex = models.get(name, small=True)
    for strategy in ("auto", "data", "model", "fsdp"):
        plan = jaxpar.plan(ex.step, *ex.args, mesh={"node": 2, "gpu": 4}, cluster="p100",
                           strategy=strategy)  # fmt: skip
        c = plan.cost
        assert c.compute_s * (1 - 1e-12) <= c.overlapped_step_s
        assert c.overlapped_step_s <= c.combined_step_s * (1 + 1e-12)
        assert c.combined_step_s <= c.step_s * (1 + 1e-12)
        if strategy == "data":  # some gradient synchronization runs beside backward compute
            hidden = c.combined_step_s - c.overlapped_step_s
            assert hidden > 0.05 * min(c.compute_s, c.combined_step_s - c.compute_s), c
