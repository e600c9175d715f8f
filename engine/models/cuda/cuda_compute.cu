// cuda_compute.cu — the Compute of compute.h on a CUDA GPU: cuBLAS's
// strided batched sgemm for gemm, and one kernel each for dot (and norm),
// axpy and normalize, enqueued on the stream given.
//
// gemm: one cuBLAS handle per stream (made on first use, under a mutex),
// so that no two streams share a handle's workspace (cuBLAS's condition
// for reproducible results on one GPU model), in CUBLAS_PEDANTIC_MATH: true
// float32, no TF32 and no reduced-precision shortcuts.
//
// dot, norm, normalize: one block of kComputeLanes threads per vector, each
// thread a lane of compute.h's order and the tree over them in shared
// memory, all in float64 with explicit _rn intrinsics (never contracted
// into an FMA): the CPU's loops (compute.cpp), bit for bit. No atomics, so
// the bits never depend on scheduling. axpy: one thread per element, the
// CPU's arithmetic in the same order. Deliberately not here: splitting a
// long vector over several blocks (its order would differ from the CPU's),
// vectorised loads; a strategy's vectors are few and its time is in gemm.
//
// A launch or cuBLAS failure throws Error naming the call and CUDA's words.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cublas_lib.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_compute.h"
#include "error.h"
#include "stream.h"

namespace ddp {
namespace {

constexpr unsigned kLanes = static_cast<unsigned>(kComputeLanes);
constexpr unsigned kThreads = 256;      // axpy's block
constexpr size_t kMaxBlocks = 1 << 16;  // beyond this a block takes several vectors (elements)

using cuda::check;
using cuda::check_launch;

void check(cublasStatus_t s, const std::string& what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(what + ": " + cuda::cublas().status_name(s) + " (" + cuda::cublas().status_string(s) + ")");
}

// The tree of compute.h over the block's lanes; every thread gets the sum.
__device__ double block_sum(double lane, double* shared) {
  const unsigned t = threadIdx.x;
  shared[t] = lane;
  __syncthreads();
  for (unsigned half = kLanes / 2; half > 0; half /= 2) {
    if (t < half) shared[t] = __dadd_rn(shared[t], shared[t + half]);
    __syncthreads();
  }
  const double sum = shared[0];
  __syncthreads();  // every thread has read it before the next vector's lanes land
  return sum;
}

// This thread's lane of x_i . y_i: elements j = lane, lane + kLanes, ...
// (a float product is exact in float64: only the sum rounds).
__device__ double dot_lane(const ddp_vectors& x, const ddp_vectors& y, size_t i) {
  const float* xi = x.ptr + i * x.stride;
  const float* yi = y.ptr + i * y.stride;
  double acc = 0.0;
  for (size_t j = threadIdx.x; j < x.length; j += kLanes)
    acc = __dadd_rn(acc, __dmul_rn(static_cast<double>(xi[j * x.inc]), static_cast<double>(yi[j * y.inc])));
  return acc;
}

// out[i] = x_i . y_i, or its square root (norm: y is x).
__global__ void dot_kernel(ddp_vectors x, ddp_vectors y, float* out, bool root) {
  __shared__ double shared[kLanes];
  for (size_t i = blockIdx.x; i < x.count; i += gridDim.x) {
    const double sum = block_sum(dot_lane(x, y, i), shared);
    if (threadIdx.x == 0) out[i] = __double2float_rn(root ? __dsqrt_rn(sum) : sum);
  }
}

// x_i /= float(||x_i||) + eps: each thread divides the elements it summed,
// after the tree (its barriers) has read them all.
__global__ void normalize_kernel(ddp_vectors x, float eps) {
  __shared__ double shared[kLanes];
  for (size_t i = blockIdx.x; i < x.count; i += gridDim.x) {
    const double sum = block_sum(dot_lane(x, x, i), shared);
    const float divisor = __fadd_rn(__double2float_rn(__dsqrt_rn(sum)), eps);
    float* xi = x.ptr + i * x.stride;
    for (size_t j = threadIdx.x; j < x.length; j += kLanes) xi[j * x.inc] = __fdiv_rn(xi[j * x.inc], divisor);
  }
}

// y_ij = float(y_ij + (alpha s_i) x_ij), compute.cpp's expression.
__global__ void axpy_kernel(double alpha, ddp_vectors x, const float* scalars, ddp_vectors y) {
  const size_t total = x.count * x.length;
  for (size_t e = size_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += size_t(gridDim.x) * blockDim.x) {
    const size_t i = e / x.length;
    const size_t j = e % x.length;
    const double a = __dmul_rn(alpha, scalars ? static_cast<double>(scalars[i]) : 1.0);
    float& out = y.ptr[i * y.stride + j * y.inc];
    const double xe = static_cast<double>(x.ptr[i * x.stride + j * x.inc]);
    out = __double2float_rn(__dadd_rn(static_cast<double>(out), __dmul_rn(a, xe)));
  }
}

unsigned blocks_of(size_t n) { return static_cast<unsigned>(std::min(n, kMaxBlocks)); }
cudaStream_t native_of(Stream& stream) { return static_cast<cudaStream_t>(stream.native()); }
// A leading dimension as cuBLAS takes it: at least 1 (k = 0 may come with 0).
int lead(size_t ld) { return static_cast<int>(std::max<size_t>(ld, 1)); }

class CudaCompute final : public Compute {
 public:
  ~CudaCompute() override {
    // Never throws: work still queued may use a handle's workspace, which
    // cublasDestroy waits for (it synchronises the device).
    for (auto& entry : handles_) cuda::cublas().destroy(entry.second);
    cudaGetLastError();
  }

  void gemm(const ddp_gemm& g, Stream& stream) override {
    if (g.m == 0 || g.n == 0) return;
    const auto alpha = static_cast<float>(g.alpha);
    const auto beta = static_cast<float>(g.beta);
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: b
    // first, n and m swapped, each operand with its own flag (the models'
    // gemm in cuda_kernels.cu does the same).
    std::lock_guard<std::mutex> lock(mutex_);
    check(cuda::cublas().sgemm_strided_batched(handle_for(native_of(stream)), g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                               g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(g.n),
                                               static_cast<int>(g.m), static_cast<int>(g.k), &alpha, g.b, lead(g.ldb),
                                               static_cast<long long>(g.stride_b), g.a, lead(g.lda),
                                               static_cast<long long>(g.stride_a), &beta, g.c, lead(g.ldc),
                                               static_cast<long long>(g.stride_c), static_cast<int>(g.batch)),
          "cublasSgemmStridedBatched (gemm)");
  }

  void dot(const ddp_vectors& x, const ddp_vectors& y, float* out, Stream& stream) override {
    if (x.count == 0) return;
    dot_kernel<<<blocks_of(x.count), kLanes, 0, native_of(stream)>>>(x, y, out, false);
    check_launch("dot_kernel");
  }

  void norm(const ddp_vectors& x, float* out, Stream& stream) override {
    if (x.count == 0) return;
    dot_kernel<<<blocks_of(x.count), kLanes, 0, native_of(stream)>>>(x, x, out, true);
    check_launch("dot_kernel (norm)");
  }

  void axpy(double alpha, const ddp_vectors& x, const float* scalars, const ddp_vectors& y, Stream& stream) override {
    const size_t total = x.count * x.length;
    if (total == 0) return;
    axpy_kernel<<<blocks_of((total + kThreads - 1) / kThreads), kThreads, 0, native_of(stream)>>>(alpha, x, scalars, y);
    check_launch("axpy_kernel");
  }

  void normalize(const ddp_vectors& x, double eps, Stream& stream) override {
    if (x.count == 0 || x.length == 0) return;
    normalize_kernel<<<blocks_of(x.count), kLanes, 0, native_of(stream)>>>(x, static_cast<float>(eps));
    check_launch("normalize_kernel");
  }

 private:
  // The handle of `stream`, made on its first gemm. Called under mutex_.
  cublasHandle_t handle_for(cudaStream_t stream) {
    for (const auto& entry : handles_)
      if (entry.first == stream) return entry.second;
    cublasHandle_t handle = nullptr;
    check(cuda::cublas().create(&handle), "cublasCreate (gemm)");
    try {
      check(cuda::cublas().set_stream(handle, stream), "cublasSetStream (gemm)");
      check(cuda::cublas().set_math_mode(handle, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode (gemm)");
    } catch (...) {
      cuda::cublas().destroy(handle);
      throw;
    }
    handles_.emplace_back(stream, handle);
    return handle;
  }

  std::mutex mutex_;
  std::vector<std::pair<cudaStream_t, cublasHandle_t>> handles_;  // one per stream
};

}  // namespace

std::unique_ptr<Compute> make_cuda_compute() {
  cuda::cublas();  // loads cuBLAS now: a missing library fails here, naming it
  return std::make_unique<CudaCompute>();
}

}  // namespace ddp
