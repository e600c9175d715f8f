// model_setup.cpp — see model_setup.h.
#include "model_setup.h"

#include <algorithm>

#include "initial_values.h"
#include "optimizer.h"  // name_matches
#include "registry.h"
#include "safetensors.h"

namespace ddp {
namespace {

// model.init_from, checked whole before anything is read from it.
std::unique_ptr<SafetensorsReader> open_init(const std::string& path, const Model& model) {
  auto file = std::make_unique<SafetensorsReader>(path);
  for (const Parameter& p : model.params()) {
    const SafetensorsReader::Entry* e = file->find(p.name);
    if (!e) throw Error(path + ": missing tensor '" + p.name + "'");
    if (e->shape != p.shape)
      throw Error(path + ": tensor '" + p.name + "' has shape " + shape_string(e->shape) + ", model expects " +
                  shape_string(p.shape));
    file->find_floats(p.name);
  }
  return file;
}

void freeze(const std::vector<std::string>& patterns, Model& model, const std::string& model_name) {
  for (const std::string& pattern : patterns) {
    bool used = false;
    for (Parameter& p : model.params()) {
      if (!name_matches(pattern, p.name)) continue;
      used = true;
      p.trainable = false;
      p.grad.reset();
    }
    if (!used) throw ConfigError("model.freeze: '" + pattern + "' matches no parameter of model '" + model_name + "'");
  }
}

}  // namespace

std::unique_ptr<Model> set_up_model(const Config& config, Device& device, uint64_t seed, DataShape* shape,
                                    std::unique_ptr<InitialValues>* values) {
  auto model = build_model(config.model.name, config.model.options, device, seed, shape, /*with_values=*/false);
  model->set_compute_dtype(config.precision.compute);
  *values = std::make_unique<InitialValues>(*model);
  if (!config.model.init_from.empty()) (*values)->read_from(open_init(config.model.init_from, *model));
  freeze(config.model.freeze, *model, config.model.name);
  const auto& params = model->params();
  if (!config.model.freeze.empty() && config.unfreeze.empty() &&
      std::none_of(params.begin(), params.end(), [](const Parameter& p) { return p.trainable; }))
    throw ConfigError("model.freeze: every parameter of model '" + config.model.name +
                      "' is frozen, so nothing would train (a [[schedule.unfreeze]] entry may thaw "
                      "some at a later step)");
  return model;  // gradients: the trainer packs them once the strategy could claim some
}

void check_unfreeze(const std::vector<UnfreezeConfig>& schedule, const Model& model, const std::string& model_name) {
  for (size_t u = 0; u < schedule.size(); ++u) {
    bool used = false;
    for (const Parameter& p : model.params()) used |= name_matches(schedule[u].params, p.name);
    if (!used)
      throw ConfigError("schedule.unfreeze[" + std::to_string(u) + "].params: '" + schedule[u].params +
                        "' matches no parameter of model '" + model_name + "'");
  }
}

bool apply_unfreeze(const std::vector<UnfreezeConfig>& schedule, int64_t step, Model& model, Device& device,
                    bool repack) {
  bool changed = false;
  for (const UnfreezeConfig& u : schedule) {
    if (u.step != step) continue;
    for (Parameter& p : model.params()) {
      if (p.trainable || !name_matches(u.params, p.name)) continue;
      p.trainable = true;
      changed = true;
    }
  }
  // Every gradient moves (the table is refreshed), once they exist.
  if (changed && repack && model.gradients_packed()) model.pack_gradients(device);
  return changed;
}

}  // namespace ddp
