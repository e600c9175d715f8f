/* ddp/abi/host.h — part of ddp/plugin.h: ddp_host, what the engine offers
 * a plugin. C99, compiles alone; include ddp/plugin.h rather than this part.
 *
 * Threads. The engine calls plugin entries from the training thread only.
 * Host entries may be called from the training thread and from host
 * functions running on a stream (launch_host_func), except:
 * - config_* only inside create or init (and plan); step_skipped on the
 *   training thread only;
 * - alloc_host and free_host never inside a host function;
 * - nothing may block on the stream it runs on;
 * - inside a host function on a device stream (a CUDA stream, where CUDA
 *   allows no CUDA call), every entry that reaches the device or blocks
 *   (alloc, copy, fill, scale, convert, add, launch_host_func,
 *   event_record, the waits, run_optimizer*, store_*, claim, bind, split,
 *   grads_final,
 *   and the compute entries of 1.9) returns DDP_ERR_UNSUPPORTED with the
 *   reason; free, free_host and
 *   event_destroy (of a device event) log it and leave the memory or event.
 * One event is not used from two threads at once.
 *
 * Entries of a later minor than 1.0 are appended at the end and exist only
 * where the engine is that new: check before calling one, as
 *   if (!DDP_HOST_HAS(host, convert)) ... the engine is older than 1.3 ...
 * which compares host->struct_size with the entry's end (offsetof(ddp_host,
 * entry) + its size) and the entry with NULL.
 *
 * What it offers, by purpose (the struct lists entries in the order they
 * were added, the ABI's; ddp/plugin.h's changelog says which minor added
 * which):
 *   who and where     abi_version, rank, world_size, local_rank, device,
 *                     timeout_ms; precision (the run's dtypes)
 *   words             log, set_error
 *   its TOML keys     config_int, config_float, config_bool, config_string
 *   the model         param_count, param, unit_count, unit
 *   memory            alloc, free; alloc_host, free_host (staging)
 *   on a stream       copy, fill, scale, convert, add; and compute: gemm,
 *                     dot, norm, axpy, normalize
 *   streams, events   compute_stream, comm_stream, launch_host_func,
 *                     stream_native, event_create, event_destroy,
 *                     event_record, stream_wait_event, event_synchronize,
 *                     event_query
 *   groups of ranks   split, group
 *   rendezvous store  store_set, store_get, store_wait
 *   the optimizer     run_optimizer (parameters), run_optimizer_ranges;
 *                     grads_final (the engine's step, ordered by the
 *                     strategy's reductions); step_skipped
 *   storage it owns   claim, bind (gradients, values)
 *
 * A host made for planning (the `plan` entries, ddp/abi/plan.h) has rank,
 * world_size, local_rank, device, timeout_ms and these entries: log,
 * set_error, config_*, param_count, param (data and grad NULL), unit_count,
 * unit and precision. Every other entry is NULL. */
#ifndef DDP_ABI_HOST_H
#define DDP_ABI_HOST_H

#include "values.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Valid from create/init until destroy. Every function takes `ctx` first.
 * Thread-safety: all functions may be called from any thread unless noted. */
typedef struct ddp_host {
  uint32_t abi_version; /* DDP_ABI_VERSION of the engine */
  uint32_t struct_size; /* sizeof(ddp_host) as the engine knows it */
  void* ctx;
  int rank;
  int world_size;
  int local_rank;
  ddp_device_kind device;

  /* Logging; the host prefixes rank and plugin name. Non-blocking. */
  void (*log)(void* ctx, ddp_log_level level, const char* message);
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
   * for i < count (NULL beyond). Pointers and names live as long as the
   * run; `trainable` changes only between steps, and on_step_begin says
   * when (params_changed); `grad` changes then, and where the strategy
   * binds storage (bind). */
  size_t (*param_count)(void* ctx);
  const ddp_param* (*param)(void* ctx, size_t index);

  /* Device memory, accounted under `category`. alloc returns zeroed memory,
   * aligned to 64 bytes; free accepts NULL and never fails (a pointer the
   * host did not allocate is logged and ignored). Blocking, not
   * stream-ordered: free only what no enqueued work still uses. */
  ddp_status (*alloc)(void* ctx, size_t bytes, ddp_mem_category category, void** out);
  void (*free)(void* ctx, void* ptr);

  /* Device operations, enqueued on `stream`. Sizes in bytes for copy; in
   * elements (buffer.count) for fill and scale, which take float32 only.
   * dst and src may not overlap. */
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
  /* A stream's native handle: a cudaStream_t on CUDA, NULL on the CPU
   * (where work goes through launch_host_func). */
  void* (*stream_native)(void* ctx, ddp_stream stream);

  /* The run's rendezvous store, shared by all ranks (Gloo's store: a file
   * store by default), keys namespaced to the run. get blocks until the key
   * exists or timeout_s elapses; *out is malloc'ed, the caller free()s it. */
  ddp_status (*store_set)(void* ctx, const char* key, const void* data, size_t bytes);
  ddp_status (*store_get)(void* ctx, const char* key, void** out, size_t* bytes);
  ddp_status (*store_wait)(void* ctx, const char* const* keys, size_t count);
  /* Run timeout in milliseconds ([run] timeout_s); transports honour it. */
  int64_t timeout_ms;

  /* Runs the engine's optimizer (as configured) on the parameters whose
   * indices are given, on the compute stream, blocking; the engine keeps
   * optimizer state for exactly these (strategies that own the optimizer
   * step: sharded). */
  ddp_status (*run_optimizer)(void* ctx, const size_t* param_indices, size_t count);

  /* (1.1) Host memory for staging a device's buffers, accounted under
   * `category`: page-locked (cudaHostAlloc) on a CUDA run, so that copies
   * to and from it stay asynchronous; plain memory on a CPU run. Zeroed,
   * aligned to 64 bytes. Blocking, not stream-ordered; never from a host
   * function (on CUDA those run on the driver's callback thread): a
   * transport calls them on the calling thread at enqueue time. free_host
   * accepts NULL and never fails; free only what no enqueued work uses. */
  ddp_status (*alloc_host)(void* ctx, size_t bytes, ddp_mem_category category, void** out);
  void (*free_host)(void* ctx, void* ptr);

  /* (1.3) Enqueues dst[i] = src[i] converted, for float32 to bfloat16
   * or float16 and back, rounding to nearest even (as PyTorch's .to()).
   * Equal counts, on the run's device, not overlapping. */
  ddp_status (*convert)(void* ctx, const ddp_buffer* dst, const ddp_buffer* src, ddp_stream stream);

  /* (1.4) The model's units (ddp_unit), unit_count() of them in
   * forward order; unit(i) is NULL beyond. 0 units: the model declares
   * none, every parameter's unit is DDP_NO_UNIT and no unit hook fires. */
  size_t (*unit_count)(void* ctx);
  const ddp_unit* (*unit)(void* ctx, size_t index);

  /* (1.4) Storage the strategy owns: gradients (`what`
   * DDP_STORAGE_GRAD) for a strategy whose caps have
   * DDP_CAP_OWNS_GRADIENTS; values (DDP_STORAGE_DATA, 1.5, below) for one
   * whose caps have DDP_CAP_OWNS_PARAMETERS. Blocking, on the training
   * thread.
   * claim: from now on the strategy supplies the gradient storage of these
   * trainable parameters; the engine holds none for them (claiming again
   * is a no-op; a frozen parameter, or one out of the table, is refused by
   * name). Only in create (then the engine never makes them: memory
   * follows ownership from the start), on_train_begin, or on_step_begin of
   * a step's first micro-batch (unfreezing), when the engine's own
   * gradients hold nothing yet. A claimed parameter's grad is NULL until
   * bound.
   * bind: the engine writes the gradient of claimed parameter `index` at
   * `ptr` (numel float32 on the run's device, the strategy's memory) from
   * now on; NULL unbinds it. Backward adds into that memory (it never
   * clears it: clear it with fill where a sum starts), only while it is
   * bound: a claimed parameter that backward reaches unbound fails the
   * step, naming it. The engine reads a claimed gradient nowhere else: not
   * to zero it, clip it, check it or step it; those go through the ranges
   * the strategy names (grad_ranges, run_optimizer_ranges).
   * DDP_STORAGE_DATA (1.5), FSDP's sharded parameters: claim, only in
   * create, any parameter, frozen or not: the engine keeps its own values
   * of them until on_train_begin returns (rank 0's by then, where the
   * strategy broadcasts them as ever: the strategy takes its part there),
   * then frees them (a strategy with take_values, 1.7, is lent them unit
   * by unit after on_train_begin instead); from then on their data is NULL until bound. bind:
   * the model reads parameter `index`'s values at `ptr` (numel float32 on
   * the run's device) from then on; NULL unbinds it. A unit's forward or
   * backward that reads a claimed parameter left unbound fails the step,
   * naming it: bind at the latest in the on_unit(FORWARD_BEGIN or
   * BACKWARD_BEGIN) of the unit that reads it. The engine's optimizer
   * steps such a parameter only through ranges that give their `data`
   * (run_optimizer_ranges), and whatever else reads the whole model (the
   * replica check, checkpoints, the output weights) fails naming the
   * first claimed parameter that is unbound when it reads. */
  ddp_status (*claim)(void* ctx, ddp_storage what, const size_t* indices, size_t count);
  ddp_status (*bind)(void* ctx, ddp_storage what, size_t index, void* ptr);

  /* (1.4) Runs the engine's optimizer on element ranges, on the
   * compute stream, blocking, with the same update rules as run_optimizer:
   * each range's data is updated from its grad (ddp_range). State lives
   * with the range that first stepped it: stepping a range that overlaps
   * another one's state, or a whole parameter with state in ranges, fails
   * naming the parameter: optimizer state never moves. Frozen parameters
   * are skipped. */
  ddp_status (*run_optimizer_ranges)(void* ctx, const ddp_range* ranges, size_t count);

  /* (1.4) Enqueues dst[i] += src[i], float32, equal counts, on the
   * run's device, not overlapping (a shard summing micro-batches). */
  ddp_status (*add)(void* ctx, const ddp_buffer* dst, const ddp_buffer* src, ddp_stream stream);

  /* (1.9) Groups of ranks (ddp_group): HSDP's shard and replica
   * groups, a hierarchical reduction's node groups.
   * split: *out is a communicator of the ranks of `parent` that pass the
   * same `color` (>= 0), ordered by `key`, then by their rank in parent
   * (MPI_Comm_split's order), named `name` (1 to 31 of [A-Za-z0-9_.-])
   * wherever the engine reports it. `parent` is the comm create was given
   * (the world) or one split made. Blocking and collective over parent:
   * every rank of it calls split at the same point, in create or
   * on_train_begin only, with no collective of parent in flight. Use the
   * result with the transport create was given, as the world's comm: its
   * ranks issue the same collectives on it in the same order, and its
   * counts are the group's (all_gather's recv holds send.count x its size;
   * broadcast's root is a rank of it). The engine meters every collective
   * with its group's size (summary.json: "groups"), traces it under its
   * group, compares the sequence within each group (run.debug_collectives),
   * names the group and its ranks where one of its collectives fails or
   * does not complete within run.timeout_s, and releases it after destroy.
   * DDP_ERR_UNSUPPORTED where the transport makes no groups (its split).
   * group: what comm `comm` is (the world's, or one split made): its
   * name, this rank's place, its size and members; NULL for another
   * handle. Valid until destroy. */
  ddp_status (*split)(void* ctx, ddp_comm* parent, int color, int key, const char* name, ddp_comm** out);
  const ddp_group* (*group)(void* ctx, ddp_comm* comm);

  /* (1.9) Compute for strategies (a gradient compressor): float32 on
   * the run's device, enqueued on `stream` as copy is (the engine's
   * OpenBLAS on a CPU run; cuBLAS and its own kernels on a CUDA run), so a
   * plugin links neither. The same inputs give the same bits on every
   * rank of a run. Operands may not overlap an output, but x and y of dot.
   * gemm: the products ddp_gemm describes.
   * dot: out[i] = x_i . y_i for the vectors of x and y (equal length and
   * count); out: count floats on the device (the scalars of an axpy:
   * Gram-Schmidt's projections), summed in float64 and rounded.
   * norm: out[i] = ||x_i||_2, as dot.
   * axpy: y_i += alpha s_i x_i, where s_i = scalars[i] (count floats on
   * the device: a dot's or norm's out), or 1 where scalars is NULL.
   * normalize: x_i /= ||x_i||_2 + eps, in place (torch's `col /= norm +
   * eps`: a zero vector with eps 0 becomes NaN, as there). */
  ddp_status (*gemm)(void* ctx, const ddp_gemm* gemm, ddp_stream stream);
  ddp_status (*dot)(void* ctx, const ddp_vectors* x, const ddp_vectors* y, float* out, ddp_stream stream);
  ddp_status (*norm)(void* ctx, const ddp_vectors* x, float* out, ddp_stream stream);
  ddp_status (*axpy)(void* ctx, double alpha, const ddp_vectors* x, const float* scalars, const ddp_vectors* y,
                     ddp_stream stream);
  ddp_status (*normalize)(void* ctx, const ddp_vectors* x, double eps, ddp_stream stream);

  /* (1.10) The averaged gradients of these trainable parameters are final
   * once `done` has fired (an event recorded after their reduction; NULL:
   * now). For a strategy without DDP_CAP_OWNS_OPTIMIZER, from on_step_begin
   * of a step's sync micro-batch until its finish returns: the engine's
   * optimizer step then waits for each such group in the order said and
   * updates its parameters, so that an update overlaps the reductions
   * still running (bucketed), then updates the trainable parameters no
   * group named. `done` stays alive until that step's optimizer step has
   * run. A parameter named twice, a frozen one, or a call outside that
   * window fails, naming it. */
  ddp_status (*grads_final)(void* ctx, ddp_event done, const size_t* param_indices, size_t count);

  /* (1.11) The run's [precision] (ddp_precision, values.h): the dtype of
   * the model's matrix products and the dtype gradients are reduced in.
   * Valid until destroy; on a planning host too. A strategy's own keys
   * may follow it where unset (sharded's gather_dtype, compress). */
  const ddp_precision* (*precision)(void* ctx);
  /* (1.11) On the training thread: 1 during optimizer_step and
   * on_step_end of a step whose optimizer update is skipped: under loss
   * scaling (ddp_precision::loss_scaled) its gradients held an inf or NaN
   * on some rank (every rank alike). optimizer_step is still called;
   * run_optimizer and run_optimizer_ranges update nothing then; a strategy
   * that updates parameters from the step's gradients by other means
   * skips that too. 0 otherwise. */
  int (*step_skipped)(void* ctx);
} ddp_host;

/* Whether the engine offers host entry `entry` (see above). */
#define DDP_HOST_HAS(host, entry) \
  ((host)->struct_size >= offsetof(ddp_host, entry) + sizeof((host)->entry) && (host)->entry != NULL)

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DDP_ABI_HOST_H */
