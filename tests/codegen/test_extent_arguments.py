"""Kernels take the outermost extent at launch (issue 44, item 1): a segment's code depends on
what its decisions depend on, not on how many rows there are. The same definition planned for
1000, 4096, 8192 and 12345 rows gives the same segments and the same CUDA source, byte for
byte, so the NVRTC cache (keyed by the source) compiles each kernel once; the rows come in as
kernel arguments (``n_rows``, ``n_vec``, ...) whose values are the plan's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from fusecut.codegen import generate_segment
from fusecut.codegen.launch import flat_rows
from fusecut.optimizer.ir import parse_text
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.inputs import tensor_meta
from fusecut.optimizer.planner import make_plan
from fusecut.runtime import ahead
from tests.conftest import CORPUS
from tests.helpers import extent_arg, fusion
from tests.runtime.test_ahead import empty_caches, nvrtc_calls  # noqa: F401 (fixtures)

ROWS = (1000, 4096, 8192, 12345)
B, F, I64 = DType.bfloat16, DType.float32, DType.int64
HEADER = "from nvfuser import FusionDefinition, DataType\ndef fusion(fd):\n"

# RMSNorm backward over [rows, hidden]: the input's gradient (row sums) and the weight's (a
# column sum over every row)
RMSNORM_BWD = """
    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
    T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
    T2 = fd.define_tensor(shape=[-1, 1], contiguity=[True, None], dtype=DataType.Float)
    T3 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.BFloat16)
    T4 = fd.ops.cast(T0, dtype=DataType.Float)
    T5 = fd.ops.cast(T1, dtype=DataType.Float)
    T6 = fd.ops.cast(T3, dtype=DataType.Float)
    T7 = fd.ops.broadcast_in_dim(T6, shape=T0.shape(), broadcast_dims=[1])
    T8 = fd.ops.broadcast_in_dim(T2, shape=T0.shape(), broadcast_dims=[0, 1])
    T9 = fd.ops.mul(T4, T8)
    T10 = fd.ops.mul(T5, T7)
    T11 = fd.ops.mul(T10, T9)
    T12 = fd.ops.sum(T11, dims=[1], keepdim=True)
    S13 = fd.define_scalar(0.000244140625, dtype=DataType.Double)
    T14 = fd.ops.mul(T12, S13)
    T15 = fd.ops.broadcast_in_dim(T14, shape=T0.shape(), broadcast_dims=[0, 1])
    T16 = fd.ops.mul(T9, T15)
    T17 = fd.ops.sub(T10, T16)
    T18 = fd.ops.mul(T17, T8)
    T19 = fd.ops.cast(T18, dtype=DataType.BFloat16)
    T20 = fd.ops.mul(T5, T9)
    T21 = fd.ops.sum(T20, dims=[0], keepdim=False)
    T22 = fd.ops.cast(T21, dtype=DataType.BFloat16)
    fd.add_output(T19)
    fd.add_output(T22)
"""
# SwiGLU backward: the gradients of silu(a) * b for a and b, bf16
SWIGLU_BWD = """
    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
    T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
    T2 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
    T3 = fd.ops.cast(T0, dtype=DataType.Float)
    T4 = fd.ops.cast(T1, dtype=DataType.Float)
    T5 = fd.ops.cast(T2, dtype=DataType.Float)
    T6 = fd.ops.sigmoid(T4)
    T7 = fd.ops.mul(T4, T6)
    T8 = fd.ops.mul(T3, T7)
    T9 = fd.ops.cast(T8, dtype=DataType.BFloat16)
    T10 = fd.ops.mul(T3, T5)
    S11 = fd.define_scalar(1.0, dtype=DataType.Double)
    T12 = fd.ops.sub(S11, T6)
    T13 = fd.ops.mul(T4, T12)
    T14 = fd.ops.add(S11, T13)
    T15 = fd.ops.mul(T6, T14)
    T16 = fd.ops.mul(T10, T15)
    T17 = fd.ops.cast(T16, dtype=DataType.BFloat16)
    fd.add_output(T17)
    fd.add_output(T9)
"""

# a [batch, sequence, hidden] RMSNorm backward as Thunder hands it over (the sizes from the
# inputs: ``T0.shape()``), with its per-row [batch, sequence, 1] statistics
THUNDER_RMSNORM_BWD = (CORPUS / "rmsnorm_bwd_thunder.py").read_text().replace(
    "[8, 2048, 2048]", "T0.shape()").replace("[8, 2048, 1]", "T4.shape()")


def batch_sequence(rows: int) -> tuple[int, int]:
    """``rows`` as batch x sequence: 1000 -> 8 x 125, 4096 -> 8 x 512, 12345 -> 5 x 2469."""
    batch = next(b for b in (8, 5, 3, 1) if rows % b == 0)
    return batch, rows // batch


def thunder_rmsnorm_bwd_inputs(rows: int) -> list:
    b, s = batch_sequence(rows)
    x, stat = (b, s, 2048), (b, s, 1)
    return [(x, B), (x, B), ((2048,), B), (x, B), (stat, F), (x, B)]


# name -> (definition, the inputs at ``rows`` rows)
CASES = {
    "softmax": ((CORPUS / "softmax_fwd.py").read_text(), lambda r: [((r, 4096), B)]),
    "layernorm": ((CORPUS / "layernorm_fwd.py").read_text(),
                  lambda r: [((r, 4096), B), ((4096,), B), ((4096,), B)]),
    "rmsnorm_bwd": (HEADER + RMSNORM_BWD,
                    lambda r: [((r, 4096), B), ((r, 4096), B), ((r, 1), F), ((4096,), B)]),
    "swiglu_bwd": (HEADER + SWIGLU_BWD, lambda r: [((r, 14336), B)] * 3),
    "cross_entropy": ((CORPUS / "cross_entropy_fwd.py").read_text(),
                      lambda r: [((r, 128256), B), ((r,), I64)]),
    "gelu_tanh_bias": ((CORPUS / "gelu_tanh_fwd.py").read_text(),
                       lambda r: [((r, 16384), B), ((16384,), B)]),
    # batch and sequence both vary: the kernel indexes its rows flat (codegen.launch.flat_rows)
    "rmsnorm_bwd_3d": (THUNDER_RMSNORM_BWD, thunder_rmsnorm_bwd_inputs),
}


def plan_at(name: str, rows: int):
    text, inputs = CASES[name]
    return make_plan(parse_text(text).fusion,
                     [tensor_meta(shape, dtype) for shape, dtype in inputs(rows)])


def generated(plan) -> list:
    return [generate_segment(plan, s) for s in plan.segments]


@pytest.mark.parametrize("name", list(CASES))
def test_the_kernels_are_the_same_for_any_number_of_rows(name):
    by_rows = {rows: plan_at(name, rows) for rows in ROWS}
    kinds = {rows: [s.kind for s in p.segments] for rows, p in by_rows.items()}
    assert len(set(map(tuple, kinds.values()))) == 1, kinds  # one segmentation
    sources = {rows: [k.source for k in generated(p)] for rows, p in by_rows.items()}
    for rows in ROWS[1:]:
        for k, (first, other) in enumerate(zip(sources[ROWS[0]], sources[rows])):
            assert first == other, f"{name}: segment {k} differs at {rows} rows"
    assert any(sources[ROWS[0]]), "no generated kernel to compare"


@pytest.mark.parametrize("rows", ROWS)
def test_the_rows_come_in_as_the_plans_values(rows):
    [norm] = generated(plan_at("softmax", rows))
    assert extent_arg(norm.kernels[0], "n_rows") == rows
    assert f"< {rows};" not in norm.source and "row < n_rows;" in norm.source
    [pointwise] = generated(plan_at("gelu_tanh_bias", rows))
    assert extent_arg(pointwise.kernels[0], "n_vec") == rows * 16384 // pointwise.notes["vector"]
    # the loss's mean over the rows: the row count is the reduced length, in chunks
    main, finish = generated(plan_at("cross_entropy", rows))[1].kernels
    parts = main.grid[1]
    chunk = extent_arg(main, "n_chunk")
    assert extent_arg(main, "n_reduced") == rows and extent_arg(finish, "n_parts") == parts
    assert chunk % 4 == 0 and (parts - 1) * chunk < rows <= parts * chunk


def flat(body: str, *metas) -> bool:
    f = fusion(body)
    plan = make_plan(f, list(metas))
    [segment] = plan.segments
    kept = [a for a in range(len(segment.schedule.domain))
            if a not in segment.schedule.reduction_axes]
    return flat_rows(plan.bound, segment.schedule, kept)


NORM_3D = ("T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], "
           "dtype=DataType.Float)\n"
           "T1 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], "
           "dtype=DataType.Float)\n"
           "T2 = fd.ops.add(T0, T1)\nT3 = fd.ops.sum(T2, dims=[2], keepdim=True)\n"
           "T4 = fd.ops.div(T2, T3)\nfd.add_output(T4)")


def test_rows_are_indexed_flat_only_where_every_access_walks_them_so():
    x = tensor_meta((6, 100, 256), F)
    assert flat(NORM_3D, x, x)
    # one input broadcast along the batch only (RoPE's tables): its rows are not one run
    assert not flat(NORM_3D, x, tensor_meta((6, 100, 256), F, strides=(0, 256, 1)))
    # batch and sequence swapped in memory
    assert not flat(NORM_3D, x, tensor_meta((6, 100, 256), F, strides=(256, 6 * 256, 1)))
    # an iota reads the sequence's index as a value: the rows keep their per-axis indices
    iota = NORM_3D.replace("T2 = fd.ops.add(T0, T1)",
                           "S9 = fd.define_scalar(256, dtype=DataType.Int)\n"
                           "T8 = fd.ops.iota(S9, dtype=DataType.Float)\n"
                           "T7 = fd.ops.broadcast_in_dim(T8, shape=T0.shape(), "
                           "broadcast_dims=[2])\nT2 = fd.ops.add(T0, T7)")
    assert not flat(iota, x, x)


def test_one_compile_serves_every_row_count(empty_caches, nvrtc_calls):  # noqa: F811
    for rows in ROWS:
        plan = plan_at("rmsnorm_bwd", rows)
        ahead.submit(lambda plan=plan: ahead.compile_plan(plan, "sm_90"))
        ahead.wait()
        if rows == ROWS[0]:
            first = len(nvrtc_calls)
            assert first >= 1
    assert len(nvrtc_calls) == first  # the other row counts found the kernels compiled


def test_fusecut_codegen_writes_the_same_files_for_other_rows(tmp_path):
    written = {}
    for rows in (1000, 12345):
        out = tmp_path / str(rows)
        inputs = json.dumps([{"shape": [rows, 4096], "dtype": "bfloat16"}])
        r = subprocess.run([sys.executable, "-m", "fusecut.cli", "codegen",
                            str(CORPUS / "softmax_fwd.py"), "--out", str(out), "--inputs",
                            inputs, "--json"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        written[rows] = {p.name: p.read_text() for p in out.glob("*.cu")}
        [segment] = json.loads(r.stdout)["segments"]
        [param] = [p for p in segment["kernels"][0]["params"] if p["kind"] == "extent"]
        assert param == {"kind": "extent", "name": "n_rows", "type": "int", "value": rows}
    assert written[1000] == written[12345] and written[1000]


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_one_compile_runs_every_row_count_right_on_the_gpu(name, tmp_path, monkeypatch):
    """The kernels compiled for the first row count run the others, with the rows passed at
    launch, through both launch paths (a segment at a time; the engine's program), against the
    torch reference."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (run on the device)")
    import fusecut.runtime.compile as rc
    from fusecut.engine import Engine
    from fusecut.runtime.executor import execute_plan
    from fusecut.runtime.kernels import cuda_runner
    from fusecut.runtime.reference import run_reference
    from fusecut.runtime.tensors import make_input
    from tests.runtime.test_gpu_kernels import close

    monkeypatch.setenv("FUSECUT_CACHE_DIR", str(tmp_path))
    rc.clear_memory_cache()
    compiles = []
    for rows in (1000, 3000, 4097):
        plan = plan_at(name, rows)
        gen = torch.Generator(device="cuda").manual_seed(rows)
        args = [make_input(plan.bound.inputs[n], "cuda", gen) for n in plan.fusion.inputs]
        if name == "cross_entropy":  # class indices in range
            args[1] = torch.randint(0, 8, (rows,), device="cuda", generator=gen)
        before = rc.STATS.compiles
        want = run_reference(plan.fusion, args)
        close(execute_plan(plan, args, cuda_runner, "cuda").outputs, want, f"{name} {rows}")
        close(Engine().fusion(plan.fusion).execute(args), want, f"{name} {rows} program")
        compiles.append(rc.STATS.compiles - before)
    assert compiles[0] >= 1 and not any(compiles[1:]), compiles


# batch x sequence of the [batch, sequence, hidden] row reductions: the last two have an axis
# of extent 1, which the binding drops
BATCH_SEQUENCE = ((8, 125), (5, 2469), (3, 7), (1, 4097), (8, 1))
ROW_SUM_3D = ("T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], "
              "dtype=DataType.Half)\n"
              "T3 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], "
              "dtype=DataType.Float)\n"
              "T1 = fd.ops.sum(T0, dims=[2])\nT4 = fd.ops.add(T1, T3)\nT2 = fd.ops.exp(T4)\n"
              "fd.add_output(T2)")


def test_a_row_reduction_over_batch_and_sequence_is_one_kernel():
    # (rows too long for a warp split across blocks by how many rows there are: not free yet)
    sources, hidden = [], 256
    for batch, seq in BATCH_SEQUENCE:
        f = fusion(ROW_SUM_3D)
        plan = make_plan(f, [tensor_meta((batch, seq, hidden), DType.float16),
                             tensor_meta((batch, seq), F)])
        [segment] = plan.segments
        kernels = generate_segment(plan, segment)
        assert extent_arg(kernels.kernels[0], "n_rows") == batch * seq
        sources.append(kernels.source)
    # the flat row indexes the [batch, sequence] statistics and output directly
    assert "const index_t i0 = row;" in sources[0] and "in_T3[i0]" in sources[0]
    # batch 1 or sequence 1 (an axis the binding drops): the same source, as one flat axis is
    # named the same as two
    assert all(s == sources[0] for s in sources[1:])


@pytest.mark.gpu
def test_a_flat_row_reduction_runs_right_on_the_gpu(tmp_path, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (run on the device)")
    import fusecut.runtime.compile as rc
    from fusecut.runtime.executor import execute_plan
    from fusecut.runtime.kernels import cuda_runner
    from fusecut.runtime.reference import run_reference
    from fusecut.runtime.tensors import make_input
    from tests.runtime.test_gpu_kernels import close

    monkeypatch.setenv("FUSECUT_CACHE_DIR", str(tmp_path))
    rc.clear_memory_cache()
    compiles = []
    for batch, seq in BATCH_SEQUENCE:
        f = fusion(ROW_SUM_3D)
        plan = make_plan(f, [tensor_meta((batch, seq, 256), DType.float16),
                             tensor_meta((batch, seq), F)])
        args = [make_input(plan.bound.inputs[n], "cuda") for n in f.inputs]
        before = rc.STATS.compiles
        close(execute_plan(plan, args, cuda_runner, "cuda").outputs, run_reference(f, args),
              f"{batch}x{seq}")
        compiles.append(rc.STATS.compiles - before)
    assert compiles[0] >= 1 and not any(compiles[1:]), compiles
