// eval_test.cpp — [eval], the held-out loss (config.h's EvalConfig),
// through the real engine, each rank a forked process (tests/harness.h):
//  - eval.holdout_rows sets the last rows of the data file aside: the run
//    equals, bit for bit, one that trains on a file of the other rows and
//    evaluates a file of those;
//  - under a divergent strategy a due evaluation runs at the next sync
//    point, and the end only where it is one;
//  - random data with data.teacher can be learnt: its held-out loss falls;
//  - what is refused, by name.
// Against PyTorch on lm-tiny: eval_torch_test.py.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "harness.h"
#include "safetensors.h"

namespace ddp {
namespace {

using harness::RunResult;
using nlohmann::json;

const std::string kData = std::string(DDP_TEST_DATA_DIR) + "/fixtures/toy_data.safetensors";

std::string toml(const std::string& data, const std::string& eval, const std::string& strategy = "naive",
                 int steps = 4) {
  return "[run]\nsteps = " + std::to_string(steps) + "\nseed = 7\ntimeout_s = 30\n[model]\nname = \"toy\"\n[data]\n" +
         data + "batch_size = 8\n[optimizer]\nlr = 0.1\nmomentum = 0.9\n[eval]\n" + eval +
         "[transport]\nplugin = \"gloo\"\n[strategy]\nplugin = \"" + strategy + "\"\n";
}

RunResult run_ok(const std::string& config, int world) {
  RunResult r = harness::run(config, world);
  for (const auto& f : r.failures) ADD_FAILURE() << f;
  return r;
}

// Rows [first, first + count) of the fixture's x and y, as a file.
void write_rows(const std::string& path, int64_t first, int64_t count) {
  const auto t = read_safetensors(kData);
  const std::vector<float> x = t.at("x").as_floats(kData, "x"), y = t.at("y").as_floats(kData, "y");
  const int64_t in = t.at("x").shape[1], out = t.at("y").shape[1];
  const std::vector<float> xs(x.begin() + first * in, x.begin() + (first + count) * in),
      ys(y.begin() + first * out, y.begin() + (first + count) * out);
  write_safetensors(path, {{"x", {count, in}, xs.data()}, {"y", {count, out}, ys.data()}});
}

TEST(Eval, HoldoutRowsAreTheLastRowsOfTheDataFile) {
  const int64_t rows = read_safetensors(kData).at("x").shape[0], held = 16;
  harness::TempDir dir;
  write_rows(dir.path + "/train.safetensors", 0, rows - held);
  write_rows(dir.path + "/held.safetensors", rows - held, held);
  const RunResult set_aside = run_ok(
      toml("path = \"" + kData + "\"\n", "every = 2\nbatches = 2\nholdout_rows = " + std::to_string(held) + "\n"), 2);
  const RunResult two_files = run_ok(toml("path = \"" + dir.path + "/train.safetensors\"\n",
                                          "every = 2\nbatches = 2\npath = \"" + dir.path + "/held.safetensors\"\n"),
                                     2);
  ASSERT_FALSE(set_aside.summary.is_null());
  ASSERT_FALSE(two_files.summary.is_null());
  EXPECT_EQ(set_aside.summary["loss"], two_files.summary["loss"]);
  EXPECT_EQ(set_aside.summary["eval"]["after_steps"], json({2, 4}));
  EXPECT_EQ(set_aside.summary["eval"]["val_loss"], two_files.summary["eval"]["val_loss"]);
  EXPECT_EQ(set_aside.summary["val_loss"][0], nullptr);
  EXPECT_TRUE(set_aside.summary["val_loss"][1].is_number());
  // A file whose name does not say what it holds: eval.kind does.
  std::filesystem::copy_file(dir.path + "/held.safetensors", dir.path + "/held.rows");
  const RunResult named_kind = run_ok(toml("path = \"" + dir.path + "/train.safetensors\"\n",
                                           "every = 2\nbatches = 2\nkind = \"safetensors\"\npath = \"" + dir.path +
                                               "/held.rows\"\n"),
                                      2);
  EXPECT_EQ(named_kind.summary["eval"]["val_loss"], two_files.summary["eval"]["val_loss"]);
  // Not the training rows: the file without a holdout trains on others.
  const RunResult all_rows = run_ok(toml("path = \"" + kData + "\"\n", "every = 0\n"), 2);
  EXPECT_NE(all_rows.summary["loss"], set_aside.summary["loss"]);
}

TEST(Eval, UnderADivergentStrategyRunsAtSyncPoints) {
  // Due after steps 2, 4, 6 and 8 (the last); diloco syncs after 3 and 6,
  // and after 8, which ends the run.
  const RunResult r = run_ok(toml("teacher = true\n", "every = 2\n", "diloco", 8) + "period = 3\n", 2);
  ASSERT_FALSE(r.summary.is_null());
  EXPECT_EQ(r.summary["eval"]["after_steps"], json({3, 6, 8}));
}

TEST(Eval, RandomDataWithATeacherIsLearnt) {
  // Measured: 0.668 → 0.476 taught, 1.238 → 1.088 on random targets.
  const RunResult taught = run_ok(toml("teacher = true\n", "every = 20\nbatches = 4\n", "naive", 40), 2);
  const RunResult untaught = run_ok(toml("", "every = 20\nbatches = 4\n", "naive", 40), 2);
  ASSERT_FALSE(taught.summary.is_null());
  ASSERT_FALSE(untaught.summary.is_null());
  const json& v = taught.summary["eval"]["val_loss"];
  ASSERT_EQ(v.size(), 2u);
  EXPECT_LT(v[1].get<double>(), 0.8 * v[0].get<double>()) << v;
  EXPECT_LT(v[1].get<double>(), 0.6 * untaught.summary["eval"]["val_loss"][1].get<double>());
}

TEST(Eval, WhatIsRefusedIsNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {toml("path = \"" + kData + "\"\n", "every = 2\n"),
       "[eval] needs held-out rows: eval.path (a file of them) or eval.holdout_rows (the last rows of data.path)"},
      {toml("", "every = 2\nholdout_rows = 4\n"),
       "key 'eval.holdout_rows' sets rows of a safetensors data file aside, and data.kind is \"random\""},
      {toml("path = \"" + kData + "\"\nteacher = true\n", "every = 0\n"),
       "key 'data.teacher' is for random data (data.kind = \"safetensors\" holds its own targets)"},
      {toml("path = \"" + kData + "\"\n", "every = 0\npath = \"/nonexistent/held_out.safetensors\"\n"),
       "key 'eval.path' names /nonexistent/held_out.safetensors, which does not exist (checked even while "
       "eval.every = 0 leaves evaluation off)"},
      {toml("", "every = 1\nbatches = 100000000\n"), "key 'eval.batches' must be <= 65536 (got 100000000)"},
      {toml("path = \"" + kData + "\"\n", "every = 2\nbatches = 3\nholdout_rows = 16\n"),
       "toy_data.safetensors: eval.batches = 3 reads 3 × data.batch_size 8 rows, and the held-out rows are 16: at "
       "most 2 batches, past which it reads the same rows again"},
      {toml("path = \"" + kData + "\"\n", "every = 2\nholdout_rows = 100000\n"),
       "and eval.holdout_rows = 100000 leaves none to train on"},
  };
  for (const auto& [config, message] : cases) {
    std::string failure;
    try {
      const RunResult r = harness::run(config, 1);
      failure = r.failures.empty() ? "" : r.failures[0];
    } catch (const std::exception& e) {
      failure = e.what();
    }
    EXPECT_NE(failure.find(message), std::string::npos) << failure;
  }
}

}  // namespace
}  // namespace ddp
