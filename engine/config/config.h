// config.h — the run's TOML configuration, read with TOML++ and validated
// against a fixed schema. Unknown keys and wrong types are errors that name
// file, line, column and key; a missing required key names itself. The
// plugin tables ([transport], [strategy]) are kept as PluginSection: plugins
// read them through the host vtable, and keys no plugin read are unknown.
// The [model] table's keys beyond name, init_from and freeze are the model's
// own, as engine/models/registry.h lists them.
//
// Error messages (exact; tests check them):
//   <file>: cannot open config file
//   <file>:<line>:<col>: <TOML++ description>                   (parse error)
//   <file>:<line>:<col>: unknown key '<section>.<key>'
//   <file>:<line>:<col>: unknown section '<name>'
//   <file>:<line>:<col>: key '<section>.<key>' must be <a/an> <type>, not <a/an> <type>
//   <file>: missing required key '<section>.<key>'
//   <file>:<line>:<col>: key '<section>.<key>' must be <constraint> (got <value>)
//   <file>:<line>:<col>: key 'data.batch_size' (<B>) must be divisible by run.world_size (<N>)
//   --set <arg>: expected section.key=value
//   --set <arg>: <TOML++ description>                           (bad value)
// Keys given with --set are reported as "--set section.key=value" in place
// of "<file>:<line>:<col>".
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <toml++/toml.h>

#include <ddp/plugin.h>

#include "error.h"
#include "plugin_section.h"
#include "registry.h"

namespace ddp {

// The most ranks a run has: 2^20, ten times the largest clusters built;
// a world size past it (run.world_size, a checkpoint's world_size) is a
// slip of the keyboard, refused before anything loops over the ranks.
// (How many ranks this host can run is the fit check's: fit_check.h.)
inline constexpr int64_t kMaxWorldSize = int64_t{1} << 20;

struct RunConfig {
  int world_size = 1;
  int64_t grad_accum_steps = 1;  // micro-batches per optimizer step, >= 1
  int64_t steps = 0;             // required, >= 0
  uint64_t seed = 0;
  std::string output_dir;                   // default: "runs/<config file stem>"
  double timeout_s = 30.0;                  // > 0
  int64_t log_every = 1;                    // progress line every N steps, >= 1
  int threads = 1;                          // BLAS threads per rank, >= 1
  std::string blas_kernel = "auto";         // "auto" | "default" | an OpenBLAS kernel (blas_kernel_candidates)
  ddp_device_kind device = DDP_DEVICE_CPU;  // "cpu" | "cuda" (GPU local_rank per rank)
  bool share_gpus = false;                  // cuda: ranks beyond the GPU count share them (gloo only)
  bool check_finite = true;                 // a non-finite loss stops the run, naming the first non-finite parameter
  // Steps between checks that every rank holds the same parameters (0: only
  // at the end of the run). The default costs well under 1 % of lm-cpu's
  // step (docs/benchmarks.md).
  int64_t check_replicas_every = 10;
  bool debug_collectives = false;  // compare every collective across ranks before it runs
  // `ddp run` restarts a failed group from its latest checkpoint this many times.
  int64_t max_restarts = 0;
  // `ddp run` refuses a CPU run whose plan does not fit this host's memory
  // (engine/plan/fit_check.h).
  bool check_memory = true;
};

// [checkpoint] (engine/train/checkpoint.h): every `every` steps (0: never)
// a checkpoint into `dir`, keeping the newest `keep`.
struct CheckpointConfig {
  int64_t every = 0;
  std::string dir;  // default: <run.output_dir>/checkpoints
  int64_t keep = 2;
};

struct ModelConfig {
  std::string name;                 // required: a name of engine/models/registry.h
  std::string init_from;            // optional safetensors path, relative to the config file
  std::vector<std::string> freeze;  // globs: parameters frozen from the start (fine-tuning)
  // The model's own keys (registry.h), each with its fallback where unset.
  ModelOptions options;
};

struct DataConfig {
  // "random": inputs (or token ids) from run.seed; "safetensors": x/y (or
  // tokens) rows consumed in order; "tokens": a flat uint16 token file,
  // memory-mapped, random windows. Default: from `path` (none: random;
  // *.safetensors: safetensors; else tokens).
  std::string kind;
  std::string path;        // relative to the config file
  int64_t batch_size = 0;  // required, global batch, > 0, divisible by world_size
  // Random data whose targets a fixed teacher gives (data.h), so that the
  // task can be learnt; false: random targets.
  bool teacher = false;
  // Not keys: how [eval] reads its held-out rows (eval_data_config).
  // holdout_rows of a safetensors source: the last ones are set aside
  // (training reads the others); held_out: read those instead. stream:
  // which rows random data and token windows draw (0: training's).
  int64_t holdout_rows = 0;
  bool held_out = false;
  uint64_t stream = 0;
};

// [eval]: the mean loss on held-out rows, every `every` steps and after the
// last (0: never); `batches` global batches of data.batch_size rows each,
// every rank its share. From `path` (a token file or safetensors, like
// data.path), else the last `holdout_rows` rows of a safetensors data
// file, else (random data) rows of a stream of their own.
// eval.batches' most, for random rows and token windows (sources that never
// end): every evaluation runs them all, and set-up reads them all once, so
// at a millisecond a batch 65536 already take a minute each time; more is
// a slip of the keyboard, as model.h's kMaxLayers. A file of held-out rows
// is bounded by its rows too (data.h's eval_batches_beyond).
inline constexpr int64_t kMaxEvalBatches = 65536;
struct EvalConfig {
  int64_t every = 0;
  int64_t batches = 1;
  std::string path;
  std::string kind;  // path's: "safetensors" or "tokens" (default: from its extension, as data.kind)
  int64_t holdout_rows = 0;
};

// [[optimizer.groups]]: parameters whose name matches `params` (a glob:
// `*` and `?`, matching dots too) take this group's lr and weight_decay
// (torch.optim's param_groups). The first matching group wins; the rest use
// the [optimizer] values.
struct ParamGroupConfig {
  std::string params;
  double lr = 0.0;
  double weight_decay = 0.0;
};

struct OptimizerConfig {
  std::string name = "sgd";  // "sgd" | "adamw"
  double lr = 0.0;           // required, > 0
  double momentum = 0.0;     // sgd, >= 0
  double beta1 = 0.9;        // adamw `betas`, each in [0, 1)
  double beta2 = 0.999;
  double eps = 1e-8;          // adamw, > 0
  double weight_decay = 0.0;  // >= 0; default 0 for sgd (L2), 0.01 for adamw (decoupled), as PyTorch
  std::vector<ParamGroupConfig> groups;
  // > 0: gradients scaled to this global L2 norm at most before each step
  // (torch.nn.utils.clip_grad_norm_); 0: off.
  double clip_grad_norm = 0.0;
};

// [schedule] lr: "constant", or "cosine" (CS336 assignment 1): linear
// warm-up from 0 over warmup_steps, cosine decay to min_lr at cosine_steps,
// min_lr after. It scales every group's lr by scheduled / optimizer.lr.
struct LrScheduleConfig {
  std::string kind = "constant";
  int64_t warmup_steps = 0;
  int64_t cosine_steps = 0;  // > warmup_steps; default run.steps
  double min_lr = 0.0;       // <= optimizer.lr
};

// [[schedule.unfreeze]]: before optimizer step `step` (0-based), the frozen
// parameters whose name matches `params` become trainable (the
// assignment's add_param_group during training).
struct UnfreezeConfig {
  int64_t step = 0;
  std::string params;
};

// [precision] (docs/precision.md): the dtype the models' GEMMs (linear
// layers, attention's products) take their inputs in, accumulating in
// float32. Parameters, gradients and the optimizer stay float32.
// fp16's dynamic loss scaling is torch.cuda.amp.GradScaler's, with its
// names (engine/train/loss_scale.h).
struct PrecisionConfig {
  ddp_dtype compute = DDP_FLOAT32;  // "fp32" | "bf16" | "fp16"
  ddp_dtype reduce = DDP_FLOAT32;   // gradients reduced in: "fp32" | "bf16" | "fp16" (ddp_precision::reduce)
  bool loss_scale = false;          // "dynamic" (fp16's default) | "none" (the others')
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};
// A dtype as [precision] writes it: "fp32", "bf16" or "fp16". Pure.
const char* compute_name(ddp_dtype dtype);
// [precision] as the plugins see it (ddp_host::precision, ABI 1.11). Pure.
ddp_precision abi_precision(const PrecisionConfig& precision);

struct Config {
  std::string file;                    // path as given
  std::vector<std::string> overrides;  // the --set arguments it was loaded with
  RunConfig run;
  ModelConfig model;
  DataConfig data;
  OptimizerConfig optimizer;
  std::vector<UnfreezeConfig> unfreeze;
  LrScheduleConfig lr_schedule;
  CheckpointConfig checkpoint;
  EvalConfig eval;
  PrecisionConfig precision;
  std::string transport_plugin = "gloo";
  std::string strategy_plugin = "naive";
  PluginSection transport;
  PluginSection strategy;
  std::string toml_text;  // the effective config (after --set), for summary.json
  // Not a key: `ddp run --resume [PATH]`: "" (start afresh), "latest" (the
  // checkpoint checkpoint.dir/latest names) or a checkpoint's path.
  std::string resume;
  // Every engine key read with a fallback, set or not: "run.timeout_s" → "30"
  // (what the ranks compare: a default written out equals one left unset).
  std::map<std::string, std::string> effective;
};

// Pure: validates a parsed document. `file` is used in messages only and to
// resolve relative paths. Throws ConfigError.
Config validate_config(const toml::table& doc, const std::string& file);

// The shortest text that reads back as `x` exactly: 0.1 (not
// 0.10000000000000001), 30 (not 3e+01). Pure.
std::string shortest_text(double x);

// Reads `path`, applies `overrides` ("section.key=value", value in TOML
// syntax; a bare word that is not valid TOML is taken as a string), validates.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

}  // namespace ddp
