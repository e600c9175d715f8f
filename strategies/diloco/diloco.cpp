// diloco.cpp — the `diloco` strategy: DiLoCo (Douillard et al. 2023;
// torchft's local_sgd.py). The engine's optimizer is the inner one: each
// rank steps on its own gradients, nothing is sent. After every `period`
// steps (on_step_end) the ranks average the pseudo-gradient
// Δ = θ_global − θ_local in one all-reduce, and an outer SGD with Nesterov
// momentum takes one step of θ_global on it, as torch.optim.SGD(lr =
// outer_lr, momentum = outer_momentum, nesterov = True) would:
//   b ← μ·b + Δ;   θ_global ← θ_global − lr·Δ − lr·μ·b;   θ_local ← θ_global
// on every trainable parameter (a frozen one is averaged: θ_global − Δ).
// That is a sync point, as is the run's last step (an outer step on the
// inner steps since the one before); between them the replicas differ on purpose
// (DDP_CAP_DIVERGENT). θ_global and b (kept where μ > 0) are the outer
// optimizer's state, a copy of the model each. Keys: period (required),
// outer_lr (default 0.7), outer_momentum (default 0.9), the paper's.
#include <string>
#include <vector>

#include "../common/replica_sync.h"
#include "../common/stats.h"

using ddp::plugin::DeviceBuffer;
using ddp::plugin::guard;
using ddp::plugin::Host;
using ddp::strategy::StrategyBase;

struct ddp_strategy_s : StrategyBase {
  ddp_strategy_s(const ddp_host* h, const ddp_transport_v1_t* t, ddp_comm* c) : StrategyBase(h, t, c) {}
  int64_t period = 1;  // the keys
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  ddp::strategy::ModelSlots slots;      // every parameter's place in the buffers below
  DeviceBuffer global;                  // θ_global
  DeviceBuffer momentum;                // b
  DeviceBuffer staging;                 // Δ on its way
  int64_t outer_steps = 0;              // sync points so far (stats)
  std::vector<ddp_state_buffer> state;  // θ_global and b, for checkpoints
};

namespace {

constexpr ddp_key kKeys[] = {
    {"period", "int >= 1", "inner steps between two outer steps (required)"},
    {"outer_lr", "float > 0", "the outer Nesterov SGD's learning rate; default 0.7"},
    {"outer_momentum", "float in [0, 1)", "the outer Nesterov SGD's momentum; default 0.9 (0: plain SGD)"},
    {nullptr, nullptr, nullptr},
};

struct Keys {
  int64_t period;
  double outer_lr;
  double outer_momentum;
};
Keys read_keys(const Host& h) {
  using ddp::plugin::Failure;
  const Keys k{ddp::strategy::period_key(h, "diloco"), h.config_float("outer_lr", 0.7),
               h.config_float("outer_momentum", 0.9)};
  if (!(k.outer_lr > 0))
    throw Failure(DDP_ERR_INVALID_ARGUMENT, "strategy.outer_lr: must be > 0, not " + std::to_string(k.outer_lr));
  if (!(k.outer_momentum >= 0 && k.outer_momentum < 1))
    throw Failure(DDP_ERR_INVALID_ARGUMENT,
                  "strategy.outer_momentum: must be in [0, 1), not " + std::to_string(k.outer_momentum));
  return k;
}

ddp_status diloco_create(const ddp_host* host, const ddp_transport_v1_t* transport, ddp_comm* comm,
                         ddp_strategy** out) {
  return guard(host, [&] {
    const Keys k = read_keys(Host(host));
    auto* s = new ddp_strategy_s(host, transport, comm);
    s->period = k.period;
    s->outer_lr = k.outer_lr;
    s->outer_momentum = k.outer_momentum;
    *out = s;
  });
}

// Rank 0's parameters everywhere, in one broadcast of the whole model
// through staging (everything a sync point needs is made here, the
// transport's buffers where it stages collectives included), and
// θ_global = them.
ddp_status diloco_on_train_begin(ddp_strategy* s) {
  return guard(s->host.raw(), [&] {
    const Host& h = s->host;
    s->slots = ddp::strategy::model_slots(h);
    const size_t bytes = s->slots.total * sizeof(float);
    if (bytes == 0) return;
    s->global = DeviceBuffer(h.raw(), bytes, DDP_MEM_OPTIMIZER_STATE);
    if (s->outer_momentum > 0) s->momentum = DeviceBuffer(h.raw(), bytes, DDP_MEM_OPTIMIZER_STATE);
    s->staging = DeviceBuffer(h.raw(), bytes, DDP_MEM_COMM_BUFFERS);
    const std::vector<bool> every(h.param_count(), true);
    ddp::strategy::broadcast_spans(*s, ddp::strategy::values_of(h, every), s->staging.floats());
    s->state = {{"global", s->global.get(), s->slots.total}};
    if (s->momentum.get()) s->state.push_back({"momentum", s->momentum.get(), s->slots.total});
    for (size_t i = 0; i < h.param_count(); ++i) {
      const ddp_param& p = h.param(i);
      h.copy(s->global.floats() + s->slots.offset[i], p.data, StrategyBase::float32_bytes(p), h.compute_stream());
    }
  });
}

// Inner steps: the gradients stay each rank's own.
ddp_status diloco_finish(ddp_strategy*) { return DDP_OK; }

// Δ = θ_global − θ_local of every parameter into staging, averaged over ranks.
void average_pseudo_gradient(ddp_strategy* s) {
  const Host& h = s->host;
  for (size_t i = 0; i < h.param_count(); ++i) {
    const ddp_param& p = h.param(i);
    float* delta = s->staging.floats() + s->slots.offset[i];
    h.copy(delta, p.data, StrategyBase::float32_bytes(p), h.compute_stream());
    h.scale(h.floats(delta, p.numel), -1.0, h.compute_stream());
    h.add(h.floats(delta, p.numel), h.floats(s->global.floats() + s->slots.offset[i], p.numel), h.compute_stream());
  }
  s->comm_after_compute();
  s->comm.all_reduce(h.floats(s->staging.floats(), s->slots.total), DDP_REDUCE_AVG, h.comm_stream());
  s->wait_comm();
}

// The outer step of parameter i on the averaged Δ (staging), then
// θ_local = θ_global. Staging is scratch from here on.
void outer_step(ddp_strategy* s, size_t i) {
  const Host& h = s->host;
  const ddp_param& p = h.param(i);
  const ddp_stream c = h.compute_stream();
  const size_t at = s->slots.offset[i];
  const ddp_buffer delta = h.floats(s->staging.floats() + at, p.numel);
  const ddp_buffer global = h.floats(s->global.floats() + at, p.numel);
  const double lr = p.trainable ? s->outer_lr : 1.0;  // a frozen parameter: averaged
  const bool nesterov = p.trainable && s->momentum.get();
  if (nesterov) {  // b ← μ·b + Δ
    const ddp_buffer b = h.floats(s->momentum.floats() + at, p.numel);
    h.scale(b, s->outer_momentum, c);
    h.add(b, delta, c);
  }
  h.scale(delta, -lr, c);  // θ_global −= lr·Δ
  h.add(global, delta, c);
  if (nesterov) {  // θ_global −= lr·μ·b
    h.copy(delta.ptr, s->momentum.floats() + at, p.numel * sizeof(float), c);
    h.scale(delta, -lr * s->outer_momentum, c);
    h.add(global, delta, c);
  }
  h.copy(p.data, global.ptr, p.numel * sizeof(float), c);
}

// An outer step after every `period` inner steps, and after the last step
// of the run (on the inner steps since the one before, fewer than `period`
// where the period does not divide the steps): the model the run writes is
// θ_global.
ddp_status diloco_on_step_end(ddp_strategy* s, const ddp_step_info* info, int* synced) {
  return guard(s->host.raw(), [&] {
    *synced = (info->step + 1) % s->period == 0 || ddp::strategy::last_step(info);
    if (!*synced || s->slots.total == 0) return;
    average_pseudo_gradient(s);
    for (size_t i = 0; i < s->host.param_count(); ++i) outer_step(s, i);
    ++s->outer_steps;
  });
}

// {"period": H, "outer_lr": lr, "outer_momentum": μ, "outer_steps": n}
ddp_status diloco_stats(ddp_strategy* s, char* buf, size_t cap, size_t* needed) {
  return guard(s->host.raw(), [&] {
    ddp::strategy::write_stats("{\"period\": " + std::to_string(s->period) +
                                   ", \"outer_lr\": " + ddp::strategy::json_number(s->outer_lr) +
                                   ", \"outer_momentum\": " + ddp::strategy::json_number(s->outer_momentum) +
                                   ", \"outer_steps\": " + std::to_string(s->outer_steps) + "}",
                               buf, cap, needed);
  });
}

// `ddp plan`: θ_global and b (where μ > 0) and the buffer Δ travels in,
// each the model's size, from set-up on; every `period` steps one
// all-reduce of the whole model.
ddp_status diloco_plan(const ddp_host* host, const ddp_transport_v1_t*, ddp_plan* out) {
  return guard(host, [&] {
    const Host h(host);
    const Keys keys = read_keys(h);
    const ddp::plugin::Plan plan(out);
    const size_t total = ddp::strategy::model_slots(h).total;
    if (total == 0) return;
    plan.buffer(DDP_MEM_OPTIMIZER_STATE, total * sizeof(float));
    if (keys.outer_momentum > 0) plan.buffer(DDP_MEM_OPTIMIZER_STATE, total * sizeof(float));
    plan.buffer(DDP_MEM_COMM_BUFFERS, total * sizeof(float));
    plan.every(keys.period);
    plan.collective(DDP_OP_ALL_REDUCE, total);
  });
}

// What a checkpoint keeps: θ_global and b (a resume fills them after
// on_train_begin, which took θ_global from rank 0's parameters).
ddp_status diloco_state(ddp_strategy* s, const ddp_state_buffer** out, size_t* count) {
  *out = s->state.data();
  *count = s->state.size();
  return DDP_OK;
}

void diloco_destroy(ddp_strategy* s) { delete s; }

}  // namespace

DDP_STRATEGY_ENTRY = {
    .abi_version = DDP_ABI_VERSION,
    .struct_size = sizeof(ddp_strategy_v1_t),
    .name = "diloco",
    .version = "0.1.0",
    .caps = DDP_CAP_DEVICE_CPU | DDP_CAP_DEVICE_CUDA | DDP_CAP_DIVERGENT,
    .create = diloco_create,
    .on_train_begin = diloco_on_train_begin,
    .finish = diloco_finish,
    .stats = diloco_stats,
    .destroy = diloco_destroy,
    .keys = kKeys,
    .plan = diloco_plan,
    .on_step_end = diloco_on_step_end,
    .state = diloco_state,
};
