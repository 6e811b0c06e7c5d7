"""Generated kernels: their source, parameters and launch configuration, and the reduction
machinery (accumulator types, identities, warp and block reductions) they share."""

from __future__ import annotations

from dataclasses import dataclass, field

from codegen import cuda
from optimizer.analysis.shapes import Bound
from optimizer.ir.dtypes import DType
from optimizer.ir.fusion import Op


@dataclass(frozen=True)
class Param:
    kind: str  # "in" (a tensor read), "out" (a tensor written), "ws" (workspace), "scalar"
    name: str  # tensor, workspace or scalar name
    ctype: str


@dataclass
class Kernel:
    name: str
    params: list[Param]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int = 0


@dataclass
class Workspace:
    name: str
    nbytes: int


@dataclass
class SegmentKernels:
    """Everything the runtime needs to run one segment: one CUDA source, its kernels in launch
    order, scratch buffers, and which tensors must be 16-byte-vector aligned."""

    segment: int
    kind: str
    source: str
    kernels: list[Kernel]
    workspaces: list[Workspace] = field(default_factory=list)
    vector_aligned: dict[str, int] = field(default_factory=dict)  # tensor -> alignment bytes
    notes: dict[str, object] = field(default_factory=dict)


REDUCE_PREAMBLE = r"""
struct fc_add { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; } };
struct fc_mul { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a * b; } };
struct fc_maxop {
  __device__ __forceinline__ float operator()(float a, float b) const { return fc_max(a, b); }
  __device__ __forceinline__ double operator()(double a, double b) const { return fc_max(a, b); }
  template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a > b ? a : b; }
};
struct fc_minop {
  __device__ __forceinline__ float operator()(float a, float b) const { return fc_min(a, b); }
  __device__ __forceinline__ double operator()(double a, double b) const { return fc_min(a, b); }
  template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a < b ? a : b; }
};
struct fc_welfordop {
  template <typename W> __device__ __forceinline__ W operator()(W a, W b) const { return fc_welford_combine(a, b); }
};
template <typename T> __device__ __forceinline__ T fc_shfl_any(T v, int m) { return fc_shfl(v, m); }
__device__ __forceinline__ fc_welford_f fc_shfl_any(fc_welford_f v, int m) { return fc_shfl_welford(v, m); }
__device__ __forceinline__ fc_welford_d fc_shfl_any(fc_welford_d v, int m) { return fc_shfl_welford(v, m); }

// Reduce over a warp: every lane gets the result.
template <typename T, typename Op>
__device__ __forceinline__ T fc_warp_reduce(T v, Op op) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = op(v, fc_shfl_any(v, m));
  return v;
}

// Reduce over a 1-D block: every thread gets the result. smem holds 33 values of T.
template <typename T, typename Op>
__device__ __forceinline__ T fc_block_reduce(T v, Op op, T identity, T* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  v = fc_warp_reduce(v, op);
  if (warps == 1) return v;
  __syncthreads();  // the previous reduction's readers are done with smem
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T w = lane < warps ? smem[lane] : identity;
    w = fc_warp_reduce(w, op);
    if (lane == 0) smem[32] = w;
  }
  __syncthreads();
  return smem[32];
}

// Reduce N values of one type and operation over a 1-D block in one pass (one set of barriers
// for several reductions of a stage). smem holds 33 * N values of T.
template <int N, typename T, typename Op>
__device__ __forceinline__ void fc_block_reduce_n(T (&v)[N], Op op, T identity, T* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = fc_warp_reduce(v[i], op);
  if (warps == 1) return;
  __syncthreads();
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) smem[i * 33 + warp] = v[i];
  }
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      T w = lane < warps ? smem[i * 33 + lane] : identity;
      w = fc_warp_reduce(w, op);
      if (lane == 0) smem[i * 33 + 32] = w;
    }
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = smem[i * 33 + 32];
}
"""  # noqa: E501


@dataclass
class Reducer:
    """How one reduction op accumulates: accumulator type, identity, combine functor, and the
    values of its outputs from a finished accumulator."""

    op_index: int
    op: Op
    source: str  # the reduced tensor
    acc_type: str
    identity: str
    functor: str
    welford: bool
    value_dtype: DType  # the type values are accumulated in

    def add(self, acc: str, x: str) -> str:
        if self.welford:
            return f"fc_welford_add({acc}, {x});"
        return f"{acc} = {self.functor}({acc}, {x});"

    def results(self, bound: Bound, acc: str) -> list[tuple[str, str]]:
        """(output tensor, C expression of its compute type) from a finished accumulator."""
        fusion = bound.fusion
        outs = []
        for k, name in enumerate(self.op.outputs):
            d = fusion.tensors[name].dtype
            if self.welford:  # torch: divisor max(n - correction, 0); empty -> nan
                nan = cuda.literal(float("nan"), self.value_dtype)
                zero = cuda.literal(0, self.value_dtype)
                if k == 0:
                    corr = cuda.literal(self.op.attrs["correction"], self.value_dtype)
                    raw = f"(fc_welford_m2({acc}) / fc_max({acc}.n - {corr}, {zero}))"
                else:
                    raw = f"({acc}.n == {zero} ? {nan} : fc_welford_mean({acc}))"
                expr = cuda.convert(raw, self.value_dtype, d)
            else:
                expr = cuda.convert(acc, self.value_dtype, d)
            outs.append((name, expr))
        return outs


def reducer(bound: Bound, op_index: int) -> Reducer:
    fusion = bound.fusion
    op = fusion.ops[op_index]
    src = op.inputs[0]
    src_dtype = fusion.tensors[src].dtype
    out_dtype = fusion.tensors[op.outputs[0]].dtype
    if op.name in ("var", "var_mean"):
        vt = DType.float64 if src_dtype is DType.float64 else DType.float32
        acc = "fc_welford_d" if vt is DType.float64 else "fc_welford_f"
        zeros = "0, 0, 0" if vt is DType.float64 else "0, 0, 0, 0"
        return Reducer(op_index, op, src, acc, f"{acc}{{{zeros}}}", "fc_welfordop()", True, vt)
    if op.name in ("sum", "prod"):
        if out_dtype.is_float:
            vt = DType.float64 if DType.float64 in (out_dtype, src_dtype) else DType.float32
        else:
            vt = DType.int64
    else:
        vt = src_dtype.compute if src_dtype.is_float else src_dtype
    ct = cuda.compute(vt)
    if op.name == "sum":
        identity, functor = cuda.literal(0, vt), "fc_add()"
    elif op.name == "prod":
        identity, functor = cuda.literal(1, vt), "fc_mul()"
    elif op.name == "max":
        identity = cuda.literal(float("-inf"), vt) if vt.is_float else \
            ("(-9223372036854775807LL - 1)" if vt is DType.int64 else "(-2147483647 - 1)")
        if vt.is_bool:
            identity = "false"
        functor = "fc_maxop()"
    else:
        identity = cuda.literal(float("inf"), vt) if vt.is_float else \
            ("9223372036854775807LL" if vt is DType.int64 else "2147483647")
        if vt.is_bool:
            identity = "true"
        functor = "fc_minop()"
    return Reducer(op_index, op, src, ct, identity, functor, False, vt)


def assemble(body: list[str]) -> str:
    return cuda.PREAMBLE + REDUCE_PREAMBLE + "\n" + "\n".join(body) + "\n"


def indent(lines: list[str], n: int) -> list[str]:
    pad = " " * n
    return [pad + line if line else line for line in lines]


def signature(name: str, params: list[Param], threads: int, min_blocks: int = 0) -> str:
    """The kernel's declaration; ``min_blocks`` (blocks per SM the registers must allow) lets
    ptxas use up to its share of the register file instead of its own smaller default."""
    args = ",\n    ".join(f"{p.ctype} {_param_name(p)}" for p in params)
    bounds = f"{threads}, {min_blocks}" if min_blocks else f"{threads}"
    return (f'extern "C" __global__ void __launch_bounds__({bounds}) {name}(\n    {args})')


def _param_name(p: Param) -> str:
    return {"in": f"in_{p.name}", "out": f"out_{p.name}", "ws": f"ws_{p.name}",
            "scalar": f"s_{p.name}"}[p.kind]


def tensor_params(bound: Bound, inputs, outputs, scalars) -> list[Param]:
    fusion = bound.fusion
    params = [Param("in", t, f"const {cuda.storage(fusion.tensors[t].dtype)}* __restrict__")
              for t in inputs]
    params += [Param("out", t, f"{cuda.storage(fusion.tensors[t].dtype)}* __restrict__")
               for t in outputs]
    params += [Param("scalar", s, _scalar_ctype(fusion.scalars[s].dtype)) for s in scalars]
    return params


def _scalar_ctype(d: DType) -> str:
    return "double" if d.is_float else ("bool" if d.is_bool else "long long")
