"""Min-cut refinement keeps a plan whose every segment schedules (found through the
torch.compile backend: a Llama backward region's rotary-embedding slices)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fusecut.engine import default_engine
from fusecut.optimizer.ir.nvtext import parse_text
from fusecut.runtime.reference import run_reference

TEXT = (Path(__file__).parent.parent / "data" / "llama_rotary_backward.py").read_text()


def _arguments() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(2, 2, 16, 16), torch.randn(2, 16, 2, 16).permute(0, 2, 1, 3),
            torch.randn(1, 16, 16), torch.randn(2, 16, 4, 16).permute(0, 2, 1, 3)]


@pytest.mark.parametrize("segmenter", ["mincut", "cpsat"])
def test_a_refinement_that_leaves_a_segment_unscheduled_is_not_kept(segmenter):
    # the refined plan asked one segment to write [2, 2, 16, 16] and [2, 4, 16, 8]: planning
    # failed with an AssertionError, and the region ran on ATen
    fusion = parse_text(TEXT).fusion
    args = _arguments()
    handle = default_engine().fusion(fusion)
    plan = handle.plan(args, segmenter=segmenter, time_limit_s=5)
    assert len(plan.segments) >= 2
    got = handle.run(args, segmenter=segmenter, time_limit_s=5).outputs
    for a, b in zip(got, run_reference(fusion, args)):
        torch.testing.assert_close(a, b)
