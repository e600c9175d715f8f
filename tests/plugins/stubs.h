/* stubs.h — do-nothing entries shared by the loader's test plugins, and
 * descriptor initialisers that the broken plugins then spoil one field of. */
#ifndef DDP_TEST_PLUGIN_STUBS_H
#define DDP_TEST_PLUGIN_STUBS_H

#include <ddp/plugin.h>

static inline ddp_status stub_init(const ddp_host* host, ddp_comm** out) {
  (void)host;
  *out = NULL;
  return DDP_OK;
}
static inline void stub_comm_destroy(ddp_comm* comm) { (void)comm; }
static inline ddp_status stub_all_reduce(ddp_comm* c, const ddp_buffer* b, ddp_reduce_op op,
                                         ddp_stream s) {
  (void)c, (void)b, (void)op, (void)s;
  return DDP_OK;
}
static inline ddp_status stub_broadcast(ddp_comm* c, const ddp_buffer* b, int root, ddp_stream s) {
  (void)c, (void)b, (void)root, (void)s;
  return DDP_OK;
}
static inline ddp_status stub_all_gather(ddp_comm* c, const ddp_buffer* send, const ddp_buffer* recv,
                                         ddp_stream s) {
  (void)c, (void)send, (void)recv, (void)s;
  return DDP_OK;
}
static inline ddp_status stub_reduce_scatter(ddp_comm* c, const ddp_buffer* send, const ddp_buffer* recv,
                                             ddp_reduce_op op, ddp_stream s) {
  (void)c, (void)send, (void)recv, (void)op, (void)s;
  return DDP_OK;
}
static inline ddp_status stub_barrier(ddp_comm* c, ddp_stream s) {
  (void)c, (void)s;
  return DDP_OK;
}

static inline ddp_status stub_create(const ddp_host* host, const ddp_transport_v1_t* t,
                                     ddp_comm* comm, ddp_strategy** out) {
  (void)host, (void)t, (void)comm;
  *out = NULL;
  return DDP_OK;
}
static inline ddp_status stub_hook(ddp_strategy* s) {
  (void)s;
  return DDP_OK;
}
static inline ddp_status stub_step_begin(ddp_strategy* s, const ddp_step_info* info) {
  (void)s, (void)info;
  return DDP_OK;
}
static inline ddp_status stub_grad_ready(ddp_strategy* s, const ddp_param* p) {
  (void)s, (void)p;
  return DDP_OK;
}
static inline void stub_strategy_destroy(ddp_strategy* s) { (void)s; }

/* A complete transport descriptor; list overrides after it. */
#define STUB_TRANSPORT_FIELDS                                                       \
  .abi_version = DDP_ABI_VERSION, .struct_size = sizeof(ddp_transport_v1_t),        \
  .name = "stub", .version = "0.0.1", .caps = DDP_CAP_DEVICE_CPU, .init = stub_init, \
  .destroy = stub_comm_destroy, .all_reduce = stub_all_reduce,                      \
  .broadcast = stub_broadcast, .all_gather = stub_all_gather,                       \
  .reduce_scatter = stub_reduce_scatter, .barrier = stub_barrier

/* A complete strategy descriptor without the optional entries. */
#define STUB_STRATEGY_FIELDS                                                         \
  .abi_version = DDP_ABI_VERSION, .struct_size = sizeof(ddp_strategy_v1_t),          \
  .name = "stub", .version = "0.0.1", .caps = DDP_CAP_DEVICE_CPU, .create = stub_create, \
  .on_train_begin = stub_hook, .on_step_begin = stub_step_begin,                     \
  .on_grad_ready = stub_grad_ready, .on_backward_end = stub_hook, .finish = stub_hook, \
  .optimizer_step = NULL, .stats = NULL, .destroy = stub_strategy_destroy

#endif /* DDP_TEST_PLUGIN_STUBS_H */
