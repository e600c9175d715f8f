// cuda_kernels.h — the models' kernels (kernels.h) on a CUDA GPU: cuBLAS for
// the GEMMs (cuda_gemm.h: float32 without TF32, or 16-bit inputs in the
// compute dtype), CUDA kernels for the rest, all enqueued on one stream.
// Only in builds with DDP_WITH_CUDA.
#pragma once

#include <memory>

#include "kernels.h"

namespace ddp {

// Kernels working on `stream` (a cudaStream_t) of the current CUDA device.
// Throws Error if cuBLAS cannot be set up.
std::unique_ptr<Kernels> make_cuda_kernels(void* stream);

}  // namespace ddp
