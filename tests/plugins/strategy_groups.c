/* strategy_groups.c — groups (ABI 1.9) misused, for tests/groups_test.cpp.
 * A DDP strategy (every trainable gradient averaged over the world, one
 * all-reduce each, then again within a group of pairs: color rank / 2,
 * which leaves the average as it is) whose key `mode` breaks one rule:
 *   "none"        nothing: it trains as naive does;
 *   "misordered"  rank 1 averages within its pair in reverse table order:
 *                 the pair disagrees on its first collective;
 *   "late"        splits in finish, after set-up: refused;
 *   "badname"     names its group "two words": refused;
 *   "foreign"     splits a handle the host never gave: refused;
 *   "nested"      also splits each pair again, color 0 in both (two
 *                 parents, one color: two groups), and checks a sum in it;
 *   "uneven"      only the first pair splits itself again, then every
 *                 rank splits the world once more, each checked by a sum;
 *   "scopes"      its state (one float, "steps") is equal on every rank
 *                 by rank 0's state_scopes and per rank by the others';
 *   "held_twice"  held_ranges names each gradient twice;
 *   "held_once"   held_ranges says each gradient is on this rank alone
 *                 (replicas 1), where every rank holds it;
 *   "scaled"      rank 1 scales its averaged gradients by 1024: under
 *                 AdamW with a tiny eps the weights stay bitwise equal,
 *                 the optimizer states do not;
 *   "state_null"  state gives 3 buffers at NULL;
 *   "state_nullptr" state's one buffer is NULL with 3 elements;
 *   "state_huge"  state's one buffer (one float) says 2^40 elements;
 *   "held_huge"   held_ranges says 2^40 ranges over its few.
 * Otherwise held_ranges names every trainable gradient, held by every rank. */
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
  float* steps;  /* its state: the steps it averaged (device memory) */
  ddp_state_buffer state;
  ddp_state_scope scope;
  ddp_held_range* held;  /* held_ranges' answer */
};

static const ddp_key kKeys[] = {{"mode", "string", "none, misordered, late, badname, foreign, nested, uneven, scopes, held_twice, held_once, scaled, state_null, state_nullptr, state_huge or held_huge"},
                                {NULL, NULL, NULL}};

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
  if (st == DDP_OK) st = h->alloc(h->ctx, sizeof(float), DDP_MEM_OPTIMIZER_STATE, (void**)&s->steps);
  s->state.name = "steps", s->state.ptr = s->steps, s->state.count = 1;
  s->scope = strcmp(s->mode, "scopes") == 0 && h->rank != 0 ? DDP_STATE_PER_RANK : DDP_STATE_EQUAL;
  return st;
}

static ddp_status groups_held(ddp_strategy* s, const ddp_held_range** out, size_t* count) {
  const ddp_host* h = s->host;
  const size_t n = h->param_count(h->ctx);
  const int twice = strcmp(s->mode, "held_twice") == 0;
  free(s->held);
  s->held = calloc(2 * n + 1, sizeof *s->held);
  if (!s->held) return DDP_ERR_OUT_OF_MEMORY;
  size_t k = 0;
  for (size_t i = 0; i < n; ++i) {
    const ddp_param* p = h->param(h->ctx, i);
    if (!p->trainable) continue;
    const ddp_held_range r = {i, 0, p->numel, NULL, strcmp(s->mode, "held_once") == 0 ? 1 : h->world_size};
    s->held[k++] = r;
    if (twice) s->held[k++] = r;
  }
  *out = s->held;
  *count = strcmp(s->mode, "held_huge") == 0 ? (size_t)1 << 40 : k;
  return DDP_OK;
}

static ddp_status groups_state(ddp_strategy* s, const ddp_state_buffer** out, size_t* count) {
  if (strcmp(s->mode, "state_nullptr") == 0) s->state.ptr = NULL, s->state.count = 3;
  if (strcmp(s->mode, "state_huge") == 0) s->state.count = (size_t)1 << 40;
  *out = strcmp(s->mode, "state_null") == 0 ? NULL : &s->state;
  *count = strcmp(s->mode, "state_null") == 0 ? 3 : 1;
  return DDP_OK;
}
static ddp_status groups_scopes(ddp_strategy* s, const ddp_state_scope** scopes, size_t* count) {
  *scopes = &s->scope;
  *count = 1;
  return DDP_OK;
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

/* Sums rank + 1 over `comm`'s members and checks it against the members'
 * world ranks (ddp_host::group): a group whose rendezvous met another's
 * would sum the wrong ranks. */
static ddp_status check_sum(ddp_strategy* s, ddp_comm* comm) {
  const ddp_host* h = s->host;
  const ddp_group* g = h->group(h->ctx, comm);
  float* value = NULL;
  ddp_status st = h->alloc(h->ctx, sizeof(float), DDP_MEM_COMM_BUFFERS, (void**)&value);
  if (st != DDP_OK) return st;
  *value = (float)(h->rank + 1);
  const ddp_buffer b = {value, 1, DDP_FLOAT32, h->device};
  st = s->t->all_reduce(comm, &b, DDP_REDUCE_SUM, h->comm_stream(h->ctx));
  if (st == DDP_OK) st = sync_with(s, s->done, h->comm_stream(h->ctx), 1);
  float want = 0;
  for (int k = 0; k < g->size; ++k) want += (float)(g->ranks[k] + 1);
  if (st == DDP_OK && *value != want) {
    h->set_error(h->ctx, "a group's sum met another group's ranks");
    st = DDP_ERR_INTERNAL;
  }
  h->free(h->ctx, value);
  return st;
}

/* The nested modes' groups, made in on_train_begin and checked there. */
static ddp_status nest(ddp_strategy* s) {
  const ddp_host* h = s->host;
  ddp_comm* sub = NULL;
  ddp_comm* again = NULL;
  ddp_status st = DDP_OK;
  if (strcmp(s->mode, "nested") == 0 || h->rank < 2) st = h->split(h->ctx, s->pairs, 0, h->rank, "sub", &sub);
  if (st == DDP_OK && sub) st = check_sum(s, sub);
  if (st == DDP_OK && strcmp(s->mode, "uneven") == 0)
    st = h->split(h->ctx, s->world, h->rank % 2, h->rank, "again", &again);
  if (st == DDP_OK && again) st = check_sum(s, again);
  return st;
}

static ddp_status groups_begin(ddp_strategy* s) {
  const ddp_host* h = s->host;
  if (strcmp(s->mode, "nested") == 0 || strcmp(s->mode, "uneven") == 0) {
    ddp_status st = nest(s);
    if (st != DDP_OK) return st;
  }
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
  for (size_t i = 0; i < h->param_count(h->ctx) && st == DDP_OK && strcmp(s->mode, "scaled") == 0 && h->rank == 1; ++i) {
    const ddp_param* p = h->param(h->ctx, i);
    const ddp_buffer g = {p->grad, p->numel, DDP_FLOAT32, h->device};
    if (p->trainable) st = h->scale(h->ctx, &g, 1024.0, h->comm_stream(h->ctx));
  }
  if (st == DDP_OK) st = sync_with(s, s->done, h->comm_stream(h->ctx), 1);
  if (st == DDP_OK) *s->steps += 1.0f;  /* (a CPU run's device memory: this plugin runs on the CPU only) */
  return st;
}

static void groups_destroy(ddp_strategy* s) {
  if (!s) return;
  if (s->computed) s->host->event_destroy(s->host->ctx, s->computed);
  if (s->done) s->host->event_destroy(s->host->ctx, s->done);
  s->host->free(s->host->ctx, s->steps);
  free(s->held);
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
    .state = groups_state,
    .held_ranges = groups_held,
    .state_scopes = groups_scopes,
};
