// device.h — where tensors live and work runs: memory with accounting by
// category, in-order streams and events with CUDA's semantics.
//
// CPU model: the compute stream is the training thread itself (work enqueued
// on it runs at once, inline); the communication stream is an executor
// thread owned by the engine. A task that throws fails its stream: the error
// is sticky, later tasks are called with cancelled = true, and every event
// recorded afterwards fails with the same message. This is how a transport
// error (a Gloo timeout, a dead peer) reaches the training thread.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <ddp/plugin.h>

#include "error.h"

namespace ddp {

using Clock = std::chrono::steady_clock;

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

// An in-order queue of work. CPU streams: inline ones run each task in the
// caller's thread at enqueue time; threaded ones on their own executor
// thread. A device's streams (CUDA) derive from this class: their tasks run
// in order with the device's own work (cudaLaunchHostFunc), and native()
// is their handle.
class Stream {
 public:
  // A task gets cancelled = true when the stream has failed before it ran;
  // it must then only release what it owns. Throwing fails the stream.
  using Task = std::function<void(bool cancelled)>;

  Stream(std::string name, bool threaded);  // a CPU stream
  virtual ~Stream();  // CPU: drains the queue, then joins the executor
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Threaded: queues the task. Inline: runs it now, and if it throws, fails
  // the stream and rethrows, so the caller sees the failure at once.
  virtual void enqueue(Task task);
  // Blocks until every task enqueued so far has run. Throws Error with the
  // stream's failure message if it failed.
  virtual void synchronize();
  bool failed() const;
  std::string error() const;
  // Whether the calling thread is running a device stream's task (a CUDA
  // host function), where no call into the device is allowed.
  static bool in_device_task();
  const std::string& name() const { return name_; }
  // Whether enqueue returns before the work ran (false: inline).
  bool threaded() const { return threaded_; }
  // The device's handle (a cudaStream_t), or null for a CPU stream.
  void* native() const { return native_; }

  // Native events order a device's streams among themselves without the
  // host (cudaEventRecord / cudaStreamWaitEvent). A CPU stream has none:
  // create_native_event returns null and Event falls back to host tasks.
  virtual void* create_native_event() { return nullptr; }
  virtual void record_native_event(void* /*event*/) {}
  virtual void wait_native_event(void* /*event*/) {}
  // Whether the device has passed the event (throws Error on a device error).
  virtual bool query_native_event(void* /*event*/) { return true; }
  // Frees an event create_native_event made (any stream of the device).
  using NativeEventDestroy = void (*)(void* event);
  virtual NativeEventDestroy native_event_destroyer() const { return nullptr; }

  // Timestamps for traces and metering: a point the stream takes when the
  // device gets there (a timing CUDA event). resolve_timestamps waits for
  // each and gives the host clock's time of them (placed together, so the
  // durations between them are the device's); release_timestamp frees one.
  // A CPU stream has none (null; its work runs when enqueued: the host
  // clock says when).
  virtual void* record_timestamp() { return nullptr; }
  // Whether the device has passed it, without waiting.
  virtual bool timestamp_passed(void* /*stamp*/) { return true; }
  virtual void resolve_timestamps(void* const* /*stamps*/, size_t n, Clock::time_point* out) {
    for (size_t i = 0; i < n; ++i) out[i] = Clock::now();
  }
  virtual void release_timestamp(void* /*stamp*/) {}

  // A device stream numbers its tasks (next_task_index, at enqueue), so
  // that an event can tell whether a failure came before its point:
  // task_count() when it was recorded.
  int64_t task_count() const { return tasks_.load(); }
  // Whether the stream failed in one of its first `point` tasks (or in a
  // task it did not number).
  bool failed_before(int64_t point) const;

 protected:
  // A device stream: no executor thread; enqueue and synchronize overridden.
  Stream(std::string name, void* native);
  // Runs one task (`index`: its number, device streams), recording a
  // failure (rethrown if inline).
  void run(Task& task, int64_t index = -1);
  int64_t next_task_index() { return tasks_.fetch_add(1); }

 private:
  void loop();

  std::string name_;
  bool threaded_;
  void* native_ = nullptr;
  mutable std::mutex mutex_;
  std::condition_variable cv_;       // work arrived / stop
  std::condition_variable idle_cv_;  // queue drained
  std::deque<Task> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::string error_;  // sticky; empty while healthy
  int64_t failed_task_ = -1;  // the numbered task that failed, -1: none or unnumbered
  std::atomic<int64_t> tasks_{0};
  std::thread thread_;
};

// A point on a stream. Recording re-arms it; it completes when the stream
// reaches it, or fails if the stream has failed by then. On a device stream
// it is a native event, so that waits between the device's streams stay on
// the device.
class Event {
 public:
  void record(Stream& stream);
  // Blocks until complete; throws Error with the stream's message on failure,
  // or when `limit` passes first (a stuck collective).
  void synchronize(std::chrono::milliseconds limit = std::chrono::milliseconds::max());
  // True once complete, or failed (CPU); on a device stream once the device
  // has passed it, even if the stream failed before (error() says).
  bool query();
  // The failure of a completed event ("" if none): its stream's message.
  std::string error();
  // Whether it was recorded on a device stream (a native event).
  bool on_device() const { return native_ && native_->recorded; }
  // Makes `stream` wait (without blocking the caller, unless inline); the
  // wait fails the stream if `limit` passes first, or if the event failed.
  void make_wait(Stream& stream, std::chrono::milliseconds limit = std::chrono::milliseconds::max());
  Clock::time_point completed_at();

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable cv;
    bool done = true;
    std::string error;
    Clock::time_point at{};
  };
  struct Native {  // a device's event, freed with the last copy of the Event
    void* event = nullptr;
    Stream::NativeEventDestroy destroy = nullptr;
    bool recorded = false;
    Stream* stream = nullptr;  // where it was last recorded
    int64_t point = 0;  // the stream's task count then
    ~Native() {
      if (event && destroy) destroy(event);
    }
  };
  void wait_native(std::chrono::milliseconds limit) const;

  std::shared_ptr<State> state_ = std::make_shared<State>();
  std::shared_ptr<Native> native_;  // recorded on a device stream
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
  // Host <-> device copies, in order with the compute stream; they return
  // when the copy is done (set-up, checkpoints, tests: not the step).
  virtual void upload(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void download(void* host_dst, const void* src, size_t bytes) = 0;
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
  void upload(void* dst, const void* host_src, size_t bytes) override;
  void download(void* host_dst, const void* src, size_t bytes) override;

 private:
  BlockTable blocks_{memory_};
};

// The device of `kind` for the rank with this local rank. CUDA: GPU
// local_rank, or local_rank modulo the GPUs present when share_gpus. Throws
// Error where there is no usable GPU, too few of them, or no CUDA in this
// build.
std::unique_ptr<Device> make_device(ddp_device_kind kind, int local_rank, bool share_gpus);

}  // namespace ddp
