"""The torch reference interpreter against hand-written torch code for every corpus case."""

from __future__ import annotations

import ast

import pytest
import torch

from fusecut.optimizer.ir import parse_text
from fusecut.runtime.reference import run_reference
from fusecut.runtime.tensors import make_input, meta_of
from tests.conftest import CORPUS
from tests.corpus_torch import CASES, EagerDefinition, small_definition
from tests.helpers import small_metas

SMALL = 1 << 15


def _inputs(parsed, max_numel=SMALL, seed=0):
    """Small inputs of the repro's structure, or its own sizes where the definition fixes them."""
    gen = torch.Generator().manual_seed(seed)
    return [make_input(m, generator=gen) for m in small_metas(parsed, max_numel)]


def _close(actual, expected):
    for a, e in zip(actual, expected, strict=True):
        assert a.shape == e.shape and a.dtype == e.dtype
        tol = {torch.bfloat16: 2e-2, torch.float16: 2e-3}.get(a.dtype, 1e-5)
        torch.testing.assert_close(a.float(), e.float(), rtol=tol, atol=tol)


def _eager(path, args):
    tree = ast.parse(path.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
    namespace = {"DataType": type("DataType", (), EagerDefinition.DTYPES)}
    exec(compile(ast.Module([fn], []), str(path), "exec"), namespace)  # our own test data
    fd = EagerDefinition()
    namespace[fn.name](fd)
    return fd.run(args)


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_matches_torch(name):
    if name == "seed_2146_rmsnorm_bwd":
        pytest.skip("fixed 56x1024x1024 sizes: covered by the slow full-size test")
    parsed = parse_text(small_definition((CORPUS / f"{name}.py").read_text(), name))
    args = _inputs(parsed)
    _close(run_reference(parsed.fusion, args), CASES[name](*args))


@pytest.mark.parametrize("name", ["many_pointwise_chain", "many_segments_stress"])
def test_generated_cases_match_eager_torch(name):
    path = CORPUS / f"{name}.py"
    parsed = parse_text(path.read_text())
    args = _inputs(parsed)
    expected = [t.float() for t in _eager(path, [a.float() if a.dtype == torch.bfloat16 else a
                                                 for a in args])]
    for a, e in zip(run_reference(parsed.fusion, args), expected, strict=True):
        torch.testing.assert_close(a.float(), e.to(a.dtype).float(), rtol=3e-2, atol=3e-2)


@pytest.mark.slow
def test_seed_2146_full_size():
    parsed = parse_text((CORPUS / "seed_2146_rmsnorm_bwd.py").read_text())
    args = _inputs(parsed)
    assert tuple(args[3].shape) == (56, 1024, 1024)
    _close(run_reference(parsed.fusion, args), CASES["seed_2146_rmsnorm_bwd"](*args))


def test_inputs_are_validated_before_anything_runs():
    parsed = parse_text((CORPUS / "softmax_fwd.py").read_text())
    with pytest.raises(Exception, match="expected dtype bfloat16, got float32"):
        run_reference(parsed.fusion, [torch.randn(4, 8)])


def test_aliased_output_updates_its_input():
    text = ("from nvfuser import FusionDefinition, DataType\ndef f(fd):\n"
            "    T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)\n"
            "    T1 = fd.ops.add(T0, 1.0)\n    fd.add_output(T1, T0)\n")
    fusion = parse_text(text).fusion
    x = torch.zeros(4)
    (out,) = run_reference(fusion, [x])
    assert torch.equal(x, torch.ones(4)) and torch.equal(out, torch.ones(4))


def test_meta_of_real_tensors():
    t = torch.randn(4, 1).expand(4, 6)
    meta = meta_of(t)
    assert meta.shape == (4, 6) and meta.strides == (1, 0) and meta.stored_numel == 4


@pytest.mark.parametrize("op", ["exp", "sin", "log", "sqrt", "tanh", "sigmoid", "reciprocal",
                                "abs"])
def test_complex_math_keeps_its_type_without_a_cast_warning(op):
    # issue 32: the only test warning from fusecut itself was the reference casting complex
    # results to real (the float ops typed their complex result float32, dropping the imaginary
    # part); abs is real, as torch's and nvFuser's
    import warnings

    text = (f"def f(fd):\n    T0 = fd.define_tensor(shape=[-1], contiguity=[True], "
            f"dtype=DataType.ComplexFloat)\n    T1 = fd.ops.{op}(T0)\n    fd.add_output(T1)\n")
    fusion = parse_text(text).fusion
    x = torch.randn(6, dtype=torch.complex64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (out,) = run_reference(fusion, [x])
    want = getattr(torch, op)(x)
    assert out.dtype == want.dtype
    torch.testing.assert_close(out, want)


def test_a_fill_value_beyond_its_dtype_is_cast_not_an_error():
    # issue 32 defect 6: full(1e300, Half) raised torch's overflow RuntimeError when run (a 500)
    text = ("def f(fd):\n    S0 = fd.define_scalar(1e300, dtype=DataType.Double)\n"
            "    T1 = fd.ops.full([2], S0, dtype=DataType.Half)\n    fd.add_output(T1)\n")
    (out,) = run_reference(parse_text(text).fusion, [])
    assert out.dtype == torch.float16 and torch.isinf(out).all()


def test_a_complex_to_real_cast_keeps_the_real_part_without_a_warning():
    # issue 32: tests/service/test_dtypes.py's complex64 passthrough cast warned from the
    # reference ("Casting complex values to real discards the imaginary part")
    import warnings

    text = ("def f(fd):\n    T0 = fd.define_tensor(shape=[-1], contiguity=[True], "
            "dtype=DataType.ComplexFloat)\n    T1 = fd.ops.cast(T0, dtype=DataType.Double)\n"
            "    fd.add_output(T1)\n")
    x = torch.tensor([1 + 2j, -3.5 - 1j], dtype=torch.complex64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (out,) = run_reference(parse_text(text).fusion, [x])
    assert out.dtype == torch.float64 and out.tolist() == [1.0, -3.5]
