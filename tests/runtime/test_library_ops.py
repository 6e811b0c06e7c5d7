"""nvFuser's library-like ops (optimizer.ir.ops_library, runtime.reference_library): shapes
and dtypes, the reference against a direct torch computation, and the plan (the op alone in a
library or fallback segment, the pointwise work around it still fused)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fusecut.optimizer.analysis.shapes import bind
from fusecut.optimizer.errors import DefinitionError, InputError
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.inputs import ScalarMeta, tensor_meta
from fusecut.optimizer.kinds.rules import Kind
from fusecut.optimizer.planner import make_plan
from fusecut.runtime.reference import run_reference
from fusecut.runtime.run import run_plan
from fusecut.runtime.tensors import make_input
from tests.helpers import fusion


def _plan_and_run(f, metas, args):
    """The plan's segments as (kind, op names), and its outputs checked against the reference."""
    plan = make_plan(f, metas)
    ref = run_reference(f, [a.clone() if isinstance(a, torch.Tensor) else a for a in args])
    got = run_plan(plan, list(args)).outputs
    for a, b in zip(got, ref, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b, equal_nan=True)
    segments = [(s.schedule.kind, [f.ops[i].name for i in s.schedule.ops]) for s in plan.segments]
    return segments, ref


def _alone(segments, op: str, kind: Kind) -> None:
    """``op`` sits alone in a segment of ``kind``; every other segment holds no such op."""
    holding = [s for s in segments if op in s[1]]
    assert holding == [(kind, [op])], segments


T4 = "shape=[-1, -1, -1, -1], contiguity=[True, True, True, True]"


# ---- attention ---------------------------------------------------------------------------------

SDPA = f"""
Q = fd.define_tensor({T4}, dtype=DataType.BFloat16)
K = fd.define_tensor({T4}, dtype=DataType.BFloat16)
V = fd.define_tensor({T4}, dtype=DataType.BFloat16)
Q1 = fd.ops.neg(Q)
Q2 = fd.ops.mul(Q1, Q1)
out, lse, seed, offset = fd.ops.sdpfa_fwd(Q2, K, V, dropout_p=0.0, is_causal=True, scale=0.25)
G = fd.ops.exp(out)
gq, gk, gv = fd.ops.sdpfa_bwd(G, Q2, K, V, out, lse, 0.0, True, seed, offset, 0.25)
L2 = fd.ops.neg(lse)
fd.add_output(out)
fd.add_output(L2)
fd.add_output(seed)
fd.add_output(offset)
fd.add_output(gq)
fd.add_output(gk)
fd.add_output(gv)
"""


def _sdpa_args():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 5, 8, generator=gen).bfloat16()
    k = torch.randn(2, 3, 7, 8, generator=gen).bfloat16()
    v = torch.randn(2, 3, 7, 6, generator=gen).bfloat16()
    return [q, k, v]


def test_sdpfa_fwd_and_bwd_shapes_dtypes_and_outputs():
    f = fusion(SDPA)
    args = _sdpa_args()
    bound = bind(f, [tensor_meta(a.shape, DType.bfloat16) for a in args])
    assert bound.shapes["out"] == (2, 3, 5, 6) and f.tensors["out"].dtype is DType.bfloat16
    assert bound.shapes["lse"] == (2, 3, 5) and f.tensors["lse"].dtype is DType.float32
    assert bound.shapes["seed"] == (2,) and f.tensors["seed"].dtype is DType.uint64
    assert bound.shapes["offset"] == () and f.tensors["offset"].dtype is DType.uint64
    assert [bound.shapes[n] for n in ("gq", "gk", "gv")] == [(2, 3, 5, 8), (2, 3, 7, 8),
                                                             (2, 3, 7, 6)]
    metas = [tensor_meta(a.shape, DType.bfloat16) for a in args]
    segments, ref = _plan_and_run(f, metas, args)
    _alone(segments, "sdpfa_fwd", Kind.LIBRARY)
    _alone(segments, "sdpfa_bwd", Kind.LIBRARY)
    assert (Kind.POINTWISE, ["neg", "mul"]) in segments  # the prologue still fuses

    q, k, v = (a.float() for a in args)
    q2 = ((-q) * (-q)).bfloat16().float().requires_grad_(True)  # the prologue's bf16 result
    k, v = k.requires_grad_(True), v.requires_grad_(True)
    expect = F.scaled_dot_product_attention(q2, k, v, is_causal=True, scale=0.25)
    torch.testing.assert_close(ref[0], expect.bfloat16())
    scores = (q2 @ k.transpose(-1, -2) * 0.25).masked_fill(
        ~torch.ones(5, 7, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(ref[1], -torch.logsumexp(scores, -1))
    grads = torch.autograd.grad(expect, (q2, k, v), torch.exp(ref[0].float()))
    for got, want in zip(ref[4:], grads, strict=True):
        torch.testing.assert_close(got.float(), want, atol=0.05, rtol=0.05)


def test_sdpfa_dropout_is_the_same_mask_forward_and_backward():
    f = fusion(SDPA.replace("dropout_p=0.0", "dropout_p=0.5").replace("lse, 0.0", "lse, 0.5"))
    args = _sdpa_args()
    ref1 = run_reference(f, args)
    ref2 = run_reference(f, args)
    for a, b in zip(ref1, ref2, strict=True):
        assert torch.equal(a, b)  # deterministic for its (reported) seed
    q, k, v = (a.float() for a in args)
    q2 = ((-q) * (-q)).bfloat16().float().requires_grad_(True)
    k, v = k.requires_grad_(True), v.requires_grad_(True)
    from fusecut.runtime.reference_library import attention
    out, _ = attention(q2, k, v, None, None, 0.5, True, 0.25, seed=0)
    grads = torch.autograd.grad(out, (q2, k, v), torch.exp(ref1[0].float()))
    torch.testing.assert_close(ref1[0], out.bfloat16())
    for got, want in zip(ref1[4:], grads, strict=True):
        torch.testing.assert_close(got.float(), want, atol=0.05, rtol=0.05)


def test_sdpfa_rejects_mismatched_operands():
    with pytest.raises(DefinitionError, match="sdpfa_fwd: query, key and value must share"):
        fusion(f"""
Q = fd.define_tensor({T4}, dtype=DataType.BFloat16)
K = fd.define_tensor({T4}, dtype=DataType.Float)
out, lse, seed, offset = fd.ops.sdpfa_fwd(Q, K, K)
fd.add_output(out)
""")
    f = fusion(f"""
Q = fd.define_tensor({T4}, dtype=DataType.Float)
K = fd.define_tensor({T4}, dtype=DataType.Float)
out, lse, seed, offset = fd.ops.sdpfa_fwd(Q, K, K)
fd.add_output(out)
""")
    with pytest.raises(InputError, match="query and key share E"):
        bind(f, [tensor_meta((1, 2, 3, 4), DType.float32), tensor_meta((1, 2, 3, 5),
                                                                       DType.float32)])


# ---- embedding, scatter, index_put_accumulate --------------------------------------------------


def test_embedding_fwd():
    f = fusion("""
I = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Int)
W = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
W1 = fd.ops.mul(W, W)
E = fd.ops.embedding_fwd(I, W1, None, 1.0, None, None, None)
E1 = fd.ops.relu(E)
fd.add_output(E1)
fd.add_output(W)
""")
    idx = torch.tensor([[0, 3, 3], [5, 1, 0]])
    w = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))
    metas = [tensor_meta(idx.shape, DType.int64), tensor_meta(w.shape, DType.float32)]
    assert bind(f, metas).shapes["E"] == (2, 3, 4)
    segments, ref = _plan_and_run(f, metas, [idx, w.clone()])
    _alone(segments, "embedding_fwd", Kind.FALLBACK)
    torch.testing.assert_close(ref[0], F.embedding(idx, w * w, max_norm=1.0).relu())
    torch.testing.assert_close(ref[1], w)  # max_norm renormalises a copy, never the input


def test_scatter_with_tensor_and_scalar_sources():
    f = fusion("""
X = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
I = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Int)
S = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
X1 = fd.ops.neg(X)
Y = fd.ops.scatter(X1, I, S, dim=1)
Z = fd.ops.scatter(Y, I, 7.0, 1)
fd.add_output(Z)
""")
    x = torch.randn(3, 5)
    idx = torch.tensor([[0, 4], [1, 1], [2, 3]])
    src = torch.randn(3, 2)
    metas = [tensor_meta(x.shape, DType.float32), tensor_meta(idx.shape, DType.int64),
             tensor_meta(src.shape, DType.float32)]
    assert bind(f, metas).shapes["Z"] == (3, 5)
    segments, ref = _plan_and_run(f, metas, [x, idx, src])
    assert [s for s in segments if "scatter" in s[1]] == [(Kind.FALLBACK, ["scatter"])] * 2
    torch.testing.assert_close(ref[0], (-x).scatter(1, idx, src).scatter(1, idx, 7.0))
    with pytest.raises(DefinitionError, match="scatter: arg, index and src must have the same"):
        fusion("""
X = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
I = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int)
Y = fd.ops.scatter(X, I, X, 0)
fd.add_output(Y)
""")


def test_index_put_accumulate():
    f = fusion("""
A = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
I = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int32)
V = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
B = fd.ops.index_put_accumulate(A, I, V)
C = fd.ops.mul(B, B)
fd.add_output(C)
""")
    acc = torch.randn(6, 3)
    idx = torch.tensor([1, 4, 1, 0], dtype=torch.int32)
    val = torch.randn(4, 3)
    metas = [tensor_meta(acc.shape, DType.float32), tensor_meta(idx.shape, DType.int32),
             tensor_meta(val.shape, DType.float32)]
    segments, ref = _plan_and_run(f, metas, [acc, idx, val])
    _alone(segments, "index_put_accumulate", Kind.FALLBACK)
    expect = torch.index_put(acc, (idx.long(),), val, accumulate=True)
    torch.testing.assert_close(ref[0], expect * expect)
    with pytest.raises(InputError, match=r"value has shape \[4, 2\]; expected \[4, 3\]"):
        bind(f, metas[:2] + [tensor_meta((4, 2), DType.float32)])


# ---- sorting -----------------------------------------------------------------------------------


def test_topk_and_argsort():
    f = fusion("""
X = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
K = fd.define_scalar(None, dtype=DataType.Int)
X1 = fd.ops.exp(X)
vals, idx = fd.ops.topk(X1, K, dim=1, largest=False, sorted=True)
order = fd.ops.argsort(X1, dim=0, descending=True, stable=True)
V2 = fd.ops.neg(vals)
fd.add_output(V2)
fd.add_output(idx)
fd.add_output(order)
""")
    assert f.tensors["idx"].dtype is DType.int64 and f.tensors["order"].dtype is DType.int64
    x = torch.randn(4, 6)
    metas = [tensor_meta(x.shape, DType.float32), ScalarMeta(DType.int64, 3)]
    assert bind(f, metas).shapes["vals"] == (4, 3)
    segments, ref = _plan_and_run(f, metas, [x, 3])
    _alone(segments, "topk", Kind.FALLBACK)
    _alone(segments, "argsort", Kind.FALLBACK)
    v, i = torch.topk(x.exp(), 3, dim=1, largest=False, sorted=True)
    torch.testing.assert_close(ref[0], -v)
    assert torch.equal(ref[1], i)
    assert torch.equal(ref[2], torch.argsort(x.exp(), dim=0, descending=True, stable=True))
    with pytest.raises(InputError, match="topk: k = 9 is out of range for an axis of extent 6"):
        bind(f, [metas[0], ScalarMeta(DType.int64, 9)])


# ---- grouped matmul ----------------------------------------------------------------------------


@pytest.mark.parametrize("shapes, out_shape", [
    (((10, 4), (3, 4, 5)), (10, 5)),   # groups of mat1's rows
    (((3, 6, 4), (4, 10)), (6, 10)),   # groups of mat2's columns
    (((6, 10), (10, 5)), (3, 6, 5)),   # groups along K
])
def test_grouped_mm(shapes, out_shape):
    (s1, s2) = shapes
    d1 = ", ".join(["-1"] * len(s1))
    d2 = ", ".join(["-1"] * len(s2))
    f = fusion(f"""
A = fd.define_tensor(shape=[{d1}], contiguity=True, dtype=DataType.Float)
B = fd.define_tensor(shape=[{d2}], contiguity=True, dtype=DataType.Float)
O = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Int32)
C = fd.ops.grouped_mm(A, B, O)
D = fd.ops.relu(C)
fd.add_output(D)
""")
    gen = torch.Generator().manual_seed(2)
    a, b = torch.randn(s1, generator=gen), torch.randn(s2, generator=gen)
    offsets = torch.tensor([3, 7, 10], dtype=torch.int32)
    metas = [tensor_meta(s1, DType.float32), tensor_meta(s2, DType.float32),
             tensor_meta((3,), DType.int32)]
    assert bind(f, metas).shapes["C"] == out_shape
    segments, ref = _plan_and_run(f, metas, [a, b, offsets])
    _alone(segments, "grouped_mm", Kind.LIBRARY)
    bounds = [(0, 3), (3, 7), (7, 10)]
    if len(s1) == 2 and len(s2) == 3:
        expect = torch.cat([a[s:e] @ b[g] for g, (s, e) in enumerate(bounds)])
    elif len(s1) == 3:
        expect = torch.cat([a[g] @ b[:, s:e] for g, (s, e) in enumerate(bounds)], dim=1)
    else:
        expect = torch.stack([a[:, s:e] @ b[s:e] for s, e in bounds])
    torch.testing.assert_close(ref[0], expect.relu())


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="torch has no _grouped_mm")
@pytest.mark.parametrize("s1, s2, grouped", [((128, 256), (256, 64), 256),
                                             ((128, 256), (4, 256, 64), 128),
                                             ((4, 128, 256), (256, 64), 64)])
def test_bf16_grouped_mm_is_torchs_grouped_mm(s1, s2, grouped):
    # nvFuser's grouped_mm evaluates to ATen's: a float32 loop rounded to bf16 differed from it
    # by a bf16 step where sums cancel (nvFuser's opinfo test_correctness_grouped_mm_bfloat16)
    d1, d2 = ", ".join(["-1"] * len(s1)), ", ".join(["-1"] * len(s2))
    f = fusion(f"""
A = fd.define_tensor(shape=[{d1}], contiguity=True, dtype=DataType.BFloat16)
B = fd.define_tensor(shape=[{d2}], contiguity=True, dtype=DataType.BFloat16)
O = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Int32)
C = fd.ops.grouped_mm(A, B, O)
fd.add_output(C)
""")
    torch.manual_seed(0)
    a = torch.testing.make_tensor(s1, dtype=torch.bfloat16, device="cpu")
    b = torch.testing.make_tensor(s2, dtype=torch.bfloat16, device="cpu")
    offsets = torch.arange(grouped // 4, grouped + 1, grouped // 4, dtype=torch.int32)
    (got,) = run_reference(f, [a, b, offsets])
    assert torch.equal(got, torch._grouped_mm(a, b, offsets))


def test_grouped_mm_rejects_two_3d_operands():
    with pytest.raises(DefinitionError, match="grouped_mm: operand ranks 3 and 3"):
        fusion("""
A = fd.define_tensor(shape=[-1, -1, -1], contiguity=True, dtype=DataType.Float)
O = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Int32)
C = fd.ops.grouped_mm(A, A, O)
fd.add_output(C)
""")


# ---- NVFP4: planned with their bytes, a one-line error at run time ------------------------------

NVFP4 = """
mat1 = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
mat2 = fd.define_tensor(shape=[-1, -1, -1], contiguity=True, dtype=DataType.Float4_e2m1fn)
scale2 = fd.define_tensor(shape=[-1, -1, -1], contiguity=True, dtype=DataType.Float8_e4m3fn)
alpha = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Float)
sizes = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Int32)
offsets = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Int32)
sf_offsets = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Int32)
fp4, fp8_scale = fd.ops.nv_block_quantize(mat1)
laid_out = fd.ops.preprocess_grouped_matmul_input_sf(fp8_scale, offsets, sf_offsets)
out = fd.ops.cutlass_nvfp4_grouped_mm(fp4, mat2, laid_out, scale2, alpha, sizes, offsets,
                                      sf_offsets, DataType.BFloat16)
fd.add_output(out)
"""


def test_nvfp4_ops_plan_with_their_bytes_and_name_themselves_at_run_time():
    f = fusion(NVFP4)
    assert f.tensors["fp4"].dtype is DType.float4_e2m1fn
    assert f.tensors["fp8_scale"].dtype is DType.float8_e4m3fn
    assert f.tensors["out"].dtype is DType.bfloat16
    metas = [tensor_meta((64, 32), DType.float32), tensor_meta((2, 32, 16), DType.float4_e2m1fn),
             tensor_meta((2, 16, 2), DType.float8_e4m3fn), tensor_meta((2,), DType.float32),
             tensor_meta((2, 3), DType.int32), tensor_meta((2,), DType.int32),
             tensor_meta((2,), DType.int32)]
    bound = bind(f, metas)
    assert bound.shapes["fp4"] == (64, 32) and bound.shapes["fp8_scale"] == (64, 2)
    assert bound.shapes["out"] == (64, 16)
    plan = make_plan(f, metas)
    kinds = {f.ops[s.schedule.ops[0]].name: s.schedule.kind for s in plan.segments}
    assert kinds == {"nv_block_quantize": Kind.FALLBACK, "cutlass_nvfp4_grouped_mm": Kind.LIBRARY,
                     "preprocess_grouped_matmul_input_sf": Kind.FALLBACK}
    fp4_bytes = [t for s in plan.segments for t in s.schedule.outputs if t == "fp4"]
    assert fp4_bytes == ["fp4"]
    quantize = next(s for s in plan.segments if s.schedule.ops == (0,))
    # the fp4 values are half a byte each, their fp8 scales one byte per block of 16
    assert quantize.write_bytes == 64 * 32 // 2 + 64 * 2
    g = fusion("""
X = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
q, s = fd.ops.nv_block_quantize(X)
fd.add_output(s)
""")
    with pytest.raises(InputError, match="nv_block_quantize: torch has no float4_e2m1fn"):
        run_reference(g, [torch.randn(64, 32)])
    with pytest.raises(InputError, match="torch has no float4_e2m1fn tensors"):
        run_plan(plan, [make_input(m) for m in metas])


def test_block_quantize_checks_dtype_and_block_size():
    with pytest.raises(DefinitionError, match="block_size must be 16 for float4_e2m1fn, got 32"):
        fusion("""
X = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
q, s = fd.ops.nv_block_quantize(X, block_size=32)
fd.add_output(s)
""")
    f = fusion("""
X = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.BFloat16)
q, s = fd.ops.nv_block_quantize(X, None, False, 32, DataType.Float8_e4m3fn)
fd.add_output(s)
""")
    assert f.tensors["s"].dtype is DType.float8_e8m0fnu
    with pytest.raises(InputError, match="nv_block_quantize: no torch reference \\(block "
                                         "quantization to float8_e4m3fn is not written yet\\)"):
        run_reference(f, [torch.randn(2, 64).bfloat16()])
    with pytest.raises(InputError, match="last extent 40 is not a multiple of the block size 32"):
        bind(f, [tensor_meta((2, 40), DType.bfloat16)])


def test_a_definition_may_return_a_tensor():
    # nvFuser's tutorial returns the tensor it schedules; what follows a return never runs
    f = fusion("""
T0 = fd.define_tensor(shape=[-1, -1])
T1 = fd.ops.sum(T0, dims=[1])
fd.add_output(T1)
return T1
fd.add_output(T0)
""")
    assert f.outputs == ["T1"]
    assert math.isclose(float(run_reference(f, [torch.ones(2, 3)])[0][0]), 3.0)


def test_every_registered_op_is_in_the_docs_table():
    from pathlib import Path

    from fusecut.optimizer.ir.opspec import all_specs

    docs = (Path(__file__).parents[2] / "docs" / "ops.md").read_text()
    missing = [name for name in all_specs() if f"| `{name}` |" not in docs]
    assert not missing, f"docs/ops.md lacks {missing}"


@pytest.mark.parametrize("body", [SDPA, NVFP4], ids=["sdpa", "nvfp4"])
def test_library_ops_round_trip_through_json_and_nvfuser_text(body):
    from fusecut.optimizer.ir import parse_text
    from fusecut.optimizer.ir.printer import print_fusion
    from fusecut.optimizer.ir.wire import fusion_from_json, fusion_to_json

    f = fusion(body)
    assert fusion_to_json(fusion_from_json(fusion_to_json(f))) == fusion_to_json(f)
    again = parse_text(print_fusion(f)).fusion
    assert fusion_to_json(again)["ops"] == fusion_to_json(f)["ops"]
