// nccl_transport.cpp — the `nccl` transport: collectives between GPUs with
// NVIDIA's NCCL. Rank r drives the engine's GPU for it (ddp::plugin::rank_gpu:
// GPU host->local_rank, or the one GPU CUDA_VISIBLE_DEVICES leaves); every collective is
// enqueued on the cudaStream_t behind the ddp_stream it is given
// (host->stream_native) and returns at once: no entry waits for the GPU.
//
// - Refusals (DDP_ERR_UNSUPPORTED, before any rendezvous): a run whose device
//   is not CUDA; a rank without a GPU (any cudaGetDeviceCount error, or a
//   count of 0: without a driver it is cudaErrorInsufficientDriver); a
//   local_rank beyond the visible GPUs. One GPU per rank: NCCL does not
//   allow two ranks of a communicator on one GPU.
// - Communicator: rank 0 makes the NCCL unique id and publishes it in the
//   engine's rendezvous store; every rank reads it and joins. The
//   communicator is NCCL's non-blocking kind (config.blocking = 0), so that
//   nothing in NCCL holds the training thread past host->timeout_ms: setup is
//   polled against that deadline, and an entry NCCL answers with
//   ncclInProgress (it is still enqueuing: host-side work, e.g. connecting to
//   a peer the first time) is polled until it is on the stream.
// - Collectives: AVG is ncclAvg; barrier is a one-float all-reduce (on 4
//   bytes allocated at init through host->alloc, a communication buffer); dtypes
//   float32, float64, int32, int64, bfloat16, float16.
// - Watchdog: after each collective a CUDA event is recorded on its stream. A
//   thread polls, every timeout/10 (at most 100 ms), ncclCommGetAsyncError and
//   the age of every collective whose event has not completed. On an NCCL
//   error, a CUDA error, or a collective older than host->timeout_ms, it keeps
//   the first failure's text (rank, collective, NCCL's error string) and calls
//   ncclCommAbort, which makes NCCL kernels still running or queued return.
//   Then every later entry fails with that text. The abort entry (the
//   engine giving up on a wait; any thread) does the same; it may wait for an
//   entry in progress on the training thread, at most timeout_ms. The
//   failure is recorded and the handle taken under the plugin's mutex, and
//   ncclCommAbort runs after it is released (PendingAbort): NCCL 2.28's abort
//   waits for the stream to reach the aborted kernel, and work queued ahead
//   that never completes must not hold every other entry. destroy waits at
//   most 5 s for a watchdog still inside the abort, then leaves the
//   communicator to the process's exit. libnccl stays loaded for the
//   process's life (its threads outlive any communicator).
// - Groups (ABI 1.9, split): ncclCommSplit of the parent (its color and
//   key; NCCL orders the members as the engine did, and its rank and count
//   must be the engine's), a non-blocking communicator of its own with its
//   own watchdog, barrier float and failure, on the parent's GPU; every
//   entry reads the rank and size of the communicator it is given. The
//   parts common to the world's and a group's communicator are in comm.h.
// - Streams: with `fail_streams` (default), each collective is followed on its
//   stream by a host function (host->launch_host_func) that fails the stream
//   once the communicator has failed, so the engine's event waits after it
//   report the NCCL error, as they report a Gloo error on CPU. What this
//   cannot guarantee: an aborted collective's kernel returns "successfully"
//   to CUDA, so work the engine orders after it without such a host function
//   (with fail_streams = false, or a host whose launch_host_func cannot fail a
//   stream) sees no error and reads partial data; the next transport call is
//   then the first to report it, and the engine's own wait limit (timeout_s
//   + 5 s) stays the backstop. The age of a collective counts from when it was
//   enqueued, so it includes waiting for earlier work on its stream. If
//   ncclCommAbort itself hangs (a driver fault), the watchdog hangs with it.
//
// Keys ([transport]): fail_streams (bool, default true): false saves one host
// function per collective (a few microseconds) and loses the stream failures.
#include <ddp/plugin.h>
#include <ddp/plugin.hpp>
#include <ddp/transport.hpp>

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "comm.h"

namespace {

constexpr const char* kVersion = "0.3.0";  // 0.2: dtypes, rank_gpu, abort outside the lock; 0.3: split
constexpr ddp_key kKeys[] = {
    {"fail_streams", "bool", "true (default): a failed communicator fails the streams of later collectives"},
    {nullptr, nullptr, nullptr},
};
// NCCL reduces each in its own type (bfloat16 and float16 natively).
constexpr uint64_t kDtypes = DDP_DTYPE_BIT(DDP_FLOAT32) | DDP_DTYPE_BIT(DDP_FLOAT64) | DDP_DTYPE_BIT(DDP_INT32) |
                             DDP_DTYPE_BIT(DDP_INT64) | DDP_DTYPE_BIT(DDP_BFLOAT16) | DDP_DTYPE_BIT(DDP_FLOAT16);
using ddp::plugin::describe;
using ddp::plugin::device_name;
using ddp::plugin::fail;
using ddp::plugin::Failure;
using ddp_nccl::Clock;
using ddp_nccl::cuda_error;
using ddp_nccl::enqueue;
using ddp_nccl::millis;
using ddp_nccl::nccl_error;
using ddp_nccl::rank_prefix;
using ddp_nccl::settle;

// --------------------------------------------------------- argument checks

ncclDataType_t nccl_type(ddp_dtype dtype) {
  switch (dtype) {
    case DDP_FLOAT32: return ncclFloat32;
    case DDP_FLOAT64: return ncclFloat64;
    case DDP_INT32: return ncclInt32;
    case DDP_INT64: return ncclInt64;
    case DDP_BFLOAT16: return ncclBfloat16;
    case DDP_FLOAT16: return ncclFloat16;
  }
  return ncclFloat32;  // not reached: checked() refuses other values
}

// Validates a buffer argument (ddp::plugin::check_buffer: on the GPU, of a
// dtype the ABI knows); returns its NCCL type.
ncclDataType_t checked(const ddp_host* h, const ddp_buffer* buf, const char* entry) {
  ddp::plugin::check(ddp::plugin::check_buffer(h, buf, entry, [&](const ddp_buffer& b) {
    if (b.device != DDP_DEVICE_CUDA)
      return fail(h, DDP_ERR_UNSUPPORTED,
                  std::string(entry) + ": the nccl transport needs CUDA buffers (this one is on the " +
                      device_name(b.device) + ")");
    if (ddp_dtype_size(b.dtype) == 0)
      return fail(h, DDP_ERR_UNSUPPORTED,
                  std::string(entry) + ": dtype " + std::to_string(b.dtype) +
                      " not supported (float32, float64, int32, int64, bfloat16, float16)");
    return DDP_OK;
  }));
  return nccl_type(buf->dtype);
}

ncclRedOp_t checked(ddp_reduce_op op, const char* entry) {
  if (op == DDP_REDUCE_SUM) return ncclSum;
  if (op == DDP_REDUCE_AVG) return ncclAvg;  // floats: premultiplied by 1/world; integers: sum / world
  throw Failure(DDP_ERR_INVALID_ARGUMENT, std::string(entry) + ": unknown reduce op " + std::to_string(op));
}

// ------------------------------------------------------------------ set-up

// NCCL starts threads that live as long as the process (its proxy threads,
// its own watchdog); unloading libnccl under them, as unloading this plugin
// would, crashes them at their next wake-up. So libnccl stays loaded for the
// process's life from the moment this plugin is loaded.
bool keep_nccl_loaded() {
  Dl_info info{};
  return dladdr(reinterpret_cast<void*>(&ncclGetVersion), &info) != 0 && info.dli_fname != nullptr &&
         dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE) != nullptr;
}
[[maybe_unused]] const bool g_nccl_kept = keep_nccl_loaded();

// Checks this rank's GPU (the engine's choice: ddp::plugin::rank_gpu, never
// shared), makes it current on the calling thread and returns it.
int use_gpu(const ddp_host* host) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    throw Failure(DDP_ERR_UNSUPPORTED, "the nccl transport needs a GPU: rank " + std::to_string(host->rank) +
                                           " has none (cudaGetDeviceCount: " + cudaGetErrorString(e) + ")");
  }
  if (count == 0)
    throw Failure(DDP_ERR_UNSUPPORTED, "the nccl transport needs a GPU: rank " + std::to_string(host->rank) +
                                           " has none (cudaGetDeviceCount: 0 devices)");
  const int gpu = ddp::plugin::rank_gpu(host->local_rank, count, std::getenv("CUDA_VISIBLE_DEVICES"), false);
  if (gpu < 0)
    throw Failure(DDP_ERR_UNSUPPORTED, "the nccl transport gives each rank of a machine its own GPU: rank " +
                                           std::to_string(host->rank) + " has local_rank " +
                                           std::to_string(host->local_rank) + ", but this machine has " +
                                           std::to_string(count) + " GPU(s) visible");
  if ((e = cudaSetDevice(gpu)) != cudaSuccess)
    throw Failure(DDP_ERR_UNSUPPORTED,
                  rank_prefix(host) + "cudaSetDevice(" + std::to_string(gpu) + "): " + cuda_error(e));
  return gpu;
}

// Rank 0 makes the unique id; the others read it from the rendezvous store.
// One key per communicator this process makes (the engine makes one a run;
// every rank makes them in the same order).
ncclUniqueId exchange_unique_id(const ddp_host* host) {
  static std::atomic<int> generation{0};
  const std::string key = "nccl_unique_id_" + std::to_string(generation++);
  ncclUniqueId id;
  if (host->rank == 0) {
    if (ncclResult_t r = ncclGetUniqueId(&id))
      throw Failure(DDP_ERR_COMM, rank_prefix(host) + "ncclGetUniqueId: " + nccl_error(r, nullptr));
    ddp::plugin::check(host->store_set(host->ctx, key.c_str(), &id, sizeof id));
    return id;
  }
  void* data = nullptr;
  size_t bytes = 0;
  if (host->store_get(host->ctx, key.c_str(), &data, &bytes) != DDP_OK)
    throw Failure(DDP_ERR_TIMEOUT, rank_prefix(host) + "no NCCL unique id from rank 0 within " +
                                       std::to_string(host->timeout_ms) +
                                       " ms (is every rank started, with the same rendezvous and transport?)");
  const bool ok = bytes == sizeof id;
  if (ok) std::memcpy(&id, data, sizeof id);
  std::free(data);
  if (!ok)
    throw Failure(DDP_ERR_COMM, rank_prefix(host) + "the rendezvous key '" + key + "' holds " + std::to_string(bytes) +
                                    " bytes, not an NCCL unique id (" + std::to_string(sizeof id) + ")");
  return id;
}

ncclComm_t connect(const ddp_host* host, int gpu, const ncclUniqueId& id, std::chrono::milliseconds timeout) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t nccl = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&nccl, host->world_size, id, host->rank, &config);
  if (nccl != nullptr) r = settle(nccl, r, Clock::now() + timeout);
  if (r == ncclSuccess) return nccl;
  const std::string why = r == ncclInProgress ? "did not complete within " + millis(timeout) +
                                                    " (run.timeout_s; is every rank started, each with its own GPU?)"
                                              : "failed: " + nccl_error(r, nccl);
  if (nccl != nullptr) ncclCommAbort(nccl);
  throw Failure(r == ncclInProgress ? DDP_ERR_TIMEOUT : DDP_ERR_COMM,
                rank_prefix(host) + "NCCL communicator set-up (" + std::to_string(host->world_size) + " ranks, GPU " +
                    std::to_string(gpu) + ") " + why);
}

// ----------------------------------------------------------------- entries

ddp_status nccl_init(const ddp_host* host, ddp_comm** out) {
  return ddp::plugin::guard(host, [&] {
    if (host->device != DDP_DEVICE_CUDA)
      throw Failure(
          DDP_ERR_UNSUPPORTED,
          std::string("the nccl transport needs a CUDA device (run.device = \"cuda\"); this run's device is ") +
              device_name(host->device));
    auto comm = std::make_unique<ddp_comm_s>();
    comm->host = host;
    comm->rank = host->rank;
    comm->size = host->world_size;
    comm->failure->host = host;
    comm->timeout = std::chrono::milliseconds(host->timeout_ms);
    comm->fail_streams = ddp::plugin::Host(host).config_bool("fail_streams", true);
    comm->gpu = use_gpu(host);
    ddp::plugin::check(host->alloc(host->ctx, sizeof(float), DDP_MEM_COMM_BUFFERS, &comm->barrier_buf));
    comm->nccl = connect(host, comm->gpu, exchange_unique_id(host), comm->timeout);
    comm->watchdog = std::thread(ddp_nccl::watchdog, comm.get());
    *out = comm.release();
  });
}

// A group's NCCL communicator (ncclCommSplit of the parent's, non-blocking
// as the parent's), under the parent's mutex: NCCL calls on a communicator
// are serialised, and a failed parent is refused with its own failure. A
// split that does not settle within the timeout (a member never called)
// is aborted.
ncclComm_t split_nccl(ddp_comm* parent, const ddp_split* how, const std::string& where) {
  std::lock_guard<std::mutex> lock(parent->mutex);
  if (parent->failure->failed.load(std::memory_order_acquire))
    throw Failure(parent->failure->status, where + "the parent communicator has failed: " + parent->failure->message);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t nccl = nullptr;
  ncclResult_t r = ncclCommSplit(parent->nccl, how->color, how->key, &nccl, &config);
  const auto deadline = Clock::now() + parent->timeout;
  if (nccl != nullptr) r = settle(nccl, r, deadline);
  if (r == ncclSuccess) r = settle(parent->nccl, ncclInProgress, deadline);  // the parent's part of the split
  if (r == ncclSuccess) return nccl;
  const std::string why = r == ncclInProgress ? "did not complete within " + millis(parent->timeout) +
                                                    " (run.timeout_s; did every rank of the parent call split?)"
                                              : "failed: " + nccl_error(r, nccl != nullptr ? nccl : parent->nccl);
  if (nccl != nullptr) ncclCommAbort(nccl);
  throw Failure(
      r == ncclInProgress ? DDP_ERR_TIMEOUT : DDP_ERR_COMM,
      where + "ncclCommSplit (color " + std::to_string(how->color) + ", key " + std::to_string(how->key) + ") " + why);
}

// A group's communicator (ABI 1.9): NCCL's split, checked against the
// membership the engine computed, with the parent's GPU, timeout and
// fail_streams, and a watchdog of its own.
ddp_status nccl_split(ddp_comm* parent, const ddp_split* how, ddp_comm** out) {
  const ddp_host* host = parent->host;
  if (ddp_status s = ddp::plugin::check_split(host, how, parent->size, "nccl")) return s;
  return ddp::plugin::guard(host, [&] {
    auto comm = std::make_unique<ddp_comm_s>();
    comm->host = host;
    comm->rank = how->rank;
    comm->size = how->size;
    comm->tag = how->tag;
    comm->failure->host = host;
    comm->timeout = parent->timeout;
    comm->fail_streams = parent->fail_streams;
    comm->gpu = parent->gpu;
    const std::string where = rank_prefix(host) + "split, group '" + comm->tag + "': ";
    if (cudaError_t e = cudaSetDevice(comm->gpu))
      throw Failure(DDP_ERR_COMM, where + "cudaSetDevice(" + std::to_string(comm->gpu) + "): " + cuda_error(e));
    ddp::plugin::check(host->alloc(host->ctx, sizeof(float), DDP_MEM_COMM_BUFFERS, &comm->barrier_buf));
    comm->nccl = split_nccl(parent, how, where);
    int rank = -1;
    int count = 0;
    ncclCommUserRank(comm->nccl, &rank);
    ncclCommCount(comm->nccl, &count);
    if (rank != how->rank || count != how->size)
      throw Failure(DDP_ERR_INTERNAL, where + "ncclCommSplit made rank " + std::to_string(rank) + " of " +
                                          std::to_string(count) + ", the engine computed rank " +
                                          std::to_string(how->rank) + " of " + std::to_string(how->size));
    comm->watchdog = std::thread(ddp_nccl::watchdog, comm.get());
    *out = comm.release();
  });
}

void nccl_destroy(ddp_comm* comm) { ddp_nccl::destroy_comm(comm); }

void nccl_abort(ddp_comm* comm) { ddp_nccl::abort_comm(comm); }

ddp_status nccl_all_reduce(ddp_comm* comm, const ddp_buffer* buf, ddp_reduce_op op, ddp_stream stream) {
  return ddp::plugin::guard(comm->host, [&] {
    const ncclDataType_t type = checked(comm->host, buf, "all_reduce");
    const ncclRedOp_t red = checked(op, "all_reduce");
    void* p = buf->ptr;
    const size_t n = buf->count;
    enqueue(comm, stream, describe("all_reduce", *buf),
            [&](ncclComm_t c, cudaStream_t s) { return ncclAllReduce(p, p, n, type, red, c, s); });
  });
}

ddp_status nccl_broadcast(ddp_comm* comm, const ddp_buffer* buf, int root, ddp_stream stream) {
  return ddp::plugin::guard(comm->host, [&] {
    const ncclDataType_t type = checked(comm->host, buf, "broadcast");
    ddp::plugin::check(ddp::plugin::check_root(comm->host, root, comm->size));
    void* p = buf->ptr;
    const size_t n = buf->count;
    enqueue(comm, stream, describe("broadcast", *buf),
            [&](ncclComm_t c, cudaStream_t s) { return ncclBroadcast(p, p, n, type, root, c, s); });
  });
}

ddp_status nccl_all_gather(ddp_comm* comm, const ddp_buffer* send, const ddp_buffer* recv, ddp_stream stream) {
  return ddp::plugin::guard(comm->host, [&] {
    const ncclDataType_t type = checked(comm->host, send, "all_gather");
    checked(comm->host, recv, "all_gather");
    ddp::plugin::check(ddp::plugin::check_all_gather(comm->host, *send, *recv, comm->size));
    const void* in = send->ptr;
    void* to = recv->ptr;
    const size_t n = send->count;
    enqueue(comm, stream, describe("all_gather", *recv),
            [&](ncclComm_t c, cudaStream_t s) { return ncclAllGather(in, to, n, type, c, s); });
  });
}

ddp_status nccl_reduce_scatter(ddp_comm* comm, const ddp_buffer* send, const ddp_buffer* recv, ddp_reduce_op op,
                               ddp_stream stream) {
  return ddp::plugin::guard(comm->host, [&] {
    const ncclDataType_t type = checked(comm->host, send, "reduce_scatter");
    checked(comm->host, recv, "reduce_scatter");
    const ncclRedOp_t red = checked(op, "reduce_scatter");
    ddp::plugin::check(ddp::plugin::check_reduce_scatter(comm->host, *send, *recv, comm->size));
    const void* in = send->ptr;
    void* to = recv->ptr;
    const size_t n = recv->count;
    enqueue(comm, stream, describe("reduce_scatter", *send),
            [&](ncclComm_t c, cudaStream_t s) { return ncclReduceScatter(in, to, n, type, red, c, s); });
  });
}

ddp_status nccl_barrier(ddp_comm* comm, ddp_stream stream) {
  return ddp::plugin::guard(comm->host, [&] {
    void* p = comm->barrier_buf;  // zeros, summed: stays zero
    enqueue(comm, stream, "barrier",
            [&](ncclComm_t c, cudaStream_t s) { return ncclAllReduce(p, p, 1, ncclFloat32, ncclSum, c, s); });
  });
}

// `ddp plan`: the barrier's one float on the device, from init on.
ddp_status nccl_plan(const ddp_host* host, ddp_plan* out) {
  return ddp::plugin::guard(host, [&] {
    (void)ddp::plugin::Host(host).config_bool("fail_streams", true);  // as init reads it
    ddp::plugin::Plan(out).buffer(DDP_MEM_COMM_BUFFERS, sizeof(float));
  });
}

}  // namespace

DDP_TRANSPORT_ENTRY = {
    .abi_version = DDP_ABI_VERSION,
    .struct_size = sizeof(ddp_transport_v1_t),
    .name = "nccl",
    .version = kVersion,
    .caps = DDP_CAP_DEVICE_CUDA,
    .init = nccl_init,
    .destroy = nccl_destroy,
    .all_reduce = nccl_all_reduce,
    .broadcast = nccl_broadcast,
    .all_gather = nccl_all_gather,
    .reduce_scatter = nccl_reduce_scatter,
    .barrier = nccl_barrier,
    .abort = nccl_abort,
    .dtypes = kDtypes,
    .keys = kKeys,
    .plan = nccl_plan,
    .split = nccl_split,
};
