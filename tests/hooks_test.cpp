// hooks_test.cpp — the order in which the engine calls a strategy's hooks,
// seen by a recording strategy (tests/plugins/strategy_recorder.c) on one
// rank: on_grad_ready in reverse layer order, after a parameter's last use
// (once for the tied weight, with its final gradient), never for frozen
// parameters.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include <nlohmann/json.hpp>

#include "config.h"
#include "trainer.h"

namespace ddp {
namespace {

// Every snapshot of the weights, by step (TrainObserver).
struct Snapshots final : TrainObserver {
  std::map<int64_t, std::vector<std::vector<float>>> at;
  void on_weights(int64_t step, const std::vector<std::vector<float>>& values) override { at[step] = values; }
};

// Trains `model` for 2 steps on one rank with the test strategy `strategy`;
// returns summary.json, with "weights_file": weights.safetensors's bytes.
// `model_keys`, `strategy_keys`: more lines of its [model], [strategy] tables.
nlohmann::json run_one_rank(const std::string& model, const std::string& strategy,
                            const std::string& model_keys = "", const std::string& strategy_keys = "",
                            TrainObserver* observer = nullptr) {
  char tmpl[] = "/tmp/ddp-hooks-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  std::ofstream(dir + "/run.toml") << "[run]\nsteps = 2\noutput_dir = \"" << dir << "/out\"\n"
                                   << "[model]\nname = \"" << model << "\"\n" << model_keys
                                   << "[data]\nbatch_size = 8\n"
                                   << "[optimizer]\nlr = 0.1\n[strategy]\nplugin = \""
                                   << DDP_TEST_BROKEN_PLUGIN_DIR << "/libddp_strategy_" << strategy << ".so\"\n"
                                   << strategy_keys;
  Config config = load_config(dir + "/run.toml");
  std::filesystem::create_directories(dir + "/rdzv");
  RankEnv env;
  env.rendezvous = "file:" + dir + "/rdzv";
  try {
    train_rank(config, env, observer);
  } catch (...) {
    std::filesystem::remove_all(dir);
    throw;
  }
  auto summary = nlohmann::json::parse(std::ifstream(dir + "/out/summary.json"));
  std::ifstream weights(dir + "/out/weights.safetensors", std::ios::binary);
  summary["weights_file"] = std::string(std::istreambuf_iterator<char>(weights), {});
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

// ABI 1.4: the unit hooks around each unit's forward and backward, from the
// model's own layer loops; on_grad_ready inside its unit's backward; the
// unit and parameter tables; total_steps; on_train_end once.
TEST(Hooks, UnitHooksWrapEachUnitsForwardAndBackwardInModelOrder) {
  auto stats = run_one_rank("toy_tied", "units").at("strategy_stats");
  EXPECT_EQ(stats["hooks"],
            "train_begin step_begin fwd(fc1) /fwd(fc1) fwd(fc2) /fwd(fc2) fwd(fc3) /fwd(fc3) fwd(fc4) /fwd(fc4) "
            "fwd(fc5) /fwd(fc5) bwd(fc5) ready(fc5.weight) /bwd(fc5) bwd(fc4) /bwd(fc4) bwd(fc3) ready(fc3.weight) "
            "/bwd(fc3) bwd(fc2) ready(fc2.weight) /bwd(fc2) bwd(fc1) ready(fc1.weight) /bwd(fc1) finish");
  EXPECT_EQ(stats["total_steps"], 2);
  EXPECT_EQ(stats["ended"], 1);
  // fc4 owns nothing and reads fc2's weight: the tie is stated.
  EXPECT_EQ(stats["units"].dump(),
            R"([{"index":0,"name":"fc1","params":[0],"tied":[]},{"index":1,"name":"fc2","params":[1],"tied":[]},)"
            R"({"index":2,"name":"fc3","params":[2],"tied":[]},{"index":3,"name":"fc4","params":[],"tied":[1]},)"
            R"({"index":4,"name":"fc5","params":[3],"tied":[]}])");
  EXPECT_EQ(stats["params"][1].dump(), R"({"name":"fc2.weight","shape":[50,10],"unit":1,"uses":2})");
}

TEST(Hooks, ToysUnusedParameterBelongsToTheFirstUnit) {
  auto stats = run_one_rank("toy", "units").at("strategy_stats");
  EXPECT_EQ(stats["units"][0].dump(), R"({"index":0,"name":"fc1","params":[0,1],"tied":[]})");
  EXPECT_EQ(stats["units"][1].dump(), R"({"index":1,"name":"fc2","params":[2,3],"tied":[]})");
  EXPECT_EQ(stats["params"][0].dump(), R"({"name":"no_grad_fixed_param","shape":[2],"unit":0,"uses":0})");
}

TEST(Hooks, MlpAndLmDeclareTheirLayersAsUnits) {
  auto mlp = run_one_rank("mlp", "units", "width = 4\ndepth = 2\nclasses = 3\n").at("strategy_stats");
  EXPECT_EQ(mlp["hooks"],
            "train_begin step_begin fwd(layers.0) /fwd(layers.0) fwd(layers.1) /fwd(layers.1) fwd(head) /fwd(head) "
            "bwd(head) ready(head.bias) ready(head.weight) /bwd(head) bwd(layers.1) ready(layers.1.bias) "
            "ready(layers.1.weight) /bwd(layers.1) bwd(layers.0) ready(layers.0.bias) ready(layers.0.weight) "
            "/bwd(layers.0) finish");
  auto lm = run_one_rank("lm", "units", "preset = \"lm-tiny\"\n").at("strategy_stats");
  std::vector<std::string> names;
  for (const auto& u : lm["units"]) names.push_back(u["name"]);
  ASSERT_GE(names.size(), 3u);
  EXPECT_EQ(names.front(), "embedding");
  EXPECT_EQ(names[1], "layers.0");
  EXPECT_EQ(names.back(), "head");
  EXPECT_EQ(lm["units"].back()["params"].size(), 2u);  // ln_final and lm_head
  EXPECT_EQ(lm["units"][1]["params"].size(), 9u);      // a block's nine
  const std::string hooks = lm["hooks"];
  EXPECT_NE(hooks.find("bwd(head) ready(lm_head.weight) ready(ln_final.weight) /bwd(head) bwd(layers."),
            std::string::npos) << hooks;
  EXPECT_NE(hooks.find("bwd(embedding) ready(token_embeddings.weight) /bwd(embedding) finish"), std::string::npos)
      << hooks;
}

// Claimed gradient storage, misused: each is refused naming what is wrong.
std::string claim_failure(const std::string& strategy, const std::string& what) {
  try {
    run_one_rank("toy", strategy, "", "what = \"" + what + "\"\n");
  } catch (const Error& e) {
    return e.what();
  }
  return "the run went through";
}

TEST(ClaimedGradients, AFrozenParameterIsRefusedByName) {
  EXPECT_EQ(claim_failure("claims", "frozen"),
            "strategy plugin 'claims': create: claim: parameter 'no_grad_fixed_param' is frozen: a strategy may claim "
            "the gradient storage of trainable parameters only");
}

TEST(ClaimedGradients, OnlyBeforeAnythingIsWrittenIntoTheGradients) {
  EXPECT_EQ(claim_failure("claims", "late"),
            "strategy plugin 'claims': on_unit(fc3, BACKWARD_BEGIN): claim: only in create, on_train_begin, or "
            "on_step_begin of a step's "
            "first micro-batch (the engine's own gradients hold nothing then)");
}

TEST(ClaimedGradients, OnlyByAStrategyWhoseCapsSaySoAndOnlyGradients) {
  EXPECT_EQ(claim_failure("claims_nocap", "frozen"),
            "strategy plugin 'claims_nocap': create: claim: the plugin's caps lack DDP_CAP_OWNS_GRADIENTS");
  EXPECT_EQ(claim_failure("claims", "storage"),
            "strategy plugin 'claims': create: claim: the plugin's caps lack DDP_CAP_OWNS_PARAMETERS");
}

// Gradients said final (ABI 1.10, grads_final): the engine steps each
// group once, in the order said, after its event, then the parameters no
// group named: the run trains as without it, loss for loss and weight for
// weight (a parameter stepped twice or not at all would differ).
TEST(GradsFinal, TheEngineStepsEachGroupOnceThenTheRestTrainingAsWithoutIt) {
  for (const std::string model : {"toy", "toy_tied"}) {
    Snapshots plain_snapshots;
    const auto plain = run_one_rank(model, "recorder", "", "", &plain_snapshots);
    for (const std::string what : {"each", "half"}) {
      Snapshots final_snapshots;
      const auto said = run_one_rank(model, "final", "", "what = \"" + what + "\"\n", &final_snapshots);
      EXPECT_EQ(said.at("loss"), plain.at("loss")) << model << " " << what;
      EXPECT_EQ(final_snapshots.at, plain_snapshots.at) << model << " " << what;
      EXPECT_NE(plain_snapshots.at.at(1), plain_snapshots.at.at(2)) << model;  // the step changed the weights
    }
  }
}

TEST(GradsFinal, MisusedItIsRefusedNamingTheEntryAndWhatIsWrong) {
  EXPECT_EQ(claim_failure("final", "early"),
            "strategy plugin 'final': on_train_begin: grads_final: only from on_step_begin of a step's sync "
            "micro-batch until its finish returns (the engine's optimizer step follows)");
  EXPECT_EQ(claim_failure("final", "frozen"),
            "strategy plugin 'final': finish: grads_final: parameter 'no_grad_fixed_param' is frozen: the "
            "optimizer steps trainable parameters only");
  EXPECT_EQ(claim_failure("final", "twice"),
            "strategy plugin 'final': finish: grads_final: parameter 'fc1.weight' was said final twice this step");
  EXPECT_EQ(claim_failure("claims", "final"),
            "strategy plugin 'claims': finish: grads_final: the plugin's caps have DDP_CAP_OWNS_OPTIMIZER: it "
            "orders its own optimizer step (run_optimizer)");
}

// Claimed values (ABI 1.5): bound to the strategy's own copy for the whole
// run, the model reads them there and the optimizer steps them there, so
// the run trains as without the claim, loss for loss (the second step's
// loss reads the first step's update).
TEST(ClaimedValues, BoundToTheStrategysMemoryTheRunTrainsAsWithoutTheClaim) {
  const auto plain = run_one_rank("toy", "recorder").at("loss");
  const auto claimed = run_one_rank("toy", "claims_values", "", "what = \"values\"\n").at("loss");
  ASSERT_EQ(plain.size(), 2u);
  EXPECT_EQ(claimed, plain);
  EXPECT_NE(plain[0], plain[1]);  // the step changed the weights
}

// Bound only while each unit computes (FSDP's pattern), the whole model is
// read unit by unit through unit_values: the replica check, the snapshots
// and weights.safetensors see what the unclaimed run's do, bit for bit.
TEST(ClaimedValues, BoundUnitByUnitTheWholeModelIsReadThroughUnitValues) {
  for (const std::string model : {"toy", "toy_tied"}) {
    Snapshots plain_snapshots, claimed_snapshots;
    const auto plain = run_one_rank(model, "recorder", "", "", &plain_snapshots);
    const auto claimed =
        run_one_rank(model, "claims_values", "", "what = \"values_per_unit\"\n", &claimed_snapshots);
    EXPECT_EQ(claimed.at("loss"), plain.at("loss")) << model;
    ASSERT_EQ(claimed_snapshots.at.size(), 4u) << model;  // before set-up, after it, after steps 1 and 2
    EXPECT_EQ(claimed_snapshots.at, plain_snapshots.at) << model;
    EXPECT_NE(plain_snapshots.at.at(0), plain_snapshots.at.at(2)) << model;
    EXPECT_EQ(claimed.at("weights_file"), plain.at("weights_file")) << model;
    EXPECT_GT(plain.at("weights_file").get<std::string>().size(), 100u) << model;
  }
}

// Taken unit by unit (ABI 1.7's take_values): the engine lends each unit's
// values in turn and never holds the claimed ones whole. Bound for the
// whole run (the binding made in on_train_begin, before the values came,
// survives the lending), bound per unit, or with only the trainable ones
// claimed (the engine makes the others after create), the run trains as
// the unclaimed one does, snapshot for snapshot (the first: each rank's
// own initial values, read where the engine would make them).
TEST(ClaimedValues, TakenUnitByUnitTheRunTrainsAsWithoutTheClaim) {
  for (const std::string model : {"toy", "toy_tied"}) {
    Snapshots plain_snapshots;
    const auto plain = run_one_rank(model, "recorder", "", "", &plain_snapshots);
    for (const std::string what : {"values", "values_per_unit", "values_trainable"}) {
      Snapshots taken_snapshots;
      const auto taken = run_one_rank(model, "claims_takes", "", "what = \"" + what + "\"\n", &taken_snapshots);
      EXPECT_EQ(taken.at("loss"), plain.at("loss")) << model << " " << what;
      ASSERT_EQ(taken_snapshots.at.size(), 4u) << model << " " << what;
      EXPECT_EQ(taken_snapshots.at, plain_snapshots.at) << model << " " << what;
      EXPECT_EQ(taken.at("weights_file"), plain.at("weights_file")) << model << " " << what;
    }
  }
}

TEST(ClaimedValues, ATakeThatFailsStopsTheRunNamingTheEntryAndTheUnit) {
  EXPECT_EQ(claim_failure("claims_takes", "take_fails"),
            "strategy plugin 'claims_takes': take_values(fc2): the test strategy fails here on purpose");
}

TEST(ClaimedValues, AValueLeftUnboundStopsForwardNamingItAndItsUnit) {
  EXPECT_EQ(claim_failure("claims_values", "values_unbound"),
            "the model read the values of 'fc1.weight', which the strategy claimed and bound none to: bind them "
            "(ddp_host::bind, DDP_STORAGE_DATA) at the latest in on_unit(FORWARD_BEGIN or BACKWARD_BEGIN) of each "
            "unit that reads them (unit 'fc1' owns them)");
}

TEST(ClaimedValues, OnlyInCreateAndReadWholeOnlyWhereBound) {
  EXPECT_EQ(claim_failure("claims_values", "values_late"),
            "strategy plugin 'claims_values': on_train_begin: claim: parameter values (DDP_STORAGE_DATA) only in "
            "create, while the engine still holds them all");
  EXPECT_EQ(claim_failure("claims_values", "values_released"),
            "the replica check reads the values of "
            "'no_grad_fixed_param', which the strategy claimed and did not bind in unit_values(unit 'fc1', 1)");
}

// Backward never writes where the strategy did not say: a claimed gradient
// left unbound stops the step, naming the parameter and its unit.
TEST(ClaimedGradients, AGradientLeftUnboundStopsBackwardNamingIt) {
  const std::string failure = claim_failure("claims", "unbound");
  EXPECT_EQ(failure, "backward reached the gradient of 'fc3.weight', whose storage the strategy claimed and bound none "
                     "to: bind it (ddp_host::bind) at the latest in on_unit(BACKWARD_BEGIN) of unit 'fc3' or of a "
                     "unit that reads it before");
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
