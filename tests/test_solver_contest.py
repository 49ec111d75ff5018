"""The IOPDDL contest's format and `jaxpar solve`: the contest's example (its optimum 445 at
usage limit 50), malformed files, the answer's format and exit status, and the timeout honoured
on a large generated problem (pure, no jax)."""

import copy
import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from jaxpar.solver.anytime import AnytimeOptions
from jaxpar.solver.contest_format import Score, parse_contest, read_contest, score
from jaxpar.solver.descent import solve_within
from jaxpar.solver.problem import brute_force

ROOT = Path(__file__).resolve().parents[1]

# google/iopddl's example.json
EXAMPLE = {
    "problem": {
        "name": "example",
        "nodes": {
            "intervals": [[30, 70], [40, 70], [50, 120], [110, 140], [110, 150]],
            "costs": [[15], [55, 65], [25, 45, 35], [85, 75], [95]],
            "usages": [[10], [25, 25], [15, 20, 15], [10, 10], [15]],
        },
        "edges": {
            "nodes": [[0, 1], [0, 2], [1, 3], [2, 4], [3, 4]],
            "costs": [[30, 40], [50, 10, 40], [90, 10, 20, 80], [60, 20, 30], [70, 60]],
        },
        "usage_limit": 50,
    }
}


@pytest.mark.oracle
def test_the_example_optimum_is_445_at_limit_50():
    """Unconstrained the best plan costs 415 and breaks the limit; at limit 50 the optimum is
    445 (a plan of 495 also fits, but costs more); the solver returns 445."""
    contest = parse_contest(EXAMPLE["problem"])
    data = EXAMPLE["problem"]
    free = copy.deepcopy(contest.problem)
    free.memory = None
    x_free, v_free = brute_force(free)
    assert v_free == 415 and not score(data, x_free).feasible
    x_best, v_best = brute_force(contest.problem)
    assert v_best == 445 and score(data, x_best) == score(data, [0, 0, 2, 1, 0])
    assert score(data, [0, 0, 1, 1, 0]) == Score(415, False, 55)
    assert score(data, [0, 1, 2, 0, 0]) == Score(495, True, 50)
    sol = solve_within(contest.problem, time.perf_counter() + 2.0, options=AnytimeOptions(stall=50))
    assert score(data, sol.assignment).cost == 445 and score(data, sol.assignment).feasible


@pytest.mark.api
def test_parallel_and_reversed_edges_add_up():
    """Two edges between one pair (one listed b, a) add up, as the contest's evaluator does."""
    data = copy.deepcopy(EXAMPLE["problem"])
    data["edges"]["nodes"].append([2, 0])  # node 2 (3 strategies) first: transposed
    data["edges"]["costs"].append([1, 2, 3])
    contest = parse_contest(data)
    for x in ([0, 0, 0, 0, 0], [0, 1, 2, 1, 0]):
        cost = sum(float(u[c]) for u, c in zip(contest.problem.unary, x, strict=True))
        cost += sum(float(t[x[i], x[j]]) for (i, j), t in contest.problem.edges.items())
        assert cost == score(data, x).cost


@pytest.mark.api
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["nodes"]["costs"].pop(), "cost lists"),
        (lambda d: d["nodes"]["usages"][1].pop(), "usages"),
        (lambda d: d["edges"]["costs"][0].pop(), "expected 2"),
        (lambda d: d["edges"]["nodes"].__setitem__(0, [0, 9]), "outside"),
        (lambda d: d["nodes"]["intervals"].__setitem__(0, [1]), "interval"),
        (lambda d: d["nodes"].pop("costs"), "missing"),
        (lambda d: d["nodes"]["costs"].__setitem__(0, ["x"]), "not numbers"),
    ],
)
def test_malformed_problems_are_value_errors(change, message):
    data = copy.deepcopy(EXAMPLE["problem"])
    change(data)
    with pytest.raises(ValueError, match=message):
        parse_contest(data)


def _run(*args, timeout=60):
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "jaxpar", "solve", *map(str, args)],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    return done, time.perf_counter() - t0


@pytest.mark.api
def test_cli_answer_format_and_exit_status(tmp_path):
    """The last stdout line is the answer (one index per node), exit 0; a gzipped file reads
    the same; progress goes to stderr."""
    path = tmp_path / "example.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(EXAMPLE, f)
    done, wall = _run(path, 2)
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    answer = json.loads(last)
    assert last.startswith("[") and len(answer) == 5 and all(isinstance(c, int) for c in answer)
    assert score(EXAMPLE["problem"], answer) == score(EXAMPLE["problem"], [0, 0, 2, 1, 0])
    assert "objective" in done.stderr and wall < 2 + 1.5
    assert read_contest(path).problem.num_nodes == 5


@pytest.mark.api
def test_cli_proves_a_tiny_problem_and_exits_without_waiting_for_its_timeout(tmp_path):
    """The example breaks its limit at the unconstrained optimum; its 12 plans are tried
    (`descent.ENUMERATED_PLANS`), the answer is proved optimal and the process exits at once,
    not at its 30 s timeout (the anytime search would polish until then)."""
    path = tmp_path / "example.json"
    path.write_text(json.dumps(EXAMPLE))
    done, wall = _run(path, 30)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [0, 0, 2, 1, 0]
    assert "enumeration: objective 445" in done.stderr and "optimal (proved)" in done.stderr
    assert wall < 10


@pytest.mark.api
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("missing.json",), "missing.json"),
        (("BAD", "5"), "not valid JSON"),
        (("EXAMPLE", "-3"), "TIMEOUT_S"),
        (("EXAMPLE", "soon"), "TIMEOUT_S"),
        (("SHAPES", "5"), "expected"),
    ],
)
def test_cli_bad_input_is_one_error_line_and_status_2(tmp_path, args, message):
    (tmp_path / "BAD").write_text("{not json")
    (tmp_path / "EXAMPLE").write_text(json.dumps(EXAMPLE))
    shapes = copy.deepcopy(EXAMPLE)
    shapes["problem"]["edges"]["costs"][1] = [1, 2]
    (tmp_path / "SHAPES").write_text(json.dumps(shapes))
    args = [str(tmp_path / a) if a.isupper() else a for a in args]
    done, _ = _run(*args)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jaxpar solve: error:"), done.stderr
    assert message in lines[0]
    assert done.stdout == ""


def large_problem(n: int, seed: int = 0) -> dict:
    """A contest-format problem of ``n`` nodes: a random tree plus 20 % extra edges, 2-8
    strategies, intervals over 2n points, a limit 1.1 × the least-usage peak."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(2, 9, n)
    starts = rng.integers(0, 2 * n, n)
    intervals = np.stack([starts, starts + rng.integers(1, 50, n)], 1)
    usages = [rng.integers(1, 100, s) for s in sizes]
    pairs = [(int(rng.integers(v)), v) for v in range(1, n)]
    pairs += [tuple(int(a) for a in rng.choice(n, 2, replace=False)) for _ in range(n // 5)]
    peak = np.zeros(2 * n + 60)
    for (a, b), u in zip(intervals, usages, strict=True):
        peak[a:b] += u.min()
    nodes = {
        "intervals": intervals.tolist(),
        "costs": [rng.integers(0, 1000, s).tolist() for s in sizes],
        "usages": [u.tolist() for u in usages],
    }
    edges = {
        "nodes": [list(p) for p in pairs],
        "costs": [rng.integers(0, 1000, sizes[a] * sizes[b]).tolist() for a, b in pairs],
    }
    return {"problem": {"name": "generated", "nodes": nodes, "edges": edges,
                        "usage_limit": int(1.1 * peak.max())}}  # fmt: skip


@pytest.mark.api
@pytest.mark.slow
def test_timeout_is_honoured_on_a_30k_node_problem(tmp_path):
    """30,000 nodes, timeout 10 s: the process exits 0 within 10 s of its start (reading
    included), with a feasible answer."""
    data = large_problem(30_000)
    path = tmp_path / "large.json.gz"
    with gzip.open(path, "wt", compresslevel=1) as f:
        json.dump(data, f)
    done, wall = _run(path, 10, timeout=30)
    assert done.returncode == 0, done.stderr[-2000:]
    assert wall <= 10.0, (wall, done.stderr[-2000:])
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(answer) == 30_000 and score(data["problem"], answer).feasible


@pytest.mark.api
def test_a_search_cut_short_answers_with_its_best_plan(tmp_path, monkeypatch, capfd):
    """A phase that outlasts the search's deadline (a loaded machine: one TRW-S sweep over
    30k nodes took 3 s beside three busy processes) is cut at the hard stop: the best plan
    found so far is the answer, exit 0, within the timeout."""
    import threading

    from jaxpar.cli import solve as cli_solve
    from jaxpar.solver import descent

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("the hard stop is a signal: main thread only")
    path = tmp_path / "example.json"
    path.write_text(json.dumps(EXAMPLE))

    def stuck(problem, deadline, log=None, on_plan=None, **kw):
        on_plan([0, 0, 2, 1, 0])
        t0 = time.perf_counter()
        while time.perf_counter() < t0 + 5:  # far past the timeout
            time.sleep(0.01)
        raise AssertionError("not cut short")

    monkeypatch.setattr(descent, "solve_within", stuck)
    monkeypatch.setattr(cli_solve, "process_elapsed", lambda: 0.0)
    t0 = time.perf_counter()
    assert cli_solve.solve_command([str(path), "1"]) == 0
    assert time.perf_counter() - t0 <= 1.0
    out = capfd.readouterr()  # written to the file descriptors, not through sys.stdout
    assert out.out.strip().splitlines()[-1] == "[0, 0, 2, 1, 0]"
    assert "out of time" in out.err
