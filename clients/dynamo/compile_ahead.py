"""Regions planned and compiled the moment AOTAutograd hands their graph over.

A graph's regions run one after another on its first call, and each would plan and compile its
kernels with NVRTC just before its first launch (GPT-2 small on the H200: 7.7 s of codegen
across 115 regions, one at a time). When ``compile_graph`` has cut a graph's regions, each
region's inputs are known as the trace's fake tensors (shapes, strides, dtypes, device): the
region writes its definition for them here, and ``runtime.ahead``'s worker threads plan it and
compile its kernels while the graph starts to run. The first call finds the plan in the
definition's plan cache and the cubins in the compile cache, or waits for the compile in
flight; NVRTC releases the GIL, so the compiles run side by side.

Nothing here decides what runs: a region whose first arguments are laid out otherwise than the
trace says (values other compiled code made) plans for itself, as it would have anyway, and a
translation that fails here is met again by the first call, which reports it and runs on ATen.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from fusecut.dynamo.regions import Region
from fusecut.runtime import ahead
from fusecut.runtime.kernels import device_arch

log = logging.getLogger("fusecut.dynamo")


def traced_args(region: Region) -> list[Any] | None:
    """The region's arguments as the trace gave them (fake tensors, numbers), or None where one
    is not known (a symbolic size: its value comes at run time)."""
    if region.symbolic:
        return None
    args = [n.meta.get("val") for n in region.aten_module.graph.nodes if n.op == "placeholder"]
    if any(not isinstance(a, (torch.Tensor, bool, int, float)) for a in args):
        return None
    return args


def cuda_arch(args: list[Any]) -> str | None:
    """The architecture of the CUDA device the region's tensors are on, or None (not CUDA)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not tensors or tensors[0].device.type != "cuda":
        return None
    return device_arch(tensors[0].device.index or 0)


def compile_region_ahead(region: Region) -> bool:
    """Write ``region``'s definition for its traced arguments (on this thread), then plan it
    and compile its kernels in the background. Whether a job was submitted."""
    args = traced_args(region)
    arch = cuda_arch(args) if args is not None else None
    if arch is None or not ahead.enabled():
        return False
    from fusecut.engine import as_metadata

    try:
        variant = region.variant(args)
    except Exception as e:  # the first call meets it again, and says so
        log.debug("fusecut: region %s not compiled ahead: %s", region.name, e)
        return False
    handle = variant.definition.handle
    metas = as_metadata([args[k] for k in variant.taken])

    def job() -> None:
        ahead.compile_plan(handle.execution_plan(metas), arch)

    ahead.submit(job)
    return True
