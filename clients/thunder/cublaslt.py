"""cuBLASLt through ctypes: one GEMM with a fused epilogue (bias, tanh GELU with its auxiliary
output, GELU's derivative). torch's API cannot ask for these: it exposes no auxiliary output.

cuBLASLt is column-major. A row-major ``[rows, cols]`` matrix with row stride ``ld`` is the
column-major ``(cols, rows)`` matrix with leading dimension ``ld``, so a row-major product
``out[m, n] = sum_k a[m, k] b[k, n]`` is the column-major ``out^T = b^T a^T``: operand A is ``b``
and operand B is ``a``, and a per-``n`` bias is cuBLASLt's per-row bias.

Enum values are cublasLt.h's (CUDA 12 and 13). A plan (descriptors and the heuristic's
algorithm) is built once per shape and epilogue; a call then sets the bias and auxiliary
pointers and launches on the current torch stream.
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading
from dataclasses import dataclass, field

import torch

DESC_TRANSA, DESC_TRANSB, DESC_EPILOGUE, DESC_BIAS_POINTER = 3, 4, 7, 8
DESC_AUX_POINTER, DESC_AUX_LD = 11, 12
EPILOGUE = {"DEFAULT": 1, "BIAS": 4, "GELU_AUX": 160, "GELU_AUX_BIAS": 164, "DGELU": 192,
            "DGELU_BGRAD": 208, "BGRADA": 256, "BGRADB": 512}
PREF_MAX_WORKSPACE_BYTES = 1
DATA_TYPE = {torch.bfloat16: 14, torch.float16: 2}  # cudaDataType: CUDA_R_16BF, CUDA_R_16F
CUDA_R_32F, COMPUTE_32F = 0, 68
OP_N, OP_T = 0, 1
WORKSPACE_BYTES = 32 << 20
ALIGNMENT = 256  # the heuristic's default assumption about every pointer (cuBLASLt's preference)

_vp, _sz = ctypes.c_void_p, ctypes.c_size_t


class CublasLtError(RuntimeError):
    pass


def _check(status: int, what: str) -> None:
    if status != 0:
        raise CublasLtError(f"{what} failed: cublasStatus {status}")


def _load() -> ctypes.CDLL:
    """The libcublasLt torch itself loaded (its wheel's copy first)."""
    try:
        torch.cuda.current_blas_handle()  # makes torch load its cuBLAS (and cuBLASLt) first
    except (RuntimeError, AssertionError) as e:  # no CUDA (torch raises either)
        raise CublasLtError(f"torch has no cuBLAS here: {e}") from e
    here = os.path.dirname(torch.__file__)
    names = sorted(glob.glob(os.path.join(here, "..", "nvidia", "cu*", "lib", "libcublasLt.so.*"))
                   + glob.glob(os.path.join(here, "..", "nvidia", "cublas", "lib",
                                            "libcublasLt.so.*")))
    for name in names + ["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"]:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.cublasLtMatmul.argtypes = [_vp] * 14 + [_sz, _vp]
        lib.cublasLtMatmulDescSetAttribute.argtypes = [_vp, ctypes.c_int, _vp, _sz]
        return lib
    raise CublasLtError("libcublasLt not found beside torch nor on the loader path")


@dataclass
class MatmulPlan:
    """A cuBLASLt matmul for one GEMM shape and epilogue: descriptors, the heuristic's algorithm,
    and scratch for the pointers a call sets."""

    desc: ctypes.c_void_p
    layouts: tuple[ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    algo: ctypes.Array
    bias: ctypes.c_uint64 = field(default_factory=ctypes.c_uint64)
    aux: ctypes.c_uint64 = field(default_factory=ctypes.c_uint64)
    lock: threading.Lock = field(default_factory=threading.Lock)


class CublasLt:
    """One handle per process; plans and workspaces cached (workspaces per device and stream)."""

    def __init__(self):
        self.lt = _load()
        self.handle = ctypes.c_void_p()
        _check(self.lt.cublasLtCreate(ctypes.byref(self.handle)), "cublasLtCreate")
        self.alpha, self.beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self.accumulate = ctypes.c_float(1.0)  # beta when C is added
        self.plans: dict[tuple, MatmulPlan | None] = {}
        self.workspaces: dict[tuple[int, int], torch.Tensor] = {}
        self.lock = threading.Lock()

    def _set(self, desc, attr: int, value) -> None:
        _check(self.lt.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(value),
                                                      ctypes.sizeof(value)), f"attribute {attr}")

    def _layout(self, dtype: int, rows: int, cols: int, ld: int) -> ctypes.c_void_p:
        out = ctypes.c_void_p()
        _check(self.lt.cublasLtMatrixLayoutCreate(ctypes.byref(out), dtype, ctypes.c_uint64(rows),
                                                  ctypes.c_uint64(cols), ctypes.c_int64(ld)),
               "cublasLtMatrixLayoutCreate")
        return out

    def plan(self, dtype: torch.dtype, trans_a: int, a_shape: tuple[int, int], trans_b: int,
             b_shape: tuple[int, int], d_shape: tuple[int, int], epilogue: str,
             workspace: int) -> MatmulPlan | None:
        """The plan of ``D = op(A) op(B)`` (column-major shapes, each leading dimension its
        rows), or None where the heuristic offers no algorithm (the caller computes it unfused)."""
        # the heuristic's choice is the current device's (cuda.current_device: a C call)
        key = (torch.cuda.current_device(), dtype, trans_a, a_shape, trans_b, b_shape, d_shape,
               epilogue)
        if key in self.plans:  # the host path of every call: no lock
            return self.plans[key]
        with self.lock:
            if key in self.plans:
                return self.plans[key]
            code = DATA_TYPE[dtype]
            desc = ctypes.c_void_p()
            _check(self.lt.cublasLtMatmulDescCreate(ctypes.byref(desc), COMPUTE_32F, CUDA_R_32F),
                   "cublasLtMatmulDescCreate")
            self._set(desc, DESC_TRANSA, ctypes.c_int32(trans_a))
            self._set(desc, DESC_TRANSB, ctypes.c_int32(trans_b))
            self._set(desc, DESC_EPILOGUE, ctypes.c_uint32(EPILOGUE[epilogue]))
            if "AUX" in epilogue or epilogue.startswith("DGELU"):
                self._set(desc, DESC_AUX_LD, ctypes.c_int64(d_shape[0]))
            layouts = tuple(self._layout(code, *s, s[0]) for s in (a_shape, b_shape, d_shape))
            pref = ctypes.c_void_p()
            _check(self.lt.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "preference")
            size = ctypes.c_uint64(workspace)
            _check(self.lt.cublasLtMatmulPreferenceSetAttribute(
                pref, PREF_MAX_WORKSPACE_BYTES, ctypes.byref(size), 8), "workspace size")
            algo = (ctypes.c_uint8 * 96)()  # cublasLtMatmulHeuristicResult_t
            found = ctypes.c_int(0)
            status = self.lt.cublasLtMatmulAlgoGetHeuristic(
                self.handle, desc, layouts[0], layouts[1], layouts[2], layouts[2], pref, 1,
                ctypes.byref(algo), ctypes.byref(found))
            self.lt.cublasLtMatmulPreferenceDestroy(pref)
            plan = MatmulPlan(desc, layouts, algo) if status == 0 and found.value == 1 else None
            self.plans[key] = plan
            return plan

    def workspace(self, device: torch.device, stream: int) -> torch.Tensor:
        key = (device.index, stream)
        workspace = self.workspaces.get(key)
        if workspace is None:
            workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
            self.workspaces[key] = workspace
        return workspace

    def run(self, plan: MatmulPlan, a: torch.Tensor, b: torch.Tensor, d: torch.Tensor,
            bias: torch.Tensor | None = None, aux: torch.Tensor | None = None,
            c: torch.Tensor | None = None) -> None:
        """``d = epilogue(op(a) op(b) + c)`` on the current stream (``c`` laid out as ``d``)."""
        stream = torch._C._cuda_getCurrentRawStream(d.device.index)  # no Stream object
        workspace = self.workspace(d.device, stream)
        with plan.lock:  # the pointers live in the shared descriptor until the launch
            if bias is not None:
                plan.bias.value = bias.data_ptr()
                self._set(plan.desc, DESC_BIAS_POINTER, plan.bias)
            if aux is not None:
                plan.aux.value = aux.data_ptr()
                self._set(plan.desc, DESC_AUX_POINTER, plan.aux)
            out = d.data_ptr()
            beta = self.beta if c is None else self.accumulate
            _check(self.lt.cublasLtMatmul(
                self.handle, plan.desc, ctypes.addressof(self.alpha), a.data_ptr(),
                plan.layouts[0], b.data_ptr(), plan.layouts[1], ctypes.addressof(beta),
                out if c is None else c.data_ptr(), plan.layouts[2], out, plan.layouts[2],
                ctypes.addressof(plan.algo),
                workspace.data_ptr(), workspace.numel(), stream), "cublasLtMatmul")


_instance: CublasLt | None = None
_unavailable: CublasLtError | None = None  # why it could not be created: asked once
_instance_lock = threading.Lock()


def cublaslt() -> CublasLt:
    """The process's cuBLASLt (created on first use). Raises ``CublasLtError`` where it cannot
    be loaded, every time, without trying again."""
    global _instance, _unavailable
    if _instance is not None:  # every call after the first: no lock
        return _instance
    with _instance_lock:
        if _instance is None and _unavailable is None:
            try:
                _instance = CublasLt()
            except CublasLtError as e:
                _unavailable = e
        if _instance is None:
            raise CublasLtError(str(_unavailable))
        return _instance
