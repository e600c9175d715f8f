// optimizer.h — the engine's optimizers, run on any subset of parameters (the
// sharded strategy asks for its own shard only). State lives in the
// OptimizerState memory category and exists only for parameters stepped.
#pragma once

#include <vector>

#include "config.h"
#include "model.h"

namespace ddp {

class Optimizer {
 public:
  Optimizer(const OptimizerConfig& config, Device& device) : config_(config), device_(device) {}
  // Updates params[i] from params[i].grad for every i in `indices`
  // (frozen ones are skipped).
  void step(std::vector<Parameter>& params, const std::vector<size_t>& indices);

 private:
  OptimizerConfig config_;
  Device& device_;
};

}  // namespace ddp
