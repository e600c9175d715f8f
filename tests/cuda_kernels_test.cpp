// cuda_kernels_test.cpp — the CUDA kernels (engine/models/cuda/cuda_kernels.cu)
// against the CPU kernels (layers.h through make_cpu_kernels()): every
// Kernels method on random inputs from a fixed seed, at a few sizes
// including awkward ones (1, primes, t not a multiple of 32, rows beyond
// one block or chunk), accumulate paths included, parameter gradients
// starting from random values (they are added into), outputs the CUDA side
// must overwrite starting as NaN. Then a run-to-run determinism check.
// Skipped where there is no GPU (gpu.h).
//
// Tolerance: |gpu - cpu| <= 1e-5 |cpu| + atol. Elementwise results take
// atol = 1e-6 (values here are O(1); an element that is a small difference
// of O(1) terms carries their rounding, ~1e-7). Results of GEMMs and other
// long sums take atol = 1e-5 * rms(cpu): cuBLAS and OpenBLAS (and a
// tree-order reduction against a sequential one) add the K terms in
// different orders, so an element that cancels to near zero keeps an
// absolute error of the size of the terms' rounding, which scales with the
// typical output, not with that element. Results made of the same float
// operations in the same order are compared exactly: among them the column
// sums (db, RMSNorm's dg: layers.h's tile order) and the embedding's
// scatter-add (each row's gradients in position order).
#include "cuda/cuda_kernels.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <ddp/numeric.h>

#include "cuda/cublas_lib.h"
#include "error.h"
#include "gpu.h"
#include "kernels.h"
#include "layers.h"

namespace ddp {
namespace {

using Vec = std::vector<float>;
using Tokens = std::vector<int32_t>;

constexpr double kRtol = 1e-5;
constexpr double kAbsFloor = 1e-6;

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Device memory holding a copy of a host vector (or n elements of NaN:
// outputs the kernels must write). Freed at scope end.
template <typename T>
class Buf {
 public:
  explicit Buf(const std::vector<T>& host) : n_(host.size()) {
    ok(cudaMalloc(reinterpret_cast<void**>(&ptr_), bytes() ? bytes() : 1), "cudaMalloc");
    ok(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice), "cudaMemcpy (to device)");
    ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  static Buf nan(size_t n) { return Buf(std::vector<T>(n, std::numeric_limits<T>::quiet_NaN())); }
  ~Buf() { cudaFree(ptr_); }
  Buf(Buf&& o) noexcept : ptr_(o.ptr_), n_(o.n_) { o.ptr_ = nullptr; }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;

  T* get() const { return ptr_; }
  size_t bytes() const { return n_ * sizeof(T); }
  // The contents once `stream` has finished its work.
  std::vector<T> host(cudaStream_t stream) const {
    ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    std::vector<T> out(n_);
    ok(cudaMemcpy(out.data(), ptr_, bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy (to host)");
    return out;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_;
};

// The kernels under test on their own non-blocking stream, and the CPU's.
struct Both {
  cudaStream_t stream = nullptr;
  std::unique_ptr<Kernels> gpu;
  std::unique_ptr<Kernels> cpu = make_cpu_kernels();
  Both() {
    ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    gpu = make_cuda_kernels(stream);
  }
  ~Both() {
    gpu.reset();
    cudaStreamDestroy(stream);
  }
  template <typename T>
  std::vector<T> get(const Buf<T>& b) const {
    return b.host(stream);
  }
};

Vec uniform(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

Tokens tokens_below(size_t n, int32_t vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  Tokens t(n);
  for (int32_t& x : t) x = dist(rng);
  return t;
}

double rms(const Vec& v) {
  double s = 0.0;
  for (float x : v) s += static_cast<double>(x) * x;
  return v.empty() ? 0.0 : std::sqrt(s / static_cast<double>(v.size()));
}

// atol for results of GEMMs and long sums (see the top of the file).
double sum_atol(const Vec& want) { return std::max(kAbsFloor, kRtol * rms(want)); }

// |got - want| <= rtol |want| + atol elementwise; reports the count of
// failures, the first and the worst.
void expect_close(const std::string& what, const Vec& got, const Vec& want, double atol,
                  double rtol = kRtol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = 0, worst = 0;
  double worst_excess = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    const double tol = rtol * std::abs(want[i]) + atol;
    if (!(err <= tol)) {  // NaN fails
      if (bad++ == 0) first = i;
      const double excess = std::isnan(err) ? INFINITY : err / tol;
      if (excess > worst_excess) {
        worst_excess = excess;
        worst = i;
      }
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements off (rtol "
                     << rtol << ", atol " << atol << "); first [" << first << "] gpu " << got[first]
                     << " cpu " << want[first] << ", worst [" << worst << "] gpu " << got[worst]
                     << " cpu " << want[worst];
}

void expect_equal(const std::string& what, const Vec& got, const Vec& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
      << what << ": not bitwise equal";
}

std::string shape(std::initializer_list<std::pair<const char*, int64_t>> dims) {
  std::string s;
  for (const auto& [name, v] : dims)
    s += std::string(s.empty() ? "" : " ") + name + "=" + std::to_string(v);
  return s;
}

// ---- cuBLAS, loaded on first use ---------------------------------------------

// Whether this process has mapped a file whose name contains `name`.
bool mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find(name) != std::string::npos) return true;
  return false;
}

// Not linked (it would cost every process 0.4 s and 200 MB at start): the
// library appears only when asked for, with every entry, GPU or not. Each
// ctest test is a fresh process, so nothing has asked for it yet.
TEST(CublasLib, LoadsOnFirstUseNotAtStartWithEveryEntry) {
  EXPECT_FALSE(mapped("libcublas"));
  const cuda::CublasLib& lib = cuda::cublas();
  EXPECT_TRUE(mapped("libcublas.so"));
  EXPECT_STREQ(lib.status_name(CUBLAS_STATUS_NOT_INITIALIZED), "CUBLAS_STATUS_NOT_INITIALIZED");
  EXPECT_STRNE(lib.status_string(CUBLAS_STATUS_NOT_INITIALIZED), "");
  for (const void* entry : {reinterpret_cast<const void*>(lib.create),
                            reinterpret_cast<const void*>(lib.destroy),
                            reinterpret_cast<const void*>(lib.set_stream),
                            reinterpret_cast<const void*>(lib.set_math_mode),
                            reinterpret_cast<const void*>(lib.sgemm),
                            reinterpret_cast<const void*>(lib.sgemm_strided_batched),
                            reinterpret_cast<const void*>(lib.gemm_ex),
                            reinterpret_cast<const void*>(lib.gemm_strided_batched_ex)})
    EXPECT_NE(entry, nullptr);
  EXPECT_EQ(&cuda::cublas(), &lib);  // loaded once
}

// ---- the device, data movement -----------------------------------------------

TEST(CudaKernels, KindIsCuda) {
  DDP_REQUIRE_GPUS(1);
  Both k;
  EXPECT_EQ(k.gpu->kind(), DDP_DEVICE_CUDA);
}

TEST(CudaKernels, UploadFreesTheSourceOnReturnAndCopyMovesBytes) {
  DDP_REQUIRE_GPUS(1);
  Both k;
  std::mt19937 rng(1);
  // 1 float, and more than the staging slots hold (chunks, slots reused), odd size.
  for (size_t n : {size_t{1}, size_t{1} << 10, (size_t{5} << 20) / 4 + 3}) {
    SCOPED_TRACE(shape({{"n", static_cast<int64_t>(n)}}));
    const Vec want = uniform(n, rng);
    Vec src = want;
    auto dst = Buf<float>::nan(n), copied = Buf<float>::nan(n);
    k.gpu->upload(dst.get(), src.data(), n * sizeof(float));
    std::fill(src.begin(), src.end(), -7.0f);  // the contract: reusable at once
    k.gpu->copy(copied.get(), dst.get(), n * sizeof(float));
    expect_equal("upload", k.get(dst), want);
    expect_equal("copy", k.get(copied), want);
  }
}

// ---- linear, bias ---------------------------------------------------------------

TEST(CudaKernels, LinearMatchesCpu) {
  DDP_REQUIRE_GPUS(1);
  Both k;
  std::mt19937 rng(2);
  struct Shape {
    int64_t n, in, out;
  };
  for (const Shape s :
       {Shape{1, 1, 1}, Shape{7, 37, 5}, Shape{70, 300, 129}, Shape{133, 64, 257}}) {
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(shape({{"n", s.n}, {"in", s.in}, {"out", s.out}, {"accumulate", accumulate}}));
      const Vec x = uniform(s.n * s.in, rng), w = uniform(s.out * s.in, rng);
      const Vec dy = uniform(s.n * s.out, rng);
      const Vec y0 = uniform(s.n * s.out, rng), dx0 = uniform(s.n * s.in, rng);
      const Vec dw0 = uniform(s.out * s.in, rng);  // a gradient: added into
      Buf<float> gx(x), gw(w), gdy(dy), gdw(dw0);
      Buf<float> gy = accumulate ? Buf<float>(y0) : Buf<float>::nan(y0.size());
      Buf<float> gdx = accumulate ? Buf<float>(dx0) : Buf<float>::nan(dx0.size());
      Vec y = y0, dx = dx0, dw = dw0;

      k.cpu->linear_forward(y.data(), x.data(), w.data(), s.n, s.in, s.out, accumulate);
      k.gpu->linear_forward(gy.get(), gx.get(), gw.get(), s.n, s.in, s.out, accumulate);
      const float alpha = accumulate ? 0.25f : 1.0f;  // a factor of dy folded into the GEMM
      k.cpu->linear_backward_input(dx.data(), dy.data(), w.data(), s.n, s.in, s.out, accumulate, alpha);
      k.gpu->linear_backward_input(gdx.get(), gdy.get(), gw.get(), s.n, s.in, s.out, accumulate, alpha);
      k.cpu->linear_backward_weight(dw.data(), dy.data(), x.data(), s.n, s.in, s.out, alpha);
      k.gpu->linear_backward_weight(gdw.get(), gdy.get(), gx.get(), s.n, s.in, s.out, alpha);

      expect_close("y", k.get(gy), y, sum_atol(y));
      expect_close("dx", k.get(gdx), dx, sum_atol(dx));
      expect_close("dw", k.get(gdw), dw, sum_atol(dw));
    }
  }
}

// 16-bit compute: the GPU's cublasGemmEx on operands rounded to bf16 or
// fp16 against the CPU's emulation (gemm.h) of the same rounding. Both
// round the same float32 inputs to nearest even, and a product of two
// 16-bit values is exact in float32: what differs is the order of the
// sums (and the tensor cores' accumulation), hence kRtol16.
constexpr double kRtol16 = 1e-4;

TEST(CudaKernels, SixteenBitLinearMatchesTheCpuEmulation) {
  DDP_REQUIRE_GPUS(1);
  Both k;
  std::mt19937 rng(12);
  for (const ddp_dtype dtype : {DDP_BFLOAT16, DDP_FLOAT16}) {
    SCOPED_TRACE(ddp_dtype_name(dtype));
    k.cpu->set_compute_dtype(dtype);
    k.gpu->set_compute_dtype(dtype);
    EXPECT_EQ(k.gpu->compute_dtype(), dtype);
    for (const int64_t n : {int64_t{7}, int64_t{133}}) {
      const int64_t in = 300, out = 129;
      SCOPED_TRACE(shape({{"n", n}}));
      const Vec x = uniform(n * in, rng), w = uniform(out * in, rng), dy = uniform(n * out, rng);
      const Vec dw0 = uniform(out * in, rng);
      Buf<float> gx(x), gw(w), gdy(dy), gdw(dw0);
      Buf<float> gy = Buf<float>::nan(n * out), gdx = Buf<float>::nan(n * in);
      Vec y(n * out), dx(n * in), dw = dw0;
      k.cpu->linear_forward(y.data(), x.data(), w.data(), n, in, out, false);
      k.gpu->linear_forward(gy.get(), gx.get(), gw.get(), n, in, out, false);
      k.cpu->linear_backward_input(dx.data(), dy.data(), w.data(), n, in, out, false, 0.5f);
      k.gpu->linear_backward_input(gdx.get(), gdy.get(), gw.get(), n, in, out, false, 0.5f);
      k.cpu->linear_backward_weight(dw.data(), dy.data(), x.data(), n, in, out, 1.0f);
      k.gpu->linear_backward_weight(gdw.get(), gdy.get(), gx.get(), n, in, out, 1.0f);
      expect_close("y", k.get(gy), y, kRtol16 * rms(y), kRtol16);
      expect_close("dx", k.get(gdx), dx, kRtol16 * rms(dx), kRtol16);
      expect_close("dw", k.get(gdw), dw, kRtol16 * rms(dw), kRtol16);
      // Not float32's: the rounding is there (a float32 product of these
      // inputs is outside the tolerance above for many of its elements:
      // for fp16, the closer type, at least 390 of 903 in 300 draws).
      Vec y32(n * out);
      make_cpu_kernels()->linear_forward(y32.data(), x.data(), w.data(), n, in, out, false);
      size_t outside = 0;
      for (size_t i = 0; i < y.size(); ++i)
        outside += std::abs(double(y32[i]) - y[i]) > kRtol16 * (std::abs(double(y[i])) + rms(y));
      EXPECT_GT(outside, y.size() / 10);
    }
  }
}

// A kept activation goes to cuBLAS in its 16 bits (GemmInput, gemm.h): the
// same products, bit for bit, as its float32 value rounded by the GEMM,
// and one of the other 16-bit dtype is refused.
TEST(CudaKernels, SixteenBitInputsAreTheirFloat32ValuesBitForBit) {
  DDP_REQUIRE_GPUS(1);
  Both k;
  std::mt19937 rng(15);
  for (const ddp_dtype dtype : {DDP_BFLOAT16, DDP_FLOAT16}) {
    SCOPED_TRACE(ddp_dtype_name(dtype));
    k.gpu->set_compute_dtype(dtype);
    const int64_t n = 133, in = 300, out = 129;
    const Vec x = uniform(n * in, rng), w = uniform(out * in, rng), dy = uniform(n * out, rng);
    const Vec dw0 = uniform(out * in, rng);
    Buf<float> gx(x), gw(w), gdy(dy), gdw(dw0), gdw16(dw0);
    Buf<uint16_t> gx16(std::vector<uint16_t>(x.size(), 0xffff));
    k.gpu->convert(gx16.get(), dtype, gx.get(), DDP_FLOAT32, x.size());
    Buf<float> gy = Buf<float>::nan(n * out), gy16 = Buf<float>::nan(n * out);
    const GemmInput x16(gx16.get(), dtype);
    k.gpu->linear_forward(gy.get(), gx.get(), gw.get(), n, in, out, false);
    k.gpu->linear_forward(gy16.get(), x16, gw.get(), n, in, out, false);
    k.gpu->linear_backward_weight(gdw.get(), gdy.get(), gx.get(), n, in, out, 0.5f);
    k.gpu->linear_backward_weight(gdw16.get(), gdy.get(), x16, n, in, out, 0.5f);
    expect_equal("y", k.get(gy16), k.get(gy));
    expect_equal("dw", k.get(gdw16), k.get(gdw));
    const ddp_dtype other = dtype == DDP_BFLOAT16 ? DDP_FLOAT16 : DDP_BFLOAT16;
    EXPECT_THROW(k.gpu->linear_forward(gy16.get(), GemmInput(gx16.get(), other), gw.get(), n, in, out, false), Error);
  }
}

// RMSNorm and SwiGLU writing their kept output in 16 bits (LayerOutput):
// the float32 result's rounding (convert's), bit for bit, and the same rms.
TEST(CudaKernels, SixteenBitOutputsAreTheFloat32ResultsRounded) {
  DDP_REQUIRE_GPUS(1);
  Both k;
  std::mt19937 rng(16);
  const int64_t n = 37, d = 300, count = 70001;
  const Vec x = uniform(n * d, rng), g = uniform(d, rng), a = uniform(count, rng), b = uniform(count, rng);
  const Vec dout = uniform(count, rng);
  const int64_t rb = 2, rt = 5, rheads = 3, rdh = 8, rsize = rb * rt * rheads * rdh;  // RoPE's backward
  const Vec rx = uniform(rsize, rng);
  Vec cos(rt * rdh / 2), sin(rt * rdh / 2);
  layers::rope_tables(cos.data(), sin.data(), rt, rdh, 10000.0);
  Buf<float> gcos(cos), gsin(sin), grdx(rx), gry(rx);
  k.gpu->rope_backward(grdx.get(), grdx.get(), gcos.get(), gsin.get(), rb, rt, rheads, rdh);
  k.gpu->rope_forward(gry.get(), gry.get(), gcos.get(), gsin.get(), rb, rt, rheads, rdh);
  Buf<float> gx(x), gg(g), ga(a), gb(b), gdout(dout);
  Buf<float> gy = Buf<float>::nan(n * d), grms = Buf<float>::nan(n), ggate = Buf<float>::nan(count);
  Buf<float> gda = Buf<float>::nan(count), gdb = Buf<float>::nan(count);
  k.gpu->rmsnorm_forward(gy.get(), grms.get(), gx.get(), gg.get(), n, d);
  k.gpu->swiglu_forward(ggate.get(), ga.get(), gb.get(), count);
  k.gpu->swiglu_backward(gda.get(), gdb.get(), gdout.get(), ga.get(), gb.get(), count);
  for (const ddp_dtype dtype : {DDP_BFLOAT16, DDP_FLOAT16}) {
    SCOPED_TRACE(ddp_dtype_name(dtype));
    Buf<uint16_t> gy16(std::vector<uint16_t>(n * d, 0xffff)), want_y(std::vector<uint16_t>(n * d, 0));
    Buf<uint16_t> ggate16(std::vector<uint16_t>(count, 0xffff)), want_gate(std::vector<uint16_t>(count, 0));
    Buf<float> grms16 = Buf<float>::nan(n);
    k.gpu->rmsnorm_forward(LayerOutput(gy16.get(), dtype), grms16.get(), gx.get(), gg.get(), n, d);
    k.gpu->swiglu_forward(LayerOutput(ggate16.get(), dtype), ga.get(), gb.get(), count);
    k.gpu->convert(want_y.get(), dtype, gy.get(), DDP_FLOAT32, n * d);
    k.gpu->convert(want_gate.get(), dtype, ggate.get(), DDP_FLOAT32, count);
    EXPECT_TRUE(k.get(gy16) == k.get(want_y)) << "rmsnorm's 16 bits";
    EXPECT_TRUE(k.get(ggate16) == k.get(want_gate)) << "swiglu's 16 bits";
    // swiglu backward's da and db, which only GEMMs read (lm under a 16-bit compute).
    Buf<uint16_t> gda16(std::vector<uint16_t>(count, 0xffff)), gdb16(std::vector<uint16_t>(count, 0xffff));
    Buf<uint16_t> want_da(std::vector<uint16_t>(count, 0)), want_db(std::vector<uint16_t>(count, 0));
    k.gpu->swiglu_backward(LayerOutput(gda16.get(), dtype), LayerOutput(gdb16.get(), dtype), gdout.get(), ga.get(),
                           gb.get(), count);
    k.gpu->convert(want_da.get(), dtype, gda.get(), DDP_FLOAT32, count);
    k.gpu->convert(want_db.get(), dtype, gdb.get(), DDP_FLOAT32, count);
    EXPECT_TRUE(k.get(gda16) == k.get(want_da)) << "swiglu backward's da in 16 bits";
    EXPECT_TRUE(k.get(gdb16) == k.get(want_db)) << "swiglu backward's db in 16 bits";
    EXPECT_THROW(k.gpu->swiglu_backward(LayerOutput(gda16.get(), dtype), gdb.get(), gdout.get(), ga.get(), gb.get(),
                                        count),
                 Error);
    // RoPE's backward into 16 bits (its float32 input then scratch).
    Buf<float> gscratch(rx);
    Buf<uint16_t> grdx16(std::vector<uint16_t>(rsize, 0xffff)), want_rdx(std::vector<uint16_t>(rsize, 0));
    k.gpu->rope_backward(LayerOutput(grdx16.get(), dtype), gscratch.get(), gcos.get(), gsin.get(), rb, rt, rheads,
                         rdh);
    k.gpu->convert(want_rdx.get(), dtype, grdx.get(), DDP_FLOAT32, rsize);
    EXPECT_TRUE(k.get(grdx16) == k.get(want_rdx)) << "rope backward's 16 bits";
    Buf<float> gscratch2(rx);
    Buf<uint16_t> gry16(std::vector<uint16_t>(rsize, 0xffff)), want_ry(std::vector<uint16_t>(rsize, 0));
    k.gpu->rope_forward(LayerOutput(gry16.get(), dtype), gscratch2.get(), gcos.get(), gsin.get(), rb, rt, rheads, rdh);
    k.gpu->convert(want_ry.get(), dtype, gry.get(), DDP_FLOAT32, rsize);
    EXPECT_TRUE(k.get(gry16) == k.get(want_ry)) << "rope forward's 16 bits";
    expect_equal("rms", k.get(grms16), k.get(grms));
  }
}

// Backward's layers reading kept 16-bit inputs (LayerInput): the results
// of their float32 values, bit for bit (RMSNorm with dg, SwiGLU, the
// fused attention backward).
TEST(CudaKernels, SixteenBitInputsGiveTheirFloat32ValuesResults) {
  DDP_REQUIRE_GPUS(1);
  Both k;
  std::mt19937 rng(17);
  for (const ddp_dtype dtype : {DDP_BFLOAT16, DDP_FLOAT16}) {
    SCOPED_TRACE(ddp_dtype_name(dtype));
    k.gpu->set_compute_dtype(dtype);
    // v rounded to dtype: its float32 copy and its 16 bits on the device.
    auto kept = [&](const Vec& v) {
      Vec r = v;
      for (float& x : r) x = layers::round_to(dtype, x);
      Buf<float> f(r);
      Buf<uint16_t> h(std::vector<uint16_t>(r.size(), 0xffff));
      k.gpu->convert(h.get(), dtype, f.get(), DDP_FLOAT32, r.size());
      return std::pair<Buf<float>, Buf<uint16_t>>(std::move(f), std::move(h));
    };
    const int64_t n = 150, d = 300, count = 70001;
    auto [x, x16] = kept(uniform(n * d, rng));
    const Vec g = uniform(d, rng), rms = uniform(n, rng, 0.5f, 2.0f), dy = uniform(n * d, rng), dx0 = uniform(n * d, rng);
    Buf<float> gg(g), grms(rms), gdy(dy), gdx(dx0), gdx16(dx0), gdg(g), gdg16(g);
    k.gpu->rmsnorm_backward(gdx.get(), gdg.get(), gdy.get(), x.get(), gg.get(), grms.get(), n, d, true);
    k.gpu->rmsnorm_backward(gdx16.get(), gdg16.get(), gdy.get(), LayerInput(x16.get(), dtype), gg.get(), grms.get(), n,
                            d, true);
    expect_equal("rmsnorm dx", k.get(gdx16), k.get(gdx));
    expect_equal("rmsnorm dg", k.get(gdg16), k.get(gdg));
    auto [a, a16] = kept(uniform(count, rng));
    auto [b, b16] = kept(uniform(count, rng));
    Buf<float> gdout(uniform(count, rng)), gda = Buf<float>::nan(count), gdb = Buf<float>::nan(count);
    Buf<float> gda16 = Buf<float>::nan(count), gdb16 = Buf<float>::nan(count);
    k.gpu->swiglu_backward(gda.get(), gdb.get(), gdout.get(), a.get(), b.get(), count);
    k.gpu->swiglu_backward(gda16.get(), gdb16.get(), gdout.get(), LayerInput(a16.get(), dtype),
                           LayerInput(b16.get(), dtype), count);
    expect_equal("swiglu da", k.get(gda16), k.get(gda));
    expect_equal("swiglu db", k.get(gdb16), k.get(gdb));
    const int64_t s = 2, t = 70, heads = 3, dh = 64, size = s * t * heads * dh;
    auto [q, q16] = kept(uniform(size, rng));
    auto [kk, k16] = kept(uniform(size, rng));
    auto [v, v16] = kept(uniform(size, rng));
    Buf<float> gat(uniform(size, rng)), gout = Buf<float>::nan(size), gp = Buf<float>::nan(s * heads * t * 2);
    Buf<float> gscratch = Buf<float>::nan(k.gpu->attention_scratch_floats(s, t, heads));
    k.gpu->attention_forward(gout.get(), gp.get(), q.get(), kk.get(), v.get(), s, t, heads, dh);
    Vec want[3];
    for (int sixteen = 0; sixteen < 2; ++sixteen) {
      Buf<float> gdq = Buf<float>::nan(size), gdk = Buf<float>::nan(size), gdv = Buf<float>::nan(size);
      if (sixteen)
        k.gpu->attention_backward(gdq.get(), gdk.get(), gdv.get(), gscratch.get(), gat.get(), gp.get(),
                                  LayerInput(q16.get(), dtype), LayerInput(k16.get(), dtype),
                                  LayerInput(v16.get(), dtype), s, t, heads, dh);
      else
        k.gpu->attention_backward(gdq.get(), gdk.get(), gdv.get(), gscratch.get(), gat.get(), gp.get(), q.get(),
                                  kk.get(), v.get(), s, t, heads, dh);
      const Vec got[3] = {k.get(gdq), k.get(gdk), k.get(gdv)};
      for (int i = 0; i < 3; ++i) {
        if (!sixteen) want[i] = got[i];
        else expect_equal(std::string("attention d") + "qkv"[i], got[i], want[i]);
      }
    }
    // lm's attention under a 16-bit compute, through the tiled kernels
    // (dh 64) and the warp kernels (80): forward reads q, k, v in 16 bits
    // and writes its output in 16 bits, backward writes dv in 16 bits (the
    // GEMMs read it so): each the float32 run's result (on the same
    // values) rounded; dq and dk as before; a dv of the other 16-bit dtype
    // refused.
    for (const int64_t hd : {dh, int64_t{80}}) {
      SCOPED_TRACE("dh " + std::to_string(hd));
      const int64_t sz = s * t * heads * hd;
      auto [hq, hq16] = kept(uniform(sz, rng));
      auto [hk, hk16] = kept(uniform(sz, rng));
      auto [hv, hv16] = kept(uniform(sz, rng));
      Buf<float> hat(uniform(sz, rng));
      Buf<float> hout = Buf<float>::nan(sz), hp = Buf<float>::nan(s * heads * t * 2);
      Buf<float> hp16 = Buf<float>::nan(s * heads * t * 2);
      Buf<uint16_t> hout16(std::vector<uint16_t>(sz, 0xffff)), want_out(std::vector<uint16_t>(sz, 0));
      k.gpu->attention_forward(hout.get(), hp.get(), hq.get(), hk.get(), hv.get(), s, t, heads, hd);
      k.gpu->attention_forward(LayerOutput(hout16.get(), dtype), hp16.get(), LayerInput(hq16.get(), dtype),
                               LayerInput(hk16.get(), dtype), LayerInput(hv16.get(), dtype), s, t, heads, hd);
      k.gpu->convert(want_out.get(), dtype, hout.get(), DDP_FLOAT32, sz);
      EXPECT_TRUE(k.get(hout16) == k.get(want_out)) << "attention's output in 16 bits";
      expect_equal("statistics from 16-bit inputs", k.get(hp16), k.get(hp));
      Buf<float> dq1 = Buf<float>::nan(sz), dk1 = Buf<float>::nan(sz), dv1 = Buf<float>::nan(sz);
      Buf<float> dq2 = Buf<float>::nan(sz), dk2 = Buf<float>::nan(sz);
      Buf<uint16_t> dv16(std::vector<uint16_t>(sz, 0xffff)), want16(std::vector<uint16_t>(sz, 0));
      k.gpu->attention_backward(dq1.get(), dk1.get(), dv1.get(), gscratch.get(), hat.get(), hp.get(), hq.get(),
                                hk.get(), hv.get(), s, t, heads, hd);
      k.gpu->attention_backward(dq2.get(), dk2.get(), LayerOutput(dv16.get(), dtype), gscratch.get(), hat.get(),
                                hp.get(), hq.get(), hk.get(), hv.get(), s, t, heads, hd);
      k.gpu->convert(want16.get(), dtype, dv1.get(), DDP_FLOAT32, sz);
      EXPECT_TRUE(k.get(dv16) == k.get(want16)) << "attention's dv in 16 bits";
      expect_equal("dq beside a 16-bit dv", k.get(dq2), k.get(dq1));
      expect_equal("dk beside a 16-bit dv", k.get(dk2), k.get(dk1));
      const ddp_dtype other = dtype == DDP_BFLOAT16 ? DDP_FLOAT16 : DDP_BFLOAT16;
      EXPECT_THROW(k.gpu->attention_backward(dq2.get(), dk2.get(), LayerOutput(dv16.get(), other), gscratch.get(),
                                             hat.get(), hp.get(), hq.get(), hk.get(), hv.get(), s, t, heads, hd),
                   Error);
    }
    // Refused: q, k, v of two dtypes; a 16-bit p (a GPU keeps statistics);
    // SwiGLU's a and b of two dtypes.
    Buf<float> gdq = Buf<float>::nan(size), gdk = Buf<float>::nan(size), gdv = Buf<float>::nan(size);
    EXPECT_THROW(k.gpu->attention_backward(gdq.get(), gdk.get(), gdv.get(), gscratch.get(), gat.get(), gp.get(),
                                           LayerInput(q16.get(), dtype), kk.get(), v.get(), s, t, heads, dh),
                 Error);
    EXPECT_THROW(k.gpu->attention_backward(gdq.get(), gdk.get(), gdv.get(), gscratch.get(), gat.get(),
                                           LayerInput(q16.get(), dtype), q.get(), kk.get(), v.get(), s, t, heads, dh),
                 Error);
    EXPECT_THROW(k.gpu->swiglu_backward(gda16.get(), gdb16.get(), gdout.get(), LayerInput(a16.get(), dtype), b.get(),
                                        count),
                 Error);
  }
}

// Attention in 16 bits: the GPU's fused kernels (cuda/fused_attention.h:
// no [t, t] weights, p holds each row's softmax max and sum; for dh 16, 32,
// 64 and 128 cuda/tiled_attention.h's tensor-core tiles, 64 rows a tile,
// else a warp a row) against the
// CPU's emulation (the weights materialised, the four products rounding
// their inputs). Both round the same values at the same points, but a
// weight or ds computed with another summation order (and another exp)
// may land next to a 16-bit rounding boundary and round the other way:
// one 16-bit ulp (2^-8 in bf16) in one input of a sum, hence the 16-bit
// format's own tolerance. What this checks is the layout, the causal mask
// and the formulas; and that the fused kernels repeat bit for bit.
TEST(CudaKernels, SixteenBitAttentionMatchesTheCpuEmulation) {
  DDP_REQUIRE_GPUS(1);
  Both k;
  std::mt19937 rng(13);
  for (const ddp_dtype dtype : {DDP_BFLOAT16, DDP_FLOAT16}) {
    SCOPED_TRACE(ddp_dtype_name(dtype));
    k.cpu->set_compute_dtype(dtype);
    k.gpu->set_compute_dtype(dtype);
    ASSERT_FALSE(attention_keeps_weights(DDP_DEVICE_CUDA, dtype));
    const double loose = dtype == DDP_BFLOAT16 ? 1e-2 : 2e-3;
    struct Shape {
      int64_t b, t, heads, dh;
    };
    // Tiled: dh 16 (lm-tiny's), 64 (small's, large's; one whole tile, then
    // a second, partial one), 32 (three tiles) and 128 (the widest; four
    // tiles, one row in the last). A warp a row: 80 (a lane with a partial
    // third element), 160 (eight a lane, the widest kind, up to
    // kFusedAttentionMaxHead).
    for (const Shape s : {Shape{1, 1, 1, 16}, Shape{1, 64, 2, 64}, Shape{2, 70, 3, 64}, Shape{2, 130, 2, 32},
                          Shape{1, 193, 2, 128}, Shape{1, 33, 2, 80}, Shape{1, 33, 2, 160}}) {
      SCOPED_TRACE(shape({{"b", s.b}, {"t", s.t}, {"heads", s.heads}, {"dh", s.dh}}));
      const size_t size = s.b * s.t * s.heads * s.dh, psize = s.b * s.heads * s.t * s.t;
      const size_t stats = s.b * s.heads * s.t * 2;
      const Vec q = uniform(size, rng), kk = uniform(size, rng), v = uniform(size, rng), dout = uniform(size, rng);
      Buf<float> gq(q), gk(kk), gv(v), gdout(dout);
      Buf<float> gout = Buf<float>::nan(size), gp = Buf<float>::nan(stats);
      Buf<float> gdq = Buf<float>::nan(size), gdk = Buf<float>::nan(size), gdv = Buf<float>::nan(size);
      ASSERT_EQ(k.gpu->attention_scratch_floats(s.b, s.t, s.heads), size_t(s.b * s.heads * s.t));
      Buf<float> gscratch = Buf<float>::nan(k.gpu->attention_scratch_floats(s.b, s.t, s.heads));
      Vec out(size), p(psize), dq(size), dk(size), dv(size);
      Vec scratch(k.cpu->attention_scratch_floats(s.b, s.t, s.heads));
      k.cpu->attention_forward(out.data(), p.data(), q.data(), kk.data(), v.data(), s.b, s.t, s.heads, s.dh);
      k.gpu->attention_forward(gout.get(), gp.get(), gq.get(), gk.get(), gv.get(), s.b, s.t, s.heads, s.dh);
      expect_close("out", k.get(gout), out, loose * rms(out), loose);
      const Vec st = k.get(gp);  // row i: sum_j<=i exp(s_ij - max) is in [1, i + 1]
      for (size_t r = 0; r < stats / 2; ++r) {
        const double i = double(r % size_t(s.t));
        ASSERT_TRUE(std::isfinite(st[2 * r]) && st[2 * r + 1] >= 1.0f && st[2 * r + 1] <= i + 1 + 1e-3) << r;
      }
      // The CPU's backward from p as lm keeps it: rounded (the GPU's recomputed weights are).
      Vec kept = p;
      for (float& x : kept) x = layers::round_to(dtype, x);
      k.cpu->attention_backward(dq.data(), dk.data(), dv.data(), scratch.data(), dout.data(), kept.data(), q.data(),
                                kk.data(), v.data(), s.b, s.t, s.heads, s.dh);
      for (int run = 0; run < 2; ++run) {
        const Vec before = run ? k.get(gdq) : Vec{};
        k.gpu->attention_backward(gdq.get(), gdk.get(), gdv.get(), gscratch.get(), gdout.get(), gp.get(), gq.get(),
                                  gk.get(), gv.get(), s.b, s.t, s.heads, s.dh);
        if (run) {
          expect_equal("dq again", k.get(gdq), before);
          continue;
        }
        expect_close("dv", k.get(gdv), dv, loose * rms(dv), loose);
        expect_close("dq", k.get(gdq), dq, loose * rms(dq), loose);
        expect_close("dk", k.get(gdk), dk, loose * rms(dk), loose);
      }
    }
  }
}

// The tiled kernels load a tile 16 bytes at a time where q, k, v and dout
// start 16 bytes aligned, and an element at a time where they do not: the
// same values, so the same bits. The same tensors at an aligned address
// and one element past one, float32 and (backward's kept q, k, v) 16 bits.
TEST(CudaKernels, SixteenBitAttentionIsTheSameUnaligned) {
  DDP_REQUIRE_GPUS(1);
  Both k;
  std::mt19937 rng(18);
  const int64_t s = 2, t = 70, heads = 2, dh = 64, size = s * t * heads * dh;
  for (const ddp_dtype dtype : {DDP_BFLOAT16, DDP_FLOAT16}) {
    SCOPED_TRACE(ddp_dtype_name(dtype));
    k.gpu->set_compute_dtype(dtype);
    std::vector<Buf<float>> aligned;  // q, k, v, dout
    std::vector<Buf<float>> shifted;  // the same one element in
    std::vector<Buf<uint16_t>> aligned16, shifted16;
    for (int i = 0; i < 4; ++i) {
      Vec v = uniform(size, rng);
      aligned.emplace_back(v);
      v.insert(v.begin(), 0.0f);
      shifted.emplace_back(v);
      aligned16.emplace_back(std::vector<uint16_t>(size, 0));
      shifted16.emplace_back(std::vector<uint16_t>(size + 1, 0));
      k.gpu->convert(aligned16.back().get(), dtype, aligned.back().get(), DDP_FLOAT32, size);
      k.gpu->convert(shifted16.back().get() + 1, dtype, aligned.back().get(), DDP_FLOAT32, size);
    }
    const auto run = [&](int64_t off, bool sixteen) {  // out, dq, dk, dv
      const auto& f = off ? shifted : aligned;
      const auto& h = off ? shifted16 : aligned16;
      const auto in = [&](int i) {
        return sixteen ? LayerInput(h[i].get() + off, dtype) : LayerInput(f[i].get() + off);
      };
      Buf<float> out = Buf<float>::nan(size), stats = Buf<float>::nan(s * heads * t * 2);
      Buf<float> dq = Buf<float>::nan(size), dk = Buf<float>::nan(size), dv = Buf<float>::nan(size);
      Buf<float> scratch = Buf<float>::nan(k.gpu->attention_scratch_floats(s, t, heads));
      k.gpu->attention_forward(out.get(), stats.get(), in(0), in(1), in(2), s, t, heads, dh);
      k.gpu->attention_backward(dq.get(), dk.get(), dv.get(), scratch.get(), f[3].get() + off, stats.get(), in(0),
                                in(1), in(2), s, t, heads, dh);
      return std::vector<Vec>{k.get(out), k.get(dq), k.get(dk), k.get(dv)};
    };
    for (const bool sixteen : {false, true}) {
      SCOPED_TRACE(sixteen ? "16-bit inputs" : "float32 inputs");
      const std::vector<Vec> want = run(0, sixteen), got = run(1, sixteen);
      for (int i = 0; i < 4; ++i) expect_equal(std::vector<std::string>{"out", "dq", "dk", "dv"}[i], got[i], want[i]);
    }
  }
}

// The kept activations' conversion: the CPU's rounding, bit for bit, both
// ways.
TEST(CudaKernels, ConvertIsTheCpusRoundingBitForBit) {
  DDP_REQUIRE_GPUS(1);
  Both k;
  std::mt19937 rng(14);
  // fp16's overflow to infinity included; no NaN (CUDA's _rn conversions
  // give their own NaN's bits, as cuda_ops_test's ConvertMatchesCpuBitwise
  // notes: both are NaN, not the same bits).
  Vec x = uniform(100003, rng, -70000.0f, 70000.0f);
  x[1] = 1e-30f;  // below fp16's smallest subnormal, a normal bf16
  for (const ddp_dtype dtype : {DDP_BFLOAT16, DDP_FLOAT16}) {
    SCOPED_TRACE(ddp_dtype_name(dtype));
    std::vector<uint16_t> half(x.size());
    Vec back(x.size());
    k.cpu->convert(half.data(), dtype, x.data(), DDP_FLOAT32, x.size());
    k.cpu->convert(back.data(), DDP_FLOAT32, half.data(), dtype, x.size());
    Buf<float> gx(x), gback = Buf<float>::nan(x.size());
    Buf<uint16_t> ghalf(std::vector<uint16_t>(x.size(), 0xffff));
    k.gpu->convert(ghalf.get(), dtype, gx.get(), DDP_FLOAT32, x.size());
    k.gpu->convert(gback.get(), DDP_FLOAT32, ghalf.get(), dtype, x.size());
    EXPECT_TRUE(k.get(ghalf) == half) << "the 16-bit values differ from the CPU's";
    expect_equal("back", k.get(gback), back);
  }
}

TEST(CudaKernels, BiasMatchesCpu) {
  DDP_REQUIRE_GPUS(1);
  Both k;
  std::mt19937 rng(3);
  struct Shape {
    int64_t n, out;
  };
  for (const Shape s : {Shape{1, 1}, Shape{7, 33}, Shape{1000, 70}, Shape{65, 300}}) {
    SCOPED_TRACE(shape({{"n", s.n}, {"out", s.out}}));
    const Vec b = uniform(s.out, rng), dy = uniform(s.n * s.out, rng);
    const Vec y0 = uniform(s.n * s.out, rng), db0 = uniform(s.out, rng);
    Buf<float> gb(b), gdy(dy), gy(y0), gdb(db0);
    Vec y = y0, db = db0;

    k.cpu->bias_forward(y.data(), b.data(), s.n, s.out);
    k.gpu->bias_forward(gy.get(), gb.get(), s.n, s.out);
    k.cpu->bias_backward(db.data(), dy.data(), s.n, s.out);
    k.gpu->bias_backward(gdb.get(), gdy.get(), s.n, s.out);

    expect_equal("y", k.get(gy), y);  // one float addition per element
    expect_equal("db (column sums, layers.h's order)", k.get(gdb), db);
  }
}

// ---- embedding ---------------------------------------------------------------------

TEST(CudaKernels, EmbeddingMatchesCpu) {
  DDP_REQUIRE_GPUS(1);
  Both k;
  std::mt19937 rng(4);
  struct Shape {
    int64_t n, d;
    int32_t vocab;
  };
  // Few tokens repeated over many positions (vocab 5, n 600; vocab 3, n
  // 5000), d beyond one block's columns, mostly distinct tokens, one token
  // only.
  for (const Shape s : {Shape{1, 1, 1}, Shape{6, 16, 3}, Shape{600, 300, 5}, Shape{300, 33, 1000},
                        Shape{517, 8, 1}, Shape{5000, 70, 3}}) {
    SCOPED_TRACE(shape({{"n", s.n}, {"d", s.d}, {"vocab", s.vocab}}));
    const Tokens tokens = tokens_below(s.n, s.vocab, rng);
    const Vec table = uniform(s.vocab * s.d, rng), dout = uniform(s.n * s.d, rng);
    const Vec dtable0 = uniform(s.vocab * s.d, rng);  // a gradient: added into
    Buf<int32_t> gtok(tokens);
    Buf<float> gtable(table), gdout(dout), gdtable(dtable0), gout = Buf<float>::nan(s.n * s.d);
    Vec out(s.n * s.d), dtable = dtable0;

    k.cpu->embedding_forward(out.data(), tokens.data(), table.data(), s.n, s.d);
    k.gpu->embedding_forward(gout.get(), gtok.get(), gtable.get(), s.n, s.d);
    k.cpu->embedding_backward(dtable.data(), dout.data(), tokens.data(), s.n, s.d);
    k.gpu->embedding_backward(gdtable.get(), gdout.get(), gtok.get(), s.n, s.d);

    expect_equal("out", k.get(gout), out);
    // Each table row adds its positions' gradients in position order, as
    // the CPU: bitwise equal.
    expect_equal("dtable", k.get(gdtable), dtable);
  }
}

// ---- RMSNorm, RoPE ---------------------------------------------------------------------

TEST(CudaKernels, RmsNormMatchesCpu) {
  DDP_REQUIRE_GPUS(1);
  Both k;
  std::mt19937 rng(5);
  struct Shape {
    int64_t n, d;
  };
  // (d >= 8: at d = 1 the backward is a difference of two nearly equal terms,
  // 1 - x^2 / (x^2 + eps), that no two summation orders agree on.)
  for (const Shape s : {Shape{1, 8}, Shape{5, 70}, Shape{33, 300}, Shape{3, 1030}, Shape{200, 300}}) {
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(shape({{"n", s.n}, {"d", s.d}, {"accumulate", accumulate}}));
      const Vec x = uniform(s.n * s.d, rng), g = uniform(s.d, rng, 0.5f, 1.5f);
      const Vec dy = uniform(s.n * s.d, rng), dx0 = uniform(s.n * s.d, rng);
      const Vec dg0 = uniform(s.d, rng);  // a gradient: added into
      Buf<float> gx(x), gg(g), gdy(dy), gdg(dg0);
      Buf<float> gy = Buf<float>::nan(x.size()), grms = Buf<float>::nan(s.n);
      Buf<float> gdx = accumulate ? Buf<float>(dx0) : Buf<float>::nan(dx0.size());
      Vec y(x.size()), r(s.n), dx = dx0, dg = dg0;

      k.cpu->rmsnorm_forward(y.data(), r.data(), x.data(), g.data(), s.n, s.d);
      k.gpu->rmsnorm_forward(gy.get(), grms.get(), gx.get(), gg.get(), s.n, s.d);
      const Vec rms_gpu = k.get(grms);
      expect_close("y", k.get(gy), y, kAbsFloor);
      expect_close("rms", rms_gpu, r, kAbsFloor);

      // Both backward passes from the CPU's rms: only the backward differs.
      Buf<float> grms_cpu(r);
      k.cpu->rmsnorm_backward(dx.data(), dg.data(), dy.data(), x.data(), g.data(), r.data(), s.n,
                              s.d, accumulate);
      k.gpu->rmsnorm_backward(gdx.get(), gdg.get(), gdy.get(), gx.get(), gg.get(), grms_cpu.get(),
                              s.n, s.d, accumulate);
      expect_close("dx", k.get(gdx), dx, sum_atol(dx));
      expect_equal("dg (column sums, layers.h's order)", k.get(gdg), dg);

      // Without a gain gradient (dg null: a frozen gain).
      Vec dx_only = dx0;
      Buf<float> gdx_only(dx0);
      k.cpu->rmsnorm_backward(dx_only.data(), nullptr, dy.data(), x.data(), g.data(), r.data(), s.n,
                              s.d, true);
      k.gpu->rmsnorm_backward(gdx_only.get(), nullptr, gdy.get(), gx.get(), gg.get(),
                              grms_cpu.get(), s.n, s.d, true);
      expect_close("dx (dg null)", k.get(gdx_only), dx_only, sum_atol(dx_only));
    }
  }
}

TEST(CudaKernels, RopeMatchesCpu) {
  DDP_REQUIRE_GPUS(1);
  Both k;
  std::mt19937 rng(6);
  struct Shape {
    int64_t b, t, heads, dh;
  };
  for (const Shape s : {Shape{1, 1, 1, 2}, Shape{2, 6, 3, 8}, Shape{3, 70, 2, 16}}) {
    SCOPED_TRACE(shape({{"b", s.b}, {"t", s.t}, {"heads", s.heads}, {"dh", s.dh}}));
    Vec cos(s.t * s.dh / 2), sin(s.t * s.dh / 2);
    layers::rope_tables(cos.data(), sin.data(), s.t, s.dh, 10000.0);
    Buf<float> gcos(cos), gsin(sin);
    const size_t size = s.b * s.t * s.heads * s.dh;
    Vec x = uniform(size, rng), dx = uniform(size, rng);
    Buf<float> gx(x), gdx(dx);

    k.cpu->rope_forward(x.data(), x.data(), cos.data(), sin.data(), s.b, s.t, s.heads, s.dh);
    k.gpu->rope_forward(gx.get(), gx.get(), gcos.get(), gsin.get(), s.b, s.t, s.heads, s.dh);
    k.cpu->rope_backward(dx.data(), dx.data(), cos.data(), sin.data(), s.b, s.t, s.heads, s.dh);
    k.gpu->rope_backward(gdx.get(), gdx.get(), gcos.get(), gsin.get(), s.b, s.t, s.heads, s.dh);

    expect_close("x rotated", k.get(gx), x, kAbsFloor);
    expect_close("dx rotated back", k.get(gdx), dx, kAbsFloor);
  }
}

// ---- causal attention ----------------------------------------------------------------

TEST(CudaKernels, AttentionMatchesCpu) {
  DDP_REQUIRE_GPUS(1);
  Both k;
  std::mt19937 rng(7);
  struct Shape {
    int64_t b, t, heads, dh;
  };
  for (const Shape s :
       {Shape{1, 1, 1, 8}, Shape{2, 6, 2, 8}, Shape{2, 70, 3, 16}, Shape{1, 33, 4, 16}}) {
    SCOPED_TRACE(shape({{"b", s.b}, {"t", s.t}, {"heads", s.heads}, {"dh", s.dh}}));
    const size_t size = s.b * s.t * s.heads * s.dh, psize = s.b * s.heads * s.t * s.t;
    const Vec q = uniform(size, rng), kk = uniform(size, rng), v = uniform(size, rng);
    const Vec dout = uniform(size, rng);
    Buf<float> gq(q), gk(kk), gv(v), gdout(dout);
    // Everything the GPU must overwrite starts as NaN, scratch included.
    Buf<float> gout = Buf<float>::nan(size), gp = Buf<float>::nan(psize);
    Buf<float> gdq = Buf<float>::nan(size), gdk = Buf<float>::nan(size),
               gdv = Buf<float>::nan(size);
    const size_t scratch_floats = k.gpu->attention_scratch_floats(s.b, s.t, s.heads);
    Buf<float> gscratch = Buf<float>::nan(scratch_floats);
    Vec out(size), p(psize), dq(size), dk(size), dv(size);
    Vec scratch(k.cpu->attention_scratch_floats(s.b, s.t, s.heads));

    k.cpu->attention_forward(out.data(), p.data(), q.data(), kk.data(), v.data(), s.b, s.t, s.heads,
                             s.dh);
    k.gpu->attention_forward(gout.get(), gp.get(), gq.get(), gk.get(), gv.get(), s.b, s.t, s.heads,
                             s.dh);
    const Vec p_gpu = k.get(gp);
    expect_close("p", p_gpu, p, kAbsFloor);
    expect_close("out", k.get(gout), out, sum_atol(out));
    // The causal mask: exact zeros beyond the diagonal, as the CPU writes.
    size_t nonzero_masked = 0;
    for (int64_t bh = 0; bh < s.b * s.heads; ++bh)
      for (int64_t i = 0; i < s.t; ++i)
        for (int64_t j = i + 1; j < s.t; ++j)
          nonzero_masked += p_gpu[(bh * s.t + i) * s.t + j] != 0.0f;
    EXPECT_EQ(nonzero_masked, 0u) << "p above the diagonal";

    // Both backward passes from the CPU's p: only the backward differs.
    Buf<float> gp_cpu(p);
    k.cpu->attention_backward(dq.data(), dk.data(), dv.data(), scratch.data(), dout.data(),
                              p.data(), q.data(), kk.data(), v.data(), s.b, s.t, s.heads, s.dh);
    k.gpu->attention_backward(gdq.get(), gdk.get(), gdv.get(), gscratch.get(), gdout.get(),
                              gp_cpu.get(), gq.get(), gk.get(), gv.get(), s.b, s.t, s.heads, s.dh);
    expect_close("dq", k.get(gdq), dq, sum_atol(dq));
    expect_close("dk", k.get(gdk), dk, sum_atol(dk));
    expect_close("dv", k.get(gdv), dv, sum_atol(dv));
  }
}

// ---- elementwise -----------------------------------------------------------------------

TEST(CudaKernels, SwiGluMatchesCpu) {
  DDP_REQUIRE_GPUS(1);
  Both k;
  std::mt19937 rng(8);
  // The last size is beyond one grid's 65536 x 256 threads: the grid-stride
  // loop takes a second lap (as the lm's larger elementwise passes do).
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{100003}, (int64_t{65536} << 8) + 1001}) {
    SCOPED_TRACE(shape({{"n", n}}));
    const Vec a = uniform(n, rng, -6.0f, 6.0f), b = uniform(n, rng), dout = uniform(n, rng);
    Buf<float> ga(a), gb(b), gdout(dout);
    Buf<float> gout = Buf<float>::nan(n), gda = Buf<float>::nan(n), gdb = Buf<float>::nan(n);
    Vec out(n), da(n), db(n);

    k.cpu->swiglu_forward(out.data(), a.data(), b.data(), n);
    k.gpu->swiglu_forward(gout.get(), ga.get(), gb.get(), n);
    k.cpu->swiglu_backward(da.data(), db.data(), dout.data(), a.data(), b.data(), n);
    k.gpu->swiglu_backward(gda.get(), gdb.get(), gdout.get(), ga.get(), gb.get(), n);

    expect_close("out", k.get(gout), out, kAbsFloor);
    expect_close("da", k.get(gda), da, kAbsFloor);
    expect_close("db", k.get(gdb), db, kAbsFloor);
  }
}

TEST(CudaKernels, ReluMatchesCpuInPlaceToo) {
  DDP_REQUIRE_GPUS(1);
  Both k;
  std::mt19937 rng(9);
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{100003}}) {
    SCOPED_TRACE(shape({{"n", n}}));
    const Vec x = uniform(n, rng), dy = uniform(n, rng);
    Vec y(n), dx(n);
    k.cpu->relu_forward(y.data(), x.data(), n);
    k.cpu->relu_backward(dx.data(), dy.data(), y.data(), n);

    Buf<float> gx(x), gdy(dy), gy = Buf<float>::nan(n), gdx = Buf<float>::nan(n);
    k.gpu->relu_forward(gy.get(), gx.get(), n);
    k.gpu->relu_backward(gdx.get(), gdy.get(), gy.get(), n);
    expect_equal("y", k.get(gy), y);
    expect_equal("dx", k.get(gdx), dx);

    // In place: y aliases x, dx aliases dy (allowed by layers.h).
    k.gpu->relu_forward(gx.get(), gx.get(), n);
    k.gpu->relu_backward(gdy.get(), gdy.get(), gx.get(), n);
    expect_equal("y in place", k.get(gx), y);
    expect_equal("dx in place", k.get(gdy), dx);
  }
}

// ---- losses --------------------------------------------------------------------------------

TEST(CudaKernels, CrossEntropyMatchesCpu) {
  DDP_REQUIRE_GPUS(1);
  Both k;
  std::mt19937 rng(10);
  struct Shape {
    int64_t n, v;
    float scale;
  };
  for (const Shape s :
       {Shape{1, 2, 1.0f}, Shape{7, 37, 0.5f}, Shape{65, 1000, 1.0f}, Shape{3, 3001, 0.25f}}) {
    SCOPED_TRACE(shape({{"n", s.n}, {"v", s.v}}));
    Vec logits = uniform(s.n * s.v, rng, -4.0f, 4.0f);
    const Tokens targets = tokens_below(s.n, static_cast<int32_t>(s.v), rng);
    Buf<float> glogits(logits), glse = Buf<float>::nan(s.n);
    Buf<int32_t> gtargets(targets);
    Vec lse(s.n);

    // Both in place: softmax - onehot left where the logits were.
    const float loss =
        k.cpu->cross_entropy_forward(lse.data(), logits.data(), targets.data(), s.n, s.v);
    const float loss_gpu =
        k.gpu->cross_entropy_forward(glse.get(), glogits.get(), gtargets.get(), s.n, s.v);
    EXPECT_NEAR(loss_gpu, loss, kRtol * std::abs(loss)) << "loss";
    expect_close("lse", k.get(glse), lse, kAbsFloor);
    expect_close("softmax - onehot", k.get(glogits), logits, kAbsFloor);

    k.cpu->cross_entropy_backward(logits.data(), s.n, s.v, s.scale);
    k.gpu->cross_entropy_backward(glogits.get(), s.n, s.v, s.scale);
    expect_close("dlogits", k.get(glogits), logits, kAbsFloor);
  }
}

TEST(CudaKernels, MseMatchesCpu) {
  DDP_REQUIRE_GPUS(1);
  Both k;
  std::mt19937 rng(11);
  // 300001: more elements than the partial-sum blocks cover in one pass.
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{300001}}) {
    for (float scale : {1.0f, 0.25f}) {
      SCOPED_TRACE(shape({{"n", n}}));
      const Vec pred = uniform(n, rng), y = uniform(n, rng);
      Buf<float> gpred(pred), gy(y), gd = Buf<float>::nan(n);
      Vec d(n);

      const float loss = k.cpu->mse_forward(pred.data(), y.data(), n);
      const float loss_gpu = k.gpu->mse_forward(gpred.get(), gy.get(), n);
      // Double sums in another order: equal once rounded to float, but for
      // a last-bit tie.
      EXPECT_NEAR(loss_gpu, loss, 1e-6 * std::abs(loss)) << "loss";

      k.cpu->mse_backward(d.data(), pred.data(), y.data(), n, scale);
      k.gpu->mse_backward(gd.get(), gpred.get(), gy.get(), n, scale);
      expect_equal("d", k.get(gd), d);  // c * (pred - y), c rounded first: the same floats
    }
  }
}

// ---- determinism -------------------------------------------------------------------------

// The reductions (scatter-add, column sums, row reductions, loss sums) and
// the GEMMs (one cuBLAS handle on one stream) run in a fixed order: two runs
// give the same bits.
TEST(CudaKernels, RepeatedRunsAreBitwiseEqual) {
  DDP_REQUIRE_GPUS(1);
  Both k;
  std::mt19937 rng(12);
  const int64_t n = 2000, d = 96, vocab = 17;
  const Tokens tokens = tokens_below(n, vocab, rng);
  const Vec dout = uniform(n * d, rng), dtable0 = uniform(vocab * d, rng), x = uniform(n * d, rng);
  const Vec g = uniform(d, rng), logits = uniform(n * vocab, rng, -4.0f, 4.0f);
  Buf<int32_t> gtok(tokens);
  Buf<float> gdout(dout), gx(x), gg(g);

  // A linear layer (cuBLAS: forward, both backward GEMMs) and attention
  // (strided-batched GEMMs, softmax) over 4 sequences.
  const int64_t out = 40, b = 4, t = 50, heads = 2, dh = 16;
  const Vec w = uniform(out * d, rng), dy = uniform(n * out, rng);
  const Vec q = uniform(b * t * heads * dh, rng), kv = uniform(b * t * heads * dh, rng);
  Buf<float> gw(w), gdy(dy), gq(q), gkv(kv);

  auto run = [&] {
    std::vector<Vec> results;
    Buf<float> y_lin = Buf<float>::nan(n * out), dx_lin = Buf<float>::nan(n * d), dw(Vec(out * d, 0.0f));
    k.gpu->linear_forward(y_lin.get(), gx.get(), gw.get(), n, d, out, false);
    k.gpu->linear_backward_input(dx_lin.get(), gdy.get(), gw.get(), n, d, out, false);
    k.gpu->linear_backward_weight(dw.get(), gdy.get(), gx.get(), n, d, out);
    const size_t qsize = q.size(), psize = size_t(b * heads * t * t);
    Buf<float> att = Buf<float>::nan(qsize), p = Buf<float>::nan(psize), dq = Buf<float>::nan(qsize),
               dk = Buf<float>::nan(qsize), dv = Buf<float>::nan(qsize),
               scratch = Buf<float>::nan(k.gpu->attention_scratch_floats(b, t, heads));
    k.gpu->attention_forward(att.get(), p.get(), gq.get(), gkv.get(), gkv.get(), b, t, heads, dh);
    k.gpu->attention_backward(dq.get(), dk.get(), dv.get(), scratch.get(), gq.get(), p.get(), gq.get(),
                              gkv.get(), gkv.get(), b, t, heads, dh);
    for (const Buf<float>* buf : {&y_lin, &dx_lin, &dw, &att, &p, &dq, &dk, &dv}) results.push_back(k.get(*buf));

    Buf<float> dtable(dtable0), db(Vec(d, 0.0f)), rms = Buf<float>::nan(n);
    Buf<float> y = Buf<float>::nan(n * d), dx = Buf<float>::nan(n * d), dg(Vec(d, 0.0f));
    Buf<float> lse = Buf<float>::nan(n), loss_input(logits);  // the forward overwrites it
    k.gpu->embedding_backward(dtable.get(), gdout.get(), gtok.get(), n, d);
    k.gpu->bias_backward(db.get(), gdout.get(), n, d);
    k.gpu->rmsnorm_forward(y.get(), rms.get(), gx.get(), gg.get(), n, d);
    k.gpu->rmsnorm_backward(dx.get(), dg.get(), gdout.get(), gx.get(), gg.get(), rms.get(), n, d,
                            false);
    const float ce = k.gpu->cross_entropy_forward(lse.get(), loss_input.get(), gtok.get(), n, vocab);
    const float mse = k.gpu->mse_forward(gx.get(), gdout.get(), n * d);
    for (const Buf<float>* b : {&dtable, &db, &rms, &y, &dx, &dg, &lse, &loss_input})
      results.push_back(k.get(*b));
    results.push_back({ce, mse});
    return results;
  };
  const std::vector<Vec> first = run(), second = run();
  const char* names[] = {"linear y", "linear dx", "linear dw", "attention out", "attention p",
                         "attention dq", "attention dk", "attention dv",
                         "embedding dtable", "bias db", "rms", "rmsnorm y",
                         "rmsnorm dx", "rmsnorm dg", "lse", "softmax - onehot", "losses"};
  ASSERT_EQ(first.size(), std::size(names));
  for (size_t i = 0; i < first.size(); ++i) expect_equal(names[i], second[i], first[i]);
}

}  // namespace
}  // namespace ddp
