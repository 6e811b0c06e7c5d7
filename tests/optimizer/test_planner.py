"""The planner: byte accounting, forwarding, compact boundaries, sub-definitions, the seed
targets, scale and determinism."""

from __future__ import annotations

import gc
import json
import time
from contextlib import contextmanager

import pytest
import torch
from hypothesis import given, settings

import fusecut
from benchmarks.fusiongen import generate
from fusecut.optimizer.analysis.shapes import bind
from fusecut.optimizer.errors import PlanError
from fusecut.optimizer.ir import parse_text, tensor_meta
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.planner import PlanOptions, make_plan
from fusecut.runtime.executor import execute_plan
from fusecut.runtime.reference import run_reference
from fusecut.runtime.tensors import make_input
from tests.conftest import CORPUS, CORPUS_FILES
from tests.helpers import fusion, small_metas
from tests.strategies import fusions

F32 = DType.float32
FAST = PlanOptions(time_limit_s=2.0)


def plan_json(f, metas, **options):
    return make_plan(f, metas, PlanOptions(**options)).to_json()


def test_plan_json_has_the_keys_other_tools_read():
    p = parse_text((CORPUS / "seed_4269_forward_full.py").read_text())
    j = plan_json(p.fusion, p.inputs)
    assert {"plan_id", "fusion_id", "segmenter", "solver", "device", "segments", "boundaries",
            "totals", "baseline", "host_program"} <= set(j)
    assert {"status", "objective", "bound", "wall_s"} <= set(j["solver"])
    assert {"index", "kind", "ops", "recomputed_ops", "inputs", "outputs", "read_bytes",
            "write_bytes", "est_time_s", "definition_json", "definition_py", "input_map",
            "output_map"} <= set(j["segments"][0])
    assert {"tensor", "shape", "compact_shape", "dtype", "bytes", "producer",
            "consumers"} <= set(j["boundaries"][0])
    assert {"io_bytes", "lower_bound_bytes", "io_ratio", "segments", "est_time_s"} <= \
        set(j["totals"])
    assert {"segmenter", "io_bytes", "segments", "est_time_s"} <= set(j["baseline"])
    json.dumps(j)


def test_bytes_of_a_single_pointwise_segment():
    f = fusion("""
T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T2 = fd.ops.neg(T0)
T3 = fd.ops.broadcast(T2, is_broadcast_dim=[False, True])
T4 = fd.ops.mul(T3, T1)
fd.add_output(T4)""")
    j = plan_json(f, [tensor_meta((16,), F32), tensor_meta((16, 32), F32)])
    assert j["totals"]["segments"] == 1
    assert j["totals"]["io_bytes"] == 16 * 4 + 2 * 16 * 32 * 4 == j["totals"]["lower_bound_bytes"]
    assert j["totals"]["io_ratio"] == 1.0


def test_boundary_tensors_are_stored_compact():
    # compact storage: a broadcast value forced across a boundary is stored without its
    # broadcast axis
    f = fusion("""
T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T2 = fd.ops.neg(T0)
T3 = fd.ops.broadcast(T2, is_broadcast_dim=[False, True])
T4 = fd.ops.expand(T3, shape=[-1, 32])
T5 = fd.ops.segment_set(T4)
T6 = fd.ops.mul(T5, T1)
fd.add_output(T6)""")
    n, m = 16, 32
    j = plan_json(f, [tensor_meta((n,), F32), tensor_meta((n, m), F32)])
    (b,) = j["boundaries"]
    assert b["tensor"] == "T4" and b["shape"] == [n, m] and b["compact_shape"] == [n]
    assert b["bytes"] == n * 4
    assert j["totals"]["io_bytes"] == 3 * n * 4 + 2 * n * m * 4
    second = j["segments"][1]
    assert "broadcast_in_dim" in second["definition_py"]  # re-broadcast by the consumer


def test_forwarding_recomputes_full_on_both_sides_of_segment_set():
    # forwarding: the full() is in both segments; only the segment_set tensor crosses
    p = parse_text((CORPUS / "seed_4269_forward_full.py").read_text())
    j = plan_json(p.fusion, p.inputs)
    full = [i for i, op in enumerate(p.fusion.ops) if op.name == "full"][0]
    assert len(j["segments"]) == 2
    assert all(full in s["ops"] for s in j["segments"])
    assert [b["tensor"] for b in j["boundaries"]] == ["T2"]
    assert [t["tensor"] for t in j["segments"][1]["inputs"]] == ["T2"]
    n = 16777216
    assert j["totals"]["io_bytes"] == 4 * n * 4  # read T0, write T2, read T2, write T4


def test_input_forwarding_of_casts():
    p = parse_text((CORPUS / "layernorm_bwd.py").read_text())
    bound = bind(p.fusion, p.inputs)
    from fusecut.optimizer.profiles import get_profile
    from fusecut.optimizer.segmenters.graph import SegGraph

    g = SegGraph(bound, get_profile())
    forwarded = {p.fusion.ops[i].outputs[0] for i in g.forwarded}
    assert {"T5", "T6", "T7", "T8", "T9", "T12"} <= forwarded  # casts and broadcasts of inputs


@pytest.mark.parametrize("path", CORPUS_FILES, ids=[p.stem for p in CORPUS_FILES])
def test_optimised_plan_never_worse_than_greedy(path):
    p = parse_text(path.read_text())
    j = make_plan(p.fusion, p.inputs, FAST).to_json()
    assert j["totals"]["io_bytes"] <= j["baseline"]["io_bytes"]
    assert j["totals"]["io_ratio"] >= 1.0 - 1e-9
    assert j["solver"]["status"] in ("OPTIMAL", "FEASIBLE")


def test_seed_2146_targets():
    p = parse_text((CORPUS / "seed_2146_rmsnorm_bwd.py").read_text())
    nvfuser_bytes = 1456 * 2**20
    with_io = plan_json(p.fusion, p.inputs)
    assert with_io["totals"]["io_bytes"] <= 0.60e9 < nvfuser_bytes
    no_io = plan_json(p.fusion, p.inputs, kinds=("pointwise", "reduction", "normalization",
                                                  "library", "fallback"))
    assert no_io["totals"]["io_bytes"] <= 0.85e9
    assert "inner_outer" not in {s["kind"] for s in no_io["segments"]}
    assert with_io["totals"]["lower_bound_bytes"] == pytest.approx(337 * 2**20, rel=0.01)


@pytest.mark.parametrize("path", CORPUS_FILES, ids=[p.stem for p in CORPUS_FILES])
def test_segments_run_to_the_same_outputs_and_replan(path):
    parsed = parse_text(path.read_text())
    metas = small_metas(parsed, 1 << 13)  # seed_2146 fixes its sizes: it runs at full size
    plan = make_plan(parsed.fusion, metas, FAST)
    gen = torch.Generator().manual_seed(1)
    args = [make_input(m, generator=gen) for m in metas]
    got = execute_plan(plan, args).outputs
    want = run_reference(parsed.fusion, args)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for seg in plan.to_json()["segments"]:
        sub = parse_text(seg["definition_py"])  # what `fusecut check` accepts
        assert sub.inputs is not None
        replanned = make_plan(sub.fusion, sub.inputs, PlanOptions(segmenter="greedy"))
        assert replanned.io_bytes <= seg["read_bytes"] + seg["write_bytes"]


@settings(max_examples=25, deadline=None)
@given(fusions(max_ops=8))
def test_random_plans_run_to_the_reference_outputs(drawn):
    plan = make_plan(drawn.fusion, drawn.inputs, PlanOptions(time_limit_s=1.0))
    assert plan.io_bytes <= plan.baseline.io_bytes
    args = [make_input(m) for m in drawn.inputs]
    got = execute_plan(plan, args).outputs
    want = run_reference(drawn.fusion, args)
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_stress_corpus_plans_fast():
    p = parse_text((CORPUS / "many_segments_stress.py").read_text())
    start = time.process_time()  # CPU time: the planner's cost, not a loaded machine's queue
    j = plan_json(p.fusion, p.inputs)
    assert time.process_time() - start < 2.0
    assert j["totals"]["io_ratio"] == 1.0


@pytest.mark.slow
def test_generated_1500_ops_plan_within_15_s_and_beat_greedy():
    p = parse_text(generate(1500, seed=1))
    assert len(p.fusion.ops) >= 1500
    start = time.perf_counter()
    j = plan_json(p.fusion, p.inputs, time_limit_s=10.0)
    assert time.perf_counter() - start < 15.0
    assert j["totals"]["io_bytes"] <= j["baseline"]["io_bytes"]


def test_same_input_same_plan():
    # a limit the wall clock does not reach (each solve ends at its optimum), so that a loaded
    # machine cannot cut one of the two searches short
    p = parse_text(generate(200, seed=2))
    first = plan_json(p.fusion, p.inputs, time_limit_s=30.0)
    second = plan_json(p.fusion, p.inputs, time_limit_s=30.0)
    assert "time limit reached" not in first["solver"]["message"]
    for j in (first, second):
        j["solver"].pop("wall_s")
    assert first == second


@contextmanager
def _cpu_hog():
    """A thread busy-looping in Python for as long as the block runs: it takes its share of the
    interpreter and of a core (about half the planner's speed)."""
    import threading

    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    hog = threading.Thread(target=spin, daemon=True)
    hog.start()
    try:
        yield
    finally:
        stop.set()
        hog.join()


@pytest.mark.slow
def test_same_plan_under_a_cpu_hog(monkeypatch):
    # before: each window's solve ran until a wall-clock share of the limit, and the windows
    # until the deadline, so a busy machine searched less and planned differently. Now each
    # solve ends on CP-SAT's deterministic time (one worker), and the search when its effort,
    # counted in deterministic time, is spent: about 0.3 of the limit on an idle machine, so
    # one twice as slow still plans the same; the wall clock is only a backstop. Here the
    # effort is half that share: a CI machine 1.6x slower than usual, with the hog, reached
    # the backstop at 0.3 (quiet 3.9 s, busy 8.2 s of 10 on it when idle); what is tested,
    # the same plan from the same effort under load, is the same at any share.
    from benchmarks.fusiongen import scale_case
    from fusecut.optimizer.segmenters import cpsat

    monkeypatch.setattr(cpsat, "SEARCH_SHARE", cpsat.SEARCH_SHARE / 2)

    p = parse_text(scale_case())
    quiet = plan_json(p.fusion, p.inputs, time_limit_s=10.0)
    with _cpu_hog():
        busy = plan_json(p.fusion, p.inputs, time_limit_s=10.0)
    assert "search effort spent" in quiet["solver"]["message"]
    for j in (quiet, busy):
        assert "time limit reached" not in j["solver"]["message"]
        j["solver"].pop("wall_s")
    assert quiet == busy
    assert quiet["totals"]["io_bytes"] < 0.8 * quiet["baseline"]["io_bytes"]


def test_mincut_refines_greedy():
    p = parse_text((CORPUS / "seed_2146_rmsnorm_bwd.py").read_text())
    j = plan_json(p.fusion, p.inputs, segmenter="mincut")
    assert j["totals"]["io_bytes"] < j["baseline"]["io_bytes"]


def test_bad_options_are_plan_errors():
    p = parse_text((CORPUS / "softmax_fwd.py").read_text())
    with pytest.raises(PlanError, match="segmenter must be one of .* got 'magic'"):
        PlanOptions(segmenter="magic")
    with pytest.raises(PlanError, match="device must be one of H100, H200 or A100"):
        make_plan(p.fusion, p.inputs, PlanOptions(device="TPU"))
    with pytest.raises(PlanError, match="device_overrides must be .*unknown: warp_speed"):
        make_plan(p.fusion, p.inputs, PlanOptions(device_overrides={"warp_speed": 9}))
    tiny = make_plan(p.fusion, p.inputs, PlanOptions(device_overrides={"persistent_budget": 1024}))
    assert "normalization" not in {s.kind.value for s in tiny.segments}


def test_restore_plan_rebuilds_the_same_plan_and_refuses_foreign_ones(corpus_file):
    from fusecut.optimizer.plan.restore import restore_plan

    parsed = fusecut.load(corpus_file)
    if parsed.inputs is None:
        pytest.skip("no inputs list")
    plan = make_plan(parsed.fusion, parsed.inputs, PlanOptions(time_limit_s=2))
    data = json.loads(json.dumps(plan.to_json()))
    assert restore_plan(parsed.fusion, parsed.inputs, data).to_json() == plan.to_json()
    other = fusecut.load(CORPUS / "softmax_fwd.py")
    if corpus_file.name != "softmax_fwd.py":
        with pytest.raises(PlanError, match="made for fusion"):
            restore_plan(other.fusion, other.inputs, data)
    if data["boundaries"]:  # segments in reverse order: a consumer before its producer
        broken = json.loads(json.dumps(data))
        broken["segments"].reverse()
        with pytest.raises(PlanError):
            restore_plan(parsed.fusion, parsed.inputs, broken)


def _neg_chain(n: int) -> str:
    lines = [f"    T{i} = fd.ops.neg(T{i - 1})" for i in range(1, n + 1)]
    return ("from nvfuser import FusionDefinition, DataType\ndef f(fd):\n"
            "    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], "
            "dtype=DataType.Float)\n" + "\n".join(lines) + f"\n    fd.add_output(T{n})\n")


@pytest.mark.slow
@pytest.mark.parametrize("segmenter", ["cpsat", "mincut"])
def test_a_20000_op_chain_plans_in_under_5_s_of_cpu(segmenter):
    # forwarding walked the chain from its start for every link: 70 s for 19,000 ops
    import fusecut.optimizer.segmenters.cpsat  # noqa: F401  (its import is not planning)

    p = parse_text(_neg_chain(20000))
    gc.collect()  # the suite's heap: its collection is not this plan's CPU
    start = time.process_time()
    plan = make_plan(p.fusion, [tensor_meta((64, 64), F32)],
                     PlanOptions(segmenter=segmenter, time_limit_s=5.0))
    assert time.process_time() - start < 5.0
    assert len(plan.segments) == 1 and len(plan.segments[0].schedule.ops) == 20000


@pytest.mark.slow
@pytest.mark.parametrize("segmenter", ["greedy", "mincut"])
def test_the_time_limit_covers_every_planning_stage(segmenter):
    # the greedy segmenter alone takes ~1 s of CPU on this fusion (it took ~9 s on 3,000 ops when
    # it classified every merged group from scratch); binding it, building the plan and the
    # solver share one deadline. CPU time, since the deadline is a wall-clock one and a loaded
    # machine only makes the CPU share smaller.
    p = parse_text(generate(8000, seed=3))
    gc.collect()
    start = time.process_time()
    plan = make_plan(p.fusion, p.inputs, PlanOptions(segmenter=segmenter, time_limit_s=1.0))
    assert time.process_time() - start < 1.0 + 1.0
    assert "time limit reached" in plan.solver.message
    assert {t for s in plan.segments for t in s.schedule.outputs} >= set(p.fusion.outputs)


def test_the_level_grouping_is_a_valid_plan_that_runs_to_the_same_outputs():
    # what a greedy segmenter cut short by the time limit falls back to
    from fusecut.optimizer.analysis.opclass import Role
    from fusecut.optimizer.kinds.rules import Kind
    from fusecut.optimizer.profiles import get_profile
    from fusecut.optimizer.segmenters.graph import SegGraph
    from fusecut.optimizer.segmenters.levels import level_groups

    parsed = parse_text(generate(200, seed=5, rows=16, cols=32))  # finite values
    graph = SegGraph(bind(parsed.fusion, parsed.inputs), get_profile("H100", {}), frozenset(Kind))
    groups = level_groups(graph)
    placed = sorted(i for g in groups for i in g)
    assert placed == sorted(graph.placed)  # every placed op once
    anchors = sum(graph.roles[i] is not Role.FUSIBLE for i in graph.placed)
    assert len(groups) <= 2 * anchors + 1 < len(graph.placed) / 4  # a group per level
    # 1 ms: the greedy segmenter is cut short at once and the level grouping stands
    plan = make_plan(parsed.fusion, parsed.inputs, PlanOptions(segmenter="greedy",
                                                              time_limit_s=0.001))
    assert "grouping by dependency level" in plan.solver.message
    assert [s.schedule.ops for s in plan.segments] == [
        tuple(sorted(graph.closure(g))) for g in groups]
    args = [make_input(m, generator=torch.Generator().manual_seed(2)) for m in parsed.inputs]
    for a, b in zip(execute_plan(plan, args).outputs, run_reference(parsed.fusion, args),
                    strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("segmenter", ["cpsat", "greedy", "mincut"])
def test_a_20000_op_fusion_plans_and_serializes_within_its_limit_plus_3_s(segmenter):
    # before: the stages after the greedy segmenter's deadline built and serialized one segment
    # per op (12,500): 3.1 s of planning and 3.0 s of to_json for a 2 s limit. The stages after
    # the deadline take 1.0-1.8 s of CPU on the 2-core CI machine, up to 2.04 s late in a full
    # run; the regression this guards spent 6.1 s in all.
    from fusecut.optimizer.plan.restore import restore_plan

    parsed = parse_text(generate(19_990, seed=3))
    start = time.process_time()  # CPU time: the deadline is wall-clock; a loaded machine
    plan = make_plan(parsed.fusion, parsed.inputs,  # only lowers the CPU share
                     PlanOptions(segmenter=segmenter, time_limit_s=2.0))
    data = plan.to_json()
    elapsed = time.process_time() - start
    assert elapsed < 2.0 + 3.0, elapsed
    assert "time limit reached" in data["solver"]["message"]
    assert data["totals"]["segments"] < 2000
    restore_plan(parsed.fusion, parsed.inputs, data)  # every segment classifies, in order


def _greedy_plan(text: str):
    from fusecut.optimizer.kinds.rules import Kind
    from fusecut.optimizer.profiles import get_profile
    from fusecut.optimizer.segmenters.graph import SegGraph
    from fusecut.optimizer.segmenters.greedy import greedy_groups

    parsed = parse_text(text)
    graph = SegGraph(bind(parsed.fusion, parsed.inputs), get_profile("H100", {}), frozenset(Kind))
    groups = greedy_groups(graph)
    return graph, list(zip(groups, graph.derive_writes(groups)))


def test_mincut_refines_the_scale_case_in_linear_time_and_keeps_to_its_deadline():
    # before: each segment gathered what every segment before and after it computes and reads,
    # and dropping idle ops scanned every later segment per op: 8.5 s of CPU for these 50
    # segments whatever the deadline (which was checked only between segments)
    from benchmarks.fusiongen import scale_case
    from fusecut.optimizer.segmenters.mincut import refine
    from fusecut.optimizer.segmenters.result import SolverOptions

    graph, plan = _greedy_plan(scale_case())
    start = time.process_time()
    refined, report = refine(graph, plan, SolverOptions(time_limit_s=600))
    assert time.process_time() - start < 1.0
    assert "min-cut refined" in report.message and "time limit" not in report.message
    from fusecut.optimizer.segmenters.result import plan_cost

    assert plan_cost(graph, refined) < plan_cost(graph, plan)
    start = time.process_time()
    late, report = refine(graph, plan, SolverOptions(), deadline=time.perf_counter())
    assert time.process_time() - start < 0.3
    assert "time limit reached" in report.message
    assert plan_cost(graph, late) <= plan_cost(graph, plan)


@pytest.mark.slow
def test_mincut_refines_410_segments_of_20000_ops_in_seconds():
    # before: each segment's network took every fusible ancestor of what it read, back to the
    # fusion's inputs (the generated chains never break): 21 s of CPU for these 410 segments
    from fusecut.optimizer.segmenters.mincut import refine
    from fusecut.optimizer.segmenters.result import SolverOptions

    graph, plan = _greedy_plan(generate(19_990, seed=3))
    assert len(plan) > 400
    # 1.1-3.9 s of CPU alone (the first call in a process is the slowest); a full CI run read
    # 6.04 s late in the suite, its heap large: the bound is half the regression's 21 s
    gc.collect()
    start = time.process_time()
    refined, report = refine(graph, plan, SolverOptions(time_limit_s=600))
    assert time.process_time() - start < 10.0
    assert "time limit" not in report.message
    assert len(refined) <= len(plan)


def test_the_solvers_take_typed_options_from_the_plan_options():
    from fusecut.optimizer.segmenters.result import SolverOptions

    options = PlanOptions(time_limit_s=3, launch_weight=2, compute_weight=0.5, seed=7)
    assert options.solver == SolverOptions(time_limit_s=3, launch_weight=2, compute_weight=0.5,
                                           seed=7)


def test_a_device_profile_has_only_the_fields_the_planner_uses():
    from fusecut.optimizer.profiles import get_profile

    with pytest.raises(PlanError, match="unknown device profile fields.*regs_per_block"):
        get_profile("H100", {"regs_per_block": 65536})  # never read by the planner: removed


@pytest.mark.parametrize("case", ["cross_entropy_bwd_hf", "cross_entropy_bwd_hf_onehot"])
def test_a_long_row_loss_backward_reads_its_logits_twice_at_the_default_limit(case):
    # Hugging Face's cross-entropy backward at a 50304-class vocabulary: one pass for the row
    # statistics, one for the gradient (147 MiB). The search used to stop at 344 MiB (the
    # shifted logits passed as float32) with a fifth of its time spent, and, with the one-hot
    # as a full tensor, at 442 MiB: written by the second of five segments and read by the
    # last two, it was in no window of 4 whole
    p = parse_text((CORPUS / f"{case}.py").read_text())
    j = plan_json(p.fusion, p.inputs)
    floor = j["totals"]["lower_bound_bytes"]
    assert floor == pytest.approx(98.3 * 2**20, rel=0.01)
    assert j["totals"]["io_bytes"] <= 1.55 * floor
    assert j["solver"]["wall_s"] < 2.0
