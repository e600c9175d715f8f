// cuda_device.cpp — the CUDA device: one GPU per rank, plain cudaMalloc with
// the same accounting as the CPU (and cudaHostAlloc'd page-locked memory for
// staging GPU buffers through the host, alloc_host), and two engine-owned streams (compute,
// communication) created non-blocking, so neither waits on the legacy
// default stream. Host tasks on a stream (a transport's bookkeeping, an
// event's completion) run through cudaLaunchHostFunc, in order with the
// stream's kernels; they must not call CUDA. Built with DDP_WITH_CUDA only.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "convert.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_ops.h"
#include "device.h"
#include "env.h"
#include "error.h"

namespace ddp {
namespace {

using cuda::check;

cudaStream_t raw(Stream& s) { return static_cast<cudaStream_t>(s.native()); }

class CudaStream final : public Stream {
 public:
  CudaStream(std::string name, cudaStream_t stream) : Stream(std::move(name), stream) {}
  ~CudaStream() override {
    cudaStreamSynchronize(raw(*this));  // host tasks reference this object
    if (anchor_) cudaEventDestroy(anchor_);
    if (anchor_stream_) cudaStreamDestroy(anchor_stream_);
    cudaStreamDestroy(raw(*this));
  }

  void enqueue(Task task) override {
    auto* call = new Call{this, std::move(task), next_task_index()};
    const cudaError_t e = cudaLaunchHostFunc(raw(*this), &CudaStream::trampoline, call);
    if (e != cudaSuccess) {
      delete call;
      check(e, ("cudaLaunchHostFunc on the " + name() + " stream").c_str());
    }
  }

  void synchronize() override {
    check(cudaStreamSynchronize(raw(*this)), ("cudaStreamSynchronize of the " + name() + " stream").c_str());
    if (failed()) throw Error(error(), error_kind());
  }

  void* create_native_event() override {
    cudaEvent_t event = nullptr;
    check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
    return event;
  }
  void record_native_event(void* event) override {
    check(cudaEventRecord(static_cast<cudaEvent_t>(event), raw(*this)), "cudaEventRecord");
  }
  void wait_native_event(void* event) override {
    check(cudaStreamWaitEvent(raw(*this), static_cast<cudaEvent_t>(event), 0), "cudaStreamWaitEvent");
  }
  bool query_native_event(void* event) override {
    const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (e == cudaErrorNotReady) {
      cudaGetLastError();  // not an error
      return false;
    }
    check(e, "cudaEventQuery");
    return true;
  }
  bool block_on_native_event(void* event) override {
    check(cudaEventSynchronize(static_cast<cudaEvent_t>(event)), "cudaEventSynchronize");
    return true;
  }
  NativeEventDestroy native_event_destroyer() const override {
    return [](void* event) { cudaEventDestroy(static_cast<cudaEvent_t>(event)); };
  }

  // Timestamps: timing events, placed on the host clock through an anchor
  // (an event the host saw complete at a known time; the error is the
  // host's wake-up latency, microseconds). The anchor is recorded on a
  // stream of its own, always idle, so taking it never waits for this
  // stream's queued work; it is renewed every 10 s (cudaEventElapsedTime is
  // a float of milliseconds, whose resolution would fall to 0.1 ms after
  // half an hour from one anchor), at most once per resolve_timestamps, so
  // that the stamps resolved together share one.
  void* record_timestamp() override {
    cudaEvent_t event = nullptr;
    check(cudaEventCreate(&event), "cudaEventCreate (timestamp)");
    check(cudaEventRecord(event, raw(*this)), "cudaEventRecord (timestamp)");
    return event;
  }
  bool timestamp_passed(void* stamp) override { return query_native_event(stamp); }
  void resolve_timestamps(void* const* stamps, size_t n, Clock::time_point* out) override {
    if (!anchor_ || Clock::now() - anchor_at_ > std::chrono::seconds(10)) {
      if (!anchor_) {
        check(cudaStreamCreateWithFlags(&anchor_stream_, cudaStreamNonBlocking), "cudaStreamCreate (anchor)");
        check(cudaEventCreate(&anchor_), "cudaEventCreate (anchor)");
      }
      check(cudaEventRecord(anchor_, anchor_stream_), "cudaEventRecord (anchor)");
      check(cudaEventSynchronize(anchor_), "cudaEventSynchronize (anchor)");
      anchor_at_ = Clock::now();
    }
    for (size_t i = 0; i < n; ++i) {
      const auto event = static_cast<cudaEvent_t>(stamps[i]);
      check(cudaEventSynchronize(event), "cudaEventSynchronize (timestamp)");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, anchor_, event), "cudaEventElapsedTime");
      out[i] = anchor_at_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(ms));
    }
  }
  void release_timestamp(void* stamp) override { cudaEventDestroy(static_cast<cudaEvent_t>(stamp)); }

 private:
  struct Call {
    CudaStream* stream;
    Task task;
    int64_t index;  // the stream's task number
  };
  cudaEvent_t anchor_ = nullptr;          // timestamps' reference point
  cudaStream_t anchor_stream_ = nullptr;  // where it is recorded: idle
  Clock::time_point anchor_at_{};
  // Runs on CUDA's callback thread; run() records a failure (never throws
  // for a threaded stream), so nothing escapes into the driver.
  static void CUDART_CB trampoline(void* user) {
    std::unique_ptr<Call> call(static_cast<Call*>(user));
    call->stream->run(call->task, call->index);
  }
};

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal) {
    check(cudaSetDevice(ordinal), ("cudaSetDevice(" + std::to_string(ordinal) + ")").c_str());
    cudaStream_t compute = nullptr;
    cudaStream_t comm = nullptr;
    check(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), "cudaStreamCreate (compute)");
    compute_ = std::make_unique<CudaStream>("compute", compute);
    check(cudaStreamCreateWithFlags(&comm, cudaStreamNonBlocking), "cudaStreamCreate (comm)");
    comm_ = std::make_unique<CudaStream>("comm", comm);
  }

  ~CudaDevice() override {
    cudaDeviceSynchronize();
    comm_.reset();
    compute_.reset();
    for (void* ptr : blocks_.pointers()) cudaFree(ptr);
    for (void* ptr : host_blocks_.pointers()) cudaFreeHost(ptr);
    if (partials_) cudaFree(partials_);
  }

  ddp_device_kind kind() const override { return DDP_DEVICE_CUDA; }

  // Zeroed before return: the memset is on the compute stream, which is then
  // waited for, so no stream sees the memory before it is zero.
  void* alloc(size_t bytes, MemCategory category) override {
    void* ptr = nullptr;
    const cudaError_t e = cudaMalloc(&ptr, bytes ? bytes : 1);
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw Error("out of GPU memory allocating " + std::to_string(bytes) + " bytes of " + to_string(category) +
                      " on GPU " + std::to_string(ordinal_) + " (" + cudaGetErrorString(e) + ")",
                  DDP_ERR_OUT_OF_MEMORY);
    }
    check(cudaMemsetAsync(ptr, 0, bytes, raw(*compute_)), "cudaMemsetAsync");
    check(cudaStreamSynchronize(raw(*compute_)), "cudaStreamSynchronize after cudaMemsetAsync");
    blocks_.add(ptr, bytes, category);
    return ptr;
  }

  void free(void* ptr) override {
    if (!ptr) return;
    blocks_.remove(ptr, "free of memory not allocated by this device");
    // Waits for the device: not inside a step. Never throws: tensors free in
    // destructors, also while an earlier CUDA error unwinds (after a device
    // fault every call fails), and that error is the one to report.
    if (cudaFree(ptr) != cudaSuccess) cudaGetLastError();
  }

  // Page-locked, so that copies between it and the GPU stay asynchronous;
  // cudaHostAlloc's memory is page-aligned, and zeroed here by the CPU.
  void* alloc_host(size_t bytes, MemCategory category) override {
    void* ptr = nullptr;
    const cudaError_t e = cudaHostAlloc(&ptr, bytes ? bytes : 1, cudaHostAllocDefault);
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw Error("out of page-locked host memory allocating " + std::to_string(bytes) + " bytes of " +
                      to_string(category) + " (" + cudaGetErrorString(e) + ")",
                  DDP_ERR_OUT_OF_MEMORY);
    }
    std::memset(ptr, 0, bytes);
    host_blocks_.add(ptr, bytes, category);
    return ptr;
  }

  void free_host(void* ptr) override {
    if (!ptr) return;
    host_blocks_.remove(ptr, "free_host of memory not allocated by alloc_host of this device");
    if (cudaFreeHost(ptr) != cudaSuccess) cudaGetLastError();  // never throws, as free
  }

  void copy(void* dst, const void* src, size_t bytes, Stream& stream) override {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, raw(stream)), "cudaMemcpyAsync");
  }
  void fill(float* data, size_t count, float value, Stream& stream) override {
    cuda_ops::fill(stream.native(), data, count, value);
  }
  void add(float* dst, const float* src, size_t count, Stream& stream) override {
    cuda_ops::add(stream.native(), dst, src, count);
  }
  void scale(float* data, size_t count, float factor, Stream& stream) override {
    cuda_ops::scale(stream.native(), data, count, factor);
  }
  void convert(void* dst, ddp_dtype dst_type, const void* src, ddp_dtype src_type, size_t count,
               Stream& stream) override {
    if (std::string why = convert_refusal(dst_type, src_type); !why.empty()) throw Error(why, DDP_ERR_UNSUPPORTED);
    cuda_ops::convert(stream.native(), dst, dst_type, src, src_type, count);
  }
  void upload(void* dst, const void* host_src, size_t bytes) override {
    check(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, raw(*compute_)), "cudaMemcpyAsync (upload)");
    check(cudaStreamSynchronize(raw(*compute_)), "cudaStreamSynchronize (upload)");
  }
  void download(void* host_dst, const void* src, size_t bytes) override {
    check(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, raw(*compute_)), "cudaMemcpyAsync (download)");
    check(cudaStreamSynchronize(raw(*compute_)), "cudaStreamSynchronize (download)");
  }
  // Every vector's chunks summed on the device, the partials copied back in
  // one download and added in order here.
  void sums_of_squares(const float* const* x, const size_t* n, size_t count, double* out) override {
    std::vector<size_t> first(count + 1, 0);  // vector i's partials: [first[i], first[i + 1])
    for (size_t i = 0; i < count; ++i) first[i + 1] = first[i] + cuda_ops::square_chunks(n[i]);
    const size_t chunks = first[count];
    if (chunks == 0) {
      std::fill(out, out + count, 0.0);
      return;
    }
    if (chunks > partial_count_) {  // (grown between steps' norms: the stream has finished with the old one)
      check(cudaStreamSynchronize(raw(*compute_)), "cudaStreamSynchronize (sums of squares)");
      if (partials_) cudaFree(partials_);
      partials_ = nullptr;
      partial_count_ = 0;
      const cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&partials_), chunks * sizeof(double));
      if (e != cudaSuccess) {
        cudaGetLastError();
        partials_ = nullptr;
        throw Error("out of GPU memory allocating " + std::to_string(chunks * sizeof(double)) +
                        " bytes for the gradients' sums of squares on GPU " + std::to_string(ordinal_) + " (" +
                        cudaGetErrorString(e) + ")",
                    DDP_ERR_OUT_OF_MEMORY);
      }
      partial_count_ = chunks;
    }
    for (size_t i = 0; i < count; ++i) cuda_ops::square_sums(compute_->native(), x[i], n[i], partials_ + first[i]);
    host_partials_.resize(chunks);
    download(host_partials_.data(), partials_, chunks * sizeof(double));
    for (size_t i = 0; i < count; ++i) {
      double sum = 0.0;
      for (size_t c = first[i]; c < first[i + 1]; ++c) sum += host_partials_[c];
      out[i] = sum;
    }
  }

 private:
  int ordinal_;
  // sums_of_squares' float64 per chunk, on the device and back here: not
  // accounted (one float64 per 16384 gradient elements, as cuBLAS's
  // workspace is not).
  double* partials_ = nullptr;
  size_t partial_count_ = 0;
  std::vector<double> host_partials_;
  BlockTable blocks_{memory_};
  BlockTable host_blocks_{memory_};  // alloc_host's
};

}  // namespace

// Any error of cudaGetDeviceCount means no usable GPU: without a driver the
// runtime answers cudaErrorInsufficientDriver, not "no device".
std::unique_ptr<Device> make_cuda_device(int local_rank, bool share_gpus) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    throw Error(std::string("device \"cuda\": no usable GPU on this machine (cudaGetDeviceCount: ") +
                    (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") + ")",
                DDP_ERR_UNSUPPORTED);
  }
  return std::make_unique<CudaDevice>(choose_gpu(local_rank, count, env().get("CUDA_VISIBLE_DEVICES"), share_gpus));
}

}  // namespace ddp
