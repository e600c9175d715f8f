// blas_info.h — the OpenBLAS this process runs: the kernel it loaded, its
// build, its thread count. Here because the models link BLAS; the names of
// the kernels a run may choose are data (engine/core/blas_kernels.h). Not a
// model layer: the engine's run summary and the kernel choice read it
// without the layers (layers.h).
#pragma once

#include <string>

namespace ddp {

// The kernel this process's OpenBLAS loaded ("Haswell", ...), and its
// build (openblas_get_config without the kernel's name).
std::string blas_kernel_loaded();
std::string blas_build();
// The threads OpenBLAS's GEMMs use in this process.
void set_blas_threads(int threads);

}  // namespace ddp
