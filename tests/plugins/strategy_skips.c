/* strategy_skips.c — a test strategy of ABI 1.12 that records, in each
 * step's on_step_end, what ddp_host::step_skipped says (loss scaling's
 * skipped update) and the step's ddp_step_info::loss_scale, and what
 * ddp_host::precision says of the run. World size 1 only: it synchronises
 * nothing. stats returns
 *   {"skipped": "<0 or 1 per step, space separated>", "scales": "<each
 *    step's loss_scale, %g, space separated>", "loss_scaled": 0 or 1} */
#include <ddp/plugin.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ddp_strategy_s {
  const ddp_host* host;
  char skipped[4096];
  char scales[4096];
};

static ddp_status skips_create(const ddp_host* host, const ddp_transport_v1_t* t, ddp_comm* c, ddp_strategy** out) {
  (void)t, (void)c;
  if (host->world_size != 1) {
    host->set_error(host->ctx, "the skips strategy runs on one rank only");
    return DDP_ERR_UNSUPPORTED;
  }
  *out = calloc(1, sizeof(struct ddp_strategy_s));
  if (!*out) return DDP_ERR_OUT_OF_MEMORY;
  (*out)->host = host;
  return DDP_OK;
}

static ddp_status skips_nothing(ddp_strategy* s) {
  (void)s;
  return DDP_OK;
}

static ddp_status skips_step_end(ddp_strategy* s, const ddp_step_info* info, int* synced) {
  size_t used = strlen(s->skipped);
  snprintf(s->skipped + used, sizeof s->skipped - used, "%s%d", used ? " " : "",
           s->host->step_skipped(s->host->ctx));
  used = strlen(s->scales);
  snprintf(s->scales + used, sizeof s->scales - used, "%s%g", used ? " " : "", info->loss_scale);
  *synced = 1;
  return DDP_OK;
}

static ddp_status skips_stats(ddp_strategy* s, char* buf, size_t cap, size_t* needed) {
  const int n = snprintf(buf, cap, "{\"skipped\": \"%s\", \"scales\": \"%s\", \"loss_scaled\": %d}",
                         s->skipped, s->scales, (int)s->host->precision(s->host->ctx)->loss_scaled);
  *needed = (size_t)n + 1;
  return DDP_OK;
}

static void skips_destroy(ddp_strategy* s) { free(s); }

DDP_STRATEGY_ENTRY = {
    .abi_version = DDP_ABI_VERSION,
    .struct_size = sizeof(ddp_strategy_v1_t),
    .name = "skips",
    .version = "0.1.0",
    .caps = DDP_CAP_DEVICE_CPU,
    .create = skips_create,
    .on_train_begin = skips_nothing,
    .finish = skips_nothing,
    .stats = skips_stats,
    .destroy = skips_destroy,
    .on_step_end = skips_step_end,
};
