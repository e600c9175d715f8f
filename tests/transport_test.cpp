// transport_test.cpp — transport conformance: every collective against
// closed-form results for world sizes 1 to 6 and 1 element to 4 MB, one
// forked process per rank (tests/multirank.h), loaded and driven exactly as
// the engine does: load_plugin, a PluginHost over HostServices (CPU device,
// file store), init, collectives enqueued on the comm stream, completion
// observed with an Event. Every expected value is closed-form and exactly
// representable, so results are compared with == (16-bit floats too).
//
// Usage: transport_test [--transport NAME|PATH] [--set transport.key=value]...
//                       [GoogleTest flags]
// (default gloo, its default keys). Tests of the gloo plugin's own wording
// skip for others. Groups (ABI 1.9, split): every collective within groups
// of worlds 2 to 4 against closed forms over their members, beside the
// world's, nested, of one rank, and a member that never issues one; they
// skip for a transport without split.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <ddp/numeric.h>
#include <ddp/plugin.hpp>
#include <gtest/gtest.h>

#include "config.h"
#include "device.h"
#include "cpu_host.h"
#include "device_like_stream.h"
#include "metered_transport.h"
#include "plugin_host.h"
#include "multirank.h"
#include "plugin_loader.h"
#include "rank_checks.h"
#include "split_membership.h"
#include "store.h"
#include "transport_rank.h"

namespace ddp {

// The transport under test (--transport); a name or a path; its keys (--set).
std::string g_transport = "gloo";
std::vector<std::string> g_sets;
namespace {

using namespace std::chrono_literals;

// ------------------------------------------------------------------ helpers


template <typename T>
const char* type_name() {
  if constexpr (std::is_same_v<T, float>) return "float32";
  if constexpr (std::is_same_v<T, double>) return "float64";
  if constexpr (std::is_same_v<T, int32_t>) return "int32";
  return "int64";
}

template <typename T>
ddp_buffer buffer_of(std::vector<T>& v) {
  return ddp_buffer{v.data(), v.size(), dtype_of<T>(), DDP_DEVICE_CPU};
}

// The ABI takes buffers by pointer; a temporary lives to the end of the call.
const ddp_buffer* ptr(const ddp_buffer& b) { return &b; }



// One rank: the engine's pieces around the loaded transport (a CPU device),
// with collectives on std::vector.
class Rank : public test::TransportRank {
 public:
  Rank(int rank, int world, const std::string& dir, int64_t timeout_ms = 30000)
      : TransportRank(std::make_unique<CpuDevice>(), rank, world, dir, "transport_test", g_transport, g_sets,
                      timeout_ms) {}

  template <typename T>
  void all_reduce(std::vector<T>& v, ddp_reduce_op op) {
    TransportRank::all_reduce(buffer_of(v), op);
  }
  template <typename T>
  void broadcast(std::vector<T>& v, int root) {
    TransportRank::broadcast(buffer_of(v), root);
  }
  template <typename T>
  void all_gather(std::vector<T>& send, std::vector<T>& recv) {
    TransportRank::all_gather(buffer_of(send), buffer_of(recv));
  }
  template <typename T>
  void reduce_scatter(std::vector<T>& send, std::vector<T>& recv, ddp_reduce_op op) {
    TransportRank::reduce_scatter(buffer_of(send), buffer_of(recv), op);
  }
};


// Element counts every collective is tried with.
const std::vector<size_t> kCounts = {1, 7, 1000};

// --------------------------------------------------------------- the plugin

// Tests of the gloo plugin itself (its name, caps and messages).
#define GLOO_ONLY() \
  if (g_transport != "gloo") GTEST_SKIP() << "checks the gloo plugin's own wording"

TEST(GlooTransport, Descriptor) {
  GLOO_ONLY();
  // Loading is no Gloo activity: nothing of Gloo runs before init.
  auto plugin = load_plugin(PluginKind::Transport, g_transport, DDP_TEST_PLUGIN_DIR);
  const ddp_transport_v1_t* t = plugin->transport();
  ASSERT_NE(t, nullptr);
  EXPECT_STREQ(t->name, "gloo");
  EXPECT_EQ(t->abi_version, DDP_ABI_VERSION);
  EXPECT_EQ(t->struct_size, sizeof(ddp_transport_v1_t));
  EXPECT_EQ(t->caps & DDP_CAP_DEVICE_CPU, DDP_CAP_DEVICE_CPU);
  EXPECT_EQ(t->caps & DDP_CAP_DEVICE_CUDA, DDP_CAP_DEVICE_CUDA);  // staged through host memory
}

// plugin.hpp's alloc_host over the engine's own host (a transport's staging
// memory): accounted, zeroed and freed on an engine of ABI 1.1; refused by
// name on one of ABI 1.0, whose ddp_host ends before alloc_host.
TEST(HostAbi, AllocHostThroughPluginHpp) {
  test::CpuPluginHost engine_host;
  CpuDevice& device = engine_host.device;
  const plugin::Host host(engine_host.get());
  ASSERT_TRUE(plugin::has_alloc_host(engine_host.get()));
  auto* p = static_cast<unsigned char*>(host.alloc_host(100, DDP_MEM_COMM_BUFFERS));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  for (size_t i = 0; i < 100; ++i) ASSERT_EQ(p[i], 0u) << "byte " << i;
  EXPECT_EQ(device.memory().current(MemCategory::CommBuffers), 100u);
  host.free_host(p);
  EXPECT_EQ(device.memory().current(MemCategory::CommBuffers), 0u);

  ddp_host old = *engine_host.get();
  old.abi_version = (1u << 16) | 0u;
  old.struct_size = static_cast<uint32_t>(offsetof(ddp_host, alloc_host));
  EXPECT_FALSE(plugin::has_alloc_host(&old));
  try {
    plugin::Host(&old).alloc_host(100, DDP_MEM_COMM_BUFFERS);
    ADD_FAILURE() << "alloc_host on an ABI 1.0 engine did not throw";
  } catch (const plugin::Failure& f) {
    EXPECT_EQ(f.status(), DDP_ERR_UNSUPPORTED);
    EXPECT_STREQ(f.what(), "alloc_host: this engine's ABI 1.0 lacks it (it needs ABI 1.1 or newer)");
  }
  EXPECT_EQ(device.memory().current(MemCategory::CommBuffers), 0u);
}

// reduce_scatter is optional since ABI 1.4: a 1.4 strategy sees a
// transport's NULL as NULL (and refuses by name at create), a strategy
// built before 1.4, promised the entry, gets one that refuses by name.
TEST(MeteredTransport, AStrategyBefore14GetsAReduceScatterThatRefusesWhereTheTransportHasNone) {
  test::CpuPluginHost cpu_host("transport", {});
  auto plugin = load_plugin(PluginKind::Transport, "norscatter", DDP_TEST_BROKEN_PLUGIN_DIR);
  MeteredTransport metered(plugin->transport(), nullptr, cpu_host.services);
  EXPECT_EQ(metered.vtable()->reduce_scatter, nullptr);
  metered.serve_strategy_of_minor(4);
  EXPECT_EQ(metered.vtable()->reduce_scatter, nullptr);
  metered.serve_strategy_of_minor(3);
  ASSERT_NE(metered.vtable()->reduce_scatter, nullptr);
  float x[2] = {1, 2};
  const ddp_buffer send{x, 2, DDP_FLOAT32, DDP_DEVICE_CPU}, recv{x, 2, DDP_FLOAT32, DDP_DEVICE_CPU};
  EXPECT_EQ(metered.vtable()->reduce_scatter(metered.comm(), &send, &recv, DDP_REDUCE_SUM, nullptr),
            DDP_ERR_UNSUPPORTED);
  EXPECT_EQ(take_plugin_error(), "reduce_scatter: transport 'norscatter' has none (optional since ABI 1.4)");
}

// The metered transport (what strategies call) on a device stream, as on a
// GPU: timestamps around each collective instead of host tasks, counted
// only when settled, and settle(false) only those the device has passed.
// One rank, in a forked child (the parent stays free of Gloo).
TEST(MeteredTransport, OnADeviceStreamCountsBusyTimeWhenSettled) {
  EXPECT_RANKS_OK(run_ranks(1, [](int, const std::string& dir) {
    Store store("file:" + dir, "metered", std::chrono::milliseconds(30000));
    test::CpuPluginHost cpu_host("transport", g_sets);
    HostServices& services = cpu_host.services;
    services.store = &store;
    PluginHost& host = *cpu_host.host;
    auto plugin = load_plugin(PluginKind::Transport, g_transport, DDP_TEST_PLUGIN_DIR);
    ddp_comm* comm = nullptr;
    host.check(plugin->transport()->init(host.get(), &comm), "init");
    {
      test::DeviceLikeStream stream("comm");
      const ddp_stream s = reinterpret_cast<ddp_stream>(&stream);
      MeteredTransport metered(plugin->transport(), comm, services);
      std::atomic<bool> release{false};
      stream.enqueue([&](bool) {  // the device is busy before the collectives
        while (!release) std::this_thread::sleep_for(1ms);
      });
      std::vector<float> v(1000, 1.5f);
      const ddp_buffer buf{v.data(), v.size(), DDP_FLOAT32, DDP_DEVICE_CPU};
      for (int i = 0; i < 3; ++i)
        host.check(metered.vtable()->all_reduce(metered.comm(), &buf, DDP_REDUCE_SUM, s), "all_reduce");
      if (services.counters.collectives != 3 || services.counters.bytes != 3 * 4000)
        fail("counted " + std::to_string(services.counters.collectives.load()) + " collectives, " +
             std::to_string(services.counters.bytes.load()) + " bytes; expected 3 and 12000");
      metered.settle(false);
      if (services.counters.busy_ns != 0) fail("busy time counted before the device passed the collectives");
      release = true;
      stream.synchronize();
      if (services.counters.busy_ns != 0) fail("busy time counted by the stream, not at settle (host tasks?)");
      metered.settle(false);
      const int64_t busy = services.counters.busy_ns;
      if (busy <= 0) fail("no busy time once the device passed the collectives");
      metered.settle(true);
      if (services.counters.busy_ns != busy) fail("a collective's busy time was counted twice");
      for (float x : v)
        if (x != 1.5f) fail("all_reduce on one rank changed the buffer: " + std::to_string(x));
    }
    plugin->transport()->destroy(comm);
  }));
}

// ------------------------------------------------------------- collectives

class Collectives : public ::testing::TestWithParam<int> {
 protected:
  int world() const { return GetParam(); }
};

TEST_P(Collectives, AllReduceSum) {
  const int w = world();
  EXPECT_RANKS_OK(run_ranks(w, [w](int r, const std::string& dir) {
    Rank rank(r, w, dir);
    std::vector<size_t> counts = kCounts;
    if (w == 2 || w == 4) counts.push_back(size_t{1} << 20);  // 4 MB
    for (size_t n : counts) {
      // r + i/2: every partial sum is exact in float32.
      std::vector<float> x(n);
      for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(r) + 0.5f * static_cast<float>(i);
      rank.all_reduce(x, DDP_REDUCE_SUM);
      rank.sync();
      check_all("all_reduce SUM float32 count " + std::to_string(n), x, [&](size_t i) {
        return w * (w - 1) / 2.0 + w * 0.5 * static_cast<double>(i);
      });
    }
  }));
}

TEST_P(Collectives, AllReduceAvg) {
  const int w = world();
  EXPECT_RANKS_OK(run_ranks(w, [w](int r, const std::string& dir) {
    Rank rank(r, w, dir);
    for (size_t n : kCounts) {
      // w * (r + i % 100): the sum is a multiple of w, so the average is exact.
      std::vector<float> x(n);
      for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(w * (r + static_cast<int>(i % 100)));
      rank.all_reduce(x, DDP_REDUCE_AVG);
      rank.sync();
      check_all("all_reduce AVG float32 count " + std::to_string(n), x, [&](size_t i) {
        return w * (w - 1) / 2.0 + w * static_cast<double>(i % 100);
      });
    }
  }));
}

TEST_P(Collectives, AllReduceOtherDtypes) {
  const int w = world();
  EXPECT_RANKS_OK(run_ranks(w, [w](int r, const std::string& dir) {
    Rank rank(r, w, dir);
    const int64_t tri = int64_t{w} * (w + 1) / 2;  // sum of r + 1
    const int64_t tri0 = int64_t{w} * (w - 1) / 2;  // sum of r
    for (size_t n : kCounts) {
      const std::string at = " count " + std::to_string(n);
      // int32: (r + 1)(i + 1), alternating sign.
      std::vector<int32_t> a(n);
      for (size_t i = 0; i < n; ++i)
        a[i] = (r + 1) * static_cast<int32_t>(i + 1) * (i % 2 ? -1 : 1);
      // int64: needs more than 32 bits.
      std::vector<int64_t> b(n);
      for (size_t i = 0; i < n; ++i) b[i] = (int64_t{r} + 1) * (int64_t{1} << 40) + int64_t(i) - r;
      // float64: 1e10 (r + 1) + i/4, exact in double.
      std::vector<double> c(n);
      for (size_t i = 0; i < n; ++i) c[i] = 1e10 * (r + 1) + 0.25 * static_cast<double>(i);
      // AVG on int32 and float64: multiples of w.
      std::vector<int32_t> d(n);
      for (size_t i = 0; i < n; ++i) d[i] = w * (r - static_cast<int32_t>(i));
      std::vector<double> e(n);
      for (size_t i = 0; i < n; ++i) e[i] = w * (r + 0.5 * static_cast<double>(i));
      // All enqueued back to back, one wait.
      rank.all_reduce(a, DDP_REDUCE_SUM);
      rank.all_reduce(b, DDP_REDUCE_SUM);
      rank.all_reduce(c, DDP_REDUCE_SUM);
      rank.all_reduce(d, DDP_REDUCE_AVG);
      rank.all_reduce(e, DDP_REDUCE_AVG);
      rank.sync();
      check_all("all_reduce SUM int32" + at, a, [&](size_t i) {
        return static_cast<int32_t>(tri * static_cast<int64_t>(i + 1) * (i % 2 ? -1 : 1));
      });
      check_all("all_reduce SUM int64" + at, b, [&](size_t i) {
        return tri * (int64_t{1} << 40) + int64_t{w} * int64_t(i) - tri0;
      });
      check_all("all_reduce SUM float64" + at, c, [&](size_t i) {
        return 1e10 * static_cast<double>(tri) + 0.25 * w * static_cast<double>(i);
      });
      check_all("all_reduce AVG int32" + at, d, [&](size_t i) {
        return static_cast<int32_t>(tri0 - int64_t{w} * static_cast<int64_t>(i));
      });
      check_all("all_reduce AVG float64" + at, e, [&](size_t i) {
        return static_cast<double>(tri0) + w * 0.5 * static_cast<double>(i);
      });
    }
  }));
}

TEST_P(Collectives, Broadcast) {
  const int w = world();
  EXPECT_RANKS_OK(run_ranks(w, [w](int r, const std::string& dir) {
    Rank rank(r, w, dir);
    std::vector<int> roots = {0};
    if (w > 1) roots.push_back(w - 1);
    for (int root : roots) {
      for (size_t n : kCounts) {
        const std::string at = " root " + std::to_string(root) + " count " + std::to_string(n);
        std::vector<float> x(n);
        for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>((r + 1) * 10000 + int(i));
        std::vector<int64_t> y(n);
        for (size_t i = 0; i < n; ++i) y[i] = (int64_t{r} + 1) << 36 | int64_t(i);
        rank.broadcast(x, root);
        rank.broadcast(y, root);
        rank.sync();
        check_all("broadcast float32" + at, x, [&](size_t i) { return (root + 1) * 10000 + int(i); });
        check_all("broadcast int64" + at, y,
                  [&](size_t i) { return (int64_t{root} + 1) << 36 | int64_t(i); });
      }
    }
  }));
}

TEST_P(Collectives, AllGather) {
  const int w = world();
  EXPECT_RANKS_OK(run_ranks(w, [w](int r, const std::string& dir) {
    Rank rank(r, w, dir);
    for (size_t n : kCounts) {
      const std::string at = " count " + std::to_string(n);
      std::vector<float> send(n);
      for (size_t i = 0; i < n; ++i) send[i] = static_cast<float>(r * 1000 + int(i));
      std::vector<float> recv(n * w, -1.0f);  // every slot must be overwritten
      std::vector<int32_t> isend(n);
      for (size_t i = 0; i < n; ++i) isend[i] = -(r * 1000 + int(i)) - 1;
      std::vector<int32_t> irecv(n * w, 7);
      rank.all_gather(send, recv);
      rank.all_gather(isend, irecv);
      rank.sync();
      check_all("all_gather float32" + at, recv,
                [&](size_t j) { return static_cast<float>((j / n) * 1000 + j % n); });
      check_all("all_gather int32" + at, irecv,
                [&](size_t j) { return -static_cast<int32_t>((j / n) * 1000 + j % n) - 1; });
      // The send buffer is left alone.
      check_all("all_gather send buffer" + at, send,
                [&](size_t i) { return static_cast<float>(r * 1000 + int(i)); });
    }
  }));
}

TEST_P(Collectives, ReduceScatter) {
  const int w = world();
  EXPECT_RANKS_OK(run_ranks(w, [w](int r, const std::string& dir) {
    Rank rank(r, w, dir);
    const double tri0 = w * (w - 1) / 2.0;
    for (size_t n : kCounts) {
      const std::string at = " count " + std::to_string(n);
      const size_t total = n * w;
      std::vector<float> sum_send(total), avg_send(total);
      for (size_t j = 0; j < total; ++j) {
        sum_send[j] = static_cast<float>(r) + static_cast<float>(j);
        avg_send[j] = static_cast<float>(w) * (static_cast<float>(r) + static_cast<float>(j));
      }
      std::vector<float> sum_recv(n, -1.0f), avg_recv(n, -1.0f);
      rank.reduce_scatter(sum_send, sum_recv, DDP_REDUCE_SUM);
      rank.reduce_scatter(avg_send, avg_recv, DDP_REDUCE_AVG);
      rank.sync();
      const size_t base = static_cast<size_t>(r) * n;  // this rank's slice
      check_all("reduce_scatter SUM" + at, sum_recv,
                [&](size_t i) { return tri0 + w * static_cast<double>(base + i); });
      check_all("reduce_scatter AVG" + at, avg_recv,
                [&](size_t i) { return tri0 + w * static_cast<double>(base + i); });
      // The send buffer is left alone.
      check_all("reduce_scatter send buffer" + at, sum_send,
                [&](size_t j) { return static_cast<float>(r) + static_cast<float>(j); });
    }
  }));
}

// bfloat16 and float16 (for a transport that declares them): every
// collective on values whose sums are exact in 8 bits of mantissa, compared
// bit for bit; and at world 2 one sum that must round (to nearest even,
// from float32) the way ddp/numeric.h does.
TEST_P(Collectives, SixteenBitFloats) {
  const int w = world();
  {
    auto plugin = load_plugin(PluginKind::Transport, g_transport, DDP_TEST_PLUGIN_DIR);
    const uint64_t dtypes = ddp_transport_dtypes(plugin->transport());
    if (!(dtypes & DDP_DTYPE_BIT(DDP_BFLOAT16)) || !(dtypes & DDP_DTYPE_BIT(DDP_FLOAT16)))
      GTEST_SKIP() << g_transport << " does not declare bfloat16 and float16";
  }
  EXPECT_RANKS_OK(run_ranks(w, [w](int r, const std::string& dir) {
    Rank rank(r, w, dir);
    for (const ddp_dtype dtype : {DDP_BFLOAT16, DDP_FLOAT16}) {
      const auto to16 = [dtype](double x) {
        return dtype == DDP_BFLOAT16 ? ddp_float_to_bf16(float(x)) : ddp_float_to_fp16(float(x));
      };
      const auto buf = [dtype](std::vector<uint16_t>& v) { return ddp_buffer{v.data(), v.size(), dtype, DDP_DEVICE_CPU}; };
      for (size_t n : kCounts) {
        const std::string at = std::string(" ") + ddp_dtype_name(dtype) + " count " + std::to_string(n);
        std::vector<uint16_t> sum(n), avg(n), bcast(n), send(n), recv(n * w), rs_send(n * w), rs_recv(n);
        for (size_t i = 0; i < n; ++i) {
          sum[i] = to16((r + 1) * double(i % 8) * (i % 2 ? -1 : 1));  // sums of at most 21 * 7
          avg[i] = to16(w * double((i + r) % 4));
          bcast[i] = to16(r + 0.5 * double(i % 16));
          send[i] = to16(r * 8 + double(i % 8));
        }
        for (size_t j = 0; j < n * w; ++j) rs_send[j] = to16(double(r + 1) * double(j % 5));
        rank.TransportRank::all_reduce(buf(sum), DDP_REDUCE_SUM);
        rank.TransportRank::all_reduce(buf(avg), DDP_REDUCE_AVG);
        rank.TransportRank::broadcast(buf(bcast), w - 1);
        rank.TransportRank::all_gather(buf(send), buf(recv));
        rank.TransportRank::reduce_scatter(buf(rs_send), buf(rs_recv), DDP_REDUCE_SUM);
        rank.sync();
        const double tri = w * (w + 1) / 2.0;
        check_all("all_reduce SUM" + at, sum, [&](size_t i) { return to16(tri * double(i % 8) * (i % 2 ? -1 : 1)); });
        check_all("all_reduce AVG" + at, avg, [&](size_t i) {
          double total = 0;
          for (int q = 0; q < w; ++q) total += double((i + q) % 4);
          return to16(total);
        });
        check_all("broadcast" + at, bcast, [&](size_t i) { return to16(w - 1 + 0.5 * double(i % 16)); });
        check_all("all_gather" + at, recv, [&](size_t j) { return to16(double(j / n) * 8 + double(j % n % 8)); });
        check_all("reduce_scatter SUM" + at, rs_recv,
                  [&](size_t i) { return to16(tri * double((size_t(r) * n + i) % 5)); });
      }
      if (w == 2) {  // sums that are no 16-bit float: a tie (to even: 1) and one that rounds up
        const int ulp_exp = dtype == DDP_BFLOAT16 ? -7 : -10;  // of 1
        const double tie = std::ldexp(1.0, ulp_exp - 1), up = 3 * std::ldexp(1.0, ulp_exp - 2);
        std::vector<uint16_t> x(1, to16(r == 0 ? 1.0 : tie)), y(1, to16(r == 0 ? 1.0 : up));
        rank.TransportRank::all_reduce(buf(x), DDP_REDUCE_SUM);
        rank.TransportRank::all_reduce(buf(y), DDP_REDUCE_SUM);
        rank.sync();
        check_all(std::string("all_reduce SUM, a tie, ") + ddp_dtype_name(dtype), x, [&](size_t) { return to16(1.0); });
        check_all(std::string("all_reduce SUM, rounding up, ") + ddp_dtype_name(dtype), y,
                  [&](size_t) { return to16(1.0 + std::ldexp(1.0, ulp_exp)); });
      }
    }
  }));
}

TEST_P(Collectives, Barrier) {
  const int w = world();
  EXPECT_RANKS_OK(run_ranks(w, [w](int r, const std::string& dir) {
    namespace fs = std::filesystem;
    Rank rank(r, w, dir);
    const fs::path marks = fs::path(dir) / "barrier_marks";
    fs::create_directories(marks);
    rank.barrier();  // everyone is connected and here
    rank.sync();
    // Each rank leaves a mark just before the barrier, rank 0 late; after
    // the barrier every rank must see every mark.
    if (r == 0) std::this_thread::sleep_for(200ms);
    std::ofstream(marks / std::to_string(r)).put('x');
    rank.barrier();
    rank.sync();
    for (int s = 0; s < w; ++s)
      if (!fs::exists(marks / std::to_string(s)))
        fail("left the barrier before rank " + std::to_string(s) + " reached it");
    // Several in a row complete too.
    for (int k = 0; k < 5; ++k) rank.barrier();
    rank.sync();
  }));
}

// Different collectives back to back with no wait in between: each keeps
// its own tag, so they never mix up.
TEST_P(Collectives, MixedSequenceWithoutWaiting) {
  const int w = world();
  EXPECT_RANKS_OK(run_ranks(w, [w](int r, const std::string& dir) {
    Rank rank(r, w, dir);
    const size_t n = 100;
    std::vector<float> ar(n), bc(n), ag_send(n), ag_recv(n * w), rs_send(n * w), rs_recv(n);
    for (size_t i = 0; i < n; ++i) {
      ar[i] = static_cast<float>(r + 1);
      bc[i] = static_cast<float>(r == w - 1 ? 4242 : -1);
      ag_send[i] = static_cast<float>(r);
    }
    for (size_t j = 0; j < n * w; ++j) rs_send[j] = static_cast<float>(j % n);
    for (int round = 0; round < 3; ++round) {
      rank.all_reduce(ar, DDP_REDUCE_SUM);
      rank.barrier();
    }
    rank.broadcast(bc, w - 1);
    rank.all_gather(ag_send, ag_recv);
    rank.reduce_scatter(rs_send, rs_recv, DDP_REDUCE_SUM);
    rank.sync();
    // three SUMs: (w(w+1)/2) * w * w
    const double s = w * (w + 1) / 2.0;
    check_all("all_reduce x3", ar, [&](size_t) { return s * w * w; });
    check_all("broadcast", bc, [&](size_t) { return 4242.0; });
    check_all("all_gather", ag_recv, [&](size_t j) { return static_cast<double>(j / n); });
    check_all("reduce_scatter", rs_recv, [&](size_t i) { return static_cast<double>(w * i); });
  }));
}

INSTANTIATE_TEST_SUITE_P(Worlds, Collectives, ::testing::Values(1, 2, 3, 4, 6),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "world" + std::to_string(info.param);
                         });

// ------------------------------------------------------------------ groups

// Groups (ABI 1.9, the transport's optional split), made as the engine makes
// them: every rank's color and key known to all, the membership computed
// here (split_membership.h), split called on every rank of the parent with
// this rank's place, its group's size and a tag unique to the group. Every
// collective on a group is then checked against closed forms over its
// members alone, named by their world ranks.

TEST(SplitMembership, OrdersByKeyThenParentRank) {
  using test::membership;
  // colors 0 1 0 1 0, keys 3 0 1 0 1: color 0 is parent ranks 0, 2, 4 with
  // keys 3, 1, 1 -> 2, 4 (a tie: parent order), 0.
  const std::vector<int> colors = {0, 1, 0, 1, 0}, keys = {3, 0, 1, 0, 1};
  EXPECT_EQ(membership(colors, keys, 0).members, (std::vector<int>{2, 4, 0}));
  EXPECT_EQ(membership(colors, keys, 0).rank, 2);
  EXPECT_EQ(membership(colors, keys, 4).rank, 1);
  EXPECT_EQ(membership(colors, keys, 2).rank, 0);
  EXPECT_EQ(membership(colors, keys, 3).members, (std::vector<int>{1, 3}));
  EXPECT_EQ(membership(colors, keys, 3).rank, 1);
  // Keys reversed: the group's order is the parent's backwards.
  EXPECT_EQ(membership({0, 0, 0}, {0, -1, -2}, 0).members, (std::vector<int>{2, 1, 0}));
  EXPECT_EQ(membership({5}, {0}, 0).size(), 1);
  EXPECT_THROW(membership({0, 1}, {0}, 0), std::invalid_argument);
}

bool transport_has_split() {
  auto plugin = load_plugin(PluginKind::Transport, g_transport, DDP_TEST_PLUGIN_DIR);
  return DDP_PLUGIN_HAS(plugin->transport(), split);
}

// Group cases need the transport's split; one without it (optional since
// ABI 1.9) skips them, saying so. Loading runs nothing of the transport.
#define REQUIRE_SPLIT()     \
  if (!transport_has_split()) \
  GTEST_SKIP() << g_transport << " has no split (optional since ABI 1.9): it makes no groups"

// One rank's communicator of a group: made with split from `parent` (the
// world's, or another group's) on every rank of it, collectives on the
// rank's comm stream, destroyed before its parent (the stream drained
// first, as the engine does). `world` names each member's world rank.
class Group {
 public:
  // parent_world[p]: parent rank p's world rank; me: this rank in parent;
  // colors and keys: every parent rank's.
  Group(Rank& rank, ddp_comm* parent, const std::vector<int>& parent_world, int me, const std::vector<int>& colors,
        const std::vector<int>& keys, const std::string& tag)
      : rank_(rank), tag_(tag) {
    const test::Membership m = test::membership(colors, keys, me);
    for (int p : m.members) world_.push_back(parent_world[size_t(p)]);
    rank_in_ = m.rank;
    const ddp_split how = test::split_request(m, colors[size_t(me)], keys[size_t(me)], tag_);
    rank.check(rank.t()->split(parent, &how, &comm_), "split");
    if (comm_ == nullptr) fail("split " + tag + " returned DDP_OK and no communicator");
  }
  // A group of the world.
  Group(Rank& rank, const std::vector<int>& colors, const std::vector<int>& keys, const std::string& tag)
      : Group(rank, rank.comm(), iota(rank.world()), rank.rank(), colors, keys, tag) {}
  // A group of another group (a split of a split).
  Group(Group& parent, const std::vector<int>& colors, const std::vector<int>& keys, const std::string& tag)
      : Group(parent.rank_, parent.comm_, parent.world_, parent.rank_in_, colors, keys, tag) {}
  ~Group() {
    try {
      rank_.device().comm_stream().synchronize();
    } catch (...) {  // a failed stream is drained all the same
    }
    rank_.t()->destroy(comm_);
  }
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  int rank() const { return rank_in_; }
  int size() const { return int(world_.size()); }
  const std::vector<int>& world() const { return world_; }  // [size]: each member's world rank
  int sum_of_world_ranks() const { return std::accumulate(world_.begin(), world_.end(), 0); }
  const std::string& tag() const { return tag_; }
  ddp_comm* comm() const { return comm_; }

  template <typename T>
  void all_reduce(std::vector<T>& v, ddp_reduce_op op) {
    rank_.check(rank_.t()->all_reduce(comm_, ptr(buffer_of(v)), op, rank_.stream()), "group all_reduce");
  }
  template <typename T>
  void broadcast(std::vector<T>& v, int root) {
    rank_.check(rank_.t()->broadcast(comm_, ptr(buffer_of(v)), root, rank_.stream()), "group broadcast");
  }
  template <typename T>
  void all_gather(std::vector<T>& send, std::vector<T>& recv) {
    rank_.check(rank_.t()->all_gather(comm_, ptr(buffer_of(send)), ptr(buffer_of(recv)), rank_.stream()),
                "group all_gather");
  }
  template <typename T>
  void reduce_scatter(std::vector<T>& send, std::vector<T>& recv, ddp_reduce_op op) {
    rank_.check(rank_.t()->reduce_scatter(comm_, ptr(buffer_of(send)), ptr(buffer_of(recv)), op, rank_.stream()),
                "group reduce_scatter");
  }
  void barrier() { rank_.check(rank_.t()->barrier(comm_, rank_.stream()), "group barrier"); }

  static std::vector<int> iota(int n) {
    std::vector<int> v(size_t(n), 0);
    std::iota(v.begin(), v.end(), 0);
    return v;
  }

 private:
  Rank& rank_;
  std::string tag_;
  std::vector<int> world_;
  int rank_in_ = -1;
  ddp_comm* comm_ = nullptr;
};

// Every collective on `g` against closed forms over its members' world
// ranks m (this rank: me, place q of s): all_reduce SUM of (m + 1)(i % 13 +
// 1) and AVG of s(m + i % 7) (exact: the sum is a multiple of s); broadcast
// from the group's root 0 and s - 1 (float32, int32); all_gather of
// m·1000 + i in the group's order; reduce_scatter SUM of (m + 1) j and AVG
// of s(m + j), of which rank q holds [q n, (q + 1) n); and a barrier that
// every member's mark precedes (group rank 0 arrives late). Every value is
// exact in float32.
void check_group_collectives(Rank& rank, Group& g, const std::string& dir) {
  namespace fs = std::filesystem;
  const int s = g.size(), q = g.rank(), me = rank.rank();
  const double members = g.sum_of_world_ranks();  // sum of m
  const std::string at = " in group " + g.tag() + " (rank " + std::to_string(q) + " of " + std::to_string(s) + ")";
  for (size_t n : kCounts) {
    const std::string count = at + " count " + std::to_string(n);
    std::vector<float> sum(n), avg(n), bcast_first(n), send(n), recv(n * s, -1.0f);
    std::vector<int32_t> bcast_last(n);
    std::vector<float> rs_sum_send(n * s), rs_avg_send(n * s), rs_sum(n, -1.0f), rs_avg(n, -1.0f);
    for (size_t i = 0; i < n; ++i) {
      sum[i] = float((me + 1) * int(i % 13 + 1));
      avg[i] = float(s * (me + int(i % 7)));
      bcast_first[i] = float((me + 1) * 1000 + int(i));
      bcast_last[i] = -((me + 1) * 1000 + int(i));
      send[i] = float(me * 1000 + int(i));
    }
    for (size_t j = 0; j < n * s; ++j) {
      rs_sum_send[j] = float(me + 1) * float(j);
      rs_avg_send[j] = float(s) * float(me + int(j));
    }
    g.all_reduce(sum, DDP_REDUCE_SUM);
    g.all_reduce(avg, DDP_REDUCE_AVG);
    g.broadcast(bcast_first, 0);
    g.broadcast(bcast_last, s - 1);
    g.all_gather(send, recv);
    g.reduce_scatter(rs_sum_send, rs_sum, DDP_REDUCE_SUM);
    g.reduce_scatter(rs_avg_send, rs_avg, DDP_REDUCE_AVG);
    rank.sync();
    check_all("group all_reduce SUM" + count, sum, [&](size_t i) { return (members + s) * double(i % 13 + 1); });
    check_all("group all_reduce AVG" + count, avg, [&](size_t i) { return members + s * double(i % 7); });
    check_all("group broadcast from root 0" + count, bcast_first,
              [&](size_t i) { return (g.world().front() + 1) * 1000 + int(i); });
    check_all("group broadcast from root s - 1" + count, bcast_last,
              [&](size_t i) { return -((g.world().back() + 1) * 1000 + int(i)); });
    check_all("group all_gather" + count, recv, [&](size_t j) { return g.world()[j / n] * 1000 + int(j % n); });
    check_all("group reduce_scatter SUM" + count, rs_sum,
              [&](size_t i) { return (members + s) * double(size_t(q) * n + i); });
    check_all("group reduce_scatter AVG" + count, rs_avg,
              [&](size_t i) { return members + s * double(size_t(q) * n + i); });
  }
  // The barrier: each member leaves a mark just before it, rank 0 late; past
  // it, every member's mark is there.
  const fs::path marks = fs::path(dir) / ("marks." + g.tag());
  fs::create_directories(marks);
  g.barrier();
  rank.sync();
  if (q == 0) std::this_thread::sleep_for(200ms);
  std::ofstream(marks / std::to_string(q)).put('x');
  g.barrier();
  rank.sync();
  for (int p = 0; p < s; ++p)
    if (!fs::exists(marks / std::to_string(p)))
      fail("left the barrier" + at + " before its rank " + std::to_string(p) + " reached it");
}

class Groups : public ::testing::TestWithParam<int> {
 protected:
  int world() const { return GetParam(); }
};

// Two splits of the world by rank % 2, both alive at once: keys in world
// order, then reversed (so that the group's order is not the world's: the
// all_gather's order and the broadcast's roots say which rank is which).
TEST_P(Groups, EveryCollectiveWithinEachGroup) {
  REQUIRE_SPLIT();
  const int w = world();
  EXPECT_RANKS_OK(run_ranks(w, [w](int r, const std::string& dir) {
    Rank rank(r, w, dir);
    std::vector<int> colors(static_cast<size_t>(w)), keys(static_cast<size_t>(w)), reversed(static_cast<size_t>(w));
    for (int p = 0; p < w; ++p) {
      colors[size_t(p)] = p % 2;
      keys[size_t(p)] = p;
      reversed[size_t(p)] = -p;
    }
    Group in_order(rank, colors, keys, "ddp.group.1." + std::to_string(r % 2));
    Group backwards(rank, colors, reversed, "ddp.group.2." + std::to_string(r % 2));
    const int s = (w - r % 2 + 1) / 2;  // ranks of w with r's parity
    if (in_order.size() != s || backwards.size() != s) fail("a group of " + std::to_string(in_order.size()));
    if (backwards.world().front() != in_order.world().back()) fail("the reversed keys did not reverse the group");
    check_group_collectives(rank, in_order, dir);
    check_group_collectives(rank, backwards, dir);
  }));
}

// Collectives of the world and of a group, enqueued in one fixed order on
// the same stream without waiting in between, then one wait: each keeps
// its own communicator's sequence, none mixes with another's.
TEST_P(Groups, GroupAndWorldCollectivesInterleavedOnOneStream) {
  REQUIRE_SPLIT();
  const int w = world();
  EXPECT_RANKS_OK(run_ranks(w, [w](int r, const std::string& dir) {
    Rank rank(r, w, dir);
    std::vector<int> colors(static_cast<size_t>(w)), keys(static_cast<size_t>(w));
    for (int p = 0; p < w; ++p) {
      colors[size_t(p)] = p % 2;
      keys[size_t(p)] = w - p;  // reversed
    }
    Group g(rank, colors, keys, "ddp.group.1." + std::to_string(r % 2));
    const int s = g.size(), q = g.rank();
    const double members = g.sum_of_world_ranks();
    const size_t n = 100;
    std::vector<float> world_sum(n, float(r + 1)), group_sum(n, float(r + 1)), world_avg(n, float(w * r));
    std::vector<float> group_send(n, float(r)), group_recv(n * s, -1.0f), world_send(n, float(r * 10)),
        world_recv(n * w, -1.0f);
    std::vector<float> world_bcast(n, float(r)), group_bcast(n, float(r)), rs_send(n * s), rs_recv(n, -1.0f);
    for (size_t j = 0; j < n * s; ++j) rs_send[j] = float(r + 1) * float(j);
    rank.all_reduce(world_sum, DDP_REDUCE_SUM);
    g.all_reduce(group_sum, DDP_REDUCE_SUM);
    g.all_gather(group_send, group_recv);
    rank.broadcast(world_bcast, w - 1);
    g.broadcast(group_bcast, 0);
    rank.barrier();
    g.reduce_scatter(rs_send, rs_recv, DDP_REDUCE_SUM);
    rank.all_gather(world_send, world_recv);
    g.barrier();
    rank.all_reduce(world_avg, DDP_REDUCE_AVG);
    g.all_reduce(group_sum, DDP_REDUCE_SUM);  // again: s times the first sum
    rank.sync();
    check_all("world all_reduce SUM", world_sum, [&](size_t) { return w * (w + 1) / 2.0; });
    check_all("group all_reduce SUM, twice", group_sum, [&](size_t) { return s * (members + s); });
    check_all("group all_gather", group_recv, [&](size_t j) { return double(g.world()[j / n]); });
    check_all("world broadcast", world_bcast, [&](size_t) { return double(w - 1); });
    check_all("group broadcast", group_bcast, [&](size_t) { return double(g.world().front()); });
    check_all("group reduce_scatter", rs_recv, [&](size_t i) { return (members + s) * double(size_t(q) * n + i); });
    check_all("world all_gather", world_recv, [&](size_t j) { return double(j / n * 10); });
    check_all("world all_reduce AVG", world_avg, [&](size_t) { return w * (w - 1) / 2.0; });
  }));
}

// A split of a split: the world without rank 0, backwards (keys -r), then
// that group split by its own ranks' parity; every level checked, the
// nested groups named by world ranks through their parent's membership.
TEST_P(Groups, SplitOfASplit) {
  REQUIRE_SPLIT();
  const int w = world();
  EXPECT_RANKS_OK(run_ranks(w, [w](int r, const std::string& dir) {
    Rank rank(r, w, dir);
    std::vector<int> colors(static_cast<size_t>(w)), keys(static_cast<size_t>(w));
    for (int p = 0; p < w; ++p) {
      colors[size_t(p)] = p == 0 ? 1 : 0;
      keys[size_t(p)] = -p;
    }
    Group outer(rank, colors, keys, "ddp.group.1." + std::to_string(colors[size_t(r)]));
    std::vector<int> inner_colors(size_t(outer.size())), inner_keys(size_t(outer.size()));
    for (int p = 0; p < outer.size(); ++p) {
      inner_colors[size_t(p)] = p % 2;
      inner_keys[size_t(p)] = p;
    }
    Group inner(outer, inner_colors, inner_keys,
                "ddp.group.2." + std::to_string(colors[size_t(r)]) + "." + std::to_string(outer.rank() % 2));
    // The outer group of w - 1 ranks is w - 1, ..., 1; its even places form one inner group.
    if (r != 0) {
      std::vector<int> expected;
      for (int p = outer.rank() % 2; p < w - 1; p += 2) expected.push_back(w - 1 - p);
      if (inner.world() != expected) fail("the nested group is not the outer one's ranks of one parity");
    }
    check_group_collectives(rank, inner, dir);
    check_group_collectives(rank, outer, dir);
    std::vector<float> x(10, float(r));
    rank.all_reduce(x, DDP_REDUCE_SUM);  // the world still works beside them
    rank.sync();
    check_all("world all_reduce after the nested groups", x, [&](size_t) { return w * (w - 1) / 2.0; });
  }));
}

// Every rank its own group (color = rank): collectives of one rank leave
// the values (AVG divides by 1, all_gather and reduce_scatter copy).
TEST_P(Groups, GroupsOfOneRank) {
  REQUIRE_SPLIT();
  const int w = world();
  EXPECT_RANKS_OK(run_ranks(w, [w](int r, const std::string& dir) {
    Rank rank(r, w, dir);
    std::vector<int> colors(static_cast<size_t>(w)), keys(size_t(w), 0);
    std::iota(colors.begin(), colors.end(), 0);
    Group alone(rank, colors, keys, "ddp.group.1." + std::to_string(r));
    if (alone.size() != 1 || alone.rank() != 0) fail("a group of one is of " + std::to_string(alone.size()));
    check_group_collectives(rank, alone, dir);
  }));
}

// The group's own size bounds broadcast's root and sets the counts of
// all_gather and reduce_scatter: the world's counts are refused on a
// smaller group, at enqueue time, and the group stays in step.
TEST_P(Groups, ArgumentsAreCheckedAgainstTheGroupsSize) {
  REQUIRE_SPLIT();
  const int w = world();
  EXPECT_RANKS_OK(run_ranks(w, [w](int r, const std::string& dir) {
    Rank rank(r, w, dir);
    std::vector<int> colors(static_cast<size_t>(w)), keys(static_cast<size_t>(w));
    for (int p = 0; p < w; ++p) {
      colors[size_t(p)] = p % 2;
      keys[size_t(p)] = p;
    }
    Group g(rank, colors, keys, "ddp.group.1." + std::to_string(r % 2));
    const int s = g.size();
    const bool shared_words = g_transport == "gloo" || g_transport == "mpi";  // ddp/transport.hpp's checks
    auto expect_refusal = [&](ddp_status got, const std::string& text, const std::string& what) {
      const std::string msg = take_plugin_error();
      if (got != DDP_ERR_INVALID_ARGUMENT) fail(what + ": status " + std::to_string(got) + ", expected invalid_argument");
      if (shared_words && msg != text) fail(what + ": error text \"" + msg + "\", expected \"" + text + "\"");
    };
    const ddp_transport_v1_t* t = rank.t();
    std::vector<float> x(4, 1.0f), world_recv(4 * size_t(w)), world_send(4 * size_t(w));
    expect_refusal(t->broadcast(g.comm(), ptr(buffer_of(x)), s, rank.stream()),
                   "broadcast: root " + std::to_string(s) + " out of range (a group of " + std::to_string(s) +
                       (s == 1 ? " rank)" : " ranks)"),
                   "broadcast root s");
    const std::string size = "the group's size (" + std::to_string(s) + ")";
    expect_refusal(t->all_gather(g.comm(), ptr(buffer_of(x)), ptr(buffer_of(world_recv)), rank.stream()),
                   "all_gather: recv must hold send.count * " + size + " elements of send's dtype",
                   "all_gather of the world's count");
    expect_refusal(t->reduce_scatter(g.comm(), ptr(buffer_of(world_send)), ptr(buffer_of(x)), DDP_REDUCE_SUM,
                                     rank.stream()),
                   "reduce_scatter: send must hold recv.count * " + size + " elements of recv's dtype",
                   "reduce_scatter of the world's count");
    rank.sync();
    g.all_reduce(x, DDP_REDUCE_SUM);
    rank.sync();
    check_all("group all_reduce after refusals", x, [&](size_t) { return double(s); });
  }));
}

// A request split cannot serve is refused on every rank alike, before any
// rendezvous (so none waits), leaving *out alone; a good one then works.
TEST_P(Groups, SplitRefusesABadRequest) {
  REQUIRE_SPLIT();
  const int w = world();
  EXPECT_RANKS_OK(run_ranks(w, [w](int r, const std::string& dir) {
    Rank rank(r, w, dir);
    const std::string tag = "ddp.group.1.0", empty;
    const test::Membership all = test::membership(std::vector<int>(size_t(w), 0), std::vector<int>(size_t(w), 0), r);
    const std::string prefix = g_transport + " split: ";
    auto refused = [&](ddp_split how, const std::string& text, const std::string& what) {
      ddp_comm* sentinel = reinterpret_cast<ddp_comm*>(&rank);
      ddp_comm* out = sentinel;
      const auto start = std::chrono::steady_clock::now();
      const ddp_status got = rank.t()->split(rank.comm(), &how, &out);
      const std::string msg = take_plugin_error();
      if (got != DDP_ERR_INVALID_ARGUMENT) fail(what + ": status " + std::to_string(got) + ": " + msg);
      if (out != sentinel) fail(what + ": *out was written");
      if (std::chrono::steady_clock::now() - start > 1s) fail(what + ": took over a second (a rendezvous?)");
      if ((g_transport == "gloo" || g_transport == "mpi") && msg != prefix + text)
        fail(what + ": error text \"" + msg + "\", expected \"" + prefix + text + "\"");
    };
    ddp_split how = test::split_request(all, 0, 0, tag);
    how.color = -1;
    refused(how, "color -1 is negative", "negative color");
    how = test::split_request(all, 0, 0, tag);
    how.rank = w;
    refused(how,
            "rank " + std::to_string(w) + " of a group of " + std::to_string(w) + " ranks, from a parent of " +
                std::to_string(w) + ": a group has 1 to the parent's ranks, and its rank is below its size",
            "rank past the size");
    how = test::split_request(all, 0, 0, tag);
    how.size = w + 1;
    refused(how,
            "rank " + std::to_string(r) + " of a group of " + std::to_string(w + 1) + " ranks, from a parent of " +
                std::to_string(w) + ": a group has 1 to the parent's ranks, and its rank is below its size",
            "a group larger than its parent");
    how = test::split_request(all, 0, 0, empty);
    refused(how, "no tag (the group's name in the rendezvous)", "empty tag");
    how = test::split_request(all, 0, 0, tag);
    how.struct_size = offsetof(ddp_split, tag);
    refused(how,
            "the request is " + std::to_string(offsetof(ddp_split, tag)) + " bytes; its fields through tag take " +
                std::to_string(offsetof(ddp_split, tag) + sizeof(const char*)),
            "a request without its tag");
    std::vector<int> colors(size_t(w), 0), keys(size_t(w), 0);
    Group g(rank, colors, keys, tag);
    std::vector<float> x(3, float(r));
    g.all_reduce(x, DDP_REDUCE_SUM);
    rank.sync();
    check_all("all_reduce on the good split", x, [&](size_t) { return w * (w - 1) / 2.0; });
  }));
}

// One member never issues the group's second collective: the others' fails
// with DDP_ERR_TIMEOUT after the run's timeout (2 s), not before and not
// long after; the member that held back stays alive (its connections open)
// until they are through.
TEST_P(Groups, ACollectiveOneMemberNeverIssuesTimesOut) {
  REQUIRE_SPLIT();
  if (g_transport == "mpi")
    GTEST_SKIP() << "mpi cannot cancel a collective it gave up on: the process then skips MPI_Finalize, which "
                    "mpirun reports as a failed launch (a run ends with abort: MPI_Abort)";
  const int w = world();
  EXPECT_RANKS_OK(run_ranks(w, [w](int r, const std::string& dir) {
    Rank rank(r, w, dir, /*timeout_ms=*/2000);
    Store done("file:" + dir, "groups_done", std::chrono::milliseconds(30000));
    std::vector<int> colors(size_t(w), 0), keys(static_cast<size_t>(w));
    for (int p = 0; p < w; ++p) keys[size_t(p)] = -p;  // the group's rank 0 is world rank w - 1
    Group g(rank, colors, keys, "ddp.group.1.0");
    std::vector<float> x(1000, 1.0f);
    g.all_reduce(x, DDP_REDUCE_SUM);  // every member: connected and in step
    rank.sync();
    check_all("first group all_reduce", x, [&](size_t) { return double(w); });
    if (g.rank() == 0) {  // holds back, then waits for the others
      for (int p = 0; p < w - 1; ++p) done.get("done." + std::to_string(p));
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    g.all_reduce(x, DDP_REDUCE_SUM);
    ddp_status status = DDP_OK;
    std::string message;
    try {
      rank.sync();
    } catch (const Error& e) {
      status = e.status();
      message = e.what();
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    done.set("done." + std::to_string(r), {'1'});
    if (message.empty()) fail("the group all_reduce without one member completed");
    if (status != DDP_ERR_TIMEOUT) fail("status " + std::to_string(status) + ", expected timeout: " + message);
    if (waited < 1.9) fail("failed after " + std::to_string(waited) + " s, before the 2 s timeout: " + message);
    if (waited > 6.0) fail("timed out only after " + std::to_string(waited) + " s: " + message);
  }));
}

// mpi checks MPI_Comm_split's rank and size against the engine's: a
// request whose rank is not MPI's (here every rank claims the next one's
// place) is refused on every rank with both named, not used.
TEST_P(Groups, MpiRefusesARankItDisagreesWith) {
  if (g_transport != "mpi") GTEST_SKIP() << "checks the mpi plugin's own check of MPI_Comm_split";
  const int w = world();
  EXPECT_RANKS_OK(run_ranks(w, [w](int r, const std::string& dir) {
    Rank rank(r, w, dir);
    const std::string tag = "ddp.group.1.0";
    ddp_split how = test::split_request(
        test::membership(std::vector<int>(static_cast<size_t>(w), 0), std::vector<int>(static_cast<size_t>(w), 0), r),
        0, 0, tag);
    how.rank = (r + 1) % w;  // a rotation: no rank keeps its own place
    ddp_comm* out = nullptr;
    const ddp_status got = rank.t()->split(rank.comm(), &how, &out);
    const std::string msg = take_plugin_error();
    const std::string expected = "mpi split: group 'ddp.group.1.0': MPI_Comm_split made rank " + std::to_string(r) +
                                 " of " + std::to_string(w) + ", the engine computed rank " +
                                 std::to_string((r + 1) % w) + " of " + std::to_string(w);
    if (got != DDP_ERR_INTERNAL || out != nullptr || msg != expected)
      fail("split returned " + std::to_string(got) + ": \"" + msg + "\", expected \"" + expected + "\"");
  }));
}

INSTANTIATE_TEST_SUITE_P(Worlds, Groups, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "world" + std::to_string(info.param);
                         });

// ------------------------------------------------------------------ refusals

// Refusals happen at enqueue time, in the caller's thread, with the text the
// plugin set; they enqueue nothing and use no tag, so the ranks stay in step
// even when they were refused different numbers of calls.
TEST(GlooTransport, RefusalsAtEnqueue) {
  GLOO_ONLY();
  const int w = 2;
  EXPECT_RANKS_OK(run_ranks(w, [](int r, const std::string& dir) {
    Rank rank(r, w, dir, /*timeout_ms=*/5000);
    auto expect_refusal = [&](ddp_status got, ddp_status want, const std::string& text,
                              const std::string& what) {
      const std::string msg = take_plugin_error();
      if (got != want)
        fail(what + ": status " + std::to_string(got) + ", expected " + std::to_string(want));
      if (msg != text) fail(what + ": error text \"" + msg + "\", expected \"" + text + "\"");
    };
    std::vector<float> x(8, 1.0f), big(16, 0.0f);
    ddp_buffer cuda{x.data(), x.size(), DDP_FLOAT32, DDP_DEVICE_CUDA};
    const ddp_transport_v1_t* t = rank.t();

    const std::string on_cpu_run = ": a CUDA buffer on a run whose device is not CUDA";
    for (int k = 0; k <= r; ++k) {  // rank 1 is refused twice as often
      expect_refusal(t->all_reduce(rank.comm(), &cuda, DDP_REDUCE_SUM, rank.stream()),
                     DDP_ERR_UNSUPPORTED, "all_reduce" + on_cpu_run, "all_reduce cuda");
    }
    expect_refusal(t->broadcast(rank.comm(), &cuda, 0, rank.stream()), DDP_ERR_UNSUPPORTED,
                   "broadcast" + on_cpu_run, "broadcast cuda");
    const ddp_buffer big_cuda{big.data(), 16, DDP_FLOAT32, DDP_DEVICE_CUDA};
    expect_refusal(t->all_gather(rank.comm(), &cuda, &big_cuda, rank.stream()), DDP_ERR_UNSUPPORTED,
                   "all_gather" + on_cpu_run, "all_gather cuda");
    expect_refusal(t->all_gather(rank.comm(), ptr(buffer_of(x)), &big_cuda, rank.stream()),
                   DDP_ERR_INVALID_ARGUMENT,
                   "all_gather: send and recv are on different kinds of device (cpu and cuda): both must be "
                   "CPU or both CUDA",
                   "all_gather mixed");
    expect_refusal(t->reduce_scatter(rank.comm(), &big_cuda, ptr(buffer_of(x)), DDP_REDUCE_SUM, rank.stream()),
                   DDP_ERR_INVALID_ARGUMENT,
                   "reduce_scatter: send and recv are on different kinds of device (cuda and cpu): both must be "
                   "CPU or both CUDA",
                   "reduce_scatter mixed");
    ddp_buffer unknown{x.data(), x.size(), static_cast<ddp_dtype>(6), DDP_DEVICE_CPU};  // no dtype of ABI 1.3
    expect_refusal(t->all_reduce(rank.comm(), &unknown, DDP_REDUCE_SUM, rank.stream()),
                   DDP_ERR_UNSUPPORTED,
                   "all_reduce: dtype not supported (float32, float64, int32, int64, bfloat16, float16)",
                   "all_reduce dtype 6");
    ddp_buffer null_buf{nullptr, 4, DDP_FLOAT32, DDP_DEVICE_CPU};
    expect_refusal(t->all_reduce(rank.comm(), &null_buf, DDP_REDUCE_SUM, rank.stream()),
                   DDP_ERR_INVALID_ARGUMENT, "all_reduce: NULL buffer", "all_reduce NULL");
    expect_refusal(t->broadcast(rank.comm(), ptr(buffer_of(x)), w, rank.stream()),
                   DDP_ERR_INVALID_ARGUMENT, "broadcast: root 2 out of range", "broadcast root");
    expect_refusal(t->broadcast(rank.comm(), ptr(buffer_of(x)), -1, rank.stream()),
                   DDP_ERR_INVALID_ARGUMENT, "broadcast: root -1 out of range", "broadcast root");
    std::vector<float> small_recv(15);
    expect_refusal(t->all_gather(rank.comm(), ptr(buffer_of(x)), ptr(buffer_of(small_recv)), rank.stream()),
                   DDP_ERR_INVALID_ARGUMENT,
                   "all_gather: recv must hold send.count * world_size elements of send's dtype",
                   "all_gather count");
    std::vector<float> rs_recv(3);
    expect_refusal(t->reduce_scatter(rank.comm(), ptr(buffer_of(x)), ptr(buffer_of(rs_recv)), DDP_REDUCE_SUM,
                                     rank.stream()),
                   DDP_ERR_INVALID_ARGUMENT,
                   "reduce_scatter: send must hold recv.count * world_size elements of recv's dtype",
                   "reduce_scatter count");
    // PluginHost::check words it for the engine.
    try {
      rank.check(t->all_reduce(rank.comm(), &cuda, DDP_REDUCE_SUM, rank.stream()), "all_reduce");
      fail("check did not throw");
    } catch (const Error& e) {
      if (std::string(e.what()) != "transport plugin 'gloo': all_reduce: all_reduce" + on_cpu_run)
        fail(std::string("check threw \"") + e.what() + "\"");
    }

    // Nothing was enqueued and the stream is healthy; the ranks still agree.
    rank.sync();
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(r + 1) * 3.0f;
    rank.all_reduce(x, DDP_REDUCE_SUM);
    rank.sync();
    check_all("all_reduce after refusals", x, [&](size_t) { return 9.0; });
  }));
}

// ------------------------------------------------------------------ timeout

// Rank 1 connects and then never joins the collective: rank 0's all_reduce
// times out after timeout_ms, failing its comm stream; the event reports
// Gloo's words behind the collective's name, and the failure is sticky.
TEST(GlooTransport, PeerThatNeverJoinsTimesOut) {
  GLOO_ONLY();
  const int w = 2;
  EXPECT_RANKS_OK(run_ranks(w, [](int r, const std::string& dir) {
    Rank rank(r, w, dir, /*timeout_ms=*/1000);
    if (r == 1) {
      std::this_thread::sleep_for(3s);
      return;
    }
    std::vector<float> x(1000, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    rank.all_reduce(x, DDP_REDUCE_SUM);  // returns at once
    if (std::chrono::steady_clock::now() - start > 500ms) fail("all_reduce blocked the caller");
    std::string message;
    try {
      rank.sync();
    } catch (const Error& e) {
      message = e.what();
    }
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (message.empty()) fail("all_reduce without the peer completed");
    if (waited > 3.0) fail("timed out only after " + std::to_string(waited) + " s: " + message);
    if (waited < 0.9) fail("failed after " + std::to_string(waited) + " s, before the timeout: " + message);
    if (message.rfind("gloo all_reduce (4000 bytes): ", 0) != 0)
      fail("message does not start with \"gloo all_reduce (4000 bytes): \": " + message);
    // Gloo's own words, e.g. "[./gloo/transport/tcp/unbound_buffer.cc:81] Timed
    // out waiting 1000ms for recv operation to complete": the run's timeout
    // reached Gloo.
    if (message.find("Timed out") == std::string::npos)
      fail("message does not mention \"Timed out\": " + message);
    if (message.find("1000ms") == std::string::npos)
      fail("message does not mention the 1000ms timeout: " + message);

    // Sticky: later work on the stream is cancelled and its events fail alike.
    rank.barrier();
    std::string again;
    try {
      rank.sync();
    } catch (const Error& e) {
      again = e.what();
    }
    if (again != message) fail("event after the failure: \"" + again + "\", expected \"" + message + "\"");
  }));
}

// ------------------------------------------------------------------ harness

// The fork helper itself reports failures, exceptions and hangs by rank.
TEST(MultiRank, ReportsEachFailingRank) {
  auto failures = run_ranks(3, [](int r, const std::string& dir) {
    if (!std::filesystem::is_directory(dir)) throw std::runtime_error("no rendezvous dir");
    if (r == 1) throw std::runtime_error("boom on one");
    if (r == 2) _exit(7);
  });
  EXPECT_EQ(failures, (std::vector<std::string>{"rank 1: boom on one", "rank 2: exited with status 7"}));
}

// A failed rank's peers get the grace, then are stopped, as the launcher
// stops them: a peer waiting for a rank that is gone does not run to the
// deadline.
TEST(MultiRank, StopsThePeersOfAFailedRankAfterTheGrace) {
  const auto start = std::chrono::steady_clock::now();
  auto failures = fork_ranks(
      2,
      [](int r, const std::string&) {
        if (r == 0) std::this_thread::sleep_for(30s);
        if (r == 1) throw std::runtime_error("boom on one");
      },
      60, 1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  EXPECT_EQ(failures, (std::vector<std::string>{"rank 0: still running 1 s after rank 1 failed, killed",
                                                "rank 1: boom on one"}));
}

TEST(MultiRank, KillsRanksPastTheDeadline) {
  const auto start = std::chrono::steady_clock::now();
  auto failures = run_ranks(
      2, [](int r, const std::string&) {
        if (r == 0) std::this_thread::sleep_for(30s);
      },
      1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  EXPECT_EQ(failures, (std::vector<std::string>{"rank 0: still running after 1 s, killed"}));
}

TEST(MultiRank, AllSucceed) {
  EXPECT_TRUE(run_ranks(4, [](int, const std::string&) {}).empty());
}

}  // namespace
}  // namespace ddp

int main(int argc, char** argv) {
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--transport=", 0) == 0) {
      ddp::g_transport = a.substr(12);
    } else if (a == "--transport" && i + 1 < argc) {
      ddp::g_transport = argv[++i];
    } else if (a == "--set" && i + 1 < argc) {
      ddp::g_sets.push_back(argv[++i]);
    } else {
      rest.push_back(argv[i]);
    }
  }
  int n = static_cast<int>(rest.size());
  rest.push_back(nullptr);  // argv[argc] is null: gtest moves it along when it removes its flags
  testing::InitGoogleTest(&n, rest.data());
  return RUN_ALL_TESTS();
}
