// gloo_cuda_test.cpp — the gloo transport on CUDA buffers (DDP_WITH_CUDA
// builds): every collective with GPU memory on the engine's own CUDA device
// (make_device, PluginHost), world 2 sharing one GPU, against closed-form
// results; the staging memory it allocates (comm_buffers, none once the
// sizes have been seen); and its refusals on a CUDA run. Skipped, with the
// reason, where there is no GPU (gpu.h).
//
// Each rank is a process of its own, as in a run: two ranks in one process
// could deadlock, since CUDA may run the host functions of all streams on one
// thread, and a Gloo collective inside one waits for the other rank's. The
// CUDA runtime does not survive fork() and this process has initialised it
// (the GPU count), so a rank is this program exec'd afresh
// (`gloo_cuda_test --rank SCENARIO RANK WORLD DIR`), forked by run_ranks
// (tests/multirank.h) for its deadline and reporting; a failing rank prints
// its message to stderr and exits with 1.
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "config.h"
#include "device.h"
#include "gpu.h"
#include "plugin_host.h"
#include "multirank.h"
#include "plugin_loader.h"
#include "rank_checks.h"
#include "store.h"
#include "transport_rank.h"

namespace ddp {
namespace {




// An array in the device's memory (device->alloc), filled from `values`.
template <typename T>
class GpuArray {
 public:
  GpuArray(Device& device, const std::vector<T>& values) : device_(device), n_(values.size()) {
    ptr_ = device_.alloc(n_ * sizeof(T), MemCategory::Gradients);
    device_.upload(ptr_, values.data(), n_ * sizeof(T));
  }
  ~GpuArray() { device_.free(ptr_); }
  GpuArray(const GpuArray&) = delete;
  GpuArray& operator=(const GpuArray&) = delete;

  std::vector<T> read() const {  // once the comm stream is synchronised
    std::vector<T> v(n_);
    device_.download(v.data(), ptr_, n_ * sizeof(T));
    return v;
  }
  ddp_buffer buffer() const { return ddp_buffer{ptr_, n_, dtype_of<T>(), DDP_DEVICE_CUDA}; }

 private:
  Device& device_;
  void* ptr_ = nullptr;
  size_t n_;
};

// One rank: the engine's CUDA device (GPUs shared), a PluginHost over it, the
// gloo plugin loaded and connected; collectives on GpuArrays.
class Rank : public test::TransportRank {
 public:
  Rank(int rank, int world, const std::string& dir)
      : TransportRank(make_device(DDP_DEVICE_CUDA, rank, /*share_gpus=*/true), rank, world, dir, "gloo_cuda_test",
                      "gloo", {}) {}

  template <typename T>
  void all_reduce(const GpuArray<T>& a, ddp_reduce_op op) {
    TransportRank::all_reduce(a.buffer(), op);
  }
  template <typename T>
  void broadcast(const GpuArray<T>& a, int root) {
    TransportRank::broadcast(a.buffer(), root);
  }
  template <typename T>
  void all_gather(const GpuArray<T>& send, const GpuArray<T>& recv) {
    TransportRank::all_gather(send.buffer(), recv.buffer());
  }
  template <typename T>
  void reduce_scatter(const GpuArray<T>& send, const GpuArray<T>& recv, ddp_reduce_op op) {
    TransportRank::reduce_scatter(send.buffer(), recv.buffer(), op);
  }
};

// Sizes from 1 element to 4 MB of float32, growing (the staging memory too).
const std::vector<size_t> kCounts = {1, 7, 1000, size_t{1} << 20};

// ---------------------------------------------------------------- scenarios
// Each runs in one rank process; throws on failure.

using Scenario = std::function<void(int rank, int world, const std::string& dir)>;

void all_reduce_scenario(int r, int w, const std::string& dir) {
  Rank rank(r, w, dir);
  const double tri0 = w * (w - 1) / 2.0;  // sum of r
  // All sizes back to back, one wait: the staging memory grows under
  // queued work, which must keep the memory it was enqueued with.
  std::vector<std::unique_ptr<GpuArray<float>>> sums, avgs;
  std::vector<std::unique_ptr<GpuArray<int64_t>>> longs;
  for (size_t n : kCounts) {
    std::vector<float> x(n), y(n);
    std::vector<int64_t> z(n);
    for (size_t i = 0; i < n; ++i) {
      x[i] = static_cast<float>(r) + 0.5f * static_cast<float>(i % 4096);  // partial sums exact
      y[i] = static_cast<float>(w * (r + static_cast<int>(i % 100)));     // a multiple of w
      z[i] = (int64_t{r} + 1) * (int64_t{1} << 40) + int64_t(i);
    }
    sums.push_back(std::make_unique<GpuArray<float>>(rank.device(), x));
    avgs.push_back(std::make_unique<GpuArray<float>>(rank.device(), y));
    longs.push_back(std::make_unique<GpuArray<int64_t>>(rank.device(), z));
    rank.all_reduce(*sums.back(), DDP_REDUCE_SUM);
    rank.all_reduce(*avgs.back(), DDP_REDUCE_AVG);
    rank.all_reduce(*longs.back(), DDP_REDUCE_SUM);
  }
  rank.sync();
  const int64_t tri = int64_t{w} * (w + 1) / 2;  // sum of r + 1
  for (size_t k = 0; k < kCounts.size(); ++k) {
    const std::string at = " count " + std::to_string(kCounts[k]);
    check_all("all_reduce SUM float32" + at, sums[k]->read(),
              [&](size_t i) { return tri0 + w * 0.5 * static_cast<double>(i % 4096); });
    check_all("all_reduce AVG float32" + at, avgs[k]->read(),
              [&](size_t i) { return tri0 + w * static_cast<double>(i % 100); });
    check_all("all_reduce SUM int64" + at, longs[k]->read(),
              [&](size_t i) { return tri * (int64_t{1} << 40) + int64_t{w} * int64_t(i); });
  }
}

void broadcast_scenario(int r, int w, const std::string& dir) {
  Rank rank(r, w, dir);
  for (int root : {0, w - 1}) {
    for (size_t n : kCounts) {
      const std::string at = " root " + std::to_string(root) + " count " + std::to_string(n);
      std::vector<float> x(n);
      for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>((r + 1) * 10000 + int(i % 1000));
      GpuArray<float> dx(rank.device(), x);
      rank.broadcast(dx, root);
      rank.sync();
      check_all("broadcast float32" + at, dx.read(), [&](size_t i) { return (root + 1) * 10000 + int(i % 1000); });
    }
  }
}

void all_gather_scenario(int r, int w, const std::string& dir) {
  Rank rank(r, w, dir);
  for (size_t n : kCounts) {
    const std::string at = " count " + std::to_string(n);
    std::vector<float> send(n);
    for (size_t i = 0; i < n; ++i) send[i] = static_cast<float>(r * 1000 + int(i % 1000));
    GpuArray<float> dsend(rank.device(), send), drecv(rank.device(), std::vector<float>(n * w, -1.0f));
    rank.all_gather(dsend, drecv);
    rank.sync();
    check_all("all_gather float32" + at, drecv.read(),
              [&](size_t j) { return static_cast<int>(j / n) * 1000 + int(j % n % 1000); });
    check_all("all_gather leaves send as it was" + at, dsend.read(), [&](size_t i) { return send[i]; });
  }
}

void reduce_scatter_scenario(int r, int w, const std::string& dir) {
  Rank rank(r, w, dir);
  const double tri0 = w * (w - 1) / 2.0;
  for (size_t n : kCounts) {
    const std::string at = " count " + std::to_string(n);
    const size_t total = n * static_cast<size_t>(w);
    std::vector<float> x(total), y(total);
    for (size_t j = 0; j < total; ++j) {
      x[j] = static_cast<float>(r) + 0.5f * static_cast<float>(j % 4096);
      y[j] = static_cast<float>(w * (r + static_cast<int>(j % 100)));
    }
    GpuArray<float> dx(rank.device(), x), dy(rank.device(), y);
    GpuArray<float> sum(rank.device(), std::vector<float>(n, -1.0f)), avg(rank.device(), std::vector<float>(n, -1.0f));
    rank.reduce_scatter(dx, sum, DDP_REDUCE_SUM);
    rank.reduce_scatter(dy, avg, DDP_REDUCE_AVG);
    rank.sync();
    const size_t base = static_cast<size_t>(r) * n;  // this rank's slice
    check_all("reduce_scatter SUM float32" + at, sum.read(),
              [&](size_t i) { return tri0 + w * 0.5 * static_cast<double>((base + i) % 4096); });
    check_all("reduce_scatter AVG float32" + at, avg.read(),
              [&](size_t i) { return tri0 + w * static_cast<double>((base + i) % 100); });
    check_all("reduce_scatter leaves send as it was" + at, dx.read(), [&](size_t j) { return x[j]; });
  }
  // CPU buffers on a CUDA run: not staged, but the scratch still comes from
  // the staging memory (no host->alloc, GPU memory, inside a host function).
  std::vector<float> send(2 * static_cast<size_t>(w) * 8), recv(16, -1.0f);
  for (size_t j = 0; j < send.size(); ++j) send[j] = static_cast<float>(r + int(j));
  const ddp_buffer s{send.data(), send.size(), DDP_FLOAT32, DDP_DEVICE_CPU};
  const ddp_buffer d{recv.data(), recv.size(), DDP_FLOAT32, DDP_DEVICE_CPU};
  rank.check(rank.t()->reduce_scatter(rank.comm(), &s, &d, DDP_REDUCE_SUM, rank.stream()), "reduce_scatter");
  rank.sync();
  check_all("reduce_scatter of CPU buffers on a CUDA run", recv,
            [&](size_t i) { return tri0 + w * static_cast<double>(size_t(r) * 16 + i); });
}

// The staging memory is page-locked host memory accounted as comm_buffers;
// once a sequence of calls has been seen, repeating it allocates nothing.
void staging_memory_scenario(int r, int w, const std::string& dir) {
  Rank rank(r, w, dir);
  MemoryTracker& memory = rank.device().memory();
  GpuArray<float> small(rank.device(), std::vector<float>(10, 1.0f)), large(rank.device(), std::vector<float>(5000, 1.0f));
  GpuArray<float> gathered(rank.device(), std::vector<float>(5000 * size_t(w), 0.0f));
  const size_t before = memory.current(MemCategory::CommBuffers);
  auto round = [&] {
    rank.all_reduce(small, DDP_REDUCE_AVG);
    rank.all_reduce(large, DDP_REDUCE_AVG);
    rank.all_gather(large, gathered);
    rank.sync();
  };
  round();
  const size_t staged = memory.current(MemCategory::CommBuffers);
  if (staged < before + 5000 * sizeof(float) * (1 + size_t(w)))
    fail("comm_buffers holds " + std::to_string(staged - before) +
         " bytes of staging after an all_gather of 5000 floats on " + std::to_string(w) + " ranks");
  const int64_t allocations = memory.allocations();
  for (int k = 0; k < 3; ++k) round();
  if (memory.allocations() != allocations)
    fail("repeating the same collectives allocated " + std::to_string(memory.allocations() - allocations) +
         " more times");
  if (memory.current(MemCategory::CommBuffers) != staged) fail("comm_buffers changed while the sizes repeated");
  check_all("all_reduce AVG of ones, four times", small.read(), [](size_t) { return 1.0; });
  check_all("all_gather of ones", gathered.read(), [](size_t) { return 1.0; });
}

// Refusals on a CUDA run, at enqueue time, with the plugin's words.
void refusals_scenario(int r, int w, const std::string& dir) {
  Rank rank(r, w, dir);
  auto expect_refusal = [](ddp_status got, ddp_status want, const std::string& text) {
    const std::string msg = take_plugin_error();
    if (got != want || msg != text)
      fail("status " + std::to_string(got) + " \"" + msg + "\", expected " + std::to_string(want) + " \"" + text + "\"");
  };
  GpuArray<float> x(rank.device(), std::vector<float>(4 * size_t(w), 1.0f));
  std::vector<float> host(4);
  const ddp_buffer gpu = x.buffer();
  const ddp_buffer cpu{host.data(), host.size(), DDP_FLOAT32, DDP_DEVICE_CPU};
  expect_refusal(rank.t()->all_gather(rank.comm(), &cpu, &gpu, rank.stream()), DDP_ERR_INVALID_ARGUMENT,
                 "all_gather: send and recv are on different kinds of device (cpu and cuda): both must be CPU or "
                 "both CUDA");
  expect_refusal(rank.t()->reduce_scatter(rank.comm(), &gpu, &cpu, DDP_REDUCE_SUM, rank.stream()),
                 DDP_ERR_INVALID_ARGUMENT,
                 "reduce_scatter: send and recv are on different kinds of device (cuda and cpu): both must be CPU "
                 "or both CUDA");

  // An engine of ABI 1.0 (no alloc_host): CUDA buffers are refused. Its own
  // host (same device, own rendezvous keys), cut to the 1.0 size.
  Store old_store("file:" + dir, "gloo_cuda_test_abi_1_0", std::chrono::milliseconds(30000));
  HostServices old_services;
  old_services.rank = RankInfo{r, w, r};
  old_services.device = &rank.device();
  old_services.store = &old_store;
  const PluginSection section = plugin_section_from_overrides("transport", {});
  PluginHost old_host(old_services, section, "transport plugin 'gloo'");
  ddp_host old = *old_host.get();
  old.abi_version = (1u << 16) | 0u;
  old.struct_size = static_cast<uint32_t>(offsetof(ddp_host, alloc_host));
  ddp_comm* old_comm = nullptr;
  rank.check(rank.t()->init(&old, &old_comm), "init (ABI 1.0 host)");
  expect_refusal(rank.t()->all_reduce(old_comm, &gpu, DDP_REDUCE_SUM, rank.stream()), DDP_ERR_UNSUPPORTED,
                 "all_reduce: on a CUDA run gloo stages buffers through host->alloc_host, which this engine (ABI "
                 "1.0) lacks: it needs ABI 1.1 or newer");
  rank.t()->destroy(old_comm);

  // Still in step after the refusals.
  rank.all_reduce(x, DDP_REDUCE_SUM);
  rank.sync();
  check_all("all_reduce after the refusals", x.read(), [&](size_t) { return w; });
}

const std::map<std::string, Scenario>& scenarios() {
  static const std::map<std::string, Scenario> all = {
      {"all_reduce", all_reduce_scenario},         {"broadcast", broadcast_scenario},
      {"all_gather", all_gather_scenario},         {"reduce_scatter", reduce_scatter_scenario},
      {"staging_memory", staging_memory_scenario}, {"refusals", refusals_scenario},
  };
  return all;
}

// `world` rank processes of `scenario` (see the header comment).
std::vector<std::string> run_scenario(const std::string& scenario, int world) {
  return run_ranks(
      world,
      [&](int rank, const std::string& dir) {
        const std::string r = std::to_string(rank), w = std::to_string(world);
        const char* argv[] = {"gloo_cuda_test", "--rank", scenario.c_str(), r.c_str(), w.c_str(), dir.c_str(),
                              nullptr};
        execv("/proc/self/exe", const_cast<char* const*>(argv));
        throw std::runtime_error("execv /proc/self/exe failed");
      },
      /*timeout_s=*/120);
}


TEST(GlooCuda, AllReduce) {
  DDP_REQUIRE_GPUS(1);
  EXPECT_RANKS_OK(run_scenario("all_reduce", 2));
}

TEST(GlooCuda, Broadcast) {
  DDP_REQUIRE_GPUS(1);
  EXPECT_RANKS_OK(run_scenario("broadcast", 2));
}

TEST(GlooCuda, AllGather) {
  DDP_REQUIRE_GPUS(1);
  EXPECT_RANKS_OK(run_scenario("all_gather", 2));
}

TEST(GlooCuda, ReduceScatter) {
  DDP_REQUIRE_GPUS(1);
  EXPECT_RANKS_OK(run_scenario("reduce_scatter", 2));
}

TEST(GlooCuda, StagingMemoryIsAccountedAndSettles) {
  DDP_REQUIRE_GPUS(1);
  EXPECT_RANKS_OK(run_scenario("staging_memory", 2));
}

TEST(GlooCuda, Refusals) {
  DDP_REQUIRE_GPUS(1);
  EXPECT_RANKS_OK(run_scenario("refusals", 1));
}

// A rank process: runs one scenario, returns the exit status.
int rank_main(const std::string& scenario, int rank, int world, const std::string& dir) {
  try {
    auto it = scenarios().find(scenario);
    if (it == scenarios().end()) fail("unknown scenario " + scenario);
    it->second(rank, world, dir);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_cuda_test %s, rank %d: %s\n", scenario.c_str(), rank, e.what());
    return 1;
  }
}

}  // namespace
}  // namespace ddp

int main(int argc, char** argv) {
  if (argc == 6 && std::string(argv[1]) == "--rank")
    return ddp::rank_main(argv[2], std::stoi(argv[3]), std::stoi(argv[4]), argv[5]);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
