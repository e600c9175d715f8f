// device_like_stream.h — a stream with a device's interface, for the
// engine's device-stream paths on any machine (Event's native events, the
// metered transport's timestamps, the host's rules in host functions): its
// work runs on an executor thread (a CPU stream inside), its "native
// events" are positions in that work, a native wait is a task that waits
// for the other stream's position, and a timestamp is a task that reads
// the host clock. (The CUDA device's streams are exercised for real in
// CudaDevice.StreamsEventsAndMemory, on a GPU.)
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "device.h"

namespace ddp::test {

class DeviceLikeStream final : public Stream {
 public:
  explicit DeviceLikeStream(const std::string& name) : Stream(name, static_cast<void*>(&inner_)) {}
  ~DeviceLikeStream() override { inner_.synchronize_quietly(); }

  void enqueue(Task task) override {
    ++queued_;
    inner_.enqueue([this, task = std::move(task), index = next_task_index()](bool) mutable {
      run(task, index);  // records a failure on this stream, as a device's host task does
      {
        std::lock_guard<std::mutex> lock(passed_mutex_);
        ++ran_;
      }
      passed_.notify_all();
    });
  }
  void synchronize() override {
    inner_.synchronize();
    if (failed()) throw Error(error());
  }
  void* create_native_event() override { return new std::atomic<int64_t>(0); }
  void record_native_event(void* event) override { static_cast<std::atomic<int64_t>*>(event)->store(queued_); }
  void wait_native_event(void* event) override {
    const int64_t point = static_cast<std::atomic<int64_t>*>(event)->load();
    DeviceLikeStream* source = last_recorder_;  // set by the test: whose position the event is
    enqueue([source, point](bool) {
      while (source->ran_ < point) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
  }
  bool query_native_event(void* event) override { return ran_ >= static_cast<std::atomic<int64_t>*>(event)->load(); }
  // With `blocking` set, blocks until the stream passes the event, as a CUDA
  // stream does (cudaEventSynchronize), and counts the calls.
  bool block_on_native_event(void* event) override {
    if (!blocking) return false;
    ++blocked;
    std::unique_lock<std::mutex> lock(passed_mutex_);
    passed_.wait(lock, [&] { return query_native_event(event); });
    return true;
  }
  bool blocking = false;
  std::atomic<int> blocked{0};
  NativeEventDestroy native_event_destroyer() const override {
    return [](void* event) { delete static_cast<std::atomic<int64_t>*>(event); };
  }

  // A timestamp: the host clock when the stream's work reaches it (a task,
  // run even on a failed stream, as a device passes its events).
  struct Stamp {
    std::atomic<bool> passed{false};
    Clock::time_point at{};
  };
  void* record_timestamp() override {
    auto* stamp = new Stamp;
    enqueue([stamp](bool) {
      stamp->at = Clock::now();
      stamp->passed = true;
    });
    return stamp;
  }
  bool timestamp_passed(void* stamp) override { return static_cast<Stamp*>(stamp)->passed; }
  void resolve_timestamps(void* const* stamps, size_t n, Clock::time_point* out) override {
    for (size_t i = 0; i < n; ++i) {
      auto* s = static_cast<Stamp*>(stamps[i]);
      while (!s->passed) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      out[i] = s->at;
    }
  }
  void release_timestamp(void* stamp) override { delete static_cast<Stamp*>(stamp); }

  DeviceLikeStream* last_recorder_ = nullptr;

 private:
  std::mutex passed_mutex_;
  std::condition_variable passed_;

 public:

 private:
  struct Inner : Stream {
    Inner() : Stream("inner", /*threaded=*/true) {}
    void synchronize_quietly() {
      try {
        Stream::synchronize();
      } catch (const std::exception&) {
      }
    }
  } inner_;
  std::atomic<int64_t> queued_{0}, ran_{0};
};

}  // namespace ddp::test
