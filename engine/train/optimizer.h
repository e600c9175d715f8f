// optimizer.h — the engine's optimizers with torch.optim's semantics, run on
// any subset of parameters (the sharded strategy asks for its own shard
// only). State (momentum; AdamW's moments and step count) is created for a
// parameter the first time it is stepped, in the OptimizerState memory
// category, so a rank that steps 1/N of the parameters holds 1/N of the
// state.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "config.h"
#include "model.h"

namespace ddp {

// One parameter's optimizer state as a checkpoint holds it, on the host:
// `steps` (AdamW's step count; 0 for SGD), `first` (SGD's momentum_buffer or
// AdamW's exp_avg; empty if none), `second` (AdamW's exp_avg_sq).
struct SavedState {
  int64_t steps = 0;
  std::vector<float> first, second;
};

class Optimizer {
 public:
  // Resolves each parameter's group (lr, weight_decay). Throws ConfigError
  // for a group pattern that matches no parameter.
  Optimizer(const OptimizerConfig& config, Device& device, const std::vector<Parameter>& params);
  ~Optimizer();

  // Updates params[i] from params[i].grad for every i in indices[0, count).
  // Frozen parameters and parameters the model never uses (no gradient, as
  // a PyTorch parameter whose .grad is None) are skipped. Allocates nothing
  // after a parameter's first step (strategies call it per bucket per step).
  void step(std::vector<Parameter>& params, const size_t* indices, size_t count);
  void step(std::vector<Parameter>& params, const std::vector<size_t>& indices) {
    step(params, indices.data(), indices.size());
  }

  // The state of params[i] as this rank holds it; none if it never stepped i.
  std::optional<SavedState> saved(size_t i) const;
  // Whether this rank holds state for params[i], and its step count.
  bool has_state(size_t i) const { return i < state_.size() && state_[i]; }
  int64_t state_steps(size_t i) const { return has_state(i) ? state_[i]->steps : 0; }
  bool is_adamw() const { return config_.name == "adamw"; }
  // Whether a stepped parameter has state to keep: AdamW's moments, SGD's momentum.
  bool keeps_state() const { return is_adamw() || config_.momentum != 0.0; }
  // A resumed run's state (by parameter index), taken up when a parameter
  // is first stepped: a rank of `sharded` materialises its own shard only.
  // Whatever no step claimed is dropped by drop_unclaimed().
  void restore_on_first_step(std::map<size_t, SavedState> states) { pending_ = std::move(states); }
  void drop_unclaimed() { pending_.clear(); }
  // Begins a training step: every group's lr times `lr_scale` ([schedule]
  // lr) from now on, and the last step's grad_squares forgotten.
  void begin_step(double lr_scale);
  // Per parameter, the sum of the squares of the gradient this step's update
  // read (sum_of_squares, schedule.h, bit for bit) where the update measured
  // it (AdamW on the CPU), else NaN.
  const std::vector<double>& grad_squares() const { return grad_sq_; }

 private:
  struct State {
    int64_t steps = 0;
    Tensor first;   // momentum buffer (sgd) or exp_avg (adamw)
    Tensor second;  // exp_avg_sq (adamw)
  };
  struct Hyper {
    double lr, weight_decay;
  };
  void sgd(Parameter& p, const Hyper& h, State& s);
  void adamw(size_t i, Parameter& p, const Hyper& h, State& s);

  OptimizerConfig config_;
  Device& device_;
  std::vector<Hyper> hyper_;                   // per parameter
  std::vector<std::unique_ptr<State>> state_;  // per parameter, made on first step
  std::map<size_t, SavedState> pending_;       // restored, not yet claimed
  double lr_scale_ = 1.0;
  std::vector<double> grad_sq_;  // per parameter: see grad_squares
  void take_up(size_t i, const Parameter& p, State& s);
};

// fnmatch-style glob over parameter names: `*` any run (dots too), `?` one.
bool name_matches(const std::string& pattern, const std::string& name);

}  // namespace ddp
