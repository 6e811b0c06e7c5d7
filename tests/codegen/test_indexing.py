"""Which axes a pointwise kernel indexes as one (codegen.indexing): decided on a survey of its
accesses and of the names its values read, before the kernel is written, which is written
once."""

from __future__ import annotations

from fusecut.codegen import generate_segment
from fusecut.codegen import pointwise as pointwise_module
from fusecut.codegen.indexing import Indexing, direct_indexing, launch_for, survey
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.inputs import tensor_meta
from fusecut.optimizer.planner import PlanOptions, make_plan
from tests.helpers import fusion

CONTIGUOUS = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
fd.add_output(fd.ops.mul(T0, T1))
"""
# the iota's position is x1 itself, read by the value's code: the axes stay apart
IOTA = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
S1 = fd.ops.size(T0, dim=1)
T2 = fd.ops.iota(S1, dtype=DataType.Float)
T3 = fd.ops.broadcast_in_dim(T2, shape=T0.shape(), broadcast_dims=[1])
fd.add_output(fd.ops.add(T0, T3))
"""
SLICE = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.ops.slice(T0, start_indices=[0, 1], end_indices=[6, 11], strides=[1, 1])
fd.add_output(fd.ops.neg(T1))
"""


def _segment(body: str, *shapes):
    f = fusion(body)
    metas = [tensor_meta(s, DType.float32) for s in shapes]
    plan = make_plan(f, metas, PlanOptions(segmenter="greedy"))
    (seg,) = plan.segments
    return plan, seg


def test_contiguous_accesses_merge_and_the_kernel_is_written_once(monkeypatch):
    plan, seg = _segment(CONTIGUOUS, (64, 96), (64, 96))
    ix, launch = direct_indexing(plan.bound, seg.schedule, None)
    assert ix.runs == ((0, 1),) and ix.extents == [64 * 96] and launch.vector == 4
    written = []
    monkeypatch.setattr(pointwise_module, "segment_kernels",
                        lambda *args, made=pointwise_module.segment_kernels: written.append(1) or
                        made(*args))
    assert generate_segment(plan, seg).notes["indexed_as"] == [64 * 96]
    assert written == [1]


def test_a_survey_gives_every_access_and_the_names_values_read():
    plan, seg = _segment(IOTA, (64, 96))
    per_axis = ((0, 0), (1, 1))
    launch = launch_for(plan.bound, seg.schedule, per_axis, None)
    found = survey(plan.bound, seg.schedule, Indexing((64, 96), per_axis, launch.vector), launch)
    assert found.rows == ((96, 1), (96, 1))  # T0 read, the output written: both contiguous
    assert "x1" in found.reads  # the iota's position
    ix, _ = direct_indexing(plan.bound, seg.schedule, None)
    assert not ix.merged


def test_a_slice_keeps_the_axes_apart():
    plan, seg = _segment(SLICE, (6, 12))
    per_axis = ((0, 0), (1, 1))
    launch = launch_for(plan.bound, seg.schedule, per_axis, None)
    found = survey(plan.bound, seg.schedule, Indexing((6, 10), per_axis, launch.vector), launch)
    assert found.rows is None  # T0 is read at (x0, (1 + x1)): not a plain domain index
    assert not direct_indexing(plan.bound, seg.schedule, None)[0].merged
