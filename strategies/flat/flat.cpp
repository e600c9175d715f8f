// flat.cpp — the `flat` strategy, as in CS336 assignment 2's "flattened"
// DDP: rank 0's parameters are broadcast at the start; after backward
// (in finish) every trainable gradient is copied into one flat buffer, the
// buffer is all-reduced (average) in one collective, and the result is
// copied back. One collective per step instead of one per parameter, at the
// price of a buffer as large as all trainable gradients and no overlap with
// backward. Frozen parameters are never touched. No keys.
#include "../common/strategy_util.h"

using ddp::plugin::DeviceBuffer;
using ddp::plugin::Failure;
using ddp::plugin::Host;
using ddp::plugin::guard;
using ddp::strategy::StrategyBase;

struct ddp_strategy_s : StrategyBase {
  using StrategyBase::StrategyBase;
  // (sum of trainable numel) float32: the trainable gradients back to back,
  // in table order. Made at train begin and again when the trainable set
  // changes; empty while nothing is trainable.
  DeviceBuffer flat;
};

namespace {

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

// Only between steps: finish has waited for the comm stream, so no
// enqueued work still uses the old buffer when it is freed.
void make_flat_buffer(ddp_strategy* s) {
  s->flat.reset();  // free first: old and new never count together
  const size_t bytes = trainable_bytes(s);
  if (bytes > 0) s->flat = DeviceBuffer(s->host.raw(), bytes, DDP_MEM_COMM_BUFFERS);
}

ddp_status flat_create(const ddp_host* host, const ddp_transport_v1_t* transport, ddp_comm* comm,
                       ddp_strategy** out) {
  return guard(host, [&] { *out = new ddp_strategy_s(host, transport, comm); });
}

ddp_status flat_on_train_begin(ddp_strategy* s) {
  return guard(s->host.raw(), [&] {
    s->broadcast_params_from_rank0();
    make_flat_buffer(s);
  });
}

ddp_status flat_on_step_begin(ddp_strategy* s, const ddp_step_info* info) {
  return guard(s->host.raw(), [&] {
    if (info->params_changed) make_flat_buffer(s);
  });
}

ddp_status flat_on_grad_ready(ddp_strategy*, const ddp_param*) { return DDP_OK; }
ddp_status flat_on_backward_end(ddp_strategy*) { return DDP_OK; }

// Pack on the compute stream (where the gradients were made), one
// all-reduce on the comm stream after it, unpack there, wait.
ddp_status flat_finish(ddp_strategy* s) {
  return guard(s->host.raw(), [&] {
    if (trainable_bytes(s) != s->flat.bytes())
      throw Failure(DDP_ERR_INTERNAL, "the trainable parameters changed without params_changed");
    if (!s->flat.get()) return;  // nothing trainable: nothing to sync
    const Host& h = s->host;
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
    nullptr,  // stats
    flat_destroy,
    nullptr,  // held_grads: every rank holds every averaged gradient
    ddp::strategy::kNoKeys,
};
