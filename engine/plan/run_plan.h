// run_plan.h — what a run will hold and send, predicted from its config
// alone (`ddp plan`): per rank, the peak bytes of each memory category at
// the three moments summary.json reports, and the collectives of one step
// with their bytes. Pure functions of the model's footprint (models/
// model.h) and the shipped strategies' rules; tests/plan_test.py runs every
// shipped strategy and compares with what the runs measure.
//
// The rules, per strategy (trainable bytes G = 4 x trainable elements):
//   naive, overlap   no buffers; an all-reduce per trainable parameter
//   flat             no buffer: the packed gradients averaged in place
//                    (with in_place = false one buffer of G); one
//                    all-reduce of G
//   bucketed         buckets (strategies/common/buckets.h) averaged in
//                    the gradients' memory, which the engine lays out as
//                    they need: no buffer but a 16-bit copy with compress
//                    (G / 2 in all); with in_place = false a buffer per
//                    bucket besides, G in all; an all-reduce per bucket
//                    (2 bytes per element compressed)
//   sharded          optimizer state for the parameters the rank owns
//                    (strategies/common/partition.h); variant "broadcast":
//                    bucketed's buffers and all-reduces, then a broadcast per
//                    trainable parameter; "allgather": a flat buffer of
//                    N x S elements and a shard of S (S: the largest rank's
//                    elements), one reduce-scatter and one all-gather
// Collectives beside compute (issued while the rank still computes):
// overlap's all but the last; of the buckets (bucketed, sharded's
// "broadcast") all but the last, and the last too with bucketed's
// overlap_optimizer (it runs beside the updates of the buckets before it,
// where there are any, and unless gradients are clipped: the engine then
// waits for all of them before any update).
// The transports' own buffers: gloo's reduce-scatter scratch on a CPU run,
// (N - 1) receive buffers, grown to the largest; nccl's 4-byte barrier
// buffer; mpi none. (gloo's staging on a CUDA run is not planned.)
// Memory that depends on the step (the optimizer's state, created by the
// first update) is that of a run's steady state: runs of two steps or more.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <ddp/plugin.h>

#include "model.h"
#include "overhead_model.h"

namespace ddp {
namespace plan {

// Bytes per memory category, in ddp_mem_category order: parameters,
// gradients, optimizer_state, comm_buffers, activations.
using Bytes = std::array<int64_t, DDP_MEM_CATEGORY_COUNT>;

struct RunInput {
  Footprint model;
  int world_size = 1;
  int64_t rows_per_rank = 0;  // rows of one micro-batch on one rank
  std::string optimizer = "sgd";  // "sgd" | "adamw"
  double momentum = 0.0;          // sgd
  std::string strategy = "naive";
  double bucket_mb = 25.0;             // bucketed, sharded (broadcast)
  std::string compress = "none";       // bucketed: "none" | "bf16" | "fp16"
  bool overlap_optimizer = true;       // bucketed: updates bucket by bucket as averages arrive
  bool in_place = true;                // bucketed, flat: averaged in the gradients' memory
  bool clips = false;                  // optimizer.clip_grad_norm > 0: the engine waits for every gradient
  std::string variant = "broadcast";   // sharded: "broadcast" | "allgather"
  std::string transport = "gloo";      // "gloo" | "mpi" | "nccl"
  ddp_device_kind device = DDP_DEVICE_CPU;
};

struct RankMemory {
  Bytes after_setup{}, before_optimizer_step{}, after_optimizer_step{};
};

// One collective of a step on one rank: its name as summary.json and the
// transport count it ("all_reduce", ...) and its bytes as comm_bytes
// counts them (the buffer; all_gather: what it receives).
// beside_compute: issued while the rank still computes (the rules above):
// on a CPU it shares the cores with that compute.
struct Collective {
  std::string op;
  int64_t bytes = 0;
  bool beside_compute = false;
};

struct RunPlan {
  std::vector<RankMemory> ranks;          // rank r at index r
  std::vector<Collective> collectives;    // one step's, in the order they start
  int64_t comm_bytes() const;             // their bytes, summed
};

// Throws std::invalid_argument naming what it cannot plan (a strategy it
// does not know, an optimizer, a world size below 1).
RunPlan plan_run(const RunInput& in);

// Seconds the collectives take at `world` ranks, from the all-reduce fit of
// `ddp bench-comm` (t = o + bytes / w): each costs o plus its bus bytes
// (plugin_host.h: what crosses a link) at the rate an all-reduce moves
// them, so a reduce-scatter or all-gather of b bytes takes o + b / (2 w).
// 0 at world 1. With `busy` (a fit measured under load: `ddp bench-comm
// --load gemm`), the collectives beside compute are priced with it
// instead. A collective costs at least nothing: a fit whose o came out
// negative (as a least-squares fit of noisy times may) would otherwise
// price a small one below zero.
double collective_seconds(const Collective& c, const strategy::OverheadFit& fit, int world,
                          const strategy::OverheadFit* busy = nullptr);
double comm_seconds(const std::vector<Collective>& collectives, const strategy::OverheadFit& fit, int world,
                    const strategy::OverheadFit* busy = nullptr);

}  // namespace plan
}  // namespace ddp
