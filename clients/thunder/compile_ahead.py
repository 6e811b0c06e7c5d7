"""Regions planned and compiled while Thunder is still tracing.

Thunder's fusion pass knows every fusecut region of a step seconds before the step runs: the
rest of the pass, the forward-backward split, the post-optimisation transforms and the Python
code generation of the traces come first. For each region whose inputs are CUDA tensors, this
plans it for the metadata its proxies give (shapes and dtypes as traced, row-major strides:
what a region's first call mostly sees) and hands the plan to ``runtime.ahead``. Its worker
threads compile the kernels with NVRTC in the meantime.

The plan goes into the region's own plan cache, under the same key a call with those tensors
looks up, and the cubins go into the compile cache. A call whose arguments differ (a transposed
weight, an offset view) plans and compiles for itself, as it would have anyway.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from thunder.core import devices, dtypes
from thunder.core.proxies import TensorProxy

from fusecut.optimizer.ir.inputs import TensorMeta, tensor_meta
from fusecut.runtime import ahead
from fusecut.runtime.kernels import device_arch
from fusecut.runtime.tensors import from_torch_dtype


def metadata_of(proxies: Sequence[Any]) -> list[TensorMeta] | None:
    """The metadata of row-major tensors like ``proxies`` (torch's strides, size-1 axes
    included), or None where an input is not a tensor of known extents (a number's value is
    only known at run time)."""
    metas = []
    for p in proxies:
        if not isinstance(p, TensorProxy) or not all(type(n) is int for n in p.shape):
            return None
        metas.append(tensor_meta(p.shape, from_torch_dtype(dtypes.to_torch_dtype(p.dtype))))
    return metas


def cuda_arch(proxies: Sequence[Any]) -> str | None:
    """The architecture of the CUDA device the region's tensors are on, or None (not CUDA)."""
    tensors = [p for p in proxies if isinstance(p, TensorProxy)]
    if not tensors or tensors[0].device.devicetype is not devices.DeviceType.CUDA:
        return None
    return device_arch(tensors[0].device.index or 0)


def compile_region_ahead(definition: Any, proxies: Sequence[Any],
                         arch: str | None = None) -> bool:
    """Plan ``definition`` (a region's) for ``proxies`` and compile its kernels in the
    background; ``arch``: the target (default: the proxies' CUDA device; nothing happens off
    CUDA). Whether a job was submitted."""
    arch = arch or cuda_arch(proxies)
    metas = metadata_of(proxies)
    if arch is None or metas is None or not ahead.enabled():
        return False
    handle = definition.handle  # on this thread: the fusion cache's entry is made once

    def job() -> None:
        ahead.compile_plan(handle.execution_plan(metas), arch)

    ahead.submit(job)
    return True
