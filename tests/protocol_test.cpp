// protocol_test.cpp — the DDP correctness protocol of spec/models.md on
// `toy` and `toy_tied`, world sizes 1, 2, 4, through the real engine, the
// gloo transport and the naive strategy, each rank a forked process:
//  - before set-up ranks differ (each starts from seed + rank); after it
//    every rank holds rank 0's weights;
//  - after every step every rank equals the single-process run (world 1 on
//    all rows) within 1e-6 and ranks are bitwise equal;
//  - and the same runs from the PyTorch fixture's initial weights match the
//    PyTorch-computed weights and losses (tests/fixtures/make_toy_fixtures.py).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "config.h"
#include "multirank.h"
#include "safetensors.h"
#include "trainer.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;
constexpr int kSteps = 5;
const std::string kFixtures = std::string(DDP_TEST_DATA_DIR) + "/fixtures/";

// step → parameter → values
using Weights = std::vector<std::vector<float>>;
using Snapshots = std::map<int64_t, Weights>;

// Appends every snapshot to a file the parent reads back.
class FileObserver final : public TrainObserver {
 public:
  explicit FileObserver(const std::string& path) : out_(path, std::ios::binary) {}
  void on_weights(int64_t step, const Model& model) override {
    int64_t count = static_cast<int64_t>(model.params().size());
    out_.write(reinterpret_cast<const char*>(&step), sizeof step);
    out_.write(reinterpret_cast<const char*>(&count), sizeof count);
    for (const Parameter& p : model.params()) {
      int64_t n = static_cast<int64_t>(p.data.numel());
      out_.write(reinterpret_cast<const char*>(&n), sizeof n);
      out_.write(reinterpret_cast<const char*>(p.data.data()), n * sizeof(float));
    }
    out_.flush();
  }

 private:
  std::ofstream out_;
};

Snapshots read_snapshots(const std::string& path) {
  Snapshots out;
  std::ifstream in(path, std::ios::binary);
  int64_t step, count;
  while (in.read(reinterpret_cast<char*>(&step), sizeof step)) {
    in.read(reinterpret_cast<char*>(&count), sizeof count);
    Weights w(count);
    for (auto& values : w) {
      int64_t n;
      in.read(reinterpret_cast<char*>(&n), sizeof n);
      values.resize(n);
      in.read(reinterpret_cast<char*>(values.data()), n * sizeof(float));
    }
    out[step] = std::move(w);
  }
  return out;
}

struct RunResult {
  std::vector<Snapshots> ranks;
  nlohmann::json summary;
  std::vector<std::string> names;  // parameter names, model order
  std::map<std::string, HostTensor> final_weights;  // rank 0's weights.safetensors
};

// Trains `model` on the fixture data with `world` ranks; returns every
// rank's snapshots and rank 0's summary.json.
RunResult run(const std::string& model, int world, const std::string& init_from = "") {
  char tmpl[] = "/tmp/ddp-protocol-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  std::ofstream(dir + "/run.toml") << "[run]\nworld_size = " << world << "\nsteps = " << kSteps
                                   << "\nseed = 7\noutput_dir = \"" << dir << "/out\"\ntimeout_s = 30\n"
                                   << "[model]\nname = \"" << model << "\"\n"
                                   << (init_from.empty() ? "" : "init_from = \"" + init_from + "\"\n")
                                   << "[data]\npath = \"" << kFixtures << "toy_data.safetensors\"\n"
                                   << "batch_size = 20\n[optimizer]\nlr = 0.1\n";
  Config config = load_config(dir + "/run.toml");
  fs::create_directories(dir + "/rdzv");
  auto failures = run_ranks(world, [&](int rank, const std::string&) {
    RankEnv env;
    env.rank = RankInfo{rank, world, rank};
    env.rendezvous = "file:" + dir + "/rdzv";
    env.run_id = "protocol";
    FileObserver observer(dir + "/rank" + std::to_string(rank) + ".bin");
    train_rank(config, env, &observer);
  });
  for (const auto& f : failures) ADD_FAILURE() << f;
  RunResult result;
  for (int r = 0; r < world; ++r) result.ranks.push_back(read_snapshots(dir + "/rank" + std::to_string(r) + ".bin"));
  std::ifstream summary(dir + "/out/summary.json");
  if (summary) result.summary = nlohmann::json::parse(summary);
  if (fs::exists(dir + "/out/weights.safetensors"))
    result.final_weights = read_safetensors(dir + "/out/weights.safetensors");
  CpuDevice device;
  auto reference = make_model(model, device, 0);
  for (const auto& p : reference->params()) result.names.push_back(p.name);
  fs::remove_all(dir);
  return result;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

struct Case {
  std::string model;
  int world;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.model << " on " << c.world << " ranks"; }
std::string case_name(const testing::TestParamInfo<Case>& info) {
  return info.param.model + "_world" + std::to_string(info.param.world);
}
const std::vector<Case> kCases = {{"toy", 1}, {"toy", 2}, {"toy", 4},
                                  {"toy_tied", 1}, {"toy_tied", 2}, {"toy_tied", 4}};

class Protocol : public testing::TestWithParam<Case> {};

TEST_P(Protocol, RanksHoldRankZerosWeightsAndMatchSingleProcess) {
  const Case& c = GetParam();
  RunResult single = run(c.model, 1);
  RunResult ddp = run(c.model, c.world);
  ASSERT_EQ(ddp.ranks.size(), static_cast<size_t>(c.world));
  for (int r = 0; r < c.world; ++r) ASSERT_EQ(ddp.ranks[r].size(), static_cast<size_t>(kSteps + 2)) << "rank " << r;
  const Weights& rank0_init = ddp.ranks[0].at(-1);

  // Before set-up each rank has its own initialisation (seed + rank).
  for (int r = 1; r < c.world; ++r) {
    bool differs = false;
    for (size_t p = 0; p < rank0_init.size(); ++p) differs |= ddp.ranks[r].at(-1)[p] != rank0_init[p];
    EXPECT_TRUE(differs) << "rank " << r << " started with rank 0's weights: broadcast is not observable";
  }
  for (int64_t step = 0; step <= kSteps; ++step) {
    for (int r = 0; r < c.world; ++r) {
      const Weights& w = ddp.ranks[r].at(step);
      for (size_t p = 0; p < w.size(); ++p) {
        const std::string where = "rank " + std::to_string(r) + ", step " + std::to_string(step) + ", " + ddp.names[p];
        if (step == 0) {
          EXPECT_EQ(w[p], rank0_init[p]) << where << ": not rank 0's weights after set-up";
        }
        EXPECT_EQ(w[p], ddp.ranks[0].at(step)[p]) << where << ": ranks not bitwise equal";
        EXPECT_LE(max_abs_diff(w[p], single.ranks[0].at(step)[p]), 1e-6f) << where << ": differs from single-process";
      }
    }
  }
  // Loss reported is the mean over the global batch, as single-process training reports it.
  ASSERT_EQ(ddp.summary["loss"].size(), static_cast<size_t>(kSteps));
  for (int s = 0; s < kSteps; ++s)
    EXPECT_NEAR(ddp.summary["loss"][s].get<double>(), single.summary["loss"][s].get<double>(), 1e-6) << "step " << s;
}

class Golden : public testing::TestWithParam<Case> {};

// From the PyTorch fixture's initial weights, every rank's weights after
// every step equal PyTorch's (SGD lr 0.1, full batch of 20 rows).
TEST_P(Golden, MatchesPyTorch) {
  const Case& c = GetParam();
  RunResult ddp = run(c.model, c.world, kFixtures + c.model + "_init.safetensors");
  auto expected = read_safetensors(kFixtures + c.model + "_sgd_expected.safetensors");
  const std::string fixture = c.model + "_sgd_expected.safetensors";
  for (int r = 0; r < c.world; ++r) {
    ASSERT_EQ(ddp.ranks[r].size(), static_cast<size_t>(kSteps + 2));
    for (int step = 1; step <= kSteps; ++step) {
      for (size_t p = 0; p < ddp.names.size(); ++p) {
        const std::string key = "step" + std::to_string(step) + "/" + ddp.names[p];
        ASSERT_TRUE(expected.count(key)) << key;
        EXPECT_LE(max_abs_diff(ddp.ranks[r].at(step)[p], expected.at(key).as_floats(fixture, key)), 1e-6f)
            << "rank " << r << ", " << key;
      }
    }
  }
  std::vector<float> loss = expected.at("loss").as_floats(fixture, "loss");
  ASSERT_EQ(ddp.summary["loss"].size(), loss.size());
  for (size_t s = 0; s < loss.size(); ++s)
    EXPECT_NEAR(ddp.summary["loss"][s].get<double>(), loss[s], 1e-6) << "step " << s;
  // Rank 0 wrote the final weights, float32, under their spec names.
  EXPECT_EQ(ddp.summary["world_size"], c.world);
  ASSERT_EQ(ddp.final_weights.size(), ddp.names.size());
  for (size_t p = 0; p < ddp.names.size(); ++p) {
    const std::string& name = ddp.names[p];
    ASSERT_TRUE(ddp.final_weights.count(name)) << name;
    EXPECT_EQ(ddp.final_weights.at(name).as_floats("weights.safetensors", name), ddp.ranks[0].at(kSteps)[p]) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Toy, Protocol, testing::ValuesIn(kCases), case_name);
INSTANTIATE_TEST_SUITE_P(Toy, Golden, testing::ValuesIn(kCases), case_name);

}  // namespace
}  // namespace ddp
