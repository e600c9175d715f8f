// tiled_attention.h — fused_attention.h's attention on the tensor cores:
// the same quantities, rounded at the same points (q, k, v and dout as the
// products' inputs, each weight before p v and in backward, ds before its
// two products; scores, softmax and sums in float32), the same layouts and
// the same scratch, computed a 64 x 64 tile at a time with 16-bit wmma
// fragments and float32 accumulators, no [t, t] buffer in memory. For the
// head sizes it is built for, on a GPU with bfloat16 fragments (compute
// capability 8.0 and up); fused_attention.h calls it where it fits and
// runs its warp-per-row kernels elsewhere. Only in builds with
// DDP_WITH_CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include <ddp/plugin.h>

#include "kernels.h"  // GemmInput, LayerOutput

namespace ddp::cuda {

// Throws Error unless q, k and v are all float32 or all `compute` (the
// dtypes attention backward reads its kept inputs in).
void check_attention_inputs(ddp_dtype compute, const GemmInput& q, const GemmInput& k, const GemmInput& v);

// Throws Error unless `out` is float32 or `compute` (forward's out,
// backward's dv).
void check_attention_output(ddp_dtype compute, const LayerOutput& out);

// dh is 16, 32, 64 or 128 and the current device has compute capability
// 8.0 or above. Throws Error if CUDA cannot say.
bool tiled_attention_fits(int64_t dh);

// fused_attention.h's forward and backward, for a head size that fits.
// Throw Error for another dh or dtype, inputs of another dtype than
// float32 or `dtype` (or not alike), a dv of another, or a failed launch.
void tiled_attention_forward(cudaStream_t stream, ddp_dtype dtype, LayerOutput out, float* stats, GemmInput q,
                             GemmInput k, GemmInput v, int64_t b, int64_t t, int64_t heads, int64_t dh);
void tiled_attention_backward(cudaStream_t stream, ddp_dtype dtype, float* dq, float* dk, LayerOutput dv, float* d,
                              const float* dout, const float* stats, GemmInput q, GemmInput k, GemmInput v, int64_t b,
                              int64_t t, int64_t heads, int64_t dh);

}  // namespace ddp::cuda
