/* ddp/plugin.h — THE public C ABI between the ddp engine and its plugins.
 *
 * A plugin is a shared library that exports exactly one const descriptor:
 *   ddp_transport_v1   (type ddp_transport_v1_t)  moves bytes between ranks
 *   ddp_strategy_v1    (type ddp_strategy_v1_t)   decides what to move, when
 * beginning with abi_version, struct_size, name, version and capability
 * bits, then a vtable. The engine passes a ddp_host vtable in (logging, the
 * plugin's TOML keys, parameters, device memory, streams and events, the
 * rendezvous store). A plugin includes only this header, links no engine.
 *
 * Rules that hold for every entry:
 * - C99, no exceptions cross this boundary. Every entry returns ddp_status;
 *   on failure it first calls host->set_error() with its own words. The
 *   status is the failure's kind, which the engine reports to the user:
 *   DDP_ERR_TIMEOUT for a peer that did not answer, DDP_ERR_COMM for one lost.
 * - "Enqueue" entries never block: they put work on the ddp_stream given and
 *   return. Completion is observed with events, as with CUDA streams; a
 *   failed operation makes its stream fail, and every event recorded on it
 *   afterwards reports that failure.
 * - Whoever allocates frees, through the same vtable.
 * - Entries are appended at the end of a struct, never reordered; the host
 *   uses struct_size to see which exist. Optional entries may be NULL. A
 *   plugin checks host->struct_size (>= offsetof of the entry + its size)
 *   before calling a host entry of a later minor than 1.0.
 * - Structs passed by pointer (ddp_buffer, ddp_param, ddp_step_info) may
 *   grow at the end in a minor version: use only the fields you know.
 * - Threads: the host calls plugin entries from the training thread only.
 *   Host entries may be called from it and from host functions on a stream,
 *   except: config_* only inside create/init; alloc_host/free_host never in
 *   a host function; nothing may block on the stream it runs on; and in a
 *   host function on a device stream (no CUDA call allowed) every entry that
 *   reaches the device or blocks (alloc, copy, convert, launch_host_func,
 *   event_record, the waits, run_optimizer, store_*, ...) returns
 *   DDP_ERR_UNSUPPORTED; free, free_host and event_destroy (of a device
 *   event) log it and leave the memory or event. One event, one thread.
 *
 * Stability: changing or removing anything here is a new major ABI version
 * (a new entry symbol, e.g. ddp_strategy_v2). Adding at the end is a minor.
 *
 * Minor versions of ABI 1:
 *   1.0  the first release.
 *   1.1  ddp_host gains alloc_host and free_host (staging memory on the
 *        host for a device's buffers).
 *   1.2  ddp_strategy_v1_t gains held_grads (gradient clipping under a
 *        strategy that leaves each averaged gradient on one rank).
 *   1.3  ddp_host gains convert (float32 <-> bfloat16, float16); transports
 *        declare dtypes; both descriptors may list their TOML keys.
 * Header-only helpers (ddp_dtype_*, DDP_*_ENTRY, ddp/numeric.h) are no ABI change.
 */
#ifndef DDP_PLUGIN_H
#define DDP_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DDP_ABI_VERSION_MAJOR 1
#define DDP_ABI_VERSION_MINOR 3
/* abi_version = major << 16 | minor. */
#define DDP_ABI_VERSION ((uint32_t)((DDP_ABI_VERSION_MAJOR << 16) | DDP_ABI_VERSION_MINOR))
#define DDP_ABI_MAJOR(v) ((uint32_t)(v) >> 16)
#define DDP_ABI_MINOR(v) ((uint32_t)(v)&0xffffu)

#define DDP_TRANSPORT_ENTRY_V1 "ddp_transport_v1" /* entry symbols (DDP_*_ENTRY below) */
#define DDP_STRATEGY_ENTRY_V1 "ddp_strategy_v1"

#if defined(_WIN32)
#define DDP_PLUGIN_EXPORT __declspec(dllexport)
#else
#define DDP_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/* ---------------------------------------------------------------- values */

typedef enum ddp_status {
  DDP_OK = 0,
  DDP_ERR_INVALID_ARGUMENT = 1, /* bad key, bad buffer, bad index */
  DDP_ERR_UNSUPPORTED = 2,      /* dtype, device or entry not supported */
  DDP_ERR_COMM = 3,             /* a peer failed or the network did */
  DDP_ERR_TIMEOUT = 4,          /* timeout_s elapsed */
  DDP_ERR_OUT_OF_MEMORY = 5,
  DDP_ERR_INTERNAL = 6
} ddp_status;

typedef enum ddp_dtype {
  DDP_FLOAT32 = 0, DDP_FLOAT64 = 1, DDP_INT32 = 2, DDP_INT64 = 3, DDP_BFLOAT16 = 4, DDP_FLOAT16 = 5
} ddp_dtype;

/* Bytes per element of `dtype`; 0 for a value this header does not name. */
static inline size_t ddp_dtype_size(ddp_dtype dtype) {
  switch (dtype) {
    case DDP_FLOAT32: case DDP_INT32: return 4;
    case DDP_FLOAT64: case DDP_INT64: return 8;
    case DDP_BFLOAT16: case DDP_FLOAT16: return 2;
  }
  return 0;
}
/* A set of dtypes, as a transport's `dtypes` holds it. */
#define DDP_DTYPE_BIT(dtype) (UINT64_C(1) << (dtype))

/* One TOML key of a plugin, for `ddp plugins` and for the launcher, which
 * refuses a key of the plugin's table that no entry names before any rank
 * starts. An array of them ends with an entry whose name is NULL. */
typedef struct ddp_key {
  const char* name;
  const char* type; /* "int", "float", "bool", "string", or as it reads: "float or \"auto\"" */
  const char* help; /* one line, with the default */
} ddp_key;

typedef enum ddp_device_kind { DDP_DEVICE_CPU = 0, DDP_DEVICE_CUDA = 1 } ddp_device_kind;
typedef enum ddp_reduce_op { DDP_REDUCE_SUM = 0, DDP_REDUCE_AVG = 1 /* sum / world_size */ } ddp_reduce_op;
typedef enum ddp_log_level { DDP_LOG_DEBUG = 0, DDP_LOG_INFO = 1, DDP_LOG_WARN = 2, DDP_LOG_ERROR = 3 } ddp_log_level;

/* Memory categories of the engine's accounting (current and peak bytes). */
typedef enum ddp_mem_category {
  DDP_MEM_PARAMETERS = 0, DDP_MEM_GRADIENTS = 1, DDP_MEM_OPTIMIZER_STATE = 2,
  DDP_MEM_COMM_BUFFERS = 3, DDP_MEM_ACTIVATIONS = 4, DDP_MEM_CATEGORY_COUNT = 5
} ddp_mem_category;

/* Capability bits of a descriptor's `caps`. */
#define DDP_CAP_DEVICE_CPU (1u << 0)      /* works on CPU memory */
#define DDP_CAP_DEVICE_CUDA (1u << 1)     /* works on CUDA memory */
#define DDP_CAP_OWNS_OPTIMIZER (1u << 8)  /* strategy: implements optimizer_step */

/* A contiguous buffer on the run's device; `count` in elements. Passed by
 * pointer, read during the call only (the memory it names must stay valid
 * until the enqueued work completes). */
typedef struct ddp_buffer {
  void* ptr;
  size_t count;
  ddp_dtype dtype;
  ddp_device_kind device;
} ddp_buffer;

/* One model parameter, in the model's named_parameters() order. The host owns
 * `data` and `grad`: `numel` elements of `dtype` on the run's device; `grad`
 * is NULL while frozen. Reach entries through host->param(ctx, i) only. */
typedef struct ddp_param {
  const char* name;
  size_t index; /* position in the parameter table */
  void* data;
  void* grad;
  size_t numel;
  ddp_dtype dtype;
  int trainable; /* 0: frozen, never touched, never fires on_grad_ready */
} ddp_param;

/* Opaque handles: streams and events are the host's, the others the plugin's. */
typedef struct ddp_stream_s* ddp_stream;
typedef struct ddp_event_s* ddp_event;
typedef struct ddp_comm_s ddp_comm;
typedef struct ddp_strategy_s ddp_strategy;

/* Work enqueued with host->launch_host_func. Called exactly once, on the
 * stream's executor, in stream order. If the stream has already failed,
 * `cancelled` is 1 and the function must only release `user`. Returns
 * DDP_OK, or an error (after host->set_error) that fails the stream. */
typedef ddp_status (*ddp_host_func)(void* user, int cancelled);

/* ------------------------------------------------------------ host vtable */

/* What the engine offers a plugin. Valid from create/init until destroy.
 * Every function takes `ctx` first. Thread-safety: all functions may be
 * called from any thread unless noted. */
typedef struct ddp_host {
  uint32_t abi_version; /* DDP_ABI_VERSION of the engine */
  uint32_t struct_size; /* sizeof(ddp_host) as the engine knows it */
  void* ctx;
  int rank;
  int world_size;
  int local_rank;
  ddp_device_kind device;

  void (*log)(void* ctx, ddp_log_level level, const char* message); /* prefixed with rank, plugin */
  /* Sets the error text of the calling thread; the host reads it when the
   * entry that this thread is in returns an error. Copied. */
  void (*set_error)(void* ctx, const char* message);

  /* Typed reads of the plugin's own TOML table ([transport] or [strategy]).
   * A missing key yields `fallback` and DDP_OK; a key of another type is
   * DDP_ERR_INVALID_ARGUMENT with an error naming file, line and key. Keys a
   * plugin never reads during create/init (or, before ranks start, that its
   * `keys` do not name) are refused as unknown. Strings stay valid until the
   * plugin is destroyed. Integers are accepted for float keys. */
  ddp_status (*config_int)(void* ctx, const char* key, int64_t fallback, int64_t* out);
  ddp_status (*config_float)(void* ctx, const char* key, double fallback, double* out);
  ddp_status (*config_bool)(void* ctx, const char* key, int fallback, int* out);
  ddp_status (*config_string)(void* ctx, const char* key, const char* fallback, const char** out);

  /* The parameter table, in model order: param_count() entries, param(i)
   * for i < count. Pointers and names live as long as the run; `trainable`
   * and `grad` change only between steps, and on_step_begin says when
   * (params_changed). */
  size_t (*param_count)(void* ctx);
  const ddp_param* (*param)(void* ctx, size_t index);

  /* Device memory, accounted under `category`. alloc returns zeroed memory,
   * aligned to 64 bytes; free accepts NULL and never fails (a pointer the
   * host did not allocate is logged and ignored). Blocking, not
   * stream-ordered: free only what no enqueued work still uses. */
  ddp_status (*alloc)(void* ctx, size_t bytes, ddp_mem_category category, void** out);
  void (*free)(void* ctx, void* ptr);

  /* Device operations, enqueued on `stream`. Sizes in bytes for copy; in
   * elements (buffer.count) for fill and scale. dst and src may not overlap. */
  ddp_status (*copy)(void* ctx, void* dst, const void* src, size_t bytes, ddp_stream stream);
  ddp_status (*fill)(void* ctx, const ddp_buffer* buffer, double value, ddp_stream stream);
  ddp_status (*scale)(void* ctx, const ddp_buffer* buffer, double factor, ddp_stream stream);

  /* Streams owned by the engine: compute (where forward and backward run;
   * on CPU this is the training thread itself) and communication. Work on
   * the comm stream that reads what compute produced must first wait for an
   * event recorded on compute (stream_wait_event), as with CUDA streams. */
  ddp_stream (*compute_stream)(void* ctx);
  ddp_stream (*comm_stream)(void* ctx);
  /* Enqueues fn(user, cancelled) on `stream` (cudaLaunchHostFunc). A
   * transport on CPU runs its blocking collective inside such a function. */
  ddp_status (*launch_host_func)(void* ctx, ddp_stream stream, ddp_host_func fn, void* user);

  /* Events, as CUDA events: record marks a point on a stream; a wait makes a
   * stream (non-blocking) or the caller (blocking) wait for it. An event
   * recorded on a failed stream fails; event_synchronize then returns that
   * stream's error and sets its text. Time spent in event_synchronize on the
   * training thread is reported as exposed communication time. */
  ddp_status (*event_create)(void* ctx, ddp_event* out);
  void (*event_destroy)(void* ctx, ddp_event event);
  ddp_status (*event_record)(void* ctx, ddp_event event, ddp_stream stream);
  ddp_status (*stream_wait_event)(void* ctx, ddp_stream stream, ddp_event event);
  ddp_status (*event_synchronize)(void* ctx, ddp_event event);
  /* Non-blocking: *done = 1 once complete; a failed event returns its error.
   * event_destroy on a pending event is allowed: waiters are unaffected. */
  ddp_status (*event_query)(void* ctx, ddp_event event, int* done);
  /* A stream's native handle: a cudaStream_t on CUDA, NULL on the CPU. */
  void* (*stream_native)(void* ctx, ddp_stream stream);

  /* The run's rendezvous store, keys namespaced to the run. get blocks until
   * the key exists or timeout_s elapses; *out is malloc'ed, caller frees. */
  ddp_status (*store_set)(void* ctx, const char* key, const void* data, size_t bytes);
  ddp_status (*store_get)(void* ctx, const char* key, void** out, size_t* bytes);
  ddp_status (*store_wait)(void* ctx, const char* const* keys, size_t count);
  /* Run timeout in milliseconds ([run] timeout_s); transports honour it. */
  int64_t timeout_ms;

  /* Runs the engine's optimizer on the parameters whose indices are given,
   * on the compute stream, blocking; the engine keeps optimizer state for
   * exactly these (strategies that own the optimizer step: sharded). */
  ddp_status (*run_optimizer)(void* ctx, const size_t* param_indices, size_t count);

  /* (ABI 1.1) Host memory for staging a device's buffers, accounted under
   * `category`: page-locked (cudaHostAlloc) on a CUDA run, so that copies
   * to and from it stay asynchronous; plain memory on a CPU run. As alloc
   * and free otherwise, and never from a host function (on CUDA those run
   * on the driver's callback thread): call them at enqueue time. */
  ddp_status (*alloc_host)(void* ctx, size_t bytes, ddp_mem_category category, void** out);
  void (*free_host)(void* ctx, void* ptr);

  /* (ABI 1.3) Enqueues dst[i] = src[i] converted, for
   * float32 to bfloat16 or float16 and back, rounding to nearest even (as
   * PyTorch's .to()). Equal counts, on the run's device, not overlapping. */
  ddp_status (*convert)(void* ctx, const ddp_buffer* dst, const ddp_buffer* src, ddp_stream stream);
} ddp_host;

/* ------------------------------------------------------ transport vtable */

/* Every collective is enqueued on `stream` and returns at once; buffers must
 * stay valid until an event recorded after it completes. All ranks must
 * issue the same collectives in the same order with the same counts. */
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
   * of every rank's send[r * recv.count, (r + 1) * recv.count). */
  ddp_status (*reduce_scatter)(ddp_comm* comm, const ddp_buffer* send, const ddp_buffer* recv,
                               ddp_reduce_op op, ddp_stream stream);
  /* Completes on each rank once every rank has reached it. */
  ddp_status (*barrier)(ddp_comm* comm, ddp_stream stream);
  /* (optional) Makes pending and future collectives of comm fail soon
   * (ncclCommAbort), from any thread; then the engine calls destroy. */
  void (*abort)(ddp_comm* comm);
  /* (ABI 1.3) DDP_DTYPE_BIT of each dtype that all_reduce, all_gather and
   * reduce_scatter take; any other fails with DDP_ERR_UNSUPPORTED. Read it
   * with ddp_transport_dtypes(). */
  uint64_t dtypes;
  const ddp_key* keys; /* (ABI 1.3) its TOML keys; {NULL}: none; NULL: not declared */
} ddp_transport_v1_t;

/* The dtypes `t` takes: float32 alone where it declares none (before 1.3). */
static inline uint64_t ddp_transport_dtypes(const ddp_transport_v1_t* t) {
  if (t->struct_size < offsetof(ddp_transport_v1_t, dtypes) + sizeof t->dtypes || !t->dtypes)
    return DDP_DTYPE_BIT(DDP_FLOAT32);
  return t->dtypes;
}

/* ------------------------------------------------------- strategy vtable */

typedef struct ddp_step_info {
  uint32_t struct_size;   /* sizeof(ddp_step_info) as the engine knows it */
  int64_t step;           /* optimizer step, from 0 */
  int32_t micro_step;     /* micro-batch index within the step, from 0 */
  int32_t micro_steps;    /* run.grad_accum_steps */
  int32_t sync_grads;     /* 1 on the micro-batch whose gradients must be synced */
  int32_t params_changed; /* 1 if trainable flags changed since last step */
} ddp_step_info;

/* Hooks are called by the engine on the training thread, in this order per
 * micro-batch: on_step_begin, on_grad_ready (per trainable parameter, after
 * its last use), on_backward_end; after the last micro-batch: finish, then
 * optimizer_step (if the strategy owns it, else the engine's optimizer runs
 * on every trainable parameter). The order of on_grad_ready calls depends
 * only on the model, so it is the same on every rank; issue collectives in
 * an order that depends only on it, never on timing.
 *
 * Gradient accumulation (run.grad_accum_steps = k): the engine zeroes the
 * gradients before micro-batch 0 and scales each micro-batch's loss by 1/k,
 * so gradients are summed in place across the k micro-batches; only the
 * last one has sync_grads = 1. Hooks fire on every micro-batch; a strategy
 * communicates only on the one with sync_grads. */
typedef struct ddp_strategy_v1_t {
  uint32_t abi_version;
  uint32_t struct_size; /* sizeof(ddp_strategy_v1_t) */
  const char* name;
  const char* version;
  uint64_t caps; /* DDP_CAP_DEVICE_*, DDP_CAP_OWNS_OPTIMIZER */

  /* Makes a strategy over `transport`/`comm` (owned by the host, valid until
   * destroy). Reads all its TOML keys here. Blocking; no collectives yet. A
   * strategy that sends other dtypes checks ddp_transport_dtypes() here. */
  ddp_status (*create)(const ddp_host* host, const ddp_transport_v1_t* transport, ddp_comm* comm,
                       ddp_strategy** out);
  /* Once, before the first step: make every rank hold rank 0's parameters
   * (all of them, frozen included). Blocking: done when it returns. */
  ddp_status (*on_train_begin)(ddp_strategy* s);
  /* Before each micro-batch's forward. Non-blocking. */
  ddp_status (*on_step_begin)(ddp_strategy* s, const ddp_step_info* info);
  /* `param` is the table entry; its grad is final for this micro-batch on the
   * compute stream (wait for an event recorded there before reading it on
   * another stream). Non-blocking. */
  ddp_status (*on_grad_ready)(ddp_strategy* s, const ddp_param* param);
  /* Backward of the micro-batch is done. Non-blocking. */
  ddp_status (*on_backward_end)(ddp_strategy* s);
  /* Blocks until every trainable gradient holds the average over ranks; for
   * a strategy that owns the optimizer step, until the gradients its
   * optimizer_step needs are in place. */
  ddp_status (*finish)(ddp_strategy* s);
  /* (optional) Replaces the engine's optimizer step; must leave identical
   * parameters on every rank. Blocking. Requires DDP_CAP_OWNS_OPTIMIZER. */
  ddp_status (*optimizer_step)(ddp_strategy* s);
  /* (optional) Writes a JSON object describing the strategy (e.g. bucket
   * layout) into buf (NUL-terminated, at most cap bytes with the NUL), its
   * length without the NUL into *needed; called again if needed >= cap. */
  ddp_status (*stats)(ddp_strategy* s, char* buf, size_t cap, size_t* needed);
  /* Releases everything. The host has synchronised all streams first. */
  void (*destroy)(ddp_strategy* s);
  /* (ABI 1.2, optional) After finish: *partitioned = 1 if each averaged
   * gradient is on one rank only (sharded's reduce_scatter), the indices this
   * rank holds in indices[0, *count) (cap >= param_count); 0 if every rank
   * has all (also if NULL). optimizer.clip_grad_norm sums these ranks' norms. */
  ddp_status (*held_grads)(ddp_strategy* s, size_t* indices, size_t cap, size_t* count, int* partitioned);
  const ddp_key* keys; /* (ABI 1.3) its TOML keys; {NULL}: none; NULL: not declared */
} ddp_strategy_v1_t;

/* What a plugin exports: exactly one entry symbol, defined with one of
 *   DDP_STRATEGY_ENTRY = {DDP_ABI_VERSION, sizeof(ddp_strategy_v1_t), "name",
 *                         "0.1.0", caps, create, on_train_begin, ...};
 *   DDP_TRANSPORT_ENTRY = {...};   (the same in C and C++) */
#ifdef __cplusplus
#define DDP_ENTRY_LINKAGE extern "C" DDP_PLUGIN_EXPORT
#else
#define DDP_ENTRY_LINKAGE DDP_PLUGIN_EXPORT
#endif
#define DDP_STRATEGY_ENTRY DDP_ENTRY_LINKAGE const ddp_strategy_v1_t ddp_strategy_v1
#define DDP_TRANSPORT_ENTRY DDP_ENTRY_LINKAGE const ddp_transport_v1_t ddp_transport_v1

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DDP_PLUGIN_H */
