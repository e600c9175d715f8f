// gloo_transport.cpp — the `gloo` transport: CPU collectives over TCP with
// Facebook's Gloo. Every entry enqueues a closure on the stream it is given
// (host->launch_host_func) that runs Gloo's blocking algorithm there, so the
// training thread never blocks on the network. Gloo exceptions become a
// failed stream whose message names the collective.
//
// Keys ([transport]): hostname (string, default "127.0.0.1": the address
// this rank listens on), algorithm ("ring" | "bcube", default "ring").
//
// Not here: GPU memory (that is the nccl plugin), TLS, ibverbs.
#include <ddp/plugin.h>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

constexpr const char* kVersion = "0.1.0";

// Gloo's rendezvous, through the engine's store (so every transport meets the
// same way, and the engine decides where: a file store, or Redis).
class HostStore final : public gloo::rendezvous::Store {
 public:
  explicit HostStore(const ddp_host* host) : host_(host) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    if (host_->store_set(host_->ctx, key.c_str(), data.data(), data.size()) != DDP_OK)
      throw std::runtime_error("store set '" + key + "' failed");
  }
  std::vector<char> get(const std::string& key) override {
    void* data = nullptr;
    size_t bytes = 0;
    if (host_->store_get(host_->ctx, key.c_str(), &data, &bytes) != DDP_OK)
      throw std::runtime_error("timed out waiting for rendezvous key '" + key + "'");
    std::vector<char> out(static_cast<char*>(data), static_cast<char*>(data) + bytes);
    std::free(data);
    return out;
  }
  void wait(const std::vector<std::string>& keys) override {
    std::vector<const char*> raw;
    for (const auto& k : keys) raw.push_back(k.c_str());
    if (host_->store_wait(host_->ctx, raw.data(), raw.size()) != DDP_OK)
      throw std::runtime_error("no answer from the other ranks within " + std::to_string(host_->timeout_ms) +
                               " ms (is every rank started, with the same rendezvous?)");
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override {
    wait(keys);  // the engine's store applies the run's timeout
  }

 private:
  const ddp_host* host_;
};

}  // namespace

struct ddp_comm_s {
  const ddp_host* host;
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
  gloo::AllreduceOptions::Algorithm algorithm;
  uint32_t next_tag = 0;  // same sequence on every rank: collectives are issued in the same order
  // reduce_scatter's scratch, grown on demand; touched only on the stream.
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
};

namespace {

ddp_status fail(const ddp_host* host, ddp_status status, const std::string& message) {
  host->set_error(host->ctx, message.c_str());
  return status;
}

size_t dtype_size(ddp_dtype dtype) {
  switch (dtype) {
    case DDP_FLOAT32: case DDP_INT32: return 4;
    case DDP_FLOAT64: case DDP_INT64: return 8;
    default: return 0;
  }
}

// Calls f(T*) with the buffer typed by its dtype.
template <typename F>
void with_type(ddp_dtype dtype, F&& f) {
  switch (dtype) {
    case DDP_FLOAT32: f(static_cast<float*>(nullptr)); return;
    case DDP_FLOAT64: f(static_cast<double*>(nullptr)); return;
    case DDP_INT32: f(static_cast<int32_t*>(nullptr)); return;
    case DDP_INT64: f(static_cast<int64_t*>(nullptr)); return;
    default: throw std::runtime_error("unsupported dtype");
  }
}

// One enqueued collective: `run` executes on the stream's executor.
struct Job {
  ddp_comm* comm;
  std::string what;  // "all_reduce (4096 bytes)", for error messages
  std::function<void()> run;
};

ddp_status run_job(void* user, int cancelled) {
  std::unique_ptr<Job> job(static_cast<Job*>(user));
  if (cancelled) return DDP_OK;
  try {
    job->run();
    return DDP_OK;
  } catch (const std::exception& e) {
    return fail(job->comm->host, DDP_ERR_COMM, "gloo " + job->what + ": " + e.what());
  }
}

ddp_status enqueue(ddp_comm* comm, ddp_stream stream, std::string what, std::function<void()> run) {
  auto* job = new Job{comm, std::move(what), std::move(run)};
  ddp_status status = comm->host->launch_host_func(comm->host->ctx, stream, run_job, job);
  if (status != DDP_OK) delete job;
  return status;
}

ddp_status check_buffer(ddp_comm* comm, const ddp_buffer& buf, const char* entry) {
  if (buf.device != DDP_DEVICE_CPU)
    return fail(comm->host, DDP_ERR_UNSUPPORTED, std::string(entry) + ": gloo needs CPU buffers");
  if (dtype_size(buf.dtype) == 0)
    return fail(comm->host, DDP_ERR_UNSUPPORTED,
                std::string(entry) + ": dtype not supported (float32, float64, int32, int64)");
  if (buf.count > 0 && !buf.ptr)
    return fail(comm->host, DDP_ERR_INVALID_ARGUMENT, std::string(entry) + ": NULL buffer");
  return DDP_OK;
}

std::string describe(const char* entry, const ddp_buffer& buf) {
  return std::string(entry) + " (" + std::to_string(buf.count * dtype_size(buf.dtype)) + " bytes)";
}

// Sum into `out`, then divide for AVG. Gloo's reduce signature: (dst, a, b, n).
template <typename T>
void reduce_in_place(ddp_comm* comm, T* ptr, size_t count, ddp_reduce_op op, uint32_t tag) {
  int world = comm->context->size;
  if (world > 1) {
    gloo::AllreduceOptions opts(comm->context);
    opts.setOutput(ptr, count);
    opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<T>));
    opts.setAlgorithm(comm->algorithm);
    opts.setTag(tag);
    gloo::allreduce(opts);
  }
  if (op == DDP_REDUCE_AVG && world > 1)
    for (size_t i = 0; i < count; ++i) ptr[i] = static_cast<T>(ptr[i] / static_cast<T>(world));
}

// ------------------------------------------------------------------ entries

ddp_status gloo_init(const ddp_host* host, ddp_comm** out) {
  try {
    const char* hostname = nullptr;
    const char* algorithm = nullptr;
    if (host->config_string(host->ctx, "hostname", "127.0.0.1", &hostname) != DDP_OK ||
        host->config_string(host->ctx, "algorithm", "ring", &algorithm) != DDP_OK)
      return DDP_ERR_INVALID_ARGUMENT;  // the host has set the error text
    auto comm = std::make_unique<ddp_comm_s>();
    comm->host = host;
    if (std::strcmp(algorithm, "ring") == 0) {
      comm->algorithm = gloo::AllreduceOptions::Algorithm::RING;
    } else if (std::strcmp(algorithm, "bcube") == 0) {
      comm->algorithm = gloo::AllreduceOptions::Algorithm::BCUBE;
    } else {
      return fail(host, DDP_ERR_INVALID_ARGUMENT,
                  std::string("transport.algorithm must be \"ring\" or \"bcube\" (got \"") + algorithm + "\")");
    }
    gloo::transport::tcp::attr attr;
    attr.hostname = hostname;
    comm->device = gloo::transport::tcp::CreateDevice(attr);
    comm->context = std::make_shared<gloo::rendezvous::Context>(host->rank, host->world_size);
    comm->context->setTimeout(std::chrono::milliseconds(host->timeout_ms));  // before connecting
    HostStore store(host);
    comm->context->connectFullMesh(store, comm->device);
    *out = comm.release();
    return DDP_OK;
  } catch (const std::exception& e) {
    return fail(host, DDP_ERR_COMM, std::string("gloo rendezvous: ") + e.what());
  }
}

void gloo_destroy(ddp_comm* comm) {
  comm->host->free(comm->host->ctx, comm->scratch);
  delete comm;
}

ddp_status gloo_all_reduce(ddp_comm* comm, const ddp_buffer* buf_in, ddp_reduce_op op, ddp_stream stream) {
  if (!buf_in) return fail(comm->host, DDP_ERR_INVALID_ARGUMENT, "all_reduce: NULL buffer");
  const ddp_buffer buf = *buf_in;
  if (ddp_status s = check_buffer(comm, buf, "all_reduce")) return s;
  uint32_t tag = comm->next_tag++;
  return enqueue(comm, stream, describe("all_reduce", buf), [=] {
    with_type(buf.dtype, [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      reduce_in_place(comm, static_cast<T*>(buf.ptr), buf.count, op, tag);
    });
  });
}

ddp_status gloo_broadcast(ddp_comm* comm, const ddp_buffer* buf_in, int root, ddp_stream stream) {
  if (!buf_in) return fail(comm->host, DDP_ERR_INVALID_ARGUMENT, "broadcast: NULL buffer");
  const ddp_buffer buf = *buf_in;
  if (ddp_status s = check_buffer(comm, buf, "broadcast")) return s;
  if (root < 0 || root >= comm->host->world_size)
    return fail(comm->host, DDP_ERR_INVALID_ARGUMENT, "broadcast: root " + std::to_string(root) + " out of range");
  uint32_t tag = comm->next_tag++;
  return enqueue(comm, stream, describe("broadcast", buf), [=] {
    if (comm->context->size == 1) return;
    with_type(buf.dtype, [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      gloo::BroadcastOptions opts(comm->context);
      opts.setOutput(static_cast<T*>(buf.ptr), buf.count);
      opts.setRoot(root);
      opts.setTag(tag);
      gloo::broadcast(opts);
    });
  });
}

ddp_status gloo_all_gather(ddp_comm* comm, const ddp_buffer* send_in, const ddp_buffer* recv_in,
                           ddp_stream stream) {
  if (!send_in || !recv_in) return fail(comm->host, DDP_ERR_INVALID_ARGUMENT, "all_gather: NULL buffer");
  const ddp_buffer send = *send_in, recv = *recv_in;
  if (ddp_status s = check_buffer(comm, send, "all_gather")) return s;
  if (ddp_status s = check_buffer(comm, recv, "all_gather")) return s;
  size_t world = static_cast<size_t>(comm->host->world_size);
  if (recv.count != send.count * world || recv.dtype != send.dtype)
    return fail(comm->host, DDP_ERR_INVALID_ARGUMENT,
                "all_gather: recv must hold send.count * world_size elements of send's dtype");
  uint32_t tag = comm->next_tag++;
  return enqueue(comm, stream, describe("all_gather", recv), [=] {
    with_type(send.dtype, [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      if (world == 1) {
        std::memmove(recv.ptr, send.ptr, send.count * sizeof(T));
        return;
      }
      gloo::AllgatherOptions opts(comm->context);
      opts.setInput(static_cast<T*>(send.ptr), send.count);
      opts.setOutput(static_cast<T*>(recv.ptr), recv.count);
      opts.setTag(tag);
      gloo::allgather(opts);
    });
  });
}

// This Gloo snapshot has no options-style reduce-scatter (only a legacy class
// that registers buffers at construction), so reduce the whole send buffer
// in a scratch copy with gloo::allreduce and keep this rank's slice. It moves
// about twice the bytes of a true reduce-scatter.
ddp_status gloo_reduce_scatter(ddp_comm* comm, const ddp_buffer* send_in, const ddp_buffer* recv_in,
                               ddp_reduce_op op, ddp_stream stream) {
  if (!send_in || !recv_in) return fail(comm->host, DDP_ERR_INVALID_ARGUMENT, "reduce_scatter: NULL buffer");
  const ddp_buffer send = *send_in, recv = *recv_in;
  if (ddp_status s = check_buffer(comm, send, "reduce_scatter")) return s;
  if (ddp_status s = check_buffer(comm, recv, "reduce_scatter")) return s;
  size_t world = static_cast<size_t>(comm->host->world_size);
  if (send.count != recv.count * world || recv.dtype != send.dtype)
    return fail(comm->host, DDP_ERR_INVALID_ARGUMENT,
                "reduce_scatter: send must hold recv.count * world_size elements of recv's dtype");
  uint32_t tag = comm->next_tag++;
  return enqueue(comm, stream, describe("reduce_scatter", send), [=] {
    with_type(send.dtype, [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      const size_t bytes = send.count * sizeof(T);
      if (comm->scratch_bytes < bytes) {  // accounted as a communication buffer
        const ddp_host* h = comm->host;
        h->free(h->ctx, comm->scratch);
        comm->scratch = nullptr;
        comm->scratch_bytes = 0;
        if (h->alloc(h->ctx, bytes, DDP_MEM_COMM_BUFFERS, &comm->scratch) != DDP_OK)
          throw std::runtime_error("out of memory for a " + std::to_string(bytes) + "-byte scratch buffer");
        comm->scratch_bytes = bytes;
      }
      T* scratch = static_cast<T*>(comm->scratch);
      std::memcpy(scratch, send.ptr, bytes);
      reduce_in_place(comm, scratch, send.count, op, tag);
      size_t rank = static_cast<size_t>(comm->context->rank);
      std::memcpy(recv.ptr, scratch + rank * recv.count, recv.count * sizeof(T));
    });
  });
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

extern "C" DDP_PLUGIN_EXPORT const ddp_transport_v1_t ddp_transport_v1;
extern "C" const ddp_transport_v1_t ddp_transport_v1 = {
    DDP_ABI_VERSION,
    sizeof(ddp_transport_v1_t),
    "gloo",
    kVersion,
    DDP_CAP_DEVICE_CPU,
    gloo_init,
    gloo_destroy,
    gloo_all_reduce,
    gloo_broadcast,
    gloo_all_gather,
    gloo_reduce_scatter,
    gloo_barrier,
    nullptr,  // abort: Gloo collectives end by their own timeout
};
