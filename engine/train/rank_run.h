// rank_run.h — one rank's run as the trainer drives it (trainer.cpp: the
// set-up, the steps and their hooks; run_end.cpp: what the run checks and
// leaves besides its steps: replica checks, resume and checkpoints, the
// averaged losses, summary.json and the weights). Internal to engine/train.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "data.h"
#include "device.h"
#include "initial_values.h"
#include "loss_scale.h"
#include "model.h"
#include "optimizer.h"
#include "plugin_host.h"
#include "rank.h"
#include "rank_plugins.h"
#include "schedule.h"
#include "step_timeline.h"
#include "store.h"
#include "summary.h"
#include "trainer.h"
#include "whole_model.h"

namespace ddp {

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

class RankRun {
 public:
  RankRun(const Config& config, const RankEnv& env, TrainObserver* observer)
      : config_(config), env_(env), observer_(observer) {}

  // Set-up, the steps, the outputs. On any failure the plugins are aborted
  // and shut down before the error (with the step it happened in) goes on.
  void run();

 private:
  void set_up();

  // `ddp run --trace`: the launcher names this rank's trace file.
  void set_up_timeline();
  // The strategy's unit hook; with a trace, each unit's forward is a range
  // of its own ("forward <unit>": from its FORWARD_BEGIN hook's return to
  // its FORWARD_END hook's call).
  void on_unit(size_t unit, ddp_unit_phase phase);
  void train();

  // The communication counters and allocations at the start of a step.
  struct Before {
    int64_t blocked_ns;
    int64_t busy_ns;
    int64_t collectives;
    int64_t bytes;
    int64_t bus_bytes;
    int64_t allocations;
  };

  StepRecord train_step(int64_t step);
  void after_step(int64_t step);
  // [eval]: the mean loss of the held-out batches over ranks (a forward of
  // each, no hooks), the same on every rank.
  double evaluate();
  // [eval]'s (step, loss) so far: a resumed run's from its checkpoint, then this run's.
  std::vector<std::pair<int64_t, double>> val_losses() const;
  void forward(const Batch& batch, int64_t k, StepRecord& rec);

  // Backward, firing on_grad_ready after each parameter's last use.
  // `seed`: the loss's gradient, 1/k times the loss scale.
  void backward(float seed, int64_t collectives_at_start, StepRecord& rec);
  // [precision] loss_scale, after finish: the gradients checked for inf
  // and NaN on every rank and the verdict agreed; then divided by the
  // scale (and clipped) or the step skipped on every rank; the scale moves.
  void unscale_gradients(StepRecord& rec);
  void optimizer_step(StepRecord& rec);
  void step_in_final_order();  // the engine's optimizer, after grads_final's groups

  // Every rank's digest of every parameter, compared (replica_check.h);
  // `step` is the step just done, -1 the end of the run.
  void check_replicas(int64_t step);

  // --resume: the checkpoint's parameters, optimizer state (taken up at
  // each parameter's first step), frozen set and losses; training goes on
  // after its step. A config that changes what the run trains is refused.
  void resume();
  // A resumed run, after on_train_begin, before its first step: the
  // strategy's own state (its `state` entry) from the checkpoint, and
  // where the replicas differed, this rank's own parameters (on_train_begin
  // may have broadcast rank 0's). Refuses state the checkpoint lacks, by name.
  void put_back_resumed_state();
  void put_back_strategy_state(const std::vector<RankPlugins::StateBuffer>& buffers);
  void agree_on_state(const std::vector<RankPlugins::StateBuffer>& buffers);
  void refuse_untaken_state(const SafetensorsReader& file, const std::vector<RankPlugins::StateBuffer>& buffers) const;
  // The strategy's state (its `state` entry) as host copies, for a checkpoint.
  std::vector<NamedFloats> strategy_state(std::vector<std::vector<float>>& storage);

  // Each rank's own first values (a test's snapshot before on_train_begin).
  std::vector<std::vector<float>> initial_snapshot();

  // After `step` steps: every rank's part of a checkpoint (checkpoint.h).
  void checkpoint(int64_t step);

  // The global L2 norm of the averaged gradients (summed across ranks where
  // the strategy partitions them). With `clip`, after finish: waits for
  // every gradient, then clips them to optimizer.clip_grad_norm; else after
  // the optimizer step, when every strategy has them all in place.
  // `unscale`: the factor the gradients are at (1 / the loss scale): the
  // norm is theirs times it, and they are multiplied by it.
  // `global`: set to whether the norm added every rank's part (then the
  // same on every rank).
  double gradient_norm(bool clip, double unscale = 1.0, bool* global = nullptr);
  bool held_gradients(std::vector<GradSpan>& spans);
  bool held_ranges(std::vector<GradSpan>& spans);
  void gather_checking_coverage(const std::vector<double>& mine, std::vector<double>& all);
  bool unfreeze(int64_t step);

  // The indices of trainable parameters; kept, not rebuilt every step.
  void refresh_trainable();

  // Replaces the local losses not yet averaged by their mean over ranks (the
  // loss single-process training would report), summed in rank order: the
  // same bits however the steps are grouped.
  void average_losses();

  // The averaged losses, then a progress line from rank 0.
  void report(int64_t step);

  // Every rank's totals to every rank; rank 0 writes weights and summary;
  // each rank its trace.
  void finish_run();
  // weights.safetensors (from `held` where the strategy holds the values), then summary.json.
  void write_summary(const std::vector<double>& all);
  void stop_plugins();
  // Every parameter's values on the host for `reader`, through the
  // store's per-unit view (param_store.h).
  HostVisit host_visit(const char* reader);

  // What the run is given.
  const Config config_;
  const RankEnv env_;
  TrainObserver* const observer_;
  // What set_up builds, in this order (and destroys in reverse: the device
  // last). The plugins are shut down explicitly before any of it goes.
  std::unique_ptr<Device> device_;       // run.device
  std::unique_ptr<Device> host_device_;  // the data's buffers on a GPU run
  std::unique_ptr<Model> model_;
  std::unique_ptr<InitialValues> initial_;  // where the values come from, until they all have
  std::unique_ptr<StepTimeline> timeline_;
  std::unique_ptr<Dataset> data_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<Store> store_;
  HostServices services_;
  std::unique_ptr<RankPlugins> plugins_;
  std::string trace_path_;                   // empty: no trace
  std::vector<std::string> forward_ranges_;  // with a trace: "forward <unit>" per unit
  StepTimeline::Mark unit_begin_;            // where the unit computing began
  // The run's state.
  int64_t tokens_per_row_ = 1;          // positions a row trains (lm: context_length)
  std::vector<size_t> trainable_;       // indices of trainable parameters
  std::vector<GradSpan> spans_;         // held_gradients', kept
  std::vector<StepRange> step_ranges_;  // run_optimizer_ranges', kept
  std::vector<size_t> unnamed_;         // step_in_final_order's, kept
  std::vector<int> remaining_uses_;     // per parameter, this micro-batch's backward
  std::vector<StepRecord> records_;
  size_t reported_ = 0;
  std::vector<int64_t> replica_checked_after_;  // steps (from 1; 0: the end) whose replicas agreed
  bool check_due_ = false;                      // until the next sync point
  bool eval_due_ = false;
  bool weights_synced_ = true;          // the last step was a sync point: weights.safetensors holds every rank's model
  std::unique_ptr<Dataset> eval_data_;  // [eval]'s held-out rows (null: off)
  bool evaluating_ = false;
  double eval_s_ = 0;
  double replica_check_s_ = 0;
  int64_t start_step_ = 0;                                   // a resumed run's first step
  std::vector<double> loss_prefix_;                          // its checkpoint's losses, steps 1..start_step_
  std::string resumed_from_;                                 // the checkpoint ("": none)
  Resumed resumed_;                                          // what it said of itself
  LossScale scale_ = initial_loss_scale(config_.precision);  // [precision] loss_scale's (1: none)
  std::vector<int64_t> checkpoints_;                         // after which steps this run wrote one
  double checkpoint_s_ = 0;
  PeakBytes mem_after_setup_{};
  PeakBytes mem_before_optimizer_{};
  PeakBytes mem_after_optimizer_{};
};

}  // namespace ddp
