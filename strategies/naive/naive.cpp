// naive.cpp — the `naive` strategy, as in CS336 assignment 2's first DDP:
// rank 0's parameters are broadcast at the start; after backward, one
// all-reduce (average) per trainable parameter, one after the other, and
// the training thread waits for them. Frozen parameters are never touched.
// No keys.
#include "../common/strategy_util.h"

using ddp::plugin::guard;
using ddp::strategy::StrategyBase;

struct ddp_strategy_s : ddp::strategy::StrategyBase {
  using StrategyBase::StrategyBase;
};

namespace {

ddp_status naive_create(const ddp_host* host, const ddp_transport_v1_t* transport, ddp_comm* comm, ddp_strategy** out) {
  return guard(host, [&] { *out = new ddp_strategy_s(host, transport, comm); });
}

ddp_status naive_on_train_begin(ddp_strategy* s) {
  return guard(s->host.raw(), [&] { s->broadcast_params_from_rank0(); });
}

ddp_status naive_finish(ddp_strategy* s) {
  return guard(s->host.raw(), [&] {
    s->comm_after_compute();
    for (size_t i = 0; i < s->host.param_count(); ++i) {
      const ddp_param& p = s->host.param(i);
      if (p.trainable)
        s->comm.all_reduce(s->host.floats(p.grad, s->float32_elements(p)), DDP_REDUCE_AVG, s->host.comm_stream());
    }
    s->wait_comm();
  });
}

void naive_destroy(ddp_strategy* s) { delete s; }

// `ddp plan`: an all-reduce per trainable parameter, in table order, after
// backward; no buffers.
ddp_status naive_plan(const ddp_host* host, const ddp_transport_v1_t*, ddp_plan* out) {
  return guard(host, [&] {
    const ddp::plugin::Host h(host);
    const ddp::plugin::Plan plan(out);
    for (size_t i = 0; i < h.param_count(); ++i)
      if (h.param(i).trainable) plan.collective(DDP_OP_ALL_REDUCE, StrategyBase::float32_elements(h.param(i)));
  });
}

}  // namespace

DDP_STRATEGY_ENTRY = {
    .abi_version = DDP_ABI_VERSION,
    .struct_size = sizeof(ddp_strategy_v1_t),
    .name = "naive",
    .version = "0.1.0",
    .caps = DDP_CAP_DEVICE_CPU | DDP_CAP_DEVICE_CUDA,
    .create = naive_create,
    .on_train_begin = naive_on_train_begin,
    .finish = naive_finish,
    .destroy = naive_destroy,
    .keys = ddp::strategy::kNoKeys,
    .plan = naive_plan,
};
