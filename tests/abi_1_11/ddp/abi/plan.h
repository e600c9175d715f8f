/* ddp/abi/plan.h — part of ddp/plugin.h (ABI 1.4): how a plugin states,
 * before any rank starts, what it will send and hold, so that `ddp plan`
 * can predict a run of any strategy and transport, shipped or not. C99,
 * compiles alone; include ddp/plugin.h rather than this part.
 *
 * The engine calls a plugin's `plan` entry once per rank it plans, with a
 * ddp_host made for planning (ddp/abi/host.h says which of its entries
 * exist then) and a ddp_plan to report through. The plugin reports what a
 * run of that rank would do in its steady state (a run of two steps or
 * more), from the parameter table, the units, the world size and its own
 * TOML keys, exactly: `ddp plan`'s prediction is compared, byte for byte,
 * with what the run's summary.json measures. A plugin without the entry is
 * planned for everything but its own part, and `ddp plan` says so. */
#ifndef DDP_ABI_PLAN_H
#define DDP_ABI_PLAN_H

#include "values.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ddp_collective_op {
  DDP_OP_ALL_REDUCE = 0,
  DDP_OP_BROADCAST = 1,
  DDP_OP_ALL_GATHER = 2,
  DDP_OP_REDUCE_SCATTER = 3,
  DDP_OP_BARRIER = 4
} ddp_collective_op;

/* One collective of a step on one rank. `count` elements of `dtype` in the
 * buffer as the engine meters it: all_gather's gathered (receive) buffer,
 * reduce_scatter's send buffer, the buffer itself for the others. */
typedef struct ddp_plan_collective {
  ddp_collective_op op;
  size_t count;
  ddp_dtype dtype;
  int beside_compute; /* 1: issued while the rank still computes (overlapped with backward) */
} ddp_plan_collective;

/* When a planned buffer starts to be held: from the end of set-up on (made
 * in create, init or on_train_begin), or from the first step on (made on
 * first use). Buffers are held to the end of the run. */
typedef enum ddp_plan_when { DDP_PLAN_SETUP = 0, DDP_PLAN_STEP = 1 } ddp_plan_when;

/* What a plan entry reports through. Every callback takes `ctx` first and
 * returns DDP_OK, or an error with its text set (a bad category, an index
 * outside the table), which the plan entry returns as its own. */
typedef struct ddp_plan {
  uint32_t struct_size; /* sizeof(ddp_plan) as the engine knows it */
  void* ctx;

  /* For a transport's plan: the step's collectives, as the strategy
   * planned them (NULL and 0 for a strategy's plan, or where the strategy
   * has no plan). */
  const ddp_plan_collective* collectives;
  size_t collective_count;
  /* The run as the engine will run it. */
  int32_t micro_steps; /* run.grad_accum_steps */
  int32_t clips;       /* 1 where optimizer.clip_grad_norm > 0 or (1.11) the loss is scaled: the engine waits for every
                          gradient before updating any */

  /* Strategy: one collective of a step, in the order they start. */
  ddp_status (*collective)(void* ctx, const ddp_plan_collective* collective);
  /* Strategy or transport: memory the plugin allocates through the host
   * (alloc or alloc_host), `bytes` in `category`, held from `when` on.
   * Call it once per allocation: the engine adds them up. */
  ddp_status (*buffer)(void* ctx, ddp_mem_category category, size_t bytes, ddp_plan_when when);
  /* Strategy with DDP_CAP_OWNS_OPTIMIZER: this rank's optimizer updates
   * elements [offset, offset + count) of parameter `param` (state for them
   * lives here). Without any such call, a strategy that owns the optimizer
   * step is planned as updating nothing; one that does not, every trainable
   * parameter. */
  ddp_status (*steps)(void* ctx, size_t param, size_t offset, size_t count);
  /* Strategy with DDP_CAP_OWNS_GRADIENTS: it claims the gradient storage
   * of parameter `param` (ddp_host::claim): the engine holds none for it,
   * and the strategy reports what it holds instead with buffer(). Values
   * (DDP_STORAGE_DATA, 1.5): the engine holds its own through set-up all
   * the same (its peak counts them beside the strategy's buffers), or, for
   * a strategy with take_values (1.7), those of one unit at a time (the
   * largest unit's claimed parameters), and none from the first step on. */
  ddp_status (*claims)(void* ctx, ddp_storage what, size_t param);
  /* (1.6) Strategy: a value of one of its own keys ("stage", "3", as TOML
   * writes it) under which this rank would hold less than under the keys it
   * plans now; call it once per such setting, the mildest first. Where a
   * run does not fit the host (the fit check of `ddp run` and `ddp plan`),
   * the engine plans it again with each and names the first that fits:
   * "strategy.stage = 3 needs 18.6 GB". An engine older than 1.6 has no
   * such entry: check DDP_PLAN_HAS(plan, leaner). */
  ddp_status (*leaner)(void* ctx, const char* key, const char* value);
  /* (1.8) Strategy: the collectives it reports after this call happen once
   * every `steps` steps (its sync points: a strategy with
   * DDP_CAP_DIVERGENT), not every step; every(ctx, 1) returns to every
   * step. One period a plan. `ddp plan` lists them apart, per sync point,
   * and counts them once per `steps` steps in the mean per step. Check
   * DDP_PLAN_HAS(plan, every). */
  ddp_status (*every)(void* ctx, int64_t steps);
  /* (1.9) Strategy: a collective of a group of `group_size` ranks (one
   * its create makes with ddp_host::split: the plan knows no groups, so
   * the plugin sizes them from its keys and the world); collective() is
   * group_collective() of the world. The engine meters it on that many
   * ranks (bus bytes). Check DDP_PLAN_HAS(plan, group_collective). */
  ddp_status (*group_collective)(void* ctx, const ddp_plan_collective* collective, int group_size);
  /* (1.9) For a transport's plan: the group size of each of `collectives`
   * (the world's where the strategy named none); NULL from an engine
   * older than 1.9. */
  const int32_t* group_sizes;
} ddp_plan;

/* Whether `plan` (a ddp_plan*) offers entry `entry`: its struct_size
 * reaches past it and it is not NULL. */
#define DDP_PLAN_HAS(plan, entry)                                                                                \
  ((plan)->struct_size >= (size_t)((const char*)&(plan)->entry - (const char*)(plan)) + sizeof((plan)->entry) && \
   (plan)->entry != NULL)

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DDP_ABI_PLAN_H */
