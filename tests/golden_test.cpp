// golden_test.cpp — the lm (lm-tiny) and mlp models against PyTorch: the
// fixtures of tests/fixtures/make_lm_fixtures.py hold initial weights, one
// batch, the logits, the loss, every gradient, and ten AdamW steps. Ours,
// loaded with those weights, must give the same logits, loss and gradients
// (1e-4 relative, 1e-5 absolute near zero) and follow the same AdamW
// trajectory through the engine's own optimizer.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lm.h"
#include "mlp.h"
#include "optimizer.h"
#include "safetensors.h"

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
void load_weights(Model& m, const Tensors& t, const std::string& file) {
  for (Parameter& p : m.params()) {
    ASSERT_TRUE(t.count(p.name)) << p.name;
    ASSERT_EQ(t.at(p.name).shape, p.shape) << p.name;
    const std::vector<float> w = floats(t, file, p.name);
    std::memcpy(p.data.data(), w.data(), p.data.bytes());
  }
}

void zero_grads(Model& m) {
  for (Parameter& p : m.params()) std::memset(p.grad.data(), 0, p.grad.bytes());
}

void expect_close(const std::string& what, const float* got, const std::vector<float>& want,
                  double rtol, double atol) {
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

// Forward, backward and 10 AdamW steps against the fixture.
void check_golden(Model& m, const Tensors& t, const std::string& file, const Batch& batch,
                  const std::function<const float*()>& logits) {
  load_weights(m, t, file);
  zero_grads(m);
  const float loss = m.forward(batch);
  const std::vector<float> want_loss = floats(t, file, "loss");
  EXPECT_NEAR(loss, want_loss[0], kRtol * std::abs(want_loss[0])) << "loss";
  expect_close("logits", logits(), floats(t, file, "logits"), kRtol, kAtol);
  m.backward(1.0f, [](size_t) {});
  for (const Parameter& p : m.params())
    expect_close("grad/" + p.name, p.grad.data(), floats(t, file, "grad/" + p.name), kRtol, kAtol);

  // AdamW(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1), 10 steps
  // on the same batch from the initial weights.
  load_weights(m, t, file);
  OptimizerConfig oc;
  oc.name = "adamw";
  oc.lr = 1e-2;
  oc.weight_decay = 0.1;
  CpuDevice device;
  Optimizer opt(oc, device, m.params());
  std::vector<size_t> all(m.params().size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  const std::vector<float> want_losses = floats(t, file, "adamw_losses");
  ASSERT_EQ(want_losses.size(), 10u);
  for (int s = 0; s < 10; ++s) {
    zero_grads(m);
    const float l = m.forward(batch);
    EXPECT_NEAR(l, want_losses[s], 2e-5 * std::abs(want_losses[s])) << "adamw step " << s;
    m.backward(1.0f, [](size_t) {});
    opt.step(m.params(), all);
  }
  // AdamW turns near-zero gradient entries into lr-sized steps whose sign
  // depends on rounding (fixtures/README.md): absolute 1e-3 on the weights.
  for (const Parameter& p : m.params())
    expect_close("adamw_final/" + p.name, p.data.data(), floats(t, file, "adamw_final/" + p.name),
                 0.0, 1e-3);
}

TEST(Golden, LmTinyMatchesPyTorch) {
  const std::string file = fixture("lm_tiny_golden.safetensors");
  const Tensors t = read_safetensors(file);
  CpuDevice device;
  const LmConfig c = lm_preset("lm-tiny");
  LmModel m(c, device, 0);
  ASSERT_EQ(t.at("tokens").shape, (Shape{2, c.context_length + 1}));
  const std::vector<int32_t> tokens = ints(t, "tokens");
  Batch batch;
  batch.tokens = tokens.data();
  batch.rows = 2;
  check_golden(m, t, file, batch, [&] { return m.logits(); });
}

TEST(Golden, MlpMatchesPyTorch) {
  const std::string file = fixture("mlp_golden.safetensors");
  const Tensors t = read_safetensors(file);
  CpuDevice device;
  MlpModel m(MlpConfig{32, 3, 10}, device, 0);
  ASSERT_EQ(t.at("x").shape, (Shape{8, 32}));
  const std::vector<float> x = floats(t, file, "x");
  const std::vector<int32_t> labels = ints(t, "y");
  Batch batch;
  batch.x = x.data();
  batch.labels = labels.data();
  batch.rows = 8;
  check_golden(m, t, file, batch, [&] { return m.logits(); });
}

}  // namespace
}  // namespace ddp
