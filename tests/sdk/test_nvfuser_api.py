"""nvFuser's frontend API as fusecut's own (issue 31): from_pytorch, FusionCache and LRUCache,
execute's keyword options, validate, the printed definition that runs again, clone, class-style
definitions, the full DataType, and manual scheduling refused."""

from __future__ import annotations

import re

import pytest
import torch

import fusecut
from fusecut import DataType, FusionCache, FusionDefinition, LRUCache, clone
from fusecut.execute_options import ExecuteOptionError
from fusecut.optimizer.errors import DefinitionError, ManualSchedulingError


@pytest.fixture(autouse=True)
def fresh_cache():
    FusionCache.reset()
    yield
    FusionCache.reset()


def _add_mul(fd: FusionDefinition, x: torch.Tensor) -> None:
    t0 = fd.from_pytorch(x)
    t1 = fd.from_pytorch(x)
    t2 = fd.ops.add(t0, t1)
    fd.add_output(fd.ops.mul(t2, fd.define_scalar(3.0)))


def test_from_pytorch_takes_dtype_layout_and_symbolic_extents():
    x = torch.randn(4, 1, 6).permute(2, 1, 0)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.neg(t))
    tv = fd.fusion.tensors[t.name]
    assert tv.declared_shape == (-1, 1, -1)
    assert tv.broadcast == (False, True, False)
    # nvFuser's computeTensorDescriptor: stride-sorted, ties (the size-1 axis, stride 6) keep
    # logical order, so strides (1, 6, 6) give stride_order (0, 2, 1)
    assert tv.stride_order == (0, 2, 1)
    (out,) = fd.execute([x])
    torch.testing.assert_close(out, -x)


def test_datatype_has_every_nvfuser_member():
    for name in ("ComplexFloat", "ComplexDouble", "Float8_e4m3fn", "Float8_e5m2",
                 "Float8_e8m0fnu", "Float4_e2m1fn", "Float4_e2m1fn_x2", "UInt64", "Int32",
                 "BFloat16"):
        assert getattr(DataType, name) is not None
    assert DataType.Null is None


def test_define_scalar_with_only_a_dtype_is_a_scalar_input():
    with FusionDefinition() as fd:
        t = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
        s = fd.define_scalar(DataType.Int)
        fd.add_output(fd.ops.mul(t, s))
    assert fd.fusion.scalars[s.name].dtype is DataType.Int
    (out,) = fd.execute([torch.ones(3), 4])
    torch.testing.assert_close(out, torch.full((3,), 4.0))


def test_complex_scalars_and_tensors_run():
    x = torch.randn(5, dtype=torch.complex64)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        c = fd.define_scalar(complex(1.0, -2.0), dtype=DataType.ComplexFloat)
        t2 = fd.ops.mul(t, c)
        fd.add_output(t2)
        fd.add_output(fd.ops.real(t2))
    prod, real = fd.execute([x])
    torch.testing.assert_close(prod, x * (1 - 2j))
    torch.testing.assert_close(real, (x * (1 - 2j)).real)
    assert "complex(1.0, -2.0)" in repr(fd)


def test_fusion_cache_counts_definitions_by_structure():
    x = torch.randn(2, 3)
    cache = FusionCache.get()
    assert cache.num_fusions() == 0
    with FusionDefinition() as fd1:
        _add_mul(fd1, x)
    with FusionDefinition() as fd2:  # the same definition again: a cache hit
        _add_mul(fd2, x)
    assert cache.num_fusions() == 1 and fd1.id() == fd2.id() == 0
    fd1.execute([x, x])
    assert fd2.handle is fd1.handle  # one set of plans and programs
    with FusionDefinition() as fd3:
        t = fd3.from_pytorch(x)
        fd3.add_output(fd3.ops.neg(t))
    assert cache.num_fusions() == 2 and fd3.id() == 1
    again = FusionDefinition(fd3.id())  # nvFuser's FusionDefinition(id)
    torch.testing.assert_close(again.execute([x])[0], -x)
    FusionCache.reset()
    assert FusionCache.get().num_fusions() == 0


def test_fusion_cache_serializes_its_definitions(tmp_path):
    x = torch.randn(2, 3)
    with FusionDefinition() as fd:
        _add_mul(fd, x)
    path = tmp_path / "cache.json"
    FusionCache.get().serialize(str(path))
    FusionCache.reset()
    FusionCache.get().deserialize(str(path))
    assert FusionCache.get().num_fusions() == 1
    with FusionDefinition() as again:
        _add_mul(again, x)
    assert again.id() == 0 and FusionCache.get().num_fusions() == 1


def test_lru_cache_compiles_each_structure_once():
    x = torch.randn(2, 3)
    cache = LRUCache(max_fusions=4)
    for _ in range(2):
        with FusionDefinition() as fd:
            _add_mul(fd, x)
        fd.fec = cache.cache_compile(fd.fusion)
        del fd._fusion  # as nvfuser_direct's helpers do
        torch.testing.assert_close(fd.execute([x, x])[0], (x + x) * 3)
    assert cache.num_fusions() == 1


def test_printed_definition_runs_again_under_both_names():
    x = torch.randn(2, 3)
    with FusionDefinition() as fd:
        _add_mul(fd, x)
    text = repr(fd)
    # legacy nvFuser's helpers read the function's name from the second line
    assert re.findall(r"(nvfuser_fusion_id\d+)", text.split("\n")[1]) == ["nvfuser_fusion_id0"]
    namespace = {"FusionDefinition": FusionDefinition, "DataType": DataType}
    exec(text, namespace)  # our own printed text, as nvFuser's tests run it
    for name in ("nvfuser_fusion_id0", "nvfuser_fusion"):  # legacy and nvfuser_direct names
        with FusionDefinition() as again:
            namespace[name](again)
        torch.testing.assert_close(again.execute([x, x])[0], (x + x) * 3)
        assert again.id() == fd.id()  # the same structure: the same cache entry
    assert len(fusecut.load(text).fusion.ops) == len(fd.fusion.ops)  # and the parser reads it


def test_clone_builds_the_same_definition():
    x = torch.randn(2, 3)
    with FusionDefinition() as fd:
        _add_mul(fd, x)
    copy = FusionDefinition()
    clone(fd, copy)
    torch.testing.assert_close(copy.execute([x, x])[0], fd.execute([x, x])[0])
    with pytest.raises(DefinitionError, match="incomplete definition"):
        clone(fd, copy)


def test_class_style_definition_and_completed_definitions():
    class Negate(FusionDefinition):
        def definition(self):
            self.t0 = self.define_tensor(shape=[-1], contiguity=[True])
            self.add_output(self.ops.neg(self.t0))

        def schedule(self):  # adding an op after the definition is complete is refused
            self.ops.abs(self.t0)

    with pytest.raises(RuntimeError, match="Attempting to add to a completed definition"):
        Negate().execute([torch.ones(3)])
    with pytest.raises(NotImplementedError):
        FusionDefinition().execute([torch.ones(3)])


def test_execute_options_are_implemented_or_refused():
    x = torch.randn(4)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.exp(t))
    want = torch.exp(x)
    # nvFuser's helpers pass these at their defaults: a plain call
    torch.testing.assert_close(fd.execute([x], device=None, _enable_options=[],
                                          _disable_options=[])[0], want)
    # switches that cannot change fusecut's result are accepted
    torch.testing.assert_close(fd.execute([x], _disable_options=["infer_contiguity"])[0], want)
    # asking for generated matmul kernels changes nothing without a matmul ...
    torch.testing.assert_close(fd.execute([x], _enable_options=["fuse_matmul"])[0], want)
    with FusionDefinition() as mm:
        a = mm.from_pytorch(torch.randn(4, 3))
        mm.add_output(mm.ops.matmul(a, mm.from_pytorch(torch.randn(3, 2))))
    # ... and is refused with one, in nvFuser's words (fusecut runs matmuls through cuBLAS)
    with pytest.raises(ExecuteOptionError, match="Can not find a scheduler to schedule fusion "
                                                 "segment: .*fuse_matmul"):
        mm.execute([torch.randn(4, 3), torch.randn(3, 2)], _enable_options=["fuse_matmul"],
                   _disable_options=["matmul_expr_eval"])
    with pytest.raises(ExecuteOptionError, match="unknown option 'no_such_switch'"):
        fd.execute([x], _disable_options=["no_such_switch"])
    with pytest.raises(ExecuteOptionError, match="CUDA device"):
        fd.execute([x], device="cpu")
    fd.execute([x], profile=True)
    prof = fd.profile()
    assert prof.segments == len(prof.kernel_profiles) >= 1
    fd.execute([x], capture_debug_output=True)
    assert fd.debug_output()
    with pytest.raises(AssertionError, match="save_repro_inputs=True"):
        fd.last_repro_script()
    fd.execute([x], save_repro_inputs=True)
    assert "fd.execute(inputs)" in fd.last_repro_script()


def test_factory_only_fusion_goes_to_the_device_given():
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.full([2, 2], fd.define_scalar(1.5), dtype=DataType.Float))
    (out,) = fd.execute([])
    assert out.device.type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_a_fusion_without_tensor_inputs_runs_on_the_current_gpu(monkeypatch):
    # nvFuser's test_random_distinct_values compares such outputs with CUDA tensors, and its
    # test_uniform_range draws 2**29 values a call: without a device= hint they must still be
    # computed on the current GPU (fusecut's kernels), not on the CPU
    import fusecut.engine

    asked = []
    run = fusecut.engine.FusionHandle.execute

    def execute(self, inputs, return_execution=False, device=None, **options):
        asked.append(device)
        return run(self, inputs, return_execution, None, **options)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(fusecut.engine.FusionHandle, "execute", execute)
    monkeypatch.setattr(fusecut.definition, "_placed", lambda outs, device, tensors: outs)
    with FusionDefinition() as fd:
        s0, s1 = fd.define_scalar(0.0), fd.define_scalar(1.0)
        fd.add_output(fd.ops.uniform(s0, s1, shape=[2, 2], dtype=DataType.Float))
    fd.execute([])
    x = torch.ones(2, 2)
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        s0, s1 = fd.define_scalar(0.0), fd.define_scalar(1.0)
        fd.add_output(fd.ops.add(t0, fd.ops.uniform(s0, s1, shape=[2, 2])))
    fd.execute([x])  # with a tensor argument, its device decides
    assert asked == [torch.device("cuda", 0), None]


@pytest.mark.gpu
def test_random_values_without_tensor_inputs_are_on_the_gpu_and_new_each_call():
    with FusionDefinition() as fd:
        s0, s1 = fd.define_scalar(0.0), fd.define_scalar(1.0)
        fd.add_output(fd.ops.normal(s0, s1, shape=[2, 2], dtype=DataType.BFloat16))
    draws = [fd.execute([])[0] for _ in range(3)]
    assert all(d.device.type == "cuda" for d in draws)
    assert not torch.equal(draws[0], draws[1]) and not torch.equal(draws[1], draws[2])
    # drawn by fusecut's kernels on the GPU (nvFuser's test_uniform_range drew 2**29 values a
    # call on the CPU before, past its 60 s)
    with FusionDefinition() as fd:
        s0, s1 = fd.define_scalar(-1.0), fd.define_scalar(1.0)
        fd.add_output(fd.ops.uniform(s0, s1, shape=[2**20], dtype=DataType.Float))
    (u,) = fd.execute([], profile=True)
    assert {k.backend for k in fd.profile().kernel_profiles} == {"cuda"}
    assert u.device.type == "cuda" and -1.0 <= float(u.min()) and float(u.max()) < 1.0


def test_validate_against_the_reference():
    x = torch.randn(8, 16)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.sum(t, dims=[1]))
    (out,) = fd.validate([x])
    torch.testing.assert_close(out, x.sum(1))
    with pytest.raises(AssertionError, match="max error"):
        fd.validate([x], [x.sum(1) + 1])
    fd.validate_with_auto_inferred_outputs([x.sum(1)], [x])


def test_in_place_updates_are_not_returned():
    x = torch.ones(4, 4)
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        t1 = fd.ops.add(t0, fd.define_scalar(1.0))
        t2 = fd.ops.add(t1, fd.define_scalar(2.0))
        fd.add_output(t1, alias_input=t0)
        fd.add_output(t2)
    outs = fd.execute([x])
    assert len(outs) == 1  # nvFuser hides the in-place update
    torch.testing.assert_close(outs[0], torch.full((4, 4), 4.0))
    torch.testing.assert_close(x, torch.full((4, 4), 2.0))


def test_vector_arguments_and_python_operators():
    x = torch.randn(2, 3, 4)
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        shape = fd.define_vector(2)  # nvfuser_direct's form: two integer inputs
        t1 = fd.ops.reshape(t0, shape)
        fd.add_output(-abs(t1) * 2.0 + t1)
    (out,) = fd.execute([x, [6, 4]])
    y = x.reshape(6, 4)
    torch.testing.assert_close(out, -y.abs() * 2 + y)
    # a second call takes the warm path: the vector comes as a list or a tuple again
    for shape in ([6, 4], (6, 4)):
        torch.testing.assert_close(fd.execute([x, shape])[0], -y.abs() * 2 + y)
    assert fd.plan([x, (6, 4)]).json and fd.segment([x, [6, 4]])  # as nvFuser's helpers call


def test_manual_scheduling_is_refused_not_pretended():
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True])
        fd.add_output(fd.ops.neg(t0))
    with pytest.raises(ManualSchedulingError, match="schedules automatically"):
        fd.sched.split(t0, 1, 4)
    with pytest.raises(ManualSchedulingError, match="schedules automatically"):
        t0.cache_after()
    with pytest.raises(ManualSchedulingError, match="schedules automatically"):
        fd.last_cuda_code()


def test_an_op_name_typo_suggests_the_op():
    with FusionDefinition() as fd:
        with pytest.raises(AttributeError) as info:
            _ = fd.ops.sqrtt
    message = str(info.value)
    assert "did you mean 'sqrt'" in message and len(message) < 120


@pytest.mark.parametrize("op", ["cumsum", "cumprod", "cummax", "cummin"])
def test_scans_run_through_the_reference(op):
    x = torch.randn(4, 6)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(getattr(fd.ops, op)(t, 1))
    want = getattr(torch, op)(x, 1)
    torch.testing.assert_close(fd.execute([x])[0], want.values if op in ("cummax", "cummin")
                               else want)


def test_complex_division_is_true_division():
    x = torch.randn(5, dtype=torch.complex64)
    y = torch.randn(5, dtype=torch.complex64)
    with FusionDefinition() as fd:
        a, b = fd.from_pytorch(x), fd.from_pytorch(y)
        fd.add_output(fd.ops.div(a, b))
    torch.testing.assert_close(fd.execute([x, y])[0], x / y)


def test_handles_say_what_they_are_and_failures_print_a_repro():
    x = torch.randn(3)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        s = fd.define_scalar(2.0)
        fd.add_output(fd.ops.mul(t, s))
    assert t.is_tensor() and not s.is_tensor()
    text = fd._repro_error_str("executing", [x])
    assert "executing" in text and "fd.execute(inputs)" in text
    with pytest.raises(NotImplementedError, match="Fusion does not exist! Use `with "
                                                  "FusionDefinition\\(\\) as fd: ...` to define"):
        FusionDefinition().execute([x])


@pytest.mark.parametrize("dtype, nv", [(torch.complex64, DataType.ComplexFloat),
                                       (torch.complex128, DataType.ComplexDouble)])
def test_complex_sums_keep_the_imaginary_part(dtype, nv):
    x = torch.randn(2, 32, dtype=dtype)
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        fd.add_output(fd.ops.sum(t0, [-1], False, nv))
        fd.add_output(fd.ops.sum(t0, dims=[0]))
    a, b = fd.execute([x])
    torch.testing.assert_close(a, x.sum(-1))
    torch.testing.assert_close(b, x.sum(0))
    with FusionDefinition() as fd2:
        with pytest.raises(DefinitionError, match="max is not supported for complex"):
            fd2.ops.max(fd2.from_pytorch(x), dims=[0])


def test_direct_spellings_dtype_method_and_negative_broadcast_dims():
    x = torch.randn(3)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        assert t.dtype() is t.dtype is DataType.Float  # nvfuser_direct calls it
        b = fd.ops.broadcast_in_dim(t, shape=[2, 3], broadcast_dims=[-1])
        fd.add_output(b)
    torch.testing.assert_close(fd.execute([x])[0], x.expand(2, 3))


def test_inputs_and_outputs_are_state_indices():
    x = torch.ones(2, 4)
    with FusionDefinition() as fd:
        t0, t1 = fd.from_pytorch(x), fd.from_pytorch(x)
        c2 = fd.define_scalar(3.0)
        t3 = fd.ops.mul(fd.ops.add(t0, t1), c2)
        fd.add_output(fd.ops.sum(t3, [-1], False, DataType.Float))
    assert fd.inputs() == [0, 1] and fd.outputs() == [5]


def test_an_empty_definition_says_so():
    with FusionDefinition() as fd:
        pass
    with pytest.raises(NotImplementedError, match="Fusion is empty!"):
        fd.execute([torch.ones(2)])


def test_mismatched_arguments_are_named_in_nvfusers_words():
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
        fd.add_output(fd.ops.mul(t0, fd.define_scalar()))
    x = torch.rand(15)
    for args, words in (([2.0, 2.0], "Expected input 0, T0, to be an at::Tensor but got scalar 2"),
                        ([x, x], "Expected input 1, S1, to be a scalar but got float tensor of "
                                 "rank 1"),
                        ([x.half(), 2.0], "to be bound to a tensor of dtype float, but got a "
                                          "tensor of dtype __half"),
                        ([x, 2.0 + 1.0j], "Scalar value (2,1) is not compatible with the "
                                          "expected data type: double.")):
        with pytest.raises(RuntimeError, match=re.escape(words)):
            fd.execute(args)


def test_version_compares_with_strings():
    from fusecut.nvfuser_direct_version import Version as DirectVersion
    from fusecut.nvfuser_version import Version, version

    assert version() > "0.0.0" and "0.0.0" < version() and version() > Version("0.0.0")
    assert Version("1.2") == "1.2.0" and Version("1.10.0") > "1.9.9" and DirectVersion is Version
    assert str(version()) == fusecut.__version__


def test_legacy_sdpfa_fwd_takes_dropout_causal_and_scale_positionally():
    q = torch.randn(1, 2, 4, 8)
    with FusionDefinition() as fd:
        t = [fd.from_pytorch(q) for _ in range(3)]
        causal = fd.define_scalar(None, dtype=DataType.Bool)
        attn, *_ = fd.ops.sdpfa_fwd(*t, None, causal, None)  # (q, k, v, dropout_p, ...)
        fd.add_output(attn)
    op = fd.fusion.ops[0]
    assert op.name == "sdpfa_fwd" and list(op.inputs[3:]) == [causal.name]
    out = fd.execute([q, q, q, True])[0]
    want = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)


def test_a_stride_ordered_output_places_its_extent_1_axes_as_nvfuser_does():
    x = torch.randn(2, 3, 4)
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        t1 = fd.ops.broadcast(t0, is_broadcast_dim=[False, True, False, False])
        fd.add_output(fd.ops.stride_order(t1, stride_order=[0, 1, 2, 3]))
    (out,) = fd.execute([x])
    torch.testing.assert_close(out, x.unsqueeze(1))
    assert out.stride() == (1, 2, 2, 6)  # axis 1 sits between axes 0 and 2 in memory


def test_complex_variance_is_real_and_the_mean_complex():
    x = torch.randn(3, 5, dtype=torch.complex64)
    with FusionDefinition() as fd:
        var, mean = fd.ops.var_mean(fd.from_pytorch(x), dims=[1], correction=1)
        fd.add_output(var)
        fd.add_output(mean)
    got_var, got_mean = fd.execute([x])
    want_var, want_mean = torch.var_mean(x, dim=1, correction=1)
    assert got_var.dtype == torch.float32 and got_mean.dtype == torch.complex64
    torch.testing.assert_close(got_var, want_var)
    torch.testing.assert_close(got_mean, want_mean)


@pytest.mark.gpu
def test_a_cpu_scalar_tensor_beside_gpu_tensors_is_a_scalar_on_every_call():
    # nvFuser's test_cpu_add: the kernel once got the CPU tensor's host pointer and faulted,
    # poisoning the process's CUDA context. The second call takes the warm path.
    scalar = torch.tensor(2.0, dtype=torch.float)
    x = torch.randn(3, device="cuda")
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(scalar)
        t1 = fd.from_pytorch(x)
        fd.add_output(fd.ops.add(t0, t1))
    for _ in range(2):
        (out,) = fd.execute([scalar, x])
        assert out.device == x.device
        torch.testing.assert_close(out, scalar + x)
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_a_cpu_tensor_with_dimensions_beside_gpu_tensors_is_refused_by_name():
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([-1], dtype=DataType.Float)
        t1 = fd.define_tensor([-1], dtype=DataType.Float)
        fd.add_output(fd.ops.add(t0, t1))
    with pytest.raises(fusecut.optimizer.errors.InputError,
                       match=r"input 0 is a CPU tensor of shape \(3,\) beside tensors on cuda"):
        fd.execute([torch.ones(3), torch.ones(3, device="cuda")])


@pytest.mark.gpu
def test_validate_and_profile_of_a_fusion_without_tensor_inputs_run_on_the_gpu():
    # nvFuser's test_issue1872: validate() once ran the CPU reference while execute() ran on
    # the GPU, and its caller compared the two
    with FusionDefinition() as fd:
        s0 = fd.define_scalar(1.0, dtype=DataType.Double)
        s1 = fd.define_scalar(5, dtype=DataType.Int)
        t3 = fd.ops.full(shape=[s1], fill_value=s0, dtype=DataType.Float)
        fd.add_output(fd.ops.cast(fd.ops.slice(t3, [0], [2], [1]), dtype=DataType.Half))
    (checked,) = fd.validate([])
    (profiled,) = fd.execute([], profile=True)
    assert fd.profile().kernel_profiles
    (plain,) = fd.execute([])
    assert {t.device.type for t in (checked, profiled, plain)} == {"cuda"}
    assert torch.equal(checked, plain)


@pytest.mark.parametrize("content", ['{"format": "fusecut-fusion-cache", "version": 1}',
                                     '{"format": "fusecut-fusion-cache", "fusions": null}',
                                     '{"format": "fusecut-fusion-cache", "fusions": [{"x": 1}]}',
                                     "not json"])
def test_an_unreadable_workspace_is_skipped_with_a_warning(content, tmp_path, monkeypatch):
    # issue 45: a workspace without "fusions" (or null) made every FusionDefinition fail until
    # the file was deleted
    from fusecut.fusion_cache import FusionCache

    path = tmp_path / "fusion_cache.json"
    path.write_text(content)
    monkeypatch.setenv("FUSECUT_FUSION_CACHE", str(path))
    FusionCache.reset()
    try:
        with pytest.warns(RuntimeWarning, match="was not loaded"):
            cache = FusionCache.get()
        assert cache.num_fusions() == 0
        assert FusionCache.get() is cache  # once: later calls find the empty cache
    finally:
        FusionCache.reset()
