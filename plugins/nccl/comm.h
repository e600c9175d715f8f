// comm.h — the nccl transport's communicator (ddp_comm_s), the world's or a
// group's alike: its state, the watchdog that fails it (a thread per
// communicator), one NCCL call enqueued on a stream and marked for the
// watchdog, and its release. nccl_transport.cpp's opening comment is the
// full account. Part of the nccl plugin; comm.cpp has what is not inline.
// Not here: set-up (the unique id, ncclCommInitRankConfig, ncclCommSplit),
// the argument checks and the entries (nccl_transport.cpp).
#pragma once

#include <ddp/plugin.h>
#include <ddp/plugin.hpp>
#include <ddp/transport.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace ddp_nccl {

using Clock = std::chrono::steady_clock;

// The first failure of a communicator: message and status are written once,
// before `failed` is set, and read without a lock by host functions on the
// streams (which hold their own reference: they may run after destroy).
struct FailureState {
  const ddp_host* host = nullptr;
  std::atomic<bool> failed{false};
  ddp_status status = DDP_OK;
  std::string message;
};

// A collective enqueued and not yet seen complete by the watchdog.
struct InFlight {
  cudaEvent_t done;
  Clock::time_point since;
  std::string what;  // "all_reduce (4096 bytes)"
};

}  // namespace ddp_nccl

struct ddp_comm_s {
  ~ddp_comm_s();

  const ddp_host* host = nullptr;
  // This rank's place in the communicator: the host's rank and world size
  // for the world's; how->rank and how->size for a group's (split), whose
  // tag names it in messages ("" for the world's).
  int rank = 0;
  int size = 1;
  std::string tag;
  int gpu = 0;  // this rank's, among the visible ones (a group's: its parent's)
  bool fail_streams = true;
  std::chrono::milliseconds timeout{30000};
  std::shared_ptr<ddp_nccl::FailureState> failure = std::make_shared<ddp_nccl::FailureState>();
  void* barrier_buf = nullptr;  // one float on the device

  std::mutex mutex;           // guards what follows; held across every NCCL call
  ncclComm_t nccl = nullptr;  // NULL once aborted
  std::deque<ddp_nccl::InFlight> in_flight;
  std::vector<cudaEvent_t> spare_events;
  bool stopping = false;
  bool watchdog_done = false;  // set by the watchdog as it ends
  std::condition_variable wake;
  std::condition_variable watchdog_ended;
  std::thread watchdog;
};

namespace ddp_nccl {

// "nccl transport, rank R: ", R the host's (world) rank; for a group's
// communicator "nccl transport, rank R (group 'TAG', rank r of n): ".
std::string rank_prefix(const ddp_host* host);
std::string rank_prefix(const ddp_comm* comm);
std::string millis(std::chrono::milliseconds ms);
std::string nccl_error(ncclResult_t r, ncclComm_t comm);
std::string cuda_error(cudaError_t e);

// Waits while NCCL reports ncclInProgress (host-side work of a non-blocking
// communicator), up to `deadline`; returns ncclInProgress if it passed.
ncclResult_t settle(ncclComm_t nccl, ncclResult_t r, Clock::time_point deadline);

// The communicator a failure took, aborted once the lock is released:
// ncclCommAbort (NCCL 2.28) waits until the stream reaches the aborted
// kernel, and work queued ahead of it may never complete; under the mutex
// that wait would block every entry, the engine's abort and destroy. Declare
// it before the lock, so that it runs after the lock's release (also when
// an exception leaves the scope).
class PendingAbort {
 public:
  PendingAbort() = default;
  PendingAbort(const PendingAbort&) = delete;
  PendingAbort& operator=(const PendingAbort&) = delete;
  ~PendingAbort() { run(); }
  void take(ncclComm_t handle) {
    if (handle != nullptr) handle_ = handle;
  }
  void run() {
    if (handle_ != nullptr) ncclCommAbort(std::exchange(handle_, nullptr));
  }

 private:
  ncclComm_t handle_ = nullptr;
};

// Keeps the first failure and takes the communicator for `abort` (every
// later call sees the failure, none the handle). Holds comm->mutex.
void fail_locked(ddp_comm* comm, PendingAbort& abort, ddp_status status, const std::string& message);

[[noreturn]] inline void throw_failure(const FailureState& f) { throw ddp::plugin::Failure(f.status, f.message); }

// The watchdog's thread body (comm->watchdog): polls until destroy.
void watchdog(ddp_comm* comm);

// The destroy entry: stops the watchdog (waiting a grace for one still in
// ncclCommAbort) and releases the communicator.
void destroy_comm(ddp_comm* comm);
// The abort entry: fails the communicator and aborts it. Any thread.
void abort_comm(ddp_comm* comm) noexcept;

// Runs one NCCL call that enqueues on the stream behind `stream`, then marks
// it for the watchdog (and, with fail_streams, for the engine's waits).
template <typename Call>
void enqueue(ddp_comm* comm, ddp_stream stream, std::string what, Call&& call) {
  const ddp_host* h = comm->host;
  auto s = static_cast<cudaStream_t>(h->stream_native(h->ctx, stream));
  {
    PendingAbort abort;  // runs after the lock is released, on every way out
    std::lock_guard<std::mutex> lock(comm->mutex);
    if (comm->failure->failed.load(std::memory_order_acquire)) throw_failure(*comm->failure);
    const std::string prefix = rank_prefix(comm);
    ncclResult_t r = settle(comm->nccl, call(comm->nccl, s), Clock::now() + comm->timeout);
    if (r == ncclInProgress) {
      fail_locked(comm, abort, DDP_ERR_TIMEOUT,
                  prefix + what + ": NCCL did not finish enqueuing it within " + millis(comm->timeout) +
                      " (run.timeout_s); the communicator was aborted");
    } else if (r != ncclSuccess) {
      fail_locked(comm, abort, DDP_ERR_COMM,
                  prefix + what + ": " + nccl_error(r, comm->nccl) + "; the communicator was aborted");
    }
    if (comm->failure->failed.load(std::memory_order_acquire)) throw_failure(*comm->failure);

    cudaEvent_t done = nullptr;
    cudaError_t e = cudaSuccess;
    if (!comm->spare_events.empty()) {
      done = comm->spare_events.back();
      comm->spare_events.pop_back();
    } else {
      e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    }
    if (e == cudaSuccess) e = cudaEventRecord(done, s);
    if (e != cudaSuccess) {
      if (done != nullptr) cudaEventDestroy(done);
      fail_locked(
          comm, abort, DDP_ERR_COMM,
          prefix + what + ": recording its completion event: " + cuda_error(e) + "; the communicator was aborted");
      throw_failure(*comm->failure);
    }
    comm->in_flight.push_back(InFlight{done, Clock::now(), std::move(what)});
  }
  // The job after each collective: fails the stream once the communicator
  // has failed. It holds its own reference: it may run after destroy.
  if (comm->fail_streams)
    ddp::plugin::check(ddp::plugin::launch_job(h, stream, "nccl", std::string(), [state = comm->failure] {
      const FailureState& f = *state;
      return f.failed.load(std::memory_order_acquire) ? ddp::plugin::fail(f.host, f.status, f.message) : DDP_OK;
    }));  // a refusal: the host has set the text
}

}  // namespace ddp_nccl
