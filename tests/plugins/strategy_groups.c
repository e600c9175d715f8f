/* strategy_groups.c — groups (ABI 1.9) misused, for tests/groups_test.cpp.
 * A DDP strategy (every trainable gradient averaged over the world, one
 * all-reduce each, then again within a group of pairs: color rank / 2,
 * which leaves the average as it is) whose key `mode` breaks one rule:
 *   "none"        nothing: it trains as naive does;
 *   "misordered"  rank 1 averages within its pair in reverse table order:
 *                 the pair disagrees on its first collective;
 *   "late"        splits in finish, after set-up: refused;
 *   "badname"     names its group "two words": refused;
 *   "foreign"     splits a handle the host never gave: refused. */
#include <stdlib.h>
#include <string.h>

#include "stubs.h"

struct ddp_strategy_s {
  const ddp_host* host;
  const ddp_transport_v1_t* t;
  ddp_comm* world;
  ddp_comm* pairs;
  const char* mode;
  ddp_event computed, done;
};

static const ddp_key kKeys[] = {{"mode", "string", "none, misordered, late, badname or foreign"}, {NULL, NULL, NULL}};

static ddp_status make_pairs(ddp_strategy* s) {
  const ddp_host* h = s->host;
  const int bad_name = strcmp(s->mode, "badname") == 0;
  ddp_comm* parent = strcmp(s->mode, "foreign") == 0 ? (ddp_comm*)s : s->world;
  return h->split(h->ctx, parent, h->rank / 2, h->rank, bad_name ? "two words" : "pairs", &s->pairs);
}

static ddp_status groups_create(const ddp_host* h, const ddp_transport_v1_t* t, ddp_comm* comm, ddp_strategy** out) {
  ddp_strategy* s = calloc(1, sizeof *s);
  if (!s) return DDP_ERR_OUT_OF_MEMORY;
  *out = s;
  s->host = h, s->t = t, s->world = comm;
  ddp_status st = h->config_string(h->ctx, "mode", "none", &s->mode);
  if (st == DDP_OK) st = h->event_create(h->ctx, &s->computed);
  if (st == DDP_OK) st = h->event_create(h->ctx, &s->done);
  if (st == DDP_OK && strcmp(s->mode, "late") != 0) st = make_pairs(s);
  return st;
}

static ddp_status sync_with(ddp_strategy* s, ddp_event e, ddp_stream stream, int wait) {
  const ddp_host* h = s->host;
  ddp_status st = h->event_record(h->ctx, e, stream);
  if (st != DDP_OK) return st;
  return wait ? h->event_synchronize(h->ctx, e) : h->stream_wait_event(h->ctx, h->comm_stream(h->ctx), e);
}

/* Every parameter (trainable ones only where !all) averaged on `comm`, in
 * table order or its reverse; broadcast from 0 where `all`. */
static ddp_status each(ddp_strategy* s, ddp_comm* comm, int all, int reverse) {
  const ddp_host* h = s->host;
  const size_t n = h->param_count(h->ctx);
  ddp_status st = DDP_OK;
  for (size_t k = 0; k < n && st == DDP_OK; ++k) {
    const ddp_param* p = h->param(h->ctx, reverse ? n - 1 - k : k);
    if (!all && !p->trainable) continue;
    const ddp_buffer b = {all ? p->data : p->grad, p->numel, DDP_FLOAT32, h->device};
    st = all ? s->t->broadcast(comm, &b, 0, h->comm_stream(h->ctx))
             : s->t->all_reduce(comm, &b, DDP_REDUCE_AVG, h->comm_stream(h->ctx));
  }
  return st;
}

static ddp_status groups_begin(ddp_strategy* s) {
  const ddp_host* h = s->host;
  ddp_status st = sync_with(s, s->computed, h->compute_stream(h->ctx), 0);
  if (st == DDP_OK) st = each(s, s->world, 1, 0);
  return st == DDP_OK ? sync_with(s, s->done, h->comm_stream(h->ctx), 1) : st;
}

static ddp_status groups_finish(ddp_strategy* s) {
  const ddp_host* h = s->host;
  if (strcmp(s->mode, "late") == 0 && !s->pairs) {
    ddp_status st = make_pairs(s);
    if (st != DDP_OK) return st;
  }
  ddp_status st = sync_with(s, s->computed, h->compute_stream(h->ctx), 0);
  if (st == DDP_OK) st = each(s, s->world, 0, 0);
  if (st == DDP_OK) st = each(s, s->pairs, 0, strcmp(s->mode, "misordered") == 0 && h->rank == 1);
  return st == DDP_OK ? sync_with(s, s->done, h->comm_stream(h->ctx), 1) : st;
}

static void groups_destroy(ddp_strategy* s) {
  if (!s) return;
  if (s->computed) s->host->event_destroy(s->host->ctx, s->computed);
  if (s->done) s->host->event_destroy(s->host->ctx, s->done);
  free(s);
}

DDP_STRATEGY_ENTRY = {
    STUB_STRATEGY_FIELDS,
    .name = "groups",
    .caps = DDP_CAP_DEVICE_CPU,
    .create = groups_create,
    .on_train_begin = groups_begin,
    .finish = groups_finish,
    .destroy = groups_destroy,
    .keys = kKeys,
};
