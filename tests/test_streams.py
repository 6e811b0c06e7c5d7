"""Stream lowering: host program text, slices equal to the unsplit run, errors for
annotations that cannot be honoured, and (marked gpu) iterations on real CUDA streams."""

from __future__ import annotations

import copy

import pytest
import torch

from optimizer.errors import DefinitionError, PlanError
from optimizer.ir import parse_text
from optimizer.ir.inputs import tensor_meta
from optimizer.planner import PlanOptions, make_plan
from runtime.run import run_plan
from tests.conftest import CORPUS

HEADER = "from nvfuser import FusionDefinition, DataType, ParallelType\ndef f(fd):\n"


def definition(body: str):
    return parse_text(HEADER + "".join(f"    {line}\n" for line in body.strip().splitlines()))


# nvFuser's ThreeSetOpsWithDisjointsForLoops: the middle op is not stream-parallel
THREE_SET_OPS = """
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.ops.set(T0)
T2 = fd.ops.set(T1)
T3 = fd.ops.set(T2)
fd.add_output(T3)
fd.sched.parallelize(T1, 0, ParallelType.stream)
fd.sched.parallelize(T3, 0, ParallelType.stream)
"""

# a library segment per slice, then pointwise and a row reduction: where streams overlap
LINEAR_RELU_SUM = """
X = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float)
W = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
Y = fd.ops.linear(X, W)
Z = fd.ops.relu(Y)
S = fd.ops.sum(Z, dims=[2], keepdim=False)
fd.add_output(Z)
fd.add_output(S)
fd.sched.parallelize(Y, 0, ParallelType.stream)
fd.sched.parallelize(Z, 0, ParallelType.stream)
fd.sched.parallelize(S, 0, ParallelType.stream)
"""


def corpus(name: str):
    return parse_text((CORPUS / f"{name}.py").read_text())


# (case, parsed definition, small CPU shapes, loops the host program must have)
CASES = {
    "seed_4147_stream_set": (lambda: corpus("seed_4147_stream_set"), [(8, 64)], 1),
    "seed_4147_stream_two_ops": (lambda: corpus("seed_4147_stream_two_ops"), [(6, 96)], 1),
    "three_set_ops": (lambda: definition(THREE_SET_OPS), [(5, 40)], 2),
    "linear_relu_sum": (lambda: definition(LINEAR_RELU_SUM), [(4, 8, 16), (12, 16)], 1),
}


def plan_for(parsed, shapes, **options):
    fusion = parsed.fusion
    metas = [tensor_meta(s, fusion.tensors[n].dtype) for n, s in zip(fusion.inputs, shapes)]
    return make_plan(fusion, metas, PlanOptions(**options))


def unsplit(parsed):
    """The same definition without its stream annotations."""
    fusion = copy.deepcopy(parsed.fusion)
    fusion.stream_axes = []
    return fusion


@pytest.mark.parametrize("case", sorted(CASES))
def test_host_program_text_has_the_expected_loops(case):
    make, shapes, loops = CASES[case]
    plan = plan_for(make(), shapes, segmenter="greedy")
    text = plan.host_program
    lines = text.splitlines()
    assert lines[0].startswith("%HostIrContainer { (") and lines[-1] == "} // %HostIrContainer"
    assert sum(1 for line in lines if line.startswith("  FOR StreamIdx in iStreamIdx")) == loops
    assert plan.host.loops == loops
    for stmt in ("GetCurrentStream into Stream", "SetCurrentStream to Stream ( StreamIdx % "
                 "numberOfStreams )", "Synchronize Stream ( StreamIdx % numberOfStreams )"):
        assert text.count(stmt) == loops, stmt
    allocated = [t for step in plan.host.steps for t in step.allocations]
    assert text.count("= ALLOCATE(buffer=") == len(allocated) > 0
    assert "HirAliasSelect(" in text and "index = StreamIdx" in text
    # every segment is launched once, inside a loop exactly when its ops are stream-parallel
    assert sorted(int(s.split("segment ")[1].split(",")[0]) for s in lines
                  if "LaunchKernel( segment " in s) == list(range(len(plan.segments)))
    assert plan.to_json()["host_program"] == text


def test_three_set_ops_run_the_middle_op_between_the_loops():
    plan = plan_for(definition(THREE_SET_OPS), [(5, 40)], segmenter="cpsat", time_limit_s=5)
    lines = plan.host_program.splitlines()
    loops = [k for k, line in enumerate(lines) if line.startswith("  FOR StreamIdx")]
    middle = next(k for k, line in enumerate(lines) if "T2 = set(T1)" in line)
    assert loops[0] < middle < loops[1]
    assert lines[middle].startswith("     = LaunchKernel(")  # top level: not in a loop body
    # the planner kept the boundaries the loops need: three segments, none mixing stages
    assert [s.schedule.ops for s in plan.segments] == [(0,), (1,), (2,)]
    # T1 leaves its loop (the middle op reads it whole), so the loop allocates it
    assert [step.allocations for step in plan.host.steps if step.is_loop] == [["T1"], ["T3"]]


def test_consecutive_stream_ops_share_one_loop_and_one_segment():
    plan = plan_for(corpus("seed_4147_stream_two_ops"), [(6, 96)], time_limit_s=5)
    (step,) = plan.host.steps
    assert step.is_loop and step.stage.extent == 6 and step.segments == [0]
    assert plan.segments[0].kind.value == "reduction"


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("num_streams", [1, 3])
def test_cpu_outputs_equal_the_unsplit_run(case, num_streams):
    make, shapes, _ = CASES[case]
    parsed = make()
    torch.manual_seed(0)
    args = [torch.randn(s) for s in shapes]
    plan = plan_for(parsed, shapes, num_streams=num_streams, segmenter="greedy")
    flat = make_plan(unsplit(parsed), [plan.bound.inputs[n] for n in parsed.fusion.inputs])
    assert flat.host is None
    got = run_plan(plan, args).outputs
    want = run_plan(flat, args).outputs
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and torch.equal(g, w)
    assert all(a.data_ptr() != g.data_ptr() for a in args for g in got)


def test_the_sdk_runs_stream_annotated_definitions():
    import fusecut

    fd = fusecut.FusionDefinition.from_fusion(definition(LINEAR_RELU_SUM).fusion)
    x, w = torch.randn(3, 5, 6), torch.randn(7, 6)
    z, s = fd.execute([x, w])
    assert torch.allclose(z, torch.relu(x @ w.T)) and torch.allclose(s, z.sum(2))
    assert "FOR StreamIdx" in fd.plan([x, w]).json["host_program"]


def test_the_host_program_is_deterministic():
    parsed = definition(THREE_SET_OPS)
    texts = {plan_for(parsed, [(5, 40)], time_limit_s=5).host_program for _ in range(3)}
    assert len(texts) == 1


def test_num_streams_is_an_option():
    with pytest.raises(PlanError, match="num_streams must be an integer in \\[1, 64\\], got 0"):
        PlanOptions(num_streams=0)
    plan = plan_for(definition(THREE_SET_OPS), [(5, 40)], num_streams=2)
    assert plan.host.num_streams == 2 and plan.options["num_streams"] == 2


# ---- annotations that cannot be honoured -------------------------------------------------------

INVALID = {
    "reduced axis": ("""
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.ops.sum(T0, dims=[0], keepdim=True)
fd.add_output(T1)
fd.sched.parallelize(T1, 0, ParallelType.stream)
""", [(4, 8)], "axis 0 of T1 cannot be stream-parallel: sum reduces it (T1 = sum(T0))"),
    "a gather along the axis": ("""
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int)
T2 = fd.ops.index_select(T0, T1, dim=0)
fd.add_output(T2)
fd.sched.parallelize(T2, 0, ParallelType.stream)
""", [(4, 8), (3,)], "axis 0 of T2 cannot be stream-parallel: index_select reads across it"),
    "reshaped axis": ("""
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.ops.reshape(T0, new_shape=[8, 4])
fd.add_output(T1)
fd.sched.parallelize(T1, 0, ParallelType.stream)
""", [(4, 8)], "axis 0 of T1 cannot be stream-parallel: reshape splits or merges it "
               "(T1 = reshape(T0))"),
    "cat along the axis": ("""
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.ops.cat([T0, T0], dim=0)
fd.add_output(T1)
fd.sched.parallelize(T1, 0, ParallelType.stream)
""", [(4, 8)], "axis 0 of T1 cannot be stream-parallel: cat joins along it"),
    "sliced axis": ("""
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.ops.slice(T0, start_indices=[1, 0], end_indices=[3, 8])
fd.add_output(T1)
fd.sched.parallelize(T1, 0, ParallelType.stream)
""", [(4, 8)], "slice resizes it"),
    "axis made by a broadcast": ("""
T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
T1 = fd.ops.broadcast_in_dim(T0, shape=[4, 8], broadcast_dims=[1])
fd.add_output(T1)
fd.sched.parallelize(T1, 0, ParallelType.stream)
""", [(8,)], "axis 0 of T1 cannot be stream-parallel"),
    "a factory": ("""
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
S0 = fd.define_scalar(0.0, dtype=DataType.Float)
T1 = fd.ops.full(shape=[4, 8], fill_value=S0, dtype=DataType.Float)
T2 = fd.ops.add(T0, T1)
fd.add_output(T2)
fd.sched.parallelize(T1, 0, ParallelType.stream)
""", [(4, 8)], "full creates it, with no operand to slice"),
    "a fusion input": ("""
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.ops.neg(T0)
fd.add_output(T1)
fd.sched.parallelize(T0, 0, ParallelType.stream)
""", [(4, 8)], "axis 0 of T0 cannot be stream-parallel: T0 is a fusion input"),
    "split two ways": ("""
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.ops.permute(T0, dims=[1, 0])
T2 = fd.ops.add(T0, T1)
fd.add_output(T2)
fd.sched.parallelize(T1, 0, ParallelType.stream)
fd.sched.parallelize(T2, 0, ParallelType.stream)
""", [(8, 8)], "T0 would be split two ways in one stream loop: along axis 1 and along axis 0"),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_annotations_are_refused_before_anything_runs(case, monkeypatch):
    import fusecut
    import runtime.executor

    body, shapes, message = INVALID[case]
    parsed = definition(body)
    with pytest.raises(PlanError) as error:
        plan_for(parsed, shapes)
    assert message in str(error.value)
    ran = []
    monkeypatch.setattr(runtime.executor, "run_reference", lambda *a: ran.append(a))
    fd = fusecut.FusionDefinition.from_fusion(parsed.fusion)
    args = [torch.randn(s) if parsed.fusion.tensors[n].dtype.is_float else torch.zeros(
        s, dtype=torch.int64) for n, s in zip(parsed.fusion.inputs, shapes)]
    with pytest.raises(PlanError, match="cannot be stream-parallel|split two ways"):
        fd.execute(args)
    assert ran == []


def test_an_axis_out_of_range_is_a_definition_error():
    with pytest.raises(DefinitionError, match="axis 2 out of range for T1"):
        definition("""
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.ops.neg(T0)
fd.add_output(T1)
fd.sched.parallelize(T1, 2, ParallelType.stream)
""")


def test_the_service_returns_the_host_program(http):
    text = (CORPUS / "seed_4147_stream_two_ops.py").read_text()
    response = http.post("/v1/plan", json={"definition": text,
                                           "options": {"time_limit_s": 5, "num_streams": 2}})
    assert response.status_code == 200, response.text
    plan = response.json()
    assert plan["host_program"].count("FOR StreamIdx in") == 1
    assert plan["options"]["num_streams"] == 2
    bad = http.post("/v1/plan", json={"definition": text, "options": {"num_streams": 0}})
    assert bad.status_code == 422 and "num_streams" in bad.text


# ---- on the GPU ---------------------------------------------------------------------------------

GPU_SHAPES = {"seed_4147_stream_set": [(8, 4194304)], "seed_4147_stream_two_ops": [(16, 2097152)],
              "three_set_ops": [(8, 1 << 20)], "linear_relu_sum": [(8, 256, 1024), (1024, 1024)]}


def gpu_inputs(shapes, exact: bool):
    """Small integers where sums must be exact whatever their order (the slices' reduction
    kernels are configured for one row, the unsplit one for all), random normals otherwise."""
    torch.manual_seed(0)
    if exact:
        return [torch.randint(-4, 5, s, device="cuda").float() for s in shapes]
    return [torch.randn(s, device="cuda") for s in shapes]


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(CASES))
def test_gpu_outputs_equal_the_unsplit_run(case):
    make, _, _ = CASES[case]
    parsed = make()
    shapes = GPU_SHAPES[case]
    plan = plan_for(parsed, shapes)
    flat = make_plan(unsplit(parsed), [plan.bound.inputs[n] for n in parsed.fusion.inputs])
    for exact in (True, False):
        args = gpu_inputs(shapes, exact)
        got = run_plan(plan, args).outputs
        want = run_plan(flat, args).outputs
        torch.cuda.synchronize()
        for g, w in zip(got, want, strict=True):
            if exact or case in ("seed_4147_stream_set", "three_set_ops"):
                assert torch.equal(g, w), case
            else:  # sums and matmuls of random data, in another order per slice
                assert torch.allclose(g, w, rtol=1e-4, atol=1e-2), case


@pytest.mark.gpu
def test_gpu_iterations_run_on_the_pools_streams(monkeypatch):
    """Every segment program of a loop iteration runs on its stream (the stream handle each
    program reads, in C++ or Python, to launch on)."""
    import runtime.program
    from runtime.streams import stream_pool

    parsed = corpus("seed_4147_stream_set")
    args = [torch.randn(8, 1 << 16, device="cuda")]
    plan = plan_for(parsed, [(8, 1 << 16)], num_streams=4)
    run_plan(plan, args)  # compile first
    used = []
    real = runtime.program.current_stream
    monkeypatch.setattr(runtime.program, "current_stream",
                        lambda index: used.append(real(index)) or used[-1])
    caller = torch.cuda.current_stream().cuda_stream
    (out,) = run_plan(plan, args).outputs
    torch.cuda.synchronize()
    pool = [s.cuda_stream for s in stream_pool(args[0].device, 4)]
    assert used == [pool[i % 4] for i in range(8)]  # iteration i on stream i % 4
    assert caller not in used and len(set(used)) == 4
    assert torch.cuda.current_stream().cuda_stream == caller  # the caller's stream is back
    assert torch.equal(out, args[0])
