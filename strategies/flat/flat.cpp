// flat.cpp — the `flat` strategy, as in CS336 assignment 2's "flattened"
// DDP: rank 0's parameters are broadcast at the start; after backward
// (in finish) every trainable gradient is averaged over ranks in one
// all-reduce of one flat buffer. One collective per step instead of one per
// parameter, and no overlap with backward. Where the trainable gradients
// already fill one range of memory, in parameter order or in reverse (the
// engine packs them so: Model::pack_gradients), that range is the buffer
// and nothing is copied; otherwise (or with in_place = false) each
// gradient is copied into a buffer of their size and back. Frozen
// parameters are never touched. Key: in_place (default true).
#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

#include "../common/stats.h"
#include "../common/strategy_util.h"

using ddp::plugin::DeviceBuffer;
using ddp::plugin::Failure;
using ddp::plugin::Host;
using ddp::plugin::guard;
using ddp::strategy::StrategyBase;

struct ddp_strategy_s : StrategyBase {
  ddp_strategy_s(const ddp_host* h, const ddp_transport_v1_t* t, ddp_comm* c, bool allow_in_place)
      : StrategyBase(h, t, c), in_place_allowed(allow_in_place) {}
  bool in_place_allowed;  // the key
  // Set at train begin and again when the trainable set changes. In place:
  // `region` is the trainable gradients' own memory, `region_bytes` long.
  // Otherwise `flat` is (sum of trainable numel) float32, the gradients
  // back to back in table order; empty while nothing is trainable.
  char* region = nullptr;
  size_t region_bytes = 0;
  DeviceBuffer flat;
};

namespace {

constexpr ddp_key kKeys[] = {
    {"in_place", "bool", "true (default): average the gradients in their own memory where they fill one range; false: copy"},
    {nullptr, nullptr, nullptr},
};

// Calls body(param, byte offset in the flat buffer, bytes) for every
// trainable parameter, in table order: the flat buffer's layout.
template <typename Body>
void for_each_slot(const ddp_strategy* s, Body&& body) {
  size_t offset = 0;
  for (size_t i = 0; i < s->host.param_count(); ++i) {
    const ddp_param& p = s->host.param(i);
    if (!p.trainable) continue;
    const size_t bytes = StrategyBase::float32_bytes(p);
    body(p, offset, bytes);
    offset += bytes;
  }
}

size_t trainable_bytes(const ddp_strategy* s) {
  size_t total = 0;
  for_each_slot(s, [&](const ddp_param&, size_t, size_t bytes) { total += bytes; });
  return total;
}

// The range the trainable gradients fill exactly, in table order or in
// reverse table order (the engine packs them in reverse), as {start,
// bytes}; {nullptr, 0} if they do not, or if there are none. A fixed order
// gives every rank the same element layout whatever the host: the one
// all-reduce sums each element with its counterparts. Addresses compared
// as integers.
std::pair<char*, size_t> packed_range(const ddp_strategy* s) {
  std::vector<std::pair<uintptr_t, size_t>> grads;  // in table order
  for_each_slot(s, [&](const ddp_param& p, size_t, size_t bytes) {
    grads.emplace_back(reinterpret_cast<uintptr_t>(p.grad), bytes);
  });
  bool forward = true, reverse = true;
  for (size_t k = 1; k < grads.size(); ++k) {
    forward = forward && grads[k].first == grads[k - 1].first + grads[k - 1].second;
    reverse = reverse && grads[k - 1].first == grads[k].first + grads[k].second;
  }
  if (grads.empty() || !(forward || reverse)) return {nullptr, 0};
  const auto& low = forward ? grads.front() : grads.back();
  if (low.first == 0) return {nullptr, 0};
  size_t total = 0;
  for (const auto& g : grads) total += g.second;
  return {reinterpret_cast<char*>(low.first), total};
}

// Averages in place or makes the flat buffer. Only between steps: finish
// has waited for the comm stream, so no enqueued work still uses the old
// buffer when it is freed.
void lay_out(ddp_strategy* s) {
  s->flat.reset();  // free first: old and new never count together
  std::tie(s->region, s->region_bytes) = s->in_place_allowed ? packed_range(s) : std::pair<char*, size_t>{};
  const size_t bytes = trainable_bytes(s);
  if (bytes > 0 && !s->region) s->flat = DeviceBuffer(s->host.raw(), bytes, DDP_MEM_COMM_BUFFERS);
}

ddp_status flat_create(const ddp_host* host, const ddp_transport_v1_t* transport, ddp_comm* comm,
                       ddp_strategy** out) {
  return guard(host, [&] {
    const Host h(host);
    const bool in_place = h.config_bool("in_place", true);
    *out = new ddp_strategy_s(host, transport, comm, in_place);
  });
}

ddp_status flat_on_train_begin(ddp_strategy* s) {
  return guard(s->host.raw(), [&] {
    s->broadcast_params_from_rank0();
    lay_out(s);
  });
}

ddp_status flat_on_step_begin(ddp_strategy* s, const ddp_step_info* info) {
  return guard(s->host.raw(), [&] {
    if (info->params_changed) lay_out(s);
  });
}

ddp_status flat_on_grad_ready(ddp_strategy*, const ddp_param*) { return DDP_OK; }
ddp_status flat_on_backward_end(ddp_strategy*) { return DDP_OK; }

// In place: one all-reduce of the gradients' range on the comm stream,
// after the compute stream has made them, and wait. Else pack on the
// compute stream, all-reduce on the comm stream after it, unpack there,
// wait.
ddp_status flat_finish(ddp_strategy* s) {
  return guard(s->host.raw(), [&] {
    const bool moved = s->region && packed_range(s) != std::make_pair(s->region, s->region_bytes);
    if (moved || trainable_bytes(s) != (s->region ? s->region_bytes : s->flat.bytes()))
      throw Failure(DDP_ERR_INTERNAL, "the trainable parameters changed without params_changed");
    const Host& h = s->host;
    if (s->region) {
      s->comm_after_compute();
      s->comm.all_reduce(h.floats(s->region, s->region_bytes / sizeof(float)), DDP_REDUCE_AVG, h.comm_stream());
      s->wait_comm();
      return;
    }
    if (!s->flat.get()) return;  // nothing trainable: nothing to sync
    char* flat = static_cast<char*>(s->flat.get());
    for_each_slot(s, [&](const ddp_param& p, size_t at, size_t bytes) {
      h.copy(flat + at, p.grad, bytes, h.compute_stream());
    });
    s->comm_after_compute();
    s->comm.all_reduce(h.floats(flat, s->flat.bytes() / sizeof(float)), DDP_REDUCE_AVG, h.comm_stream());
    for_each_slot(s, [&](const ddp_param& p, size_t at, size_t bytes) {
      h.copy(p.grad, flat + at, bytes, h.comm_stream());
    });
    s->wait_comm();
  });
}

// {"in_place": b (the key), "averaged_in_place": b (this layout), "bytes": n}
ddp_status flat_stats(ddp_strategy* s, char* buf, size_t cap, size_t* needed) {
  return guard(s->host.raw(), [&] {
    ddp::strategy::write_stats(std::string("{\"in_place\": ") + (s->in_place_allowed ? "true" : "false") +
                                   ", \"averaged_in_place\": " + (s->region ? "true" : "false") +
                                   ", \"bytes\": " + std::to_string(trainable_bytes(s)) + "}",
                               buf, cap, needed);
  });
}

void flat_destroy(ddp_strategy* s) { delete s; }

}  // namespace

DDP_STRATEGY_ENTRY = {
    DDP_ABI_VERSION,
    sizeof(ddp_strategy_v1_t),
    "flat",
    "0.1.0",
    DDP_CAP_DEVICE_CPU | DDP_CAP_DEVICE_CUDA,
    flat_create,
    flat_on_train_begin,
    flat_on_step_begin,
    flat_on_grad_ready,
    flat_on_backward_end,
    flat_finish,
    nullptr,  // optimizer_step: the engine's optimizer runs
    flat_stats,
    flat_destroy,
    nullptr,  // held_grads: every rank holds every averaged gradient
    kKeys,
};
