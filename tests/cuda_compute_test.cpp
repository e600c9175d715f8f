// cuda_compute_test — ddp_host's compute entries (ABI 1.9) on a CUDA run,
// through the vtable of a real PluginHost over the engine's CUDA device,
// against the same entries of a PluginHost over a CpuDevice on the same
// inputs:
// - gemm (cuBLAS, pedantic float32) within |GPU - CPU| <= 1e-6 (k + 2)
//   (|alpha| sum_q |a b| + |beta c|) per element, every transpose pair, a
//   batch with strides and padded rows (padding left alone, bit for bit),
//   beta 0 over NaN; the same bits run after run and on either stream;
// - dot, norm, axpy and normalize: the CPU's bits exactly (both devices sum
//   in compute.h's order, each operation rounded alike), on rows and on
//   strided columns, and through a Gram-Schmidt pass;
// - the refusal inside a host function on a CUDA stream.
// Every test needs a GPU and skips, with the reason, where there is none.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "config.h"
#include "device.h"
#include "gpu.h"
#include "plugin_host.h"

namespace ddp {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

::testing::AssertionResult bitwise_equal(const std::vector<float>& want, const std::vector<float>& got) {
  if (want.size() == got.size() && std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0)
    return ::testing::AssertionSuccess();
  size_t differing = 0, first = want.size();
  for (size_t i = 0; i < want.size() && i < got.size(); ++i)
    if (std::memcmp(&want[i], &got[i], sizeof(float)) != 0 && differing++ == 0) first = i;
  return ::testing::AssertionFailure() << differing << " of " << want.size() << " differ; first at " << first;
}

// One device with a PluginHost over it; its memory holds vectors uploaded
// from the host and read back after the streams are drained.
struct DeviceRun {
  explicit DeviceRun(ddp_device_kind kind)
      : device(make_device(kind, 0, false)), section(plugin_section_from_overrides("strategy", {})) {
    services.device = device.get();
    host = std::make_unique<PluginHost>(services, section, "strategy plugin 'test'");
  }
  ~DeviceRun() {
    for (void* p : blocks) device->free(p);
  }
  const ddp_host* h() const { return host->get(); }
  ddp_stream compute() const { return h()->compute_stream(h()->ctx); }
  ddp_stream comm() const { return h()->comm_stream(h()->ctx); }
  float* put(const std::vector<float>& v) {
    void* p = device->alloc(v.size() * sizeof(float), MemCategory::CommBuffers);
    blocks.push_back(p);
    device->upload(p, v.data(), v.size() * sizeof(float));
    return static_cast<float*>(p);
  }
  std::vector<float> get(const float* p, size_t n) {
    device->comm_stream().synchronize();
    device->compute_stream().synchronize();
    std::vector<float> v(n);
    device->download(v.data(), p, n * sizeof(float));
    return v;
  }

  std::unique_ptr<Device> device;  // first: it outlives the host and the compute it made
  HostServices services;
  PluginSection section;
  std::unique_ptr<PluginHost> host;
  std::vector<void*> blocks;
};

// A padded batch of products, its operands' host copies.
struct Gemm {
  ddp_gemm g{};
  std::vector<float> a, b, c;
};

Gemm make_gemm(size_t m, size_t n, size_t k, size_t batch, int ta, int tb, uint32_t seed) {
  Gemm x;
  x.g.struct_size = sizeof(ddp_gemm);
  x.g.trans_a = ta;
  x.g.trans_b = tb;
  x.g.m = m;
  x.g.n = n;
  x.g.k = k;
  x.g.alpha = 1.5;
  x.g.beta = -0.5;
  x.g.batch = batch;
  x.g.lda = (ta ? m : k) + 3;
  x.g.ldb = (tb ? k : n) + 2;
  x.g.ldc = n + 1;
  x.g.stride_a = (ta ? k : m) * x.g.lda + 5;
  x.g.stride_b = (tb ? n : k) * x.g.ldb + 7;
  x.g.stride_c = m * x.g.ldc + 9;
  x.a = random_floats(x.g.stride_a * batch, seed);
  x.b = random_floats(x.g.stride_b * batch, seed + 1);
  x.c = random_floats(x.g.stride_c * batch, seed + 2);
  return x;
}

// Runs x on `run`'s `stream` (its operands uploaded) and returns C.
std::vector<float> run_gemm(DeviceRun& run, const Gemm& x, ddp_stream stream) {
  ddp_gemm g = x.g;
  g.a = run.put(x.a);
  g.b = run.put(x.b);
  g.c = run.put(x.c);
  EXPECT_EQ(run.h()->gemm(run.h()->ctx, &g, stream), DDP_OK) << take_plugin_error();
  return run.get(g.c, x.c.size());
}

class CudaCompute : public ::testing::Test {
 protected:
  void SetUp() override {
    DDP_REQUIRE_GPUS(1);
    gpu = std::make_unique<DeviceRun>(DDP_DEVICE_CUDA);
  }
  DeviceRun cpu{DDP_DEVICE_CPU};
  std::unique_ptr<DeviceRun> gpu;
};

TEST_F(CudaCompute, GemmAgreesWithTheCpu) {
  for (int ta = 0; ta <= 1; ++ta)
    for (int tb = 0; tb <= 1; ++tb) {
      SCOPED_TRACE("trans_a " + std::to_string(ta) + " trans_b " + std::to_string(tb));
      const Gemm x = make_gemm(67, 45, 129, 3, ta, tb, 10u + 2 * ta + tb);
      const std::vector<float> want = run_gemm(cpu, x, cpu.compute());
      const std::vector<float> got = run_gemm(*gpu, x, gpu->compute());
      for (size_t p = 0; p < x.g.batch; ++p)
        for (size_t i = 0; i < x.g.m; ++i)
          for (size_t j = 0; j < x.g.n; ++j) {
            double magnitude = 0;
            for (size_t q = 0; q < x.g.k; ++q) {
              const float av = ta ? x.a[p * x.g.stride_a + q * x.g.lda + i] : x.a[p * x.g.stride_a + i * x.g.lda + q];
              const float bv = tb ? x.b[p * x.g.stride_b + j * x.g.ldb + q] : x.b[p * x.g.stride_b + q * x.g.ldb + j];
              magnitude += std::fabs(double(av) * bv);
            }
            const size_t e = p * x.g.stride_c + i * x.g.ldc + j;
            const double tol = 1e-6 * double(x.g.k + 2) * (1.5 * magnitude + 0.5 * std::fabs(x.c[e]));
            ASSERT_NEAR(got[e], want[e], tol) << p << ": (" << i << ", " << j << ")";
          }
      // Padding and gaps: untouched on both.
      for (size_t e = 0; e < x.c.size(); ++e) {
        const size_t in_product = e % x.g.stride_c;
        if (in_product >= x.g.m * x.g.ldc || in_product % x.g.ldc >= x.g.n) {
          ASSERT_EQ(std::memcmp(&got[e], &x.c[e], sizeof(float)), 0) << e;
        }
      }
    }
}

// The same bits run after run, and on the comm stream (its own cuBLAS
// handle) as on the compute stream.
TEST_F(CudaCompute, GemmIsDeterministicOnEitherStream) {
  const Gemm x = make_gemm(256, 192, 320, 2, 0, 1, 40);
  const std::vector<float> first = run_gemm(*gpu, x, gpu->compute());
  EXPECT_TRUE(bitwise_equal(first, run_gemm(*gpu, x, gpu->compute())));
  EXPECT_TRUE(bitwise_equal(first, run_gemm(*gpu, x, gpu->comm())));
}

TEST_F(CudaCompute, GemmBetaZeroOverwritesNaN) {
  Gemm x = make_gemm(33, 17, 21, 2, 1, 0, 50);
  x.g.beta = 0.0;
  std::fill(x.c.begin(), x.c.end(), kNaN);
  const std::vector<float> want = run_gemm(cpu, x, cpu.compute());
  const std::vector<float> got = run_gemm(*gpu, x, gpu->compute());
  for (size_t p = 0; p < 2; ++p)
    for (size_t i = 0; i < 33; ++i)
      for (size_t j = 0; j < 17; ++j) {
        const size_t e = p * x.g.stride_c + i * x.g.ldc + j;
        ASSERT_FALSE(std::isnan(got[e])) << e;
        ASSERT_NEAR(got[e], want[e], 1e-4) << e;
      }
}

// dot, norm, axpy (with a dot's out as its scalars) and normalize, on rows
// and on strided columns: the CPU's bits.
TEST_F(CudaCompute, VectorEntriesGiveTheCpusBits) {
  const size_t rows = 700, cols = 5, ld = 7;
  const std::vector<float> xs = random_floats(rows * ld, 60), ys = random_floats(rows * ld, 61);
  for (const bool columns : {false, true}) {
    SCOPED_TRACE(columns ? "columns" : "rows");
    std::vector<std::vector<float>> results[2];  // [cpu, gpu]: the outputs in turn
    DeviceRun* runs[2] = {&cpu, gpu.get()};
    for (int r = 0; r < 2; ++r) {
      DeviceRun& run = *runs[r];
      const ddp_host* h = run.h();
      float* x = run.put(xs);
      float* y = run.put(ys);
      float* out = run.put(std::vector<float>(rows, kNaN));
      float* norms = run.put(std::vector<float>(rows, kNaN));
      const ddp_vectors xv = columns ? ddp_vectors{x, rows, ld, cols, 1} : ddp_vectors{x, cols, 1, rows, ld};
      const ddp_vectors yv = columns ? ddp_vectors{y, rows, ld, cols, 1} : ddp_vectors{y, cols, 1, rows, ld};
      const ddp_stream s = run.compute();
      ASSERT_EQ(h->dot(h->ctx, &xv, &yv, out, s), DDP_OK) << take_plugin_error();
      ASSERT_EQ(h->norm(h->ctx, &xv, norms, s), DDP_OK) << take_plugin_error();
      ASSERT_EQ(h->axpy(h->ctx, -0.75, &xv, out, &yv, s), DDP_OK) << take_plugin_error();
      ASSERT_EQ(h->normalize(h->ctx, &xv, columns ? 0.0 : 1e-3, s), DDP_OK) << take_plugin_error();
      results[r] = {run.get(out, xv.count), run.get(norms, xv.count), run.get(y, ys.size()), run.get(x, xs.size())};
    }
    const char* names[] = {"dot", "norm", "axpy", "normalize"};
    for (size_t k = 0; k < 4; ++k) EXPECT_TRUE(bitwise_equal(results[0][k], results[1][k])) << names[k];
  }
}

// The order of compute.h, seen at float's resolution (host_compute_test's
// DotSumsInTheDocumentedOrder): 2^60 and -2^60 meet in one lane, or in the
// tree's first step, before they absorb lane 1's 1. Any other order of the
// block's reduction gives 0.
TEST_F(CudaCompute, DotSumsInTheDocumentedOrder) {
  const float big = std::ldexp(1.0f, 60);
  std::vector<float> xs(2 * 512, 0.0f);
  xs[0] = big;
  xs[1] = 1.0f;
  xs[256] = -big;
  xs[512 + 0] = big;
  xs[512 + 1] = 1.0f;
  xs[512 + 128] = -big;
  const ddp_host* h = gpu->h();
  const ddp_vectors x{gpu->put(xs), 512, 1, 2, 512};
  const ddp_vectors ones{gpu->put(std::vector<float>(2 * 512, 1.0f)), 512, 1, 2, 512};
  float* out = gpu->put(std::vector<float>(2, kNaN));
  ASSERT_EQ(h->dot(h->ctx, &x, &ones, out, gpu->compute()), DDP_OK) << take_plugin_error();
  EXPECT_EQ(gpu->get(out, 2), std::vector<float>({1.0f, 1.0f}));
}

// Inside a host function on a CUDA stream (CUDA's callback thread) the
// entries are refused, and the stream goes on.
TEST_F(CudaCompute, RefusedInsideAHostFunction) {
  struct Seen {
    const ddp_host* h;
    ddp_stream s;
    ddp_status status = DDP_OK;
    std::string text;
  } seen{gpu->h(), gpu->compute(), DDP_OK, ""};
  const ddp_host* h = gpu->h();
  ASSERT_EQ(h->launch_host_func(
                h->ctx, seen.s,
                [](void* user, int) {
                  auto* o = static_cast<Seen*>(user);
                  const ddp_vectors v{reinterpret_cast<float*>(64), 1, 1, 1, 1};
                  o->status = o->h->normalize(o->h->ctx, &v, 0.0, o->s);
                  o->text = take_plugin_error();
                  return DDP_OK;
                },
                &seen),
            DDP_OK);
  gpu->device->compute_stream().synchronize();
  EXPECT_EQ(seen.status, DDP_ERR_UNSUPPORTED);
  EXPECT_EQ(seen.text,
            "normalize: not allowed inside a host function on a device stream (CUDA allows no CUDA calls there, and "
            "none may block): call it at enqueue time, on the calling thread");
}

}  // namespace
}  // namespace ddp
