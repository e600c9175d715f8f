// gloo_transport.cpp — the `gloo` transport: CPU collectives over TCP with
// Facebook's Gloo. Every entry enqueues a closure on the stream it is given
// (host->launch_host_func) that runs Gloo's blocking algorithm there, so the
// training thread never blocks on the network. Gloo exceptions become a
// failed stream whose message names the collective.
//
// CUDA buffers (a CUDA run) are staged through page-locked host memory, all
// on the given stream: host->copy into the staging memory (async D2H), the
// same Gloo closure on it, host->copy back (async H2D). The staging memory
// (host->alloc_host, accounted as comm_buffers) is allocated at enqueue time
// on the calling thread, never in a closure; see stage().
//
// Keys ([transport], README.md): hostname and interface (the address this
// rank listens on: address.h), algorithm (all_reduce's: "auto", "direct",
// "ring" or "bcube").
//
// Groups (ABI 1.9, split): a group's communicator is a Gloo context of its
// own, made over the world's TCP device with a full mesh of new pairs, met
// under the group's tag (rendezvous.h). Every entry reads the rank and size
// of the communicator it is given, never the host's (the world's).
//
// Not here: GPUDirect or any CUDA call of its own (the nccl plugin moves GPU
// memory directly), TLS, ibverbs.
#include <ddp/plugin.h>
#include <ddp/plugin.hpp>
#include <ddp/transport.hpp>

#include "plan.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include "address.h"
#include "direct.h"
#include "dtypes.h"
#include "rendezvous.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace {

constexpr const char* kVersion = "0.5.0";  // 0.3: CUDA buffers, staged; 0.4: bfloat16, float16; 0.5: split

// The keys of [transport.gloo] (README.md has them in full).
constexpr ddp_key kKeys[] = {
    {"hostname", "string", "the address this rank listens on; \"auto\" (default): found from interface or the routes"},
    {"interface", "string", "with hostname = \"auto\", the network interface to listen on (as GLOO_SOCKET_IFNAME)"},
    {"algorithm", "string", "all-reduce: \"auto\" (default), \"direct\", \"ring\" or \"bcube\""},
    {nullptr, nullptr, nullptr},
};

}  // namespace

struct ddp_comm_s {
  const ddp_host* host;
  // This rank's place in the communicator: the host's rank and world size
  // for the world's, how->rank and how->size for a group's (split).
  int rank = 0;
  int size = 1;
  std::shared_ptr<gloo::transport::Device> device;  // the world's, shared by its groups
  std::shared_ptr<gloo::rendezvous::Context> context;
  enum class Choice { Auto, Direct, Gloo } choice = Choice::Auto;                         // all_reduce's algorithm
  gloo::AllreduceOptions::Algorithm algorithm = gloo::AllreduceOptions::Algorithm::RING;  // for Gloo (and Auto)
  uint32_t next_tag = 0;  // same sequence on every rank: collectives are issued in the same order
  // reduce_scatter's scratch, grown on demand (accounted as a communication
  // buffer, as the buffers it reduces); touched only on the stream.
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  // all_reduce's scratch (direct): like the temporaries Gloo's own
  // algorithms allocate, not accounted; at most (n-1)/n of a piece.
  std::vector<unsigned char> temp;
  // Host memory (host->alloc_host) the calls on one stream stage their
  // buffers through on a CUDA run, one region per stream: calls on one stream
  // run in order, so a call's copies in come after the previous call's out.
  struct Staging {
    ddp_stream stream;
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  std::vector<Staging> staging;
  // Outgrown regions, freed once `done` (recorded on its stream at the
  // growth) has completed, as seen at a later growth, or in destroy. Only a
  // growth frees: once a step's sizes have been seen, staging memory stays
  // the same from step to step, as the engine's conformance suite checks.
  struct Retired {
    void* ptr;
    ddp_event done;  // null: kept until destroy
  };
  std::vector<Retired> retired;
};

namespace {

using ddp_gloo::divide;
using ddp_gloo::HostStore;
using ddp_gloo::gloo_supports;
using ddp_gloo::kDtypes;
using ddp_gloo::with_type;
using ddp::plugin::bytes_of;
using ddp::plugin::describe;
using ddp::plugin::fail;

// The status of an exception a Gloo call that ran for `took` threw. Gloo
// throws one type (IoException) for a lost peer and for a timeout alike, so
// an I/O failure that took the run's timeout is DDP_ERR_TIMEOUT (a peer
// hung), an earlier one DDP_ERR_COMM (a peer or its connection is gone).
// Anything else (Gloo's enforce checks, out of memory) is not the network.
ddp_status gloo_failure(const std::exception& e, const ddp_host* host,
                        std::chrono::steady_clock::duration took) noexcept {
  if (!dynamic_cast<const gloo::IoException*>(&e)) return ddp::plugin::job_status(e, host, took);
  return took >= std::chrono::milliseconds(host->timeout_ms) ? DDP_ERR_TIMEOUT : DDP_ERR_COMM;
}

// A copy between a CUDA buffer and its staging part (host->copy, on the
// stream). One whose dst is its src (a CPU buffer, not staged) is no copy.
struct Copy {
  void* dst;
  const void* src;
  size_t bytes;
};

// Enqueues the copies `in`, then `run` in a host function (a job whose
// failure reads "gloo <what>: <Gloo's words>"), then the copies `out`, all
// on `stream`, in that order.
ddp_status enqueue(ddp_comm* comm, ddp_stream stream, std::string what, std::function<void()> run,
                   std::initializer_list<Copy> in = {}, std::initializer_list<Copy> out = {}) {
  const ddp_host* h = comm->host;
  for (const Copy& c : in)
    if (c.dst != c.src && c.bytes > 0)
      if (ddp_status s = h->copy(h->ctx, c.dst, c.src, c.bytes, stream)) return s;
  if (ddp_status s = ddp::plugin::launch_job(h, stream, "gloo", std::move(what), std::move(run), gloo_failure))
    return s;
  for (const Copy& c : out)
    if (c.dst != c.src && c.bytes > 0)
      if (ddp_status s = h->copy(h->ctx, c.dst, c.src, c.bytes, stream)) return s;
  return DDP_OK;
}

// A buffer argument (ddp::plugin::check_buffer): CPU, or CUDA on a CUDA run
// (staged through host memory), of a dtype Gloo sums.
ddp_status check_buffer(ddp_comm* comm, const ddp_buffer* buf, const char* entry) {
  const ddp_host* h = comm->host;
  return ddp::plugin::check_buffer(h, buf, entry, [&](const ddp_buffer& b) {
    if (b.device == DDP_DEVICE_CUDA && h->device != DDP_DEVICE_CUDA)
      return fail(h, DDP_ERR_UNSUPPORTED, std::string(entry) + ": a CUDA buffer on a run whose device is not CUDA");
    if (b.device != DDP_DEVICE_CPU && b.device != DDP_DEVICE_CUDA)
      return fail(h, DDP_ERR_UNSUPPORTED,
                  std::string(entry) + ": device kind " + std::to_string(int(b.device)) + " not supported (cpu, cuda)");
    if (!gloo_supports(b.dtype))
      return fail(h, DDP_ERR_UNSUPPORTED,
                  std::string(entry) + ": dtype not supported (float32, float64, int32, int64, bfloat16, float16)");
    return DDP_OK;
  });
}

// send and recv of one call: both given, on the same kind of device, and each valid.
ddp_status check_pair(ddp_comm* comm, const ddp_buffer* send, const ddp_buffer* recv, const char* entry) {
  if (!send || !recv) return ddp::plugin::null_buffer(comm->host, entry);
  if (send->device != recv->device)
    return fail(comm->host, DDP_ERR_INVALID_ARGUMENT,
                std::string(entry) + ": send and recv are on different kinds of device (" +
                    ddp::plugin::device_name(send->device) + " and " + ddp::plugin::device_name(recv->device) +
                    "): both must be CPU or both CUDA");
  if (ddp_status s = check_buffer(comm, send, entry)) return s;
  return check_buffer(comm, recv, entry);
}

// comm->scratch holding at least `bytes`; runs on the stream. CPU runs only
// (host->alloc is GPU memory on a CUDA run, not for a host function): other
// runs take their scratch from stage() at enqueue time.
void* scratch_of(ddp_comm* comm, size_t bytes) {
  if (comm->scratch_bytes < bytes) {
    const ddp_host* h = comm->host;
    h->free(h->ctx, comm->scratch);
    comm->scratch = nullptr;
    comm->scratch_bytes = 0;
    if (h->alloc(h->ctx, bytes, DDP_MEM_COMM_BUFFERS, &comm->scratch) != DDP_OK)
      throw std::runtime_error("out of memory for a " + std::to_string(bytes) + "-byte scratch buffer");
    comm->scratch_bytes = bytes;
  }
  return comm->scratch;
}

// Frees the outgrown staging regions whose event has completed, without
// waiting; at a growth only (see ddp_comm_s::retired). A region whose event
// failed, or could not be recorded, waits for destroy.
void release_retired(ddp_comm* comm) {
  const ddp_host* h = comm->host;
  auto& retired = comm->retired;
  for (size_t i = 0; i < retired.size();) {
    int done = 0;
    if (retired[i].done && h->event_query(h->ctx, retired[i].done, &done) == DDP_OK && done) {
      h->event_destroy(h->ctx, retired[i].done);
      h->free_host(h->ctx, retired[i].ptr);
      retired[i] = retired.back();
      retired.pop_back();
    } else {
      ++i;
    }
  }
}

// Points parts[i] at sizes[i] bytes (each 64-byte aligned) of the staging
// region of `stream`, growing it if needed. On the calling thread, at
// enqueue time: alloc_host may not be called from a host function. The
// parts stay valid for the work enqueued next on `stream`.
ddp_status stage(ddp_comm* comm, ddp_stream stream, const char* entry, std::initializer_list<size_t> sizes,
                 void** parts) {
  const ddp_host* h = comm->host;
  if (!ddp::plugin::has_alloc_host(h))
    return fail(h, DDP_ERR_UNSUPPORTED,
                std::string(entry) +
                    ": on a CUDA run gloo stages buffers through host->alloc_host, which this "
                    "engine (ABI " +
                    std::to_string(DDP_ABI_MAJOR(h->abi_version)) + "." +
                    std::to_string(DDP_ABI_MINOR(h->abi_version)) + ") lacks: it needs ABI 1.1 or newer");
  constexpr size_t kAlign = 64;
  size_t total = 0;
  for (size_t bytes : sizes) total += (bytes + kAlign - 1) / kAlign * kAlign;
  auto it = std::find_if(comm->staging.begin(), comm->staging.end(),
                         [&](const ddp_comm_s::Staging& s) { return s.stream == stream; });
  if (it == comm->staging.end()) it = comm->staging.insert(it, ddp_comm_s::Staging{stream});
  if (it->bytes < total) {
    release_retired(comm);
    void* grown = nullptr;
    if (ddp_status s = h->alloc_host(h->ctx, total, DDP_MEM_COMM_BUFFERS, &grown)) return s;  // text set
    if (it->ptr) {  // retired until the work already enqueued on the stream is done with it
      ddp_event done = nullptr;
      if (h->event_create(h->ctx, &done) != DDP_OK) done = nullptr;
      if (done && h->event_record(h->ctx, done, stream) != DDP_OK) {
        h->event_destroy(h->ctx, done);
        done = nullptr;
      }
      comm->retired.push_back(ddp_comm_s::Retired{it->ptr, done});
    }
    it->ptr = grown;
    it->bytes = total;
  }
  size_t offset = 0;
  for (size_t bytes : sizes) {
    *parts++ = static_cast<unsigned char*>(it->ptr) + offset;
    offset += (bytes + kAlign - 1) / kAlign * kAlign;
  }
  return DDP_OK;
}

// "auto" takes "direct" on 2 ranks, and on more up to this size, Gloo's
// ring above, which overlaps transfers with sums (README.md: measurements).
constexpr size_t kDirectMaxBytes = size_t(32) << 20;
// Gloo's ring moves segments of at most this (its default, 1 MiB, wakes
// more threads: 20-35 % slower at 100 MB; README.md).
constexpr size_t kRingSegmentBytes = size_t(16) << 20;

// Sum into `out`, then divide for AVG. Gloo's reduce signature: (dst, a, b, n).
template <typename T>
void reduce_in_place(ddp_comm* comm, T* ptr, size_t count, ddp_reduce_op op, uint32_t tag) {
  int world = comm->context->size;
  if (world == 1 || count == 0) return;
  const bool direct =
      comm->choice == ddp_comm_s::Choice::Direct ||
      (comm->choice == ddp_comm_s::Choice::Auto && (world == 2 || count * sizeof(T) <= kDirectMaxBytes));
  if (direct) {
    ddp_gloo::direct_all_reduce(*comm->context, comm->temp, ptr, count, tag);
  } else {
    gloo::AllreduceOptions opts(comm->context);
    opts.setOutput(ptr, count);
    opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<T>));
    opts.setAlgorithm(comm->algorithm);
    opts.setMaxSegmentSize(kRingSegmentBytes);
    opts.setTag(tag);
    gloo::allreduce(opts);
  }
  if (op == DDP_REDUCE_AVG) divide(ptr, count, world);
}

// ------------------------------------------------------------------ entries

ddp_status gloo_init(const ddp_host* host, ddp_comm** out) {
  const auto start = std::chrono::steady_clock::now();
  try {
    const char* key = nullptr;
    const char* interface = nullptr;
    const char* algorithm = nullptr;
    if (host->config_string(host->ctx, "hostname", "auto", &key) != DDP_OK ||
        host->config_string(host->ctx, "interface", "", &interface) != DDP_OK ||
        host->config_string(host->ctx, "algorithm", "auto", &algorithm) != DDP_OK)
      return DDP_ERR_INVALID_ARGUMENT;  // the host has set the error text
    std::string why;
    const std::string hostname = ddp_gloo::listen_address(key, interface, host->world_size, &why);
    if (hostname.empty()) return fail(host, DDP_ERR_INVALID_ARGUMENT, why);
    auto comm = std::make_unique<ddp_comm_s>();
    comm->host = host;
    comm->rank = host->rank;
    comm->size = host->world_size;
    const std::string name = algorithm;
    if (name == "direct") {
      comm->choice = ddp_comm_s::Choice::Direct;
    } else if (name == "ring" || name == "bcube") {
      comm->choice = ddp_comm_s::Choice::Gloo;
      if (name == "bcube") comm->algorithm = gloo::AllreduceOptions::Algorithm::BCUBE;
    } else if (name != "auto") {
      return fail(host, DDP_ERR_INVALID_ARGUMENT,
                  "transport.algorithm must be \"auto\", \"direct\", \"ring\" or \"bcube\" (got \"" + name + "\")");
    }
    if (ddp_status st = ddp_gloo::check_listen_address(host, hostname)) return st;
    gloo::transport::tcp::attr attr;
    attr.hostname = hostname;
    comm->device = gloo::transport::tcp::CreateDevice(attr);
    comm->context = std::make_shared<gloo::rendezvous::Context>(comm->rank, comm->size);
    comm->context->setTimeout(std::chrono::milliseconds(host->timeout_ms));  // before connecting
    HostStore store(host);
    comm->context->connectFullMesh(store, comm->device);
    *out = comm.release();
    return DDP_OK;
  } catch (const std::exception& e) {  // the store's own timeout is a Failure of its kind
    return fail(host, gloo_failure(e, host, std::chrono::steady_clock::now() - start),
                std::string("gloo rendezvous: ") + e.what());
  }
}

// A group's communicator (ABI 1.9): a new Gloo context of how->size ranks
// over the parent's TCP device, connected as a full mesh (a pair to every
// other member) through the engine's store under the group's tag, so that
// groups made at once never read each other's addresses. Its collectives
// then use tags of their own (next_tag from 0): every member issues the
// same sequence on it. The algorithm, the timeout and the host are the
// parent's; scratch and staging are its own.
ddp_status gloo_split(ddp_comm* parent, const ddp_split* how, ddp_comm** out) {
  const ddp_host* host = parent->host;
  if (ddp_status s = ddp::plugin::check_split(host, how, parent->size, "gloo")) return s;
  const auto start = std::chrono::steady_clock::now();
  try {
    auto comm = std::make_unique<ddp_comm_s>();
    comm->host = host;
    comm->rank = how->rank;
    comm->size = how->size;
    comm->device = parent->device;
    comm->choice = parent->choice;
    comm->algorithm = parent->algorithm;
    comm->context = std::make_shared<gloo::rendezvous::Context>(comm->rank, comm->size);
    comm->context->setTimeout(std::chrono::milliseconds(host->timeout_ms));  // before connecting
    HostStore store(host);
    gloo::rendezvous::PrefixStore group_store(how->tag, store);
    comm->context->connectFullMesh(group_store, comm->device);
    *out = comm.release();
    return DDP_OK;
  } catch (const std::exception& e) {  // the store's own timeout is a Failure of its kind
    return fail(host, gloo_failure(e, host, std::chrono::steady_clock::now() - start),
                "gloo split: group '" + std::string(how->tag) + "' (rank " + std::to_string(how->rank) + " of " +
                    std::to_string(how->size) + "): rendezvous: " + e.what());
  }
}

void gloo_destroy(ddp_comm* comm) {
  const ddp_host* h = comm->host;
  h->free(h->ctx, comm->scratch);
  // The host has synchronised every stream: no work uses staging memory now.
  for (const auto& r : comm->retired) {
    if (r.done) h->event_destroy(h->ctx, r.done);
    h->free_host(h->ctx, r.ptr);
  }
  for (const auto& st : comm->staging) h->free_host(h->ctx, st.ptr);
  delete comm;
}

ddp_status gloo_all_reduce(ddp_comm* comm, const ddp_buffer* buf_in, ddp_reduce_op op, ddp_stream stream) {
  if (ddp_status s = check_buffer(comm, buf_in, "all_reduce")) return s;
  const ddp_buffer buf = *buf_in;
  ddp_buffer work = buf;  // what Gloo works on: buf, or its staging part for a CUDA buffer
  if (buf.device == DDP_DEVICE_CUDA)
    if (ddp_status s = stage(comm, stream, "all_reduce", {bytes_of(buf)}, &work.ptr)) return s;
  uint32_t tag = comm->next_tag++;
  return enqueue(comm, stream, describe("all_reduce", buf),
                 [=] {
                   with_type(work.dtype, [&](auto* type) {
                     using T = std::remove_pointer_t<decltype(type)>;
                     reduce_in_place(comm, static_cast<T*>(work.ptr), work.count, op, tag);
                   });
                 },
                 {{work.ptr, buf.ptr, bytes_of(buf)}}, {{buf.ptr, work.ptr, bytes_of(buf)}});
}

ddp_status gloo_broadcast(ddp_comm* comm, const ddp_buffer* buf_in, int root, ddp_stream stream) {
  if (ddp_status s = check_buffer(comm, buf_in, "broadcast")) return s;
  if (ddp_status s = ddp::plugin::check_root(comm->host, root, comm->size)) return s;
  const ddp_buffer buf = *buf_in;
  ddp_buffer work = buf;  // as in all_reduce; only the root's data need go to the host
  if (buf.device == DDP_DEVICE_CUDA)
    if (ddp_status s = stage(comm, stream, "broadcast", {bytes_of(buf)}, &work.ptr)) return s;
  const size_t in_bytes = comm->rank == root ? bytes_of(buf) : 0;
  uint32_t tag = comm->next_tag++;
  return enqueue(comm, stream, describe("broadcast", buf),
                 [=] {
                   if (comm->context->size == 1) return;
                   with_type(work.dtype, [&](auto* type) {
                     using T = std::remove_pointer_t<decltype(type)>;
                     gloo::BroadcastOptions opts(comm->context);
                     opts.setOutput(static_cast<T*>(work.ptr), work.count);
                     opts.setRoot(root);
                     opts.setTag(tag);
                     gloo::broadcast(opts);
                   });
                 },
                 {{work.ptr, buf.ptr, in_bytes}}, {{buf.ptr, work.ptr, bytes_of(buf)}});
}

ddp_status gloo_all_gather(ddp_comm* comm, const ddp_buffer* send_in, const ddp_buffer* recv_in, ddp_stream stream) {
  if (ddp_status s = check_pair(comm, send_in, recv_in, "all_gather")) return s;
  if (ddp_status s = ddp::plugin::check_all_gather(comm->host, *send_in, *recv_in, comm->size)) return s;
  const ddp_buffer send = *send_in;
  const ddp_buffer recv = *recv_in;
  size_t world = static_cast<size_t>(comm->size);
  // What Gloo works on (staging parts for CUDA buffers).
  ddp_buffer hsend = send;
  ddp_buffer hrecv = recv;
  if (send.device == DDP_DEVICE_CUDA) {
    void* parts[2];
    if (ddp_status s = stage(comm, stream, "all_gather", {bytes_of(send), bytes_of(recv)}, parts)) return s;
    hsend.ptr = parts[0];
    hrecv.ptr = parts[1];
  }
  uint32_t tag = comm->next_tag++;
  return enqueue(comm, stream, describe("all_gather", recv),
                 [=] {
                   with_type(hsend.dtype, [&](auto* type) {
                     using T = std::remove_pointer_t<decltype(type)>;
                     if (world == 1) {
                       std::memmove(hrecv.ptr, hsend.ptr, hsend.count * sizeof(T));
                       return;
                     }
                     gloo::AllgatherOptions opts(comm->context);
                     opts.setInput(static_cast<T*>(hsend.ptr), hsend.count);
                     opts.setOutput(static_cast<T*>(hrecv.ptr), hrecv.count);
                     opts.setTag(tag);
                     gloo::allgather(opts);
                   });
                 },
                 {{hsend.ptr, send.ptr, bytes_of(send)}}, {{recv.ptr, hrecv.ptr, bytes_of(recv)}});
}

// reduce_scatter: the first step of direct_all_reduce alone (this Gloo
// snapshot has no options-style reduce-scatter): each rank sends chunk q of
// its send buffer to rank q and sums the chunks it receives into recv.
ddp_status gloo_reduce_scatter(ddp_comm* comm, const ddp_buffer* send_in, const ddp_buffer* recv_in, ddp_reduce_op op,
                               ddp_stream stream) {
  if (ddp_status s = check_pair(comm, send_in, recv_in, "reduce_scatter")) return s;
  if (ddp_status s = ddp::plugin::check_reduce_scatter(comm->host, *send_in, *recv_in, comm->size)) return s;
  const ddp_buffer send = *send_in;
  const ddp_buffer recv = *recv_in;
  size_t world = static_cast<size_t>(comm->size);
  // What Gloo works on (staging parts for CUDA buffers).
  ddp_buffer hsend = send;
  ddp_buffer hrecv = recv;
  void* staged_scratch = nullptr;              // null on a CPU run: scratch_of, on the stream, as ever
  if (comm->host->device != DDP_DEVICE_CPU) {  // no host->alloc in a host function there
    const bool cuda = send.device == DDP_DEVICE_CUDA;
    void* parts[3];
    if (ddp_status s =
            stage(comm, stream, "reduce_scatter",
                  {cuda ? bytes_of(send) : 0, cuda ? bytes_of(recv) : 0, (world - 1) * bytes_of(recv)}, parts))
      return s;
    if (cuda) {
      hsend.ptr = parts[0];
      hrecv.ptr = parts[1];
    }
    staged_scratch = parts[2];
  }
  uint32_t tag = comm->next_tag++;
  return enqueue(comm, stream, describe("reduce_scatter", send),
                 [=] {
                   with_type(hsend.dtype, [&](auto* type) {
                     using T = std::remove_pointer_t<decltype(type)>;
                     T* out = static_cast<T*>(hrecv.ptr);
                     if (world == 1 || hrecv.count == 0) {
                       std::memmove(out, hsend.ptr, hrecv.count * sizeof(T));
                       return;
                     }
                     auto in = comm->context->createUnboundBuffer(hsend.ptr, hsend.count * sizeof(T));
                     T* scratch = static_cast<T*>(
                         staged_scratch ? staged_scratch : scratch_of(comm, (world - 1) * hrecv.count * sizeof(T)));
                     ddp_gloo::scatter_reduce_step<T>(*comm->context, *in, 0, hsend.count, hrecv.count, out, scratch,
                                                      gloo::Slot::build(ddp_gloo::kDirectSlotPrefix, tag));
                     if (op == DDP_REDUCE_AVG) divide(out, hrecv.count, int(world));
                   });
                 },
                 {{hsend.ptr, send.ptr, bytes_of(send)}}, {{recv.ptr, hrecv.ptr, bytes_of(recv)}});
}

ddp_status gloo_barrier(ddp_comm* comm, ddp_stream stream) {
  uint32_t tag = comm->next_tag++;
  return enqueue(comm, stream, "barrier", [=] {
    if (comm->context->size == 1) return;
    gloo::BarrierOptions opts(comm->context);
    opts.setTag(tag);
    gloo::barrier(opts);
  });
}

}  // namespace

DDP_TRANSPORT_ENTRY = {
    .abi_version = DDP_ABI_VERSION,
    .struct_size = sizeof(ddp_transport_v1_t),
    .name = "gloo",
    .version = kVersion,
    .caps = DDP_CAP_DEVICE_CPU | DDP_CAP_DEVICE_CUDA,  // CUDA: staged through page-locked host memory
    .init = gloo_init,
    .destroy = gloo_destroy,
    .all_reduce = gloo_all_reduce,
    .broadcast = gloo_broadcast,
    .all_gather = gloo_all_gather,
    .reduce_scatter = gloo_reduce_scatter,
    .barrier = gloo_barrier,
    .dtypes = kDtypes,
    .keys = kKeys,
    .plan = ddp::gloo_transport::plan,
    .split = gloo_split,
};
