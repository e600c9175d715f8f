// schema.h — every key of the config's fixed sections, with its TOML type
// and whether it is required. The models' own [model] keys are the
// registry's (engine/models/registry.h); the plugin sections ([transport],
// [strategy]) list only `plugin`: their other keys belong to the plugin and
// are checked by PluginSection.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "registry.h"

namespace ddp {

struct KeySpec {
  const char* section;
  const char* key;
  toml::node_type type;
  bool required;
};

std::vector<KeySpec> schema();

bool is_plugin_section(const std::string& section);
bool is_known_section(const std::string& section);
const KeySpec* find_spec(const std::string& section, const std::string& key);
const ModelKey* model_key(const ModelInfo& model, const std::string& key);
// The type of a key of the fixed sections, or of any model's key.
std::optional<toml::node_type> key_type(const std::string& section, const std::string& key);

}  // namespace ddp
