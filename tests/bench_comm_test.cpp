// bench_comm_test.cpp — `ddp bench-comm`: the pure parts (nccl-tests' bus
// bandwidth factors, sizes, buffer counts, iteration counts, aggregation over
// ranks, transport keys from --set) and one quick run of the command on tiny
// sizes over the real gloo transport, checking its outputs' structure and
// that every figure is finite and positive. No timing is asserted: speed is
// tools/bench_comm_compare.py's business.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

#include "bench_comm.h"
#include "config.h"
#include "process.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;

TEST(BenchComm, BusFactorsAreNcclTests) {
  // all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n, broadcast 1
  EXPECT_DOUBLE_EQ(bus_factor(Collective::AllReduce, 2), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor(Collective::AllReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(bus_factor(Collective::AllReduce, 6), 10.0 / 6.0);
  EXPECT_DOUBLE_EQ(bus_factor(Collective::AllGather, 2), 0.5);
  EXPECT_DOUBLE_EQ(bus_factor(Collective::AllGather, 6), 5.0 / 6.0);
  EXPECT_DOUBLE_EQ(bus_factor(Collective::ReduceScatter, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor(Collective::Broadcast, 6), 1.0);
  for (Collective op : {Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter})
    EXPECT_DOUBLE_EQ(bus_factor(op, 1), 0.0) << to_string(op);  // nothing crosses a bus
}

TEST(BenchComm, SizesAreBinaryAndRoundTrip) {
  EXPECT_EQ(parse_size("4096"), 4096u);
  EXPECT_EQ(parse_size("4KB"), 4096u);
  EXPECT_EQ(parse_size("1MB"), 1u << 20);
  EXPECT_EQ(parse_size("10mb"), 10u << 20);
  EXPECT_EQ(parse_size("1GiB"), 1u << 30);
  EXPECT_EQ(parse_size("3M"), 3u << 20);
  for (size_t bytes : {size_t(1) << 20, size_t(10) << 20, size_t(1) << 30, size_t(4096), size_t(1536) << 10, size_t(1000)})
    EXPECT_EQ(parse_size(format_size(bytes)), bytes) << format_size(bytes);
  EXPECT_EQ(format_size(1u << 30), "1GB");
  EXPECT_EQ(format_size(1048560), "1048560B");
  for (const char* bad : {"", "MB", "0", "10XB", "1.5MB", "-1MB", "99999999999999GB"}) {
    try {
      parse_size(bad);
      ADD_FAILURE() << "'" << bad << "' accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(BenchComm, CollectivesByName) {
  for (Collective op : {Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter, Collective::Broadcast})
    EXPECT_EQ(parse_collective(to_string(op)), op);
  EXPECT_THROW(parse_collective("allreduce"), Error);
}

TEST(BenchComm, BufferCountsFollowTheSizeConvention) {
  const size_t mb = 1 << 20;
  // S is the in-place buffer of all_reduce and broadcast...
  EXPECT_EQ(buffer_counts(Collective::AllReduce, mb, 6).send, mb / 4);
  EXPECT_EQ(buffer_counts(Collective::Broadcast, mb, 6).recv, mb / 4);
  // ...the gathered buffer of all_gather, the send buffer of reduce_scatter,
  // each rank's share rounded down to whole floats.
  const BufferCounts ag = buffer_counts(Collective::AllGather, mb, 6);
  EXPECT_EQ(ag.send, 43690u);
  EXPECT_EQ(ag.recv, 6 * 43690u);
  const BufferCounts rs = buffer_counts(Collective::ReduceScatter, mb, 4);
  EXPECT_EQ(rs.send, mb / 4);
  EXPECT_EQ(rs.recv, mb / 16);
  EXPECT_EQ(buffer_counts(Collective::AllGather, 8, 4).send, 0u);  // too small: refused by the rank
}

TEST(BenchComm, FewerIterationsForLargeSizes) {
  EXPECT_EQ(default_iters(4096), 50);
  EXPECT_EQ(default_iters(1 << 20), 50);
  EXPECT_EQ(default_iters(100 << 20), 20);
  EXPECT_EQ(default_iters(size_t(1) << 30), 5);
}

TEST(BenchComm, IterationTimeIsTheMeanOverRanks) {
  // rank 0: 1 2 3 6, rank 1: 3 2 5 2 → per iteration 2 2 4 4
  const TimeStats s = aggregate_times({{1, 2, 3, 6}, {3, 2, 5, 2}});
  EXPECT_DOUBLE_EQ(s.mean_s, 3.0);
  EXPECT_DOUBLE_EQ(s.median_s, 3.0);
  EXPECT_DOUBLE_EQ(aggregate_times({{1, 9, 2}}).median_s, 2.0);
  EXPECT_THROW(aggregate_times({{1, 2}, {1}}), Error);
  EXPECT_THROW(aggregate_times({}), Error);
}

TEST(BenchComm, TransportKeysFromSet) {
  PluginSection s = plugin_section_from_overrides("transport", {"transport.algorithm=bcube"});
  EXPECT_EQ(s.get_string("algorithm", "ring"), "bcube");
  EXPECT_NO_THROW(s.check_all_read("transport", "gloo"));
  EXPECT_THROW(plugin_section_from_overrides("transport", {"strategy.bucket_mb=1"}), ConfigError);
  EXPECT_THROW(plugin_section_from_overrides("transport", {"transport.plugin=gloo"}), ConfigError);
  PluginSection unread = plugin_section_from_overrides("transport", {"transport.bogus=1"});
  try {
    unread.check_all_read("transport", "gloo");
    ADD_FAILURE() << "unknown key accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "--set transport.bogus=1: unknown key 'transport.bogus' (transport plugin 'gloo' does not read it)");
  }
}

// The command end to end, world 2, tiny sizes, every op.
TEST(BenchCommCommand, TinyRunWritesTableJsonAndCsv) {
  const std::string dir = temp_dir();
  Process p = start({"bench-comm", "--world", "2", "--sizes", "4KB,64KB", "--warmup", "1", "--iters", "3", "--out",
                     dir + "/out"},
                    {}, dir + "/ddp");
  ASSERT_EQ(wait_for(p, std::chrono::seconds(60)), 0) << read_file(p.err);

  const std::string out = read_file(p.out);
  EXPECT_NE(out.find("| transport | op | size | world | iters | mean ms | median ms | algbw GB/s | busbw GB/s |"),
            std::string::npos)
      << out;
  for (const char* op : {"all_reduce", "all_gather", "reduce_scatter", "broadcast"})
    for (const char* size : {"4KB", "64KB"})
      EXPECT_NE(out.find(std::string("| gloo | ") + op + " | " + size + " | 2 | 3 | "), std::string::npos)
          << op << " " << size << "\n" << out;

  const auto doc = nlohmann::json::parse(read_file(dir + "/out/bench_comm.json"));
  ASSERT_EQ(doc["rows"].size(), 8u);
  for (const auto& row : doc["rows"]) {
    EXPECT_EQ(row["world"], 2);
    EXPECT_EQ(row["iters"], 3);
    EXPECT_EQ(row["warmup"], 1);
    EXPECT_TRUE(row["bytes"] == 4096 || row["bytes"] == 65536) << row.dump();  // divisible by 2 floats: exact
    for (const char* key : {"mean_s", "median_s", "algbw_GBps", "busbw_GBps"}) {
      const double v = row[key].get<double>();
      EXPECT_TRUE(std::isfinite(v) && v > 0) << key << " in " << row.dump();
    }
    const double factor = bus_factor(parse_collective(row["op"].get<std::string>()), 2);
    EXPECT_NEAR(row["busbw_GBps"].get<double>(), row["algbw_GBps"].get<double>() * factor, 1e-12);
    EXPECT_NEAR(row["algbw_GBps"].get<double>(), row["bytes"].get<double>() / row["mean_s"].get<double>() / 1e9,
                1e-9);
  }
  ASSERT_EQ(doc["overhead_fit"].size(), 1u);  // world 2, all_reduce at two sizes
  EXPECT_EQ(doc["overhead_fit"][0]["world"], 2);
  EXPECT_EQ(doc["load"], "none");

  std::istringstream csv(read_file(dir + "/out/bench_comm.csv"));
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line, "transport,op,size,bytes,world,iters,warmup,mean_s,median_s,algbw_GBps,busbw_GBps,load");
  int rows = 0;
  while (std::getline(csv, line)) ++rows;
  EXPECT_EQ(rows, 8);
  // Nothing else left behind (no rank part files, no rendezvous directory).
  for (const auto& e : fs::directory_iterator(dir + "/out")) {
    const std::string name = e.path().filename();
    EXPECT_TRUE(name == "bench_comm.json" || name == "bench_comm.csv") << "left behind: " << name;
  }
  fs::remove_all(dir);
}

// --load gemm: the same measurement beside a GEMM thread per rank, and the
// file says so (`ddp plan --bench-busy` takes only such a file).
TEST(BenchCommCommand, LoadGemmIsRecorded) {
  const std::string dir = temp_dir();
  Process p = start({"bench-comm", "--world", "2", "--sizes", "4KB,64KB", "--ops", "all_reduce", "--warmup", "1",
                     "--iters", "3", "--load", "gemm", "--out", dir + "/out"},
                    {}, dir + "/ddp");
  ASSERT_EQ(wait_for(p, std::chrono::seconds(60)), 0) << read_file(p.err);
  EXPECT_NE(read_file(p.out).find("Timed with --load gemm: one core of each rank busy with GEMMs."), std::string::npos)
      << read_file(p.out);
  const auto doc = nlohmann::json::parse(read_file(dir + "/out/bench_comm.json"));
  EXPECT_EQ(doc["load"], "gemm");
  ASSERT_EQ(doc["rows"].size(), 2u);
  for (const auto& row : doc["rows"]) EXPECT_EQ(row["load"], "gemm");
  ASSERT_EQ(doc["overhead_fit"].size(), 1u);
  fs::remove_all(dir);
}

TEST(BenchCommCommand, BadInputIsNamed) {
  const std::string dir = temp_dir();
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--sizes", "10XB"}, "--sizes: '10XB' is not a size"},
      {{"--ops", "all_reduce,gossip"}, "--ops: unknown collective 'gossip'"},
      {{"--set", "transport.algorithm=spiral"}, "transport.algorithm must be"},
      {{"--set", "transport.bogus=1"}, "unknown key 'transport.bogus'"},
      {{"--transport", dir + "/nowhere.so"}, "nowhere.so"},
      {{"--load", "spin"}, "--load: unknown load 'spin' (none, or gemm: one core per rank busy with GEMMs)"},
      {{"--load", "gemm", "--device", "cuda"}, "--load gemm keeps CPU cores busy: it does not load a GPU (use --device cpu)"},
      // More ranks than this host holds: each rank's process's own memory, summed (fit_check.h).
      {{"--world", "4096"}, "--world: 4096 ranks do not fit this host's memory: the run needs "},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"bench-comm", "--world", "2", "--sizes", "4KB", "--iters", "1", "--out", dir + "/out"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    Process p = start(args, {}, dir + "/ddp");
    EXPECT_NE(wait_for(p, std::chrono::seconds(60)), 0) << c.message;
    const std::string err = read_file(p.err);
    EXPECT_NE(err.find(c.message), std::string::npos) << "expected '" << c.message << "' in:\n" << err;
  }
  fs::remove_all(dir);
}

// What would measure nothing is refused, never ended with 0: no iterations,
// no directory, a transport that cannot run on the device asked for.
TEST(BenchCommCommand, ARunThatWouldMeasureNothingIsRefused) {
  const std::string dir = temp_dir();
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  std::vector<Case> cases = {
      {{"--iters", "0", "--out", dir + "/out"}, "--iters: Value 0 not in range 1 to 1000000"},
      {{"--out", ""}, "--out: empty (\".\" is the working directory)"},
  };
  if (fs::exists(std::string(DDP_BIN_DIR) + "/../lib/ddp/libddp_transport_nccl.so"))  // built with CUDA
    cases.push_back({{"--transport", "nccl", "--out", dir + "/out"},
                     "ddp: error: bench-comm: nothing measured: 'nccl' cannot run on --device cpu"});
  for (const Case& c : cases) {
    std::vector<std::string> args = {"bench-comm", "--world", "2", "--sizes", "4KB"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    Process p = start(args, {}, dir + "/ddp");
    EXPECT_NE(wait_for(p, std::chrono::seconds(60)), 0) << c.message;
    const std::string err = read_file(p.err);
    EXPECT_NE(err.find(c.message), std::string::npos) << "expected '" << c.message << "' in:\n" << err;
  }
  EXPECT_FALSE(fs::exists(dir + "/out/bench_comm.json"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ddp
