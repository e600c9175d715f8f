// hsdp_test.cpp — HSDP in the `sharded` strategy (strategy.shard_size,
// strategies/sharded/README.md#hsdp-shard_size): on 4 ranks with
// shard_size = 2 (shard groups {0, 1} and {2, 3}, replica groups {0, 2} and
// {1, 3}), for stage 1 (both variants), stage 2 and stage 3, through the
// real engine over gloo, each rank a forked process (tests/harness.h):
//  - bus bytes per step: summary.json's equal the README's formula,
//    computed here from the layout the run reports (its strategy_stats),
//    and `ddp plan`'s; each group's share (summary.json "groups", which
//    names the 'shard' and 'replicate' groups and their ranks) is the
//    formula's term on that group; the formula with g = N is the plain
//    stage's;
//  - the gradient norm, and clipping by it, equal the plain stage's and
//    DDP's (naive) to 1e-6 relative; the weights equal the plain stage's
//    within the conformance tolerance (1e-5, AdamW), every rank's bitwise
//    equal to rank 0's after every step;
//  - every rank's peak bytes of parameters, gradients and optimizer state
//    equal `ddp plan`'s exactly, and with communication buffers those of
//    the plain stage on a world of g ranks;
//  - with compress = "bf16" (stage 1's broadcast, stage 2), the bus bytes
//    of reductions in 16 bits, and the memory, as formula and plan say;
//  - shard_size = 4 on 4 ranks is the plain stage bit for bit, with no
//    groups; shard_size = 3 on 4 ranks is refused by name (create and
//    plan), shard_size = 0 too.
// Parity with single-process training in every scenario is the
// conformance suite's (sharded_hsdp_* in tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "harness.h"
#include "plan_command.h"

namespace ddp {
namespace {

using harness::RunResult;
using nlohmann::json;

constexpr int kWorld = 4;
constexpr int kShard = 2;
constexpr int kReplicas = kWorld / kShard;
constexpr int kSteps = 4;
// A norm mlp's gradients exceed at every step (measured: 0.31 to 0.62):
// clipping scales them all.
constexpr double kClip = 0.1;

struct Stage {
  std::string name, keys;
};
void PrintTo(const Stage& s, std::ostream* os) { *os << s.name; }
const std::vector<Stage> kStages = {
    {"stage1_broadcast", "stage = 1\nbucket_mb = 0.002\n"},  // a bucket per weight
    {"stage1_allgather", "variant = \"allgather\"\n"},
    {"stage2", "stage = 2\nbucket_mb = 0.002\n"},
    {"stage3", "stage = 3\n"},
};

// mlp (units of a weight and a bias; random data) for kSteps steps of
// AdamW, clipped, under `strategy` ([strategy] lines).
std::string config(const std::string& strategy) {
  return "[run]\nsteps = " + std::to_string(kSteps) +
         "\nseed = 5\ntimeout_s = 30\n[model]\nname = \"mlp\"\nwidth = 32\ndepth = 2\nclasses = 4\n"
         "[data]\nkind = \"random\"\nbatch_size = 16\n[optimizer]\nname = \"adamw\"\nlr = 0.01\n"
         "clip_grad_norm = " + std::to_string(kClip) + "\n[transport]\nplugin = \"gloo\"\n[strategy]\n" + strategy;
}
std::string sharded(const Stage& s, int shard_size = 0) {
  return config("plugin = \"sharded\"\n" + s.keys +
                (shard_size ? "shard_size = " + std::to_string(shard_size) + "\n" : std::string()));
}

RunResult run_ok(const std::string& toml, int world = kWorld) {
  RunResult r = harness::run(toml, world);
  for (const auto& f : r.failures) ADD_FAILURE() << f;
  return r;
}

// `ddp plan --json`'s "run" for `toml` on `world` ranks, as the command
// prints it; throws what it throws.
json ddp_plan(const std::string& toml, int world = kWorld) {
  harness::TempDir dir("ddp-hsdp-plan");
  std::ofstream(dir.path + "/run.toml") << toml;
  PlanOptions options;
  options.config_path = dir.path + "/run.toml";
  options.overrides = {"run.world_size=" + std::to_string(world)};
  options.json = true;
  std::ostringstream out;
  std::streambuf* const old = std::cout.rdbuf(out.rdbuf());
  try {
    plan_command(options);
  } catch (...) {
    std::cout.rdbuf(old);
    throw;
  }
  std::cout.rdbuf(old);
  return json::parse(out.str())["run"];
}

// What one collective of S buffer bytes moves per rank on n ranks (ring
// algorithms, nccl-tests' bus bytes): all-reduce 2(n-1)/n S, all-gather
// (S: gathered) and reduce-scatter (S: sent) (n-1)/n S, broadcast S.
int64_t bus(const std::string& op, int64_t bytes, int n) {
  if (n <= 1) return 0;
  if (op == "all_reduce") return 2 * (n - 1) * bytes / n;
  if (op == "all_gather" || op == "reduce_scatter") return (n - 1) * bytes / n;
  return bytes;  // broadcast
}

// The README's bus bytes per step for shard groups of g ranks and r
// replicas, from the layout the run reports: the group's ZeRO traffic on
// g ranks ("shard") plus the all-reduce of this rank's 1/g across the r
// replicas ("replicate"); gradients reduced in `wire` bytes an element
// (compress: 2), parameters gathered and broadcast in float32.
struct Formula {
  int64_t shard = 0, replicate = 0;
  int64_t total() const { return shard + replicate; }
};
Formula formula(const Stage& s, const json& stats, int g, int r, int64_t wire = 4) {
  Formula f;
  if (s.name == "stage1_broadcast") {  // each bucket all-reduced on g and on r; each parameter broadcast on g
    for (const json& b : stats["buckets"]) {
      const int64_t bytes = b["bytes"].get<int64_t>();
      f.shard += bus("all_reduce", bytes / 4 * wire, g) + bus("broadcast", bytes, g);
      f.replicate += bus("all_reduce", bytes / 4 * wire, r);
    }
  } else if (s.name == "stage1_allgather") {  // S: the largest place's elements
    const int64_t shard = 4 * stats["shard_elements"].get<int64_t>();
    f.shard = bus("reduce_scatter", shard * g, g) + bus("all_gather", shard * g, g);
    f.replicate = bus("all_reduce", shard, r);
  } else {  // per bucket (stage 3: per unit) of chunk c: reduce-scatter of g c, all-gathers, all-reduce of c on r
    const json& buckets = stats["buckets"];
    for (size_t k = 0; k < buckets.size(); ++k) {
      const int64_t chunk = buckets[k]["chunk"].get<int64_t>();
      // stage 3 gathers each unit before its forward and its backward,
      // but the last unit (bucket 0: buckets run in backward order),
      // which stays gathered from its forward to its backward.
      const int gathers = s.name == "stage2" ? 1 : (k == 0 ? 1 : 2);
      f.shard += bus("reduce_scatter", wire * chunk * g, g) + gathers * bus("all_gather", 4 * chunk * g, g);
      f.replicate += bus("all_reduce", wire * chunk, r);
    }
  }
  return f;
}

const json* group_named(const json& summary, const std::string& name) {
  if (!summary.contains("groups")) return nullptr;
  for (const json& g : summary["groups"])
    if (g["name"] == name) return &g;
  return nullptr;
}

// The memory categories `ddp plan` predicts for HSDP: every one it plans,
// the communication buffers too (gloo's reduce-scatter scratch per group,
// sized on the group's size: ddp_plan::group_sizes).
std::vector<std::string> planned_categories(const Stage&) {
  return {"parameters", "gradients", "optimizer_state", "comm_buffers"};
}

class Hsdp : public testing::TestWithParam<Stage> {};

TEST_P(Hsdp, BusBytesEqualTheFormulaAndThePlan) {
  const Stage& s = GetParam();
  const RunResult hybrid = run_ok(sharded(s, kShard));
  const RunResult plain = run_ok(sharded(s));
  ASSERT_TRUE(hybrid.failures.empty() && plain.failures.empty());
  const json& stats = hybrid.summary["strategy_stats"];
  EXPECT_EQ(stats["shard_size"], kShard);
  EXPECT_EQ(stats["replicas"], kReplicas);
  EXPECT_EQ(plain.summary["strategy_stats"]["shard_size"], kWorld);
  EXPECT_EQ(plain.summary["strategy_stats"]["replicas"], 1);
  const Formula want = formula(s, stats, kShard, kReplicas);
  ASSERT_GT(want.replicate, 0);
  if (s.name == "stage3") {  // as formula() counts them: every unit twice, the last once
    EXPECT_EQ(stats["gathers_per_micro_batch"].get<size_t>(), 2 * stats["buckets"].size() - 1);
  }
  const json plan = ddp_plan(sharded(s, kShard));
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_EQ(hybrid.summary["bus_bytes"][step].get<int64_t>(), want.total()) << "step " << step + 1;
    EXPECT_EQ(plain.summary["bus_bytes"][step].get<int64_t>(),
              formula(s, plain.summary["strategy_stats"], kWorld, 1).total())
        << "step " << step + 1 << ", without groups";
  }
  EXPECT_EQ(plan["bus_bytes_per_step"].get<int64_t>(), want.total()) << plan.dump();
  EXPECT_EQ(plan["collectives_per_step"], hybrid.summary["collectives"][kSteps - 1]);
  EXPECT_EQ(plan["comm_bytes_per_step"], hybrid.summary["comm_bytes"][kSteps - 1]);
  for (const json& c : plan["collectives"]) {  // every collective in a group of 2: none of the world's
    ASSERT_TRUE(c.contains("group_size")) << c.dump();
    EXPECT_EQ(c["group_size"], 2) << c.dump();
  }
  // Rank 0's groups: each moved its term of the formula every step.
  const json* shard = group_named(hybrid.summary, "shard");
  const json* replicate = group_named(hybrid.summary, "replicate");
  ASSERT_TRUE(shard && replicate) << hybrid.summary.value("groups", json()).dump();
  EXPECT_EQ((*shard)["ranks"], json({0, 1}));
  EXPECT_EQ((*replicate)["ranks"], json({0, 2}));
  EXPECT_EQ((*replicate)["bus_bytes"].get<int64_t>(), kSteps * want.replicate);
  if (s.name != "stage3") {
    EXPECT_EQ((*shard)["bus_bytes"].get<int64_t>(), kSteps * want.shard);
  } else {  // and the whole model gathered unit by unit for each of the engine's reads between steps
    int64_t model = 0;
    for (const json& b : stats["buckets"]) model += bus("all_gather", 4 * kShard * b["chunk"].get<int64_t>(), kShard);
    const int64_t reads = (*shard)["bus_bytes"].get<int64_t>() - kSteps * want.shard;
    EXPECT_GT(reads, 0);
    EXPECT_EQ(reads % model, 0) << reads << " bytes of reads, the model's gather moving " << model;
  }
  EXPECT_FALSE(plain.summary.contains("groups")) << "shard_size = the world made groups";
}

TEST_P(Hsdp, NormClippingAndWeightsEqualThePlainStageAndDdp) {
  const Stage& s = GetParam();
  const RunResult hybrid = run_ok(sharded(s, kShard));
  const RunResult plain = run_ok(sharded(s));
  const RunResult ddp = run_ok(config("plugin = \"naive\"\n"));
  ASSERT_TRUE(hybrid.failures.empty() && plain.failures.empty() && ddp.failures.empty());
  ASSERT_EQ(hybrid.summary["grad_norm"].size(), size_t(kSteps));
  for (int step = 0; step < kSteps; ++step) {
    const double norm = hybrid.summary["grad_norm"][step].get<double>();
    EXPECT_GT(norm, kClip) << "step " << step + 1 << ": nothing to clip";
    for (const RunResult* other : {&plain, &ddp})
      EXPECT_NEAR(norm, other->summary["grad_norm"][step].get<double>(), 1e-6 * norm)
          << "step " << step + 1 << (other == &ddp ? " (DDP)" : " (the plain stage)");
  }
  for (int step = 0; step <= kSteps; ++step)
    for (size_t p = 0; p < hybrid.names.size(); ++p) {
      for (int r = 1; r < kWorld; ++r)
        ASSERT_EQ(hybrid.ranks[r].at(step)[p], hybrid.ranks[0].at(step)[p])
            << "rank " << r << ", step " << step << ", " << hybrid.names[p] << ": not bitwise equal to rank 0";
      EXPECT_LE(harness::max_abs_diff(hybrid.ranks[0].at(step)[p], plain.ranks[0].at(step)[p]), 1e-5f)
          << "step " << step << ", " << hybrid.names[p];
      EXPECT_LE(harness::max_abs_diff(hybrid.ranks[0].at(step)[p], ddp.ranks[0].at(step)[p]), 1e-5f)
          << "step " << step << ", " << hybrid.names[p] << " (DDP)";
    }
}

TEST_P(Hsdp, EveryRanksMemoryEqualsThePlan) {
  const Stage& s = GetParam();
  const RunResult run = run_ok(sharded(s, kShard));
  ASSERT_TRUE(run.failures.empty());
  const json plan = ddp_plan(sharded(s, kShard));
  const char* const moments[] = {"after_setup", "before_optimizer_step", "after_optimizer_step"};
  for (const std::string& category : planned_categories(s)) {
    for (const char* moment : moments)
      EXPECT_EQ(plan["peak_bytes"][0][moment][category], run.summary["peak_bytes"][moment][category])
          << "rank 0, " << moment << ", " << category;
    for (int r = 0; r < kWorld; ++r) {
      int64_t planned = 0;
      for (const char* moment : moments)
        planned = std::max(planned, plan["peak_bytes"][r][moment][category].get<int64_t>());
      EXPECT_EQ(planned, run.summary["ranks"][r]["peak_bytes"][category].get<int64_t>())
          << "rank " << r << ", " << category;
    }
  }
  // A rank holds what the plain stage holds on a world of g ranks, its
  // communication buffers (the transport's scratch too) included: rank r
  // what rank r % g does there.
  const RunResult on_g = run_ok(sharded(s), kShard);
  ASSERT_TRUE(on_g.failures.empty());
  for (int r = 0; r < kWorld; ++r)
    for (const char* category : {"parameters", "gradients", "optimizer_state", "comm_buffers"})
      EXPECT_EQ(run.summary["ranks"][r]["peak_bytes"][category],
                on_g.summary["ranks"][r % kShard]["peak_bytes"][category])
          << "rank " << r << ", " << category;
}

INSTANTIATE_TEST_SUITE_P(Sharded, Hsdp, testing::ValuesIn(kStages),
                         [](const testing::TestParamInfo<Stage>& info) { return info.param.name; });

// compress = "bf16": the gradients reduced in bfloat16 at both levels
// (divided by N once), half the bytes of the reductions; bus bytes and
// memory (the 16-bit buffers) as the formula and the plan say.
TEST(HsdpCompressed, BusBytesAndMemoryEqualTheFormulaAndThePlan) {
  for (const Stage& s : {kStages[0], kStages[2]}) {
    SCOPED_TRACE(s.name);
    const std::string toml = sharded(s, kShard) + "compress = \"bf16\"\n";
    const RunResult run = run_ok(toml);
    ASSERT_TRUE(run.failures.empty());
    EXPECT_EQ(run.summary["strategy_stats"]["compress"], "bf16");
    const json plan = ddp_plan(toml);
    const int64_t want = formula(s, run.summary["strategy_stats"], kShard, kReplicas, 2).total();
    ASSERT_LT(want, formula(s, run.summary["strategy_stats"], kShard, kReplicas).total());
    for (int step = 0; step < kSteps; ++step) EXPECT_EQ(run.summary["bus_bytes"][step].get<int64_t>(), want);
    EXPECT_EQ(plan["bus_bytes_per_step"].get<int64_t>(), want);
    for (int r = 0; r < kWorld; ++r)
      for (const std::string& category : planned_categories(s)) {
        int64_t planned = 0;
        for (const auto& [moment, bytes] : plan["peak_bytes"][r].items())
          planned = std::max(planned, bytes[category].get<int64_t>());
        EXPECT_EQ(planned, run.summary["ranks"][r]["peak_bytes"][category].get<int64_t>())
            << "rank " << r << ", " << category;
      }
    for (int r = 1; r < kWorld; ++r) EXPECT_EQ(run.ranks[r].at(kSteps), run.ranks[0].at(kSteps)) << "rank " << r;
  }
}

// shard_size = the world is the strategy without the key: the same
// collectives, the same bits, no groups.
TEST(HsdpConfig, ShardSizeOfTheWorldIsThePlainStrategyBitForBit) {
  for (const Stage& s : kStages) {
    SCOPED_TRACE(s.name);
    const RunResult plain = run_ok(sharded(s));
    const RunResult explicit_world = run_ok(sharded(s, kWorld));
    ASSERT_TRUE(plain.failures.empty() && explicit_world.failures.empty());
    for (int step = 0; step <= kSteps; ++step) EXPECT_EQ(explicit_world.ranks[0].at(step), plain.ranks[0].at(step));
    for (const char* column : {"collectives", "comm_bytes", "bus_bytes", "grad_norm"})
      EXPECT_EQ(explicit_world.summary[column], plain.summary[column]) << column;
    EXPECT_FALSE(explicit_world.summary.contains("groups"));
    EXPECT_EQ(ddp_plan(sharded(s, kWorld))["collectives"], ddp_plan(sharded(s))["collectives"]);
  }
}

// Every rank refuses in create; a peer still connecting may first see the
// refusing rank's connection close, so the refusal is looked for in every
// rank's report.
std::string every_report(const RunResult& r) {
  std::string all;
  for (const std::string& f : r.failures) all += f + "\n";
  return all;
}

TEST(HsdpConfig, AShardSizeThatDoesNotDivideTheWorldIsRefusedByName) {
  const std::string refusal = "strategy.shard_size = 3 does not divide the world of 4 ranks";
  for (const Stage& s : kStages) {
    SCOPED_TRACE(s.name);
    const RunResult r = harness::run(sharded(s, 3), kWorld);
    ASSERT_FALSE(r.failures.empty());
    EXPECT_NE(every_report(r).find("strategy plugin 'sharded': create: " + refusal), std::string::npos)
        << every_report(r);
    try {
      ddp_plan(sharded(s, 3));
      ADD_FAILURE() << "ddp plan planned shard_size = 3 on 4 ranks";
    } catch (const Error& e) {  // the engine's error, not the plugin SDK's
      EXPECT_EQ(e.status(), DDP_ERR_UNSUPPORTED) << e.what();
      EXPECT_NE(std::string(e.what()).find("strategy plugin 'sharded': plan: " + refusal), std::string::npos)
          << e.what();
    }
  }
  const RunResult zero = harness::run(sharded(kStages[0]) + "shard_size = 0\n", kWorld);
  ASSERT_FALSE(zero.failures.empty());
  EXPECT_NE(every_report(zero).find("create: strategy.shard_size must be a number of ranks >= 1 (got 0)"),
            std::string::npos) << every_report(zero);
}

}  // namespace
}  // namespace ddp
