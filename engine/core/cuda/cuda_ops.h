// cuda_ops.h — the CUDA device's elementwise operations and the optimizer's
// update rules as CUDA kernels, each enqueued on the stream it is given (a
// cudaStream_t passed as void*, so that engine code can include this header
// without CUDA's). Pointers are device memory. A launch failure throws
// ddp::Error naming the kernel and CUDA's message. Only in builds with
// DDP_WITH_CUDA.
//
// The update rules round every operation on its own (no fused multiply-add),
// as the CPU loops of optimizer.cpp do, so both devices compute bitwise the
// same updates from the same inputs.
#pragma once

#include <cstddef>

#include <ddp/plugin.h>

#include "update_rules.h"

namespace ddp::cuda_ops {

// data[0, n) = value.
void fill(void* stream, float* data, size_t n, float value);
// data[0, n) *= factor.
void scale(void* stream, float* data, size_t n, float factor);
// dst[0, n) += src[0, n).
void add(void* stream, float* dst, const float* src, size_t n);

// dst[0, n) = src[0, n) converted: float32 to bfloat16 or float16 and back,
// rounding to nearest even (convert.h; the caller has checked the pair).
void convert(void* stream, void* dst, ddp_dtype dst_type, const void* src, ddp_dtype src_type, size_t n);

// The elements square_sums sums into one float64 of `partial`.
constexpr size_t kSquareChunk = 16384;
// ceil(n / kSquareChunk): the float64s square_sums writes for n elements.
size_t square_chunks(size_t n);
// partial[c] = the sum of x[j]² in float64 over chunk c of x[0, n) (a
// fixed order: the same bits every run); the sum of the partials, added in
// order, is x's. Nothing for n = 0.
void square_sums(void* stream, const float* x, size_t n, double* partial);

// SGD without momentum: w += -lr * (wd != 0 ? g + wd * w : g).
void sgd_plain(void* stream, float* w, const float* g, size_t n, float lr, float wd);
// SGD with momentum mu: d = wd != 0 ? g + wd * w : g;
// buf = first ? d : buf * mu + d;  w += -lr * buf.
void sgd_momentum(void* stream, float* w, const float* g, float* buf, size_t n, float lr, float wd, float mu,
                  bool first);
// AdamW, the rule of update_rules.h; m, v the two moments.
void adamw_update(void* stream, float* w, const float* g, float* m, float* v, size_t n, const AdamScalars& c);

}  // namespace ddp::cuda_ops
