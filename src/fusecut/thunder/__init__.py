"""fusecut as a Lightning Thunder executor: fusion regions planned and run by fusecut, GEMM
epilogues fused into cuBLASLt calls.

    import thunder
    from fusecut.thunder import fusecut_ex

    jitted = thunder.jit(model, executors=[fusecut_ex])

Importing this package imports neither Thunder nor torch: the names below load on first use, so
that the start-up hook (``named_tensors``) can live here without pulling Thunder in.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_LAZY = {
    "FusecutExecutor": "fusecut.thunder.executor", "RegionReport": "fusecut.thunder.executor",
    "fusecut_ex": "fusecut.thunder.executor", "region_reports": "fusecut.thunder.executor",
}

if TYPE_CHECKING:
    from fusecut.thunder.executor import FusecutExecutor, RegionReport, fusecut_ex, region_reports

__all__ = ["FusecutExecutor", "RegionReport", "fusecut_ex", "region_reports"]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fusecut.thunder' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
