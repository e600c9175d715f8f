// checkpoint_test.cpp — checkpoints and --resume (engine/train/checkpoint.h)
// through the real engine, each rank a forked process (tests/harness.h):
//  - resuming on the same world size and strategy gives the uninterrupted
//    run's losses and weights bit for bit, for every shipped strategy, with
//    SGD + momentum and with AdamW, with gradient accumulation, from a
//    checkpoint before an unfreeze step and from one after it;
//  - resuming on 2 → 4 and 4 → 2 ranks, and across strategies, equals the
//    uninterrupted run within 1e-6 (SGD) / 1e-5 (AdamW);
//  - a config that changes what the run trains is refused naming the key;
//  - the pure parts: names, the resume comparison, who writes which state,
//    which checkpoints go.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "checkpoint_state.h"
#include "harness.h"
#include "reseal.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;
using harness::RunResult;

const std::string kFixtures = std::string(DDP_TEST_DATA_DIR) + "/fixtures/";

struct Strategy {
  std::string name, plugin, keys;
};
const std::vector<Strategy> kStrategies = {
    {"naive", "naive", ""},
    {"flat", "flat", ""},
    {"overlap", "overlap", ""},
    {"bucketed", "bucketed", "bucket_mb = 0.001\n"},
    {"sharded_broadcast", "sharded", "variant = \"broadcast\"\nbucket_mb = 0.001\n"},
    {"sharded_allgather", "sharded", "variant = \"allgather\"\n"},
    // ZeRO-2: optimizer state in pieces, element ranges of each rank.
    {"sharded_stage2", "sharded", "stage = 2\nbucket_mb = 0.0001\n"},
    // ZeRO-3: the weights gathered unit by unit to be written.
    {"sharded_stage3", "sharded", "stage = 3\n"},
};

const std::string kSgd = "[optimizer]\nname = \"sgd\"\nlr = 0.1\nmomentum = 0.9\n";
const std::string kAdamW = "[optimizer]\nname = \"adamw\"\nlr = 0.05\nweight_decay = 0.1\n";

// Six steps of the toy model from the fixture's weights, two micro-batches
// a step, fc1 frozen until step 3.
std::string toml(const Strategy& s, const std::string& optimizer) {
  return "[run]\nsteps = 6\nseed = 7\ntimeout_s = 30\ngrad_accum_steps = 2\n"
         "[model]\nname = \"toy\"\ninit_from = \"" + kFixtures + "toy_init.safetensors\"\nfreeze = [\"fc1.*\"]\n"
         "[[schedule.unfreeze]]\nstep = 3\nparams = \"fc1.*\"\n"
         "[data]\npath = \"" + kFixtures + "toy_data.safetensors\"\nbatch_size = 20\n" +
         optimizer + "[transport]\nplugin = \"gloo\"\n[strategy]\nplugin = \"" + s.plugin + "\"\n" + s.keys;
}

// A directory for one test's checkpoints, removed at the end.
struct TempDir : harness::TempDir {
  TempDir() : harness::TempDir("ddp-checkpoint-test") {}
};

std::vector<std::string> checkpointing(const std::string& dir) {
  return {"checkpoint.every=2", "checkpoint.keep=5", "checkpoint.dir=\"" + dir + "\""};
}

RunResult run_ok(const std::string& config, int world, const std::vector<std::string>& sets = {},
                 const std::string& resume = "") {
  RunResult r = harness::run(config, world, sets, resume);
  for (const auto& f : r.failures) ADD_FAILURE() << f;
  return r;
}

// The weights of two runs, bit for bit.
void expect_same_weights(const RunResult& a, const RunResult& b, const std::string& what) {
  ASSERT_FALSE(a.final_weights.empty());
  ASSERT_EQ(a.final_weights.size(), b.final_weights.size()) << what;
  for (const auto& [name, t] : a.final_weights) {
    const auto it = b.final_weights.find(name);
    ASSERT_NE(it, b.final_weights.end()) << what << ": " << name;
    EXPECT_TRUE(t.bytes == it->second.bytes) << what << ": parameter " << name << " differs";
  }
}

float max_weight_difference(const RunResult& a, const RunResult& b) {
  float m = 0;
  for (const auto& [name, t] : a.final_weights) {
    const auto it = b.final_weights.find(name);
    if (it == b.final_weights.end()) return INFINITY;
    m = std::max(m, harness::max_abs_diff(t.as_floats("a", name), it->second.as_floats("b", name)));
  }
  return m;
}

struct Case {
  Strategy strategy;
  std::string optimizer;  // "sgd" | "adamw"
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.strategy.name << " " << c.optimizer; }

class BitwiseResume : public testing::TestWithParam<Case> {};

TEST_P(BitwiseResume, EqualsTheUninterruptedRunFromBeforeAndAfterAnUnfreeze) {
  const Case& c = GetParam();
  const std::string config = toml(c.strategy, c.optimizer == "sgd" ? kSgd : kAdamW);
  TempDir dir;
  const RunResult whole = run_ok(config, 2);
  const RunResult writing = run_ok(config, 2, checkpointing(dir.path));
  expect_same_weights(whole, writing, "writing checkpoints changed the run");
  EXPECT_EQ(writing.summary["checkpoints"]["after_steps"], nlohmann::json({2, 4, 6}));
  for (const char* from : {"step-00000002", "step-00000004"}) {
    const RunResult resumed = run_ok(config, 2, checkpointing(dir.path), dir.path + "/" + from);
    expect_same_weights(whole, resumed, std::string("resumed from ") + from);
    EXPECT_EQ(resumed.summary["loss"], whole.summary["loss"]) << "resumed from " << from;
    EXPECT_EQ(resumed.summary["first_step"], from == std::string("step-00000002") ? 2 : 4);
  }
}

// Plain SGD keeps no tensors of state: its checkpoints still resume, bit
// for bit, whole or sharded.
TEST(BitwiseResumePlainSgd, EqualsTheUninterruptedRun) {
  for (size_t s : {size_t(0), size_t(5), size_t(6)}) {  // naive, sharded allgather, stage 2
    const std::string config = toml(kStrategies[s], "[optimizer]\nname = \"sgd\"\nlr = 0.1\n");
    TempDir dir;
    const RunResult whole = run_ok(config, 2);
    run_ok(config, 2, checkpointing(dir.path));
    const RunResult resumed = run_ok(config, 2, checkpointing(dir.path), dir.path + "/step-00000004");
    expect_same_weights(whole, resumed, kStrategies[s].name + ": resumed from step 4");
    EXPECT_EQ(resumed.summary["loss"], whole.summary["loss"]) << kStrategies[s].name;
  }
}

std::vector<Case> bitwise_cases() {
  std::vector<Case> out;
  for (const Strategy& s : kStrategies)
    for (const char* o : {"sgd", "adamw"}) out.push_back({s, o});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Strategies, BitwiseResume, testing::ValuesIn(bitwise_cases()),
                         [](const testing::TestParamInfo<Case>& info) {
                           return info.param.strategy.name + "_" + info.param.optimizer;
                         });

// Replicas that differ on purpose (DDP_CAP_DIVERGENT): localsgd (averages
// after steps 1 and 4) and diloco (an outer step after step 4), each
// checkpointed after step 2, where the ranks differ, and after step 4.
const std::vector<Strategy> kDivergent = {
    {"localsgd", "localsgd", "[strategy.localsgd]\nperiod = 3\nwarmup_steps = 1\n"},
    {"diloco", "diloco", "[strategy.diloco]\nperiod = 4\n"},
};

// Every rank's weights after every step, bit for bit, from step `from` on.
void expect_same_ranks(const RunResult& a, const RunResult& b, int64_t from, const std::string& what) {
  ASSERT_EQ(a.ranks.size(), b.ranks.size()) << what;
  for (size_t r = 0; r < a.ranks.size(); ++r)
    for (int64_t step = from; step <= 6; ++step)
      EXPECT_TRUE(a.ranks[r].at(step) == b.ranks[r].at(step)) << what << ": rank " << r << " after step " << step;
}

TEST(DivergentResume, EveryRanksOwnStateSurvivesBitForBit) {
  for (const Strategy& s : kDivergent)
    for (const std::string& optimizer : {kSgd, kAdamW}) {
      const std::string config = toml(s, optimizer), what = s.name + (optimizer == kSgd ? " sgd" : " adamw");
      TempDir dir;
      const RunResult whole = run_ok(config, 2);
      const RunResult writing = run_ok(config, 2, checkpointing(dir.path));
      expect_same_ranks(whole, writing, 1, what + ": writing checkpoints changed the run");
      ASSERT_FALSE(whole.ranks[1].at(2) == whole.ranks[0].at(2)) << what << ": the ranks do not differ at step 2";
      for (const char* from : {"step-00000002", "step-00000004"}) {
        const RunResult resumed = run_ok(config, 2, checkpointing(dir.path), dir.path + "/" + from);
        const int64_t first = from == std::string("step-00000002") ? 3 : 5;
        expect_same_ranks(whole, resumed, first, what + ": resumed from " + from);
        EXPECT_EQ(resumed.summary["loss"], whole.summary["loss"]) << what << ": resumed from " << from;
      }
    }
}

// Rank 1's momentum is its own: its optimizer file, not a copy of rank 0's.
TEST(DivergentResume, EachRankWritesItsOwnWeightsAndOptimizerState) {
  TempDir dir;
  run_ok(toml(kDivergent[1], kSgd), 2, checkpointing(dir.path));
  const std::string step2 = dir.path + "/step-00000002/";
  for (const char* file : {"weights.safetensors", "weights-1.safetensors", "optimizer-0.safetensors",
                           "optimizer-1.safetensors", "strategy-0.safetensors", "strategy-1.safetensors"})
    EXPECT_TRUE(fs::exists(step2 + file)) << file;
  const auto momentum = [&](const char* file) {
    return read_safetensors(step2 + file).at("fc2.fc.weight.momentum_buffer").as_floats(file, "momentum");
  };
  EXPECT_NE(momentum("optimizer-0.safetensors"), momentum("optimizer-1.safetensors"));
  const auto meta = read_checkpoint_meta(step2);
  EXPECT_TRUE(meta.divergent);
  EXPECT_EQ(meta.format, "ddp-checkpoint 3");
}

TEST(DivergentResume, OnAnotherWorldSizeStrategyOrKeysIsRefusedByName) {
  TempDir dir;
  const std::string config = toml(kDivergent[0], kSgd);
  run_ok(config, 2, checkpointing(dir.path));
  const std::string step2 = dir.path + "/step-00000002";
  RunResult r = harness::run(config, 4, checkpointing(dir.path), step2);
  ASSERT_FALSE(r.failures.empty());
  EXPECT_NE(r.failures[0].find("--resume " + step2 + ": it holds each rank's own replica (strategy 'localsgd' lets "
                               "them differ) for 2 ranks: it resumes on as many, not run.world_size = 4"),
            std::string::npos) << r.failures[0];
  // The sync points follow the strategy and its keys.
  for (const auto& [set, change] : std::vector<std::pair<std::string, std::string>>{
           {"strategy.plugin=\"bucketed\"", "strategy.plugin localsgd → bucketed"},
           {"strategy.localsgd.warmup_steps=6",
            "strategy.localsgd {period = 3, warmup_steps = 1} → {period = 3, warmup_steps = 6}"}}) {
    std::vector<std::string> sets = checkpointing(dir.path);
    sets.push_back(set);
    r = harness::run(config, 2, sets, step2);
    ASSERT_FALSE(r.failures.empty());
    EXPECT_NE(r.failures[0].find("--resume " + step2 + ": it holds each rank's own replica (strategy 'localsgd' "
                                 "lets them differ), which goes on under the same strategy and keys only: " + change),
              std::string::npos) << r.failures[0];
  }
}

// A replica check and an evaluation due at the checkpoint (step 3) wait
// for the next sync point (4) in the resumed run as in the whole one, and
// the resumed summary holds the held-out losses of before.
TEST(DivergentResume, ChecksAndEvaluationsDueAtTheCheckpointGoOn) {
  TempDir dir;
  const std::string config =
      toml({"localsgd", "localsgd",
            "[strategy.localsgd]\nperiod = 2\n[eval]\nevery = 3\npath = \"" + kFixtures + "toy_data.safetensors\"\n"},
           kSgd);
  const std::vector<std::string> sets = {"checkpoint.every=3", "checkpoint.dir=\"" + dir.path + "\"",
                                         "run.check_replicas_every=3"};
  const RunResult whole = run_ok(config, 2, {"run.check_replicas_every=3"});
  run_ok(config, 2, sets);
  const RunResult resumed = run_ok(config, 2, sets, dir.path + "/step-00000003");
  ASSERT_FALSE(whole.summary.is_null());
  ASSERT_FALSE(resumed.summary.is_null());
  EXPECT_EQ(whole.summary["eval"]["after_steps"], nlohmann::json({4, 6}));
  EXPECT_EQ(whole.summary["replica_checks"]["after_steps"], nlohmann::json({4, 6}));
  EXPECT_EQ(resumed.summary["replica_checks"]["after_steps"], nlohmann::json({4, 6}));
  EXPECT_EQ(resumed.summary["eval"]["after_steps"], whole.summary["eval"]["after_steps"]);
  EXPECT_EQ(resumed.summary["eval"]["val_loss"], whole.summary["eval"]["val_loss"]);
}

// Equal replicas: a strategy's state may start afresh, and diloco takes
// θ_global from the checkpoint's weights (a DDP warm start).
TEST(DivergentResume, FromEqualReplicasTheStrategysStateStartsAfresh) {
  TempDir dir;
  const std::string config =
      toml({"bucketed", "bucketed", "[strategy.bucketed]\nbucket_mb = 0.001\n[strategy.diloco]\nperiod = 2\n"}, kSgd);
  run_ok(config, 2, checkpointing(dir.path));
  std::vector<std::string> sets = checkpointing(dir.path);
  sets.push_back("strategy.plugin=\"diloco\"");
  const RunResult r = run_ok(config, 2, sets, dir.path + "/step-00000002");
  EXPECT_EQ(r.summary["synced"], nlohmann::json({false, true, false, true}));
}

// Another world size, another strategy: the optimizer state follows each
// parameter to its new owner.
TEST(ResumeElsewhere, TwoToFourAndFourToTwoRanksAcrossStrategiesWithinTolerance) {
  for (const char* optimizer : {"sgd", "adamw"}) {
    const std::string o = optimizer == std::string("sgd") ? kSgd : kAdamW;
    const float tolerance = optimizer == std::string("sgd") ? 1e-6f : 1e-5f;
    const RunResult whole = run_ok(toml(kStrategies[0], o), 2);
    struct Move {
      int from_world, to_world;
      size_t from, to;  // indices into kStrategies
    };
    // ... and from ZeRO stage 1 to 2 and back, from bucketed to stage 2 and
    // back, from stage 3 to stages 2 and 1 and back.
    for (const Move m : {Move{2, 4, 5, 3}, Move{2, 4, 4, 5}, Move{4, 2, 0, 5}, Move{4, 2, 5, 4}, Move{2, 4, 5, 6},
                         Move{4, 2, 6, 5}, Move{2, 2, 3, 6}, Move{4, 4, 6, 3}, Move{2, 4, 6, 6}, Move{2, 4, 7, 6},
                         Move{4, 2, 6, 7}, Move{2, 4, 7, 5}, Move{4, 2, 0, 7}}) {
      TempDir dir;
      const RunResult first = run_ok(toml(kStrategies[m.from], o), m.from_world, checkpointing(dir.path));
      const RunResult resumed = run_ok(toml(kStrategies[m.to], o), m.to_world, checkpointing(dir.path),
                                       dir.path + "/step-00000002");
      const std::string what = std::string(optimizer) + ": " + kStrategies[m.from].name + " on " +
                               std::to_string(m.from_world) + " → " + kStrategies[m.to].name + " on " +
                               std::to_string(m.to_world);
      EXPECT_LE(max_weight_difference(whole, resumed), tolerance) << what;
      EXPECT_LE(max_weight_difference(whole, first), tolerance) << what;
    }
  }
}

// Stage 2's state in pieces through 2 → 4 → 3 ranks, each leg a resume
// of the last one's checkpoint (random data: 24 rows divide 2, 3 and 4).
TEST(ResumeElsewhere, Stage2FromTwoToFourToThreeRanksWithinTolerance) {
  for (const char* optimizer : {"sgd", "adamw"}) {
    const std::string o = optimizer == std::string("sgd") ? kSgd : kAdamW;
    const float tolerance = optimizer == std::string("sgd") ? 1e-6f : 1e-5f;
    std::string config = toml(kStrategies[6], o);
    config.replace(config.find("path = "), config.find("batch_size") - config.find("path = "), "kind = \"random\"\n");
    config.replace(config.find("batch_size = 20"), 15, "batch_size = 24");
    const RunResult whole = run_ok(config, 2);
    TempDir dir;
    run_ok(config, 2, checkpointing(dir.path));
    std::vector<std::string> sets = checkpointing(dir.path);
    run_ok(config, 4, sets, dir.path + "/step-00000002");
    const RunResult last = run_ok(config, 3, sets, dir.path + "/step-00000004");
    EXPECT_EQ(last.summary["first_step"], 4);
    EXPECT_LE(max_weight_difference(whole, last), tolerance) << optimizer << ": stage 2 on 2 → 4 → 3 ranks";
  }
}

// HSDP (shard_size = 2 on 4 ranks: sharded within {0, 1} and {2, 3},
// replicated across them): each stage's optimizer state lives on a place
// of each group, the replicas' the same.
const std::vector<Strategy> kHsdp = {
    {"hsdp_broadcast", "sharded", "variant = \"broadcast\"\nbucket_mb = 0.001\nshard_size = 2\n"},
    {"hsdp_allgather", "sharded", "variant = \"allgather\"\nshard_size = 2\n"},
    {"hsdp_stage2", "sharded", "stage = 2\nbucket_mb = 0.0001\nshard_size = 2\n"},
    {"hsdp_stage3", "sharded", "stage = 3\nshard_size = 2\n"},
};

TEST(HsdpResume, FourRanksInGroupsOfTwoResumeBitForBit) {
  for (const Strategy& s : kHsdp)
    for (const std::string& optimizer : {kSgd, kAdamW}) {
      const std::string config = toml(s, optimizer), what = s.name + (optimizer == kSgd ? " sgd" : " adamw");
      TempDir dir;
      const RunResult whole = run_ok(config, 4);
      const RunResult writing = run_ok(config, 4, checkpointing(dir.path));
      expect_same_weights(whole, writing, what + ": writing checkpoints changed the run");
      for (const char* from : {"step-00000002", "step-00000004"}) {
        const RunResult resumed = run_ok(config, 4, checkpointing(dir.path), dir.path + "/" + from);
        expect_same_weights(whole, resumed, what + ": resumed from " + from);
        EXPECT_EQ(resumed.summary["loss"], whole.summary["loss"]) << what << ": resumed from " << from;
      }
    }
}

// An HSDP checkpoint resumes without groups (worlds 2 and 4), under
// another stage (1), and the other way round, within tolerance of the
// uninterrupted run: the state of a piece is the same whoever holds it.
TEST(HsdpResume, OnTwoAndFourRanksWithoutGroupsAndUnderStage1WithinTolerance) {
  for (const char* optimizer : {"sgd", "adamw"}) {
    const std::string o = optimizer == std::string("sgd") ? kSgd : kAdamW;
    const float tolerance = optimizer == std::string("sgd") ? 1e-6f : 1e-5f;
    const RunResult whole = run_ok(toml(kStrategies[0], o), 2);
    struct Move {
      int from_world;
      Strategy from;
      int to_world;
      Strategy to;
    };
    for (const Move& m : {Move{4, kHsdp[2], 2, kStrategies[6]}, Move{4, kHsdp[2], 4, kStrategies[6]},
                          Move{4, kHsdp[2], 4, kStrategies[4]}, Move{4, kHsdp[3], 2, kStrategies[7]},
                          Move{4, kHsdp[3], 4, kStrategies[5]}, Move{4, kHsdp[1], 2, kStrategies[5]},
                          Move{4, kHsdp[0], 4, kStrategies[6]}, Move{2, kStrategies[6], 4, kHsdp[2]},
                          Move{4, kHsdp[2], 4, kHsdp[3]}, Move{4, kStrategies[7], 4, kHsdp[1]}}) {
      TempDir dir;
      const RunResult first = run_ok(toml(m.from, o), m.from_world, checkpointing(dir.path));
      const RunResult resumed = run_ok(toml(m.to, o), m.to_world, checkpointing(dir.path), dir.path + "/step-00000002");
      const std::string what = std::string(optimizer) + ": " + m.from.name + " on " + std::to_string(m.from_world) +
                               " → " + m.to.name + " on " + std::to_string(m.to_world);
      EXPECT_EQ(resumed.summary["first_step"], 2) << what;
      EXPECT_LE(max_weight_difference(whole, resumed), tolerance) << what;
      EXPECT_LE(max_weight_difference(whole, first), tolerance) << what;
    }
  }
}

// A piece of optimizer state that the replicas hold is written once, by
// the lowest rank holding it (after the engine checked that their copies
// agree): ranks 0 and 1 write the whole state, ranks 2 and 3 nothing, and
// stage 2's pieces tile each parameter exactly once.
TEST(HsdpCheckpoint, StateTheReplicasHoldIsWrittenOnce) {
  for (const Strategy& s : kHsdp) {
    SCOPED_TRACE(s.name);
    TempDir dir;
    run_ok(toml(s, kAdamW), 4, checkpointing(dir.path));
    const std::string step6 = dir.path + "/step-00000006/";
    std::ifstream in(step6 + "checkpoint.json");
    const nlohmann::json meta = nlohmann::json::parse(in);
    EXPECT_TRUE(fs::exists(step6 + "optimizer-0.safetensors"));
    EXPECT_TRUE(fs::exists(step6 + "optimizer-1.safetensors"));
    EXPECT_FALSE(fs::exists(step6 + "optimizer-2.safetensors"));
    EXPECT_FALSE(fs::exists(step6 + "optimizer-3.safetensors"));
    const nlohmann::json& fc2 = meta["state"]["fc2.fc.weight"];
    if (!fc2.contains("pieces")) continue;  // stage 1: whole, by its owner in group 0
    size_t next = 0;
    for (const auto& piece : fc2["pieces"]) {
      EXPECT_EQ(piece["offset"], next);
      next += piece["count"].get<size_t>();
    }
    EXPECT_EQ(next, 500u);  // fc2.fc.weight: 50 x 10, each element once
  }
}

// What a checkpoint of stage 2 holds: every parameter's state in pieces
// that tile it, one file per rank.
TEST(Checkpoint, Stage2WritesEachRanksPiecesAndIndexesThem) {
  TempDir dir;
  run_ok(toml(kStrategies[6], kAdamW), 2, checkpointing(dir.path));
  std::ifstream in(dir.path + "/step-00000006/checkpoint.json");
  const nlohmann::json meta = nlohmann::json::parse(in);
  const nlohmann::json& fc2 = meta["state"]["fc2.fc.weight"];
  ASSERT_TRUE(fc2.contains("pieces")) << meta["state"].dump();
  size_t next = 0;
  std::set<std::string> files;
  for (const auto& piece : fc2["pieces"]) {
    EXPECT_EQ(piece["offset"], next);
    next += piece["count"].get<size_t>();
    files.insert(piece["file"].get<std::string>());
  }
  EXPECT_EQ(next, 500u);  // fc2.fc.weight: 50 x 10
  EXPECT_EQ(files, (std::set<std::string>{"optimizer-0.safetensors", "optimizer-1.safetensors"}));
  EXPECT_EQ(fc2["steps"], 6);
}

TEST(ResumeRefused, AConfigThatChangesWhatTheRunTrainsNamesTheKey) {
  TempDir dir;
  const std::string config = toml(kStrategies[0], kSgd);
  run_ok(config, 2, checkpointing(dir.path));
  std::vector<std::string> sets = checkpointing(dir.path);
  sets.push_back("optimizer.lr=0.2");
  const RunResult r = harness::run(config, 2, sets, "latest");
  ASSERT_EQ(r.failures.size(), 2u);
  EXPECT_EQ(r.failures[0], "rank 0: --resume " + dir.path + "/step-00000006: optimizer.lr is 0.2 but was 0.1 in "
                           "the checkpoint: a resumed run may change run.steps, run.world_size, the strategy, the "
                           "transport, timeouts and checks, not what it trains");
}

TEST(ResumeRefused, NoCheckpointToResumeFromIsSaid) {
  TempDir dir;
  const RunResult r = harness::run(toml(kStrategies[0], kSgd), 1, checkpointing(dir.path), "latest");
  ASSERT_EQ(r.failures.size(), 1u);
  EXPECT_EQ(r.failures[0],
            "rank 0: " + dir.path + ": no checkpoint to resume from (no 'latest' in checkpoint.dir)");
}

// A `latest` that is a directory is said to be one, not "empty".
TEST(ResumeRefused, ALatestThatIsADirectoryIsSaidToBeOne) {
  TempDir dir;
  std::filesystem::create_directories(dir.path + "/latest");
  const RunResult r = harness::run(toml(kStrategies[0], kSgd), 1, checkpointing(dir.path), "latest");
  ASSERT_EQ(r.failures.size(), 1u);
  EXPECT_EQ(r.failures[0], "rank 0: " + dir.path + "/latest is a directory, where a file naming the latest "
                           "checkpoint (step-N) belongs: remove it, or give --resume a checkpoint's path");
}

TEST(ResumeRefused, AFreshRunDoesNotWriteIntoAnotherRunsCheckpoints) {
  TempDir dir;
  const std::string config = toml(kStrategies[0], kSgd);
  run_ok(config, 1, checkpointing(dir.path));
  const RunResult r = harness::run(config, 1, checkpointing(dir.path));
  ASSERT_EQ(r.failures.size(), 1u);
  EXPECT_EQ(r.failures[0], "rank 0: checkpoint.dir " + dir.path +
                               " holds an earlier run's checkpoints: continue it with --resume, or give this run "
                               "another checkpoint.dir (or remove that one)");
}

TEST(ResumeRefused, ACheckpointDirHoldingAnotherRunsCheckpointsIsNotWrittenInto) {
  TempDir mine, theirs;
  const std::string config = toml(kStrategies[0], kSgd);
  run_ok(config, 1, checkpointing(theirs.path));
  run_ok(config, 1, checkpointing(mine.path));
  const RunResult r = harness::run(config, 1, checkpointing(theirs.path), mine.path + "/step-00000002");
  ASSERT_EQ(r.failures.size(), 1u);
  EXPECT_EQ(r.failures[0], "rank 0: checkpoint.dir " + theirs.path + " holds other checkpoints than " + mine.path +
                               "/step-00000002's: give this run a checkpoint.dir of its own (or resume from one in " +
                               theirs.path + ")");
}

// Each state checkpoint.json lists must be there, and as many losses as steps,
// also where the checksums were recomputed after the edit.
TEST(ResumeRefused, ACheckpointMissingWhatItsIndexListsIsRefused) {
  TempDir dir;
  const std::string config = toml(kStrategies[0], kSgd);
  run_ok(config, 1, checkpointing(dir.path));
  const std::string step2 = dir.path + "/step-00000002", file = step2 + "/optimizer-0.safetensors";
  auto tensors = read_safetensors(file);
  tensors.erase("fc3.weight.momentum_buffer");  // fc1 is still frozen at step 2
  std::vector<std::vector<float>> values;
  std::vector<NamedFloats> kept;
  for (const auto& [name, t] : tensors)
    kept.push_back({name, t.shape, values.emplace_back(t.as_floats(file, name)).data()});
  write_safetensors(file, kept);
  RunResult r = harness::run(config, 1, checkpointing(dir.path), step2);
  ASSERT_EQ(r.failures.size(), 1u);
  EXPECT_EQ(r.failures[0].rfind("rank 0: " + file + ": ", 0), 0u) << "its checksum first: " << r.failures[0];
  test::edit_and_reseal(step2);
  r = harness::run(config, 1, checkpointing(dir.path), step2);
  ASSERT_EQ(r.failures.size(), 1u);
  EXPECT_EQ(r.failures[0], "rank 0: " + file + ": no tensor 'fc3.weight.momentum_buffer', which checkpoint.json "
                           "says holds its state");

  const std::string meta = step2 + "/checkpoint.json";
  test::edit_and_reseal(step2, [](nlohmann::ordered_json& j) { j["losses"].erase(0); });
  r = harness::run(config, 1, checkpointing(dir.path), dir.path + "/step-00000004");
  EXPECT_TRUE(r.failures.empty()) << r.failures[0];
  r = harness::run(config, 1, checkpointing(dir.path), step2);
  ASSERT_EQ(r.failures.size(), 1u);
  EXPECT_EQ(r.failures[0], "rank 0: " + meta + ": 1 losses for 2 steps");
}

// A run whose steps do not divide by checkpoint.every still ends with one.
TEST(Checkpoint, TheEndOfARunIsCheckpointedToo) {
  TempDir dir;
  const RunResult r = run_ok(toml(kStrategies[0], kSgd), 1,
                             {"checkpoint.every=4", "checkpoint.dir=\"" + dir.path + "\""});
  EXPECT_EQ(r.summary["checkpoints"]["after_steps"], nlohmann::json({4, 6}));
  EXPECT_TRUE(fs::exists(dir.path + "/step-00000006/checkpoint.json"));
  EXPECT_TRUE(fs::exists(dir.path + "/step-00000004/checkpoint.json")) << "keep = 2 holds both";
}

// ------------------------------------------------------------ pure parts

TEST(Checkpoint, NamesSortByStep) {
  EXPECT_EQ(checkpoint_name(10), "step-00000010");
  EXPECT_EQ(checkpoint_name(123456789), "step-123456789");
}

TEST(Checkpoint, ResumeMayChangeHowTheRunRunsNotWhatItTrains) {
  const std::map<std::string, std::string> saved = {
      {"run.world_size", "2"}, {"strategy.plugin", "naive"}, {"optimizer.lr", "0.1"}, {"run.seed", "7"}};
  std::map<std::string, std::string> now = saved;
  now["run.world_size"] = "4";
  now["strategy.plugin"] = "sharded";
  now["strategy.variant"] = "allgather";
  ResumeCheck check = compare_for_resume(saved, now);
  EXPECT_EQ(check.refused, "");
  EXPECT_EQ(check.changed, (std::vector<std::string>{"run.world_size 2 → 4", "strategy.plugin naive → sharded",
                                                     "strategy.variant (not set) → allgather"}));
  now["run.seed"] = "8";
  now["data.batch_size"] = "40";
  now["model.init_from"] = "elsewhere.safetensors";  // the weights come from the checkpoint
  check = compare_for_resume(saved, now);
  EXPECT_EQ(check.refused,
            "data.batch_size is 40 but was (not set) in the checkpoint; also run.seed: a resumed run may change "
            "run.steps, run.world_size, the strategy, the transport, timeouts and checks, not what it trains");
  // What the run trains is named first; a default that follows run.steps says so.
  EXPECT_EQ(compare_for_resume({{"model.name", "toy"}, {"data.batch_size", "8"}},
                               {{"model.name", "lm"}, {"data.batch_size", "16"}})
                .refused.substr(0, 46),
            "model.name is lm but was toy in the checkpoint");
  const std::string cosine = compare_for_resume({{"schedule.cosine_steps", "5"}}, {{"schedule.cosine_steps", "8"}}).refused;
  EXPECT_EQ(cosine.substr(0, cosine.find(')') + 1),
            "schedule.cosine_steps is 8 but was 5 in the checkpoint (unless set, it follows run.steps: --set "
            "schedule.cosine_steps=5 keeps the schedule)");
}

// A checkpoint written before data.teacher and [eval] existed resumes in a
// run that leaves them unset; one that sets them differently is refused.
TEST(Checkpoint, KeysAddedSinceACheckpointWasWrittenTakeTheirDefaults) {
  const std::map<std::string, std::string> saved = {{"optimizer.lr", "0.1"}};
  std::map<std::string, std::string> now = {{"optimizer.lr", "0.1"},       {"data.teacher", "false"},
                                            {"eval.every", "0"},           {"eval.batches", "1"},
                                            {"eval.holdout_rows", "0"},    {"precision.compute", "fp32"}};
  EXPECT_EQ(compare_for_resume(saved, now).refused, "");
  EXPECT_TRUE(compare_for_resume(saved, now).changed.empty());
  now["data.teacher"] = "true";
  EXPECT_EQ(compare_for_resume(saved, now).refused.substr(0, 52), "data.teacher is true but was false in the checkpoint");
  now["data.teacher"] = "false";
  now["precision.compute"] = "bf16";
  EXPECT_EQ(compare_for_resume(saved, now).refused.substr(0, 58),
            "precision.compute is bf16 but was fp32 in the checkpoint: ");
}

TEST(Checkpoint, TheLowestRankHoldingAStateWritesIt) {
  // 3 parameters, 3 ranks: parameter 0 on every rank, 1 on ranks 1 and 2, 2 on none.
  EXPECT_EQ(state_writers({1, 0, 0, 1, 1, 0, 1, 1, 0}, 3, 3), (std::vector<int>{0, 1, -1}));
}

TEST(Checkpoint, PiecesOfStateAreTakenOnlyWhereTheyTileTheParameterOnce) {
  const auto refusal = [](const std::vector<std::pair<size_t, size_t>>& pieces) {
    try {
      check_pieces(pieces, 3, "'w'");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("taken");
  };
  EXPECT_EQ(refusal({{0, 2}, {2, 1}}), "taken");
  EXPECT_EQ(refusal({{0, 1}, {2, 1}}),
            "'w': its pieces of optimizer state do not cover its 3 elements once each (a piece at 2 where 1 was next)");
  EXPECT_EQ(refusal({{0, 2}, {1, 2}}),
            "'w': its pieces of optimizer state do not cover its 3 elements once each (a piece at 1 where 2 was next)");
  EXPECT_EQ(refusal({{0, 2}}), "'w': its pieces of optimizer state end at element 2 of 3");
}

// Resume reads the slices a rank steps, nothing else: a slice that spans
// two ranks' pieces comes from both files, and the state checkpoint.json
// names for a parameter this rank never steps is never read.
TEST(Checkpoint, ResumeReadsTheSliceARangeStepsAcrossPieces) {
  TempDir dir;
  const std::vector<float> m0 = {0, 1, 2, 3}, v0 = {10, 11, 12, 13}, m1 = {4, 5}, v1 = {14, 15};
  write_safetensors(dir.path + "/optimizer-0.safetensors",
                    {{"w.exp_avg@0", {4}, m0.data()}, {"w.exp_avg_sq@0", {4}, v0.data()}});
  write_safetensors(dir.path + "/optimizer-1.safetensors",
                    {{"w.exp_avg@4", {2}, m1.data()}, {"w.exp_avg_sq@4", {2}, v1.data()}});
  CheckpointMeta meta;
  meta.state["w"] = {"", 3, {{"optimizer-0.safetensors", 0, 4}, {"optimizer-1.safetensors", 4, 2}}};
  CpuDevice device;
  std::vector<Parameter> params(2);
  params[0].name = "w", params[0].shape = {6}, params[0].data = Tensor::view(device, nullptr, {6});
  params[1].name = "b", params[1].shape = {2}, params[1].data = Tensor::view(device, nullptr, {2});
  OptimizerConfig adamw;
  adamw.name = "adamw", adamw.lr = 0.1;
  const Optimizer optimizer(adamw, device, params);
  StateReader states(dir.path, meta, params, optimizer);
  EXPECT_TRUE(states.has(0));
  EXPECT_FALSE(states.has(1));
  SavedState slice;
  ASSERT_TRUE(states.read(0, 3, 2, slice));
  EXPECT_EQ(slice.steps, 3);
  EXPECT_EQ(slice.first, (std::vector<float>{3, 4}));
  EXPECT_EQ(slice.second, (std::vector<float>{13, 14}));
  EXPECT_EQ(slice.offset, 3u);
  EXPECT_EQ(slice.count, 2u);
  EXPECT_FALSE(states.read(1, 0, 2, slice));
}

TEST(Checkpoint, KeepLeavesTheNewestWholeOnesAndNoPartials) {
  const std::vector<std::string> names = {"latest", "step-00000002", "step-00000010", "step-00000004",
                                          "step-00000006.partial", "step-00000008.replaced", "notes.txt"};
  EXPECT_EQ(checkpoints_to_remove(names, 2, "step-00000012"),
            (std::vector<std::string>{"step-00000006.partial", "step-00000008.replaced", "step-00000002",
                                      "step-00000004"}));
  EXPECT_EQ(checkpoints_to_remove({"step-00000002"}, 1, "step-00000002"), std::vector<std::string>{});
}

// Rotation removes only what is provably a checkpoint (issue 35): not a
// user's file in a step-N directory, not an empty step-N (nor does it count
// toward keep), not a step number too large for a 64-bit integer.
TEST(Checkpoint, OnlyProvableCheckpointsAreListedForRotation) {
  TempDir dir;
  auto file = [&](const std::string& name) {
    fs::create_directories(fs::path(dir.path + "/" + name).parent_path());
    std::ofstream(dir.path + "/" + name) << "x";
  };
  file("step-00000002/checkpoint.json");
  file("step-00000002/weights.safetensors");
  file("step-00000002/optimizer-1.safetensors");
  file("step-00000004.partial/optimizer-0.safetensors.tmp.123.0");
  fs::create_directories(dir.path + "/step-00000005.partial");  // created, then the run was killed
  file("step-00000006.replaced/checkpoint.json");
  file("step-00000001/notes.txt");
  file("step-00000003/checkpoint.json");
  file("step-00000003/notes.txt");
  fs::create_directories(dir.path + "/step-00000099");
  fs::create_directories(dir.path + "/step-99999999999999999999");
  file("step-00000007");  // a file, not a directory
  fs::create_directories(dir.path + "/elsewhere/step-00000008");
  file("elsewhere/step-00000008/checkpoint.json");
  fs::create_directory_symlink(dir.path + "/elsewhere/step-00000008", dir.path + "/step-00000008");
  file("latest");
  std::vector<std::string> names = checkpoint_entries(dir.path);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step-00000002", "step-00000004.partial", "step-00000005.partial",
                                             "step-00000006.replaced"}));
  EXPECT_EQ(checkpoints_to_remove(names, 1, "step-00000010"),
            (std::vector<std::string>{"step-00000004.partial", "step-00000005.partial", "step-00000006.replaced",
                                      "step-00000002"}));
}

TEST(Checkpoint, LatestNamingAMissingCheckpointIsSaid) {
  TempDir dir;
  std::ofstream(dir.path + "/latest") << "step-00000004\n";
  EXPECT_THROW(
      {
        try {
          resolve_checkpoint(dir.path, "latest");
        } catch (const Error& e) {
          EXPECT_EQ(std::string(e.what()),
                    dir.path + "/latest names step-00000004, which is not a whole checkpoint");
          throw;
        }
      },
      Error);
  EXPECT_THROW(resolve_checkpoint(dir.path, dir.path + "/nothing"), Error);
}

TEST(Checkpoint, StepOfReadsOnlyCheckpointNames) {
  EXPECT_EQ(step_of("step-00000010"), 10);
  EXPECT_EQ(step_of("step-00000010.partial"), 10);
  EXPECT_EQ(step_of("step-00000010.replaced"), 10);
  EXPECT_EQ(step_of("step-999999999999999999"), 999999999999999999);
  for (const std::string other : {"step-", "step-x", "step-1x", "step--1", "Step-1", "latest", "",
                                  "step-9999999999999999999"})
    EXPECT_EQ(step_of(other), -1) << other;
}

// A checkpoint the engine writes is one it can resume, whatever the
// strategy: every shipped one in each of its forms and every test strategy
// that trains, on the world it runs on, writes one after step 2 and,
// resumed from it, ends with the uninterrupted run's weights bit for bit.
struct Writer {
  std::string name, plugin, keys;
  int world;
};
const std::string kTestPlugins = std::string(DDP_TEST_BROKEN_PLUGIN_DIR) + "/libddp_strategy_";
const std::vector<Writer> kWriters = {
    {"naive", "naive", "", 2},
    {"flat", "flat", "", 2},
    {"overlap", "overlap", "", 2},
    {"bucketed", "bucketed", "bucket_mb = 0.001\n", 2},
    {"sharded_broadcast", "sharded", "variant = \"broadcast\"\n", 2},
    {"sharded_allgather", "sharded", "variant = \"allgather\"\n", 2},
    {"sharded_stage2", "sharded", "stage = 2\n", 2},
    {"sharded_stage3", "sharded", "stage = 3\n", 2},
    {"sharded_hsdp_broadcast", "sharded", "shard_size = 2\n", 4},
    {"sharded_hsdp_allgather", "sharded", "variant = \"allgather\"\nshard_size = 2\n", 4},
    {"sharded_hsdp_stage2", "sharded", "stage = 2\nshard_size = 2\n", 4},
    {"sharded_hsdp_stage3", "sharded", "stage = 3\nshard_size = 2\n", 4},
    {"localsgd", "localsgd", "period = 2\n", 2},
    {"diloco", "diloco", "period = 2\n", 2},
    {"powersgd", "powersgd", "rank = 1\n", 2},
    {"powersgd_c", kTestPlugins + "powersgd_c.so", "", 2},
    {"hsdp_c", kTestPlugins + "hsdp_c.so", "", 4},
    {"groups", kTestPlugins + "groups.so", "", 2},
    {"claims_values", kTestPlugins + "claims_values.so", "what = \"values_per_unit\"\n", 1},
    {"claims_takes", kTestPlugins + "claims_takes.so", "what = \"values_trainable\"\n", 1},
    {"units", kTestPlugins + "units.so", "", 1},
    {"recorder", kTestPlugins + "recorder.so", "", 1},
};

TEST(Checkpoint, EveryStrategyResumesTheCheckpointsItWrites) {
  for (const Writer& w : kWriters) {
    const std::string config =
        "[run]\nsteps = 4\nseed = 7\ntimeout_s = 30\n[model]\nname = \"toy\"\n[data]\npath = \"" + kFixtures +
        "toy_data.safetensors\"\nbatch_size = 24\n" + kAdamW + "[transport]\nplugin = \"gloo\"\n[strategy]\nplugin = \"" +
        w.plugin + "\"\n" + w.keys;
    TempDir dir;
    const RunResult whole = run_ok(config, w.world, checkpointing(dir.path));
    ASSERT_TRUE(fs::exists(dir.path + "/step-00000002/checkpoint.json")) << w.name << " wrote no checkpoint";
    const RunResult resumed = run_ok(config, w.world, checkpointing(dir.path), dir.path + "/step-00000002");
    expect_same_weights(whole, resumed, w.name + ": resumed from step 2");
  }
}

// `latest` names a checkpoint of its own directory, never a path out of it
// (a whole checkpoint elsewhere, ../ or absolute), nor a partial one.
TEST(Checkpoint, LatestNamingAPathOutOfItsDirectoryIsRefused) {
  TempDir dir;
  fs::create_directories(dir.path + "/run/step-00000004");
  fs::create_directories(dir.path + "/elsewhere/step-00000004");
  std::ofstream(dir.path + "/elsewhere/step-00000004/checkpoint.json") << "{}";
  const std::string own = dir.path + "/run";
  for (const std::string& name : std::vector<std::string>{"../elsewhere/step-00000004",
                                                           dir.path + "/elsewhere/step-00000004",
                                                           "step-00000004.partial", "step-x", "notes"}) {
    std::ofstream(own + "/latest", std::ios::trunc) << name << "\n";
    try {
      resolve_checkpoint(own, "latest");
      ADD_FAILURE() << name << " was taken";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), own + "/latest names '" + name +
                                           "', which is not a checkpoint of this directory (step-N)");
    }
  }
}

}  // namespace
}  // namespace ddp
