"""GEMM epilogues (GPU): what fusing nanoGPT's tanh-GELU into its MLP matmuls through cuBLASLt
would save, against the matmul and a separate pass, at the training step's shapes.

Forward: ``h = x w_fc^T + b`` and ``g = gelu_tanh(h)`` (h kept for the backward) as one cuBLASLt
call with GELU_AUX_BIAS. Backward: ``gh = gelu_tanh'(h) * (gy w_proj)`` as one call with DGELU
(and with DGELU_BGRAD, which also sums the bias gradient). torch exposes neither auxiliary
output, so cuBLASLt is called directly (ctypes; enum values from cublasLt.h, CUDA 12-13).
Kernel times from torch.profiler; each fused result is checked against the unfused one.

    python -m benchmarks.epilogues [--tokens 16384] [--width 2048] [--hidden 8192]
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F

from benchmarks.common import markdown_table, write_result

# cublasLt.h
DESC_TRANSA, DESC_TRANSB, DESC_EPILOGUE, DESC_BIAS_POINTER = 3, 4, 7, 8
DESC_AUX_POINTER, DESC_AUX_LD = 11, 12
EPILOGUE = {"GELU_AUX_BIAS": 164, "DGELU": 192, "DGELU_BGRAD": 208}
PREF_MAX_WORKSPACE_BYTES = 1
CUDA_R_16BF, CUDA_R_32F, COMPUTE_32F = 14, 0, 68
OP_N, OP_T = 0, 1


class CublasLt:
    """One handle and workspace; ``matmul`` plans a column-major ``D = op(A) op(B)`` with an
    epilogue and returns a function that runs it on the current stream."""

    def __init__(self):
        lib = glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "cu*",
                                     "lib", "libcublasLt.so.*"))
        self.lt = ctypes.CDLL(lib[0] if lib else "libcublasLt.so")
        self.handle = ctypes.c_void_p()
        self.check(self.lt.cublasLtCreate(ctypes.byref(self.handle)), "cublasLtCreate")
        self.workspace = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")

    @staticmethod
    def check(status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what} failed: cublasStatus {status}")

    def layout(self, rows: int, cols: int, ld: int) -> ctypes.c_void_p:
        out = ctypes.c_void_p()
        self.check(self.lt.cublasLtMatrixLayoutCreate(
            ctypes.byref(out), CUDA_R_16BF, ctypes.c_uint64(rows), ctypes.c_uint64(cols),
            ctypes.c_int64(ld)), "cublasLtMatrixLayoutCreate")
        return out

    def set(self, desc, attr: int, value) -> None:
        self.check(self.lt.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(value),
                                                          ctypes.sizeof(value)), f"attr {attr}")

    def matmul(self, a: torch.Tensor, trans_a: int, a_shape: tuple[int, int], b: torch.Tensor,
               trans_b: int, b_shape: tuple[int, int], d: torch.Tensor, d_shape: tuple[int, int],
               epilogue: str, bias: torch.Tensor | None = None,
               aux: torch.Tensor | None = None) -> Callable[[], None]:
        """Shapes are column-major (rows, cols), each leading dimension its rows."""
        desc = ctypes.c_void_p()
        self.check(self.lt.cublasLtMatmulDescCreate(ctypes.byref(desc), COMPUTE_32F, CUDA_R_32F),
                   "cublasLtMatmulDescCreate")
        self.set(desc, DESC_TRANSA, ctypes.c_int32(trans_a))
        self.set(desc, DESC_TRANSB, ctypes.c_int32(trans_b))
        self.set(desc, DESC_EPILOGUE, ctypes.c_uint32(EPILOGUE[epilogue]))
        if bias is not None:
            self.set(desc, DESC_BIAS_POINTER, ctypes.c_void_p(bias.data_ptr()))
        if aux is not None:
            self.set(desc, DESC_AUX_POINTER, ctypes.c_void_p(aux.data_ptr()))
            self.set(desc, DESC_AUX_LD, ctypes.c_int64(d_shape[0]))
        la, lb, ld = (self.layout(*s, s[0]) for s in (a_shape, b_shape, d_shape))
        pref = ctypes.c_void_p()
        self.check(self.lt.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "preference")
        size = ctypes.c_uint64(self.workspace.numel())
        self.check(self.lt.cublasLtMatmulPreferenceSetAttribute(
            pref, PREF_MAX_WORKSPACE_BYTES, ctypes.byref(size), 8), "workspace size")
        algo = (ctypes.c_uint8 * 96)()  # cublasLtMatmulHeuristicResult_t
        found = ctypes.c_int(0)
        self.check(self.lt.cublasLtMatmulAlgoGetHeuristic(
            self.handle, desc, la, lb, ld, ld, pref, 1, ctypes.byref(algo), ctypes.byref(found)),
            "heuristic")
        if found.value != 1:
            raise RuntimeError(f"cuBLASLt has no algorithm for {epilogue} at {d_shape}")
        alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)

        def run() -> None:
            out = ctypes.c_void_p(d.data_ptr())
            self.check(self.lt.cublasLtMatmul(
                self.handle, desc, ctypes.byref(alpha), ctypes.c_void_p(a.data_ptr()), la,
                ctypes.c_void_p(b.data_ptr()), lb, ctypes.byref(beta), out, ld, out, ld,
                ctypes.byref(algo), ctypes.c_void_p(self.workspace.data_ptr()),
                ctypes.c_size_t(self.workspace.numel()),
                ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)), "cublasLtMatmul")
        return run


def kernel_ms(fn: Callable[[], object], calls: int = 20) -> tuple[float, str]:
    """Device time of one call (torch.profiler), and its kernels."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    per_call = [(e.key[:48], e.self_device_time_total / calls / 1e3) for e in events]
    return sum(ms for _, ms in per_call), "; ".join(f"{k} {ms:.3f}" for k, ms in per_call)


def max_error(got: torch.Tensor, want: torch.Tensor) -> str:
    diff = (got.float() - want.float()).abs().max().item()
    return f"{diff:.3g} (of {want.abs().max().item():.3g})"


def measure(tokens: int, width: int, hidden: int) -> list[list[str]]:
    torch.manual_seed(0)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    x, gy = torch.randn(tokens, width, **bf), torch.randn(tokens, width, **bf)
    w_fc, w_proj = torch.randn(hidden, width, **bf) * 0.02, torch.randn(width, hidden, **bf) * 0.02
    b_fc = torch.randn(hidden, **bf) * 0.1
    lt = CublasLt()
    h_ref = F.linear(x, w_fc, b_fc)
    g_ref = F.gelu(h_ref, approximate="tanh")
    gg_ref = gy @ w_proj
    gh_ref = torch.ops.aten.gelu_backward(gg_ref, h_ref, approximate="tanh")
    db_ref = gh_ref.sum(0)
    g, h, gh = (torch.empty(tokens, hidden, **bf) for _ in range(3))
    db = torch.empty(hidden, **bf)
    # row-major [tokens, n] is column-major (n, tokens)
    forward = lt.matmul(w_fc, OP_T, (width, hidden), x, OP_N, (width, tokens), g,
                        (hidden, tokens), "GELU_AUX_BIAS", bias=b_fc, aux=h)
    dgelu = lt.matmul(w_proj, OP_N, (hidden, width), gy, OP_N, (width, tokens), gh,
                      (hidden, tokens), "DGELU", aux=h_ref)
    dgelu_bgrad = lt.matmul(w_proj, OP_N, (hidden, width), gy, OP_N, (width, tokens), gh,
                            (hidden, tokens), "DGELU_BGRAD", bias=db, aux=h_ref)
    rows = []

    def row(step: str, system: str, fn, error: str) -> None:
        ms, kernels = kernel_ms(fn)
        rows.append([step, system, f"{ms:.3f}", error, kernels])

    row("forward", "linear with bias, then GELU", lambda: F.gelu(F.linear(x, w_fc, b_fc),
                                                                 approximate="tanh"), "-")
    forward()
    row("forward", "cuBLASLt GELU_AUX_BIAS", forward,
        f"g {max_error(g, g_ref)}, h {max_error(h, h_ref)}")
    row("backward", "matmul, GELU backward, bias sum",
        lambda: torch.ops.aten.gelu_backward(gy @ w_proj, h_ref, approximate="tanh").sum(0), "-")
    dgelu()
    row("backward", "cuBLASLt DGELU, then bias sum", lambda: (dgelu(), gh.sum(0)),
        f"gh {max_error(gh, gh_ref)}")
    dgelu_bgrad()
    row("backward", "cuBLASLt DGELU_BGRAD", dgelu_bgrad,
        f"gh {max_error(gh, gh_ref)}, bias grad {max_error(db, db_ref)}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--hidden", type=int, default=8192)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.epilogues needs a CUDA GPU")
    rows = measure(args.tokens, args.width, args.hidden)
    table = markdown_table(["step", "system", "kernel ms", "max error (of max value)",
                            "kernels (ms)"], rows)
    notes = (f"nanoGPT's MLP at a training step's shapes: {args.tokens} tokens, width "
             f"{args.width}, hidden {args.hidden}, bf16; tanh GELU. Kernel time per call "
             f"from torch.profiler over 20 calls. PyTorch {torch.__version__}.")
    print(table)
    print(notes)
    print("written to", write_result("epilogues", torch.cuda.get_device_name(),
                                     "GEMM epilogues: nanoGPT's MLP GELU", table, notes))


if __name__ == "__main__":
    main()
