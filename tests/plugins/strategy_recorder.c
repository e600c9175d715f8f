/* strategy_recorder.c — a test strategy that records the engine's hook calls
 * of the first step, and for each on_grad_ready the sum of the gradient at
 * that moment, next to the sum at finish: a gradient reported ready before
 * its last use (a tied weight fired early) shows up as two different sums.
 * World size 1 only: it synchronises nothing. stats returns
 *   {"hooks": "<calls, space separated>", "ready_sums": {...}, "finish_sums": {...}} */
#include <ddp/plugin.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ddp_strategy_s {
  const ddp_host* host;
  int step;
  char hooks[4096];
  char ready[4096];
  char final_sums[4096];
};

static void append(char* buf, const char* text) {
  size_t used = strlen(buf);
  snprintf(buf + used, 4096 - used, "%s", text);
}

static double grad_sum(const ddp_param* p) {
  const float* g = (const float*)p->grad;
  double s = 0;
  for (size_t i = 0; i < p->numel; ++i) s += g[i];
  return s;
}

static ddp_status rec_create(const ddp_host* host, const ddp_transport_v1_t* t, ddp_comm* c,
                             ddp_strategy** out) {
  (void)t, (void)c;
  if (host->world_size != 1) {
    host->set_error(host->ctx, "the recorder strategy runs on one rank only");
    return DDP_ERR_UNSUPPORTED;
  }
  *out = calloc(1, sizeof(struct ddp_strategy_s));
  if (!*out) return DDP_ERR_OUT_OF_MEMORY;
  (*out)->host = host;
  return DDP_OK;
}

static ddp_status rec_train_begin(ddp_strategy* s) {
  append(s->hooks, "train_begin");
  return DDP_OK;
}

static ddp_status rec_step_begin(ddp_strategy* s, const ddp_step_info* info) {
  char text[128];
  s->step = (int)info->step;
  if (s->step != 0) return DDP_OK;
  snprintf(text, sizeof text, " step_begin(%d,%d/%d,sync=%d)", (int)info->step, info->micro_step,
           info->micro_steps, info->sync_grads);
  append(s->hooks, text);
  return DDP_OK;
}

static ddp_status rec_grad_ready(ddp_strategy* s, const ddp_param* p) {
  char text[256];
  if (s->step != 0) return DDP_OK;
  snprintf(text, sizeof text, " ready(%s)", p->name);
  append(s->hooks, text);
  snprintf(text, sizeof text, "%s\"%s\": %.9g", s->ready[0] ? ", " : "", p->name, grad_sum(p));
  append(s->ready, text);
  return DDP_OK;
}

static ddp_status rec_backward_end(ddp_strategy* s) {
  if (s->step == 0) append(s->hooks, " backward_end");
  return DDP_OK;
}

static ddp_status rec_finish(ddp_strategy* s) {
  char text[256];
  size_t n, i;
  if (s->step != 0) return DDP_OK;
  append(s->hooks, " finish");
  n = s->host->param_count(s->host->ctx);
  for (i = 0; i < n; ++i) {
    const ddp_param* p = s->host->param(s->host->ctx, i);
    if (!p->trainable) continue;
    snprintf(text, sizeof text, "%s\"%s\": %.9g", s->final_sums[0] ? ", " : "", p->name, grad_sum(p));
    append(s->final_sums, text);
  }
  return DDP_OK;
}

static ddp_status rec_stats(ddp_strategy* s, char* buf, size_t cap, size_t* needed) {
  int n = snprintf(buf, cap, "{\"hooks\": \"%s\", \"ready_sums\": {%s}, \"finish_sums\": {%s}}", s->hooks,
                   s->ready, s->final_sums);
  *needed = (size_t)n + 1;
  return DDP_OK;
}

static void rec_destroy(ddp_strategy* s) { free(s); }

DDP_STRATEGY_ENTRY = {
    DDP_ABI_VERSION, sizeof(ddp_strategy_v1_t), "recorder", "0.1.0", DDP_CAP_DEVICE_CPU,
    rec_create,      rec_train_begin,           rec_step_begin, rec_grad_ready, rec_backward_end,
    rec_finish,      NULL,                      rec_stats,      rec_destroy,    NULL /* held_grads */,
    NULL /* keys: not declared, checked as the plugin reads them */};
