// comm.cpp — the nccl transport's communicator (comm.h): messages, the
// watchdog, destroy and abort, and the destructor that finalises NCCL's
// communicator. The world's and every group's alike. Not here: making a
// communicator (ncclCommInitRankConfig, ncclCommSplit: nccl_transport.cpp).
#include "comm.h"

#include <algorithm>

namespace ddp_nccl {
namespace {

// One watchdog round. Holds comm->mutex; comm->nccl is not NULL. A failure
// leaves the communicator in `abort`.
void watch_once(ddp_comm* comm, PendingAbort& abort) {
  const std::string prefix = rank_prefix(comm);
  ncclResult_t state = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(comm->nccl, &state);
  if (r == ncclSuccess) r = state;
  if (r != ncclSuccess && r != ncclInProgress) {
    std::string during = comm->in_flight.empty() ? "" : " during " + comm->in_flight.front().what;
    fail_locked(comm, abort, DDP_ERR_COMM,
                prefix + "asynchronous " + nccl_error(r, comm->nccl) + during + "; the communicator was aborted");
    return;
  }
  const auto now = Clock::now();
  for (auto it = comm->in_flight.begin(); it != comm->in_flight.end();) {
    cudaError_t q = cudaEventQuery(it->done);
    if (q == cudaSuccess) {
      comm->spare_events.push_back(it->done);
      it = comm->in_flight.erase(it);
    } else if (q != cudaErrorNotReady) {
      fail_locked(comm, abort, DDP_ERR_COMM,
                  prefix + it->what + ": " + cuda_error(q) + "; the communicator was aborted");
      return;
    } else if (now - it->since > comm->timeout) {
      fail_locked(comm, abort, DDP_ERR_TIMEOUT,
                  prefix + it->what + " did not complete within " + millis(comm->timeout) +
                      " (run.timeout_s): a peer rank died, hung or issued another collective; "
                      "the communicator was aborted");
      return;
    } else {
      ++it;
    }
  }
}

}  // namespace

std::string rank_prefix(const ddp_host* host) { return "nccl transport, rank " + std::to_string(host->rank) + ": "; }

std::string rank_prefix(const ddp_comm* comm) {
  if (comm->tag.empty()) return rank_prefix(comm->host);
  return "nccl transport, rank " + std::to_string(comm->host->rank) + " (group '" + comm->tag + "', rank " +
         std::to_string(comm->rank) + " of " + std::to_string(comm->size) + "): ";
}

std::string millis(std::chrono::milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

std::string nccl_error(ncclResult_t r, ncclComm_t comm) {
  std::string text = std::string("NCCL error '") + ncclGetErrorString(r) + "'";
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') text += " (" + std::string(last) + ")";
  return text;
}

std::string cuda_error(cudaError_t e) { return std::string("CUDA error '") + cudaGetErrorString(e) + "'"; }

ncclResult_t settle(ncclComm_t nccl, ncclResult_t r, Clock::time_point deadline) {
  while (r == ncclInProgress) {
    if (Clock::now() >= deadline) return ncclInProgress;
    std::this_thread::sleep_for(std::chrono::microseconds(10));
    ncclResult_t state = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(nccl, &state);
    r = q != ncclSuccess ? q : state;
  }
  return r;
}

void fail_locked(ddp_comm* comm, PendingAbort& abort, ddp_status status, const std::string& message) {
  FailureState& f = *comm->failure;
  if (!f.failed.load(std::memory_order_relaxed)) {
    f.status = status;
    f.message = message;
    f.failed.store(true, std::memory_order_release);
  }
  abort.take(std::exchange(comm->nccl, nullptr));
}

void watchdog(ddp_comm* comm) {
  cudaSetDevice(comm->gpu);  // this thread's events live there
  const auto poll = std::clamp<std::chrono::milliseconds>(comm->timeout / 10, std::chrono::milliseconds(1),
                                                          std::chrono::milliseconds(100));
  std::unique_lock<std::mutex> lock(comm->mutex);
  while (!comm->stopping) {
    comm->wake.wait_for(lock, poll);
    if (comm->stopping || comm->nccl == nullptr) continue;
    PendingAbort abort;
    try {
      watch_once(comm, abort);
    } catch (...) {  // out of memory for a message: try again next round
    }
    lock.unlock();  // the abort may wait on the stream: not under the mutex
    abort.run();
    lock.lock();
  }
  comm->watchdog_done = true;
  comm->watchdog_ended.notify_all();  // under the lock: destroy joins before it frees comm
}

// How long destroy waits for a watchdog still inside ncclCommAbort.
constexpr std::chrono::seconds kWatchdogGrace{5};

// A watchdog still in ncclCommAbort (waiting for a stream that never reaches
// the aborted kernel) would hold destroy, and the run, forever: past
// kWatchdogGrace the communicator is left to the process's exit instead.
void destroy_comm(ddp_comm* comm) {
  bool ended = true;
  {
    std::unique_lock<std::mutex> lock(comm->mutex);
    comm->stopping = true;
    comm->wake.notify_all();
    if (comm->watchdog.joinable())
      ended = comm->watchdog_ended.wait_for(lock, kWatchdogGrace, [comm] { return comm->watchdog_done; });
  }
  if (!ended) {
    comm->watchdog.detach();
    comm->host->log(
        comm->host->ctx, DDP_LOG_WARN,
        (rank_prefix(comm) + "ncclCommAbort has not returned after " + std::to_string(kWatchdogGrace.count()) +
         " s (the stream never reached the aborted "
         "collective): the communicator is left to the process's exit")
            .c_str());
    return;  // comm stays allocated: the watchdog still uses it
  }
  if (comm->watchdog.joinable()) comm->watchdog.join();
  delete comm;
}

void abort_comm(ddp_comm* comm) noexcept {
  try {
    PendingAbort abort;  // after the lock: see PendingAbort
    std::lock_guard<std::mutex> lock(comm->mutex);
    fail_locked(comm, abort, DDP_ERR_COMM, rank_prefix(comm) + "the communicator was aborted by the engine");
  } catch (...) {  // any thread, nothing may escape
  }
}

}  // namespace ddp_nccl

using ddp_nccl::Clock;
using ddp_nccl::InFlight;
using ddp_nccl::settle;

// The host has synchronised every stream first, or called abort.
ddp_comm_s::~ddp_comm_s() {
  {
    std::lock_guard<std::mutex> lock(mutex);
    stopping = true;
  }
  wake.notify_all();
  if (watchdog.joinable()) watchdog.join();
  if (nccl != nullptr) {
    // Flush and free; abort when that fails or outlasts the timeout (a peer gone).
    if (settle(nccl, ncclCommFinalize(nccl), Clock::now() + timeout) == ncclSuccess) {
      ncclCommDestroy(nccl);
    } else {
      ncclCommAbort(nccl);
    }
    nccl = nullptr;
  }
  for (const InFlight& f : in_flight) cudaEventDestroy(f.done);
  for (cudaEvent_t e : spare_events) cudaEventDestroy(e);
  if (host != nullptr) host->free(host->ctx, barrier_buf);
}
