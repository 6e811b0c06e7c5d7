"""Gathers whose index the kernel computes itself (issue 30): nanoGPT's position embedding reads
rows at an ``iota`` the kernel recomputes per element, and cross-entropy's backward reads the
target's logit at ``where(label != ignore, label, V)`` over a padded row. A pointwise kernel issues
its loads before the compute; such a load's address reads a value of the compute, which was
declared after it ("identifier T8 is undefined" from NVRTC on the whole GPT).

Now a lane-invariant index moves up with the load (the vector keeps its one 16-byte read), and an
index that varies with the lane keeps the load after it. Each kernel compiles with NVRTC and,
run on the host, equals the reference.
"""

from __future__ import annotations

import pytest
import torch

from fusecut.codegen import generate_segment
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.inputs import tensor_meta
from fusecut.optimizer.planner import PlanOptions, make_plan
from fusecut.runtime.compile import compile_cubin
from fusecut.runtime.reference import run_reference
from fusecut.runtime.tensors import to_torch_dtype
from tests.helpers import fusion
from tests.host_kernels import run_on_host

# token and position embeddings: wte[idx] + wpe[iota(T)], the iota also an output
EMBEDDINGS = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Int)
T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T2 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
S5 = fd.define_scalar(32, dtype=DataType.Int)
S6 = fd.define_scalar(0, dtype=DataType.Int)
S7 = fd.define_scalar(1, dtype=DataType.Int)
T8 = fd.ops.iota(S5, start=S6, step=S7, dtype=DataType.Int)
T9 = fd.ops.reshape(T0, new_shape=[64])
T10 = fd.ops.index_select(T1, T9, dim=0)
T11 = fd.ops.reshape(T10, new_shape=[2, 32, 64])
T12 = fd.ops.index_select(T2, T8, dim=0)
T13 = fd.ops.broadcast_in_dim(T12, shape=[2, 32, 64], broadcast_dims=[1, 2])
T14 = fd.ops.add(T11, T13)
fd.add_output(T8)
fd.add_output(T14)
"""
# cross-entropy's backward gathers the target logit of a padded row; label -1 is ignored
TARGET_LOGIT = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int)
T27 = fd.ops.broadcast_in_dim(T1, shape=[64, 1], broadcast_dims=[0])
S28 = fd.define_scalar(-1, dtype=DataType.Int)
T29 = fd.ops.ne(T27, S28)
S30 = fd.define_scalar(128, dtype=DataType.Int)
T31 = fd.ops.where(T29, T27, S30)
S32 = fd.define_scalar(0.0, dtype=DataType.Double)
T33 = fd.ops.pad(T0, pad_widths=[0, 1, 0, 0], value=S32)
T34 = fd.ops.take_along_axis(T33, T31, dim=1)
T37 = fd.ops.cast(T29, dtype=DataType.Int)
fd.add_output(T34)
fd.add_output(T37)
"""
# an index that differs from lane to lane: a row gather along the innermost axis
PER_LANE = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Int)
S2 = fd.define_scalar(1, dtype=DataType.Int)
T3 = fd.ops.add(T1, S2)
T4 = fd.ops.take_along_axis(T0, T3, dim=1)
fd.add_output(T4)
"""


def embeddings():
    return EMBEDDINGS, [tensor_meta((2, 32), DType.int64), tensor_meta((128, 64), DType.float32),
                        tensor_meta((32, 64), DType.float32)]


def target_logit():
    return TARGET_LOGIT, [tensor_meta((64, 128), DType.float32),
                          tensor_meta((64,), DType.int64)]


def per_lane():
    return PER_LANE, [tensor_meta((16, 64), DType.float32), tensor_meta((16, 64), DType.int64)]


def inputs_for(name: str, metas) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out = []
    for m in metas:
        dtype = to_torch_dtype(m.dtype)
        if dtype == torch.int64:
            high = {"embeddings": 128, "target_logit": 128, "per_lane": 63}[name]
            t = torch.randint(0, high, m.shape, generator=g)
            if name == "target_logit":
                t[::5] = -1  # ignored labels read the pad column
            out.append(t)
        else:
            out.append(torch.randn(m.shape, generator=g, dtype=dtype))
    return out


CASES = {"embeddings": embeddings, "target_logit": target_logit, "per_lane": per_lane}


def pointwise_segments(name: str):
    body, metas = CASES[name]()
    plan = make_plan(fusion(body), metas, PlanOptions(segmenter="greedy"))
    segments = [s for s in plan.segments if s.kind.value == "pointwise"]
    assert segments
    return plan, metas, segments


@pytest.mark.parametrize("vector", [None, 1])
@pytest.mark.parametrize("name", sorted(CASES))
def test_gathers_at_computed_indices_compile_and_equal_the_reference(name, vector, tmp_path):
    plan, metas, segments = pointwise_segments(name)
    [segment] = segments
    kernels = generate_segment(plan, segment, vector)
    compile_cubin(kernels.source, "sm_90", kernels.kernels[0].name)
    args = inputs_for(name, metas)
    outs = {t: torch.empty(plan.bound.shapes[t],
                           dtype=to_torch_dtype(plan.bound.fusion.tensors[t].dtype))
            for t in segment.schedule.outputs}
    named = dict(zip(plan.bound.fusion.inputs, args))
    run_on_host(kernels, {t: named[t] for t in segment.schedule.inputs} | outs, tmp_path)
    want = dict(zip(plan.bound.fusion.outputs, run_reference(plan.bound.fusion, args)))
    for t, got in outs.items():
        if t in want:
            torch.testing.assert_close(got, want[t], rtol=0, atol=0)


def test_a_lane_invariant_index_keeps_the_vector_read():
    plan, _, [segment] = pointwise_segments("embeddings")
    source = generate_segment(plan, segment).source
    # the position rows are read as vectors, after the iota that indexes them
    iota = source.index("T8 = iota")
    vector = source.index("vec_T2 = *reinterpret_cast")
    assert iota < vector < source.index("for (int _lane")


def test_an_index_that_varies_with_the_lane_reads_after_it():
    plan, _, [segment] = pointwise_segments("per_lane")
    source = generate_segment(plan, segment).source
    assert "vec_T0" not in source  # no vector of T0: each lane reads its own element
    loop = source.index("for (int _lane")
    assert source.index("in_T0[") > loop  # T0 read per lane, inside the loop
