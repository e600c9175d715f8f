// flat.cpp — the `flat` strategy, as in CS336 assignment 2's "flattened"
// DDP: rank 0's parameters are broadcast at the start; after backward
// (in finish) every trainable gradient is averaged over ranks in one
// all-reduce of one flat buffer. One collective per step instead of one per
// parameter, and no overlap with backward. Where the trainable gradients
// already lie back to back in reverse parameter order (the engine packs
// them so: Model::pack_gradients), their memory is the buffer and nothing
// is copied; otherwise (or with in_place = false) each
// gradient is copied into a buffer of their size and back. Frozen
// parameters are never touched. Key: in_place (default true).
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
  // Set at train begin and again when the trainable set changes: `bytes`,
  // the trainable gradients'; in place, `region`, their own memory;
  // otherwise `flat`, a buffer of `bytes`, the gradients back to back in
  // table order. Both empty while nothing is trainable.
  size_t bytes = 0;
  char* region = nullptr;
  DeviceBuffer flat;
};

namespace {

constexpr ddp_key kKeys[] = {
    {"in_place", "bool",
     "true (default): average the gradients in their own memory where they lie back to back; false: copy"},
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

// The trainable gradients' memory if they lie back to back in reverse
// parameter order, else nullptr (StrategyBase::packed_grads).
char* packed_range(const ddp_strategy* s) {
  std::vector<size_t> reverse;
  for (size_t i = s->host.param_count(); i-- > 0;)
    if (s->host.param(i).trainable) reverse.push_back(i);
  return s->packed_grads(reverse);
}

// Averages in place or makes the flat buffer. Only between steps: finish
// has waited for the comm stream, so no enqueued work still uses the old
// buffer when it is freed.
void lay_out(ddp_strategy* s) {
  s->flat.reset();  // free first: old and new never count together
  s->bytes = trainable_bytes(s);
  s->region = s->in_place_allowed ? packed_range(s) : nullptr;
  if (s->bytes > 0 && !s->region) s->flat = DeviceBuffer(s->host.raw(), s->bytes, DDP_MEM_COMM_BUFFERS);
}

ddp_status flat_create(const ddp_host* host, const ddp_transport_v1_t* transport, ddp_comm* comm, ddp_strategy** out) {
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

// In place: one all-reduce of the gradients' range on the comm stream,
// after the compute stream has made them, and wait. Else pack on the
// compute stream, all-reduce on the comm stream after it, unpack there,
// wait.
ddp_status flat_finish(ddp_strategy* s) {
  return guard(s->host.raw(), [&] {
    if (trainable_bytes(s) != s->bytes)  // grads move only with params_changed (plugin.h), as bucketed trusts
      throw Failure(DDP_ERR_INTERNAL, "the trainable parameters changed without params_changed");
    const Host& h = s->host;
    if (s->region) {
      s->comm_after_compute();
      s->comm.all_reduce(h.floats(s->region, s->bytes / sizeof(float)), DDP_REDUCE_AVG, h.comm_stream());
      s->wait_comm();
      return;
    }
    if (!s->flat.get()) return;  // nothing trainable: nothing to sync
    char* flat = static_cast<char*>(s->flat.get());
    for_each_slot(
        s, [&](const ddp_param& p, size_t at, size_t bytes) { h.copy(flat + at, p.grad, bytes, h.compute_stream()); });
    s->comm_after_compute();
    s->comm.all_reduce(h.floats(flat, s->bytes / sizeof(float)), DDP_REDUCE_AVG, h.comm_stream());
    for_each_slot(
        s, [&](const ddp_param& p, size_t at, size_t bytes) { h.copy(p.grad, flat + at, bytes, h.comm_stream()); });
    s->wait_comm();
  });
}

// {"in_place": b (the key), "averaged_in_place": b (this layout), "bytes": n}
ddp_status flat_stats(ddp_strategy* s, char* buf, size_t cap, size_t* needed) {
  return guard(s->host.raw(), [&] {
    ddp::strategy::write_stats(std::string("{\"in_place\": ") + (s->in_place_allowed ? "true" : "false") +
                                   ", \"averaged_in_place\": " + (s->region ? "true" : "false") +
                                   ", \"bytes\": " + std::to_string(s->bytes) + "}",
                               buf, cap, needed);
  });
}

void flat_destroy(ddp_strategy* s) { delete s; }

// `ddp plan`: one all-reduce of every trainable gradient after backward;
// a buffer of them all from set-up on unless averaged in place (the
// engine packs them back to back in the order flat needs).
ddp_status flat_plan(const ddp_host* host, const ddp_transport_v1_t*, ddp_plan* out) {
  return guard(host, [&] {
    const Host h(host);
    const ddp::plugin::Plan plan(out);
    const bool in_place = h.config_bool("in_place", true);
    size_t elements = 0;
    for (size_t i = 0; i < h.param_count(); ++i)
      if (h.param(i).trainable) elements += StrategyBase::float32_elements(h.param(i));
    if (elements == 0) return;
    if (!in_place) plan.buffer(DDP_MEM_COMM_BUFFERS, elements * sizeof(float));
    plan.collective(DDP_OP_ALL_REDUCE, elements);
  });
}

}  // namespace

DDP_STRATEGY_ENTRY = {
    .abi_version = DDP_ABI_VERSION,
    .struct_size = sizeof(ddp_strategy_v1_t),
    .name = "flat",
    .version = "0.1.0",
    .caps = DDP_CAP_DEVICE_CPU | DDP_CAP_DEVICE_CUDA,
    .create = flat_create,
    .on_train_begin = flat_on_train_begin,
    .on_step_begin = flat_on_step_begin,
    .finish = flat_finish,
    .stats = flat_stats,
    .destroy = flat_destroy,
    .keys = kKeys,
    .plan = flat_plan,
};
