"""nvFuser's own test definitions (tests/data/nvfuser_compat) parse, plan and run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fusecut.optimizer.ir import parse_text
from fusecut.optimizer.planner import make_plan
from fusecut.runtime.reference import run_reference
from fusecut.runtime.run import run_plan
from fusecut.runtime.tensors import make_input, meta_of
from tests.sample_inputs import sample_metas

COMPAT = Path(__file__).parents[1] / "data" / "nvfuser_compat"
FILES = sorted(COMPAT.glob("*.py"))


def test_the_compat_set_is_present():
    assert len(FILES) >= 30 and (COMPAT / "LICENSE").exists()


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_nvfuser_definition_parses_plans_and_runs(path):
    fusion = parse_text(path.read_text()).fusion
    metas = sample_metas(fusion)
    plan = make_plan(fusion, metas)
    args = [make_input(m, generator=torch.Generator().manual_seed(0)) for m in metas]
    # the reference may update inputs in place (aliased outputs): give it its own copies
    ref = run_reference(fusion, [a.clone() if isinstance(a, torch.Tensor) and 0 not in a.stride()
                                 else a for a in args])
    got = run_plan(plan, args).outputs
    assert len(got) == len(ref) == len(fusion.outputs)
    for a, b in zip(got, ref, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b, equal_nan=True)


# Where nvFuser's test states the expected output as a torch expression, that expression (copied
# from the test named, at Fuser 81c4b22) applied to the test's inputs, or to small sample inputs
# of the same structure when the values do not matter. name -> (inputs or None, expected outputs).
EXPECTED = {
    # test_python_frontend.py:101  assertEqual(out_tensors[0], in_tensor * 2)
    "nvf_python_frontend_95_fusion_func": (
        lambda: [torch.randn(2, 3)], lambda x: [x * 2]),
    # test_python_frontend.py:1948-1950  prims.broadcast_in_dim(inputs[2], eager_out1.size(), ...)
    "nvf_python_frontend_1932_fusion_func": (
        lambda: [torch.randn(2, 3, 4), torch.randn(2, 1, 4), torch.randn(2, 1, 4)],
        lambda a, b, c: [c.expand(b.expand(a.shape).shape)]),
    # test_python_frontend.py:977-978  exec_nvfuser(fusion_func, [2.0, 3.0]);
    # torch.full([2, 2], 1.0) * 5.0
    "nvf_python_frontend_966_fusion_func": (
        lambda: [2.0, 3.0], lambda s0, s1: [torch.full([2, 2], 1.0) * 5.0]),
    # test_python_frontend.py:433-438  exec_nvfuser(dynamic_reshape, [x, 2, 2]);
    # y.shape == [3, 2, 2] and x.flatten() == y.flatten()
    "nvf_python_frontend_424_dynamic_reshape": (
        lambda: [torch.rand(3, 4), 2, 2], lambda x, d1, d2: [x.reshape(3, 2, 2)]),
    # test_repro.py:413-416  torch.var_mean(inputs[0].type(torch.float32), dim=1, correction=0),
    # each .type(torch.float16)
    "nvf_repro_397_fusion_func": (
        lambda: [torch.randn(2, 1, 2, dtype=torch.float16)],
        lambda x: [t.type(torch.float16) for t in torch.var_mean(x.type(torch.float32), dim=1,
                                                                  correction=0)]),
    # test_repro.py:456-461  t14 = inputs[0].type(torch.float32); t14.sum([0, 1]) twice,
    # t14.sum([2]) (inputs of (16, 128, 768) cut to (4, 8, 16))
    "nvf_repro_435_fusion_func": (
        lambda: [torch.randn(4, 8, 16, dtype=torch.bfloat16)],
        lambda x: [x.type(torch.float32).sum([0, 1])] * 2 + [x.type(torch.float32).sum([2])]),
    # test_repro.py:1756-1757  in_tensor.squeeze([0, 1])[1:2], rtol=0, atol=0
    "nvf_repro_1748_fusion_func": (
        lambda: [torch.randn(1, 1, 2)], lambda x: [x.squeeze([0, 1])[1:2]]),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_nvfuser_definition_gives_the_output_its_test_expects(name):
    fusion = parse_text((COMPAT / f"{name}.py").read_text()).fusion
    make_args, expected = EXPECTED[name]
    args = make_args()
    want = expected(*args)
    ref = run_reference(fusion, list(args))
    got = run_plan(make_plan(fusion, [meta_of(a) for a in args]), list(args)).outputs
    assert len(got) == len(ref) == len(want)
    for a, b, w in zip(got, ref, want, strict=True):
        assert a.shape == b.shape == w.shape and a.dtype == b.dtype == w.dtype
        torch.testing.assert_close(b, w)
        torch.testing.assert_close(a, w)
