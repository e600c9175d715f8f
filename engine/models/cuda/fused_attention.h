// fused_attention.h — causal attention for a 16-bit compute on a GPU,
// without the [t, t] weights in memory: one warp per row recomputes the
// scores from q and k, as FlashAttention does, and keeps for backward only
// each row's softmax max and sum. Rounded where the CPU's emulation
// (layers.h, gemm.h) rounds: q, k, v and dout as a product's inputs, the
// normalised weights before p v and in backward, ds before its two
// products; scores, softmax and sums in float32. Only in builds with
// DDP_WITH_CUDA; the CudaKernels call it when their compute dtype is
// bfloat16 or float16 (kernels.h's attention_keeps_weights).
//
// Layout as the CPU's: q, k, v, out, dq, dk, dv [b, t, heads, dh] (row
// stride heads * dh); stats [b, heads, t, 2] (max, sum); d [b, heads, t]
// (backward's scratch: sum_j p_ij dp_ij). dh at most 256. Every sum runs
// in an order fixed by the sizes: the same results from run to run.
// Backward reads q, k and v as backward kept them: float32, or already in
// the compute dtype (kernels.h's LayerInput, all three alike). Where
// tiled_attention.h fits (dh 16, 32, 64 or 128 on compute capability 8.0
// and up) these run its tensor-core kernels; the warp kernels elsewhere.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include <ddp/plugin.h>

#include "kernels.h"  // GemmInput, LayerOutput

namespace ddp::cuda {

// Throws Error for dh above 256, a dtype other than bf16/fp16, inputs of
// another dtype than float32 or `dtype` (or not alike), a dv of another
// (backward writes dv in float32 or `dtype`: LayerOutput), or a failed
// launch.
void fused_attention_forward(cudaStream_t stream, ddp_dtype dtype, LayerOutput out, float* stats, GemmInput q,
                             GemmInput k, GemmInput v, int64_t b, int64_t t, int64_t heads, int64_t dh);
void fused_attention_backward(cudaStream_t stream, ddp_dtype dtype, float* dq, float* dk, LayerOutput dv, float* d,
                              const float* dout, const float* stats, GemmInput q, GemmInput k, GemmInput v, int64_t b,
                              int64_t t, int64_t heads, int64_t dh);

}  // namespace ddp::cuda
