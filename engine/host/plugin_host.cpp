// plugin_host.cpp — the ddp_host vtable (see plugin_host.h). Each callback
// is a small adapter: it converts handles, calls the engine piece that does
// the work, and turns exceptions into a status plus text (host_guard).
#include "plugin_host.h"

#include "env.h"
#include "whereabouts.h"

#include <cstdlib>
#include <cstring>
#include <string_view>

namespace ddp {

int64_t bus_bytes(const char* op, int64_t buffer_bytes, int world) {
  if (world <= 1) return 0;
  const std::string_view o(op);  // per collective: no allocation
  if (o == "all_reduce") return 2 * (world - 1) * buffer_bytes / world;
  if (o == "all_gather" || o == "reduce_scatter") return (world - 1) * buffer_bytes / world;
  if (o == "broadcast") return buffer_bytes;
  return 0;  // barrier
}
namespace {

thread_local std::string t_plugin_error;
// The text of the host entry that last failed on this thread, until the
// plugin's own error (which that failure usually caused) takes it along.
thread_local std::string t_host_cause;

Stream* to_stream(ddp_stream s) { return reinterpret_cast<Stream*>(s); }
ddp_stream from_stream(Stream& s) { return reinterpret_cast<ddp_stream>(&s); }
Event* to_event(ddp_event e) { return reinterpret_cast<Event*>(e); }

}  // namespace

std::string take_plugin_error() {
  std::string text = std::move(t_plugin_error);
  t_plugin_error.clear();
  t_host_cause.clear();
  return text.empty() ? "failed without an error message" : text;
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
    if (level == DDP_LOG_DEBUG && !env().debug) return;
    std::fprintf(stderr, "[rank %d] %s: %s: %s\n", svc(ctx).rank.rank, self(ctx).label_.c_str(),
                 kLevels[level < 0 || level > 3 ? 1 : level], message);
  }
  // A plugin's error keeps the cause a host entry gave it, where the
  // plugin's words do not already hold it ("store set 'rank_1' failed" alone
  // would hide "No space left on device").
  static void set_error(void*, const char* message) {
    t_plugin_error = message ? message : "";
    if (!t_host_cause.empty() && t_plugin_error.find(t_host_cause) == std::string::npos)
      t_plugin_error += " (" + t_host_cause + ")";
    t_host_cause.clear();
  }
  static void set_host_error(void*, const char* message) { t_plugin_error = t_host_cause = message ? message : ""; }

  static ddp_status config_int(void* ctx, const char* key, int64_t fallback, int64_t* out) {
    return host_guard([&] { *out = self(ctx).section_.get_int(key, fallback); });
  }
  static ddp_status config_float(void* ctx, const char* key, double fallback, double* out) {
    return host_guard([&] { *out = self(ctx).section_.get_float(key, fallback); });
  }
  static ddp_status config_bool(void* ctx, const char* key, int fallback, int* out) {
    return host_guard([&] { *out = self(ctx).section_.get_bool(key, fallback != 0) ? 1 : 0; });
  }
  static ddp_status config_string(void* ctx, const char* key, const char* fallback, const char** out) {
    return host_guard([&] {
      auto& strings = self(ctx).strings_;
      strings.push_back(self(ctx).section_.get_string(key, fallback ? fallback : ""));
      *out = strings.back().c_str();
    });
  }
  static size_t param_count(void* ctx) { return svc(ctx).params.param_table.size(); }
  static size_t unit_count(void* ctx) { return svc(ctx).params.unit_table.size(); }
  static const ddp_unit* unit(void* ctx, size_t index) {
    auto& table = svc(ctx).params.unit_table;
    return index < table.size() ? &table[index] : nullptr;
  }
  static const ddp_param* param(void* ctx, size_t index) {
    auto& table = svc(ctx).params.param_table;
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
    return host_guard([&] { alloc(static_cast<MemCategory>(category)); }, DDP_ERR_OUT_OF_MEMORY);
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
    return host_guard([&] { svc(ctx).device->copy(dst, src, bytes, *to_stream(stream)); });
  }
  static ddp_status fill(void* ctx, const ddp_buffer* buf, double value, ddp_stream stream) {
    if (in_host_function("fill")) return DDP_ERR_UNSUPPORTED;
    if (buf->dtype != DDP_FLOAT32) return unsupported_dtype("fill");
    return host_guard([&] {
      svc(ctx).device->fill(static_cast<float*>(buf->ptr), buf->count, static_cast<float>(value), *to_stream(stream));
    });
  }
  static ddp_status scale(void* ctx, const ddp_buffer* buf, double factor, ddp_stream stream) {
    if (in_host_function("scale")) return DDP_ERR_UNSUPPORTED;
    if (buf->dtype != DDP_FLOAT32) return unsupported_dtype("scale");
    return host_guard([&] {
      svc(ctx).device->scale(static_cast<float*>(buf->ptr), buf->count, static_cast<float>(factor), *to_stream(stream));
    });
  }
  static ddp_status convert(void* ctx, const ddp_buffer* dst, const ddp_buffer* src, ddp_stream stream) {
    if (in_host_function("convert")) return DDP_ERR_UNSUPPORTED;
    if (!dst || !src) {
      t_plugin_error = "convert: NULL buffer";
      return DDP_ERR_INVALID_ARGUMENT;
    }
    if (dst->count != src->count) {
      t_plugin_error = "convert: dst holds " + std::to_string(dst->count) + " elements, src " +
                       std::to_string(src->count) + ": they must be equal";
      return DDP_ERR_INVALID_ARGUMENT;
    }
    return host_guard(
        [&] { svc(ctx).device->convert(dst->ptr, dst->dtype, src->ptr, src->dtype, src->count, *to_stream(stream)); });
  }
  static ddp_status unsupported_dtype(const char* what) {
    t_plugin_error = std::string(what) + ": only float32 buffers are supported";
    return DDP_ERR_UNSUPPORTED;
  }

  static ddp_stream compute_stream(void* ctx) { return from_stream(svc(ctx).device->compute_stream()); }
  static ddp_stream comm_stream(void* ctx) { return from_stream(svc(ctx).device->comm_stream()); }
  static ddp_status launch_host_func(void* ctx, ddp_stream stream, ddp_host_func fn, void* user) {
    if (in_host_function("launch_host_func")) return DDP_ERR_UNSUPPORTED;
    const char* label = self(ctx).label_.c_str();  // the PluginHost outlives the plugin's work
    return host_guard([&] {
      to_stream(stream)->enqueue([fn, user, label](bool cancelled) {
        whereabouts::Inside in(label, "a host function");
        const ddp_status status = fn(user, cancelled ? 1 : 0);
        if (status != DDP_OK && !cancelled) throw Error(take_plugin_error(), status);
      });
    });
  }

  static ddp_status event_create(void*, ddp_event* out) {
    return host_guard([&] { *out = reinterpret_cast<ddp_event>(new Event()); });
  }
  static void event_destroy(void* ctx, ddp_event event) {
    if (event && to_event(event)->on_device() && dropped_in_host_function(ctx, "event_destroy")) return;
    delete to_event(event);
  }
  static ddp_status event_record(void*, ddp_event event, ddp_stream stream) {
    if (in_host_function("event_record")) return DDP_ERR_UNSUPPORTED;
    return host_guard([&] { to_event(event)->record(*to_stream(stream)); });
  }
  // A wait on an inline stream (CPU compute) blocks the training thread, so
  // it counts as exposed communication time just like event_synchronize.
  static ddp_status stream_wait_event(void* ctx, ddp_stream stream, ddp_event event) {
    if (in_host_function("stream_wait_event")) return DDP_ERR_UNSUPPORTED;
    auto start = Clock::now();
    ddp_status status = host_guard(
        [&] { naming_group(ctx, [&] { to_event(event)->make_wait(*to_stream(stream), svc(ctx).wait_limit()); }); },
        DDP_ERR_COMM);
    if (!to_stream(stream)->threaded()) add_blocked(ctx, start);
    return status;
  }
  static ddp_status event_synchronize(void* ctx, ddp_event event) {
    if (in_host_function("event_synchronize")) return DDP_ERR_UNSUPPORTED;
    auto start = Clock::now();
    // Its own stage: the watchdog's clock restarts for the wait (bounded by
    // wait_limit) and again after it, so an entry of many waits is not stuck.
    whereabouts::Inside in(self(ctx).label_.c_str(), "event_synchronize");
    ddp_status status = host_guard(
        [&] { naming_group(ctx, [&] { to_event(event)->synchronize(svc(ctx).wait_limit()); }); }, DDP_ERR_COMM);
    add_blocked(ctx, start);
    return status;
  }
  // A wait that gives up while a group's collective runs on the comm stream
  // names the group and its ranks (ABI 1.9).
  template <typename Wait>
  static void naming_group(void* ctx, Wait&& wait) {
    try {
      wait();
    } catch (const Error& e) {
      const char* group = svc(ctx).group_in_flight.load();
      if (e.status() != DDP_ERR_TIMEOUT || !group || std::string(e.what()).find(group) != std::string::npos) throw;
      throw Error(std::string(e.what()) + " (in " + group + ")", e.status());
    }
  }
  static void add_blocked(void* ctx, Clock::time_point start) {
    svc(ctx).counters.blocked_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
  }
  static ddp_status event_query(void*, ddp_event event, int* done) {
    if (in_host_function("event_query")) return DDP_ERR_UNSUPPORTED;
    // Done and failed: the failure, as the ABI says (*done is still 1).
    return host_guard(
        [&] {
          *done = to_event(event)->query() ? 1 : 0;
          if (*done) {
            const std::string error = to_event(event)->error();
            if (!error.empty()) throw Error(error, to_event(event)->error_kind());
          }
        },
        DDP_ERR_COMM);
  }
  static void* stream_native(void*, ddp_stream stream) { return to_stream(stream)->native(); }  // CPU: null

  static ddp_status store_set(void* ctx, const char* key, const void* data, size_t bytes) {
    if (in_host_function("store_set")) return DDP_ERR_UNSUPPORTED;
    return host_guard(
        [&] {
          const char* p = static_cast<const char*>(data);
          svc(ctx).store->set(key, std::vector<char>(p, p + bytes));
        },
        DDP_ERR_COMM);
  }
  static ddp_status store_get(void* ctx, const char* key, void** out, size_t* bytes) {
    if (in_host_function("store_get")) return DDP_ERR_UNSUPPORTED;
    return host_guard(
        [&] {
          std::vector<char> value = svc(ctx).store->get(key);
          *out = std::malloc(value.size() ? value.size() : 1);
          if (!*out) throw Error("store_get: out of memory");
          std::memcpy(*out, value.data(), value.size());
          *bytes = value.size();
        },
        DDP_ERR_TIMEOUT);
  }
  static ddp_status store_wait(void* ctx, const char* const* keys, size_t count) {
    if (in_host_function("store_wait")) return DDP_ERR_UNSUPPORTED;
    return host_guard([&] { svc(ctx).store->wait(std::vector<std::string>(keys, keys + count)); }, DDP_ERR_TIMEOUT);
  }

  static ddp_status claim(void* ctx, ddp_storage what, const size_t* indices, size_t count) {
    if (in_host_function("claim")) return DDP_ERR_UNSUPPORTED;
    if (!storage_allowed(ctx, "claim", what)) return DDP_ERR_UNSUPPORTED;
    return host_guard([&] {
      if (what == DDP_STORAGE_DATA)
        svc(ctx).params.claim_values(indices, count);
      else
        svc(ctx).params.claim_grads(indices, count);
    });
  }
  static ddp_status bind(void* ctx, ddp_storage what, size_t index, void* ptr) {
    if (in_host_function("bind")) return DDP_ERR_UNSUPPORTED;
    if (!storage_allowed(ctx, "bind", what)) return DDP_ERR_UNSUPPORTED;
    return host_guard([&] {
      if (what == DDP_STORAGE_DATA)
        svc(ctx).params.bind_values(index, ptr);
      else
        svc(ctx).params.bind_grad(index, ptr);
    });
  }
  // Gradient storage (1.4) or values (1.5), for a strategy that says it
  // may own them.
  static bool storage_allowed(void* ctx, const char* entry, ddp_storage what) {
    if (what != DDP_STORAGE_GRAD && what != DDP_STORAGE_DATA) {
      t_plugin_error = std::string(entry) + ": storage " + std::to_string(int(what)) +
                       " is none of DDP_STORAGE_GRAD and DDP_STORAGE_DATA";
      return false;
    }
    const uint64_t cap = what == DDP_STORAGE_GRAD ? DDP_CAP_OWNS_GRADIENTS : DDP_CAP_OWNS_PARAMETERS;
    if (!(self(ctx).caps_ & cap)) {
      t_plugin_error = std::string(entry) + ": the plugin's caps lack " +
                       (what == DDP_STORAGE_GRAD ? "DDP_CAP_OWNS_GRADIENTS" : "DDP_CAP_OWNS_PARAMETERS");
      return false;
    }
    return true;
  }
  static ddp_status run_optimizer_ranges(void* ctx, const ddp_range* ranges, size_t count) {
    if (in_host_function("run_optimizer_ranges")) return DDP_ERR_UNSUPPORTED;
    whereabouts::Inside in(nullptr, nullptr);  // the engine's optimizer, as run_optimizer
    return host_guard([&] {
      if (!svc(ctx).run_optimizer_ranges)
        throw Error("run_optimizer_ranges: this host has no optimizer", DDP_ERR_UNSUPPORTED);
      svc(ctx).run_optimizer_ranges(ranges, count);
    });
  }
  static ddp_status add(void* ctx, const ddp_buffer* dst, const ddp_buffer* src, ddp_stream stream) {
    if (in_host_function("add")) return DDP_ERR_UNSUPPORTED;
    if (!dst || !src || dst->count != src->count) {
      t_plugin_error = "add: dst and src must be buffers of equal counts";
      return DDP_ERR_INVALID_ARGUMENT;
    }
    if (dst->dtype != DDP_FLOAT32 || src->dtype != DDP_FLOAT32) return unsupported_dtype("add");
    return host_guard([&] {
      svc(ctx).device->add(static_cast<float*>(dst->ptr), static_cast<const float*>(src->ptr), dst->count,
                           *to_stream(stream));
    });
  }

  static ddp_status split(void* ctx, ddp_comm* parent, int color, int key, const char* name, ddp_comm** out) {
    if (in_host_function("split")) return DDP_ERR_UNSUPPORTED;
    return host_guard([&] {
      if (!out) throw Error("split: out is NULL", DDP_ERR_INVALID_ARGUMENT);
      if (!svc(ctx).split) throw Error("split: this host makes no groups", DDP_ERR_UNSUPPORTED);
      if (!svc(ctx).splits_open)
        throw Error(
            "split: only in create or on_train_begin (every rank of the parent at the same point, before "
            "the first step)",
            DDP_ERR_INVALID_ARGUMENT);
      *out = svc(ctx).split(parent, color, key, name);
    });
  }
  static const ddp_group* group(void* ctx, ddp_comm* comm) { return svc(ctx).group ? svc(ctx).group(comm) : nullptr; }

  // (1.10) The engine orders its optimizer step after the strategy's
  // reductions; a strategy that owns the step orders its own.
  static ddp_status grads_final(void* ctx, ddp_event done, const size_t* indices, size_t count) {
    if (in_host_function("grads_final")) return DDP_ERR_UNSUPPORTED;
    if (self(ctx).caps_ & DDP_CAP_OWNS_OPTIMIZER) {
      t_plugin_error =
          "grads_final: the plugin's caps have DDP_CAP_OWNS_OPTIMIZER: it orders its own optimizer "
          "step (run_optimizer)";
      return DDP_ERR_UNSUPPORTED;
    }
    return host_guard([&] { svc(ctx).say_final(to_event(done), indices, count, self(ctx).label_.c_str()); });
  }
  static ddp_status run_optimizer(void* ctx, const size_t* indices, size_t count) {
    if (in_host_function("run_optimizer")) return DDP_ERR_UNSUPPORTED;
    // The engine's optimizer computes, with no limit, as it does outside a
    // plugin: not a stage the watchdog times (no entry).
    whereabouts::Inside in(nullptr, nullptr);
    return host_guard([&] {
      if (!svc(ctx).run_optimizer) throw Error("run_optimizer: this host has no optimizer", DDP_ERR_UNSUPPORTED);
      svc(ctx).run_optimizer(indices, count);
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
  host_.convert = H::convert;
  host_.unit_count = H::unit_count;
  host_.unit = H::unit;
  host_.claim = H::claim;
  host_.bind = H::bind;
  host_.run_optimizer_ranges = H::run_optimizer_ranges;
  host_.add = H::add;
  host_.split = H::split;
  host_.group = H::group;
  host_.grads_final = H::grads_final;
  host_.precision = [](void* ctx) -> const ddp_precision* { return &H::svc(ctx).precision; };
  host_.step_skipped = [](void* ctx) { return H::svc(ctx).step_skipped ? 1 : 0; };
  install_compute_entries(host_);
}

void PluginHost::check(ddp_status status, const char* entry) const {
  if (status == DDP_OK) {
    t_plugin_error.clear();  // text set by a call that then succeeded is stale
    return;
  }
  throw Error(label_ + ": " + entry + ": " + take_plugin_error(), status).in_plugin(label_, entry);
}

const ddp_host* engine_error_sink() {
  static const ddp_host sink = [] {
    ddp_host h{};
    h.abi_version = DDP_ABI_VERSION;
    h.struct_size = sizeof(ddp_host);
    h.set_error = HostCallbacks::set_host_error;
    return h;
  }();
  return &sink;
}

}  // namespace ddp
