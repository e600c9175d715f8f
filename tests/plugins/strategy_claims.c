/* strategy_claims.c — an ABI 1.4 test strategy that misuses claimed
 * gradient storage on purpose, one way per value of its key `what`:
 *   "frozen"   claims every parameter in create, frozen ones too;
 *   "late"     claims the trainable ones in on_unit (too late: backward);
 *   "unbound"  claims the trainable ones in create and binds nothing;
 *   "storage"  claims DDP_STORAGE_DATA (caps without DDP_CAP_OWNS_PARAMETERS);
 *   "final"    says a gradient final in finish (grads_final, ABI 1.10);
 * and, built as _values (-DVALUES, caps with DDP_CAP_OWNS_PARAMETERS), uses
 * claimed values (ABI 1.5):
 *   "values"   claims every parameter's values in create, copies them into
 *              memory of its own in on_train_begin and binds them there for
 *              the run, steps them through ranges that give their data:
 *              training as without the claim;
 *   "values_per_unit"  the same, bound only from each unit's BEGIN to its
 *              END, and in unit_values (FSDP's pattern, on one rank);
 *   "values_unbound"   the same as "values", binding nothing;
 *   "values_released"  the same, unbinding them all in on_train_end, and
 *              binding nothing in unit_values;
 *   "values_late"      claims values in on_train_begin.
 * Built with TAKES (claims_takes, ABI 1.7), the "values*" ways take the
 * values unit by unit in take_values instead of on_train_begin, and two
 * more: "values_trainable" claims only the trainable parameters' values
 * (the engine makes the others), bound for the whole run; "take_fails"
 * is "values_per_unit" failing in its second unit's take_values.
 * Built five times: libddp_strategy_claims.so with DDP_CAP_OWNS_GRADIENTS
 * (and DDP_CAP_OWNS_OPTIMIZER, which goes with it), _nocap (-DNOCAP)
 * without it, _noopt (-DNOOPT) with it but without DDP_CAP_OWNS_OPTIMIZER,
 * which the loader refuses, _values, and _values_nounit (-DVALUES_NOUNIT:
 * without unit_values, which the loader refuses). One rank only. */
#include <ddp/plugin.h>

#include <stdlib.h>
#include <string.h>

struct ddp_strategy_s {
  const ddp_host* host;
  const char* what;
  void* values[64];      /* "values*": its own copy of each parameter's values */
  ddp_range ranges[64];  /* optimizer_step's */
};

static int is(const struct ddp_strategy_s* s, const char* what) { return strcmp(s->what, what) == 0; }
static int holds_values(const struct ddp_strategy_s* s) { return strncmp(s->what, "values", 6) == 0; }

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
  if (status == DDP_OK && is(s, "values_trainable")) status = claim_all(host, DDP_STORAGE_DATA, 0);
  else if (status == DDP_OK && (holds_values(s) || is(s, "take_fails")) && !is(s, "values_late"))
    status = claim_all(host, DDP_STORAGE_DATA, 1);
  if (status != DDP_OK) {
    free(s);
    return status;
  }
  *out = s;
  return DDP_OK;
}

/* "values": the engine's values (still there in on_train_begin) copied
 * into this strategy's memory, and bound there. */
static ddp_status claims_train_begin(ddp_strategy* s) {
  const ddp_host* h = s->host;
  size_t i;
  ddp_status status = DDP_OK;
  if (is(s, "values_late")) return claim_all(h, DDP_STORAGE_DATA, 1);
  if (!holds_values(s) && !is(s, "take_fails")) return DDP_OK;
  for (i = 0; i < h->param_count(h->ctx) && i < 64 && status == DDP_OK; ++i) {
    const ddp_param* p = h->param(h->ctx, i);
    if (is(s, "values_trainable") && !p->trainable) continue;  /* the engine's */
    status = h->alloc(h->ctx, p->numel * sizeof(float), DDP_MEM_PARAMETERS, &s->values[i]);
#if !defined(TAKES)
    if (status == DDP_OK) status = h->copy(h->ctx, s->values[i], p->data, p->numel * sizeof(float), h->compute_stream(h->ctx));
#endif
    if (status == DDP_OK && (is(s, "values") || is(s, "values_released") || is(s, "values_trainable")))
      status = h->bind(h->ctx, DDP_STORAGE_DATA, i, s->values[i]);  /* (TAKES: before its values come) */
  }
  return status;
}

static ddp_status claims_train_end(ddp_strategy* s) {
  size_t i;
  ddp_status status = DDP_OK;
  if (!is(s, "values_released")) return DDP_OK;
  for (i = 0; i < s->host->param_count(s->host->ctx) && status == DDP_OK; ++i)
    status = s->host->bind(s->host->ctx, DDP_STORAGE_DATA, i, NULL);
  return status;
}

/* Binds (or, with hold 0, unbinds) the values of the parameters `unit`
 * owns, and with `tied` those it reads of other units too. */
static ddp_status bind_unit(ddp_strategy* s, size_t unit, int hold, int tied) {
  const ddp_host* h = s->host;
  const ddp_unit* u = h->unit(h->ctx, unit);
  size_t k;
  ddp_status status = DDP_OK;
  for (k = 0; k < u->param_count && status == DDP_OK; ++k)
    status = h->bind(h->ctx, DDP_STORAGE_DATA, u->params[k], hold ? s->values[u->params[k]] : NULL);
  for (k = 0; tied && k < u->tied_count && status == DDP_OK; ++k)
    status = h->bind(h->ctx, DDP_STORAGE_DATA, u->tied[k], hold ? s->values[u->tied[k]] : NULL);
  return status;
}

static ddp_status claims_on_unit(ddp_strategy* s, size_t unit, ddp_unit_phase phase) {
  if (strcmp(s->what, "late") == 0 && phase == DDP_UNIT_BACKWARD_BEGIN) return claim_all(s->host, DDP_STORAGE_GRAD, 0);
  if (!is(s, "values_per_unit") && !is(s, "take_fails")) return DDP_OK;
  return bind_unit(s, unit, phase == DDP_UNIT_FORWARD_BEGIN || phase == DDP_UNIT_BACKWARD_BEGIN, 1);
}

#if defined(VALUES) || defined(TAKES)
/* "values": bound for the whole run already; "values_released": binds
 * nothing, on purpose. */
static ddp_status claims_unit_values(ddp_strategy* s, size_t unit, int hold) {
  return is(s, "values_per_unit") || is(s, "take_fails") ? bind_unit(s, unit, hold, 0) : DDP_OK;
}
#endif

#if defined(TAKES)
/* The lent values of `unit`'s claimed parameters, copied into this
 * strategy's memory; complete when it returns. */
static ddp_status claims_take_values(ddp_strategy* s, size_t unit) {
  const ddp_host* h = s->host;
  const ddp_unit* u = h->unit(h->ctx, unit);
  ddp_event done;
  size_t k;
  ddp_status status = DDP_OK;
  if (is(s, "take_fails") && unit == 1) {
    h->set_error(h->ctx, "the test strategy fails here on purpose");
    return DDP_ERR_INTERNAL;
  }
  for (k = 0; k < u->param_count && status == DDP_OK; ++k) {
    const ddp_param* p = h->param(h->ctx, u->params[k]);
    if (!s->values[p->index]) continue;
    if (!p->data) {
      h->set_error(h->ctx, "take_values: a claimed parameter of the unit lent has no data");
      return DDP_ERR_INTERNAL;
    }
    status = h->copy(h->ctx, s->values[p->index], p->data, p->numel * sizeof(float), h->compute_stream(h->ctx));
  }
  if (status != DDP_OK) return status;
  status = h->event_create(h->ctx, &done);
  if (status == DDP_OK) status = h->event_record(h->ctx, done, h->compute_stream(h->ctx));
  if (status == DDP_OK) status = h->event_synchronize(h->ctx, done);
  h->event_destroy(h->ctx, done);
  return status;
}
#endif

/* "final": says a gradient final (ABI 1.10), which a strategy that owns
 * the optimizer step may not: it orders its own. */
static ddp_status claims_finish(ddp_strategy* s) {
  size_t first = 0;
  if (is(s, "final")) return s->host->grads_final(s->host->ctx, NULL, &first, 1);
  return DDP_OK;
}

static ddp_status claims_grad_ranges(ddp_strategy* s, const ddp_range** ranges, size_t* count, int* partitioned) {
  (void)s;
  *ranges = NULL, *count = 0, *partitioned = 0;
  return DDP_OK;
}

#if !defined(NOCAP) && !defined(NOOPT)
/* "values": every trainable parameter whole, its data where it is bound. */
static ddp_status claims_optimizer_step(ddp_strategy* s) {
  const ddp_host* h = s->host;
  size_t i, n = 0;
  if (!holds_values(s)) return DDP_OK;
  for (i = 0; i < h->param_count(h->ctx) && i < 64; ++i) {
    const ddp_param* p = h->param(h->ctx, i);
    if (!p->trainable) continue;
    s->ranges[n].param = i, s->ranges[n].offset = 0, s->ranges[n].count = p->numel;
    s->ranges[n].grad = NULL, s->ranges[n].data = s->values[i];
    ++n;
  }
  return h->run_optimizer_ranges(h->ctx, s->ranges, n);
}
#endif

static void claims_destroy(ddp_strategy* s) {
  size_t i;
  for (i = 0; i < 64; ++i) s->host->free(s->host->ctx, s->values[i]);
  free(s);
}

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
#elif defined(VALUES)
    .name = "claims_values",
    .caps = DDP_CAP_DEVICE_CPU | DDP_CAP_OWNS_GRADIENTS | DDP_CAP_OWNS_OPTIMIZER | DDP_CAP_OWNS_PARAMETERS,
    .optimizer_step = claims_optimizer_step,
    .unit_values = claims_unit_values,
#elif defined(TAKES)
    .name = "claims_takes",
    .caps = DDP_CAP_DEVICE_CPU | DDP_CAP_OWNS_GRADIENTS | DDP_CAP_OWNS_OPTIMIZER | DDP_CAP_OWNS_PARAMETERS,
    .optimizer_step = claims_optimizer_step,
    .unit_values = claims_unit_values,
    .take_values = claims_take_values,
#elif defined(VALUES_NOUNIT)
    .name = "claims_values_nounit",
    .caps = DDP_CAP_DEVICE_CPU | DDP_CAP_OWNS_GRADIENTS | DDP_CAP_OWNS_OPTIMIZER | DDP_CAP_OWNS_PARAMETERS,
    .optimizer_step = claims_optimizer_step,
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
    .on_train_end = claims_train_end,
    .grad_ranges = claims_grad_ranges,
};
