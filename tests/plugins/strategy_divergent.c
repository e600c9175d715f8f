/* strategy_divergent.c — divergent replicas (ABI 1.8), misused and broken.
 * Built with NOENTRY (divergent_noentry): caps has DDP_CAP_DIVERGENT and no
 * on_step_end, which the loader refuses (nothing would say when the
 * replicas are equal). Built with NOCAP (divergent_nocap): on_step_end says
 * the replicas may differ without the cap, which stops the run after its
 * first step (one rank only: nothing is sent). Built with MISORDERED
 * (divergent_misordered): local SGD that averages every trainable
 * parameter after each step, one all-reduce each, in table order, but in
 * reverse order on rank 1: the conformance suite must fail it. Built with
 * SHARDS (divergent_shards): divergent replicas that claim gradients,
 * which the loader refuses (each rank's replica is whole). Built with
 * PERIODIC (divergent_periodic): local SGD that averages every trainable
 * parameter after every `period`-th step (key, default 2), never at the end
 * of the run unless it falls there; rank `odd_rank` (key, default -1: none)
 * averages after every `odd_period`-th step instead (key, default period),
 * and rank `lying_rank` (default -1) answers the opposite of what it did:
 * ranks that disagree on on_step_end. */
#include <stdlib.h>

#include "stubs.h"

#if defined(MISORDERED) || defined(PERIODIC)
struct ddp_strategy_s {
  const ddp_host* host;
  const ddp_transport_v1_t* transport;
  ddp_comm* comm;
  ddp_event computed, done;
  int64_t period, odd_rank, odd_period, lying_rank;  /* PERIODIC's keys */
};

static ddp_status mis_create(const ddp_host* host, const ddp_transport_v1_t* t, ddp_comm* comm, ddp_strategy** out) {
  ddp_strategy* s = calloc(1, sizeof *s);
  if (!s) return DDP_ERR_OUT_OF_MEMORY;
  s->host = host, s->transport = t, s->comm = comm;
  ddp_status st = host->event_create(host->ctx, &s->computed);
  if (st == DDP_OK) st = host->event_create(host->ctx, &s->done);
  *out = s;
  return st;
}

/* Parameter i (table order, or its reverse) of the trainable ones, all
 * (trainable or not) where `all`, averaged or broadcast from rank 0;
 * after compute, waited for. */
static ddp_status each_param(ddp_strategy* s, int all, int reverse) {
  const ddp_host* h = s->host;
  ddp_status st = h->event_record(h->ctx, s->computed, h->compute_stream(h->ctx));
  if (st == DDP_OK) st = h->stream_wait_event(h->ctx, h->comm_stream(h->ctx), s->computed);
  const size_t n = h->param_count(h->ctx);
  for (size_t k = 0; k < n && st == DDP_OK; ++k) {
    const ddp_param* p = h->param(h->ctx, reverse ? n - 1 - k : k);
    if (!all && !p->trainable) continue;
    const ddp_buffer b = {p->data, p->numel, DDP_FLOAT32, h->device};
    st = all ? s->transport->broadcast(s->comm, &b, 0, h->comm_stream(h->ctx))
             : s->transport->all_reduce(s->comm, &b, DDP_REDUCE_AVG, h->comm_stream(h->ctx));
  }
  if (st == DDP_OK) st = h->event_record(h->ctx, s->done, h->comm_stream(h->ctx));
  if (st == DDP_OK) st = h->event_synchronize(h->ctx, s->done);
  return st;
}

static ddp_status mis_begin(ddp_strategy* s) { return each_param(s, 1, 0); }
#ifdef MISORDERED
static ddp_status mis_step_end(ddp_strategy* s, const ddp_step_info* info, int* synced) {
  (void)info;
  *synced = 1;
  return each_param(s, 0, s->host->rank == 1);
}
#else
static ddp_status periodic_create(const ddp_host* host, const ddp_transport_v1_t* t, ddp_comm* comm,
                                  ddp_strategy** out) {
  ddp_status st = mis_create(host, t, comm, out);
  ddp_strategy* s = *out;
  if (st == DDP_OK) st = host->config_int(host->ctx, "period", 2, &s->period);
  if (st == DDP_OK) st = host->config_int(host->ctx, "odd_rank", -1, &s->odd_rank);
  if (st == DDP_OK) st = host->config_int(host->ctx, "odd_period", s->period, &s->odd_period);
  if (st == DDP_OK) st = host->config_int(host->ctx, "lying_rank", -1, &s->lying_rank);
  return st;
}
static ddp_status periodic_step_end(ddp_strategy* s, const ddp_step_info* info, int* synced) {
  const int rank = s->host->rank;
  const int64_t period = rank == s->odd_rank ? s->odd_period : s->period;
  const int sync = (info->step + 1) % period == 0;
  *synced = rank == s->lying_rank ? !sync : sync;
  return sync ? each_param(s, 0, 0) : DDP_OK;
}
static const ddp_key periodic_keys[] = {
    {"period", "int >= 1", "steps between two averages; default 2"},
    {"odd_rank", "int", "the rank that averages after every odd_period-th step instead; default -1 (none)"},
    {"odd_period", "int >= 1", "odd_rank's period; default period"},
    {"lying_rank", "int", "the rank that answers on_step_end the opposite of what it did; default -1 (none)"},
    {NULL, NULL, NULL},
};
#endif
static void mis_destroy(ddp_strategy* s) {
  if (!s) return;
  s->host->event_destroy(s->host->ctx, s->computed);
  s->host->event_destroy(s->host->ctx, s->done);
  free(s);
}
#elif defined(SHARDS)
static ddp_status no_ranges(ddp_strategy* s, const ddp_range** ranges, size_t* count, int* partitioned) {
  (void)s, (void)ranges, (void)count, (void)partitioned;
  return DDP_OK;
}
#endif
#if !defined(NOENTRY) && !defined(MISORDERED) && !defined(PERIODIC)
static ddp_status says_differ(ddp_strategy* s, const ddp_step_info* info, int* synced) {
  (void)s, (void)info;
  *synced = 0;
  return DDP_OK;
}
#endif

DDP_PLUGIN_EXPORT extern const ddp_strategy_v1_t ddp_strategy_v1;
#if defined(NOENTRY)
const ddp_strategy_v1_t ddp_strategy_v1 = {STUB_STRATEGY_FIELDS, .name = "divergent_noentry",
                                           .caps = DDP_CAP_DEVICE_CPU | DDP_CAP_DIVERGENT};
#elif defined(SHARDS)
const ddp_strategy_v1_t ddp_strategy_v1 = {
    STUB_STRATEGY_FIELDS, .name = "divergent_shards",
    .caps = DDP_CAP_DEVICE_CPU | DDP_CAP_DIVERGENT | DDP_CAP_OWNS_OPTIMIZER | DDP_CAP_OWNS_GRADIENTS,
    .optimizer_step = stub_hook, .grad_ranges = no_ranges, .on_step_end = says_differ};
#elif defined(MISORDERED)
const ddp_strategy_v1_t ddp_strategy_v1 = {STUB_STRATEGY_FIELDS, .name = "divergent_misordered",
                                           .caps = DDP_CAP_DEVICE_CPU | DDP_CAP_DIVERGENT, .create = mis_create,
                                           .on_train_begin = mis_begin, .destroy = mis_destroy,
                                           .on_step_end = mis_step_end};
#elif defined(PERIODIC)
const ddp_strategy_v1_t ddp_strategy_v1 = {STUB_STRATEGY_FIELDS, .name = "divergent_periodic",
                                           .caps = DDP_CAP_DEVICE_CPU | DDP_CAP_DIVERGENT, .create = periodic_create,
                                           .on_train_begin = mis_begin, .destroy = mis_destroy,
                                           .keys = periodic_keys, .on_step_end = periodic_step_end};
#else
const ddp_strategy_v1_t ddp_strategy_v1 = {STUB_STRATEGY_FIELDS, .name = "divergent_nocap",
                                           .on_step_end = says_differ};
#endif
