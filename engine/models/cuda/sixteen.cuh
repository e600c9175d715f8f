// sixteen.cuh — the CUDA layer kernels' conversions between float32 and
// the 16-bit compute dtypes: to nearest even, as cuda_ops' convert (and
// the CPU's convert.h) rounds; widening is exact. `float` passes through,
// so one template serves a float32 or a 16-bit input or output.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace ddp::cuda {

// x as a T: itself for float, rounded for bfloat16 and float16.
template <typename T>
__device__ inline T narrow(float x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(x);
  else
    return __float2bfloat16_rn(x);
}

// x's float32 value (exact).
__device__ inline float wide(float x) { return x; }
__device__ inline float wide(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline float wide(__half x) { return __half2float(x); }

}  // namespace ddp::cuda
