"""Combined all-reduces (`jaxpar.combine`): XLA's combiner replayed on the planned program."""

import math

import jaxpar_zoo as zoo
import pytest

import jaxpar
from jaxpar.verify.compiled import fidelity
from jaxpar.xla.allreduce_combiner import COMBINERS, AllReduceItem, Combiner, group_all_reduces

KEY = ("sum", "float32", (0,), -1)


def _items(*specs):
    """(eqn, key, bytes) per item."""
    return [AllReduceItem(e, k, b) for e, k, b in specs]


@pytest.mark.closed_form
def test_independent_all_reduces_of_one_key_combine():
    items = _items((1, KEY, 10), (2, KEY, 10), (3, KEY, 10))
    assert group_all_reduces(items, [0, 0, 0], COMBINERS["cpu"]) == [0, 0, 0]


@pytest.mark.closed_form
def test_a_dependent_all_reduce_starts_a_new_group():
    # item 1 reads item 0's result (a forward chain of batch-norm statistics)
    items = _items((1, KEY, 10), (2, KEY, 10), (3, KEY, 10))
    groups = group_all_reduces(items, [0, 0b001, 0b010], COMBINERS["cpu"])
    assert groups == [0, 1, 2]
    # item 2 depends on item 0 only: it may join item 1's group, item 1 not item 0's
    assert group_all_reduces(items, [0, 0b001, 0b001], COMBINERS["cpu"]) == [0, 1, 1]


@pytest.mark.closed_form
def test_keys_and_thresholds_split_groups():
    other = ("sum", "float32", (1,), -1)
    items = _items((1, KEY, 10), (2, other, 10), (3, KEY, 10), (4, other, 10))
    assert group_all_reduces(items, [0] * 4, COMBINERS["cpu"]) == [0, 1, 0, 1]
    small = Combiner("test", 25, 8)
    items = _items((1, KEY, 10), (2, KEY, 10), (3, KEY, 10), (4, KEY, 30))
    # 10 + 10 fit, the third would pass 25 bytes; 30 bytes is above the threshold: alone
    assert group_all_reduces(items, [0] * 4, small) == [0, 0, 1, 2]
    assert group_all_reduces(_items(*((i, KEY, 1) for i in range(5))), [0] * 5, Combiner(
        "two", math.inf, 2
    )) == [0, 0, 1, 1, 2]  # fmt: skip


@pytest.mark.closed_form
def test_combining_merges_dependencies():
    """A, B, D, C in program order; B reads A, C reads D. A and C combine; then B depends on
    D through the combined op (D -> C=A -> B), so B and D cannot combine, though neither reads
    the other."""
    items = _items((1, KEY, 1), (2, ("max",), 1), (4, KEY, 1), (3, ("max",), 1))
    deps = [0, 0b0001, 0b1000, 0]  # B reads A; C reads D
    assert group_all_reduces(items, deps, COMBINERS["cpu"]) == [0, 1, 0, 2]


@pytest.mark.closed_form
@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp", "gpt_small", "cnn"])
@pytest.mark.parametrize("axes", [{"d": 8}, {"a": 2, "b": 2, "c": 2}])
def test_predicted_counts_match_the_compiled_program(name, axes):
    """Per collective kind, the predicted count after combining is the compiled program's
    (within 10 % or ±1) for the hand plans on one and three mesh axes: data parallelism (whose
    gradient all-reduces XLA merges) and the `model` and `owt` plans (their gathers of small
    tensors). test_numerics checks the same of the auto plans on every mesh and of the hand
    plans on (2, 4), with the programs it compiles anyway."""
    ex = zoo.get(name, small=True)
    mesh = jaxpar.make_mesh(axes)
    for strategy in ("data", "model", "owt"):
        step = jaxpar.auto_shard(ex.step, mesh=mesh, strategy=strategy)
        compiled = step.lower(*ex.args).compile()
        check = fidelity(step.plan.collectives, compiled)
        assert check.counts_ok(), check.text
        assert check.ok(), check.text
        cost = step.plan.cost
        assert cost.combined_all_reduces == check.predicted_counts.get("all-reduce", 0)
        assert cost.combined_step_s <= cost.step_s


@pytest.mark.closed_form
@pytest.mark.slow
def test_all_reduces_combine_only_when_their_replica_groups_are_listed_alike():
    """On three axes the partial sums over one axis list their replica groups in the order of
    the other two as their partitioned operand splits them (`evaluation.group_order`), and XLA
    combines only identical lists: the small Llama's auto plan on 2x2x2 compiles to exactly the
    predicted all-reduces after combining (30; a key by the reduced axes alone predicted 29)."""
    ex = zoo.get("llama_small")
    step = jaxpar.auto_shard(ex.step, mesh=jaxpar.make_mesh({"a": 2, "b": 2, "c": 2}))
    compiled = step.lower(*ex.args).compile()
    check = fidelity(step.plan.collectives, compiled)
    assert check.predicted_counts["all-reduce"] == check.hlo_counts["all-reduce"], check.text
    assert check.ok(), check.text


@pytest.mark.closed_form
def test_combined_latency_is_paid_once_per_group():
    """Data-parallel GPT on two P100 nodes: 28 gradient all-reduces over the same axes combine
    into one, so the combined step saves 27 all-reduce latencies."""
    from jaxpar.hardware.collectives import ALL_REDUCE, ring_steps

    ex = zoo.get("gpt_small", small=True)
    plan = jaxpar.plan(ex.step, *ex.args, mesh={"node": 2, "gpu": 4}, cluster="p100",
                       strategy="data")  # fmt: skip
    ars = [c for c in plan.collectives if c.kind == ALL_REDUCE]
    assert len(ars) == 28 and len({c.group for c in ars}) == 1
    n, _, lat = plan.mesh_axes.group((0, 1))
    latency = lat * ring_steps(ALL_REDUCE, n)  # the α term of one all-reduce
    assert latency > 0
    assert plan.cost.step_s - plan.cost.combined_step_s == pytest.approx(27 * latency)
    assert "combined: 28 all-reduces run as 1" in plan.report()


@pytest.mark.closed_form
def test_uniform_tensors_are_gathered_for_free():
    """A broadcast of a constant scalar, its views and elementwise functions of only such
    tensors hold one value: XLA turns their all-gathers into broadcasts
    (`buffers.uniform_tensors`), so a reshard path prices their all-to-alls only. Values
    read from data, iotas and loop inputs are not uniform."""
    import jax
    import jax.numpy as jnp

    from jaxpar.trace.tracing import trace
    from jaxpar.xla.buffer_assignment import uniform_tensors
    from jaxpar.xla.reshard_paths import ALL_GATHER, ALL_TO_ALL, priced_steps, reshard_path

    def f(x):
        seed = (jnp.zeros_like(x) + 1.0) * 0.5  # uniform: a broadcast, then + and * of literals
        ramp = jnp.arange(x.shape[0], dtype=x.dtype)[:, None] + seed  # an iota: not uniform
        carry = jax.lax.fori_loop(0, 3, lambda i, c: c + x, jnp.ones_like(x))  # a loop input
        return x * seed + ramp + carry

    program, _ = trace(f, (jnp.ones((8, 4)),))
    uniform = uniform_tensors(program)
    by_op = {}
    for e in program.eqns:
        by_op.setdefault(e.primitive, []).extend(e.outputs)
    assert by_op["mul"][0] in uniform  # the seed
    assert not uniform & set(by_op["iota"]) and not uniform & set(program.invars)
    entering = {t for e in program.regions[0].carry_eqns for t in program.eqns[e].inputs}
    assert entering and not uniform & entering

    path = reshard_path(1024, ((0,), (1,)), ((1,), ()), (2, 2))
    assert [s.kind for s in path] == [ALL_GATHER, ALL_TO_ALL]
    assert [s.kind for s in priced_steps(path, True)] == [ALL_TO_ALL]
    assert [s.kind for s in priced_steps(path)] == [ALL_GATHER, ALL_TO_ALL]


@pytest.mark.closed_form
def test_a_uniform_tensor_of_one_element_per_device_is_gathered_for_real():
    """XLA folds a broadcast to a one-element shard into a constant and all-gathers it: a
    bincount's zeros[4] split four ways costs an all-gather. So a uniform tensor with at most
    as many elements as the mesh has devices is priced like any other
    (`tables.gathers_free`); the plan keeps the counts replicated, and the compiled
    collectives are the predicted ones (before: an unpredicted all-gather of 12 bytes)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxpar.cost.search_tables import gathers_free

    def route(x, w):
        sizes = jnp.bincount(jnp.argmax(x @ w, -1), length=4)
        return sizes.astype(jnp.float32).sum() * x

    x = jnp.cos(jnp.arange(512 * 64, dtype=jnp.float32)).reshape(512, 64)
    w = jnp.sin(jnp.arange(64 * 4, dtype=jnp.float32)).reshape(64, 4)
    step = jaxpar.auto_shard(route, mesh=jaxpar.make_mesh({"a": 2, "b": 4}))
    np.testing.assert_allclose(np.asarray(step(x, w)), np.asarray(jax.jit(route)(x, w)))
    program = step.plan.program
    (zeros,) = [e.inputs[0] for e in program.eqns if e.primitive == "scatter-add"]
    assert not gathers_free(program, zeros, 8) and gathers_free(program, zeros, 2)
    check = fidelity(step.plan.collectives, step.lower(x, w).compile())
    assert check.ok() and check.predicted_counts == check.hlo_counts, check.text
