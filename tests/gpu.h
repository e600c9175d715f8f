// gpu.h — whether this machine has a usable GPU, for tests of the GPU path
// that must skip (GTEST_SKIP, with the reason) where none is. Any error of
// cudaGetDeviceCount counts as none: without a driver the runtime returns
// cudaErrorInsufficientDriver, not "no device".
#pragma once

#include <cuda_runtime_api.h>

#include <string>

namespace ddp::test {

struct Gpus {
  int count = 0;
  std::string why;  // why count is 0: the runtime's words
};

inline const Gpus& gpus() {
  static const Gpus found = [] {
    Gpus g;
    const cudaError_t e = cudaGetDeviceCount(&g.count);
    if (e != cudaSuccess) {
      g.count = 0;
      g.why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
      cudaGetLastError();  // clear it
    } else if (g.count == 0) {
      g.why = "cudaGetDeviceCount: 0 devices";
    }
    return g;
  }();
  return found;
}

}  // namespace ddp::test

// First statement of a test that needs n GPUs.
#define DDP_REQUIRE_GPUS(n)                                                                  \
  if (::ddp::test::gpus().count < (n))                                                       \
  GTEST_SKIP() << "needs " << (n) << " GPU(s); this machine has " << ::ddp::test::gpus().count \
               << " (" << ::ddp::test::gpus().why << ")"
