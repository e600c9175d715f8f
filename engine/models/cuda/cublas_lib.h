// cublas_lib.h — cuBLAS, loaded on first use rather than linked.
//
// Linking libcublas pulls in libcublasLt (540 MB), whose relocations cost
// every process that loads it about 0.4 s and 200 MB of resident memory at
// start, GPU or not: every CPU run, every rank, every `ddp plugins`. The
// GPU kernels therefore reach cuBLAS through this table, loaded (with
// Boost.DLL) the first time a CUDA device makes its kernels. Only in builds
// with DDP_WITH_CUDA.
#pragma once

#include <cublas_v2.h>

namespace ddp::cuda {

// The cuBLAS entries the kernels call, typed from cublas_v2.h.
struct CublasLib {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasDestroy_v2) destroy;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSetMathMode) set_math_mode;
  decltype(&cublasSgemm_v2) sgemm;
  decltype(&cublasSgemmStridedBatched) sgemm_strided_batched;
  // 16-bit inputs (cuda_gemm.h). Spelled out: cublas_api.h overloads both
  // names in C++ (a compute type given as a cudaDataType), so decltype of
  // the name is ambiguous.
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  cublasStatus_t (*gemm_strided_batched_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                            const void*, const void*, cudaDataType, int, long long, const void*,
                                            cudaDataType, int, long long, const void*, void*, cudaDataType, int,
                                            long long, int, cublasComputeType_t, cublasGemmAlgo_t);
  decltype(&cublasGetStatusName) status_name;
  decltype(&cublasGetStatusString) status_string;
};

// The loaded library, loaded once per process (thread-safe) and never
// unloaded. Throws Error naming the file, where it was looked for and the
// loader's message, or the entry the library lacks.
const CublasLib& cublas();

}  // namespace ddp::cuda
