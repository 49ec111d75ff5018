"""SoyBean's k-cut search (jaxpar/kcut.py): against brute force, and SoyBean's hybrid MLP plan."""

import itertools
import math

import jax
import jax.numpy as jnp
import jaxpar_zoo as zoo
import numpy as np
import pytest
from test_search import GRAPHS

import jaxpar
from jaxpar.solver.descent import solve
from jaxpar.solver.elimination import solve_exact
from jaxpar.solver.kcut import cut_order, kcut, project, recut, recut_and_descend, restrict
from jaxpar.solver.problem import Problem, SearchBudget, assignment_cost, brute_force


def config_problem(rng, n, edges, dims=2, axes=2):
    """Random costs over real configurations: per mesh axis a dim in {-1, 0..dims-1}."""
    configs = [list(itertools.product(range(-1, dims), repeat=axes)) for _ in range(n)]
    unary = [rng.random(len(c)) for c in configs]
    p = Problem(unary=unary, edges={})
    for i, j in edges:
        p.add_edge(i, j, rng.random((len(configs[i]), len(configs[j]))))
    return p, configs


@pytest.mark.oracle
@pytest.mark.parametrize("name", ["chain", "diamond", "ladder"])
@pytest.mark.parametrize("seed", range(3))
def test_kcut_vs_brute_force_random(name, seed):
    n, edges = GRAPHS[name]
    n = min(n, 6)
    edges = [(i, j) for i, j in edges if i < n and j < n]
    p, configs = config_problem(np.random.default_rng(seed), n, edges)
    _, best = brute_force(p)
    assignment, value, _ = solve_exact(p)
    assert value == pytest.approx(best, rel=1e-12)
    assert assignment_cost(p, assignment) == pytest.approx(value, rel=1e-12)
    res = kcut(p, configs, sizes=(2, 2), bandwidth=(1e10, 1e9))
    assert res.objective >= best - 1e-12
    assert res.objective == pytest.approx(assignment_cost(p, res.assignment), rel=1e-12)
    assert [c.axis for c in res.cuts] == [1, 0]  # the slow axis first
    assert res.exact_cuts
    # the first cut left the later axis unused: its objective is that of such an assignment
    assert all(c.objective >= best - 1e-12 for c in res.cuts)


@pytest.mark.oracle
@pytest.mark.parametrize("seed", range(4))
def test_recut_ends_where_no_single_axis_change_improves(seed):
    """`kcut.recut`: never worse than its start, and at its result no change of one mesh axis's
    dims (over every node at once, the others held) improves: checked by enumerating each
    axis's whole neighbourhood."""
    rng = np.random.default_rng(seed)
    n, edges = GRAPHS["ladder"]
    p, configs = config_problem(rng, n, edges, dims=2, axes=2)
    start = [int(rng.integers(len(c))) for c in configs]
    x, value = recut(p, configs, start)
    assert value <= assignment_cost(p, start) + 1e-12
    assert value == pytest.approx(assignment_cost(p, x), rel=1e-12)
    for axis in range(2):
        other = 1 - axis
        choices = [
            [i for i, c in enumerate(cfgs) if c[other] == cfgs[x[v]][other]]
            for v, cfgs in enumerate(configs)
        ]
        best = min(assignment_cost(p, list(a)) for a in itertools.product(*choices))
        assert value <= best + 1e-12


@pytest.mark.oracle
@pytest.mark.parametrize("seed", range(3))
def test_recut_and_descend_ends_where_neither_move_improves(seed):
    """`kcut.recut_and_descend` from a block descent's result on a graph too wide to eliminate:
    never worse than its start, and at its result neither a re-cut nor descent improves."""
    rng = np.random.default_rng(seed)
    n = 10
    edges = [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < 0.5]
    p, configs = config_problem(rng, n, edges, dims=2, axes=2)
    p.blocks = [list(range(0, 6)), list(range(4, 10))]
    budget = SearchBudget(table=30, enum=30)
    start = [int(rng.integers(len(c))) for c in configs]
    start = solve(p, starts=[start], budget=budget).assignment  # as the planner calls it
    x, value = recut_and_descend(p, configs, start, budget, rounds=20)
    assert value <= assignment_cost(p, start) + 1e-12
    assert value == pytest.approx(assignment_cost(p, x), rel=1e-12)
    assert recut(p, configs, x, budget)[1] >= value - 1e-12
    assert solve(p, starts=[x], budget=budget).objective >= value - 1e-12


@pytest.mark.oracle
def test_kcut_final_configs_and_restrict():
    rng = np.random.default_rng(7)
    n, edges = GRAPHS["diamond"]
    p, configs = config_problem(rng, n, edges, dims=3)
    full = [[i for i, c in enumerate(cfgs) if all(d >= 0 for d in c)] for cfgs in configs]
    res = kcut(p, configs, sizes=(4, 2), bandwidth=(1e9, 1e9), final=full)
    # every node ends on a full-degree configuration (SoyBean: every cut splits every operator)
    assert all(a in f for a, f in zip(res.assignment, full, strict=True))
    assert [c.axis for c in res.cuts] == [0, 1]  # equal links: the larger axis first
    sub = restrict(p, full)
    local = project(res.assignment, full)
    assert assignment_cost(sub, local) == pytest.approx(res.objective, rel=1e-12)
    assert res.objective >= brute_force(sub)[1] - 1e-12


@pytest.mark.closed_form
def test_cut_order():
    assert cut_order((2, 4), (1e9, 1e9)) == [1, 0]  # tie on links: larger axis first
    assert cut_order((4, 4), (1e9, 1e9)) == [0, 1]  # then mesh order
    assert cut_order((2, 2, 2), (3e11, 2.5e10, 3e11)) == [1, 0, 2]


def tiny_step(params, batch):
    def loss(p):
        h = jnp.tanh(batch @ p["w1"])
        return jnp.sum(h @ p["w2"])

    return jax.grad(loss)(params)


def tiny_forward(w1, w2, x):
    return jnp.sum(jnp.tanh(x @ w1) @ w2)


CLUSTERS = {
    "cpu": lambda: "cpu",
    "mixed-gpu": lambda: jaxpar.Cluster.preset("mixed-gpu", devices=4),
    "accpar-tpu": lambda: jaxpar.Cluster.preset("accpar-tpu", devices=4),
}


@pytest.mark.oracle
@pytest.mark.parametrize("cluster", sorted(CLUSTERS))
def test_real_problem_vs_brute_force(cluster):
    f32 = jnp.float32
    args = (
        jax.ShapeDtypeStruct((8, 8), f32),
        jax.ShapeDtypeStruct((8, 4), f32),
        jax.ShapeDtypeStruct((4, 8), f32),
    )
    plan = jaxpar.plan(
        tiny_forward, *args, mesh={"x": 2, "y": 2}, cluster=CLUSTERS[cluster](), search="kcut",
        objective="time",
    )  # fmt: skip
    problem = plan.problem
    assert math.prod(len(u) for u in problem.unary) < 5e7
    _, best = brute_force(problem)  # a reshard per read: an upper bound of the reported cost
    _, low = brute_force(plan.tables.bound)  # its lower bound
    objectives = plan.stats["search_objectives"]  # each search's plan, reported cost
    assert low * (1 - 1e-9) <= objectives["elimination"] <= best * (1 + 1e-9)
    assert plan.searches["elimination"].certified == (objectives["elimination"] <= low * (1 + 1e-9))
    assert plan.lower_bound == pytest.approx(low, rel=1e-9)
    assert objectives["kcut"] >= low * (1 - 1e-9)
    assert objectives["kcut"] == pytest.approx(plan.evaluation.objective, rel=1e-9)
    assert objectives["kcut"] <= assignment_cost(problem, plan.assignment) * (1 + 1e-9)
    bw = plan.mesh_axes.bandwidth
    order = [c["axis"] for c in plan.stats["kcut_cuts"]]
    assert order == cut_order(plan.mesh_axes.sizes, bw)
    assert [bw[a] for a in order] == sorted(bw)  # slowest first


@pytest.mark.oracle
@pytest.mark.parametrize("cluster", sorted(CLUSTERS))
def test_real_train_step_kcut(cluster):
    """A gradient step (too many assignments for brute force): against certified elimination."""
    f32 = jnp.float32
    params = {"w1": jax.ShapeDtypeStruct((8, 8), f32), "w2": jax.ShapeDtypeStruct((8, 4), f32)}
    batch = jax.ShapeDtypeStruct((4, 8), f32)
    plan = jaxpar.plan(
        tiny_step, params, batch, mesh={"x": 2, "y": 2}, cluster=CLUSTERS[cluster](), search="kcut"
    )
    obj = plan.stats["search_objectives"]
    elim = jaxpar.plan(tiny_step, params, batch, mesh={"x": 2, "y": 2}, cluster=CLUSTERS[cluster]())
    assert elim.optimal and elim.stats["search"] == "elimination"
    assert obj["elimination"] == pytest.approx(elim.stats["objective"], rel=1e-12)
    assert obj["kcut"] >= obj["elimination"] * (1 - 1e-9)
    assert plan.stats["objective"] == pytest.approx(plan.evaluation.objective)
    assert plan.evaluation.objective <= assignment_cost(plan.problem, plan.assignment) * (1 + 1e-9)
    # certified only when it reaches the exact lower bound that certifies elimination's plan
    assert plan.optimal == (obj["kcut"] <= elim.lower_bound * (1 + 1e-9))
    assert "search (auto)" in plan.comparison() and "search (auto)" in elim.comparison()


@pytest.mark.oracle
def test_soybean_mlp_hybrid():
    """SoyBean §4.1: data parallel across the groups (slow links), model parallel within."""
    ex = zoo.get("soybean_mlp")
    mesh = {"node": 4, "gpu": 4}
    plan = jaxpar.plan(
        ex.step, *ex.args, mesh=mesh, cluster="p100", objective="comm", search="kcut"
    )
    assert [c["axis_name"] for c in plan.stats["kcut_cuts"]] == ["node", "gpu"]
    assert plan.stats["kcut_exact"]
    node_axis, gpu_axis = 0, 1
    checked = 0
    for node in plan.ng.nodes:
        if node.anchor < 0 or plan.program.eqns[node.anchor].primitive != "dot_general":
            continue
        label = plan.labels[node.index]
        # the first layer reads the raw input and goes model parallel over all 16 devices; the
        # weight gradient of the second follows its output's layout
        if label == "MLP/dense_0" or (label == "MLP/dense_1" and node.phase != "forward"):
            continue
        cfg = plan.configs[node.index][plan.assignment[node.index]]
        batch = plan.batch[node.index]
        assert cfg[node_axis] in batch, (label, node.phase, cfg)
        assert cfg[gpu_axis] >= 0 and cfg[gpu_axis] not in batch, (label, node.phase, cfg)
        checked += 1
    assert checked == 4 + 3 * 2  # forward of dense_1..4, backward (2 contractions) of dense_2..4
    for row in plan.layer_rows():
        if row["layer"] in ("MLP/dense_1", "MLP/dense_2", "MLP/dense_3", "MLP/dense_4"):
            assert row["config"].startswith("{n=4,"), row
    # joint elimination does better on this model (it may mix the axes per layer)
    obj = plan.stats["search_objectives"]
    assert obj["elimination"] <= obj["kcut"]
    assert plan.cost.comm_bytes < plan.baselines["data"].comm_bytes


@pytest.mark.api
def test_search_option_validation():
    with pytest.raises(ValueError, match="search='joint'"):
        jaxpar.PlannerOptions(search="joint")
    ex = zoo.get("mlp", small=True)
    plan = jaxpar.plan(ex.step, *ex.args, mesh={"a": 2, "b": 2}, search="kcut")
    assert plan.stats["search"] == "kcut"
    lone = jaxpar.plan(
        ex.step,
        *ex.args,
        mesh={"a": 2, "b": 2},
        options=jaxpar.PlannerOptions(search="kcut", compare_searches=False),
    )
    assert set(lone.stats["search_objectives"]) == {"kcut"}
    assert "search (" not in lone.comparison()
