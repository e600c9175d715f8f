// cuda_gemm.cu — the CUDA kernels' GEMMs (cuda_gemm.h).
//
// cuBLAS is column-major, and a row-major X[r, c] with row stride ld is,
// read column-major, X^T[c, r] with leading dimension ld. So
// C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T: the column-major
// call takes b first and a second, n and m swapped, and each operand keeps
// its own transpose flag.
#include "cuda/cuda_gemm.h"

#include <climits>
#include <string>

#include <ddp/numeric.h>

#include "cuda/cublas_lib.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_ops.h"
#include "error.h"

namespace ddp::cuda {
namespace {

void check(cublasStatus_t s, const std::string& what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(what + ": " + cublas().status_name(s) + " (" + cublas().status_string(s) + ")");
}

int to_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX)
    throw Error(std::string("CUDA kernels: ") + what + " = " + std::to_string(v) +
                " is out of int range (cuBLAS sizes)");
  return static_cast<int>(v);
}

cublasOperation_t op(bool transposed) { return transposed ? CUBLAS_OP_T : CUBLAS_OP_N; }

// A GEMM's sizes as cuBLAS takes them.
struct Dims {
  int m;
  int n;
  int k;
  int lda;
  int ldb;
  int ldc;
};
Dims dims(int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc) {
  return {to_int(m, "gemm m"),     to_int(n, "gemm n"),     to_int(k, "gemm k"),
          to_int(lda, "gemm lda"), to_int(ldb, "gemm ldb"), to_int(ldc, "gemm ldc")};
}

// The elements an operand of `rows` x `cols` (as stored) with row stride
// `ld` spans, `batch` of them `stride` apart: what rounding it must cover.
size_t span(int64_t rows, int64_t cols, int64_t ld, int64_t batch = 1, int64_t stride = 0) {
  return static_cast<size_t>((batch - 1) * stride + (rows - 1) * ld + cols);
}

}  // namespace

Gemms::Gemms(cudaStream_t stream) : stream_(stream) {
  check(cublas().create(&blas_), "cublasCreate");
  try {
    check(cublas().set_stream(blas_, stream_), "cublasSetStream");
    // float32 GEMMs stay float32: no TF32 (cuBLAS's default, stated so it
    // stays). 16-bit inputs take the tensor cores whatever the mode.
    check(cublas().set_math_mode(blas_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  } catch (...) {
    cublas().destroy(blas_);
    throw;
  }
}

// Never throws: work still queued may read the buffers, so the device is
// waited for first, errors ignored (a failed stream has reported them).
Gemms::~Gemms() {
  cudaDeviceSynchronize();
  if (blas_) cublas().destroy(blas_);
  for (void* b : buffers_)
    if (b) cudaFree(b);
  cudaGetLastError();
}

void Gemms::set_inputs(ddp_dtype dtype) {
  if (dtype != DDP_FLOAT32 && dtype != DDP_BFLOAT16 && dtype != DDP_FLOAT16)
    throw Error(std::string("CUDA GEMMs: inputs in ") + ddp_dtype_name(dtype) + " (float32, bfloat16 or float16 only)",
                DDP_ERR_UNSUPPORTED);
  inputs_ = dtype;
}

const void* Gemms::rounded(int slot, const float* p, size_t count) {
  const size_t bytes = count * 2;
  if (bytes > sizes_[slot]) {
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (GEMM operand buffer)");
    if (buffers_[slot]) check(cudaFree(buffers_[slot]), "cudaFree (GEMM operand buffer)");
    buffers_[slot] = nullptr;
    sizes_[slot] = 0;
    check(cudaMalloc(&buffers_[slot], bytes), "cudaMalloc (GEMM operand buffer)");
    sizes_[slot] = bytes;
  }
  cuda_ops::convert(stream_, buffers_[slot], inputs_, p, DDP_FLOAT32, count);
  return buffers_[slot];
}

const void* Gemms::operand(int slot, const GemmInput& x, size_t count) {
  if (x.dtype == DDP_FLOAT32) return rounded(slot, static_cast<const float*>(x.data), count);
  return x.data;  // already in inputs_ (check_gemm_input)
}

void Gemms::gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, GemmInput a, int64_t lda, GemmInput b,
                 int64_t ldb, float beta, float* c, int64_t ldc) {
  check_gemm_input(a, inputs_);
  check_gemm_input(b, inputs_);
  if (m == 0 || n == 0) return;
  const Dims d = dims(m, n, k, lda, ldb, ldc);
  if (inputs_ == DDP_FLOAT32 || k == 0) {  // (k == 0: beta c alone, no operand read)
    const auto* fa = static_cast<const float*>(a.data);
    const auto* fb = static_cast<const float*>(b.data);
    check(cublas().sgemm(blas_, op(tb), op(ta), d.n, d.m, d.k, &alpha, fb, d.ldb, fa, d.lda, &beta, c, d.ldc),
          "cublasSgemm");
    return;
  }
  const cudaDataType_t type = inputs_ == DDP_BFLOAT16 ? CUDA_R_16BF : CUDA_R_16F;
  const void* ra = operand(0, a, span(ta ? k : m, ta ? m : k, lda));
  const void* rb = operand(1, b, span(tb ? n : k, tb ? k : n, ldb));
  check(cublas().gemm_ex(blas_, op(tb), op(ta), d.n, d.m, d.k, &alpha, rb, type, d.ldb, ra, type, d.lda, &beta, c,
                         CUDA_R_32F, d.ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
}

void Gemms::gemm_heads(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                       int64_t sa, const float* b, int64_t ldb, int64_t sb, float beta, float* c, int64_t ldc,
                       int64_t sc, int64_t batch) {
  if (m == 0 || n == 0 || batch == 0) return;
  const Dims d = dims(m, n, k, lda, ldb, ldc);
  const int ibatch = to_int(batch, "gemm batch");
  if (inputs_ == DDP_FLOAT32 || k == 0) {
    check(cublas().sgemm_strided_batched(blas_, op(tb), op(ta), d.n, d.m, d.k, &alpha, b, d.ldb, sb, a, d.lda, sa,
                                         &beta, c, d.ldc, sc, ibatch),
          "cublasSgemmStridedBatched");
    return;
  }
  const cudaDataType_t type = inputs_ == DDP_BFLOAT16 ? CUDA_R_16BF : CUDA_R_16F;
  const void* ra = rounded(0, a, span(ta ? k : m, ta ? m : k, lda, batch, sa));
  const void* rb = rounded(1, b, span(tb ? n : k, tb ? k : n, ldb, batch, sb));
  check(cublas().gemm_strided_batched_ex(blas_, op(tb), op(ta), d.n, d.m, d.k, &alpha, rb, type, d.ldb, sb, ra, type,
                                         d.lda, sa, &beta, c, CUDA_R_32F, d.ldc, sc, ibatch, CUBLAS_COMPUTE_32F,
                                         CUBLAS_GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx");
}

}  // namespace ddp::cuda
