// config.h — the run's TOML configuration, read with TOML++ and validated
// against a fixed schema. Unknown keys and wrong types are errors that name
// file, line, column and key; a missing required key names itself. The
// plugin tables ([transport], [strategy]) are kept as PluginSection: plugins
// read them through the host vtable, and keys no plugin read are unknown.
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
#include <set>
#include <string>
#include <vector>

#include <toml++/toml.h>

#include <ddp/plugin.h>

#include "error.h"

namespace ddp {

class ConfigError : public Error {
 public:
  using Error::Error;
};

// A plugin's own table ([transport] or [strategy] minus `plugin`). Typed
// reads throw ConfigError naming the key's location; every key read is
// remembered so that unread ones can be reported as unknown.
class PluginSection {
 public:
  PluginSection() = default;
  // Takes the table by reference: copying a TOML++ node drops its source
  // position, so the positions are recorded here before the copy.
  PluginSection(std::string file, std::string section, const toml::table& table);

  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_float(const std::string& key, double fallback) const;  // ints accepted
  bool get_bool(const std::string& key, bool fallback) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;

  // Throws ConfigError "<where>: unknown key '<section>.<key>' (<kind> plugin
  // '<name>' does not read it)" for the first key (in file order) not read.
  void check_all_read(const std::string& kind, const std::string& plugin_name) const;

  const std::string& section() const { return section_; }

 private:
  const toml::node* find(const std::string& key) const;
  std::string where(const std::string& key) const;  // "<file>:<l>:<c>" or "--set ..."

  std::string file_;
  std::string section_;
  toml::table table_;
  std::map<std::string, toml::source_region> sources_;  // key -> position in the file
  mutable std::set<std::string> read_;
};

struct RunConfig {
  int world_size = 1;
  int64_t grad_accum_steps = 1;  // micro-batches per optimizer step, >= 1
  int64_t steps = 0;          // required, >= 0
  uint64_t seed = 0;
  std::string output_dir;     // default: "runs/<config file stem>"
  double timeout_s = 30.0;    // > 0
  int64_t log_every = 1;      // progress line every N steps, >= 1
  int threads = 1;            // BLAS threads per rank, >= 1
  ddp_device_kind device = DDP_DEVICE_CPU;  // "cpu" | "cuda" (GPU local_rank per rank)
  bool share_gpus = false;    // cuda: ranks beyond the GPU count share them (gloo only)
};

struct ModelConfig {
  std::string name;           // required: "toy" | "toy_tied" | "mlp" | "lm"
  std::string init_from;      // optional safetensors path, relative to the config file
  std::vector<std::string> freeze;  // globs: parameters frozen from the start (fine-tuning)
  // lm: a preset ("lm-tiny", "lm-cpu", "small", ...; default "lm-tiny") and
  // any hyper-parameter overriding it (0: the preset's).
  std::string preset;
  int64_t vocab_size = 0, context_length = 0, d_model = 0, num_layers = 0, num_heads = 0, d_ff = 0;
  double rope_theta = 0.0;
  // mlp
  int64_t width = 1024, depth = 8, classes = 10;
};

struct DataConfig {
  // "random": inputs (or token ids) from run.seed; "safetensors": x/y (or
  // tokens) rows consumed in order; "tokens": a flat uint16 token file,
  // memory-mapped, random windows. Default: from `path` (none: random;
  // *.safetensors: safetensors; else tokens).
  std::string kind;
  std::string path;           // relative to the config file
  int64_t batch_size = 0;     // required, global batch, > 0, divisible by world_size
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
  std::string name = "sgd";   // "sgd" | "adamw"
  double lr = 0.0;            // required, > 0
  double momentum = 0.0;      // sgd, >= 0
  double beta1 = 0.9, beta2 = 0.999;  // adamw `betas`, each in [0, 1)
  double eps = 1e-8;          // adamw, > 0
  double weight_decay = 0.0;  // >= 0; default 0 for sgd (L2), 0.01 for adamw (decoupled), as PyTorch
  std::vector<ParamGroupConfig> groups;
};

// [[schedule.unfreeze]]: before optimizer step `step` (0-based), the frozen
// parameters whose name matches `params` become trainable (the
// assignment's add_param_group during training).
struct UnfreezeConfig {
  int64_t step = 0;
  std::string params;
};

struct Config {
  std::string file;           // path as given
  RunConfig run;
  ModelConfig model;
  DataConfig data;
  OptimizerConfig optimizer;
  std::vector<UnfreezeConfig> unfreeze;
  std::string transport_plugin = "gloo";
  std::string strategy_plugin = "naive";
  PluginSection transport;
  PluginSection strategy;
  std::string toml_text;      // the effective config (after --set), for summary.json
};

// Pure: validates a parsed document. `file` is used in messages only and to
// resolve relative paths. Throws ConfigError.
Config validate_config(const toml::table& doc, const std::string& file);

// Reads `path`, applies `overrides` ("section.key=value", value in TOML
// syntax; a bare word that is not valid TOML is taken as a string), validates.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// One plugin's table from --set arguments alone ("<section>.key=value", the
// value as for load_config), for commands without a config file (`ddp
// bench-comm`). Throws ConfigError naming the argument for any other
// section, and for "<section>.plugin" (the command names the plugin).
PluginSection plugin_section_from_overrides(const std::string& section, const std::vector<std::string>& overrides);

}  // namespace ddp
