// overlap_test.cpp — `overlap` and `bucketed` really communicate during
// backward: the engine counts, per step, the collectives a strategy had
// enqueued when it called the step's last on_grad_ready (summary.json's
// collectives_before_last_grad_ready). Strategies that wait for the end of
// backward (naive, flat) have none there.
#include <gtest/gtest.h>

#include "harness.h"

namespace ddp {
namespace {

const std::string kFixtures = std::string(DDP_TEST_DATA_DIR) + "/fixtures/";

nlohmann::json summary_of(const std::string& model, const std::string& strategy_section) {
  const std::string toml = "[run]\nsteps = 3\n[model]\nname = \"" + model + "\"\n[data]\npath = \"" + kFixtures +
                           "toy_data.safetensors\"\nbatch_size = 20\n[optimizer]\nlr = 0.1\n" + strategy_section;
  harness::RunResult r = harness::run(toml, 2);
  for (const auto& f : r.failures) ADD_FAILURE() << f;
  return r.summary;
}

// Every step: how many collectives were launched before backward ended.
std::vector<int64_t> early(const nlohmann::json& summary) {
  return summary.at("collectives_before_last_grad_ready").get<std::vector<int64_t>>();
}

TEST(Overlap, OverlapLaunchesEachGradientAsItBecomesFinal) {
  for (const char* model : {"toy", "toy_tied"}) {
    auto s = summary_of(model, "[strategy]\nplugin = \"overlap\"\n");
    // toy: 3 trainable parameters, toy_tied: 4; all but the last fired
    // before the last on_grad_ready.
    const int64_t expected = std::string(model) == "toy" ? 2 : 3;
    EXPECT_EQ(early(s), std::vector<int64_t>(3, expected)) << model;
    EXPECT_EQ(s["collectives"][0], expected + 1) << model;
  }
}

TEST(Overlap, BucketedLaunchesCompleteBucketsDuringBackward) {
  // 0.001 MiB: one bucket per parameter of `toy`, the first two launch early.
  auto s = summary_of("toy", "[strategy]\nplugin = \"bucketed\"\nbucket_mb = 0.001\n");
  EXPECT_EQ(early(s), std::vector<int64_t>(3, 2));
  EXPECT_EQ(s["strategy_stats"]["buckets"].size(), 3u);
  // One bucket holding everything cannot launch before the end.
  auto one = summary_of("toy", "[strategy]\nplugin = \"bucketed\"\nbucket_mb = 25\n");
  EXPECT_EQ(early(one), std::vector<int64_t>(3, 0));
  EXPECT_EQ(one["collectives"][0], 1);
}

TEST(Overlap, NaiveAndFlatCommunicateOnlyAfterBackward) {
  for (const char* plugin : {"naive", "flat"}) {
    auto s = summary_of("toy", std::string("[strategy]\nplugin = \"") + plugin + "\"\n");
    EXPECT_EQ(early(s), std::vector<int64_t>(3, 0)) << plugin;
  }
}

}  // namespace
}  // namespace ddp
