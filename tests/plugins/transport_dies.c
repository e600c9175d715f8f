/* transport_dies.c — the gloo transport with one fault, for the tests of a
 * collective whose peer died: rank `die_rank` (a key of its table) kills
 * itself as it enqueues its `die_at`-th all-gather, counted
 * from 1 after init; every other call goes to the real gloo plugin (its
 * path built in: DDP_TEST_GLOO_PLUGIN), so the survivors meet a real
 * connection reset. With `die_signal` = SIGSTOP (19) instead of SIGKILL
 * (9, the default) the rank hangs, alive: the survivors time out. The
 * counts are of calls on every communicator, the world's and the groups'
 * (split goes to gloo's too). Not a mock: the fault is the only thing it
 * adds. */
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include <ddp/plugin.h>

static const ddp_transport_v1_t* gloo;
static int64_t die_rank = -1, die_at = -1, die_signal = SIGKILL, gathers = 0;
static int64_t drop_rank = -1, drop_at = -1, reduces = 0;
static void* dropped; /* the zeros its dropped all-reduce wrote */
static int my_rank = -1;

static ddp_status fail(const ddp_host* host, const char* message) {
  host->set_error(host->ctx, message);
  return DDP_ERR_INTERNAL;
}

static ddp_status dies_init(const ddp_host* host, ddp_comm** out) {
  if (!gloo) {
    void* lib = dlopen(DDP_TEST_GLOO_PLUGIN, RTLD_NOW | RTLD_LOCAL);
    gloo = lib ? (const ddp_transport_v1_t*)dlsym(lib, "ddp_transport_v1") : NULL;
    if (!gloo) return fail(host, "transport_dies: cannot load " DDP_TEST_GLOO_PLUGIN);
  }
  ddp_status s = host->config_int(host->ctx, "die_rank", -1, &die_rank);
  if (s == DDP_OK) s = host->config_int(host->ctx, "die_at", -1, &die_at);
  if (s == DDP_OK) s = host->config_int(host->ctx, "die_signal", SIGKILL, &die_signal);
  if (s == DDP_OK) s = host->config_int(host->ctx, "drop_rank", -1, &drop_rank);
  if (s == DDP_OK) s = host->config_int(host->ctx, "drop_at", -1, &drop_at);
  if (s != DDP_OK) return s;
  my_rank = host->rank;
  return gloo->init(host, out);
}

static void dies_destroy(ddp_comm* comm) {
  gloo->destroy(comm);
  free(dropped);
  dropped = NULL;
}
static ddp_status dies_all_reduce(ddp_comm* c, const ddp_buffer* b, ddp_reduce_op op, ddp_stream s) {
  if (my_rank == drop_rank && ++reduces == drop_at && b->device == DDP_DEVICE_CPU) {
    ddp_buffer zeros = *b;
    zeros.ptr = dropped = calloc(b->count ? b->count : 1, ddp_dtype_size(b->dtype));
    return gloo->all_reduce(c, &zeros, op, s);
  }
  return gloo->all_reduce(c, b, op, s);
}
static ddp_status dies_broadcast(ddp_comm* c, const ddp_buffer* b, int root, ddp_stream s) {
  return gloo->broadcast(c, b, root, s);
}
static ddp_status dies_all_gather(ddp_comm* c, const ddp_buffer* send, const ddp_buffer* recv, ddp_stream s) {
  if (my_rank == die_rank && ++gathers == die_at) raise((int)die_signal);
  return gloo->all_gather(c, send, recv, s);
}
static ddp_status dies_reduce_scatter(ddp_comm* c, const ddp_buffer* send, const ddp_buffer* recv, ddp_reduce_op op,
                                      ddp_stream s) {
  return gloo->reduce_scatter(c, send, recv, op, s);
}
static ddp_status dies_barrier(ddp_comm* c, ddp_stream s) { return gloo->barrier(c, s); }
static ddp_status dies_split(ddp_comm* parent, const ddp_split* how, ddp_comm** out) {
  return gloo->split(parent, how, out); /* gloo has split: it is built from this tree */
}
static void dies_abort(ddp_comm* c) {
  if (gloo->abort) gloo->abort(c);
}

DDP_TRANSPORT_ENTRY = {
    .abi_version = DDP_ABI_VERSION,
    .struct_size = sizeof(ddp_transport_v1_t),
    .name = "dies",
    .version = "0.1.0",
    .caps = DDP_CAP_DEVICE_CPU,
    .init = dies_init,
    .destroy = dies_destroy,
    .all_reduce = dies_all_reduce,
    .broadcast = dies_broadcast,
    .all_gather = dies_all_gather,
    .reduce_scatter = dies_reduce_scatter,
    .barrier = dies_barrier,
    .abort = dies_abort,
    .dtypes = DDP_DTYPE_BIT(DDP_FLOAT32) | DDP_DTYPE_BIT(DDP_BFLOAT16) | DDP_DTYPE_BIT(DDP_FLOAT16),
    /* keys: not declared; plan: none */
    .split = dies_split,
};
