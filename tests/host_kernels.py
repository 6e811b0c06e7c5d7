"""Generated pointwise kernels run on the CPU: the source compiled as C++ by the host compiler,
with the CUDA built-ins such a kernel uses defined for the host, and every thread of every block
run in turn. Only kernels without shared memory or barriers (each thread's work stands alone);
enough to check, without a GPU, the values a kernel computes, its vector reads included. Another
kernel of the same source may use them: it is compiled (shared memory as static arrays, barriers
as nothing), never run.
"""

from __future__ import annotations

import ctypes
import re
import subprocess
from pathlib import Path

import torch

from codegen.kernel import SegmentKernels
from codegen.preamble import HEADER
from runtime.launcher import compiler

# the CUDA a pointwise kernel's source names, for the host (bf16 as torch rounds it: to nearest
# even, NaN kept quiet)
HOST_CUDA = r"""
#include <cmath>
#include <cstring>
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
static inline void __syncthreads() {}
struct fc_dim3 { unsigned int x, y, z; };
static fc_dim3 threadIdx, blockIdx, blockDim, gridDim;
struct __nv_bfloat16 { unsigned short x; };
static inline float __bfloat162float(__nv_bfloat16 h) {
  unsigned int u = (unsigned int)h.x << 16; float f; std::memcpy(&f, &u, 4); return f;
}
static inline __nv_bfloat16 __float2bfloat16(float f) {
  unsigned int u; std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {(unsigned short)((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return {(unsigned short)(u >> 16)};
}
"""


def run_on_host(sk: SegmentKernels, args: dict[str, torch.Tensor], workdir: Path,
                name: str | None = None) -> None:
    """Run the segment's kernel ``name`` (default: its one kernel) over CPU tensors: ``args``
    maps each tensor parameter (an input read or an output written in place) to its tensor."""
    cxx = compiler()
    assert cxx is not None, "no C++ compiler"
    assert name is not None or len(sk.kernels) == 1
    kernel = next(k for k in sk.kernels if name in (None, k.name))
    # its code: from its name to the next kernel's declaration
    code = sk.source.split(f" {kernel.name}(", 1)[1].split('extern "C"', 1)[0]
    assert "__shared__" not in code and "__syncthreads" not in code, "threads that cooperate"
    assert all(p.kind in ("in", "out") for p in kernel.params), "tensor parameters only"
    (grid, _, _), (block, _, _) = kernel.grid, kernel.block
    casts = [re.sub(r"\s*__restrict__", "", p.ctype) for p in kernel.params]
    call = ", ".join(f"({c})args[{k}]" for k, c in enumerate(casts))
    driver = f"""
extern "C" void fc_host_run(void** args) {{
  blockDim = {{{block}u, 1u, 1u}}; gridDim = {{{grid}u, 1u, 1u}};
  for (unsigned int b = 0; b < {grid}u; ++b)
    for (unsigned int t = 0; t < {block}u; ++t) {{
      blockIdx = {{b, 0u, 0u}}; threadIdx = {{t, 0u, 0u}};
      {kernel.name}({call});
    }}
}}
"""
    source = workdir / f"{kernel.name}.cpp"
    source.write_text(HOST_CUDA + sk.source.replace(HEADER, "") + driver)
    lib = workdir / f"{kernel.name}.so"
    subprocess.run([cxx, "-O1", "-shared", "-fPIC", "-std=c++17", "-fno-strict-aliasing", "-w",
                    str(source), "-o", str(lib)], check=True, capture_output=True)
    tensors = [args[p.name] for p in kernel.params]
    for t in tensors:
        assert t.device.type == "cpu" and t.is_contiguous()
    pointers = (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])
    ctypes.CDLL(str(lib)).fc_host_run(pointers)
