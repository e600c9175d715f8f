// nccl_transport_test.cpp — the `nccl` transport plugin (built with
// DDP_WITH_CUDA), loaded through the engine's loader.
//
// Everywhere: its descriptor, that it exports exactly ddp_transport_v1, the
// refusal of a CPU run (through the engine's own PluginHost, with the exact
// message) and, on a machine without a GPU, the refusal of a CUDA run.
//
// Where GPUs are (skipped with a message otherwise): every collective against
// closed-form results at world 1 (and 2 where there are two GPUs: NCCL does
// not allow two ranks of a communicator on one GPU), 1 element to 4 MB, on
// cudaMalloc'd buffers and a real cudaStream_t given through a minimal
// ddp_host built here (stream_native returns it; launch_host_func is
// cudaLaunchHostFunc and a failing host function fails the stream, as the
// engine's CUDA device is to do); that entries enqueue on that stream without
// waiting for it; the watchdog's timeout and the abort entry; groups (ABI
// 1.9 split): a world of one split into a group of one and again (one GPU),
// and two ranks split two ways (two GPUs).
//
// All CUDA work runs in forked children (tests/multirank.h): the CUDA runtime
// does not survive fork(), so this process never initialises it (even the GPU
// count is taken in a child).
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <utility>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "config.h"
#include "device.h"
#include "exports.h"
#include "gpu.h"
#include "plugin_host.h"
#include "multirank.h"
#include "plugin_loader.h"
#include "rank_checks.h"
#include "split_membership.h"
#include "store.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;

void cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(std::string(what) + ": " + cudaGetErrorString(e));
}

// ------------------------------------------------------------ GPU presence

using test::gpus;  // counted in a child (gpu.h)
#define REQUIRE_GPUS(n) DDP_REQUIRE_GPUS_OF(gpus(), n)

// ------------------------------------------------------- a minimal ddp_host

thread_local std::string t_error;  // set_error's text on this thread

std::string take_error() {
  std::string e;
  e.swap(t_error);
  return e;
}

// A stream of the test host: a real cudaStream_t and the text of its first
// failure (what the engine's CUDA device is to keep per stream).
struct TestStream {
  cudaStream_t native = nullptr;
  std::mutex mutex;
  std::string error;
};

struct PendingHostFunc {
  TestStream* stream;
  ddp_host_func fn;
  void* user;
};

// Just what a transport may use: logging, set_error, config reads (fallbacks,
// and fail_streams), alloc/free (cudaMalloc), one stream for compute and comm,
// stream_native, launch_host_func, the rendezvous store, timeout_ms. The rest
// is NULL: the plugin must not need it.
class TestHost {
 public:
  TestHost(int rank, int world, int local_rank, ddp_device_kind device, Store* store, int64_t timeout_ms,
           bool fail_streams = true)
      : store_(store), fail_streams_(fail_streams) {
    h_.abi_version = DDP_ABI_VERSION;
    h_.struct_size = sizeof(ddp_host);
    h_.ctx = this;
    h_.rank = rank;
    h_.world_size = world;
    h_.local_rank = local_rank;
    h_.device = device;
    h_.log = [](void*, ddp_log_level, const char* m) { std::fprintf(stderr, "[nccl plugin] %s\n", m); };
    h_.set_error = [](void*, const char* m) { t_error = m; };
    h_.config_int = [](void*, const char*, int64_t fallback, int64_t* out) { return *out = fallback, DDP_OK; };
    h_.config_float = [](void*, const char*, double fallback, double* out) { return *out = fallback, DDP_OK; };
    h_.config_bool = [](void* ctx, const char* key, int fallback, int* out) {
      *out = std::strcmp(key, "fail_streams") == 0 ? self(ctx).fail_streams_ : fallback;
      return DDP_OK;
    };
    h_.config_string = [](void*, const char*, const char* fallback, const char** out) {
      return *out = fallback, DDP_OK;
    };
    h_.alloc = [](void*, size_t bytes, ddp_mem_category, void** out) {
      if (cudaMalloc(out, bytes) != cudaSuccess || cudaMemset(*out, 0, bytes) != cudaSuccess) {
        t_error = "cudaMalloc failed";
        return DDP_ERR_OUT_OF_MEMORY;
      }
      return DDP_OK;
    };
    h_.free = [](void*, void* p) { cudaFree(p); };
    h_.compute_stream = [](void* ctx) { return reinterpret_cast<ddp_stream>(&self(ctx).stream_); };
    h_.comm_stream = h_.compute_stream;
    h_.launch_host_func = [](void*, ddp_stream stream, ddp_host_func fn, void* user) {
      auto* s = reinterpret_cast<TestStream*>(stream);
      auto* pending = new PendingHostFunc{s, fn, user};
      if (cudaLaunchHostFunc(s->native, run_host_func, pending) != cudaSuccess) {
        delete pending;
        t_error = "cudaLaunchHostFunc failed";
        return DDP_ERR_INTERNAL;
      }
      return DDP_OK;
    };
    h_.stream_native = [](void*, ddp_stream stream) -> void* {
      return reinterpret_cast<TestStream*>(stream)->native;
    };
    h_.store_set = [](void* ctx, const char* key, const void* data, size_t bytes) {
      return store_call([&] {
        const char* p = static_cast<const char*>(data);
        self(ctx).store().set(key, std::vector<char>(p, p + bytes));
      });
    };
    h_.store_get = [](void* ctx, const char* key, void** out, size_t* bytes) {
      return store_call([&] {
        std::vector<char> v = self(ctx).store().get(key);
        *out = std::malloc(v.size() + 1);
        std::memcpy(*out, v.data(), v.size());
        *bytes = v.size();
      });
    };
    h_.store_wait = [](void* ctx, const char* const* keys, size_t count) {
      return store_call([&] { self(ctx).store().wait(std::vector<std::string>(keys, keys + count)); });
    };
    h_.timeout_ms = timeout_ms;
  }
  ~TestHost() {
    if (stream_.native) cudaStreamDestroy(stream_.native);
  }

  // The rank's stream, on its GPU (a blocking stream: it also waits for the
  // synchronous copies the test makes on the default stream).
  void make_stream() {
    cuda(cudaSetDevice(h_.local_rank), "cudaSetDevice");
    cuda(cudaStreamCreate(&stream_.native), "cudaStreamCreate");
  }
  const ddp_host* get() const { return &h_; }
  ddp_stream stream() { return reinterpret_cast<ddp_stream>(&stream_); }
  cudaStream_t native() const { return stream_.native; }
  std::string stream_error() {
    std::lock_guard<std::mutex> lock(stream_.mutex);
    return stream_.error;
  }

 private:
  static TestHost& self(void* ctx) { return *static_cast<TestHost*>(ctx); }
  Store& store() {
    if (!store_) throw std::runtime_error("this test host has no rendezvous store");
    return *store_;
  }
  template <typename F>
  static ddp_status store_call(F&& f) {
    try {
      f();
      return DDP_OK;
    } catch (const std::exception& e) {
      t_error = e.what();
      return DDP_ERR_TIMEOUT;
    }
  }
  // On CUDA's host-function thread: a cancelled call once the stream failed;
  // a failing one fails the stream with the function's text.
  static void CUDART_CB run_host_func(void* data) {
    std::unique_ptr<PendingHostFunc> p(static_cast<PendingHostFunc*>(data));
    bool cancelled;
    {
      std::lock_guard<std::mutex> lock(p->stream->mutex);
      cancelled = !p->stream->error.empty();
    }
    t_error.clear();
    if (p->fn(p->user, cancelled ? 1 : 0) != DDP_OK) {
      std::lock_guard<std::mutex> lock(p->stream->mutex);
      if (p->stream->error.empty()) p->stream->error = t_error.empty() ? "a host function failed" : t_error;
    }
  }

  ddp_host h_{};
  Store* store_;
  int fail_streams_;
  TestStream stream_;
};

// ------------------------------------------------------------ device data


// A cudaMalloc'd array holding `values`.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& values, ddp_dtype dtype = dtype_of<T>())
      : n_(values.size()), dtype_(dtype) {
    cuda(cudaMalloc(&ptr_, bytes()), "cudaMalloc");
    cuda(cudaMemcpy(ptr_, values.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
    cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  std::vector<T> read() const {  // after the stream is synchronised
    std::vector<T> v(n_);
    cuda(cudaMemcpy(v.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return v;
  }
  ddp_buffer buffer() const { return ddp_buffer{ptr_, n_, dtype_, DDP_DEVICE_CUDA}; }
  T* ptr() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return (n_ ? n_ : 1) * sizeof(T); }

 private:
  void* ptr_ = nullptr;
  size_t n_;
  ddp_dtype dtype_;
};



// The bfloat16 and float16 bits of a small non-negative integer k (exact:
// k < 256 for bfloat16, k < 2048 for float16).
uint16_t bf16(int k) {
  float f = static_cast<float>(k);
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<uint16_t>(u >> 16);
}
uint16_t f16(int k) {
  if (k == 0) return 0;
  int e = 0;
  while ((k >> (e + 1)) != 0) ++e;
  return static_cast<uint16_t>((e + 15) << 10 | ((k << (10 - e)) & 0x3ff));
}

// ------------------------------------------------------------------ a rank

// One rank: the plugin loaded by the engine's loader, over a TestHost on GPU
// local_rank = rank, meeting the others through the engine's file store.
class Rank {
 public:
  Rank(int rank, int world, const std::string& dir, int64_t timeout_ms = 30000)
      : store_("file:" + dir, "nccl_transport_test", std::chrono::milliseconds(30000)),
        host_(rank, world, rank, DDP_DEVICE_CUDA, &store_, timeout_ms) {
    host_.make_stream();
    plugin_ = load_plugin(PluginKind::Transport, "nccl", DDP_TEST_PLUGIN_DIR);
    t_ = plugin_->transport();
    check(t_->init(host_.get(), &comm_), "init");
  }
  ~Rank() {
    cudaStreamSynchronize(host_.native());
    if (comm_) t_->destroy(comm_);
  }

  int world() const { return host_.get()->world_size; }
  const ddp_transport_v1_t* t() const { return t_; }
  ddp_comm* comm() const { return comm_; }
  ddp_comm* release() { return std::exchange(comm_, nullptr); }  // the caller destroys it
  TestHost& host() { return host_; }
  ddp_stream stream() { return host_.stream(); }
  void check(ddp_status s, const char* entry) {
    if (s != DDP_OK) fail(std::string(entry) + " failed (status " + std::to_string(s) + "): " + take_error());
  }
  // Waits for the stream; throws if a host function failed it.
  void sync() {
    cuda(cudaStreamSynchronize(host_.native()), "cudaStreamSynchronize");
    if (std::string e = host_.stream_error(); !e.empty()) fail("the stream failed: " + e);
  }

  template <typename T>
  void all_reduce(const DeviceArray<T>& a, ddp_reduce_op op) {
    const ddp_buffer b = a.buffer();
    check(t_->all_reduce(comm_, &b, op, stream()), "all_reduce");
  }
  template <typename T>
  void broadcast(const DeviceArray<T>& a, int root) {
    const ddp_buffer b = a.buffer();
    check(t_->broadcast(comm_, &b, root, stream()), "broadcast");
  }
  template <typename T>
  void all_gather(const DeviceArray<T>& send, const DeviceArray<T>& recv) {
    const ddp_buffer s = send.buffer(), r = recv.buffer();
    check(t_->all_gather(comm_, &s, &r, stream()), "all_gather");
  }
  template <typename T>
  void reduce_scatter(const DeviceArray<T>& send, const DeviceArray<T>& recv, ddp_reduce_op op) {
    const ddp_buffer s = send.buffer(), r = recv.buffer();
    check(t_->reduce_scatter(comm_, &s, &r, op, stream()), "reduce_scatter");
  }
  void barrier() { check(t_->barrier(comm_, stream()), "barrier"); }

 private:
  Store store_;
  TestHost host_;
  std::unique_ptr<LoadedPlugin> plugin_;
  const ddp_transport_v1_t* t_ = nullptr;
  ddp_comm* comm_ = nullptr;
};


// Blocks a CUDA stream for `ms` milliseconds (a host function that sleeps).
void block_stream(cudaStream_t s, int ms) {
  auto* wait = new int(ms);
  cuda(cudaLaunchHostFunc(
           s,
           [](void* p) {
             std::unique_ptr<int> ms(static_cast<int*>(p));
             std::this_thread::sleep_for(std::chrono::milliseconds(*ms));
           },
           wait),
       "cudaLaunchHostFunc");
}

// Element counts every collective is tried with; 4 MB of float32 last.
std::vector<size_t> counts_for(int world) { return {1, 7, 1000, (size_t{1} << 20) / static_cast<size_t>(world)}; }

// ------------------------------------------------------------- the plugin

std::unique_ptr<LoadedPlugin> load_nccl() {
  return load_plugin(PluginKind::Transport, "nccl", DDP_TEST_PLUGIN_DIR);
}

TEST(NcclPlugin, Descriptor) {
  auto plugin = load_nccl();
  const ddp_transport_v1_t* t = plugin->transport();
  ASSERT_NE(t, nullptr);
  EXPECT_STREQ(t->name, "nccl");
  EXPECT_STREQ(t->version, "0.3.0");
  EXPECT_EQ(t->abi_version, DDP_ABI_VERSION);
  EXPECT_EQ(t->struct_size, sizeof(ddp_transport_v1_t));
  EXPECT_EQ(t->caps, DDP_CAP_DEVICE_CUDA);  // GPU memory only
  EXPECT_NE(t->abort, nullptr);             // the optional entry, for the engine's give-up
  EXPECT_NE(t->barrier, nullptr);
  EXPECT_EQ(ddp_transport_dtypes(t), DDP_DTYPE_BIT(DDP_FLOAT32) | DDP_DTYPE_BIT(DDP_FLOAT64) |
                                         DDP_DTYPE_BIT(DDP_INT32) | DDP_DTYPE_BIT(DDP_INT64) |
                                         DDP_DTYPE_BIT(DDP_BFLOAT16) | DDP_DTYPE_BIT(DDP_FLOAT16));
}

// NCCL's threads outlive its communicators: once the plugin has been loaded,
// libnccl stays loaded after the plugin is unloaded. (No GPU needed.)
TEST(NcclPlugin, KeepsLibncclLoadedForTheProcess) {
  if (dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD) != nullptr) GTEST_SKIP() << "libnccl was loaded before the test";
  load_nccl().reset();  // loaded, then unloaded
  EXPECT_NE(dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD), nullptr) << "libnccl was unloaded with the plugin";
}


TEST(NcclPlugin, ExportsExactlyItsEntrySymbol) {
  const std::string file = std::string(DDP_TEST_PLUGIN_DIR) + "/libddp_transport_nccl.so";
  ASSERT_TRUE(std::filesystem::exists(file)) << file;
  auto symbols = test::exported_symbols(file);
  if (!symbols) GTEST_SKIP() << "nm is not available";
  EXPECT_EQ(*symbols, std::vector<std::string>{DDP_TRANSPORT_ENTRY_V1});
}

// A CPU run, through the engine's own host: refused before any CUDA call or
// rendezvous (there is no store at all), with the plugin's exact words.
TEST(NcclPlugin, RefusesACpuRun) {
  CpuDevice device;
  HostServices services;
  services.rank = RankInfo{0, 2, 0};
  services.device = &device;
  services.store = nullptr;
  PluginSection section("test.toml", "transport", toml::table{});
  PluginHost host(services, section, "transport plugin 'nccl'");
  auto plugin = load_nccl();
  ddp_comm* comm = nullptr;
  EXPECT_EQ(plugin->transport()->init(host.get(), &comm), DDP_ERR_UNSUPPORTED);
  EXPECT_EQ(comm, nullptr);
  try {
    host.check(DDP_ERR_UNSUPPORTED, "init");
    ADD_FAILURE() << "check did not throw";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "transport plugin 'nccl': init: the nccl transport needs a CUDA device "
                 "(run.device = \"cuda\"); this run's device is cpu");
  }
}

// A CUDA run on a machine without a GPU: refused before any rendezvous (the
// test host has no store), naming the rank and CUDA's own reason.
TEST(NcclPlugin, RefusesACudaRunWithoutGpu) {
  if (gpus().count > 0) GTEST_SKIP() << "this machine has a GPU";
  EXPECT_RANKS_OK(run_ranks(1, [](int, const std::string&) {
    TestHost host(1, 2, 1, DDP_DEVICE_CUDA, nullptr, 30000);
    auto plugin = load_nccl();
    ddp_comm* comm = nullptr;
    const ddp_status status = plugin->transport()->init(host.get(), &comm);
    const std::string message = take_error();
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    const std::string reason = e != cudaSuccess ? cudaGetErrorString(e) : "0 devices";
    if (status != DDP_ERR_UNSUPPORTED || comm != nullptr)
      fail("init returned " + std::to_string(status) + " (expected DDP_ERR_UNSUPPORTED): " + message);
    const std::string expected = "the nccl transport needs a GPU: rank 1 has none (cudaGetDeviceCount: " + reason + ")";
    if (message != expected) fail("message\n  " + message + "\nexpected\n  " + expected);
  }));
}

// A local rank beyond the machine's GPUs.
TEST(NcclPlugin, RefusesALocalRankWithoutItsGpu) {
  REQUIRE_GPUS(1);
  if (gpus().count == 1 && std::getenv("CUDA_VISIBLE_DEVICES"))
    GTEST_SKIP() << "one GPU visible through CUDA_VISIBLE_DEVICES: every local rank takes it";
  const int n = gpus().count;
  EXPECT_RANKS_OK(run_ranks(1, [n](int, const std::string&) {
    TestHost host(n, n + 1, n, DDP_DEVICE_CUDA, nullptr, 30000);
    auto plugin = load_nccl();
    ddp_comm* comm = nullptr;
    const ddp_status status = plugin->transport()->init(host.get(), &comm);
    const std::string message = take_error();
    const std::string expected = "the nccl transport gives each rank of a machine its own GPU: rank " +
                                 std::to_string(n) + " has local_rank " + std::to_string(n) +
                                 ", but this machine has " + std::to_string(n) + " GPU(s) visible";
    if (status != DDP_ERR_UNSUPPORTED || message != expected)
      fail("init returned " + std::to_string(status) + ": " + message + "\nexpected: " + expected);
  }));
}

// ------------------------------------------------------------ collectives

class NcclCollectives : public ::testing::TestWithParam<int> {
 protected:
  int world() const { return GetParam(); }
};

TEST_P(NcclCollectives, AllReduceFloat32) {
  REQUIRE_GPUS(world());
  const int w = world();
  EXPECT_RANKS_OK(run_ranks(w, [w](int r, const std::string& dir) {
    Rank rank(r, w, dir);
    for (size_t n : counts_for(1)) {  // up to 4 MB at any world size
      // SUM: r + i/2, every partial sum exact. AVG: w (r + i % 100), the sum a multiple of w.
      std::vector<float> x(n), y(n);
      for (size_t i = 0; i < n; ++i) {
        x[i] = static_cast<float>(r) + 0.5f * static_cast<float>(i);
        y[i] = static_cast<float>(w * (r + static_cast<int>(i % 100)));
      }
      DeviceArray<float> dx(x), dy(y);
      rank.all_reduce(dx, DDP_REDUCE_SUM);
      rank.all_reduce(dy, DDP_REDUCE_AVG);
      rank.sync();
      const std::string at = " count " + std::to_string(n);
      check_all("all_reduce SUM float32" + at, dx.read(),
                [&](size_t i) { return w * (w - 1) / 2.0 + w * 0.5 * static_cast<double>(i); });
      check_all("all_reduce AVG float32" + at, dy.read(),
                [&](size_t i) { return w * (w - 1) / 2.0 + w * static_cast<double>(i % 100); });
    }
  }));
}

TEST_P(NcclCollectives, AllReduceOtherDtypes) {
  REQUIRE_GPUS(world());
  const int w = world();
  EXPECT_RANKS_OK(run_ranks(w, [w](int r, const std::string& dir) {
    Rank rank(r, w, dir);
    const int64_t tri = int64_t{w} * (w + 1) / 2;   // sum of r + 1
    const int64_t tri0 = int64_t{w} * (w - 1) / 2;  // sum of r
    for (size_t n : {size_t{1}, size_t{7}, size_t{1000}}) {
      const std::string at = " count " + std::to_string(n);
      std::vector<int32_t> a(n), d(n);
      std::vector<int64_t> b(n);
      std::vector<double> c(n), e(n);
      std::vector<uint16_t> hb(n), hf(n), hb_avg(n);
      for (size_t i = 0; i < n; ++i) {
        const int k = static_cast<int>(i % 8);
        a[i] = (r + 1) * static_cast<int32_t>(i + 1) * (i % 2 ? -1 : 1);
        b[i] = (int64_t{r} + 1) * (int64_t{1} << 40) + int64_t(i) - r;  // needs more than 32 bits
        c[i] = 1e10 * (r + 1) + 0.25 * static_cast<double>(i);
        d[i] = w * (r - static_cast<int32_t>(i));  // AVG of multiples of w: exact
        e[i] = w * (r + 0.5 * static_cast<double>(i));
        hb[i] = bf16(r + 1 + k);  // small integers: every sum exact in 16 bits
        hf[i] = f16(r + 1 + k);
        hb_avg[i] = bf16(w * (r + 1 + k));
      }
      DeviceArray<int32_t> da(a), dd(d);
      DeviceArray<int64_t> db(b);
      DeviceArray<double> dc(c), de(e);
      DeviceArray<uint16_t> dhb(hb, DDP_BFLOAT16), dhf(hf, DDP_FLOAT16), dhb_avg(hb_avg, DDP_BFLOAT16);
      rank.all_reduce(da, DDP_REDUCE_SUM);  // all enqueued back to back, one wait
      rank.all_reduce(db, DDP_REDUCE_SUM);
      rank.all_reduce(dc, DDP_REDUCE_SUM);
      rank.all_reduce(dd, DDP_REDUCE_AVG);
      rank.all_reduce(de, DDP_REDUCE_AVG);
      rank.all_reduce(dhb, DDP_REDUCE_SUM);
      rank.all_reduce(dhf, DDP_REDUCE_SUM);
      rank.all_reduce(dhb_avg, DDP_REDUCE_AVG);
      rank.sync();
      check_all("all_reduce SUM int32" + at, da.read(), [&](size_t i) {
        return static_cast<int32_t>(tri * static_cast<int64_t>(i + 1) * (i % 2 ? -1 : 1));
      });
      check_all("all_reduce SUM int64" + at, db.read(),
                [&](size_t i) { return tri * (int64_t{1} << 40) + int64_t{w} * int64_t(i) - tri0; });
      check_all("all_reduce SUM float64" + at, dc.read(),
                [&](size_t i) { return 1e10 * static_cast<double>(tri) + 0.25 * w * static_cast<double>(i); });
      check_all("all_reduce AVG int32" + at, dd.read(),
                [&](size_t i) { return static_cast<int32_t>(tri0 - int64_t{w} * static_cast<int64_t>(i)); });
      check_all("all_reduce AVG float64" + at, de.read(),
                [&](size_t i) { return static_cast<double>(tri0) + w * 0.5 * static_cast<double>(i); });
      const auto sum16 = [&](size_t i) { return static_cast<int>(tri) + w * static_cast<int>(i % 8); };
      check_all("all_reduce SUM bfloat16" + at, dhb.read(), [&](size_t i) { return bf16(sum16(i)); });
      check_all("all_reduce SUM float16" + at, dhf.read(), [&](size_t i) { return f16(sum16(i)); });
      check_all("all_reduce AVG bfloat16" + at, dhb_avg.read(), [&](size_t i) { return bf16(sum16(i)); });
    }
  }));
}

TEST_P(NcclCollectives, Broadcast) {
  REQUIRE_GPUS(world());
  const int w = world();
  EXPECT_RANKS_OK(run_ranks(w, [w](int r, const std::string& dir) {
    Rank rank(r, w, dir);
    for (int root : {0, w - 1}) {
      for (size_t n : counts_for(1)) {
        const std::string at = " root " + std::to_string(root) + " count " + std::to_string(n);
        std::vector<float> x(n);
        std::vector<int64_t> y(n);
        for (size_t i = 0; i < n; ++i) {
          x[i] = static_cast<float>((r + 1) * 10000 + int(i % 1000));
          y[i] = (int64_t{r} + 1) << 36 | int64_t(i);
        }
        DeviceArray<float> dx(x);
        DeviceArray<int64_t> dy(y);
        rank.broadcast(dx, root);
        rank.broadcast(dy, root);
        rank.sync();
        check_all("broadcast float32" + at, dx.read(), [&](size_t i) { return (root + 1) * 10000 + int(i % 1000); });
        check_all("broadcast int64" + at, dy.read(), [&](size_t i) { return (int64_t{root} + 1) << 36 | int64_t(i); });
      }
    }
  }));
}

TEST_P(NcclCollectives, AllGather) {
  REQUIRE_GPUS(world());
  const int w = world();
  EXPECT_RANKS_OK(run_ranks(w, [w](int r, const std::string& dir) {
    Rank rank(r, w, dir);
    for (size_t n : counts_for(w)) {  // recv up to 4 MB
      std::vector<float> send(n);
      for (size_t i = 0; i < n; ++i) send[i] = static_cast<float>(r * 1000 + int(i % 1000));
      DeviceArray<float> dsend(send), drecv(std::vector<float>(n * w, -1.0f));  // every slot overwritten
      rank.all_gather(dsend, drecv);
      rank.sync();
      check_all("all_gather float32 count " + std::to_string(n), drecv.read(),
                [&](size_t j) { return static_cast<int>(j / n) * 1000 + int(j % n % 1000); });
      check_all("all_gather leaves send as it was, count " + std::to_string(n), dsend.read(),
                [&](size_t i) { return send[i]; });
    }
  }));
}

TEST_P(NcclCollectives, ReduceScatter) {
  REQUIRE_GPUS(world());
  const int w = world();
  EXPECT_RANKS_OK(run_ranks(w, [w](int r, const std::string& dir) {
    Rank rank(r, w, dir);
    for (size_t n : counts_for(w)) {  // send up to 4 MB
      const size_t total = n * static_cast<size_t>(w);
      std::vector<float> x(total), y(total);
      for (size_t j = 0; j < total; ++j) {
        x[j] = static_cast<float>(r) + 0.5f * static_cast<float>(j);
        y[j] = static_cast<float>(w * (r + static_cast<int>(j % 100)));
      }
      DeviceArray<float> dx(x), dy(y), sum(std::vector<float>(n, -1.0f)), avg(std::vector<float>(n, -1.0f));
      rank.reduce_scatter(dx, sum, DDP_REDUCE_SUM);
      rank.reduce_scatter(dy, avg, DDP_REDUCE_AVG);
      rank.sync();
      const size_t base = static_cast<size_t>(r) * n;  // this rank's slice
      const std::string at = " count " + std::to_string(n);
      check_all("reduce_scatter SUM float32" + at, sum.read(),
                [&](size_t i) { return w * (w - 1) / 2.0 + w * 0.5 * static_cast<double>(base + i); });
      check_all("reduce_scatter AVG float32" + at, avg.read(),
                [&](size_t i) { return w * (w - 1) / 2.0 + w * static_cast<double>((base + i) % 100); });
      check_all("reduce_scatter leaves send as it was" + at, dx.read(), [&](size_t j) { return x[j]; });
    }
  }));
}

TEST_P(NcclCollectives, BarrierThenAllReduce) {
  REQUIRE_GPUS(world());
  const int w = world();
  EXPECT_RANKS_OK(run_ranks(w, [w](int r, const std::string& dir) {
    Rank rank(r, w, dir);
    for (int i = 0; i < 3; ++i) rank.barrier();
    DeviceArray<float> x(std::vector<float>{static_cast<float>(r + 1)});
    rank.all_reduce(x, DDP_REDUCE_SUM);
    rank.barrier();
    rank.sync();
    check_all("all_reduce after barriers", x.read(), [&](size_t) { return w * (w + 1) / 2; });
  }));
}

INSTANTIATE_TEST_SUITE_P(World, NcclCollectives, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& info) { return "world" + std::to_string(info.param); });

// ------------------------------------------------------------------ groups

// One rank's communicator of a group (ABI 1.9 split), made as the engine
// makes it (split_membership.h), destroyed before its parent once the
// stream is drained. `world`: each member's world rank, in group order.
class NcclGroup {
 public:
  NcclGroup(Rank& rank, const std::vector<int>& colors, const std::vector<int>& keys, const std::string& tag,
            ddp_comm* parent = nullptr, std::vector<int> parent_world = {}, int me = -1)
      : rank_(rank), tag_(tag) {
    if (parent == nullptr) {
      parent = rank.comm();
      for (int p = 0; p < rank.world(); ++p) parent_world.push_back(p);
      me = rank.host().get()->rank;
    }
    const test::Membership m = test::membership(colors, keys, me);
    for (int p : m.members) world_.push_back(parent_world[size_t(p)]);
    rank_in_ = m.rank;
    const ddp_split how = test::split_request(m, colors[size_t(me)], keys[size_t(me)], tag_);
    rank.check(rank.t()->split(parent, &how, &comm_), "split");
  }
  ~NcclGroup() {
    cudaStreamSynchronize(rank_.host().native());
    if (comm_) rank_.t()->destroy(comm_);
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  ddp_comm* comm() const { return comm_; }
  int rank() const { return rank_in_; }
  int size() const { return int(world_.size()); }
  const std::vector<int>& world() const { return world_; }

  template <typename T>
  void all_reduce(const DeviceArray<T>& a, ddp_reduce_op op) {
    const ddp_buffer b = a.buffer();
    rank_.check(rank_.t()->all_reduce(comm_, &b, op, rank_.stream()), "group all_reduce");
  }
  template <typename T>
  void broadcast(const DeviceArray<T>& a, int root) {
    const ddp_buffer b = a.buffer();
    rank_.check(rank_.t()->broadcast(comm_, &b, root, rank_.stream()), "group broadcast");
  }
  template <typename T>
  void all_gather(const DeviceArray<T>& send, const DeviceArray<T>& recv) {
    const ddp_buffer s = send.buffer(), r = recv.buffer();
    rank_.check(rank_.t()->all_gather(comm_, &s, &r, rank_.stream()), "group all_gather");
  }
  template <typename T>
  void reduce_scatter(const DeviceArray<T>& send, const DeviceArray<T>& recv, ddp_reduce_op op) {
    const ddp_buffer s = send.buffer(), r = recv.buffer();
    rank_.check(rank_.t()->reduce_scatter(comm_, &s, &r, op, rank_.stream()), "group reduce_scatter");
  }
  void barrier() { rank_.check(rank_.t()->barrier(comm_, rank_.stream()), "group barrier"); }

 private:
  Rank& rank_;
  std::string tag_;
  std::vector<int> world_;
  int rank_in_ = -1;
  ddp_comm* comm_ = nullptr;
};

// Every collective on `g` against closed forms over its members' world
// ranks m (this rank: me, place q of s), as transport_test's groups:
// all_reduce SUM of (m + 1)(i % 13 + 1) and AVG of s(m + i % 7), broadcast
// from root s - 1, all_gather of m·1000 + i in group order, reduce_scatter
// SUM of (m + 1) j, then a barrier and one more all_reduce.
void check_group_collectives(Rank& rank, NcclGroup& g, int me) {
  const int s = g.size(), q = g.rank();
  double members = 0;
  for (int m : g.world()) members += m;
  for (size_t n : {size_t{1}, size_t{7}, size_t{1000}}) {
    const std::string at = " in a group of " + std::to_string(s) + ", count " + std::to_string(n);
    std::vector<float> sum(n), avg(n), bcast(n), send(n), rs(n * s);
    for (size_t i = 0; i < n; ++i) {
      sum[i] = float((me + 1) * int(i % 13 + 1));
      avg[i] = float(s * (me + int(i % 7)));
      bcast[i] = float((me + 1) * 1000 + int(i));
      send[i] = float(me * 1000 + int(i));
    }
    for (size_t j = 0; j < n * s; ++j) rs[j] = float(me + 1) * float(j);
    DeviceArray<float> dsum(sum), davg(avg), dbcast(bcast), dsend(send), drecv(std::vector<float>(n * s, -1.0f)),
        drs(rs), drs_recv(std::vector<float>(n, -1.0f));
    g.all_reduce(dsum, DDP_REDUCE_SUM);
    g.all_reduce(davg, DDP_REDUCE_AVG);
    g.broadcast(dbcast, s - 1);
    g.all_gather(dsend, drecv);
    g.reduce_scatter(drs, drs_recv, DDP_REDUCE_SUM);
    g.barrier();
    rank.sync();
    check_all("group all_reduce SUM" + at, dsum.read(), [&](size_t i) { return (members + s) * double(i % 13 + 1); });
    check_all("group all_reduce AVG" + at, davg.read(), [&](size_t i) { return members + s * double(i % 7); });
    check_all("group broadcast from root s - 1" + at, dbcast.read(),
              [&](size_t i) { return (g.world().back() + 1) * 1000 + int(i); });
    check_all("group all_gather" + at, drecv.read(), [&](size_t j) { return g.world()[j / n] * 1000 + int(j % n); });
    check_all("group reduce_scatter SUM" + at, drs_recv.read(),
              [&](size_t i) { return (members + s) * double(size_t(q) * n + i); });
  }
}

TEST(NcclGroups, DescriptorOffersSplit) {
  auto plugin = load_nccl();
  EXPECT_TRUE(DDP_PLUGIN_HAS(plugin->transport(), split));
}

// The one split a single GPU allows: a world of one into a group of one,
// and that group split again. Each collective on the groups, between
// collectives of the world on the same stream; the group's arguments
// checked against its size; a bad request refused before NCCL sees it.
TEST(NcclGroups, AWorldOfOneSplitIntoAGroupOfOneAndAgain) {
  REQUIRE_GPUS(1);
  EXPECT_RANKS_OK(run_ranks(1, [](int, const std::string& dir) {
    Rank rank(0, 1, dir);
    ddp_split bad{};
    bad.struct_size = sizeof(ddp_split);
    bad.color = -1;
    bad.size = 1;
    bad.tag = "ddp.group.0.0";
    ddp_comm* none = nullptr;
    if (rank.t()->split(rank.comm(), &bad, &none) != DDP_ERR_INVALID_ARGUMENT || none != nullptr)
      fail("a negative color was not refused");
    if (std::string e = take_error(); e != "nccl split: color -1 is negative") fail("refused with '" + e + "'");

    DeviceArray<float> before(std::vector<float>(16, 2.0f));
    rank.all_reduce(before, DDP_REDUCE_SUM);
    NcclGroup g(rank, {0}, {0}, "ddp.group.1.0");
    if (g.size() != 1 || g.rank() != 0) fail("a world of one split into a group of " + std::to_string(g.size()));
    check_group_collectives(rank, g, 0);
    NcclGroup nested(rank, {0}, {0}, "ddp.group.2.0", g.comm(), g.world(), g.rank());
    check_group_collectives(rank, nested, 0);

    DeviceArray<float> x(std::vector<float>(4, 3.0f));
    const ddp_buffer b = x.buffer();
    if (rank.t()->broadcast(g.comm(), &b, 1, rank.stream()) != DDP_ERR_INVALID_ARGUMENT)
      fail("broadcast from root 1 of a group of one was not refused");
    if (std::string e = take_error(); e != "broadcast: root 1 out of range") fail("refused with '" + e + "'");
    rank.all_reduce(x, DDP_REDUCE_AVG);
    g.all_reduce(x, DDP_REDUCE_SUM);
    rank.barrier();
    g.barrier();
    rank.sync();
    check_all("world all_reduce before the split", before.read(), [](size_t) { return 2.0; });
    check_all("world and group all_reduce of one rank", x.read(), [](size_t) { return 3.0; });
  }));
}

// Two GPUs: groups of one (color = rank) and one group of both with keys
// reversed, so that its rank 0 is world rank 1 (all_gather's order and the
// broadcast's root say which is which).
TEST(NcclGroups, TwoRanksSplitIntoOnesAndIntoAReversedPair) {
  REQUIRE_GPUS(2);
  EXPECT_RANKS_OK(run_ranks(2, [](int r, const std::string& dir) {
    Rank rank(r, 2, dir);
    NcclGroup alone(rank, {0, 1}, {0, 0}, "ddp.group.1." + std::to_string(r));
    NcclGroup pair(rank, {0, 0}, {1, 0}, "ddp.group.2.0");
    if (alone.size() != 1 || pair.size() != 2 || pair.world() != std::vector<int>{1, 0} || pair.rank() != 1 - r)
      fail("the groups are not the ones computed");
    check_group_collectives(rank, alone, r);
    check_group_collectives(rank, pair, r);
  }, /*timeout_s=*/120));
}

// ------------------------------------------------- streams and the watchdog

// A collective goes on the stream it is given, behind the work already there,
// and its entry returns without waiting for that work.
TEST(NcclStreams, EnqueuedBehindTheStreamsWorkWithoutWaiting) {
  REQUIRE_GPUS(1);
  EXPECT_RANKS_OK(run_ranks(1, [](int, const std::string& dir) {
    Rank rank(0, 1, dir);
    const size_t n = 1000;
    std::vector<float> fresh(n);
    for (size_t i = 0; i < n; ++i) fresh[i] = static_cast<float>(i) + 0.25f;
    DeviceArray<float> from(fresh), send(std::vector<float>(n, 0.0f)), recv(std::vector<float>(n, -1.0f));
    rank.all_gather(from, recv);  // the first call loads NCCL's kernels: not timed
    rank.sync();
    cudaStream_t s = rank.host().native();
    block_stream(s, 500);
    cuda(cudaMemcpyAsync(send.ptr(), from.ptr(), n * sizeof(float), cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
    const auto start = std::chrono::steady_clock::now();
    rank.all_gather(send, recv);  // at world 1: recv = send, once the copy before it is done
    const auto took = std::chrono::steady_clock::now() - start;
    rank.sync();
    check_all("all_gather after a copy on its stream", recv.read(), [&](size_t i) { return fresh[i]; });
    if (took > 250ms)
      fail("all_gather took " + std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()) +
           " ms to return while its stream was blocked for 500 ms: it waited for the stream");
  }));
}

// Arguments are checked before anything is enqueued, and a refused call
// leaves the communicator usable.
TEST(NcclStreams, RefusesBadArgumentsAndStaysUsable) {
  REQUIRE_GPUS(1);
  EXPECT_RANKS_OK(run_ranks(1, [](int, const std::string& dir) {
    Rank rank(0, 1, dir);
    DeviceArray<float> x(std::vector<float>{1.0f, 2.0f});
    auto expect_refused = [&](ddp_status got, ddp_status status, const std::string& message) {
      const std::string text = take_error();
      if (got != status || text != message)
        fail("got status " + std::to_string(got) + " '" + text + "', expected " + std::to_string(status) + " '" +
             message + "'");
    };
    std::vector<float> host_memory(2);
    const ddp_buffer on_cpu{host_memory.data(), 2, DDP_FLOAT32, DDP_DEVICE_CPU};
    expect_refused(rank.t()->all_reduce(rank.comm(), &on_cpu, DDP_REDUCE_SUM, rank.stream()), DDP_ERR_UNSUPPORTED,
                   "all_reduce: the nccl transport needs CUDA buffers (this one is on the cpu)");
    const ddp_buffer odd_type{x.ptr(), 2, static_cast<ddp_dtype>(99), DDP_DEVICE_CUDA};
    expect_refused(rank.t()->all_reduce(rank.comm(), &odd_type, DDP_REDUCE_SUM, rank.stream()), DDP_ERR_UNSUPPORTED,
                   "all_reduce: dtype 99 not supported (float32, float64, int32, int64, bfloat16, float16)");
    const ddp_buffer b = x.buffer();
    expect_refused(rank.t()->all_reduce(rank.comm(), &b, static_cast<ddp_reduce_op>(7), rank.stream()),
                   DDP_ERR_INVALID_ARGUMENT, "all_reduce: unknown reduce op 7");
    expect_refused(rank.t()->broadcast(rank.comm(), &b, 1, rank.stream()), DDP_ERR_INVALID_ARGUMENT,
                   "broadcast: root 1 out of range");
    const ddp_buffer one{x.ptr(), 1, DDP_FLOAT32, DDP_DEVICE_CUDA};
    expect_refused(rank.t()->all_gather(rank.comm(), &one, &b, rank.stream()), DDP_ERR_INVALID_ARGUMENT,
                   "all_gather: recv must hold send.count * world_size elements of send's dtype");
    expect_refused(rank.t()->reduce_scatter(rank.comm(), &one, &b, DDP_REDUCE_SUM, rank.stream()),
                   DDP_ERR_INVALID_ARGUMENT,
                   "reduce_scatter: send must hold recv.count * world_size elements of recv's dtype");
    rank.all_reduce(x, DDP_REDUCE_SUM);
    rank.sync();
    check_all("all_reduce after the refusals", x.read(), [](size_t i) { return i + 1.0; });
  }));
}

// A collective that does not complete within timeout_ms (here: its stream is
// held by an 8 s host function; the timeout is 3 s, not less, because it
// bounds NCCL's set-up too) is aborted by the watchdog; the next call and the
// stream report it, naming the rank and the collective.
TEST(NcclWatchdog, TimeoutAbortsAndFailsTheStream) {
  REQUIRE_GPUS(1);
  EXPECT_RANKS_OK(run_ranks(1, [](int, const std::string& dir) {
    Rank rank(0, 1, dir, /*timeout_ms=*/3000);
    DeviceArray<float> x(std::vector<float>{1.0f});
    rank.all_reduce(x, DDP_REDUCE_SUM);  // kernels loaded before the clock matters
    rank.sync();
    block_stream(rank.host().native(), 8000);
    rank.all_reduce(x, DDP_REDUCE_SUM);
    std::this_thread::sleep_for(4500ms);  // > 3000 ms and the watchdog's polls
    const std::string expected =
        "nccl transport, rank 0: all_reduce (4 bytes) did not complete within 3000 ms (run.timeout_s): a peer "
        "rank died, hung or issued another collective; the communicator was aborted";
    const ddp_buffer b = x.buffer();
    const ddp_status status = rank.t()->all_reduce(rank.comm(), &b, DDP_REDUCE_SUM, rank.stream());
    const std::string text = take_error();
    if (status != DDP_ERR_TIMEOUT || text != expected)
      fail("the call after the timeout returned " + std::to_string(status) + " '" + text + "', expected '" +
           expected + "'");
    cuda(cudaStreamSynchronize(rank.host().native()), "cudaStreamSynchronize");
    if (rank.host().stream_error() != expected)
      fail("the stream's error is '" + rank.host().stream_error() + "', expected '" + expected + "'");
  }));
}

TEST(NcclWatchdog, AbortFailsTheNextCall) {
  REQUIRE_GPUS(1);
  EXPECT_RANKS_OK(run_ranks(1, [](int, const std::string& dir) {
    Rank rank(0, 1, dir);
    DeviceArray<float> x(std::vector<float>{1.0f});
    rank.all_reduce(x, DDP_REDUCE_SUM);
    rank.sync();
    rank.t()->abort(rank.comm());
    rank.t()->abort(rank.comm());  // twice is fine
    const ddp_buffer b = x.buffer();
    const ddp_status status = rank.t()->all_reduce(rank.comm(), &b, DDP_REDUCE_SUM, rank.stream());
    const std::string text = take_error();
    if (status != DDP_ERR_COMM || text != "nccl transport, rank 0: the communicator was aborted by the engine")
      fail("after abort: status " + std::to_string(status) + " '" + text + "'");
  }));  // destroy after abort
}

// The abort that waits for a stuck stream holds no entry: rank 0's stream is
// blocked for 14 s with a collective behind it, so its watchdog's
// ncclCommAbort (after 3 s) waits for the stream (NCCL 2.28; world 1 takes
// another path, hence two GPUs). Meanwhile the next collective and the
// engine's abort answer at once with the failure, and destroy returns within
// its 5 s grace, leaving the communicator to the process.
TEST(NcclWatchdog, AnAbortWaitingForAStuckStreamHoldsNoEntry) {
  REQUIRE_GPUS(2);
  EXPECT_RANKS_OK(run_ranks(2, [](int r, const std::string& dir) {
    Rank rank(r, 2, dir, /*timeout_ms=*/3000);
    Store store("file:" + dir, "nccl_transport_test_done", std::chrono::milliseconds(60000));
    DeviceArray<float> x(std::vector<float>(1024, 1.0f));
    rank.all_reduce(x, DDP_REDUCE_SUM);  // connected
    rank.sync();
    if (r == 1) {
      store.get("done");
      return;
    }
    block_stream(rank.host().native(), 14000);
    rank.all_reduce(x, DDP_REDUCE_SUM);
    std::this_thread::sleep_for(4500ms);  // the watchdog has failed it and is inside ncclCommAbort
    const auto quick = [](const char* what, auto&& call) {
      const auto start = std::chrono::steady_clock::now();
      call();
      const auto took = std::chrono::steady_clock::now() - start;
      if (took > 1s) fail(std::string(what) + " took " + std::to_string(std::chrono::duration<double>(took).count()) + " s");
    };
    const ddp_buffer b = x.buffer();
    quick("all_reduce after the failure", [&] {
      if (rank.t()->all_reduce(rank.comm(), &b, DDP_REDUCE_SUM, rank.stream()) != DDP_ERR_TIMEOUT)
        fail("all_reduce after the failure did not report the timeout: " + take_error());
      take_error();
    });
    quick("the engine's abort", [&] { rank.t()->abort(rank.comm()); });
    const auto start = std::chrono::steady_clock::now();
    rank.t()->destroy(rank.release());
    if (std::chrono::steady_clock::now() - start > 7s) fail("destroy waited past its 5 s grace");
    store.set("done", {'1'});
  }));  // ~Rank waits for the stream to be released
}

// Two ranks, one never issuing the second collective: the other's watchdog
// aborts it within the timeout, then tells its peer to finish. (A first
// collective of the same size connects the ranks: NCCL connects lazily, and a
// connection needs both.)
TEST(NcclWatchdog, PeerThatNeverCallsTimesOut) {
  REQUIRE_GPUS(2);
  EXPECT_RANKS_OK(run_ranks(2, [](int r, const std::string& dir) {
    Rank rank(r, 2, dir, /*timeout_ms=*/5000);
    Store store("file:" + dir, "nccl_transport_test_done", std::chrono::milliseconds(60000));
    DeviceArray<float> x(std::vector<float>(1024, 1.0f));
    rank.all_reduce(x, DDP_REDUCE_SUM);
    rank.sync();
    if (r == 1) {
      store.get("done");  // issue nothing more until rank 0 is through
      return;
    }
    rank.all_reduce(x, DDP_REDUCE_SUM);
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (cudaStreamQuery(rank.host().native()) == cudaErrorNotReady) {  // the abort ends NCCL's kernel
      if (std::chrono::steady_clock::now() > deadline) fail("the all_reduce still runs 20 s after it began");
      std::this_thread::sleep_for(10ms);
    }
    const std::string expected =
        "nccl transport, rank 0: all_reduce (4096 bytes) did not complete within 5000 ms (run.timeout_s): a peer "
        "rank died, hung or issued another collective; the communicator was aborted";
    const std::string stream_error = rank.host().stream_error();
    const ddp_buffer b = x.buffer();
    const ddp_status status = rank.t()->all_reduce(rank.comm(), &b, DDP_REDUCE_SUM, rank.stream());
    const std::string text = take_error();
    store.set("done", {'1'});
    if (status != DDP_ERR_TIMEOUT || text != expected) fail("next call: " + std::to_string(status) + " '" + text + "'");
    if (stream_error != expected) fail("the stream's error is '" + stream_error + "'");
  }, /*timeout_s=*/90));
}

}  // namespace
}  // namespace ddp
