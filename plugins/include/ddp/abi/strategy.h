/* ddp/abi/strategy.h — part of ddp/plugin.h: the strategy descriptor,
 * ddp_strategy_v1, which decides what to move between ranks and when. C99,
 * compiles alone; include ddp/plugin.h rather than this part.
 *
 * The entries in the order of a run's life. The engine calls them on the
 * training thread; those marked (optional) may be NULL, which means
 * "nothing to do" or what the entry says. The struct below lists them in
 * the order they were added (that order is the ABI); ddp/plugin.h's table
 * says which caps need which entries, its changelog which minor added
 * each (a plugin checks an engine's with DDP_ABI_MINOR(host->abi_version)).
 *
 * BEFORE ANY RANK STARTS
 *   keys    its TOML keys, for `ddp plugins` and to refuse a misspelt one.
 *   plan    (optional) what a rank would send and hold (ddp/abi/plan.h),
 *           on a planning host, without create; reads its keys as create
 *           does. DDP_ERR_UNSUPPORTED: it does not run on this world with
 *           these keys, in its own words (ddp run refuses, ddp-conformance
 *           skips the case). NULL: `ddp plan` says its part is unplanned.
 *
 * SET-UP, every rank at the same point
 *   create          makes the strategy over `transport`/`comm` (the
 *                   world's: the host's, valid until destroy). Reads all its
 *                   keys here (a key not read is refused as unknown).
 *                   Blocking; no collective yet, but groups (ddp_host::
 *                   split, collective over the world) and claims of
 *                   storage. A strategy that sends other dtypes checks
 *                   ddp_transport_dtypes(), one that needs an optional
 *                   transport entry (reduce_scatter) checks it: refuse here,
 *                   by name.
 *   on_train_begin  makes every rank hold rank 0's parameters, frozen ones
 *                   included (those it claimed and takes unit by unit are
 *                   NULL here). Blocking.
 *   take_values     (optional; with DDP_CAP_OWNS_PARAMETERS and a model
 *                   with units) the initial values of the parameters it
 *                   claimed, lent one unit at a time in forward order after
 *                   on_train_begin, so that no rank holds them all: where it
 *                   is set, no value exists in create; in take_values(u)
 *                   the claimed parameters of unit u hold this rank's own
 *                   (drawn, read from model.init_from or resumed); the
 *                   strategy takes its part (broadcasting rank 0's first)
 *                   and returns once done with them; the engine frees them
 *                   then (a bind made here stays). Blocking. A plugin
 *                   tells an engine that lends by DDP_ABI_MINOR(host->
 *                   abi_version) >= 7; NULL: the engine holds every value
 *                   through on_train_begin.
 *
 * EACH STEP, for each micro-batch m = 0 .. k-1 (k = run.grad_accum_steps)
 *   on_step_begin   (optional) before the micro-batch's forward
 *                   (ddp_step_info: sync_grads on the last, params_changed
 *                   after an unfreeze). Non-blocking.
 *   on_unit         (optional) FORWARD_BEGIN/END for u = 0 .. U-1, then in
 *                   backward BACKWARD_BEGIN, the unit's on_grad_ready,
 *                   BACKWARD_END for u = U-1 .. 0. A unit's parameters are
 *                   read (gradients written) between its BEGIN and END on
 *                   the compute stream: bind claimed storage in BEGIN;
 *                   enqueue what waits for the unit's compute after END.
 *                   Non-blocking, but it may wait for its own earlier
 *                   communication. A model without units fires none.
 *   on_grad_ready   (optional) `param`'s gradient is final for this
 *                   micro-batch on the compute stream (wait for an event
 *                   recorded there before reading it on another stream).
 *                   Non-blocking.
 *   on_backward_end (optional) the micro-batch's backward is done.
 *                   Non-blocking.
 * then, once per step:
 *   finish          blocks until every trainable gradient holds the
 *                   average over ranks (for a strategy that owns the
 *                   optimizer step: those its optimizer_step needs).
 *   held_ranges     (optional, 1.9) the averaged gradient elements this
 *                   rank holds (ddp_held_range: the engine's, grad NULL, and
 *                   those in storage it claimed) and how many ranks hold
 *                   each, for the gradient norm (each element counted once)
 *                   and clipping on every rank that holds it. Where set,
 *                   the engine asks neither of its forerunners:
 *                   held_grads (optional, 1.2): the indices of the
 *                   parameters whose averaged gradient is on this rank only,
 *                   *partitioned = 1 (0: every rank holds all);
 *                   grad_ranges (1.4; needed with DDP_CAP_OWNS_GRADIENTS
 *                   but for held_ranges): the ranges of claimed storage
 *                   (their grad set), *partitioned = 1 if each element is
 *                   on one rank only; gradients it did not claim are
 *                   measured where they are. The engine reads a claimed
 *                   gradient nowhere else. Valid until the next hook.
 *   the engine clips the gradients (optimizer.clip_grad_norm) and, under
 *   loss scaling (1.11, ddp_precision::loss_scaled), unscales them or
 *   skips the step's update on every rank (ddp_host::step_skipped; the
 *   hook below is still called), then
 *   optimizer_step  (optional; required with DDP_CAP_OWNS_OPTIMIZER)
 *                   replaces the engine's optimizer step: identical
 *                   parameters on every rank after it (but under
 *                   DDP_CAP_DIVERGENT). Blocking.
 *   on_step_end     (optional; required with DDP_CAP_DIVERGENT) after the
 *                   optimizer step of every step, with its last micro-
 *                   batch's info: the strategy may communicate (local SGD
 *                   averages, DiLoCo's outer step) and sets *synced = 1 if
 *                   every rank holds the same parameters now (a sync
 *                   point), the same answer on every rank (the engine
 *                   compares the answers after every step, and the
 *                   collectives issued here before each runs: ranks that
 *                   disagree stop the run). Only a strategy with
 *                   DDP_CAP_DIVERGENT may answer 0; the engine's checks
 *                   of the replicas then run at sync points only. Make
 *                   the run's last step (total_steps) a sync point:
 *                   weights.safetensors is rank 0's. Blocking.
 *
 * BETWEEN STEPS, every rank at the same point
 *   unit_values     (required with DDP_CAP_OWNS_PARAMETERS) the whole
 *                   model a unit at a time, for what the engine reads
 *                   between steps (the replica check, checkpoints,
 *                   weights.safetensors): hold 1 binds the full values of
 *                   every parameter `unit` owns (DDP_STORAGE_DATA) and
 *                   returns once in place (it may gather); hold 0 releases
 *                   them. One unit held at a time. Blocking.
 *   state           (optional) its own state that a checkpoint keeps
 *                   (ddp_state_buffer: DiLoCo's θ_global, PowerSGD's error
 *                   feedback and Q), the same buffers from on_train_begin
 *                   on; after on_step_end of a checkpointed step, and on
 *                   resume after on_train_begin (and take_values), where the
 *                   engine fills them (the same names and counts, or the
 *                   resume is refused by name; under DDP_CAP_DIVERGENT it
 *                   also puts back each rank's own parameters). A
 *                   checkpoint of another strategy, or without this
 *                   rank's buffers, leaves them as on_train_begin made
 *                   them (rank 0 says so). Blocking.
 *   state_scopes    (optional, 1.9) after each call of state: who holds
 *                   each buffer (ddp_state_scope), *count equal to state's.
 *                   An equal buffer is checked equal on every rank,
 *                   written once and taken up on any world size; a per-rank
 *                   one on the same world size only. NULL: all per rank.
 *   stats           (optional) a JSON object describing the strategy
 *                   (summary.json's strategy_stats), NUL-terminated into
 *                   buf (cap bytes); *needed its full length: called again
 *                   with more where needed >= cap.
 *
 * THE END
 *   on_train_end    (optional) after the last step, before the engine's
 *                   last check of the replicas and the outputs. Blocking.
 *   destroy         releases everything; the host has synchronised every
 *                   stream first, and releases the groups after it.
 *
 * THE ORDER OF on_grad_ready: after a parameter's last use in backward
 * (PyTorch's post-accumulate-grad hook), once per micro-batch, never for a
 * frozen parameter or one the model did not use. It depends only on the
 * model, so it is the same on every rank: for every shipped model it is
 * strictly decreasing table index (a tied weight fires once, after its
 * last use). Issue collectives in an order that depends only on this
 * sequence and on the unit hooks, never on timing: every rank of a group
 * must issue the same collectives in the same order.
 *
 * THE PACKED GRADIENTS. The engine lays the gradients it owns (trainable,
 * not claimed: ddp_host::claim) out back to back in one block of device
 * memory, in reverse table order, without gaps: the gradients of a run of
 * parameters consecutive in that order are one contiguous range, which a
 * strategy may average where it lies instead of copying it (PyTorch's
 * gradient_as_bucket_view). The layout changes only between steps, when
 * on_step_begin says params_changed, or when the strategy claims. (For a
 * strategy with DDP_CAP_OWNS_GRADIENTS the engine makes its gradients after
 * create, and those of parameters just unfrozen after that step's first
 * on_step_begin, where the strategy may claim them first.)
 *
 * Gradient accumulation (k > 1): the engine zeroes its gradients before
 * micro-batch 0 and scales each micro-batch's loss by 1/k, so gradients
 * are summed in place across the k micro-batches; only the last one has
 * sync_grads = 1. A strategy that keeps only a shard of the gradients
 * (claimed storage) reduces each micro-batch's instead and sums the shard. */
#ifndef DDP_ABI_STRATEGY_H
#define DDP_ABI_STRATEGY_H

#include "transport.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ddp_step_info {
  uint32_t struct_size;   /* sizeof(ddp_step_info) as the engine knows it */
  int64_t step;           /* optimizer step, from 0 */
  int32_t micro_step;     /* micro-batch index within the step, from 0 */
  int32_t micro_steps;    /* run.grad_accum_steps */
  int32_t sync_grads;     /* 1 on the micro-batch whose gradients must be synced */
  int32_t params_changed; /* 1 if trainable flags changed since last step */
  int64_t total_steps;    /* (1.4) run.steps: the last step is total_steps - 1 */
  /* (1.12) The factor this step's gradients carry: the loss scale under
   * ddp_precision::loss_scaled (GradScaler's scale, which changes between
   * steps; a power of two under the default init_scale, growth_factor and
   * backoff_factor), 1 otherwise. The engine divides it out after finish;
   * a strategy that keeps state made of gradients keeps it divided out
   * (powersgd's error feedback). */
  double loss_scale;
} ddp_step_info;

/* The descriptor. Each entry's contract is above, in the order of a run;
 * here they stand in the order they were added (never reordered). */
typedef struct ddp_strategy_v1_t {
  uint32_t abi_version;
  uint32_t struct_size; /* sizeof(ddp_strategy_v1_t) */
  const char* name;
  const char* version;
  uint64_t caps; /* DDP_CAP_DEVICE_*, DDP_CAP_OWNS_* and DDP_CAP_DIVERGENT (values.h) */

  /* 1.0 */
  ddp_status (*create)(const ddp_host* host, const ddp_transport_v1_t* transport, ddp_comm* comm, ddp_strategy** out);
  ddp_status (*on_train_begin)(ddp_strategy* s);
  ddp_status (*on_step_begin)(ddp_strategy* s, const ddp_step_info* info);
  ddp_status (*on_grad_ready)(ddp_strategy* s, const ddp_param* param);
  ddp_status (*on_backward_end)(ddp_strategy* s);
  ddp_status (*finish)(ddp_strategy* s);
  ddp_status (*optimizer_step)(ddp_strategy* s);
  ddp_status (*stats)(ddp_strategy* s, char* buf, size_t cap, size_t* needed);
  void (*destroy)(ddp_strategy* s);
  /* 1.2: indices[0, *count) (cap >= param_count) */
  ddp_status (*held_grads)(ddp_strategy* s, size_t* indices, size_t cap, size_t* count, int* partitioned);
  /* 1.3: its TOML keys; {NULL}: none; NULL: not declared */
  const ddp_key* keys;

  /* 1.4 */
  ddp_status (*on_unit)(ddp_strategy* s, size_t unit, ddp_unit_phase phase);
  ddp_status (*on_train_end)(ddp_strategy* s);
  ddp_status (*grad_ranges)(ddp_strategy* s, const ddp_range** ranges, size_t* count, int* partitioned);
  /* `transport` not initialised: read its dtypes and entries only */
  ddp_status (*plan)(const ddp_host* host, const ddp_transport_v1_t* transport, ddp_plan* out);
  /* 1.5 */
  ddp_status (*unit_values)(ddp_strategy* s, size_t unit, int hold);
  /* 1.7 */
  ddp_status (*take_values)(ddp_strategy* s, size_t unit);
  /* 1.8: *out valid until its next entry */
  ddp_status (*on_step_end)(ddp_strategy* s, const ddp_step_info* info, int* synced);
  ddp_status (*state)(ddp_strategy* s, const ddp_state_buffer** out, size_t* count);
  /* 1.9 */
  ddp_status (*held_ranges)(ddp_strategy* s, const ddp_held_range** out, size_t* count);
  ddp_status (*state_scopes)(ddp_strategy* s, const ddp_state_scope** scopes, size_t* count);
} ddp_strategy_v1_t;

/* A strategy plugin's one export, with designated initializers (C99, or
 * C++20) naming the entries it has; every other entry is NULL:
 *   DDP_STRATEGY_ENTRY = {
 *       .abi_version = DDP_ABI_VERSION, .struct_size = sizeof(ddp_strategy_v1_t),
 *       .name = "mine", .version = "0.1.0", .caps = DDP_CAP_DEVICE_CPU,
 *       .create = mine_create, .on_train_begin = mine_begin, .finish = mine_finish,
 *       .destroy = mine_destroy, .keys = mine_keys};
 * (exported, and unmangled in C++). */
#define DDP_STRATEGY_ENTRY DDP_ENTRY_LINKAGE const ddp_strategy_v1_t ddp_strategy_v1

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DDP_ABI_STRATEGY_H */
