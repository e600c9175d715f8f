// hooks_test.cpp — the order in which the engine calls a strategy's hooks,
// seen by a recording strategy (tests/plugins/strategy_recorder.c) on one
// rank: on_grad_ready in reverse layer order, after a parameter's last use
// (once for the tied weight, with its final gradient), never for frozen
// parameters.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "config.h"
#include "trainer.h"

namespace ddp {
namespace {

// Trains `model` for 2 steps on one rank with the test strategy `strategy`;
// returns summary.json.
nlohmann::json run_one_rank(const std::string& model, const std::string& strategy) {
  char tmpl[] = "/tmp/ddp-hooks-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  std::ofstream(dir + "/run.toml") << "[run]\nsteps = 2\noutput_dir = \"" << dir << "/out\"\n"
                                   << "[model]\nname = \"" << model << "\"\n[data]\nbatch_size = 8\n"
                                   << "[optimizer]\nlr = 0.1\n[strategy]\nplugin = \""
                                   << DDP_TEST_BROKEN_PLUGIN_DIR << "/libddp_strategy_" << strategy << ".so\"\n";
  Config config = load_config(dir + "/run.toml");
  std::filesystem::create_directories(dir + "/rdzv");
  RankEnv env;
  env.rendezvous = "file:" + dir + "/rdzv";
  try {
    train_rank(config, env);
  } catch (...) {
    std::filesystem::remove_all(dir);
    throw;
  }
  auto summary = nlohmann::json::parse(std::ifstream(dir + "/out/summary.json"));
  std::filesystem::remove_all(dir);
  return summary;
}

nlohmann::json recorded_stats(const std::string& model) { return run_one_rank(model, "recorder").at("strategy_stats"); }

TEST(Hooks, ToyFiresEachTrainableParameterOnceInReverseOrderAndNeverAFrozenOne) {
  auto stats = recorded_stats("toy");
  EXPECT_EQ(stats["hooks"],
            "train_begin step_begin(0,0/1,sync=1) ready(fc3.weight) ready(fc2.fc.weight) ready(fc1.weight) "
            "backward_end finish");
  EXPECT_EQ(stats["ready_sums"], stats["finish_sums"]);
}

TEST(Hooks, TiedWeightFiresOnceAfterItsLastUseWithItsFinalGradient) {
  auto stats = recorded_stats("toy_tied");
  EXPECT_EQ(stats["hooks"],
            "train_begin step_begin(0,0/1,sync=1) ready(fc5.weight) ready(fc3.weight) ready(fc2.weight) "
            "ready(fc1.weight) backward_end finish");
  // fc2.weight's gradient when reported ready already holds both uses.
  EXPECT_EQ(stats["ready_sums"], stats["finish_sums"]);
  EXPECT_NE(stats["finish_sums"]["fc2.weight"], 0.0);
}

TEST(Hooks, StrategyWithoutTheRunsDeviceIsRefused) {
  try {
    run_one_rank("toy", "cudaonly");
    FAIL() << "a CUDA-only strategy ran on CPU";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "strategy plugin 'stub' does not support device 'cpu' (its caps lack DDP_CAP_DEVICE_CPU)");
  }
}

}  // namespace
}  // namespace ddp
