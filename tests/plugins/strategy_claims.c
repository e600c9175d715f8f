/* strategy_claims.c — an ABI 1.4 test strategy that misuses claimed
 * gradient storage on purpose, one way per value of its key `what`:
 *   "frozen"   claims every parameter in create, frozen ones too;
 *   "late"     claims the trainable ones in on_unit (too late: backward);
 *   "unbound"  claims the trainable ones in create and binds nothing;
 *   "storage"  claims DDP_STORAGE_DATA (not offered in 1.4).
 * Built three times: libddp_strategy_claims.so with DDP_CAP_OWNS_GRADIENTS
 * (and DDP_CAP_OWNS_OPTIMIZER, which goes with it), _nocap (-DNOCAP)
 * without it, _noopt (-DNOOPT) with it but without DDP_CAP_OWNS_OPTIMIZER,
 * which the loader refuses. One rank only. */
#include <ddp/plugin.h>

#include <stdlib.h>
#include <string.h>

struct ddp_strategy_s {
  const ddp_host* host;
  const char* what;
};

static ddp_status claim_all(const ddp_host* h, ddp_storage storage, int frozen_too) {
  size_t indices[64], count = 0, i;
  for (i = 0; i < h->param_count(h->ctx) && count < 64; ++i)
    if (frozen_too || h->param(h->ctx, i)->trainable) indices[count++] = i;
  return h->claim(h->ctx, storage, indices, count);
}

static ddp_status claims_create(const ddp_host* host, const ddp_transport_v1_t* t, ddp_comm* c, ddp_strategy** out) {
  struct ddp_strategy_s* s;
  ddp_status status;
  (void)t, (void)c;
  s = calloc(1, sizeof *s);
  if (!s) return DDP_ERR_OUT_OF_MEMORY;
  s->host = host;
  status = host->config_string(host->ctx, "what", "frozen", &s->what);
  if (status == DDP_OK && strcmp(s->what, "frozen") == 0) status = claim_all(host, DDP_STORAGE_GRAD, 1);
  if (status == DDP_OK && strcmp(s->what, "unbound") == 0) status = claim_all(host, DDP_STORAGE_GRAD, 0);
  if (status == DDP_OK && strcmp(s->what, "storage") == 0) status = claim_all(host, DDP_STORAGE_DATA, 0);
  if (status != DDP_OK) {
    free(s);
    return status;
  }
  *out = s;
  return DDP_OK;
}

static ddp_status claims_train_begin(ddp_strategy* s) {
  (void)s;
  return DDP_OK;
}

static ddp_status claims_on_unit(ddp_strategy* s, size_t unit, ddp_unit_phase phase) {
  (void)unit;
  if (strcmp(s->what, "late") == 0 && phase == DDP_UNIT_BACKWARD_BEGIN) return claim_all(s->host, DDP_STORAGE_GRAD, 0);
  return DDP_OK;
}

static ddp_status claims_finish(ddp_strategy* s) {
  (void)s;
  return DDP_OK;
}

static ddp_status claims_grad_ranges(ddp_strategy* s, const ddp_range** ranges, size_t* count, int* partitioned) {
  (void)s;
  *ranges = NULL, *count = 0, *partitioned = 0;
  return DDP_OK;
}

#if !defined(NOCAP) && !defined(NOOPT)
static ddp_status claims_optimizer_step(ddp_strategy* s) {
  (void)s;
  return DDP_OK;
}
#endif

static void claims_destroy(ddp_strategy* s) { free(s); }

static const ddp_key kKeys[] = {{"what", "string", "the misuse"}, {NULL, NULL, NULL}};

DDP_STRATEGY_ENTRY = {
    .abi_version = DDP_ABI_VERSION,
    .struct_size = sizeof(ddp_strategy_v1_t),
#if defined(NOCAP)
    .name = "claims_nocap",
    .caps = DDP_CAP_DEVICE_CPU,
#elif defined(NOOPT)
    .name = "claims_noopt",
    .caps = DDP_CAP_DEVICE_CPU | DDP_CAP_OWNS_GRADIENTS,
#else
    .name = "claims",
    .caps = DDP_CAP_DEVICE_CPU | DDP_CAP_OWNS_GRADIENTS | DDP_CAP_OWNS_OPTIMIZER,
    .optimizer_step = claims_optimizer_step,
#endif
    .version = "0.1.0",
    .create = claims_create,
    .on_train_begin = claims_train_begin,
    .finish = claims_finish,
    .destroy = claims_destroy,
    .keys = kKeys,
    .on_unit = claims_on_unit,
    .grad_ranges = claims_grad_ranges,
};
