// groups_test.cpp — process groups through the engine (ABI 1.9): a strategy
// that splits the world (tests/kit/hsdp_c: shard groups of 2 and replica
// groups across them; tests/plugins/strategy_groups.c: pairs, misused)
// trains as DDP does, with every collective metered on its group's size,
// the gradient norm counting each element once (held_ranges' replicas),
// collectives compared within their group (run.debug_collectives), traced
// under their group, misuse of split refused by name, and a group
// collective that one rank never issues ending the run within
// run.timeout_s + 10 s, naming the group and its ranks.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <regex>
#include <string>
#include <vector>

#include "harness.h"
#include "process.h"

namespace ddp {
namespace {

using harness::RunResult;
using nlohmann::json;

const std::string kFixtures = std::string(DDP_TEST_DATA_DIR) + "/fixtures/";
const std::string kPlugins = std::string(DDP_TEST_BROKEN_PLUGIN_DIR);
const std::string kHsdp = kPlugins + "/libddp_strategy_hsdp_c.so";
const std::string kGroups = kPlugins + "/libddp_strategy_groups.so";

// `toy` for 5 steps of SGD with momentum on 24 rows; `strategy` is the
// [strategy] table's body, `run` more [run] keys.
std::string toml(const std::string& strategy, const std::string& run = "", const std::string& optimizer = "") {
  return "[run]\nsteps = 5\nseed = 7\ntimeout_s = 30\n" + run + "[model]\nname = \"toy\"\n[data]\npath = \"" +
         kFixtures + "toy_data.safetensors\"\nbatch_size = 24\n[optimizer]\nlr = 0.1\nmomentum = 0.9\n" + optimizer +
         "[transport]\nplugin = \"gloo\"\n[strategy]\n" + strategy;
}

RunResult run_ok(const std::string& config, int world) {
  RunResult r = harness::run(config, world, {}, "", harness::Ranks::kForked);
  for (const auto& f : r.failures) ADD_FAILURE() << f;
  return r;
}

// Elements of each trainable parameter of `toy` (docs/models.md).
const std::vector<int64_t> kToyTrainable = {100, 500, 250};

TEST(Groups, AnHsdpStyleStrategyTrainsAsDdpWithEachGroupMetered) {
  const RunResult hsdp = run_ok(toml("plugin = \"" + kHsdp + "\"\n"), 4);
  const RunResult ddp = run_ok(toml("plugin = \"naive\"\n"), 4);
  ASSERT_FALSE(hsdp.summary.is_null());
  for (int64_t step = 0; step <= 5; ++step)
    for (size_t p = 0; p < hsdp.names.size(); ++p) {
      for (int r = 1; r < 4; ++r) EXPECT_EQ(hsdp.ranks[r].at(step)[p], hsdp.ranks[0].at(step)[p]) << "rank " << r;
      EXPECT_LT(harness::max_abs_diff(hsdp.ranks[0].at(step)[p], ddp.ranks[0].at(step)[p]), 1e-6f)
          << hsdp.names[p] << " after step " << step;
    }
  // Per step: a sum in the shard group and one in the replica group per
  // trainable parameter, and a broadcast in the shard group: each on 2
  // ranks, where an all-reduce and a broadcast move their bytes once.
  int64_t bytes = 0;
  for (int64_t n : kToyTrainable) bytes += 4 * n;
  const json& groups = hsdp.summary["groups"];
  ASSERT_EQ(groups.size(), 3u) << groups.dump();
  EXPECT_EQ(groups[0]["name"], "world");
  EXPECT_EQ(groups[0]["ranks"], json({0, 1, 2, 3}));
  EXPECT_EQ(groups[1]["name"], "shard");
  EXPECT_EQ(groups[1]["ranks"], json({0, 1}));
  EXPECT_EQ(groups[1]["size"], 2);
  EXPECT_EQ(groups[1]["collectives"], 5 * 6);
  EXPECT_EQ(groups[1]["comm_bytes"], 5 * 2 * bytes);
  EXPECT_EQ(groups[1]["bus_bytes"], 5 * 2 * bytes);
  EXPECT_EQ(groups[2]["name"], "replicate");
  EXPECT_EQ(groups[2]["ranks"], json({0, 2}));
  EXPECT_EQ(groups[2]["collectives"], 5 * 3);
  EXPECT_EQ(groups[2]["bus_bytes"], 5 * bytes);
  for (size_t s = 0; s < 5; ++s) EXPECT_EQ(hsdp.summary["bus_bytes"][s], 3 * bytes) << "step " << s + 1;
  EXPECT_EQ(hsdp.summary["collective_sequences_agree"], true);
}

TEST(Groups, TheGradientNormCountsEveryElementOnceAndClippingReachesEveryReplica) {
  // hsdp_c names only the gradients its group rank owns, each held by the
  // 2 replica groups: the norm must be DDP's, and clipping too.
  const std::string clip = "clip_grad_norm = 0.05\n";
  const RunResult hsdp = run_ok(toml("plugin = \"" + kHsdp + "\"\n", "", clip), 4);
  const RunResult ddp = run_ok(toml("plugin = \"naive\"\n", "", clip), 4);
  ASSERT_FALSE(hsdp.summary.is_null());
  for (size_t s = 0; s < 5; ++s) {
    const double a = hsdp.summary["grad_norm"][s].get<double>(), b = ddp.summary["grad_norm"][s].get<double>();
    EXPECT_LT(std::fabs(a - b), 1e-6 * b) << "step " << s + 1 << ": " << a << " against " << b;
    EXPECT_GT(b, 0.05) << "the clip must bite for the test to mean something";
  }
  for (size_t p = 0; p < hsdp.names.size(); ++p)
    EXPECT_LT(harness::max_abs_diff(hsdp.ranks[0].at(5)[p], ddp.ranks[0].at(5)[p]), 1e-6f) << hsdp.names[p];
}

TEST(Groups, DebugCollectivesComparesTheSequenceWithinEachGroup) {
  const RunResult r = harness::run(toml("plugin = \"" + kGroups + "\"\nmode = \"misordered\"\n",
                                        "debug_collectives = true\n"),
                                   2, {}, "", harness::Ranks::kForked);
  ASSERT_FALSE(r.failures.empty());
  std::string all;
  for (const std::string& f : r.failures) all += f + "\n";
  EXPECT_NE(all.find("run.debug_collectives: the ranks of group 'pairs' (ranks 0, 1) disagree on collective #1 of "
                     "the group: rank 0 calls all_reduce (avg) of 100 float32 (parameter 'fc1.weight'), rank 1 "
                     "calls all_reduce (avg) of 250 float32 (parameter 'fc3.weight')"),
            std::string::npos)
      << all;
}

// Each misuse of split, and the words it is refused with.
TEST(Groups, SplitIsRefusedByNameWhereItCannotBe) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"late", "strategy plugin 'groups': finish: split: only in create or on_train_begin (every rank of the "
               "parent at the same point, before the first step)"},
      {"badname", "strategy plugin 'groups': create: split: a group name has only characters of [A-Za-z0-9_.-]: "
                  "'two words' has another"},
      {"foreign", "strategy plugin 'groups': create: split: the parent is no communicator of this strategy's (the "
                  "comm create was given, or one split made)"},
  };
  for (const auto& [mode, words] : cases) {
    const RunResult r =
        harness::run(toml("plugin = \"" + kGroups + "\"\nmode = \"" + mode + "\"\n"), 2, {}, "", harness::Ranks::kForked);
    ASSERT_FALSE(r.failures.empty()) << mode;
    std::string all;  // (a peer still connecting may see the refusing rank leave first)
    for (const std::string& f : r.failures) all += f + "\n";
    EXPECT_NE(all.find(words), std::string::npos) << all;
  }
}

// A split of a split: two parents split at the same point with one color
// make two groups (their rendezvous never meet), and a split that only
// some groups make does not shift the world's later splits. Each group
// checks a sum of its ranks; repeated, as a meeting would show by chance.
TEST(Groups, NestedSplitsKeepTheirGroupsApart) {
  for (int round = 0; round < 5; ++round)
    for (const std::string mode : {"nested", "uneven"}) {
      const RunResult r = harness::run(toml("plugin = \"" + kGroups + "\"\nmode = \"" + mode + "\"\n"), 4, {}, "",
                                       harness::Ranks::kForked);
      for (const auto& f : r.failures) ADD_FAILURE() << mode << ", round " << round << ": " << f;
      ASSERT_FALSE(r.summary.is_null()) << mode;
    }
}

// state_scopes that differ between ranks (rank 0 says its one buffer is
// equal on every rank, the others that it is theirs alone) are refused by
// name when a checkpoint is written, before anything is compared.
TEST(Groups, StateScopesThatDifferBetweenRanksAreRefused) {
  harness::TempDir dir("ddp-groups-scopes");
  const RunResult r = harness::run(toml("plugin = \"" + kGroups + "\"\nmode = \"scopes\"\n"), 2,
                                   {"checkpoint.every=2", "checkpoint.dir=\"" + dir.path + "\""}, "",
                                   harness::Ranks::kForked);
  ASSERT_FALSE(r.failures.empty());
  std::string all;
  for (const std::string& f : r.failures) all += f + "\n";
  EXPECT_NE(all.find("strategy plugin 'groups': state: rank 1 gives other buffers, counts or scopes (state_scopes) "
                     "than rank 0: every rank must give the same (writing a checkpoint)"),
            std::string::npos)
      << all;
}

// held_ranges that repeat elements on one rank, or that count the ranks
// holding a gradient wrong (each rank says it alone holds what all hold),
// would make the gradient norm and clipping wrong: refused by name at the
// first step's norm.
TEST(Groups, HeldRangesThatRepeatOrMiscountAreRefused) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"held_twice", "strategy plugin 'groups': held_ranges: two ranges hold elements [0, 100) of parameter "
                     "'fc1.weight': each element this rank holds is named once"},
      {"held_once", "strategy plugin 'groups': held_ranges: the ranks hold the averaged gradient of parameter "
                    "'fc1.weight' 2 times over, counting each range once per its replicas, not once"},
  };
  for (const auto& [mode, words] : cases) {
    const RunResult r =
        harness::run(toml("plugin = \"" + kGroups + "\"\nmode = \"" + mode + "\"\n"), 2, {}, "", harness::Ranks::kForked);
    ASSERT_FALSE(r.failures.empty()) << mode;
    std::string all;
    for (const std::string& f : r.failures) all += f + "\n";
    EXPECT_NE(all.find(words), std::string::npos) << all;
  }
}

// What `state` and `held_ranges` point the engine at is checked before it
// is read: buffers at NULL, a buffer at NULL with elements, a count far
// past the memory behind a pointer are refused naming the plugin, the
// entry and the buffer, not a segmentation fault in the engine.
TEST(Groups, StateAndHeldRangesThatPointAtTooLittleAreRefusedByName) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"state_null", "strategy plugin 'groups': state: 3 buffers at NULL"},
      {"state_nullptr", "strategy plugin 'groups': state: buffer 0 ('steps') is NULL with 3 elements"},
      {"state_huge", "strategy plugin 'groups': state: buffer 0 ('steps') of 1099511627776 elements: its "
                     "4398046511104 bytes from 0x"},
      {"held_huge", "strategy plugin 'groups': held_ranges: its 1099511627776 ranges: its "},
  };
  for (const auto& [mode, words] : cases) {
    harness::TempDir dir("ddp-groups-" + mode);
    const RunResult r = harness::run(toml("plugin = \"" + kGroups + "\"\nmode = \"" + mode + "\"\n"), 2,
                                     {"checkpoint.every=2", "checkpoint.dir=\"" + dir.path + "\""}, "",
                                     harness::Ranks::kForked);
    ASSERT_FALSE(r.failures.empty()) << mode;
    std::string all;
    for (const std::string& f : r.failures) all += f + "\n";
    EXPECT_NE(all.find(words), std::string::npos) << all;
    if (mode != "state_null" && mode != "state_nullptr") {
      EXPECT_NE(all.find("run past the memory mapped there"), std::string::npos) << all;
    }
  }
}

// Replicas of a parameter's whole optimizer state that differ (rank 1's
// AdamW moments 1024 times rank 0's, its weights bitwise the same) are
// not written as one: the checkpoint is refused, naming both.
TEST(Groups, AWholeStateTheReplicasHoldApartIsNotCheckpointed) {
  harness::TempDir dir("ddp-groups-state");
  std::string config =
      toml("plugin = \"" + kGroups + "\"\nmode = \"scaled\"\n", "", "name = \"adamw\"\neps = 1e-30\n");
  config.replace(config.find("momentum = 0.9\n"), 15, "");  // (SGD's key)
  const RunResult r = harness::run(config, 2, {"checkpoint.every=2", "checkpoint.dir=\"" + dir.path + "\""}, "",
                                   harness::Ranks::kForked);
  ASSERT_FALSE(r.failures.empty());
  std::string all;
  for (const std::string& f : r.failures) all += f + "\n";
  EXPECT_NE(all.find("checkpoint: the optimizer state of 'fc1.weight' differs between rank 0 and rank 1, which both "
                     "hold it whole: replicas must hold the same state"),
            std::string::npos)
      << all;
}

TEST(Groups, ATransportWithoutSplitIsNamed) {
  const RunResult r = harness::run(
      toml("plugin = \"" + kGroups + "\"\n") + "", 1,
      {"transport.plugin=\"" + kPlugins + "/libddp_transport_norscatter.so\""}, "", harness::Ranks::kForked);
  ASSERT_FALSE(r.failures.empty());
  EXPECT_NE(r.failures[0].find("strategy plugin 'groups': create: split: transport 'norscatter' makes no groups "
                               "(it has no split entry)"),
            std::string::npos)
      << r.failures[0];
}

// A rank that stops issuing a group's all-reduces (hsdp_c's skip_rank:
// rank 3 issues none from its second on, in step 1): its replica partner,
// rank 1,
// waits for it until the transport's timeout, and the run ends within
// run.timeout_s + 10 s naming the group and its ranks.
void a_group_collective_never_issued(int timeout_s, const std::string& transport = "gloo") {
  const std::string dir = temp_dir();
  const auto started = std::chrono::steady_clock::now();
  Process p = start({"run", kRepo + "/configs/toy.toml", "--set", "run.output_dir=\"" + dir + "/out\"", "--set",
                     "run.world_size=4", "--set", "data.batch_size=24", "--set", "run.steps=50", "--set",
                     "run.timeout_s=" + std::to_string(timeout_s), "--set", "strategy.plugin=\"" + kHsdp + "\"",
                     "--set", "strategy.skip_rank=3", "--set", "strategy.skip_at=2", "--set",
                     "transport.plugin=\"" + transport + "\""},
                    {}, dir + "/ddp");
  EXPECT_EQ(wait_for(p, std::chrono::seconds(timeout_s + 60)), 1);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_LT(took, timeout_s + 10) << "the run took " << took << " s to stop";
  // The waits chain (rank 3 goes on to its shard group, whose other rank
  // waits on its replica group, ...), so whichever rank's transport gives
  // up first reports: its collective's group, with the group's ranks.
  const std::string err = read_file(p.err);
  // (gloo gives up on its own; mpi's blocking collectives are given up on
  // by the engine's wait: "made no progress".)
  const std::regex named("ddp: rank ([0-3]) (failed|reported) in step 1: .*(?:timed out|made no progress).*\\(in group "
                         "'(shard|replicate)' \\(ranks ([0-3]), ([0-3])\\)\\)", std::regex::icase);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(err, m, named)) << err;
  EXPECT_TRUE(m[1] == m[4] || m[1] == m[5]) << "the reporting rank is in the group it names: " << m[0];
  EXPECT_FALSE(std::filesystem::exists(dir + "/out/summary.json")) << "a failed run wrote a summary";
  std::filesystem::remove_all(dir);
}

TEST(GroupTimeouts, ACollectiveOneRankNeverIssuesEndsTheRunNamingItsGroupAt2s) { a_group_collective_never_issued(2); }
TEST(GroupTimeouts, ACollectiveOneRankNeverIssuesEndsTheRunNamingItsGroupAt5s) { a_group_collective_never_issued(5); }
TEST(GroupTimeouts, OverMpiTheEnginesWaitNamesTheGroupAt2s) {
  if (!std::filesystem::exists(std::string(DDP_TEST_PLUGIN_DIR) + "/libddp_transport_mpi.so"))
    GTEST_SKIP() << "this build has no mpi transport";
  a_group_collective_never_issued(2, "mpi");
}

TEST(GroupTrace, ACollectiveOfAGroupIsTracedUnderItsGroup) {
  const std::string dir = temp_dir();
  Process p = start({"run", kRepo + "/configs/toy.toml", "--trace", "--set", "run.output_dir=\"" + dir + "/out\"",
                     "--set", "run.world_size=4", "--set", "data.batch_size=24", "--set",
                     "strategy.plugin=\"" + kHsdp + "\""},
                    {}, dir + "/ddp");
  ASSERT_EQ(wait_for(p, std::chrono::seconds(120)), 0) << read_file(p.err);
  const json trace = json::parse(read_file(dir + "/out/trace.json"));
  int shard = 0, replicate = 0, world = 0;
  for (const json& e : trace["traceEvents"]) {
    if (!e.contains("args") || !e["args"].contains("op") || e["pid"] != 3) continue;
    const std::string group = e["args"].value("group", "");
    if (group == "group 'shard' (ranks 2, 3)") ++shard;
    else if (group == "group 'replicate' (ranks 1, 3)") ++replicate;
    else if (group.empty()) ++world;
    else ADD_FAILURE() << "rank 3 traced a collective of " << group;
  }
  EXPECT_EQ(shard, 5 * 6);
  EXPECT_EQ(replicate, 5 * 3);
  EXPECT_EQ(world, 5);  // the set-up broadcasts (the engine's own gathers are not the strategy's)
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ddp
