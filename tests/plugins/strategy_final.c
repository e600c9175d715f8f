/* strategy_final.c — an ABI 1.10 test strategy that says gradients final
 * (ddp_host::grads_final) for the engine's optimizer step, one way per value
 * of its key `what`:
 *   "each"     in on_backward_end, each trainable parameter a group of its
 *              own, in reverse order, final at once (NULL event): training
 *              as without it (the engine steps each once);
 *   "half"     in finish, every other trainable parameter, as one group
 *              final once an event recorded on the comm stream has fired:
 *              the engine steps the others after (training as without it);
 *   "early"    in on_train_begin (outside the sync micro-batch);
 *   "frozen"   in finish, every parameter, frozen ones too;
 *   "twice"    in finish, the first trainable parameter, then it again.
 * One rank only: it synchronises nothing. */
#include <ddp/plugin.h>

#include <stdlib.h>
#include <string.h>

struct ddp_strategy_s {
  const ddp_host* host;
  const char* what;
  ddp_event done;
};

static int is(const struct ddp_strategy_s* s, const char* what) { return strcmp(s->what, what) == 0; }

/* The trainable parameters' indices (every other one with `stride` 2; the
 * frozen ones too with `frozen_too`) into `out`, at most 64. */
static size_t pick(const ddp_host* h, size_t stride, int frozen_too, size_t* out) {
  size_t count = 0, seen = 0, i;
  for (i = 0; i < h->param_count(h->ctx) && count < 64; ++i) {
    if (!frozen_too && !h->param(h->ctx, i)->trainable) continue;
    if (seen++ % stride == 0) out[count++] = i;
  }
  return count;
}

static ddp_status final_create(const ddp_host* host, const ddp_transport_v1_t* t, ddp_comm* c, ddp_strategy** out) {
  struct ddp_strategy_s* s;
  ddp_status status;
  (void)t;
  (void)c;
  if (host->world_size != 1) {
    host->set_error(host->ctx, "the final strategy runs on one rank only");
    return DDP_ERR_UNSUPPORTED;
  }
  s = calloc(1, sizeof *s);
  if (!s) return DDP_ERR_OUT_OF_MEMORY;
  s->host = host;
  status = host->config_string(host->ctx, "what", "each", &s->what);
  if (status == DDP_OK) status = host->event_create(host->ctx, &s->done);
  if (status != DDP_OK) {
    free(s);
    return status;
  }
  *out = s;
  return DDP_OK;
}

static ddp_status final_train_begin(ddp_strategy* s) {
  size_t first = 0;
  if (is(s, "early")) return s->host->grads_final(s->host->ctx, NULL, &first, 1);
  return DDP_OK;
}

static ddp_status final_backward_end(ddp_strategy* s) {
  size_t indices[64], count, k;
  ddp_status status = DDP_OK;
  if (!is(s, "each")) return DDP_OK;
  count = pick(s->host, 1, 0, indices);
  for (k = count; k-- > 0 && status == DDP_OK;) status = s->host->grads_final(s->host->ctx, NULL, &indices[k], 1);
  return status;
}

static ddp_status final_finish(ddp_strategy* s) {
  const ddp_host* h = s->host;
  size_t indices[64], count;
  ddp_status status;
  if (is(s, "half")) {
    status = h->event_record(h->ctx, s->done, h->comm_stream(h->ctx));
    count = pick(h, 2, 0, indices);
    return status != DDP_OK ? status : h->grads_final(h->ctx, s->done, indices, count);
  }
  if (is(s, "frozen")) {
    count = pick(h, 1, 1, indices);
    return h->grads_final(h->ctx, NULL, indices, count);
  }
  if (is(s, "twice")) {
    if (pick(h, 1, 0, indices) == 0) return DDP_OK;
    status = h->grads_final(h->ctx, NULL, indices, 1);
    return status != DDP_OK ? status : h->grads_final(h->ctx, NULL, indices, 1);
  }
  return DDP_OK;
}

static void final_destroy(ddp_strategy* s) {
  s->host->event_destroy(s->host->ctx, s->done);
  free(s);
}

static const ddp_key kKeys[] = {{"what", "string", "the way it says gradients final"}, {NULL, NULL, NULL}};

DDP_STRATEGY_ENTRY = {
    .abi_version = DDP_ABI_VERSION,
    .struct_size = sizeof(ddp_strategy_v1_t),
    .name = "final",
    .version = "0.1.0",
    .caps = DDP_CAP_DEVICE_CPU,
    .create = final_create,
    .on_train_begin = final_train_begin,
    .on_backward_end = final_backward_end,
    .finish = final_finish,
    .destroy = final_destroy,
    .keys = kKeys,
};
