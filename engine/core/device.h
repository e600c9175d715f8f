// device.h — where tensors live and work runs: memory with accounting by
// category, and the two streams of a rank (stream.h): compute and
// communication. CpuDevice here; the CUDA device in cuda/cuda_device.cpp.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <ddp/plugin.h>

#include "error.h"
#include "stream.h"

namespace ddp {

enum class MemCategory : int {
  Parameters = DDP_MEM_PARAMETERS,
  Gradients = DDP_MEM_GRADIENTS,
  OptimizerState = DDP_MEM_OPTIMIZER_STATE,
  CommBuffers = DDP_MEM_COMM_BUFFERS,
  Activations = DDP_MEM_ACTIVATIONS,
};
constexpr int kMemCategories = DDP_MEM_CATEGORY_COUNT;
const char* to_string(MemCategory category);  // "parameters", "gradients", ...

// Current and peak bytes per category (and in total). Thread-safe.
class MemoryTracker {
 public:
  void add(MemCategory category, size_t bytes);
  void sub(MemCategory category, size_t bytes);
  size_t current(MemCategory category) const { return current_[index(category)]; }
  size_t peak(MemCategory category) const { return peak_[index(category)]; }
  size_t total_peak() const { return total_peak_; }
  // Allocations so far (every add); the training step must make none after
  // its first run.
  int64_t allocations() const { return allocations_; }
  // Starts a new measurement window: peaks drop to the current values.
  void reset_peaks();

 private:
  static size_t index(MemCategory c) { return static_cast<size_t>(c); }
  std::array<std::atomic<size_t>, kMemCategories> current_{};
  std::array<std::atomic<size_t>, kMemCategories> peak_{};
  std::atomic<size_t> total_current_{0};
  std::atomic<size_t> total_peak_{0};
  std::atomic<int64_t> allocations_{0};
};

// The blocks a device has handed out, with their sizes and categories,
// accounted in `memory` as they come and go. Thread-safe.
class BlockTable {
 public:
  explicit BlockTable(MemoryTracker& memory) : memory_(memory) {}
  void add(void* ptr, size_t bytes, MemCategory category);
  // Forgets a block and takes its bytes off; throws Error(refusal) for a
  // pointer that is not in the table.
  void remove(void* ptr, const char* refusal);
  std::vector<void*> pointers() const;  // the blocks still out

 private:
  MemoryTracker& memory_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, std::pair<size_t, MemCategory>> blocks_;
};

// The engine's device: memory and the two streams. One per rank.
class Device {
 public:
  virtual ~Device() = default;
  virtual ddp_device_kind kind() const = 0;
  // Zeroed, 64-byte aligned, accounted under `category`. Throws on failure.
  virtual void* alloc(size_t bytes, MemCategory category) = 0;
  virtual void free(void* ptr) = 0;  // accepts nullptr
  // Host memory to stage this device's buffers through, accounted like
  // alloc: page-locked on CUDA (async copies stay async), plain on the CPU.
  // Not from a stream's host task (no CUDA calls there).
  virtual void* alloc_host(size_t bytes, MemCategory category) = 0;
  virtual void free_host(void* ptr) = 0;  // accepts nullptr
  virtual void copy(void* dst, const void* src, size_t bytes, Stream& stream) = 0;
  virtual void fill(float* data, size_t count, float value, Stream& stream) = 0;
  virtual void scale(float* data, size_t count, float factor, Stream& stream) = 0;
  // dst[i] += src[i] (a float32 sum, rounded once per element).
  virtual void add(float* dst, const float* src, size_t count, Stream& stream) = 0;
  // dst[i] = src[i] converted (convert.h: float32 <-> bfloat16, float16).
  virtual void convert(void* dst, ddp_dtype dst_type, const void* src, ddp_dtype src_type, size_t count,
                       Stream& stream) = 0;
  // Host <-> device copies, in order with the compute stream; they return
  // when the copy is done (set-up, checkpoints, tests: not the step).
  virtual void upload(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void download(void* host_dst, const void* src, size_t bytes) = 0;
  // out[i] = the sum of x[i][j]² over j < n[i], in float64, for each of the
  // `count` vectors, read in order with the compute stream; returns when
  // done (the gradients' norm: clipping, loss scaling). The CPU sums in
  // update_rules.h's fixed lanes (sum_of_squares's bits); a GPU reads each
  // vector on the device and copies back one float64 per 16384 elements
  // (the same bits run to run, not the CPU's).
  virtual void sums_of_squares(const float* const* x, const size_t* n, size_t count, double* out) = 0;
  Stream& compute_stream() { return *compute_; }
  Stream& comm_stream() { return *comm_; }
  MemoryTracker& memory() { return memory_; }

 protected:
  MemoryTracker memory_;
  std::unique_ptr<Stream> compute_;
  std::unique_ptr<Stream> comm_;
};

class CpuDevice final : public Device {
 public:
  CpuDevice();
  ~CpuDevice() override;
  ddp_device_kind kind() const override { return DDP_DEVICE_CPU; }
  void* alloc(size_t bytes, MemCategory category) override;
  void free(void* ptr) override;
  void* alloc_host(size_t bytes, MemCategory category) override { return alloc(bytes, category); }
  void free_host(void* ptr) override { free(ptr); }
  void copy(void* dst, const void* src, size_t bytes, Stream& stream) override;
  void fill(float* data, size_t count, float value, Stream& stream) override;
  void scale(float* data, size_t count, float factor, Stream& stream) override;
  void add(float* dst, const float* src, size_t count, Stream& stream) override;
  void convert(void* dst, ddp_dtype dst_type, const void* src, ddp_dtype src_type, size_t count,
               Stream& stream) override;
  void upload(void* dst, const void* host_src, size_t bytes) override;
  void download(void* host_dst, const void* src, size_t bytes) override;
  void sums_of_squares(const float* const* x, const size_t* n, size_t count, double* out) override;

 private:
  BlockTable blocks_{memory_};
};

// The GPU (index among the `visible` ones) of the rank with `local_rank`:
// ddp::plugin::rank_gpu (the one GPU a launcher left visible, else GPU
// local_rank, else local_rank modulo visible when shared); throws Error
// (DDP_ERR_UNSUPPORTED) saying why where there is none. Pure.
int choose_gpu(int local_rank, int visible, const char* cuda_visible_devices, bool share_gpus);

// The device of `kind` for the rank with this local rank. CUDA: GPU
// local_rank, or local_rank modulo the GPUs present when share_gpus. Throws
// Error where there is no usable GPU, too few of them, or no CUDA in this
// build.
std::unique_ptr<Device> make_device(ddp_device_kind kind, int local_rank, bool share_gpus);

}  // namespace ddp
