"""Issue 18 (rope backward with grouped-query heads, Thunder's form): a sum over extent-1 axes is
a squeeze, and the kernel that sums over a head group writes its layout-only epilogue (a permute,
then a reshape that merges axes the domain keeps apart) itself, with no copy kernel after it.

Planned I/O and segments on the corpus case, the kind rules both ways, CPU-path results against
torch, and every generated kernel through NVRTC.
"""

from __future__ import annotations

import pytest
import torch

from fusecut.codegen import generate_segment
from fusecut.optimizer.analysis.opclass import Role, role
from fusecut.optimizer.analysis.shapes import bind
from fusecut.optimizer.ir import parse_text, tensor_meta
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.kinds.rules import Kind, classify
from fusecut.optimizer.planner import PlanOptions, make_plan
from fusecut.optimizer.profiles import get_profile
from fusecut.runtime.compile import compile_cubin
from fusecut.runtime.executor import execute_plan
from fusecut.runtime.reference import run_reference
from tests.conftest import CORPUS, HAS_GPU
from tests.helpers import fusion

PLAN = PlanOptions(time_limit_s=2)


def compiles(plan) -> None:
    for seg in plan.segments:
        sk = generate_segment(plan, seg)
        for k in sk.kernels:
            assert compile_cubin(sk.source, "sm_90", k.name), k.name


# ---- a reduction over extent-1 axes is a squeeze ------------------------------------------------

SIZE_ONE_SUM = """
T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.BFloat16)
T1 = fd.ops.cast(T0, dtype=DataType.Float)
T2 = fd.ops.sum(T1, dims=[1], keepdim=False, dtype=DataType.Null)
T3 = fd.ops.cast(T2, dtype=DataType.BFloat16)
T4 = fd.ops.permute(T3, dims=[1, 0])
fd.add_output(T4)
"""


def test_a_sum_over_an_extent_one_axis_is_a_squeeze():
    f = fusion(SIZE_ONE_SUM)
    bound = bind(f, [tensor_meta((64, 1, 32), DType.bfloat16)])
    (total,) = [op for op in f.ops if op.name == "sum"]
    assert role(total, bound) is Role.FUSIBLE
    # so it joins a pointwise kernel, permute and all: one segment, no reduction kind
    plan = make_plan(f, [tensor_meta((64, 1, 32), DType.bfloat16)], PLAN)
    assert [s.kind for s in plan.segments] == [Kind.POINTWISE]
    assert plan.io_bytes == plan.lower_bound_bytes
    source = generate_segment(plan, plan.segments[0]).source
    assert "fc_add" not in source and "acc" not in source  # nothing accumulates
    x = torch.randn(64, 1, 32, generator=torch.Generator().manual_seed(0)).bfloat16()
    (got,) = execute_plan(plan, [x]).outputs
    torch.testing.assert_close(got, x.float().sum(1).bfloat16().T, rtol=0, atol=0)
    compiles(plan)
    # a real extent keeps it a reduction
    wide = bind(f, [tensor_meta((64, 3, 32), DType.bfloat16)])
    assert role(total, wide) is Role.REDUCTION


# ---- the group sum writes its permuted, merged layout itself ------------------------------------

HEAD_SUM = """
T0 = fd.define_tensor(shape=[-1, -1, -1, -1], dtype=DataType.BFloat16)
T1 = fd.ops.permute(T0, dims=[0, 2, 1, 3])
T2 = fd.ops.reshape(T1, new_shape=[2, 4, 2, 16, 32])
T3 = fd.ops.cast(T2, dtype=DataType.Float)
T4 = fd.ops.sum(T3, dims=[2], keepdim=False, dtype=DataType.Null)
T5 = fd.ops.cast(T4, dtype=DataType.BFloat16)
T6 = fd.ops.permute(T5, dims=[0, 2, 1, 3])
T7 = fd.ops.reshape(T6, new_shape=[2, 16, 128])
fd.add_output(T7)
"""
HEAD_SUM_INPUT = (2, 16, 8, 32)  # [batch, seq, query heads, head dim]; 4 kv heads of 2


def test_a_group_sum_may_write_a_merge_of_axes_its_domain_keeps_apart():
    # T7's last axis merges the kv-head axis (domain axis 1) and the head dim (axis 4): the
    # kernel writes it at i1 * 32 + i4, and no copy kernel re-lays T5
    f = fusion(HEAD_SUM)
    bound = bind(f, [tensor_meta(HEAD_SUM_INPUT, DType.bfloat16)])
    s = classify(bound, range(len(f.ops)), ["T7"], get_profile())
    assert s and s.kind is Kind.REDUCTION, s
    assert s.domain == (2, 4, 2, 16, 32) and s.reduction_axes == (2,)
    assert s.axis_map["T7"] == (0, 3, (1, 4))
    assert s.axis_map["T0"] == (0, 3, (1, 2), 4)
    plan = make_plan(f, [tensor_meta(HEAD_SUM_INPUT, DType.bfloat16)], PLAN)
    assert len(plan.segments) == 1 and plan.io_bytes == plan.lower_bound_bytes
    x = torch.randn(HEAD_SUM_INPUT, generator=torch.Generator().manual_seed(0)).bfloat16()
    (got,) = execute_plan(plan, [x]).outputs
    want = x.permute(0, 2, 1, 3).reshape(2, 4, 2, 16, 32).float().sum(2).bfloat16()
    torch.testing.assert_close(got, want.permute(0, 2, 1, 3).reshape(2, 16, 128), rtol=0, atol=0)
    source = generate_segment(plan, plan.segments[0]).source
    assert "out_T7[" in source or "out_T7 +" in source
    compiles(plan)


def test_a_merge_of_domain_axes_in_another_order_too():
    # (head dim, kv head): the run (4, 1), indexed i4 * 4 + i1
    f = fusion(HEAD_SUM.replace("T6 = fd.ops.permute(T5, dims=[0, 2, 1, 3])",
                                "T6 = fd.ops.permute(T5, dims=[0, 2, 3, 1])"))
    bound = bind(f, [tensor_meta(HEAD_SUM_INPUT, DType.bfloat16)])
    s = classify(bound, range(len(f.ops)), ["T7"], get_profile())
    assert s and s.axis_map["T7"] == (0, 3, (4, 1)), s
    plan = make_plan(f, [tensor_meta(HEAD_SUM_INPUT, DType.bfloat16)], PLAN)
    x = torch.randn(HEAD_SUM_INPUT, generator=torch.Generator().manual_seed(1)).bfloat16()
    (got,) = execute_plan(plan, [x]).outputs
    want = x.permute(0, 2, 1, 3).reshape(2, 4, 2, 16, 32).float().sum(2).bfloat16()
    torch.testing.assert_close(got, want.permute(0, 2, 3, 1).reshape(2, 16, 128), rtol=0, atol=0)
    compiles(plan)


def thunder_plan():
    parsed = parse_text((CORPUS / "rope_bwd_gqa_thunder.py").read_text())
    return make_plan(parsed.fusion, parsed.inputs, PLAN)


def test_thunder_region_writes_dv_from_its_group_sum():
    plan = thunder_plan()
    # dv's group sum writes T59 (its permute + reshape) itself: no 64 MiB copy segment
    (dv,) = [s for s in plan.segments if "T5" in s.schedule.inputs]
    assert dv.kind is Kind.REDUCTION and dv.schedule.outputs == ("T59",)
    assert len(plan.segments) <= 3
    assert plan.io_bytes / plan.lower_bound_bytes <= 1.2, plan.io_bytes / plan.lower_bound_bytes
    # T52 (a sum over T36's size-1 axis) runs in it as a squeeze
    fusion_ = plan.bound.fusion
    assert fusion_.ops[plan.bound.producers["T52"]].name == "sum"
    assert plan.bound.producers["T52"] in dv.schedule.ops
    assert dv.schedule.reductions == (plan.bound.producers["T28"],)


# ---- k's RoPE in the group-sum kernel: results read at other columns --------------------------

def rope_of_group_sum(rows: int, group: int, d: int, dtype: str = "Float") -> str:
    """rotate_half of a sum over ``group`` rows, times a [rows, d] table, plus the sum: the
    pattern of Thunder's dk (slices and pads of the innermost axis of a reduction result)."""
    h = d // 2
    return f"""
T0 = fd.define_tensor(shape=[-1, -1, -1], dtype=DataType.{dtype})
T9 = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float)
T10 = fd.ops.cast(T0, dtype=DataType.Float)
T1 = fd.ops.sum(T10, dims=[1], keepdim=False, dtype=DataType.Null)
T11 = fd.ops.mul(T1, T9)
T2 = fd.ops.slice(T11, start_indices=[0, 0], end_indices=[{rows}, {h}], strides=[1, 1])
T3 = fd.ops.slice(T11, start_indices=[0, {h}], end_indices=[{rows}, {d}], strides=[1, 1])
T4 = fd.ops.neg(T2)
T5 = fd.ops.pad(T4, [{h}, 0, 0, 0], None)
T6 = fd.ops.pad(T3, [0, {h}, 0, 0], None)
T7 = fd.ops.add(T5, T6)
T8 = fd.ops.add(T7, T1)
T12 = fd.ops.cast(T8, dtype=DataType.{dtype})
fd.add_output(T12)
"""


def torch_rope_of_group_sum(x, table):
    s = x.float().sum(1)
    g, h = s * table, s.shape[1] // 2
    return (torch.cat([g[:, h:], -g[:, :h]], dim=1) + s).to(x.dtype)


# (rows, group, head dim, dtype): 4 lanes and 32-thread rows, 2 lanes and 3-thread rows (129
# threads a block), a 1024-wide row (a block of 256 threads), rows that end mid-block, bf16
STAGED_SHAPES = [(64, 2, 32, "Float"), (50, 3, 6, "Float"), (8, 4, 1024, "Float"),
                 (1000, 2, 40, "Float"), (300, 2, 128, "BFloat16")]
TORCH_DTYPES = {"Float": torch.float32, "BFloat16": torch.bfloat16}


def staged_plan(rows, group, d, dtype):
    f = fusion(rope_of_group_sum(rows, group, d, dtype))
    metas = [tensor_meta((rows, group, d), DType.bfloat16 if dtype == "BFloat16"
                         else DType.float32), tensor_meta((rows, d), DType.float32)]
    return f, make_plan(f, metas, PLAN)


def test_rope_of_a_group_sum_is_one_staged_kernel():
    for shape in STAGED_SHAPES:
        f, plan = staged_plan(*shape)
        assert [s.kind for s in plan.segments] == [Kind.REDUCTION], shape
        assert plan.io_bytes == plan.lower_bound_bytes
        sk = generate_segment(plan, plan.segments[0])
        (kernel,) = sk.kernels
        vec, d = sk.notes["vector"], shape[2]
        assert (kernel.block[0] * vec) % d == 0 and kernel.grid[1] == 1, (shape, kernel)
        assert kernel.block[0] * kernel.block[1] <= max(256, d // vec)
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(shape[:3], generator=gen).to(TORCH_DTYPES[shape[3]])
        table = torch.randn(shape[0], d, generator=gen)
        (got,) = execute_plan(plan, [x, table]).outputs
        torch.testing.assert_close(got.float(), torch_rope_of_group_sum(x, table).float(),
                                   rtol=2e-2, atol=2e-2)
        compiles(plan)


def test_a_row_longer_than_a_block_stages_stays_out():
    f, plan = staged_plan(4, 2, 2048, "Float")
    assert len(plan.segments) == 2
    bound = plan.bound
    why = classify(bound, range(len(f.ops)), ["T12"], get_profile())
    assert not why and "over the 1024 a block stages" in why.reason, why


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("shape", STAGED_SHAPES)
def test_staged_rope_kernel_on_the_gpu(shape):
    from fusecut.runtime.kernels import cuda_runner
    from tests.runtime.test_gpu_kernels import close

    f, plan = staged_plan(*shape)
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(shape[:3], generator=gen, device="cuda").to(TORCH_DTYPES[shape[3]])
    table = torch.randn(shape[0], shape[2], generator=gen, device="cuda")
    got = execute_plan(plan, [x, table], cuda_runner, "cuda").outputs
    close(got, run_reference(f, [x, table]))
