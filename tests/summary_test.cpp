// summary_test.cpp — summary.json as the pure function run_summary
// (engine/train/summary.h) builds it from step records and rank totals:
// the fields, means, rates and the cross-rank checks that users and
// tools/ddp_suite.py read.
#include <gtest/gtest.h>

#include "summary.h"

namespace ddp {
namespace {

using json = nlohmann::ordered_json;

RunFacts facts(int64_t tokens_per_row) {
  RunFacts f;
  f.world_size = 2;
  f.steps = 2;
  f.model = "lm";
  f.transport = "gloo";
  f.strategy = "naive";
  f.rows_per_step = 8;  // batch 4, 2 micro-batches
  f.tokens_per_row = tokens_per_row;
  f.after_setup[int(MemCategory::Parameters)] = 100;
  f.before_optimizer[int(MemCategory::Gradients)] = 40;
  f.config_toml = "[run]\nsteps = 2\n";
  return f;
}

std::vector<StepRecord> two_steps() {
  StepRecord a, b;
  a.loss = 2.0, a.step_s = 0.5, a.comm_blocked_s = 0.1, a.comm_busy_s = 0.2, a.collectives = 3, a.comm_bytes = 12;
  b.loss = 1.5, b.step_s = 1.5, b.comm_blocked_s = 0.3, b.comm_busy_s = 0.4, b.collectives = 3, b.comm_bytes = 12;
  return {a, b};
}

RankTotals totals(uint64_t sequence) {
  RankTotals t;
  t.peaks[int(MemCategory::Parameters)] = 100;
  t.comm_blocked_s = 0.4;
  t.collective_sequence = sequence;
  return t;
}

TEST(Summary, StepColumnsMeansAndRates) {
  const json s = run_summary(facts(32), two_steps(), {totals(7), totals(7)}, nullptr);
  EXPECT_EQ(s["world_size"], 2);
  EXPECT_EQ(s["strategy"], "naive");
  EXPECT_EQ(s["loss"], json::array({2.0, 1.5}));
  EXPECT_EQ(s["collectives"], json::array({3, 3}));
  EXPECT_DOUBLE_EQ(s["mean_step_time_s"].get<double>(), 1.0);
  // 8 rows of 32 tokens per step, 2 steps in 2 s.
  EXPECT_DOUBLE_EQ(s["tokens_per_s"].get<double>(), 8.0 * 32 * 2 / 2.0);
  EXPECT_FALSE(s.contains("samples_per_s"));
  EXPECT_DOUBLE_EQ(s["total_comm_blocked_s"].get<double>(), 0.4);
  EXPECT_DOUBLE_EQ(s["total_comm_busy_s"].get<double>(), 0.6000000000000001);
  EXPECT_EQ(s["peak_bytes"]["after_setup"]["parameters"], 100);
  EXPECT_EQ(s["peak_bytes"]["after_setup"]["total"], 100);
  EXPECT_EQ(s["peak_bytes"]["before_optimizer_step"]["gradients"], 40);
  EXPECT_EQ(s["config"], "[run]\nsteps = 2\n");
  EXPECT_FALSE(s.contains("strategy_stats"));
  // The order users see in the file.
  std::vector<std::string> keys;
  for (auto it = s.begin(); it != s.end(); ++it) keys.push_back(it.key());
  EXPECT_EQ(std::vector<std::string>(keys.begin(), keys.begin() + 10),
            (std::vector<std::string>{"world_size", "steps", "model", "transport", "strategy", "precision", "loss",
                                      "step_time_s", "mean_step_time_s", "tokens_per_s"}));
  EXPECT_EQ(s["precision"], json({{"compute", "fp32"}, {"loss_scale", nullptr}}));
  EXPECT_EQ(s["loss_scale"].dump(), "[null,null]");  // no step scaled its loss (NaN, written as null)
  EXPECT_EQ(s["step_skipped"], json({false, false}));
  EXPECT_EQ(keys.back(), "config");
}

TEST(Summary, LossScalingSaysEachStepsScaleAndWhereItEnded) {
  RunFacts f = facts(32);
  f.compute = "fp16";
  f.loss_scale = LossScale{32768.0, 1, 1};
  std::vector<StepRecord> steps = two_steps();
  steps[0].loss_scale = 65536.0;
  steps[0].step_skipped = true;
  steps[1].loss_scale = 32768.0;
  const json s = run_summary(f, steps, {totals(7), totals(7)}, nullptr);
  EXPECT_EQ(s["precision"], json::parse(R"({"compute": "fp16",
                                             "loss_scale": {"scale": 32768.0, "growth_tracker": 1, "skipped_steps": 1}})"));
  EXPECT_EQ(s["loss_scale"], json({65536.0, 32768.0}));
  EXPECT_EQ(s["step_skipped"], json({true, false}));
}

TEST(Summary, HugePagesAreReportedAsRankZeroSawThem) {
  RunFacts f = facts(32);
  f.huge_pages = {"1", "madvise", int64_t(6) << 20};
  const json s = run_summary(f, two_steps(), {totals(7), totals(7)}, nullptr);
  EXPECT_EQ(s["huge_pages"], json({{"malloc_hugetlb", "1"}, {"transparent_huge_pages", "madvise"},
                                   {"anon_huge_bytes", 6291456}}));
}

TEST(Summary, ModelsWithoutTokensReportSamples) {
  const json s = run_summary(facts(1), two_steps(), {totals(7)}, nullptr);
  EXPECT_DOUBLE_EQ(s["samples_per_s"].get<double>(), 8.0 * 2 / 2.0);
  EXPECT_FALSE(s.contains("tokens_per_s"));
}

TEST(Summary, RanksAgreeOnlyIfTheyIssuedTheSameCollectives) {
  EXPECT_TRUE(run_summary(facts(1), two_steps(), {totals(7), totals(7)}, nullptr)["collective_sequences_agree"]);
  const json s = run_summary(facts(1), two_steps(), {totals(7), totals(8)}, nullptr);
  EXPECT_FALSE(s["collective_sequences_agree"]);
  EXPECT_EQ(s["ranks"][1]["rank"], 1);
  EXPECT_EQ(s["ranks"][1]["collective_sequence"], 8);
  EXPECT_EQ(s["ranks"][1]["peak_bytes"]["parameters"], 100);
}

// Which steps' replicas were proven equal (0: the end of the run), at what
// cost (issue 13).
TEST(Summary, ReplicaChecksAreReported) {
  RunFacts f = facts(1);
  f.replica_check_every = 1;
  f.replica_checked_after = {1, 2};
  f.replica_check_s = 0.25;
  const json s = run_summary(f, two_steps(), {totals(7)}, nullptr);
  EXPECT_EQ(s["replica_checks"], json({{"every", 1}, {"sync_points_only", false}, {"after_steps", {1, 2}}, {"seconds", 0.25}}));
  f.replica_check_every = 0;
  f.replica_checked_after = {0};
  EXPECT_EQ(run_summary(f, two_steps(), {totals(7)}, nullptr)["replica_checks"]["after_steps"], json::array({0}));
}

// What weights.safetensors holds: every rank's model after the last step,
// or, where a divergent strategy's last step was no sync point, rank 0's
// own replica, said in words.
TEST(Summary, WeightsSayWhetherTheLastStepWasASyncPoint) {
  RunFacts f = facts(1);
  EXPECT_EQ(run_summary(f, two_steps(), {totals(7)}, nullptr)["weights"],
            json({{"after_step", 2}, {"sync_point", true}, {"note", nullptr}}));
  f.strategy = "mine";
  f.divergent = true;
  f.weights_synced = false;
  const std::string note =
      "weights.safetensors holds rank 0's replica as of step 2, which was not a sync point: strategy plugin 'mine' "
      "lets the replicas differ between sync points and did not end the run with one";
  EXPECT_EQ(unsynced_weights_note("mine", 2), note);
  EXPECT_EQ(run_summary(f, two_steps(), {totals(7)}, nullptr)["weights"],
            json({{"after_step", 2}, {"sync_point", false}, {"note", note}}));
}

// A resumed run: `loss` covers every step (the checkpoint's first), the
// timing columns the steps this process ran; restarts and checkpoints said.
TEST(Summary, AResumedRunReportsEveryLossItsStartAndItsRestarts) {
  RunFacts f = facts(1);
  f.first_step = 3;
  f.losses_before = {3.0, 2.5, 2.25};
  f.resumed_from = "ck/step-00000003";
  f.checkpoints = {4};
  f.checkpoint_s = 0.5;
  f.restarts_json = R"([{"failure": "ddp: rank 1 failed\n", "resumed_from": "ck/step-00000003"}])";
  const json s = run_summary(f, two_steps(), {totals(7)}, nullptr);
  EXPECT_EQ(s["loss"].size(), 5u);
  EXPECT_EQ(s["loss"][0], 3.0);
  EXPECT_EQ(s["step_time_s"].size(), 2u);
  EXPECT_EQ(s["first_step"], 3);
  EXPECT_EQ(s["resumed_from"], "ck/step-00000003");
  EXPECT_EQ(s["checkpoints"], json({{"after_steps", {4}}, {"seconds", 0.5}}));
  EXPECT_EQ(s["restarts"][0]["resumed_from"], "ck/step-00000003");
  f.restarts_json = "";
  f.resumed_from = "";
  EXPECT_EQ(run_summary(f, two_steps(), {totals(7)}, nullptr)["restarts"], json::array());
  EXPECT_TRUE(run_summary(f, two_steps(), {totals(7)}, nullptr)["resumed_from"].is_null());
}

TEST(Summary, StrategyStatsAreCopiedWhenTheStrategyHasThem) {
  const json stats = {{"buckets", json::array({1, 2})}};
  EXPECT_EQ(run_summary(facts(1), two_steps(), {totals(7)}, &stats)["strategy_stats"], stats);
}

TEST(Summary, NoStepsMeansZeroRatesNotNaN) {
  const json s = run_summary(facts(1), {}, {totals(7)}, nullptr);
  EXPECT_EQ(s["mean_step_time_s"], 0.0);
  EXPECT_EQ(s["samples_per_s"], 0.0);
}

TEST(Summary, RankTotalsTravelAsDoubles) {
  RankTotals t = totals((uint64_t(1) << 52) - 3);
  t.comm_busy_s = 1.25;
  t.peak_resident_bytes = (int64_t(1) << 40) + 4096;
  const std::vector<double> v = t.to_doubles();
  ASSERT_EQ(v.size(), RankTotals::kDoubles);
  const RankTotals back = RankTotals::from_doubles(v.data());
  EXPECT_EQ(back.peaks, t.peaks);
  EXPECT_EQ(back.comm_blocked_s, t.comm_blocked_s);
  EXPECT_EQ(back.comm_busy_s, t.comm_busy_s);
  EXPECT_EQ(back.collective_sequence, t.collective_sequence);
  EXPECT_EQ(back.peak_resident_bytes, t.peak_resident_bytes);
  EXPECT_EQ(run_summary(facts(1), two_steps(), {t}, nullptr)["ranks"][0]["peak_resident_bytes"], (int64_t(1) << 40) + 4096);
  EXPECT_TRUE(run_summary(facts(1), two_steps(), {totals(7)}, nullptr)["ranks"][0]["peak_resident_bytes"].is_null());
}

TEST(Summary, PeakResidentBytesIsThisProcesssHighWaterMark) {
  std::vector<char> touched(size_t(64) << 20, 1);  // 64 MiB, every page written: in bytes, not kB
  ASSERT_EQ(touched[12345], 1);
  EXPECT_GE(peak_resident_bytes(), int64_t(64) << 20);
  EXPECT_LT(peak_resident_bytes(), int64_t(64) << 30);
}

}  // namespace
}  // namespace ddp
