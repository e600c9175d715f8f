// cuda_gemm.h — the CUDA kernels' GEMMs (cuda_kernels.cu), row-major with
// the arguments of cblas_sgemm, on cuBLAS and the kernels' stream. Inputs
// in float32: cublasSgemm (no TF32). In bfloat16 or float16 (the compute
// dtype, kernels.h): each float32 operand rounded into a device buffer of
// its own first (to nearest even, cuda_ops.h's conversion; an operand
// already in the dtype, gemm.h's GemmInput, as it is), then cublasGemmEx with
// a float32 compute type and a float32 output — the CPU emulation's
// alpha r(A) r(B) + beta C (gemm.h), on the tensor cores. Only in builds
// with DDP_WITH_CUDA.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include <ddp/plugin.h>

#include "gemm.h"

namespace ddp::cuda {

class Gemms {
 public:
  // A cuBLAS handle on `stream`. Throws Error if cuBLAS cannot be set up.
  explicit Gemms(cudaStream_t stream);
  ~Gemms();
  Gemms(const Gemms&) = delete;
  Gemms& operator=(const Gemms&) = delete;

  // DDP_FLOAT32 (the default), DDP_BFLOAT16 or DDP_FLOAT16; throws Error
  // for another.
  void set_inputs(ddp_dtype dtype);
  ddp_dtype inputs() const { return inputs_; }

  // c[m, n] = alpha op(a)[m, k] op(b)[k, n] + beta c, each with its row
  // stride, op the transpose where ta / tb is set. An operand already in
  // the 16-bit inputs (gemm.h's GemmInput) goes to cuBLAS as it is; throws
  // Error for one check_gemm_input refuses.
  void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, GemmInput a, int64_t lda, GemmInput b,
            int64_t ldb, float beta, float* c, int64_t ldc);
  // gemm() over `batch` triples, the i-th at a + i*sa, b + i*sb, c + i*sc.
  void gemm_heads(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                  int64_t sa, const float* b, int64_t ldb, int64_t sb, float beta, float* c, int64_t ldc, int64_t sc,
                  int64_t batch);

 private:
  // The `count` floats at p rounded to inputs_, in buffer `slot` (0: a,
  // 1: b), grown on demand (the stream is idle before an old one goes).
  const void* rounded(int slot, const float* p, size_t count);
  // x as cuBLAS reads it in inputs_: rounded into `slot` if float32.
  const void* operand(int slot, const GemmInput& x, size_t count);

  cudaStream_t stream_;
  cublasHandle_t blas_ = nullptr;
  ddp_dtype inputs_ = DDP_FLOAT32;
  void* buffers_[2] = {nullptr, nullptr};
  size_t sizes_[2] = {0, 0};  // bytes
};

}  // namespace ddp::cuda
