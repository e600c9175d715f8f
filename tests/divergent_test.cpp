// divergent_test.cpp — strategies whose replicas differ on purpose between
// sync points (DDP_CAP_DIVERGENT, ABI 1.8): `localsgd` and `diloco`,
// through the real engine and the gloo transport, each rank a forked
// process (tests/harness.h). What binds them still:
//  - the ranks really differ between sync points and are bitwise equal at
//    each one; the replica check (run.check_replicas_every = 1) runs there
//    only, also where the period does not divide the steps, and the end of
//    the run is checked only where its last step is a sync point;
//  - a rank that keeps its own values at one sync point (the transport
//    `dies` drops its all-reduce there) is caught at that sync point;
//  - the shipped strategies end the run with a sync point, so that
//    weights.safetensors is every rank's model; a strategy that does not
//    is said to have left rank 0's replica there (console, summary.json);
//  - ranks that disagree on on_step_end (whether the step is a sync point,
//    or the collectives in it) stop at that step, naming what each did
//    (tests/plugins/strategy_divergent.c's `periodic`);
// Their equality with DDP where the algebra says so (period 1, SGD) is the
// conformance suite's: localsgd_1, localsgd_warmup, diloco_1 in ctest; their
// checkpoints checkpoint_test's DivergentResume.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness.h"
#include "process.h"

namespace ddp {
namespace {

using harness::RunResult;
using nlohmann::json;

const std::string kFixtures = std::string(DDP_TEST_DATA_DIR) + "/fixtures/";
const std::string kDies = std::string(DDP_TEST_BROKEN_PLUGIN_DIR) + "/libddp_transport_dies.so";
const std::string kPeriodic = std::string(DDP_TEST_BROKEN_PLUGIN_DIR) + "/libddp_strategy_divergent_periodic.so";

// `steps` of toy with SGD (momentum: per-rank state), every step's replicas
// due for a check; `strategy` is the [strategy] table's body.
std::string toml(const std::string& strategy, int steps, const std::string& transport = "gloo") {
  return "[run]\nsteps = " + std::to_string(steps) + "\nseed = 7\ntimeout_s = 30\ncheck_replicas_every = 1\n" +
         "[model]\nname = \"toy\"\n[data]\npath = \"" + kFixtures + "toy_data.safetensors\"\nbatch_size = 24\n" +
         "[optimizer]\nlr = 0.1\nmomentum = 0.9\n[transport]\nplugin = \"" + transport + "\"\n[strategy]\n" +
         strategy;
}

RunResult run_ok(const std::string& config, int world) {
  RunResult r = harness::run(config, world);
  for (const auto& f : r.failures) ADD_FAILURE() << f;
  return r;
}

bool ranks_equal(const RunResult& r, int64_t step) {
  for (size_t k = 1; k < r.ranks.size(); ++k)
    if (r.ranks[k].at(step) != r.ranks[0].at(step)) return false;
  return true;
}

// Ranks equal exactly after the steps `synced` says, different after the
// others; what summary.json says of them.
void expect_sync_points(const RunResult& r, const std::vector<bool>& synced, const std::vector<int64_t>& checked) {
  ASSERT_FALSE(r.summary.is_null());
  EXPECT_EQ(r.summary["synced"], json(synced));
  EXPECT_EQ(r.summary["replica_checks"]["sync_points_only"], true);
  EXPECT_EQ(r.summary["replica_checks"]["after_steps"], json(checked));
  EXPECT_TRUE(ranks_equal(r, 0)) << "rank 0's parameters everywhere after set-up";
  for (size_t s = 0; s < synced.size(); ++s)
    EXPECT_EQ(ranks_equal(r, int64_t(s) + 1), bool(synced[s])) << "after step " << s + 1;
}

// The model the run writes, every rank's: summary.json says so, and
// weights.safetensors holds the ranks' (equal) parameters after the last step.
void expect_synced_weights(const RunResult& r, int64_t steps) {
  EXPECT_EQ(r.summary["weights"], json({{"after_step", steps}, {"sync_point", true}, {"note", nullptr}}));
  for (size_t p = 0; p < r.names.size(); ++p) {
    EXPECT_EQ(r.final_weights.at(r.names[p]).as_floats("weights", r.names[p]), r.ranks[0].at(steps)[p]) << r.names[p];
    for (size_t k = 1; k < r.ranks.size(); ++k)
      EXPECT_EQ(r.ranks[k].at(steps)[p], r.ranks[0].at(steps)[p]) << r.names[p] << ", rank " << k;
  }
}

TEST(LocalSgd, ReplicasDifferBetweenAveragesAndAreCheckedAtEachOne) {
  // 7 steps, period 3: averaged after steps 3 and 6, and after the last
  // (7), which ends the run.
  const RunResult r = run_ok(toml("plugin = \"localsgd\"\nperiod = 3\n", 7), 2);
  expect_sync_points(r, {false, false, true, false, false, true, true}, {3, 6, 7});
  EXPECT_EQ(r.summary["strategy_stats"]["averages"], 3);
  expect_synced_weights(r, 7);
}

// The last step's average is the mean of the ranks' local steps: rank 0's
// values after step 7 are the mean of what each rank's replica would have
// been, which, from equal replicas after step 6, differ by one step each.
TEST(LocalSgd, TheRunEndsWithAnAverageWhereThePeriodDoesNotDivideTheSteps) {
  const RunResult ended = run_ok(toml("plugin = \"localsgd\"\nperiod = 3\n", 7), 2);
  const RunResult on = run_ok(toml("plugin = \"localsgd\"\nperiod = 3\n", 9), 2);
  ASSERT_FALSE(ended.summary.is_null());
  ASSERT_FALSE(on.summary.is_null());
  // The same run to step 6; step 7 local on each rank in the longer run.
  for (size_t p = 0; p < on.names.size(); ++p) {
    EXPECT_EQ(ended.ranks[0].at(6)[p], on.ranks[0].at(6)[p]) << on.names[p];
    const std::vector<float>& a = on.ranks[0].at(7)[p];
    const std::vector<float>& b = on.ranks[1].at(7)[p];
    const std::vector<float>& mean = ended.ranks[0].at(7)[p];
    ASSERT_EQ(mean.size(), a.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(mean[i], (a[i] + b[i]) / 2, 1e-6) << on.names[p] << "[" << i << "]";
  }
  EXPECT_NE(on.ranks[0].at(7), on.ranks[1].at(7)) << "step 7 of the longer run is local";
}

TEST(LocalSgd, WarmupStepsAreDdpThenLocal) {
  // Steps 1-2 averaged gradients (DDP), then an average every 2 local
  // steps: after 4 and 6. The end (step 6) was just checked: once.
  RunResult r = run_ok(toml("plugin = \"localsgd\"\nperiod = 2\nwarmup_steps = 2\n", 6), 3);
  expect_sync_points(r, {true, true, false, true, false, true}, {1, 2, 4, 6});
}

TEST(DiLoCo, OuterStepsAtEachPeriodWithThePapersDefaults) {
  // 8 steps, period 3: outer steps after 3 and 6, and after the last (8),
  // on its two inner steps.
  const RunResult r = run_ok(toml("plugin = \"diloco\"\nperiod = 3\n", 8), 2);
  expect_sync_points(r, {false, false, true, false, false, true, false, true}, {3, 6, 8});
  EXPECT_EQ(r.summary["strategy_stats"]["outer_steps"], 3);
  expect_synced_weights(r, 8);
  EXPECT_EQ(r.summary["strategy_stats"]["outer_lr"], 0.7);
  EXPECT_EQ(r.summary["strategy_stats"]["outer_momentum"], 0.9);
}

TEST(DiLoCo, AChecksDueBetweenSyncPointsRunsAtTheNext) {
  // every = 4, period 3, 9 steps: due after step 4, checked at step 6;
  // due after 8, checked at 9, the last step: the end is not checked again.
  const RunResult r = harness::run(toml("plugin = \"diloco\"\nperiod = 3\n", 9), 2, {"run.check_replicas_every=4"});
  for (const auto& f : r.failures) ADD_FAILURE() << f;
  ASSERT_FALSE(r.summary.is_null());
  EXPECT_EQ(r.summary["replica_checks"]["after_steps"], json({6, 9}));
}

TEST(LocalSgd, ARankThatKeepsItsValuesAtASyncPointIsCaughtThere) {
  // Rank 1's second all-reduce (step 6's average) averages zeros of its
  // own instead: its values stay its own, the others average.
  const std::string config = toml("plugin = \"localsgd\"\nperiod = 3\n", 7, kDies);
  RunResult r = harness::run(config, 2, {"transport.drop_rank=1", "transport.drop_at=2"});
  ASSERT_FALSE(r.failures.empty()) << "the run passed";
  bool named = false;
  for (const std::string& f : r.failures)
    named |= f.find("the replicas differ after step 6: parameter 'fc1.weight' of rank 1 differs from rank 0's") !=
             std::string::npos;
  EXPECT_TRUE(named) << r.failures[0];
  EXPECT_TRUE(ranks_equal(r, 3)) << "step 3's average was whole";
}

// A divergent strategy whose last step is not a sync point (periodic, 2,
// over 3 steps): weights.safetensors is rank 0's own replica, and the run
// says so on the console and in summary.json.
TEST(Divergent, WeightsOfALastStepThatIsNoSyncPointAreSaidToBeRank0s) {
  const std::string note =
      "weights.safetensors holds rank 0's replica as of step 3, which was not a sync point: strategy plugin "
      "'divergent_periodic' lets the replicas differ between sync points and did not end the run with one";
  const std::string config = toml("plugin = \"" + kPeriodic + "\"\nperiod = 2\n", 3);
  const RunResult r = run_ok(config, 2);
  ASSERT_FALSE(r.summary.is_null());
  EXPECT_EQ(r.summary["synced"], json({false, true, false}));
  EXPECT_EQ(r.summary["weights"], json({{"after_step", 3}, {"sync_point", false}, {"note", note}}));
  EXPECT_EQ(r.final_weights.at(r.names[1]).as_floats("weights", r.names[1]), r.ranks[0].at(3)[1]);
  EXPECT_NE(r.ranks[1].at(3)[1], r.ranks[0].at(3)[1]);
  // The user's view: `ddp run`, exit 0, the note on the console.
  const std::string dir = temp_dir();
  std::ofstream(dir + "/periodic.toml") << "[run]\nworld_size = 2\noutput_dir = \"" << dir << "/out\"\n"
                                         << config.substr(std::string("[run]\n").size());
  const Process p = start({"run", dir + "/periodic.toml"}, {}, dir + "/ddp");
  EXPECT_EQ(wait_for(p, std::chrono::seconds(60)), 0) << read_file(p.err);
  EXPECT_NE(read_file(p.out).find("note: " + note + "\n"), std::string::npos) << read_file(p.out);
  EXPECT_NE(read_file(dir + "/out/summary.json").find("\"sync_point\": false"), std::string::npos);
  std::filesystem::remove_all(dir);
}

// Every rank's failure, one string per line.
std::string all_failures(const RunResult& r) {
  std::string all;
  for (const std::string& f : r.failures) all += f + "\n";
  return all;
}

// Ranks that disagree on whether a step is a sync point stop after it,
// every rank naming the step, the plugin, the entry and each one's answer
// (rank 1 averages as rank 0 does, and answers otherwise: at step 1 that
// it synced).
TEST(Divergent, RanksThatAnswerOnStepEndDifferentlyStopThere) {
  const RunResult r = harness::run(toml("plugin = \"" + kPeriodic + "\"\nperiod = 2\nlying_rank = 1\n", 4), 2);
  ASSERT_EQ(r.failures.size(), 2u) << all_failures(r);
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_EQ(r.failures[size_t(rank)],
              "rank " + std::to_string(rank) + ": strategy plugin 'divergent_periodic': on_step_end: the ranks "
              "disagree on whether step 1 is a sync point: rank 0 says it is not, rank 1 says it is: every rank "
              "must answer on_step_end alike");
}

// A rank whose strategy averages at a step where another's returned (rank
// 1's period is 3, the others' 2): the collective is refused before it
// runs, the same words on every rank, with run.debug_collectives or without.
TEST(Divergent, ARankThatSyncsWhereAnotherReturnedStopsBeforeItsCollective) {
  const std::string config =
      toml("plugin = \"" + kPeriodic + "\"\nperiod = 2\nodd_rank = 1\nodd_period = 3\n", 4);
  for (const bool debug : {false, true})
    for (const int world : {2, 3}) {
      const RunResult r = harness::run(config, world, {std::string("run.debug_collectives=") + (debug ? "true" : "false")});
      ASSERT_EQ(r.failures.size(), size_t(world)) << all_failures(r);
      for (int rank = 0; rank < world; ++rank)
        EXPECT_EQ(r.failures[size_t(rank)],
                  "rank " + std::to_string(rank) + ": strategy plugin 'divergent_periodic': on_step_end: the ranks "
                  "disagree in on_step_end of step 2: rank 0 calls all_reduce (avg) of 100 float32 (parameter "
                  "'fc1.weight'), rank 1 returned saying step 2 is not a sync point: every rank "
                  "must answer on_step_end alike, with the same collectives")
            << "world " << world << (debug ? ", run.debug_collectives" : "");
    }
}

// A strategy whose caps lack DDP_CAP_DIVERGENT has equal replicas after
// every step: saying otherwise stops the run (tests/plugins/strategy_divergent.c).
TEST(Divergent, ReplicasSaidToDifferWithoutTheCapStopTheRun) {
  const std::string plugin = std::string(DDP_TEST_BROKEN_PLUGIN_DIR) + "/libddp_strategy_divergent_nocap.so";
  const RunResult r = harness::run(toml("plugin = \"" + plugin + "\"\n", 2), 1);
  ASSERT_FALSE(r.failures.empty());
  EXPECT_NE(r.failures[0].find("strategy plugin 'divergent_nocap': on_step_end said the replicas may differ after "
                               "step 1, but its caps lack DDP_CAP_DIVERGENT"),
            std::string::npos)
      << r.failures[0];
}

TEST(Divergent, APeriodIsRequired) {
  for (const char* plugin : {"localsgd", "diloco"}) {
    const RunResult r = harness::run(toml(std::string("plugin = \"") + plugin + "\"\n", 2), 2);
    ASSERT_FALSE(r.failures.empty());
    // Every rank refuses in create; a peer still connecting may first see
    // the refusing rank's connection close, so look for it in any rank's.
    std::string all;
    for (const std::string& f : r.failures) all += f + "\n";
    EXPECT_NE(all.find(std::string("create: strategy.period: ") + plugin +
                       " needs the number of steps between sync points, an integer >= 1 (the key is required)"),
              std::string::npos)
        << all;
  }
}

}  // namespace
}  // namespace ddp
