"""Slices, pads and cats along the vector lanes (codegen.resize): where every piece boundary,
slice start and pad width on the innermost axis is a multiple of the vector width, each vector
of lanes lies in one piece and is read as one aligned vector of it (under the condition that it
lies there), chosen once per vector; elsewhere the kernel selects and clamps lane by lane.

The kernels run on the CPU (tests/host_kernels.py) and must equal the torch reference, in both
forms, and compile with NVRTC.
"""

from __future__ import annotations

import re

import pytest
import torch

import fusecut.codegen.pointwise
from fusecut.codegen import generate_segment
from fusecut.optimizer.ir import parse_text
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.inputs import tensor_meta
from fusecut.optimizer.planner import PlanOptions, make_plan
from fusecut.runtime.compile import compile_cubin
from fusecut.runtime.reference import run_reference
from fusecut.runtime.tensors import to_torch_dtype
from tests.conftest import CORPUS
from tests.helpers import fusion
from tests.host_kernels import run_on_host

ROWS = 48
# rotate_half of a 128-wide row split at SPLIT (a slice, a negation, a cat), the lower part
# padded back to the row from the left, and a slice starting at column 4 padded back from the
# right, and the lower part padded on both sides: aligned for bf16 vectors of 8 at SPLIT 64
# (the slice from column 4 never is), misaligned at 60
RESIZES = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
T1 = fd.ops.slice(T0, start_indices=[0, SPLIT], end_indices=[ROWS, 128], strides=[1, 1])
T2 = fd.ops.slice(T0, start_indices=[0, 0], end_indices=[ROWS, SPLIT], strides=[1, 1])
T3 = fd.ops.cast(T1, dtype=DataType.Float)
T4 = fd.ops.neg(T3)
T5 = fd.ops.cast(T4, dtype=DataType.BFloat16)
T6 = fd.ops.cat([T5, T2], dim=-1)
S7 = fd.define_scalar(1.5, dtype=DataType.Double)
T8 = fd.ops.pad(T2, pad_widths=[REST, 0, 0, 0], value=S7)
T9 = fd.ops.cast(T6, dtype=DataType.Float)
T10 = fd.ops.cast(T8, dtype=DataType.Float)
T11 = fd.ops.add(T9, T10)
T12 = fd.ops.cast(T11, dtype=DataType.BFloat16)
T13 = fd.ops.slice(T0, start_indices=[0, 4], end_indices=[ROWS, 128], strides=[1, 1])
T14 = fd.ops.pad(T13, pad_widths=[0, 4, 0, 0])
T15 = fd.ops.pad(T2, pad_widths=[HALF, HALF, 0, 0])
fd.add_output(T12)
fd.add_output(T14)
fd.add_output(T15)
"""
# a read that is a vector of a piece, under the condition that the vector lies in it
GUARDED_READ = re.compile(r"\) \? \*reinterpret_cast<const fc_vec<__nv_bfloat16, 8>\*>")
# a lane's index clamped into a piece: the scalar path
LANE_CLAMP = re.compile(r"fc_clampi<int>\(\(*x1 \+ _lane\)")


def _plan(body: str, *metas):
    plan = make_plan(fusion(body), list(metas), PlanOptions(time_limit_s=2))
    assert [s.kind.value for s in plan.segments] == ["pointwise"]
    return plan


def _resizes(split: int):
    body = RESIZES.replace("SPLIT", str(split)).replace("REST", str(128 - split)) \
        .replace("HALF", str((128 - split) // 2))
    return _plan(body.replace("ROWS", str(ROWS)), tensor_meta((ROWS, 128), DType.bfloat16))


def _host_outputs(plan, seg, inputs: list[torch.Tensor], tmp_path, vector=None):
    """The segment's outputs, computed by its kernel on the CPU."""
    sk = generate_segment(plan, seg, vector)
    args = dict(zip(seg.schedule.inputs, inputs))
    outs = {t: torch.empty(plan.bound.shapes[t],
                           dtype=to_torch_dtype(plan.bound.fusion.tensors[t].dtype))
            for t in seg.schedule.outputs}
    run_on_host(sk, args | outs, tmp_path)
    return [outs[t] for t in plan.bound.fusion.outputs]


def test_aligned_pieces_are_read_as_whole_vectors():
    src = generate_segment(*_one(_resizes(64))).source
    # the cat's two pieces and the two-sided pad's data: one guarded vector read each, the
    # conditions per vector (x1 is its first lane's column); the left pad's data is the cat's
    # second piece's read, shared
    assert len(GUARDED_READ.findall(src)) == 3, src
    assert "(x1 < 64) ? *reinterpret_cast" in src
    assert "(x1 >= 64) ? *reinterpret_cast" in src
    assert "(x1 < 64 ? " in src  # the cat selects once per vector
    # the pad on both sides: its data is the vectors of the lower half, moved by 32
    assert "(x1 >= 32 && x1 < 96) ? *reinterpret_cast" in src
    assert "const float T15 = ((x1 >= 32 && x1 < 96)) ? " in src
    # the slice from column 4, padded back, is not aligned: it alone stays lane by lane
    assert len(LANE_CLAMP.findall(src)) == 1, src
    assert "in_T0[x0 * 128 + (4 + fc_clampi<int>((x1 + _lane), 123))]" in src


def test_misaligned_pieces_keep_the_lane_by_lane_path():
    src = generate_segment(*_one(_resizes(60))).source
    assert GUARDED_READ.search(src) is None, src
    assert "fc_clampi<int>(((x1 + _lane) - 68), 59)" in src  # the cat's second piece
    assert "((x1 + _lane) < 68 ? " in src


@pytest.mark.parametrize("split", [64, 60])
@pytest.mark.parametrize("vector", [None, 1])
def test_resized_kernels_equal_the_reference_on_the_cpu(split, vector, tmp_path):
    plan = _resizes(split)
    x = torch.randn(ROWS, 128).to(torch.bfloat16)
    x[0, :8] = float("nan")  # NaN stays where the reference puts it
    got = _host_outputs(plan, plan.segments[0], [x], tmp_path, vector)
    want = run_reference(plan.bound.fusion, [x])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("split", [64, 60])
def test_resized_kernels_compile(split):
    plan = _resizes(split)
    for vector in (None, 1):
        sk = generate_segment(plan, plan.segments[0], vector)
        compile_cubin(sk.source, "sm_90", sk.kernels[0].name)


def test_a_piece_read_across_its_rows_stays_staged():
    """cat of two halves of a transposed input along the vector lanes: read along its rows
    the pieces are not vectors of the lanes, so they stay lane by lane and go through the
    shared-memory tile (a vector form would read them uncoalesced)."""
    body = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
T1 = fd.ops.permute(T0, dims=[1, 0])
T2 = fd.ops.slice(T1, start_indices=[0, 0], end_indices=[128, 128], strides=[1, 1])
T3 = fd.ops.slice(T1, start_indices=[0, 128], end_indices=[128, 256], strides=[1, 1])
fd.add_output(fd.ops.cat([T3, T2], dim=1))
"""
    plan = _plan(body, tensor_meta((256, 128), DType.bfloat16))
    sk = generate_segment(plan, plan.segments[0])
    assert sk.notes["scheme"] == "transpose" and sk.notes["staged"] == ["T0"]
    assert GUARDED_READ.search(sk.source) is None


def _one(plan):
    return plan, plan.segments[0]


# ---- the RoPE regions ---------------------------------------------------------------------------

def _rope_fwd(seq: int | None = None):
    """tests/corpus/rope_fwd_thunder.py, at its own size or with a shorter sequence."""
    text = (CORPUS / "rope_fwd_thunder.py").read_text()
    if seq is not None:
        text = text.replace("2048", str(seq))  # 2048 is the sequence length only
    parsed = parse_text(text)
    plan = make_plan(parsed.fusion, parsed.inputs, PlanOptions(time_limit_s=10))
    assert [s.kind.value for s in plan.segments] == ["pointwise"]
    return parsed, plan


def test_rope_fwd_reads_the_rotated_halves_as_vectors():
    _, plan = _rope_fwd()
    sk = generate_segment(plan, plan.segments[0])
    src = sk.source
    assert sk.notes["scheme"] == "transpose" and sk.notes["vector"] == 8
    # q's and k's upper and lower halves: a guarded 16-byte read each, no lane clamped
    assert len(GUARDED_READ.findall(src)) == 4, src
    assert "fc_clampi<int>((x3 - 64), 56)" in src
    assert re.search(r"fc_clampi<\w+>\(\(*x3 \+ _lane\)", src) is None
    # v, read through the reshape that splits its heads, is a vector too (in the direct kernel
    # beside the tiled one: tests/codegen/test_tiled_split.py)
    assert re.search(r"fc_vec<\w+, 8> vec_T0 = \*reinterpret_cast", src), src
    assert "in_T0[" not in src and "in_T2[" not in src and "in_T5[" not in src
    compile_cubin(src, "sm_90", sk.kernels[0].name)


def test_rope_fwd_equals_the_reference_on_the_cpu(tmp_path, monkeypatch):
    # the direct pointwise kernel (the host cannot run the tiled one's shared memory) reads the
    # pieces exactly as the tiled kernel's compute phase does
    monkeypatch.setattr(fusecut.codegen.pointwise, "generate_transpose", lambda *a, **k: None)
    parsed, plan = _rope_fwd(seq=32)
    seg = plan.segments[0]
    src = generate_segment(plan, seg).source
    assert len(GUARDED_READ.findall(src)) == 4 and "__shared__" not in src
    torch.manual_seed(0)
    inputs = [torch.randn(m.shape).to(to_torch_dtype(m.dtype)) for m in parsed.inputs]
    by_name = dict(zip(parsed.fusion.inputs, inputs))
    got = _host_outputs(plan, seg, [by_name[t] for t in seg.schedule.inputs], tmp_path)
    want = run_reference(parsed.fusion, inputs)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w.contiguous(), rtol=0, atol=0)


# ---- a vector's lanes inside a split axis ------------------------------------------------------

HEADS_MERGED = """
T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.BFloat16)
T1 = fd.ops.permute(T0, dims=[1, 0, 2])
T2 = fd.ops.reshape(T1, new_shape=[16, WIDTH])
fd.add_output(T2)
"""


@pytest.mark.parametrize("head", [128, 60])
def test_lanes_inside_one_head_of_a_merged_axis_are_one_vector(head, tmp_path):
    """[heads, seq, head] -> [seq, heads * head], as the RoPE backward writes k's and v's
    gradients: with 128-wide heads a vector of 8 lanes lies in one head, read as one vector at
    the first lane's head and column; 60-wide heads split vectors, read lane by lane."""
    plan = _plan(HEADS_MERGED.replace("WIDTH", str(8 * head)),
                 tensor_meta((8, 16, head), DType.bfloat16))
    src = generate_segment(plan, plan.segments[0]).source
    if head == 128:
        assert f"in_T0 + (x1 / {head}) * 2048 + x0 * {head} + ((x1 % {head})))" in src, src
        assert "in_T0[" not in src
    else:
        assert f"in_T0[((x1 + _lane) / {head}) * 960 + x0 * {head} + ((x1 + _lane) % {head})]" \
            in src, src
    x = torch.randn(8, 16, head).to(torch.bfloat16)
    got = _host_outputs(plan, plan.segments[0], [x], tmp_path)
    torch.testing.assert_close(got[0], run_reference(plan.bound.fusion, [x])[0], rtol=0, atol=0)
