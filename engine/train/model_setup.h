// model_setup.h — the model as the config sets it up: built through the
// registry (engine/models/registry.h) from run.seed + rank, initial weights from
// model.init_from, parameters frozen by model.freeze, and the unfreeze
// schedule ([[schedule.unfreeze]]) applied step by step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "model.h"

namespace ddp {

class InitialValues;  // initial_values.h

// The config's model on `device`, with model.freeze applied, and neither
// values nor gradients yet: the trainer makes them once the strategy could
// claim some (InitialValues, Model::pack_gradients). `values` receives
// where its values come from: model.init_from, checked whole, else the
// draw from `seed`; `shape` what data it reads. Throws ConfigError for a
// freeze pattern that matches no parameter, Error for a bad init file.
std::unique_ptr<Model> set_up_model(const Config& config, Device& device, uint64_t seed, DataShape* shape,
                                    std::unique_ptr<InitialValues>* values);

// Throws ConfigError for an unfreeze pattern that matches no parameter.
void check_unfreeze(const std::vector<UnfreezeConfig>& schedule, const Model& model, const std::string& model_name);

// Makes the parameters scheduled for `step` trainable and, where the
// gradients exist already, packs every trainable gradient anew
// (Model::pack_gradients: all zero, all moved); returns whether any changed.
// `repack` false: the caller makes them later (a strategy that may claim
// the new ones first: their gradients are then never made).
bool apply_unfreeze(const std::vector<UnfreezeConfig>& schedule, int64_t step, Model& model, Device& device,
                    bool repack = true);

}  // namespace ddp
