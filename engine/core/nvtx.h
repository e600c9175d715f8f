// nvtx.h — NVTX ranges for Nsight Systems on GPU builds: the trainer marks
// forward, backward and the optimizer step on the training thread; the
// metered transport marks each collective: on a GPU its enqueue on the
// training thread (Nsight Systems projects such a range onto the kernels
// launched in it), on a CPU stream from when the stream starts it to when
// it is done. Without a profiler attached NVTX
// calls return at once; in builds without CUDA they compile to nothing.
#pragma once

#include <cstdint>

#if DDP_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace ddp::nvtx {

// A nested range on the calling thread, for the scope's lifetime.
class Range {
 public:
#if DDP_WITH_CUDA
  explicit Range(const char* name) { nvtxRangePushA(name); }
  ~Range() { nvtxRangePop(); }
#else
  explicit Range(const char*) {}
#endif
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;
};

// A range that may end on another thread (a stream's host tasks).
inline uint64_t start(const char* name) {
#if DDP_WITH_CUDA
  return nvtxRangeStartA(name);
#else
  (void)name;
  return 0;
#endif
}

inline void end(uint64_t id) {
#if DDP_WITH_CUDA
  nvtxRangeEnd(id);
#else
  (void)id;
#endif
}

}  // namespace ddp::nvtx
