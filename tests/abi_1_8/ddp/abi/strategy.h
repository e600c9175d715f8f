/* ddp/abi/strategy.h — part of ddp/plugin.h: the strategy descriptor,
 * ddp_strategy_v1, which decides what to move between ranks and when. C99,
 * compiles alone; include ddp/plugin.h rather than this part.
 *
 * THE ORDER OF HOOKS. The engine calls them on the training thread. With k
 * = run.grad_accum_steps micro-batches per step and U units (ddp_unit):
 *   create, on_train_begin, take_values(u) for u = 0 .. U-1 (1.7, where
 *   it is set and the strategy claimed values);
 *   for each step, from the first (0, or a resumed run's) to total_steps:
 *     for each micro-batch m = 0 .. k-1:
 *       on_step_begin(step, m);
 *       forward:  on_unit(u, FORWARD_BEGIN), on_unit(u, FORWARD_END)
 *                 for u = 0 .. U-1;
 *       backward: on_unit(u, BACKWARD_BEGIN), on_grad_ready(p) for each
 *                 trainable p whose last use is in u, on_unit(u,
 *                 BACKWARD_END), for u = U-1 .. 0;
 *       on_backward_end;
 *     finish; the engine clips the gradients (optimizer.clip_grad_norm);
 *     optimizer_step if the strategy owns it, else the engine's optimizer
 *     steps every trainable parameter; on_step_end (1.8);
 *   on_train_end; destroy.
 * Every entry of that list but create, on_train_begin, finish and destroy
 * may be NULL (since 1.4; before, on_step_begin, on_grad_ready and
 * on_backward_end were required too), which means "nothing to do", but
 * optimizer_step where caps has DDP_CAP_OWNS_OPTIMIZER. Caps with
 * DDP_CAP_OWNS_GRADIENTS need DDP_CAP_OWNS_OPTIMIZER and grad_ranges too (a
 * strategy that holds gradients says where and steps them itself). A model
 * without units fires no unit hook.
 *
 * THE ORDER OF on_grad_ready: after a parameter's last use in backward
 * (PyTorch's post-accumulate-grad hook), once per micro-batch, never for a
 * frozen parameter or one the model did not use. It depends only on the
 * model, so it is the same on every rank: for every shipped model it is
 * strictly decreasing table index (a tied weight fires once, after its
 * last use). Issue collectives in an order that depends only on this
 * sequence and on the unit hooks, never on timing: every rank must issue
 * the same collectives in the same order.
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
  int64_t total_steps;    /* (ABI 1.4) run.steps: the last step is total_steps - 1 */
} ddp_step_info;

typedef struct ddp_strategy_v1_t {
  uint32_t abi_version;
  uint32_t struct_size; /* sizeof(ddp_strategy_v1_t) */
  const char* name;
  const char* version;
  uint64_t caps; /* DDP_CAP_DEVICE_*, DDP_CAP_OWNS_* and DDP_CAP_DIVERGENT (values.h) */

  /* Makes a strategy over `transport`/`comm` (owned by the host, valid until
   * destroy). Reads all its TOML keys here. Blocking; no collectives yet. A
   * strategy that sends other dtypes checks ddp_transport_dtypes() here;
   * one that needs an optional transport entry (reduce_scatter) checks it
   * here and refuses by name. */
  ddp_status (*create)(const ddp_host* host, const ddp_transport_v1_t* transport, ddp_comm* comm,
                       ddp_strategy** out);
  /* Once, before the first step: make every rank hold rank 0's parameters
   * (all of them, frozen included; those the strategy claimed and takes
   * unit by unit, 1.7, in take_values instead: their data is NULL here).
   * Blocking: done when it returns. */
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
   * parameters on every rank (but under DDP_CAP_DIVERGENT, 1.8: see
   * on_step_end). Blocking. Requires DDP_CAP_OWNS_OPTIMIZER. */
  ddp_status (*optimizer_step)(ddp_strategy* s);
  /* (optional) Writes a JSON object describing the strategy (e.g. bucket
   * layout) into buf (NUL-terminated, at most cap bytes including the NUL)
   * and its full length without the NUL into *needed; the host calls again
   * with a larger buffer if needed >= cap. */
  ddp_status (*stats)(ddp_strategy* s, char* buf, size_t cap, size_t* needed);
  /* Releases everything. The host has synchronised all streams first. */
  void (*destroy)(ddp_strategy* s);
  /* (ABI 1.2, optional) After finish: *partitioned = 1 if each averaged
   * gradient is on one rank only (sharded's reduce_scatter), the indices this
   * rank holds in indices[0, *count) (cap >= param_count); 0 if every rank
   * has all (also if NULL). optimizer.clip_grad_norm sums these ranks' norms. */
  ddp_status (*held_grads)(ddp_strategy* s, size_t* indices, size_t cap, size_t* count, int* partitioned);
  const ddp_key* keys; /* (ABI 1.3) its TOML keys; {NULL}: none; NULL: not declared */

  /* (ABI 1.4, optional) A unit hook, in the order above. The unit's
   * parameters are read (forward) or their gradients written (backward)
   * between its BEGIN and END on the compute stream: a strategy that binds
   * storage (ddp_host::bind) binds it in BEGIN, and may enqueue work that
   * waits for the unit's compute after END. Non-blocking, but it may wait
   * for its own earlier communication (a buffer to reuse). */
  ddp_status (*on_unit)(ddp_strategy* s, size_t unit, ddp_unit_phase phase);
  /* (ABI 1.4, optional) After the last step, before the engine's last
   * check of the replicas and the outputs. Blocking. */
  ddp_status (*on_train_end)(ddp_strategy* s);
  /* (ABI 1.4, optional) After finish: the averaged gradients this rank
   * holds in storage it claimed, as element ranges (their grad set; valid
   * until the next hook), for the engine to measure and clip
   * (optimizer.clip_grad_norm) and to report their norm. *partitioned = 1
   * if each element is held by one rank only (the norm sums the ranks'),
   * 0 if every rank holds them all. Gradients the strategy did not claim
   * are measured where they are, as before. Required where the strategy
   * claims gradients: the engine reads a claimed gradient nowhere else. */
  ddp_status (*grad_ranges)(ddp_strategy* s, const ddp_range** ranges, size_t* count, int* partitioned);
  /* (ABI 1.4, optional) `ddp plan`: this strategy's collectives per step
   * and its own buffers, the elements its optimizer steps and the storage it
   * claims, on the rank and world of `host`, a planning host (ddp/abi/
   * host.h, ddp/abi/plan.h), over `transport` (not initialised: read its
   * dtypes and entries only). Called before any rank starts, without
   * create; reads its keys as create does. NULL: the strategy's own part
   * is not planned, and `ddp plan` says so. */
  ddp_status (*plan)(const ddp_host* host, const ddp_transport_v1_t* transport, ddp_plan* out);
  /* (ABI 1.5) Required where caps have DDP_CAP_OWNS_PARAMETERS: the whole
   * model, one unit at a time, for what the engine reads between steps
   * (the replica check, checkpoints, weights.safetensors, a test's
   * snapshots). `hold` 1: bind the full values of every parameter `unit`
   * owns (ddp_host::bind, DDP_STORAGE_DATA) and return once they are in
   * place; `hold` 0: the engine is done reading them (bind what you like
   * then). Blocking. Every rank calls it for the same units in the same
   * order, one unit held at a time, so it may communicate (an all-gather
   * of the unit's shards). */
  ddp_status (*unit_values)(ddp_strategy* s, size_t unit, int hold);
  /* (ABI 1.7, optional; ignored without DDP_CAP_OWNS_PARAMETERS, or for
   * a model that declares no units) The initial values of the parameters
   * the strategy claimed, lent one unit at a time, so that no rank ever
   * holds them all. Where it is set, no parameter's values exist in create
   * (ddp_param::data is NULL for all); the engine makes those of the
   * parameters left unclaimed after create (they are there in
   * on_train_begin, to broadcast as ever), and never holds the claimed
   * ones whole: after on_train_begin returns, if the strategy claimed any,
   * it calls take_values for every unit in forward order, every rank at
   * the same point, with the values of the claimed parameters `unit` owns
   * in place (ddp_param::data: this rank's own, as drawn, read from
   * model.init_from or resumed; other units' claimed data stay where the
   * strategy bound them, or NULL). The strategy takes its part (it may
   * overwrite them: broadcasting rank 0's first where replicas start
   * equal) and returns once done with them, its work on them complete;
   * the engine then frees them, and a parameter bound before is bound
   * where it was again (a bind made in take_values stays). Blocking. A
   * plugin tells a 1.7 engine by DDP_ABI_MINOR(host->abi_version) >= 7.
   * NULL: the engine holds every value through set-up, as in 1.5. */
  ddp_status (*take_values)(ddp_strategy* s, size_t unit);
  /* (ABI 1.8; optional, required with DDP_CAP_DIVERGENT, which goes with
   * neither DDP_CAP_OWNS_GRADIENTS nor DDP_CAP_OWNS_PARAMETERS) After the
   * optimizer step of every step (the engine's or the strategy's), on every
   * rank, with that step's info (that of its last micro-batch). The
   * strategy may communicate here (local SGD averages the parameters,
   * DiLoCo takes its outer step) and sets *synced: 1 if every rank now
   * holds the same parameters (a sync point), 0 if they may differ; the
   * same answer on every rank (the engine's checks at sync points are
   * collectives; run.debug_collectives compares the answers). Only
   * a strategy with DDP_CAP_DIVERGENT may answer 0: the engine then checks
   * the replicas (run.check_replicas_every), and at the end of the run,
   * only at sync points; without the cap every step is one and a 0 is an
   * error. Blocking. */
  ddp_status (*on_step_end)(ddp_strategy* s, const ddp_step_info* info, int* synced);
  /* (ABI 1.8, optional) The strategy's own state that a checkpoint keeps
   * so that a resumed run is the same run (DiLoCo's θ_global and outer
   * momentum): *out = an array of *count buffers (ddp_state_buffer), the
   * strategy's, valid until its next entry. The engine calls it after
   * on_step_end of a step it checkpoints, and writes them as this rank's
   * own; on resume, after on_train_begin (and take_values) and before the
   * first step, it calls it again and fills them from the checkpoint, the
   * same names and counts or the resume is refused by name. Under
   * DDP_CAP_DIVERGENT, the engine also puts back each rank's own
   * parameter values then (on_train_begin may have broadcast rank 0's).
   * The same buffers from on_train_begin on. NULL: the strategy keeps no
   * state across steps. Blocking. (A checkpoint of equal replicas without
   * this strategy's state, or of another world size, leaves it as
   * on_train_begin made it.) */
  ddp_status (*state)(ddp_strategy* s, const ddp_state_buffer** out, size_t* count);
} ddp_strategy_v1_t;

/* A strategy plugin's one export: DDP_STRATEGY_ENTRY = {DDP_ABI_VERSION,
 * sizeof(ddp_strategy_v1_t), "name", "0.1.0", caps, create, ...}; (the
 * same in C and C++: exported, and unmangled in C++). */
#define DDP_STRATEGY_ENTRY DDP_ENTRY_LINKAGE const ddp_strategy_v1_t ddp_strategy_v1

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DDP_ABI_STRATEGY_H */
