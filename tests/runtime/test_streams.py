"""Stream lowering: host program text, slices equal to the unsplit run, errors for
annotations that cannot be honoured, and (marked gpu) iterations on real CUDA streams."""

from __future__ import annotations

import copy

import pytest
import torch

from fusecut.optimizer.errors import DefinitionError, PlanError
from fusecut.optimizer.ir import parse_text
from fusecut.optimizer.ir.inputs import tensor_meta
from fusecut.optimizer.planner import PlanOptions, make_plan
from fusecut.runtime.run import run_plan
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
    import fusecut.runtime.executor

    body, shapes, message = INVALID[case]
    parsed = definition(body)
    with pytest.raises(PlanError) as error:
        plan_for(parsed, shapes)
    assert message in str(error.value)
    ran = []
    monkeypatch.setattr(fusecut.runtime.executor, "run_reference", lambda *a: ran.append(a))
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
    import fusecut.runtime.program
    from fusecut.runtime.stream_pool import stream_pool

    parsed = corpus("seed_4147_stream_set")
    args = [torch.randn(8, 1 << 16, device="cuda")]
    plan = plan_for(parsed, [(8, 1 << 16)], num_streams=4)
    run_plan(plan, args)  # compile first
    used = []
    real = fusecut.runtime.program.current_stream
    monkeypatch.setattr(fusecut.runtime.program, "current_stream",
                        lambda index: used.append(real(index)) or used[-1])
    caller = torch.cuda.current_stream().cuda_stream
    (out,) = run_plan(plan, args).outputs
    torch.cuda.synchronize()
    pool = [s.cuda_stream for s in stream_pool(args[0].device, 4)]
    assert used == [pool[i % 4] for i in range(8)]  # iteration i on stream i % 4
    assert caller not in used and len(set(used)) == 4
    assert torch.cuda.current_stream().cuda_stream == caller  # the caller's stream is back
    assert torch.equal(out, args[0])


# ---- the stream loop in the C++ launcher (issue 18, item 7) -----------------------------------


class _Trace:
    """Stand-ins for the driver's streams and events, recording what each path asks of them in
    one vocabulary: ("record", event, stream), ("wait", stream, event), ("launch", ...)."""

    CALLER, ENTRY = 7, 11

    def __init__(self):
        self.ops: list[tuple] = []

    def stream(self, handle: int):
        trace = self

        class Stream:
            stream_id, device_index, device_type, cuda_stream = handle, -1, 0, handle

            def record_event(self):
                event = trace.event(_Trace.ENTRY)
                event.record(self)
                return event

            def wait_event(self, event):
                trace.ops.append(("wait", handle, event.cuda_event))

        return Stream()

    def event(self, handle: int):
        trace = self

        class Event:
            cuda_event = handle

            def record(self, stream):
                trace.ops.append(("record", handle, stream.cuda_stream))

            def wait(self, stream):
                trace.ops.append(("wait", stream.cuda_stream, handle))

        return Event()


def _raw(value, ctype) -> int:
    import ctypes
    import struct

    if ctype is ctypes.c_double:
        return struct.unpack("<Q", struct.pack("<d", value))[0]
    return int(value) & ((1 << 64) - 1)


def _name_pointers(ops, regions):
    """Launch parameters that point into an argument or an output as (which, byte offset); other
    buffers by order of first appearance in their iteration (the two paths allocate them at
    other addresses, and free them at other times)."""
    import ctypes

    others: dict[int, str] = {}
    out = []
    for op in ops:
        if op[0] != "launch":
            if op[0] == "wait" and op[2] == _Trace.ENTRY:  # an iteration starts
                others = {}
            out.append(op)
            continue
        _, function, values, types = op
        named = []
        for v, t in zip(values, types):
            if t is not ctypes.c_void_p:
                named.append(v)
                continue
            hit = next(((name, v - base) for name, base, size in regions
                        if base <= v < base + max(size, 1)), None)
            named.append(hit or others.setdefault(v, f"buffer{len(others)}"))
        out.append(("launch", function, tuple(named)))
    return out


@pytest.mark.parametrize("case", ["seed_4147_stream_two_ops", "three_set_ops",
                                  "seed_4147_stream_set", "linear_relu_sum"])
def test_the_cpp_loop_does_what_the_python_loop_does(case, monkeypatch):
    """Both loops, run here with stand-ins for kernels, streams and events: the same launches
    with the same parameters (slices of the same arguments and outputs), on stream i % 3 in
    iteration i, between the same event records and stream waits; outputs of the same layout."""
    import ctypes
    import itertools

    from fusecut.runtime import kernels, launcher, native_host, streams
    from fusecut.runtime import program as programs

    module = launcher.build()
    make, shapes, _ = CASES[case]
    plan = plan_for(make(), shapes, num_streams=3)
    args = [torch.randn(s) for s in shapes]
    handles = itertools.count(0x1000, 0x10)
    monkeypatch.setattr(kernels, "_functions", lambda k: [next(handles) for _ in k.kernels])
    types: dict[int, tuple] = {}
    python, native = _Trace(), _Trace()

    def python_launch(launch, values, stream):
        types[launch.address] = launch.ctypes
        python.ops.append(("launch", launch.address,
                           [_raw(v, t) for v, t in zip(values, launch.ctypes)], launch.ctypes))

    monkeypatch.setattr(programs, "launch_kernel", python_launch)
    pool = [(python.stream(100 + k), python.event(200 + k)) for k in range(3)]
    for user in (streams, native_host):  # the pool both loops take their streams from
        monkeypatch.setattr(user, "events_pool", lambda device, count: pool[:count])
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: python.stream(7))
    monkeypatch.setattr(torch._C, "_cuda_setStream", lambda *a: None, raising=False)
    used: dict = {}
    want = streams.run_host(plan, list(args), used, gpu=True).outputs

    def native_launch(fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        t = types[fn]
        raw = [ctypes.cast(params[k], ctypes.POINTER(ctypes.c_uint64))[0] for k in range(len(t))]
        masks = [(1 << (8 * ctypes.sizeof(x))) - 1 for x in t]
        native.ops.append(("launch", fn, [r & m for r, m in zip(raw, masks)], t, stream))
        return 0

    record = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(
        lambda event, stream: native.ops.append(("record", event, stream or 0)) or 0)
    wait = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint)(
        lambda stream, event, flags: native.ops.append(("wait", stream or 0, event)) or 0)
    from tests.runtime.test_program import LAUNCH

    launch = LAUNCH(native_launch)
    launch_address = ctypes.cast(launch, ctypes.c_void_p).value
    description = native_host.describe(
        plan, args, used,
        lambda p: programs.native_capsule(module, p, (launch_address, 0, 0, 0), 0))
    assert not isinstance(description, str), description
    forms = [call[4] for extent, _, calls in description.steps if extent for call in calls]
    # kernel-only loop programs run on addresses (no slices made); a library call takes tensors
    assert forms == [case != "linear_relu_sum" or k > 0 for k in range(len(forms))], forms
    capsule = native_host.host_capsule(
        module, description, tuple(ctypes.cast(f, ctypes.c_void_p).value for f in (record, wait)),
        torch.device("cpu"), [(100 + k, 100 + k, -1, 0, 200 + k) for k in range(3)],
        _Trace.ENTRY)
    got = module.run_host(capsule, args, _Trace.CALLER)
    assert got is not None and len(got) == len(want)
    for g, w in zip(got, want):
        assert (g.shape, g.stride(), g.dtype) == (w.shape, w.stride(), w.dtype)
    # every launch of iteration i on stream 100 + i % 3 (the Python path's CPU programs launch
    # on stream 0: the stream is checked on the C++ side only)
    loop_streams = [op[4] for op in native.ops if op[0] == "launch"]
    assert set(loop_streams) <= {_Trace.CALLER, 100, 101, 102}
    stream_now = _Trace.CALLER
    for op in native.ops:
        if op[0] == "wait" and op[2] == _Trace.ENTRY:
            stream_now = op[1]
        elif op[0] == "wait":
            stream_now = _Trace.CALLER
        elif op[0] == "launch":
            assert op[4] == stream_now
    native.ops = [op[:4] if op[0] == "launch" else op for op in native.ops]

    def regions(outputs):
        return [(f"arg{k}", a.data_ptr(), a.numel() * a.element_size())
                for k, a in enumerate(args)] + \
            [(f"out{k}", o.data_ptr(), o.untyped_storage().nbytes())
             for k, o in enumerate(outputs)]

    assert _name_pointers(native.ops, regions(got)) == _name_pointers(python.ops, regions(want))
    extent = plan.host.steps[0].stage.extent
    waits = [op for op in native.ops if op[0] == "wait" and op[2] == _Trace.ENTRY]
    assert [op[1] for op in waits][:extent] == [100 + i % 3 for i in range(extent)]
    assert native_host.describe(plan, args, {}, lambda p: None) == \
        f"segment {plan.host.steps[0].segments[0]} ran 0 programs, not one"
    del launch, record, wait


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(CASES))
def test_gpu_cpp_loop_equals_the_python_loop(case):
    """The SDK's warm call of a host program: the first runs the loop in Python and hands it
    to the C++ launcher; later calls run there and give the Python loop's outputs."""
    from fusecut.runtime import launcher
    from fusecut.runtime.run import compile_plan
    from fusecut.runtime.streams import run_host

    assert launcher.native(wait=True) is not None, launcher.failure()
    make, _, _ = CASES[case]
    shapes = GPU_SHAPES[case]
    plan = plan_for(make(), shapes, num_streams=4)
    args = gpu_inputs(shapes, exact=True)
    host = compile_plan(plan, args)
    first = host.run(args)
    if host.native is None:  # programs made before the launcher was built: a second run
        assert host.run(args) is not None and host.tries == 2, case
    assert host.native is not None, (case, host.python_why)
    again = host.call(args)
    python = run_host(plan, list(args)).outputs
    torch.cuda.synchronize()
    for a, b, c in zip(first, again, python, strict=True):
        assert torch.equal(a, c) and torch.equal(b, c), case
    other = [torch.randn(s[0] + 1, *s[1:], device="cuda") for s in shapes]
    assert host.call(other) is None  # another signature: the caller plans again
