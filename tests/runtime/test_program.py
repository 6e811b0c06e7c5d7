"""Compiled programs (runtime.program) and the native launcher, on the CPU.

Kernels cannot run here, so the kernel functions are stand-ins: the code generator and the
program layout are real, and a recording function takes cuLaunchKernel's place. The C++ launcher
is really compiled and run: it must launch exactly what the Python path launches, with the same
parameters resolved to the same tensors, and refuse arguments that do not match its signature.
"""

from __future__ import annotations

import ctypes
import itertools
import struct

import pytest
import torch

from fusecut.optimizer.ir import parse_text
from fusecut.optimizer.ir.inputs import scale_metas
from fusecut.optimizer.planner import make_plan
from fusecut.runtime import kernels, launcher
from fusecut.runtime import program as programs
from fusecut.runtime.tensors import make_input
from tests.conftest import CORPUS

LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint,
                          ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                          ctypes.c_uint, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                          ctypes.c_void_p)


@pytest.fixture(scope="module")
def native():
    return launcher.build()  # a real compile with the system compiler and torch's headers


@pytest.fixture
def fake_kernels(monkeypatch):
    """Kernel handles are numbers; Python-path launches are recorded."""
    handles = itertools.count(0x1000, 0x10)
    monkeypatch.setattr(kernels, "_functions", lambda k: [next(handles) for _ in k.kernels])
    launched = []
    monkeypatch.setattr(programs, "launch_kernel",
                        lambda launch, values, stream: launched.append((launch, list(values))))
    return launched


def corpus_program(name: str, max_numel: int = 4096):
    parsed = parse_text((CORPUS / f"{name}.py").read_text())
    metas = scale_metas(parsed.inputs, max_numel)
    plan = make_plan(parsed.fusion, metas)
    torch.manual_seed(0)
    args = [make_input(m) for m in metas]
    return plan, args, programs.build_program(plan, args)


def _as_value(raw: int, kind: int):
    if kind in (programs.DOUBLE, programs.SCALAR_DOUBLE):
        return struct.unpack("<d", struct.pack("<Q", raw))[0]
    if kind in (programs.BOOL, programs.SCALAR_BOOL):
        return bool(raw & 0xFF)
    return raw


def _normalise(launches, args):
    """Launches with pointers named by what they point at: an argument, or the n-th other buffer
    met. (Not by output: a freed buffer's address may come back as an output's in one path and
    not in the other, as the allocator pleases.)"""
    names = {a.data_ptr(): f"arg{i}" for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
    others = itertools.count()
    out = []
    for function, values, kinds in launches:
        row = [function]
        for v, kind in zip(values, kinds):
            if kind == programs.SLOT:
                if v not in names:
                    names[v] = f"buffer{next(others)}"
                row.append(names[v])
            else:
                row.append(_as_value(v, kind) if isinstance(v, int) else v)
        out.append(tuple(row))
    return out


def kernel_steps(program):
    return [s for s in program.steps
            if isinstance(s, programs.Launch) and s.kernel is not None]


def run_native(module, program, args, targets=None):
    recorded = []

    steps = kernel_steps(program)

    def record(fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        n = len(steps[len(recorded) % len(steps)].params)  # launches come in program order
        raw = [ctypes.cast(params[k], ctypes.POINTER(ctypes.c_uint64))[0] for k in range(n)]
        recorded.append((fn, (gx, gy, gz), (bx, by, bz), raw))
        return 0

    callback = LAUNCH(record)
    address = ctypes.cast(callback, ctypes.c_void_p).value
    capsule = programs.native_capsule(module, program, (address, 0, 0, 0), 0)
    run_native.keep.append(callback)  # the launcher calls it for as long as the test runs
    return module.run(capsule, args, 0, targets), recorded, capsule


run_native.keep = []


@pytest.mark.parametrize("name", ["softmax_fwd", "adam_step", "layernorm_bwd",
                                  "seed_4269_forward_full", "seed_3366_neg_broadcast_mul",
                                  "mlp_gelu"])
def test_native_launches_what_python_launches(name, native, fake_kernels):
    plan, args, program = corpus_program(name)
    python_outputs = program.run_python(args)
    python = [(launch.address, values, [p[0] for p in step.params])
              for (launch, values), step in zip(fake_kernels, kernel_steps(program))]
    outputs, recorded, _ = run_native(native, program, args)
    assert outputs is not None
    steps = kernel_steps(program)
    assert len(recorded) == len(steps) == sum(
        len(kernels.generate_segment(plan, seg).kernels) for seg in plan.segments)
    for (fn, grid, block, _), step in zip(recorded, steps):
        assert fn == step.kernel.address
        assert grid == tuple(step.kernel.grid) and block == tuple(step.kernel.block)
    native_launches = [(fn, raw, [p[0] for p in step.params])
                       for (fn, _, _, raw), step in zip(recorded, steps)]
    python_named = _normalise(python, args)
    native_named = _normalise(native_launches, args)
    assert native_named == python_named
    bound = plan.bound
    for out, t in zip(outputs, plan.fusion.outputs):  # logical shapes, broadcast axes stride 0
        assert tuple(out.shape) == tuple(bound.shapes[t])
        assert out.dtype == python_outputs[plan.fusion.outputs.index(t)].dtype
        for extent, stride, b in zip(out.shape, out.stride(), bound.broadcast[t]):
            assert not b or stride == 0 or extent == 1


def test_native_refuses_other_arguments(native, fake_kernels):
    plan, args, program = corpus_program("layernorm_fwd")
    _, _, capsule = run_native(native, program, args)
    assert native.run(capsule, args, 0) is not None
    x = args[0]
    bigger = torch.empty(x.shape[0] + 1, x.shape[1], dtype=x.dtype)
    other_dtype = x.float()
    strided = torch.empty(x.shape[1], x.shape[0], dtype=x.dtype).t()
    misaligned = torch.empty(x.numel() + 1, dtype=x.dtype)[1:].view(x.shape)
    for wrong in (bigger, other_dtype, strided, misaligned):
        assert native.run(capsule, [wrong, *args[1:]], 0) is None
    assert native.run(capsule, args[:-1], 0) is None
    assert native.run(capsule, [1.0, *args[1:]], 0) is None


def test_scalar_arguments_are_parameters_not_plans(native, fake_kernels):
    parsed = parse_text(
        "from nvfuser import FusionDefinition, DataType\n"
        "def f(fd):\n"
        "    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)\n"
        "    S1 = fd.define_scalar(dtype=DataType.Double)\n"
        "    T2 = fd.ops.mul(T0, S1)\n"
        "    T3 = fd.ops.sum(T2, dims=[1], keepdim=False, dtype=DataType.Null)\n"
        "    fd.add_output(T3)\n")
    x = torch.randn(8, 32)
    from fusecut.runtime.tensors import meta_of

    plan = make_plan(parsed.fusion, [meta_of(x), meta_of(2.5)])
    program = programs.build_program(plan, [x, 2.5])
    assert program.baked == frozenset()  # the value may change without a new plan
    assert programs.signature([x, 7.0]) == program.signature
    _, recorded, capsule = run_native(native, program, [x, 7.0])
    kinds = [p[0] for p in program.steps[0].params]
    assert programs.SCALAR_DOUBLE in kinds
    raw = recorded[0][3][kinds.index(programs.SCALAR_DOUBLE)]
    assert struct.unpack("<d", struct.pack("<Q", raw))[0] == 7.0
    assert native.run(capsule, [x, 7], 0) is None  # an int is another signature


def test_shape_scalars_are_part_of_the_signature():
    parsed = parse_text(
        "from nvfuser import FusionDefinition, DataType\n"
        "def f(fd):\n"
        "    T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)\n"
        "    S1 = fd.define_scalar(dtype=DataType.Int)\n"
        "    S2 = fd.define_scalar(dtype=DataType.Double)\n"
        "    T3 = fd.ops.reshape(T0, new_shape=[S1, -1])\n"
        "    T4 = fd.ops.mul(T3, S2)\n"
        "    fd.add_output(T4)\n")
    baked = programs.baked_positions(parsed.fusion)
    assert baked == frozenset({1})  # the reshape's size; the factor is a kernel parameter
    x = torch.randn(12)
    assert programs.signature([x, 3, 1.0], baked) != programs.signature([x, 4, 1.0], baked)
    assert programs.signature([x, 3, 1.0], baked) == programs.signature([x, 3, 2.0], baked)


def test_random_seed_and_offset_are_kernel_parameters():
    # Thunder passes a new Philox seed and offset every step: one program must serve them all.
    parsed = parse_text(
        "from nvfuser import FusionDefinition, DataType\n"
        "def f(fd):\n"
        "    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)\n"
        "    S1 = fd.define_scalar(dtype=DataType.Int)\n"
        "    S2 = fd.define_scalar(dtype=DataType.Int)\n"
        "    T3 = fd.ops.uniform(0.0, 1.0, shape=[4, 8], dtype=DataType.Float, rng_seed=S1,\n"
        "                        rng_offset=S2)\n"
        "    fd.add_output(fd.ops.mul(T0, T3))\n")
    baked = programs.baked_positions(parsed.fusion)
    assert baked == frozenset()
    x = torch.randn(4, 8)
    assert programs.signature([x, 3, 0], baked) == programs.signature([x, 4, 8], baked)


def test_expanded_strides():
    assert programs.expanded_strides((4, 3, 5), (False, True, False)) == (5, 0, 1)
    assert programs.expanded_strides((2, 6), (True, False)) == (0, 1)


def test_a_program_output_that_is_an_argument_comes_back_as_a_copy(fake_kernels):
    parsed = parse_text(
        "from nvfuser import FusionDefinition, DataType\n"
        "def f(fd):\n"
        "    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)\n"
        "    T1 = fd.ops.neg(T0)\n"
        "    fd.add_output(T1)\n"
        "    fd.add_output(T0)\n")
    x = torch.randn(4, 8)
    before = x.clone()
    from fusecut.runtime.tensors import meta_of

    program = programs.build_program(make_plan(parsed.fusion, [meta_of(x)]), [x])
    assert program.may_share == (1,)
    _, same = program.run_python([x])
    assert same is not x and torch.equal(same, before)
    same.zero_()
    assert torch.equal(x, before)


@pytest.mark.parametrize("path", ["python", "native"])
def test_outputs_are_written_to_their_targets(path, native, fake_kernels):
    """A stream loop's slices: a dense target is the kernel's output buffer itself;
    another is filled by a copy."""
    plan, args, program = corpus_program("softmax_fwd")
    (slot, _, _), = program.outputs
    shape, dtype = program.buffers[slot - program.n_args]
    numel = torch.Size(shape).numel()
    dense = torch.zeros(3, numel, dtype=dtype)[1]  # a row of a whole output
    strided = torch.zeros(numel, 2, dtype=dtype)[:, 1]
    for target, in_place in ((dense, True), (strided, False)):
        fake_kernels.clear()
        if path == "python":
            (out,) = program.run_python(args, [target])
            pointers = {v for _, values in fake_kernels for v in values}
        else:
            (out,), recorded, _ = run_native(native, program, args, [target])
            pointers = {v for *_, raw in recorded for v in raw}
        assert (target.data_ptr() in pointers) == in_place
        assert (out.data_ptr() == target.data_ptr()) == in_place
        bits = [t.reshape(-1).contiguous().view(torch.uint8) for t in (out, target)]
        assert torch.equal(*bits)  # bit for bit: the fake kernels leave whatever was there


def test_unseeded_random_ops_take_each_call_s_draw_in_both_paths(native, fake_kernels,
                                                                  monkeypatch):
    """A call gives only its tensor; the program appends the seed and per-op offsets it draws
    (issue 18, item 6), as kernel parameters: the C++ launcher gets them like any scalar."""
    parsed = parse_text(
        "from nvfuser import FusionDefinition, DataType\n"
        "def f(fd):\n"
        "    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)\n"
        "    T1 = fd.ops.uniform(0.0, 1.0, shape=T0.shape(), dtype=DataType.Float)\n"
        "    T2 = fd.ops.normal(0.0, 1.0, shape=T0.shape(), dtype=DataType.Float)\n"
        "    fd.add_output(fd.ops.mul(T0, T1))\n"
        "    fd.add_output(T2)\n")
    from fusecut.runtime.tensors import meta_of

    x = torch.randn(4, 8)
    plan = make_plan(parsed.fusion, [meta_of(x)])
    program = programs.build_program(plan, [x])
    assert program.n_args == 4 and len(program.implicit_rng) == 3
    kinds = [(k, i) for step in kernel_steps(program) for k, i, _, _ in step.params
             if k >= programs.SCALAR_INT]
    assert {i for _, i in kinds} == {1, 2, 3}  # seed and two offsets, argument positions

    def drawn(seed):  # what the CPU generator gives a call after manual_seed(seed)
        torch.manual_seed(seed)
        return [int(torch.randint(-(1 << 63), (1 << 63) - 1, (), dtype=torch.int64)), 0, 1]

    def scalar_params(values_by_launch):
        return [v for values, step in values_by_launch for v, (k, _, _, _) in
                zip(values, step.params) if k >= programs.SCALAR_INT]

    torch.manual_seed(11)
    program.run([x])  # the Python path
    python = scalar_params(zip([v for _, v in fake_kernels], kernel_steps(program)))
    want = drawn(11)
    assert sorted(set(python)) == sorted(set(want))
    outputs, recorded, capsule = run_native(native, program, [x, *want])
    assert outputs is not None
    native_params = scalar_params(zip([r for *_, r in recorded], kernel_steps(program)))
    assert [v & ((1 << 64) - 1) for v in python] == native_params
    # the warm call with the caller's argument only: the launcher runs this call's draw
    monkeypatch.setattr(programs, "current_stream", lambda index: 0)
    program.native = (native.run, capsule)
    recorded.clear()
    torch.manual_seed(12)
    assert program.call([x]) is not None
    warm = scalar_params(zip([r for *_, r in recorded], kernel_steps(program)))
    assert sorted(set(warm)) == sorted(v & ((1 << 64) - 1) for v in drawn(12))
    assert program.call([torch.randn(5, 8)]) is None  # another signature: nothing launched
