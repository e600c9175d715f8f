/* strategy_units.c — an ABI 1.4 test strategy that records what 1.4 adds:
 * the hook order of the first step with the unit hooks in it, on_train_end,
 * total_steps, and the unit and parameter tables (shape, unit, uses) as the
 * host describes them. World size 1 only: it synchronises nothing, and
 * leaves NULL every hook it has no use for. stats returns
 *   {"hooks": "...", "units": [...], "params": [...], "total_steps": n, "ended": 0|1} */
#include <ddp/plugin.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TEXT 16384

struct ddp_strategy_s {
  const ddp_host* host;
  int step;
  long long total_steps;
  int ended;
  char hooks[TEXT];
};

static void append(char* buf, const char* text) {
  size_t used = strlen(buf);
  snprintf(buf + used, TEXT - used, "%s", text);
}

static ddp_status units_create(const ddp_host* host, const ddp_transport_v1_t* t, ddp_comm* c, ddp_strategy** out) {
  (void)t, (void)c;
  if (host->world_size != 1 || !DDP_HOST_HAS(host, unit)) {
    host->set_error(host->ctx, "the units strategy runs on one rank of an engine of ABI 1.4 or newer");
    return DDP_ERR_UNSUPPORTED;
  }
  *out = calloc(1, sizeof(struct ddp_strategy_s));
  if (!*out) return DDP_ERR_OUT_OF_MEMORY;
  (*out)->host = host;
  return DDP_OK;
}

static ddp_status units_train_begin(ddp_strategy* s) {
  append(s->hooks, "train_begin");
  return DDP_OK;
}

static ddp_status units_step_begin(ddp_strategy* s, const ddp_step_info* info) {
  s->step = (int)info->step;
  s->total_steps = info->total_steps;
  if (s->step == 0) append(s->hooks, " step_begin");
  return DDP_OK;
}

static ddp_status units_grad_ready(ddp_strategy* s, const ddp_param* p) {
  char text[256];
  if (s->step != 0) return DDP_OK;
  snprintf(text, sizeof text, " ready(%s)", p->name);
  append(s->hooks, text);
  return DDP_OK;
}

static ddp_status units_on_unit(ddp_strategy* s, size_t unit, ddp_unit_phase phase) {
  static const char* kPhases[] = {"fwd", "/fwd", "bwd", "/bwd"};
  char text[256];
  if (s->step != 0) return DDP_OK;
  snprintf(text, sizeof text, " %s(%s)", kPhases[phase], s->host->unit(s->host->ctx, unit)->name);
  append(s->hooks, text);
  return DDP_OK;
}

static ddp_status units_finish(ddp_strategy* s) {
  if (s->step == 0) append(s->hooks, " finish");
  return DDP_OK;
}

static ddp_status units_train_end(ddp_strategy* s) {
  s->ended += 1;
  return DDP_OK;
}

static void list(char* buf, const size_t* indices, size_t count) {
  size_t i;
  char text[32];
  append(buf, "[");
  for (i = 0; i < count; ++i) {
    snprintf(text, sizeof text, "%s%zu", i ? ", " : "", indices[i]);
    append(buf, text);
  }
  append(buf, "]");
}

static ddp_status units_stats(ddp_strategy* s, char* buf, size_t cap, size_t* needed) {
  static char text[TEXT];
  char one[256];
  size_t i, d;
  const ddp_host* h = s->host;
  text[0] = '\0';
  append(text, "{\"hooks\": \"");
  append(text, s->hooks);
  snprintf(one, sizeof one, "\", \"total_steps\": %lld, \"ended\": %d, \"units\": [", s->total_steps, s->ended);
  append(text, one);
  for (i = 0; i < h->unit_count(h->ctx); ++i) {
    const ddp_unit* u = h->unit(h->ctx, i);
    snprintf(one, sizeof one, "%s{\"name\": \"%s\", \"index\": %zu, \"params\": ", i ? ", " : "", u->name, u->index);
    append(text, one);
    list(text, u->params, u->param_count);
    append(text, ", \"tied\": ");
    list(text, u->tied, u->tied_count);
    append(text, "}");
  }
  append(text, "], \"params\": [");
  for (i = 0; i < h->param_count(h->ctx); ++i) {
    const ddp_param* p = h->param(h->ctx, i);
    snprintf(one, sizeof one, "%s{\"name\": \"%s\", \"unit\": %zu, \"uses\": %d, \"shape\": [", i ? ", " : "", p->name,
             p->unit, (int)p->uses);
    append(text, one);
    for (d = 0; d < p->ndim; ++d) {
      snprintf(one, sizeof one, "%s%lld", d ? ", " : "", (long long)p->shape[d]);
      append(text, one);
    }
    append(text, "]}");
  }
  append(text, "]}");
  *needed = strlen(text);
  if (*needed < cap) memcpy(buf, text, *needed + 1);
  return DDP_OK;
}

static void units_destroy(ddp_strategy* s) { free(s); }

DDP_STRATEGY_ENTRY = {
    .abi_version = DDP_ABI_VERSION,
    .struct_size = sizeof(ddp_strategy_v1_t),
    .name = "units",
    .version = "0.1.0",
    .caps = DDP_CAP_DEVICE_CPU,
    .create = units_create,
    .on_train_begin = units_train_begin,
    .on_step_begin = units_step_begin,
    .on_grad_ready = units_grad_ready,
    .on_backward_end = NULL, /* optional since 1.4 */
    .finish = units_finish,
    .stats = units_stats,
    .destroy = units_destroy,
    .keys = NULL,
    .on_unit = units_on_unit,
    .on_train_end = units_train_end,
};
