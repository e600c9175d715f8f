/* A strategy that misbehaves on purpose, for the launcher's fault tests.
 * Keys: `fault` — "segv" (writes through a null pointer), "exit0" and
 * "exit3" (exit the process with code 0 or 3), "hang" (never returns),
 * "stuck_stream" (puts a host function that never returns on the
 * communication stream, and returns); `entry` — the entry it
 * misbehaves in ("on_step_begin", "on_grad_ready", "on_backward_end",
 * "finish"); `step` — at which optimizer step (from 0); `rank` — on which
 * rank (-1: every rank); "mismatch": from `step` on, every rank
 * all-reduces each gradient as it becomes ready, but `rank` one element
 * short (for run.debug_collectives). Otherwise it does nothing: no
 * collective at all, so the replicas drift apart (for the replica check). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stubs.h"

struct ddp_strategy_s {
  const ddp_host* host;
  const ddp_transport_v1_t* transport;
  ddp_comm* comm;
  const char* fault;
  const char* entry;
  int64_t step, rank, now;
  int my_rank;
};

static ddp_status faulty_create(const ddp_host* host, const ddp_transport_v1_t* t, ddp_comm* comm,
                                ddp_strategy** out) {
  struct ddp_strategy_s* s = calloc(1, sizeof *s);
  if (!s) return DDP_ERR_OUT_OF_MEMORY;
  s->host = host, s->transport = t, s->comm = comm;
  s->my_rank = host->rank;
  s->now = -1;
  if (host->config_string(host->ctx, "fault", "none", &s->fault) != DDP_OK ||
      host->config_string(host->ctx, "entry", "finish", &s->entry) != DDP_OK ||
      host->config_int(host->ctx, "step", 0, &s->step) != DDP_OK ||
      host->config_int(host->ctx, "rank", -1, &s->rank) != DDP_OK) {
    free(s);
    return DDP_ERR_INVALID_ARGUMENT;
  }
  *out = s;
  return DDP_OK;
}

static ddp_status never_returns(void* user, int cancelled) {
  (void)user, (void)cancelled;
  for (;;) pause();
  return DDP_OK;
}

static void maybe_fault(struct ddp_strategy_s* s, const char* entry) {
  if (strcmp(s->entry, entry) != 0 || s->now != s->step || (s->rank >= 0 && s->rank != s->my_rank)) return;
  if (strcmp(s->fault, "segv") == 0) {
    volatile int* nowhere = NULL;
    *nowhere = 1;
  } else if (strcmp(s->fault, "exit0") == 0) {
    exit(0);
  } else if (strcmp(s->fault, "exit3") == 0) {
    exit(3);
  } else if (strcmp(s->fault, "hang") == 0) {
    for (;;) pause();
  } else if (strcmp(s->fault, "stuck_stream") == 0) {
    s->host->launch_host_func(s->host->ctx, s->host->comm_stream(s->host->ctx), never_returns, NULL);
  }
}

static ddp_status faulty_step_begin(ddp_strategy* s, const ddp_step_info* info) {
  s->now = info->step;
  maybe_fault(s, "on_step_begin");
  return DDP_OK;
}
static ddp_status faulty_grad_ready(ddp_strategy* s, const ddp_param* p) {
  maybe_fault(s, "on_grad_ready");
  if (strcmp(s->fault, "mismatch") != 0 || s->now < s->step) return DDP_OK;
  const int short_one = s->rank < 0 || s->rank == s->my_rank;
  const ddp_buffer buf = {p->grad, p->numel - (size_t)short_one, p->dtype, s->host->device};
  return s->transport->all_reduce(s->comm, &buf, DDP_REDUCE_AVG, s->host->comm_stream(s->host->ctx));
}
static ddp_status faulty_backward_end(ddp_strategy* s) {
  maybe_fault(s, "on_backward_end");
  return DDP_OK;
}
static ddp_status faulty_finish(ddp_strategy* s) {
  maybe_fault(s, "finish");
  return DDP_OK;
}
static void faulty_destroy(ddp_strategy* s) { free(s); }

DDP_STRATEGY_ENTRY = {
    STUB_STRATEGY_FIELDS,
    .name = "faulty",
    .create = faulty_create,
    .on_step_begin = faulty_step_begin,
    .on_grad_ready = faulty_grad_ready,
    .on_backward_end = faulty_backward_end,
    .finish = faulty_finish,
    .destroy = faulty_destroy,
};
