"""The device helpers generated kernels call, as named pieces; a source carries only the pieces its
kernels use.

A piece is needed when a statement of the kernels reads one of its ``triggers`` (the statements
record the helpers and types they spell, as they record the values they read: ``codegen.code``),
and then so are its ``deps``, transitively: the kernels declare what they call, the pieces what
they need. Pieces are emitted in the order of ``PIECES``, which defines everything before its
first use. ``deps`` must list every piece a piece's text needs; a missing one is an NVRTC error,
which the CPU tests catch (each piece is also compiled alone with its dependencies). Templates
that call overloads (``fc_welfordop``, ``fc_warp_reduce`` on a Welford accumulator) resolve them
where they are instantiated, and the accumulator type the kernel names brings its overloads.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fusecut.codegen.rng import CUDA_PHILOX, CUDA_RANDOM

HEADER = """
#include <cuda_fp16.h>
#include <cuda_bf16.h>
"""


@dataclass(frozen=True)
class Piece:
    name: str
    triggers: tuple[str, ...]  # names a kernel's statements read that need this piece
    text: str
    deps: tuple[str, ...] = ()


def _lse_text(suffix: str, t: str, exp: str, fma: str, one: str, zero: str, nan: str) -> str:
    """The online log-sum-exp accumulator ``fc_lse_<suffix>`` over values of type ``t``.

    m: the running maximum; s: the sum of exp(x - m), rescaled when m grows. A value equal to m
    adds 1 without an exp, which also counts -inf values while m is -inf: they become 0 once a
    finite maximum rescales them. An infinite final m means torch's exp(inf - inf) (or an all
    -inf row): the sum reads NaN then (fc_lse_sum). ``fc_lse_add_n`` takes N values at once:
    their maximum first, so the running sum is rescaled at most once and the exps do not wait
    on each other; while m is infinite the sum is never read, so a chunk then only counts.

    Every exp here takes x - m <= 0, so the float accumulator uses ``__expf``: its error,
    (2 + 1.16 |x|) ulp of e^x, is at most 2 ulp of 1 in absolute terms for x <= 0, the same
    bound as ``expf``'s 2 ulp on terms of at most 1, and it costs two instructions instead of
    about eight. The precise exp made the cross-entropy row pass arithmetic-bound (0.65 of the
    copy floor)."""
    a = f"fc_lse_{suffix}"
    return f"""\
struct {a} {{ {t} m, s; }};
__device__ __forceinline__ void fc_lse_add({a}& a, {t} x) {{
  if (x > a.m) {{ a.s = {fma}(a.s, {exp}(a.m - x), {one}); a.m = x; }}
  else if (x != x) {{ a.m = x; a.s = x; }}
  else a.s += x == a.m ? {one} : {exp}(x - a.m);
}}
template <int N> __device__ __forceinline__ void fc_lse_add_n({a}& a, const {t} (&x)[N]) {{
  {t} mx = x[0];
#pragma unroll
  for (int i = 1; i < N; ++i) mx = fc_max(mx, x[i]);
  if (mx != mx) {{ a.m = mx; a.s = mx; return; }}
  if (mx > a.m) {{ a.s *= {exp}(a.m - mx); a.m = mx; }}
  if (isinf(a.m)) {{ a.s += ({t})N; return; }}
  {t} sum = {zero};
#pragma unroll
  for (int i = 0; i < N; ++i) sum += {exp}(x[i] - a.m);
  a.s += sum;
}}
__device__ __forceinline__ {a} fc_lse_combine({a} a, {a} b) {{
  const {t} m = fc_max(a.m, b.m);
  if (isinf(m)) return {a}{{m, a.s + b.s}};
  return {a}{{m, a.s * {exp}(a.m - m) + b.s * {exp}(b.m - m)}};
}}
__device__ __forceinline__ {t} fc_lse_sum(const {a}& a) {{ return isinf(a.m) ? {nan} : a.s; }}
__device__ __forceinline__ {a} fc_shfl_any({a} v, int m) {{
  {a} r; r.m = fc_shfl(v.m, m); r.s = fc_shfl(v.s, m); return r;
}}
"""


PIECES: tuple[Piece, ...] = (
    Piece("int64", ("int64",), "typedef long long int64;\n"),
    Piece("fc_vec", ("fc_vec",), """\
template <typename T, int N>
struct alignas(sizeof(T) * N) fc_vec { T v[N]; };
"""),
    Piece("fc_max", ("fc_max",), """\
__device__ __forceinline__ float fc_max(float a, float b) { return (a > b || a != a) ? a : b; }
__device__ __forceinline__ double fc_max(double a, double b) { return (a > b || a != a) ? a : b; }
"""),
    Piece("fc_min", ("fc_min",), """\
__device__ __forceinline__ float fc_min(float a, float b) { return (a < b || a != a) ? a : b; }
__device__ __forceinline__ double fc_min(double a, double b) { return (a < b || a != a) ? a : b; }
"""),
    Piece("fc_remainder", ("fc_remainder",), """\
__device__ __forceinline__ float fc_remainder(float a, float b) {
  float r = fmodf(a, b);
  return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r;
}
__device__ __forceinline__ double fc_remainder(double a, double b) {
  double r = fmod(a, b);
  return (r != 0.0 && ((r < 0.0) != (b < 0.0))) ? r + b : r;
}
"""),
    # Integer division and remainder are C's, unguarded: a zero divisor gives the GPU's own
    # value, as in torch's CUDA kernels (``a / b``, ``a % b``) and nvFuser's (its div, fmod and
    # remainder), which a zero guard returning 0 did not match (test_integer_division).
    Piece("fc_div", ("fc_div",), """\
template <typename T> __device__ __forceinline__ T fc_div(T a, T b) { return a / b; }
"""),
    Piece("fc_div_rem", ("fc_div_rem",), """\
template <typename T> __device__ __forceinline__ T fc_div_rem(T a, T b) { return a % b; }
"""),
    Piece("fc_remainder_int", ("fc_remainder_int",), """\
template <typename T> __device__ __forceinline__ T fc_remainder_int(T a, T b) {
  T r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
"""),
    Piece("fc_ipow", ("fc_ipow",), """\
template <typename T> __device__ __forceinline__ T fc_ipow(T a, T b) {
  if (b < 0) return (a == 1) ? 1 : ((a == -1) ? ((b & 1) ? -1 : 1) : 0);
  T r = 1;
  while (b) { if (b & 1) r *= a; a *= a; b >>= 1; }
  return r;
}
"""),
    Piece("fc_lshr", ("fc_lshr",), """\
template <typename T> __device__ __forceinline__ T fc_lshr(T a, T b) {
  const int bits = 8 * sizeof(T);
  if (b >= bits) return 0;
  return (T)(((unsigned long long)a & (bits == 64 ? ~0ULL : ((1ULL << bits) - 1))) >> b);
}
"""),
    # 2^x by the special-function unit alone (relative error 2^-22; results below 2^-126 flush
    # to 0). The host stand-in lets the host-run kernel tests run kernels that call it.
    Piece("fc_ex2_approx", ("fc_ex2_approx",), """\
__device__ __forceinline__ float fc_ex2_approx(float x) {
#ifdef __CUDA_ARCH__
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}
"""),
    # tanh for values that reach only 16-bit outputs (codegen.precision): 1 - 2 / (1 + e^2|x|) with
    # the sign of x, and x - x^3/3 below 1/16, where that form cancels: relative error below 1e-5
    # (tests/codegen/test_fast_math.py), and near +-1 an absolute error of a few ulp of 1, as tanhf.
    # GELU's tail 1 + tanh(u) for very negative u needs that: tanh.approx, used before, is off by
    # 2e-7 there, and bf16 GELU outputs below 1e-5 were off by up to 37 ulp (torch and nvFuser: 3.4;
    # so is this). GELU kernels take the same time on H100; a kernel bound by tanh pays its two
    # special-function operations, against tanh.approx's one (many_pointwise_chain, 17 tanh an
    # element: 226 -> 360 us).
    Piece("fc_tanh_fast", ("fc_tanh_fast",), """\
__device__ __forceinline__ float fc_tanh_fast(float x) {
  const float a = fabsf(x);
  const float t = copysignf(1.0f - __fdividef(2.0f, 1.0f + fc_ex2_approx(a * 2.88539008f)), x);
  return a < 0.0625f ? x * fmaf(x * x, -0.333333333f, 1.0f) : t;
}
""", ("fc_ex2_approx",)),
    # erf for values that reach only 16-bit outputs (codegen.precision): within 3 ulp of the true
    # erf on the GPU (tests/codegen/test_fast_math.py), against erff's 2, in about 16 instructions
    # against erff's 24, which bind an exact-GELU kernel (mlp_gelu's: 13.2 -> 10.7 us on H100).
    # Minimax fits: erf(x) = x p(x^2) below 0.75, 1 - 2^q(|x|) from there, |x| clamped at 4 (erf
    # rounds to 1 there). Both are computed and one selected: no branch. A NaN fails the comparison
    # and takes x p(x^2), which keeps it.
    Piece("fc_erf_fast", ("fc_erf_fast",), """\
__device__ __forceinline__ float fc_erf_fast(float x) {
  const float s = x * x;
  float p = 0x1.108d4ep-8f;
  p = fmaf(p, s, -0x1.afe2dep-6f);
  p = fmaf(p, s, 0x1.cdc5b0p-4f);
  p = fmaf(p, s, -0x1.81256ap-2f);
  p = fmaf(p, s, 0x1.20dd74p+0f);
  const float t = fminf(fabsf(x), 4.0f);
  float q = -0x1.0aaac4p-9f;
  q = fmaf(q, t, 0x1.8c1014p-6f);
  q = fmaf(q, t, -0x1.173588p-3f);
  q = fmaf(q, t, -0x1.dd2f5ep-1f);
  q = fmaf(q, t, -0x1.9ee928p+0f);
  q = fmaf(q, t, -0x1.830fe2p-10f);
  const float large = copysignf(1.0f - fc_ex2_approx(q), x);
  const float small = p * x;
  return fabsf(x) >= 0.75f ? large : small;
}
""", ("fc_ex2_approx",)),
    Piece("fc_clampi", ("fc_clampi",), """\
template <typename T> __device__ __forceinline__ T fc_clampi(T i, T hi) {
  return i < 0 ? 0 : (i > hi ? hi : i);
}
"""),
    # ---- 8-bit floats, bit for bit as torch's c10 conversions (torch >= 2.12) ----
    Piece("fc_e4m3", ("fc_f_to_e4m3", "fc_e4m3_to_f"), """\
// float8_e4m3fn, as torch's fp8e4m3fn_from_fp32_value: round to nearest even; NaN stays NaN
// (0x7f); no infinities in the format. Past 448 (and +-inf): torch >= 2.12 saturates to +-448,
// older torch gives NaN (FC_E4M3_OVERFLOW_NAN, defined by fusecut.runtime.compile to match the
// installed torch).
__device__ __forceinline__ unsigned char fc_f_to_e4m3(float f) {
  unsigned int bits = __float_as_uint(f), r;
  const unsigned int sign = bits & 0x80000000u;
  bits ^= sign;
  if (bits >= (1087u << 20)) {  // 480 and beyond, inf, NaN
#ifdef FC_E4M3_OVERFLOW_NAN
    r = 0x7fu;
#else
    r = bits > 0x7f800000u ? 0x7fu : 0x7eu;
#endif
  } else if (bits < (121u << 23)) {  // below 2^-6: subnormal, rounded by a float addition
    r = __float_as_uint(__fadd_rn(__uint_as_float(bits), __uint_as_float(141u << 23))) -
        (141u << 23);
  } else {
    bits += (unsigned int)(7 - 127) * (1u << 23) + 0x7ffffu + ((bits >> 20) & 1u);
    r = (bits >> 20) & 0xffu;
#ifndef FC_E4M3_OVERFLOW_NAN
    if (r == 0x7fu) r = 0x7eu;  // rounding up into the NaN pattern saturates
#endif
  }
  return (unsigned char)(r | (sign >> 24));
}
__device__ __forceinline__ float fc_e4m3_to_f(unsigned char b) {
  const unsigned int sign = (unsigned int)(b & 0x80u) << 24, em = b & 0x7fu;
  if (em == 0x7fu) return __uint_as_float(sign | 0x7fc00000u);
  // subnormal: m 2^-9
  if (em < 8u) return __uint_as_float(sign | __float_as_uint((float)em * 0.001953125f));
  return __uint_as_float(sign | ((em + (120u << 3)) << 20));
}
"""),
    Piece("fc_e5m2", ("fc_f_to_e5m2", "fc_e5m2_to_f"), """\
// float8_e5m2: round to nearest even; past the largest finite 57344 it rounds to +-inf (as IEEE
// and torch's fp8e5m2_from_fp32_value do); NaN stays NaN (0x7f).
__device__ __forceinline__ unsigned char fc_f_to_e5m2(float f) {
  unsigned int bits = __float_as_uint(f), r;
  const unsigned int sign = bits & 0x80000000u;
  bits ^= sign;
  if (bits >= (143u << 23)) {  // 65536 and beyond, inf, NaN
    r = bits > 0x7f800000u ? 0x7fu : 0x7cu;
  } else if (bits < (113u << 23)) {  // below 2^-14: subnormal, rounded by a float addition
    r = __float_as_uint(__fadd_rn(__uint_as_float(bits), __uint_as_float(134u << 23))) -
        (134u << 23);
  } else {
    bits += (unsigned int)(15 - 127) * (1u << 23) + 0xfffffu + ((bits >> 21) & 1u);
    r = (bits >> 21) & 0xffu;
  }
  return (unsigned char)(r | (sign >> 24));
}
__device__ __forceinline__ float fc_e5m2_to_f(unsigned char b) {
  const unsigned int sign = (unsigned int)(b & 0x80u) << 24, em = b & 0x7fu;
  if (em >= 0x7cu) return __uint_as_float(sign | (em == 0x7cu ? 0x7f800000u : 0x7fc00000u));
  // subnormal: m 2^-16
  if (em < 4u) return __uint_as_float(sign | __float_as_uint((float)em * 1.52587890625e-05f));
  return __uint_as_float(sign | ((em + (112u << 2)) << 21));
}
"""),
    Piece("fc_philox", ("fc_philox",), CUDA_PHILOX),
    Piece("fc_random", ("fc_uniform_f", "fc_uniform_d", "fc_normal_f", "fc_normal_d"), CUDA_RANDOM,
          ("fc_philox",)),
    # uniform draws lie in [lo, hi): a value that is hi in the output type (rounding can reach
    # it for bounds other than [0, 1), and for 16-bit outputs) is lo, as torch's uniform_ makes it
    Piece("fc_below_hi", ("fc_below_hi_f", "fc_below_hi_d", "fc_below_hi_h", "fc_below_hi_bf"),
          """\
__device__ __forceinline__ float fc_below_hi_f(float v, float lo, float hi) {
  return v == hi ? lo : v;
}
__device__ __forceinline__ double fc_below_hi_d(double v, double lo, double hi) {
  return v == hi ? lo : v;
}
__device__ __forceinline__ float fc_below_hi_h(float v, float lo, float hi) {
  return __float2half_rn(v) == __float2half_rn(hi) ? lo : v;
}
__device__ __forceinline__ float fc_below_hi_bf(float v, float lo, float hi) {
  return __float2bfloat16_rn(v) == __float2bfloat16_rn(hi) ? lo : v;
}
"""),
    Piece("fc_shfl", ("fc_shfl",), """\
template <typename T> __device__ __forceinline__ T fc_shfl(T v, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
}
"""),
    # ---- Welford accumulators (var, var_mean), with their combine and shuffle overloads ----
    Piece("welford_f", ("fc_welford_f",), """\
// float var/var_mean accumulate shifted data: k is the first value seen, s1 and s2 the sum and
// sum of squares of x - k. No division per element (a rounded reciprocal costs more than the
// bandwidth leaves), and no mean rounded to float until the end: combining re-expresses one
// side's sums around the other's k (k values are samples, so their difference is exact).
struct fc_welford_f { float k, s1, s2, n; };
__device__ __forceinline__ void fc_welford_add(fc_welford_f& w, float x) {
  w.k = w.n == 0.0f ? x : w.k; const float d = x - w.k;
  w.s1 += d; w.s2 = fmaf(d, d, w.s2); w.n += 1.0f;
}
__device__ __forceinline__ float fc_welford_mean(const fc_welford_f& w) { return w.k + w.s1 / w.n; }
__device__ __forceinline__ float fc_welford_m2(const fc_welford_f& w) {
  return fmaxf(w.s2 - w.s1 * (w.s1 / w.n), 0.0f);  // rounding must not make it negative
}
__device__ __forceinline__ fc_welford_f fc_welford_combine(fc_welford_f a, fc_welford_f b) {
  if (b.n == 0.0f) return a;
  if (a.n == 0.0f) return b;
  const float shift = b.k - a.k;  // b's values are (x - b.k) = (x - a.k) - shift
  const float s1 = b.s1 + b.n * shift;
  const float s2 = b.s2 + shift * (2.0f * b.s1 + b.n * shift);
  return fc_welford_f{a.k, a.s1 + s1, a.s2 + s2, a.n + b.n};
}
__device__ __forceinline__ fc_welford_f fc_shfl_any(fc_welford_f v, int m) {
  return fc_welford_f{fc_shfl(v.k, m), fc_shfl(v.s1, m), fc_shfl(v.s2, m), fc_shfl(v.n, m)};
}
""", ("fc_shfl",)),  # noqa: E501
    Piece("welford_d", ("fc_welford_d",), """\
struct fc_welford_d { double mean, m2, n; };
__device__ __forceinline__ void fc_welford_add(fc_welford_d& w, double x) {
  w.n += 1.0; double d = x - w.mean; w.mean += d / w.n; w.m2 += d * (x - w.mean);
}
__device__ __forceinline__ double fc_welford_mean(const fc_welford_d& w) { return w.mean; }
__device__ __forceinline__ double fc_welford_m2(const fc_welford_d& w) { return w.m2; }
__device__ __forceinline__ fc_welford_d fc_welford_combine(fc_welford_d a, fc_welford_d b) {
  if (b.n == 0) return a;
  if (a.n == 0) return b;
  fc_welford_d r; r.n = a.n + b.n;
  double d = b.mean - a.mean;
  r.mean = a.mean + d * (b.n / r.n);
  r.m2 = a.m2 + b.m2 + d * d * (a.n * b.n / r.n);
  return r;
}
__device__ __forceinline__ fc_welford_d fc_shfl_any(fc_welford_d v, int m) {
  fc_welford_d r; r.mean = fc_shfl(v.mean, m); r.m2 = fc_shfl(v.m2, m);
  r.n = fc_shfl(v.n, m); return r;
}
""", ("fc_shfl",)),
    # ---- online log-sum-exp accumulators (a max and the sum of exp(x - max) in one pass) ----
    Piece("lse_f", ("fc_lse_f",), _lse_text("f", "float", "__expf", "fmaf", "1.0f", "0.0f",
                                              "__int_as_float(0x7fc00000)"), ("fc_shfl", "fc_max")),
    Piece("lse_d", ("fc_lse_d",), _lse_text("d", "double", "exp", "fma", "1.0", "0.0",
                                              "__longlong_as_double(0x7ff8000000000000LL)"),
          ("fc_shfl", "fc_max")),
    # ---- combine functors and block reductions ----
    Piece("fc_add", ("fc_add",), """\
struct fc_add { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; } };
"""),  # noqa: E501
    Piece("fc_mul", ("fc_mul",), """\
struct fc_mul { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a * b; } };
"""),  # noqa: E501
    Piece("fc_maxop", ("fc_maxop",), """\
struct fc_maxop {
  __device__ __forceinline__ float operator()(float a, float b) const { return fc_max(a, b); }
  __device__ __forceinline__ double operator()(double a, double b) const { return fc_max(a, b); }
  template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a > b ? a : b; }
};
""", ("fc_max",)),  # noqa: E501
    Piece("fc_minop", ("fc_minop",), """\
struct fc_minop {
  __device__ __forceinline__ float operator()(float a, float b) const { return fc_min(a, b); }
  __device__ __forceinline__ double operator()(double a, double b) const { return fc_min(a, b); }
  template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a < b ? a : b; }
};
""", ("fc_min",)),  # noqa: E501
    Piece("fc_welfordop", ("fc_welfordop",), """\
struct fc_welfordop {
  template <typename W> __device__ __forceinline__ W operator()(W a, W b) const { return fc_welford_combine(a, b); }
};
"""),  # noqa: E501
    Piece("fc_lseop", ("fc_lseop",), """\
struct fc_lseop {
  template <typename A> __device__ __forceinline__ A operator()(A a, A b) const { return fc_lse_combine(a, b); }
};
"""),  # noqa: E501
    Piece("fc_shfl_any", ("fc_shfl_any",), """\
template <typename T> __device__ __forceinline__ T fc_shfl_any(T v, int m) { return fc_shfl(v, m); }
""", ("fc_shfl",)),
    Piece("fc_warp_reduce", ("fc_warp_reduce",), """\
// Reduce over a warp: every lane gets the result.
template <typename T, typename Op>
__device__ __forceinline__ T fc_warp_reduce(T v, Op op) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = op(v, fc_shfl_any(v, m));
  return v;
}
""", ("fc_shfl_any",)),
    Piece("fc_block_reduce", ("fc_block_reduce",), """\
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
""", ("fc_warp_reduce",)),
    Piece("fc_block_reduce_n", ("fc_block_reduce_n",), """\
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
""", ("fc_warp_reduce",)),
    Piece("fc_group_reduce_n", ("fc_group_reduce_n",), """\
// Reduce N values over a group of NT consecutive threads (NT a multiple of 32, at most 1024)
// that meet at named barrier `bar`; every thread gets the results. smem holds 2 * 32 * N
// values: calls alternate halves (`parity`), so one barrier per call suffices (a warp can only
// write a half again after every warp has passed the barrier of the call that used the other).
template <int N, int NT, typename T, typename Op>
__device__ __forceinline__ void fc_group_reduce_n(T (&v)[N], Op op, T identity, T* smem, int bar,
                                                  int parity) {
  constexpr int warps = NT / 32;
  const int lane = threadIdx.x & 31, warp = (threadIdx.x % NT) >> 5;
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = fc_warp_reduce(v[i], op);
  if (warps == 1) return;
  smem += parity * 32 * N;
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) smem[i * 32 + warp] = v[i];
  }
  asm volatile("bar.sync %0, %1;" ::"r"(bar), "n"(NT) : "memory");
#pragma unroll
  for (int i = 0; i < N; ++i)
    v[i] = fc_warp_reduce(lane < warps ? smem[i * 32 + lane] : identity, op);
}
""", ("fc_warp_reduce",)),
)

BY_NAME = {p.name: p for p in PIECES}


def needed(uses: Iterable[str]) -> list[Piece]:
    """The pieces kernels reading ``uses`` (names: the helpers and types among them count)
    need, with their dependencies, in emission order."""
    names = set(uses)
    todo = [p.name for p in PIECES if names.intersection(p.triggers)]
    chosen: set[str] = set()
    while todo:
        name = todo.pop()
        if name not in chosen:
            chosen.add(name)
            todo.extend(BY_NAME[name].deps)
    return [p for p in PIECES if p.name in chosen]


def preamble(uses: Iterable[str]) -> str:
    """The includes and the helpers kernels reading ``uses`` call."""
    pieces = needed(uses)
    return HEADER + "".join("\n" + p.text for p in pieces)


# The inner-outer kernels' copies into shared memory (cp.async, and on sm_90 bulk copies on an
# mbarrier), written at the head of their source.
IO_PREAMBLE = r"""
// ---- inner-outer: prefetch through shared memory, group reductions ------------------------
// Copy BYTES (4, 8 or a multiple of 16) from global to this thread's own shared-memory slot,
// asynchronously; a commit closes a group of copies, wait<N> leaves at most N groups in flight.
template <int BYTES>
__device__ __forceinline__ void fc_cp_async(void* dst, const void* src) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
#if __CUDA_ARCH__ >= 800
  if constexpr (BYTES % 16 == 0) {
#pragma unroll
    for (int i = 0; i < BYTES / 16; ++i)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s + 16 * i),
                   "l"((const char*)src + 16 * i) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(s), "l"(src), "n"(BYTES)
                 : "memory");
  }
#else
  (void)s;
  for (int i = 0; i < BYTES / 4; ++i) ((int*)dst)[i] = ((const int*)src)[i];
#endif
}
__device__ __forceinline__ void fc_cp_async_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void fc_cp_async_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

#if __CUDA_ARCH__ >= 900
// Bulk copies (TMA) into shared memory, completed on an mbarrier; the barrier's phase parity
// says which completion a waiter waits for.
__device__ __forceinline__ unsigned fc_smem_addr(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void fc_mbar_init(unsigned long long* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(fc_smem_addr(bar)), "r"(count)
               : "memory");
}
__device__ __forceinline__ void fc_mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void fc_mbar_expect_tx(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
               ::"r"(fc_smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void fc_mbar_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(fc_smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void fc_mbar_wait(unsigned long long* bar, int parity) {
  asm volatile("{\n .reg .pred p;\n FC_WAIT_%=:\n"
               " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
               " @!p bra FC_WAIT_%=;\n}" ::"r"(fc_smem_addr(bar)), "r"(parity) : "memory");
}
__device__ __forceinline__ void fc_bulk_copy(void* dst, const void* src, unsigned bytes,
                                             unsigned long long* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
               "%2, [%3];" ::"r"(fc_smem_addr(dst)), "l"(src), "r"(bytes),
               "r"(fc_smem_addr(bar)) : "memory");
}
#endif
"""
