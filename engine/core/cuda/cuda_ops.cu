// cuda_ops.cu — the CUDA device's elementwise kernels (fill, scale), the
// optimizer's update rules (SGD, SGD with momentum, AdamW), one grid-stride
// kernel each, and the gradients' sums of squares. Not here: fused or
// multi-tensor updates, vectorised loads — these kernels are memory-bound
// and simple on purpose.
//
// Bitwise agreement with optimizer.cpp's CPU loops: every arithmetic
// operation is an explicit round-to-nearest intrinsic (__fmul_rn,
// __fadd_rn, __fdiv_rn, __fsqrt_rn), which nvcc never contracts into a
// fused multiply-add, and the operands and their order are those of the C++
// expressions, read with C++'s precedence and left-to-right associativity
// (each kernel quotes the line it mirrors). The intrinsics keep denormals
// unless the file is built with -ftz=true (--use_fast_math), which must
// therefore stay off; the CPU side sets no flush-to-zero mode either.
#include "cuda_ops.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "cuda/cuda_check.h"

namespace ddp::cuda_ops {
namespace {

constexpr unsigned kThreads = 256;   // per block
constexpr size_t kMaxBlocks = 4096;  // beyond this each thread loops (grid-stride)

// Blocks for n > 0 elements: one element per thread, up to kMaxBlocks.
unsigned blocks_for(size_t n) {
  const size_t blocks = n / kThreads + (n % kThreads != 0 ? 1 : 0);
  return static_cast<unsigned>(std::min(blocks, kMaxBlocks));
}

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

using cuda::check_launch;

// size_t indices throughout: n may exceed 2^31.
#define DDP_GRID_STRIDE_LOOP(i, n) \
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += size_t(gridDim.x) * blockDim.x)

__global__ void fill_kernel(float* __restrict__ data, size_t n, float value) {
  DDP_GRID_STRIDE_LOOP(i, n) data[i] = value;
}

// CpuDevice::scale: data[i] *= factor.
__global__ void scale_kernel(float* __restrict__ data, size_t n, float factor) {
  DDP_GRID_STRIDE_LOOP(i, n) data[i] = __fmul_rn(data[i], factor);
}

// CpuDevice::add: dst[i] += src[i].
__global__ void add_kernel(float* __restrict__ dst, const float* __restrict__ src, size_t n) {
  DDP_GRID_STRIDE_LOOP(i, n) dst[i] = __fadd_rn(dst[i], src[i]);
}

// w[k] += -lr * (wd != 0.0f ? g[k] + wd * w[k] : g[k]);
//   d = g + (wd * w);  w = w + ((-lr) * d)
__global__ void sgd_plain_kernel(float* __restrict__ w, const float* __restrict__ g, size_t n, float lr, float wd) {
  const float neg_lr = -lr;  // negation is exact
  DDP_GRID_STRIDE_LOOP(i, n) {
    const float wi = w[i];
    const float d = wd != 0.0f ? __fadd_rn(g[i], __fmul_rn(wd, wi)) : g[i];
    w[i] = __fadd_rn(wi, __fmul_rn(neg_lr, d));
  }
}

// const float d = wd != 0.0f ? g[k] + wd * w[k] : g[k];
// buf[k] = first ? d : buf[k] * mu + d;      buf = (buf * mu) + d
// w[k] += -lr * buf[k];                      w = w + ((-lr) * buf)
__global__ void sgd_momentum_kernel(float* __restrict__ w, const float* __restrict__ g, float* __restrict__ buf,
                                    size_t n, float lr, float wd, float mu, bool first) {
  const float neg_lr = -lr;
  DDP_GRID_STRIDE_LOOP(i, n) {
    const float wi = w[i];
    const float d = wd != 0.0f ? __fadd_rn(g[i], __fmul_rn(wd, wi)) : g[i];
    const float b = first ? d : __fadd_rn(__fmul_rn(buf[i], mu), d);
    buf[i] = b;
    w[i] = __fadd_rn(wi, __fmul_rn(neg_lr, b));
  }
}

// w[k] *= c.decay;
// m[k] = m[k] * c.b1 + c.one_minus_b1 * g[k];          (m*b1) + (omb1*g)
// v[k] = v[k] * c.b2 + c.one_minus_b2 * g[k] * g[k];   (v*b2) + ((omb2*g)*g)
// const float denom = std::sqrt(v[k]) / c.bias2_sqrt + c.eps;   (sqrt(v)/b2s) + eps
// w[k] = w[k] + -c.step_size * m[k] / denom;           w + (((-step_size)*m) / denom)
__global__ void adamw_kernel(float* __restrict__ w, const float* __restrict__ g, float* __restrict__ m,
                             float* __restrict__ v, size_t n, const AdamScalars c) {
  const float neg_step_size = -c.step_size;
  DDP_GRID_STRIDE_LOOP(i, n) {
    const float gi = g[i];
    const float wi = __fmul_rn(w[i], c.decay);
    const float mi = __fadd_rn(__fmul_rn(m[i], c.b1), __fmul_rn(c.one_minus_b1, gi));
    const float vi = __fadd_rn(__fmul_rn(v[i], c.b2), __fmul_rn(__fmul_rn(c.one_minus_b2, gi), gi));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c.bias2_sqrt), c.eps);
    m[i] = mi;
    v[i] = vi;
    w[i] = __fadd_rn(wi, __fdiv_rn(__fmul_rn(neg_step_size, mi), denom));
  }
}

// convert_cpu (convert.cpp): the same rounding, by CUDA's _rn intrinsics.
struct ToBf16 {
  __device__ __nv_bfloat16 operator()(float x) const { return __float2bfloat16_rn(x); }
};
struct ToHalf {
  __device__ __half operator()(float x) const { return __float2half_rn(x); }
};
struct ToFloat {
  __device__ float operator()(__nv_bfloat16 x) const { return __bfloat162float(x); }
  __device__ float operator()(__half x) const { return __half2float(x); }
};
template <typename Out, typename In, typename F>
__global__ void convert_kernel(Out* __restrict__ out, const In* __restrict__ in, size_t n, F f) {
  DDP_GRID_STRIDE_LOOP(i, n) out[i] = f(in[i]);
}

#undef DDP_GRID_STRIDE_LOOP

// One float64 sum of squares per kSquareChunk elements: each of the block's
// threads adds its elements (every kThreads-th) in order, then the block
// adds its threads' sums as a fixed tree. The same bits every run.
__global__ void square_sums_kernel(const float* __restrict__ x, size_t n, double* __restrict__ partial) {
  __shared__ double sums[kThreads];
  const size_t begin = size_t(blockIdx.x) * kSquareChunk;
  const size_t end = begin + kSquareChunk < n ? begin + kSquareChunk : n;
  double sum = 0.0;
  for (size_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const double v = x[i];
    sum = __dadd_rn(sum, __dmul_rn(v, v));
  }
  sums[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) sums[threadIdx.x] = __dadd_rn(sums[threadIdx.x], sums[threadIdx.x + half]);
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = sums[0];
}

}  // namespace

size_t square_chunks(size_t n) { return n / kSquareChunk + (n % kSquareChunk != 0 ? 1 : 0); }

void square_sums(void* stream, const float* x, size_t n, double* partial) {
  if (n == 0) return;
  square_sums_kernel<<<static_cast<unsigned>(square_chunks(n)), kThreads, 0, as_stream(stream)>>>(x, n, partial);
  check_launch("square_sums");
}

void fill(void* stream, float* data, size_t n, float value) {
  if (n == 0) return;
  fill_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(data, n, value);
  check_launch("fill");
}

void scale(void* stream, float* data, size_t n, float factor) {
  if (n == 0) return;
  scale_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(data, n, factor);
  check_launch("scale");
}

void add(void* stream, float* dst, const float* src, size_t n) {
  if (n == 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(dst, src, n);
  check_launch("add");
}

void convert(void* stream, void* dst, ddp_dtype dst_type, const void* src, ddp_dtype src_type, size_t n) {
  if (n == 0) return;
  const auto grid = blocks_for(n);
  cudaStream_t s = as_stream(stream);
  float* out_f = static_cast<float*>(dst);
  const float* in_f = static_cast<const float*>(src);
  if (src_type == DDP_FLOAT32 && dst_type == DDP_BFLOAT16)
    convert_kernel<<<grid, kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(dst), in_f, n, ToBf16{});
  else if (src_type == DDP_FLOAT32)
    convert_kernel<<<grid, kThreads, 0, s>>>(static_cast<__half*>(dst), in_f, n, ToHalf{});
  else if (src_type == DDP_BFLOAT16)
    convert_kernel<<<grid, kThreads, 0, s>>>(out_f, static_cast<const __nv_bfloat16*>(src), n, ToFloat{});
  else
    convert_kernel<<<grid, kThreads, 0, s>>>(out_f, static_cast<const __half*>(src), n, ToFloat{});
  check_launch("convert");
}

void sgd_plain(void* stream, float* w, const float* g, size_t n, float lr, float wd) {
  if (n == 0) return;
  sgd_plain_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(w, g, n, lr, wd);
  check_launch("sgd_plain");
}

void sgd_momentum(void* stream, float* w, const float* g, float* buf, size_t n, float lr, float wd, float mu,
                  bool first) {
  if (n == 0) return;
  sgd_momentum_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(w, g, buf, n, lr, wd, mu, first);
  check_launch("sgd_momentum");
}

void adamw_update(void* stream, float* w, const float* g, float* m, float* v, size_t n, const AdamScalars& c) {
  if (n == 0) return;
  adamw_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(w, g, m, v, n, c);
  check_launch("adamw_update");
}

}  // namespace ddp::cuda_ops
