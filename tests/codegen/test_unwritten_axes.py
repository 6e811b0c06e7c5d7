"""A pointwise segment whose outputs are all broadcast along an axis that nothing it reads
varies along (an attention mask built over the batch, ``where(mask, 0, -inf)`` from a mask
expanded over it): the kernel runs over one position of that axis, not every position with a
store at the first (8x the threads on GPT-2's [8, 1, 1024, 1024] mask, and scalar stores behind
a guard). Compiled with NVRTC and, run on the host, equal to the reference."""

from __future__ import annotations

import torch

from fusecut.codegen import generate_segment
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.inputs import tensor_meta
from fusecut.optimizer.planner import PlanOptions, make_plan
from fusecut.runtime.compile import compile_cubin
from fusecut.runtime.reference import run_reference
from fusecut.runtime.tensors import to_torch_dtype
from tests.helpers import extent_arg, fusion
from tests.host_kernels import run_on_host

MASK = """
T0 = fd.define_tensor(shape=[-1, 1, -1, -1], contiguity=[None, None, True, True],
                      dtype=DataType.Bool)
T1 = fd.define_tensor(shape=[], contiguity=[], dtype=DataType.BFloat16)
S2 = fd.define_scalar(-3.0e38, dtype=DataType.Double)
T3 = fd.ops.full(shape=[], fill_value=S2, dtype=DataType.BFloat16)
T4 = fd.ops.where(T0, T1, T3)
T5 = fd.ops.cast(T4, dtype=DataType.Float)
S6 = fd.define_scalar(0.5, dtype=DataType.Double)
T7 = fd.ops.mul(T5, S6)
fd.add_output(T4)
fd.add_output(T7)
"""
# the same mask beside a value that does vary along the batch: that output covers the axis
COVERED = MASK.replace("fd.add_output(T7)", """T8 = fd.define_tensor(shape=[-1, 1, -1, -1],
                      contiguity=[True, None, True, True], dtype=DataType.Float)
T9 = fd.ops.add(T7, T8)
fd.add_output(T9)""")


def _segment(body, metas):
    plan = make_plan(fusion(body), metas, PlanOptions(segmenter="greedy"))
    [segment] = plan.segments
    return plan, segment


def test_a_mask_broadcast_over_the_batch_is_computed_once_per_position(tmp_path):
    metas = [tensor_meta((8, 1, 64, 64), DType.bool, strides=(0, 0, 64, 1)),
             tensor_meta((), DType.bfloat16)]
    plan, segment = _segment(MASK, metas)
    kernels = generate_segment(plan, segment)
    compile_cubin(kernels.source, "sm_90", kernels.kernels[0].name)
    # 64 x 64 / 8 per vector, not 8 x that
    assert extent_arg(kernels.kernels[0], "n_vec") == 512
    assert "if (x0 == 0)" not in kernels.source
    (grid, _, _) = kernels.kernels[0].grid
    assert grid == 2  # 512 vectors / 256 threads
    mask = torch.rand(1, 1, 64, 64, generator=torch.Generator().manual_seed(0)) > 0.5
    value = torch.tensor(-2.5, dtype=torch.bfloat16)
    outs = {t: torch.empty((1, 1, 64, 64), dtype=to_torch_dtype(
        plan.bound.fusion.tensors[t].dtype)) for t in segment.schedule.outputs}
    inputs = dict(zip(plan.bound.fusion.inputs, [mask, value]))
    run_on_host(kernels, inputs | outs, tmp_path)
    want = run_reference(plan.bound.fusion, [mask.expand(8, 1, 64, 64), value])
    for t, w in zip(plan.bound.fusion.outputs, want):
        torch.testing.assert_close(outs[t].expand(8, 1, 64, 64), w, rtol=0, atol=0)


def test_an_output_along_the_batch_keeps_the_whole_domain():
    metas = [tensor_meta((8, 1, 64, 64), DType.bool, strides=(0, 0, 64, 1)),
             tensor_meta((), DType.bfloat16), tensor_meta((8, 1, 64, 64), DType.float32)]
    plan, segment = _segment(COVERED, metas)
    kernels = generate_segment(plan, segment)
    assert extent_arg(kernels.kernels[0], "n_vec") == 4096  # 8 x 64 x 64 / 8
