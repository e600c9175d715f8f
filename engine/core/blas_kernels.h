// blas_kernels.h — the names of the OpenBLAS GEMM kernels (OPENBLAS_CORETYPE
// values) `ddp run` may choose between, besides OpenBLAS's own pick
// (engine/blas/blas_choice.h): data the config validates run.blas_kernel
// against and the kernel choice measures, so it sits below both. What this
// process's OpenBLAS loaded is the models' (engine/models/blas_info.h), where
// BLAS is linked; this header links nothing.
#pragma once

#include <string>
#include <vector>

namespace ddp {

// x86-64 kernels of Debian's DYNAMIC_ARCH build, oldest first.
inline const std::vector<std::string>& blas_kernel_candidates() {
  static const std::vector<std::string> names = {"Sandybridge", "Haswell", "Zen", "SkylakeX", "Cooperlake"};
  return names;
}

}  // namespace ddp
