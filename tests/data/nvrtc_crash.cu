// A normalization kernel fusecut generated (benchmarks.gpu_fuzz seed 2188, statements NVRTC
// did not need to crash removed): NVRTC 13.0 and 13.5 die on it with a segmentation fault.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

template <typename T, int N>
struct alignas(sizeof(T) * N) fc_vec { T v[N]; };

template <typename T> __device__ __forceinline__ T fc_shfl(T v, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
}

struct fc_add { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; } };

template <typename T> __device__ __forceinline__ T fc_shfl_any(T v, int m) { return fc_shfl(v, m); }

// Reduce over a warp: every lane gets the result.
template <typename T, typename Op>
__device__ __forceinline__ T fc_warp_reduce(T v, Op op) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = op(v, fc_shfl_any(v, m));
  return v;
}

// segment 0: normalization over domain [33, 2, 96]: 33 rows of 192, a warp per row, 1 x 8 elements per thread, 3 stage(s), on chip: T0
typedef int index_t;
extern "C" __global__ void __launch_bounds__(256) fusecut_segment0_normalization(
    const __half* __restrict__ in_T0,
    const float* __restrict__ in_T17,
    __half* __restrict__ out_T20) {
  for (index_t row = (index_t)blockIdx.x * 8 + (threadIdx.x >> 5); row < 33; row += (index_t)gridDim.x * 8) {
    const index_t i0 = row;
    fc_vec<__half, 8> p_T0[1];
    float acc0 = 0.0f;  // T3 = sum(T2, dims=[1, 2])
    for (int k = 0; k < 1; ++k) {
      const index_t c = (k * 32 + (threadIdx.x & 31)) * 8;
      if (c < 192) {
        const index_t c_2 = c % 96;
        const index_t c_1 = c / 96;
        for (int _lane = 0; _lane < 8; ++_lane) {
          p_T0[k].v[_lane] = in_T0[c_1 * 3168 + (c_2 + _lane) * 33 + i0];
          const float T1 = __half2float(p_T0[k].v[_lane]);  // T1 = cast(T0, float32)
        }
      }
    }
    const float T3 = acc0;  // T3 = sum(T2, dims=[1, 2])
    const float T5 = __fdividef(T3, (float)(192.0));  // T5 = div(T3, S4)
    float acc1 = 0.0f;  // T9 = sum(T8, dims=[1, 2])
    for (int k = 0; k < 1; ++k) {
      const index_t c = (k * 32 + (threadIdx.x & 31)) * 8;
      if (c < 192) {
        for (int _lane = 0; _lane < 8; ++_lane) {
          const float T1_1 = __half2float(p_T0[k].v[_lane]);  // T1 = cast(T0, float32)
          const float T7 = (T1_1 - T5);  // T7 = sub(T2, T6)
          const float T8 = (T7 * T7);  // T8 = mul(T7, T7)
        }
      }
    }
    const float T9 = acc1;  // T9 = sum(T8, dims=[1, 2])
    const float T11 = __fdividef(T9, (float)(192.0));  // T11 = div(T9, S10)
    const float T13 = (T11 + (float)(1e-05));  // T13 = add(T11, S12)
    const float T14 = rsqrtf(T13);  // T14 = rsqrt(T13)
    for (int k = 0; k < 1; ++k) {
      const index_t c = (k * 32 + (threadIdx.x & 31)) * 8;
      if (c < 192) {
        const index_t c_2 = c % 96;
        const index_t c_1 = c / 96;
        const fc_vec<float, 8> vec_T17 = *reinterpret_cast<const fc_vec<float, 8>*>(in_T17 + c_2);
        fc_vec<__half, 8> o_T20;
        for (int _lane = 0; _lane < 8; ++_lane) {
          const float T1_2 = __half2float(p_T0[k].v[_lane]);  // T1 = cast(T0, float32)
          const float T7_1 = (T1_2 - T5);  // T7 = sub(T2, T6)
          const float T16 = (T7_1 * T14);  // T16 = mul(T7, T15)
          const float T19 = (T16 * vec_T17.v[_lane]);  // T19 = mul(T16, T18)
          o_T20.v[_lane] = __float2half(T19);
        }
        *reinterpret_cast<fc_vec<__half, 8>*>(out_T20 + i0 * 192 + c_1 * 96 + c_2) = o_T20;
      }
    }
  }
}
