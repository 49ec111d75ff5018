"""HyPar (AccPar §3.5): the planner's search over Type-I (batch) / Type-II (D_i) partitions."""

import jax
import jaxpar_zoo as zoo
import pytest
from helpers import assert_equivalent

import jaxpar
from jaxpar.nodes.configs import CONTRACTIONS
from jaxpar.search.baselines import STRATEGIES, _best_on_dim, type2_dims

SETUPS = [({"data": 2, "model": 4}, "dgx-h100"), ({"node": 2, "gpu": 4}, "p100")]


def contraction_nodes(plan):
    for node in plan.ng.nodes:
        if node.anchor >= 0 and plan.program.eqns[node.anchor].primitive in CONTRACTIONS:
            yield node


def assert_hypar_space(plan):
    data = plan.choice.baselines["data"][0]
    for node in contraction_nodes(plan):
        i = node.index
        cfg = plan.configs[i][plan.assignment[i]]
        allowed = plan.batch[i] | type2_dims(plan.ng, i, plan.batch[i])
        # every axis on the batch (Type-I) or on D_i (Type-II), or the node's data-parallel config
        assert all(d in allowed for d in cfg) or plan.assignment[i] == data[i], (
            plan.labels[i],
            node.phase,
            node.space.names,
            cfg,
        )


@pytest.mark.closed_form
def test_hand_plans_put_the_most_devices_on_one_dim():
    """`_best_on_dim`: the config with the largest device product on one of ``dims`` and no
    axis elsewhere, the first of equals; else the first replicated one, else 0."""
    sizes = (2, 4)  # config: per mesh axis, the dim it splits (-1: none)
    cfgs = [(-1, -1), (0, -1), (-1, 0), (0, 0), (1, 0), (0, 1)]
    assert _best_on_dim(cfgs, [0], sizes) == 3  # both axes on dim 0: 8 devices
    assert _best_on_dim(cfgs, [1], sizes) == 0  # nothing splits only dim 1: replicated
    assert _best_on_dim(cfgs, [1, 0], sizes) == 3
    assert _best_on_dim(cfgs[1:], [], sizes) == 0
    assert _best_on_dim([(1, 0), (-1, -1)], [], sizes) == 1
    assert _best_on_dim([(0, -1), (-1, 0), (0, 0)], [0], (2, 2)) == 2
    assert _best_on_dim([(1, -1), (-1, 1)], [1], (2, 2)) == 0  # equal: the first


@pytest.mark.closed_form
@pytest.mark.parametrize("name", ["soybean_mlp", "lenet5"])
def test_type2_dims_follow_accpar_table3(name):
    """Dense: forward splits the contracted D_i, the input gradient its result's D_i, the weight
    gradient the D_i rows of dW (AccPar Table 3, Type-II column). LeNet-5's top layer reads the
    loss gradient from a forward-phase node (merged followers): the rule must not use phases."""
    ex = zoo.get(name, small=name != "soybean_mlp")
    plan = jaxpar.plan(ex.step, *ex.args, mesh={"a": 2, "b": 2})
    seen = set()
    for node in contraction_nodes(plan):
        if plan.program.eqns[node.anchor].primitive != "dot_general":
            continue
        i, batch = node.index, plan.batch[node.index]
        got = type2_dims(plan.ng, i, batch)
        if node.phase == "forward":  # F_l (B, D_i) x W (D_i, D_o): dims (B, D_o, D_i)
            want, kind = {2}, "forward"
        elif batch == {0}:  # E_{l+1} (B, D_o) x W^T: dims (B, D_i, D_o)
            want, kind = {1}, "input-grad"
        else:  # E_{l+1}^T (D_o, B) x F_l (B, D_i) in jax's order: dims (D_o, D_i, B)
            assert batch == {2}
            want, kind = {1}, "weight-grad"
        assert got == want, (plan.labels[i], kind, node.space.names, got)
        seen.add((plan.labels[i], kind))
    layers = {label for label, _ in seen}
    assert {(layer, k) for layer in layers for k in ("forward", "weight-grad")} <= seen
    assert sum(k == "input-grad" for _, k in seen) >= len(layers) - 1  # not of the first layer


@pytest.mark.closed_form
def test_type2_dims_conv():
    """Convolutions: Type-II is the input-channel dim k forward; input gradient: its result's
    channel c; weight gradient: the kernel's input-channel dim (size C_in of the layer)."""
    ex = zoo.get("lenet5", small=True)
    plan = jaxpar.plan(ex.step, *ex.args, mesh={"a": 2, "b": 2})
    convs = [
        n
        for n in contraction_nodes(plan)
        if plan.program.eqns[n.anchor].primitive == "conv_general_dilated"
    ]
    c_in = {
        plan.labels[n.index]: n.space.sizes[n.space.names.index("k")]
        for n in convs
        if n.phase == "forward"
    }
    kinds = set()
    for node in convs:
        i, names = node.index, node.space.names
        (got,) = type2_dims(plan.ng, i, plan.batch[i])
        if node.phase == "forward":
            assert names[got] == "k", (plan.labels[i], names, got)
        elif plan.batch[i] == {0}:  # input gradient
            assert names[got] == "c", (plan.labels[i], names, got)
            kinds.add("input-grad")
        else:  # weight gradient: the batch is contracted
            assert node.space.sizes[got] == c_in[plan.labels[i]], (plan.labels[i], names, got)
            kinds.add("weight-grad")
    assert kinds == {"input-grad", "weight-grad"}


@pytest.mark.oracle
@pytest.mark.parametrize(("mesh", "cluster"), SETUPS, ids=str)
@pytest.mark.parametrize("name", ["mlp", "cnn", "gpt_small"])
def test_hypar_between_auto_and_data(name, mesh, cluster):
    ex = zoo.get(name, small=True)
    auto = jaxpar.plan(ex.step, *ex.args, mesh=mesh, cluster=cluster)
    hypar = jaxpar.plan(ex.step, *ex.args, mesh=mesh, cluster=cluster, strategy="hypar")
    assert hypar.strategy == "hypar"
    assert_hypar_space(hypar)
    data = hypar.baselines["data"]
    assert hypar.cost.step_s <= data.step_s * (1 + 1e-9), hypar.comparison()
    if auto.optimal:  # the full space contains HyPar's
        assert auto.stats["objective"] <= hypar.stats["objective"] * (1 + 1e-9)
    assert "hypar*" in hypar.comparison()


@pytest.mark.oracle
def test_hypar_kcut_and_comm():
    ex = zoo.get("soybean_mlp")
    mesh = {"node": 4, "gpu": 4}
    plan = jaxpar.plan(
        ex.step,
        *ex.args,
        mesh=mesh,
        cluster="p100",
        objective="comm",
        strategy="hypar",
        search="kcut",
    )
    assert_hypar_space(plan)
    assert plan.cost.comm_bytes <= plan.baselines["data"].comm_bytes
    auto = jaxpar.plan(ex.step, *ex.args, mesh=mesh, cluster="p100", objective="comm")
    assert auto.cost.comm_bytes <= plan.cost.comm_bytes * (1 + 1e-9)
    with pytest.raises(ValueError, match="strategy='hypar'"):
        auto.variant("hypar")


@pytest.mark.numerics
def test_hypar_auto_shard_numerics():
    assert "hypar" in STRATEGIES
    ex = zoo.get("mlp", small=True)
    args = ex.make_args(0)
    ref = jax.jit(ex.step)(*args)
    mesh = jaxpar.make_mesh({"data": 2, "model": 4})
    step = jaxpar.auto_shard(
        ex.step, mesh=mesh, cluster="dgx-h100", strategy="hypar", objective="time"
    )
    out = step(*args)
    assert_equivalent(out, ref)
    assert step.plan.strategy == "hypar"
    assert_hypar_space(step.plan)
    # the plan does use model parallelism (Type-II) somewhere: it is not just data parallel
    data = step.plan.choice.baselines["data"][0]
    assert step.plan.assignment != data
