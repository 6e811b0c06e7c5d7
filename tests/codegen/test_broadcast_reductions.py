"""Reductions of a tensor broadcast along some of the axes they reduce (issue 41).

An operand broadcast along a reduced axis of extent > 1 (an input expanded with stride 0, as
fusecut hands a broadcast gradient from one Thunder region to the next; a ``broadcast_in_dim``)
holds one value for that whole axis. A kernel iterates its domain, which has no axis where every
tensor of the segment is broadcast, so it visits that value once; torch counts it once per
element of the axis. The bias gradient of a pooled classifier was off by the pooled extent.

Per kernel kind (a column and a row reduction, a welford variance, a normalization, an online
log-sum-exp): how many elements each visited one stands for, every kernel through NVRTC, and on
the GPU the values against the torch reference.
"""

from __future__ import annotations

import pytest
import torch

from fusecut.codegen import generate_segment
from fusecut.codegen.kernel import copies_per_visit
from fusecut.optimizer.analysis.shapes import bind
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.inputs import TensorMeta
from fusecut.optimizer.planner import PlanOptions, make_plan
from fusecut.runtime.compile import compile_cubin
from fusecut.runtime.kernels import NOT_GENERATED
from fusecut.runtime.reference import run_reference
from fusecut.runtime.run import run_plan
from fusecut.runtime.tensors import make_input
from tests.helpers import fusion

F32 = DType.float32

# name -> (definition body, inputs, the kind of the segment holding the reductions and the
# copies of each of its reductions in program order: a maximum's too, which ignores them; None
# where the kind is the planner's choice)
CASES = {
    # a bias gradient: a layer-scale times a gradient expanded along the batch axis
    "column_sum": ("""
T0 = fd.define_tensor(shape=[-1, -1, -1, -1], contiguity=[None, True, True, True])
T1 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
T2 = fd.ops.broadcast_in_dim(T1, shape=T0.shape(), broadcast_dims=[3])
T3 = fd.ops.mul(T2, T0)
T4 = fd.ops.sum(T3, dims=[0, 1, 2], keepdim=False)
fd.add_output(T3)
fd.add_output(T4)
""", [TensorMeta((130, 130, 5, 16), (0, 80, 16, 1), F32, {}),
      TensorMeta((16,), (1,), F32, {})], "reduction", [130]),
    # a split column sum: many rows, few columns (a workspace and a finishing kernel)
    "split_column_sum": ("""
T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, None, True], dtype=DataType.Float)
T1 = fd.ops.sum(T0, dims=[0, 1], keepdim=False)
fd.add_output(T1)
""", [TensorMeta((4096, 56, 96), (96, 0, 1), F32, {})], "reduction", [56]),
    # a row sum whose row is broadcast along one of its two axes
    "row_sum": ("""
T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, None, True], dtype=DataType.Float)
T1 = fd.ops.exp(T0)
T2 = fd.ops.sum(T1, dims=[1, 2], keepdim=False)
fd.add_output(T2)
""", [TensorMeta((64, 8, 256), (256, 0, 1), F32, {})], "reduction", [8]),
    "var_mean": ("""
T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, None, True], dtype=DataType.Float)
T1, T2 = fd.ops.var_mean(T0, dims=[1, 2], correction=1, keepdim=False)
fd.add_output(T1)
fd.add_output(T2)
""", [TensorMeta((64, 8, 256), (256, 0, 1), F32, {})], "reduction", [8]),
    # softmax over two axes, one of them broadcast: the max, then the sum of exponentials
    "softmax": ("""
T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, None, True], dtype=DataType.Float)
T1 = fd.ops.max(T0, dims=[1, 2], keepdim=False)
T2 = fd.ops.broadcast_in_dim(T1, shape=T0.shape(), broadcast_dims=[0])
T3 = fd.ops.sub(T0, T2)
T4 = fd.ops.exp(T3)
T5 = fd.ops.sum(T4, dims=[1, 2], keepdim=False)
T6 = fd.ops.broadcast_in_dim(T5, shape=T0.shape(), broadcast_dims=[0])
T7 = fd.ops.div(T4, T6)
fd.add_output(T7)
""", [TensorMeta((64, 8, 256), (256, 0, 1), F32, {})], "normalization", [8, 8]),
    # log-sum-exp: one online accumulator for the max and the sum
    "logsumexp": ("""
T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, None, True], dtype=DataType.Float)
T1 = fd.ops.max(T0, dims=[1, 2], keepdim=False)
T2 = fd.ops.broadcast_in_dim(T1, shape=T0.shape(), broadcast_dims=[0])
T3 = fd.ops.sub(T0, T2)
T4 = fd.ops.exp(T3)
T5 = fd.ops.sum(T4, dims=[1, 2], keepdim=False)
T6 = fd.ops.log(T5)
T7 = fd.ops.add(T6, T1)
fd.add_output(T7)
""", [TensorMeta((64, 8, 256), (256, 0, 1), F32, {})], None, None),
    # a layer norm's backward: row sums beside column sums over the rows (inner-outer), with a
    # gradient broadcast along the rows' middle axis
    "layernorm_backward": ("""
T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, None, True], dtype=DataType.Float)
T1 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float)
T2 = fd.ops.mul(T0, T1)
T3 = fd.ops.sum(T2, dims=[2], keepdim=False)
T4 = fd.ops.broadcast_in_dim(T3, shape=T1.shape(), broadcast_dims=[0, 1])
T5 = fd.ops.sub(T0, T4)
T6 = fd.ops.sum(T2, dims=[0, 1], keepdim=False)
T7 = fd.ops.sum(T0, dims=[0, 1], keepdim=False)
fd.add_output(T5)
fd.add_output(T6)
fd.add_output(T7)
""", [TensorMeta((64, 8, 1024), (1024, 0, 1), F32, {}),
      TensorMeta((64, 8, 1024), (8192, 1024, 1), F32, {})], None, None),
}


def planned(name: str):
    body, metas, _, _ = CASES[name]
    f = fusion(body)
    return make_plan(f, metas, PlanOptions(time_limit_s=2)), f, metas


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_visited_element_counts_as_the_elements_it_stands_for(name):
    plan, f, metas = planned(name)
    _, _, kind, copies = CASES[name]
    bound = bind(f, metas)
    found = []
    for seg in plan.segments:
        s = seg.schedule
        ops = list(s.reductions) + list(s.outer_reductions) if s is not None else []
        if not ops:
            continue
        found.append((seg.kind.value, [copies_per_visit(bound, i, s.domain, s.reduction_axes
                                                        if i in s.reductions else s.outer_axes)
                                       for i in ops]))
    if kind is not None:
        assert (kind, copies) in found, found
    else:  # the kind is the planner's choice: some reduction still counts the broadcast axis
        assert any(max(c) > 1 for _, c in found), found


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_kernel_compiles(name):
    plan, _, _ = planned(name)
    for seg in plan.segments:
        if seg.kind in NOT_GENERATED:
            continue
        sk = generate_segment(plan, seg)
        for k in sk.kernels:
            assert compile_cubin(sk.source, "sm_90", k.name), k.name


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_on_the_gpu_like_torch(name):
    plan, f, metas = planned(name)
    gen = torch.Generator(device="cuda").manual_seed(0)
    args = [make_input(m, "cuda", gen) for m in metas]
    got = run_plan(plan, args).outputs
    want = run_reference(f, args)
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        scale = max(1.0, b.abs().max().item())
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * scale,
                                   msg=lambda m, k=k: f"{name} output {k}: {m}")
