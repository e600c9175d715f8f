// precision_run_test.cpp — [precision] through the engine, beside the
// models' rounding (precision_test, golden_test):
//  - where the strategy's own keys are unset, gradients are reduced in
//    [precision] reduce (ddp_host::precision, ABI 1.11) and stage 3
//    gathers in [precision] compute; a strategy that cannot reduce in 16
//    bits is refused, naming the key;
// fp16's dynamic loss scaling ([precision] loss_scale,
// engine/train/loss_scale.h):
//  - the pure parts: GradScaler's update of the scale, checkpoint.json's
//    "loss_scale" and its refusals;
//  - through the real engine on 2 and 4 forked ranks (tests/harness.h),
//    with every kind of optimizer step (the engine's, grads_final's
//    ordered one, a sharded strategy's own, over claimed gradients and
//    values, and powersgd's, whose error feedback is made of gradients):
//    an overflow injected into one rank's backward skips exactly that step
//    on every rank (weights, AdamW state and powersgd's state untouched),
//    halves the scale, and summary.json says so; a power-of-two scale,
//    growing every step, changes no bit of any strategy's result;
//  - a run resumed from a checkpoint goes on with the scale and its growth
//    count, bit for bit as the run that did not stop.
#include <gtest/gtest.h>

#include <cfloat>
#include <cstdio>

#include "checkpoint.h"
#include "harness.h"
#include "loss_scale.h"
#include "plugin_loader.h"

namespace ddp {
namespace {

using json = nlohmann::json;  // the harness's summary
using ojson = nlohmann::ordered_json;

PrecisionConfig dynamic(int64_t interval = 2000) {
  PrecisionConfig p;
  p.compute = DDP_FLOAT16;
  p.loss_scale = true;
  p.growth_interval = interval;
  return p;
}

TEST(LossScale, StartsAtInitScaleOnlyWhereScaling) {
  EXPECT_EQ(initial_loss_scale(dynamic()).scale, 65536.0);
  EXPECT_EQ(initial_loss_scale(PrecisionConfig{}).scale, 1.0);
}

TEST(LossScale, BacksOffOnInfAndGrowsAfterTheInterval) {
  const PrecisionConfig p = dynamic(3);
  LossScale s = initial_loss_scale(p);
  s = next_loss_scale(s, p, /*found_inf=*/true);
  EXPECT_EQ(s, (LossScale{32768.0, 0, 1}));
  s = next_loss_scale(s, p, false);
  s = next_loss_scale(s, p, false);
  EXPECT_EQ(s, (LossScale{32768.0, 2, 1}));
  s = next_loss_scale(s, p, false);  // the third clean step: grows
  EXPECT_EQ(s, (LossScale{65536.0, 0, 1}));
  s = next_loss_scale(next_loss_scale(s, p, false), p, true);  // an inf resets the count
  EXPECT_EQ(s, (LossScale{32768.0, 0, 2}));
}

TEST(LossScale, KeepsAScaleWhoseGrowthWouldOverflowAFloat) {
  const PrecisionConfig p = dynamic(1);
  const LossScale top{double(FLT_MAX), 0, 0};
  EXPECT_EQ(next_loss_scale(top, p, false), (LossScale{double(FLT_MAX), 0, 0}));
}

TEST(LossScale, ScalesAsAFloatDoes) {
  PrecisionConfig p = dynamic();
  p.backoff_factor = 0.3;  // 65536 * 0.3 is not a float: rounded as GradScaler's float32 scale
  EXPECT_EQ(next_loss_scale(initial_loss_scale(p), p, true).scale, double(float(65536 * 0.3)));
}

TEST(LossScale, CheckpointJsonRoundTripsAndRefusesWhatIsNotAScale) {
  const LossScale s{8192.0, 17, 3};
  EXPECT_EQ(loss_scale_json(s).dump(), R"({"scale":8192.0,"growth_tracker":17,"skipped_steps":3})");
  EXPECT_EQ(loss_scale_of(loss_scale_json(s)), s);
  const auto refusal = [](const std::string& text) {
    try {
      loss_scale_of(ojson::parse(text));
    } catch (const ojson::exception& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string counts = R"(,"growth_tracker":0,"skipped_steps":0})";
  EXPECT_NE(refusal(R"({"scale":0)" + counts).find("'loss_scale'.'scale' is 0, not a float from FLT_MIN to FLT_MAX"),
            std::string::npos);
  for (const char* scale : {"1e300", "1e-39", "0.1"})  // beyond a float, below FLT_MIN, not a float's value
    EXPECT_NE(refusal(R"({"scale":)" + std::string(scale) + counts).find("not a float from FLT_MIN to FLT_MAX"),
              std::string::npos)
        << scale;
  EXPECT_NE(refusal(R"({"scale":2.0,"growth_tracker":-1,"skipped_steps":0})")
                .find("'loss_scale'.'growth_tracker' is -1, not a whole number >= 0"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"scale":2.0,"growth_tracker":0,"skipped_steps":1.5})")
                .find("'loss_scale'.'skipped_steps' is 1.5, not a whole number >= 0"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"scale":2.0,"growth_tracker":0})").find("skipped_steps"), std::string::npos);
}

const std::string kFixtures = std::string(DDP_TEST_DATA_DIR) + "/fixtures/";

// The toy model from the fixture's weights, AdamW (whose step count a
// skipped step must leave), fp16 compute with dynamic loss scaling.
std::string toy(int steps, const std::string& strategy, const std::string& precision = "") {
  return "[run]\nsteps = " + std::to_string(steps) + "\nseed = 7\ntimeout_s = 30\n[model]\nname = \"toy\"\n" +
         "init_from = \"" + kFixtures + "toy_init.safetensors\"\n[data]\npath = \"" + kFixtures +
         "toy_data.safetensors\"\nbatch_size = 20\n[optimizer]\nname = \"adamw\"\nlr = 0.05\nweight_decay = 0.1\n" +
         "[precision]\ncompute = \"fp16\"\n" + precision + "[strategy]\n" + strategy;
}

struct Strategy {
  const char* label;
  const char* section;
};
// The engine's step; grads_final's ordered one; a strategy's own over whole
// parameters, over element ranges of claimed gradients, over claimed values;
// one with state made of gradients (powersgd's error feedback).
const Strategy kStrategies[] = {
    {"naive", "plugin = \"naive\"\n"},
    {"bucketed", "plugin = \"bucketed\"\nbucket_mb = 0.0001\n"},
    {"sharded_stage1", "plugin = \"sharded\"\n"},
    {"sharded_stage2", "plugin = \"sharded\"\nstage = 2\nbucket_mb = 0.0001\n"},
    {"sharded_stage3", "plugin = \"sharded\"\nstage = 3\n"},
    {"powersgd", "plugin = \"powersgd\"\n"},
};

// Whether some rank's failure holds `text`: a refusal in create fails the
// rank that says it, and may fail the others first in the transport's
// rendezvous, as their peer leaves ("Connection closed by peer").
bool some_rank_says(const std::vector<std::string>& failures, const std::string& text) {
  return std::any_of(failures.begin(), failures.end(),
                     [&](const std::string& f) { return f.find(text) != std::string::npos; });
}

std::vector<double> doubles(const json& column) {
  std::vector<double> out;
  for (const json& v : column) out.push_back(v.is_null() ? NAN : v.get<double>());
  return out;
}

TEST(LossScaleRun, AnOverflowOnOneRankSkipsThatStepOnEveryRankAndHalvesTheScale) {
  for (const Strategy& st : kStrategies) {
    for (int world : {2, 4}) {
      SCOPED_TRACE(std::string(st.label) + " on " + std::to_string(world) + " ranks");
      // Step 2 (the third) overflows on the last rank alone.
      const harness::RunResult r =
          harness::run(toy(4, st.section), world, {}, "", harness::Ranks::kAsTest, {{world - 1, {2}}});
      ASSERT_TRUE(r.failures.empty()) << r.failures[0];
      EXPECT_EQ(r.summary["step_skipped"], json({false, false, true, false}));
      EXPECT_EQ(doubles(r.summary["loss_scale"]), (std::vector<double>{65536, 65536, 65536, 32768}));
      EXPECT_EQ(r.summary["precision"]["loss_scale"],
                json::parse(R"({"scale":32768.0,"growth_tracker":1,"skipped_steps":1})"));
      EXPECT_TRUE(r.summary["grad_norm"][2].is_null());
      EXPECT_TRUE(r.summary["grad_norm"][3].is_number());
      for (int rank = 0; rank < world; ++rank) {
        const harness::Snapshots& s = r.ranks[size_t(rank)];
        const auto moved = [&](int64_t step) {  // the parameters step `step` (from 1) changed
          size_t n = 0;
          for (size_t p = 0; p < r.names.size(); ++p) n += s.at(step)[p] != s.at(step - 1)[p];
          return n;
        };
        EXPECT_EQ(moved(3), 0u) << "rank " << rank << ": the skipped step moved parameters";
        EXPECT_GT(moved(2), 0u) << "rank " << rank;
        EXPECT_EQ(moved(4), moved(2)) << "rank " << rank << ": the step after the skipped one";
        for (size_t p = 0; p < r.names.size(); ++p)
          EXPECT_EQ(s.at(4)[p], r.ranks[0].at(4)[p]) << "rank " << rank << " differs from rank 0: " << r.names[p];
      }
    }
  }
}

TEST(LossScaleRun, OverflowsOnTwoRanksInARowBackOffTwice) {
  const harness::RunResult r = harness::run(toy(4, "plugin = \"naive\"\n"), 2, {}, "", harness::Ranks::kAsTest,
                                            {{0, {1}}, {1, {2}}});
  ASSERT_TRUE(r.failures.empty()) << r.failures[0];
  EXPECT_EQ(r.summary["step_skipped"], json({false, true, true, false}));
  EXPECT_EQ(doubles(r.summary["loss_scale"]), (std::vector<double>{65536, 65536, 32768, 16384}));
  EXPECT_EQ(r.summary["precision"]["loss_scale"]["skipped_steps"], 2);
}

TEST(LossScaleRun, WithoutScalingNothingIsScaledOrSkipped) {
  const harness::RunResult r =
      harness::run(toy(2, "plugin = \"naive\"\n", "loss_scale = \"none\"\n"), 2, {}, "", harness::Ranks::kAsTest);
  ASSERT_TRUE(r.failures.empty()) << r.failures[0];
  EXPECT_TRUE(r.summary["precision"]["loss_scale"].is_null());
  EXPECT_EQ(r.summary["loss_scale"], json({nullptr, nullptr}));
  EXPECT_EQ(r.summary["step_skipped"], json({false, false}));
}

TEST(PrecisionPolicy, StrategiesReduceInReduceAndStageThreeGathersInComputeUnlessTheirKeysSay) {
  const auto stats = [](const std::string& strategy, const std::string& precision) {
    const harness::RunResult r = harness::run(toy(1, strategy, precision), 2);
    EXPECT_TRUE(r.failures.empty()) << r.failures[0];
    return r.summary["strategy_stats"];
  };
  const std::string bf16_reduce = "reduce = \"bf16\"\n";
  EXPECT_EQ(stats("plugin = \"bucketed\"\n", bf16_reduce)["compress"], "bf16");
  EXPECT_EQ(stats("plugin = \"bucketed\"\ncompress = \"none\"\n", bf16_reduce)["compress"], "none");
  EXPECT_EQ(stats("plugin = \"bucketed\"\n", "")["compress"], "none");
  EXPECT_EQ(stats("plugin = \"sharded\"\nstage = 2\n", bf16_reduce)["compress"], "bf16");
  const json stage3 = stats("plugin = \"sharded\"\nstage = 3\n", "");  // compute = "fp16"
  EXPECT_EQ(stage3["gather_dtype"], "fp16");
  EXPECT_EQ(stage3["compress"], "none");
  EXPECT_EQ(stats("plugin = \"sharded\"\nstage = 3\ngather_dtype = \"float32\"\n", "")["gather_dtype"], "float32");
}

TEST(PrecisionPolicy, AStrategyThatReducesInFloat32OnlyIsRefusedNamingTheKey) {
  EXPECT_EQ(reduce_refusal(DDP_CAP_DEVICE_CPU, DDP_FLOAT32, "naive"), "");
  EXPECT_EQ(reduce_refusal(DDP_CAP_DEVICE_CPU | DDP_CAP_REDUCE_DTYPE, DDP_BFLOAT16, "bucketed"), "");
  EXPECT_EQ(reduce_refusal(DDP_CAP_DEVICE_CPU, DDP_FLOAT16, "naive"),
            "precision.reduce = \"fp16\": strategy plugin 'naive' does not reduce gradients in 16 bits (its caps "
            "lack DDP_CAP_REDUCE_DTYPE; `ddp plugins` lists them as reduce-dtype): choose a strategy that does, or "
            "precision.reduce = \"fp32\"");
  const harness::RunResult naive = harness::run(toy(1, "plugin = \"naive\"\n", "reduce = \"bf16\"\n"), 2);
  ASSERT_EQ(naive.failures.size(), 2u);
  EXPECT_NE(naive.failures[0].find("precision.reduce = \"bf16\": strategy plugin 'naive' does not reduce "
                                   "gradients in 16 bits"),
            std::string::npos)
      << naive.failures[0];
  const harness::RunResult allgather =
      harness::run(toy(1, "plugin = \"sharded\"\nvariant = \"allgather\"\n", "reduce = \"bf16\"\n"), 2);
  ASSERT_FALSE(allgather.failures.empty());
  EXPECT_TRUE(some_rank_says(allgather.failures,
                             "create: precision.reduce = \"bf16\": strategy.variant = \"allgather\" reduces in float32 "
                             "only (variant \"broadcast\" and stages 2 and 3 take it; or precision.reduce = \"fp32\")"))
      << allgather.failures[0];
}

// The scale is a power of two and toy's gradients stay in float32's range
// times 2^18: a scaled run must equal the unscaled one bit for bit (SGD, no
// clipping, fp32 compute), whoever steps the optimizer. A missing or
// doubled unscale would be 2^16 off; the scale grows every step, so state
// kept at a step's scale (powersgd's error) would be 2x off the next.
TEST(LossScaleRun, APowerOfTwoScaleChangesNoBitUnderEveryKindOfStep) {
  const std::string sgd_fp32 = "[optimizer]\nname = \"sgd\"\nlr = 0.1\nmomentum = 0.9\n[precision]\ncompute = \"fp32\"\n";
  for (const Strategy& st : kStrategies) {
    std::string config = toy(3, st.section);
    config.replace(config.find("[optimizer]"), config.find("[strategy]") - config.find("[optimizer]"), sgd_fp32);
    const harness::RunResult plain = harness::run(config, 2);
    const harness::RunResult scaled =
        harness::run(config, 2, {"precision.loss_scale=\"dynamic\"", "precision.growth_interval=1"});
    ASSERT_TRUE(plain.failures.empty() && scaled.failures.empty()) << st.label;
    EXPECT_EQ(doubles(scaled.summary["loss_scale"]), (std::vector<double>{65536, 131072, 262144})) << st.label;
    for (size_t p = 0; p < plain.names.size(); ++p)
      EXPECT_EQ(scaled.ranks[0].at(3)[p], plain.ranks[0].at(3)[p]) << st.label << ": " << plain.names[p];
  }
}

// Every step overflowing whatever the scale: once the scale falls below
// FLT_MIN the run stops on every rank, saying why, rather than skip forever.
TEST(LossScaleRun, AScaleBelowFltMinStopsTheRunOnEveryRank) {
  const harness::RunResult r = harness::run(toy(3, "plugin = \"naive\"\n", "init_scale = 2e-38\n"), 2, {}, "",
                                            harness::Ranks::kAsTest, {{1, {0}}});
  ASSERT_EQ(r.failures.size(), 2u);
  for (const std::string& f : r.failures)
    EXPECT_NE(f.find("precision.loss_scale: the scale fell below FLT_MIN (1 steps skipped in the run): the gradients "
                     "overflow whatever the scale"),
              std::string::npos)
        << f;
}

// ddp_host::step_skipped and precision's loss_scaled, as a plugin reads
// them: 1 on the skipped step only (tests/plugins/strategy_skips.c, one
// rank).
TEST(LossScaleRun, AStrategyReadsWhichStepsWereSkipped) {
  const std::string skips = std::string(DDP_TEST_BROKEN_PLUGIN_DIR) + "/libddp_strategy_skips.so";
  const harness::RunResult r =
      harness::run(toy(3, "plugin = \"" + skips + "\"\n"), 1, {}, "", harness::Ranks::kAsTest, {{0, {1}}});
  ASSERT_TRUE(r.failures.empty()) << r.failures[0];
  EXPECT_EQ(r.summary["strategy_stats"]["skipped"], "0 1 0");
  EXPECT_EQ(r.summary["strategy_stats"]["scales"], "65536 65536 32768");  // ddp_step_info::loss_scale (1.12)
  EXPECT_EQ(r.summary["strategy_stats"]["loss_scaled"], 1);
}

// powersgd's error feedback and Q are made of gradients: a skipped step
// (step 2, overflowing on rank 1) puts back what it started from, so the
// checkpoint after it holds each rank's state as the one before it, bit
// for bit, and the step after moves it again (an inf or NaN kept there
// would skip every later step).
TEST(LossScaleRun, PowerSgdPutsBackTheErrorAndQOfASkippedStep) {
  harness::TempDir dir;
  const harness::RunResult r =
      harness::run(toy(4, "plugin = \"powersgd\"\n"), 2, {"checkpoint.every=1", "checkpoint.keep=5",
                   "checkpoint.dir=\"" + dir.path + "\""}, "", harness::Ranks::kAsTest, {{1, {2}}});
  ASSERT_TRUE(r.failures.empty()) << r.failures[0];
  EXPECT_EQ(r.summary["step_skipped"], json({false, false, true, false}));
  for (int rank = 0; rank < 2; ++rank) {
    const auto state = [&](int step) {
      char name[32];
      std::snprintf(name, sizeof name, "/step-%08d/", step);
      return read_safetensors(dir.path + name + strategy_state_file(rank));
    };
    const auto before = state(2);
    const auto skipped = state(3);
    const auto after = state(4);
    ASSERT_FALSE(before.empty());
    ASSERT_EQ(skipped.size(), before.size());
    size_t moved = 0;
    for (const auto& [name, t] : before) {
      EXPECT_TRUE(skipped.at(name).bytes == t.bytes) << "rank " << rank << ": " << name << " changed in the skipped step";
      moved += after.at(name).bytes != t.bytes;
    }
    EXPECT_EQ(moved, before.size()) << "rank " << rank << ": the step after the skipped one left state unchanged";
  }
}

// A skipped step updates nothing but makes (or, resumed, takes up) the
// state a first update starts from: a run resumed into one, from a
// checkpoint written after only skipped steps, or from one a resumed run
// wrote before its first update, goes on bit for bit as the run that did
// not stop (AdamW's moments and step count kept). The losses of skipped
// steps (inf: the injected overflow's) travel through checkpoint.json.
TEST(LossScaleRun, ResumingIntoOrAfterSkippedStepsKeepsTheOptimizerState) {
  for (const Strategy& st : {kStrategies[0], kStrategies[3], kStrategies[5]}) {
    SCOPED_TRACE(st.label);
    harness::TempDir dir;
    const std::string config = toy(4, st.section);
    const auto sets = [](const std::string& d) {
      return std::vector<std::string>{"checkpoint.every=1", "checkpoint.keep=5", "checkpoint.dir=\"" + d + "\""};
    };
    // Steps 0 and 2 overflow (on rank 1): the checkpoint after step 1 holds
    // only skipped steps' state; a run resumed after step 2 starts with a skip.
    const std::map<int, std::vector<int64_t>> overflows = {{1, {0, 2}}};
    const harness::RunResult whole =
        harness::run(config, 2, sets(dir.path + "/whole"), "", harness::Ranks::kAsTest, overflows);
    ASSERT_TRUE(whole.failures.empty()) << whole.failures[0];
    EXPECT_EQ(whole.summary["step_skipped"], json({true, false, true, false}));
    EXPECT_TRUE(whole.summary["loss"][0].is_null());  // inf
    const auto expect_whole = [&](const harness::RunResult& resumed, const std::string& what) {
      ASSERT_TRUE(resumed.failures.empty()) << what << ": " << resumed.failures[0];
      EXPECT_EQ(resumed.summary["loss"], whole.summary["loss"]) << what;
      for (const auto& [name, t] : whole.final_weights)
        EXPECT_TRUE(t.bytes == resumed.final_weights.at(name).bytes) << what << ": " << name;
    };
    for (const char* from : {"step-00000001", "step-00000002"})
      expect_whole(harness::run(config, 2, sets(dir.path + "/" + from), dir.path + "/whole/" + from,
                                harness::Ranks::kAsTest, overflows),
                   std::string("resumed from ") + from);
    // The run resumed after step 2 skipped step 3 and wrote step-00000003.
    expect_whole(harness::run(config, 2, sets(dir.path + "/again"), dir.path + "/step-00000002/step-00000003",
                              harness::Ranks::kAsTest, overflows),
                 "resumed from the resumed run's step 3");
  }
}

// growth_interval 2, an overflow at step 1: the scale used by steps 0..5 is
// 65536, 65536 (skipped), 32768, 32768, then grown: 65536, 65536; the
// checkpoint after step 3 holds {32768, 1 clean step, 1 skipped}, and the
// run resumed from it must grow at its first step to match.
TEST(LossScaleRun, AResumedRunGoesOnWithTheScaleBitForBit) {
  for (const Strategy& st : {kStrategies[0], kStrategies[3], kStrategies[5]}) {
    SCOPED_TRACE(st.label);
    harness::TempDir dir;
    const std::vector<std::string> sets = {"checkpoint.every=3", "checkpoint.dir=\"" + dir.path + "\""};
    const std::string config = toy(6, st.section, "growth_interval = 2\n");
    const harness::RunResult whole = harness::run(config, 2, sets, "", harness::Ranks::kAsTest, {{1, {1}}});
    ASSERT_TRUE(whole.failures.empty()) << whole.failures[0];
    const std::vector<double> scales{65536, 65536, 32768, 32768, 65536, 65536};
    EXPECT_EQ(doubles(whole.summary["loss_scale"]), scales);
    const CheckpointMeta meta = read_checkpoint_meta(dir.path + "/step-00000003");
    ASSERT_TRUE(meta.loss_scale.has_value());
    EXPECT_EQ(*meta.loss_scale, (LossScale{32768.0, 1, 1}));
    for (const auto& [name, state] : meta.state)  // AdamW's: two of the three steps stepped
      EXPECT_EQ(state.steps, 2) << name;
    EXPECT_FALSE(meta.state.empty());
    const harness::RunResult resumed = harness::run(config, 2, sets, dir.path + "/step-00000003");
    ASSERT_TRUE(resumed.failures.empty()) << resumed.failures[0];
    EXPECT_EQ(doubles(resumed.summary["loss_scale"]), std::vector<double>(scales.begin() + 3, scales.end()));
    EXPECT_EQ(resumed.summary["precision"]["loss_scale"], whole.summary["precision"]["loss_scale"]);
    EXPECT_EQ(resumed.summary["loss"], whole.summary["loss"]);
    for (const auto& [name, t] : whole.final_weights)
      EXPECT_TRUE(t.bytes == resumed.final_weights.at(name).bytes) << name << " differs from the run that went on";
  }
}

}  // namespace
}  // namespace ddp
