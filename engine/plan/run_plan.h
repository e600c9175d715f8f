// run_plan.h — what a run will hold and send, predicted from its config
// alone (`ddp plan`): per rank, the peak bytes of each memory category at
// the three moments summary.json reports, and the collectives of one step
// with their bytes. The engine's part is its own (parameters, the
// gradients it holds, the optimizer state of what is stepped, activations
// and batches); the plugins' part is what their plan entries say
// (plugin_plan.h): collectives, buffers, the elements a strategy's
// optimizer steps, the gradients it claims. A plugin without a plan entry
// is planned for everything but its own part, and the plan says so.
// tests/plan_test.py runs every shipped strategy and compares with what the
// runs measure.
//
// Memory that depends on the step (the optimizer's state, created by the
// first update) is that of a run's steady state: runs of two steps or more.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <ddp/plugin.h>
#include <ddp/overhead_model.hpp>

#include "model.h"
#include "plugin_plan.h"

namespace ddp {
namespace plan {

struct RunInput {
  Footprint model;
  int world_size = 1;
  int64_t rows_per_rank = 0;      // rows of one micro-batch on one rank
  std::string optimizer = "sgd";  // "sgd" | "adamw"
  double momentum = 0.0;          // sgd
};

// What the plugins said of one rank; `owns_optimizer`: the strategy's caps
// have DDP_CAP_OWNS_OPTIMIZER (then only what it says it steps has state).
struct RankParts {
  PluginPart strategy;
  PluginPart transport;
  bool owns_optimizer = false;
};

struct RankMemory {
  Bytes after_setup{};
  Bytes before_optimizer_step{};
  Bytes after_optimizer_step{};
};

struct RunPlan {
  std::vector<RankMemory> ranks;        // rank r at index r
  std::vector<Collective> collectives;  // a step's, in the order they start (rank 0's); with those of sync points
  std::vector<std::string> unplanned;   // "strategy plugin 'x'": plugins without a plan entry
  // The strategy's settings of its own keys that hold less, mildest first
  // (key, TOML value; ddp_plan::leaner): the fit check tries them.
  std::vector<std::pair<std::string, std::string>> leaner;
  // Those of every step, or those of the sync points (periodic: once
  // every every() steps; ddp_plan::every, 1.8), and that period (1: none).
  std::vector<Collective> step_collectives(bool periodic = false) const;
  int64_t every() const;
};

// Throws std::invalid_argument naming what it cannot plan (an optimizer, a
// world size below 1, parts for another number of ranks, ranks whose
// strategy plans different collectives).
RunPlan plan_run(const RunInput& in, const std::vector<RankParts>& parts);

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
