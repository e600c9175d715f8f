// host.cpp — the ddp_host vtable and the metered transport (see host.h).
// Each callback is a small adapter: it converts handles, calls the engine
// piece that does the work, and turns exceptions into a status plus text.
#include "host.h"

#include <cstdlib>
#include <cstring>

#include "nvtx.h"

namespace ddp {
namespace {

thread_local std::string t_plugin_error;

Stream* to_stream(ddp_stream s) { return reinterpret_cast<Stream*>(s); }
ddp_stream from_stream(Stream& s) { return reinterpret_cast<ddp_stream>(&s); }
Event* to_event(ddp_event e) { return reinterpret_cast<Event*>(e); }

size_t dtype_bytes(ddp_dtype dtype) {
  switch (dtype) {
    case DDP_FLOAT32: case DDP_INT32: return 4;
    case DDP_FLOAT64: case DDP_INT64: return 8;
    case DDP_BFLOAT16: case DDP_FLOAT16: return 2;
  }
  return 0;
}

// Runs `body`, mapping exceptions to a status with the text set.
template <typename F>
ddp_status guarded(F&& body, ddp_status on_error = DDP_ERR_INTERNAL) {
  try {
    body();
    return DDP_OK;
  } catch (const ConfigError& e) {
    t_plugin_error = e.what();
    return DDP_ERR_INVALID_ARGUMENT;
  } catch (const std::exception& e) {
    t_plugin_error = e.what();
    return on_error;
  }
}

}  // namespace

std::string take_plugin_error() {
  std::string text = std::move(t_plugin_error);
  t_plugin_error.clear();
  return text.empty() ? "failed without an error message" : text;
}

void HostServices::refresh_param_table() {
  auto& params = model->params();
  param_table.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    Parameter& p = params[i];
    param_table[i] = ddp_param{p.name.c_str(), i, p.data.data(),
                               p.trainable ? p.grad.data() : nullptr, p.data.numel(), DDP_FLOAT32,
                               p.trainable ? 1 : 0};
  }
}

struct HostCallbacks {
  static PluginHost& self(void* ctx) { return *static_cast<PluginHost*>(ctx); }
  static HostServices& svc(void* ctx) { return self(ctx).services_; }

  // Entries that call into the device are refused inside a device stream's
  // host function (CUDA forbids CUDA calls there: they may fail, or
  // deadlock, as a blocking allocation would). Sets the text.
  static std::string refusal(const char* entry) {
    return std::string(entry) +
           ": not allowed inside a host function on a device stream (CUDA allows no CUDA calls there, "
           "and none may block): call it at enqueue time, on the calling thread";
  }
  static bool in_host_function(const char* entry) {
    if (!Stream::in_device_task()) return false;
    t_plugin_error = refusal(entry);
    return true;
  }
  // For the entries without a status: logged, and the call dropped (memory
  // or an event left, never a blocking device call there).
  static bool dropped_in_host_function(void* ctx, const char* entry) {
    if (!Stream::in_device_task()) return false;
    log(ctx, DDP_LOG_ERROR, refusal(entry).c_str());
    return true;
  }

  static void log(void* ctx, ddp_log_level level, const char* message) {
    static const char* kLevels[] = {"debug", "info", "warning", "error"};
    if (level == DDP_LOG_DEBUG && !std::getenv("DDP_DEBUG")) return;
    std::fprintf(stderr, "[rank %d] %s: %s: %s\n", svc(ctx).rank.rank, self(ctx).label_.c_str(),
                 kLevels[level < 0 || level > 3 ? 1 : level], message);
  }
  static void set_error(void*, const char* message) { t_plugin_error = message ? message : ""; }

  static ddp_status config_int(void* ctx, const char* key, int64_t fallback, int64_t* out) {
    return guarded([&] { *out = self(ctx).section_.get_int(key, fallback); });
  }
  static ddp_status config_float(void* ctx, const char* key, double fallback, double* out) {
    return guarded([&] { *out = self(ctx).section_.get_float(key, fallback); });
  }
  static ddp_status config_bool(void* ctx, const char* key, int fallback, int* out) {
    return guarded([&] { *out = self(ctx).section_.get_bool(key, fallback != 0) ? 1 : 0; });
  }
  static ddp_status config_string(void* ctx, const char* key, const char* fallback, const char** out) {
    return guarded([&] {
      auto& strings = self(ctx).strings_;
      strings.push_back(self(ctx).section_.get_string(key, fallback ? fallback : ""));
      *out = strings.back().c_str();
    });
  }
  static size_t param_count(void* ctx) { return svc(ctx).param_table.size(); }
  static const ddp_param* param(void* ctx, size_t index) {
    auto& table = svc(ctx).param_table;
    return index < table.size() ? &table[index] : nullptr;
  }

  // alloc and alloc_host: device memory, or host memory for staging it.
  template <typename Alloc>
  static ddp_status allocate(const char* entry, ddp_mem_category category, Alloc&& alloc) {
    if (in_host_function(entry)) return DDP_ERR_UNSUPPORTED;
    if (category < 0 || category >= DDP_MEM_CATEGORY_COUNT) {
      t_plugin_error = std::string(entry) + ": unknown memory category " + std::to_string(category);
      return DDP_ERR_INVALID_ARGUMENT;
    }
    return guarded([&] { alloc(static_cast<MemCategory>(category)); }, DDP_ERR_OUT_OF_MEMORY);
  }
  // free and free_host: never fail across the ABI.
  template <typename Free>
  static void release(void* ctx, const char* entry, void* ptr, Free&& free) {
    if (ptr && dropped_in_host_function(ctx, entry)) return;
    try {
      free();
    } catch (const std::exception& e) {
      log(ctx, DDP_LOG_ERROR, e.what());
    }
  }
  static ddp_status alloc(void* ctx, size_t bytes, ddp_mem_category category, void** out) {
    return allocate("alloc", category, [&](MemCategory c) { *out = svc(ctx).device->alloc(bytes, c); });
  }
  static void free(void* ctx, void* ptr) {
    release(ctx, "free", ptr, [&] { svc(ctx).device->free(ptr); });
  }
  static ddp_status alloc_host(void* ctx, size_t bytes, ddp_mem_category category, void** out) {
    return allocate("alloc_host", category, [&](MemCategory c) { *out = svc(ctx).device->alloc_host(bytes, c); });
  }
  static void free_host(void* ctx, void* ptr) {
    release(ctx, "free_host", ptr, [&] { svc(ctx).device->free_host(ptr); });
  }

  static ddp_status copy(void* ctx, void* dst, const void* src, size_t bytes, ddp_stream stream) {
    if (in_host_function("copy")) return DDP_ERR_UNSUPPORTED;
    return guarded([&] { svc(ctx).device->copy(dst, src, bytes, *to_stream(stream)); });
  }
  static ddp_status fill(void* ctx, const ddp_buffer* buf, double value, ddp_stream stream) {
    if (in_host_function("fill")) return DDP_ERR_UNSUPPORTED;
    if (buf->dtype != DDP_FLOAT32) return unsupported_dtype("fill");
    return guarded([&] {
      svc(ctx).device->fill(static_cast<float*>(buf->ptr), buf->count, static_cast<float>(value),
                            *to_stream(stream));
    });
  }
  static ddp_status scale(void* ctx, const ddp_buffer* buf, double factor, ddp_stream stream) {
    if (in_host_function("scale")) return DDP_ERR_UNSUPPORTED;
    if (buf->dtype != DDP_FLOAT32) return unsupported_dtype("scale");
    return guarded([&] {
      svc(ctx).device->scale(static_cast<float*>(buf->ptr), buf->count, static_cast<float>(factor),
                             *to_stream(stream));
    });
  }
  static ddp_status unsupported_dtype(const char* what) {
    t_plugin_error = std::string(what) + ": only float32 buffers are supported";
    return DDP_ERR_UNSUPPORTED;
  }

  static ddp_stream compute_stream(void* ctx) { return from_stream(svc(ctx).device->compute_stream()); }
  static ddp_stream comm_stream(void* ctx) { return from_stream(svc(ctx).device->comm_stream()); }
  static ddp_status launch_host_func(void*, ddp_stream stream, ddp_host_func fn, void* user) {
    if (in_host_function("launch_host_func")) return DDP_ERR_UNSUPPORTED;
    return guarded([&] {
      to_stream(stream)->enqueue([fn, user](bool cancelled) {
        if (fn(user, cancelled ? 1 : 0) != DDP_OK && !cancelled) throw Error(take_plugin_error());
      });
    });
  }

  static ddp_status event_create(void*, ddp_event* out) {
    return guarded([&] { *out = reinterpret_cast<ddp_event>(new Event()); });
  }
  static void event_destroy(void* ctx, ddp_event event) {
    if (event && to_event(event)->on_device() && dropped_in_host_function(ctx, "event_destroy")) return;
    delete to_event(event);
  }
  static ddp_status event_record(void*, ddp_event event, ddp_stream stream) {
    if (in_host_function("event_record")) return DDP_ERR_UNSUPPORTED;
    return guarded([&] { to_event(event)->record(*to_stream(stream)); });
  }
  // A wait on an inline stream (CPU compute) blocks the training thread, so
  // it counts as exposed communication time just like event_synchronize.
  static ddp_status stream_wait_event(void* ctx, ddp_stream stream, ddp_event event) {
    if (in_host_function("stream_wait_event")) return DDP_ERR_UNSUPPORTED;
    auto start = Clock::now();
    ddp_status status =
        guarded([&] { to_event(event)->make_wait(*to_stream(stream), svc(ctx).wait_limit()); }, DDP_ERR_COMM);
    if (!to_stream(stream)->threaded()) add_blocked(ctx, start);
    return status;
  }
  static ddp_status event_synchronize(void* ctx, ddp_event event) {
    if (in_host_function("event_synchronize")) return DDP_ERR_UNSUPPORTED;
    auto start = Clock::now();
    ddp_status status = guarded([&] { to_event(event)->synchronize(svc(ctx).wait_limit()); }, DDP_ERR_COMM);
    add_blocked(ctx, start);
    return status;
  }
  static void add_blocked(void* ctx, Clock::time_point start) {
    svc(ctx).counters.blocked_ns +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
  }
  static ddp_status event_query(void*, ddp_event event, int* done) {
    if (in_host_function("event_query")) return DDP_ERR_UNSUPPORTED;
    // Done and failed: the failure, as the ABI says (*done is still 1).
    return guarded([&] {
      *done = to_event(event)->query() ? 1 : 0;
      if (*done) {
        const std::string error = to_event(event)->error();
        if (!error.empty()) throw Error(error);
      }
    }, DDP_ERR_COMM);
  }
  static void* stream_native(void*, ddp_stream stream) { return to_stream(stream)->native(); }  // CPU: null

  static ddp_status store_set(void* ctx, const char* key, const void* data, size_t bytes) {
    if (in_host_function("store_set")) return DDP_ERR_UNSUPPORTED;
    return guarded([&] {
      const char* p = static_cast<const char*>(data);
      svc(ctx).store->set(key, std::vector<char>(p, p + bytes));
    }, DDP_ERR_COMM);
  }
  static ddp_status store_get(void* ctx, const char* key, void** out, size_t* bytes) {
    if (in_host_function("store_get")) return DDP_ERR_UNSUPPORTED;
    return guarded([&] {
      std::vector<char> value = svc(ctx).store->get(key);
      *out = std::malloc(value.size() ? value.size() : 1);
      if (!*out) throw Error("store_get: out of memory");
      std::memcpy(*out, value.data(), value.size());
      *bytes = value.size();
    }, DDP_ERR_TIMEOUT);
  }
  static ddp_status store_wait(void* ctx, const char* const* keys, size_t count) {
    if (in_host_function("store_wait")) return DDP_ERR_UNSUPPORTED;
    return guarded([&] { svc(ctx).store->wait(std::vector<std::string>(keys, keys + count)); },
                   DDP_ERR_TIMEOUT);
  }

  static ddp_status run_optimizer(void* ctx, const size_t* indices, size_t count) {
    if (in_host_function("run_optimizer")) return DDP_ERR_UNSUPPORTED;
    return guarded([&] {
      HostServices& s = svc(ctx);
      s.optimizer->step(s.model->params(), indices, count);
    });
  }
};

PluginHost::PluginHost(HostServices& services, const PluginSection& section, std::string label)
    : services_(services), section_(section), label_(std::move(label)) {
  using H = HostCallbacks;
  host_.abi_version = DDP_ABI_VERSION;
  host_.struct_size = sizeof(ddp_host);
  host_.ctx = this;
  host_.rank = services.rank.rank;
  host_.world_size = services.rank.world_size;
  host_.local_rank = services.rank.local_rank;
  host_.device = services.device->kind();
  host_.log = H::log;
  host_.set_error = H::set_error;
  host_.config_int = H::config_int;
  host_.config_float = H::config_float;
  host_.config_bool = H::config_bool;
  host_.config_string = H::config_string;
  host_.param_count = H::param_count;
  host_.param = H::param;
  host_.alloc = H::alloc;
  host_.free = H::free;
  host_.copy = H::copy;
  host_.fill = H::fill;
  host_.scale = H::scale;
  host_.compute_stream = H::compute_stream;
  host_.comm_stream = H::comm_stream;
  host_.launch_host_func = H::launch_host_func;
  host_.event_create = H::event_create;
  host_.event_destroy = H::event_destroy;
  host_.event_record = H::event_record;
  host_.stream_wait_event = H::stream_wait_event;
  host_.event_synchronize = H::event_synchronize;
  host_.event_query = H::event_query;
  host_.stream_native = H::stream_native;
  host_.store_set = H::store_set;
  host_.store_get = H::store_get;
  host_.store_wait = H::store_wait;
  host_.timeout_ms = services.timeout_ms;
  host_.run_optimizer = H::run_optimizer;
  host_.alloc_host = H::alloc_host;
  host_.free_host = H::free_host;
}

void PluginHost::check(ddp_status status, const char* entry) const {
  if (status == DDP_OK) {
    t_plugin_error.clear();  // text set by a call that then succeeded is stale
    return;
  }
  throw Error(label_ + ": " + entry + ": " + take_plugin_error());
}

// ------------------------------------------------------- metered transport

struct MeterCallbacks {
  static MeteredTransport& self(ddp_comm* comm) { return *reinterpret_cast<MeteredTransport*>(comm); }

  // Brackets the real call with two host functions on the same stream: the
  // second one runs when the collective has finished, in stream order.
  // Issue order is the training thread's order, so the hash is race-free.
  static void fingerprint(ddp_comm* comm, uint64_t op, uint64_t count, uint64_t dtype, uint64_t arg) {
    std::atomic<uint64_t>& h = self(comm).services_.counters.sequence_hash;
    uint64_t v = h.load();
    for (uint64_t word : {op, count, dtype, arg})
      for (int b = 0; b < 8; ++b) v = (v ^ ((word >> (8 * b)) & 0xff)) * 1099511628211ull;
    h.store(v);
  }

  // What the closing host function needs (the start, and for a trace the
  // collective): heap-held so the tasks stay two pointers, as without a trace.
  struct Span {
    Clock::time_point start;
    Trace* trace;  // null: not traced
    const char* op;
    int64_t bytes, step;
    uint64_t nvtx = 0;  // the collective's NVTX range (GPU builds)
  };

  template <typename Call>
  static ddp_status metered(ddp_comm* comm, ddp_stream stream, const char* op, size_t bytes, Call&& call) {
    MeteredTransport& m = self(comm);
    Stream& s = *to_stream(stream);
    if (s.native()) return metered_on_device(m, s, op, bytes, std::forward<Call>(call));
    auto* span = new Span{Clock::time_point(), nullptr, op, int64_t(bytes), 0};
    // A device stream's enqueue can fail (cudaLaunchHostFunc): the error
    // goes back as a status, never as an exception across the C ABI.
    ddp_status queued = guarded([&] {
      s.enqueue([span](bool) {
        span->start = Clock::now();
        span->nvtx = nvtx::start(span->op);
      });
    }, DDP_ERR_COMM);
    if (queued != DDP_OK) {
      delete span;
      return queued;
    }
    ddp_status status = call(m.real_, m.real_comm_);
    if (status == DDP_OK && m.trace_) {  // traced iff counted, under the step that issued it
      span->trace = m.trace_;
      span->step = m.trace_->step();
    }
    CommCounters* counters = &m.services_.counters;
    // (If this enqueue fails, the first task still holds span: it leaks.)
    queued = guarded([&] {
      s.enqueue([span, counters](bool cancelled) {
        nvtx::end(span->nvtx);
        if (!cancelled) {
          const Clock::time_point end = Clock::now();
          counters->busy_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(end - span->start).count();
          if (span->trace) span->trace->collective(span->op, span->bytes, span->step, span->start, end);
        }
        delete span;
      });
    }, DDP_ERR_COMM);
    if (queued != DDP_OK) return queued;
    if (status == DDP_OK) {
      m.services_.counters.collectives += 1;
      m.services_.counters.bytes += static_cast<int64_t>(bytes);
    }
    return status;
  }

  // A device stream: timestamps around the collective, read in settle().
  template <typename Call>
  static ddp_status metered_on_device(MeteredTransport& m, Stream& s, const char* op, size_t bytes, Call&& call) {
    void* begin = nullptr;
    void* end = nullptr;
    ddp_status queued = guarded([&] { begin = s.record_timestamp(); }, DDP_ERR_COMM);
    if (queued != DDP_OK) return queued;
    ddp_status status;
    {
      nvtx::Range range(op);
      status = call(m.real_, m.real_comm_);
    }
    queued = guarded([&] {
      end = s.record_timestamp();
      m.pending_.push_back(MeteredTransport::Pending{&s, begin, end, op, int64_t(bytes),
                                                     status == DDP_OK && m.trace_ ? m.trace_->step() : -1});
    }, DDP_ERR_COMM);
    if (queued != DDP_OK) {
      s.release_timestamp(begin);
      s.release_timestamp(end);
      return queued;
    }
    if (status == DDP_OK) {
      m.services_.counters.collectives += 1;
      m.services_.counters.bytes += static_cast<int64_t>(bytes);
    }
    return status;
  }

  static ddp_status init(const ddp_host*, ddp_comm**) {
    t_plugin_error = "a strategy may not create another communicator";
    return DDP_ERR_UNSUPPORTED;
  }
  static void destroy(ddp_comm*) {}
  static ddp_status all_reduce(ddp_comm* c, const ddp_buffer* buf, ddp_reduce_op op, ddp_stream s) {
    fingerprint(c, 1, buf->count, buf->dtype, op);
    return metered(c, s, "all_reduce", buf->count * dtype_bytes(buf->dtype), [&](auto* t, ddp_comm* rc) {
      return t->all_reduce(rc, buf, op, s);
    });
  }
  static ddp_status broadcast(ddp_comm* c, const ddp_buffer* buf, int root, ddp_stream s) {
    fingerprint(c, 2, buf->count, buf->dtype, uint64_t(root));
    return metered(c, s, "broadcast", buf->count * dtype_bytes(buf->dtype), [&](auto* t, ddp_comm* rc) {
      return t->broadcast(rc, buf, root, s);
    });
  }
  static ddp_status all_gather(ddp_comm* c, const ddp_buffer* send, const ddp_buffer* recv, ddp_stream s) {
    fingerprint(c, 3, send->count, send->dtype, recv->count);
    return metered(c, s, "all_gather", recv->count * dtype_bytes(recv->dtype), [&](auto* t, ddp_comm* rc) {
      return t->all_gather(rc, send, recv, s);
    });
  }
  static ddp_status reduce_scatter(ddp_comm* c, const ddp_buffer* send, const ddp_buffer* recv,
                                   ddp_reduce_op op, ddp_stream s) {
    fingerprint(c, 4, send->count, send->dtype, op);
    return metered(c, s, "reduce_scatter", send->count * dtype_bytes(send->dtype), [&](auto* t, ddp_comm* rc) {
      return t->reduce_scatter(rc, send, recv, op, s);
    });
  }
  static ddp_status barrier(ddp_comm* c, ddp_stream s) {
    fingerprint(c, 5, 0, 0, 0);
    return metered(c, s, "barrier", 0, [&](auto* t, ddp_comm* rc) { return t->barrier(rc, s); });
  }
  static void abort(ddp_comm* c) {
    MeteredTransport& m = self(c);
    if (m.real_->abort) m.real_->abort(m.real_comm_);
  }
};

MeteredTransport::~MeteredTransport() {
  for (const Pending& p : pending_) {
    p.stream->release_timestamp(p.begin);
    p.stream->release_timestamp(p.end);
  }
}

void MeteredTransport::settle(bool wait) {
  size_t kept = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    const Pending p = pending_[i];
    if (!wait && !p.stream->timestamp_passed(p.end)) {
      pending_[kept++] = p;
      continue;
    }
    void* const stamps[2] = {p.begin, p.end};
    Clock::time_point at[2];
    p.stream->resolve_timestamps(stamps, 2, at);
    const Clock::time_point begin = at[0], end = at[1];
    p.stream->release_timestamp(p.begin);
    p.stream->release_timestamp(p.end);
    services_.counters.busy_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(end - begin).count();
    if (trace_ && p.step >= 0) trace_->collective(p.op, p.bytes, p.step, begin, end);
  }
  pending_.resize(kept);
}

MeteredTransport::MeteredTransport(const ddp_transport_v1_t* real, ddp_comm* comm,
                                   HostServices& services)
    : real_(real), real_comm_(comm), services_(services) {
  // Every entry is listed here: a new one must be metered (or refused), never
  // passed through with the wrapper's handle.
  static_assert(sizeof(ddp_transport_v1_t) == 4 + 4 + 2 * sizeof(void*) + 8 + 8 * sizeof(void*),
                "ddp_transport_v1_t changed: update MeteredTransport");
  vtable_ = ddp_transport_v1_t{};
  vtable_.abi_version = real->abi_version;
  vtable_.name = real->name;
  vtable_.version = real->version;
  vtable_.caps = real->caps;
  vtable_.struct_size = sizeof(ddp_transport_v1_t);
  vtable_.init = MeterCallbacks::init;
  vtable_.destroy = MeterCallbacks::destroy;
  vtable_.all_reduce = MeterCallbacks::all_reduce;
  vtable_.broadcast = MeterCallbacks::broadcast;
  vtable_.all_gather = MeterCallbacks::all_gather;
  vtable_.reduce_scatter = MeterCallbacks::reduce_scatter;
  vtable_.barrier = MeterCallbacks::barrier;
  vtable_.abort = MeterCallbacks::abort;
}

}  // namespace ddp
