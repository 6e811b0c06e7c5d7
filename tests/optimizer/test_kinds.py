"""The segment-kind rules, both sides of each (what the code generator relies on)."""

from __future__ import annotations

from dataclasses import replace

from fusecut.optimizer.kinds.rules import Kind
from fusecut.optimizer.profiles import get_profile
from tests.helpers import graph

F = "dtype=DataType.Float"
IN2 = f"T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], {F})"


def kind_of(g, ops=None, written=None):
    ops = g.ops if ops is None else ops
    return g.classify(ops, written if written is not None else g.written(ops))


def test_pointwise_with_views_and_broadcasts():
    g = graph(IN2 + """
T1 = fd.ops.permute(T0, dims=[1, 0])
T2 = fd.ops.exp(T1)
T3 = fd.ops.slice(T2, start_indices=[0, 0], end_indices=[4, 8])
fd.add_output(T2)
fd.add_output(T3)""", (8, 16))
    s = kind_of(g)
    assert s.kind is Kind.POINTWISE and s.ref == "T2" and s.domain == (16, 8)
    assert s.axis_map["T3"] == (0, 1)  # a [4, 8] slice embeds in the [16, 8] domain


def test_pointwise_outputs_must_share_a_domain():
    g = graph(IN2 + """
T1 = fd.ops.slice(T0, start_indices=[0, 0], end_indices=[3, 1])
T2 = fd.ops.slice(T0, start_indices=[0, 0], end_indices=[2, 2])
fd.add_output(T1)
fd.add_output(T2)""", (8, 16))
    s = kind_of(g)
    assert not s and "do not share an iteration domain" in s.reason


def test_two_reductions_over_different_axes_cannot_share_a_segment():
    g = graph(IN2 + """
T1 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float)
T2 = fd.ops.sum(T1, dims=[0])
T3 = fd.ops.sum(T1, dims=[1])
fd.add_output(T2)
fd.add_output(T3)""", (2, 2), (4, 8, 16))
    s = kind_of(g)
    assert not s and "different" in s.reason
    same = graph(IN2 + """
T1 = fd.ops.sum(T0, dims=[1])
T2 = fd.ops.max(T0, dims=[1])
fd.add_output(T1)
fd.add_output(T2)""", (8, 16))
    assert kind_of(same).kind is Kind.REDUCTION


def test_normalization_needs_trailing_axes_and_a_budget():
    body = IN2 + """
T1 = fd.ops.sum(T0, dims=[{axis}])
T2 = fd.ops.broadcast_in_dim(T1, shape=T0.shape(), broadcast_dims=[{kept}])
T3 = fd.ops.div(T0, T2)
fd.add_output(T3)"""
    rows = graph(body.format(axis=1, kept=0), (64, 4096))
    s = kind_of(rows)
    assert s.kind is Kind.NORMALIZATION and s.reduction_axes == (1,)
    assert s.persistence.persisted == ("T0",) and s.persistence.row_bytes == 4096 * 4
    cols = graph(body.format(axis=0, kept=1), (64, 4096))
    s = kind_of(cols)
    assert not s and "trailing" in s.reason
    tight = replace(get_profile(), persistent_budget=8 * 1024)
    s = kind_of(graph(body.format(axis=1, kept=0), (64, 4096), profile=tight))
    assert not s and "budget" in s.reason


def test_reduction_with_prologue_and_epilogue():
    g = graph(IN2 + """
T1 = fd.ops.mul(T0, T0)
T2 = fd.ops.sum(T1, dims=[0, 1])
T3 = fd.ops.sqrt(T2)
fd.add_output(T1)
fd.add_output(T3)""", (8, 16))
    s = kind_of(g)
    assert s.kind is Kind.REDUCTION and s.reduction_axes == (0, 1)


def test_inner_outer_pairs_complementary_reductions():
    g = graph(IN2 + """
T1 = fd.ops.sum(T0, dims=[1])
T2 = fd.ops.broadcast_in_dim(T1, shape=T0.shape(), broadcast_dims=[0])
T3 = fd.ops.sub(T0, T2)
T4 = fd.ops.sum(T3, dims=[0])
fd.add_output(T3)
fd.add_output(T4)""", (64, 256))
    s = kind_of(g)
    assert s.kind is Kind.INNER_OUTER and s.reduction_axes == (1,) and s.outer_axes == (0,)
    not_complement = graph("""
T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float)
T1 = fd.ops.sum(T0, dims=[2])
T2 = fd.ops.sum(T0, dims=[0])
fd.add_output(T1)
fd.add_output(T2)""", (4, 8, 16))
    assert not kind_of(not_complement)


def test_library_runs_alone_and_views_stay_out_of_reductions():
    g = graph(IN2 + """
T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T2 = fd.ops.matmul(T0, T1)
T3 = fd.ops.relu(T2)
fd.add_output(T3)""", (8, 16), (16, 4))
    s = kind_of(g)
    assert not s and "alone" in s.reason
    (mm,) = [i for i in g.ops if g.fusion.ops[i].name == "matmul"]
    assert kind_of(g, [mm], {"T2"}).kind is Kind.LIBRARY
    regrouped = graph(IN2 + """
T1 = fd.ops.reshape(T0, new_shape=[16, 8])
T2 = fd.ops.sum(T1, dims=[1])
fd.add_output(T2)""", (8, 16))
    s = kind_of(regrouped)
    assert not s and "re-indexes" in s.reason
    # a merge whose parts would each be a piece of the domain's one axis
    merged = graph(IN2 + """
T1 = fd.ops.reshape(T0, new_shape=[-1])
T2 = fd.ops.sum(T1, dims=[0])
fd.add_output(T2)""", (8, 16))
    s = kind_of(merged)
    assert not s and "does not map onto the reduction domain" in s.reason


GROUP_NORM = """
T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.BFloat16)
T1 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.BFloat16)
T2 = fd.ops.reshape(T0, new_shape=[4, 8, 6, 32])
T3 = fd.ops.cast(T2, dtype=DataType.Float)
T4, T5 = fd.ops.var_mean(T3, dims=[2, 3], correction=0, keepdim=False)
T6 = fd.ops.broadcast_in_dim(T5, shape=[4, 8, 6, 32], broadcast_dims=[0, 1])
T7 = fd.ops.broadcast_in_dim(fd.ops.rsqrt(T4), shape=[4, 8, 6, 32], broadcast_dims=[0, 1])
T8 = fd.ops.mul(fd.ops.sub(T3, T6), T7)
T9 = fd.ops.reshape(T8, new_shape=[4, 48, 32])
T10 = fd.ops.broadcast_in_dim(T1, shape=[4, 48, 32], broadcast_dims=[1])
T11 = fd.ops.mul(T9, fd.ops.cast(T10, dtype=DataType.Float))
fd.add_output(fd.ops.cast(T11, dtype=DataType.BFloat16))
"""


def test_group_norm_is_one_normalization_over_the_split_channels():
    """[N, C, L] viewed as [N, G, C/G, L]: the domain is the grouped view; the channel axis of
    the input, the output and the weight lands on the run (G, C/G) of the domain."""
    g = graph(GROUP_NORM, (4, 48, 32), (48,))
    s = kind_of(g)
    assert s.kind is Kind.NORMALIZATION, s
    assert s.domain == (4, 8, 6, 32) and s.reduction_axes == (2, 3)
    assert s.axis_map["T0"] == (0, (1, 2), 3)
    assert s.axis_map["T1"] == ((1, 2),)
    assert s.persistence.persisted == ("T0",) and s.persistence.row_bytes == 6 * 32 * 2
    # the statistics alone are a reduction reading T0 through the split
    stats = [i for i in g.ops if g.fusion.ops[i].name in ("reshape", "cast", "var_mean")][:3]
    r = kind_of(g, stats, {"T4", "T5"})
    assert r.kind is Kind.REDUCTION and r.inputs == ("T0",)


def test_rows_may_skip_an_axis_when_they_hold_the_innermost():
    """Batch norm's rows: [N, C, L] reduced over N and L, per channel."""
    body = """
T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float)
T1 = fd.ops.sum(T0, dims=[{dims}])
T2 = fd.ops.broadcast_in_dim(T1, shape=T0.shape(), broadcast_dims=[{kept}])
fd.add_output(fd.ops.div(T0, T2))"""
    s = kind_of(graph(body.format(dims="0, 2", kept="1"), (8, 16, 64)))
    assert s.kind is Kind.NORMALIZATION and s.reduction_axes == (0, 2)
    s = kind_of(graph(body.format(dims="0, 1", kept="2"), (8, 16, 64)))
    assert not s and "trailing" in s.reason  # the innermost axis is kept: rows cut across it


def test_segment_set_forces_a_boundary():
    g = graph(IN2 + """
T1 = fd.ops.exp(T0)
T2 = fd.ops.segment_set(T1)
T3 = fd.ops.neg(T2)
fd.add_output(T3)""", (8, 16))
    s = kind_of(g)
    assert not s and "segment_set" in s.reason


def test_reduction_over_broadcast_axes_is_pointwise():
    g = graph("""
T0 = fd.define_tensor(shape=[-1, 1], contiguity=[True, None], dtype=DataType.Float)
T1 = fd.ops.sum(T0, dims=[1])
fd.add_output(T1)""", (8, 1))
    assert kind_of(g).kind is Kind.POINTWISE
