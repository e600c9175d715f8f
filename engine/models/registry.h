// registry.h — every model ddp trains, in one table: its name, the data it
// reads, the keys of its [model] table (type, limit, default) and how to
// build it. The config validates [model] against this table and the trainer
// builds through it, so adding a model is a change in this folder alone:
// write the model, add its row in registry.cpp (and its section in
// docs/models.md).
//
// Not here: the keys every model shares (model.name, init_from, freeze),
// which the config reads itself.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "model.h"

namespace ddp {

// One key of a model's [model] table.
struct ModelKey {
  enum Type { Int, Float, String };
  std::string name;
  Type type;
  // Int: the least value allowed. Float: values must be > 0. String: the
  // values allowed, in the order errors list them.
  int64_t min = 0;
  std::vector<std::string> choices;
  // The value when the config does not set it (lm's sizes: 0, "the
  // preset's").
  std::variant<int64_t, double, std::string> fallback;
};

// A model's hyper-parameters after validation: a value for every key of its
// table, the key's fallback where the config sets none.
class ModelOptions {
 public:
  using Value = std::variant<int64_t, double, std::string>;
  void set(const std::string& key, Value value) { values_[key] = std::move(value); }
  // Throw Error for a key the options lack or hold with another type.
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  const std::string& get_string(const std::string& key) const;
  bool has(const std::string& key) const { return values_.count(key) != 0; }

 private:
  template <typename T>
  const T& get(const std::string& key) const;
  std::map<std::string, Value> values_;
};

struct ModelInfo {
  std::string name;
  DataShape::Kind data;        // what its batches hold (regression, classes, tokens)
  std::vector<ModelKey> keys;  // its [model] keys beyond name, init_from, freeze
  // The model, its parameters to be drawn from `seed` (no values yet:
  // Model::materialise), and the shape of the data it reads. Throws Error
  // for sizes it cannot build.
  std::unique_ptr<Model> (*build)(const ModelOptions& options, Device& device, uint64_t seed, DataShape* shape);
  // What it holds with `rows` rows per micro-batch, computing in `compute`
  // (model.h); null where `ddp plan` cannot account for it (the toy models).
  Footprint (*footprint)(const ModelOptions& options, int64_t rows, ddp_device_kind device,
                         ddp_dtype compute) = nullptr;
};

// Every model, in the order the documentation lists them.
const std::vector<ModelInfo>& model_registry();
// The entry named `name`, or null.
const ModelInfo* find_model(const std::string& name);
// The options of `name` with every key at its fallback (what an empty
// [model] table gives).
ModelOptions default_model_options(const std::string& name);

// The registry's footprint for `name`. Throws Error for an unknown name or
// one without a footprint.
Footprint model_footprint(const std::string& name, const ModelOptions& options, int64_t rows, ddp_device_kind device,
                          ddp_dtype compute = DDP_FLOAT32);

// The registry's build for `name`, with its values drawn unless
// `with_values` is false (Model::materialise). Throws Error for an unknown
// name.
std::unique_ptr<Model> build_model(const std::string& name, const ModelOptions& options, Device& device, uint64_t seed,
                                   DataShape* shape, bool with_values = true);

}  // namespace ddp
