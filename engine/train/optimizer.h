// optimizer.h — the engine's optimizers with torch.optim's semantics, run on
// any subset of parameters, or of their elements (the sharded strategy asks
// for its own shard only: whole parameters in stage 1, element ranges in
// stage 2). State (momentum; AdamW's moments and step count) is created for
// a range the first time it is stepped, in the OptimizerState memory
// category, so a rank that steps 1/N of the elements holds 1/N of the
// state. State never moves: a range that overlaps another's state is
// refused, naming the parameter.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "config.h"
#include "model.h"

namespace ddp {

// Optimizer state as a checkpoint holds it, on the host: `steps` (AdamW's
// step count; 0 for SGD), `first` (SGD's momentum_buffer or AdamW's
// exp_avg; empty if none), `second` (AdamW's exp_avg_sq): of a whole
// parameter, or of its elements [offset, offset + count) (a piece).
struct SavedState {
  int64_t steps = 0;
  std::vector<float> first;
  std::vector<float> second;
  size_t offset = 0;
  size_t count = 0;
};

// Elements [offset, offset + count) of params[param] to update from `grad`
// (ddp_range): values at `data`, or the parameter's own + offset if null.
struct StepRange {
  size_t param = 0;
  size_t offset = 0;
  size_t count = 0;
  const float* grad = nullptr;
  float* data = nullptr;
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
  // Updates each range's elements from its gradient, as step() does whole
  // parameters (step() is the ranges that cover them). Throws Error naming
  // the parameter for a range outside it, or one that overlaps a range of
  // this parameter's state but is not that range.
  void step_ranges(std::vector<Parameter>& params, const StepRange* ranges, size_t count);

  // The state of params[i] as this rank holds it, one piece per range it
  // stepped (offset 0 and count numel: the whole parameter); none if it
  // never stepped i.
  std::vector<SavedState> saved(size_t i) const;
  // Whether this rank holds state for params[i] (a piece or all), and its
  // step count.
  bool has_state(size_t i) const { return i < state_.size() && !state_[i].empty(); }
  int64_t state_steps(size_t i) const { return has_state(i) ? state_[i].front()->steps : 0; }
  // The (offset, count) of each range of params[i] this rank holds state for.
  std::vector<std::pair<size_t, size_t>> state_ranges(size_t i) const {
    std::vector<std::pair<size_t, size_t>> out;
    if (i < state_.size())
      for (const auto& s : state_[i]) out.emplace_back(s->offset, s->count);
    return out;
  }
  // Whether that state is the whole parameter's, in one piece.
  bool whole_state(size_t i, size_t numel) const {
    return has_state(i) && state_[i].size() == 1 && state_[i][0]->offset == 0 && state_[i][0]->count == numel;
  }
  bool is_adamw() const { return config_.name == "adamw"; }
  // Whether a stepped parameter has state to keep: AdamW's moments, SGD's momentum.
  bool keeps_state() const { return is_adamw() || config_.momentum != 0.0; }
  // A resumed run's state, taken up when a range of a parameter is first
  // stepped: restore(param, offset, count, out) fills `out` with that
  // slice of it (false: none saved), so a rank of `sharded` reads its own
  // shard only. drop_unclaimed() lets it go.
  using Restore = std::function<bool(size_t param, size_t offset, size_t count, SavedState& out)>;
  void restore_on_first_step(Restore restore) { restore_ = std::move(restore); }
  void drop_unclaimed() { restore_ = nullptr; }
  // Begins a training step: every group's lr times `lr_scale` ([schedule]
  // lr) from now on, and the last step's grad_squares forgotten.
  void begin_step(double lr_scale);
  // Until the next begin_step, step and step_ranges update nothing
  // ([precision] loss scaling's skipped step, as GradScaler skips
  // optimizer.step()): a range's state is made as a first update would
  // start from it (zero moments, 0 steps: the same bits once it updates)
  // or taken up from a resumed checkpoint, so that a checkpoint after it
  // holds the state.
  void skip_step() { skipping_ = true; }
  // Per parameter, the sum of the squares of the gradient this step's update
  // read (sum_of_squares, update_rules.h, bit for bit) where the update measured
  // it (AdamW on the CPU), else NaN.
  const std::vector<double>& grad_squares() const { return grad_sq_; }

 private:
  // The state of elements [offset, offset + count) of a parameter.
  struct State {
    size_t offset = 0;
    size_t count = 0;
    int64_t steps = 0;
    Tensor first;   // momentum buffer (sgd) or exp_avg (adamw) [count]
    Tensor second;  // exp_avg_sq (adamw) [count]
  };
  struct Hyper {
    double lr;
    double weight_decay;
  };
  // The state of `r`, made (and taken up from restore_) at its first step.
  State& state_for(const Parameter& p, const StepRange& r);
  void sgd(const StepRange& r, float* w, const Hyper& h, State& s);
  void adamw(const StepRange& r, float* w, const Hyper& h, State& s, bool whole);

  OptimizerConfig config_;
  Device& device_;
  std::vector<Hyper> hyper_;  // per parameter
  // Per parameter, the ranges it was stepped in (made on first step; one
  // covering it for a whole parameter), in the order they came.
  std::vector<std::vector<std::unique_ptr<State>>> state_;
  Restore restore_;  // a resumed run's state, until drop_unclaimed
  double lr_scale_ = 1.0;
  bool skipping_ = false;         // skip_step's, until begin_step
  std::vector<double> grad_sq_;   // per parameter: see grad_squares
  std::vector<StepRange> whole_;  // step()'s ranges, kept: it allocates nothing once settled
  void take_up(size_t i, const Parameter& p, State& s);
};

// fnmatch-style glob over parameter names: `*` any run (dots too), `?` one.
bool name_matches(const std::string& pattern, const std::string& name);

}  // namespace ddp
