"""fusecut as a Lightning Thunder executor: fusion regions planned and run by fusecut, GEMM
epilogues fused into cuBLASLt calls.

    import thunder
    import fusecut.thunder

    # Thunder's default executors with fusecut in nvFuser's place; the transforms decompose
    # nn.MultiheadAttention (which Thunder cannot differentiate) and trace tied weights as one
    jitted = thunder.jit(model, executors=fusecut.thunder.executors(),
                         transforms=fusecut.thunder.transforms())
    for report in fusecut.thunder.region_reports(jitted):
        print(report.summary())

Importing this package imports neither Thunder nor torch: the names below load on first use, so
that the start-up hook (``compat``) can live here without pulling Thunder in.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_LAZY = {
    "CUDAGraphTransform": "fusecut.thunder.cudagraphs",
    "FusecutExecutor": "fusecut.thunder.executor", "RegionReport": "fusecut.thunder.reports",
    "executors": "fusecut.thunder.executor", "fusecut_ex": "fusecut.thunder.executor",
    "region_reports": "fusecut.thunder.reports", "transforms": "fusecut.thunder.executor",
    "TiedParametersTransform": "fusecut.thunder.tied_parameters",
    "MultiheadAttentionTransform": "fusecut.thunder.multihead_attention",
}

if TYPE_CHECKING:
    from fusecut.thunder.cudagraphs import CUDAGraphTransform
    from fusecut.thunder.executor import (
        FusecutExecutor,
        RegionReport,
        executors,
        fusecut_ex,
        region_reports,
        transforms,
    )
    from fusecut.thunder.multihead_attention import MultiheadAttentionTransform
    from fusecut.thunder.tied_parameters import TiedParametersTransform

__all__ = ["CUDAGraphTransform", "FusecutExecutor", "MultiheadAttentionTransform", "RegionReport",
           "TiedParametersTransform", "executors", "fusecut_ex", "region_reports", "transforms"]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fusecut.thunder' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
