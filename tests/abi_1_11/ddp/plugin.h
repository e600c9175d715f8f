/* ddp/plugin.h — THE public C ABI between the ddp engine and its plugins.
 * The one header a plugin includes; it includes one part per concern, in
 * the order a newcomer reads them:
 *   ddp/abi/values.h     versions, statuses, dtypes, caps, and the plain
 *                        structs that cross by pointer (buffers, parameters,
 *                        units, ranges, groups, compute descriptors)
 *   ddp/abi/strategy.h   ddp_strategy_v1: decides what to move, when; its
 *                        entries in the order of a run's life (before any
 *                        rank, set-up, each step, between steps, the end),
 *                        the order of hooks and the packed gradients
 *   ddp/abi/host.h       ddp_host: what the engine offers a plugin, by
 *                        purpose (memory, streams, groups, compute, ...)
 *   ddp/abi/transport.h  ddp_transport_v1: moves bytes between ranks
 *   ddp/abi/plan.h       what a plugin tells `ddp plan` before any rank starts
 *
 * A plugin is a shared library that exports exactly one const descriptor,
 * ddp_transport_v1 or ddp_strategy_v1 (DDP_TRANSPORT_ENTRY,
 * DDP_STRATEGY_ENTRY), filled with designated initializers: abi_version,
 * struct_size, name, version and capability bits, then the entries it has
 * (every other one is NULL). The engine passes a ddp_host vtable in. A
 * plugin includes only this header (and, if it likes, the header-only
 * helpers ddp/plugin.hpp, ddp/transport.hpp and ddp/numeric.h, and the
 * strategy kit <ddp/strategy/...>) and links no engine.
 *
 * CAPS (values.h) and what each asks of a strategy:
 *   cap                      the strategy                  needs entries / caps
 *   DDP_CAP_DEVICE_CPU,      works on that device's memory  -
 *     DDP_CAP_DEVICE_CUDA
 *   DDP_CAP_OWNS_OPTIMIZER   replaces the optimizer step   optimizer_step
 *   DDP_CAP_OWNS_GRADIENTS   may claim gradient storage    DDP_CAP_OWNS_OPTIMIZER;
 *                                                          grad_ranges or held_ranges
 *   DDP_CAP_OWNS_PARAMETERS  may claim parameter values    DDP_CAP_OWNS_OPTIMIZER;
 *                                                          unit_values (take_values:
 *                                                          lent unit by unit)
 *   DDP_CAP_DIVERGENT        replicas differ between       on_step_end; neither
 *                            sync points                   OWNS_GRADIENTS nor
 *                                                          OWNS_PARAMETERS
 *   DDP_CAP_REDUCE_DTYPE     reduces gradients in the      reads ddp_host::precision
 *                            run's [precision] reduce
 * Every strategy has create, on_train_begin, finish and destroy; every
 * transport init, destroy, all_reduce, broadcast, all_gather and barrier.
 * The loader refuses a plugin that lacks one, naming it.
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
 *   uses struct_size to see which exist. An optional entry left NULL means
 *   what its comment documents. A plugin built against a newer minor
 *   checks host->struct_size before calling a host entry that the engine's
 *   minor may lack: DDP_HOST_HAS(host, entry) (ddp/abi/host.h). The engine
 *   checks a descriptor's the same way (DDP_PLUGIN_HAS).
 * - Structs passed by pointer (ddp_buffer, ddp_param, ddp_unit, ddp_range,
 *   ddp_step_info, ddp_plan, ddp_group, ddp_split) may grow at the end in a
 *   minor version; use only the fields you know (ddp/abi/values.h).
 * - Threads: the engine calls plugin entries from its training thread only;
 *   which host entries may be called from which thread: ddp/abi/host.h.
 *
 * Stability: changing or removing anything here is a new major ABI version
 * (a new entry symbol, e.g. ddp_strategy_v2). Adding at the end is a minor.
 * A plugin built against any 1.x header loads in an engine of 1.x or newer.
 *
 * CHANGELOG, the minor versions of ABI 1 (the one place history is kept):
 *   1.0  the first release.
 *   1.1  ddp_host: alloc_host, free_host (staging memory on the host for a
 *        device's buffers).
 *   1.2  strategy: held_grads (clipping where each averaged gradient is on
 *        one rank).
 *   1.3  ddp_host: convert (float32 <-> bfloat16, float16); transports
 *        declare dtypes; both descriptors may list their keys.
 *   1.4  strategies that own memory and plan themselves: ddp_param's
 *        shape, unit and uses; units (ddp_unit, on_unit); total_steps,
 *        on_train_end; gradient storage a strategy claims and binds
 *        (DDP_CAP_OWNS_GRADIENTS, claim, bind), the optimizer on element
 *        ranges (ddp_range, run_optimizer_ranges) and grad_ranges;
 *        ddp_host::add; the plan entries (ddp/abi/plan.h). on_step_begin,
 *        on_grad_ready, on_backward_end and a transport's reduce_scatter
 *        become optional.
 *   1.5  parameter values a strategy claims and binds (DDP_STORAGE_DATA,
 *        DDP_CAP_OWNS_PARAMETERS) and lends back (unit_values).
 *   1.6  ddp_plan::leaner: settings of a strategy's keys that hold less.
 *   1.7  take_values: claimed initial values lent unit by unit.
 *   1.8  replicas that differ on purpose: DDP_CAP_DIVERGENT, on_step_end;
 *        a strategy's own state in checkpoints (state, ddp_state_buffer);
 *        ddp_plan::every, for collectives of sync points.
 *   1.9  strategies beyond one group, on the device: process groups
 *        (ddp_host::split and group, ddp_group; ddp_transport_v1_t::split,
 *        ddp_split; ddp_plan::group_collective and group_sizes); gradients
 *        held by several replicas (held_ranges, ddp_held_range); state
 *        equal on every rank (state_scopes, ddp_state_scope); compute on a
 *        stream (ddp_host::gemm, dot, norm, axpy, normalize; ddp_gemm,
 *        ddp_vectors).
 *   1.10 the engine's optimizer ordered by a strategy's reductions:
 *        ddp_host::grads_final (a strategy need not own the optimizer
 *        step only to order it).
 *   1.11 mixed precision: the run's dtypes and loss scaling
 *        (ddp_host::precision, ddp_precision), a step's skipped update
 *        (ddp_host::step_skipped); DDP_CAP_REDUCE_DTYPE; ddp_plan::clips
 *        also under loss scaling.
 * Header-only helpers (ddp_dtype_*, DDP_*_ENTRY, DDP_*_HAS, ddp/numeric.h,
 * ddp/plugin.hpp, ddp/transport.hpp, the strategy kit) are no ABI change.
 */
#ifndef DDP_PLUGIN_H
#define DDP_PLUGIN_H

#include "abi/host.h"
#include "abi/plan.h"
#include "abi/strategy.h"
#include "abi/transport.h"
#include "abi/values.h"

#endif /* DDP_PLUGIN_H */
