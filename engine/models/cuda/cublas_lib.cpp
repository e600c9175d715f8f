// cublas_lib.cpp — loads cuBLAS on first use (cublas_lib.h). The library is
// looked for as the dynamic linker would find a linked one
// (LD_LIBRARY_PATH, the binary's run path, the system's cache), then in the
// toolkit this build was made with.
#include "cuda/cublas_lib.h"

#include <string>
#include <type_traits>

#include <boost/dll/shared_library.hpp>
#include <boost/system/system_error.hpp>

#include "error.h"

namespace ddp::cuda {
namespace {

namespace dll = boost::dll;

dll::shared_library load_library() {
  const std::string candidates[] = {DDP_CUBLAS_SONAME, std::string(DDP_CUDA_LIBRARY_DIR) + "/" + DDP_CUBLAS_SONAME};
  std::string failures;
  for (const std::string& path : candidates) {
    try {
      return dll::shared_library(path, dll::load_mode::search_system_folders);
    } catch (const boost::system::system_error& e) {
      failures += "\n  " + path + ": " + e.what();
    }
  }
  throw Error(std::string("cuBLAS: cannot load ") + DDP_CUBLAS_SONAME +
              " (a CUDA device needs it; set LD_LIBRARY_PATH to the CUDA toolkit's lib folder):" + failures);
}

template <typename F>
F entry(const dll::shared_library& lib, const char* name) {
  if (!lib.has(name))
    throw Error(std::string("cuBLAS: ") + lib.location().string() + " has no entry '" + name +
                "' (a cuBLAS older than the toolkit this build was made with?)");
  return &lib.get<std::remove_pointer_t<F>>(name);
}

CublasLib load() {
  // Never unloaded, not even at exit: a stream may still be inside it.
  static const dll::shared_library& lib = *new dll::shared_library(load_library());
  CublasLib api{};
  api.create = entry<decltype(api.create)>(lib, "cublasCreate_v2");
  api.destroy = entry<decltype(api.destroy)>(lib, "cublasDestroy_v2");
  api.set_stream = entry<decltype(api.set_stream)>(lib, "cublasSetStream_v2");
  api.set_math_mode = entry<decltype(api.set_math_mode)>(lib, "cublasSetMathMode");
  api.sgemm = entry<decltype(api.sgemm)>(lib, "cublasSgemm_v2");
  api.sgemm_strided_batched = entry<decltype(api.sgemm_strided_batched)>(lib, "cublasSgemmStridedBatched");
  api.gemm_ex = entry<decltype(api.gemm_ex)>(lib, "cublasGemmEx");
  api.gemm_strided_batched_ex = entry<decltype(api.gemm_strided_batched_ex)>(lib, "cublasGemmStridedBatchedEx");
  api.status_name = entry<decltype(api.status_name)>(lib, "cublasGetStatusName");
  api.status_string = entry<decltype(api.status_string)>(lib, "cublasGetStatusString");
  return api;
}

}  // namespace

const CublasLib& cublas() {
  static const CublasLib api = load();
  return api;
}

}  // namespace ddp::cuda
