"""Counter-based random numbers: which Philox4x32-10 words make element i of ``uniform``/``normal``.

One scheme, two implementations that must agree bit for bit: the CUDA helpers generated kernels
call (``codegen.preamble``, pieces ``fc_philox`` and ``fc_random``) and the torch reference
(``runtime.philox``). An element's value depends only on (seed, offset, i), i its row-major linear
index in the op's output shape, never on how a kernel walks the tensor, so a uniform recomputed
in two segments (or by two lanes, or at two vector widths) gives the same numbers.

- Philox4x32-10 (Salmon et al., SC'11; Random123's test vectors hold): key = (seed mod 2**64) as
  (low, high) 32-bit words; counter = (offset low, offset high, block low, block high), offset mod
  2**64. That is curand's layout: block b of offset k is the first draw of
  ``curand_init(seed, subsequence=b, offset=4 * k)``. Different (seed, offset) pairs never share a
  counter, so different offsets are disjoint streams.
- A block gives 4 words w0..w3: 4 values of a 32-bit output (float32, and float16/bfloat16, which
  are made in float32 and rounded), element i using block i // 4; or 2 values of a float64 output,
  element i using block i // 2.
- uniform, 32-bit: u = (w >> 8) * 2**-24, in [0, 1); value = lo + u * (hi - lo) in float32,
  rounded after each operation (lo, hi rounded to float32 first). float64: u = x * 2**-53 with
  x = (w[2k] << 21) | (w[2k+1] >> 11), k = i % 2; value = lo + u * (hi - lo) in float64.
  For [0, 1) the result lies in [0, 1); for other bounds rounding may reach hi.
- normal (Box-Muller, computed in float64 and rounded once to the output type): 32-bit outputs
  take pair p = (i % 4) // 2 of their block, u1 = (w[2p] + 1) * 2**-32 in (0, 1] and
  u2 = w[2p+1] * 2**-32 in [0, 1); float64 outputs take u1 = (x01 + 1) * 2**-53 and
  u2 = x23 * 2**-53 from their block's two 53-bit values. r = sqrt(-2 log u1), t = 2 pi u2;
  even elements get mean + std * r cos t, odd ones mean + std * r sin t.
- An op with neither rng_seed nor rng_offset draws both from torch's generator on every call
  (optimizer.ir.rng makes them per-call scalar inputs, runtime.rng draws them); an op given only
  one of them takes 0 for the other.
"""

from __future__ import annotations

# Philox4x32 multipliers and Weyl key increments (Random123)
PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
PHILOX_ROUNDS = 10
TWO_PI = 6.283185307179586  # the double nearest 2 pi


def values_per_block(wide: bool) -> int:
    """Output elements one Philox block makes: 4 of a 32-bit output, 2 of a float64 one."""
    return 2 if wide else 4


CUDA_PHILOX = f"""\
// Philox4x32-{PHILOX_ROUNDS} (Random123): key = seed, counter = (offset, block), 64 bits each.
struct fc_philox4 {{ unsigned int w[4]; }};
__device__ __forceinline__ fc_philox4 fc_philox(unsigned long long seed,
                                                unsigned long long offset,
                                                unsigned long long block) {{
  unsigned int c0 = (unsigned int)offset, c1 = (unsigned int)(offset >> 32);
  unsigned int c2 = (unsigned int)block, c3 = (unsigned int)(block >> 32);
  unsigned int k0 = (unsigned int)seed, k1 = (unsigned int)(seed >> 32);
#pragma unroll
  for (int r = 0; r < {PHILOX_ROUNDS}; ++r) {{
    if (r) {{ k0 += {PHILOX_W0:#010x}u; k1 += {PHILOX_W1:#010x}u; }}
    const unsigned int hi0 = __umulhi({PHILOX_M0:#010x}u, c0), lo0 = {PHILOX_M0:#010x}u * c0;
    const unsigned int hi1 = __umulhi({PHILOX_M1:#010x}u, c2), lo1 = {PHILOX_M1:#010x}u * c2;
    c0 = hi1 ^ c1 ^ k0; c1 = lo1; c2 = hi0 ^ c3 ^ k1; c3 = lo0;
  }}
  fc_philox4 out;
  out.w[0] = c0; out.w[1] = c1; out.w[2] = c2; out.w[3] = c3;
  return out;
}}
"""

CUDA_RANDOM = f"""\
// Element i = base + lane of uniform/normal from (seed, offset, i): see codegen/rng.py for the
// scheme. Taking i in two parts lets lanes of one vector share a Philox block: where base is a
// known multiple of 4 (a vectorised loop's flat index), (base >> 2) + ((base & 3) + lane) / 4 is
// the same expression for lanes 0..3 and the compiler computes the block once.
// The __f*_rn/__d*_rn intrinsics keep the compiler from contracting into fma: the torch
// reference rounds every operation, and so must we to give the same numbers.
__device__ __forceinline__ fc_philox4 fc_philox_of(unsigned long long seed,
                                                   unsigned long long offset,
                                                   unsigned long long base, unsigned int lane,
                                                   int shift, unsigned int& k) {{
  const unsigned long long mask = (1ULL << shift) - 1, j = (base & mask) + lane;
  k = (unsigned int)(j & mask);  // the element's place in its block (i mod 4 or i mod 2)
  return fc_philox(seed, offset, (base >> shift) + (j >> shift));
}}
__device__ __forceinline__ unsigned long long fc_u53(unsigned int a, unsigned int b) {{
  return ((unsigned long long)a << 21) | (b >> 11);
}}
// uniform, 32-bit: [0, 1) from the top 24 bits of word i % 4 of block i / 4
__device__ __forceinline__ float fc_uniform_f(unsigned long long seed, unsigned long long offset,
                                              unsigned long long base, unsigned int lane,
                                              float lo, float hi) {{
  unsigned int k;
  const fc_philox4 r = fc_philox_of(seed, offset, base, lane, 2, k);
  const float u = (float)(r.w[k] >> 8) * 5.9604644775390625e-08f;  // 2^-24
  return __fadd_rn(lo, __fmul_rn(u, __fsub_rn(hi, lo)));
}}
// uniform, float64: [0, 1) from 53 bits of words 2k, 2k+1 (k = i % 2) of block i / 2
__device__ __forceinline__ double fc_uniform_d(unsigned long long seed, unsigned long long offset,
                                               unsigned long long base, unsigned int lane,
                                               double lo, double hi) {{
  unsigned int k;
  const fc_philox4 r = fc_philox_of(seed, offset, base, lane, 1, k);
  const double u = (double)fc_u53(r.w[2 * k], r.w[2 * k + 1]) * 1.1102230246251565e-16;  // 2^-53
  return __dadd_rn(lo, __dmul_rn(u, __dsub_rn(hi, lo)));
}}
// Box-Muller in double: u1 in (0, 1], u2 in [0, 1); cos for even i, sin for odd i
__device__ __forceinline__ double fc_box_muller(double u1, double u2, bool odd, double mean,
                                                double std) {{
  const double r = sqrt(__dmul_rn(-2.0, log(u1)));
  const double t = __dmul_rn(u2, {TWO_PI!r});
  return __dadd_rn(mean, __dmul_rn(std, __dmul_rn(r, odd ? sin(t) : cos(t))));
}}
// normal, 32-bit: pair (i % 4) / 2 of block i / 4, 32-bit uniforms
__device__ __forceinline__ float fc_normal_f(unsigned long long seed, unsigned long long offset,
                                             unsigned long long base, unsigned int lane,
                                             double mean, double std) {{
  unsigned int k;
  const fc_philox4 r = fc_philox_of(seed, offset, base, lane, 2, k);
  const unsigned int p = k & 2;
  const double u1 = ((double)r.w[p] + 1.0) * 2.3283064365386963e-10;  // 2^-32
  const double u2 = (double)r.w[p + 1] * 2.3283064365386963e-10;
  return (float)fc_box_muller(u1, u2, k & 1, mean, std);
}}
// normal, float64: block i / 2, two 53-bit uniforms
__device__ __forceinline__ double fc_normal_d(unsigned long long seed, unsigned long long offset,
                                              unsigned long long base, unsigned int lane,
                                              double mean, double std) {{
  unsigned int k;
  const fc_philox4 r = fc_philox_of(seed, offset, base, lane, 1, k);
  const double u1 = ((double)fc_u53(r.w[0], r.w[1]) + 1.0) * 1.1102230246251565e-16;
  const double u2 = (double)fc_u53(r.w[2], r.w[3]) * 1.1102230246251565e-16;
  return fc_box_muller(u1, u2, k & 1, mean, std);
}}
"""
