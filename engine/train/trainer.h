// trainer.h — one rank's training run: builds the device, model, data,
// optimizer and plugins from the config, runs the steps with the strategy's
// hooks in their contract order (plugin.h), and writes weights and
// summary.json (rank 0).
#pragma once

#include <cstdint>

#include "config.h"
#include "model.h"
#include "rank.h"

namespace ddp {

// Lets tests look at the weights: step -1 before the strategy's set-up
// (each rank's own initialisation), 0 after it, s after optimizer step s;
// `values`: every parameter's, on the host, in table order (read unit by
// unit where the strategy holds them: the store, engine/host/param_store.h).
class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  virtual void on_weights(int64_t step, const std::vector<std::vector<float>>& values) = 0;
  // An overflow injected into step `step` (from 0) on this rank: its loss
  // is inf and its backward starts from an infinite loss gradient, so every
  // gradient it makes is inf or NaN, as an fp16 overflow's would be.
  virtual bool overflow(int64_t step) {
    (void)step;
    return false;
  }
};

// Runs the whole training of one rank. Throws Error on any failure, with
// its kind, and the step and plugin entry where known (error.h).
void train_rank(const Config& config, const RankEnv& env, TrainObserver* observer = nullptr);

}  // namespace ddp
