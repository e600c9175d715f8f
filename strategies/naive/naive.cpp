// naive.cpp — the `naive` strategy, as in CS336 assignment 2's first DDP:
// rank 0's parameters are broadcast at the start; after backward, one
// all-reduce (average) per trainable parameter, one after the other.
// Frozen parameters are never touched. No keys.
#include <ddp/plugin.h>

#include <new>

struct ddp_strategy_s {
  const ddp_host* host;
  const ddp_transport_v1_t* transport;
  ddp_comm* comm;
  ddp_event done;  // recorded on the comm stream after the last collective
};

namespace {

ddp_buffer buffer_of(const ddp_host* h, const ddp_param& p, void* ptr) {
  return ddp_buffer{ptr, p.numel, p.dtype, h->device};
}

ddp_status naive_create(const ddp_host* host, const ddp_transport_v1_t* transport, ddp_comm* comm,
                        ddp_strategy** out) {
  auto* s = new (std::nothrow) ddp_strategy_s{host, transport, comm, nullptr};
  if (!s) return DDP_ERR_OUT_OF_MEMORY;
  if (ddp_status st = host->event_create(host->ctx, &s->done)) {
    delete s;
    return st;
  }
  *out = s;
  return DDP_OK;
}

// Enqueues on the comm stream; blocks until every collective has completed.
ddp_status wait_comm(ddp_strategy* s) {
  const ddp_host* h = s->host;
  if (ddp_status st = h->event_record(h->ctx, s->done, h->comm_stream(h->ctx))) return st;
  return h->event_synchronize(h->ctx, s->done);
}

ddp_status naive_on_train_begin(ddp_strategy* s) {
  const ddp_host* h = s->host;
  size_t n = 0;
  const ddp_param* params = h->params(h->ctx, &n);
  ddp_stream comm = h->comm_stream(h->ctx);
  for (size_t i = 0; i < n; ++i) {
    ddp_buffer buf = buffer_of(h, params[i], params[i].data);
    if (ddp_status st = s->transport->broadcast(s->comm, buf, 0, comm)) return st;
  }
  return wait_comm(s);
}

ddp_status naive_on_step_begin(ddp_strategy*, const ddp_step_info*) { return DDP_OK; }
ddp_status naive_on_grad_ready(ddp_strategy*, const ddp_param*) { return DDP_OK; }
ddp_status naive_on_backward_end(ddp_strategy*) { return DDP_OK; }

ddp_status naive_finish(ddp_strategy* s) {
  const ddp_host* h = s->host;
  size_t n = 0;
  const ddp_param* params = h->params(h->ctx, &n);
  ddp_stream comm = h->comm_stream(h->ctx);
  for (size_t i = 0; i < n; ++i) {
    if (!params[i].trainable) continue;
    ddp_buffer buf = buffer_of(h, params[i], params[i].grad);
    if (ddp_status st = s->transport->all_reduce(s->comm, buf, DDP_REDUCE_AVG, comm)) return st;
  }
  return wait_comm(s);
}

void naive_destroy(ddp_strategy* s) {
  s->host->event_destroy(s->host->ctx, s->done);
  delete s;
}

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
