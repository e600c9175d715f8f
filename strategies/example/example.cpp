// example.cpp — a strategy plugin written the way a third party writes one:
// outside the ddp source tree, against the installed headers alone, built by
// its own CMakeLists.txt (find_package(ddp) + ddp_add_plugin) and chosen in
// TOML by path. README.md beside this file walks through it.
//
// What it does: every rank takes rank 0's parameters at the start; on the
// micro-batch whose gradients are synced, once backward is done, all
// trainable gradients are packed into one flat buffer, averaged over ranks
// with a single all-reduce and unpacked, all enqueued on the comm stream;
// finish waits for it. One collective per step.
//
// Keys ([strategy] table of the TOML file):
//   log_layout  bool, default false: rank 0 logs the flat buffer's size.
//
// It includes nothing but the public headers: <ddp/plugin.h> (the C ABI)
// through <ddp/plugin.hpp> (optional header-only C++ helpers: throwing
// wrappers, RAII events and buffers, `guard` to turn exceptions into a
// ddp_status at each entry). It never links against the engine.
#include <ddp/plugin.hpp>

#include <cstdio>
#include <memory>
#include <string>

using ddp::plugin::Comm;
using ddp::plugin::DeviceBuffer;
using ddp::plugin::Event;
using ddp::plugin::Failure;
using ddp::plugin::Host;
using ddp::plugin::guard;

// plugin.h declares the opaque handle `ddp_strategy` as struct
// ddp_strategy_s; the plugin defines it. The host only passes it back.
struct ddp_strategy_s {
  ddp_strategy_s(const ddp_host* h, const ddp_transport_v1_t* transport, ddp_comm* c)
      : host(h), comm(transport, c), computed(h), done(h) {}

  Host host;                // the host vtable: logging, keys, params, memory, streams
  Comm comm;                // the transport and its communicator (owned by the host)
  Event computed;           // recorded on the compute stream: the gradients are final
  Event done;               // recorded on the comm stream after the last unpack
  DeviceBuffer flat;        // all trainable gradients back to back, float32
  size_t elements = 0;      // floats in use in `flat`
  bool sync = false;        // this micro-batch's gradients are to be synced
  bool in_flight = false;   // an exchange is enqueued and not yet waited for
  bool log_layout = false;  // the `log_layout` key
  long long syncs = 0;      // exchanges issued (reported by stats)
};

namespace {

constexpr ddp_key kKeys[] = {
    {"log_layout", "bool", "rank 0 logs the flat buffer's size (default false)"},
    {nullptr, nullptr, nullptr},
};

// The flat buffer's layout is the parameter table's order, trainable
// entries only: it depends on the model alone, so it is the same on every
// rank (every rank must issue the same collectives with the same counts).
// Called at train begin and when the trainable set changes; never while
// work that uses the old buffer is enqueued (finish has waited by then).
void lay_out(ddp_strategy* s) {
  size_t elements = 0;
  for (size_t i = 0; i < s->host.param_count(); ++i) {
    const ddp_param& p = s->host.param(i);
    if (!p.trainable) continue;
    if (p.dtype != DDP_FLOAT32)
      throw Failure(DDP_ERR_UNSUPPORTED, std::string("example: parameter '") + p.name + "' is not float32");
    elements += p.numel;
  }
  s->flat.reset();  // free before allocating: the two never count together
  if (elements > 0) s->flat = DeviceBuffer(s->host.raw(), elements * sizeof(float), DDP_MEM_COMM_BUFFERS);
  s->elements = elements;
  if (s->log_layout && s->host.rank() == 0)
    s->host.log(DDP_LOG_INFO, "example: one flat all-reduce of " + std::to_string(elements) + " floats per step");
}

// Enqueues, on the comm stream: wait for compute, pack, all-reduce (average),
// unpack, then records `done`. Non-blocking.
void launch(ddp_strategy* s) {
  const Host& h = s->host;
  const ddp_stream comm = h.comm_stream();
  // The plugin.h rule: comm-stream work that reads what compute produced
  // first waits for an event recorded on the compute stream.
  s->computed.record(h.compute_stream());
  s->computed.make_wait(comm);
  float* flat = s->flat.floats();
  size_t at = 0;
  for (size_t i = 0; i < h.param_count(); ++i) {
    const ddp_param& p = h.param(i);
    if (!p.trainable) continue;  // frozen: no gradient, never touched
    h.copy(flat + at, p.grad, p.numel * sizeof(float), comm);
    at += p.numel;
  }
  if (at != s->elements)
    throw Failure(DDP_ERR_INTERNAL, "example: the trainable parameters changed without params_changed");
  s->comm.all_reduce(h.floats(flat, s->elements), DDP_REDUCE_AVG, comm);
  at = 0;
  for (size_t i = 0; i < h.param_count(); ++i) {
    const ddp_param& p = h.param(i);
    if (!p.trainable) continue;
    h.copy(p.grad, flat + at, p.numel * sizeof(float), comm);
    at += p.numel;
  }
  s->done.record(comm);
  s->in_flight = true;
  ++s->syncs;
}

// ---- the entries of the vtable; each catches everything with guard() ----

// Reads all of its keys here: a key the plugin never reads in create is
// reported to the user as unknown. No collectives yet.
ddp_status example_create(const ddp_host* host, const ddp_transport_v1_t* transport, ddp_comm* comm,
                          ddp_strategy** out) {
  return guard(host, [&] {
    auto s = std::make_unique<ddp_strategy_s>(host, transport, comm);
    s->log_layout = s->host.config_bool("log_layout", false);
    *out = s.release();  // the host passes it back to every entry, then to destroy
  });
}

// Blocking: every rank holds rank 0's parameters, frozen ones included.
ddp_status example_on_train_begin(ddp_strategy* s) {
  return guard(s->host.raw(), [&] {
    const Host& h = s->host;
    const ddp_stream comm = h.comm_stream();
    s->computed.record(h.compute_stream());  // whatever initialised the weights is done
    s->computed.make_wait(comm);
    for (size_t i = 0; i < h.param_count(); ++i) {
      const ddp_param& p = h.param(i);
      s->comm.broadcast(ddp_buffer{p.data, p.numel, p.dtype, h.device()}, /*root=*/0, comm);
    }
    s->done.record(comm);
    s->done.synchronize();
    lay_out(s);
  });
}

// Gradient accumulation: the engine sums k micro-batches' gradients in
// place and sets sync_grads only on the last; communicate only then.
ddp_status example_on_step_begin(ddp_strategy* s, const ddp_step_info* info) {
  return guard(s->host.raw(), [&] {
    s->sync = info->sync_grads != 0;
    if (info->params_changed) lay_out(s);  // a parameter was (un)frozen
  });
}

// A per-parameter strategy (overlap, buckets) would start work here.
ddp_status example_on_grad_ready(ddp_strategy*, const ddp_param*) { return DDP_OK; }

// Backward is done: on the synced micro-batch, enqueue the whole exchange.
ddp_status example_on_backward_end(ddp_strategy* s) {
  return guard(s->host.raw(), [&] {
    if (s->sync && s->elements > 0 && !s->in_flight) launch(s);
  });
}

// Blocking: returns once every trainable gradient holds the average over
// ranks. A failed collective comes back here, with the transport's text.
ddp_status example_finish(ddp_strategy* s) {
  return guard(s->host.raw(), [&] {
    if (!s->in_flight && s->elements > 0) launch(s);  // no synced micro-batch seen: sync now
    if (!s->in_flight) return;                        // nothing trainable
    s->in_flight = false;
    s->done.synchronize();
  });
}

// Optional: a JSON object that lands in summary.json as strategy_stats.
ddp_status example_stats(ddp_strategy* s, char* buf, size_t cap, size_t* needed) {
  const int n = std::snprintf(buf, cap, "{\"flat_floats\": %zu, \"all_reduces\": %lld}", s->elements, s->syncs);
  if (n < 0) {
    s->host.raw()->set_error(s->host.raw()->ctx, "example: stats formatting failed");
    return DDP_ERR_INTERNAL;
  }
  // snprintf wrote at most cap bytes including the NUL and returned the full
  // length without it: exactly plugin.h's *needed. The host calls again with
  // a larger buffer when needed >= cap.
  *needed = size_t(n);
  return DDP_OK;
}

// The host has synchronised all streams first.
void example_destroy(ddp_strategy* s) { delete s; }

#if DDP_ABI_VERSION_MINOR >= 4  // built against ABI 1.4 or newer: `ddp plan` can ask it
// `ddp plan`, before any rank starts (no create): on a host made for
// planning (parameters without memory, this plugin's keys), says what a
// rank will do: one all-reduce of every trainable gradient per step, and
// the flat buffer that holds them, made at train begin. Reads its keys as
// create does.
ddp_status example_plan(const ddp_host* host, const ddp_transport_v1_t*, ddp_plan* out) {
  return guard(host, [&] {
    const Host h(host);
    const ddp::plugin::Plan plan(out);
    (void)h.config_bool("log_layout", false);
    size_t elements = 0;
    for (size_t i = 0; i < h.param_count(); ++i)
      if (h.param(i).trainable) elements += h.param(i).numel;
    if (elements == 0) return;
    plan.buffer(DDP_MEM_COMM_BUFFERS, elements * sizeof(float), DDP_PLAN_SETUP);
    plan.collective(DDP_OP_ALL_REDUCE, elements, DDP_FLOAT32, /*beside_compute=*/false);
  });
}
#endif

}  // namespace

// The one exported symbol: DDP_STRATEGY_ENTRY (ddp/plugin.h) defines
// ddp_strategy_v1 with C linkage and default visibility (everything else is
// hidden); ddp_add_plugin's version script keeps the dynamic symbol table
// to exactly this.
DDP_STRATEGY_ENTRY = {
    .abi_version = DDP_ABI_VERSION,                    // the ABI this was built against (major.minor)
    .struct_size = sizeof(ddp_strategy_v1_t),          // lets a newer host see which entries exist
    .name = "example",                                 // as the host reports it
    .version = "0.1.0",                                // this plugin's own version
    .caps = DDP_CAP_DEVICE_CPU | DDP_CAP_DEVICE_CUDA,  // only host device operations are used
    .create = example_create,
    .on_train_begin = example_on_train_begin,
    .on_step_begin = example_on_step_begin,
    .on_grad_ready = example_on_grad_ready,
    .on_backward_end = example_on_backward_end,
    .finish = example_finish,
    .stats = example_stats,
    .destroy = example_destroy,
    .keys = kKeys,
#if DDP_ABI_VERSION_MINOR >= 4  // where the headers have it (1.4)
    .plan = example_plan,
#endif
    // Every entry not named is NULL: optional, with the meaning its comment
    // in ddp/abi/strategy.h gives (optimizer_step: the engine's optimizer runs).
};
