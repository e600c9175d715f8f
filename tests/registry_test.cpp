// registry_test.cpp — the model registry (models/registry.h): every model it
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
