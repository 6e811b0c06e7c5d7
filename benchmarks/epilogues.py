"""GEMM epilogues (GPU): what fusing nanoGPT's tanh-GELU into its MLP matmuls through cuBLASLt
saves, against the matmul and a separate pass, at the training step's shapes; and two more
candidates: the bias gradient in the weight-gradient GEMM (BGRADB) and the residual add read as
the GEMM's C.

Forward: ``h = x w_fc^T + b`` and ``g = gelu_tanh(h)`` (h kept for the backward) as one cuBLASLt
call with GELU_AUX_BIAS. Backward: ``gh = gelu_tanh'(h) * (gy w_proj)`` as one call with DGELU
(and with DGELU_BGRAD, which also sums the bias gradient). torch exposes neither auxiliary
output, so cuBLASLt is called directly (ctypes; enum values from cublasLt.h, CUDA 12-13).
Kernel times from torch.profiler; each fused result is checked against the unfused one.

    python -m benchmarks.epilogues [--tokens 16384] [--width 2048] [--hidden 8192]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F

from benchmarks.common import markdown_table, write_result
from fusecut.thunder.cublaslt import OP_N, OP_T, WORKSPACE_BYTES, cublaslt
from fusecut.thunder.fused_gemm import linear_gelu_tanh, linear_residual, matmul_dgelu_tanh


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
    lt = cublaslt()
    h_ref = F.linear(x, w_fc, b_fc)
    g_ref = F.gelu(h_ref, approximate="tanh")
    gg_ref = gy @ w_proj
    gh_ref = torch.ops.aten.gelu_backward(gg_ref, h_ref, approximate="tanh")
    db_ref = gh_ref.sum(0)
    gh = torch.empty(tokens, hidden, **bf)
    db = torch.empty(hidden, **bf)
    # row-major [tokens, n] is column-major (n, tokens)
    bgrad = lt.plan(torch.bfloat16, OP_N, (hidden, width), OP_N, (width, tokens),
                    (hidden, tokens), "DGELU_BGRAD", WORKSPACE_BYTES)

    def dgelu_bgrad():
        lt.run(bgrad, w_proj, gy, gh, bias=db, aux=h_ref)

    rows = []

    def row(step: str, system: str, fn, error: str) -> None:
        ms, kernels = kernel_ms(fn)
        rows.append([step, system, f"{ms:.3f}", error, kernels])

    row("forward", "linear with bias, then GELU", lambda: F.gelu(F.linear(x, w_fc, b_fc),
                                                                 approximate="tanh"), "-")
    g, h = linear_gelu_tanh(x, w_fc, b_fc)
    row("forward", "cuBLASLt GELU_AUX_BIAS", lambda: linear_gelu_tanh(x, w_fc, b_fc),
        f"g {max_error(g, g_ref)}, h {max_error(h, h_ref)}")
    row("backward", "matmul, GELU backward, bias sum",
        lambda: torch.ops.aten.gelu_backward(gy @ w_proj, h_ref, approximate="tanh").sum(0), "-")
    row("backward", "cuBLASLt DGELU, then bias sum",
        lambda: matmul_dgelu_tanh(gy, w_proj, h_ref).sum(0),
        f"gh {max_error(matmul_dgelu_tanh(gy, w_proj, h_ref), gh_ref)}")
    dgelu_bgrad()
    row("backward", "cuBLASLt DGELU_BGRAD", dgelu_bgrad,
        f"gh {max_error(gh, gh_ref)}, bias grad {max_error(db, db_ref)}")
    # c_fc's weight gradient gh^T x with its bias gradient: BGRADB sums gh in the GEMM call.
    # column-major: dW^T (width, hidden) = x^T (width, tokens) @ gh (tokens, hidden)
    dw = torch.empty(hidden, width, **bf)
    wgrad = lt.plan(torch.bfloat16, OP_N, (width, tokens), OP_T, (hidden, tokens),
                    (width, hidden), "BGRADB", WORKSPACE_BYTES)
    row("backward", "weight gradient matmul, then bias sum",
        lambda: (gh_ref.t() @ x, gh_ref.sum(0)), "-")
    lt.run(wgrad, x, gh_ref, dw, bias=db)
    row("backward", "cuBLASLt BGRADB", lambda: lt.run(wgrad, x, gh_ref, dw, bias=db),
        f"dW {max_error(dw, gh_ref.t() @ x)}, bias grad {max_error(db, db_ref)}")
    # c_proj with the residual: r + g w_proj^T + b, the residual read as the GEMM's C
    b_proj, residual = torch.randn(width, **bf) * 0.1, torch.randn(tokens, width, **bf)
    summed_ref = residual + F.linear(g_ref, w_proj, b_proj)
    row("forward", "linear with bias, then residual add",
        lambda: residual + F.linear(g_ref, w_proj, b_proj), "-")
    summed = linear_residual(g_ref, w_proj, b_proj, residual)
    row("forward", "cuBLASLt BIAS with C = residual",
        lambda: linear_residual(g_ref, w_proj, b_proj, residual),
        f"out {max_error(summed, summed_ref)}")
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
