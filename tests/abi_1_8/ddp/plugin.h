/* ddp/plugin.h — THE public C ABI between the ddp engine and its plugins.
 * The one header a plugin includes; it includes one part per concern:
 *   ddp/abi/values.h     versions, statuses, dtypes, caps, parameters, units
 *   ddp/abi/host.h       ddp_host: what the engine offers a plugin
 *   ddp/abi/plan.h       what a plugin tells `ddp plan` (1.4)
 *   ddp/abi/transport.h  ddp_transport_v1: moves bytes between ranks
 *   ddp/abi/strategy.h   ddp_strategy_v1: decides what to move, when; the
 *                        order of hooks, on_grad_ready and packed gradients
 *
 * A plugin is a shared library that exports exactly one const descriptor,
 * ddp_transport_v1 or ddp_strategy_v1 (DDP_TRANSPORT_ENTRY,
 * DDP_STRATEGY_ENTRY), beginning with abi_version, struct_size, name,
 * version and capability bits, then a vtable. The engine passes a ddp_host
 * vtable in (logging, the plugin's TOML keys, parameters and units, device
 * memory, streams and events, the rendezvous store, the optimizer). A
 * plugin includes only this header (and, if it likes, the header-only
 * helpers ddp/plugin.hpp and ddp/numeric.h) and links no engine.
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
 *   ddp_step_info, ddp_plan) may grow at the end in a minor version; use
 *   only the fields you know (ddp/abi/values.h).
 * - Threads: the engine calls plugin entries from its training thread only;
 *   which host entries may be called from which thread: ddp/abi/host.h.
 *
 * Stability: changing or removing anything here is a new major ABI version
 * (a new entry symbol, e.g. ddp_strategy_v2). Adding at the end is a minor.
 * A plugin built against any 1.x header loads in an engine of 1.x or newer.
 *
 * Minor versions of ABI 1:
 *   1.0  the first release.
 *   1.1  ddp_host gains alloc_host and free_host (staging memory on the
 *        host for a device's buffers). Check DDP_HOST_HAS(host, free_host),
 *        i.e. host->struct_size >= offsetof(ddp_host, free_host) +
 *        sizeof(host->free_host), before calling them.
 *   1.2  ddp_strategy_v1_t gains held_grads (gradient clipping under a
 *        strategy that leaves each averaged gradient on one rank).
 *   1.3  ddp_host gains convert (float32 <-> bfloat16, float16); transports
 *        declare dtypes; both descriptors may list their TOML keys.
 *   1.4  strategies that own memory and plan themselves: ddp_param gains
 *        its shape, unit and uses; the model's units (ddp_unit, unit hooks
 *        on_unit); total_steps and on_train_end; gradient storage a
 *        strategy claims and binds (DDP_CAP_OWNS_GRADIENTS), the optimizer
 *        on element ranges (ddp_range) and grad_ranges; ddp_host::add; the
 *        plan entries (ddp/abi/plan.h). on_step_begin, on_grad_ready,
 *        on_backward_end and a transport's reduce_scatter become optional.
 *   1.5  parameter values a strategy claims and binds (DDP_STORAGE_DATA,
 *        DDP_CAP_OWNS_PARAMETERS) and lends back (unit_values).
 *   1.6  ddp_plan gains leaner: a strategy names settings of its keys that
 *        hold less, for the fit check's suggestion.
 *   1.7  take_values: a strategy that claims values is lent their initial
 *        values unit by unit; the engine never holds them all.
 *   1.8  strategies whose replicas differ on purpose: DDP_CAP_DIVERGENT
 *        and on_step_end, which says which steps are sync points; a
 *        strategy's own state in checkpoints (state, ddp_state_buffer);
 *        ddp_plan::every, for collectives of sync points.
 * Header-only helpers (ddp_dtype_*, DDP_*_ENTRY, DDP_*_HAS, ddp/numeric.h,
 * ddp/plugin.hpp) are no ABI change.
 */
#ifndef DDP_PLUGIN_H
#define DDP_PLUGIN_H

#include "abi/values.h"
#include "abi/host.h"
#include "abi/plan.h"
#include "abi/transport.h"
#include "abi/strategy.h"

#endif /* DDP_PLUGIN_H */
