// stream.h — in-order streams of work and events on them, with CUDA's
// semantics, on every device.
//
// CPU model: the compute stream is the training thread itself (work enqueued
// on it runs at once, inline); the communication stream is an executor
// thread owned by the engine. A task that throws fails its stream: the error
// is sticky, later tasks are called with cancelled = true, and every event
// recorded afterwards fails with the same message. This is how a transport
// error (a Gloo timeout, a dead peer) reaches the training thread. A
// device's streams (CUDA, cuda/cuda_device.cpp) derive from Stream.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <ddp/plugin.h>

#include "error.h"

namespace ddp {

using Clock = std::chrono::steady_clock;

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
  virtual ~Stream();                        // CPU: drains the queue, then joins the executor
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Threaded: queues the task. Inline: runs it now, and if it throws, fails
  // the stream and rethrows, so the caller sees the failure at once.
  virtual void enqueue(Task task);
  // Blocks until every task enqueued so far has run. Throws Error with the
  // stream's failure message if it failed.
  virtual void synchronize();
  // Waits up to `limit` for every task enqueued so far to run: false if one
  // is still running then (a task that never returns). Never throws. A
  // device stream waits as synchronize() does.
  bool drained_within(std::chrono::milliseconds limit);
  bool failed() const;
  std::string error() const;
  // The failure's kind: the status of what failed it (a transport's
  // DDP_ERR_TIMEOUT or DDP_ERR_COMM), DDP_ERR_INTERNAL if unknown.
  ddp_status error_kind() const;
  // Whether the calling thread is running a device stream's task (a CUDA
  // host function), where no call into the device is allowed.
  static bool in_device_task();
  // Whether it is running any stream's task (where waiting for a stream may
  // wait for itself).
  static bool in_task();
  // A note the calling thread's next task failures carry, " (in <note>)"
  // after their message, until set to null; `note` outlives its use. A
  // task before a group's collective sets it, one after clears it: the
  // collective's failure names its group (ABI 1.9).
  static void set_task_note(const char* note);
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
  // Blocks the calling thread until the device has passed the event, as the
  // driver blocks (cudaEventSynchronize), and returns true; false where the
  // stream cannot (the caller polls). No time limit: the rank's watchdog
  // bounds a wait that never ends (whereabouts.h).
  virtual bool block_on_native_event(void* /*event*/) { return false; }
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
  ddp_status error_kind_ = DDP_OK;
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
  ddp_status error_kind();  // its failure's kind (DDP_OK if none), as error()
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
    ddp_status kind = DDP_OK;
    Clock::time_point at{};
  };
  struct Native {  // a device's event, freed with the last copy of the Event
    void* event = nullptr;
    Stream::NativeEventDestroy destroy = nullptr;
    bool recorded = false;
    Stream* stream = nullptr;  // where it was last recorded
    int64_t point = 0;         // the stream's task count then
    ~Native() {
      if (event && destroy) destroy(event);
    }
  };
  void wait_native(std::chrono::milliseconds limit) const;

  std::shared_ptr<State> state_ = std::make_shared<State>();
  std::shared_ptr<Native> native_;  // recorded on a device stream
};

}  // namespace ddp
