// harness.h — runs the real engine (train_rank) on N forked ranks for a test
// and hands back what every rank held: its weights before set-up (step -1),
// after it (step 0) and after every optimizer step, plus rank 0's
// summary.json and weights.safetensors.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config.h"
#include "multirank.h"
#include "registry.h"
#include "safetensors.h"
#include "trainer.h"

namespace ddp {
namespace harness {

// A directory for one test's files, removed at the end.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& prefix = "ddp-test") {
    std::string tmpl = "/tmp/" + prefix + "-XXXXXX";
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

// step → parameter → values
using Weights = std::vector<std::vector<float>>;
using Snapshots = std::map<int64_t, Weights>;

// Appends every snapshot to a file the parent reads back.
class FileObserver final : public TrainObserver {
 public:
  explicit FileObserver(const std::string& path, std::vector<int64_t> overflows = {})
      : out_(path, std::ios::binary), overflows_(std::move(overflows)) {}
  bool overflow(int64_t step) override {
    return std::find(overflows_.begin(), overflows_.end(), step) != overflows_.end();
  }
  void on_weights(int64_t step, const std::vector<std::vector<float>>& values) override {
    int64_t count = static_cast<int64_t>(values.size());
    out_.write(reinterpret_cast<const char*>(&step), sizeof step);
    out_.write(reinterpret_cast<const char*>(&count), sizeof count);
    for (const std::vector<float>& v : values) {
      int64_t n = static_cast<int64_t>(v.size());
      out_.write(reinterpret_cast<const char*>(&n), sizeof n);
      out_.write(reinterpret_cast<const char*>(v.data()), n * sizeof(float));
    }
    out_.flush();
  }

 private:
  std::ofstream out_;
  std::vector<int64_t> overflows_;  // the steps (from 0) whose backward this rank makes overflow
};

inline Snapshots read_snapshots(const std::string& path) {
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
  std::vector<std::string> names;                   // parameter names, model order
  std::map<std::string, HostTensor> final_weights;  // rank 0's weights.safetensors
  std::vector<std::string> failures;                // "rank r: message"
};

enum class Ranks {
  kAsTest,  // as the test's ranks are: forked, or launched by mpirun (multirank.h)
  kForked,  // forked children of this process, even when it was launched
};

// Trains with `world` ranks on the configuration `toml` (a whole TOML
// document without [run] world_size/output_dir, which this adds), with
// `sets` as --set overrides and `resume` as --resume ("": none).
// `overflows`: rank → the steps (from 0) whose backward overflows there
// (TrainObserver::overflow).
inline RunResult run(const std::string& toml, int world, const std::vector<std::string>& sets = {},
                     const std::string& resume = "", Ranks ranks = Ranks::kAsTest,
                     const std::map<int, std::vector<int64_t>>& overflows = {}) {
  namespace fs = std::filesystem;
  const auto launched = ranks == Ranks::kAsTest ? launched_rank() : std::nullopt;
  std::string dir;
  if (launched) {
    dir = launched_call_dir(*launched, "harness");  // every rank's, and shared
  } else {
    char tmpl[] = "/tmp/ddp-harness-XXXXXX";
    dir = mkdtemp(tmpl);
  }
  {  // launched: every rank writes the same file; whole (a rename), never half
    const std::string partial = dir + "/run.toml." + std::to_string(getpid());
    std::ofstream(partial) << toml;
    fs::rename(partial, dir + "/run.toml");
  }
  std::vector<std::string> overrides = {"run.world_size=" + std::to_string(world),
                                        "run.output_dir=\"" + dir + "/out\""};
  overrides.insert(overrides.end(), sets.begin(), sets.end());
  Config config = load_config(dir + "/run.toml", overrides);
  config.resume = resume;
  RunResult result;
  const RankBody body = [&](int rank, const std::string& rendezvous) {
    RankEnv env;
    env.rank = RankInfo{rank, world, rank};
    env.rendezvous = "file:" + rendezvous;
    env.run_id = "harness";
    const auto injected = overflows.find(rank);
    FileObserver observer(dir + "/rank" + std::to_string(rank) + ".bin",
                          injected == overflows.end() ? std::vector<int64_t>{} : injected->second);
    train_rank(config, env, &observer);
  };
  result.failures = launched ? run_launched_rank(*launched, world, body, 60) : fork_ranks(world, body);
  for (int r = 0; r < world; ++r) result.ranks.push_back(read_snapshots(dir + "/rank" + std::to_string(r) + ".bin"));
  std::ifstream summary(dir + "/out/summary.json");
  if (summary) result.summary = nlohmann::json::parse(summary);
  if (fs::exists(dir + "/out/weights.safetensors"))
    result.final_weights = read_safetensors(dir + "/out/weights.safetensors");
  CpuDevice device;
  DataShape shape;
  auto reference = build_model(config.model.name, config.model.options, device, 0, &shape);
  for (const auto& p : reference->params()) result.names.push_back(p.name);
  if (!launched) fs::remove_all(dir);  // launched: others may still read it; mpirun_ranks.sh removes it
  return result;
}

inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const float d = std::fabs(a[i] - b[i]);
    if (std::isnan(d)) return INFINITY;  // std::max would drop a NaN
    m = std::max(m, d);
  }
  return m;
}

}  // namespace harness
}  // namespace ddp
