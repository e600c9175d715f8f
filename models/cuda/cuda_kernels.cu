// cuda_kernels.cu — the models' kernels (kernels.h) on a CUDA GPU: the
// functions of layers.h, enqueued in call order on one stream. GEMMs are
// cuBLAS in float32 (no TF32), the rest are the CUDA kernels below, one
// group per layer. They compute what the CPU does to float32 rounding
// (agreement 1e-5 relative is tested in tests/cuda_kernels_test.cpp):
// accurate expf/logf/sqrtf and IEEE division (no fast math), the CPU's order
// of operations within an element, and sums in double where the CPU sums in
// double.
//
// Every result is the same from run to run: no float atomics, every
// reduction runs in a fixed order given by the sizes alone (cuBLAS is
// deterministic on one GPU model and toolkit).
//
// Deliberately absent: fused or flash attention (p is materialised as the
// CPU does, and the causal GEMMs compute the masked half too), half
// precision, any tuning beyond a sensible launch geometry.
//
// Every call runs on the device current when the kernels were made. A CUDA
// or cuBLAS failure throws Error naming the call and CUDA's message.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <string>

#include "cuda/cuda_kernels.h"
#include "error.h"
#include "layers.h"

namespace ddp {
namespace {

// ---- errors -----------------------------------------------------------------

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear a non-sticky error
    throw Error(std::string("CUDA kernels: ") + what + ": " + cudaGetErrorString(e));
  }
}

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("CUDA kernels: ") + what + ": " + cublasGetStatusName(s) + " (" +
                cublasGetStatusString(s) + ")");
}

// After each launch: a bad configuration fails here, not at the next sync.
void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

// cuBLAS takes int sizes; one-block-per-row grids take int counts too.
int to_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX)
    throw Error(std::string("CUDA kernels: ") + what + " = " + std::to_string(v) +
                " is out of int range (cuBLAS sizes, grid dimensions)");
  return static_cast<int>(v);
}

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
// sum[cols]: a block covers 32 columns; thread (x, y) sums rows y, y + 32,
// ... of column x in order, then thread (x, 0) adds the 32 partial sums in
// order of y. Reads are coalesced along a row.
constexpr int kColTile = 32;

template <typename Term>
__global__ void column_sum_kernel(float* sum, int64_t n, int64_t cols, Term term) {
  __shared__ float partial[kColTile][kColTile + 1];  // [y][x], padded
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  float s = 0.0f;
  if (j < cols)
    for (int64_t i = threadIdx.y; i < n; i += kColTile) s += term(i, j);
  partial[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && j < cols) {
    float r = partial[0][threadIdx.x];
    for (int y = 1; y < kColTile; ++y) r += partial[y][threadIdx.x];
    sum[j] += r;
  }
}

template <typename Term>
void column_sum(cudaStream_t stream, float* sum, int64_t n, int64_t cols, Term term,
                const char* name) {
  if (n == 0 || cols == 0) return;
  const unsigned blocks = static_cast<unsigned>((cols + kColTile - 1) / kColTile);
  column_sum_kernel<<<blocks, dim3(kColTile, kColTile), 0, stream>>>(sum, n, cols, term);
  check_launch(name);
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

__global__ void embedding_forward_kernel(float* out, const int32_t* tokens, const float* table,
                                         int64_t n, int64_t d) {
  DDP_GRID_STRIDE(idx, n * d) {
    const int64_t i = idx / d, j = idx - i * d;
    out[idx] = table[static_cast<int64_t>(tokens[i]) * d + j];
  }
}

// The scatter-add without atomics and without the vocabulary size: block i
// handles token position i. If the same token occurs earlier, the block
// exits (that occurrence's block owns the table row); otherwise it scans
// positions i..n-1 in chunks of kThreads, lists the matches of each chunk in
// order (warp ballots, prefix counts), and each thread adds their dout rows
// into its columns of the table row in increasing position: exactly the
// CPU's sequence of float additions, so the result is bitwise the CPU's.
// Cost: O(n^2 / kThreads) token comparisons (tokens stay in cache), tens
// of microseconds at n = 8k.
__global__ void embedding_backward_kernel(float* dtable, const float* dout, const int32_t* tokens,
                                          int64_t n, int64_t d) {
  __shared__ int64_t match_rows[kThreads];  // positions matching in this chunk, in order
  __shared__ int warp_matches[kThreads / 32];
  const int64_t i = blockIdx.x;
  const int32_t token = tokens[i];
  for (int64_t j0 = 0; j0 < i; j0 += kThreads) {
    const int64_t j = j0 + threadIdx.x;
    if (__syncthreads_or(j < i && tokens[j] == token)) return;  // not the first occurrence
  }
  float* row = dtable + static_cast<int64_t>(token) * d;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t j0 = i; j0 < n; j0 += kThreads) {
    const int64_t j = j0 + threadIdx.x;
    const bool match = j < n && tokens[j] == token;
    const unsigned ballot = __ballot_sync(0xffffffffu, match);
    if (lane == 0) warp_matches[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, count = 0;  // matches in earlier warps, in the whole chunk
    for (int w = 0; w < kThreads / 32; ++w) {
      if (w < warp) before += warp_matches[w];
      count += warp_matches[w];
    }
    if (match) match_rows[before + __popc(ballot & ((1u << lane) - 1u))] = j;
    __syncthreads();
    for (int64_t c = threadIdx.x; c < d; c += kThreads) {
      float acc = row[c];
      for (int m = 0; m < count; ++m) acc += dout[match_rows[m] * d + c];
      row[c] = acc;
    }
    __syncthreads();  // match_rows and warp_matches are rewritten next chunk
  }
}

// ---- RMSNorm: one block per row of x[n, d]; rms[n] kept ----------------------
// Forward y = x / r * g with r = sqrt(mean(x^2) + eps); backward
// dx_j = g_j dy_j / r - x_j sum_i(g_i dy_i x_i) / (d r^3) (= or +=), and
// dg_j += sum over rows of dy_j x_j / r (a column sum, see column_sum_kernel).

__global__ void rmsnorm_forward_kernel(float* y, float* rms, const float* x, const float* g,
                                       int64_t d) {
  const int64_t i = blockIdx.x;
  const float* xi = x + i * d;
  float* yi = y + i * d;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) ss += xi[j] * xi[j];
  ss = block_all_reduce(ss, Sum());
  const float r = sqrtf(ss / static_cast<float>(d) + layers::kRmsNormEps);
  if (threadIdx.x == 0) rms[i] = r;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) yi[j] = xi[j] / r * g[j];
}

__global__ void rmsnorm_backward_kernel(float* dx, const float* dy, const float* x, const float* g,
                                        const float* rms, int64_t d, bool accumulate) {
  const int64_t i = blockIdx.x;
  const float* xi = x + i * d;
  const float* dyi = dy + i * d;
  float* dxi = dx + i * d;
  const float inv = 1.0f / rms[i];
  float dot = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) dot += g[j] * dyi[j] * xi[j];
  dot = block_all_reduce(dot, Sum());
  const float c = dot * inv * inv * inv / static_cast<float>(d);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float v = g[j] * dyi[j] * inv - xi[j] * c;
    dxi[j] = accumulate ? dxi[j] + v : v;
  }
}

struct RmsGainTerm {
  const float* dy;
  const float* x;
  const float* rms;
  int64_t d;
  __device__ float operator()(int64_t i, int64_t j) const {
    return dy[i * d + j] * x[i * d + j] * (1.0f / rms[i]);
  }
};

// ---- RoPE: x[b, t, heads, dh] in place, one thread per pair (2k, 2k+1) ----------
// Pair index p = (bt * heads + h) * dh/2 + k: the pair sits at
// x + (bt * heads + h) * dh + 2k, at position bt mod t. sign = -1 rotates
// back (the backward).

__global__ void rope_kernel(float* x, const float* cos, const float* sin, int64_t pairs, int64_t t,
                            int64_t heads, int64_t dh, int64_t half, float sign) {
  DDP_GRID_STRIDE(p, pairs) {
    const int64_t k = p % half, head_row = p / half;  // head_row = bt * heads + h
    const int64_t pos = (head_row / heads) % t;
    const float c = cos[pos * half + k], sk = sign * sin[pos * half + k];
    float* xp = x + head_row * dh + 2 * k;
    const float x0 = xp[0], x1 = xp[1];
    xp[0] = c * x0 - sk * x1;
    xp[1] = sk * x0 + c * x1;
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
__global__ void causal_softmax_backward_kernel(float* ds, const float* p, int64_t rows, int64_t t,
                                               float scale) {
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

__global__ void swiglu_forward_kernel(float* out, const float* a, const float* b, int64_t n) {
  DDP_GRID_STRIDE(i, n) out[i] = a[i] * sigmoid(a[i]) * b[i];
}

__global__ void swiglu_backward_kernel(float* da, float* db, const float* dout, const float* a,
                                       const float* b, int64_t n) {
  // d silu(z)/dz = s (1 + z (1 - s)), s = sigmoid(z)
  DDP_GRID_STRIDE(i, n) {
    const float z = a[i], s = sigmoid(z), g = dout[i], bi = b[i];
    db[i] = g * z * s;
    da[i] = g * bi * s * (1.0f + z * (1.0f - s));
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

__global__ void cross_entropy_forward_kernel(float* lse, double* loss, const float* logits,
                                             const int32_t* targets, int64_t v) {
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

// dlogits may alias logits: each element is read before it is written.
__global__ void cross_entropy_backward_kernel(float* dlogits, const float* logits, const float* lse,
                                              const int32_t* targets, int64_t n, int64_t v,
                                              float c) {
  DDP_GRID_STRIDE(idx, n * v) {
    const int64_t i = idx / v, j = idx - i * v;
    const float e = c * expf(logits[idx] - lse[i]);
    dlogits[idx] = j == targets[i] ? e - c : e;
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

__global__ void mse_backward_kernel(float* d, const float* pred, const float* y, int64_t n,
                                    float c) {
  DDP_GRID_STRIDE(k, n) d[k] = c * (pred[k] - y[k]);
}

// ---- the Kernels -----------------------------------------------------------------

// Uploads go through pinned staging slots, used in turn, each reused once
// the copy out of it has run (an event); a larger upload goes in chunks. So
// the caller's memory is free once upload returns, whatever kind of host
// memory it is, and uploads in a row (tokens, then targets) do not wait for
// the stream.
constexpr int kStagingSlots = 4;
constexpr size_t kSlotBytes = size_t{1} << 20;

class CudaKernels final : public Kernels {
 public:
  explicit CudaKernels(cudaStream_t stream) : stream_(stream) {
    try {
      check(cublasCreate(&blas_), "cublasCreate");
      check(cublasSetStream(blas_, stream_), "cublasSetStream");
      // float32 throughout: no TF32 (cuBLAS's default, stated so it stays).
      check(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
      for (Slot& slot : slots_)
        check(cudaEventCreateWithFlags(&slot.sent, cudaEventDisableTiming), "cudaEventCreate");
      check(cudaMallocHost(&host_sum_, sizeof(double)), "cudaMallocHost");
    } catch (...) {
      release();
      throw;
    }
  }
  ~CudaKernels() override { release(); }
  CudaKernels(const CudaKernels&) = delete;
  CudaKernels& operator=(const CudaKernels&) = delete;

  ddp_device_kind kind() const override { return DDP_DEVICE_CUDA; }

  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_),
          "cudaMemcpyAsync (copy)");
  }

  void upload(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    for (size_t done = 0; done < bytes; done += kSlotBytes) {
      const size_t chunk = std::min(kSlotBytes, bytes - done);
      Slot& slot = slots_[next_slot_];
      next_slot_ = (next_slot_ + 1) % kStagingSlots;
      if (!slot.host) check(cudaMallocHost(&slot.host, kSlotBytes), "cudaMallocHost (staging)");
      check(cudaEventSynchronize(slot.sent),
            "cudaEventSynchronize (staging)");  // its last copy ran
      std::memcpy(slot.host, static_cast<const char*>(src) + done, chunk);
      check(cudaMemcpyAsync(static_cast<char*>(dst) + done, slot.host, chunk,
                            cudaMemcpyHostToDevice, stream_),
            "cudaMemcpyAsync (upload)");
      check(cudaEventRecord(slot.sent, stream_), "cudaEventRecord (staging)");
    }
  }

  // ---- linear ------------------------------------------------------------------
  // Row-major operands as layers.cpp's cblas calls, through gemm() below.

  void linear_forward(float* y, const float* x, const float* w, int64_t n, int64_t in, int64_t out,
                      bool accumulate) override {
    // y[n, out] (+)= x[n, in] · w[out, in]^T
    gemm(false, true, n, out, in, 1.0f, x, in, w, in, accumulate ? 1.0f : 0.0f, y, out);
  }
  void linear_backward_input(float* dx, const float* dy, const float* w, int64_t n, int64_t in,
                             int64_t out, bool accumulate) override {
    // dx[n, in] (+)= dy[n, out] · w[out, in]
    gemm(false, false, n, in, out, 1.0f, dy, out, w, in, accumulate ? 1.0f : 0.0f, dx, in);
  }
  void linear_backward_weight(float* dw, const float* dy, const float* x, int64_t n, int64_t in,
                              int64_t out) override {
    // dw[out, in] += dy[n, out]^T · x[n, in]
    gemm(true, false, out, in, n, 1.0f, dy, out, x, in, 1.0f, dw, in);
  }

  void bias_forward(float* y, const float* b, int64_t n, int64_t out) override {
    if (n * out == 0) return;
    bias_forward_kernel<<<grid_for(n * out), kThreads, 0, stream_>>>(y, b, n, out);
    check_launch("bias_forward_kernel");
  }
  void bias_backward(float* db, const float* dy, int64_t n, int64_t out) override {
    column_sum(stream_, db, n, out, BiasTerm{dy, out}, "column_sum_kernel (bias_backward)");
  }

  // ---- embedding -----------------------------------------------------------------

  void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t n,
                         int64_t d) override {
    if (n * d == 0) return;
    embedding_forward_kernel<<<grid_for(n * d), kThreads, 0, stream_>>>(out, tokens, table, n, d);
    check_launch("embedding_forward_kernel");
  }
  void embedding_backward(float* dtable, const float* dout, const int32_t* tokens, int64_t n,
                          int64_t d) override {
    if (n * d == 0) return;
    embedding_backward_kernel<<<blocks(n, "embedding_backward rows"), kThreads, 0, stream_>>>(
        dtable, dout, tokens, n, d);
    check_launch("embedding_backward_kernel");
  }

  // ---- RMSNorm, RoPE -----------------------------------------------------------------

  void rmsnorm_forward(float* y, float* rms, const float* x, const float* g, int64_t n,
                       int64_t d) override {
    if (n == 0) return;
    rmsnorm_forward_kernel<<<blocks(n, "rmsnorm rows"), kThreads, 0, stream_>>>(y, rms, x, g, d);
    check_launch("rmsnorm_forward_kernel");
  }
  void rmsnorm_backward(float* dx, float* dg, const float* dy, const float* x, const float* g,
                        const float* rms, int64_t n, int64_t d, bool accumulate) override {
    if (n == 0) return;
    rmsnorm_backward_kernel<<<blocks(n, "rmsnorm rows"), kThreads, 0, stream_>>>(dx, dy, x, g, rms,
                                                                                 d, accumulate);
    check_launch("rmsnorm_backward_kernel");
    if (dg)
      column_sum(stream_, dg, n, d, RmsGainTerm{dy, x, rms, d}, "column_sum_kernel (rmsnorm dg)");
  }

  void rope_forward(float* x, const float* cos, const float* sin, int64_t b, int64_t t,
                    int64_t heads, int64_t dh) override {
    rope(x, cos, sin, b, t, heads, dh, 1.0f);
  }
  void rope_backward(float* dx, const float* cos, const float* sin, int64_t b, int64_t t,
                     int64_t heads, int64_t dh) override {
    rope(dx, cos, sin, b, t, heads, dh, -1.0f);
  }

  // ---- causal attention --------------------------------------------------------------

  // ds (dp first) for every sequence and head at once: one softmax-backward
  // launch instead of one per sequence. The same size as p.
  size_t attention_scratch_floats(int64_t b, int64_t t, int64_t heads) const override {
    return static_cast<size_t>(b * heads * t * t);
  }

  void attention_forward(float* out, float* p, const float* q, const float* k, const float* v,
                         int64_t b, int64_t t, int64_t heads, int64_t dh) override {
    if (b * t * heads * dh == 0) return;
    const int64_t d = heads * dh, tt = t * t;
    const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
    for (int64_t s = 0; s < b; ++s) {
      const int64_t off = s * t * d;  // sequence s; head h at + h*dh
      // scores p_h[t, t] = q_h[t, dh] · k_h[t, dh]^T / sqrt(dh)
      gemm_heads(false, true, t, t, dh, scale, q + off, d, dh, k + off, d, dh, 0.0f,
                 p + s * heads * tt, t, tt, heads);
    }
    const int64_t rows = b * heads * t;
    causal_softmax_kernel<<<blocks((rows + kRowsPerBlock - 1) / kRowsPerBlock, "attention rows"),
                            kThreads, 0, stream_>>>(p, rows, t);
    check_launch("causal_softmax_kernel");
    for (int64_t s = 0; s < b; ++s) {
      const int64_t off = s * t * d;
      // out_h[t, dh] = p_h[t, t] · v_h[t, dh]
      gemm_heads(false, false, t, dh, t, 1.0f, p + s * heads * tt, t, tt, v + off, d, dh, 0.0f,
                 out + off, d, dh, heads);
    }
  }

  void attention_backward(float* dq, float* dk, float* dv, float* scratch, const float* dout,
                          const float* p, const float* q, const float* k, const float* v, int64_t b,
                          int64_t t, int64_t heads, int64_t dh) override {
    if (b * t * heads * dh == 0) return;
    const int64_t d = heads * dh, tt = t * t;
    const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
    for (int64_t s = 0; s < b; ++s) {
      const int64_t off = s * t * d;
      const float* ps = p + s * heads * tt;
      // dp_h[t, t] = dout_h[t, dh] · v_h[t, dh]^T
      gemm_heads(false, true, t, t, dh, 1.0f, dout + off, d, dh, v + off, d, dh, 0.0f,
                 scratch + s * heads * tt, t, tt, heads);
      // dv_h[t, dh] = p_h[t, t]^T · dout_h[t, dh]
      gemm_heads(true, false, t, dh, t, 1.0f, ps, t, tt, dout + off, d, dh, 0.0f, dv + off, d, dh,
                 heads);
    }
    const int64_t rows = b * heads * t;
    causal_softmax_backward_kernel<<<blocks((rows + kRowsPerBlock - 1) / kRowsPerBlock,
                                            "attention rows"),
                                     kThreads, 0, stream_>>>(scratch, p, rows, t, scale);
    check_launch("causal_softmax_backward_kernel");
    for (int64_t s = 0; s < b; ++s) {
      const int64_t off = s * t * d;
      const float* ds = scratch + s * heads * tt;
      // dq_h[t, dh] = ds_h[t, t] · k_h[t, dh];  dk_h[t, dh] = ds_h[t, t]^T · q_h[t, dh]
      gemm_heads(false, false, t, dh, t, 1.0f, ds, t, tt, k + off, d, dh, 0.0f, dq + off, d, dh,
                 heads);
      gemm_heads(true, false, t, dh, t, 1.0f, ds, t, tt, q + off, d, dh, 0.0f, dk + off, d, dh,
                 heads);
    }
  }

  // ---- elementwise -------------------------------------------------------------------

  void swiglu_forward(float* out, const float* a, const float* b, int64_t n) override {
    if (n == 0) return;
    swiglu_forward_kernel<<<grid_for(n), kThreads, 0, stream_>>>(out, a, b, n);
    check_launch("swiglu_forward_kernel");
  }
  void swiglu_backward(float* da, float* db, const float* dout, const float* a, const float* b,
                       int64_t n) override {
    if (n == 0) return;
    swiglu_backward_kernel<<<grid_for(n), kThreads, 0, stream_>>>(da, db, dout, a, b, n);
    check_launch("swiglu_backward_kernel");
  }
  void relu_forward(float* y, const float* x, int64_t n) override {
    if (n == 0) return;
    relu_forward_kernel<<<grid_for(n), kThreads, 0, stream_>>>(y, x, n);
    check_launch("relu_forward_kernel");
  }
  void relu_backward(float* dx, const float* dy, const float* y, int64_t n) override {
    if (n == 0) return;
    relu_backward_kernel<<<grid_for(n), kThreads, 0, stream_>>>(dx, dy, y, n);
    check_launch("relu_backward_kernel");
  }

  // ---- losses ------------------------------------------------------------------------

  float cross_entropy_forward(float* lse, const float* logits, const int32_t* targets, int64_t n,
                              int64_t v) override {
    double total = 0.0;
    if (n > 0) {
      double* terms = device_doubles(static_cast<size_t>(n) + 1);  // [n] terms, then the sum
      cross_entropy_forward_kernel<<<blocks(n, "cross_entropy rows"), kThreads, 0, stream_>>>(
          lse, terms, logits, targets, v);
      check_launch("cross_entropy_forward_kernel");
      total = sum_to_host(terms + n, terms, n);
    }
    return static_cast<float>(total / static_cast<double>(n));
  }
  void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                              const int32_t* targets, int64_t n, int64_t v, float scale) override {
    if (n * v == 0) return;
    const float c = scale / static_cast<float>(n);
    cross_entropy_backward_kernel<<<grid_for(n * v), kThreads, 0, stream_>>>(dlogits, logits, lse,
                                                                             targets, n, v, c);
    check_launch("cross_entropy_backward_kernel");
  }

  float mse_forward(const float* pred, const float* y, int64_t n) override {
    double total = 0.0;
    if (n > 0) {
      const int64_t parts = std::min<int64_t>(grid_for(n), kMseBlocks);
      double* partial = device_doubles(static_cast<size_t>(parts) + 1);  // [parts], then the sum
      mse_partial_kernel<<<static_cast<unsigned>(parts), kThreads, 0, stream_>>>(partial, pred, y,
                                                                                 n);
      check_launch("mse_partial_kernel");
      total = sum_to_host(partial + parts, partial, parts);
    }
    return static_cast<float>(total / static_cast<double>(n));
  }
  void mse_backward(float* d, const float* pred, const float* y, int64_t n, float scale) override {
    if (n == 0) return;
    const float c = 2.0f * scale / static_cast<float>(n);  // rounded to float first, as the CPU
    mse_backward_kernel<<<grid_for(n), kThreads, 0, stream_>>>(d, pred, y, n, c);
    check_launch("mse_backward_kernel");
  }

 private:
  // Row-major GEMM, the arguments of cblas_sgemm(CblasRowMajor, ...):
  // c[m, n] = alpha * op(a)[m, k] · op(b)[k, n] + beta * c, each with its
  // row stride (lda, ldb, ldc). cuBLAS is column-major, and a row-major
  // X[r, c] with row stride ld is, read column-major, X^T[c, r] with leading
  // dimension ld. So C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T:
  // the column-major call takes b first and a second, n and m swapped, and
  // each operand keeps its own transpose flag.
  void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
            int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
    if (m == 0 || n == 0) return;
    check(cublasSgemm(blas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                      to_int(n, "gemm n"), to_int(m, "gemm m"), to_int(k, "gemm k"), &alpha, b,
                      to_int(ldb, "gemm ldb"), a, to_int(lda, "gemm lda"), &beta, c,
                      to_int(ldc, "gemm ldc")),
          "cublasSgemm");
  }

  // gemm() over `batch` matrix triples, the i-th at a + i*sa, b + i*sb,
  // c + i*sc (the heads of one sequence; same mapping to column-major).
  void gemm_heads(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  int64_t lda, int64_t sa, const float* b, int64_t ldb, int64_t sb, float beta,
                  float* c, int64_t ldc, int64_t sc, int64_t batch) {
    if (m == 0 || n == 0 || batch == 0) return;
    check(cublasSgemmStridedBatched(
              blas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
              to_int(n, "gemm n"), to_int(m, "gemm m"), to_int(k, "gemm k"), &alpha, b,
              to_int(ldb, "gemm ldb"), sb, a, to_int(lda, "gemm lda"), sa, &beta, c,
              to_int(ldc, "gemm ldc"), sc, to_int(batch, "gemm batch")),
          "cublasSgemmStridedBatched");
  }

  void rope(float* x, const float* cos, const float* sin, int64_t b, int64_t t, int64_t heads,
            int64_t dh, float sign) {
    const int64_t pairs = b * t * heads * (dh / 2);
    if (pairs == 0) return;
    rope_kernel<<<grid_for(pairs), kThreads, 0, stream_>>>(x, cos, sin, pairs, t, heads, dh, dh / 2,
                                                           sign);
    check_launch("rope_kernel");
  }

  // A grid of one block per row (or per group of rows).
  static unsigned blocks(int64_t n, const char* what) {
    return static_cast<unsigned>(to_int(n, what));
  }

  // The scratch doubles of the losses, grown on demand (rarely: the sizes
  // are those of the step). The stream is idle before the old buffer goes.
  double* device_doubles(size_t count) {
    if (count > sums_size_) {
      check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (loss scratch)");
      if (sums_) check(cudaFree(sums_), "cudaFree (loss scratch)");
      sums_ = nullptr;
      sums_size_ = 0;
      check(cudaMalloc(&sums_, count * sizeof(double)), "cudaMalloc (loss scratch)");
      sums_size_ = count;
    }
    return sums_;
  }

  // Sums in[n] into *out on the device and returns it to the host, waiting
  // for the stream (the loss's .item()).
  double sum_to_host(double* out, const double* in, int64_t n) {
    sum_doubles_kernel<<<1, kThreads, 0, stream_>>>(out, in, n);
    check_launch("sum_doubles_kernel");
    check(cudaMemcpyAsync(host_sum_, out, sizeof(double), cudaMemcpyDeviceToHost, stream_),
          "cudaMemcpyAsync (loss)");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (loss)");
    return *host_sum_;
  }

  // Teardown never throws: work still queued may use the buffers, so wait
  // for the device first (not the stream: it may be gone already), ignoring
  // errors (a failed stream has reported them).
  void release() noexcept {
    cudaDeviceSynchronize();
    if (blas_) cublasDestroy(blas_);
    for (Slot& slot : slots_) {
      if (slot.sent) cudaEventDestroy(slot.sent);
      if (slot.host) cudaFreeHost(slot.host);
      slot = Slot{};
    }
    if (host_sum_) cudaFreeHost(host_sum_);
    if (sums_) cudaFree(sums_);
    cudaGetLastError();
    blas_ = nullptr;
    host_sum_ = nullptr;
    sums_ = nullptr;
  }

  cudaStream_t stream_;
  cublasHandle_t blas_ = nullptr;
  struct Slot {
    void* host = nullptr;        // pinned [kSlotBytes], allocated at its first use
    cudaEvent_t sent = nullptr;  // recorded after the copy out of it
  };
  Slot slots_[kStagingSlots];
  int next_slot_ = 0;
  double* host_sum_ = nullptr;  // pinned, a loss on its way to the host
  double* sums_ = nullptr;      // device [sums_size_], the losses' partial sums
  size_t sums_size_ = 0;
};

}  // namespace

std::unique_ptr<Kernels> make_cuda_kernels(void* stream) {
  return std::make_unique<CudaKernels>(static_cast<cudaStream_t>(stream));
}

}  // namespace ddp
