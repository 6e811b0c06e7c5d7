"""One plan for a range of shapes (issue 44, item 2): a shape's plan is its representative's
(free extents rounded up to powers of two), searched once and rebound to each shape of the range
without a search; a shape where that plan does not hold is planned itself."""

from __future__ import annotations

import math
import random

import pytest
import torch

import fusecut.engine
from fusecut.engine import Engine
from fusecut.optimizer.analysis.shapes import bind
from fusecut.optimizer.ir import parse_text
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.inputs import ScalarMeta, tensor_meta
from fusecut.optimizer.plan.rebind import (
    REBOUND,
    fixed_extents,
    free_extents,
    rebind,
    representative,
    representative_fusion,
)
from fusecut.optimizer.plan.restore import restore_plan
from fusecut.optimizer.planner import make_plan
from fusecut.runtime.reference import run_reference
from tests.codegen.test_extent_arguments import CASES
from tests.conftest import CORPUS
from tests.helpers import fusion

B, F, I64 = DType.bfloat16, DType.float32, DType.int64


def metas_of(name: str, rows: int) -> list:
    return [tensor_meta(shape, dtype) for shape, dtype in CASES[name][1](rows)]


def fixed_of(f, metas) -> set[int]:
    return fixed_extents(bind(f, metas))


def test_free_extents_are_the_ones_no_reduction_and_no_hidden_size_has():
    # the logits' rows and the 1-D labels' extent are one extent; the vocabulary is reduced
    # (and the logits' innermost), never free
    metas = metas_of("cross_entropy", 1000)
    f = parse_text(CASES["cross_entropy"][0]).fusion
    assert fixed_of(f, metas) == {128256}
    assert free_extents(metas, {128256}) == {1000}
    assert [m.shape for m in representative(metas, {128256})] == [(1024, 128256), (1024,)]
    # [batch, sequence, hidden] with a per-row [batch, sequence, 1]: batch and sequence round
    three = [tensor_meta((6, 1000, 2048), B), tensor_meta((6, 1000, 1), F),
             tensor_meta((2048,), B), ScalarMeta(F, 0.5)]
    shapes = [getattr(m, "shape", None) for m in representative(three, {2048})]
    assert shapes == [(8, 1024, 2048), (8, 1024, 1), (2048,), None]
    assert representative(three, {2048})[0].strides == (1024 * 2048, 2048, 1)
    # a sequence that a reduction reduces (attention's softmax over the keys) is fixed
    f, metas = thunder_rmsnorm_bwd(6, 1000)
    assert fixed_of(f, metas) == {2048}
    softmax = parse_text(CASES["softmax"][0]).fusion
    assert fixed_of(softmax, [tensor_meta((4096, 1000), B)]) == {1000}
    # an extent that is also a fixed one stays (the plan may turn on it)
    assert free_extents([tensor_meta((4096, 4096), F)], {4096}) == set()


def test_a_tensor_that_is_not_dense_keeps_its_extents():
    padded = tensor_meta((1000, 64), F, strides=(80, 1))
    assert representative([padded], set()) == [padded]


@pytest.mark.parametrize("name", list(CASES))
def test_a_rebound_plan_is_the_segmentation_checked_at_the_new_extents(name):
    text = CASES[name][0]
    f = parse_text(text).fusion
    source = make_plan(f, metas_of(name, 4096))
    for rows in (1000, 3000, 777):
        made = rebind(source, f, metas_of(name, rows))
        assert made is not None and made.solver.status == REBOUND
        assert made.rebound_from == source.plan_id
        assert [(s.kind, s.schedule.ops, s.schedule.outputs) for s in made.segments] == \
            [(s.kind, s.schedule.ops, s.schedule.outputs) for s in source.segments]
        # bound to the new extents: every tensor's shape and the bytes follow the rows
        assert math.prod(made.bound.shapes[f.inputs[0]][:-1]) == rows
        searched = make_plan(f, metas_of(name, rows))
        assert made.plan_id != searched.plan_id  # kernels cached by plan id never mix them
        assert made.io_bytes == pytest.approx(searched.io_bytes, rel=0.02)
        # its JSON restores to the same plan (a plan file, a service's answer)
        assert restore_plan(f, metas_of(name, rows), made.to_json()).plan_id == made.plan_id


def test_a_plan_that_does_not_bind_at_the_new_extents_is_none():
    # the definition fixes the rows (a reshape to literal sizes): another row count has no plan
    body = ("T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], "
            "dtype=DataType.Float)\nT1 = fd.ops.reshape(T0, new_shape=[8, 64])\n"
            "T2 = fd.ops.sum(T1, dims=[1])\nfd.add_output(T2)")
    f = fusion(body)
    source = make_plan(f, [tensor_meta((8, 64), F)])
    assert rebind(source, f, [tensor_meta((16, 64), F)]) is None


def test_execution_plans_are_the_same_whatever_order_the_shapes_come_in(monkeypatch):
    f = parse_text(CASES["rmsnorm_bwd"][0]).fusion
    rows = [1000, 4096, 3000, 12345, 777, 2048, 5000, 1500]
    seen = {}
    for seed in range(3):
        order = rows[:]
        random.Random(seed).shuffle(order)
        handle = Engine().fusion(f)
        for r in order:
            plan = handle.execution_plan(metas_of("rmsnorm_bwd", r))
            assert seen.setdefault(r, plan.plan_id) == plan.plan_id, (seed, r)
        # one search per power-of-two range: 1024 (777, 1000), 2048 (1500, 2048), 4096
        # (3000, 4096), 8192 (5000), 16384 (12345); every shape but 2048 and 4096 rebound
        stats = handle.engine.stats
        assert (stats.plans_made, stats.plans_rebound) == (5, 6)


def test_fd_plan_still_shows_the_search_for_exactly_these_inputs():
    handle = Engine().fusion(parse_text(CASES["softmax"][0]).fusion)
    metas = metas_of("softmax", 1000)
    assert handle.execution_plan(metas).solver.status == REBOUND
    assert handle.plan(metas).solver.status != REBOUND
    assert handle.execution_plan(metas).plan_id != handle.plan(metas).plan_id


def test_a_rebound_run_on_the_cpu_equals_the_reference(monkeypatch):
    text = CASES["rmsnorm_bwd"][0]
    f = parse_text(text).fusion
    engine = Engine()
    handle = engine.fusion(f)
    g = torch.Generator().manual_seed(0)

    def check(rows: int) -> None:
        args = [torch.randn(rows, 256, generator=g).to(torch.bfloat16),
                torch.randn(rows, 256, generator=g).to(torch.bfloat16),
                torch.rand(rows, 1, generator=g) + 0.5,
                torch.randn(256, generator=g).to(torch.bfloat16)]
        got = handle.execute(args)
        want = run_reference(f, args)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)

    for rows in (64, 100, 37):
        check(rows)
    assert engine.stats.plans_rebound == 2  # 100 and 37 (64 is its own representative)

    def refuse(*a, **k):
        raise AssertionError("searched again")

    monkeypatch.setattr(fusecut.engine, "make_plan", refuse)
    check(50)  # the range of 64: rebound, no search
    assert engine.stats.plans_rebound == 3


def thunder_rmsnorm_bwd(batch: int, seq: int):
    """The corpus's RMSNorm backward as Thunder writes it for one shape: its sizes in its
    broadcasts; and its inputs' metadata."""
    text = (CORPUS / "rmsnorm_bwd_thunder.py").read_text()
    text = text.replace("[8, 2048, 2048]", f"[{batch}, {seq}, 2048]")
    text = text.replace("[8, 2048, 1]", f"[{batch}, {seq}, 1]")
    rows, row = (batch, seq, 2048), (batch, seq, 1)
    metas = [tensor_meta(shape, dtype) for shape, dtype in
             [(rows, B), (rows, B), ((2048,), B), (rows, B), (row, F), (rows, B)]]
    return parse_text(text).fusion, metas


def test_the_representative_definition_rounds_the_sizes_written_in_it():
    f, metas = thunder_rmsnorm_bwd(6, 1000)
    rep = representative_fusion(f, metas, fixed_of(f, metas))
    shapes = [op.attrs["shape"] for op in rep.ops if op.name == "broadcast_in_dim"]
    assert [8, 1024, 2048] in shapes and [8, 1024, 1] in shapes  # the row length stays 2048
    assert [op.attrs["shape"] for op in f.ops if op.name == "broadcast_in_dim"][0] == \
        [6, 1000, 2048]  # the definition itself is left as it was
    # a shape of its own range: nothing to round, the same definition
    f, metas = thunder_rmsnorm_bwd(8, 1024)
    assert representative_fusion(f, metas, fixed_of(f, metas)) is f


def test_definitions_written_per_shape_share_their_ranges_search(monkeypatch):
    engine = Engine()
    f, metas = thunder_rmsnorm_bwd(8, 1024)
    first = engine.fusion(f).execution_plan(metas)
    assert first.solver.status != REBOUND

    def refuse(*a, **k):
        raise AssertionError("searched again")

    monkeypatch.setattr(fusecut.engine, "make_plan", refuse)
    for batch, seq in ((6, 1024), (5, 1000), (7, 777)):  # Thunder's retraces: new definitions
        f, metas = thunder_rmsnorm_bwd(batch, seq)
        plan = engine.fusion(f).execution_plan(metas)
        assert plan.solver.status == REBOUND and plan.bound.shapes[f.inputs[0]] == \
            (batch, seq, 2048)
        assert [s.kind for s in plan.segments] == [s.kind for s in first.segments]
    assert (engine.stats.plans_made, engine.stats.plans_rebound) == (1, 3)


def test_a_symbolic_plan_keeps_its_pattern_through_json_and_binds_any_rows():
    from dataclasses import replace

    from fusecut.optimizer.errors import InputError
    from fusecut.optimizer.plan.rebind import bind_symbolic

    text, _ = CASES["softmax"]
    f = parse_text(text).fusion
    stand_in = [tensor_meta((1024, 4096), DType.bfloat16)]
    searched = make_plan(f, stand_in)
    plan = replace(searched, symbolic=((0, 0),))
    assert plan.plan_id != searched.plan_id  # holds for more: another id
    data = plan.to_json()
    assert data["valid_for"] == [{"input": f.inputs[0], "shape": [{"min": 2, "max": None},
                                                                  4096]}]
    restored = restore_plan(f, stand_in, data)
    assert restored.symbolic == ((0, 0),) and restored.plan_id == plan.plan_id
    assert bind_symbolic(plan, stand_in) is plan
    other = bind_symbolic(plan, [tensor_meta((3000, 4096), DType.bfloat16)])
    assert other.rebound_from == plan.plan_id and other.bound.inputs[f.inputs[0]].shape == (
        3000, 4096)
    with pytest.raises(InputError, match="axis 1: plan .* was made for extent 4096, got 2048"):
        bind_symbolic(plan, [tensor_meta((3000, 2048), DType.bfloat16)])
    with pytest.raises(InputError, match="float16"):
        bind_symbolic(plan, [tensor_meta((3000, 4096), DType.float16)])
