"""nvFuser's own test definitions (tests/data/nvfuser_compat) parse, plan and run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from optimizer.ir import parse_text
from optimizer.planner import make_plan
from runtime.reference import run_reference
from runtime.run import run_plan
from runtime.tensors import make_input
from tests.sample_inputs import sample_metas

COMPAT = Path(__file__).parent / "data" / "nvfuser_compat"
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
