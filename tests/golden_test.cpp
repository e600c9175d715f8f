// golden_test.cpp — the lm (lm-tiny) and mlp models against PyTorch: the
// fixtures of tests/fixtures/make_lm_fixtures.py hold initial weights, one
// batch, the logits, the loss, every gradient, and ten AdamW steps. Ours,
// loaded with those weights, must give the same logits, loss and gradients
// (1e-4 relative, 1e-5 absolute near zero) and follow the same AdamW
// trajectory through the engine's own optimizer. Each test runs on the CPU
// and, in GPU builds, on CUDA (skipped where no GPU is); on CUDA the model's
// logits and gradients must also equal the CPU's within 1e-5 relative.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#if DDP_WITH_CUDA
#include "gpu.h"
#endif
#include "lm.h"
#include "mlp.h"
#include "optimizer.h"
#include "safetensors.h"
#include "schedule.h"

namespace ddp {
namespace {

using Tensors = std::map<std::string, HostTensor>;

std::string fixture(const std::string& name) {
  return std::string(DDP_TEST_DATA_DIR) + "/fixtures/" + name;
}

std::vector<float> floats(const Tensors& t, const std::string& file, const std::string& name) {
  auto it = t.find(name);
  if (it == t.end()) throw Error(file + ": no tensor '" + name + "'");
  return it->second.as_floats(file, name);
}

// An I64 tensor as int32 (tokens, labels).
std::vector<int32_t> ints(const Tensors& t, const std::string& name) {
  const HostTensor& h = t.at(name);
  EXPECT_EQ(h.dtype, "I64") << name;
  std::vector<int32_t> out(h.bytes.size() / 8);
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t v;
    std::memcpy(&v, h.bytes.data() + 8 * i, 8);
    out[i] = static_cast<int32_t>(v);
  }
  return out;
}

// Copies the fixture's initial weights into the model, checking that names,
// order and shapes are the model's.
void load_weights(Device& device, Model& m, const Tensors& t, const std::string& file) {
  for (Parameter& p : m.params()) {
    ASSERT_TRUE(t.count(p.name)) << p.name;
    ASSERT_EQ(t.at(p.name).shape, p.shape) << p.name;
    const std::vector<float> w = floats(t, file, p.name);
    device.upload(p.data.data(), w.data(), p.data.bytes());
  }
}

void zero_grads(Device& device, Model& m) {
  for (Parameter& p : m.params())  // a model built directly has none yet: one tensor each
    if (!p.grad.defined()) p.grad = Tensor(device, p.shape, MemCategory::Gradients);
  for (Parameter& p : m.params()) device.fill(p.grad.data(), p.grad.numel(), 0.0f, device.compute_stream());
}

// `count` floats of device memory, on the host.
std::vector<float> host(Device& device, const float* data, size_t count) {
  std::vector<float> out(count);
  device.download(out.data(), data, count * sizeof(float));
  return out;
}

// The devices the tests run on: the CPU, and CUDA in GPU builds.
std::unique_ptr<Device> test_device(const std::string& kind) {
  return make_device(kind == "cuda" ? DDP_DEVICE_CUDA : DDP_DEVICE_CPU, 0, false);
}

void expect_close(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
                  double rtol, double atol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double excess = std::abs(double(got[i]) - want[i]) - (atol + rtol * std::abs(want[i]));
    if (i == 0 || !(excess <= worst)) worst = excess, worst_i = i;  // NaN counts as worst
    if (std::isnan(excess)) break;
  }
  EXPECT_LE(worst, 0.0) << what << "[" << worst_i << "]: " << got[worst_i] << " vs PyTorch "
                        << want[worst_i];
}

constexpr double kRtol = 1e-4, kAtol = 1e-5;

// softmax(logits[i]) - onehot(targets[i]) of each row, in double: what the
// forward leaves in place of the logits. (Logits that differ from the
// fixture's by a constant a row would pass; no output of the model, loss
// or gradient, can see such a difference either.)
std::vector<float> loss_gradient(const std::vector<float>& logits, const std::vector<int32_t>& targets) {
  const size_t v = logits.size() / targets.size();
  std::vector<float> out(logits.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    const float* row = &logits[i * v];
    const double m = *std::max_element(row, row + v);
    double sum = 0;
    for (size_t j = 0; j < v; ++j) sum += std::exp(double(row[j]) - m);
    for (size_t j = 0; j < v; ++j)
      out[i * v + j] = float(std::exp(double(row[j]) - m) / sum - (int32_t(j) == targets[i] ? 1.0 : 0.0));
  }
  return out;
}

// The fixtures' optimizer: AdamW(lr=1e-2, betas=(0.9, 0.999), eps=1e-8,
// weight_decay=0.1).
OptimizerConfig fixture_adamw() {
  OptimizerConfig oc;
  oc.name = "adamw";
  oc.lr = 1e-2;
  oc.weight_decay = 0.1;
  return oc;
}

// 0, 1, ..., one per parameter: what the optimizer steps.
std::vector<size_t> every_index(const Model& m) {
  std::vector<size_t> all(m.params().size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  return all;
}

// Forward, backward and 10 AdamW steps against the fixture. `dlogits`
// gives the model's loss gradient (device memory) and its count; `targets`
// the batch's target classes, one a row of it.
using Logits = std::function<std::pair<const float*, size_t>()>;
void check_golden(Device& device, Model& m, const Tensors& t, const std::string& file, const Batch& batch,
                  const Logits& dlogits, const std::vector<int32_t>& targets) {
  load_weights(device, m, t, file);
  zero_grads(device, m);
  const float loss = m.forward(batch);
  const std::vector<float> want_loss = floats(t, file, "loss");
  EXPECT_NEAR(loss, want_loss[0], kRtol * std::abs(want_loss[0])) << "loss";
  expect_close("softmax - onehot", host(device, dlogits().first, dlogits().second),
               loss_gradient(floats(t, file, "logits"), targets), kRtol, kAtol);
  m.backward(1.0f, [](size_t) {});
  for (const Parameter& p : m.params())
    expect_close("grad/" + p.name, p.grad.to_host(), floats(t, file, "grad/" + p.name), kRtol, kAtol);

  // AdamW(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1), 10 steps
  // on the same batch from the initial weights.
  load_weights(device, m, t, file);
  Optimizer opt(fixture_adamw(), device, m.params());
  const std::vector<size_t> all = every_index(m);
  const std::vector<float> want_losses = floats(t, file, "adamw_losses");
  ASSERT_EQ(want_losses.size(), 10u);
  for (int s = 0; s < 10; ++s) {
    zero_grads(device, m);
    const float l = m.forward(batch);
    EXPECT_NEAR(l, want_losses[s], 2e-5 * std::abs(want_losses[s])) << "adamw step " << s;
    m.backward(1.0f, [](size_t) {});
    opt.begin_step(1.0);
    opt.step(m.params(), all);
    // The CPU's update measures each gradient's squares as the gradient
    // norm's own pass would, bit for bit (optimizer.h); a GPU's does not.
    for (const Parameter& p : m.params()) {
      const double squares = opt.grad_squares()[size_t(&p - m.params().data())];
      if (device.kind() != DDP_DEVICE_CPU) {
        EXPECT_TRUE(std::isnan(squares)) << p.name;
        continue;
      }
      const std::vector<float> g = p.grad.to_host();
      EXPECT_EQ(squares, sum_of_squares(g.data(), g.size())) << p.name << ", adamw step " << s;
    }
  }
  // AdamW turns near-zero gradient entries into lr-sized steps whose sign
  // depends on rounding (fixtures/README.md), and the rounding is the BLAS
  // kernel's: absolute 2.5e-3 on the weights. Measured worst on lm-tiny,
  // OPENBLAS_CORETYPE forced on one AMD EPYC: SkylakeX and Prescott under
  // 1e-3, Haswell and Zen 1.14e-3, Sandybridge and Nehalem 1.85e-3.
  for (const Parameter& p : m.params())
    expect_close("adamw_final/" + p.name, p.data.to_host(), floats(t, file, "adamw_final/" + p.name),
                 0.0, 2.5e-3);
}

// Within 1e-5 relative of the CPU's values, with an absolute floor of 1e-5
// of their root mean square (at least 1e-6): GEMMs on the two devices sum
// in different orders, which leaves entries near zero with the rounding
// error of the terms, not of the result (as cuda_kernels_test argues).
void expect_close_to_cpu(const std::string& what, const std::vector<float>& got, const std::vector<float>& cpu) {
  double squares = 0;
  for (float v : cpu) squares += double(v) * v;
  const double rms = cpu.empty() ? 0.0 : std::sqrt(squares / double(cpu.size()));
  expect_close(what, got, cpu, 1e-5, std::max(1e-6, 1e-5 * rms));
}

// The same model on the CPU and on `device` from the fixture's weights:
// logits, loss and every gradient (expect_close_to_cpu): the CUDA kernels
// against the CPU's on the golden fixtures.
// `cpu` is the device on_cpu was built on: the gradients made here live as
// long as the model and are freed by it.
void check_against_cpu(Device& device, Device& cpu, Model& on_device, Model& on_cpu, const Tensors& t,
                       const std::string& file, const Batch& batch, const Logits& device_logits,
                       const Logits& cpu_logits) {
  load_weights(device, on_device, t, file);
  load_weights(cpu, on_cpu, t, file);
  zero_grads(device, on_device);
  zero_grads(cpu, on_cpu);
  const float loss = on_device.forward(batch), cpu_loss = on_cpu.forward(batch);
  EXPECT_NEAR(loss, cpu_loss, 1e-5 * std::abs(cpu_loss)) << "loss";
  expect_close_to_cpu("softmax - onehot", host(device, device_logits().first, device_logits().second),
                      host(cpu, cpu_logits().first, cpu_logits().second));
  on_device.backward(1.0f, [](size_t) {});
  on_cpu.backward(1.0f, [](size_t) {});
  for (size_t i = 0; i < on_cpu.params().size(); ++i)
    expect_close_to_cpu("grad/" + on_cpu.params()[i].name, on_device.params()[i].grad.to_host(),
                        on_cpu.params()[i].grad.to_host());
}

class Golden : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
#if DDP_WITH_CUDA
    if (GetParam() == "cuda") {
      DDP_REQUIRE_GPUS(1);
    }
#endif
    device_ = test_device(GetParam());
  }
  std::unique_ptr<Device> device_;
};

TEST_P(Golden, LmTinyMatchesPyTorch) {
  const std::string file = fixture("lm_tiny_golden.safetensors");
  const Tensors t = read_safetensors(file);
  const LmConfig c = lm_preset("lm-tiny");
  LmModel m(c, *device_, 0);
  ASSERT_EQ(t.at("tokens").shape, (Shape{2, c.context_length + 1}));
  const std::vector<int32_t> tokens = ints(t, "tokens");
  Batch batch;
  batch.tokens = tokens.data();
  batch.rows = 2;
  const size_t logits = size_t(2 * c.context_length * c.vocab_size);
  std::vector<int32_t> targets;  // tokens[:, 1:]
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t i = 1; i <= c.context_length; ++i) targets.push_back(tokens[size_t(r * (c.context_length + 1) + i)]);
  check_golden(*device_, m, t, file, batch, [&] { return std::pair{m.loss_gradient(), logits}; }, targets);
  if (GetParam() == "cpu") return;
  CpuDevice cpu;
  LmModel on_cpu(c, cpu, 0);
  check_against_cpu(*device_, cpu, m, on_cpu, t, file, batch, [&] { return std::pair{m.loss_gradient(), logits}; },
                    [&] { return std::pair{on_cpu.loss_gradient(), logits}; });
}

TEST_P(Golden, MlpMatchesPyTorch) {
  const std::string file = fixture("mlp_golden.safetensors");
  const Tensors t = read_safetensors(file);
  MlpModel m(MlpConfig{32, 3, 10}, *device_, 0);
  ASSERT_EQ(t.at("x").shape, (Shape{8, 32}));
  const std::vector<float> x = floats(t, file, "x");
  const std::vector<int32_t> labels = ints(t, "y");
  Batch batch;
  batch.x = x.data();
  batch.labels = labels.data();
  batch.rows = 8;
  check_golden(*device_, m, t, file, batch, [&] { return std::pair{m.loss_gradient(), size_t(8 * 10)}; },
               labels);
  if (GetParam() == "cpu") return;
  CpuDevice cpu;
  MlpModel on_cpu(MlpConfig{32, 3, 10}, cpu, 0);
  check_against_cpu(*device_, cpu, m, on_cpu, t, file, batch,
                    [&] { return std::pair{m.loss_gradient(), size_t(8 * 10)}; },
                    [&] { return std::pair{on_cpu.loss_gradient(), size_t(8 * 10)}; });
}

// Emulated mixed precision ([precision] compute; docs/precision.md) against
// make_precision_fixtures.py's references: the golden files' weights and
// batches, every GEMM's inputs rounded to bf16 or fp16, forward and
// backward, as tools/torch_models.py's rounded matmul rounds them.
// The first loss must agree within 1e-6 relative (measured: 2.3e-7 at
// worst), where computing in float32 instead misses by 2.6e-6 at least
// (checked here too, so the check can fail). The two sides add their
// float32 products in different orders, and a sum that lands next to a
// 16-bit rounding boundary rounds the other way on the other side: one
// 16-bit ulp in one input of the next product. Backward carries such
// flips to the layers before, whose own roundings then flip more: deep
// gradients agree to the 16-bit format's own noise, not float32's, and
// AdamW turns a flipped near-zero gradient into an lr-sized step. The
// other tolerances are those, measured on lm-tiny (the worst each case
// saw is printed as it runs) with room for another machine's BLAS kernel.
// fp16's loss over the 10 steps: within its unit roundoff 2^-11 (4.9e-4);
// measured 4.6e-5 on the CPU, 2.2e-4 with cuBLAS on an H200 (at step 9,
// the smallest loss, 0.23, after AdamW's steps have drifted most).
struct PrecisionCase {
  std::string device;  // "cpu" (emulated) or "cuda" (cuBLAS's 16-bit GEMMs)
  std::string model;   // "lm_tiny" or "mlp"
  std::string tag;    // "bf16" or "fp16"
  ddp_dtype dtype;
  double grad_rtol;   // on each gradient, with atol = grad_rtol x its root mean square
  double loss_rtol;   // on the loss of each of the 10 AdamW steps
  double final_atol;  // on the weights after them
};

constexpr double kFirstLossRtol = 1e-6;

// The worst |got - want| / (rtol |want| + atol) of a tensor, rms-scaled atol.
double worst_ratio(const std::vector<float>& got, const std::vector<float>& want, double rtol) {
  double squares = 0;
  for (float v : want) squares += double(v) * v;
  const double atol = rtol * std::sqrt(squares / double(std::max<size_t>(want.size(), 1)));
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double r = std::abs(double(got[i]) - want[i]) / (rtol * std::abs(want[i]) + atol + 1e-30);
    if (!(r <= worst)) worst = r;  // NaN counts as worst
  }
  return worst;
}

// fp16's backward as the engine runs it by default ([precision]
// loss_scale): from the loss times GradScaler's 65536, the gradients then
// times 1/65536 (on the CPU). bf16's: from the loss.
void scaled_backward(Device& device, Model& m, const PrecisionCase& c) {
  const float scale = c.dtype == DDP_FLOAT16 ? 65536.0f : 1.0f;
  m.backward(scale, [](size_t) {});
  if (scale == 1.0f) return;
  for (Parameter& p : m.params()) {
    std::vector<float> g = p.grad.to_host();
    for (float& v : g) v *= 1.0f / scale;
    device.upload(p.grad.data(), g.data(), p.grad.bytes());
  }
}

void check_precision(Device& device, Model& m, const PrecisionCase& c, const Tensors& init,
                     const std::string& init_file, const Batch& batch) {
  const std::string file = fixture(c.model + "_" + c.tag + ".safetensors");
  const Tensors t = read_safetensors(file);
  m.set_compute_dtype(c.dtype);
  load_weights(device, m, init, init_file);
  zero_grads(device, m);
  const double want_loss = floats(t, file, "loss")[0];
  EXPECT_NEAR(m.forward(batch), want_loss, kFirstLossRtol * std::abs(want_loss)) << "loss";
  scaled_backward(device, m, c);
  double worst = 0;
  for (const Parameter& p : m.params()) {
    const double r = worst_ratio(p.grad.to_host(), floats(t, file, "grad/" + p.name), c.grad_rtol);
    EXPECT_LE(r, 1.0) << "grad/" << p.name;
    worst = std::max(worst, r);
  }
  load_weights(device, m, init, init_file);
  Optimizer opt(fixture_adamw(), device, m.params());
  const std::vector<size_t> all = every_index(m);
  const std::vector<float> want_losses = floats(t, file, "adamw_losses");
  double worst_loss = 0;
  for (int s = 0; s < 10; ++s) {
    zero_grads(device, m);
    const float l = m.forward(batch);
    worst_loss = std::max(worst_loss, double(std::abs(l - want_losses[s]) / std::abs(want_losses[s])));
    EXPECT_NEAR(l, want_losses[s], c.loss_rtol * std::abs(want_losses[s])) << "adamw step " << s;
    scaled_backward(device, m, c);
    opt.begin_step(1.0);
    opt.step(m.params(), all);
  }
  double worst_final = 0;
  for (const Parameter& p : m.params()) {
    const std::vector<float> got = p.data.to_host(), want = floats(t, file, "adamw_final/" + p.name);
    for (size_t i = 0; i < want.size(); ++i) worst_final = std::max(worst_final, double(std::abs(got[i] - want[i])));
    expect_close("adamw_final/" + p.name, got, want, 0.0, c.final_atol);
  }
  // The same model computing in float32 misses the first loss.
  m.set_compute_dtype(DDP_FLOAT32);
  load_weights(device, m, init, init_file);
  EXPECT_GT(std::abs(m.forward(batch) - want_loss), kFirstLossRtol * std::abs(want_loss)) << "float32's loss";
  std::printf("%s %s %s: worst gradient %.3g of its tolerance, loss %.3g relative, weights %.3g absolute\n",
              c.device.c_str(), c.model.c_str(), c.tag.c_str(), worst, worst_loss, worst_final);
}

// Its name, in the test's name (`# GetParam() = lm_tiny bf16`), not its bytes.
void PrintTo(const PrecisionCase& c, std::ostream* os) { *os << c.device << " " << c.model << " " << c.tag; }

class PrecisionGolden : public ::testing::TestWithParam<PrecisionCase> {};

TEST_P(PrecisionGolden, MatchesPyTorchRoundingAtTheSamePoints) {
  const PrecisionCase& c = GetParam();
#if DDP_WITH_CUDA
  if (c.device == "cuda") {
    DDP_REQUIRE_GPUS(1);
  }
#endif
  const std::unique_ptr<Device> device = test_device(c.device);
  const std::string init_file = fixture(c.model + "_golden.safetensors");
  const Tensors init = read_safetensors(init_file);
  if (c.model == "lm_tiny") {
    LmModel m(lm_preset("lm-tiny"), *device, 0);
    const std::vector<int32_t> tokens = ints(init, "tokens");
    Batch batch;
    batch.tokens = tokens.data();
    batch.rows = 2;
    check_precision(*device, m, c, init, init_file, batch);
    return;
  }
  MlpModel m(MlpConfig{32, 3, 10}, *device, 0);
  const std::vector<float> x = floats(init, init_file, "x");
  const std::vector<int32_t> labels = ints(init, "y");
  Batch batch;
  batch.x = x.data();
  batch.labels = labels.data();
  batch.rows = 8;
  check_precision(*device, m, c, init, init_file, batch);
}

// The same cases on each device: the CPU emulates the 16-bit products, a
// GPU runs them on cuBLAS (skipped without one). The tolerances are the
// CPU's reasons: another summation order, a rounding that flips.
std::vector<PrecisionCase> precision_cases(const std::string& device) {
  return {PrecisionCase{device, "lm_tiny", "bf16", DDP_BFLOAT16, 2e-2, 2e-3, 5e-2},
          PrecisionCase{device, "lm_tiny", "fp16", DDP_FLOAT16, 5e-3, 0x1p-11, 5e-2},
          PrecisionCase{device, "mlp", "bf16", DDP_BFLOAT16, 2e-2, 2e-3, 5e-2},
          PrecisionCase{device, "mlp", "fp16", DDP_FLOAT16, 5e-3, 2e-4, 5e-2}};
}

INSTANTIATE_TEST_SUITE_P(Cpu, PrecisionGolden, ::testing::ValuesIn(precision_cases("cpu")),
                         [](const auto& info) { return info.param.model + "_" + info.param.tag; });
#if DDP_WITH_CUDA
INSTANTIATE_TEST_SUITE_P(Cuda, PrecisionGolden, ::testing::ValuesIn(precision_cases("cuda")),
                         [](const auto& info) { return info.param.model + "_" + info.param.tag; });
#endif

#if DDP_WITH_CUDA
INSTANTIATE_TEST_SUITE_P(Device, Golden, ::testing::Values("cpu", "cuda"),
                         [](const auto& info) { return info.param; });
#else
INSTANTIATE_TEST_SUITE_P(Device, Golden, ::testing::Values("cpu"), [](const auto& info) { return info.param; });
#endif

}  // namespace
}  // namespace ddp
