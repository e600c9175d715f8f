/* ddp/abi/transport.h — part of ddp/plugin.h: the transport descriptor,
 * ddp_transport_v1, which moves bytes between ranks. C99, compiles alone;
 * include ddp/plugin.h rather than this part.
 *
 * Every collective is enqueued on `stream` and returns at once; its buffers
 * must stay valid until an event recorded after it completes. A failed
 * collective fails its stream (and every event recorded there after it);
 * the status returned at enqueue time covers only what can be checked then
 * (a bad buffer, an unsupported dtype). All ranks must issue the same
 * collectives in the same order with the same counts: the engine and the
 * strategies keep that order, a transport may rely on it. */
#ifndef DDP_ABI_TRANSPORT_H
#define DDP_ABI_TRANSPORT_H

#include "host.h"
#include "plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ddp_transport_v1_t {
  uint32_t abi_version; /* DDP_ABI_VERSION the plugin was built with */
  uint32_t struct_size; /* sizeof(ddp_transport_v1_t) */
  const char* name;     /* "gloo" */
  const char* version;  /* the plugin's own version, e.g. "0.1.0" */
  uint64_t caps;        /* DDP_CAP_DEVICE_* */

  /* Connects to all ranks through host's store (blocking, up to timeout_ms)
   * and returns a communicator. Reads all its TOML keys here. */
  ddp_status (*init)(const ddp_host* host, ddp_comm** out);
  /* Releases the communicator. The host has synchronised all streams first,
   * or called abort. */
  void (*destroy)(ddp_comm* comm);

  /* In place: buf holds the reduction of every rank's buf. */
  ddp_status (*all_reduce)(ddp_comm* comm, const ddp_buffer* buf, ddp_reduce_op op, ddp_stream stream);
  /* In place: every rank's buf becomes root's. */
  ddp_status (*broadcast)(ddp_comm* comm, const ddp_buffer* buf, int root, ddp_stream stream);
  /* recv.count == send.count * world_size; rank r's send lands at
   * recv[r * send.count]. send is not modified. */
  ddp_status (*all_gather)(ddp_comm* comm, const ddp_buffer* send, const ddp_buffer* recv, ddp_stream stream);
  /* send.count == recv.count * world_size; rank r receives the reduction
   * of every rank's send[r * recv.count, (r + 1) * recv.count). send is not
   * modified. Optional since 1.4: NULL means the transport has none, and a
   * strategy that needs one refuses at create, naming the transport. */
  ddp_status (*reduce_scatter)(ddp_comm* comm, const ddp_buffer* send, const ddp_buffer* recv, ddp_reduce_op op,
                               ddp_stream stream);
  /* Completes on each rank once every rank has reached it. */
  ddp_status (*barrier)(ddp_comm* comm, ddp_stream stream);
  /* (optional) Makes pending and future collectives of comm fail soon
   * (ncclCommAbort). Any thread; the engine calls it when it gives up on a
   * stuck collective, then destroy. */
  void (*abort)(ddp_comm* comm);
  /* (ABI 1.3) DDP_DTYPE_BIT of each dtype that all_reduce, all_gather and
   * reduce_scatter take; any other fails with DDP_ERR_UNSUPPORTED. Read it
   * with ddp_transport_dtypes(). */
  uint64_t dtypes;
  const ddp_key* keys; /* (ABI 1.3) its TOML keys; {NULL}: none; NULL: not declared */

  /* (ABI 1.4, optional) `ddp plan`: the transport's own buffers
   * (out->buffer) for the step's collectives (out->collectives), on the
   * rank and world of `host`, a planning host (ddp/abi/host.h). Called
   * before any rank starts, without init; reads its keys as init does.
   * NULL: its buffers are not planned, and `ddp plan` says so. */
  ddp_status (*plan)(const ddp_host* host, ddp_plan* out);

  /* (ABI 1.9, optional) The communicator of a group (ddp_split): the ranks
   * of `parent` that passed how->color, where this rank is how->rank of
   * how->size. Blocking and collective over parent: the engine calls it on
   * every rank of parent at the same point (a strategy's ddp_host::split),
   * with no collective of parent in flight. Every entry on the result
   * works within the group, on its ranks and size (all_gather's and
   * reduce_scatter's counts, broadcast's root, AVG's divisor); it keeps the
   * parent's keys and timeout. destroy releases it, before its parent.
   * NULL: the transport makes no groups, and ddp_host::split refuses by
   * name. */
  ddp_status (*split)(ddp_comm* parent, const ddp_split* how, ddp_comm** out);
} ddp_transport_v1_t;

/* The dtypes `t` takes: float32 alone where it declares none (before 1.3). */
static inline uint64_t ddp_transport_dtypes(const ddp_transport_v1_t* t) {
  if (t->struct_size < offsetof(ddp_transport_v1_t, dtypes) + sizeof t->dtypes || !t->dtypes)
    return DDP_DTYPE_BIT(DDP_FLOAT32);
  return t->dtypes;
}

/* Whether a descriptor of either kind offers optional entry `entry`: its
 * struct_size reaches past it and it is not NULL. */
#define DDP_PLUGIN_HAS(descriptor, entry)                                                                       \
  ((descriptor)->struct_size >=                                                                                 \
       (size_t)((const char*)&(descriptor)->entry - (const char*)(descriptor)) + sizeof((descriptor)->entry) && \
   (descriptor)->entry != NULL)

/* A transport plugin's one export: DDP_TRANSPORT_ENTRY = {DDP_ABI_VERSION,
 * sizeof(ddp_transport_v1_t), "name", "0.1.0", caps, init, ...}; (the same
 * in C and C++: exported, and unmangled in C++). */
#ifdef __cplusplus
#define DDP_ENTRY_LINKAGE extern "C" DDP_PLUGIN_EXPORT
#else
#define DDP_ENTRY_LINKAGE DDP_PLUGIN_EXPORT
#endif
#define DDP_TRANSPORT_ENTRY DDP_ENTRY_LINKAGE const ddp_transport_v1_t ddp_transport_v1

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DDP_ABI_TRANSPORT_H */
