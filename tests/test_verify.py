"""Tests for jaxpar.verify: HLO collective parsing and ring-traffic accounting.

Unit tests run on literal HLO lines in every replica-group format XLA prints; integration tests
compile small jitted functions on 8 fake CPU devices and check the collectives XLA emitted
against hand-computed kinds, group sizes and bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxpar.verify.compiled import (
    HloCollective,
    collective_summary,
    compiled_collectives,
    module_device_count,
    parse_collectives,
    replica_group_size,
)
from jaxpar.verify.hlo_text import shape_bytes

pytestmark = pytest.mark.closed_form

F32 = 4


def _only(hlo: str, num_devices: int = 8) -> HloCollective:
    colls = parse_collectives(hlo, num_devices)
    assert len(colls) == 1, colls
    return colls[0]


# --------------------------------------------------------------------------------------------
# Shapes and element sizes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "nbytes"),
    [
        ("f32[8,64]{0,1}", 8 * 64 * 4),
        ("f32[]", 4),
        ("pred[3]", 3),
        ("s8[5]{0}", 5),
        ("u8[5]", 5),
        ("bf16[4,8]", 64),
        ("f16[4,8]", 64),
        ("s16[2]", 4),
        ("u16[2]", 4),
        ("s32[3]", 12),
        ("u32[]", 4),
        ("f64[2]", 16),
        ("s64[2]", 16),
        ("u64[2]", 16),
        ("c64[2]", 16),
        ("c128[2]", 32),
        ("f8e4m3fn[16]", 16),
        ("f8e5m2[16]", 16),
        ("f8e4m3b11fnuz[16]", 16),
        ("s4[16]", 8),
        ("token[]", 0),
        ("f32[<=8,4]", 128),
        ("f32[8,128]{1,0:T(8,128)}", 8 * 128 * 4),
        ("(f32[2], bf16[4])", 16),
        ("(f32[1,1,8]{2,1,0}, /*index=5*/f32[1,1,8]{2,1,0})", 64),
        ("((f32[2]), f32[1], u32[])", 16),
    ],
)
def test_shape_bytes(shape: str, nbytes: int) -> None:
    assert shape_bytes(shape) == nbytes


def test_unknown_element_type_raises() -> None:
    with pytest.raises(ValueError, match="element type"):
        shape_bytes("q7[4]")


# --------------------------------------------------------------------------------------------
# Replica group formats
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attrs", "size"),
    [
        # explicit
        (", replica_groups={{0,1,2,3},{4,5,6,7}}, to_apply=%add", 4),
        (", replica_groups={{0,4},{1,5},{2,6},{3,7}}, dimensions={0}", 2),
        (", replica_groups={{0,1,2,3,4,5,6,7}}", 8),
        (", replica_groups={{0},{1},{2},{3},{4},{5},{6},{7}}", 1),
        (", replica_groups={}, to_apply=%add", 8),
        (", channel_id=1, to_apply=%add", 8),  # no attribute: every device
        # iota
        (", replica_groups=[2,4]<=[8], use_global_device_ids=true", 4),
        (", replica_groups=[4,2]<=[2,4]T(1,0), dimensions={1}", 2),
        (", replica_groups=[4,2]<=[2,2,2]T(1,0,2), dimensions={1}", 2),
        (", replica_groups=[1,8]<=[8]", 8),
        # mesh axes
        (", replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}, dimensions={1}", 4),
        (", replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_0'}, dimensions={0}", 2),
        (", replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_0','axis_1'}", 8),
        (", replica_groups=mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0)) {'axis_1'}", 2),
        ((", replica_groups=mesh['axis_0'=4,'axis_1'=2], device_ids=([2,2,2]T(0,2,1)) "
          "{'axis_0':(2)2}"), 2),
        ((", replica_groups=mesh['axis_0'=1,'axis_1'=4,'axis_2'=2], device_ids=([2,4]T(1,0)) "
          "{'axis_1'}"), 4),
        (", replica_groups=mesh['axis_0'=8] {'axis_0':(1)2,'axis_0':(4)2}", 4),
        ((", replica_groups=mesh['axis_0'=2,'axis_1'=4], device_ids=(0,4,1,5,2,6,3,7) "
          "{'axis_1'}"), 4),
        # upstream XLA prints mesh axis names unquoted
        (", replica_groups=mesh[x=2,y=4] {y}", 4),
        (", replica_groups=mesh[x=2,y=4] {}", 1),
        (", replica_groups=maximal_mesh[device_id=3] {}", 1),
    ],
)  # fmt: skip
def test_replica_group_size(attrs: str, size: int) -> None:
    assert replica_group_size(attrs, 8) == size


def test_unequal_explicit_groups_raise() -> None:
    with pytest.raises(ValueError, match="unequal"):
        replica_group_size(", replica_groups={{0,1,2},{3,4}}", 5)


def test_iota_groups_must_cover_devices() -> None:
    with pytest.raises(ValueError, match="cover"):
        replica_group_size(", replica_groups=[2,3]<=[8]", 8)


def test_unknown_mesh_axis_raises() -> None:
    with pytest.raises(ValueError, match="unknown mesh axis"):
        replica_group_size(", replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_9'}", 8)


# --------------------------------------------------------------------------------------------
# Every kind, one literal line each, closed-form bytes
# --------------------------------------------------------------------------------------------


def test_all_reduce_iota() -> None:
    line = (
        "%all-reduce = f32[8,64]{0,1} all-reduce(%w), channel_id=1, replica_groups=[2,4]<=[8], "
        "use_global_device_ids=true, to_apply=%add.clone"
    )
    coll = _only(line)
    s = 8 * 64 * F32
    assert (coll.kind, coll.group_size, coll.buffer_bytes) == ("all-reduce", 4, s)
    assert coll.bytes_per_device == pytest.approx(2 * 3 / 4 * s)
    assert coll.shape == "f32[8,64]"
    assert coll.op_name == ""
    assert coll.line == line


def test_all_reduce_explicit_tuple_sums_elements() -> None:
    coll = _only(
        "%all-reduce = (f32[4,64]{1,0}, bf16[4,64]{1,0}) all-reduce(%p, %q), channel_id=1, "
        "replica_groups={{0,1,2,3},{4,5,6,7}}, use_global_device_ids=true, to_apply=%r, "
        'metadata={op_name="jit(f)/shard_map/psum_invariant" stack_frame_id=5}'
    )
    s = 4 * 64 * 4 + 4 * 64 * 2
    assert (coll.group_size, coll.buffer_bytes) == (4, s)
    assert coll.bytes_per_device == pytest.approx(2 * 3 / 4 * s)
    assert coll.shape == "(f32[4,64], bf16[4,64])"
    assert coll.op_name == "jit(f)/shard_map/psum_invariant"


def test_all_reduce_empty_groups_span_all_devices() -> None:
    coll = _only("%ar = f32[16]{0} all-reduce(%x), replica_groups={}, to_apply=%add", 8)
    assert coll.group_size == 8
    assert coll.bytes_per_device == pytest.approx(2 * 7 / 8 * 64)


def test_all_gather_mesh_with_device_ids() -> None:
    coll = _only(
        "%all-gather = f32[4,64]{0,1} all-gather(%x), channel_id=4, "
        "replica_groups=mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0)) {'axis_1'}, "
        "dimensions={1}, use_global_device_ids=true"
    )
    s_out = 4 * 64 * F32
    assert (coll.kind, coll.group_size, coll.buffer_bytes) == ("all-gather", 2, s_out)
    assert coll.bytes_per_device == pytest.approx(1 / 2 * s_out)


def test_all_gather_iota_transposed() -> None:
    coll = _only(
        "%all-gather = f32[4,32]{0,1} all-gather(%c), channel_id=2, "
        "replica_groups=[4,2]<=[4,2]T(1,0), dimensions={1}, use_global_device_ids=true"
    )
    assert coll.group_size == 2
    assert coll.bytes_per_device == pytest.approx(1 / 2 * 4 * 32 * F32)


def test_reduce_scatter_explicit() -> None:
    coll = _only(
        "%reduce_scatter.7 = f32[4,16]{0,1} reduce-scatter(%wrapped_copy), channel_id=1, "
        "replica_groups={{0,1,2,3},{4,5,6,7}}, use_global_device_ids=true, dimensions={1}, "
        'to_apply=%region_0.0, metadata={op_name="jit(f)/shard_map/reduce_scatter"}'
    )
    s_out = 4 * 16 * F32
    assert (coll.kind, coll.group_size, coll.buffer_bytes) == ("reduce-scatter", 4, s_out)
    # (n-1)/n * S_in with S_in = n * S_out
    assert coll.bytes_per_device == pytest.approx(3 / 4 * (4 * s_out)) == 3 * s_out


def test_all_to_all_mesh_sub_axis() -> None:
    coll = _only(
        "%all-to-all.1 = (f32[1,4,16]{2,1,0}, f32[1,4,16]{2,1,0}) all-to-all(%a, %b), "
        "channel_id=2, replica_groups=mesh['axis_0'=4,'axis_1'=2], "
        "device_ids=([2,2,2]T(0,2,1)) {'axis_0':(2)2}, "
        'metadata={op_name="jit(f)/mul" stack_frame_id=7}'
    )
    s = 2 * 4 * 16 * F32
    assert (coll.kind, coll.group_size, coll.buffer_bytes) == ("all-to-all", 2, s)
    assert coll.bytes_per_device == pytest.approx(1 / 2 * s)
    assert coll.shape == "(f32[1,4,16], f32[1,4,16])"
    assert coll.op_name == "jit(f)/mul"


def test_all_to_all_array_form() -> None:
    coll = _only(
        "%all_to_all.5 = bf16[8,8,4]{2,1,0} all-to-all(%x), channel_id=1, "
        "replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}"
    )
    assert coll.group_size == 8
    assert coll.bytes_per_device == pytest.approx(7 / 8 * 8 * 8 * 4 * 2)


def test_all_to_all_index_comments_are_ignored() -> None:
    elems = ", ".join(["f32[1,1,8]{2,1,0}"] * 5 + ["/*index=5*/f32[1,1,8]{2,1,0}"] * 3)
    operands = ", ".join([f"%s{i}" for i in range(5)] + ["/*index=5*/%s5", "%s6", "%s7"])
    coll = _only(
        f"%all-to-all.1 = ({elems}) all-to-all({operands}), channel_id=1, "
        "replica_groups=mesh['axis_0'=1,'axis_1'=8] {'axis_1'}"
    )
    s = 8 * 8 * F32
    assert (coll.group_size, coll.buffer_bytes) == (8, s)
    assert coll.bytes_per_device == pytest.approx(7 / 8 * s)


def test_collective_permute_counts_only_moving_devices() -> None:
    coll = _only(
        "%collective-permute = f32[4,32]{0,1} collective-permute(%c), channel_id=3, "
        "source_target_pairs={{0,0},{2,4},{1,1},{3,5},{4,2},{6,6},{5,3},{7,7}}"
    )
    s = 4 * 32 * F32
    assert (coll.kind, coll.group_size, coll.buffer_bytes) == ("collective-permute", 8, s)
    # devices 2,3,4,5 send, 0,1,6,7 keep their data: half the devices move S bytes
    assert coll.bytes_per_device == pytest.approx(s * 4 / 8)


def test_collective_permute_ring() -> None:
    coll = _only(
        "%ppermute.3 = f32[2,64]{1,0} collective-permute(%p), channel_id=1, "
        "source_target_pairs={{0,1},{1,2},{2,3},{3,0},{4,5},{5,6},{6,7},{7,4}}"
    )
    assert coll.bytes_per_device == pytest.approx(2 * 64 * F32)


def test_group_of_one_sends_nothing() -> None:
    coll = _only(
        "%ar = f32[8]{0} all-reduce(%x), replica_groups={{0},{1},{2},{3}}, to_apply=%add", 4
    )
    assert coll.group_size == 1
    assert coll.bytes_per_device == 0.0
    assert _only("%ag = f32[8]{0} all-gather(%x), replica_groups=[8,1]<=[8], dimensions={0}")\
        .bytes_per_device == 0.0  # fmt: skip


# --------------------------------------------------------------------------------------------
# Async pairs, wrapped computations, fusions: each collective counted exactly once
# --------------------------------------------------------------------------------------------


def _hlo(*lines: str) -> str:
    """HLO text from instruction lines (long lines are written as concatenated pieces)."""
    return "\n".join(lines) + "\n"


def test_all_gather_start_uses_result_part() -> None:
    hlo = _hlo(
        (
            "%ag-start = (f32[4,16]{1,0}, f32[4,64]{1,0}) all-gather-start(%x), channel_id=1, "
            "replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={1}, use_global_device_ids=true"
        ),
        "%ag-done = f32[4,64]{1,0} all-gather-done(%ag-start)",
    )
    coll = _only(hlo)
    assert (coll.kind, coll.shape, coll.buffer_bytes) == ("all-gather", "f32[4,64]", 1024)
    assert coll.bytes_per_device == pytest.approx(3 / 4 * 1024)


def test_multi_operand_all_gather_start() -> None:
    coll = _only(
        "%ags = ((f32[2]{0}, bf16[2]{0}), (f32[4]{0}, bf16[4]{0})) all-gather-start(%a, %b), "
        "replica_groups=[4,2]<=[8], dimensions={0}"
    )
    assert coll.shape == "(f32[4], bf16[4])"
    assert coll.buffer_bytes == 4 * 4 + 4 * 2


def test_all_reduce_start_keeps_its_shape() -> None:
    hlo = _hlo(
        (
            "%ar-start = f32[8,32]{1,0} all-reduce-start(%x), channel_id=1, "
            "replica_groups=[2,4]<=[8], to_apply=%add"
        ),
        "%ar-done = f32[8,32]{1,0} all-reduce-done(%ar-start)",
    )
    coll = _only(hlo)
    assert (coll.kind, coll.buffer_bytes, coll.group_size) == ("all-reduce", 1024, 4)
    assert coll.bytes_per_device == pytest.approx(2 * 3 / 4 * 1024)


@pytest.mark.parametrize(
    "start_shape",
    ["(f32[4,32]{0,1}, f32[4,32]{0,1}, u32[], u32[])", "(f32[4,32]{0,1}, f32[4,32]{0,1})"],
)
def test_collective_permute_start(start_shape: str) -> None:
    hlo = _hlo(
        (
            f"%cp-start = {start_shape} collective-permute-start(%c), channel_id=3, "
            "source_target_pairs={{0,1},{1,0}}"
        ),
        "%cp-done = f32[4,32]{0,1} collective-permute-done(%cp-start)",
    )
    coll = _only(hlo, 4)
    assert (coll.kind, coll.shape, coll.group_size) == ("collective-permute", "f32[4,32]", 4)
    # 2 of the 4 devices send their 512-byte buffer
    assert coll.bytes_per_device == pytest.approx(512 * 2 / 4)


def test_sugared_async_reduce_scatter_and_all_to_all() -> None:
    hlo = _hlo(
        (
            "%rs-start = ((f32[8,32]{1,0}), f32[2,32]{1,0}, u32[]) reduce-scatter-start(%p), "
            "channel_id=1, replica_groups=[2,4]<=[8], dimensions={0}, to_apply=%add"
        ),
        "%rs-done = f32[2,32]{1,0} reduce-scatter-done(%rs-start)",
        (
            "%a2a-start = ((f32[8,16]{1,0}), f32[8,16]{1,0}) all-to-all-start(%q), channel_id=2, "
            "replica_groups={{0,1},{2,3},{4,5},{6,7}}, dimensions={0}"
        ),
        "%a2a-done = f32[8,16]{1,0} all-to-all-done(%a2a-start)",
    )
    rs, a2a = parse_collectives(hlo, 8)
    assert (rs.kind, rs.shape, rs.group_size) == ("reduce-scatter", "f32[2,32]", 4)
    assert rs.bytes_per_device == pytest.approx(3 * 2 * 32 * F32)
    assert (a2a.kind, a2a.shape, a2a.group_size) == ("all-to-all", "f32[8,16]", 2)
    assert a2a.bytes_per_device == pytest.approx(1 / 2 * 8 * 16 * F32)


ASYNC_WRAPPED_MODULE = _hlo(
    "HloModule m, is_scheduled=true, num_partitions=8",
    "",
    "%wrapped_reduce_scatter (p: f32[8,32]) -> f32[2,32] {",
    "  %p = f32[8,32]{1,0} parameter(0)",
    (
        "  ROOT %reduce-scatter.1 = f32[2,32]{1,0} reduce-scatter(%p), channel_id=1, "
        "replica_groups=[2,4]<=[8], dimensions={0}, to_apply=%add"
    ),
    "}",
    "",
    "ENTRY %main (x: f32[8,32]) -> f32[2,32] {",
    "  %x = f32[8,32]{1,0} parameter(0)",
    (
        "  %async-start = ((f32[8,32]{1,0}), f32[2,32]{1,0}, s32[]) async-start(%x), "
        "calls=%wrapped_reduce_scatter"
    ),
    "  ROOT %async-done = f32[2,32]{1,0} async-done(%async-start)",
    "}",
)


def test_generic_async_start_counts_the_wrapped_collective_once() -> None:
    coll = _only(ASYNC_WRAPPED_MODULE)
    assert (coll.kind, coll.group_size, coll.shape) == ("reduce-scatter", 4, "f32[2,32]")


def test_sugared_start_with_printed_body_is_not_double_counted() -> None:
    hlo = ASYNC_WRAPPED_MODULE.replace(
        "async-start(%x), calls=",
        "reduce-scatter-start(%x), channel_id=1, replica_groups=[2,4]<=[8], dimensions={0}, "
        "to_apply=%add, calls=",
    )
    coll = _only(hlo)
    assert coll.line.startswith("%async-start = ")


FUSED_MODULE = _hlo(
    (
        "HloModule jit_f, is_scheduled=true, "
        "entry_computation_layout={(f32[4,16]{1,0})->f32[4,64]{1,0}}, num_partitions=8"
    ),
    "",
    "%fused_computation (param_0: f32[4,64]) -> f32[4,64] {",
    "  %param_0 = f32[4,64]{0,1} parameter(0)",
    '  %all-reduce.9 = f32[4,64]{1,0} copy(%param_0), metadata={op_name="all-gather(x)"}',
    "  ROOT %multiply.1 = f32[4,64]{1,0} multiply(%all-reduce.9, %all-reduce.9)",
    "}",
    "",
    "ENTRY %main.0_spmd (param: f32[4,16]) -> f32[4,64] {",
    (
        "  %param = f32[4,16]{1,0} parameter(0), "
        "sharding={devices=[1,4,2]<=[8] last_tile_dim_replicate}"
    ),
    (
        "  %all-gather = f32[4,64]{0,1} all-gather(%param), channel_id=1, "
        "replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}, dimensions={1}, "
        'use_global_device_ids=true, metadata={op_name="jit(f)/mul" stack_frame_id=3}'
    ),
    "  ROOT %fusion = f32[4,64]{1,0} fusion(%all-gather), kind=kLoop, calls=%fused_computation",
    "}",
)


def test_mentions_of_collective_names_are_not_collectives() -> None:
    coll = _only(FUSED_MODULE)
    assert (coll.kind, coll.group_size, coll.op_name) == ("all-gather", 4, "jit(f)/mul")
    assert module_device_count(FUSED_MODULE) == 8


def test_quoted_collective_names_are_not_parsed() -> None:
    hlo = _hlo(
        '%cc = f32[4]{0} custom-call(%x), custom_call_target="all-gather(x)"',
        '%y = f32[4]{0} negate(%x), metadata={op_name="jit(f)/ all-reduce(y)"}',
    )
    assert parse_collectives(hlo, 8) == []


def test_malformed_collective_raises() -> None:
    with pytest.raises(ValueError, match="element type"):
        parse_collectives("%ar = q7[4]{0} all-reduce(%x), replica_groups={}", 8)


def test_collective_inside_a_fusion_body_is_counted_once() -> None:
    hlo = _hlo(
        "%wrapped_all-reduce-start {",
        "  %param = f32[65536]{0} parameter(0)",
        (
            "  ROOT %all-reduce-start = f32[65536]{0} all-reduce-start(%param), "
            "replica_groups={{0,1}}, to_apply=%apply_op"
        ),
        "}",
        "",
        "ENTRY %entry {",
        "  %param = f32[65536]{0} parameter(0)",
        (
            "  ROOT %fusion = f32[65536]{0} fusion(%param), kind=kLoop, "
            "calls=%wrapped_all-reduce-start"
        ),
        "}",
    )
    coll = _only(hlo, 2)
    assert (coll.kind, coll.group_size) == ("all-reduce", 2)


def test_instruction_split_over_lines_is_joined() -> None:
    hlo = """
  %ag-start = (f32[8,256]{1,0}, f32[16,256]{1,0}) all-gather-start(
      f32[8,256]{1,0} %input), replica_groups={{0,1}}, dimensions={0},
      metadata={op_type="AllGather" op_name="ag0"}
  ROOT %ag-done = f32[16,256]{1,0} all-gather-done(
      (f32[8,256]{1,0}, f32[16,256]{1,0}) %ag-start)
"""
    coll = _only(hlo, 2)
    assert (coll.shape, coll.group_size, coll.op_name) == ("f32[16,256]", 2, "ag0")
    assert coll.bytes_per_device == pytest.approx(1 / 2 * 16 * 256 * F32)


def test_collective_summary_sums_per_kind() -> None:
    hlo = """
  %a = f32[8]{0} all-reduce(%x), replica_groups=[2,4]<=[8], to_apply=%add
  %b = f32[16]{0} all-reduce(%y), replica_groups=[4,2]<=[8], to_apply=%add
  %c = f32[8]{0} all-gather(%z), replica_groups=[2,4]<=[8], dimensions={0}
"""
    summary = collective_summary(parse_collectives(hlo, 8))
    assert list(summary) == ["all-gather", "all-reduce"]
    assert summary["all-reduce"]["count"] == 2
    assert summary["all-reduce"]["bytes_per_device"] == pytest.approx(
        2 * 3 / 4 * 32 + 2 * 1 / 2 * 64
    )
    assert summary["all-gather"] == {"count": 1, "bytes_per_device": pytest.approx(3 / 4 * 32)}
    assert collective_summary([]) == {}


def test_module_device_count() -> None:
    assert module_device_count("HloModule m, num_partitions=8\n") == 8
    assert module_device_count("HloModule m, replica_count=4, num_partitions=2\n") == 8
    assert module_device_count("HloModule m, is_scheduled=true\n") == 1
    with pytest.raises(ValueError, match="HloModule"):
        module_device_count("ENTRY %main {}")


# --------------------------------------------------------------------------------------------
# Integration: what XLA really emits on 8 fake CPU devices
# --------------------------------------------------------------------------------------------

needs_8_devices = pytest.mark.skipif(
    len(jax.devices()) < 8, reason="needs 8 devices (fake CPU devices from tests/conftest.py)"
)
AUTO = jax.sharding.AxisType.Auto


def _mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> jax.sharding.Mesh:
    return jax.make_mesh(shape, names, axis_types=(AUTO,) * len(names))


def _collectives(fn: Callable[..., Any], *args: jax.Array) -> list[HloCollective]:
    return compiled_collectives(jax.jit(fn).lower(*args).compile())


def _put(shape: tuple[int, ...], mesh: jax.sharding.Mesh, spec: P) -> jax.Array:
    return jax.device_put(jnp.ones(shape, jnp.float32), NamedSharding(mesh, spec))


def _constrain(mesh: jax.sharding.Mesh, spec: P) -> Callable[[jax.Array], jax.Array]:
    """f(x) = 2x, with the result forced to ``spec``."""
    return lambda x: jax.lax.with_sharding_constraint(x * 2, NamedSharding(mesh, spec))


@pytest.fixture
def mesh_2x4() -> jax.sharding.Mesh:
    return _mesh((2, 4), ("data", "model"))


@pytest.fixture
def mesh_2x2x2() -> jax.sharding.Mesh:
    return _mesh((2, 2, 2), ("a", "b", "c"))


@needs_8_devices
def test_compiled_all_reduce(mesh_2x4: jax.sharding.Mesh) -> None:
    # contraction dim sharded over 'model', output replicated: partial sums all-reduced
    x = _put((8, 64), mesh_2x4, P(None, "model"))
    w = _put((64, 32), mesh_2x4, P("model", None))
    out = NamedSharding(mesh_2x4, P())
    (coll,) = _collectives(lambda a, b: jax.lax.with_sharding_constraint(a @ b, out), x, w)
    s = 8 * 32 * F32  # the full (8,32) result on every device
    assert (coll.kind, coll.group_size, coll.buffer_bytes) == ("all-reduce", 4, s)
    assert coll.bytes_per_device == pytest.approx(2 * 3 / 4 * s)
    assert "dot_general" in coll.op_name


@needs_8_devices
def test_compiled_all_gather(mesh_2x4: jax.sharding.Mesh) -> None:
    y = _put((8, 64), mesh_2x4, P("data", "model"))
    (coll,) = _collectives(_constrain(mesh_2x4, P("data", None)), y)
    s_out = 4 * 64 * F32  # gathered over 'model': rows still split by 'data'
    assert (coll.kind, coll.group_size, coll.buffer_bytes) == ("all-gather", 4, s_out)
    assert coll.bytes_per_device == pytest.approx(3 / 4 * s_out)


@needs_8_devices
def test_compiled_all_to_all(mesh_2x4: jax.sharding.Mesh) -> None:
    # 'model' moves from dim 0 to dim 1
    y = _put((8, 64), mesh_2x4, P("model", None))
    (coll,) = _collectives(_constrain(mesh_2x4, P(None, "model")), y)
    s = 8 * 16 * F32  # the (8,16) output shard, as 4 tuple pieces
    assert (coll.kind, coll.group_size, coll.buffer_bytes) == ("all-to-all", 4, s)
    assert coll.bytes_per_device == pytest.approx(3 / 4 * s)


@needs_8_devices
def test_compiled_collective_permute(mesh_2x4: jax.sharding.Mesh) -> None:
    # P('model',None) -> P(('data','model'),None): device (d,m) = 4d+m needs row 4d+m, which
    # lives on the devices of 'model' index (4d+m)//2. Only devices 0 (row 0) and 7 (row 7)
    # already hold it, so 6 of 8 devices receive their one-row (1,32) shard.
    y = _put((8, 32), mesh_2x4, P("model", None))
    (coll,) = _collectives(_constrain(mesh_2x4, P(("data", "model"), None)), y)
    s = 1 * 32 * F32
    assert (coll.kind, coll.group_size, coll.buffer_bytes) == ("collective-permute", 8, s)
    assert coll.bytes_per_device == pytest.approx(s * 6 / 8)


@needs_8_devices
def test_compiled_3axis_all_reduce_over_non_adjacent_axes(mesh_2x2x2: jax.sharding.Mesh) -> None:
    # contraction over ('a','c'): XLA prints a mesh with a transposed device order
    x = _put((8, 64), mesh_2x2x2, P(None, ("a", "c")))
    w = _put((64, 32), mesh_2x2x2, P(("a", "c"), None))
    out = NamedSharding(mesh_2x2x2, P())
    (coll,) = _collectives(lambda a, b: jax.lax.with_sharding_constraint(a @ b, out), x, w)
    s = 8 * 32 * F32
    assert (coll.kind, coll.group_size) == ("all-reduce", 4)
    assert coll.bytes_per_device == pytest.approx(2 * 3 / 4 * s)


@needs_8_devices
def test_compiled_3axis_all_gather_iota_groups(mesh_2x2x2: jax.sharding.Mesh) -> None:
    # P('a',('b','c')) -> P('a','b'): gather over 'c' (size 2); XLA prints iota groups here
    z = _put((8, 64), mesh_2x2x2, P("a", ("b", "c")))
    (coll,) = _collectives(_constrain(mesh_2x2x2, P("a", "b")), z)
    s_out = 4 * 32 * F32
    assert (coll.kind, coll.group_size, coll.buffer_bytes) == ("all-gather", 2, s_out)
    assert coll.bytes_per_device == pytest.approx(1 / 2 * s_out)


@needs_8_devices
def test_compiled_3axis_all_to_all_over_sub_axis(mesh_2x2x2: jax.sharding.Mesh) -> None:
    # P(('a','b'),'c') -> P('b',('a','c')): 'a' moves to dim 1 by an all-to-all over a size-2
    # sub-axis (printed as {'axis_1':(2)2}); a collective-permute then reorders the shards.
    z = _put((8, 64), mesh_2x2x2, P(("a", "b"), "c"))
    colls = _collectives(_constrain(mesh_2x2x2, P("b", ("a", "c"))), z)
    (a2a,) = [c for c in colls if c.kind == "all-to-all"]
    s = 4 * 16 * F32  # the (4,16) output shard
    assert (a2a.group_size, a2a.buffer_bytes) == (2, s)
    assert a2a.bytes_per_device == pytest.approx(1 / 2 * s)
    assert ":(2)2}" in a2a.line
    assert {c.kind for c in colls} <= {"all-to-all", "collective-permute"}


@needs_8_devices
def test_compiled_shard_map_explicit_groups(mesh_2x4: jax.sharding.Mesh) -> None:
    # shard_map collectives print explicit replica groups
    def body(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
        scattered = jax.lax.psum_scatter(a, "model", scatter_dimension=1, tiled=True)
        shifted = jax.lax.ppermute(b, "model", [(i, (i + 1) % 4) for i in range(4)])
        return scattered, shifted

    fn = jax.shard_map(
        body,
        mesh=mesh_2x4,
        in_specs=(P("data", None), P("model", None)),
        out_specs=(P("data", "model"), P("model", None)),
    )
    a = _put((8, 64), mesh_2x4, P("data", None))
    b = _put((8, 64), mesh_2x4, P("model", None))
    by_kind = {c.kind: c for c in _collectives(fn, a, b)}
    assert sorted(by_kind) == ["collective-permute", "reduce-scatter"]
    rs = by_kind["reduce-scatter"]
    s_out = 4 * 16 * F32  # (4,64) local block summed over 'model', scattered along dim 1
    assert (rs.group_size, rs.buffer_bytes) == (4, s_out)
    assert "replica_groups={{0,1,2,3},{4,5,6,7}}" in rs.line
    assert rs.bytes_per_device == pytest.approx(3 * s_out)
    cp = by_kind["collective-permute"]
    assert cp.bytes_per_device == pytest.approx(2 * 64 * F32)  # every device sends its block


@needs_8_devices
def test_compiled_without_collectives(mesh_2x4: jax.sharding.Mesh) -> None:
    y = _put((8, 64), mesh_2x4, P("data", "model"))
    assert _collectives(_constrain(mesh_2x4, P("data", "model")), y) == []
