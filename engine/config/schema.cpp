// schema.cpp — see schema.h.
#include "schema.h"

#include <algorithm>
#include <iterator>

namespace ddp {
namespace {

const KeySpec kSchema[] = {
    {"run", "world_size", toml::node_type::integer, false},
    {"run", "steps", toml::node_type::integer, true},
    {"run", "seed", toml::node_type::integer, false},
    {"run", "output_dir", toml::node_type::string, false},
    {"run", "timeout_s", toml::node_type::floating_point, false},
    {"run", "log_every", toml::node_type::integer, false},
    {"run", "grad_accum_steps", toml::node_type::integer, false},
    {"run", "threads", toml::node_type::integer, false},
    {"run", "blas_kernel", toml::node_type::string, false},
    {"run", "device", toml::node_type::string, false},
    {"run", "share_gpus", toml::node_type::boolean, false},
    {"run", "check_finite", toml::node_type::boolean, false},
    {"run", "check_replicas_every", toml::node_type::integer, false},
    {"run", "debug_collectives", toml::node_type::boolean, false},
    {"run", "max_restarts", toml::node_type::integer, false},
    {"run", "check_memory", toml::node_type::boolean, false},
    {"checkpoint", "every", toml::node_type::integer, false},
    {"checkpoint", "dir", toml::node_type::string, false},
    {"checkpoint", "keep", toml::node_type::integer, false},
    {"model", "name", toml::node_type::string, true},
    {"model", "init_from", toml::node_type::string, false},
    {"model", "freeze", toml::node_type::array, false},
    {"data", "kind", toml::node_type::string, false},
    {"data", "path", toml::node_type::string, false},
    {"data", "batch_size", toml::node_type::integer, true},
    {"data", "teacher", toml::node_type::boolean, false},
    {"eval", "every", toml::node_type::integer, false},
    {"eval", "batches", toml::node_type::integer, false},
    {"eval", "path", toml::node_type::string, false},
    {"eval", "kind", toml::node_type::string, false},
    {"eval", "holdout_rows", toml::node_type::integer, false},
    {"optimizer", "name", toml::node_type::string, false},
    {"optimizer", "lr", toml::node_type::floating_point, true},
    {"optimizer", "momentum", toml::node_type::floating_point, false},
    {"optimizer", "betas", toml::node_type::array, false},
    {"optimizer", "eps", toml::node_type::floating_point, false},
    {"optimizer", "weight_decay", toml::node_type::floating_point, false},
    {"optimizer", "groups", toml::node_type::array, false},
    {"optimizer", "clip_grad_norm", toml::node_type::floating_point, false},
    {"schedule", "unfreeze", toml::node_type::array, false},
    {"schedule", "lr", toml::node_type::string, false},
    {"schedule", "warmup_steps", toml::node_type::integer, false},
    {"schedule", "cosine_steps", toml::node_type::integer, false},
    {"schedule", "min_lr", toml::node_type::floating_point, false},
    {"precision", "compute", toml::node_type::string, false},
    {"precision", "reduce", toml::node_type::string, false},
    {"precision", "loss_scale", toml::node_type::string, false},
    {"precision", "init_scale", toml::node_type::floating_point, false},
    {"precision", "growth_factor", toml::node_type::floating_point, false},
    {"precision", "backoff_factor", toml::node_type::floating_point, false},
    {"precision", "growth_interval", toml::node_type::integer, false},
    {"transport", "plugin", toml::node_type::string, false},
    {"strategy", "plugin", toml::node_type::string, false},
};

}  // namespace

std::vector<KeySpec> schema() { return {std::begin(kSchema), std::end(kSchema)}; }

bool is_plugin_section(const std::string& section) { return section == "transport" || section == "strategy"; }

bool is_known_section(const std::string& section) {
  return std::any_of(std::begin(kSchema), std::end(kSchema), [&](const KeySpec& s) { return section == s.section; });
}

const KeySpec* find_spec(const std::string& section, const std::string& key) {
  for (const KeySpec& s : kSchema)
    if (section == s.section && key == s.key) return &s;
  return nullptr;
}

const ModelKey* model_key(const ModelInfo& model, const std::string& key) {
  for (const ModelKey& k : model.keys)
    if (k.name == key) return &k;
  return nullptr;
}

// The type of a key of the fixed sections, or of any model's key.
std::optional<toml::node_type> key_type(const std::string& section, const std::string& key) {
  if (const KeySpec* spec = find_spec(section, key)) return spec->type;
  if (section != "model") return std::nullopt;
  for (const ModelInfo& model : model_registry()) {
    if (const ModelKey* k = model_key(model, key)) {
      return k->type == ModelKey::Int     ? toml::node_type::integer
             : k->type == ModelKey::Float ? toml::node_type::floating_point
                                          : toml::node_type::string;
    }
  }
  return std::nullopt;
}

}  // namespace ddp
