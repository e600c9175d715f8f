// trainer.h — one rank's training run: builds the device, model, data,
// transport and strategy from the config, runs the steps with the strategy's
// hooks in their contract order, and writes weights and summary.json.
#pragma once

#include <cstdint>
#include <string>

#include "config.h"
#include "data.h"
#include "host.h"
#include "model.h"

namespace ddp {

// Where this rank meets the others (see store.h) and who it is.
struct RankEnv {
  RankInfo rank;
  std::string rendezvous;    // "file:<dir>" or "redis:<host>:<port>"
  std::string run_id = "ddp";  // key prefix in the store, unique per run
};

// Lets tests look at the weights: step -1 before the strategy's set-up
// (each rank's own initialisation), 0 after it, s after optimizer step s.
class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  virtual void on_weights(int64_t step, const Model& model) = 0;
};

// The model the config names, initialised from `seed`, and what data it
// consumes.
std::unique_ptr<Model> build_model(const ModelConfig& config, Device& device, uint64_t seed, DataShape* shape);

// Runs the whole training of one rank. Throws Error (with the rank's number
// in the message) on any failure.
void train_rank(const Config& config, const RankEnv& env, TrainObserver* observer = nullptr);

}  // namespace ddp
