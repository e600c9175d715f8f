/* hsdp_c.c — an HSDP-style strategy written in C against the installed
 * headers alone (<ddp/plugin.h>), as a plugin author outside the project
 * writes one: the ranks form groups of `shard_size` (color rank /
 * shard_size) and replica groups across them (color rank % shard_size),
 * made with ddp_host::split (ABI 1.9).
 *   finish          each trainable gradient summed within its shard group,
 *                   then across the replica group, then scaled by 1/world
 *                   (a two-level all-reduce);
 *   optimizer_step  within each shard group every trainable parameter has
 *                   one owner (table index modulo shard_size): it steps
 *                   its own (the engine's optimizer keeps state for those
 *                   alone, shared by the replicas of the other groups) and
 *                   broadcasts them within its group;
 *   held_ranges     the owned gradients, each held by world / shard_size
 *                   ranks (one per group): the norm counts each once.
 * Keys: shard_size (default 2, a divisor of the world size); skip_rank
 * and skip_at (tests: rank skip_rank issues no replica all-reduce from its
 * skip_at-th on, from 1, which its replica group then waits for in vain).
 * Built in tree for tests/groups_test.cpp and out of tree by
 * tools/build_example.sh --source tests/kit/hsdp_c. */
#include <ddp/plugin.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ddp_strategy_s {
  const ddp_host* host;
  const ddp_transport_v1_t* t;
  ddp_comm* world;
  ddp_comm* shard;    /* this rank's group of shard_size */
  ddp_comm* replica;  /* the ranks of its place in every group */
  int shard_size, shard_rank, replicas;
  int64_t skip_rank, skip_at, replica_calls;
  int syncing;
  ddp_event computed, done;
  size_t* owned;  /* table indices this rank steps */
  size_t owned_count;
  ddp_held_range* held;
};

static const ddp_key kKeys[] = {
    {"shard_size", "int", "ranks per shard group, a divisor of the world size (default 2)"},
    {"skip_rank", "int", "tests: the rank that leaves out a replica all-reduce (default -1: none)"},
    {"skip_at", "int", "tests: from which of its replica all-reduces on it issues none, from 1 (default 1)"},
    {NULL, NULL, NULL},
};

static ddp_status fail(const ddp_host* h, ddp_status status, const char* message) {
  h->set_error(h->ctx, message);
  return status;
}

/* shard_size from the keys, checked against the world: the worlds this
 * strategy runs on (a plan entry's DDP_ERR_UNSUPPORTED skips the others
 * in ddp-conformance). */
static ddp_status read_shard_size(const ddp_host* h, int64_t* size) {
  ddp_status st = h->config_int(h->ctx, "shard_size", 2, size);
  if (st != DDP_OK) return st;
  if (*size < 1) return fail(h, DDP_ERR_INVALID_ARGUMENT, "strategy.shard_size must be at least 1");
  if (h->world_size % *size != 0 || *size > h->world_size) {
    char why[160];
    snprintf(why, sizeof why, "strategy.shard_size = %lld does not divide a world of %d ranks",
             (long long)*size, h->world_size);
    return fail(h, DDP_ERR_UNSUPPORTED, why);
  }
  return DDP_OK;
}

static ddp_status hsdp_create(const ddp_host* h, const ddp_transport_v1_t* t, ddp_comm* comm, ddp_strategy** out) {
  if (!DDP_HOST_HAS(h, split) || !DDP_HOST_HAS(h, group))
    return fail(h, DDP_ERR_UNSUPPORTED, "hsdp_c makes groups: it needs an engine of ABI 1.9 or newer");
  int64_t size = 0;
  ddp_status st = read_shard_size(h, &size);
  if (st != DDP_OK) return st;
  ddp_strategy* s = calloc(1, sizeof *s);
  if (!s) return fail(h, DDP_ERR_OUT_OF_MEMORY, "out of memory");
  s->host = h, s->t = t, s->world = comm, s->shard_size = (int)size;
  s->replicas = h->world_size / (int)size;
  *out = s;
  if ((st = h->config_int(h->ctx, "skip_rank", -1, &s->skip_rank)) != DDP_OK) return st;
  if ((st = h->config_int(h->ctx, "skip_at", 1, &s->skip_at)) != DDP_OK) return st;
  if ((st = h->event_create(h->ctx, &s->computed)) != DDP_OK) return st;
  if ((st = h->event_create(h->ctx, &s->done)) != DDP_OK) return st;
  /* Collective over the world: every rank makes both, in this order. */
  st = h->split(h->ctx, comm, h->rank / s->shard_size, h->rank, "shard", &s->shard);
  if (st == DDP_OK) st = h->split(h->ctx, comm, h->rank % s->shard_size, h->rank, "replicate", &s->replica);
  if (st == DDP_OK) s->shard_rank = h->group(h->ctx, s->shard)->rank;
  return st;
}

/* Makes the comm stream wait for compute; `then` runs there; waited for. */
static ddp_status comm_after_compute(ddp_strategy* s) {
  const ddp_host* h = s->host;
  ddp_status st = h->event_record(h->ctx, s->computed, h->compute_stream(h->ctx));
  return st == DDP_OK ? h->stream_wait_event(h->ctx, h->comm_stream(h->ctx), s->computed) : st;
}
static ddp_status wait_comm(ddp_strategy* s) {
  const ddp_host* h = s->host;
  ddp_status st = h->event_record(h->ctx, s->done, h->comm_stream(h->ctx));
  return st == DDP_OK ? h->event_synchronize(h->ctx, s->done) : st;
}

static ddp_status hsdp_train_begin(ddp_strategy* s) {
  const ddp_host* h = s->host;
  ddp_status st = comm_after_compute(s);
  for (size_t i = 0; i < h->param_count(h->ctx) && st == DDP_OK; ++i) {
    const ddp_param* p = h->param(h->ctx, i);
    const ddp_buffer b = {p->data, p->numel, DDP_FLOAT32, h->device};
    st = s->t->broadcast(s->world, &b, 0, h->comm_stream(h->ctx));
  }
  return st == DDP_OK ? wait_comm(s) : st;
}

static ddp_status hsdp_step_begin(ddp_strategy* s, const ddp_step_info* info) {
  s->syncing = info->sync_grads;
  return DDP_OK;
}

/* The owned parameters (and their held ranges) of the trainable set now. */
static ddp_status own(ddp_strategy* s) {
  const ddp_host* h = s->host;
  const size_t n = h->param_count(h->ctx);
  free(s->owned), free(s->held);
  s->owned = calloc(n ? n : 1, sizeof *s->owned);
  s->held = calloc(n ? n : 1, sizeof *s->held);
  if (!s->owned || !s->held) return fail(h, DDP_ERR_OUT_OF_MEMORY, "out of memory");
  s->owned_count = 0;
  for (size_t i = 0; i < n; ++i) {
    const ddp_param* p = h->param(h->ctx, i);
    if (!p->trainable || (int)(i % (size_t)s->shard_size) != s->shard_rank) continue;
    const ddp_held_range r = {i, 0, p->numel, NULL, s->replicas};
    s->held[s->owned_count] = r;
    s->owned[s->owned_count++] = i;
  }
  return DDP_OK;
}

static ddp_status hsdp_finish(ddp_strategy* s) {
  const ddp_host* h = s->host;
  if (!s->syncing) return DDP_OK;
  const ddp_stream comm = h->comm_stream(h->ctx);
  ddp_status st = comm_after_compute(s);
  for (size_t i = 0; i < h->param_count(h->ctx) && st == DDP_OK; ++i) {
    const ddp_param* p = h->param(h->ctx, i);
    if (!p->trainable) continue;
    const ddp_buffer g = {p->grad, p->numel, DDP_FLOAT32, h->device};
    st = s->t->all_reduce(s->shard, &g, DDP_REDUCE_SUM, comm);
    const int skip = h->rank == s->skip_rank && ++s->replica_calls >= s->skip_at;
    if (st == DDP_OK && !skip) st = s->t->all_reduce(s->replica, &g, DDP_REDUCE_SUM, comm);
    if (st == DDP_OK) st = h->scale(h->ctx, &g, 1.0 / h->world_size, comm);
  }
  if (st == DDP_OK) st = wait_comm(s);
  return st == DDP_OK ? own(s) : st;
}

static ddp_status hsdp_optimizer_step(ddp_strategy* s) {
  const ddp_host* h = s->host;
  ddp_status st = h->run_optimizer(h->ctx, s->owned, s->owned_count);
  if (st == DDP_OK) st = comm_after_compute(s);
  for (size_t i = 0; i < h->param_count(h->ctx) && st == DDP_OK; ++i) {
    const ddp_param* p = h->param(h->ctx, i);
    if (!p->trainable) continue;
    const ddp_buffer b = {p->data, p->numel, DDP_FLOAT32, h->device};
    st = s->t->broadcast(s->shard, &b, (int)(i % (size_t)s->shard_size), h->comm_stream(h->ctx));
  }
  return st == DDP_OK ? wait_comm(s) : st;
}

static ddp_status hsdp_held_ranges(ddp_strategy* s, const ddp_held_range** out, size_t* count) {
  *out = s->held;
  *count = s->owned_count;
  return DDP_OK;
}

static void hsdp_destroy(ddp_strategy* s) {
  if (!s) return;
  if (s->computed) s->host->event_destroy(s->host->ctx, s->computed);
  if (s->done) s->host->event_destroy(s->host->ctx, s->done);
  free(s->owned), free(s->held), free(s);
}

/* `ddp plan`: per trainable parameter a sum in the shard group and one in
 * the replica group, then a broadcast in the shard group; the owned
 * parameters stepped here. */
static ddp_status hsdp_plan(const ddp_host* h, const ddp_transport_v1_t* t, ddp_plan* plan) {
  (void)t;
  int64_t size = 0;
  ddp_status st = read_shard_size(h, &size);
  if (st != DDP_OK) return st;
  if (!DDP_PLAN_HAS(plan, group_collective))
    return fail(h, DDP_ERR_UNSUPPORTED, "hsdp_c plans group collectives: an engine of ABI 1.9 or newer");
  const int shard_rank = h->rank % (int)size;
  for (size_t i = 0; i < h->param_count(h->ctx) && st == DDP_OK; ++i) {
    const ddp_param* p = h->param(h->ctx, i);
    const ddp_plan_collective c = {DDP_OP_ALL_REDUCE, p->numel, DDP_FLOAT32, 0};
    st = plan->group_collective(plan->ctx, &c, (int)size);
    if (st == DDP_OK) st = plan->group_collective(plan->ctx, &c, h->world_size / (int)size);
    if (st == DDP_OK && (int)(i % (size_t)size) == shard_rank) st = plan->steps(plan->ctx, i, 0, p->numel);
  }
  for (size_t i = 0; i < h->param_count(h->ctx) && st == DDP_OK; ++i) {
    const ddp_plan_collective c = {DDP_OP_BROADCAST, h->param(h->ctx, i)->numel, DDP_FLOAT32, 0};
    st = plan->group_collective(plan->ctx, &c, (int)size);
  }
  return st;
}

DDP_STRATEGY_ENTRY = {
    .abi_version = DDP_ABI_VERSION,
    .struct_size = sizeof(ddp_strategy_v1_t),
    .name = "hsdp_c",
    .version = "0.1.0",
    .caps = DDP_CAP_DEVICE_CPU | DDP_CAP_DEVICE_CUDA | DDP_CAP_OWNS_OPTIMIZER,
    .create = hsdp_create,
    .on_train_begin = hsdp_train_begin,
    .on_step_begin = hsdp_step_begin,
    .finish = hsdp_finish,
    .optimizer_step = hsdp_optimizer_step,
    .destroy = hsdp_destroy,
    .keys = kKeys,
    .plan = hsdp_plan,
    .held_ranges = hsdp_held_ranges,
};
