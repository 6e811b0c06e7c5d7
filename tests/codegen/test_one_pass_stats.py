"""Issue 18 item 3: one-pass log-sum-exp statistics (cross-entropy) and RoPE backward with
grouped-query heads in the kernel that sums over the group.

Planned I/O against the lower bound on the corpus cases, the rules' edges (what must stay as it
was), CPU-path results against torch's own cross-entropy and RoPE, every generated kernel through
NVRTC, and on a GPU the kernels against the torch reference (marked gpu).
"""

from __future__ import annotations

import pytest
import torch

from fusecut.codegen import generate_segment
from fusecut.optimizer.analysis.shapes import bind
from fusecut.optimizer.ir import parse_text, tensor_meta
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.kinds.rules import classify
from fusecut.optimizer.planner import PlanOptions, make_plan
from fusecut.optimizer.profiles import get_profile
from fusecut.optimizer.segmenters.cpsat import _Rules
from fusecut.runtime.compile import compile_cubin
from fusecut.runtime.executor import execute_plan
from fusecut.runtime.reference import run_reference
from fusecut.runtime.tensors import make_input
from tests.conftest import CORPUS, HAS_GPU
from tests.corpus_torch import assert_cpu_path_equals_oracle, small_definition
from tests.helpers import fusion, graph

PLAN = PlanOptions(time_limit_s=2)


def corpus_plan(name: str):
    parsed = parse_text((CORPUS / f"{name}.py").read_text())
    return make_plan(parsed.fusion, parsed.inputs, PLAN)


def ratio(plan) -> float:
    return plan.io_bytes / plan.lower_bound_bytes


def compiles(plan) -> list[str]:
    """The sources of the plan's generated kernels, each compiled by NVRTC for sm_90."""
    sources = []
    for seg in plan.segments:
        sk = generate_segment(plan, seg)
        if sk.kernels:
            for k in sk.kernels:
                assert compile_cubin(sk.source, "sm_90", k.name)
            sources.append(sk.source)
    return sources


# ---- cross-entropy: max and sum of exp in one pass ----------------------------------------------

def cross_entropy(rows: int, classes: int, dtype=DType.bfloat16):
    """The corpus case's definition over logits of another dtype (float64: computed in
    double), with inputs of these sizes."""
    text = (CORPUS / "cross_entropy_fwd.py").read_text()
    name = {DType.bfloat16: "BFloat16", DType.float32: "Float", DType.float64: "Double"}[dtype]
    text = text.replace("dtype=DataType.BFloat16", f"dtype=DataType.{name}")
    if dtype is DType.float64:
        text = text.replace("fd.ops.cast(T0, dtype=DataType.Float)",
                            "fd.ops.cast(T0, dtype=DataType.Double)")
    metas = [tensor_meta((rows, classes), dtype), tensor_meta((rows,), DType.int64)]
    return parse_text(text).fusion, metas


def online_segments(plan):
    return [s for s in plan.segments if s.schedule.online]


def test_cross_entropy_corpus_case_reads_the_logits_once():
    plan = corpus_plan("cross_entropy_fwd")
    assert 1.0 <= ratio(plan) <= 1.01, ratio(plan)
    (seg,) = online_segments(plan)
    assert seg.kind.value == "reduction"  # nothing kept on chip: the row is 250 KiB
    # the target logit's gather runs in its epilogue (tests/codegen/test_row_gather.py): no other
    # segment reads the logits
    readers = [s for s in plan.segments if "T0" in s.schedule.inputs]
    assert readers == [seg]


def test_online_plan_is_deterministic():
    a, b = corpus_plan("cross_entropy_fwd"), corpus_plan("cross_entropy_fwd")
    assert [(s.kind, s.schedule.ops, s.schedule.online) for s in a.segments] == \
        [(s.kind, s.schedule.ops, s.schedule.online) for s in b.segments]


def test_online_accumulator_replaces_the_two_reductions_in_the_kernel():
    f, metas = cross_entropy(64, 5000)
    plan = make_plan(f, metas, PLAN)
    (seg,) = online_segments(plan)
    src = generate_segment(plan, seg).source
    # the inner layout adds each vector load's lanes together: one rescale at most per load
    assert "fc_lse_add_n(" in src and "fc_lseop()" in src
    assert "expf(T5)" not in src and "__expf(T5)" not in src  # exp(x - max) is never on its own
    assert src.count("for (index_t c =") == 1  # one pass over the row
    compiles(plan)


@pytest.mark.parametrize("rows,classes,dtype", [
    (2, 100000, DType.bfloat16),  # few rows: the row splits over blocks, partials combine
    (300, 40, DType.float32),  # short rows: a warp per row
    (16, 3000, DType.float64),  # the double accumulator
])
def test_online_kernels_compile_in_every_layout(rows, classes, dtype):
    f, metas = cross_entropy(rows, classes, dtype)
    plan = make_plan(f, metas, PLAN)
    assert online_segments(plan)
    sources = compiles(plan)
    assert any(("fc_lse_d" if dtype is DType.float64 else "fc_lse_f") in s for s in sources)


COLUMN_LSE = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T3 = fd.ops.max(T0, dims=[0], keepdim=False, dtype=DataType.Null)
T4 = fd.ops.broadcast_in_dim(T3, shape=T0.shape(), broadcast_dims=[1])
T5 = fd.ops.sub(T0, T4)
T6 = fd.ops.exp(T5)
T7 = fd.ops.sum(T6, dims=[0], keepdim=False, dtype=DataType.Null)
T8 = fd.ops.log(T7)
T9 = fd.ops.add(T8, T3)
fd.add_output(T9)
"""


def test_online_over_the_outer_axis_updates_each_lane():
    # columns: every lane has its own accumulator, updated element by element
    plan = make_plan(fusion(COLUMN_LSE), [tensor_meta((3000, 256), DType.float32)], PLAN)
    (seg,) = online_segments(plan)
    src = generate_segment(plan, seg).source
    assert "fc_lse_add(acc0[_lane]" in src and "fc_lse_add_n(acc" not in src
    compiles(plan)


def test_cpsat_lets_an_online_pair_over_columns_share_a_slot():
    # a max over a non-innermost axis forbids, in CP-SAT's static rules, the ops that broadcast
    # its result back from sharing its segment: not the ops an online pair absorbs
    g = graph(COLUMN_LSE, (3000, 256))
    fusion_ = g.fusion
    (max_op,) = [i for i in g.ops if fusion_.ops[i].name == "max"]
    assert _Rules(g).frontier[max_op] == []
    # a second use of exp(x - max) keeps it out of the pair: then the sub is the frontier
    g = graph(COLUMN_LSE.replace("fd.add_output(T9)", "fd.add_output(T9)\nfd.add_output(T6)"),
              (3000, 256))
    (sub,) = [i for i in g.ops if fusion_.ops[i].name == "sub"]
    assert _Rules(g).frontier[max_op] == [sub]


def test_softmax_keeps_its_normalization_kernel():
    # exp(x - max) is also the output's numerator: no pair to absorb
    parsed = parse_text((CORPUS / "softmax_fwd.py").read_text())
    plan = make_plan(parsed.fusion, parsed.inputs, PLAN)
    assert not online_segments(plan)
    assert [s.kind.value for s in plan.segments] == ["normalization"]


@pytest.mark.parametrize("body", [
    # the sub subtracts the max from another tensor
    "T9 = fd.ops.sub(T8, T4)\nT6 = fd.ops.exp(T9)",
    # exp(x - max) is a fusion output too: it must be written, so evaluated on its own
    "T5 = fd.ops.sub(T2, T4)\nT6 = fd.ops.exp(T5)\nfd.add_output(T6)",
])
def test_near_misses_are_not_online(body):
    f = fusion(f"""
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T2 = fd.ops.abs(T0)
T8 = fd.ops.neg(T0)
T3 = fd.ops.max(T2, dims=[1], keepdim=False, dtype=DataType.Null)
T4 = fd.ops.broadcast_in_dim(T3, shape=T0.shape(), broadcast_dims=[0])
{body}
T7 = fd.ops.sum(T6, dims=[1], keepdim=False, dtype=DataType.Null)
fd.add_output(T7)
""")
    plan = make_plan(f, [tensor_meta((8, 200000), DType.float32)], PLAN)
    assert not online_segments(plan)
    assert ratio(plan) > 1.5  # the row is read twice


def test_keepdim_max_pairs_too():
    f = fusion("""
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T3 = fd.ops.max(T0, dims=[1], keepdim=True, dtype=DataType.Null)
T5 = fd.ops.sub(T0, T3)
T6 = fd.ops.exp(T5)
T7 = fd.ops.sum(T6, dims=[1], keepdim=False, dtype=DataType.Null)
T8 = fd.ops.log(T7)
fd.add_output(T8)
""")
    plan = make_plan(f, [tensor_meta((8, 200000), DType.float32)], PLAN)
    assert online_segments(plan)
    assert ratio(plan) < 1.01


def test_cross_entropy_on_the_cpu_path_equals_torch():
    f, metas = cross_entropy(64, 5000)
    plan = make_plan(f, metas, PLAN)
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 5000, generator=gen).bfloat16()
    target = torch.randint(0, 5000, (64,), generator=gen)
    loss, lse = execute_plan(plan, [logits, target]).outputs
    want_lse = torch.logsumexp(logits.float(), dim=1)
    torch.testing.assert_close(lse, want_lse)
    # the corpus case scales the sum of row losses by 1/2048
    want = torch.nn.functional.cross_entropy(logits.float(), target, reduction="sum") / 2048
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-5)


# ---- RoPE backward with grouped-query heads ---------------------------------------------------

def rope_bwd_gqa(batch: int, heads: int, kv_heads: int, seq: int, head: int) -> str:
    """The corpus case's definition at other sizes."""
    text = (CORPUS / "rope_bwd_gqa.py").read_text()
    half = head // 2
    text = text.replace("end_indices=[4, 32, 2048, 64]", f"end_indices=[{batch}, {heads}, "
                        f"{seq}, {half}]")
    text = text.replace("start_indices=[0, 0, 0, 64], end_indices=[4, 32, 2048, 128]",
                        f"start_indices=[0, 0, 0, {half}], end_indices=[{batch}, {heads}, "
                        f"{seq}, {head}]")
    text = text.replace("[64, 0, 0, 0, 0, 0, 0, 0]", f"[{half}, 0, 0, 0, 0, 0, 0, 0]")
    text = text.replace("[0, 64, 0, 0, 0, 0, 0, 0]", f"[0, {half}, 0, 0, 0, 0, 0, 0]")
    text = text.replace("new_shape=[4, 8, 4, 2048, 128]",
                        f"new_shape=[{batch}, {kv_heads}, {heads // kv_heads}, {seq}, {head}]")
    text = text.replace("(4, 32, 2048, 128)", f"({batch}, {heads}, {seq}, {head})")
    return text.replace("(2048, 128)", f"({seq}, {head})")


def torch_rope_bwd_gqa(gq, gk, gv, cos, sin, kv_heads: int):
    """The gradients by torch's autograd through RoPE and the expansion of k and v."""
    b, h, t, d = gq.shape
    g = h // kv_heads

    def rope(x):
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return x * cos.float() + torch.cat((-x2, x1), dim=-1) * sin.float()

    q = torch.zeros(b, h, t, d, requires_grad=True)
    k = torch.zeros(b, kv_heads, t, d, requires_grad=True)
    v = torch.zeros(b, kv_heads, t, d, requires_grad=True)
    k_exp = k[:, :, None].expand(b, kv_heads, g, t, d).reshape(b, h, t, d)
    v_exp = v[:, :, None].expand(b, kv_heads, g, t, d).reshape(b, h, t, d)
    out = (rope(q) * gq.float()).sum() + (rope(k_exp) * gk.float()).sum() + \
        (v_exp * gv.float()).sum()
    out.backward()
    return q.grad, k.grad, v.grad


def test_rope_bwd_gqa_corpus_case_reads_each_input_once():
    plan = corpus_plan("rope_bwd_gqa")
    assert ratio(plan) <= 1.3, ratio(plan)
    assert plan.boundaries == []
    # the pads and slices of dk's RoPE run in the kernel that sums over the group
    fusion = plan.bound.fusion
    summing = [s for s in plan.segments if s.kind.value == "reduction"
               and "T1" in s.schedule.inputs]
    assert len(summing) == 1
    assert {"pad", "slice", "neg", "sum"} <= {fusion.ops[i].name for i in summing[0].schedule.ops}
    # 4 rows to sum per column: no block rows of threads left idle
    (kernel,) = generate_segment(plan, summing[0]).kernels
    assert kernel.block[1] <= 4 and kernel.block[0] * kernel.block[1] == 256


def test_rope_bwd_gqa_on_the_cpu_path_equals_torch():
    parsed = parse_text(rope_bwd_gqa(2, 8, 2, 16, 32))
    plan = make_plan(parsed.fusion, parsed.inputs, PLAN)
    assert ratio(plan) <= 1.3
    gen = torch.Generator().manual_seed(0)
    args = [torch.randn(m.shape, generator=gen).bfloat16() for m in parsed.inputs]
    dq, dk, dv = execute_plan(plan, args).outputs
    want = torch_rope_bwd_gqa(*args, kv_heads=2)
    for got, exp in zip((dq, dk, dv), want):
        torch.testing.assert_close(got.float(), exp, rtol=2e-2, atol=2e-2)
    compiles(plan)


def test_rope_written_with_cat_joins_the_group_sum_too():
    # rotate_half's own form, cat([-x2, x1]), differentiated as Thunder may write it
    f = fusion("""
T0 = fd.define_tensor(shape=[-1, -1, -1, -1], dtype=DataType.Float)
T1 = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float)
T2 = fd.ops.broadcast_in_dim(T1, shape=T0.shape(), broadcast_dims=[2, 3])
T3 = fd.ops.mul(T0, T2)
T4 = fd.ops.slice(T3, start_indices=[0, 0, 0, 0], end_indices=[2, 8, 64, 16], strides=[1, 1, 1, 1])
T5 = fd.ops.slice(T3, start_indices=[0, 0, 0, 16], end_indices=[2, 8, 64, 32], strides=[1, 1, 1, 1])
T6 = fd.ops.neg(T4)
T7 = fd.ops.cat([T5, T6], dim=3)
T8 = fd.ops.reshape(T7, new_shape=[2, 2, 4, 64, 32])
T9 = fd.ops.sum(T8, dims=[2], keepdim=False, dtype=DataType.Null)
fd.add_output(T9)
""")
    metas = [tensor_meta((2, 8, 64, 32), DType.float32), tensor_meta((64, 32), DType.float32)]
    plan = make_plan(f, metas, PLAN)
    assert ratio(plan) < 1.01 and len(plan.segments) == 1
    gen = torch.Generator().manual_seed(0)
    x, s = torch.randn(2, 8, 64, 32, generator=gen), torch.randn(64, 32, generator=gen)
    h = x * s
    want = torch.cat([h[..., 16:], -h[..., :16]], dim=-1).reshape(2, 2, 4, 64, 32).sum(2)
    torch.testing.assert_close(execute_plan(plan, [x, s]).outputs[0], want)
    compiles(plan)


def test_resize_along_the_summed_axis_stays_out_of_the_reduction():
    # a slice of the reduced axis would make the loop walk the wrong extent
    f = fusion("""
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.ops.slice(T0, start_indices=[0, 8], end_indices=[64, 4096], strides=[1, 1])
T2 = fd.ops.sum(T1, dims=[1], keepdim=False, dtype=DataType.Null)
T3 = fd.ops.pad(T0, [0, 0, 4, 0], None)
T4 = fd.ops.sum(T3, dims=[0], keepdim=False, dtype=DataType.Null)
fd.add_output(T2)
fd.add_output(T4)
""")
    plan = make_plan(f, [tensor_meta((64, 4096), DType.float32)], PLAN)
    in_reductions = {f.ops[i].name for seg in plan.segments if seg.kind.value == "reduction"
                     for i in seg.schedule.ops}
    assert in_reductions and not in_reductions & {"slice", "pad"}
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4096, generator=gen)
    got = execute_plan(plan, [x]).outputs
    torch.testing.assert_close(got[0], x[:, 8:].sum(1))
    torch.testing.assert_close(got[1], torch.nn.functional.pad(x, (0, 0, 4, 0)).sum(0))
    compiles(plan)


ROPE_OF_SUM = """
T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float)
T1 = fd.ops.sum(T0, dims=[1], keepdim=False, dtype=DataType.Null)
T2 = fd.ops.slice(T1, start_indices=[0, 0], end_indices=[64, 16], strides=[1, 1])
T3 = fd.ops.slice(T1, start_indices=[0, 16], end_indices=[64, 32], strides=[1, 1])
T4 = fd.ops.neg(T2)
T5 = fd.ops.pad(T4, [16, 0, 0, 0], None)
T6 = fd.ops.pad(T3, [0, 16, 0, 0], None)
T7 = fd.ops.add(T5, T6)
T8 = fd.ops.add(T7, T1)
fd.add_output(T8)
"""


def test_resize_of_a_reduction_result_joins_the_reduction_along_the_innermost_axis():
    # rotate_half of the group sum: the slices read the sum at another column than the one a
    # thread holds; the block stages its sums in shared memory, whole rows of the innermost
    # axis, and the epilogue reads them there
    f = fusion(ROPE_OF_SUM)
    meta = tensor_meta((64, 2, 32), DType.float32)
    s = classify(bind(f, [meta]), range(len(f.ops)), ["T8"], get_profile())
    assert s and s.kind.value == "reduction", s
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 2, 32, generator=gen)
    h = x.sum(1)
    want = torch.cat([-h[:, :16], h[:, 16:]], dim=1).roll(16, 1) + h
    for segmenter in ("cpsat", "greedy", "mincut"):
        plan = make_plan(f, [meta], PlanOptions(segmenter=segmenter, time_limit_s=2))
        assert len(plan.segments) == 1, segmenter
        torch.testing.assert_close(execute_plan(plan, [x]).outputs[0], want)
    (source,) = compiles(plan)
    assert "(staged, another column)" in source and source.count("__syncthreads();") == 2
    (kernel,) = generate_segment(plan, plan.segments[0]).kernels
    assert kernel.grid[1] == 1 and (kernel.block[0] * 4) % 32 == 0  # whole rows, no split


def test_resize_of_a_reduction_result_along_another_axis_stays_out():
    # shifted along the outer kept axis: the other rows' sums are other blocks'
    f = fusion(ROPE_OF_SUM.replace("start_indices=[0, 0], end_indices=[64, 16]",
                                   "start_indices=[0, 0], end_indices=[32, 32]")
               .replace("start_indices=[0, 16], end_indices=[64, 32]",
                        "start_indices=[32, 0], end_indices=[64, 32]")
               .replace("[16, 0, 0, 0]", "[0, 0, 32, 0]").replace("[0, 16, 0, 0]", "[0, 0, 0, 32]"))
    meta = tensor_meta((64, 2, 32), DType.float32)
    why = classify(bind(f, [meta]), range(len(f.ops)), ["T8"], get_profile())
    assert not why and "reads T1, computed from a reduction result, at a shifted index along " \
        "an axis other than the innermost kept one" in why.reason, why
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 2, 32, generator=gen)
    h = x.sum(1)
    want = torch.cat([-h[:32], h[32:]], dim=0).roll(32, 0) + h
    for segmenter in ("cpsat", "greedy", "mincut"):
        plan = make_plan(f, [meta], PlanOptions(segmenter=segmenter, time_limit_s=2))
        assert len(plan.segments) == 2, segmenter
        torch.testing.assert_close(execute_plan(plan, [x]).outputs[0], want)
    compiles(plan)


def thunder_rope_plan(name: str = "rope_bwd_gqa_thunder", small: bool = False):
    text = (CORPUS / f"{name}.py").read_text()
    parsed = parse_text(small_definition(text, name) if small else text)
    return parsed, make_plan(parsed.fusion, parsed.inputs, PLAN)


def test_thunder_rope_bwd_gqa_region_generates_every_kernel():
    # Thunder's Llama-3 region: k's group sum, cast, a sum over a broadcast size-1 axis, then
    # RoPE's slices and pads of the result, in the group-sum kernel's epilogue (which reads the
    # sum at the other half of the head row from shared memory); dv's group sum writes its
    # permute + reshape itself: each input read once, 324 MiB against 322
    _, plan = thunder_rope_plan()
    fusion = plan.bound.fusion
    (dk,) = [s for s in plan.segments if "T0" in s.schedule.inputs]
    assert dk.kind.value == "reduction" and dk.schedule.outputs == ("T65",)
    assert {"slice", "pad"} <= {fusion.ops[i].name for i in dk.schedule.ops}
    compiles(plan)
    assert len(plan.segments) == 3 and plan.boundaries == []
    assert ratio(plan) <= 1.01, ratio(plan)


def test_thunder_rope_bwd_gqa_region_on_the_cpu_path_equals_torch():
    parsed, plan = thunder_rope_plan(small=True)
    assert_cpu_path_equals_oracle("rope_bwd_gqa_thunder", parsed, plan)


# ---- on the GPU: the kernels against the torch reference ------------------------------------

def _gpu_close(f, metas, args):
    from fusecut.runtime.kernels import cuda_runner
    from tests.runtime.test_gpu_kernels import close

    plan = make_plan(f, metas, PLAN)
    got = execute_plan(plan, args, cuda_runner, "cuda").outputs
    close(got, run_reference(f, args))
    return plan


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("rows,classes,dtype", [
    (2048, 128256, DType.bfloat16), (2, 100000, DType.bfloat16), (300, 40, DType.float32),
    (16, 3000, DType.float64), (5, 7, DType.float32)])
def test_online_kernels_on_the_gpu(rows, classes, dtype):
    f, metas = cross_entropy(rows, classes, dtype)
    gen = torch.Generator(device="cuda").manual_seed(0)
    tdt = {DType.bfloat16: torch.bfloat16, DType.float32: torch.float32,
           DType.float64: torch.float64}[dtype]
    logits = (torch.randn(rows, classes, generator=gen, device="cuda") * 4).to(tdt)
    target = torch.randint(0, classes, (rows,), generator=gen, device="cuda")
    plan = _gpu_close(f, metas, [logits, target])
    assert online_segments(plan)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("shape", [(3000, 256), (100000, 8)])
def test_online_columns_on_the_gpu(shape):
    f = fusion(COLUMN_LSE)
    x = torch.randn(shape, device="cuda") * 4
    x[:50, 0] = float("-inf")
    plan = _gpu_close(f, [tensor_meta(shape, DType.float32)], [x])
    assert online_segments(plan)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
def test_online_special_values_on_the_gpu():
    f, metas = cross_entropy(6, 5000, DType.float32)
    x = torch.randn(6, 5000, device="cuda")
    x[0, :100] = float("-inf")  # -inf before any finite value: they add 0
    x[1, :] = float("-inf")  # all -inf: NaN, as torch
    x[2, 17] = float("inf")  # +inf: exp(inf - inf) is NaN
    x[3, 4000] = float("nan")
    x[4, 2500:] = float("-inf")
    target = torch.zeros(6, dtype=torch.int64, device="cuda")
    _gpu_close(f, metas, [x, target])
    f, metas = cross_entropy(6, 5000, DType.bfloat16)  # 8 lanes a load
    _gpu_close(f, metas, [x.bfloat16(), target])


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("sizes", [(4, 32, 8, 2048, 128), (2, 8, 2, 33, 64), (1, 6, 3, 5, 6)])
def test_rope_bwd_gqa_on_the_gpu(sizes):
    parsed = parse_text(rope_bwd_gqa(*sizes))
    gen = torch.Generator(device="cuda").manual_seed(0)
    args = [torch.randn(m.shape, generator=gen, device="cuda").bfloat16()
            for m in parsed.inputs]
    plan = _gpu_close(parsed.fusion, parsed.inputs, args)
    assert ratio(plan) <= 1.3


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("small", [False, True])
def test_thunder_rope_bwd_gqa_region_on_the_gpu(small):
    text = (CORPUS / "rope_bwd_gqa_thunder.py").read_text()
    parsed = parse_text(small_definition(text, "rope_bwd_gqa_thunder") if small else text)
    gen = torch.Generator(device="cuda").manual_seed(0)
    args = [make_input(m, "cuda", generator=gen) for m in parsed.inputs]
    plan = _gpu_close(parsed.fusion, parsed.inputs, args)
    assert not [s for s in plan.segments if s.kind.value == "fallback"]
