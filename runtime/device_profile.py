"""The device profile of the GPU this process runs on: what a plan made here without a
``device`` option is planned and its kernels tuned for (an H200 holds more loads in flight
than an H100: ``optimizer.profiles``). Without a GPU, or on one without a built-in profile,
plans keep the default profile."""

from __future__ import annotations

import functools
from typing import Any

import torch

from fusecut.optimizer.profiles import profile_of_device


@functools.cache
def _profile_of(index: int) -> str | None:
    return profile_of_device(torch.cuda.get_device_name(index))


def detected_device() -> str | None:
    """The built-in profile of the current GPU ("H200"), or None (no GPU, or none matches)."""
    if not torch.cuda.is_available():
        return None
    try:
        return _profile_of(torch.cuda.current_device())
    except Exception:  # a GPU whose name cannot be read (torch raises RuntimeError or, built
        return None  # without CUDA, AssertionError) plans for the default profile


def with_device(options: dict[str, Any]) -> dict[str, Any]:
    """Plan options with this GPU's profile as ``device`` where the caller named none."""
    if "device" in options:
        return options
    device = detected_device()
    return options if device is None else {**options, "device": device}
