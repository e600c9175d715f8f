// sharded_test.cpp — the acceptance checks of the `sharded` strategy
// (optimizer state sharding, ZeRO stage 1), through the real engine and the
// gloo transport, each rank a forked process (tests/harness.h):
//  (a) from the PyTorch fixture's initial weights, AdamW with weight decay
//      gives PyTorch's weights after every step within 1e-5, on every rank
//      (ranks bitwise equal), worlds 1, 2, 4, both variants;
//  (b) optimizer-state bytes per rank (summary.json's per-rank peak) are at
//      most the unsharded run's / N + the state of the largest parameter,
//      and the shards add up to exactly the unsharded state;
//  (c) stats report the partition (owners, shard bytes) with a finite
//      largest/smallest ratio;
//  plus: a bad variant is refused naming the key and the allowed values,
//  and unfreezing mid-run keeps the owners of already-owned parameters.
// Correctness against the single-process engine in every scenario (SGD,
// AdamW, frozen, unfreeze, accumulation) is the conformance suite's:
//   conformance_test --strategy sharded [--strategy-key variant=\"allgather\"]
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "harness.h"
#include "safetensors.h"

#include <ddp/numeric.h>

namespace ddp {
namespace {

using harness::max_abs_diff;
using harness::RunResult;
using nlohmann::json;

const std::string kFixtures = std::string(DDP_TEST_DATA_DIR) + "/fixtures/";
constexpr int kSteps = 5;
const std::string kAdamW = "[optimizer]\nname = \"adamw\"\nlr = 0.1\nweight_decay = 0.1\n";

// A whole run configuration; `strategy_keys` are lines of [strategy].
std::string toml(const std::string& model, const std::string& strategy, const std::string& strategy_keys,
                 bool from_fixture = true, const std::string& tail = "") {
  std::string t = "[run]\nsteps = " + std::to_string(kSteps) + "\nseed = 7\ntimeout_s = 30\n";
  t += "[model]\nname = \"" + model + "\"\n";
  if (from_fixture) t += "init_from = \"" + kFixtures + model + "_init.safetensors\"\n";
  t += "[data]\npath = \"" + kFixtures + "toy_data.safetensors\"\nbatch_size = 20\n";
  t += kAdamW;
  t += "[transport]\nplugin = \"gloo\"\n[strategy]\nplugin = \"" + strategy + "\"\n" + strategy_keys;
  return t + tail;
}

std::string variant_key(const std::string& variant) { return "variant = \"" + variant + "\"\n"; }

RunResult run_ok(const std::string& config, int world) {
  RunResult r = harness::run(config, world);
  for (const auto& f : r.failures) ADD_FAILURE() << f;
  return r;
}

// Total float32 elements of the trainable parameters of `model`, and the largest.
std::pair<size_t, size_t> trainable_numel(const std::string& model) {
  CpuDevice device;
  auto m = make_model(model, device, 0);
  size_t total = 0, largest = 0;
  for (const auto& p : m->params()) {
    if (!p.trainable) continue;
    total += p.data.numel();
    largest = std::max(largest, p.data.numel());
  }
  return {total, largest};
}

struct Case {
  std::string model;
  std::string variant;
  int world;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.model << ", " << c.variant << ", " << c.world << " ranks"; }
std::string case_name(const testing::TestParamInfo<Case>& info) {
  return info.param.model + "_" + info.param.variant + "_world" + std::to_string(info.param.world);
}

std::vector<Case> fixture_cases() {
  std::vector<Case> out;
  for (const char* model : {"toy", "toy_tied"})
    for (const char* variant : {"broadcast", "allgather"})
      for (int world : {1, 2, 4}) out.push_back({model, variant, world});
  return out;
}

// (a) PyTorch's AdamW(lr=0.1, weight_decay=0.1), 5 full-batch steps.
class ShardedFixture : public testing::TestWithParam<Case> {};

TEST_P(ShardedFixture, MatchesPyTorchAdamW) {
  const Case& c = GetParam();
  RunResult ddp = run_ok(toml(c.model, "sharded", variant_key(c.variant)), c.world);
  ASSERT_TRUE(ddp.failures.empty());
  const std::string file = c.model + "_adamw_expected.safetensors";
  auto expected = read_safetensors(kFixtures + file);
  ASSERT_EQ(ddp.ranks.size(), size_t(c.world));
  for (int r = 0; r < c.world; ++r) {
    ASSERT_EQ(ddp.ranks[r].size(), size_t(kSteps + 2)) << "rank " << r;
    for (int step = 1; step <= kSteps; ++step) {
      for (size_t p = 0; p < ddp.names.size(); ++p) {
        const std::string key = "step" + std::to_string(step) + "/" + ddp.names[p];
        ASSERT_TRUE(expected.count(key)) << key;
        EXPECT_LE(max_abs_diff(ddp.ranks[r].at(step)[p], expected.at(key).as_floats(file, key)), 1e-5f)
            << "rank " << r << ", " << key;
        EXPECT_EQ(ddp.ranks[r].at(step)[p], ddp.ranks[0].at(step)[p])
            << "rank " << r << ", " << key << ": not bitwise equal to rank 0";
      }
    }
  }
  std::vector<float> loss = expected.at("loss").as_floats(file, "loss");
  ASSERT_EQ(ddp.summary["loss"].size(), loss.size());
  for (size_t s = 0; s < loss.size(); ++s)
    EXPECT_NEAR(ddp.summary["loss"][s].get<double>(), loss[s], 1e-5) << "loss of step " << s + 1;
  EXPECT_EQ(ddp.summary["strategy"], "sharded");
  EXPECT_EQ(ddp.summary["strategy_stats"]["variant"], c.variant);
}

INSTANTIATE_TEST_SUITE_P(Sharded, ShardedFixture, testing::ValuesIn(fixture_cases()), case_name);

// (b) Optimizer-state memory per rank, from summary.json's accounting.
class ShardedMemory : public testing::TestWithParam<Case> {};

TEST_P(ShardedMemory, OptimizerStatePerRankIsAboutOneNth) {
  const Case& c = GetParam();
  RunResult naive = run_ok(toml(c.model, "naive", ""), c.world);
  RunResult sharded = run_ok(toml(c.model, "sharded", variant_key(c.variant)), c.world);
  ASSERT_TRUE(naive.failures.empty() && sharded.failures.empty());
  const json& nr = naive.summary["ranks"];
  const json& sr = sharded.summary["ranks"];
  ASSERT_EQ(nr.size(), size_t(c.world));
  ASSERT_EQ(sr.size(), size_t(c.world));

  // AdamW keeps two float32 moments per trainable element, on every rank.
  const auto [total, largest] = trainable_numel(c.model);
  const int64_t unsharded = nr[0]["peak_bytes"]["optimizer_state"].get<int64_t>();
  EXPECT_EQ(unsharded, int64_t(2 * 4 * total));
  for (int r = 0; r < c.world; ++r) EXPECT_EQ(nr[r]["peak_bytes"]["optimizer_state"].get<int64_t>(), unsharded);

  // Greedy balance: no rank holds more than 1/N plus the largest parameter's state.
  const int64_t largest_state = int64_t(2 * 4 * largest);
  const json& shard_bytes = sharded.summary["strategy_stats"]["shard_bytes"];
  ASSERT_EQ(shard_bytes.size(), size_t(c.world));
  int64_t sum = 0;
  for (int r = 0; r < c.world; ++r) {
    const int64_t mine = sr[r]["peak_bytes"]["optimizer_state"].get<int64_t>();
    EXPECT_LE(mine, unsharded / c.world + largest_state)
        << "rank " << r << ": unsharded " << unsharded << " bytes over " << c.world << " ranks";
    EXPECT_LT(mine, unsharded) << "rank " << r << ": not sharded at all";
    // The state of the parameters this rank owns (exact here: every owned parameter of toy/toy_tied is used; at most that in general) (two moments each).
    EXPECT_EQ(mine, 2 * shard_bytes[r].get<int64_t>()) << "rank " << r;
    sum += mine;
  }
  EXPECT_EQ(sum, unsharded) << "every parameter's state lives on exactly one rank";
}

INSTANTIATE_TEST_SUITE_P(Sharded, ShardedMemory,
                         testing::Values(Case{"toy", "broadcast", 2}, Case{"toy", "allgather", 2},
                                         Case{"toy", "broadcast", 4}, Case{"toy", "allgather", 4},
                                         Case{"toy_tied", "broadcast", 4}),
                         case_name);

// (c) The partition in summary.json's strategy_stats.
TEST(ShardedStats, ReportThePartitionWithAFiniteRatio) {
  for (const char* variant : {"broadcast", "allgather"}) {
    SCOPED_TRACE(variant);
    RunResult r = run_ok(toml("toy", "sharded", variant_key(variant)), 2);
    ASSERT_TRUE(r.failures.empty());
    const json& stats = r.summary["strategy_stats"];
    ASSERT_TRUE(stats.is_object()) << stats.dump();
    EXPECT_EQ(stats["variant"], variant);
    // toy's trainable parameters: fc1.weight [10,10], fc2.fc.weight [50,10], fc3.weight [5,50].
    // Greedy: fc2 (2000 B) → rank 0; fc3 (1000 B) → rank 1; fc1 (400 B) → rank 1.
    EXPECT_EQ(stats["owners"], json({{"fc1.weight", 1}, {"fc2.fc.weight", 0}, {"fc3.weight", 1}}));
    EXPECT_EQ(stats["shard_bytes"], json::array({2000, 1400}));
    ASSERT_TRUE(stats["largest_to_smallest"].is_number()) << stats.dump();
    EXPECT_NEAR(stats["largest_to_smallest"].get<double>(), 2000.0 / 1400.0, 1e-5);
    // Collectives per step: broadcast = 1 bucket + 3 parameter broadcasts;
    // allgather = reduce_scatter + all_gather.
    for (const auto& n : r.summary["collectives"]) EXPECT_EQ(n, std::string(variant) == "broadcast" ? 4 : 2);
  }
  // Four ranks over toy_tied's four parameters: every shard non-empty.
  RunResult tied = run_ok(toml("toy_tied", "sharded", ""), 4);
  ASSERT_TRUE(tied.failures.empty());
  const json& stats = tied.summary["strategy_stats"];
  EXPECT_EQ(stats["variant"], "broadcast");
  EXPECT_EQ(stats["owners"].size(), 4u);
  ASSERT_TRUE(stats["largest_to_smallest"].is_number()) << stats.dump();
  EXPECT_GE(stats["largest_to_smallest"].get<double>(), 1.0);
  // More ranks than trainable parameters (toy on 4): an empty shard, ratio null.
  RunResult toy4 = run_ok(toml("toy", "sharded", ""), 4);
  ASSERT_TRUE(toy4.failures.empty());
  EXPECT_TRUE(toy4.summary["strategy_stats"]["largest_to_smallest"].is_null());
  EXPECT_EQ(toy4.summary["strategy_stats"]["shard_bytes"], json::array({2000, 1000, 400, 0}));
}

TEST(ShardedConfig, UnknownVariantIsRefusedNamingTheKeyAndTheValues) {
  RunResult r = harness::run(toml("toy", "sharded", "variant = \"ring\"\n"), 1);
  ASSERT_EQ(r.failures.size(), 1u);
  EXPECT_NE(r.failures[0].find("strategy.variant"), std::string::npos) << r.failures[0];
  EXPECT_NE(r.failures[0].find("\"broadcast\""), std::string::npos) << r.failures[0];
  EXPECT_NE(r.failures[0].find("\"allgather\""), std::string::npos) << r.failures[0];
  EXPECT_NE(r.failures[0].find("ring"), std::string::npos) << r.failures[0];
  RunResult bad_cap = harness::run(toml("toy", "sharded", "bucket_mb = 0\n"), 1);
  ASSERT_EQ(bad_cap.failures.size(), 1u);
  EXPECT_NE(bad_cap.failures[0].find("strategy.bucket_mb"), std::string::npos) << bad_cap.failures[0];
}

// mlp (units of a weight and a bias; random data) for 4 steps under
// `strategy` ([strategy] lines) with `optimizer` ([optimizer] lines).
std::string mlp_config(const std::string& optimizer, const std::string& strategy) {
  return "[run]\nsteps = 4\nseed = 5\ntimeout_s = 30\n[model]\nname = \"mlp\"\nwidth = 32\ndepth = 2\n"
         "classes = 4\n[data]\nkind = \"random\"\nbatch_size = 16\n[optimizer]\n" + optimizer + "[strategy]\n" +
         strategy;
}

// `run` on `world` ranks against `single`: every rank's weights bitwise
// equal to rank 0's, and within `tolerance` of single-process training,
// after every step (and, from `first`, before the first).
void expect_equals_single(const RunResult& run, const RunResult& single, int world, float tolerance, int first) {
  ASSERT_TRUE(single.failures.empty() && run.failures.empty());
  for (int step = first; step <= 4; ++step)
    for (size_t p = 0; p < run.names.size(); ++p) {
      for (int r = 1; r < world; ++r) ASSERT_EQ(run.ranks[r].at(step)[p], run.ranks[0].at(step)[p]);
      EXPECT_LE(harness::max_abs_diff(run.ranks[0].at(step)[p], single.ranks[0].at(step)[p]), tolerance)
          << "step " << step << ", " << run.names[p];
    }
}

const char* const kMlpOptimizers[] = {"name = \"sgd\"\nlr = 0.05\nmomentum = 0.9\n", "name = \"adamw\"\nlr = 0.01\n"};
float mlp_tolerance(const std::string& optimizer) { return optimizer.find("adamw") != std::string::npos ? 1e-5f : 1e-6f; }

// ZeRO-2 on mlp: on 1, 2 and 4 ranks it equals single-process training
// within 1e-6 with SGD and momentum, 1e-5 with AdamW, ranks bitwise equal
// after every step.
TEST(ShardedStage2, MlpEqualsSingleProcess) {
  for (const char* optimizer : kMlpOptimizers) {
    const RunResult single = run_ok(mlp_config(optimizer, "plugin = \"naive\"\n"), 1);
    for (int world : {1, 2, 4}) {
      SCOPED_TRACE(std::string(optimizer) + " on " + std::to_string(world) + " ranks");
      const RunResult z2 = run_ok(mlp_config(optimizer, "plugin = \"sharded\"\nstage = 2\nbucket_mb = 0.002\n"), world);
      expect_equals_single(z2, single, world, mlp_tolerance(optimizer), 1);
    }
  }
}

TEST(ShardedConfig, StageOtherThanOneTwoOrThreeIsRefused) {
  RunResult r = harness::run(toml("toy", "sharded", "stage = 4\n"), 1);
  ASSERT_EQ(r.failures.size(), 1u);
  EXPECT_NE(r.failures[0].find("strategy plugin 'sharded': create: strategy.stage must be 1, 2 or 3 (got 4)"),
            std::string::npos) << r.failures[0];
}

// Stage 3's prefetch: a number of units from 0 to 16; anything else is
// refused at create, naming the key and the value.
TEST(ShardedConfig, Stage3PrefetchOutsideZeroToSixteenIsRefused) {
  for (const char* value : {"-1", "17", "1000000000000"}) {
    RunResult r = harness::run(toml("toy", "sharded", "stage = 3\nprefetch = " + std::string(value) + "\n"), 1);
    ASSERT_EQ(r.failures.size(), 1u) << value;
    EXPECT_NE(r.failures[0].find("strategy plugin 'sharded': create: strategy.prefetch must be a number of units "
                                 "from 0 to 16 (got " + std::string(value) + ")"),
              std::string::npos) << r.failures[0];
  }
}

TEST(ShardedConfig, Stage3GatherDtypeOtherThanFloat32Bf16OrFp16IsRefused) {
  RunResult r = harness::run(toml("toy", "sharded", "stage = 3\ngather_dtype = \"fp8\"\n"), 1);
  ASSERT_EQ(r.failures.size(), 1u);
  EXPECT_NE(r.failures[0].find("strategy plugin 'sharded': create: strategy.gather_dtype must be \"float32\", "
                               "\"bf16\" or \"fp16\" (got \"fp8\")"),
            std::string::npos) << r.failures[0];
}

// ZeRO-3 on mlp: on 1, 2 and 4 ranks, with and without prefetch and
// resharding after forward, as ZeRO-2 above, from the weights before the
// first step on (each rank's snapshot is the model gathered unit by unit).
TEST(ShardedStage3, MlpEqualsSingleProcess) {
  for (const char* optimizer : kMlpOptimizers) {
    const RunResult single = run_ok(mlp_config(optimizer, "plugin = \"naive\"\n"), 1);
    for (const char* keys : {"prefetch = 1\n", "prefetch = 0\nreshard_after_forward = false\n", "prefetch = 2\n"})
      for (int world : {1, 2, 4}) {
        SCOPED_TRACE(std::string(optimizer) + keys + " on " + std::to_string(world) + " ranks");
        const RunResult z3 = run_ok(mlp_config(optimizer, "plugin = \"sharded\"\nstage = 3\n" + std::string(keys)), world);
        expect_equals_single(z3, single, world, mlp_tolerance(optimizer), 0);
      }
  }
}

// gather_dtype = "bf16": the units compute from bfloat16-rounded copies of
// float32 values, which the shards, the step and every reader keep. From
// weights bfloat16 holds exactly, the first step is float32's bit for bit;
// after it the values are float32 (not rounded), the ranks equal, and the
// run parts from float32's by no more than bfloat16's rounding makes.
TEST(ShardedStage3, GatherInBf16ComputesFromRoundedCopies) {
  const std::string adamw = kMlpOptimizers[1], stage3 = "plugin = \"sharded\"\nstage = 3\n";
  const RunResult plain = run_ok(mlp_config(adamw, stage3), 2);
  ASSERT_TRUE(plain.failures.empty());
  char dir[] = "/tmp/ddp-bf16-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string init = std::string(dir) + "/init.safetensors";
  std::vector<std::vector<float>> rounded;
  std::vector<NamedFloats> tensors;
  for (size_t p = 0; p < plain.names.size(); ++p) {
    rounded.push_back(plain.ranks[0].at(0)[p]);
    for (float& v : rounded.back()) v = ddp_bf16_to_float(ddp_float_to_bf16(v));
  }
  for (size_t p = 0; p < plain.names.size(); ++p)
    tensors.push_back({plain.names[p], plain.final_weights.at(plain.names[p]).shape, rounded[p].data()});
  write_safetensors(init, tensors);
  auto from_init = [&](std::string config) {
    return config.replace(config.find("classes = 4\n"), 12, "classes = 4\ninit_from = \"" + init + "\"\n");
  };
  const RunResult f32 = run_ok(from_init(mlp_config(adamw, stage3)), 2);
  const RunResult bf16 = run_ok(from_init(mlp_config(adamw, stage3 + "gather_dtype = \"bf16\"\n")), 2);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(f32.failures.empty() && bf16.failures.empty());
  EXPECT_EQ(bf16.summary["strategy_stats"]["gather_dtype"], "bf16");
  bool kept_float32 = false;
  float parted = 0;
  for (size_t p = 0; p < bf16.names.size(); ++p) {
    EXPECT_EQ(bf16.ranks[0].at(1)[p], f32.ranks[0].at(1)[p]) << bf16.names[p];
    for (float v : bf16.ranks[0].at(1)[p]) kept_float32 |= ddp_bf16_to_float(ddp_float_to_bf16(v)) != v;
    for (int step = 2; step <= 4; ++step) {
      ASSERT_EQ(bf16.ranks[1].at(step)[p], bf16.ranks[0].at(step)[p]);
      parted = std::max(parted, harness::max_abs_diff(bf16.ranks[0].at(step)[p], f32.ranks[0].at(step)[p]));
    }
  }
  EXPECT_TRUE(kept_float32) << "the values after step 1 are all bfloat16: the shards were rounded";
  EXPECT_GT(parted, 0.0f) << "the gathers were not rounded";
  EXPECT_LT(parted, 0.06f);  // AdamW at lr 0.01 moves an element about 0.01 a step: 3 steps of 2 runs
}

// Stage 2 (and stage 1's allgather) reduce-scatter: over a transport
// without reduce_scatter (optional since ABI 1.4) they refuse at create.
TEST(ShardedConfig, ReduceScatteringNeedsATransportThatHasIt) {
  const std::string stub = std::string(DDP_TEST_BROKEN_PLUGIN_DIR) + "/libddp_transport_norscatter.so";
  for (const char* keys : {"stage = 2\n", "variant = \"allgather\"\n"}) {
    std::string config = toml("toy", "sharded", keys);
    config.replace(config.find("plugin = \"gloo\""), 15, "plugin = \"" + stub + "\"");
    RunResult r = harness::run(config, 1);
    ASSERT_EQ(r.failures.size(), 1u) << keys;
    EXPECT_NE(r.failures[0].find("reduce-scatters the gradients, and transport 'norscatter' has no reduce_scatter"),
              std::string::npos) << r.failures[0];
  }
}

// Unfreezing mid-run: the parameters owned before keep their owner (their
// optimizer state lives there); the new one gets an owner too.
TEST(ShardedUnfreeze, KeepsOwnersAndAssignsTheNewParameter) {
  const std::string unfreeze = "[[schedule.unfreeze]]\nstep = 2\nparams = \"fc2.fc.bias\"\n";
  for (const char* variant : {"broadcast", "allgather"}) {
    SCOPED_TRACE(variant);
    RunResult before = run_ok(toml("toy", "sharded", variant_key(variant), false), 2);
    RunResult after = run_ok(toml("toy", "sharded", variant_key(variant), false, unfreeze), 2);
    ASSERT_TRUE(before.failures.empty() && after.failures.empty());
    json owners = after.summary["strategy_stats"]["owners"];
    ASSERT_TRUE(owners.contains("fc2.fc.bias")) << owners.dump();
    owners.erase("fc2.fc.bias");
    EXPECT_EQ(owners, before.summary["strategy_stats"]["owners"]);
    // The bias trained after step 2, the same on both ranks.
    size_t p = std::find(after.names.begin(), after.names.end(), "fc2.fc.bias") - after.names.begin();
    EXPECT_EQ(after.ranks[0].at(2)[p], after.ranks[0].at(0)[p]);
    EXPECT_NE(after.ranks[0].at(3)[p], after.ranks[0].at(2)[p]);
    EXPECT_EQ(after.ranks[1].at(kSteps)[p], after.ranks[0].at(kSteps)[p]);
  }
}

}  // namespace
}  // namespace ddp
