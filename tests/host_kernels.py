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

from fusecut.codegen.kernel import SegmentKernels
from fusecut.codegen.preamble import HEADER, needed
from fusecut.runtime.launcher import compiler

# the CUDA a pointwise kernel's source names, for the host (bf16 as torch rounds it: to nearest
# even, NaN kept quiet)
HOST_CUDA = r"""
#include <algorithm>
#include <cmath>
#include <cstring>
using std::max;
using std::min;
static inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
static inline float __fdividef(float a, float b) { return a / b; }
struct __half { unsigned short x; };  // IEEE half through the compiler's _Float16
static inline float __half2float(__half h) { _Float16 f; std::memcpy(&f, &h.x, 2); return f; }
static inline __half __float2half(float f) {
  _Float16 g = (_Float16)f; __half h; std::memcpy(&h.x, &g, 2); return h;
}
#define __expf(x) std::exp(x)
#define __logf(x) std::log(x)
#include <cstdio>
#include <cstdlib>
// threads that exchange values cannot run one after another: a kernel calling this is not
// host-runnable (it only lets a source whose other kernels do compile)
template <typename T> T __shfl_xor_sync(unsigned, T, int, int = 32) {
  std::fputs("a warp shuffle cannot run on the host\n", stderr); std::abort();
}
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __drcp_rn(double a) { return 1.0 / a; }
static inline unsigned int __umulhi(unsigned int a, unsigned int b) {
  return (unsigned int)(((unsigned long long)a * b) >> 32);
}
static inline float __uint_as_float(unsigned int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline unsigned int __float_as_uint(float f) {
  unsigned int i; std::memcpy(&i, &f, 4); return i;
}
static inline double __longlong_as_double(long long i) {
  double d; std::memcpy(&d, &i, 8); return d;
}
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
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


def _host_source(sk: SegmentKernels, name: str | None):
    """(kernel, C++ source with ``fc_host_run(void** args)``, which runs every thread of every
    block of kernel ``name`` (default: the segment's one kernel) in turn)."""
    assert name is not None or len(sk.kernels) == 1
    kernel = next(k for k in sk.kernels if name in (None, k.name))
    # its code: from its name to the next kernel's declaration
    code = sk.source.split(f" {kernel.name}(", 1)[1].split('extern "C"', 1)[0]
    assert "__shared__" not in code and "__syncthreads" not in code, "threads that cooperate"
    # inline PTX has no host meaning, unless the source gives a host branch beside it
    assert "asm(" not in re.sub(r"#ifdef __CUDA_ARCH__.*?#else", "", sk.source, flags=re.S), \
        "inline PTX"
    calls = re.findall(r"[A-Za-z_]\w*", code)  # the names its code spells
    assert not any("__shfl" in piece.text for piece in needed(calls)) and "__shfl" not in code, \
        "threads of a warp that exchange values"
    assert all(p.kind in ("in", "out", "extent") for p in kernel.params), \
        "tensor parameters and extents only"
    (grid, _, _), (block, _, _) = kernel.grid, kernel.block
    # a tensor from its pointer in ``args``; an extent (codegen's launch argument) by its value
    casts = [re.sub(r"\s*__restrict__", "", p.ctype) for p in kernel.params]
    call = ", ".join(f"({c}){p.value}" if p.kind == "extent" else f"({c})args[{k}]"
                     for k, (p, c) in enumerate(zip(kernel.params, casts)))
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
    return kernel, HOST_CUDA + sk.source.replace(HEADER, "") + driver


def host_runnable(sk: SegmentKernels, name: str) -> bool:
    """Whether kernel ``name`` of the segment can run on the host (see the module's doc)."""
    try:
        _host_source(sk, name)
    except AssertionError:
        return False
    return True


def run_on_host(sk: SegmentKernels, args: dict[str, torch.Tensor], workdir: Path,
                name: str | None = None) -> None:
    """Run the segment's kernel ``name`` (default: its one kernel) over CPU tensors: ``args``
    maps each tensor parameter (an input read or an output written in place) to its tensor."""
    cxx = compiler()
    assert cxx is not None, "no C++ compiler"
    kernel, text = _host_source(sk, name)
    source = workdir / f"{kernel.name}.cpp"
    source.write_text(text)
    lib = workdir / f"{kernel.name}.so"
    subprocess.run([cxx, "-O1", "-shared", "-fPIC", "-std=c++17", "-fno-strict-aliasing", "-w",
                    str(source), "-o", str(lib)], check=True, capture_output=True)
    tensors = [args[p.name] for p in kernel.params if p.kind != "extent"]
    for t in tensors:
        assert t.device.type == "cpu" and t.is_contiguous()
    pointers = (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])
    ctypes.CDLL(str(lib)).fc_host_run(pointers)


def out_of_bounds_on_host(sk: SegmentKernels, nbytes: dict[str, int], workdir: Path,
                          name: str | None = None) -> str:
    """AddressSanitizer's report of kernel ``name`` run on the host over zeroed buffers of
    exactly ``nbytes[param]`` bytes each (16-byte aligned, as CUDA allocations are), or "" when
    every read and write stays inside its tensor. A value a kernel reads but never uses (say,
    for an output's guarded store) escapes any comparison of results: this sees the access."""
    cxx = compiler()
    assert cxx is not None, "no C++ compiler"
    kernel, text = _host_source(sk, name)
    # an extent's slot gets a 16-byte buffer nothing reads: the driver passes its value
    sizes = ", ".join(str(nbytes[p.name]) if p.kind != "extent" else "16"
                      for p in kernel.params)
    text += f"""
#include <cstdlib>
int main() {{
  const unsigned long sizes[] = {{{sizes}}};
  void* args[{len(kernel.params)}];
  for (int k = 0; k < {len(kernel.params)}; ++k)
    args[k] = std::aligned_alloc(16, (sizes[k] + 15) / 16 * 16 ? (sizes[k] + 15) / 16 * 16 : 16);
  for (int k = 0; k < {len(kernel.params)}; ++k) std::memset(args[k], 0, sizes[k]);
  fc_host_run(args);
  for (int k = 0; k < {len(kernel.params)}; ++k) std::free(args[k]);
  return 0;
}}
"""
    source = workdir / f"{kernel.name}_asan.cpp"
    source.write_text(text)
    exe = workdir / f"{kernel.name}_asan"
    subprocess.run([cxx, "-O1", "-g", "-fsanitize=address", "-fno-omit-frame-pointer",
                    "-std=c++17", "-fno-strict-aliasing", "-w", str(source), "-o", str(exe)],
                   check=True, capture_output=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    return "" if run.returncode == 0 else run.stderr[-3000:]
