// localsgd.cpp — the `localsgd` strategy: post-local SGD (Lin et al.
// 2020; PyTorch's PostLocalSGDOptimizer with a PeriodicModelAverager).
// The first `warmup_steps` steps are DDP: the trainable gradients are
// averaged over ranks in finish (in one all-reduce, in place where the
// engine packed them). From then on each rank steps on its own gradients,
// and after every `period` such steps (on_step_end) the values of every
// trainable parameter are averaged over ranks in one all-reduce: a sync
// point; the run's last step is one too, so that the model it writes is
// the average. Between
// sync points the replicas differ on purpose (DDP_CAP_DIVERGENT): the
// engine checks them at sync points only. Keys: period (required, >= 1),
// warmup_steps (default 0).
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
  // The keys.
  int64_t period = 1;
  int64_t warmup_steps = 0;
  int64_t step = 0;      // the step under way (on_step_begin)
  int64_t averages = 0;  // sync points so far (stats)
  DeviceBuffer staging;  // the model's values (or gradients) back to back, to average
};

namespace {

constexpr ddp_key kKeys[] = {
    {"period", "int >= 1", "local steps between two averagings of the parameters (required)"},
    {"warmup_steps", "int >= 0", "steps of DDP (gradients averaged every step) before the local steps; default 0"},
    {nullptr, nullptr, nullptr},
};

struct Keys {
  int64_t period;
  int64_t warmup_steps;
};
Keys read_keys(const Host& h) {
  const int64_t period = ddp::strategy::period_key(h, "localsgd");
  const int64_t warmup = h.config_int("warmup_steps", 0);
  if (warmup < 0)
    throw ddp::plugin::Failure(DDP_ERR_INVALID_ARGUMENT,
                               "strategy.warmup_steps: must be >= 0, not " + std::to_string(warmup));
  return {period, warmup};
}

// Whether `step` (from 0) ends with the parameters averaged: the
// `period`-th local step after the warmup, and every `period` after it.
bool averages_after(const ddp_strategy* s, int64_t step) {
  return step >= s->warmup_steps && (step + 1 - s->warmup_steps) % s->period == 0;
}

ddp_status localsgd_create(const ddp_host* host, const ddp_transport_v1_t* transport, ddp_comm* comm,
                           ddp_strategy** out) {
  return guard(host, [&] {
    const Keys keys = read_keys(Host(host));
    auto* s = new ddp_strategy_s(host, transport, comm);
    s->period = keys.period;
    s->warmup_steps = keys.warmup_steps;
    *out = s;
  });
}

// Rank 0's parameters everywhere, in one broadcast of the whole model
// through staging: everything a sync point needs is made here, the
// transport's buffers (where it stages collectives) included.
ddp_status localsgd_on_train_begin(ddp_strategy* s) {
  return guard(s->host.raw(), [&] {
    const size_t total = ddp::strategy::model_slots(s->host).total;
    if (total > 0) s->staging = DeviceBuffer(s->host.raw(), total * sizeof(float), DDP_MEM_COMM_BUFFERS);
    const std::vector<bool> every(s->host.param_count(), true);
    ddp::strategy::broadcast_spans(*s, ddp::strategy::values_of(s->host, every), s->staging.floats());
  });
}

ddp_status localsgd_on_step_begin(ddp_strategy* s, const ddp_step_info* info) {
  s->step = info->step;
  return DDP_OK;
}

// The warmup's steps are DDP's: the gradients averaged; later ones local.
ddp_status localsgd_finish(ddp_strategy* s) {
  return guard(s->host.raw(), [&] {
    if (s->step >= s->warmup_steps) return;
    ddp::strategy::average_spans(*s, ddp::strategy::trainable_grads(s->host), s->staging.floats());
  });
}

// A sync point after every `period` local steps, and after the last step
// of the run (weights.safetensors is then every rank's model).
ddp_status localsgd_on_step_end(ddp_strategy* s, const ddp_step_info* info, int* synced) {
  return guard(s->host.raw(), [&] {
    *synced = info->step < s->warmup_steps;  // DDP's steps leave equal replicas
    if (*synced || !(averages_after(s, info->step) || ddp::strategy::last_step(info))) return;
    // The trainable parameters: a frozen one is equal on every rank (and
    // was since the last average: a run only ever unfreezes), and an
    // average (x + x + x) / 3 could move it.
    std::vector<bool> trainable;
    for (size_t i = 0; i < s->host.param_count(); ++i) trainable.push_back(s->host.param(i).trainable);
    ddp::strategy::average_spans(*s, ddp::strategy::values_of(s->host, trainable), s->staging.floats());
    ++s->averages;
    *synced = 1;
  });
}

// {"period": H, "warmup_steps": W, "averages": n}
ddp_status localsgd_stats(ddp_strategy* s, char* buf, size_t cap, size_t* needed) {
  return guard(s->host.raw(), [&] {
    ddp::strategy::write_stats("{\"period\": " + std::to_string(s->period) +
                                   ", \"warmup_steps\": " + std::to_string(s->warmup_steps) +
                                   ", \"averages\": " + std::to_string(s->averages) + "}",
                               buf, cap, needed);
  });
}

void localsgd_destroy(ddp_strategy* s) { delete s; }

// `ddp plan`, after the warmup: every `period` steps one all-reduce of the
// trainable values, through a buffer of the model's size from set-up on
// (the warmup's averages run in the gradients' packed memory).
ddp_status localsgd_plan(const ddp_host* host, const ddp_transport_v1_t*, ddp_plan* out) {
  return guard(host, [&] {
    const Host h(host);
    const Keys keys = read_keys(h);
    const ddp::plugin::Plan plan(out);
    size_t trainable = 0;
    for (size_t i = 0; i < h.param_count(); ++i)
      if (h.param(i).trainable) trainable += StrategyBase::float32_elements(h.param(i));
    const size_t total = ddp::strategy::model_slots(h).total;
    if (total > 0) plan.buffer(DDP_MEM_COMM_BUFFERS, total * sizeof(float));
    if (trainable == 0) return;
    plan.every(keys.period);
    plan.collective(DDP_OP_ALL_REDUCE, trainable);
  });
}

}  // namespace

DDP_STRATEGY_ENTRY = {
    .abi_version = DDP_ABI_VERSION,
    .struct_size = sizeof(ddp_strategy_v1_t),
    .name = "localsgd",
    .version = "0.1.0",
    .caps = DDP_CAP_DEVICE_CPU | DDP_CAP_DEVICE_CUDA | DDP_CAP_DIVERGENT,
    .create = localsgd_create,
    .on_train_begin = localsgd_on_train_begin,
    .on_step_begin = localsgd_on_step_begin,
    .finish = localsgd_finish,
    .stats = localsgd_stats,
    .destroy = localsgd_destroy,
    .keys = kKeys,
    .plan = localsgd_plan,
    .on_step_end = localsgd_on_step_end,
};
