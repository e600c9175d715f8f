// trace_test.cpp — `ddp run --trace`: one Chrome trace per run with, per
// rank, a compute lane (step, forward, backward per layer, strategy hooks,
// optimizer) and a communication lane (each collective, with its bytes),
// agreeing with summary.json; and the picture it is for: on `overlap` the
// all-reduces start under backward, on `naive` only after it.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#if DDP_WITH_CUDA
#include "gpu.h"
#endif
#include "lm.h"
#include "mlp.h"
#include "model.h"
#include "process.h"
#include "trace.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
constexpr int kSteps = 5;

// Thin forms of process.h's helpers, as this file uses them.
pid_t start_ddp(const std::vector<std::string>& args, const std::vector<std::string>& env, const std::string& log) {
  return start(args, env, log).pid;
}
int wait_ddp(pid_t pid) { return wait_for(Process{pid, "", ""}, std::chrono::seconds(120)); }

// The quick start's config with an `mlp` big enough (4 layers of 1024, 256
// rows) that backward lasts tens of milliseconds: long enough for overlap
// to show (toy's lasts about 10 µs, less than a collective takes to start).
std::vector<std::string> run_args(const std::string& strategy, const std::string& out,
                                  const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"run", kRepo + "/configs/toy.toml", "--trace"};
  for (const std::string& kv : extra) args.insert(args.end(), {"--set", kv});
  for (const std::string& kv :
       {"run.output_dir=\"" + out + "\"", "strategy.plugin=\"" + strategy + "\"", std::string("model.name=\"mlp\""),
        std::string("model.width=1024"), std::string("model.depth=4"), std::string("data.path=\"\""),
        std::string("data.kind=\"random\""), std::string("data.batch_size=256")})
    args.insert(args.end(), {"--set", kv});
  return args;
}

double end_of(const json& e) { return e["ts"].get<double>() + e["dur"].get<double>(); }

// One rank's events of one step on one lane, in time order.
std::vector<json> lane(const json& trace, int pid, int tid, int step) {
  std::vector<json> out;
  for (const json& e : trace["traceEvents"])
    if (e["ph"] == "X" && e["pid"] == pid && e["tid"] == tid && e["args"]["step"] == step) out.push_back(e);
  std::stable_sort(out.begin(), out.end(), [](const json& a, const json& b) { return a["ts"] < b["ts"]; });
  return out;
}

// The events whose name starts with `prefix` ("backward ": the layers').
std::vector<json> named(const std::vector<json>& events, const std::string& prefix) {
  std::vector<json> out;
  for (const json& e : events)
    if (e["name"].get<std::string>().rfind(prefix, 0) == 0) out.push_back(e);
  return out;
}

std::vector<json> exactly(const std::vector<json>& events, const std::string& name) {
  std::vector<json> out;
  for (const json& e : events)
    if (e["name"] == name) out.push_back(e);
  return out;
}

// Runs `strategy` with --trace and checks what every trace must hold; returns
// the trace (null when the run failed).
json traced_run(const std::string& strategy, const std::string& dir, const std::vector<std::string>& extra = {}) {
  const std::string out = dir + "/out";
  const int code = wait_ddp(start_ddp(run_args(strategy, out, extra), {}, dir + "/ddp"));
  EXPECT_EQ(code, 0) << read_file(dir + "/ddp.err");
  if (code != 0) return nullptr;
  EXPECT_NE(read_file(dir + "/ddp.out").find("trace: " + out + "/trace.json"), std::string::npos);
  // One merged file; the ranks' files and the rendezvous directory are gone.
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(out)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"summary.json", "trace.json", "weights.safetensors"}));

  json trace = json::parse(read_file(out + "/trace.json"));
  const json summary = json::parse(read_file(out + "/summary.json"));
  EXPECT_EQ(trace["displayTimeUnit"], "ms");
  std::map<std::pair<int, int>, std::string> threads;
  std::map<int, std::string> processes;
  double first = 1e300;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") processes[e["pid"]] = e["args"]["name"];
    if (e["ph"] == "M" && e["name"] == "thread_name") threads[{e["pid"], e["tid"]}] = e["args"]["name"];
    if (e["ph"] != "X") continue;
    EXPECT_GE(e["dur"].get<double>(), 0) << e;
    first = std::min(first, e["ts"].get<double>());
  }
  EXPECT_EQ(first, 0.0) << "the merged trace starts at 0";
  EXPECT_EQ(processes, (std::map<int, std::string>{{0, "rank 0"}, {1, "rank 1"}}));
  EXPECT_EQ(threads, (std::map<std::pair<int, int>, std::string>{
                         {{0, 0}, "compute"}, {{0, 1}, "communication"}, {{1, 0}, "compute"}, {{1, 1}, "communication"}}));

  for (int rank = 0; rank < 2; ++rank) {
    for (int step = 0; step < kSteps; ++step) {
      SCOPED_TRACE("rank " + std::to_string(rank) + ", step " + std::to_string(step));
      const std::vector<json> compute = lane(trace, rank, 0, step);
      for (const char* name : {"step", "on_step_begin", "forward", "backward", "on_backward_end", "finish", "optimizer"})
        EXPECT_EQ(exactly(compute, name).size(), 1u) << name;
      // backward's layers, last first, each inside backward, inside the step.
      std::vector<std::string> layers;
      for (const json& e : named(compute, "backward ")) layers.push_back(e["name"]);
      EXPECT_EQ(layers, (std::vector<std::string>{"backward head", "backward layers.3", "backward layers.2",
                                                  "backward layers.1", "backward layers.0"}));
      if (exactly(compute, "step").size() != 1 || exactly(compute, "backward").size() != 1) continue;
      const json step_range = exactly(compute, "step")[0];
      const json backward = exactly(compute, "backward")[0];
      for (const json& e : named(compute, "backward ")) {
        EXPECT_GE(e["ts"].get<double>(), backward["ts"].get<double>());
        EXPECT_LE(end_of(e), end_of(backward));
      }
      for (const json& e : compute) {
        EXPECT_GE(e["ts"].get<double>(), step_range["ts"].get<double>()) << e;
        EXPECT_LE(end_of(e), end_of(step_range)) << e;
      }
      // One event per collective the summary counts, with its bytes.
      const std::vector<json> comm = lane(trace, rank, 1, step);
      EXPECT_EQ(int64_t(comm.size()), summary["collectives"][step].get<int64_t>());
      int64_t bytes = 0;
      for (const json& e : comm) {
        EXPECT_EQ(e["name"], e["args"]["op"]);
        if (strategy != "sharded") {
          EXPECT_EQ(e["name"], "all_reduce");  // ZeRO-3's: all_gather, reduce_scatter
        }
        bytes += e["args"]["bytes"].get<int64_t>();
      }
      EXPECT_EQ(bytes, summary["comm_bytes"][step].get<int64_t>());
    }
  }
  return trace;
}

// When the step's last backward range ends, and when its first collective starts.
std::pair<double, double> backward_end_and_first_collective(const json& trace, int rank, int step) {
  const std::vector<json> layers = named(lane(trace, rank, 0, step), "backward ");
  const std::vector<json> comm = lane(trace, rank, 1, step);
  if (layers.empty() || comm.empty()) return {0, 0};
  return {end_of(layers.back()), comm.front()["ts"].get<double>()};
}

TEST(Trace, OverlapShowsCollectivesUnderBackward) {
  const std::string dir = temp_dir();
  const json trace = traced_run("overlap", dir);
  ASSERT_FALSE(trace.is_null());
  int overlapped = 0;
  for (int rank = 0; rank < 2; ++rank)
    for (int step = 0; step < kSteps; ++step) {
      auto [backward_end, first] = backward_end_and_first_collective(trace, rank, step);
      overlapped += first < backward_end;
    }
  EXPECT_GT(overlapped, 0) << "no collective started before its step's backward ended";
  fs::remove_all(dir);
}

// ZeRO-3 (sharded stage 3): with one unit prefetched, the next unit's
// all-gather runs while the current unit computes, in forward (each unit
// its range, "forward <unit>") and in backward (its per-layer range); with
// none prefetched, never. mlp's units are layers.0..3 and head, without
// ties: the step's gathers are each unit's in forward order, then, from
// head's backward on, layers.3's, layers.2's, ...: gather u + 1 is
// prefetched as forward range u computes, gather U + j as backward range j.
// Returns how many did overlap, in forward and in backward.
std::pair<int, int> stage3_gathers_under_compute(const std::string& prefetch) {
  const std::string dir = temp_dir();
  const json trace = traced_run("sharded", dir, {"strategy.sharded.stage=3", "strategy.sharded.prefetch=" + prefetch});
  fs::remove_all(dir);
  if (trace.is_null()) return {-1, -1};
  const std::vector<std::string> units = {"layers.0", "layers.1", "layers.2", "layers.3", "head"};
  const size_t n = units.size();
  auto overlaps = [](const json& a, const json& b) {
    return a["ts"].get<double>() < end_of(b) && end_of(a) > b["ts"].get<double>();
  };
  int in_forward = 0, in_backward = 0;
  for (int rank = 0; rank < 2; ++rank)
    for (int step = 0; step < kSteps; ++step) {
      SCOPED_TRACE("rank " + std::to_string(rank) + ", step " + std::to_string(step));
      const std::vector<json> compute = lane(trace, rank, 0, step);
      const std::vector<json> forward = named(compute, "forward "), backward = named(compute, "backward ");
      const std::vector<json> gathers = exactly(lane(trace, rank, 1, step), "all_gather");
      std::vector<std::string> names;
      for (const json& e : forward) names.push_back(e["name"].get<std::string>().substr(8));
      EXPECT_EQ(names, units);
      if (names != units || backward.size() != n || gathers.size() != 2 * n - 1) {  // head kept for its backward
        ADD_FAILURE() << backward.size() << " backward ranges, " << gathers.size() << " gathers";
        continue;
      }
      for (size_t u = 0; u + 1 < n; ++u) in_forward += overlaps(gathers[u + 1], forward[u]);
      for (size_t j = 0; j + 1 < n; ++j) in_backward += overlaps(gathers[n + j], backward[j]);
    }
  std::printf("prefetch %s: gathers under compute: %d of %zu in forward, %d of %zu in backward\n", prefetch.c_str(),
              in_forward, 2 * kSteps * (n - 1), in_backward, 2 * kSteps * (n - 1));
  return {in_forward, in_backward};
}

TEST(Trace, Stage3GathersTheNextUnitWhileTheCurrentOneComputes) {
  const auto [forward, backward] = stage3_gathers_under_compute("1");
  EXPECT_GT(forward, 0) << "no unit's gather ran under the previous unit's forward";
  EXPECT_GT(backward, 0) << "no unit's gather ran under the next unit's backward";
}

TEST(Trace, Stage3WithoutPrefetchGathersOnlyBetweenUnits) {
  EXPECT_EQ(stage3_gathers_under_compute("0"), std::make_pair(0, 0));
}

TEST(Trace, NaiveCommunicatesOnlyAfterBackward) {
  const std::string dir = temp_dir();
  const json trace = traced_run("naive", dir);
  ASSERT_FALSE(trace.is_null());
  for (int rank = 0; rank < 2; ++rank)
    for (int step = 0; step < kSteps; ++step) {
      auto [backward_end, first] = backward_end_and_first_collective(trace, rank, step);
      EXPECT_GE(first, backward_end) << "rank " << rank << ", step " << step;
    }
  fs::remove_all(dir);
}

#if DDP_WITH_CUDA
// On a GPU the compute lane's ranges are the times the GPU reached them
// (CUDA events), with the same structure: every range once per step, the
// layers inside backward inside the step, a collective event per collective.
TEST(Trace, OnCudaTheSameLanesFromGpuTimes) {
  DDP_REQUIRE_GPUS(1);
  const std::string dir = temp_dir();
  const json trace = traced_run("overlap", dir, {"run.device=\"cuda\"", "run.share_gpus=true"});
  ASSERT_FALSE(trace.is_null());
  fs::remove_all(dir);
}
#endif

TEST(Trace, RanksUnderAnotherLauncherEachWriteTheirOwn) {
  const std::string dir = temp_dir();
  fs::create_directories(dir + "/rdzv");
  std::vector<pid_t> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.push_back(start_ddp({"run", kRepo + "/configs/toy.toml", "--trace", "--set", "run.output_dir=\"" + dir + "/out\""},
                              {"RANK=" + std::to_string(r), "WORLD_SIZE=2", "DDP_RENDEZVOUS=file:" + dir + "/rdzv"},
                              dir + "/rank" + std::to_string(r)));
  std::vector<int> codes;
  for (pid_t pid : ranks) codes.push_back(wait_ddp(pid));
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(codes[r], 0) << read_file(dir + "/rank" + std::to_string(r) + ".err");
    const json trace = json::parse(read_file(dir + "/out/trace.rank" + std::to_string(r) + ".json"));
    EXPECT_EQ(exactly(lane(trace, r, 0, kSteps - 1), "optimizer").size(), 1u);
    EXPECT_EQ(lane(trace, r, 1, 0).size(), 3u) << "toy: one all-reduce per trainable parameter";
  }
  EXPECT_FALSE(fs::exists(dir + "/out/trace.json"));
  fs::remove_all(dir);
}

TEST(Trace, MergeNamesAFileThatIsNotATrace) {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/bad.json") << "{\"not\": 1}";
  try {
    ddp::merge_traces({dir + "/bad.json"}, dir + "/trace.json");
    ADD_FAILURE() << "no error";
  } catch (const std::exception& e) {
    EXPECT_EQ(std::string(e.what()), dir + "/bad.json: not a trace (a rank's trace file is malformed)");
  }
  EXPECT_THROW(ddp::merge_traces({dir + "/missing.json"}, dir + "/trace.json"), std::exception);
  fs::remove_all(dir);
}

// Each model reports its backward layer by layer, in the order it runs, and
// the ranges follow one another inside backward.
std::vector<std::string> backward_ranges(ddp::Model& model, const ddp::Batch& batch) {
  std::vector<std::string> names;
  Clock::time_point last{};
  model.set_range_hook([&](const char* name, Clock::time_point begin, Clock::time_point end) {
    EXPECT_LE(begin, end);
    if (!names.empty()) {
      EXPECT_EQ(begin, last) << name;
    }
    last = end;
    names.push_back(name);
  });
  model.forward(batch);
  model.backward(1.0f, [](size_t) {});
  model.set_range_hook(nullptr);
  model.forward(batch);
  model.backward(1.0f, [](size_t) {});  // no hook: nothing reported, nothing breaks
  return names;
}

TEST(Trace, ModelsReportBackwardPerLayer) {
  ddp::CpuDevice device;
  std::vector<float> x(4 * 10, 0.5f), y(4 * 5, 0.1f);
  ddp::Batch toy_batch;
  toy_batch.x = x.data();
  toy_batch.y = y.data();
  toy_batch.rows = 4;
  auto toy = ddp::make_model("toy", device, 0);
  EXPECT_EQ(backward_ranges(*toy, toy_batch),
            (std::vector<std::string>{"backward fc3", "backward fc2.fc", "backward fc1"}));
  auto tied = ddp::make_model("toy_tied", device, 0);
  EXPECT_EQ(backward_ranges(*tied, toy_batch), (std::vector<std::string>{"backward fc5", "backward fc2", "backward fc3",
                                                                         "backward fc2", "backward fc1"}));

  std::vector<int32_t> labels(4, 1);
  ddp::Batch mlp_batch;
  mlp_batch.x = x.data();
  mlp_batch.labels = labels.data();
  mlp_batch.rows = 4;
  auto mlp = ddp::make_mlp(ddp::MlpConfig{10, 2, 3}, device, 0);
  EXPECT_EQ(backward_ranges(*mlp, mlp_batch),
            (std::vector<std::string>{"backward head", "backward layers.1", "backward layers.0"}));

  ddp::LmConfig c = ddp::lm_preset("lm-tiny");
  std::vector<int32_t> tokens(2 * (c.context_length + 1));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i % c.vocab_size);
  ddp::Batch lm_batch;
  lm_batch.tokens = tokens.data();
  lm_batch.rows = 2;
  auto lm = ddp::make_lm(c, device, 0);
  EXPECT_EQ(backward_ranges(*lm, lm_batch),
            (std::vector<std::string>{"backward lm_head", "backward ln_final", "backward layers.1",
                                      "backward layers.0", "backward token_embeddings"}));
}

}  // namespace
