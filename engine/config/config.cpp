// config.cpp — the run's configuration: load, apply --set overrides,
// validate against the fixed schema (schema.h) and the models' keys
// (engine/models/registry.h), section by section through the typed reads of
// config_reader.h. See config.h for the exact error messages.
#include "config.h"

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <sstream>
#include <tuple>

#include "blas_kernels.h"
#include "config_reader.h"
#include "schema.h"
#include "toml_read.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;
using toml_read::format_double;
using toml_read::from_override;

RunConfig read_run(const ConfigReader& r) {
  RunConfig run;
  run.world_size = int(r.integer("run", "world_size", 1, 1, kMaxWorldSize));
  run.steps = r.integer("run", "steps", 0, 0);
  run.seed = uint64_t(r.integer("run", "seed", 0, 0));
  // Relative to the working directory: users expect runs/ where they run.
  run.output_dir = r.directory("run", "output_dir", "runs/" + fs::path(r.file()).stem().string());
  // At most a million seconds (11.6 days): a wait on one collective, in
  // milliseconds for the transports.
  run.timeout_s = r.positive("run", "timeout_s", 30.0, 1e6);
  run.log_every = r.integer("run", "log_every", 1, 1);

  run.threads = int(r.integer("run", "threads", 1, 1, 1024));
  std::vector<std::string> kernels = {"auto", "default"};
  for (const std::string& k : blas_kernel_candidates()) kernels.push_back(k);
  run.blas_kernel = r.one_of("run", "blas_kernel", "auto", kernels);
  run.device = r.one_of("run", "device", "cpu", {"cpu", "cuda"}) == "cuda" ? DDP_DEVICE_CUDA : DDP_DEVICE_CPU;
  run.share_gpus = r.boolean("run", "share_gpus", false);
  run.check_finite = r.boolean("run", "check_finite", true);
  run.check_replicas_every = r.integer("run", "check_replicas_every", run.check_replicas_every, 0);
  run.debug_collectives = r.boolean("run", "debug_collectives", false);
  run.max_restarts = r.integer("run", "max_restarts", 0, 0, 1000);
  run.check_memory = r.boolean("run", "check_memory", true);

  return run;
}

// A [model] key of another model than `model` is a mistake, named as such;
// the first in the file is reported.
void refuse_foreign_keys(const ConfigReader& r, const ModelInfo& model) {
  const toml::node* first = nullptr;
  std::string first_key;
  for (auto&& [name, node] : *r.find("model")->as_table()) {
    const std::string key(name.str());
    if (find_spec("model", key) || model_key(model, key)) continue;
    const auto at = [](const toml::node& n) {  // file order; keys from --set after the file's
      return std::make_tuple(from_override(n.source()), n.source().begin.line, n.source().begin.column);
    };
    if (!first || at(node) < at(*first)) {
      first = &node;
      first_key = key;
    }
  }
  if (!first) return;
  std::string owners;
  for (const ModelInfo& other : model_registry())
    if (model_key(other, first_key)) owners += (owners.empty() ? "'" : ", '") + other.name + "'";
  throw ConfigError(r.where(*first) + ": key 'model." + first_key + "' applies to model" +
                    (owners.find(',') == std::string::npos ? " " : "s ") + owners + " only");
}

// [model]: name, init_from, freeze, then the keys the registry lists for
// that model, each at its fallback when unset. A key of another model is a
// mistake, named as such.
ModelConfig read_model(const ConfigReader& r) {
  ModelConfig m;
  std::vector<std::string> names;
  for (const ModelInfo& info : model_registry()) names.push_back(info.name);
  m.name = r.one_of("model", "name", "", names);
  m.init_from = r.path_from_file("model", "init_from");
  if (const toml::node* f = r.find("model", "freeze")) {
    for (const toml::node& e : *f->as_array()) {
      if (!e.is_string())
        throw ConfigError(r.where(*f) + ": key 'model.freeze' must be an array of strings (parameter name globs)");
      m.freeze.push_back(e.as_string()->get());
    }
  }
  const ModelInfo& model = *find_model(m.name);
  refuse_foreign_keys(r, model);
  for (const ModelKey& k : model.keys) {
    const char* key = k.name.c_str();
    if (k.type == ModelKey::Int) {
      m.options.set(k.name, r.integer("model", key, std::get<int64_t>(k.fallback), k.min));
    } else if (k.type == ModelKey::Float) {
      m.options.set(k.name, r.positive("model", key, std::get<double>(k.fallback)));
    } else {
      m.options.set(k.name, r.one_of("model", key, std::get<std::string>(k.fallback), k.choices));
    }
  }
  return m;
}

DataConfig read_data(const ConfigReader& r, const std::string& model, int world_size) {
  DataConfig d;
  d.path = r.path_from_file("data", "path");
  {
    const std::string inferred = d.path.empty()                                   ? "random"
                                 : fs::path(d.path).extension() == ".safetensors" ? "safetensors"
                                                                                  : "tokens";
    d.kind = r.one_of("data", "kind", inferred, {"random", "safetensors", "tokens"});
    if (d.kind == "random" && !d.path.empty())
      throw ConfigError(r.where(*r.find("data", "path")) + ": key 'data.path' is not used with data.kind = \"random\"");
    if (d.kind != "random" && d.path.empty())
      throw ConfigError(r.file() + ": missing required key 'data.path' (data.kind = \"" + d.kind + "\")");
    if (d.kind == "tokens" && find_model(model)->data != DataShape::Tokens) {
      std::string readers;
      for (const ModelInfo& m : model_registry())
        if (m.data == DataShape::Tokens) readers += (readers.empty() ? "'" : " or '") + m.name + "'";
      throw ConfigError(r.where(r.find("data", "kind") ? *r.find("data", "kind") : *r.find("data", "path")) +
                        ": data.kind = \"tokens\" (a token file) needs model " + readers);
    }
  }
  d.batch_size = r.integer("data", "batch_size", 0, 1, INT_MAX);
  d.teacher = r.boolean("data", "teacher", false);
  if (d.teacher && d.kind != "random")
    throw ConfigError(r.where(*r.find("data", "teacher")) + ": key 'data.teacher' is for random data (data.kind = \"" +
                      d.kind + "\" holds its own targets)");
  // The batch is global: every rank takes an equal share.
  if (d.batch_size % world_size != 0)
    throw ConfigError(r.where(*r.find("data", "batch_size")) + ": key 'data.batch_size' (" +
                      std::to_string(d.batch_size) + ") must be divisible by run.world_size (" +
                      std::to_string(world_size) + ")");

  return d;
}

OptimizerConfig read_optimizer(const ConfigReader& r) {
  OptimizerConfig o;
  o.name = r.one_of("optimizer", "name", "sgd", {"sgd", "adamw"});
  o.lr = r.positive("optimizer", "lr", 0.0);
  o.momentum = r.non_negative("optimizer", "momentum", 0.0);
  std::tie(o.beta1, o.beta2) = r.betas(o.beta1, o.beta2);
  o.eps = r.positive("optimizer", "eps", o.eps);
  o.weight_decay = r.non_negative("optimizer", "weight_decay", o.name == "adamw" ? 0.01 : 0.0);
  if (r.find("optimizer", "clip_grad_norm")) o.clip_grad_norm = r.positive("optimizer", "clip_grad_norm", 1.0);
  for (const char* key : {"momentum"})
    if (o.name != "sgd" && r.find("optimizer", key))
      throw ConfigError(r.where(*r.find("optimizer", key)) + ": key 'optimizer." + key + "' applies to sgd only");
  for (const char* key : {"betas", "eps"})
    if (o.name != "adamw" && r.find("optimizer", key))
      throw ConfigError(r.where(*r.find("optimizer", key)) + ": key 'optimizer." + key + "' applies to adamw only");
  using T = toml::node_type;
  r.tables("optimizer", "groups",
           {{"params", T::string, true}, {"lr", T::floating_point, false}, {"weight_decay", T::floating_point, false}},
           [&](const toml::table& t, const std::string& name) {
             ParamGroupConfig g;
             g.params = t["params"].value_or(std::string());
             g.lr = t["lr"].node() ? ConfigReader::as_double(*t["lr"].node()) : o.lr;
             g.weight_decay =
                 t["weight_decay"].node() ? ConfigReader::as_double(*t["weight_decay"].node()) : o.weight_decay;
             if (!(g.lr > 0))
               throw ConfigError(r.where(*t["lr"].node()) + ": key '" + name + ".lr' must be > 0 (got " +
                                 format_double(g.lr) + ")");
             for (const char* key : {"lr", "weight_decay"})
               if (t[key].node() && !std::isfinite(ConfigReader::as_double(*t[key].node())))
                 throw ConfigError(r.where(*t[key].node()) + ": key '" + name + "." + key + "' must be finite (got " +
                                   format_double(ConfigReader::as_double(*t[key].node())) + ")");
             if (!(g.weight_decay >= 0))
               throw ConfigError(r.where(*t["weight_decay"].node()) + ": key '" + name +
                                 ".weight_decay' must be >= 0 (got " + format_double(g.weight_decay) + ")");
             o.groups.push_back(g);
           });
  return o;
}

LrScheduleConfig read_lr_schedule(const ConfigReader& r, const RunConfig& run, double lr) {
  LrScheduleConfig s;
  s.kind = r.one_of("schedule", "lr", "constant", {"constant", "cosine"});
  for (const char* key : {"warmup_steps", "cosine_steps", "min_lr"})
    if (s.kind != "cosine" && r.find("schedule", key))
      throw ConfigError(r.where(*r.find("schedule", key)) + ": key 'schedule." + key +
                        "' applies to lr = \"cosine\" only");
  if (s.kind != "cosine") return s;
  s.warmup_steps = r.integer("schedule", "warmup_steps", 0, 0);
  s.cosine_steps = r.integer("schedule", "cosine_steps", std::max(run.steps, s.warmup_steps + 1), s.warmup_steps + 1);
  s.min_lr = r.non_negative("schedule", "min_lr", 0.0);
  if (r.find("schedule", "min_lr"))
    r.require(s.min_lr <= lr, "schedule", "min_lr", "<= optimizer.lr (" + format_double(lr) + ")",
              format_double(s.min_lr));
  return s;
}

EvalConfig read_eval(const ConfigReader& r, const DataConfig& data) {
  EvalConfig e;
  e.every = r.integer("eval", "every", 0, 0);
  e.batches = r.integer("eval", "batches", 1, 1, kMaxEvalBatches);
  e.path = r.path_from_file("eval", "path");
  e.kind = r.one_of("eval", "kind", fs::path(e.path).extension() == ".safetensors" ? "safetensors" : "tokens",
                    {"safetensors", "tokens"});
  e.holdout_rows = r.integer("eval", "holdout_rows", 0, 0);
  if (!e.path.empty() && e.holdout_rows > 0)
    throw ConfigError(r.where(*r.find("eval", "holdout_rows")) +
                      ": key 'eval.holdout_rows' sets rows of data.path aside, and eval.path gives held-out rows "
                      "already: one or the other");
  if (e.holdout_rows > 0 && data.kind != "safetensors")
    throw ConfigError(r.where(*r.find("eval", "holdout_rows")) +
                      ": key 'eval.holdout_rows' sets rows of a "
                      "safetensors data file aside, and data.kind is \"" +
                      data.kind + "\"");
  // Checked even where eval.every = 0 turns evaluation off: a key that
  // names a file the run never finds is a mistake either way.
  if (!e.path.empty() && !fs::exists(e.path))
    throw ConfigError(r.where(*r.find("eval", "path")) + ": key 'eval.path' names " + e.path +
                      ", which does not exist (checked even while eval.every = 0 leaves evaluation off)");
  if (e.every > 0 && e.path.empty() && e.holdout_rows == 0 && data.kind != "random")
    throw ConfigError(r.where(*r.find("eval", "every")) +
                      ": [eval] needs held-out rows: eval.path (a file of "
                      "them) or eval.holdout_rows (the last rows of data.path)");
  return e;
}

std::vector<UnfreezeConfig> read_unfreeze(const ConfigReader& r) {
  using T = toml::node_type;
  std::vector<UnfreezeConfig> unfreeze;
  r.tables("schedule", "unfreeze", {{"step", T::integer, true}, {"params", T::string, true}},
           [&](const toml::table& t, const std::string& name) {
             UnfreezeConfig u{t["step"].value_or(int64_t(0)), t["params"].value_or(std::string())};
             if (u.step < 0)
               throw ConfigError(r.where(*t["step"].node()) + ": key '" + name + ".step' must be >= 0 (got " +
                                 std::to_string(u.step) + ")");
             unfreeze.push_back(u);
           });

  return unfreeze;
}

// [precision]: the CPU emulates 16-bit compute, CUDA runs it on cuBLAS.
PrecisionConfig read_precision(const ConfigReader& r) {
  PrecisionConfig p;
  // A dtype key's value: one of compute_name's.
  const auto dtype = [&](const char* key) {
    const std::string value = r.one_of("precision", key, "fp32", {"fp32", "bf16", "fp16"});
    return value == "bf16" ? DDP_BFLOAT16 : value == "fp16" ? DDP_FLOAT16 : DDP_FLOAT32;
  };
  p.compute = dtype("compute");
  p.reduce = dtype("reduce");
  const char* scaling = p.compute == DDP_FLOAT16 ? "dynamic" : "none";
  p.loss_scale = r.one_of("precision", "loss_scale", scaling, {"dynamic", "none"}) == "dynamic";
  for (const char* key : {"init_scale", "growth_factor", "backoff_factor", "growth_interval"})
    if (!p.loss_scale && r.find("precision", key))
      throw ConfigError(r.where(*r.find("precision", key)) + ": key 'precision." + key +
                        "' applies to dynamic loss scaling only, which is off (precision.loss_scale = \"none\"" +
                        (p.compute == DDP_FLOAT16 ? "" : ", the default unless precision.compute = \"fp16\"") + ")");
  p.init_scale = r.positive("precision", "init_scale", p.init_scale, FLT_MAX);  // GradScaler's scale is a float
  r.require(p.init_scale >= FLT_MIN, "precision", "init_scale", ">= " + shortest_text(FLT_MIN) + " (FLT_MIN)",
            shortest_text(p.init_scale));
  p.growth_factor = r.positive("precision", "growth_factor", p.growth_factor);
  r.require(p.growth_factor > 1, "precision", "growth_factor", "> 1", shortest_text(p.growth_factor));
  p.backoff_factor = r.positive("precision", "backoff_factor", p.backoff_factor);
  r.require(p.backoff_factor < 1, "precision", "backoff_factor", "< 1", shortest_text(p.backoff_factor));
  p.growth_interval = r.integer("precision", "growth_interval", p.growth_interval, 1);
  return p;
}

}  // namespace

const char* compute_name(ddp_dtype dtype) {
  return dtype == DDP_BFLOAT16 ? "bf16" : dtype == DDP_FLOAT16 ? "fp16" : "fp32";
}

ddp_precision abi_precision(const PrecisionConfig& p) {
  return ddp_precision{sizeof(ddp_precision), p.compute, p.reduce, p.loss_scale ? 1 : 0};
}

std::string shortest_text(double x) {
  char text[32];
  if (x == std::floor(x) && std::fabs(x) < 1e15) {
    std::snprintf(text, sizeof text, "%.0f", x);  // 30, not 3e+01
    return text;
  }
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, x);
    if (std::strtod(text, nullptr) == x) break;
  }
  return text;
}

Config validate_config(const toml::table& doc, const std::string& file) {
  const ConfigReader r(doc, file);
  r.check_structure();

  Config c;
  c.file = file;
  c.run = read_run(r);
  c.model = read_model(r);
  c.data = read_data(r, c.model.name, c.run.world_size);
  // Plugins see it as ddp_step_info.micro_steps, an int32_t.
  c.run.grad_accum_steps = r.integer("run", "grad_accum_steps", 1, 1, INT_MAX);

  c.optimizer = read_optimizer(r);
  c.unfreeze = read_unfreeze(r);
  c.lr_schedule = read_lr_schedule(r, c.run, c.optimizer.lr);
  c.checkpoint.every = r.integer("checkpoint", "every", 0, 0);
  c.checkpoint.dir = r.directory("checkpoint", "dir", (fs::path(c.run.output_dir) / "checkpoints").string());
  c.checkpoint.keep = r.integer("checkpoint", "keep", 2, 1);
  c.eval = read_eval(r, c.data);
  c.precision = read_precision(r);
  c.data.holdout_rows = c.eval.holdout_rows;
  c.transport_plugin = r.string("transport", "plugin", "gloo");
  c.strategy_plugin = r.string("strategy", "plugin", "naive");
  c.transport = r.plugin_section("transport", c.transport_plugin);
  c.strategy = r.plugin_section("strategy", c.strategy_plugin);

  c.effective = r.effective();
  std::ostringstream text;
  text << doc;
  c.toml_text = text.str();
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  toml::table doc = toml_read::parse_file(path);
  for (const std::string& arg : overrides) toml_read::apply_override(doc, arg);
  Config c = validate_config(doc, path);
  c.overrides = overrides;
  return c;
}

}  // namespace ddp
