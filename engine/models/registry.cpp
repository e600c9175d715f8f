// registry.cpp — the table of registry.h: one row per model.
#include "registry.h"

#include "error.h"
#include "lm.h"
#include "mlp.h"

namespace ddp {
namespace {

std::unique_ptr<Model> build_toy(const std::string& name, Device& device, uint64_t seed, DataShape* shape) {
  auto model = make_model(name, device, seed, /*with_gradients=*/false, /*with_values=*/false);
  *shape = DataShape{DataShape::Regression, model->input_width(), model->output_width(), 0, 0};
  return model;
}

// A preset, then each size the config sets (0: the preset's).
LmConfig lm_config(const ModelOptions& o) {
  LmConfig c = lm_preset(o.get_string("preset"));
  for (auto [field, key] : {std::pair{&c.vocab_size, "vocab_size"},
                            {&c.context_length, "context_length"},
                            {&c.d_model, "d_model"},
                            {&c.num_layers, "num_layers"},
                            {&c.num_heads, "num_heads"},
                            {&c.d_ff, "d_ff"}})
    if (const int64_t value = o.get_int(key)) *field = value;
  if (o.get_float("rope_theta") > 0) c.rope_theta = o.get_float("rope_theta");
  return c;
}

std::unique_ptr<Model> build_lm(const ModelOptions& o, Device& device, uint64_t seed, DataShape* shape) {
  const LmConfig c = lm_config(o);
  if (c.ffn_only)
    throw Error("lm preset '" + o.get_string("preset") +
                "' is for accounting only (FFN-only blocks, CS336's communication_accounting): "
                "`ddp plan` takes it, a run cannot build it");
  *shape = DataShape{DataShape::Tokens, 0, 0, c.context_length, c.vocab_size};
  return make_lm(c, device, seed, /*with_gradients=*/false, /*with_values=*/false);
}

MlpConfig mlp_config(const ModelOptions& o) {
  return MlpConfig{o.get_int("width"), o.get_int("depth"), o.get_int("classes")};
}

std::unique_ptr<Model> build_mlp(const ModelOptions& o, Device& device, uint64_t seed, DataShape* shape) {
  const MlpConfig c = mlp_config(o);
  *shape = DataShape{DataShape::Classification, c.width, c.classes, 0, 0};
  return make_mlp(c, device, seed, /*with_gradients=*/false, /*with_values=*/false);
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const LmPreset& p : lm_presets()) names.push_back(p.name);
  return names;
}

ModelKey int_key(const char* name, int64_t min, int64_t fallback) {
  return ModelKey{name, ModelKey::Int, min, {}, fallback};
}

}  // namespace

const std::vector<ModelInfo>& model_registry() {
  static const std::vector<ModelInfo> models = {
      {"toy",
       DataShape::Regression,
       {},
       [](const ModelOptions&, Device& d, uint64_t seed, DataShape* s) { return build_toy("toy", d, seed, s); }},
      {"toy_tied",
       DataShape::Regression,
       {},
       [](const ModelOptions&, Device& d, uint64_t seed, DataShape* s) { return build_toy("toy_tied", d, seed, s); }},
      {"mlp",
       DataShape::Classification,
       {int_key("width", 1, 1024), int_key("depth", 0, 8), int_key("classes", 2, 10)},
       build_mlp,
       [](const ModelOptions& o, int64_t rows, ddp_device_kind k, ddp_dtype c) {
         return mlp_footprint(mlp_config(o), rows, k, c);
       }},
      {"lm",
       DataShape::Tokens,
       {ModelKey{"preset", ModelKey::String, 0, preset_names(), std::string("lm-tiny")}, int_key("vocab_size", 2, 0),
        int_key("context_length", 1, 0), int_key("d_model", 1, 0), int_key("num_layers", 1, 0),
        int_key("num_heads", 1, 0), int_key("d_ff", 1, 0), ModelKey{"rope_theta", ModelKey::Float, 0, {}, 0.0}},
       build_lm,
       [](const ModelOptions& o, int64_t rows, ddp_device_kind k, ddp_dtype c) {
         return lm_footprint(lm_config(o), rows, k, c);
       }},
  };
  return models;
}

const ModelInfo* find_model(const std::string& name) {
  for (const ModelInfo& m : model_registry())
    if (m.name == name) return &m;
  return nullptr;
}

ModelOptions default_model_options(const std::string& name) {
  ModelOptions options;
  if (const ModelInfo* m = find_model(name))
    for (const ModelKey& k : m->keys) options.set(k.name, k.fallback);
  return options;
}

namespace {
const ModelInfo& known_model(const std::string& name) {
  const ModelInfo* m = find_model(name);
  if (!m) {
    std::string known;
    for (const ModelInfo& i : model_registry()) known += (known.empty() ? "" : ", ") + i.name;
    throw Error("unknown model '" + name + "' (known: " + known + ")");
  }
  return *m;
}
}  // namespace

std::unique_ptr<Model> build_model(const std::string& name, const ModelOptions& options, Device& device, uint64_t seed,
                                   DataShape* shape, bool with_values) {
  std::unique_ptr<Model> model = known_model(name).build(options, device, seed, shape);
  if (with_values) model->materialise(device);
  return model;
}

Footprint model_footprint(const std::string& name, const ModelOptions& options, int64_t rows, ddp_device_kind device,
                          ddp_dtype compute) {
  const ModelInfo& m = known_model(name);
  if (!m.footprint) throw Error("model '" + name + "' has no footprint: `ddp plan` cannot account for it");
  return m.footprint(options, rows, device, compute);
}

template <typename T>
const T& ModelOptions::get(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end()) throw Error("model option '" + key + "' is not set");
  if (const T* value = std::get_if<T>(&it->second)) return *value;
  throw Error("model option '" + key + "' has another type");
}

int64_t ModelOptions::get_int(const std::string& key) const { return get<int64_t>(key); }
double ModelOptions::get_float(const std::string& key) const { return get<double>(key); }
const std::string& ModelOptions::get_string(const std::string& key) const { return get<std::string>(key); }

}  // namespace ddp
