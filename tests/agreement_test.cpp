// agreement_test.cpp — ranks agree before they train (engine/train/
// agreement.h): the fingerprint of a config, its plugins and parameters,
// and the first difference between ranks, named with the ranks that differ.
#include <gtest/gtest.h>

#include "agreement.h"
#include "device.h"
#include "registry.h"

namespace ddp {
namespace {

Config config_from(const std::string& extra) {
  return validate_config(toml::parse("[run]\nsteps = 2\noutput_dir = \"out\"\nthreads = 2\n[model]\nname = \"toy\"\n"
                                     "[data]\nbatch_size = 4\n[optimizer]\nlr = 0.1\nbetas = [0.9, 0.999]\n"
                                     "name = \"adamw\"\n" + extra),
                         "t.toml");
}

std::vector<Parameter> toy_params(CpuDevice& device) {
  DataShape shape;
  auto model = build_model("toy", default_model_options("toy"), device, 0, &shape);
  return std::move(model->params());
}

TEST(Agreement, TheFingerprintHoldsConfigPluginsAndParametersButNotRankLocalKeys) {
  CpuDevice device;
  const auto params = toy_params(device);
  const Fingerprint f = fingerprint(config_from(""), params, "transport gloo 0.3.0, strategy naive 0.1.0");
  EXPECT_EQ(f.at("config optimizer.lr"), "0.1");  // the shortest exact text
  EXPECT_EQ(f.at("config optimizer.betas"), "[0.9, 0.999]");
  EXPECT_EQ(f.at("plugins"), "transport gloo 0.3.0, strategy naive 0.1.0");
  EXPECT_EQ(f.at("parameter 000000"), "no_grad_fixed_param [2] float32");
  EXPECT_EQ(f.at("parameter 000002"), "fc2.fc.weight [50, 10] float32");
  EXPECT_FALSE(f.count("config run.output_dir"));
  EXPECT_FALSE(f.count("config run.threads"));
}

TEST(Agreement, EqualRanksAgree) {
  CpuDevice device;
  const Fingerprint f = fingerprint(config_from(""), toy_params(device), "p");
  EXPECT_EQ(first_difference(f, 0, {{1, f}, {2, f}}), "");
}

// The engine's keys are compared as they take effect: a default written
// out is the same config as one left unset; run.log_every is not
// rank-local (the loss all-reduce follows it).
TEST(Agreement, DefaultsWrittenOutAgreeWithDefaultsLeftUnset) {
  CpuDevice device;
  const auto params = toy_params(device);
  const Fingerprint unset = fingerprint(config_from(""), params, "p");
  const Fingerprint written = fingerprint(
      config_from("[strategy]\nplugin = \"naive\"\n[transport]\nplugin = \"gloo\"\n"), params, "p");
  EXPECT_EQ(first_difference(unset, 0, {{1, written}}), "");
  EXPECT_EQ(unset.at("config run.check_finite"), "true");
  EXPECT_EQ(unset.at("config run.timeout_s"), "30");
  Config often = config_from("");
  often.effective["run.log_every"] = "5";
  EXPECT_EQ(first_difference(unset, 0, {{1, fingerprint(often, params, "p")}}),
            "the ranks disagree on config run.log_every: rank 0 has 1, rank 1 has 5: every rank must train the "
            "same model with the same config");
}

TEST(Agreement, TheFirstDifferenceNamesTheItemAndTheRanks) {
  CpuDevice device;
  const auto params = toy_params(device);
  const Fingerprint base = fingerprint(config_from(""), params, "p");
  const Fingerprint lr = fingerprint(validate_config(toml::parse(
      "[run]\nsteps = 2\n[model]\nname = \"toy\"\n[data]\nbatch_size = 4\n[optimizer]\nlr = 0.2\n"
      "betas = [0.9, 0.999]\nname = \"adamw\"\n"), "t.toml"), params, "p");
  EXPECT_EQ(first_difference(base, 0, {{1, base}, {2, lr}, {3, lr}}),
            "the ranks disagree on config optimizer.lr: rank 0 has 0.1, ranks 2 and 3 have 0.2 (or another value): every "
            "rank must train the same model with the same config");
  // A value of 0.1 + 1e-17 is not 0.1: no digit is lost.
  Fingerprint near = base;
  near["config optimizer.lr"] = "0.10000000000000002";
  EXPECT_NE(first_difference(base, 0, {{1, near}}), "");
  // A key only one rank has (a plugin's, read by the plugin), and another model.
  Fingerprint extra = base;
  extra["config strategy.bucket_mb"] = "2";
  EXPECT_EQ(first_difference(base, 0, {{1, extra}}),
            "the ranks disagree on config strategy.bucket_mb: rank 0 has (not set), rank 1 has 2: every rank must "
            "train the same model with the same config");
  Fingerprint model = base;
  model["parameter 000002"] = "fc2.fc.weight [60, 10] float32";
  EXPECT_EQ(first_difference(base, 0, {{1, model}}).rfind("the ranks disagree on parameter 000002: rank 0 has "
                                                          "fc2.fc.weight [50, 10] float32, rank 1 has fc2.fc.weight "
                                                          "[60, 10] float32",
                                                          0),
            0u);
}

// The units: a strategy that binds or shards by unit needs one layout on
// every rank; a rank whose model declares another is refused naming the
// unit and the ranks (issue 33: ranks that disagree on the unit layout).
TEST(Agreement, RanksThatDisagreeOnTheUnitsAreRefusedNamingTheUnit) {
  CpuDevice device;
  DataShape shape;
  auto model = build_model("toy_tied", default_model_options("toy_tied"), device, 0, &shape);
  const Fingerprint base = fingerprint(config_from(""), model->params(), "p", model->units());
  ASSERT_GE(model->units().size(), 2u);
  for (size_t u = 0; u < model->units().size(); ++u) EXPECT_TRUE(base.count("unit 00000" + std::to_string(u))) << u;
  std::vector<Unit> moved = model->units();  // the last unit's first parameter, owned by the first instead
  moved.front().params.push_back(moved.back().params.front());
  moved.back().params.erase(moved.back().params.begin());
  const Fingerprint other = fingerprint(config_from(""), model->params(), "p", moved);
  const std::string why = first_difference(base, 0, {{1, base}, {2, other}});
  EXPECT_EQ(why.rfind("the ranks disagree on unit 000000: rank 0 has " + model->units().front().name + " owns ", 0), 0u)
      << why;
  EXPECT_NE(why.find(", rank 2 has " + moved.front().name + " owns "), std::string::npos) << why;
  EXPECT_EQ(first_difference(base, 0, {{1, fingerprint(config_from(""), model->params(), "p", model->units())}}), "");
}

}  // namespace
}  // namespace ddp
