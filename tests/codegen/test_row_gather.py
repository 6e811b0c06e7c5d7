"""Issue 18: cross-entropy forward as nvFuser plans it, in 2 kernels.

- The cost of a gather: take_along_axis / gather / index_select read of their input only the
  elements their index selects, in the plan's totals, the lower bound and CP-SAT's objective.
- A gather of one element per reduced row (the target logit) runs in the row reduction's
  epilogue (``optimizer.kinds.gather``): the plan is the row reduction, then the mean.
Plan shapes on the corpus case and small variants, CPU-path results against torch, every
generated kernel through NVRTC, the rules' edges, and on a GPU the kernels against the torch
reference (marked gpu).
"""

from __future__ import annotations

import pytest
import torch

from fusecut.codegen import generate_segment
from fusecut.optimizer.analysis.cost import KIB, launch_kib
from fusecut.optimizer.analysis.shapes import bind
from fusecut.optimizer.errors import InputError
from fusecut.optimizer.ir import parse_text, tensor_meta
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.kinds.rules import classify
from fusecut.optimizer.planner import PlanOptions, make_plan
from fusecut.optimizer.profiles import get_profile
from fusecut.runtime.compile import compile_cubin
from fusecut.runtime.executor import execute_plan
from fusecut.runtime.reference import run_reference
from tests.conftest import CORPUS, HAS_GPU
from tests.helpers import fusion

PLAN = PlanOptions(time_limit_s=2)
SEGMENTERS = ("cpsat", "greedy", "mincut")


def cross_entropy(rows: int, classes: int, text: str | None = None):
    """The corpus case (or ``text``, a variant of it) with inputs of these sizes."""
    text = text or (CORPUS / "cross_entropy_fwd.py").read_text()
    return parse_text(text).fusion, [tensor_meta((rows, classes), DType.bfloat16),
                                     tensor_meta((rows,), DType.int64)]


def shape_of(plan):
    """(kind, names of the ops, reads, writes) of every segment."""
    f = plan.bound.fusion
    return [(s.kind.value, {f.ops[i].name for i in s.schedule.ops}, s.schedule.inputs,
             s.schedule.outputs) for s in plan.segments]


def compiles(plan) -> list[str]:
    sources = []
    for seg in plan.segments:
        sk = generate_segment(plan, seg)
        for k in sk.kernels:
            assert compile_cubin(sk.source, "sm_90", k.name)
        sources.append(sk.source)
    return sources


def logits_and_targets(rows: int, classes: int, high: int | None = None):
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(rows, classes, generator=gen) * 4).bfloat16()
    return logits, torch.randint(0, high or classes, (rows,), generator=gen)


# ---- the plan: the row reduction with the gather in its epilogue, then the mean ---------------

@pytest.mark.parametrize("segmenter", SEGMENTERS)
def test_cross_entropy_corpus_case_plans_two_segments(segmenter):
    parsed = parse_text((CORPUS / "cross_entropy_fwd.py").read_text())
    plan = make_plan(parsed.fusion, parsed.inputs, PlanOptions(segmenter=segmenter,
                                                                time_limit_s=2))
    (red, red_ops, red_in, red_out), (mean, mean_ops, mean_in, mean_out) = shape_of(plan)
    assert (red, mean) == ("reduction", "reduction")
    assert {"take_along_axis", "max", "sum", "log", "sub"} <= red_ops
    assert red_in == ("T0", "T1") and red_out == ("T9", "T13")  # lse, and lse - target logit
    assert mean_in == ("T13",) and mean_out == ("T16",) and "take_along_axis" not in mean_ops
    assert plan.segments[0].schedule.online  # max and sum of exp in one pass
    # the logits are read once: 501 MiB, the lower bound
    assert plan.io_bytes <= 1.001 * plan.lower_bound_bytes
    assert plan.segments[0].read_bytes == 2048 * 128256 * 2 + 2048 * 8


VARIANT = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
T1 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int)
T2 = fd.ops.cast(T0, dtype=DataType.Float)
S0 = fd.define_scalar(0.5, dtype=DataType.Double)
T3 = fd.ops.mul(T2, S0)
T4 = fd.ops.max(T3, dims=[1], keepdim=False, dtype=DataType.Null)
T5 = fd.ops.cast(T1, dtype=DataType.Int32)
T6 = fd.ops.broadcast(T5, is_broadcast_dim=[False, True])
T7 = fd.ops.take_along_axis(T3, T6, dim=1)
T8 = fd.ops.squeeze(T7, dims=[1])
T9 = fd.ops.sub(T4, T8)
fd.add_output(T9)
"""


def test_a_computed_index_and_a_prologue_before_the_gather():
    # the gather reads mul(cast(T0), 0.5) at the row's target: the prologue runs at that one
    # position, after the index (a cast of T1) is computed (a load there is not hoisted)
    f = fusion(VARIANT)
    metas = [tensor_meta((64, 5000), DType.bfloat16), tensor_meta((64,), DType.int64)]
    for segmenter in SEGMENTERS:
        plan = make_plan(f, metas, PlanOptions(segmenter=segmenter, time_limit_s=2))
        ((kind, ops, ins, outs),) = shape_of(plan)
        assert kind == "reduction" and "take_along_axis" in ops
        assert ins == ("T0", "T1") and outs == ("T9",)
    (src,) = compiles(plan)
    epilogue = src[src.index("if (threadIdx.x == 0)"):]
    assert epilogue.index("(int)(T1)") < epilogue.index("in_T0[")
    logits, target = logits_and_targets(64, 5000)
    (got,) = execute_plan(plan, [logits, target]).outputs
    want = logits.float().max(1).values * 0.5 - \
        logits.float().gather(1, target[:, None])[:, 0] * 0.5
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("rows,classes", [
    (64, 5000),  # a block per row
    (300, 40),  # short rows: a warp per row
    (2, 100000),  # few rows: the row splits over blocks; the finishing kernel gathers
])
def test_small_cross_entropy_plans_two_segments_and_equals_torch(rows, classes):
    f, metas = cross_entropy(rows, classes)
    plan = make_plan(f, metas, PLAN)
    assert [s[2:] for s in shape_of(plan)] == [(("T0", "T1"), ("T9", "T13")),
                                                (("T13",), ("T16",))]
    sources = compiles(plan)
    # the row's target logit: one load per row, in the epilogue, clamped as the pointwise
    # gather clamps (a negative index counts from the end)
    gathered = [line for line in sources[0].splitlines()
                if "in_T0[" in line and "fc_clampi<" in line]
    assert len(gathered) == 1 and f"+ {classes} :" in gathered[0], gathered
    split = generate_segment(plan, plan.segments[0]).notes["split"] > 1
    # issued before the row streams in, unless a finishing kernel combines the row's parts
    before = sources[0].index(gathered[0]) < sources[0].index("for (index_t c =")
    assert before != split and (rows, split) != (2, False)
    logits, target = logits_and_targets(rows, classes)
    loss, lse = execute_plan(plan, [logits, target]).outputs
    torch.testing.assert_close(lse, torch.logsumexp(logits.float(), dim=1))
    want = torch.nn.functional.cross_entropy(logits.float(), target, reduction="sum") / 2048
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-5)


def test_an_out_of_range_target_is_the_same_error_as_before():
    f, metas = cross_entropy(8, 100)
    plan = make_plan(f, metas, PLAN)
    logits, target = logits_and_targets(8, 100)
    target[3] = 100
    with pytest.raises(InputError, match="index out of range for an axis of extent 100"):
        execute_plan(plan, [logits, target])


COLUMNS = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.define_tensor(shape=[1, -1], contiguity=[None, True], dtype=DataType.Int)
T3 = fd.ops.sum(T0, dims=[0], keepdim=False, dtype=DataType.Null)
T11 = fd.ops.take_along_axis(T0, T1, dim=0)
T12 = fd.ops.squeeze(T11, dims=[0])
T13 = fd.ops.sub(T3, T12)
fd.add_output(T13)
"""


@pytest.mark.parametrize("shape", [(64, 65536), (3000, 256)])
def test_a_gather_along_a_reduced_outer_axis_joins_the_column_reduction(shape):
    f = fusion(COLUMNS)
    metas = [tensor_meta(shape, DType.float32), tensor_meta((1, shape[1]), DType.int64)]
    plan = make_plan(f, metas, PLAN)
    ((kind, ops, _, _),) = shape_of(plan)
    assert kind == "reduction" and "take_along_axis" in ops
    compiles(plan)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen)
    idx = torch.randint(0, shape[0], (1, shape[1]), generator=gen)
    torch.testing.assert_close(execute_plan(plan, [x, idx]).outputs[0],
                               x.sum(0) - x.gather(0, idx)[0])


# ---- the rule's edges --------------------------------------------------------------------------

def why_not(body: str, *metas) -> str:
    f = fusion(body)
    bound = bind(f, list(metas))
    result = classify(bound, range(len(f.ops)), f.outputs, get_profile())
    assert not result, result
    return result.reason


HEAD = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Int)
"""
ROWS = (tensor_meta((64, 512), DType.float32),)


SUM_AND_GATHER = HEAD + """
T2 = fd.ops.sum(T0, dims=[1], keepdim=True, dtype=DataType.Null)
T3 = fd.ops.take_along_axis(T0, T1, dim={dim})
T4 = fd.ops.add(T2, T3)
fd.add_output(T4)
"""


@pytest.mark.parametrize("dim,index,why", [
    (0, (1, 512), "gathers along an axis the segment does not reduce alone"),
    (1, (64, 2), "re-indexes data and cannot join a reduction segment"),  # 2 per row
])
def test_a_gather_that_is_not_one_per_reduced_row_stays_out(dim, index, why):
    assert why in why_not(SUM_AND_GATHER.format(dim=dim), *ROWS,
                          tensor_meta(index, DType.int64))


def plans_as_the_reference(body: str, index: tuple[int, ...]):
    """The plan of ``body`` over ROWS and an index of this shape: on the CPU path equal to the
    torch reference, every kernel compiled."""
    f = fusion(body)
    plan = make_plan(f, [ROWS[0], tensor_meta(index, DType.int64)], PLAN)
    gen = torch.Generator().manual_seed(0)
    x, idx = torch.randn(64, 512, generator=gen), torch.randint(0, 512, index, generator=gen)
    for got, want in zip(execute_plan(plan, [x, idx]).outputs, run_reference(f, [x, idx]),
                         strict=True):
        torch.testing.assert_close(got, want)
    compiles(plan)
    return plan


MINUS_MAX = HEAD + """
T2 = fd.ops.max(T0, dims=[1], keepdim=True, dtype=DataType.Null)
T3 = fd.ops.sub(T0, T2)
"""


def test_a_gather_of_a_value_computed_from_the_reduction_stays_out():
    # x - max(x) is a row value of the second stage: the epilogue cannot read it at the target
    body = MINUS_MAX + """
T4 = fd.ops.take_along_axis(T3, T1, dim=1)
fd.add_output(T4)
"""
    reason = why_not(body, *ROWS, tensor_meta((64, 1), DType.int64))
    assert "gathers from T3, computed from a reduction result" in reason
    plans_as_the_reference(body, (64, 1))


def test_a_gather_stays_out_of_a_normalization():
    # the row is kept on chip for x - max(x): a persistent kernel has no gathering epilogue
    body = MINUS_MAX + """
T4 = fd.ops.take_along_axis(T0, T1, dim=1)
fd.add_output(T3)
fd.add_output(T4)
"""
    reason = why_not(body, *ROWS, tensor_meta((64, 1), DType.int64))
    assert "gathers a row: only a plain reduction computes it in its epilogue" in reason
    plan = plans_as_the_reference(body, (64, 1))
    assert "normalization" in [s[0] for s in shape_of(plan)]


def test_a_gather_and_a_resize_do_not_share_a_reduction():
    reason = why_not(HEAD + """
T2 = fd.ops.sum(T0, dims=[1], keepdim=True, dtype=DataType.Null)
T3 = fd.ops.take_along_axis(T0, T1, dim=1)
T4 = fd.ops.add(T2, T3)
T5 = fd.ops.pad(T4, [0, 0, 1, 0], None)
fd.add_output(T5)
""", *ROWS, tensor_meta((64, 1), DType.int64))
    assert "cannot share a reduction segment with a resize" in reason


# ---- the cost of a gather ----------------------------------------------------------------------

ONLY_GATHER = HEAD + """
T2 = fd.ops.exp(T0)
T3 = fd.ops.take_along_axis(T2, T1, dim=1)
fd.add_output(T3)
"""


def test_a_gather_reads_only_the_elements_it_selects():
    f = fusion(ONLY_GATHER)
    plan = make_plan(f, [tensor_meta((1024, 4096), DType.float32),
                         tensor_meta((1024, 1), DType.int64)], PLAN)
    (seg,) = plan.segments
    # one float of T0 and one index per row, not the 16 MiB of T0
    assert seg.read_bytes == 1024 * 4 + 1024 * 8
    assert seg.write_bytes == 1024 * 4
    assert plan.lower_bound_bytes == plan.io_bytes  # the bound counts the same elements
    assert seg.est_time_s < 8e-6
    # index_select reads the selected rows, each whole
    f = fusion(HEAD.replace("[-1, -1], contiguity=[True, True], dtype=DataType.Int",
                            "[-1], contiguity=[True], dtype=DataType.Int") + """
T3 = fd.ops.index_select(T0, T1, dim=0)
fd.add_output(T3)
""")
    plan = make_plan(f, [tensor_meta((1024, 4096), DType.float32),
                         tensor_meta((3,), DType.int64)], PLAN)
    assert plan.segments[0].read_bytes == 3 * 4096 * 4 + 3 * 8


def test_a_tensor_read_whole_elsewhere_in_the_segment_costs_whole():
    f = fusion(HEAD + """
T2 = fd.ops.exp(T0)
T3 = fd.ops.take_along_axis(T2, T1, dim=1)
T4 = fd.ops.add(T0, T3)
fd.add_output(T4)
""")
    plan = make_plan(f, [tensor_meta((1024, 4096), DType.float32),
                         tensor_meta((1024, 1), DType.int64)], PLAN)
    assert sum(s.read_bytes for s in plan.segments) >= 1024 * 4096 * 4


def test_cpsat_prices_a_gathered_read_as_the_totals_do():
    # the gather (8 rows of each column) is its own kernel beside the row sum of exp(T0); it
    # recomputes exp from T0 at 8 x 4096 elements: CP-SAT's objective is the plan's bytes plus
    # its launches and a little arithmetic, not an extra 16 MiB for a whole read of T0
    f = fusion(HEAD + """
T2 = fd.ops.exp(T0)
T3 = fd.ops.sum(T2, dims=[1], keepdim=False, dtype=DataType.Null)
T4 = fd.ops.take_along_axis(T2, T1, dim=0)
fd.add_output(T3)
fd.add_output(T4)
""")
    plan = make_plan(f, [tensor_meta((1024, 4096), DType.float32),
                         tensor_meta((8, 4096), DType.int64)], PLAN)
    assert plan.solver.status == "OPTIMAL"
    gather = [s for s in plan.segments if "T4" in s.schedule.outputs]
    assert gather and gather[0].read_bytes == 8 * 4096 * (4 + 8)
    launches = len(plan.segments) * launch_kib(get_profile(), PLAN.launch_weight) * KIB
    extra = plan.solver.objective - launches - plan.io_bytes
    assert 0 <= extra < 256 * KIB, extra


# ---- on the GPU: the kernels against the torch reference ------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("rows,classes", [(2048, 128256), (2, 100000), (300, 40), (5, 7)])
def test_row_gather_kernels_on_the_gpu(rows, classes):
    from fusecut.runtime.kernels import cuda_runner
    from tests.runtime.test_gpu_kernels import close

    f, metas = cross_entropy(rows, classes)
    plan = make_plan(f, metas, PLAN)
    assert len(plan.segments) == 2
    gen = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(rows, classes, generator=gen, device="cuda") * 4).bfloat16()
    target = torch.randint(0, classes, (rows,), generator=gen, device="cuda")
    got = execute_plan(plan, [logits, target], cuda_runner, "cuda").outputs
    close(got, run_reference(f, [logits, target]))
    f = fusion(VARIANT)
    plan = make_plan(f, metas, PLAN)
    got = execute_plan(plan, [logits, target], cuda_runner, "cuda").outputs
    close(got, run_reference(f, [logits, target]))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("shape", [(64, 65536), (3000, 256)])
def test_column_gather_kernels_on_the_gpu(shape):
    from fusecut.runtime.kernels import cuda_runner
    from tests.runtime.test_gpu_kernels import close

    f = fusion(COLUMNS)
    metas = [tensor_meta(shape, DType.float32), tensor_meta((1, shape[1]), DType.int64)]
    plan = make_plan(f, metas, PLAN)
    x = torch.randn(shape, device="cuda")
    idx = torch.randint(0, shape[0], (1, shape[1]), device="cuda")
    got = execute_plan(plan, [x, idx], cuda_runner, "cuda").outputs
    close(got, run_reference(f, [x, idx]))
