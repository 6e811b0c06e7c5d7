"""Which segment runner executes a plan for a given set of arguments."""

from __future__ import annotations

from typing import Any

import torch

from runtime.executor import SegmentRunner, reference_runner


def runner_for(args: list[Any]) -> tuple[SegmentRunner, str]:
    """Generated kernels when the tensors are on a GPU; the torch reference otherwise."""
    on_gpu = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    if on_gpu:
        try:
            from runtime.kernels import cuda_runner
        except ImportError:
            return reference_runner, "reference"
        return cuda_runner, "cuda"
    return reference_runner, "reference"
