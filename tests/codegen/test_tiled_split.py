"""A tiled (transposing) pointwise segment splits off the part that needs no tiles
(codegen.pointwise ``_split_off_untiled``): the connected components of the segment's own op
graph whose kernel would not be tiled run in a direct, vectorised kernel beside the tiled one,
in one source. The RoPE forward region (tests/corpus/rope_fwd_thunder.py) is the case: only k's
RoPE is written transposed; q's RoPE and v's repeat share nothing with it but cos and sin.
"""

from __future__ import annotations

import re

import pytest
import torch

from fusecut.codegen import generate_segment
from fusecut.codegen.code import lines, stmt
from fusecut.codegen.kernel import SegmentKernels, segment_kernels
from fusecut.codegen.pointwise import op_components
from fusecut.codegen.preamble import HEADER, preamble
from fusecut.optimizer.ir import parse_text
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.inputs import tensor_meta
from fusecut.optimizer.planner import PlanOptions, make_plan
from fusecut.runtime.compile import compile_cubin
from fusecut.runtime.reference import run_reference
from fusecut.runtime.tensors import to_torch_dtype
from tests.codegen.index_text import parse_index
from tests.conftest import CORPUS
from tests.corpus_torch import CASES, assert_cpu_path_equals_oracle, small_definition
from tests.helpers import fusion
from tests.host_kernels import run_on_host

PLAN = PlanOptions(time_limit_s=10)
DIRECT, TILED = "fusecut_segment0_pointwise", "fusecut_segment0_transpose"


def _rope_fwd(small: bool):
    text = (CORPUS / "rope_fwd_thunder.py").read_text()
    parsed = parse_text(small_definition(text, "rope_fwd_thunder") if small else text)
    plan = make_plan(parsed.fusion, parsed.inputs, PLAN)
    assert [s.kind.value for s in plan.segments] == ["pointwise"]
    return parsed, plan


def _writes(kernel) -> list[str]:
    return [p.name for p in kernel.params if p.kind == "out"]


def _reads(kernel) -> list[str]:
    return [p.name for p in kernel.params if p.kind == "in"]


def _host_run(plan, seg, sk, name: str, inputs: dict[str, torch.Tensor], tmp_path):
    """The outputs kernel ``name`` writes, computed on the CPU."""
    kernel = next(k for k in sk.kernels if k.name == name)
    outs = {t: torch.empty(plan.bound.shapes[t],
                           dtype=to_torch_dtype(plan.bound.fusion.tensors[t].dtype))
            for t in _writes(kernel)}
    run_on_host(sk, inputs | outs, tmp_path, name)
    return outs


def test_rope_fwd_runs_q_and_v_in_a_direct_kernel_beside_k_s_tiled_one():
    _, plan = _rope_fwd(small=False)
    seg = plan.segments[0]
    # q's RoPE, k's RoPE, v's repeat: three components, none computing what another reads
    assert len(op_components(plan.bound, seg.schedule)) == 3
    for vector in (None, 1):
        sk = generate_segment(plan, seg, vector)
        direct, tiled = sk.kernels
        assert (direct.name, tiled.name) == (DIRECT, TILED)
        assert _writes(direct) == ["T50", "T51"] and _writes(tiled) == ["T52"]
        # each reads its own projection; both the small cos and sin tables (2 x 1 MiB)
        assert _reads(direct) == ["T2", "T0", "T1", "T4"] and _reads(tiled) == ["T5", "T1", "T4"]
        assert sk.notes["writes"] == {DIRECT: ["T50", "T51"], TILED: ["T52"]}
        assert sk.notes["scheme"] == "transpose" and sk.notes["written_through_tiles"] == ["T52"]
        assert sk.notes["direct"]["index_type"] == sk.notes["index_type"] == "int"
        # one preamble, then both kernels: the tiles only in the second
        assert sk.source.count(HEADER) == 1 and sk.source.count("T fc_clampi(") == 1
        direct_code, tiled_code = sk.source.split(f" {TILED}(")
        assert "__shared__" not in direct_code and "__shared__" in tiled_code
        assert re.search(r"\b(in_T5|out_T52)\b", direct_code) is None  # k's input and output
        assert re.search(r"\b(in_T2|in_T0|out_T5[01])\b", tiled_code) is None
        assert (sk.notes["direct"]["vector"], sk.notes["vector"]) == ((8, 8) if vector is None
                                                                      else (1, 1))
        compile_cubin(sk.source, "sm_90", direct.name)
    assert sk.vector_aligned == {}  # vector 1: nothing needs aligning


def test_rope_fwd_on_the_cpu_path_equals_torch():
    parsed, plan = _rope_fwd(small=True)
    assert len(generate_segment(plan, plan.segments[0]).kernels) == 2  # split at this size too
    assert_cpu_path_equals_oracle("rope_fwd_thunder", parsed, plan)


def test_rope_fwd_direct_kernel_on_the_host_equals_the_reference(tmp_path):
    parsed, plan = _rope_fwd(small=True)
    seg = plan.segments[0]
    sk = generate_segment(plan, seg)
    torch.manual_seed(0)
    inputs = [torch.randn(m.shape).to(to_torch_dtype(m.dtype)) for m in parsed.inputs]
    got = _host_run(plan, seg, sk, DIRECT, dict(zip(parsed.fusion.inputs, inputs)), tmp_path)
    want = dict(zip(parsed.fusion.outputs, run_reference(parsed.fusion, inputs)))
    assert sorted(got) == ["T50", "T51"]
    for t, g in got.items():
        torch.testing.assert_close(g, want[t].contiguous(), rtol=0, atol=0)
    # the oracle too (a bf16 rounding apart at most)
    oracle = dict(zip(parsed.fusion.outputs, CASES["rope_fwd_thunder"](*inputs)))
    for t, g in got.items():
        torch.testing.assert_close(g.float(), oracle[t].float(), rtol=2e-2, atol=2e-2)


# x + bias, and the transpose of (T * bias): two components reading the bias, the transposed one
# reading SHARED, another input (T1) or the same one as the direct part (T0)
TWO_PARTS = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
T2 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.BFloat16)
T3 = fd.ops.broadcast_in_dim(T2, shape=T0.shape(), broadcast_dims=[1])
T4 = fd.ops.add(T0, T3)
T5 = fd.ops.broadcast_in_dim(T2, shape=T0.shape(), broadcast_dims=[1])
T6 = fd.ops.mul(SHARED, T5)
T7 = fd.ops.permute(T6, dims=[1, 0])
fd.add_output(T4)
fd.add_output(T7)
"""


def _two_parts(shared: str):
    f = fusion(TWO_PARTS.replace("SHARED", shared))
    metas = [tensor_meta((256, 128), DType.bfloat16)] * 2 + [tensor_meta((128,), DType.bfloat16)]
    plan = make_plan(f, metas, PlanOptions(time_limit_s=2))
    assert [s.kind.value for s in plan.segments] == ["pointwise"]
    assert len(op_components(plan.bound, plan.segments[0].schedule)) == 2
    return plan


def test_parts_sharing_only_a_small_input_split(tmp_path):
    plan = _two_parts("T1")
    seg = plan.segments[0]
    sk = generate_segment(plan, seg)
    assert [(k.name, _writes(k)) for k in sk.kernels] == [(DIRECT, ["T4"]), (TILED, ["T7"])]
    compile_cubin(sk.source, "sm_90", DIRECT)
    x, y, bias = (torch.randn(shape).to(torch.bfloat16) for shape in ((256, 128), (256, 128), 128))
    got = _host_run(plan, seg, sk, DIRECT, {"T0": x, "T1": y, "T2": bias}, tmp_path)
    torch.testing.assert_close(got["T4"], run_reference(plan.bound.fusion, [x, y, bias])[0],
                               rtol=0, atol=0)


def test_parts_sharing_a_large_input_keep_one_kernel():
    # both read T0 (64 KiB of the segment's 192): reading it twice would cost a third more
    plan = _two_parts("T0")
    sk = generate_segment(plan, plan.segments[0])
    assert [k.name for k in sk.kernels] == [TILED] and "writes" not in sk.notes
    assert _writes(sk.kernels[0]) == ["T4", "T7"]


# a slice of a tall input beside the negated transpose of another: the slice's offsets need
# 64-bit indices when the input is tall, and the tiled part's do not
SLICED = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
T2 = fd.ops.slice(T0, start_indices=[START, 0], end_indices=[END, 128], strides=[1, 1])
T3 = fd.ops.neg(T2)
T4 = fd.ops.permute(T1, dims=[1, 0])
T5 = fd.ops.neg(T4)
fd.add_output(T3)
fd.add_output(T5)
"""


@pytest.mark.parametrize("rows", [1 << 10, 1 << 24])
def test_parts_split_only_with_one_index_type(rows):
    # sizes as metadata: nothing is allocated
    f = fusion(SLICED.replace("START", str(rows - 384)).replace("END", str(rows - 128)))
    metas = [tensor_meta((rows, 128), DType.bfloat16), tensor_meta((128, 256), DType.bfloat16)]
    plan = make_plan(f, metas, PlanOptions(time_limit_s=2))
    sk = generate_segment(plan, plan.segments[0])
    if rows < 1 << 24:
        assert [k.name for k in sk.kernels] == [DIRECT, TILED]
        assert sk.source.count("typedef int index_t;") == 2
    else:  # one source has one index_t: the direct part would need int64, the tiled one int
        assert [k.name for k in sk.kernels] == [TILED] and sk.notes["index_type"] == "int64"


def test_a_transpose_of_one_component_is_unchanged():
    parsed = parse_text((CORPUS / "transpose_add.py").read_text())
    plan = make_plan(parsed.fusion, parsed.inputs, PLAN)
    (seg,) = plan.segments
    assert len(op_components(plan.bound, seg.schedule)) == 1
    sk = generate_segment(plan, seg)
    assert [k.name for k in sk.kernels] == [TILED] and "writes" not in sk.notes


def test_a_source_is_the_preamble_its_code_calls_then_the_code():
    body = [*lines("typedef int index_t;", "// fc_vec<float, 4> names a preamble piece"),
            stmt("__device__ float f(float x) { return fc_max(x, 0.f); }", "fc_max")]
    sk = segment_kernels(0, "pointwise", body, [], [], {}, {})
    assert sk.code == "\n".join(s.text for s in body) + "\n" and sk.uses == {"fc_max"}
    assert sk.source == preamble(sk.uses) + "\n" + sk.code and "fc_max(float a" in sk.source
    assert "struct alignas" not in sk.source  # a comment calls nothing: no fc_vec
    assert SegmentKernels(0, "pointwise", "", []).source == ""  # no kernel, no source


def test_batched_tiles_run_consecutively_in_a_block():
    """Where the domain has batch axes a block takes TILES_PER_BLOCK consecutive tiles, the
    batch index fastest, so they share the window of the batch-broadcast cos/sin tables; a
    transpose without batch axes keeps one tile per block."""
    from fusecut.codegen import tiles

    def _plan(name):
        parsed = parse_text((CORPUS / f"{name}.py").read_text())
        return make_plan(parsed.fusion, parsed.inputs, PlanOptions(time_limit_s=2))

    run = tiles.TILES_PER_BLOCK
    plan = _plan("rope_fwd_thunder")
    sk = generate_segment(plan, plan.segments[0])
    tiled = [k for k in sk.kernels if k.name.endswith("_transpose")][0]
    # 8 batches x 8 kv heads (each tile written to both query heads of its group) x 64 tiles
    assert tiled.grid == (-(-4096 // run), 1, 1)
    assert f"for (index_t tile = (index_t)blockIdx.x * {run}; tile < tile_end; ++tile)" in sk.source
    assert "const index_t batch = tile % 64;" in sk.source
    plan = _plan("transpose_add")
    source = generate_segment(plan, plan.segments[0]).source
    assert "tile += gridDim.x" in source and "tile_end" not in source


def test_a_repeated_head_is_computed_once_and_written_to_each_copy():
    """k's 8 heads are repeated to 16 (grouped-query attention): the tiled kernel reads them only
    as ``(x2 / 2)``, so it computes a tile once per kv head and stores it to both query heads."""
    _, plan = _rope_fwd(small=False)
    sk = generate_segment(plan, plan.segments[0])
    assert sk.notes["copies"] == {2: 2}
    tiled_code = sk.source.split(f" {TILED}(")[1]
    assert "const index_t x2_copy = batch % 8;" in tiled_code
    assert "const index_t x2 = x2_copy * 2;" in tiled_code
    assert "for (int rep = 0; rep < 2; ++rep)" in tiled_code
    assert "(x2 + rep) * 2048" in tiled_code  # the store, per copy
    # every load names the head only divided by the group: both copies hold the same values
    loads = tiled_code.split("// 3. the outputs")[0]
    assert re.findall(r"\bx2\b", loads.split("x2_copy * 2;")[1]) == \
        re.findall(r"\bx2\b(?= / 2\))", loads.split("x2_copy * 2;")[1])
    compile_cubin(sk.source, "sm_90", TILED)


def test_repeated_axis_needs_every_use_divided_by_one_factor():
    from fusecut.codegen.code import stmt
    from fusecut.codegen.index import Var
    from fusecut.codegen.tiles import Repeat, repeated_axis

    def spelling(*indices):  # statements spelling these indices
        return [stmt("...", parse_index(i)) for i in indices]

    xs, domain = [Var(f"x{k}") for k in range(4)], [8, 64, 16, 128]
    divided = spelling("x0 * 9 + (x2 / 2) * 128 + x3", "(x2 / 2) + x1")
    assert repeated_axis(xs, domain, [0, 2], divided) == Repeat(2, 2)
    assert repeated_axis(xs, domain, [0, 2], divided + spelling("x2 * 128 + x3")) is None
    assert repeated_axis(xs, domain, [0, 2], divided + spelling("(x2 / 4) + x3")) is None
    assert repeated_axis(xs, [8, 64, 6, 128], [0, 2], divided[:1] + spelling("(x2 / 4)")) is None
    assert repeated_axis(xs, [8, 64, 6, 128], [0, 2], spelling("(x2 / 4) + x3")) is None  # 6 % 4
    assert repeated_axis(xs, domain, [0, 2], spelling("x1 + x3")) is None  # x2 unused: no repeat
