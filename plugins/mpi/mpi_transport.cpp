// mpi_transport.cpp — the `mpi` transport: CPU collectives through MPI (Open
// MPI: shared memory between ranks of one host, TCP or a fabric between
// hosts). Every entry enqueues a closure on the stream it is given
// (host->launch_host_func) that starts the non-blocking MPI collective there
// (MPI_Allreduce, ...; with the nonblocking key, MPI_Iallreduce completed
// with MPI_Test until it is done, the run's timeout passes or abort() is
// called): the training thread never blocks on the network.
//
// The ranks are MPI's: the process must have been started by mpirun (or
// srun), so that MPI_COMM_WORLD is the run's ranks, in the run's order.
// MPI is initialised at the first init (MPI_THREAD_SERIALIZED at least: the
// collectives run on the comm stream's thread, not the one that called
// MPI_Init) and finalised when the process exits, as PyTorch's MPI process
// group does: MPI cannot start again once finalised, and a process may
// create and destroy several communicators (each its own MPI_Comm_dup).
//
// Keys ([transport], README.md): nonblocking (false: each collective is the
// blocking MPI call, on the comm stream's thread: Open MPI's tuned
// algorithms, about twice the bandwidth of its non-blocking ones here; a
// stuck peer is then bounded by the engine's own waits; true: MPI_I* and
// MPI_Test, bounded by run.timeout_s). After a failure, abort() ends the
// MPI job (MPI_Abort): every rank stops at once, none waits in a collective.
//
// Groups (ABI 1.9, split): MPI_Comm_split of the parent's communicator,
// whose rank and size must be those the engine computed; every entry reads
// the rank and size of the communicator it is given, never the host's.
//
// Not here (yet): CUDA buffers (refused: use nccl, or gloo's staging).
#include <ddp/numeric.h>
#include <ddp/plugin.h>
#include <ddp/plugin.hpp>
#include <ddp/transport.hpp>

#include <dlfcn.h>
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>

namespace {

constexpr const char* kVersion = "0.3.0";  // 0.2: bfloat16, float16; 0.3: split

constexpr ddp_key kKeys[] = {
    {"nonblocking", "bool",
     "true: MPI_I* collectives and MPI_Test, bounded by run.timeout_s; false (default): blocking"},
    {nullptr, nullptr, nullptr},
};
constexpr uint64_t kDtypes = DDP_DTYPE_BIT(DDP_FLOAT32) | DDP_DTYPE_BIT(DDP_FLOAT64) | DDP_DTYPE_BIT(DDP_INT32) |
                             DDP_DTYPE_BIT(DDP_INT64) | DDP_DTYPE_BIT(DDP_BFLOAT16) | DDP_DTYPE_BIT(DDP_FLOAT16);

// MPI has no 16-bit floats: they travel as MPI_UINT16_T and are summed by
// these user operations, each sum in float32 rounded back (ddp/numeric.h).
// Made once, when MPI starts.
MPI_Op g_bf16_sum = MPI_OP_NULL;
MPI_Op g_fp16_sum = MPI_OP_NULL;

template <uint16_t (*FromFloat)(float), float (*ToFloat)(uint16_t)>
void sum16(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = FromFloat(ToFloat(a[i]) + ToFloat(b[i]));
}

// A collective was given up on in this process: it is still pending, and
// MPI_Finalize under it could hang (the process is failing anyway).
std::atomic<bool> g_stuck{false};

}  // namespace

struct ddp_comm_s {
  const ddp_host* host;
  MPI_Comm comm = MPI_COMM_NULL;     // the world's MPI_Comm_dup, or a group's MPI_Comm_split
  int rank = 0;                      // this rank's place in `comm` (the host's rank for the world's)
  int size = 1;                      // its ranks (AVG's divisor, the counts' factor)
  bool nonblocking = false;          // the nonblocking key: MPI_I* and MPI_Test
  std::atomic<bool> aborted{false};  // abort(): pending and later collectives fail
  std::atomic<bool> stuck{false};    // a collective was given up: MPI's state is not clean
};

namespace {

using ddp::plugin::describe;
using ddp::plugin::fail;
using ddp::plugin::Failure;

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, size_t(length));
}

// The MPI datatype of an ABI dtype; MPI_DATATYPE_NULL where MPI has none.
MPI_Datatype mpi_type(ddp_dtype dtype) {
  switch (dtype) {
    case DDP_FLOAT32: return MPI_FLOAT;
    case DDP_FLOAT64: return MPI_DOUBLE;
    case DDP_INT32: return MPI_INT32_T;
    case DDP_INT64: return MPI_INT64_T;
    case DDP_BFLOAT16:
    case DDP_FLOAT16: return MPI_UINT16_T;  // summed by g_bf16_sum, g_fp16_sum
    default: return MPI_DATATYPE_NULL;
  }
}

MPI_Op sum_of(ddp_dtype dtype) {
  return dtype == DDP_BFLOAT16 ? g_bf16_sum : dtype == DDP_FLOAT16 ? g_fp16_sum : MPI_SUM;
}

// A buffer argument (ddp::plugin::check_buffer): on the CPU, of a dtype MPI
// carries, within MPI's int count.
ddp_status check_buffer(ddp_comm* comm, const ddp_buffer* buf, const char* entry) {
  const ddp_host* h = comm->host;
  return ddp::plugin::check_buffer(h, buf, entry, [&](const ddp_buffer& b) {
    if (b.device != DDP_DEVICE_CPU)
      return fail(h, DDP_ERR_UNSUPPORTED,
                  std::string(entry) + ": mpi moves CPU buffers only (a CUDA run: use transport nccl, or gloo)");
    if (mpi_type(b.dtype) == MPI_DATATYPE_NULL)
      return fail(h, DDP_ERR_UNSUPPORTED,
                  std::string(entry) + ": dtype not supported (float32, float64, int32, int64, bfloat16, float16)");
    if (b.count > size_t(INT_MAX))
      return fail(h, DDP_ERR_UNSUPPORTED,
                  std::string(entry) + ": " + std::to_string(b.count) + " elements, more than MPI's int count");
    return DDP_OK;
  });
}

template <typename T>
void divide(void* ptr, size_t count, int world) {
  T* p = static_cast<T*>(ptr);
  for (size_t i = 0; i < count; ++i) p[i] = static_cast<T>(p[i] / static_cast<T>(world));
}

template <uint16_t (*FromFloat)(float), float (*ToFloat)(uint16_t)>
void divide16(void* ptr, size_t count, int world) {
  uint16_t* p = static_cast<uint16_t*>(ptr);
  for (size_t i = 0; i < count; ++i) p[i] = FromFloat(ToFloat(p[i]) / static_cast<float>(world));
}

void divide_by(const ddp_buffer& buf, int world) {
  switch (buf.dtype) {
    case DDP_FLOAT32: divide<float>(buf.ptr, buf.count, world); return;
    case DDP_FLOAT64: divide<double>(buf.ptr, buf.count, world); return;
    case DDP_INT32: divide<int32_t>(buf.ptr, buf.count, world); return;
    case DDP_INT64: divide<int64_t>(buf.ptr, buf.count, world); return;
    case DDP_BFLOAT16: divide16<ddp_float_to_bf16, ddp_bf16_to_float>(buf.ptr, buf.count, world); return;
    case DDP_FLOAT16: divide16<ddp_float_to_fp16, ddp_fp16_to_float>(buf.ptr, buf.count, world); return;
    default: return;
  }
}

// Tests `request` until it completes; throws (the job's failure: "mpi
// <what>: ...") once the run's timeout passes or the communicator is aborted.
void complete(ddp_comm* comm, MPI_Request& request) {
  const ddp_host* h = comm->host;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(h->timeout_ms);
  for (long tries = 0;; ++tries) {
    int done = 0;
    if (int rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE)) throw Failure(DDP_ERR_COMM, mpi_error(rc));
    if (done) return;
    if (comm->aborted) {
      comm->stuck = true;
      g_stuck = true;
      throw Failure(DDP_ERR_COMM, "the communicator was aborted");
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      comm->stuck = true;
      g_stuck = true;
      throw Failure(DDP_ERR_TIMEOUT,
                    "not complete within " + std::to_string(h->timeout_ms) + " ms (a peer is stuck or gone)");
    }
    // Open MPI progresses a collective only inside MPI calls: sleeping
    // between tests stalls a large one. Yield, so that compute still runs.
    if (tries % 64 == 63) std::this_thread::yield();
  }
}

// Enqueues one collective, a job on `stream` (ddp::plugin::launch_job) whose
// failure reads "mpi <what>: <MPI's words>": `block` runs it (MPI_Allreduce,
// ...), or, with the nonblocking key, `start` begins it (MPI_Iallreduce, ...);
// `then` runs once it completed (AVG's division).
ddp_status enqueue(ddp_comm* comm, ddp_stream stream, std::string what, std::function<int()> block,
                   std::function<int(MPI_Request*)> start, std::function<void()> then = {}) {
  auto run = [comm, block = std::move(block), start = std::move(start), then = std::move(then)] {
    if (comm->aborted) throw Failure(DDP_ERR_COMM, "the communicator was aborted");
    if (comm->nonblocking) {
      MPI_Request request = MPI_REQUEST_NULL;
      if (int rc = start(&request)) throw Failure(DDP_ERR_COMM, mpi_error(rc));
      complete(comm, request);
    } else if (int rc = block()) {
      throw Failure(DDP_ERR_COMM, mpi_error(rc));
    }
    if (then) then();
  };
  return ddp::plugin::launch_job(comm->host, stream, "mpi", std::move(what), std::move(run));
}

// ------------------------------------------------------------------ entries

// Open MPI loads its components with dlopen, and they find libmpi's symbols
// only if libmpi is global; reached through a plugin dlopen'ed locally it is
// not. Makes the libmpi this plugin links global (RTLD_NOLOAD: no new load).
void make_libmpi_global() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&MPI_Init_thread), &info) && info.dli_fname)
    dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
}

std::string thread_level(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    default: return "MPI_THREAD_MULTIPLE";
  }
}

// Each rank runs two busy threads (compute, and the comm stream's MPI
// calls, which spin while they wait for a peer). Where the ranks of this
// host have fewer cores than that, the spinning takes the cores compute
// needs (mlp 1024x8 on 2 cores, 2 ranks: backward 2x slower), so Open MPI
// is told to yield while idle, as it does itself for more ranks than cores.
// A value already in the environment (mpirun --mca, or the user) wins.
void yield_when_oversubscribed() {
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const long ranks = local ? std::strtol(local, nullptr, 10) : 1;
  if (2 * ranks > long(std::thread::hardware_concurrency())) setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
}

// At process exit: MPI_Finalize, where this process initialised MPI and
// no collective of it was given up on.
void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || g_stuck) return;
  if (g_bf16_sum != MPI_OP_NULL) MPI_Op_free(&g_bf16_sum);
  if (g_fp16_sum != MPI_OP_NULL) MPI_Op_free(&g_fp16_sum);
  MPI_Finalize();
}

// Keeps this plugin loaded to the end of the process, so that
// finalize_at_exit is still there to run (a library's atexit handlers run
// when it is unloaded, which would finalise MPI under the next init).
void pin_this_plugin() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&finalize_at_exit), &info) && info.dli_fname)
    dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
}

// srun started this rank without a process-management interface (srun
// --mpi=none, SLURM's default): no MPI can start then, and Open MPI would
// abort inside MPI_Init with a page about rebuilding it.
bool srun_without_pmi(const char* (*get)(const char*)) {
  return get("SLURM_PROCID") && get("SLURM_STEP_NUM_TASKS") && !get("PMIX_RANK") && !get("PMI_FD") &&
         !get("PMI_RANK") && !get("OMPI_COMM_WORLD_RANK");
}

// MPI initialised (by us, once per process, unless it already was) at a
// thread level the comm stream's thread may call it at.
ddp_status start_mpi(const ddp_host* host) {
  int initialized = 0;
  int finalized = 0;
  int provided = MPI_THREAD_SINGLE;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized)
    return fail(host, DDP_ERR_UNSUPPORTED, "MPI was finalised in this process (by its host) and cannot start again");
  if (initialized) {
    MPI_Query_thread(&provided);
  } else {
    if (srun_without_pmi([](const char* name) -> const char* { return std::getenv(name); }))
      return fail(host, DDP_ERR_UNSUPPORTED,
                  "srun started this rank without PMIx (srun --mpi=none): start the ranks with "
                  "srun --mpi=pmix (or set MpiDefault=pmix in slurm.conf) for the mpi transport");
    make_libmpi_global();
    yield_when_oversubscribed();
    if (int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided))
      return fail(host, DDP_ERR_COMM, "MPI_Init_thread failed: " + mpi_error(rc));
    pin_this_plugin();
    std::atexit(finalize_at_exit);
  }
  if (provided < MPI_THREAD_SERIALIZED)
    return fail(host, DDP_ERR_UNSUPPORTED,
                "the MPI library gives " + thread_level(provided) +
                    "; the mpi transport needs MPI_THREAD_SERIALIZED (collectives run on the comm stream's thread)");
  if (g_bf16_sum == MPI_OP_NULL) MPI_Op_create(&sum16<ddp_float_to_bf16, ddp_bf16_to_float>, 1, &g_bf16_sum);
  if (g_fp16_sum == MPI_OP_NULL) MPI_Op_create(&sum16<ddp_float_to_fp16, ddp_fp16_to_float>, 1, &g_fp16_sum);
  return DDP_OK;
}

ddp_status mpi_init(const ddp_host* host, ddp_comm** out) {
  return ddp::plugin::guard(host, [&] {
    auto comm = std::make_unique<ddp_comm_s>();
    comm->host = host;
    int nonblocking = 0;
    if (host->config_bool(host->ctx, "nonblocking", false, &nonblocking) != DDP_OK)
      throw ddp::plugin::Failure(DDP_ERR_INVALID_ARGUMENT, "", /*text_is_set=*/true);
    comm->nonblocking = nonblocking != 0;
    if (ddp_status s = start_mpi(host)) throw ddp::plugin::Failure(s, "", /*text_is_set=*/true);
    int rank = -1;
    int size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank != host->rank || size != host->world_size)
      throw ddp::plugin::Failure(DDP_ERR_INVALID_ARGUMENT,
                                 "MPI_COMM_WORLD is " + std::to_string(size) + " ranks and this is rank " +
                                     std::to_string(rank) + ", but the run is " + std::to_string(host->world_size) +
                                     " ranks and this is rank " + std::to_string(host->rank) +
                                     ": start the ranks with mpirun -np " + std::to_string(host->world_size) +
                                     " ddp run CONFIG, or srun, or let ddp run start them (it does so through mpirun)");
    if (int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm->comm))
      throw ddp::plugin::Failure(DDP_ERR_COMM, "MPI_Comm_dup failed: " + mpi_error(rc));
    MPI_Comm_set_errhandler(comm->comm, MPI_ERRORS_RETURN);
    comm->rank = rank;
    comm->size = size;
    *out = comm.release();
  });
}

// A group's communicator (ABI 1.9): MPI_Comm_split of the parent's, on the
// calling thread (the engine calls split with no collective of the parent
// in flight; with MPI_THREAD_SERIALIZED no collective of another
// communicator of this process may run on a stream meanwhile either). MPI
// orders the members as the engine did (key, then the rank in the parent),
// so its rank and size must be how->rank and how->size; they differ only
// where the engine and MPI disagree on the membership, which is a bug.
ddp_status mpi_split(ddp_comm* parent, const ddp_split* how, ddp_comm** out) {
  const ddp_host* host = parent->host;
  if (ddp_status s = ddp::plugin::check_split(host, how, parent->size, "mpi")) return s;
  return ddp::plugin::guard(host, [&] {
    if (parent->stuck || parent->aborted)
      throw Failure(DDP_ERR_COMM, "mpi split: the parent communicator has a collective that was given up on");
    auto comm = std::make_unique<ddp_comm_s>();
    comm->host = host;
    comm->nonblocking = parent->nonblocking;
    if (int rc = MPI_Comm_split(parent->comm, how->color, how->key, &comm->comm))
      throw Failure(DDP_ERR_COMM, "mpi split: MPI_Comm_split (color " + std::to_string(how->color) + ", key " +
                                      std::to_string(how->key) + ") failed: " + mpi_error(rc));
    MPI_Comm_set_errhandler(comm->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm->comm, &comm->rank);
    MPI_Comm_size(comm->comm, &comm->size);
    // Left unfreed on a mismatch: MPI_Comm_free is collective, and members
    // that agree with the engine would not call it. The run fails anyway.
    if (comm->rank != how->rank || comm->size != how->size)
      throw Failure(DDP_ERR_INTERNAL, "mpi split: group '" + std::string(how->tag) + "': MPI_Comm_split made rank " +
                                          std::to_string(comm->rank) + " of " + std::to_string(comm->size) +
                                          ", the engine computed rank " + std::to_string(how->rank) + " of " +
                                          std::to_string(how->size));
    *out = comm.release();
  });
}

void mpi_destroy(ddp_comm* comm) {
  // A collective given up on is still pending: freeing the communicator
  // under it could hang, and the process is about to end anyway.
  if (!comm->stuck && comm->comm != MPI_COMM_NULL) MPI_Comm_free(&comm->comm);
  delete comm;
}

// MPI cannot cancel a collective, and a peer that waits in one for this
// rank would wait until its own timeout; MPI_Finalize, a fence, would wait
// for the peers too. So abort, called only on a failed run (after the rank
// reported why), ends the whole MPI job as MPI does: MPI_Abort, which has
// mpirun (or srun) stop every rank at once, this one with exit code 1.
void mpi_abort(ddp_comm* comm) {
  comm->aborted = true;
  MPI_Abort(MPI_COMM_WORLD, 1);
}

ddp_status mpi_all_reduce(ddp_comm* comm, const ddp_buffer* buf, ddp_reduce_op op, ddp_stream stream) {
  if (ddp_status s = check_buffer(comm, buf, "all_reduce")) return s;
  const ddp_buffer b = *buf;
  const int world = comm->size;
  return enqueue(
      comm, stream, describe("all_reduce", b),
      [comm, b] {
        return MPI_Allreduce(MPI_IN_PLACE, b.ptr, int(b.count), mpi_type(b.dtype), sum_of(b.dtype), comm->comm);
      },
      [comm, b](MPI_Request* r) {
        return MPI_Iallreduce(MPI_IN_PLACE, b.ptr, int(b.count), mpi_type(b.dtype), sum_of(b.dtype), comm->comm, r);
      },
      op == DDP_REDUCE_AVG ? std::function<void()>([b, world] { divide_by(b, world); }) : std::function<void()>());
}

ddp_status mpi_broadcast(ddp_comm* comm, const ddp_buffer* buf, int root, ddp_stream stream) {
  if (ddp_status s = check_buffer(comm, buf, "broadcast")) return s;
  if (ddp_status s = ddp::plugin::check_root(comm->host, root, comm->size)) return s;
  const ddp_buffer b = *buf;
  return enqueue(
      comm, stream, describe("broadcast", b),
      [comm, b, root] { return MPI_Bcast(b.ptr, int(b.count), mpi_type(b.dtype), root, comm->comm); },
      [comm, b, root](MPI_Request* r) {
        return MPI_Ibcast(b.ptr, int(b.count), mpi_type(b.dtype), root, comm->comm, r);
      });
}

ddp_status mpi_all_gather(ddp_comm* comm, const ddp_buffer* send, const ddp_buffer* recv, ddp_stream stream) {
  if (ddp_status s = check_buffer(comm, send, "all_gather")) return s;
  if (ddp_status s = check_buffer(comm, recv, "all_gather")) return s;
  if (ddp_status s = ddp::plugin::check_all_gather(comm->host, *send, *recv, comm->size)) return s;
  const ddp_buffer s = *send;
  const ddp_buffer v = *recv;
  const MPI_Datatype t = mpi_type(s.dtype);
  return enqueue(
      comm, stream, describe("all_gather", s),
      [comm, s, v, t] { return MPI_Allgather(s.ptr, int(s.count), t, v.ptr, int(s.count), t, comm->comm); },
      [comm, s, v, t](MPI_Request* r) {
        return MPI_Iallgather(s.ptr, int(s.count), t, v.ptr, int(s.count), t, comm->comm, r);
      });
}

ddp_status mpi_reduce_scatter(ddp_comm* comm, const ddp_buffer* send, const ddp_buffer* recv, ddp_reduce_op op,
                              ddp_stream stream) {
  if (ddp_status s = check_buffer(comm, send, "reduce_scatter")) return s;
  if (ddp_status s = check_buffer(comm, recv, "reduce_scatter")) return s;
  if (ddp_status s = ddp::plugin::check_reduce_scatter(comm->host, *send, *recv, comm->size)) return s;
  const int world = comm->size;
  const ddp_buffer s = *send;
  const ddp_buffer v = *recv;
  return enqueue(
      comm, stream, describe("reduce_scatter", s),
      [comm, s, v] {
        return MPI_Reduce_scatter_block(s.ptr, v.ptr, int(v.count), mpi_type(v.dtype), sum_of(v.dtype), comm->comm);
      },
      [comm, s, v](MPI_Request* r) {
        return MPI_Ireduce_scatter_block(s.ptr, v.ptr, int(v.count), mpi_type(v.dtype), sum_of(v.dtype), comm->comm, r);
      },
      op == DDP_REDUCE_AVG ? std::function<void()>([v, world] { divide_by(v, world); }) : std::function<void()>());
}

ddp_status mpi_barrier(ddp_comm* comm, ddp_stream stream) {
  return enqueue(
      comm, stream, "barrier", [comm] { return MPI_Barrier(comm->comm); },
      [comm](MPI_Request* r) { return MPI_Ibarrier(comm->comm, r); });
}

// `ddp plan`: MPI's own buffers are its own, not the engine's; none here.
// Reads its key as init does.
ddp_status mpi_plan(const ddp_host* host, ddp_plan*) {
  return ddp::plugin::guard(host, [&] { (void)ddp::plugin::Host(host).config_bool("nonblocking", false); });
}

}  // namespace

DDP_TRANSPORT_ENTRY = {
    .abi_version = DDP_ABI_VERSION,
    .struct_size = sizeof(ddp_transport_v1_t),
    .name = "mpi",
    .version = kVersion,
    .caps = DDP_CAP_DEVICE_CPU,
    .init = mpi_init,
    .destroy = mpi_destroy,
    .all_reduce = mpi_all_reduce,
    .broadcast = mpi_broadcast,
    .all_gather = mpi_all_gather,
    .reduce_scatter = mpi_reduce_scatter,
    .barrier = mpi_barrier,
    .abort = mpi_abort,
    .dtypes = kDtypes,
    .keys = kKeys,
    .plan = mpi_plan,
    .split = mpi_split,
};
