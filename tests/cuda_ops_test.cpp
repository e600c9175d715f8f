// cuda_ops_test — the CUDA device's elementwise kernels and the optimizer's
// CUDA update kernels (engine/core/cuda/cuda_ops.h). fill and scale against
// closed-form values; SGD, SGD with momentum and AdamW against the engine's
// real CPU Optimizer on a CpuDevice, stepped the same number of times from
// the same weights and gradients, compared BITWISE after every step (the
// kernels promise the CPU loops' rounding, operation by operation). Every
// test needs a GPU and skips, with the reason, where there is none.
#include <ddp/numeric.h>
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "config.h"
#include "convert.h"
#include "cuda/cuda_ops.h"
#include "device.h"
#include "gpu.h"
#include "model.h"
#include "optimizer.h"
#include "update_rules.h"

namespace ddp {
namespace {

#define CUDA_ASSERT(call)                                                                     \
  do {                                                                                        \
    const cudaError_t e_ = (call);                                                            \
    ASSERT_EQ(e_, cudaSuccess) << #call << ": " << cudaGetErrorString(e_);                    \
  } while (0)

// Device memory for n floats, freed at scope exit.
class DeviceFloats {
 public:
  explicit DeviceFloats(size_t n) : n_(n) {
    if (n > 0) error_ = cudaMalloc(reinterpret_cast<void**>(&ptr_), n * sizeof(float));
  }
  ~DeviceFloats() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  cudaError_t error() const { return error_; }  // of the allocation
  float* get() { return ptr_; }
  size_t size() const { return n_; }

 private:
  float* ptr_ = nullptr;
  size_t n_;
  cudaError_t error_ = cudaSuccess;
};

void upload(DeviceFloats& dst, const std::vector<float>& src, cudaStream_t stream) {
  ASSERT_EQ(dst.size(), src.size());
  CUDA_ASSERT(cudaMemcpyAsync(dst.get(), src.data(), src.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
  CUDA_ASSERT(cudaStreamSynchronize(stream));
}

std::vector<float> download(DeviceFloats& src, cudaStream_t stream) {
  std::vector<float> out(src.size());
  if (!out.empty()) {
    EXPECT_EQ(cudaMemcpyAsync(out.data(), src.get(), out.size() * sizeof(float), cudaMemcpyDeviceToHost, stream),
              cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  }
  return out;
}

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// Bitwise comparison: the number of differing elements and the first one.
::testing::AssertionResult bitwise_equal(const float* expected, const float* actual, size_t n) {
  if (std::memcmp(expected, actual, n * sizeof(float)) == 0) return ::testing::AssertionSuccess();
  size_t differing = 0, first = n;
  for (size_t i = 0; i < n; ++i) {
    if (bits(expected[i]) != bits(actual[i])) {
      if (differing++ == 0) first = i;
    }
  }
  return ::testing::AssertionFailure() << differing << " of " << n << " elements differ; first at [" << first
                                       << "]: expected " << std::hexfloat << expected[first] << ", got "
                                       << actual[first] << std::defaultfloat;
}

// Values that exercise rounding: mostly standard normal, one in ten scaled
// by 10^[-20, 10] (squares reach float's denormals), a few exact zeros.
std::vector<float> random_values(size_t n, float scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-20.0f, 10.0f);
  std::uniform_int_distribution<int> kind(0, 99);
  std::vector<float> out(n);
  for (float& x : out) {
    const int k = kind(rng);
    if (k == 0) {
      x = 0.0f;
    } else if (k < 10) {
      x = normal(rng) * std::pow(10.0f, exponent(rng));
    } else {
      x = normal(rng) * scale;
    }
  }
  return out;
}

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    DDP_REQUIRE_GPUS(1);
    CUDA_ASSERT(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
  }
  void* stream() { return stream_; }

  cudaStream_t stream_ = nullptr;
};

const size_t kSizes[] = {0, 1, 1000, (size_t{1} << 20) + 3};

TEST_F(CudaOps, FillIsExactAndStaysInRange) {
  DDP_REQUIRE_GPUS(1);
  const float value = 1.0f / 3.0f;
  for (const size_t n : kSizes) {
    SCOPED_TRACE("n = " + std::to_string(n));
    // One guard element past the end, which fill must leave alone.
    DeviceFloats d(n + 1);
    CUDA_ASSERT(d.error());
    CUDA_ASSERT(cudaMemsetAsync(d.get(), 0, (n + 1) * sizeof(float), stream_));
    cuda_ops::fill(stream(), d.get(), n, value);
    std::vector<float> expected(n + 1, value);
    expected[n] = 0.0f;
    const std::vector<float> got = download(d, stream_);
    EXPECT_TRUE(bitwise_equal(expected.data(), got.data(), n + 1));
  }
  // n == 0 launches nothing, so even a null pointer is fine.
  cuda_ops::fill(stream(), nullptr, 0, value);
  CUDA_ASSERT(cudaStreamSynchronize(stream_));
}

TEST_F(CudaOps, ScaleIsExactAndStaysInRange) {
  DDP_REQUIRE_GPUS(1);
  const float factor = 0.7f;  // inexact: most products round
  for (const size_t n : kSizes) {
    SCOPED_TRACE("n = " + std::to_string(n));
    std::vector<float> data = random_values(n + 1, 1.0f, 7 + n);
    DeviceFloats d(n + 1);
    CUDA_ASSERT(d.error());
    upload(d, data, stream_);
    cuda_ops::scale(stream(), d.get(), n, factor);
    for (size_t i = 0; i < n; ++i) data[i] *= factor;  // CpuDevice::scale's loop; data[n] is the guard
    const std::vector<float> got = download(d, stream_);
    EXPECT_TRUE(bitwise_equal(data.data(), got.data(), n + 1));
  }
  cuda_ops::scale(stream(), nullptr, 0, factor);
  CUDA_ASSERT(cudaStreamSynchronize(stream_));
}

// convert: float32 to bfloat16 and float16 and back, bit for bit as the
// CPU (convert_cpu) on random values of every magnitude, ties and NaN left out.
TEST_F(CudaOps, ConvertMatchesCpuBitwise) {
  DDP_REQUIRE_GPUS(1);
  for (const ddp_dtype half : {DDP_BFLOAT16, DDP_FLOAT16}) {
    const size_t n = (size_t{1} << 20) + 3;
    const std::vector<float> data = random_values(n, 1e4f, 11);
    std::vector<uint16_t> want16(n);
    std::vector<float> want32(n);
    convert_cpu(want16.data(), half, data.data(), DDP_FLOAT32, n);
    convert_cpu(want32.data(), DDP_FLOAT32, want16.data(), half, n);
    DeviceFloats in(n), back(n), mid((n + 1) / 2);  // mid: n 16-bit values
    CUDA_ASSERT(in.error());
    CUDA_ASSERT(back.error());
    CUDA_ASSERT(mid.error());
    upload(in, data, stream_);
    cuda_ops::convert(stream(), mid.get(), half, in.get(), DDP_FLOAT32, n);
    cuda_ops::convert(stream(), back.get(), DDP_FLOAT32, mid.get(), half, n);
    std::vector<uint16_t> got16(n);
    CUDA_ASSERT(cudaMemcpyAsync(got16.data(), mid.get(), n * sizeof(uint16_t), cudaMemcpyDeviceToHost, stream_));
    const std::vector<float> got32 = download(back, stream_);
    EXPECT_EQ(got16, want16) << ddp_dtype_name(half);
    EXPECT_TRUE(bitwise_equal(want32.data(), got32.data(), n)) << ddp_dtype_name(half);
  }
}

// Indices past 2^31 (size_t, not int): fill and scale 2^31 + 1000 floats
// (8 GiB) and read back both ends. Skips where the GPU has not the memory.
TEST_F(CudaOps, FillAndScaleBeyondTwoToThe31Elements) {
  DDP_REQUIRE_GPUS(1);
  const size_t n = (size_t{1} << 31) + 1000;
  DeviceFloats d(n);
  if (d.error() != cudaSuccess) {
    cudaGetLastError();  // clear it
    GTEST_SKIP() << "cannot allocate " << n * sizeof(float) << " bytes: " << cudaGetErrorString(d.error());
  }
  cuda_ops::fill(stream(), d.get(), n, 3.0f);
  cuda_ops::scale(stream(), d.get(), n, 0.5f);
  const size_t kEnd = 4096;
  std::vector<float> head(kEnd), tail(kEnd);
  CUDA_ASSERT(cudaMemcpyAsync(head.data(), d.get(), kEnd * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  CUDA_ASSERT(
      cudaMemcpyAsync(tail.data(), d.get() + (n - kEnd), kEnd * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  CUDA_ASSERT(cudaStreamSynchronize(stream_));
  const std::vector<float> expected(kEnd, 1.5f);
  EXPECT_TRUE(bitwise_equal(expected.data(), head.data(), kEnd));
  EXPECT_TRUE(bitwise_equal(expected.data(), tail.data(), kEnd));
}

// The engine's CPU optimizer on one parameter of n elements, stepped with
// gradients[s] at step s; and the same weights on the GPU.
constexpr size_t kParamSize = 300007;  // not a multiple of any block size
constexpr int kSteps = 5;

struct CpuReference {
  CpuDevice device;
  std::vector<Parameter> params;
  std::unique_ptr<Optimizer> optimizer;

  CpuReference(const OptimizerConfig& config, const std::vector<float>& initial) {
    Parameter p;
    p.name = "layer.weight";
    p.shape = {int64_t(initial.size())};
    p.trainable = true;
    p.data = Tensor(device, p.shape, MemCategory::Parameters);
    p.grad = Tensor(device, p.shape, MemCategory::Gradients);
    std::memcpy(p.data.data(), initial.data(), initial.size() * sizeof(float));
    params.push_back(std::move(p));
    optimizer = std::make_unique<Optimizer>(config, device, params);
  }
  void step(const std::vector<float>& grad) {
    std::memcpy(params[0].grad.data(), grad.data(), grad.size() * sizeof(float));
    optimizer->step(params, std::vector<size_t>{0});
  }
  const float* weights() const { return params[0].data.data(); }
};

std::vector<std::vector<float>> step_gradients(uint64_t seed) {
  std::vector<std::vector<float>> out;
  for (int s = 0; s < kSteps; ++s) out.push_back(random_values(kParamSize, 1.0f, seed + uint64_t(s)));
  return out;
}

struct SgdCase {
  const char* name;
  double lr, momentum, weight_decay;
};

const SgdCase kSgdCases[] = {
    {"plain", 0.05, 0.0, 0.0},
    {"plain_wd", 0.05, 0.0, 0.01},
    {"momentum", 0.01, 0.9, 0.0},
    {"momentum_wd", 0.01, 0.9, 1e-3},
    {"momentum_odd", 0.3, 0.37, 0.123},  // constants far from round binary values
};

TEST_F(CudaOps, SgdMatchesCpuOptimizerBitwise) {
  DDP_REQUIRE_GPUS(1);
  const std::vector<float> initial = random_values(kParamSize, 0.1f, 1);
  const std::vector<std::vector<float>> grads = step_gradients(100);
  for (const SgdCase& c : kSgdCases) {
    SCOPED_TRACE(c.name);
    OptimizerConfig config;
    config.name = "sgd";
    config.lr = c.lr;
    config.momentum = c.momentum;
    config.weight_decay = c.weight_decay;
    CpuReference cpu(config, initial);

    // The float scalars exactly as Optimizer::sgd derives them.
    const float lr = float(c.lr), wd = float(c.weight_decay), mu = float(c.momentum);
    DeviceFloats w(kParamSize), g(kParamSize), buf(kParamSize);
    CUDA_ASSERT(w.error());
    CUDA_ASSERT(g.error());
    CUDA_ASSERT(buf.error());
    upload(w, initial, stream_);
    // The buffer's contents before the first step must not matter.
    CUDA_ASSERT(cudaMemsetAsync(buf.get(), 0xff, kParamSize * sizeof(float), stream_));

    for (int s = 0; s < kSteps; ++s) {
      SCOPED_TRACE("step " + std::to_string(s + 1));
      cpu.step(grads[s]);
      upload(g, grads[s], stream_);
      if (mu == 0.0f) {
        cuda_ops::sgd_plain(stream(), w.get(), g.get(), kParamSize, lr, wd);
      } else {
        cuda_ops::sgd_momentum(stream(), w.get(), g.get(), buf.get(), kParamSize, lr, wd, mu, s == 0);
      }
      const std::vector<float> got = download(w, stream_);
      ASSERT_TRUE(bitwise_equal(cpu.weights(), got.data(), kParamSize));
    }
  }
}

struct AdamCase {
  const char* name;
  double lr, weight_decay, beta1, beta2, eps;
};

const AdamCase kAdamCases[] = {
    {"default", 1e-3, 0.01, 0.9, 0.999, 1e-8},
    {"no_wd", 1e-3, 0.0, 0.9, 0.999, 1e-8},
    {"odd", 0.037, 0.31, 0.83, 0.97, 1e-6},  // constants far from round binary values
};

TEST_F(CudaOps, AdamwMatchesCpuOptimizerBitwise) {
  DDP_REQUIRE_GPUS(1);
  const std::vector<float> initial = random_values(kParamSize, 0.1f, 2);
  const std::vector<std::vector<float>> grads = step_gradients(200);
  for (const AdamCase& c : kAdamCases) {
    SCOPED_TRACE(c.name);
    OptimizerConfig config;
    config.name = "adamw";
    config.lr = c.lr;
    config.weight_decay = c.weight_decay;
    config.beta1 = c.beta1;
    config.beta2 = c.beta2;
    config.eps = c.eps;
    CpuReference cpu(config, initial);

    DeviceFloats w(kParamSize), g(kParamSize), m(kParamSize), v(kParamSize);
    CUDA_ASSERT(w.error());
    CUDA_ASSERT(g.error());
    CUDA_ASSERT(m.error());
    CUDA_ASSERT(v.error());
    upload(w, initial, stream_);
    // The moments start at zero, as the CPU optimizer's zeroed state.
    CUDA_ASSERT(cudaMemsetAsync(m.get(), 0, kParamSize * sizeof(float), stream_));
    CUDA_ASSERT(cudaMemsetAsync(v.get(), 0, kParamSize * sizeof(float), stream_));

    for (int s = 0; s < kSteps; ++s) {
      SCOPED_TRACE("step " + std::to_string(s + 1));
      cpu.step(grads[s]);
      upload(g, grads[s], stream_);
      const AdamScalars scalars = adamw_scalars(c.lr, c.weight_decay, c.beta1, c.beta2, c.eps, s + 1);
      cuda_ops::adamw_update(stream(), w.get(), g.get(), m.get(), v.get(), kParamSize, scalars);
      const std::vector<float> got = download(w, stream_);
      ASSERT_TRUE(bitwise_equal(cpu.weights(), got.data(), kParamSize));
    }
  }
}

}  // namespace
}  // namespace ddp
