"""Code generation without a GPU: every kernel compiles with NVRTC, and index math is right.

NVRTC needs no GPU, so CI compiles every generated kernel of every corpus case for sm_80 and
sm_90, and of random fusions. Index arithmetic the emitter writes as C is also evaluated in Python
here and compared with torch's own indexing.
"""

from __future__ import annotations

import itertools
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fusecut.codegen import GENERATED_KINDS, generate_segment
from fusecut.codegen.emit import Emitter
from fusecut.codegen.index import Var
from fusecut.codegen.layout import address, decompose, merge_axes
from fusecut.codegen.preamble import HEADER, PIECES, needed, preamble
from fusecut.optimizer.analysis.shapes import bind
from fusecut.optimizer.ir import parse_text, tensor_meta
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.printer import print_fusion
from fusecut.optimizer.planner import SEGMENTERS, PlanOptions, make_plan
from fusecut.runtime.compile import compile_cubin
from tests.conftest import CORPUS_FILES
from tests.helpers import extent_arg, fusion
from tests.strategies import fusions, resized_reductions


def compile_plan(plan, arch: str) -> int:
    count = 0
    for seg in plan.segments:
        sk = generate_segment(plan, seg)
        if sk.kernels:
            assert unread_values(sk.source) == [], sk.source
            assert same_type_casts(sk.source) == [], sk.source
            cubin = compile_cubin(sk.source, arch, sk.kernels[0].name)
            assert len(cubin) > 0
            for k in sk.kernels:
                bounds = r"__launch_bounds__\(\d+(, \d+)?\)"  # threads[, blocks per SM]
                assert re.search(rf'extern "C" __global__ void {bounds} {k.name}\(', sk.source), \
                    k.name
            count += len(sk.kernels)
    return count


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("path", CORPUS_FILES, ids=[p.stem for p in CORPUS_FILES])
def test_every_corpus_kernel_compiles(path, arch):
    parsed = parse_text(path.read_text())
    plan = make_plan(parsed.fusion, parsed.inputs, PlanOptions(time_limit_s=2))
    kinds = {s.kind.value for s in plan.segments}
    n = compile_plan(plan, arch)
    assert n >= 1 or kinds <= {"library", "fallback"}


@settings(max_examples=40, deadline=None)
@given(fusions(max_ops=8, extents=[1, 2, 3, 5, 8, 13, 16, 64, 130]))
def test_random_fusion_kernels_compile(drawn):
    plan = make_plan(drawn.fusion, drawn.inputs, PlanOptions(time_limit_s=1))
    compile_plan(plan, "sm_90")


@settings(max_examples=200, deadline=None)
@given(st.one_of(resized_reductions(), fusions(max_ops=10, extents=[0, 1, 2, 3, 5, 8, 13])))
def test_codegen_accepts_every_segment_the_planner_makes(drawn):
    # The kinds' rules are the planner's contract with the code generator: whichever segmenter
    # planned it, no segment makes the generator raise (a PlanError sends the fusion to torch).
    # Generation only, no NVRTC: cheap enough for many plans, resizes meeting reductions included.
    for segmenter in SEGMENTERS:
        plan = make_plan(drawn.fusion, drawn.inputs,
                         PlanOptions(segmenter=segmenter, time_limit_s=1))
        for seg in plan.segments:
            sk = generate_segment(plan, seg)
            empty = all(plan.bound.numel(t) == 0 for t in seg.schedule.outputs)
            assert bool(sk.kernels) == (seg.kind in GENERATED_KINDS and not empty), seg.kind


def _eval(expr, env: dict[str, int]) -> int:
    """Evaluate an index expression as the generator renders it to C (our own generated text)."""
    py = str(expr).replace("/", "//").replace("(uindex_t)", "")  # positions: never negative
    py = re.sub(r"fc_clampi<\w+>\(", "_clamp(", py)
    return eval(py, {"_clamp": lambda i, hi: min(max(i, 0), hi)}, dict(env))


def test_decompose_and_address_match_row_major_order():
    extents = [3, 5, 7]
    lines = decompose(Var("flat"), extents, ["a", "b", "c"], "index_t")
    for flat in range(3 * 5 * 7):
        env = {"flat": flat}
        for line in lines:
            name, expr = re.match(r"const index_t (\w+) = (.*);", line.text).groups()
            env[name] = _eval(expr, env)
        assert (env["a"], env["b"], env["c"]) == (flat // 35, flat // 7 % 5, flat % 7)
        assert _eval(address((Var("a"), Var("b"), Var("c")), (35, 7, 1)), env) == flat


VIEWS = """
T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float)
T1 = fd.ops.permute(T0, dims=[2, 0, 1])
T2 = fd.ops.reshape(T1, new_shape=[-1, 6])
T3 = fd.ops.slice(T0, start_indices=[1, 0, 2], end_indices=[3, 3, 4], strides=[1, 2, 1])
T4 = fd.ops.broadcast_in_dim(T3, shape=[4, 2, 2, 2], broadcast_dims=[1, 2, 3])
fd.add_output(T2)
fd.add_output(T4)
"""


@pytest.mark.parametrize("target", ["T1", "T2", "T3", "T4"])
def test_index_maps_of_views_match_torch(target):
    f = fusion(VIEWS)
    bound = bind(f, [tensor_meta((3, 4, 5), DType.float32)])
    src = torch.arange(60).reshape(3, 4, 5)
    want = {"T1": src.permute(2, 0, 1), "T2": src.permute(2, 0, 1).reshape(-1, 6),
            "T3": src[1:3, 0:3:2, 2:4],
            "T4": src[1:3, 0:3:2, 2:4].unsqueeze(0).expand(4, 2, 2, 2)}[target]
    producer = {o: op for op in f.ops for o in op.outputs}
    em = Emitter(bound, tuple(range(len(f.ops))), {"T0"}, lambda t, i: "", "index_t")
    shape = bound.shapes[target]
    names = [Var(f"x{a}") for a in range(len(shape))]
    for idx in itertools.product(*[range(e) for e in shape]):
        env = {v.name: i for v, i in zip(names, idx)}
        t, cur = target, tuple(names)
        while t != "T0":  # follow the chain of index maps back to the input
            op = producer[t]
            cur = em.operand_index(op, cur)
            t = op.inputs[0]
        value = src[tuple(_eval(i, env) for i in cur)]
        assert value == want[idx], (target, idx)


def test_generated_source_is_readable():
    parsed = parse_text((CORPUS_FILES[0].parent / "gelu_tanh_fwd.py").read_text())
    plan = make_plan(parsed.fusion, parsed.inputs)
    src = generate_segment(plan, plan.segments[0]).source
    # the outermost extent comes at launch (n_vec): the comment does not pin it either
    assert "// segment 0: pointwise over [*, 16384], n_vec vectors of 8" in src
    assert "fc_vec<__nv_bfloat16, 8>" in src  # 16-byte vectors
    assert "fc_tanh_fast(" in src  # the tanh only reaches a bf16 output: fast math is safe
    assert "#pragma unroll" in src


def test_merge_axes_joins_axes_every_access_walks_flat():
    # contiguous everywhere: one run
    assert merge_axes([8, 14], [(14, 1), (14, 1)]) == [(0, 1)]
    # a row vector broadcast along axis 1 keeps the axes apart; a column one too
    assert merge_axes([8, 16], [(16, 1), (0, 1)]) == [(0, 0), (1, 1)]
    assert merge_axes([8, 16], [(16, 1), (1, 0)]) == [(0, 0), (1, 1)]
    # broadcast along both merged axes is fine; the broadcast bias splits axis 0 off
    assert merge_axes([4, 6, 10], [(60, 10, 1), (0, 10, 1), (0, 0, 0)]) == [(0, 0), (1, 2)]
    # unit axes join any run, whatever their stride
    assert merge_axes([1, 5, 1, 3], [(7, 3, 99, 1)]) == [(0, 3)]
    # padded rows (stride 16 for 14 elements) do not merge
    assert merge_axes([8, 14], [(16, 1)]) == [(0, 0), (1, 1)]


def _index_math(src: str) -> dict[str, str]:
    """The domain indices a kernel computes from its flat position: name -> C expression."""
    return dict(re.findall(r"const index_t (x\w*) = ([^;]*);", src))


def test_contiguous_domain_is_indexed_flat():
    """silu_mul's tensors are all contiguous [8192, 14336]: one flat index, no division by
    14336 per vector; gelu's bias is broadcast along the rows, so its domain keeps two axes."""
    parsed = parse_text((CORPUS_FILES[0].parent / "silu_mul_fwd.py").read_text())
    plan = make_plan(parsed.fusion, parsed.inputs)
    sk = generate_segment(plan, plan.segments[0])
    math = _index_math(sk.source)
    assert math == {"x0_1": "flat"}, math
    assert "indexed as [*]" in sk.source and sk.notes["vector"] == 8
    assert sk.notes["indexed_as"] == [117440512] and extent_arg(sk.kernels[0], "n_vec") == \
        117440512 // 8
    assert "in_T0 + x0_1)" in sk.source and "out_T11 + x0_1)" in sk.source
    parsed = parse_text((CORPUS_FILES[0].parent / "gelu_tanh_fwd.py").read_text())
    plan = make_plan(parsed.fusion, parsed.inputs)
    src = generate_segment(plan, plan.segments[0]).source
    assert "x1 = (uindex_t)flat % 16384" in src and "x0 = (uindex_t)flat / 16384" in src
    assert "in_T1 + x1)" in src and "in_T0 + x0 * 16384 + x1)" in src


MERGE = """
T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float)
T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T2 = fd.ops.broadcast_in_dim(T1, shape=T0.shape(), broadcast_dims=[1, 2])
fd.add_output(fd.ops.add(T0, T2))
"""
NO_MERGE = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.ops.slice(T0, start_indices=[0, 1], end_indices=[6, 11], strides=[1, 1])
fd.add_output(fd.ops.neg(T1))
"""


def test_partial_merge_and_no_merge_through_index_maps():
    f = fusion(MERGE)
    plan = make_plan(f, [tensor_meta((4, 6, 10), DType.float32),
                         tensor_meta((6, 10), DType.float32)])
    src = generate_segment(plan, plan.segments[0]).source
    assert _index_math(src) == {"x1_2": "(uindex_t)flat % 60", "x0": "(uindex_t)flat / 60"}
    assert "in_T0 + x0 * 60 + x1_2)" in src and "in_T1 + x1_2)" in src
    assert not re.search(r"\bx[12]\b", src)
    compile_cubin(src, "sm_90", "merge")
    f = fusion(NO_MERGE)  # the slice reads T0 at (x0, 1 + x1): per-axis indices stay
    plan = make_plan(f, [tensor_meta((6, 12), DType.float32)])
    src = generate_segment(plan, plan.segments[0]).source
    assert "flat % 10" in src and "flat / 10" in src


FAST = """
T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.BFloat16)
T1 = fd.ops.cast(T0, dtype=DataType.Float)
T2 = fd.ops.exp(T1)
T3 = fd.ops.tanh(T1)
T4 = fd.ops.exp(fd.ops.neg(T1))
T5 = fd.ops.where(fd.ops.gt(T4, T1), T1, T3)
fd.add_output(fd.ops.cast(T2, dtype=DataType.BFloat16))
fd.add_output(fd.ops.cast(T5, dtype=DataType.BFloat16))
fd.add_output(fd.ops.sqrt(T3))
"""


def test_fast_math_only_where_it_cannot_show():
    from fusecut.codegen.precision import fast_math_tensors

    f = fusion(FAST)
    plan = make_plan(f, [tensor_meta((64,), DType.bfloat16)])
    (seg,) = plan.segments
    fast = fast_math_tensors(plan.bound, seg.schedule)
    assert "T2" in fast  # exp -> bf16 output
    assert "T4" not in fast  # exp -> comparison: a last-bit change could flip the select
    assert "T3" not in fast  # tanh -> a float32 output (sqrt) would show the error


@pytest.mark.parametrize(("exponent", "code"), [
    ("2.0", "(T0 * T0)"), ("3.0", "(T0 * T0 * T0)"), ("0.5", "sqrtf(T0)"),
    ("-0.5", "rsqrtf(T0)"), ("-1.0", "(1.0f / T0)"), ("1.0", "(T0)"), ("0.0", "1.0f"),
    ("2.5", "powf(T0, (float)(2.5))")])
def test_pow_by_a_small_constant_is_arithmetic(exponent, code):
    """As torch's pow_tensor_scalar: x.pow(2) of RMSNorm is x * x (powf costs tens of
    instructions per element; Thunder's RMSNorm backward has a pow by 1); other exponents keep
    powf."""
    f = fusion(f"""
T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
S1 = fd.define_scalar({exponent}, dtype=DataType.Double)
T2 = fd.ops.pow(T0, S1)
fd.add_output(T2)
""")
    plan = make_plan(f, [tensor_meta((1024,), DType.float32)])
    (seg,) = plan.segments
    source = generate_segment(plan, seg).source
    assert f"T2 = {code};" in source.replace("vec_T0.v[_lane]", "T0"), source
    assert ("powf" in _code(source)) == (exponent == "2.5")
    assert compile_plan(plan, "sm_90") == 1


# ---- readable sources: names, comments, only the helpers used, no dead values ----------------

_DECLARED = re.compile(r"^\s*(?:const )?(\w[\w<>, :]*?) (\w+)(?: = |\[|;)", re.M)
_CAST = re.compile(r"\((float|double|int|long long|bool)\)\((\w+)((?:\[\w+\])*)\)")


def _code(source: str) -> str:
    """The kernels of a source (after the preamble), without comments."""
    kernels = source[source.index('extern "C"'):] if 'extern "C"' in source else source
    return "\n".join(line.split("//", 1)[0] for line in kernels.splitlines())


def unread_values(source: str) -> list[str]:
    """``const`` declarations of the kernel code whose name nothing after them reads."""
    lines = _code(source).splitlines()
    dead = []
    for i, line in enumerate(lines):
        m = re.match(r"\s*const [\w<>, :]+? (\w+) = ", line)
        if m and not re.search(rf"\b{m.group(1)}\b", "\n".join(lines[i + 1:])):
            dead.append(line.strip())
    return dead


def same_type_casts(source: str) -> list[str]:
    """Casts of a declared value (or array element) to the type it already has."""
    code = _code(source)
    types: dict[str, set[str]] = {}
    for ctype, name in _DECLARED.findall(code):
        types.setdefault(name, set()).add(ctype.strip())
    return [m.group(0) for m in _CAST.finditer(code) if types.get(m.group(2)) == {m.group(1)}]


def test_source_checks_catch_dead_values_and_no_op_casts():
    old = """extern "C" __global__ void k(float* out) {
  const float v14 = 1.0f;
  float acc[2];
  const float v15 = (float)(v14);
  const float v16 = __bfloat162float(__float2bfloat16(v15));  // v16: a comment is no read
  out[0] = (float)(acc[1]) + (double)(v15);
}"""
    assert unread_values(old) == ["const float v16 = __bfloat162float(__float2bfloat16(v15));"]
    assert same_type_casts(old) == ["(float)(v14)", "(float)(acc[1])"]


def _plan(case: str):
    parsed = parse_text((CORPUS_FILES[0].parent / f"{case}.py").read_text())
    return make_plan(parsed.fusion, parsed.inputs, PlanOptions(time_limit_s=2))


def _sources(case: str) -> list[str]:
    plan = _plan(case)
    return [generate_segment(plan, s).source for s in plan.segments]


def test_values_are_named_after_tensors_with_their_op():
    (src,) = _sources("layernorm_fwd")
    assert re.search(r"^\s*const float T7 = \(T3_1 - T5\);  // T7 = sub\(T3, T6\)$", src, re.M)
    assert re.search(r"const float T10 = rsqrtf\(T9\);  // T10 = rsqrt\(T9\)$", src, re.M)
    # the bf16 cast of the output is only stored: the store rounds T18, nothing declares T19
    assert "o_T19.v[_lane] = __float2bfloat16(T18);" in src
    assert not re.search(r"const float T19\b", src)
    assert "vec_T1" in src and "p_T0" in src  # input registers are named after their tensor
    assert "fc_welford_f acc0 = fc_welford_f{0, 0, 0, 0};  // T4, T5 = var_mean(T3, dims=[1])" \
        in src
    assert not re.search(r"\b(v|red|l|vl)\d+\b", _code(src))  # no anonymous counters left
    # T3 is evaluated in both stages: one name per evaluation
    assert re.search(r"const float T3 = .*  // T3 = cast\(T0, float32\)$", src, re.M)
    assert re.search(r"const float T3_1 = .*  // T3 = cast\(T0, float32\)$", src, re.M)


def test_names_are_unique_within_a_source():
    for case in ("layernorm_fwd", "layernorm_bwd", "softmax_fwd", "seed_2146_rmsnorm_bwd",
                 "adam_step", "many_segments_stress"):
        for src in _sources(case):
            names = re.findall(r"^\s*const [\w<>, :]+? (\w+) = ", src[src.index('extern "C"'):]
                               if 'extern "C"' in src else "", re.M)
            values = [n for n in names if re.fullmatch(r"T\d+(_\d+)?(_f32)?", n)]
            assert values and len(values) == len(set(values)), (case, values)


def test_recomputed_values_are_marked():
    plan = _plan("seed_2146_rmsnorm_bwd")
    ops = plan.bound.fusion.ops
    marked = 0
    for seg in plan.segments:
        src = generate_segment(plan, seg).source
        for tensor, rest in re.findall(r"// (T\d+) = \w+\((.*)$", src, re.M):
            (i,) = [k for k in seg.schedule.ops if tensor in ops[k].outputs]
            assert rest.endswith("[recomputed]") == (i in seg.recomputed_ops), (seg.index, tensor)
            marked += rest.endswith("[recomputed]")
    assert marked >= 4  # this plan recomputes the normalised input in both segments


def test_only_the_helpers_a_kernel_uses():
    (pointwise,) = _sources("gelu_tanh_fwd")
    for helper in ("fc_block_reduce", "fc_warp_reduce", "fc_welford", "fc_shfl", "fc_max",
                   "fc_add", "int64"):
        assert helper not in pointwise, helper
    assert "fc_tanh_fast(float x)" in pointwise and "fc_vec { T v[N]; }" in pointwise
    (norm,) = _sources("layernorm_fwd")
    assert "struct fc_welford_f" in norm and "T fc_block_reduce(T v" in norm
    for helper in ("fc_welford_d", "fc_block_reduce_n", "fc_ipow", "fc_remainder", "fc_maxop"):
        assert helper not in norm, helper


@pytest.mark.parametrize("piece", PIECES, ids=[p.name for p in PIECES])
def test_each_preamble_piece_compiles_with_its_dependencies(piece):
    uses = {piece.triggers[0]}
    assert piece in needed(uses)
    compile_cubin(preamble(uses) + 'extern "C" __global__ void k() {}\n', "sm_90", "k")


def test_preamble_keeps_declaration_order():
    src = preamble({"fc_block_reduce", "acc0", "fc_maxop", "x", "smem0", "fc_welford_f", "w"})
    assert src.startswith(HEADER)
    marks = ["fc_max(float", "T fc_shfl(T v", "struct fc_welford_f", "struct fc_maxop",
             "T fc_shfl_any(T v", "T fc_warp_reduce(T v", "T fc_block_reduce(T v"]
    at = [src.index(m) for m in marks]
    assert at == sorted(at)
    assert "fc_welford_d" not in src and "fc_min" not in src


@settings(max_examples=25, deadline=None)
@given(fusions(max_ops=8, extents=[1, 2, 3, 8, 64]))
def test_random_fusions_comment_each_value_with_its_op(drawn):
    plan = make_plan(drawn.fusion, drawn.inputs, PlanOptions(time_limit_s=1))
    ops = plan.bound.fusion.ops
    for seg in plan.segments:
        src = generate_segment(plan, seg).source
        for tensor, op in re.findall(r"// (\w+) = (\w+)\(", src):
            assert [o.name for o in ops if tensor in o.outputs] == [op], \
                (tensor, op, print_fusion(drawn.fusion))


# Small fusions through the paths that name, cast and drop values: a bf16 reduction result
# (rounded from float), an unread var output, an outer reduction, a squeeze, a pad value, a cast.
SMALL = {
    "bf16_sum": ("T1 = fd.ops.sum(T0, dims=[1], keepdim=False, dtype=DataType.Null)\n"
                 "fd.add_output(T1)", (64, 256)),
    "bf16_max_outer": ("T1 = fd.ops.max(T0, dims=[0], keepdim=False, dtype=DataType.Null)\n"
                       "fd.add_output(T1)", (256, 64)),
    "mean_only": ("T1 = fd.ops.cast(T0, dtype=DataType.Float)\n"
                  "T2, T3 = fd.ops.var_mean(T1, dims=[1], correction=0, keepdim=False)\n"
                  "T4 = fd.ops.cast(T3, dtype=DataType.BFloat16)\n"
                  "fd.add_output(T4)", (64, 256)),
    "squeeze_pad_cast": ("T1 = fd.ops.sum(T0, dims=[1], keepdim=True, dtype=DataType.Null)\n"
                         "T2 = fd.ops.squeeze(T1, dims=[1])\n"
                         "S3 = fd.define_scalar(0.5, dtype=DataType.Float)\n"
                         "T4 = fd.ops.pad(T0, [1, 1], S3)\n"
                         "T5 = fd.ops.cast(T4, dtype=DataType.Half)\n"
                         "fd.add_output(T2)\nfd.add_output(T5)", (64, 1)),
}


@pytest.mark.parametrize("case", sorted(SMALL))
def test_small_fusions_compile_without_dead_values_or_no_op_casts(case):
    body, shape = SMALL[case]
    f = fusion("T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], "
               "dtype=DataType.BFloat16)\n" + body)
    plan = make_plan(f, [tensor_meta(shape, DType.bfloat16)], PlanOptions(time_limit_s=1))
    assert compile_plan(plan, "sm_90") >= 1  # checks unread values and same-type casts too

@pytest.mark.parametrize(("heads_per_group", "block"), [(2, (256, 1, 1)), (4, (256, 1, 1)),
                                                       (8, (32, 8, 1)), (64, (32, 8, 1))])
def test_short_outer_reduction_keeps_every_thread_busy(heads_per_group, block):
    """Summing the query heads of a GQA group: up to COLUMN_ALONE_ROWS rows per column, each
    thread sums its columns alone (no shared memory); a few more, as many rows at a time as
    there are and more columns per block, so no thread of the block idles."""
    text = f"""
def nvfuser_fusion_id0(fd):
    T0 = fd.define_tensor(shape=[-1, -1, -1, -1], contiguity=[True, True, True, True],
                            dtype=DataType.BFloat16)
    T1 = fd.ops.reshape(T0, new_shape=[2, 4, {heads_per_group}, 64, 128])
    T2 = fd.ops.cast(T1, dtype=DataType.Float)
    T3 = fd.ops.sum(T2, dims=[2], keepdim=False)
    T4 = fd.ops.cast(T3, dtype=DataType.BFloat16)
    fd.add_output(T4)

inputs = [torch.randn((2, {4 * heads_per_group}, 64, 128), dtype=torch.bfloat16)]
"""
    parsed = parse_text(text)
    plan = make_plan(parsed.fusion, parsed.inputs, PlanOptions(time_limit_s=2))
    [segment] = plan.segments
    sk = generate_segment(plan, segment)
    assert sk.notes["layout"] == "outer"
    assert sk.kernels[0].block == block
    assert ("__shared__" in sk.source) == (block[1] > 1)
    assert compile_plan(plan, "sm_90") == 1


def _inner_outer(plan):
    segs = [s for s in plan.segments if s.kind.value == "inner_outer"]
    assert len(segs) == 1, [s.kind.value for s in plan.segments]
    return generate_segment(plan, segs[0])


def test_inner_outer_scheme_of_layernorm_bwd():
    """Resident blocks (one per SM) of row groups; rows prefetched through shared memory (bulk
    copies on sm_90, per-thread cp.async otherwise); one partial row per block for the
    finishing kernel."""
    from fusecut.codegen import launch

    parsed = parse_text((CORPUS_FILES[0].parent / "layernorm_bwd.py").read_text())
    plan = make_plan(parsed.fusion, parsed.inputs, PlanOptions(time_limit_s=2))
    sk = _inner_outer(plan)
    main, finish = sk.kernels
    blocks = plan.profile.sm_count * launch.IO_BLOCKS_PER_SM
    assert main.grid == (blocks, 1, 1) and main.block == (512, 1, 1)
    assert sk.notes["rows_per_block"] == 2 and sk.notes["threads_per_row"] == 256
    # T0 and T1 rows in flight by bulk copy, the per-row mean and rstd per thread, the weight
    # read once; the column sums combine in shared memory, then one partial row per block
    assert sk.notes["prefetched"] == ["T0", "T1", "T2", "T3"] and sk.notes["read_once"] == ["T4"]
    stages = sk.notes["prefetch_stages"]
    assert stages >= 2
    assert "fc_bulk_copy(sm_T0 + " in sk.source and "fc_bulk_copy(sm_T1 + " in sk.source
    assert "fc_group_reduce_n<2, 256>(" in sk.source and "fc_cp_async<4>(" in sk.source
    row = 4096 * 2  # bytes of one bf16 row
    assert main.smem == sk.notes["smem"] >= stages * 2 * 2 * row + row
    assert main.smem <= plan.profile.smem_per_block
    assert [(w.name, w.nbytes) for w in sk.workspaces] == [("c0", blocks * 4096 * 4),
                                                           ("c1", blocks * 4096 * 4)]
    assert f"combine {blocks} blocks' partial column sums" in sk.source
    assert f"for (int p = threadIdx.y; p < {blocks}; p += 32)" in sk.source
    assert finish.grid == (4096 // 32, 1, 1)
    for arch in ("sm_80", "sm_90"):  # sm_80 takes the per-thread copies
        assert compile_cubin(sk.source, arch, main.name)


IO_SMALL = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T2 = fd.ops.mul(T0, T1)
T3 = fd.ops.sum(T2, dims=[1])
T4 = fd.ops.broadcast_in_dim(T3, shape=T0.shape(), broadcast_dims=[0])
T5 = fd.ops.sub(T2, T4)
T6 = fd.ops.sum(T0, dims=[0])
T7 = fd.ops.sum(T5, dims=[0])
fd.add_output(T5)
fd.add_output(T6)
fd.add_output(T7)
"""


@pytest.mark.parametrize("shape,smem", [((3, 37), None), ((1000, 300), None),
                                        ((512, 4096), None), ((512, 4096), 40 * 1024)])
def test_inner_outer_variants_compile(shape, smem):
    """Odd row lengths (per-thread copies, no bulk copy), fewer rows than row groups, and a
    device whose shared memory cannot hold two rows per group (no prefetch) all compile."""
    f = fusion(IO_SMALL)
    metas = [tensor_meta(shape, DType.float32)] * 2
    overrides = {"smem_per_block": smem} if smem else {}
    plan = make_plan(f, metas, PlanOptions(time_limit_s=2, device_overrides=overrides))
    sk = _inner_outer(plan)
    bulk = "fc_bulk_copy(sm_" in sk.source
    assert bulk == (smem is None and shape[1] * 4 % 16 == 0)
    if smem:
        assert sk.notes["prefetch_stages"] == 0 and "fc_cp_async<" not in sk.source
        groups = sk.notes["rows_per_block"]
        assert groups * shape[1] * 4 <= smem  # the groups' column sums fit
    assert sk.kernels[0].smem <= plan.profile.smem_per_block
    for arch in ("sm_80", "sm_90"):
        assert compile_cubin(sk.source, arch, sk.kernels[0].name)


def test_persistent_launch_is_decided_before_any_code_is_written():
    """codegen.launch decides a persistent kernel's block, grid and prefetch from the schedule
    alone; the generator renders exactly that (layernorm_bwd: two row groups of 256 threads,
    rows of T0 and T1 by bulk copy, the weight read once)."""
    from fusecut.codegen.launch import persistent_launch, prefetch_plan

    parsed = parse_text((CORPUS_FILES[0].parent / "layernorm_bwd.py").read_text())
    plan = make_plan(parsed.fusion, parsed.inputs, PlanOptions(time_limit_s=2))
    [seg] = [s for s in plan.segments if s.kind.value == "inner_outer"]
    launch = persistent_launch(plan.bound, seg.schedule, plan.profile, 8)
    fetch = prefetch_plan(plan.bound, seg.schedule, plan.profile, launch)
    assert (launch.rows_per_block, launch.threads_per_row, launch.groups) == (2, 256, True)
    assert fetch.bulk == ("T0", "T1") and fetch.fixed == ("T4",) and fetch.stages >= 2
    sk = generate_segment(plan, seg)
    main = sk.kernels[0]
    assert main.block == (launch.threads, 1, 1) and main.grid == (launch.blocks, 1, 1)
    assert main.smem == fetch.dyn_smem and sk.notes["prefetch_stages"] == fetch.stages
    assert sk.notes["read_once"] == list(fetch.fixed)
    assert sk.notes["prefetched"] == list(fetch.staged + fetch.row_scalars)
    assert all(f"fc_bulk_copy(sm_{t}" in sk.source for t in fetch.bulk)


NORM_SMALL = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
T1 = fd.ops.cast(T0, dtype=DataType.Float)
T2, T3 = fd.ops.var_mean(T1, dims=[1], correction=0, keepdim=False)
T4 = fd.ops.broadcast_in_dim(T3, shape=T0.shape(), broadcast_dims=[0])
T5 = fd.ops.sub(T1, T4)
T6 = fd.ops.cast(T5, dtype=DataType.BFloat16)
fd.add_output(T6)
fd.add_output(T2)
"""


def _normalization(shape):
    plan = make_plan(fusion(NORM_SMALL), [tensor_meta(shape, DType.bfloat16)],
                     PlanOptions(time_limit_s=2))
    (seg,) = plan.segments
    assert seg.kind.value == "normalization"
    return generate_segment(plan, seg)


@pytest.mark.parametrize("cols,guarded", [(4096, False), (4000, True), (8192, False)])
def test_normalization_rows_of_whole_vectors_have_no_bounds_checks(cols, guarded):
    """When every thread holds the same number of whole vectors of the row, the per-vector
    bounds check is left out (it kept the compiler from folding Welford's count: 10% on
    layernorm_fwd); a row that does not divide evenly keeps it."""
    sk = _normalization((64, cols))
    slots, threads, vec = sk.notes["slots"], sk.notes["threads"], sk.notes["vector"]
    assert (slots * threads * vec != cols) == guarded
    assert (f"if (c < {cols})" in sk.source) == guarded
    assert "fc_block_reduce(acc0, fc_welfordop()" in sk.source
    assert compile_cubin(sk.source, "sm_90", sk.kernels[0].name)


def test_normalization_blocks_of_several_rows(monkeypatch):
    """Several rows per block: a group of threads per row on its own named barrier."""
    from fusecut.codegen import launch

    monkeypatch.setattr(launch, "NORM_ROWS_PER_BLOCK", 2)
    sk = _normalization((63, 4096))
    assert sk.kernels[0].block == (512, 1, 1) and sk.kernels[0].grid == (32, 1, 1)
    assert "fc_group_reduce_n<1, 256>(together, fc_welfordop()" in sk.source
    assert "fc_block_reduce" not in sk.source
    for arch in ("sm_80", "sm_90"):
        assert compile_cubin(sk.source, arch, sk.kernels[0].name)


# ---- tiled transpose --------------------------------------------------------------------------

TRANSPOSE_ADD = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
T2 = fd.ops.permute(T1, dims=[1, 0])
T3 = fd.ops.add(fd.ops.cast(T0, dtype=DataType.Float), fd.ops.cast(T2, dtype=DataType.Float))
fd.add_output(fd.ops.cast(T3, dtype=DataType.BFloat16))
"""


def _kernels_of(body: str, *metas):
    plan = make_plan(fusion(body), list(metas), PlanOptions(time_limit_s=2))
    assert len(plan.segments) == 1, [s.kind for s in plan.segments]
    return generate_segment(plan, plan.segments[0])


@pytest.mark.parametrize("tile", [32, 64])
@pytest.mark.parametrize("vec", [1, 2, 4, 8])
def test_tile_phases_cover_each_position_once(tile, vec):
    """The threads of a phase take every (slow, fast) position of a tile exactly once."""
    from fusecut.codegen.tiles import THREADS, TilePhase

    ph = TilePhase(tile, vec)
    seen = []
    for t in range(THREADS):
        for it in range(ph.iters):
            env = {"threadIdx": t, "it": it}
            fast = _eval(ph.fast().replace("threadIdx.x", "threadIdx").replace("(int)", ""), env)
            slow = _eval(ph.slow("it").replace("threadIdx.x", "threadIdx")
                         .replace("(int)", ""), env)
            if slow < tile:
                seen += [(slow, fast + j) for j in range(vec)]
    assert sorted(seen) == [(s, f) for s in range(tile) for f in range(tile)]


def test_transposed_operand_is_staged_and_both_sides_are_vectors():
    """x + y.T: y is read along its own rows into a shared-memory tile (16-byte vectors), x is
    read and the output written along theirs."""
    sk = _kernels_of(TRANSPOSE_ADD, tensor_meta((4096, 2048), DType.bfloat16),
                     tensor_meta((2048, 4096), DType.bfloat16))
    assert sk.notes["scheme"] == "transpose" and sk.notes["tile_axes"] == (0, 1)
    assert sk.notes["staged"] == ["T1"] and sk.notes["vector"] == 8
    assert sk.vector_aligned == {"T1": 16, "T0": 16, "T6": 16}
    src = sk.source
    assert "__shared__ __nv_bfloat16 s0_T1[64][66];" in src  # an odd number of words per row
    assert "fc_vec<__nv_bfloat16, 8>*>(in_T1 + x1 * 4096 + x0)" in src  # along T1's rows
    assert "fc_vec<__nv_bfloat16, 8>*>(in_T0 + x0 * 2048 + x1)" in src
    assert "s0_T1[sl][fa + _lane]" in src and "(out_T6 + x0 * 2048 + x1) = o_T6" in src
    for arch in ("sm_80", "sm_90"):
        compile_cubin(src, arch, sk.kernels[0].name)


def test_layouts_that_agree_keep_the_pointwise_kernel():
    sk = _kernels_of(TRANSPOSE_ADD.replace("dims=[1, 0]", "dims=[0, 1]"),
                     tensor_meta((256, 128), DType.bfloat16),
                     tensor_meta((256, 128), DType.bfloat16))
    assert "scheme" not in sk.notes and "__shared__" not in sk.source
    # too short an axis to fill a tile: the strided reads stay
    sk = _kernels_of(TRANSPOSE_ADD, tensor_meta((4096, 8), DType.bfloat16),
                     tensor_meta((8, 4096), DType.bfloat16))
    assert "scheme" not in sk.notes


def test_input_in_another_stride_order_is_staged():
    from fusecut.optimizer.ir.inputs import TensorMeta

    body = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
fd.add_output(fd.ops.neg(T0))
"""
    sk = _kernels_of(body, TensorMeta((64, 48), (1, 64), DType.float32))  # column-major
    assert sk.notes["scheme"] == "transpose" and sk.notes["staged"] == ["T0"]
    assert sk.notes["tile"] == 64 and "(in_T0 + x0 + x1 * 64)" in sk.source
    compile_cubin(sk.source, "sm_90", sk.kernels[0].name)


def test_permuted_output_is_written_through_a_tile():
    body = """
T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float)
T1 = fd.ops.exp(T0)
fd.add_output(T1)
fd.add_output(fd.ops.permute(T1, dims=[0, 2, 1]))
"""
    sk = _kernels_of(body, tensor_meta((3, 100, 70), DType.float32))
    assert sk.notes["tile_axes"] == (1, 2) and sk.notes["written_through_tiles"] == ["T2"]
    src = sk.source
    assert "__shared__ float so_T2[64][65];" in src
    assert "const index_t batch = tile / 4;" in src  # 2 x 2 tiles per batch index
    assert "out_T2 + x0 * 7000 + x2 * 100 + x1) = w;" in src  # along T2's rows
    compile_cubin(src, "sm_90", sk.kernels[0].name)


def test_transpose_feeding_cat_is_staged_through_the_clamp():
    """Thunder materialises cat([x.T, y]): the transposed piece is read along its rows, its
    index clamped into range as the emitter writes it."""
    body = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
T2 = fd.ops.permute(T0, dims=[1, 0])
fd.add_output(fd.ops.cat([T2, T1], dim=0))
"""
    sk = _kernels_of(body, tensor_meta((512, 256), DType.bfloat16),
                     tensor_meta((128, 512), DType.bfloat16))
    assert sk.notes["scheme"] == "transpose" and sk.notes["staged"] == ["T0"]
    assert "fc_clampi<int>(x0, 255)" in sk.source
    compile_cubin(sk.source, "sm_90", sk.kernels[0].name)


# ---- grouped normalization ----------------------------------------------------------------------

SPLITS = """
T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float)
T1 = fd.ops.reshape(T0, new_shape=[2, 4, 3, 5])
T2 = fd.ops.reshape(T1, new_shape=[2, 12, 5])
T3 = fd.ops.reshape(T0, new_shape=[2, 60])
T4 = fd.ops.reshape(T0, new_shape=[2, 1, 12, 5])
fd.add_output(T2)
fd.add_output(T3)
fd.add_output(T4)
"""


@pytest.mark.parametrize("target", ["T1", "T2", "T3", "T4"])
def test_index_maps_of_split_and_merged_axes_match_torch(target):
    """Reshapes that only split or merge axes index each axis from its parts, and a merge of
    a split gives the parts back (T2 reads T0 at T0's own indices)."""
    f = fusion(SPLITS)
    bound = bind(f, [tensor_meta((2, 12, 5), DType.float32)])
    src = torch.arange(120).reshape(2, 12, 5)
    want = {"T1": src.reshape(2, 4, 3, 5), "T2": src, "T3": src.reshape(2, 60),
            "T4": src.reshape(2, 1, 12, 5)}[target]
    producer = {o: op for op in f.ops for o in op.outputs}
    em = Emitter(bound, tuple(range(len(f.ops))), {"T0"}, lambda t, i: "", "index_t")
    shape = bound.shapes[target]
    names = tuple(Var(f"x{a}") for a in range(len(shape)))
    chain = []
    t, cur = target, names
    while t != "T0":
        op = producer[t]
        cur = em.operand_index(op, cur)
        t = op.inputs[0]
        chain.append(cur)
    if target == "T2":
        assert cur == names  # split then merged: no division left
    if target == "T1":
        assert [str(i) for i in cur] == ["x0", "(x1 * 3 + x2)", "x3"]
    for idx in itertools.product(*[range(e) for e in shape]):
        env = {v.name: i for v, i in zip(names, idx)}
        assert src[tuple(_eval(i, env) for i in cur)] == want[idx], (target, idx)


def test_group_norm_is_one_kernel_reading_through_the_split():
    parsed = parse_text((CORPUS_FILES[0].parent / "group_norm_fwd.py").read_text())
    plan = make_plan(parsed.fusion, parsed.inputs, PlanOptions(time_limit_s=2))
    assert [s.kind.value for s in plan.segments] == ["normalization"]
    assert plan.io_bytes == plan.lower_bound_bytes
    sk = generate_segment(plan, plan.segments[0])
    src = sk.source
    assert len(sk.kernels) == 1 and sk.notes["prefetched"] == ["T0"]
    # the channel index is the group's and the channel-in-group's, joined: a group's rows are
    # one contiguous run, copied whole
    assert "in_T0 + n0 * 1310720 + (n1 * 10) * 4096, 81920" in src
    assert "in_T1[(i1 * 10 + c_2)]" in src
    assert "(out_T23 + i0 * 1310720 + (i1 * 10 + c_2) * 4096 + c_3 * 64 + c_4) = o_T23" in src
    compile_cubin(src, "sm_90", sk.kernels[0].name)


def _group_norm_kernels(n, c, length, groups):
    from tests.runtime.test_gpu_kernels import group_norm

    plan = make_plan(fusion(group_norm(n, c, length, groups)),
                     [tensor_meta((n, c, length), DType.bfloat16),
                      tensor_meta((c,), DType.bfloat16)], PlanOptions(time_limit_s=2))
    assert [s.kind.value for s in plan.segments] == ["normalization"]
    return generate_segment(plan, plan.segments[0])


def test_vector_lanes_inside_a_split_axis_keep_its_outer_part():
    """[1, 6, 1] in 3 groups: the row's only moving axis is the split channel, so the vector
    lane lands inside the joined index, whose group part must stay in the address."""
    sk = _group_norm_kernels(1, 6, 1, 3)
    assert "(in_T0 + (i0 * 2 + c_1))" in sk.source and "(in_T1 + (i0 * 2 + c_1))" in sk.source
    compile_cubin(sk.source, "sm_90", sk.kernels[0].name)


def test_long_group_norm_rows_stream_through_shared_memory():
    """A group of 40960 bf16 values: the next row is copied in (one bulk copy per row on sm_90)
    while the block reduces and writes the current one, by resident blocks."""
    sk = _group_norm_kernels(32, 320, 4096, 32)
    assert sk.notes["prefetched"] == ["T0"] and sk.notes["prefetch_stages"] == 2
    assert sk.kernels[0].grid == (132, 1, 1) and sk.kernels[0].smem == 2 * 40960 * 2
    assert ("fc_bulk_copy(sm_T0 + (nbuf * 1 + g) * 40960, in_T0 + n0 * 1310720 + (n1 * 10) * "
            "4096, 81920" in sk.source)
    compile_cubin(sk.source, "sm_90", sk.kernels[0].name)
    short = _group_norm_kernels(2, 64, 4099, 32)  # 16 KiB rows stay in registers
    assert "prefetched" not in short.notes and short.notes["persisted"] == ["T0"]


def test_rows_of_32_kib_stay_in_registers():
    """Streaming rows through shared memory pays for group norm's 80 KiB rows, not for 32 KiB
    ones (H100: seed_3334's two f32 rows 280 us streamed against 264 in registers); and a
    weight that is the same in every row is read once, so it does not count toward a row's
    bytes (rmsnorm_fwd: 16 KiB of x, 16 KiB of weight: 205 us streamed, 179 in registers)."""
    for case in ("rmsnorm_fwd", "seed_3334_reduction_broadcast_pointwise"):
        parsed = parse_text((CORPUS_FILES[0].parent / f"{case}.py").read_text())
        plan = make_plan(parsed.fusion, parsed.inputs, PlanOptions(time_limit_s=2))
        [segment] = plan.segments
        sk = generate_segment(plan, segment)
        assert "prefetched" not in sk.notes, case
        assert sk.kernels[0].grid[0] == 16384, case  # a block per row
    # drawing random numbers, rows of 16 KiB stream: the copy overlaps the Philox arithmetic
    # (bias_dropout_add_layernorm: 192 us streamed against 207 in registers)
    parsed = parse_text((CORPUS_FILES[0].parent / "bias_dropout_add_layernorm.py").read_text())
    plan = make_plan(parsed.fusion, parsed.inputs, PlanOptions(time_limit_s=2))
    sk = generate_segment(plan, plan.segments[0])
    assert sk.notes["prefetched"] == ["T0", "T2"], sk.notes


def test_pointwise_threads_take_one_vector():
    """One vector a thread: on H100 two were never faster, and slower where a vector's
    loads take many registers (the RoPE forward region's q, k, v, rotated halves and f32
    cos/sin: 179 -> 133 us at one)."""
    for name, n_vec in (("seed_4269_forward_full", 2**22), ("rope_bwd_gqa", 2**22)):
        parsed = parse_text((CORPUS_FILES[0].parent / f"{name}.py").read_text())
        plan = make_plan(parsed.fusion, parsed.inputs, PlanOptions(time_limit_s=2))
        seg = next(s for s in plan.segments if s.kind.value == "pointwise")
        sk = generate_segment(plan, seg)
        assert "v += (index_t)gridDim.x * blockDim.x)" in sk.source  # no loop of vectors
        assert "// loads" in sk.source and " u " not in sk.source
        assert sk.kernels[0].grid == (-(-n_vec // 256), 1, 1)


def test_column_reductions_sum_eight_bf16_columns_a_thread():
    """16-byte loads of bf16 columns: on H100 the bias gradient of gelu_tanh_bwd_bias_grad
    went 308 -> 302 us and the GQA head sums of rope_bwd_gqa 197 -> 174 us against 4 columns."""
    parsed = parse_text((CORPUS_FILES[0].parent / "gelu_tanh_bwd_bias_grad.py").read_text())
    plan = make_plan(parsed.fusion, parsed.inputs, PlanOptions(time_limit_s=2))
    [segment] = [s for s in plan.segments if s.kind.value == "reduction"]
    sk = generate_segment(plan, segment)
    assert "8 columns per thread" in sk.source
    assert compile_plan(plan, "sm_90") == sum(len(generate_segment(plan, s).kernels)
                                              for s in plan.segments)
