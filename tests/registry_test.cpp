// registry_test.cpp — the model registry (engine/models/registry.h): every model it
// lists builds from its keys' fallbacks and reads the data it says; the
// config's [model] keys are its keys; an unknown name is refused by name.
#include <gtest/gtest.h>

#include <map>

#include "config.h"
#include "device.h"
#include "registry.h"

namespace ddp {
namespace {

TEST(Registry, ListsTheReferenceModelsInOrder) {
  std::vector<std::string> names;
  for (const ModelInfo& m : model_registry()) names.push_back(m.name);
  EXPECT_EQ(names, (std::vector<std::string>{"toy", "toy_tied", "mlp", "lm"}));
}

TEST(Registry, EveryModelBuildsFromItsFallbacksAndSaysWhatItReads) {
  CpuDevice device;
  for (const ModelInfo& m : model_registry()) {
    DataShape shape;
    auto model = build_model(m.name, default_model_options(m.name), device, 0, &shape);
    ASSERT_TRUE(model) << m.name;
    EXPECT_FALSE(model->params().empty()) << m.name;
    EXPECT_EQ(shape.kind, m.data) << m.name;
  }
}

// What lets the engine make a model's values one tensor at a time
// (engine/train/initial_values.h): any parameter drawn alone, in any
// order, equals what the whole draw gives it; a model built without
// values holds none, only their shapes.
TEST(Registry, EveryParameterDrawnAloneInAnyOrderIsWhatTheWholeDrawGives) {
  CpuDevice device;
  for (const ModelInfo& m : model_registry()) {
    DataShape shape;
    auto whole = build_model(m.name, default_model_options(m.name), device, 7, &shape);
    auto alone = build_model(m.name, default_model_options(m.name), device, 7, &shape, /*with_values=*/false);
    ASSERT_EQ(alone->params().size(), whole->params().size()) << m.name;
    for (const Parameter& p : alone->params()) {
      EXPECT_EQ(p.data.data(), nullptr) << m.name << " " << p.name;
      EXPECT_EQ(p.data.numel(), numel_of(p.shape)) << m.name << " " << p.name;
    }
    const size_t n = whole->params().size();
    for (size_t k = 0; k < n; ++k) {
      const size_t i = k % 2 == 0 ? n - 1 - k / 2 : k / 2;  // last, first, second last, second, ...
      std::vector<float> drawn(numel_of(whole->params()[i].shape));
      alone->draw_initial(i, drawn.data());
      EXPECT_EQ(drawn, whole->params()[i].data.to_host()) << m.name << " " << whole->params()[i].name;
    }
  }
}

TEST(Registry, AKeySharedByModelsHasOneType) {
  std::map<std::string, ModelKey::Type> types;
  for (const ModelInfo& m : model_registry())
    for (const ModelKey& k : m.keys) {
      auto [it, fresh] = types.emplace(k.name, k.type);
      EXPECT_EQ(it->second, k.type) << "model." << k.name << " has two types";
    }
}

TEST(Registry, TheConfigFillsEveryKeyOfTheModelAndNoOther) {
  const Config c = validate_config(toml::parse("[run]\nsteps = 1\n[model]\nname = \"mlp\"\ndepth = 3\n"
                                               "[data]\nbatch_size = 2\n[optimizer]\nlr = 0.1\n"),
                                   "t.toml");
  for (const ModelKey& k : find_model("mlp")->keys) EXPECT_TRUE(c.model.options.has(k.name)) << k.name;
  EXPECT_EQ(c.model.options.get_int("depth"), 3);
  EXPECT_EQ(c.model.options.get_int("width"), 1024);
  EXPECT_FALSE(c.model.options.has("preset"));
}

TEST(Registry, AnUnknownModelIsRefusedByName) {
  CpuDevice device;
  DataShape shape;
  try {
    build_model("gpt", ModelOptions(), device, 0, &shape);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "unknown model 'gpt' (known: toy, toy_tied, mlp, lm)");
  }
  EXPECT_EQ(find_model("gpt"), nullptr);
}

TEST(Registry, AnOptionOfAnotherTypeIsAnError) {
  ModelOptions o;
  o.set("width", int64_t(4));
  EXPECT_EQ(o.get_int("width"), 4);
  EXPECT_THROW(o.get_float("width"), Error);
  EXPECT_THROW(o.get_int("depth"), Error);
}

}  // namespace
}  // namespace ddp
