// conformance_test.cpp — the conformance suite every strategy plugin must
// pass: the DDP correctness protocol of docs/models.md on `toy` and
// `toy_tied`, world sizes 1 to 4 (3 where the batch allows), each rank a forked process over the real
// transport, in these scenarios:
//   sgd, adamw              vs the single-process engine (world 1, naive)
//   pytorch_sgd/adamw/momentum/accum/clip/cosine   vs PyTorch-computed
//                           weights (and the lr and gradient norm per step)
//                           (tests/fixtures/make_toy_fixtures.py)
//   unfreeze_sgd/adamw      a frozen parameter made trainable at step 2,
//                           with an optimizer parameter group
//   accum_adamw             gradient accumulation (2 micro-batches)
//   unfreeze_unused         every frozen parameter unfrozen, one never used
//   unfreeze_large          the largest parameter frozen at start, joins at step 2
// and in all of them: no collective before the sync micro-batch (but for a
// strategy that claims gradient storage, which reduces each), no growing
// communication buffers, no device allocation once settled, no collective
// after the first step larger than any before it (what a GPU run's staging
// transport allocates for: caught on the CPU too), the same collective
// sequence on every rank.
// A strategy whose replicas may differ between sync points
// (DDP_CAP_DIVERGENT) is checked in the divergent mode: ranks bitwise equal
// only after the steps its summary.json says were sync points, every
// collective compared across ranks before it runs (run.debug_collectives),
// and parity with the reference only where every step was a sync point;
// the other invariants as ever.
// Every scenario checks: ranks differ before set-up (own seeds) and hold
// rank 0's weights after it; after every step ranks are bitwise equal and
// within tolerance (1e-6 SGD, 1e-5 AdamW) of the reference; frozen
// parameters never change; the reported loss is the reference's; rank 0's
// weights.safetensors holds the final weights.
//
// Usage: ddp-conformance [OPTIONS] [GoogleTest flags]   (built as
// conformance_test, installed as bin/ddp-conformance; --help lists them)
// e.g.   ddp-conformance --strategy /path/libddp_strategy_mine.so
//        ddp-conformance --strategy bucketed --strategy-key bucket_mb=0.001
//        ddp-conformance --strategy mine.so --tolerance 1e-3     (a lossy strategy)
//        ddp-conformance --device cuda --transport nccl   (GPU builds; skipped
//                         without a GPU; with nccl, worlds above the GPU count
//                         skip; with gloo, ranks share the GPUs)
// Each case's failures say which kind they are: "[invariant]" (checked
// exactly, whatever the tolerance) or "[parity]" (against the reference,
// within the tolerance: the scenario's, or --tolerance where the author
// declares one; one line per case, the worst difference). The last line is
// the verdict.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

#if DDP_WITH_CUDA
#include "gpu.h"
#endif
#include "conformance_options.h"
#include "bucket_layout.h"
#include "harness.h"
#include "reference_cache.h"
#include "config_plan.h"
#include "plugin_plan.h"
#include "plugin_loader.h"

namespace ddp {
namespace {

using harness::max_abs_diff;
using harness::RunResult;

ConformanceOptions g_options;

const std::string kFixtures = conformance_data_dir(DDP_TEST_DATA_DIR "/fixtures") + "/";
constexpr int kSteps = 5;

struct Scenario {
  std::string name;
  std::vector<std::string> models;
  std::string optimizer;        // body of [optimizer]
  std::string run_extra;        // more [run] keys
  std::string tail;             // more tables ([[optimizer.groups]], [[schedule.unfreeze]])
  int64_t batch = 20;
  float tolerance = 1e-6f;
  std::string fixture;          // "<model>" is replaced; empty: the engine is the reference
  std::string unfrozen;         // parameter made trainable at step 2
  std::string frozen = "";      // parameter frozen from the start (model.freeze)
};

const std::string kGroups = "[[optimizer.groups]]\nparams = \"fc1.*\"\nlr = 0.05\n";
const std::string kUnfreeze = "[[schedule.unfreeze]]\nstep = 2\nparams = \"fc2.fc.bias\"\n";
const std::string kAdamW = "name = \"adamw\"\nlr = 0.1\nweight_decay = 0.1\n";

// Scenarios checked against the engine itself use batches of 24 (12 with
// accumulation) so that 3 ranks divide them; the PyTorch fixtures were made
// with 20 rows (10 per micro-batch). AdamW on `toy_tied` stays on the spec's
// 20 rows: its gradients are tiny, and AdamW's normalisation turns float32
// rounding of other batches into differences just above 1e-5. A scenario
// runs on every world of 1 to 4 that divides its batch (worlds_of); the
// plugin says which it runs on (--worlds, its plan entry).
const std::vector<Scenario> kScenarios = {
    {"sgd", {"toy", "toy_tied"}, "lr = 0.1\n", "", "", 24, 1e-6f, "", ""},
    {"adamw", {"toy"}, kAdamW, "", "", 24, 1e-5f, "", ""},
    {"adamw", {"toy_tied"}, kAdamW, "", "", 20, 1e-5f, "", ""},
    {"pytorch_sgd", {"toy", "toy_tied"}, "lr = 0.1\n", "", "", 20, 1e-6f, "<model>_sgd_expected", ""},
    {"pytorch_adamw", {"toy", "toy_tied"}, kAdamW, "", "", 20, 1e-5f, "<model>_adamw_expected", ""},
    {"pytorch_momentum", {"toy"}, "lr = 0.1\nmomentum = 0.9\n", "", "", 20, 1e-6f,
     "toy_sgd_momentum_expected", ""},
    {"pytorch_accum", {"toy"}, "lr = 0.1\n", "grad_accum_steps = 2\n", "", 10, 1e-6f, "toy_accum_expected", ""},
    {"pytorch_clip", {"toy", "toy_tied"}, kAdamW + "clip_grad_norm = 0.05\n", "", "", 20, 1e-5f,
     "<model>_clip_adamw_expected", ""},
    {"pytorch_cosine", {"toy"}, "lr = 0.1\nmomentum = 0.9\n", "",
     "[schedule]\nlr = \"cosine\"\nwarmup_steps = 1\ncosine_steps = 3\nmin_lr = 0.01\n", 20, 1e-6f,
     "toy_cosine_momentum_expected", ""},
    {"unfreeze_sgd", {"toy"}, "lr = 0.1\n", "", kGroups + kUnfreeze, 24, 1e-6f, "", "fc2.fc.bias"},
    {"unfreeze_adamw", {"toy"}, kAdamW, "", kGroups + kUnfreeze, 24, 1e-5f, "", "fc2.fc.bias"},
    // The largest parameter starts frozen and joins at step 2: a strategy
    // that re-partitions must keep existing owners (their optimizer state).
    {"unfreeze_large", {"toy"}, kAdamW, "",
     "[[schedule.unfreeze]]\nstep = 2\nparams = \"fc2.fc.weight\"\n", 24, 1e-5f, "", "fc2.fc.weight",
     "fc2.fc.weight"},
    {"accum_adamw", {"toy_tied"}, kAdamW, "grad_accum_steps = 2\n", "", 8, 1e-5f, "", ""},
    {"accum_sgd", {"toy", "toy_tied"}, "lr = 0.1\n", "grad_accum_steps = 2\n", "", 12, 1e-6f, "", ""},
    // Everything frozen becomes trainable at step 2, including a parameter
    // the model never uses (its gradient never fires; it must not move).
    {"unfreeze_unused", {"toy"}, kAdamW, "grad_accum_steps = 2\n",
     "[[schedule.unfreeze]]\nstep = 2\nparams = \"*\"\n", 12, 1e-5f, "", "fc2.fc.bias"},
};

std::string replace_model(std::string s, const std::string& model) {
  auto at = s.find("<model>");
  return at == std::string::npos ? s : s.replace(at, 7, model);
}

// The whole TOML document of a run; `strategy` overrides the plugin,
// `transport` the transport (empty: --transport's). --strategy-key values
// are --set overrides of the run under test (harness::run).
// `reference`: the single-process engine's, whose [precision] has no
// reduce (ConformanceOptions::precision_table).
std::string toml_for(const Scenario& sc, const std::string& model, const std::string& strategy,
                     std::string transport = "", bool reference = false) {
  if (transport.empty()) transport = g_options.transport;
  std::string t = "[run]\nsteps = " + std::to_string(kSteps) + "\nseed = 7\ntimeout_s = 30\n" + sc.run_extra;
  if (g_options.device != "cpu") {
    t += "device = \"" + g_options.device + "\"\n";
    if (g_options.transport == "gloo") t += "share_gpus = true\n";  // world 2 on one GPU
  }
  t += "[model]\nname = \"" + model + "\"\n";
  if (!sc.frozen.empty()) t += "freeze = [\"" + sc.frozen + "\"]\n";
  if (!sc.fixture.empty()) t += "init_from = \"" + kFixtures + model + "_init.safetensors\"\n";
  t += "[data]\npath = \"" + kFixtures + "toy_data.safetensors\"\nbatch_size = " + std::to_string(sc.batch) + "\n";
  t += "[optimizer]\n" + sc.optimizer;
  t += "[transport]\nplugin = \"" + transport + "\"\n";
  t += "[strategy]\nplugin = \"" + strategy + "\"\n";
  return t + g_options.precision_table(/*reference=*/reference) + sc.tail;
}

// The single-process engine: world 1, naive, same configuration, forked
// (under mpirun too: each rank computes it). A transport whose ranks only a
// launcher starts (mpi) cannot run a forked world; on one rank every
// transport leaves the gradients as they are, so gloo stands in for it.
// Kept in this process, and where $DDP_CONFORMANCE_REFERENCE_CACHE names a
// directory (as the build's ctest does) in a file there, for the other
// cases' processes (reference_cache.h). A run that failed is not kept.
struct EngineReference {
  std::vector<std::string> failures;  // "rank r: message"
  reference_cache::Reference ref;
};
std::string g_reference_cache;  // the directory; "": none

EngineReference compute_reference(const std::string& toml) {
  if (!g_reference_cache.empty())
    if (std::optional<reference_cache::Reference> ref = reference_cache::load(g_reference_cache, toml))
      return {{}, std::move(*ref)};
  RunResult run = harness::run(toml, 1, {}, "", harness::Ranks::kForked);
  EngineReference out{run.failures, {}};
  if (!out.failures.empty()) return out;
  out.ref.weights = std::move(run.ranks.at(0));
  for (const auto& l : run.summary["loss"]) out.ref.loss.push_back(l.get<double>());
  if (!g_reference_cache.empty()) reference_cache::store(g_reference_cache, toml, out.ref);
  return out;
}

const EngineReference& engine_reference(const Scenario& sc, const std::string& model) {
  static std::map<std::string, EngineReference> cache;
  const std::string transport = g_options.transport == "mpi" ? "gloo" : g_options.transport;
  const std::string toml = toml_for(sc, model, "naive", transport, /*reference=*/true);
  auto it = cache.find(toml);
  if (it == cache.end()) it = cache.emplace(toml, compute_reference(toml)).first;
  return it->second;
}

struct Case {
  const Scenario* scenario;
  std::string model;
  int world;
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.scenario->name << ": " << c.model << " on " << c.world << " ranks";
}

// The worlds of 1 to 4 whose ranks share `batch` rows evenly (a micro-
// batch's rows split by rank): where the scenario runs. Pure.
std::vector<int> worlds_of(int64_t batch) {
  std::vector<int> out;
  for (int world = 1; world <= 4; ++world)
    if (batch % world == 0) out.push_back(world);
  return out;
}

std::vector<Case> all_cases() {
  std::vector<Case> out;
  for (const Scenario& sc : kScenarios)
    for (const auto& model : sc.models)
      for (int world : worlds_of(sc.batch)) out.push_back({&sc, model, world});
  return out;
}

// Why the strategy under test does not run a case on `world` ranks ("" if
// it does): not among the worlds it declared (--worlds), or its plan entry
// refuses the case with DDP_ERR_UNSUPPORTED (its own words).
std::string not_run_because(const std::string& toml, int world) {
  const auto& worlds = g_options.worlds;
  if (std::find(worlds.begin(), worlds.end(), world) == worlds.end())
    return "the strategy runs on other worlds (--worlds)";
  harness::TempDir dir("ddp-conformance-plan");
  std::ofstream(dir.path + "/case.toml") << toml;
  std::vector<std::string> sets = g_options.strategy_sets();
  sets.push_back("run.world_size=" + std::to_string(world));
  try {  // the strategy's plan entry alone, for rank 0, on the model's table and units
    const Config config = load_config(dir.path + "/case.toml", sets);
    CpuDevice device;
    DataShape shape;
    const std::unique_ptr<Model> model = build_model(config.model.name, config.model.options, device, 0, &shape);
    Footprint footprint;
    for (const Parameter& p : model->params()) footprint.params.push_back({p.name, int64_t(numel_of(p.shape)), p.shape});
    footprint.units = model->units();
    plan::PlanRun run = plan_run_of(config);  // (world_size is set above)
    run.model = &footprint;
    run.device = g_options.device == "cuda" ? DDP_DEVICE_CUDA : DDP_DEVICE_CPU;
    const auto strategy = load_plugin(PluginKind::Strategy, config.strategy_plugin);
    const auto transport = load_plugin(PluginKind::Transport, config.transport_plugin);
    plan::plan_strategy(*strategy->strategy(), *transport->transport(), config.strategy, run, 0);
  } catch (const Error& e) {
    if (e.status() == DDP_ERR_UNSUPPORTED) return std::string("its plan entry refuses it: ") + e.what();
  } catch (const std::exception&) {  // not the plugin's word on the world: the run says what is wrong
  }
  return "";
}

// The case as a command a user reruns, printed where it fails: its whole
// TOML document and `ddp run` with the world and the strategy's keys.
std::string rerun_command(const std::string& toml, int world) {
  std::string command = "ddp run case.toml --set run.world_size=" + std::to_string(world);
  for (const std::string& kv : g_options.strategy_sets()) command += " --set '" + kv + "'";
  return "[case] to rerun it, save this as case.toml:\n" + toml + "\nand run: " + command + "\n";
}

class Conformance : public testing::TestWithParam<Case> {};

// What the reference holds: weights after step s of parameter p, losses,
// and the fixture's other columns where it has them.
struct Reference {
  std::function<std::vector<float>(int, size_t)> weights;
  std::vector<double> loss;
  std::shared_ptr<const std::map<std::string, HostTensor>> fixture;  // shared with `weights`; null: none
  std::string name;  // "the single-process engine" or the fixture file
};

// Under --precision the single-process engine under the same [precision]
// is the reference of every scenario: the PyTorch fixtures are float32's
// (the engine's 16-bit products against PyTorch's: golden_test).
Reference reference_of(const Scenario& sc, const std::string& model, const RunResult& ddp) {
  Reference ref;
  if (sc.fixture.empty() || !g_options.precision_keys.empty()) {
    const EngineReference& run = engine_reference(sc, model);
    if (!run.failures.empty())
      throw std::runtime_error("the reference run (the single-process engine: naive, 1 rank) failed: " +
                               run.failures[0]);
    ref.weights = [&run](int s, size_t p) { return run.ref.weights.at(s)[p]; };
    ref.loss = run.ref.loss;
    ref.name = "the single-process engine";
    return ref;
  }
  ref.name = replace_model(sc.fixture, model) + ".safetensors";
  const auto fixture = std::make_shared<const std::map<std::string, HostTensor>>(read_safetensors(kFixtures + ref.name));
  ref.fixture = fixture;
  const std::string file = ref.name;
  ref.weights = [fixture, file, &ddp](int s, size_t p) {
    const std::string key = "step" + std::to_string(s) + "/" + ddp.names[p];
    return fixture->at(key).as_floats(file, key);
  };
  for (float l : fixture->at("loss").as_floats(ref.name, "loss")) ref.loss.push_back(l);
  return ref;
}

// The caps of the strategy under test, as the loader reads its descriptor.
uint64_t strategy_caps() {
  static const uint64_t caps = [] {
    const std::unique_ptr<LoadedPlugin> plugin = load_plugin(PluginKind::Strategy, g_options.strategy);
    return plugin->strategy()->caps;
  }();
  return caps;
}
// Whether it may claim gradient storage (DDP_CAP_OWNS_GRADIENTS).
bool strategy_claims_gradients() { return (strategy_caps() & DDP_CAP_OWNS_GRADIENTS) != 0; }
// Whether its replicas may differ between sync points (DDP_CAP_DIVERGENT):
// the divergent mode.
bool strategy_divergent() { return (strategy_caps() & DDP_CAP_DIVERGENT) != 0; }

// Whether every rank holds the same parameters after `step` (0: set-up):
// every step but under a divergent strategy, whose summary says.
bool synced_after(const RunResult& ddp, int64_t step) {
  return step == 0 || !strategy_divergent() || ddp.summary["synced"][size_t(step - 1)].get<bool>();
}

// What must hold exactly, whatever the tolerance: each rank starts from its
// own seed and holds rank 0's weights after set-up; ranks are bitwise equal
// after every step; frozen parameters never change; communication only on
// the micro-batch with sync_grads; buffers that do not grow; no device
// allocation once settled; the same collectives on every rank; rank 0's
// weights.safetensors holds its final weights.
void check_invariants(const Case& c, const RunResult& ddp) {
  const Scenario& sc = *c.scenario;
  const harness::Weights& init0 = ddp.ranks[0].at(-1);
  if (sc.fixture.empty())
    for (int r = 1; r < c.world; ++r) {
      bool differs = false;
      for (size_t p = 0; p < init0.size(); ++p) differs |= ddp.ranks[r].at(-1)[p] != init0[p];
      EXPECT_TRUE(differs) << "[invariant] rank " << r << " started with rank 0's weights";
    }
  if (strategy_divergent()) {  // a strategy that never synced would pass every check below
    bool any = false;
    for (int64_t step = 1; step <= kSteps; ++step) any = any || synced_after(ddp, step);
    EXPECT_TRUE(any) << "[invariant] no step of " << kSteps << " was a sync point (summary.json's synced): test the "
                     << "strategy with keys under which one is";
  }
  CpuDevice device;
  auto model = make_model(c.model, device, 0);
  for (int64_t step = 0; step <= kSteps; ++step)
    for (size_t p = 0; p < init0.size(); ++p) {
      const std::string& name = ddp.names[p];
      const std::string where = "[invariant] step " + std::to_string(step) + ", " + name;
      const std::vector<float>& w0 = ddp.ranks[0].at(step)[p];
      if (step == 0) {
        EXPECT_EQ(w0, init0[p]) << where << ": rank 0's weights changed in set-up";
      }
      for (int r = 1; r < c.world && synced_after(ddp, step); ++r)
        EXPECT_EQ(ddp.ranks[r].at(step)[p], w0) << where << ", rank " << r << ": not bitwise equal to rank 0"
                                                << (strategy_divergent() ? " at a sync point" : "");
      const bool frozen = (!model->params()[p].trainable || name == sc.frozen) && !(name == sc.unfrozen && step > 2);
      if (frozen) {
        EXPECT_EQ(w0, ddp.ranks[0].at(0)[p]) << where << ": a frozen parameter changed";
      }
    }
  if (!sc.unfrozen.empty()) {  // it did start training at step 2
    size_t p = std::find(ddp.names.begin(), ddp.names.end(), sc.unfrozen) - ddp.names.begin();
    EXPECT_NE(ddp.ranks[0].at(3)[p], ddp.ranks[0].at(2)[p]) << "[invariant] " << sc.unfrozen
                                                              << " did not train after unfreezing";
  }
  // A strategy that keeps a shard of the gradients only (claimed storage:
  // sharded stage 2) reduces every micro-batch's, as the ABI says.
  for (int s = 0; s < kSteps && !strategy_claims_gradients(); ++s)
    EXPECT_EQ(ddp.summary["collectives_before_sync_micro_batch"][s], 0)
        << "[invariant] step " << s + 1 << ": collectives issued on a micro-batch without sync_grads";
  const int settled = sc.unfrozen.empty() ? 0 : 2;  // buffers may change when parameters join
  for (int s = settled + 1; s < kSteps; ++s) {
    EXPECT_EQ(ddp.summary["comm_buffer_bytes"][s], ddp.summary["comm_buffer_bytes"][settled])
        << "[invariant] step " << s + 1 << ": communication buffers grew";
    EXPECT_EQ(ddp.summary["device_allocations"][s], 0) << "[invariant] step " << s + 1 << ": allocated device memory";
    // What a GPU run would allocate where the CPU's transports stage
    // nothing: a collective larger than any before (gloo on a GPU grows its
    // page-locked staging for it). Checked on every device.
    const int64_t largest = ddp.summary["largest_collective_bytes"][s];
    const int64_t before = ddp.summary["largest_collective_bytes"][settled];
    EXPECT_EQ(largest, before) << "[invariant] step " << s + 1 << ": a collective of " << largest
                               << " bytes, larger than any the strategy issued by the end of step " << settled + 1
                               << " (" << before << " bytes): a transport that stages collectives (gloo on a GPU) "
                               << "allocates for it there; issue the largest one at set-up or in the first step";
  }
  EXPECT_TRUE(ddp.summary["collective_sequences_agree"].get<bool>())
      << "[invariant] ranks issued different collective sequences: " << ddp.summary["ranks"].dump();
  for (size_t p = 0; p < ddp.names.size(); ++p) {
    ASSERT_TRUE(ddp.final_weights.count(ddp.names[p])) << "[invariant] " << ddp.names[p]
                                                       << " missing in weights.safetensors";
    EXPECT_EQ(ddp.final_weights.at(ddp.names[p]).as_floats("weights.safetensors", ddp.names[p]),
              ddp.ranks[0].at(kSteps)[p])
        << "[invariant] weights.safetensors does not hold rank 0's final " << ddp.names[p];
  }
}

// Against the reference, within `tolerance`: rank 0's weights after every
// step, the loss, and the lr and gradient norm where the fixture has them.
// One failure per case: the worst difference, where.
void check_parity(const RunResult& ddp, const Reference& ref, float tolerance) {
  float worst = 0;
  std::string at;
  for (int64_t step = 1; step <= kSteps; ++step)
    for (size_t p = 0; p < ddp.names.size(); ++p) {
      const float d = max_abs_diff(ddp.ranks[0].at(step)[p], ref.weights(int(step), p));
      if (!(d <= worst)) worst = d, at = "step " + std::to_string(step) + ", " + ddp.names[p];
    }
  EXPECT_LE(worst, tolerance) << "[parity] weights differ from " << ref.name << " by up to " << worst << " ("
                              << at << "); the tolerance is " << tolerance;
  ASSERT_EQ(ddp.summary["loss"].size(), ref.loss.size()) << "[parity] steps reported";
  double loss_worst = 0;
  for (size_t s = 0; s < ref.loss.size(); ++s)
    loss_worst = std::max(loss_worst, std::fabs(ddp.summary["loss"][s].get<double>() - ref.loss[s]));
  EXPECT_LE(loss_worst, std::max(1e-6, double(tolerance))) << "[parity] the loss differs from " << ref.name
                                                           << " by up to " << loss_worst;
  for (const char* column : {"lr", "grad_norm"}) {
    if (!ref.fixture || !ref.fixture->count(column)) continue;
    const std::vector<float> want = ref.fixture->at(column).as_floats(ref.name, column);
    for (size_t s = 0; s < want.size(); ++s)
      EXPECT_NEAR(ddp.summary[column][s].get<double>(), want[s],
                  std::max(1e-6 * std::max(1.0f, want[s]), double(tolerance)))
          << "[parity] " << column << " of step " << s + 1;
  }
}

TEST_P(Conformance, Protocol) {
  const Case& c = GetParam();
  const Scenario& sc = *c.scenario;
#if DDP_WITH_CUDA
  if (g_options.device == "cuda") {
    DDP_REQUIRE_GPUS(1);
    if (g_options.transport == "nccl" && c.world > test::gpus().count)
      GTEST_SKIP() << "nccl needs a GPU per rank: world " << c.world << ", " << test::gpus().count << " GPU(s)";
  }
#endif
  const std::string toml = toml_for(sc, c.model, g_options.strategy);
  if (const std::string why = not_run_because(toml, c.world); !why.empty())
    GTEST_SKIP() << "world " << c.world << ": " << why;
  struct OnFailure {  // whatever failed, the case as a command to rerun it
    const std::string& toml;
    int world;
    ~OnFailure() {
      if (testing::Test::HasFailure()) std::cout << rerun_command(toml, world);
    }
  } on_failure{toml, c.world};
  // Divergent: every collective compared across ranks before it runs
  // (run.debug_collectives), the invariant that binds them most.
  std::vector<std::string> sets = g_options.strategy_sets();
  if (strategy_divergent()) sets.push_back("run.debug_collectives=true");
  RunResult ddp = harness::run(toml, c.world, sets);
  for (const auto& f : ddp.failures) ADD_FAILURE() << "[run] the run under test (strategy " << g_options.strategy << ") failed: " << f;
  ASSERT_TRUE(ddp.failures.empty());
  ASSERT_EQ(ddp.ranks.size(), size_t(c.world));
  for (int r = 0; r < c.world; ++r) ASSERT_EQ(ddp.ranks[r].size(), size_t(kSteps + 2)) << "rank " << r;
  check_invariants(c, ddp);
  // Parity with DDP holds where the replicas were equal after every step.
  for (int64_t step = 1; step <= kSteps; ++step)
    if (!synced_after(ddp, step)) return;
  const bool adamw = sc.optimizer.find("\"adamw\"") != std::string::npos;
  check_parity(ddp, reference_of(sc, c.model, ddp), g_options.parity_tolerance(adamw ? "adamw" : "sgd", sc.tolerance));
}

// summary.json's grad_norm has the same bits whether the engine measures it
// before the update (clipping on: here at a bound no norm reaches, so
// nothing is scaled) or takes the squares AdamW's pass measured (off),
// under gradient accumulation, with a group and a parameter unfrozen at
// step 2, on every world its batch allows. The two runs must have had the
// same gradients: bit for bit where both laid out the same buckets at every
// step (always, but for bucket_mb = "auto" when start-up probes chose other
// caps: other summation orders, test::bucket_layouts_differ), else to
// float32 rounding. (Equal weights after a step do not tell: the squares
// may be summed in another order, e.g. per shard, while the weights round
// alike.)
class ConformanceGradNorm : public testing::TestWithParam<int> {};

const Scenario kGradNorm{"grad_norm", {"toy"}, kAdamW, "grad_accum_steps = 2\n", kGroups + kUnfreeze, 12, 1e-5f, "",
                         "fc2.fc.bias"};

TEST_P(ConformanceGradNorm, TheSameBitsWithAndWithoutClipping) {
  const int world = GetParam();
  if (g_options.device != "cpu") GTEST_SKIP() << "without clipping, grad_norm is recorded on CPU runs only";
  if (g_options.transport == "mpi") GTEST_SKIP() << "the mpi transport's worlds come from mpirun";
  Scenario sc = kGradNorm;
  const std::string plain = toml_for(sc, "toy", g_options.strategy);
  if (const std::string why = not_run_because(plain, world); !why.empty())
    GTEST_SKIP() << "world " << world << ": " << why;
  sc.optimizer += "clip_grad_norm = 1e30\n";
  const std::string clipped = toml_for(sc, "toy", g_options.strategy);
  const RunResult a = harness::run(plain, world, g_options.strategy_sets());
  const RunResult b = harness::run(clipped, world, g_options.strategy_sets());
  for (const auto& f : a.failures) ADD_FAILURE() << "[run] " << f;
  for (const auto& f : b.failures) ADD_FAILURE() << "[run, clipped] " << f;
  if (HasFailure()) std::cout << rerun_command(plain, world);
  ASSERT_TRUE(a.failures.empty() && b.failures.empty());
  ASSERT_EQ(a.summary["grad_norm"].size(), size_t(kSteps));
  ASSERT_EQ(b.summary["grad_norm"].size(), size_t(kSteps));
  const std::string differ = test::bucket_layouts_differ(a.summary["strategy_stats"], b.summary["strategy_stats"]);
  for (size_t s = 0; s < size_t(kSteps); ++s) {
    const double na = a.summary["grad_norm"][s].get<double>();
    const double nb = b.summary["grad_norm"][s].get<double>();
    if (differ.empty())
      EXPECT_EQ(na, nb) << "step " << s + 1 << " (the same bucket layout at every step)";
    else
      EXPECT_NEAR(na, nb, 1e-5 * na) << "step " << s + 1 << " (" << differ << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, ConformanceGradNorm, testing::ValuesIn(worlds_of(kGradNorm.batch)),
                         [](const testing::TestParamInfo<int>& info) {
                           return "world" + std::to_string(info.param);
                         });

INSTANTIATE_TEST_SUITE_P(Strategy, Conformance, testing::ValuesIn(all_cases()),
                         [](const testing::TestParamInfo<Case>& info) {
                           return info.param.scenario->name + "_" + info.param.model + "_world" +
                                  std::to_string(info.param.world);
                         });

}  // namespace
}  // namespace ddp

int main(int argc, char** argv) {
  ddp::ConformanceOptions& options = ddp::g_options;
  std::vector<std::string> gtest_args;
  const std::string error =
      ddp::parse_conformance_args(std::vector<std::string>(argv + 1, argv + argc), &options, &gtest_args);
  if (!error.empty()) {
    std::cerr << "ddp-conformance: error: " << error << std::endl;
    return 2;
  }
  if (options.help) {
    std::cout << ddp::kConformanceHelp;
    return 0;
  }
  if (const char* dir = std::getenv("DDP_CONFORMANCE_REFERENCE_CACHE"); dir && *dir) ddp::g_reference_cache = dir;
  std::vector<char*> rest = {argv[0]};
  for (std::string& a : gtest_args) rest.push_back(a.data());
  int n = static_cast<int>(rest.size());
  rest.push_back(nullptr);  // argv[argc] is null: gtest moves it along when it removes its flags
  testing::InitGoogleTest(&n, rest.data());
  std::string what = "strategy " + options.strategy;
  for (const auto& k : options.strategy_keys) what += (k == options.strategy_keys.front() ? " (" : ", ") + k;
  if (!options.strategy_keys.empty()) what += ")";
  what += ", transport " + options.transport + ", device " + options.device;
  if (const std::string t = options.declared_tolerance(); !t.empty()) what += ", parity tolerance " + t + " (declared)";
  std::cout << "conformance: " << what << std::endl;
  auto* verdict = new ddp::ConformanceVerdict(what);  // the listeners own it
  testing::UnitTest::GetInstance()->listeners().Append(verdict);
  const int status = RUN_ALL_TESTS();
  if (verdict->nothing_ran() && !testing::GTEST_FLAG(list_tests)) {
    std::cerr << "ddp-conformance: error: no case matched (check --gtest_filter)" << std::endl;
    return 1;
  }
  if (verdict->all_of_several_skipped()) {
    std::cerr << "ddp-conformance: error: every case skipped (the reasons above): nothing was checked" << std::endl;
    return 1;
  }
  return status;
}
