// cuda_check.h — the one way a CUDA failure becomes a ddp::Error: the call
// that failed, then CUDA's own words. Used by the CUDA device, its kernels
// (cuda_ops.cu) and the models' kernels (engine/models/cuda/). Builds with
// DDP_WITH_CUDA only.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "error.h"

namespace ddp::cuda {

// Throws Error("<what>: <CUDA's message>") unless `e` is cudaSuccess. A
// non-sticky error is cleared first, so the next call does not see it.
inline void check(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();
  throw Error(what + ": " + cudaGetErrorString(e) + " (" + cudaGetErrorName(e) + ")");
}

// After a kernel launch: a bad launch configuration, no device, or a sticky
// error an earlier kernel left fails here, naming the kernel, not at the
// next synchronisation.
inline void check_launch(const std::string& kernel) { check(cudaGetLastError(), "launch of kernel " + kernel); }

}  // namespace ddp::cuda
