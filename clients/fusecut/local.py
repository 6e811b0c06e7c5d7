"""In-process execution: what ``fd.execute`` and ``fusecut execute`` run."""

from __future__ import annotations

from typing import Any

from optimizer.ir.fusion import Fusion
from runtime.reference import run_reference


def execute(fusion: Fusion, inputs: list[Any], *, cache: dict | None = None,
            **options: Any) -> list[Any]:
    """Run ``fusion`` on real inputs and return its outputs."""
    if options:
        raise TypeError(f"unknown execute options: {sorted(options)}")
    return run_reference(fusion, list(inputs))
