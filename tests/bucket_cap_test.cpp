// bucket_cap_test.cpp — `strategy.bucket_mb = "auto"` (strategies/common/
// bucket_cap.h) in `bucketed` and `sharded`, on real ranks: the start-up
// probes, rank 0's fit shared by everyone, the cap the model chooses, what
// summary.json records; and the refusal of anything but a number or "auto".
// (The conformance suite runs both strategies with "auto" too:
// bucketed_auto/..., sharded_broadcast_auto/... in tests/CMakeLists.txt.)
#include <gtest/gtest.h>

#include <cmath>

#include <ddp/overhead_model.hpp>
#include "bucket_layout.h"
#include "harness.h"

namespace ddp {
namespace {

using json = nlohmann::json;
const std::string kFixtures = std::string(DDP_TEST_DATA_DIR) + "/fixtures/";

harness::RunResult run(const std::string& strategy_section, int world) {
  return harness::run("[run]\nsteps = 3\n[model]\nname = \"toy\"\n[data]\npath = \"" + kFixtures +
                          "toy_data.safetensors\"\nbatch_size = 20\n[optimizer]\nlr = 0.1\n[strategy]\n" +
                          strategy_section,
                      world);
}

// The recorded fit, probes and choice agree with the model's formula.
void expect_auto_stats(const json& stats, size_t gradient_bytes) {
  ASSERT_EQ(stats["bucket_mb"], "auto") << stats.dump();
  const json& a = stats["auto"];
  const double o = a["o_s"].get<double>();
  const double w = a["w_bytes_per_s"].is_null() ? INFINITY : a["w_bytes_per_s"].get<double>();
  EXPECT_TRUE(std::isfinite(o)) << a.dump();
  EXPECT_GT(w, 0) << a.dump();
  // toy's 3.6 kB of parameters: probes of 64 KiB, 512 KiB and 4 MiB
  ASSERT_EQ(a["probes"].size(), 3u) << a.dump();
  const size_t probe_bytes[] = {64 << 10, 512 << 10, 4 << 20};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(a["probes"][i]["bytes"].get<double>(), double(probe_bytes[i]));
    EXPECT_GT(a["probes"][i]["seconds"].get<double>(), 0);
  }
  EXPECT_EQ(a["gradient_bytes"], gradient_bytes);
  const strategy::OverheadFit fit{o, w};
  const double best = std::min(strategy::optimal_bucket_bytes(fit, double(gradient_bytes)), double(gradient_bytes));
  EXPECT_NEAR(a["chosen_bucket_mb"].get<double>() * 1024 * 1024, std::max(1.0, std::floor(best)), 1.0) << a.dump();
  EXPECT_EQ(a["buckets"].get<size_t>(), stats["buckets"].size());
  EXPECT_NEAR(a["predicted_overhead_s"].get<double>(),
              strategy::predicted_overhead_s(fit, double(gradient_bytes), double(stats["buckets"].size())), 1e-12);
}

// The layouts two runs' stats prove the same, and why the others are not.
json auto_stats(double o, double w, double chosen_mb) {
  return json{{"bucket_mb", "auto"},
              {"auto", {{"o_s", o}, {"w_bytes_per_s", w}, {"gradient_bytes", 3400}, {"chosen_bucket_mb", chosen_mb}}}};
}

TEST(BucketLayouts, TheSameWhereNeitherMeasuredOrTheFitsOrClampedCapsAgree) {
  const double whole = 3400.0 / (1024 * 1024);  // every trainable gradient in one cap
  const double one = 1.0 / (1024 * 1024);       // a 1-byte cap: a parameter per bucket
  EXPECT_EQ(test::bucket_layouts_differ(json{{"bucket_mb", 25}}, json{{"bucket_mb", 25}}), "");
  EXPECT_EQ(test::bucket_layouts_differ(json(), json()), "");
  EXPECT_EQ(test::bucket_layouts_differ(auto_stats(1e-5, 1e9, 0.001), auto_stats(1e-5, 1e9, 0.001)), "");
  EXPECT_EQ(test::bucket_layouts_differ(auto_stats(1e-5, 1e9, whole), auto_stats(2e-5, 3e9, whole)), "");
  EXPECT_EQ(test::bucket_layouts_differ(auto_stats(-1e-6, 1e9, one), auto_stats(1e-12, 1e9, one)), "");
}

TEST(BucketLayouts, OtherFitsWithOtherOrUnclampedCapsMayDiffer) {
  EXPECT_EQ(test::bucket_layouts_differ(auto_stats(1e-5, 1e9, 0.002), auto_stats(-1e-6, 1e9, 1.0 / (1024 * 1024))),
            "bucket_mb = \"auto\" measured other fits: caps of 0.002 and 9.5367431640625e-07 MiB for 3400 "
            "gradient bytes");
  // The same cap below the whole, from other fits: before an unfreeze
  // (fewer trainable bytes) the two caps may have differed.
  EXPECT_EQ(test::bucket_layouts_differ(auto_stats(1e-5, 1e9, 0.002), auto_stats(2e-5, 5e8, 0.002)),
            "bucket_mb = \"auto\" measured other fits: caps of 0.002 and 0.002 MiB for 3400 gradient bytes");
  EXPECT_EQ(test::bucket_layouts_differ(json{{"bucket_mb", 25}}, auto_stats(1e-5, 1e9, 0.002)),
            "one run measured its bucket cap (bucket_mb = \"auto\"), the other did not");
  json more = auto_stats(1e-5, 1e9, 0.002);
  more["auto"]["gradient_bytes"] = 3600;
  EXPECT_EQ(test::bucket_layouts_differ(auto_stats(1e-5, 1e9, 0.002), more),
            "the runs ended with 3400 and 3600 trainable gradient bytes");
}

TEST(BucketMbAuto, BucketedMeasuresAtStartAndRecordsTheChoice) {
  harness::RunResult r = run("plugin = \"bucketed\"\nbucket_mb = \"auto\"\n", 2);
  for (const auto& f : r.failures) ADD_FAILURE() << f;
  ASSERT_TRUE(r.failures.empty());
  expect_auto_stats(r.summary["strategy_stats"], 3400);  // toy's trainable gradients
  // Every rank issued the same collectives (the probes included) and holds the same weights.
  EXPECT_TRUE(r.summary["collective_sequences_agree"].get<bool>()) << r.summary["ranks"].dump();
  EXPECT_EQ(r.ranks[1].at(3), r.ranks[0].at(3));
}

TEST(BucketMbAuto, ShardedBroadcastVariantToo) {
  harness::RunResult r = run("plugin = \"sharded\"\nvariant = \"broadcast\"\nbucket_mb = \"auto\"\n", 4);
  for (const auto& f : r.failures) ADD_FAILURE() << f;
  ASSERT_TRUE(r.failures.empty());
  expect_auto_stats(r.summary["strategy_stats"], 3400);
  EXPECT_TRUE(r.summary["collective_sequences_agree"].get<bool>());
}

TEST(BucketMbAuto, NumbersStillWork) {
  harness::RunResult r = run("plugin = \"bucketed\"\nbucket_mb = 0.001\n", 2);
  ASSERT_TRUE(r.failures.empty());
  EXPECT_EQ(r.summary["strategy_stats"]["bucket_mb"], 0.001);
  EXPECT_EQ(r.summary["strategy_stats"]["buckets"].size(), 3u);  // one per parameter of toy
  EXPECT_FALSE(r.summary["strategy_stats"].contains("auto"));
}

TEST(BucketMbAuto, AnythingElseIsRefusedNamingTheKey) {
  for (const char* strategy : {"bucketed", "sharded"}) {
    for (const std::string& value : {std::string("\"fast\""), std::string("\"Auto\""), std::string("true"),
                                     std::string("0"), std::string("-2.5"), std::string("nan")}) {
      SCOPED_TRACE(std::string(strategy) + " bucket_mb = " + value);
      harness::RunResult r = run("plugin = \"" + std::string(strategy) + "\"\nbucket_mb = " + value + "\n", 1);
      ASSERT_EQ(r.failures.size(), 1u);
      EXPECT_NE(r.failures[0].find("strategy.bucket_mb must be a finite number of MiB > 0 or \"auto\""),
                std::string::npos)
          << r.failures[0];
    }
  }
}

}  // namespace
}  // namespace ddp
