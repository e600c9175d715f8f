// summary.h — what a run reports: a StepRecord per optimizer step, memory
// peaks over three windows of every step, and summary.json, built from them
// by a pure function (run_summary). The trainer fills the records; the
// ranks exchange their RankTotals at the end (as doubles, one all-gather),
// and rank 0 writes the summary.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "device.h"
#include "huge_pages.h"
#include "loss_scale.h"

namespace ddp {

struct StepRecord {
  double loss = 0;
  double step_s = 0;
  double data_s = 0;
  double forward_s = 0;
  double backward_s = 0;
  double optimizer_s = 0;
  double comm_blocked_s = 0;
  double comm_busy_s = 0;
  int64_t collectives = 0;
  int64_t comm_bytes = 0;
  int64_t bus_bytes = 0;  // sent (and received) by this rank: bus_bytes() of plugin_host.h
  // Collectives the strategy had enqueued when the step's last
  // on_grad_ready was called: > 0 means communication overlapped backward.
  int64_t collectives_before_last_grad_ready = 0;
  // Collectives enqueued during micro-batches without sync_grads: must be 0.
  int64_t collectives_before_sync_micro_batch = 0;
  int64_t comm_buffer_bytes = 0;   // current at the end of the step (a leak grows it)
  int64_t device_allocations = 0;  // device memory allocated during the step
  // The largest collective the strategy issued so far, set-up included (its
  // buffer bytes, as comm_bytes counts them): what a transport that stages
  // collectives (gloo on a GPU) holds a buffer of. Where it grows after the
  // first step, such a transport allocates there, which a CPU run hides.
  int64_t largest_collective_bytes = 0;
  double lr = 0;              // the scheduled learning rate ([optimizer] lr unless a schedule)
  double grad_norm = NAN;     // the averaged gradients' L2 norm before clipping; NaN (null): not measured
  bool synced = true;         // every rank holds the same parameters after it (on_step_end, 1.8)
  double val_loss = NAN;      // [eval]'s mean held-out loss after it; NaN (null): not evaluated
  double loss_scale = NAN;    // what backward's loss was multiplied by ([precision]); NaN (null): not scaled
  bool step_skipped = false;  // its gradients held an inf or NaN on some rank: no rank stepped
};

// Peak bytes per memory category over a window of the run.
using PeakBytes = std::array<size_t, kMemCategories>;

// One rank's figures for every rank's summary: its peak bytes per category
// (over all windows), its total communication times and its collective
// sequence fingerprint.
struct RankTotals {
  PeakBytes peaks{};
  double comm_blocked_s = 0;
  double comm_busy_s = 0;
  uint64_t collective_sequence = 0;  // 52 bits of the fingerprint: exact in a double
  int64_t peak_resident_bytes = -1;  // the process's VmHWM at the end of its steps; -1: unknown

  static constexpr size_t kDoubles = kMemCategories + 4;
  std::vector<double> to_doubles() const;
  static RankTotals from_doubles(const double* values);  // kDoubles of them
};

// What summary.json says of the run besides its steps.
struct RunFacts {
  int world_size = 1;
  int64_t steps = 0;
  std::string model;
  std::string transport;
  std::string strategy;
  std::string compute = "fp32";         // [precision] compute: the dtype of the GEMMs' inputs
  std::optional<LossScale> loss_scale;  // [precision] loss_scale = "dynamic": where it ended
  double rows_per_step = 0;             // data.batch_size * run.grad_accum_steps
  int64_t tokens_per_row = 1;           // lm: context_length (tokens_per_s), else 1 (samples_per_s)
  PeakBytes after_setup{};
  PeakBytes before_optimizer{};
  PeakBytes after_optimizer{};
  std::string config_toml;  // the effective config
  // The replica checks that passed: run.check_replicas_every, after which
  // steps (from 1; 0: the end of the run), and the seconds they took.
  int64_t replica_check_every = 0;
  bool divergent = false;      // the strategy's replicas may differ between sync points: checked there only
  bool weights_synced = true;  // the last step was a sync point (else weights.safetensors is rank 0's own replica)
  std::vector<int64_t> replica_checked_after;
  double replica_check_s = 0;
  // [eval]: eval.every, eval.batches, and the seconds the evaluations took.
  int64_t eval_every = 0;
  int64_t eval_batches = 0;
  double eval_s = 0;
  std::vector<std::pair<int64_t, double>> val_losses;  // (step, held-out loss), a resumed run's earlier ones too
  // A resumed run: the step it started after, from which checkpoint ("":
  // none), the losses of the steps before. The checkpoints this run wrote
  // (after which steps) and their seconds. The restarts of `ddp run` before
  // this one (a JSON array, "" for none).
  int64_t first_step = 0;
  std::string resumed_from;
  std::vector<double> losses_before;
  std::vector<int64_t> checkpoints;
  double checkpoint_s = 0;
  std::string restarts_json;
  // The GEMM kernel rank 0's OpenBLAS loaded, its build, and how it was
  // chosen (the launcher's DDP_BLAS_CHOICE, JSON; "" for none).
  std::string blas_kernel;
  std::string blas_build;
  std::string blas_choice_json;
  // Rank 0's huge pages at the end of its run (huge_pages.h).
  HugePages huge_pages;
  // Rank 0's communicators, where the strategy made groups (ABI 1.9): each
  // one's name, members (world ranks) and figures over the run, the
  // world's first; empty where it made none.
  struct Group {
    std::string name;
    std::vector<int> ranks;
    int64_t collectives = 0;
    int64_t bytes = 0;
    int64_t bus_bytes = 0;
  };
  std::vector<Group> groups;
};

// summary.json: the run's facts, `loss` for every step (a resumed run's
// earlier steps from its checkpoint), one column per StepRecord field (the
// steps this process ran, from first_step + 1), means and
// totals, rank 0's peaks per window, every rank's totals, whether the ranks
// issued the same collectives, the strategy's own stats (if it has any:
// not null). Pure.
// This process's peak resident set size so far (VmHWM of /proc/self/status),
// in bytes; -1 where the kernel does not say.
int64_t peak_resident_bytes();

// What weights.safetensors holds where the run's last step (`steps`) was
// not a sync point of strategy `strategy`: the sentence rank 0 prints and
// summary.json's weights.note hold. Pure.
std::string unsynced_weights_note(const std::string& strategy, int64_t steps);

nlohmann::ordered_json run_summary(const RunFacts& facts, const std::vector<StepRecord>& steps,
                                   const std::vector<RankTotals>& ranks, const nlohmann::ordered_json* strategy_stats);

}  // namespace ddp
