// checkpoint.h — what a run leaves to continue from, and how it continues.
//
// Layout of [checkpoint] dir (docs/checkpoints.md):
//   step-00000010/weights.safetensors    every parameter, under its model name
//   step-00000010/optimizer-<r>.safetensors
//                                        the optimizer state rank r held and
//                                        no lower rank did: "<name>.exp_avg",
//                                        "<name>.exp_avg_sq" (AdamW),
//                                        "<name>.momentum_buffer" (SGD)
//   step-00000010/weights-<r>.safetensors, strategy-<r>.safetensors
//                                        where the replicas differ (a
//                                        divergent strategy: format 3): each
//                                        rank r > 0's own parameters (rank
//                                        0's are weights.safetensors); each
//                                        rank's optimizer-<r> then holds its
//                                        whole state; and the strategy's
//                                        own state, where it keeps some
//   step-00000010/checkpoint.json        written last: the step, the world
//                                        size and plugins, every config key,
//                                        the trainable parameters, each
//                                        parameter's state file and AdamW
//                                        step count, the losses so far, every
//                                        other file's size and digest, and
//                                        its own digest (checkpoint_files.h)
//   latest                               "step-00000010": moved last
// A checkpoint is built in "step-00000010.partial" and renamed into place
// once every file is written and synced; `latest` moves after the rename.
// A crash at any point leaves `latest` naming a whole checkpoint.
//
// What the next step depends on and where it is: the parameters and the
// optimizer state (above); the data position and its random state follow
// from the step (micro-batch m reads rows [m*B, (m+1)*B), each drawn from
// run.seed and its row number); the frozen set from the step and the
// unfreeze schedule; the config (compared on resume).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "checksum.h"
#include "config.h"
#include "initial_values.h"
#include "loss_scale.h"
#include "model.h"
#include "optimizer.h"
#include "safetensors.h"
#include "whole_model.h"

namespace ddp {

struct CheckpointMeta {
  std::string format;  // "ddp-checkpoint 2"; 3: divergent
  int64_t step = 0;    // optimizer steps done
  int world_size = 1;
  bool divergent = false;  // each rank's own replica (format 3)
  std::string strategy;
  std::string transport;
  std::string optimizer;
  std::map<std::string, std::string> config;  // config_items() of the run
  std::vector<std::string> trainable;         // parameters trainable at `step`
  std::vector<double> losses;                 // the mean loss of steps 1..step
  bool eval_due = false;                      // waiting for a sync point ("due"; absent: none)
  bool check_due = false;
  std::vector<std::pair<int64_t, double>> val_losses;  // [eval]'s (step, loss) so far ("val_loss")
  std::optional<LossScale> loss_scale;                 // where [precision] scaled the loss ("loss_scale")
  struct Piece {
    std::string file;  // "optimizer-1.safetensors"
    size_t offset = 0;
    size_t count = 0;
  };
  struct State {
    std::string file;           // "optimizer-0.safetensors" ("" where held in pieces)
    int64_t steps = 0;          // AdamW's step count
    std::vector<Piece> pieces;  // by offset (checkpoint_state.h); empty where whole
  };
  std::map<std::string, State> state;       // parameter name → its optimizer state
  std::map<std::string, FileDigest> files;  // every other file: size and xxh3 (checkpoint_files.h)
};

std::string checkpoint_name(int64_t step);  // "step-00000010"
// The step a name of checkpoint.dir's says: step-N, step-N.partial,
// step-N.replaced give N; anything else (a number beyond 18 digits too) -1.
// Pure.
int64_t step_of(const std::string& name);

// What `dir`/latest names ("" if there is no such file, or it is empty).
std::string latest_name(const std::string& dir);

// The checkpoint `given` names: "" or "latest" → the one `dir`/latest names;
// else a checkpoint directory, or a checkpoint dir holding `latest`.
// Throws Error saying what is missing.
std::string resolve_checkpoint(const std::string& dir, const std::string& given);

// The checkpoint.json at `path`, its checksum and shape checked
// (checkpoint_files.h); throws Error naming the file.
CheckpointMeta read_checkpoint_meta(const std::string& path);

// Whether a run configured as `now` may resume a checkpoint of `saved`:
// `refused` names the first key that may not change (model, data, the
// optimizer, the schedule, the seed, the batch; "" if none), `changed`
// lists the keys that may and did ("run.world_size 2 → 4"). Pure.
struct ResumeCheck {
  std::string refused;
  std::vector<std::string> changed;
};
ResumeCheck compare_for_resume(const std::map<std::string, std::string>& saved,
                               const std::map<std::string, std::string>& now);

// Which rank writes each parameter's state: the lowest rank holding it, -1
// if none does. `held` is every rank's per-parameter flag, rank-major. Pure.
std::vector<int> state_writers(const std::vector<double>& held, size_t params, int world);

// The checkpoint directories `keep` leaves: all but the newest `keep` whole
// ones, and partial ones of other steps than `writing`. Pure.
std::vector<std::string> checkpoints_to_remove(const std::vector<std::string>& names, int64_t keep,
                                               const std::string& writing);

// The entries of `dir` that are provably checkpoints, the only ones keep may
// remove: step-N directories holding checkpoint.json, and step-N.partial or
// .replaced ones, with nothing in them but the files a checkpoint writes.
// A foreign file, an empty step-N, a step number beyond 18 digits: left alone.
std::vector<std::string> checkpoint_entries(const std::string& dir);

// What writing a checkpoint needs from the run.
struct CheckpointInput {
  const Config& config;
  int rank = 0;
  int world = 1;
  const std::vector<Parameter>& params;
  const Optimizer& optimizer;
  std::string strategy;
  std::string transport;
  std::map<std::string, std::string> config_items;  // agreement.h's config_items()
  std::vector<double> losses;                       // steps 1..step
  // Every rank's `mine`, rank-major, to every rank (an engine collective).
  std::function<void(const std::vector<double>& mine, std::vector<double>& all)> all_gather;
  // Calls put(i, host values of parameter i) for every parameter, each
  // valid during its call (the store's per-unit view, param_store.h: unit by unit where
  // the strategy holds the values). `collective`: every rank must call it
  // at the same point (the strategy gathers); else rank 0 alone does.
  HostVisit visit_values;
  bool collective = false;
  // The replicas may differ (a divergent strategy): every rank writes its
  // own weights and whole optimizer state. The strategy's own state, this
  // rank's (strategy-<r>.safetensors where not empty): its per-rank
  // buffers, and on rank 0 those equal on every rank too (1.9), which a
  // resume on any world size reads there.
  bool divergent = false;
  std::vector<NamedFloats> strategy_state{};
  // What waits for the next sync point (a divergent strategy's), and the
  // held-out losses so far (step, loss): a resumed run goes on with them.
  bool eval_due = false;
  bool check_due = false;
  std::vector<std::pair<int64_t, double>> val_losses{};
  std::optional<LossScale> loss_scale{};  // [precision] loss_scale = "dynamic": where it stands
};

// The file that holds rank `rank`'s parameters in a checkpoint:
// weights.safetensors, or, in a divergent one, weights-<r> for r > 0. And
// rank `rank`'s strategy state. Pure.
std::string weights_file(int rank, bool divergent);
std::string strategy_state_file(int rank);

// Every rank calls it after the same step; returns the checkpoint's path.
// Throws Error naming the file and the reason (on every rank: a rank's
// failure to write is everyone's).
std::string write_checkpoint(const CheckpointInput& in, int64_t step);

// Loads `path`'s optimizer state into `optimizer` (for the parameters'
// first step), and makes its weights (`weights`, a file of it), checked
// whole, where `values` reads `params` from.
void load_checkpoint(const std::string& path, const CheckpointMeta& meta, const std::string& weights,
                     std::vector<Parameter>& params, Optimizer& optimizer, InitialValues& values);

// config.resume, before the plugins start: the checkpoint it names, checked
// against `config` (ConfigError naming the first key that may not change),
// loaded into `optimizer` and `values` (load_checkpoint) as rank `rank`
// reads it (a divergent one: its own files, on the same world size only),
// with the unfreeze schedule applied to `model` up to its step.
struct Resumed {
  std::string path;
  int64_t step = 0;
  std::vector<double> losses;        // steps 1..step
  std::vector<std::string> changed;  // what the config changed, as allowed
  std::string strategy;              // the strategy that wrote it
  int world = 0;                     // on how many ranks
  bool divergent = false;            // each rank's own replica
  std::string strategy_state;        // this rank's strategy state file ("": none)
  std::string shared_state;          // rank 0's, which holds the state equal on every rank ("": none)
  bool eval_due = false;             // waiting for a sync point
  bool check_due = false;
  std::vector<std::pair<int64_t, double>> val_losses;  // [eval]'s so far
  std::optional<LossScale> loss_scale;                 // where [precision]'s scaling stood
};
Resumed resume_run(const Config& config, int rank, Model& model, Device& device, Optimizer& optimizer,
                   InitialValues& values);

// A run with checkpoints on writes into a checkpoint.dir that holds
// another run's checkpoints only to continue that run: starting afresh
// (`resumed` "") or resuming a checkpoint from elsewhere there throws
// ConfigError saying what to do.
void refuse_foreign_checkpoints(const Config& config, const std::string& resumed = "");

// config_items() as a checkpoint compares them on resume: data.path as the
// absolute path of the file and its size, wherever the config is.
std::map<std::string, std::string> resume_items(const Config& config);

}  // namespace ddp
