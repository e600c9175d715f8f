// cuda_compute.h — the Compute of compute.h on a CUDA GPU
// (cuda_compute.cu): cuBLAS's strided batched sgemm in pedantic float32
// (no TF32) and kernels for dot, norm, axpy and normalize. Only in builds
// with DDP_WITH_CUDA.
#pragma once

#include <memory>

#include "compute.h"

namespace ddp {

// Works on the device current on the calling thread; each stream it is
// given gets a cuBLAS handle of its own, made on first use. Throws Error if
// cuBLAS cannot be loaded or set up.
std::unique_ptr<Compute> make_cuda_compute();

}  // namespace ddp
