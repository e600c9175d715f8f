// naive.cpp — the `naive` strategy, as in CS336 assignment 2's first DDP:
// rank 0's parameters are broadcast at the start; after backward, one
// all-reduce (average) per trainable parameter, one after the other, and
// the training thread waits for them. Frozen parameters are never touched.
// No keys. Written on the optional C++ helpers of ddp/plugin.hpp.
#include <ddp/plugin.hpp>

using ddp::plugin::Comm;
using ddp::plugin::Event;
using ddp::plugin::Host;
using ddp::plugin::guard;

struct ddp_strategy_s {
  Host host;
  Comm comm;
  Event computed;  // recorded on the compute stream: gradients are final
  Event done;      // recorded on the comm stream after the last collective
};

namespace {

// Waits (blocking) for everything enqueued on the comm stream so far.
void wait_comm(ddp_strategy* s) {
  s->done.record(s->host.comm_stream());
  s->done.synchronize();
}

ddp_status naive_create(const ddp_host* host, const ddp_transport_v1_t* transport, ddp_comm* comm,
                        ddp_strategy** out) {
  return guard(host, [&] { *out = new ddp_strategy_s{Host(host), Comm(transport, comm), Event(host), Event(host)}; });
}

ddp_status naive_on_train_begin(ddp_strategy* s) {
  return guard(s->host.raw(), [&] {
    for (size_t i = 0; i < s->host.param_count(); ++i) {
      const ddp_param& p = s->host.param(i);
      s->comm.broadcast(s->host.floats(p.data, p.numel), 0, s->host.comm_stream());
    }
    wait_comm(s);
  });
}

ddp_status naive_on_step_begin(ddp_strategy*, const ddp_step_info*) { return DDP_OK; }
ddp_status naive_on_grad_ready(ddp_strategy*, const ddp_param*) { return DDP_OK; }
ddp_status naive_on_backward_end(ddp_strategy*) { return DDP_OK; }

ddp_status naive_finish(ddp_strategy* s) {
  return guard(s->host.raw(), [&] {
    const ddp_stream comm = s->host.comm_stream();
    s->computed.record(s->host.compute_stream());
    s->computed.make_wait(comm);
    for (size_t i = 0; i < s->host.param_count(); ++i) {
      const ddp_param& p = s->host.param(i);
      if (p.trainable) s->comm.all_reduce(s->host.floats(p.grad, p.numel), DDP_REDUCE_AVG, comm);
    }
    wait_comm(s);
  });
}

void naive_destroy(ddp_strategy* s) { delete s; }

}  // namespace

extern "C" DDP_PLUGIN_EXPORT const ddp_strategy_v1_t ddp_strategy_v1;
extern "C" const ddp_strategy_v1_t ddp_strategy_v1 = {
    DDP_ABI_VERSION,
    sizeof(ddp_strategy_v1_t),
    "naive",
    "0.1.0",
    DDP_CAP_DEVICE_CPU | DDP_CAP_DEVICE_CUDA,
    naive_create,
    naive_on_train_begin,
    naive_on_step_begin,
    naive_on_grad_ready,
    naive_on_backward_end,
    naive_finish,
    nullptr,  // optimizer_step: the engine's optimizer runs
    nullptr,  // stats
    naive_destroy,
};
