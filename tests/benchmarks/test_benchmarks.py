"""The end-to-end benchmark's pure parts, on CPU: ratios, geometric means and tables on synthetic
numbers, tiny-input shrinking of the corpus, splitting profiler events by call, the nvFuser
loader, the first-call budget, and the command line without a GPU. Nothing here is timed."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import fusecut
from benchmarks.common import source_pythonpath
from benchmarks.e2e import corpus_names, parse_args
from benchmarks.e2e_report import (
    Row,
    Systems,
    TinyRow,
    floor_table,
    geomean,
    ratio,
    render,
    summarize,
    times_table,
    tiny_table,
)
from benchmarks.kernel_profile import (
    MARKER,
    CallKernels,
    TraceEvent,
    device_kind,
    marker,
    split_by_call,
    summarize_calls,
    trace_events,
)
from benchmarks.nvfuser_peer import describe, first_call, load_nvfuser
from benchmarks.tiny_inputs import dense_strides_like, shapes_text, shrink_meta
from fusecut.optimizer.ir.inputs import ScalarMeta, TensorMeta
from fusecut.runtime.tensors import make_input, storage_extent
from tests.conftest import CORPUS, CORPUS_FILES

ROOT = Path(__file__).parents[2]
US = 1e-6


def rows_fixture() -> list[Row]:
    """Three memory-bound cases nvFuser ran (fusecut faster on two), one not memory-bound, one
    nvFuser could not run."""
    return [
        Row("a", floor_s=80 * US, fusecut_e2e=100 * US, nvfuser_e2e=200 * US,
            fusecut_kernels=90 * US, nvfuser_kernels=90 * US, compile_s=150 * US,
            eager_s=400 * US, segments=1, fusecut_launches=1, nvfuser_launches=2),
        Row("b", floor_s=80 * US, fusecut_e2e=100 * US, nvfuser_e2e=50 * US,
            fusecut_kernels=80 * US, nvfuser_kernels=160 * US, compile_s=90 * US),
        Row("c", floor_s=40 * US, fusecut_e2e=50 * US, nvfuser_e2e=100 * US,
            fusecut_kernels=40 * US, nvfuser_kernels=40 * US),
        Row("mlp", memory_bound=False, floor_s=10 * US, fusecut_e2e=100 * US,
            nvfuser_e2e=1000 * US, fusecut_kernels=90 * US, nvfuser_kernels=900 * US),
        Row("stream", floor_s=80 * US, fusecut_e2e=100 * US,
            notes=["nvFuser cannot define it"]),
    ]


# ---- ratios, geometric means, wins --------------------------------------------------------------

def test_ratio_and_geomean_skip_missing_values():
    assert ratio(200, 100) == 2.0
    assert math.isnan(ratio(math.nan, 100)) and math.isnan(ratio(1, 0))
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([2.0, math.nan, 8.0]) == pytest.approx(4.0)
    assert math.isnan(geomean([]))


def test_summary_counts_wins_and_takes_geomeans_over_memory_bound_cases_nvfuser_ran():
    s = summarize(rows_fixture())
    # e2e ratios a 2.0, b 0.5, c 2.0 (mlp 10.0 is not memory-bound; stream has no nvFuser)
    assert s.e2e_cases == 3
    assert s.e2e_geomean == pytest.approx((2.0 * 0.5 * 2.0) ** (1 / 3))
    # kernels: a 1.0, b 2.0, c 1.0
    assert s.kernels_cases == 3
    assert s.kernels_geomean == pytest.approx(2 ** (1 / 3))
    # faster end to end: a, c and mlp, of the 4 cases nvFuser ran
    assert (s.wins_e2e, s.compared_e2e) == (3, 4)
    # against torch.compile: a (100 < 150) wins, b (100 > 90) loses
    assert (s.wins_vs_compile, s.compared_vs_compile) == (1, 2)
    # floor fractions: fusecut e2e 0.8, 0.8, 0.8, 0.8 (stream) -> 0.8; mlp left out
    assert s.floor["fusecut_e2e"] == pytest.approx(0.8)
    assert s.floor["eager_s"] == pytest.approx(0.2)


def test_tables_show_ratios_and_leave_out_absent_peers():
    rows = rows_fixture()
    both = times_table(rows, Systems(nvfuser=True, compile=True))
    lines = both.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    row_a = [c.strip() for c in lines[2].strip("|").split("|")]
    assert len(row_a) == len(header)
    assert row_a[header.index("e2e nvFuser / fusecut")] == "2.00"
    assert row_a[header.index("kernels/call fusecut / nvFuser")] == "1 / 2"
    footer = [c.strip() for c in lines[-1].strip("|").split("|")]
    assert len(footer) == len(header)
    assert footer[header.index("e2e nvFuser / fusecut")] == f"{(2.0 * 0.5 * 2.0) ** (1 / 3):.2f}"
    stream = [c.strip() for c in lines[6].strip("|").split("|")]
    assert stream[header.index("nvFuser e2e us")] == "-"
    assert "nvFuser cannot define it" in stream[-1]

    alone = times_table(rows, Systems(nvfuser=False, compile=False))
    alone_header = alone.splitlines()[0]
    assert "nvFuser" not in alone_header and "torch.compile" not in alone_header
    fractions = floor_table(rows, Systems(nvfuser=False, compile=True))
    fractions_header = fractions.splitlines()[0]
    assert "nvFuser" not in fractions_header and "torch.compile" in fractions_header
    text = render(rows, [], Systems(nvfuser=True, compile=True))
    assert "fusecut faster than nvFuser end to end on 3 of the 4 cases nvFuser ran" in text


def test_tiny_goal_allows_ten_us_per_extra_segment():
    one = TinyRow("one", segments=1, fusecut_s=20 * US, nvfuser_s=19 * US)
    three = TinyRow("three", segments=3, fusecut_s=35 * US, nvfuser_s=16 * US)
    alone = TinyRow("alone", segments=1, fusecut_s=20 * US, notes=["nvFuser rejects it"])
    assert one.goal_met is False
    assert three.allowed_s == pytest.approx(36 * US) and three.goal_met is True
    assert alone.goal_met is None
    table = tiny_table([one, three, alone], nvfuser=True)
    assert "| three | " in table and "| 36.0 | yes |" in table and "| 19.0 | no |" in table
    text = render([], [one, three, alone], Systems(nvfuser=True, compile=False))
    assert "on 1 of 2 cases" in text
    assert "nvFuser" not in tiny_table([one], nvfuser=False)


# ---- tiny inputs --------------------------------------------------------------------------------

def test_dense_strides_keep_order_and_broadcast_axes():
    assert dense_strides_like((16, 16), (4096, 1)) == (16, 1)
    assert dense_strides_like((16, 16), (1, 4096)) == (1, 16)  # column-major stays column-major
    assert dense_strides_like((16, 16, 16), (0, 0, 1)) == (0, 0, 1)
    assert dense_strides_like((16, 1, 16), (1024, 1024, 1)) == (16, 16, 1)
    assert dense_strides_like((16, 16, 1), (1024, 1, 1)) == (16, 1, 1)


@pytest.mark.parametrize("path", CORPUS_FILES, ids=[p.stem for p in CORPUS_FILES])
def test_corpus_inputs_shrink_to_tiny_with_the_same_dtypes_and_broadcast_axes(path):
    parsed = fusecut.load(path)
    tiny = [shrink_meta(m) for m in parsed.inputs]
    assert len(tiny) == len(parsed.inputs)
    for big, small in zip(parsed.inputs, tiny):
        if isinstance(big, ScalarMeta):
            assert small == big
            continue
        assert small.dtype == big.dtype
        assert all(s <= 16 and s == min(b, 16) for s, b in zip(small.shape, big.shape))
        assert [s == 0 for s in small.strides] == [s == 0 for s in big.strides]
        # every other axis packed densely: the storage holds exactly the distinct elements
        assert storage_extent(small.shape, small.strides) == small.stored_numel
        t = make_input(small, "cpu")
        assert tuple(t.shape) == small.shape and tuple(t.stride()) == small.strides
    assert shapes_text(tiny).count(",") == len(tiny) - 1


def test_shrinking_a_seed_case_with_stride_zero_inputs():
    parsed = fusecut.load(CORPUS / "seed_2146_rmsnorm_bwd.py")
    t0 = shrink_meta(parsed.inputs[0])
    assert isinstance(t0, TensorMeta)
    assert (t0.shape, t0.strides) == ((16, 16, 16), (0, 0, 1))


# ---- profiler events, split by call -------------------------------------------------------------

def ev(name, start, end, on_device=False, corr=0, annotation=False):
    return TraceEvent(name, on_device, corr, start, end, annotation)


def test_device_kinds():
    assert device_kind("Memset (Device)") == "memset"
    assert device_kind("Memcpy DtoD (Device -> Device)") == "memcpy"
    assert device_kind("Stream Sync") == "sync"
    assert device_kind("nvfuser_pointwise_f0_c1_r0_g0") == "kernel"


def test_split_by_call_places_device_work_by_its_launch_and_counts_kernels():
    m0, m1 = marker("x/fusecut", 0), marker("x/fusecut", 1)
    events = [
        ev(m0, 0, 100), ev(m1, 200, 300),
        # call 0: two kernels and a memset, launched inside its range
        ev("cuLaunchKernel", 10, 12, corr=7), ev("k_a", 20, 50, on_device=True, corr=7),
        ev("cudaLaunchKernel", 13, 15, corr=8), ev("k_b", 50, 60, on_device=True, corr=8),
        ev("cudaMemsetAsync", 16, 17, corr=9), ev("Memset (Device)", 60, 61, True, corr=9),
        # the range mirrored on the device and a sync: neither is work
        ev(m0, 18, 99, on_device=True, annotation=True), ev("Context Sync", 61, 98, True),
        # call 1: a kernel whose device timestamp came from another clock, placed by its launch
        ev("cuLaunchKernel", 210, 211, corr=11), ev("k_c", 1e9, 1e9 + 40, True, corr=11),
        # a kernel outside every call, without a launch event
        ev("stray", 150, 160, on_device=True, corr=99),
    ]
    calls, unassigned = split_by_call(events)
    assert unassigned == 1
    c0, c1 = calls[m0], calls[m1]
    assert (c0.kernels, c0.memsets, c0.memcpys) == (2, 1, 0)
    assert c0.device_s == pytest.approx(41e-6)
    assert (c1.kernels, c1.device_s) == (1, pytest.approx(40e-6))


def test_summarize_calls_takes_medians_per_system():
    calls = {marker("x/nvFuser", i): CallKernels(t * 1e-6, k)
             for i, (t, k) in enumerate([(10, 2), (30, 2), (20, 3)])}
    calls[marker("x/fusecut", 0)] = CallKernels(failed="profiled call failed: RuntimeError")
    stats = summarize_calls(calls)
    assert stats["x/nvFuser"].device_s == pytest.approx(20e-6)
    assert stats["x/nvFuser"].kernels == 2 and stats["x/nvFuser"].calls == 3
    assert math.isnan(stats["x/fusecut"].device_s)
    assert stats["x/fusecut"].notes == ["profiled call failed: RuntimeError"]


def test_trace_events_read_a_real_profile():
    """The adapter reads torch's FunctionEvents (CPU-only here: the markers, no device work)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(3):
            with record_function(marker("cpu/fusecut", i)):
                torch.ones(64).mul_(2)
    events = trace_events(prof.events())
    marks = [e for e in events if e.name.startswith(MARKER)]
    assert len(marks) == 3 and not any(e.on_device for e in events)
    assert all(e.end_us >= e.start_us for e in marks)
    calls, unassigned = split_by_call(events)
    assert sorted(calls) == [marker("cpu/fusecut", i) for i in range(3)]
    assert unassigned == 0 and all(c.kernels == 0 for c in calls.values())


# ---- nvFuser loader, first-call budget ----------------------------------------------------------

def test_nvfuser_absent_is_reported_with_the_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "nvfuser_direct", None)  # import raises ImportError
    peer, reason = load_nvfuser()
    assert peer is None
    assert "nvfuser_direct does not import" in reason and ".nvf/setup.sh" in reason


def test_nvfuser_present_defines_cases_through_the_anchor(monkeypatch):
    class Anchor:
        def load(self, path):
            return ("fd", [path])

    monkeypatch.setitem(sys.modules, "nvfuser_direct", type(sys)("nvfuser_direct"))
    sys.modules["nvfuser_direct"].__version__ = "9.9"
    monkeypatch.setitem(sys.modules, "nvfuser_anchor", Anchor())
    peer, reason = load_nvfuser()
    assert reason == "" and peer.version == "9.9"
    assert peer.define(Path("case.py")) == ("fd", ["case.py"])


def test_first_call_reports_errors_and_gives_up_waiting_after_the_budget():
    assert first_call(lambda: 1, 5.0).ok
    failed = first_call(lambda: 1 / 0, 5.0)
    assert not failed.ok and failed.finished and failed.error.startswith("ZeroDivisionError")
    release = threading.Event()
    stuck = first_call(release.wait, 0.05)
    assert not stuck.ok and not stuck.finished and stuck.thread.is_alive()
    release.set()
    stuck.thread.join(5)
    assert not stuck.thread.is_alive()


def test_describe_keeps_the_first_line_short():
    text = describe(ValueError("first line " + "x" * 200 + "\nsecond"))
    assert text.startswith("ValueError: first line") and len(text) == 100
    assert "second" not in text


# ---- command line -------------------------------------------------------------------------------

def test_case_order_puts_the_heaviest_last_and_names_are_checked():
    names = corpus_names()
    assert sorted(names) == sorted(p.stem for p in CORPUS_FILES)
    assert names[-2:] == ["many_pointwise_chain", "many_segments_stress"]
    # issue 18's cases (item 8, and item 3's RoPE backward) are benchmarked against nvFuser
    assert {"group_norm_fwd", "cross_entropy_fwd", "transpose_add", "bias_dropout_add_layernorm",
            "rmsnorm_bwd_2d_weight", "rope_bwd_gqa"} <= set(names)
    assert parse_args(["--cases", "softmax_fwd,adam_step"]).case_list == ["softmax_fwd",
                                                                         "adam_step"]
    with pytest.raises(SystemExit):
        parse_args(["--cases", "softmax_fwd,no_such_case"])
    with pytest.raises(SystemExit):
        parse_args(["--iters", "0"])


def test_help_works_and_a_run_without_a_gpu_says_so():
    env = {**os.environ, "PYTHONPATH": source_pythonpath(),
           "CUDA_VISIBLE_DEVICES": ""}
    shown = subprocess.run([sys.executable, "-m", "benchmarks.e2e", "--help"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    for flag in ("--cases", "--iters", "--no-compile", "--no-nvfuser", "--tiny-only",
                 "--budget-s", "--nvfuser-skip"):
        assert flag in shown.stdout
    refused = subprocess.run([sys.executable, "-m", "benchmarks.e2e", "--cases", "softmax_fwd"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "needs a CUDA GPU" in refused.stderr


def test_thunder_benchmark_help_and_gpu_refusal():
    import subprocess
    import sys

    helped = subprocess.run([sys.executable, "-m", "benchmarks.thunder", "--help"],
                            capture_output=True, text=True)
    assert helped.returncode == 0 and "--width" in helped.stdout
    if not torch.cuda.is_available():
        refused = subprocess.run([sys.executable, "-m", "benchmarks.thunder"],
                                 capture_output=True, text=True)
        assert refused.returncode != 0 and "needs a CUDA GPU" in refused.stderr


def test_thunder_benchmark_reports_the_system_a_crashed_process_stopped_in():
    from benchmarks.thunder import HEADERS, ROW_MARK, child_rows

    systems = ["a", "b", "c"]
    row_a = ["m", "train", "a", "1.00", "-", "0.90", "10", "-", "first step 1.0 s"]
    lines = ["noise\n", ROW_MARK + json.dumps([row_a, "k 0.1 ms x1"]) + "\n"]
    crashed = list(child_rows(lines + ["Traceback\n", "RuntimeError: CUDA error: illegal\n"],
                              lambda: 1, "m", "train", systems))
    assert [r[0] for r in crashed] == [row_a, ["m", "train", "b", "-", "-", "-", "-", "-",
           "not run: the process stopped (RuntimeError: CUDA error: illegal)"]]
    assert all(len(r[0]) == len(HEADERS) for r in crashed)
    clean = list(child_rows(lines, lambda: 0, "m", "train", systems))
    assert [r[0] for r in clean] == [row_a]


def test_torch_compile_skips_the_cases_it_cannot_warm_up(monkeypatch):
    """A case in COMPILE_SKIP gets eager only, and its row says why; another case is compiled."""
    from types import SimpleNamespace

    import torch

    from benchmarks import e2e
    from benchmarks.e2e_report import Row

    compiled: list = []
    monkeypatch.setattr(torch, "compile", lambda fn: compiled.append(fn) or fn)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)  # no GPU here
    monkeypatch.setattr(e2e, "eager_function", lambda name, fusion, args: lambda *a: a)
    clock = e2e.Clock(60)
    skipped, other = next(iter(e2e.COMPILE_SKIP)), "transpose_add"
    for name in (skipped, other):
        case = e2e.Case(name, SimpleNamespace(fusion=None), [torch.zeros(2)], None, None,
                        Row(name))
        systems = [system for system, _ in e2e.warm_torch(case, e2e.Options(), clock)]
        if name == skipped:
            assert systems == ["eager"]
            assert any("torch.compile not run" in note for note in case.row.notes)
        else:
            assert systems == ["torch.compile", "eager"] and not case.row.notes
    assert len(compiled) == 1


def test_epilogues_benchmark_help_and_gpu_refusal():
    import subprocess
    import sys

    helped = subprocess.run([sys.executable, "-m", "benchmarks.epilogues", "--help"],
                            capture_output=True, text=True, cwd=ROOT)
    assert helped.returncode == 0 and "--hidden" in helped.stdout
    if not torch.cuda.is_available():
        refused = subprocess.run([sys.executable, "-m", "benchmarks.epilogues"],
                                 capture_output=True, text=True, cwd=ROOT)
        assert refused.returncode != 0 and "needs a CUDA GPU" in refused.stderr


@pytest.mark.gpu
def test_cublaslt_gelu_epilogues_compute_what_the_unfused_ops_do():
    import torch.nn.functional as F

    from fusecut.thunder.fused_gemm import linear_gelu_tanh, matmul_dgelu_tanh

    torch.manual_seed(0)
    tokens, width, hidden = 256, 128, 512
    bf = dict(device="cuda", dtype=torch.bfloat16)
    x, gy = torch.randn(tokens, width, **bf), torch.randn(tokens, width, **bf)
    w_fc, w_proj = torch.randn(hidden, width, **bf) * 0.1, torch.randn(width, hidden, **bf) * 0.1
    b_fc = torch.randn(hidden, **bf)
    g, h = linear_gelu_tanh(x, w_fc, b_fc)
    gh = matmul_dgelu_tanh(gy, w_proj, h)
    torch.cuda.synchronize()
    h_ref = F.linear(x, w_fc, b_fc)
    torch.testing.assert_close(h, h_ref)
    torch.testing.assert_close(g, F.gelu(h_ref, approximate="tanh"), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(
        gh, torch.ops.aten.gelu_backward(gy @ w_proj, h_ref, approximate="tanh"),
        atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(
        gh, torch.ops.aten.gelu_backward(gy @ w_proj, h_ref, approximate="tanh"),
        atol=2e-2, rtol=2e-2)


def test_benchmarked_blocks_have_the_same_weights_on_every_call():
    # The Thunder tests and benchmarks compare steps of these blocks: their weights must not
    # depend on what drew random numbers before, and drawing them must not move that state.
    from benchmarks.models import blocks

    torch.manual_seed(123)
    first = {name: [p.clone() for p in m.parameters()] for name, m, _ in blocks(32, 8)}
    state = torch.random.get_rng_state()
    torch.randn(100)
    again = blocks(32, 8)
    torch.randn(100)
    assert [name for name, _, _ in again] == list(first)
    for name, module, _ in again:
        assert all(torch.equal(p, q) for p, q in zip(module.parameters(), first[name]))
    name, other, _ = blocks(32, 8, seed=1)[0]
    assert not all(torch.equal(p, q) for p, q in zip(other.parameters(), first[name]))
    torch.manual_seed(123)
    blocks(32, 8)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_ratio_interval_brackets_the_ratio_and_narrows_with_more_steps():
    import random

    from benchmarks.intervals import median_ratio_interval

    rng = random.Random(1)
    # steps of 10 ms and 10.5 ms with 5% noise and a few slow outliers, as on the H100
    def steps(ms, n):
        return [ms * (1 + rng.gauss(0, 0.05)) + (3.0 if rng.random() < 0.05 else 0.0)
                for _ in range(n)]

    few = median_ratio_interval(steps(10.0, 12), steps(10.5, 12))
    many = median_ratio_interval(steps(10.0, 400), steps(10.5, 400))
    for interval in (few, many):
        assert interval.low <= interval.ratio <= interval.high
    assert many.high - many.low < (few.high - few.low) / 2
    assert many.low < 10.0 / 10.5 < many.high  # it covers the true ratio
    assert many.high < 1.0  # and 400 steps each show a 5% gain
    # same samples, same interval; the row prints the ratio and its bounds
    a, b = steps(10.0, 30), steps(10.5, 30)
    assert median_ratio_interval(a, b) == median_ratio_interval(a, b)
    assert str(median_ratio_interval([2.0], [4.0])) == "0.500x (0.500-0.500)"
    with pytest.raises(ValueError, match="samples on both sides"):
        median_ratio_interval([], b)
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        median_ratio_interval(a, b, confidence=1.0)


def test_thunder_rows_compare_with_the_default_unless_it_is_the_default_or_absent():
    from benchmarks.thunder import against_default

    default = [10.0, 10.2, 9.9, 10.1]
    assert against_default(default, default) == "-"
    assert against_default([9.0, 9.1], None) == "-"
    assert against_default([5.0, 5.1, 4.9, 5.05], default).startswith("0.50")


def test_a_second_run_the_same_day_writes_a_file_of_its_own(tmp_path, monkeypatch):
    from benchmarks import common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    run = common.RunResults("models", "NVIDIA H200", "T")
    first = run.write("| a |")
    again = run.write("| a | b |")  # a run's partial tables replace its own file
    second = common.write_result("models", "NVIDIA H200", "T", "| c |")
    third = common.write_result("models", "NVIDIA H200", "T", "| d |")
    assert again == first and first.name.startswith("models-nvidia-h200-")
    assert second.name == first.name.replace(".md", "-2.md")
    assert third.name == first.name.replace(".md", "-3.md")
    assert "| a | b |" in first.read_text() and "| c |" in second.read_text()


def test_the_shapes_benchmark_counts_searches_rebinds_and_compiles(monkeypatch, tmp_path):
    # three row counts of one power-of-two range: one search (at 1024 rows), three rebound
    # plans, one NVRTC compile of the one kernel; from empty caches
    from benchmarks import shapes

    monkeypatch.setenv("FUSECUT_CACHE_DIR", str(tmp_path))
    result = shapes.run_case("softmax_fwd", [(1, 1000), (1, 900), (2, 300)])
    assert (result["searched"], result["rebound"], result["compiles"]) == (1, 3, 1)
    assert result["first_ms"] > result["median_ms"] > 0
