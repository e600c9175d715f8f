// ddp/plugin.hpp — optional, header-only C++17 helpers over ddp/plugin.h for
// plugin authors. Nothing here crosses the ABI: it only makes the C vtables
// pleasant to call from C++ (exceptions inside, statuses at the boundary).
//
//   ddp_status my_finish(ddp_strategy* s) {
//     return ddp::plugin::guard(s->host, [&] { ... may throw ddp::plugin::Failure ... });
//   }
#ifndef DDP_PLUGIN_HPP
#define DDP_PLUGIN_HPP

#include <ddp/plugin.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace ddp {
namespace plugin {

// An error on its way to the ABI boundary. `status` is what the entry
// returns; what() is the text the host shows the user. When the host has
// already set the text (a host call failed), `text_is_set` is true.
class Failure : public std::runtime_error {
 public:
  Failure(ddp_status status, const std::string& message, bool text_is_set = false)
      : std::runtime_error(message), status_(status), text_is_set_(text_is_set) {}
  ddp_status status() const { return status_; }
  bool text_is_set() const { return text_is_set_; }

 private:
  ddp_status status_;
  bool text_is_set_;
};

// Throws if a host or transport call failed; the callee has set the text.
inline void check(ddp_status status) {
  if (status != DDP_OK) throw Failure(status, "", /*text_is_set=*/true);
}

// Runs `body` at an ABI entry: every exception becomes a status plus text
// (host->set_error). A Failure returns its own status, std::bad_alloc
// DDP_ERR_OUT_OF_MEMORY, any other exception `fallback`: the status that
// stands for "this entry failed" when nothing says more. The one guard of
// ddp: plugins and the engine's own host entries both use it.
template <typename Body>
ddp_status guard(const ddp_host* host, Body&& body, ddp_status fallback = DDP_ERR_INTERNAL) noexcept {
  try {
    body();
    return DDP_OK;
  } catch (const Failure& f) {
    if (!f.text_is_set()) host->set_error(host->ctx, f.what());
    return f.status();
  } catch (const std::bad_alloc&) {
    host->set_error(host->ctx, "out of memory");
    return DDP_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    host->set_error(host->ctx, e.what());
    return fallback;
  } catch (...) {
    host->set_error(host->ctx, "unknown exception");
    return fallback;
  }
}

// Whether the engine offers alloc_host/free_host (ABI 1.1): an engine of
// ABI 1.0 hands a shorter ddp_host, without them.
inline bool has_alloc_host(const ddp_host* h) noexcept {
  return h->struct_size >= offsetof(ddp_host, free_host) + sizeof(h->free_host) && h->alloc_host && h->free_host;
}

// The GPU, by its index among the `visible` ones, that the rank with
// `local_rank` uses on a CUDA run, as the engine chooses it (and as a plugin
// that opens the device itself must): the one GPU a rank sees when a
// launcher gave each rank its own (CUDA_VISIBLE_DEVICES set, as SLURM's
// --gpus-per-task does), whatever its local rank; else GPU local_rank; else,
// where ranks may share GPUs, local_rank modulo visible. -1: none for it.
inline int rank_gpu(int local_rank, int visible, const char* cuda_visible_devices, bool share) noexcept {
  if (visible <= 0 || local_rank < 0) return -1;
  if (visible == 1 && cuda_visible_devices != nullptr && *cuda_visible_devices != '\0') return 0;
  if (local_rank < visible) return local_rank;
  return share ? local_rank % visible : -1;
}

// Whether the engine offers convert (ABI 1.3).
inline bool has_convert(const ddp_host* h) noexcept {
  return h->struct_size >= offsetof(ddp_host, convert) + sizeof(h->convert) && h->convert;
}

// The host vtable with throwing, typed calls.
class Host {
 public:
  explicit Host(const ddp_host* host) : h_(host) {}
  const ddp_host* raw() const { return h_; }
  int rank() const { return h_->rank; }
  int world_size() const { return h_->world_size; }
  int local_rank() const { return h_->local_rank; }
  ddp_device_kind device() const { return h_->device; }
  int64_t timeout_ms() const { return h_->timeout_ms; }  // run.timeout_s, in ms

  int64_t config_int(const char* key, int64_t fallback) const {
    int64_t v = 0;
    check(h_->config_int(h_->ctx, key, fallback, &v));
    return v;
  }
  double config_float(const char* key, double fallback) const {
    double v = 0;
    check(h_->config_float(h_->ctx, key, fallback, &v));
    return v;
  }
  bool config_bool(const char* key, bool fallback) const {
    int v = 0;
    check(h_->config_bool(h_->ctx, key, fallback ? 1 : 0, &v));
    return v != 0;
  }
  std::string config_string(const char* key, const char* fallback) const {
    const char* v = nullptr;
    check(h_->config_string(h_->ctx, key, fallback, &v));
    return v;
  }

  // The parameter table, in model order.
  size_t param_count() const { return h_->param_count(h_->ctx); }
  const ddp_param& param(size_t i) const { return *h_->param(h_->ctx, i); }
  // The model's units (ABI 1.4; none from an older engine).
  size_t unit_count() const { return DDP_HOST_HAS(h_, unit_count) ? h_->unit_count(h_->ctx) : 0; }
  const ddp_unit& unit(size_t i) const { return *h_->unit(h_->ctx, i); }

  // Storage the strategy owns (ABI 1.4; ddp/abi/host.h says when).
  void claim_gradients(const size_t* indices, size_t count) const {
    require_1_4(DDP_HOST_HAS(h_, claim), "claim");
    check(h_->claim(h_->ctx, DDP_STORAGE_GRAD, indices, count));
  }
  void bind_gradient(size_t index, void* ptr) const {
    require_1_4(DDP_HOST_HAS(h_, bind), "bind");
    check(h_->bind(h_->ctx, DDP_STORAGE_GRAD, index, ptr));
  }
  // Values (ABI 1.5: DDP_STORAGE_DATA; an older engine refuses by name).
  void claim_values(const size_t* indices, size_t count) const {
    require_1_4(DDP_HOST_HAS(h_, claim), "claim");
    check(h_->claim(h_->ctx, DDP_STORAGE_DATA, indices, count));
  }
  void bind_values(size_t index, void* ptr) const {
    require_1_4(DDP_HOST_HAS(h_, bind), "bind");
    check(h_->bind(h_->ctx, DDP_STORAGE_DATA, index, ptr));
  }
  void run_optimizer_ranges(const ddp_range* ranges, size_t count) const {
    require_1_4(DDP_HOST_HAS(h_, run_optimizer_ranges), "run_optimizer_ranges");
    check(h_->run_optimizer_ranges(h_->ctx, ranges, count));
  }
  void add(const ddp_buffer& dst, const ddp_buffer& src, ddp_stream s) const {
    require_1_4(DDP_HOST_HAS(h_, add), "add");
    check(h_->add(h_->ctx, &dst, &src, s));
  }

  void* alloc(size_t bytes, ddp_mem_category category) const {
    void* p = nullptr;
    check(h_->alloc(h_->ctx, bytes, category, &p));
    return p;
  }
  void free(void* p) const { h_->free(h_->ctx, p); }
  // Staging memory on the host (ABI 1.1; see ddp_host::alloc_host): on the
  // calling thread, never inside a host function.
  void* alloc_host(size_t bytes, ddp_mem_category category) const {
    if (!has_alloc_host(h_))
      throw Failure(DDP_ERR_UNSUPPORTED,
                    "alloc_host: this engine's ABI " + std::to_string(DDP_ABI_MAJOR(h_->abi_version)) + "." +
                        std::to_string(DDP_ABI_MINOR(h_->abi_version)) + " lacks it (it needs ABI 1.1 or newer)");
    void* p = nullptr;
    check(h_->alloc_host(h_->ctx, bytes, category, &p));
    return p;
  }
  void free_host(void* p) const {
    if (has_alloc_host(h_)) h_->free_host(h_->ctx, p);
  }
  void copy(void* dst, const void* src, size_t bytes, ddp_stream s) const {
    check(h_->copy(h_->ctx, dst, src, bytes, s));
  }
  void fill(const ddp_buffer& b, double value, ddp_stream s) const { check(h_->fill(h_->ctx, &b, value, s)); }
  void scale(const ddp_buffer& b, double factor, ddp_stream s) const { check(h_->scale(h_->ctx, &b, factor, s)); }
  // float32 <-> bfloat16/float16 (ABI 1.3; see ddp_host::convert).
  void convert(const ddp_buffer& dst, const ddp_buffer& src, ddp_stream s) const {
    if (!has_convert(h_))
      throw Failure(DDP_ERR_UNSUPPORTED,
                    "convert: this engine's ABI " + std::to_string(DDP_ABI_MAJOR(h_->abi_version)) + "." +
                        std::to_string(DDP_ABI_MINOR(h_->abi_version)) + " lacks it (it needs ABI 1.3 or newer)");
    check(h_->convert(h_->ctx, &dst, &src, s));
  }

  // Compute on the run's device (ABI 1.9; see ddp_host::gemm): float32,
  // enqueued on `s` as copy is. An older engine refuses by name.
  void gemm(const ddp_gemm& g, ddp_stream s) const {
    require_compute(DDP_HOST_HAS(h_, gemm), "gemm");
    check(h_->gemm(h_->ctx, &g, s));
  }
  void dot(const ddp_vectors& x, const ddp_vectors& y, float* out, ddp_stream s) const {
    require_compute(DDP_HOST_HAS(h_, dot), "dot");
    check(h_->dot(h_->ctx, &x, &y, out, s));
  }
  void norm(const ddp_vectors& x, float* out, ddp_stream s) const {
    require_compute(DDP_HOST_HAS(h_, norm), "norm");
    check(h_->norm(h_->ctx, &x, out, s));
  }
  // y_i += alpha scalars[i] x_i; scalars (device floats, a dot's out) may be null: 1.
  void axpy(double alpha, const ddp_vectors& x, const float* scalars, const ddp_vectors& y, ddp_stream s) const {
    require_compute(DDP_HOST_HAS(h_, axpy), "axpy");
    check(h_->axpy(h_->ctx, alpha, &x, scalars, &y, s));
  }
  void normalize(const ddp_vectors& x, double eps, ddp_stream s) const {
    require_compute(DDP_HOST_HAS(h_, normalize), "normalize");
    check(h_->normalize(h_->ctx, &x, eps, s));
  }
  // One product C = A B (alpha 1, beta 0, batch 1) of this header's
  // struct_size, for the caller to fill in.
  static ddp_gemm gemm_desc() {
    ddp_gemm g{};
    g.struct_size = sizeof(ddp_gemm);
    g.alpha = 1.0;
    g.batch = 1;
    return g;
  }
  // The rows, or the columns, of a row-major matrix [rows, cols] whose rows
  // are `ld` elements apart.
  static ddp_vectors rows_of(float* ptr, size_t rows, size_t cols, size_t ld) {
    return ddp_vectors{ptr, cols, 1, rows, ld};
  }
  static ddp_vectors columns_of(float* ptr, size_t rows, size_t cols, size_t ld) {
    return ddp_vectors{ptr, rows, ld, cols, 1};
  }
  // The compute wrappers' refusal where the engine is older than 1.9.
  void require_compute(bool has, const char* entry) const {
    if (!has)
      throw Failure(DDP_ERR_UNSUPPORTED,
                    std::string(entry) + ": this engine's ABI " + std::to_string(DDP_ABI_MAJOR(h_->abi_version)) + "." +
                        std::to_string(DDP_ABI_MINOR(h_->abi_version)) + " lacks it (it needs ABI 1.9 or newer)");
  }

  ddp_stream compute_stream() const { return h_->compute_stream(h_->ctx); }
  ddp_stream comm_stream() const { return h_->comm_stream(h_->ctx); }
  // A stream's native handle: a cudaStream_t on CUDA, NULL on the CPU.
  void* stream_native(ddp_stream s) const { return h_->stream_native(h_->ctx, s); }
  // Enqueues fn() on `s` (ddp_host::launch_host_func: exactly once, in
  // stream order, on the stream's executor; not at all where the stream
  // failed before it). An exception fn throws fails the stream with its
  // text (a Failure with its status; anything else DDP_ERR_INTERNAL).
  template <typename Fn>
  void launch_host_func(ddp_stream s, Fn&& fn) const {
    using Body = std::decay_t<Fn>;
    struct Job {
      const ddp_host* host;
      Body fn;
    };
    Job* job = new Job{h_, std::forward<Fn>(fn)};
    const ddp_host_func run = [](void* user, int cancelled) -> ddp_status {
      std::unique_ptr<Job> owned(static_cast<Job*>(user));
      if (cancelled) return DDP_OK;
      return guard(owned->host, [&] { owned->fn(); });
    };
    const ddp_status status = h_->launch_host_func(h_->ctx, s, run, job);
    if (status != DDP_OK) delete job;
    check(status);
  }

  // The run's rendezvous store (ddp_host::store_*): keys namespaced to
  // the run; get waits for its key up to the run's timeout.
  void store_set(const std::string& key, const void* data, size_t bytes) const {
    check(h_->store_set(h_->ctx, key.c_str(), data, bytes));
  }
  std::string store_get(const std::string& key) const {
    void* data = nullptr;
    size_t bytes = 0;
    check(h_->store_get(h_->ctx, key.c_str(), &data, &bytes));
    std::string value(static_cast<const char*>(data), bytes);
    std::free(data);
    return value;
  }
  void store_wait(const std::vector<std::string>& keys) const {
    std::vector<const char*> raw;
    for (const std::string& k : keys) raw.push_back(k.c_str());
    check(h_->store_wait(h_->ctx, raw.data(), raw.size()));
  }

  // Groups (ABI 1.9; ddp/abi/host.h): a communicator of the ranks of
  // `parent` that pass the same color, ordered by key, named `name` in the
  // engine's reports; collective over parent, in create or on_train_begin.
  ddp_comm* split(ddp_comm* parent, int color, int key, const char* name) const {
    require(DDP_HOST_HAS(h_, split), "split", 9);
    ddp_comm* out = nullptr;
    check(h_->split(h_->ctx, parent, color, key, name, &out));
    return out;
  }
  // What `comm` is: its name, this rank's place, its size and members.
  const ddp_group& group(ddp_comm* comm) const {
    require(DDP_HOST_HAS(h_, group), "group", 9);
    const ddp_group* g = h_->group(h_->ctx, comm);
    if (!g) throw Failure(DDP_ERR_INVALID_ARGUMENT, "group: not a communicator this host gave");
    return *g;
  }

  void log(ddp_log_level level, const std::string& message) const { h_->log(h_->ctx, level, message.c_str()); }
  void run_optimizer(const size_t* indices, size_t count) const { check(h_->run_optimizer(h_->ctx, indices, count)); }
  // (1.10) These parameters' averaged gradients are final once `done` has
  // fired (NULL: now): the engine's optimizer step updates them then.
  bool has_grads_final() const { return DDP_HOST_HAS(h_, grads_final); }
  void grads_final(ddp_event done, const size_t* indices, size_t count) const {
    require(has_grads_final(), "grads_final", 10);
    check(h_->grads_final(h_->ctx, done, indices, count));
  }

  // A float32 buffer on the run's device; one of `dtype`.
  ddp_buffer floats(void* ptr, size_t count) const { return ddp_buffer{ptr, count, DDP_FLOAT32, h_->device}; }
  ddp_buffer buffer(void* ptr, size_t count, ddp_dtype dtype) const {
    return ddp_buffer{ptr, count, dtype, h_->device};
  }

 private:
  void require_1_4(bool has, const char* entry) const { require(has, entry, 4); }
  // An entry of minor `minor` the engine lacks, refused by name.
  void require(bool has, const char* entry, int minor) const {
    if (!has)
      throw Failure(DDP_ERR_UNSUPPORTED, std::string(entry) + ": this engine's ABI " +
                                             std::to_string(DDP_ABI_MAJOR(h_->abi_version)) + "." +
                                             std::to_string(DDP_ABI_MINOR(h_->abi_version)) +
                                             " lacks it (it needs ABI 1." + std::to_string(minor) + " or newer)");
  }
  const ddp_host* h_;
};

// An owned host event.
class Event {
 public:
  explicit Event(const ddp_host* host) : h_(host) { check(h_->event_create(h_->ctx, &e_)); }
  ~Event() {
    if (e_) h_->event_destroy(h_->ctx, e_);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& o) noexcept : h_(o.h_), e_(std::exchange(o.e_, nullptr)) {}

  void record(ddp_stream s) const { check(h_->event_record(h_->ctx, e_, s)); }
  void make_wait(ddp_stream s) const { check(h_->stream_wait_event(h_->ctx, s, e_)); }
  void synchronize() const { check(h_->event_synchronize(h_->ctx, e_)); }
  ddp_event raw() const { return e_; }  // the handle, for grads_final
  bool query() const {
    int done = 0;
    check(h_->event_query(h_->ctx, e_, &done));
    return done != 0;
  }

 private:
  const ddp_host* h_;
  ddp_event e_ = nullptr;
};

// Device memory owned through the host (freed with it).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const ddp_host* host, size_t bytes, ddp_mem_category category) : h_(host), bytes_(bytes) {
    check(h_->alloc(h_->ctx, bytes, category, &ptr_));
  }
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = o.h_;
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void reset() {
    if (ptr_) h_->free(h_->ctx, ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* get() const { return ptr_; }
  float* floats() const { return static_cast<float*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  const ddp_host* h_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// What a plan entry reports (ddp/abi/plan.h), with throwing calls.
class Plan {
 public:
  explicit Plan(ddp_plan* plan) : p_(plan) {}
  ddp_plan* raw() const { return p_; }
  int32_t micro_steps() const { return p_->micro_steps; }
  bool clips() const { return p_->clips != 0; }
  // A transport's plan: the step's collectives as the strategy planned them.
  const ddp_plan_collective* begin() const { return p_->collectives; }
  const ddp_plan_collective* end() const { return p_->collectives + p_->collective_count; }

  void collective(ddp_collective_op op, size_t count, ddp_dtype dtype = DDP_FLOAT32,
                  bool beside_compute = false) const {
    const ddp_plan_collective c{op, count, dtype, beside_compute ? 1 : 0};
    check(p_->collective(p_->ctx, &c));
  }
  void buffer(ddp_mem_category category, size_t bytes, ddp_plan_when when = DDP_PLAN_SETUP) const {
    if (bytes > 0) check(p_->buffer(p_->ctx, category, bytes, when));
  }
  void steps(size_t param, size_t offset, size_t count) const { check(p_->steps(p_->ctx, param, offset, count)); }
  void claims_gradient(size_t param) const { check(p_->claims(p_->ctx, DDP_STORAGE_GRAD, param)); }
  void claims_values(size_t param) const { check(p_->claims(p_->ctx, DDP_STORAGE_DATA, param)); }  // (1.5)
  // (1.6) A setting of its own keys that holds less (ddp/abi/plan.h);
  // nothing where the engine is older.
  void leaner(const char* key, const char* value) const {
    if (DDP_PLAN_HAS(p_, leaner)) check(p_->leaner(p_->ctx, key, value));
  }
  // (1.9) A collective of a group of `group_size` ranks (ddp/abi/plan.h);
  // an engine older than 1.9 knows no groups: refused by name.
  void group_collective(ddp_collective_op op, size_t count, int group_size, ddp_dtype dtype = DDP_FLOAT32,
                        bool beside_compute = false) const {
    if (!DDP_PLAN_HAS(p_, group_collective))
      throw Failure(DDP_ERR_UNSUPPORTED, "plan: this engine plans no groups (ABI 1.9 or newer needed)");
    const ddp_plan_collective c{op, count, dtype, beside_compute ? 1 : 0};
    check(p_->group_collective(p_->ctx, &c, group_size));
  }
  // (1.8) The collectives reported next happen once every `steps` steps
  // (ddp/abi/plan.h); an older engine plans them every step.
  void every(int64_t steps) const {
    if (DDP_PLAN_HAS(p_, every)) check(p_->every(p_->ctx, steps));
  }

 private:
  ddp_plan* p_;
};

// A transport as the strategy receives it, with throwing calls.
class Comm {
 public:
  Comm(const ddp_transport_v1_t* transport, ddp_comm* comm) : t_(transport), c_(comm) {}
  void all_reduce(const ddp_buffer& b, ddp_reduce_op op, ddp_stream s) const { check(t_->all_reduce(c_, &b, op, s)); }
  void broadcast(const ddp_buffer& b, int root, ddp_stream s) const { check(t_->broadcast(c_, &b, root, s)); }
  void all_gather(const ddp_buffer& send, const ddp_buffer& recv, ddp_stream s) const {
    check(t_->all_gather(c_, &send, &recv, s));
  }
  void reduce_scatter(const ddp_buffer& send, const ddp_buffer& recv, ddp_reduce_op op, ddp_stream s) const {
    check(t_->reduce_scatter(c_, &send, &recv, op, s));
  }
  void barrier(ddp_stream s) const { check(t_->barrier(c_, s)); }

 private:
  const ddp_transport_v1_t* t_;
  ddp_comm* c_;
};

}  // namespace plugin
}  // namespace ddp

#endif  // DDP_PLUGIN_HPP
