// powersgd_test.cpp — the `powersgd` strategy's state across checkpoints,
// through the real engine on forked ranks (tests/harness.h):
//  - resuming on the same world size gives the uninterrupted run's losses
//    and weights bit for bit, with SGD + momentum and with AdamW, under
//    gradient accumulation, from a checkpoint before an unfreeze (which
//    lays the matrices out again and draws the new one's Q) and after it;
//    on toy and on mlp (whose biases travel uncompressed);
//  - across a world-size change (2 → 4 ranks) every Q is taken up bit for
//    bit from the checkpoint (written once, by rank 0) while each rank's
//    error starts afresh at zero;
//  - on a CUDA run (gloo, the GPU shared; skipped without one) the same
//    bytes as on the CPU and weights within float rounding of it.
// The pure layout: powersgd_layout_test.cpp; the bytes and the plan:
// powersgd_bytes_test.py; against PyTorch's hook: powersgd_torch_test.py.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#if DDP_WITH_CUDA
#include "gpu.h"
#endif
#include "../strategies/powersgd/layout.h"
#include "harness.h"
#include "process.h"

namespace ddp {
namespace {

using harness::RunResult;

const std::string kFixtures = std::string(DDP_TEST_DATA_DIR) + "/fixtures/";
const std::string kSgd = "[optimizer]\nname = \"sgd\"\nlr = 0.1\nmomentum = 0.9\n";
const std::string kAdamW = "[optimizer]\nname = \"adamw\"\nlr = 0.05\nweight_decay = 0.1\n";

// Six steps of toy from the fixture's weights, two micro-batches a step,
// fc1 frozen until step 3; PowerSGD at rank 2 from step 1 (step 0 plain).
std::string toy(const std::string& optimizer, const std::string& device = "cpu") {
  std::string t = "[run]\nsteps = 6\nseed = 7\ntimeout_s = 30\ngrad_accum_steps = 2\n";
  if (device != "cpu") t += "device = \"" + device + "\"\nshare_gpus = true\n";
  return t + "[model]\nname = \"toy\"\ninit_from = \"" + kFixtures +
         "toy_init.safetensors\"\nfreeze = [\"fc1.*\"]\n"
         "[[schedule.unfreeze]]\nstep = 3\nparams = \"fc1.*\"\n"
         "[data]\npath = \"" + kFixtures + "toy_data.safetensors\"\nbatch_size = 20\n" +
         optimizer + "[transport]\nplugin = \"gloo\"\n[strategy]\nplugin = \"powersgd\"\nrank = 2\nstart_step = 1\n";
}

// mlp 32 × 2 learning a teacher (random data), its biases 1-D.
std::string mlp(const std::string& optimizer) {
  return "[run]\nsteps = 6\nseed = 7\ntimeout_s = 30\n[model]\nname = \"mlp\"\nwidth = 32\ndepth = 2\nclasses = 4\n"
         "[data]\nkind = \"random\"\nteacher = true\nbatch_size = 16\n" + optimizer +
         "[transport]\nplugin = \"gloo\"\n[strategy]\nplugin = \"powersgd\"\nrank = 2\n";
}

std::vector<std::string> checkpointing(const std::string& dir) {
  return {"checkpoint.every=2", "checkpoint.keep=5", "checkpoint.dir=\"" + dir + "\""};
}

RunResult run_ok(const std::string& config, int world, const std::vector<std::string>& sets = {},
                 const std::string& resume = "") {
  RunResult r = harness::run(config, world, sets, resume);
  for (const auto& f : r.failures) ADD_FAILURE() << f;
  return r;
}

void expect_same_weights(const RunResult& a, const RunResult& b, const std::string& what) {
  ASSERT_FALSE(a.final_weights.empty()) << what;
  ASSERT_EQ(a.final_weights.size(), b.final_weights.size()) << what;
  for (const auto& [name, t] : a.final_weights) {
    const auto it = b.final_weights.find(name);
    ASSERT_NE(it, b.final_weights.end()) << what << ": " << name;
    EXPECT_TRUE(t.bytes == it->second.bytes) << what << ": parameter " << name << " differs";
  }
}

// The tensors of rank r's strategy state in checkpoint `step_dir`.
std::map<std::string, HostTensor> state_of(const std::string& step_dir, int r) {
  return read_safetensors(step_dir + "/strategy-" + std::to_string(r) + ".safetensors");
}

TEST(PowerSgdResume, SameWorldIsTheUninterruptedRunBitForBit) {
  struct Case {
    std::string what, config;
    std::vector<const char*> from;
  };
  const std::vector<Case> cases = {
      {"toy, SGD + momentum", toy(kSgd), {"step-00000002", "step-00000004"}},
      {"toy, AdamW", toy(kAdamW), {"step-00000002", "step-00000004"}},
      {"mlp, AdamW", mlp(kAdamW), {"step-00000004"}},
  };
  for (const Case& c : cases) {
    harness::TempDir dir("ddp-powersgd-test");
    const RunResult whole = run_ok(c.config, 2);
    const RunResult writing = run_ok(c.config, 2, checkpointing(dir.path));
    expect_same_weights(whole, writing, c.what + ": writing checkpoints changed the run");
    ASSERT_EQ(writing.summary["strategy_stats"]["compressed_steps"], c.config.find("toy") != std::string::npos ? 5 : 6);
    for (const char* from : c.from) {
      const RunResult resumed = run_ok(c.config, 2, checkpointing(dir.path), dir.path + "/" + from);
      expect_same_weights(whole, resumed, c.what + ": resumed from " + from);
      EXPECT_EQ(resumed.summary["loss"], whole.summary["loss"]) << c.what << ": resumed from " << from;
    }
    // Other initial Qs make another run: a resume that lost them could not pass the check above.
    const RunResult fresh = run_ok(c.config + "seed = 1\n", 2);
    bool differs = false;
    for (const auto& [name, t] : whole.final_weights) differs |= t.bytes != fresh.final_weights.at(name).bytes;
    EXPECT_TRUE(differs) << c.what << ": another seed of the initial Qs changed nothing";
  }
}

// The checkpoint holds every matrix's Q once (rank 0's file) and each
// rank's error in its own; a resume on 4 ranks takes up the Qs bit for bit
// (uncompressed steps after it leave them as they were), and its errors
// start at zero.
TEST(PowerSgdResume, AnotherWorldSizeKeepsEveryQBitForBit) {
  harness::TempDir dir("ddp-powersgd-test");
  const std::string config = mlp(kAdamW);
  run_ok(config, 2, checkpointing(dir.path));
  const std::string step2 = dir.path + "/step-00000002";
  const auto rank0 = state_of(step2, 0), rank1 = state_of(step2, 1);
  std::vector<std::string> qs;
  for (const auto& [name, t] : rank0)
    if (name.size() > 2 && name.compare(name.size() - 2, 2, ".q") == 0) qs.push_back(name);
  ASSERT_EQ(qs.size(), 3u);  // layers.0.weight, layers.1.weight, head.weight
  for (const std::string& q : qs) {
    EXPECT_EQ(rank1.count(q), 0u) << q << ": an equal buffer is written once";
    const std::string param = q.substr(0, q.size() - 2);
    ASSERT_EQ(rank0.count(param + ".error"), 1u) << param;
    ASSERT_EQ(rank1.count(param + ".error"), 1u) << param;
    EXPECT_NE(rank0.at(param + ".error").bytes, rank1.at(param + ".error").bytes) << param << ": errors are per rank";
    // Two compressed steps moved Q away from its draw.
    const std::vector<float> got = rank0.at(q).as_floats("strategy-0", q);
    std::vector<float> drawn(got.size());
    powersgd::initial_q(0, param, drawn.data(), drawn.size());
    EXPECT_NE(got, drawn) << q;
  }
  std::vector<std::string> sets = checkpointing(dir.path);
  sets.push_back("strategy.start_step=100");  // steps 2 and 3 uncompressed: Q untouched
  const RunResult four = run_ok(config, 4, sets, step2);
  EXPECT_EQ(four.summary["strategy_stats"]["compressed_steps"], 0);
  const std::string step4 = dir.path + "/step-00000004";
  const auto after = state_of(step4, 0);
  for (const std::string& q : qs) {
    ASSERT_EQ(after.count(q), 1u) << q;
    EXPECT_TRUE(after.at(q).bytes == rank0.at(q).bytes) << q << " was not taken up bit for bit on 4 ranks";
  }
  for (int r = 0; r < 4; ++r)
    for (const auto& [name, t] : state_of(step4, r)) {
      if (name.size() < 6 || name.compare(name.size() - 6, 6, ".error") != 0) continue;
      for (const float e : t.as_floats("strategy", name)) ASSERT_EQ(e, 0.0f) << "rank " << r << ", " << name;
    }
}

// Through `ddp run`, as a user meets it: resumed on 4 ranks from a
// checkpoint of 2, rank 0 says which state starts afresh and why (the
// per-rank errors, held for 2 ranks), and nothing of Q.
TEST(PowerSgdResume, AnotherWorldSizeSaysWhichStateStartsAfresh) {
  harness::TempDir dir("ddp-powersgd-resume");
  const std::string config = dir.path + "/run.toml";
  std::ofstream(config) << mlp(kSgd);
  const auto run = [&](int world, const std::string& resume) {
    std::vector<std::string> args = {"run", config, "--set", "run.world_size=" + std::to_string(world), "--set",
                                     "run.output_dir=\"" + dir.path + "/out" + std::to_string(world) + "\""};
    for (const std::string& kv : checkpointing(dir.path + "/ckpt")) args.insert(args.end(), {"--set", kv});
    if (!resume.empty()) args.insert(args.end(), {"--resume", resume});
    Process p = start(args, {}, dir.path + "/ddp" + std::to_string(world));
    EXPECT_EQ(wait_for(p, std::chrono::seconds(120)), 0) << read_file(p.err);
    return read_file(p.out);
  };
  run(2, "");
  const std::string out = run(4, dir.path + "/ckpt/step-00000002");
  EXPECT_NE(out.find("  strategy plugin 'powersgd' starts its per-rank state afresh ('head.weight.error' and more): "
                     "the checkpoint holds it for 2 ranks, this run has 4\n"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find(".q'"), std::string::npos) << "Q is taken up on any world size: " << out;
}

#if DDP_WITH_CUDA
// The same toy run on a GPU (cuBLAS and the engine's kernels behind the
// compute entries; gloo, both ranks on one GPU): the same bytes every step
// and the CPU's weights within float rounding.
TEST(PowerSgdCuda, TheCpuRunWithinRoundingAndTheSameBytes) {
  DDP_REQUIRE_GPUS(1);
  const RunResult cpu = run_ok(toy(kSgd), 2);
  const RunResult gpu = run_ok(toy(kSgd, "cuda"), 2);
  ASSERT_FALSE(gpu.final_weights.empty());
  EXPECT_EQ(gpu.summary["comm_bytes"], cpu.summary["comm_bytes"]);
  EXPECT_EQ(gpu.summary["strategy_stats"]["bytes_per_step"], cpu.summary["strategy_stats"]["bytes_per_step"]);
  for (const auto& [name, t] : cpu.final_weights)
    EXPECT_LE(harness::max_abs_diff(t.as_floats("cpu", name), gpu.final_weights.at(name).as_floats("gpu", name)),
              1e-5f)
        << name;
}
#endif

}  // namespace
}  // namespace ddp
