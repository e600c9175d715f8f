// layer_kernels.cuh — the device code of cuda_kernels.cu: launch geometry,
// fixed-order reductions and one group of __global__ kernels per layer of
// layers.h. Included by cuda_kernels.cu alone (one translation unit: no
// relocatable device code). Each kernel says which CPU function it mirrors
// and in what order it reduces; the host side that launches them is the
// CudaKernels class there.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>

#include "cuda/cuda_check.h"
#include "cuda/sixteen.cuh"
#include "error.h"
#include "kernels.h"  // LayerOutput
#include "layers.h"   // the CPU functions mirrored, their constants

namespace ddp {
namespace {

using cuda::check_launch;

// ---- launch geometry and reductions --------------------------------------------

constexpr int kThreads = 256;          // threads per block (a multiple of 32)
constexpr int64_t kMaxBlocks = 65536;  // grid-stride kernels cap their grid here

unsigned grid_for(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
}

#define DDP_GRID_STRIDE(i, n)                                                            \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

struct Sum {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Every lane gets op over the warp (a butterfly: a fixed order).
template <typename T, typename Op>
__device__ T warp_all_reduce(T v, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Every thread gets op over the block: warps reduce, then each thread folds
// the warps' results in warp order. All threads of the block must call it.
template <typename T, typename Op>
__device__ T block_all_reduce(T v, Op op) {
  __shared__ T partial[32];
  v = warp_all_reduce(v, op);
  __syncthreads();  // a previous call's readers of `partial` are done
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
  __syncthreads();
  T r = partial[0];
  for (unsigned w = 1; w < (blockDim.x >> 5); ++w) r = op(r, partial[w]);
  return r;
}

// out[0] = sum of in[n] (double), one block, fixed order.
__global__ void sum_doubles_kernel(double* out, const double* in, int64_t n) {
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += in[i];
  s = block_all_reduce(s, Sum());
  if (threadIdx.x == 0) out[0] = s;
}

// Column sums of a [n, cols] matrix given by term(i, j), added into
// sum[cols] in layers.h's order (kColumnSumRows), in two passes that scale
// with both n and cols. Pass 1: a thread per (column, row tile) adds its
// tile's terms in row order into partial[tile, cols] (reads coalesced along
// a row). Pass 2: a thread per column adds the tile sums into sum[j] in tile
// order. Sums and the terms' products are __fadd_rn / __fmul_rn, which nvcc
// never contracts into FMAs (nor does the CPU: -ffp-contract=off), so the
// bits are the CPU's.
__global__ void column_total_kernel(float* sum, const float* partial, int64_t tiles, int64_t cols) {
  DDP_GRID_STRIDE(j, cols) {
    float acc = sum[j];
    for (int64_t t = 0; t < tiles; ++t) acc = __fadd_rn(acc, partial[t * cols + j]);
    sum[j] = acc;
  }
}

template <typename Term>
__global__ void column_tile_sums_kernel(float* partial, int64_t n, int64_t cols, Term term) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  const int64_t tiles = (n + layers::kColumnSumRows - 1) / layers::kColumnSumRows;
  for (int64_t t = blockIdx.y; t < tiles; t += gridDim.y) {
    const int64_t r0 = t * layers::kColumnSumRows;
    const int64_t r1 = r0 + layers::kColumnSumRows < n ? r0 + layers::kColumnSumRows : n;
    float s = term(r0, j);
    for (int64_t i = r0 + 1; i < r1; ++i) s = __fadd_rn(s, term(i, j));
    partial[t * cols + j] = s;
  }
}

// Floats of scratch column_sum needs for an [n, cols] matrix.
size_t column_sum_scratch(int64_t n, int64_t cols) {
  return static_cast<size_t>((n + layers::kColumnSumRows - 1) / layers::kColumnSumRows * cols);
}

template <typename Term>
void column_sum(cudaStream_t stream, float* partial, float* sum, int64_t n, int64_t cols, Term term, const char* name) {
  if (n == 0 || cols == 0) return;
  const int64_t tiles = (n + layers::kColumnSumRows - 1) / layers::kColumnSumRows;
  const dim3 grid(static_cast<unsigned>((cols + kThreads - 1) / kThreads),
                  static_cast<unsigned>(std::min<int64_t>(tiles, 65535)));
  column_tile_sums_kernel<<<grid, kThreads, 0, stream>>>(partial, n, cols, term);
  check_launch(name);
  column_total_kernel<<<grid_for(cols), kThreads, 0, stream>>>(sum, partial, tiles, cols);
  check_launch("column_total_kernel");
}

// ---- bias: y[n, out] += b[out]; db[out] += column sums of dy[n, out] ----------

__global__ void bias_forward_kernel(float* y, const float* b, int64_t n, int64_t out) {
  DDP_GRID_STRIDE(idx, n * out) y[idx] += b[idx % out];
}

struct BiasTerm {
  const float* dy;
  int64_t out;
  __device__ float operator()(int64_t i, int64_t j) const { return dy[i * out + j]; }
};

// ---- embedding: out[n, d] = table[tokens[i], :]; dtable[tokens[i], :] += dout[i, :]

__global__ void embedding_forward_kernel(float* out, const int32_t* tokens, const float* table, int64_t n, int64_t d) {
  DDP_GRID_STRIDE(idx, n * d) {
    const int64_t i = idx / d;
    const int64_t j = idx - i * d;
    out[idx] = table[static_cast<int64_t>(tokens[i]) * d + j];
  }
}

// The scatter-add without atomics, in the CPU's order, in O(n d) work: the
// host side sorts the positions by token, stably (CUB's radix sort: equal
// tokens keep increasing positions), then block k takes sorted index k; the
// block at the start of a run of equal tokens adds the run's dout rows, in
// increasing position, into its table row (a thread per column), and every
// other block exits. Each table element thus gets the same float additions
// in the same order as the CPU's loop over positions: bitwise its result.
__global__ void iota_kernel(int32_t* v, int64_t n) { DDP_GRID_STRIDE(i, n) v[i] = static_cast<int32_t>(i); }

__global__ void embedding_runs_kernel(float* dtable, const float* dout, const int32_t* sorted_tokens,
                                      const int32_t* positions, int64_t n, int64_t d) {
  const int64_t k = blockIdx.x;
  const int32_t token = sorted_tokens[k];
  if (k > 0 && sorted_tokens[k - 1] == token) return;  // inside a run: its first block owns it
  // The run's end, a block-wide chunk at a time (the keys are sorted: the
  // run is contiguous and nothing after it matches).
  int64_t end = k + 1;
  while (end < n) {
    const int64_t m = end + threadIdx.x;
    const int same = __syncthreads_count(m < n && sorted_tokens[m] == token);
    end += same;
    if (same < static_cast<int>(blockDim.x)) break;
  }
  float* row = dtable + static_cast<int64_t>(token) * d;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float acc = row[c];
#pragma unroll 4
    for (int64_t m = k; m < end; ++m) acc = __fadd_rn(acc, dout[static_cast<int64_t>(positions[m]) * d + c]);
    row[c] = acc;
  }
}

// ---- where a kernel writes a float32 result (kernels.h's LayerOutput) ----------
// float32 as it is; bfloat16 and float16 rounded to nearest even, as
// cuda_ops' convert (and the CPU's) rounds.

template <typename T>
struct StoreTo {
  T* p;
  __device__ void operator()(int64_t i, float v) const { p[i] = cuda::narrow<T>(v); }
};

// f(store) for out's dtype; throws Error for a dtype none writes.
template <typename F>
void with_store(const LayerOutput& out, F&& f) {
  if (out.dtype == DDP_FLOAT32) return f(StoreTo<float>{static_cast<float*>(out.data)});
  if (out.dtype == DDP_BFLOAT16) return f(StoreTo<__nv_bfloat16>{static_cast<__nv_bfloat16*>(out.data)});
  if (out.dtype == DDP_FLOAT16) return f(StoreTo<__half>{static_cast<__half*>(out.data)});
  throw Error(std::string("CUDA kernels: a layer output in ") + ddp_dtype_name(out.dtype) +
              " (float32, bfloat16 or float16 only)");
}

// The same kind of store as `like`, into `other` (which must share its dtype).
template <typename Store>
Store store_like(const Store&, const LayerOutput& other) {
  return Store{static_cast<decltype(Store::p)>(other.data)};
}

// ---- where a kernel reads a kept activation (kernels.h's LayerInput) -----------
// float32 as it is; bfloat16 and float16 widened (exactly).

template <typename T>
struct LoadFrom {
  const T* p;
  __device__ float operator()(int64_t i) const { return cuda::wide(p[i]); }
};

// f(load) for in's dtype; throws Error for a dtype none reads.
template <typename F>
void with_load(const LayerInput& in, F&& f) {
  if (in.dtype == DDP_FLOAT32) return f(LoadFrom<float>{static_cast<const float*>(in.data)});
  if (in.dtype == DDP_BFLOAT16) return f(LoadFrom<__nv_bfloat16>{static_cast<const __nv_bfloat16*>(in.data)});
  if (in.dtype == DDP_FLOAT16) return f(LoadFrom<__half>{static_cast<const __half*>(in.data)});
  throw Error(std::string("CUDA kernels: a layer input in ") + ddp_dtype_name(in.dtype) +
              " (float32, bfloat16 or float16 only)");
}
// The same kind of load as `like`, of `other` (which must share its dtype).
template <typename Load>
Load load_like(const Load&, const LayerInput& other) {
  return Load{static_cast<decltype(Load::p)>(other.data)};
}

// ---- RMSNorm: one block per row of x[n, d]; rms[n] kept ----------------------
// Forward y = x / r * g with r = sqrt(mean(x^2) + eps); backward
// dx_j = g_j dy_j / r - x_j sum_i(g_i dy_i x_i) / (d r^3) (= or +=), and
// dg_j += sum over rows of dy_j x_j / r (a column sum, see column_sum).

template <typename Store>
__global__ void rmsnorm_forward_kernel(Store y, float* rms, const float* x, const float* g, int64_t d) {
  const int64_t i = blockIdx.x;
  const float* xi = x + i * d;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) ss += xi[j] * xi[j];
  ss = block_all_reduce(ss, Sum());
  const float r = sqrtf(ss / static_cast<float>(d) + layers::kRmsNormEps);
  if (threadIdx.x == 0) rms[i] = r;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) y(i * d + j, xi[j] / r * g[j]);
}

template <typename Load>
__global__ void rmsnorm_backward_kernel(float* dx, const float* dy, Load x, const float* g, const float* rms, int64_t d,
                                        bool accumulate) {
  const int64_t i = blockIdx.x;
  const float* dyi = dy + i * d;
  float* dxi = dx + i * d;
  const float inv = 1.0f / rms[i];
  float dot = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) dot += g[j] * dyi[j] * x(i * d + j);
  dot = block_all_reduce(dot, Sum());
  const float c = dot * inv * inv * inv / static_cast<float>(d);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float v = g[j] * dyi[j] * inv - x(i * d + j) * c;
    dxi[j] = accumulate ? dxi[j] + v : v;
  }
}

template <typename Load>
struct RmsGainTerm {  // layers.cpp: dy_ij * x_ij * inv, inv = 1 / rms_i
  const float* dy;
  Load x;
  const float* rms;
  int64_t d;
  __device__ float operator()(int64_t i, int64_t j) const {
    return __fmul_rn(__fmul_rn(dy[i * d + j], x(i * d + j)), __fdiv_rn(1.0f, rms[i]));
  }
};

// ---- RoPE: x[b, t, heads, dh] into out, one thread per pair (2k, 2k+1) --------
// Pair index p = (bt * heads + h) * dh/2 + k: the pair sits at
// x + (bt * heads + h) * dh + 2k, at position bt mod t. sign = -1 rotates
// back (the backward). out may be x itself (in place: each thread reads its
// pair before it writes it), or 16 bits.

template <typename Store>
__global__ void rope_kernel(Store out, const float* x, const float* cos, const float* sin, int64_t pairs, int64_t t,
                            int64_t heads, int64_t dh, int64_t half, float sign) {
  DDP_GRID_STRIDE(p, pairs) {
    const int64_t k = p % half;
    const int64_t head_row = p / half;  // bt * heads + h
    const int64_t pos = (head_row / heads) % t;
    const float c = cos[pos * half + k];
    const float sk = sign * sin[pos * half + k];
    const int64_t at = head_row * dh + 2 * k;
    const float x0 = x[at];
    const float x1 = x[at + 1];
    out(at, c * x0 - sk * x1);
    out(at + 1, sk * x0 + c * x1);
  }
}

// ---- causal attention ------------------------------------------------------------
// q, k, v, out [b, t, heads, dh] with row stride d = heads*dh: head h of
// sequence s is the [t, dh] matrix at offset s*t*d + h*dh, leading dimension
// d, and the heads of one sequence are a strided batch (stride dh). p[b,
// heads, t, t] is [t, t] per (s, h), stride t*t. So each GEMM is one
// strided-batched call per sequence over its heads. The softmax and its
// backward are one warp per row of p (b*heads*t rows, row i of its [t, t]
// at index row mod t), covering the whole row: entries j > i are written 0,
// as the CPU does, and the GEMMs then read the full [t, t].

constexpr int kRowsPerBlock = kThreads / 32;

// p row i: softmax over j <= i of the scaled scores already in it, 0 beyond.
__global__ void causal_softmax_kernel(float* p, int64_t rows, int64_t t) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;  // whole warps return: no later block-wide sync
  const int lane = threadIdx.x & 31;
  const int64_t i = r % t;
  float* row = p + r * t;
  float m = row[0];
  for (int64_t j = lane; j <= i; j += 32) m = fmaxf(m, row[j]);
  m = warp_all_reduce(m, Max());
  float sum = 0.0f;
  for (int64_t j = lane; j <= i; j += 32) {
    const float e = expf(row[j] - m);
    row[j] = e;
    sum += e;
  }
  sum = warp_all_reduce(sum, Sum());
  for (int64_t j = lane; j < t; j += 32) row[j] = j <= i ? row[j] / sum : 0.0f;
}

// ds = p * (dp - sum_j p dp) * scale in place of dp (ds row i: 0 beyond i).
__global__ void causal_softmax_backward_kernel(float* ds, const float* p, int64_t rows, int64_t t, float scale) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int lane = threadIdx.x & 31;
  const int64_t i = r % t;
  const float* pr = p + r * t;
  float* dr = ds + r * t;
  float dot = 0.0f;
  for (int64_t j = lane; j <= i; j += 32) dot += pr[j] * dr[j];
  dot = warp_all_reduce(dot, Sum());
  for (int64_t j = lane; j < t; j += 32) dr[j] = j <= i ? pr[j] * (dr[j] - dot) * scale : 0.0f;
}

// ---- elementwise ---------------------------------------------------------------

__device__ float sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

template <typename Store>
__global__ void swiglu_forward_kernel(Store out, const float* a, const float* b, int64_t n) {
  DDP_GRID_STRIDE(i, n) out(i, a[i] * sigmoid(a[i]) * b[i]);
}

template <typename Store, typename Load>
__global__ void swiglu_backward_kernel(Store da, Store db, const float* dout, Load a, Load b, int64_t n) {
  // d silu(z)/dz = s (1 + z (1 - s)), s = sigmoid(z)
  DDP_GRID_STRIDE(i, n) {
    const float z = a(i);
    const float s = sigmoid(z);
    const float g = dout[i];
    const float bi = b(i);
    db(i, g * z * s);
    da(i, g * bi * s * (1.0f + z * (1.0f - s)));
  }
}

// y may alias x, dx may alias dy: each element is read before it is written.
__global__ void relu_forward_kernel(float* y, const float* x, int64_t n) {
  DDP_GRID_STRIDE(i, n) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

__global__ void relu_backward_kernel(float* dx, const float* dy, const float* y, int64_t n) {
  DDP_GRID_STRIDE(i, n) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

// ---- losses ----------------------------------------------------------------------
// Cross-entropy: one block per row of logits[n, v] finds the max and the sum
// of exp (fixed-order block reductions, float as on the CPU), keeps lse[i]
// and writes its loss lse - logit[target] in double; sum_doubles_kernel
// adds the n terms; the host divides by n. MSE: grid-stride blocks sum
// (pred - y)^2 in double into one partial each, then sum_doubles_kernel.
// The backward passes are elementwise.

__global__ void cross_entropy_forward_kernel(float* lse, double* loss, const float* logits, const int32_t* targets,
                                             int64_t v) {
  const int64_t i = blockIdx.x;
  const float* row = logits + i * v;
  float m = row[0];
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) m = fmaxf(m, row[j]);
  m = block_all_reduce(m, Max());
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) sum += expf(row[j] - m);
  sum = block_all_reduce(sum, Sum());
  if (threadIdx.x == 0) {
    const float l = m + logf(sum);
    lse[i] = l;
    loss[i] = static_cast<double>(l) - static_cast<double>(row[targets[i]]);
  }
}

// logits[n, v] := softmax - onehot in place, from the forward's lse.
__global__ void cross_entropy_gradient_kernel(float* logits, const float* lse, const int32_t* targets, int64_t n,
                                              int64_t v) {
  DDP_GRID_STRIDE(idx, n * v) {
    const int64_t i = idx / v;
    const int64_t j = idx - i * v;
    const float p = expf(logits[idx] - lse[i]);
    logits[idx] = j == targets[i] ? p - 1.0f : p;
  }
}

constexpr int64_t kMseBlocks = 1024;  // partial sums of mse_forward

__global__ void mse_partial_kernel(double* partial, const float* pred, const float* y, int64_t n) {
  double s = 0.0;
  DDP_GRID_STRIDE(k, n) {
    const double e = static_cast<double>(pred[k]) - y[k];
    s += e * e;
  }
  s = block_all_reduce(s, Sum());
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void mse_backward_kernel(float* d, const float* pred, const float* y, int64_t n, float c) {
  DDP_GRID_STRIDE(k, n) d[k] = c * (pred[k] - y[k]);
}

}  // namespace
}  // namespace ddp
