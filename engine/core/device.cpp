// device.cpp — memory accounting, the CPU device, make_device (see device.h).
#include "device.h"

#include <ddp/plugin.hpp>

#include "convert.h"
#include "update_rules.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace ddp {

const char* to_string(MemCategory category) {
  switch (category) {
    case MemCategory::Parameters: return "parameters";
    case MemCategory::Gradients: return "gradients";
    case MemCategory::OptimizerState: return "optimizer_state";
    case MemCategory::CommBuffers: return "comm_buffers";
    case MemCategory::Activations: return "activations";
  }
  return "unknown";
}

static void raise_peak(std::atomic<size_t>& peak, size_t value) {
  size_t seen = peak.load();
  while (value > seen && !peak.compare_exchange_weak(seen, value)) {}
}

void MemoryTracker::add(MemCategory category, size_t bytes) {
  ++allocations_;
  raise_peak(peak_[index(category)], current_[index(category)] += bytes);
  raise_peak(total_peak_, total_current_ += bytes);
}

void MemoryTracker::sub(MemCategory category, size_t bytes) {
  current_[index(category)] -= bytes;
  total_current_ -= bytes;
}

void MemoryTracker::reset_peaks() {
  for (int i = 0; i < kMemCategories; ++i) peak_[i] = current_[i].load();
  total_peak_ = total_current_.load();
}

// -------------------------------------------------------------- BlockTable

void BlockTable::add(void* ptr, size_t bytes, MemCategory category) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    blocks_[ptr] = {bytes, category};
  }
  memory_.add(category, bytes);
}

void BlockTable::remove(void* ptr, const char* refusal) {
  std::pair<size_t, MemCategory> block;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.find(ptr);
    if (it == blocks_.end()) throw Error(refusal);
    block = it->second;
    blocks_.erase(it);
  }
  memory_.sub(block.second, block.first);
}

std::vector<void*> BlockTable::pointers() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<void*> out;
  for (const auto& entry : blocks_) out.push_back(entry.first);
  return out;
}

// --------------------------------------------------------------- CpuDevice

CpuDevice::CpuDevice() {
  compute_ = std::make_unique<Stream>("compute", /*threaded=*/false);
  comm_ = std::make_unique<Stream>("comm", /*threaded=*/true);
}

CpuDevice::~CpuDevice() {
  comm_.reset();  // join the executor before memory goes away
  for (void* ptr : blocks_.pointers()) std::free(ptr);
}

void* CpuDevice::alloc(size_t bytes, MemCategory category) {
  constexpr size_t kAlign = 64;
  size_t rounded = std::max<size_t>(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  void* ptr = std::aligned_alloc(kAlign, rounded);
  if (!ptr)
    throw Error("out of memory allocating " + std::to_string(bytes) + " bytes of " + to_string(category),
                DDP_ERR_OUT_OF_MEMORY);
  std::memset(ptr, 0, rounded);
  blocks_.add(ptr, bytes, category);
  return ptr;
}

void CpuDevice::free(void* ptr) {
  if (!ptr) return;
  blocks_.remove(ptr, "free of memory not allocated by this device");
  std::free(ptr);
}

void CpuDevice::copy(void* dst, const void* src, size_t bytes, Stream& stream) {
  stream.enqueue([=](bool cancelled) {
    if (!cancelled) std::memcpy(dst, src, bytes);
  });
}

void CpuDevice::fill(float* data, size_t count, float value, Stream& stream) {
  stream.enqueue([=](bool cancelled) {
    if (cancelled) return;
    if (value == 0.0f && !std::signbit(value)) {
      if (count) std::memset(data, 0, count * sizeof(float));  // all bits zero: libc's fastest store loop
    } else {
      std::fill(data, data + count, value);
    }
  });
}

void CpuDevice::upload(void* dst, const void* host_src, size_t bytes) { std::memcpy(dst, host_src, bytes); }

void CpuDevice::download(void* host_dst, const void* src, size_t bytes) { std::memcpy(host_dst, src, bytes); }

void CpuDevice::sums_of_squares(const float* const* x, const size_t* n, size_t count, double* out) {
  for (size_t i = 0; i < count; ++i) out[i] = sum_of_squares(x[i], n[i]);
}

void CpuDevice::scale(float* data, size_t count, float factor, Stream& stream) {
  stream.enqueue([=](bool cancelled) {
    if (cancelled) return;
    for (size_t i = 0; i < count; ++i) data[i] *= factor;
  });
}

void CpuDevice::add(float* dst, const float* src, size_t count, Stream& stream) {
  stream.enqueue([=](bool cancelled) {
    if (cancelled) return;
    for (size_t i = 0; i < count; ++i) dst[i] += src[i];
  });
}

void CpuDevice::convert(void* dst, ddp_dtype dst_type, const void* src, ddp_dtype src_type, size_t count,
                        Stream& stream) {
  if (std::string why = convert_refusal(dst_type, src_type); !why.empty()) throw Error(why, DDP_ERR_UNSUPPORTED);
  stream.enqueue([=](bool cancelled) {
    if (!cancelled) convert_cpu(dst, dst_type, src, src_type, count);
  });
}

int choose_gpu(int local_rank, int visible, const char* cuda_visible_devices, bool share_gpus) {
  const int gpu = plugin::rank_gpu(local_rank, visible, cuda_visible_devices, share_gpus);
  if (gpu >= 0) return gpu;
  throw Error("device \"cuda\": local rank " + std::to_string(local_rank) + " needs GPU " + std::to_string(local_rank) +
                  ", but this machine has " + std::to_string(visible) + " GPU" + (visible == 1 ? "" : "s") +
                  " visible (one GPU per local rank, or one visible to each rank through CUDA_VISIBLE_DEVICES; set "
                  "run.share_gpus = true to let ranks share them, which the gloo transport allows and nccl does not)",
              DDP_ERR_UNSUPPORTED);
}

#if DDP_WITH_CUDA
std::unique_ptr<Device> make_cuda_device(int local_rank, bool share_gpus);  // cuda/cuda_device.cpp
#endif

std::unique_ptr<Device> make_device(ddp_device_kind kind, int local_rank, bool share_gpus) {
  if (kind == DDP_DEVICE_CPU) return std::make_unique<CpuDevice>();
#if DDP_WITH_CUDA
  return make_cuda_device(local_rank, share_gpus);
#else
  (void)local_rank;
  (void)share_gpus;
  throw Error(
      "device \"cuda\": this build of ddp has no CUDA (it was configured without "
      "nvcc or with -DDDP_WITH_CUDA=OFF)",
      DDP_ERR_UNSUPPORTED);
#endif
}

}  // namespace ddp
