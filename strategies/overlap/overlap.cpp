// overlap.cpp — the `overlap` strategy, as in CS336 assignment 2's DDP that
// overlaps communication with backward: rank 0's parameters are broadcast at
// the start; during the sync micro-batch's backward, the moment a
// parameter's gradient is final (on_grad_ready) its all-reduce (average) is
// enqueued on the comm stream, in place, while backward goes on; finish
// waits for them all. One collective per trainable parameter, issued in the
// engine's on_grad_ready order (the same on every rank). Frozen parameters
// are never touched. No keys.
#include <vector>

#include "../common/strategy_util.h"

using ddp::plugin::Failure;
using ddp::plugin::guard;
using ddp::strategy::StrategyBase;

struct ddp_strategy_s : StrategyBase {
  using StrategyBase::StrategyBase;
  bool syncing = false;       // inside the micro-batch with sync_grads = 1
  std::vector<char> reduced;  // (param_count) 1: all-reduce enqueued in this micro-batch
};

namespace {

// Enqueues the in-place average of param i's gradient on the comm stream,
// after everything compute has done so far (which made it final).
void reduce(ddp_strategy* s, size_t i) {
  const ddp_param& p = s->host.param(i);
  s->comm_after_compute();
  s->comm.all_reduce(s->host.floats(p.grad, StrategyBase::float32_elements(p)), DDP_REDUCE_AVG, s->host.comm_stream());
  s->reduced[i] = 1;
}

ddp_status overlap_create(const ddp_host* host, const ddp_transport_v1_t* transport, ddp_comm* comm,
                          ddp_strategy** out) {
  return guard(host, [&] { *out = new ddp_strategy_s(host, transport, comm); });
}

ddp_status overlap_on_train_begin(ddp_strategy* s) {
  return guard(s->host.raw(), [&] { s->broadcast_params_from_rank0(); });
}

// Gradient accumulation: only the micro-batch with sync_grads communicates;
// the others only add into the gradients.
ddp_status overlap_on_step_begin(ddp_strategy* s, const ddp_step_info* info) {
  return guard(s->host.raw(), [&] {
    s->syncing = info->sync_grads != 0;
    if (s->syncing) s->reduced.assign(s->host.param_count(), 0);
  });
}

ddp_status overlap_on_grad_ready(ddp_strategy* s, const ddp_param* param) {
  return guard(s->host.raw(), [&] {
    if (!s->syncing) return;
    const size_t i = param->index;
    if (!param->trainable)
      throw Failure(DDP_ERR_INVALID_ARGUMENT, std::string("on_grad_ready for frozen '") + param->name + "'");
    if (s->reduced.at(i))
      throw Failure(DDP_ERR_INVALID_ARGUMENT,
                    std::string("on_grad_ready for '") + param->name + "' twice in one micro-batch");
    reduce(s, i);
  });
}

// A trainable parameter the model did not use never fires; every rank still
// expects its all-reduce. Those are enqueued here, after the fired ones, in
// table order (`reduced` is reset per sync micro-batch in on_step_begin).
//
// Why this is rank-consistent: the sequence is "fired parameters in
// on_grad_ready order, then never-fired ones in table order", so it depends
// on which parameters fired. It relies on plugin.h's guarantee that the
// engine fires on_grad_ready by model structure only — a parameter fires
// iff the model's forward uses it, in an order fixed by the model, never by
// data, timing or rank — so every rank has the same fired set in the same
// order and issues the same all-reduces in the same order. A model whose
// parameter use depended on the data (e.g. a data-dependent branch) would
// break this assumption and with it this strategy (`bucketed` would not:
// its fixed buckets always launch in index order, whatever fired).
ddp_status overlap_on_backward_end(ddp_strategy* s) {
  return guard(s->host.raw(), [&] {
    if (!s->syncing) return;
    for (size_t i = 0; i < s->host.param_count(); ++i)
      if (s->host.param(i).trainable && !s->reduced[i]) reduce(s, i);
    s->syncing = false;
  });
}

ddp_status overlap_finish(ddp_strategy* s) {
  return guard(s->host.raw(), [&] { s->wait_comm(); });
}

void overlap_destroy(ddp_strategy* s) { delete s; }

// `ddp plan`: an all-reduce per trainable parameter as its gradient is
// final (reverse table order), each beside backward but the last, which
// backward ends with; no buffers.
ddp_status overlap_plan(const ddp_host* host, const ddp_transport_v1_t*, ddp_plan* out) {
  return guard(host, [&] {
    const ddp::plugin::Host h(host);
    const ddp::plugin::Plan plan(out);
    std::vector<size_t> order;
    for (size_t i = h.param_count(); i-- > 0;)
      if (h.param(i).trainable) order.push_back(i);
    for (size_t k = 0; k < order.size(); ++k)
      plan.collective(DDP_OP_ALL_REDUCE, ddp::strategy::StrategyBase::float32_elements(h.param(order[k])), DDP_FLOAT32,
                      k + 1 < order.size());
  });
}

}  // namespace

DDP_STRATEGY_ENTRY = {
    .abi_version = DDP_ABI_VERSION,
    .struct_size = sizeof(ddp_strategy_v1_t),
    .name = "overlap",
    .version = "0.1.0",
    .caps = DDP_CAP_DEVICE_CPU | DDP_CAP_DEVICE_CUDA,
    .create = overlap_create,
    .on_train_begin = overlap_on_train_begin,
    .on_step_begin = overlap_on_step_begin,
    .on_grad_ready = overlap_on_grad_ready,
    .on_backward_end = overlap_on_backward_end,
    .finish = overlap_finish,
    .destroy = overlap_destroy,
    .keys = ddp::strategy::kNoKeys,
    .plan = overlap_plan,
};
