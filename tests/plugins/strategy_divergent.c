/* strategy_divergent.c — the two misuses of divergent replicas (ABI 1.8).
 * Built with NOENTRY (divergent_noentry): caps has DDP_CAP_DIVERGENT and no
 * on_step_end, which the loader refuses (nothing would say when the
 * replicas are equal). Built with NOCAP (divergent_nocap): on_step_end says
 * the replicas may differ without the cap, which stops the run after its
 * first step. One rank only: nothing is sent. */
#include "stubs.h"

#ifndef NOENTRY
static ddp_status says_differ(ddp_strategy* s, const ddp_step_info* info, int* synced) {
  (void)s, (void)info;
  *synced = 0;
  return DDP_OK;
}
#endif

DDP_PLUGIN_EXPORT extern const ddp_strategy_v1_t ddp_strategy_v1;
#ifdef NOENTRY
const ddp_strategy_v1_t ddp_strategy_v1 = {STUB_STRATEGY_FIELDS, .name = "divergent_noentry",
                                           .caps = DDP_CAP_DEVICE_CPU | DDP_CAP_DIVERGENT};
#else
const ddp_strategy_v1_t ddp_strategy_v1 = {STUB_STRATEGY_FIELDS, .name = "divergent_nocap",
                                           .on_step_end = says_differ};
#endif
