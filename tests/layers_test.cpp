// layers_test.cpp — the model building blocks and the lm / mlp models, with
// no reference but mathematics: every forward against a direct float64
// evaluation of its definition, every backward against central finite
// differences (layer by layer on small random shapes, then the whole lm-tiny
// and mlp), plus causal masking, the order of accumulated() calls, parameter
// counts, initialisation statistics and allocation-free steady state.
// (golden_test.cpp compares the same models with PyTorch.)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <ddp/numeric.h>

#include "layers.h"
#include "lm.h"
#include "mlp.h"
#include "registry.h"

namespace ddp {
namespace {

using Vec = std::vector<float>;

Vec randn(size_t n, std::mt19937& rng, float std = 1.0f) {
  std::normal_distribution<float> normal(0.0f, std);
  Vec v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

void expect_close(const std::string& what, const Vec& got, const std::vector<double>& want,
                  double rtol, double atol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], atol + rtol * std::abs(want[i])) << what << "[" << i << "]";
}

// Central differences of f with respect to x[i], for each i in `which` (x is
// perturbed in place and restored), against the analytic grad[i]. The step
// actually taken is measured in float, not assumed.
void expect_grad(const std::string& what, float* x, const float* grad, const std::vector<size_t>& which,
                 const std::function<double()>& f, float h, double rtol, double atol) {
  for (size_t i : which) {
    const float x0 = x[i];
    x[i] = x0 + h;
    const double up = x[i], fp = f();
    x[i] = x0 - h;
    const double down = x[i], fm = f();
    x[i] = x0;
    const double numeric = (fp - fm) / (up - down);
    EXPECT_NEAR(grad[i], numeric, atol + rtol * std::abs(numeric)) << what << "[" << i << "]";
  }
}

std::vector<size_t> all(size_t n) {
  std::vector<size_t> v(n);
  std::iota(v.begin(), v.end(), size_t{0});
  return v;
}

// Layer-level finite differences: inputs ~N(0, 1), a loss sum(out * r).
constexpr float kStep = 1e-2f;
constexpr double kRtol = 1e-2, kAtol = 1e-3;

// ---- linear and bias ----------------------------------------------------

TEST(Linear, ForwardIsXWTranspose) {
  std::mt19937 rng(1);
  const int64_t n = 5, in = 7, out = 3;
  Vec x = randn(n * in, rng), w = randn(out * in, rng), y(n * out);
  layers::linear_forward(y.data(), x.data(), w.data(), n, in, out);
  std::vector<double> want(n * out);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t k = 0; k < in; ++k) want[i * out + o] += double(x[i * in + k]) * w[o * in + k];
  expect_close("y", y, want, 1e-5, 1e-5);
  // accumulate adds
  Vec y2 = y;
  layers::linear_forward(y2.data(), x.data(), w.data(), n, in, out, true);
  for (size_t i = 0; i < y.size(); ++i) EXPECT_FLOAT_EQ(y2[i], 2 * y[i]);
}

TEST(Linear, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(2);
  const int64_t n = 5, in = 7, out = 3;
  Vec x = randn(n * in, rng), w = randn(out * in, rng), r = randn(n * out, rng), y(n * out);
  auto loss = [&] {
    layers::linear_forward(y.data(), x.data(), w.data(), n, in, out);
    return dot(y, r);
  };
  Vec dx(n * in, 5.0f), dw(out * in, 0.0f);
  layers::linear_backward_input(dx.data(), r.data(), w.data(), n, in, out);
  layers::linear_backward_weight(dw.data(), r.data(), x.data(), n, in, out);
  expect_grad("dx", x.data(), dx.data(), all(dx.size()), loss, kStep, kRtol, kAtol);
  expect_grad("dw", w.data(), dw.data(), all(dw.size()), loss, kStep, kRtol, kAtol);
  // dw accumulates; dx with accumulate adds.
  Vec dw2 = dw, dx2 = dx;
  layers::linear_backward_weight(dw2.data(), r.data(), x.data(), n, in, out);
  layers::linear_backward_input(dx2.data(), r.data(), w.data(), n, in, out, true);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_FLOAT_EQ(dw2[i], 2 * dw[i]);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_FLOAT_EQ(dx2[i], 2 * dx[i]);
  // alpha scales the product: by a power of two, exactly.
  Vec dx4(n * in), dw4(out * in, 0.0f);
  layers::linear_backward_input(dx4.data(), r.data(), w.data(), n, in, out, false, 0.25f);
  layers::linear_backward_weight(dw4.data(), r.data(), x.data(), n, in, out, 0.25f);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_EQ(dw4[i], 0.25f * dw[i]);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_EQ(dx4[i], 0.25f * dx[i]);
}

TEST(Bias, ForwardAndBackward) {
  std::mt19937 rng(3);
  const int64_t n = 4, out = 6;
  Vec b = randn(out, rng), y0 = randn(n * out, rng), r = randn(n * out, rng), y(n * out);
  auto loss = [&] {
    y = y0;
    layers::bias_forward(y.data(), b.data(), n, out);
    return dot(y, r);
  };
  loss();
  for (int64_t i = 0; i < n * out; ++i) EXPECT_FLOAT_EQ(y[i], y0[i] + b[i % out]);
  Vec db(out, 0.0f);
  layers::bias_backward(db.data(), r.data(), n, out);
  expect_grad("db", b.data(), db.data(), all(db.size()), loss, kStep, kRtol, kAtol);
}

// The column-sum order layers.h defines (and the CUDA kernels reproduce),
// written out one scalar at a time: per tile of kColumnSumRows rows, the
// terms from the tile's first; then the tile sums added into sum[j].
Vec column_sums_in_order(Vec sum, int64_t n, int64_t cols,
                         const std::function<float(int64_t, int64_t)>& term) {
  for (int64_t j = 0; j < cols; ++j)
    for (int64_t r0 = 0; r0 < n; r0 += layers::kColumnSumRows) {
      volatile float tile = term(r0, j);  // volatile: one rounding per operation, no FMA
      for (int64_t i = r0 + 1; i < std::min(n, r0 + layers::kColumnSumRows); ++i)
        tile = tile + term(i, j);
      sum[j] = sum[j] + tile;
    }
  return sum;
}

// Bitwise, at sizes spanning several row tiles and column chunks (and
// neither a multiple of either): the order is what the GPU must reproduce.
TEST(ColumnSums, BiasAndRmsGainAddInTheDocumentedOrder) {
  std::mt19937 rng(11);
  for (const auto& size : {std::pair<int64_t, int64_t>{1, 3}, {64, 8}, {65, 300}, {300, 517}}) {
    const int64_t n = size.first, cols = size.second;  // (lambdas below: clang 14 cannot capture bindings)
    SCOPED_TRACE("n=" + std::to_string(n) + " cols=" + std::to_string(cols));
    const Vec dy = randn(n * cols, rng), x = randn(n * cols, rng), sum0 = randn(cols, rng);
    Vec rms = randn(n, rng);
    for (float& r : rms) r = 0.5f + std::abs(r);
    Vec db = sum0;
    layers::bias_backward(db.data(), dy.data(), n, cols);
    const Vec want_db =
        column_sums_in_order(sum0, n, cols, [&](int64_t i, int64_t j) { return dy[i * cols + j]; });
    EXPECT_EQ(db, want_db);

    Vec dx(n * cols), dg = sum0;
    const Vec g(cols, 1.0f);
    layers::rmsnorm_backward(dx.data(), dg.data(), dy.data(), x.data(), g.data(), rms.data(), n,
                             cols);
    const Vec want_dg = column_sums_in_order(sum0, n, cols, [&](int64_t i, int64_t j) {
      volatile float inv = 1.0f / rms[i], p = dy[i * cols + j] * x[i * cols + j], t = p * inv;
      return t;
    });
    EXPECT_EQ(dg, want_dg);
  }
}

// ---- embedding ----------------------------------------------------------

TEST(Embedding, GatherAndScatterAdd) {
  std::mt19937 rng(4);
  const int64_t vocab = 6, d = 5, n = 8;
  const std::vector<int32_t> tokens = {3, 1, 3, 0, 5, 3, 1, 2};  // repeats sum; 4 unused
  Vec table = randn(vocab * d, rng), r = randn(n * d, rng), out(n * d);
  auto loss = [&] {
    layers::embedding_forward(out.data(), tokens.data(), table.data(), n, d);
    return dot(out, r);
  };
  loss();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j) EXPECT_EQ(out[i * d + j], table[tokens[i] * d + j]);
  Vec dtable(vocab * d, 0.0f);
  layers::embedding_backward(dtable.data(), r.data(), tokens.data(), n, d);
  expect_grad("dtable", table.data(), dtable.data(), all(dtable.size()), loss, kStep, kRtol, kAtol);
  for (int64_t j = 0; j < d; ++j) EXPECT_EQ(dtable[4 * d + j], 0.0f);
}

// ---- RMSNorm --------------------------------------------------------------

TEST(RmsNorm, ForwardMatchesDefinition) {
  std::mt19937 rng(5);
  const int64_t n = 4, d = 16;
  Vec x = randn(n * d, rng), g = randn(d, rng), y(n * d), rms(n);
  layers::rmsnorm_forward(y.data(), rms.data(), x.data(), g.data(), n, d);
  std::vector<double> want(n * d);
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += double(x[i * d + j]) * x[i * d + j];
    const double r = std::sqrt(ss / d + 1e-5);
    EXPECT_NEAR(rms[i], r, 1e-6 * r);
    for (int64_t j = 0; j < d; ++j) want[i * d + j] = x[i * d + j] / r * g[j];
  }
  expect_close("y", y, want, 1e-5, 1e-6);
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(6);
  const int64_t n = 4, d = 16;
  Vec x = randn(n * d, rng), g = randn(d, rng), r = randn(n * d, rng), y(n * d), rms(n);
  auto loss = [&] {
    layers::rmsnorm_forward(y.data(), rms.data(), x.data(), g.data(), n, d);
    return dot(y, r);
  };
  loss();
  Vec dx(n * d, 9.0f), dg(d, 0.0f);
  layers::rmsnorm_backward(dx.data(), dg.data(), r.data(), x.data(), g.data(), rms.data(), n, d);
  expect_grad("dx", x.data(), dx.data(), all(dx.size()), loss, kStep, kRtol, kAtol);
  expect_grad("dg", g.data(), dg.data(), all(dg.size()), loss, kStep, kRtol, kAtol);
  // accumulate adds into dx; a null dg is skipped.
  Vec dx2 = dx;
  layers::rmsnorm_backward(dx2.data(), nullptr, r.data(), x.data(), g.data(), rms.data(), n, d, true);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_FLOAT_EQ(dx2[i], 2 * dx[i]);
}

// ---- RoPE -------------------------------------------------------------------

TEST(Rope, RotatesAdjacentPairsByPosOverThetaPower) {
  std::mt19937 rng(7);
  const int64_t b = 2, t = 5, heads = 3, dh = 8, half = dh / 2;
  const double theta = 10000.0;
  Vec cos(t * half), sin(t * half);
  layers::rope_tables(cos.data(), sin.data(), t, dh, theta);
  Vec x = randn(b * t * heads * dh, rng), y = x;
  layers::rope_forward(y.data(), cos.data(), sin.data(), b, t, heads, dh);
  std::vector<double> want(y.size());
  for (int64_t bt = 0; bt < b * t; ++bt)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t k = 0; k < half; ++k) {
        const double angle = double(bt % t) / std::pow(theta, 2.0 * k / dh);
        const size_t i = static_cast<size_t>((bt * heads + h) * dh + 2 * k);
        want[i] = x[i] * std::cos(angle) - x[i + 1] * std::sin(angle);
        want[i + 1] = x[i] * std::sin(angle) + x[i + 1] * std::cos(angle);
      }
  expect_close("rope", y, want, 1e-6, 1e-6);
  // Position 0 is the identity; pair (0, 1) at position 1 turns by exactly 1 radian.
  for (int64_t i = 0; i < heads * dh; ++i) EXPECT_EQ(y[i], x[i]);
  EXPECT_FLOAT_EQ(cos[1 * half], static_cast<float>(std::cos(1.0)));
}

TEST(Rope, BackwardIsTheInverseRotation) {
  std::mt19937 rng(8);
  const int64_t b = 2, t = 5, heads = 3, dh = 8;
  Vec cos(t * dh / 2), sin(t * dh / 2);
  layers::rope_tables(cos.data(), sin.data(), t, dh, 10000.0);
  Vec x = randn(b * t * heads * dh, rng), r = randn(x.size(), rng), y(x.size());
  auto loss = [&] {
    y = x;
    layers::rope_forward(y.data(), cos.data(), sin.data(), b, t, heads, dh);
    return dot(y, r);
  };
  Vec dx = r;
  layers::rope_backward(dx.data(), cos.data(), sin.data(), b, t, heads, dh);
  expect_grad("dx", x.data(), dx.data(), all(dx.size()), loss, kStep, kRtol, kAtol);
  // Forward then backward is the identity.
  Vec z = x;
  layers::rope_forward(z.data(), cos.data(), sin.data(), b, t, heads, dh);
  layers::rope_backward(z.data(), cos.data(), sin.data(), b, t, heads, dh);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(z[i], x[i], 1e-6);
}

// ---- attention --------------------------------------------------------------

struct AttentionCase {
  int64_t b = 2, t = 6, heads = 2, dh = 4;  // t = 70: three query blocks, the last partial
  int64_t d() const { return heads * dh; }
  size_t size() const { return static_cast<size_t>(b * t * d()); }
};

class Attention : public ::testing::TestWithParam<int64_t> {};

TEST_P(Attention, ForwardIsCausalSoftmaxOfScaledScores) {
  std::mt19937 rng(9);
  AttentionCase c;
  c.t = GetParam();
  Vec q = randn(c.size(), rng), k = randn(c.size(), rng), v = randn(c.size(), rng), out(c.size());
  Vec p(c.b * c.heads * c.t * c.t, 7.0f);
  layers::attention_forward(out.data(), p.data(), q.data(), k.data(), v.data(), c.b, c.t, c.heads, c.dh);
  std::vector<double> want(c.size());
  const int64_t d = c.d();
  for (int64_t bi = 0; bi < c.b; ++bi)
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t i = 0; i < c.t; ++i) {
        std::vector<double> s(i + 1);
        double m = -1e300, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          for (int64_t e = 0; e < c.dh; ++e)
            s[j] += double(q[(bi * c.t + i) * d + h * c.dh + e]) * k[(bi * c.t + j) * d + h * c.dh + e];
          s[j] /= std::sqrt(double(c.dh));
          m = std::max(m, s[j]);
        }
        for (double& x : s) sum += (x = std::exp(x - m));
        const float* prow = &p[((bi * c.heads + h) * c.t + i) * c.t];
        for (int64_t j = 0; j < c.t; ++j) {
          if (j <= i) EXPECT_NEAR(prow[j], s[j] / sum, 1e-6);
          else EXPECT_EQ(prow[j], 0.0f) << "masked weight";
        }
        for (int64_t e = 0; e < c.dh; ++e) {
          double o = 0;
          for (int64_t j = 0; j <= i; ++j) o += s[j] / sum * v[(bi * c.t + j) * d + h * c.dh + e];
          want[(bi * c.t + i) * d + h * c.dh + e] = o;
        }
      }
  expect_close("out", out, want, 1e-5, 1e-6);
}

TEST_P(Attention, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(10);
  AttentionCase c;
  c.t = GetParam();
  Vec q = randn(c.size(), rng), k = randn(c.size(), rng), v = randn(c.size(), rng);
  Vec r = randn(c.size(), rng), out(c.size()), p(c.b * c.heads * c.t * c.t);
  auto loss = [&] {
    layers::attention_forward(out.data(), p.data(), q.data(), k.data(), v.data(), c.b, c.t, c.heads,
                              c.dh);
    return dot(out, r);
  };
  loss();
  Vec dq(c.size()), dk(c.size()), dv(c.size()), scratch(c.t * c.t);
  layers::attention_backward(dq.data(), dk.data(), dv.data(), scratch.data(), r.data(), p.data(),
                             q.data(), k.data(), v.data(), c.b, c.t, c.heads, c.dh);
  expect_grad("dq", q.data(), dq.data(), all(dq.size()), loss, kStep, kRtol, kAtol);
  expect_grad("dk", k.data(), dk.data(), all(dk.size()), loss, kStep, kRtol, kAtol);
  expect_grad("dv", v.data(), dv.data(), all(dv.size()), loss, kStep, kRtol, kAtol);
}

INSTANTIATE_TEST_SUITE_P(SequenceLengths, Attention, ::testing::Values(6, 70));

// ---- elementwise --------------------------------------------------------------

TEST(SwiGlu, ForwardAndBackward) {
  std::mt19937 rng(11);
  const int64_t n = 37;
  Vec a = randn(n, rng, 2.0f), b = randn(n, rng), r = randn(n, rng), out(n);
  a[0] = 30.0f, a[1] = -30.0f, a[2] = 0.0f;  // saturated and zero
  auto loss = [&] {
    layers::swiglu_forward(out.data(), a.data(), b.data(), n);
    return dot(out, r);
  };
  loss();
  std::vector<double> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = a[i] / (1.0 + std::exp(-double(a[i]))) * b[i];
  expect_close("out", out, want, 1e-6, 1e-7);
  Vec da(n), db(n);
  layers::swiglu_backward(da.data(), db.data(), r.data(), a.data(), b.data(), n);
  expect_grad("da", a.data(), da.data(), all(n), loss, kStep, kRtol, kAtol);
  expect_grad("db", b.data(), db.data(), all(n), loss, kStep, kRtol, kAtol);
}

TEST(Relu, ForwardAndBackward) {
  std::mt19937 rng(12);
  const int64_t n = 40;
  Vec x = randn(n, rng), r = randn(n, rng), y(n);
  for (float& v : x) v += v > 0 ? 0.1f : -0.1f;  // keep finite differences off the kink
  auto loss = [&] {
    layers::relu_forward(y.data(), x.data(), n);
    return dot(y, r);
  };
  loss();
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(y[i], std::max(x[i], 0.0f));
  Vec dx(n);
  layers::relu_backward(dx.data(), r.data(), y.data(), n);
  expect_grad("dx", x.data(), dx.data(), all(n), loss, kStep, kRtol, kAtol);
  // In place on the forward input and on the incoming gradient.
  Vec z = x, dz = r;
  layers::relu_forward(z.data(), z.data(), n);
  layers::relu_backward(dz.data(), dz.data(), z.data(), n);
  EXPECT_EQ(z, y);
  EXPECT_EQ(dz, dx);
}

// ---- cross-entropy --------------------------------------------------------------

TEST(CrossEntropy, ForwardIsMeanNegativeLogSoftmax) {
  std::mt19937 rng(13);
  const int64_t n = 5, v = 11;
  Vec logits = randn(n * v, rng, 3.0f), lse(n);
  logits[3] = 80.0f, logits[v + 2] = -90.0f;  // far from 0: stability
  const std::vector<int32_t> targets = {0, 2, 10, 5, 5};
  Vec x = logits;
  const double loss = layers::cross_entropy_forward(lse.data(), x.data(), targets.data(), n, v);
  double want = 0;
  for (int64_t i = 0; i < n; ++i) {
    double m = -1e300, s = 0;
    for (int64_t j = 0; j < v; ++j) m = std::max(m, double(logits[i * v + j]));
    for (int64_t j = 0; j < v; ++j) s += std::exp(logits[i * v + j] - m);
    const double l = m + std::log(s);
    EXPECT_NEAR(lse[i], l, 1e-6 * std::abs(l) + 1e-6);
    want += l - logits[i * v + targets[i]];
    // In place of the logits: softmax - onehot, each row summing to 0.
    double row_sum = 0;
    for (int64_t j = 0; j < v; ++j) {
      const double p = std::exp(logits[i * v + j] - l) - (j == targets[i] ? 1.0 : 0.0);
      EXPECT_NEAR(x[i * v + j], p, 1e-6) << "row " << i << ", column " << j;
      row_sum += x[i * v + j];
    }
    EXPECT_NEAR(row_sum, 0.0, 1e-6) << "row " << i;
  }
  EXPECT_NEAR(loss, want / n, 1e-6 * std::abs(want / n));
}

TEST(CrossEntropy, ForwardThenBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(14);
  const int64_t n = 5, v = 11;
  Vec logits = randn(n * v, rng, 2.0f), lse(n);
  const std::vector<int32_t> targets = {0, 2, 10, 5, 5};
  const float scale = 3.0f;
  auto loss = [&] {
    Vec scratch = logits;  // the forward overwrites its input
    return scale * layers::cross_entropy_forward(lse.data(), scratch.data(), targets.data(), n, v);
  };
  Vec d = logits;  // in place, as the models do
  layers::cross_entropy_forward(lse.data(), d.data(), targets.data(), n, v);
  layers::cross_entropy_backward(d.data(), n, v, scale);
  expect_grad("dlogits", logits.data(), d.data(), all(d.size()), loss, 1e-2f, kRtol, 1e-4);
}

// ---- the lm model -------------------------------------------------------------

std::vector<int32_t> random_tokens(int64_t rows, const LmConfig& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(rows * (c.context_length + 1)));
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % c.vocab_size);
  return t;
}

void zero_grads(Model& m) {
  for (Parameter& p : m.params())
    if (p.trainable) std::fill(p.grad.data(), p.grad.data() + p.grad.numel(), 0.0f);
}

Vec grad_of(const Parameter& p) { return Vec(p.grad.data(), p.grad.data() + p.grad.numel()); }

// Finite differences of a whole model's loss for every parameter tensor: a
// directional derivative along a random +-1 direction over the whole tensor,
// and single entries (the largest gradients and a few random ones).
void check_model_gradients(Model& m, const Batch& batch, float h, double rtol, double atol) {
  zero_grads(m);
  m.forward(batch);
  m.backward(1.0f, [](size_t) {});
  auto loss = [&] { return static_cast<double>(m.forward(batch)); };
  std::mt19937 rng(99);
  for (Parameter& p : m.params()) {
    const Vec g = grad_of(p);
    float* w = p.data.data();
    const size_t n = p.data.numel();
    // Directional: d/de loss(w + e u) = <g, u>.
    Vec u(n), w0(w, w + n);
    for (float& x : u) x = rng() % 2 ? 1.0f : -1.0f;
    for (size_t i = 0; i < n; ++i) w[i] = w0[i] + h * u[i];
    const double fp = loss();
    for (size_t i = 0; i < n; ++i) w[i] = w0[i] - h * u[i];
    const double fm = loss();
    std::copy(w0.begin(), w0.end(), w);
    const double numeric = (fp - fm) / (2.0 * h), analytic = dot(g, u);
    EXPECT_NEAR(analytic, numeric, atol + rtol * std::abs(numeric)) << p.name << " (directional)";
    // Entries.
    std::vector<size_t> order = all(n);
    const size_t top = std::min<size_t>(3, n);
    std::partial_sort(order.begin(), order.begin() + top, order.end(),
                      [&](size_t a, size_t b) { return std::abs(g[a]) > std::abs(g[b]); });
    std::vector<size_t> which(order.begin(), order.begin() + top);
    for (int i = 0; i < 2; ++i) which.push_back(rng() % n);
    expect_grad(p.name, w, g.data(), which, loss, h, rtol, atol);
  }
}

TEST(Lm, PresetsAndParameterCounts) {
  const LmConfig tiny = lm_preset("lm-tiny");
  EXPECT_EQ(tiny.vocab_size, 512);
  EXPECT_EQ(tiny.context_length, 32);
  EXPECT_EQ(tiny.d_model, 64);
  EXPECT_EQ(tiny.d_ff, 256);
  EXPECT_EQ(tiny.num_layers, 2);
  EXPECT_EQ(tiny.num_heads, 4);
  // 2 V D + L (2 D + 4 D^2 + 3 D F) + D
  EXPECT_EQ(lm_parameter_count(tiny), 2 * 512 * 64 + 2 * (2 * 64 + 4 * 64 * 64 + 3 * 64 * 256) + 64);
  EXPECT_EQ(lm_parameter_count(tiny), 196928);
  EXPECT_EQ(lm_parameter_count(lm_preset("lm-cpu")), 9316608);  // "about 9.3 M"
  EXPECT_EQ(lm_preset("lm-cpu").context_length, 128);
  // The spec's "about" sizes of the larger presets.
  EXPECT_NEAR(lm_parameter_count(lm_preset("small")) / 1e6, 128.6, 0.5);
  EXPECT_NEAR(lm_parameter_count(lm_preset("medium")) / 1e6, 423.2, 0.5);
  EXPECT_NEAR(lm_parameter_count(lm_preset("large")) / 1e6, 969.4, 0.5);
  EXPECT_NEAR(lm_parameter_count(lm_preset("xl")) / 1e9, 2.0, 0.05);
  EXPECT_NEAR(lm_parameter_count(lm_preset("2.7B")) / 1e9, 3.4, 0.05);
  for (const char* name : {"small", "medium", "large", "xl", "2.7B"})
    EXPECT_EQ(lm_preset(name).context_length, 256) << name;
  try {
    lm_preset("huge");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "unknown lm preset 'huge' (known: lm-tiny, lm-cpu, small, medium, large, xl, 2.7B, xxl)");
  }
}

TEST(Lm, ParameterTableInSpecOrder) {
  CpuDevice device;
  for (const char* preset : {"lm-tiny", "lm-cpu"}) {
    const LmConfig c = lm_preset(preset);
    auto m = make_lm(c, device, 0);
    const auto& p = m->params();
    ASSERT_EQ(p.size(), 3 + 9 * static_cast<size_t>(c.num_layers));
    size_t total = 0;
    for (const Parameter& x : p) {
      total += x.data.numel();
      EXPECT_TRUE(x.trainable);
      EXPECT_EQ(x.uses, 1);
      EXPECT_EQ(x.grad.numel(), x.data.numel());
    }
    EXPECT_EQ(static_cast<int64_t>(total), lm_parameter_count(c)) << preset;
    const int64_t d = c.d_model, f = c.d_ff, v = c.vocab_size;
    EXPECT_EQ(p[0].name, "token_embeddings.weight");
    EXPECT_EQ(p[0].shape, (Shape{v, d}));
    const std::vector<std::pair<std::string, Shape>> layer = {
        {"ln1.weight", {d}},           {"attn.q_proj.weight", {d, d}},
        {"attn.k_proj.weight", {d, d}}, {"attn.v_proj.weight", {d, d}},
        {"attn.output_proj.weight", {d, d}}, {"ln2.weight", {d}},
        {"ffn.w1.weight", {f, d}},     {"ffn.w2.weight", {d, f}},
        {"ffn.w3.weight", {f, d}}};
    for (int64_t l = 0; l < c.num_layers; ++l)
      for (size_t i = 0; i < layer.size(); ++i) {
        const Parameter& x = p[1 + 9 * l + i];
        EXPECT_EQ(x.name, "layers." + std::to_string(l) + "." + layer[i].first);
        EXPECT_EQ(x.shape, layer[i].second) << x.name;
      }
    EXPECT_EQ(p[p.size() - 2].name, "ln_final.weight");
    EXPECT_EQ(p.back().name, "lm_head.weight");
    EXPECT_EQ(p.back().shape, (Shape{v, d}));
    EXPECT_EQ(m->input_width(), c.context_length + 1);
    EXPECT_EQ(m->output_width(), v);
  }
}

// Sample standard deviation and largest magnitude of a tensor.
std::pair<double, double> stats(const Parameter& p) {
  const float* w = p.data.data();
  const size_t n = p.data.numel();
  double s = 0, s2 = 0, mx = 0;
  for (size_t i = 0; i < n; ++i) {
    s += w[i];
    s2 += double(w[i]) * w[i];
    mx = std::max(mx, std::abs(double(w[i])));
  }
  const double mean = s / n;
  return {std::sqrt(s2 / n - mean * mean), mx};
}

TEST(Lm, InitialisationStatistics) {
  CpuDevice device;
  const LmConfig c = lm_preset("lm-cpu");
  auto m = make_lm(c, device, 7);
  for (const Parameter& p : m->params()) {
    if (p.shape.size() == 1) {  // RMSNorm gains
      for (size_t i = 0; i < p.data.numel(); ++i) ASSERT_EQ(p.data.data()[i], 1.0f) << p.name;
      continue;
    }
    const double std = p.name == "token_embeddings.weight"
                           ? 1.0
                           : std::sqrt(2.0 / static_cast<double>(p.shape[0] + p.shape[1]));
    auto [sd, mx] = stats(p);
    // A normal truncated at +-3 std has std 0.9866 std.
    EXPECT_NEAR(sd, 0.9866 * std, 0.05 * std) << p.name;
    EXPECT_LE(mx, 3.0 * std + 1e-7) << p.name;
    if (p.data.numel() > 100000) {
      EXPECT_GT(mx, 2.5 * std) << p.name << " (tails present)";
    }
  }
  // The seed decides: same seed, same weights; another seed, others.
  auto same = make_lm(c, device, 7), other = make_lm(c, device, 8);
  const Parameter& a = m->params()[5];
  EXPECT_TRUE(std::equal(a.data.data(), a.data.data() + a.data.numel(), same->params()[5].data.data()));
  EXPECT_FALSE(std::equal(a.data.data(), a.data.data() + a.data.numel(), other->params()[5].data.data()));
}

TEST(Lm, RejectsBadSizesAndTokens) {
  CpuDevice device;
  LmConfig c = lm_preset("lm-tiny");
  c.num_heads = 3;  // 64 / 3
  EXPECT_THROW(make_lm(c, device, 0), Error);
  c.num_heads = 64;  // head size 1: RoPE needs pairs
  EXPECT_THROW(make_lm(c, device, 0), Error);
  c = lm_preset("lm-tiny");
  auto m = make_lm(c, device, 0);
  auto tokens = random_tokens(1, c, 1);
  tokens[5] = 512;
  Batch batch;
  batch.tokens = tokens.data();
  batch.rows = 1;
  try {
    m->forward(batch);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "lm: token 512 at row 0, position 5 is outside the vocabulary [0, 512)");
  }
  Batch floats;
  floats.rows = 1;
  EXPECT_THROW(m->forward(floats), Error);
}

TEST(Lm, LossAtInitIsNearLogVocab) {
  CpuDevice device;
  const LmConfig c = lm_preset("lm-tiny");
  auto m = make_lm(c, device, 0);
  auto tokens = random_tokens(3, c, 2);
  Batch batch;
  batch.tokens = tokens.data();
  batch.rows = 3;
  const float loss = m->forward(batch);
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(loss, std::log(512.0), 1.0);
}

TEST(Lm, GradientsMatchFiniteDifferences) {
  CpuDevice device;
  const LmConfig c = lm_preset("lm-tiny");
  auto m = make_lm(c, device, 3);
  auto tokens = random_tokens(2, c, 4);
  Batch batch;
  batch.tokens = tokens.data();
  batch.rows = 2;
  check_model_gradients(*m, batch, 1e-2f, 2e-2, 1e-4);
}

TEST(Lm, CausalMaskHidesTheFuture) {
  CpuDevice device;
  const LmConfig c = lm_preset("lm-tiny");
  auto m = make_lm(c, device, 5);
  auto* lm = dynamic_cast<LmModel*>(m.get());
  ASSERT_NE(lm, nullptr);
  auto tokens = random_tokens(2, c, 6);
  Batch batch;
  batch.tokens = tokens.data();
  batch.rows = 2;
  const int64_t t = c.context_length, v = c.vocab_size;
  // The forward leaves softmax - onehot(targets) of the logits. The token
  // changed is also the target of the position before it: there the
  // softmax is compared, the one-hot added back (to within its rounding).
  m->forward(batch);
  const Vec before(lm->loss_gradient(), lm->loss_gradient() + 2 * t * v);
  const int64_t changed = 20;  // input position changed in row 1
  const int32_t old_token = tokens[(t + 1) + changed];
  tokens[(t + 1) + changed] = (old_token + 1) % static_cast<int32_t>(v);
  m->forward(batch);
  const float* after = lm->loss_gradient();
  // Row 0 unchanged entirely; row 1 unchanged before `changed`, changed from it on.
  for (int64_t i = 0; i < t * v; ++i) ASSERT_EQ(after[i], before[i]) << "row 0, " << i;
  for (int64_t i = 0; i < (changed - 1) * v; ++i)
    ASSERT_EQ(after[t * v + i], before[t * v + i]) << "row 1, position " << i / v;
  for (int64_t j = 0; j < v; ++j) {
    const int64_t i = t * v + (changed - 1) * v + j;
    const float p_before = before[i] + (j == old_token ? 1.0f : 0.0f);
    const float p_after = after[i] + (j == tokens[(t + 1) + changed] ? 1.0f : 0.0f);
    ASSERT_NEAR(p_after, p_before, 1e-7) << "row 1, position " << changed - 1 << ", column " << j;
  }
  double diff = 0;
  for (int64_t i = changed * v; i < (changed + 1) * v; ++i)
    diff = std::max(diff, double(std::abs(after[t * v + i] - before[t * v + i])));
  EXPECT_GT(diff, 1e-3);
}

TEST(Lm, AccumulatedOncePerParameterInReverseOrder) {
  CpuDevice device;
  const LmConfig c = lm_preset("lm-tiny");
  auto m = make_lm(c, device, 0);
  auto tokens = random_tokens(2, c, 7);
  Batch batch;
  batch.tokens = tokens.data();
  batch.rows = 2;
  for (int step = 0; step < 2; ++step) {
    m->forward(batch);
    std::vector<size_t> calls;
    m->backward(1.0f, [&](size_t i) { calls.push_back(i); });
    const size_t n = m->params().size();
    ASSERT_EQ(calls.size(), n);
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(calls[i], n - 1 - i);
    EXPECT_EQ(m->params()[calls.front()].name, "lm_head.weight");
    EXPECT_EQ(m->params()[calls.back()].name, "token_embeddings.weight");
  }
  // Frozen parameters get no call and keep no gradient; the rest are unchanged.
  zero_grads(*m);
  m->forward(batch);
  m->backward(1.0f, [](size_t) {});
  const Vec q_grad = grad_of(m->params()[2]);
  m->params()[1].trainable = false;  // layers.0.ln1.weight
  m->params()[9].trainable = false;  // layers.0.ffn.w3.weight
  zero_grads(*m);
  m->forward(batch);
  std::vector<size_t> calls;
  m->backward(1.0f, [&](size_t i) { calls.push_back(i); });
  EXPECT_EQ(calls.size(), m->params().size() - 2);
  EXPECT_EQ(std::count(calls.begin(), calls.end(), 1), 0);
  EXPECT_EQ(std::count(calls.begin(), calls.end(), 9), 0);
  EXPECT_EQ(grad_of(m->params()[2]), q_grad);
}

TEST(Lm, BackwardScalesAndAccumulates) {
  CpuDevice device;
  const LmConfig c = lm_preset("lm-tiny");
  auto m = make_lm(c, device, 0);
  auto tokens = random_tokens(2, c, 8);
  Batch batch;
  batch.tokens = tokens.data();
  batch.rows = 2;
  zero_grads(*m);
  m->forward(batch);
  m->backward(1.0f, [](size_t) {});
  std::vector<Vec> once;
  for (const Parameter& p : m->params()) once.push_back(grad_of(p));
  // loss_scale 0.5 twice: the same sum.
  zero_grads(*m);
  for (int i = 0; i < 2; ++i) {
    m->forward(batch);
    m->backward(0.5f, [](size_t) {});
  }
  for (size_t i = 0; i < once.size(); ++i) {
    const Vec g = grad_of(m->params()[i]);
    for (size_t j = 0; j < g.size(); ++j)
      ASSERT_NEAR(g[j], once[i][j], 1e-6 * std::abs(once[i][j]) + 1e-9) << m->params()[i].name;
  }
}

TEST(Lm, NoAllocationAfterTheFirstStep) {
  CpuDevice device;
  const LmConfig c = lm_preset("lm-tiny");
  auto m = make_lm(c, device, 0);
  auto tokens = random_tokens(4, c, 9);
  Batch batch;
  batch.tokens = tokens.data();
  batch.rows = 4;
  m->forward(batch);
  m->backward(1.0f, [](size_t) {});
  MemoryTracker& mem = device.memory();
  const size_t acts = mem.current(MemCategory::Activations);
  EXPECT_GT(acts, 0u);
  mem.reset_peaks();
  for (int i = 0; i < 2; ++i) {
    m->forward(batch);
    m->backward(1.0f, [](size_t) {});
  }
  EXPECT_EQ(mem.current(MemCategory::Activations), acts);
  EXPECT_EQ(mem.peak(MemCategory::Activations), acts);
  // Another number of rows re-sizes once (smaller: less memory).
  batch.rows = 2;
  m->forward(batch);
  EXPECT_LT(mem.current(MemCategory::Activations), acts);
}

// ---- the mlp model ------------------------------------------------------------

TEST(Mlp, ParameterTableAndInit) {
  CpuDevice device;
  const MlpConfig c{64, 3, 10};
  auto m = make_mlp(c, device, 1);
  const auto& p = m->params();
  ASSERT_EQ(p.size(), 8u);
  const std::vector<std::string> names = {"layers.0.weight", "layers.0.bias", "layers.1.weight",
                                          "layers.1.bias",   "layers.2.weight", "layers.2.bias",
                                          "head.weight",     "head.bias"};
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(p[i].name, names[i]);
  EXPECT_EQ(p[0].shape, (Shape{64, 64}));
  EXPECT_EQ(p[1].shape, (Shape{64}));
  EXPECT_EQ(p[6].shape, (Shape{10, 64}));
  EXPECT_EQ(p[7].shape, (Shape{10}));
  // U(-1/sqrt(in), 1/sqrt(in)): bounded by 1/8 here, std 1/(8 sqrt 3).
  for (const Parameter& x : p) {
    auto [sd, mx] = stats(x);
    EXPECT_LE(mx, 0.125) << x.name;
    if (x.data.numel() > 1000) {
      EXPECT_NEAR(sd, 0.125 / std::sqrt(3.0), 0.005) << x.name;
    }
  }
  EXPECT_EQ(m->input_width(), 64);
  EXPECT_EQ(m->output_width(), 10);
  EXPECT_THROW(make_mlp(MlpConfig{0, 1, 2}, device, 0), Error);
}

TEST(Mlp, GradientsMatchFiniteDifferencesAndOrder) {
  CpuDevice device;
  const MlpConfig c{16, 3, 5};
  auto m = make_mlp(c, device, 2);
  std::mt19937 rng(3);
  const int64_t rows = 6;
  Vec x = randn(rows * c.width, rng);
  std::vector<int32_t> labels = {0, 4, 2, 2, 1, 3};
  Batch batch;
  batch.x = x.data();
  batch.labels = labels.data();
  batch.rows = rows;
  check_model_gradients(*m, batch, 1e-3f, 2e-2, 1e-4);
  m->forward(batch);
  std::vector<size_t> calls;
  m->backward(1.0f, [&](size_t i) { calls.push_back(i); });
  ASSERT_EQ(calls.size(), 8u);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(calls[i], 7 - i);
  labels[2] = 5;
  EXPECT_THROW(m->forward(batch), Error);
}

TEST(Mlp, DepthZeroIsLogisticRegression) {
  CpuDevice device;
  auto m = make_mlp(MlpConfig{8, 0, 3}, device, 4);
  std::mt19937 rng(5);
  Vec x = randn(4 * 8, rng);
  std::vector<int32_t> labels = {0, 1, 2, 1};
  Batch batch;
  batch.x = x.data();
  batch.labels = labels.data();
  batch.rows = 4;
  check_model_gradients(*m, batch, 1e-3f, 2e-2, 1e-4);
}

// ---- footprints: what `ddp plan` counts is what the models allocate -------

// The parameter table (names, sizes) and the activation bytes after
// construction and after a forward and backward of `rows` rows, against the
// device's own accounting.
void expect_footprint_matches(Model& m, const Footprint& f, CpuDevice& device, size_t setup_bytes,
                              const Batch& batch) {
  ASSERT_EQ(f.params.size(), m.params().size());
  for (size_t i = 0; i < f.params.size(); ++i) {
    EXPECT_EQ(f.params[i].name, m.params()[i].name);
    EXPECT_EQ(f.params[i].elements, int64_t(m.params()[i].data.numel())) << f.params[i].name;
    EXPECT_EQ(f.params[i].shape, m.params()[i].shape) << f.params[i].name;
  }
  EXPECT_EQ(int64_t(setup_bytes), f.setup_activation_bytes);
  m.forward(batch);
  m.backward(1.0f, [](size_t) {});
  EXPECT_EQ(int64_t(device.memory().peak(MemCategory::Activations)),
            f.setup_activation_bytes + f.step_activation_bytes);
}

TEST(Footprint, LmCountsWhatItAllocates) {
  for (const char* preset : {"lm-tiny", "lm-cpu"}) {
    for (int64_t rows : {1, 3}) {
      for (const ddp_dtype compute : {DDP_FLOAT32, DDP_BFLOAT16, DDP_FLOAT16}) {
        // The 16-bit layout: one size of one preset is enough (the sanitizers' run is slow).
        if (compute != DDP_FLOAT32 && (rows > 1 || std::string(preset) != "lm-tiny")) continue;
        SCOPED_TRACE(std::string(preset) + " rows " + std::to_string(rows) + " " + ddp_dtype_name(compute));
        CpuDevice device;
        const LmConfig c = lm_preset(preset);
        auto m = make_lm(c, device, 0);
        m->set_compute_dtype(compute);
        const size_t setup = device.memory().current(MemCategory::Activations);
        auto tokens = random_tokens(rows, c, 5);
        Batch batch;
        batch.tokens = tokens.data();
        batch.rows = rows;
        const Footprint f = lm_footprint(c, rows, DDP_DEVICE_CPU, compute);
        expect_footprint_matches(*m, f, device, setup, batch);
        EXPECT_EQ(f.d_model, c.d_model);
        EXPECT_FALSE(f.plan_only);
      }
    }
  }
}

// Under 16-bit compute what backward keeps takes 2 bytes an element: per
// block ln1 q k v att h ln2 y [N, D], p [rows, H, T, T], a b gate [N, F],
// and x0, lnf [N, D] (the RMS statistics stay float32); no float32 copy
// of them is made (backward's layers read them as kept).
TEST(Footprint, LmKeepsItsActivationsInTheComputeDtype) {
  for (const char* preset : {"lm-tiny", "lm-cpu", "large"}) {
    SCOPED_TRACE(preset);
    const LmConfig c = lm_preset(preset);
    const int64_t rows = 2, t = c.context_length, n = rows * t, d = c.d_model, f = c.d_ff;
    const int64_t p = rows * c.num_heads * t * t;
    const int64_t kept = c.num_layers * (8 * n * d + p + 3 * n * f) + 2 * n * d;
    const int64_t fp32 = lm_footprint(c, rows, DDP_DEVICE_CPU).step_activation_bytes;
    for (const ddp_dtype compute : {DDP_BFLOAT16, DDP_FLOAT16})
      EXPECT_EQ(fp32 - lm_footprint(c, rows, DDP_DEVICE_CPU, compute).step_activation_bytes, 2 * kept);
  }
  // lm large, 32 rows (the GPU check's batch): about half (the float32
  // logits, RMS statistics and backward's scratch keep it above).
  const LmConfig large = lm_preset("large");
  const double ratio = double(lm_footprint(large, 32, DDP_DEVICE_CPU, DDP_BFLOAT16).step_activation_bytes) /
                       double(lm_footprint(large, 32, DDP_DEVICE_CPU).step_activation_bytes);
  EXPECT_GT(ratio, 0.5);
  EXPECT_LT(ratio, 0.52);
}

// On a GPU in 16 bits attention is fused (kernels.h): p keeps each row's
// max and sum [rows, H, T, 2] in float32 instead of the weights, and the
// scratch is [rows, H, T].
TEST(Footprint, LmOnAGpuIn16BitsKeepsNoAttentionWeights) {
  for (const char* preset : {"lm-tiny", "large"}) {
    SCOPED_TRACE(preset);
    const LmConfig c = lm_preset(preset);
    const int64_t rows = 2, t = c.context_length, n = rows * t, h = c.num_heads;
    const int64_t weights = rows * h * t * t, stats = rows * h * t * 2;
    const int64_t cpu = lm_footprint(c, rows, DDP_DEVICE_CPU, DDP_BFLOAT16).step_activation_bytes;
    const int64_t gpu = lm_footprint(c, rows, DDP_DEVICE_CUDA, DDP_BFLOAT16).step_activation_bytes;
    EXPECT_EQ(gpu - cpu, 4 * 2 * n + c.num_layers * (4 * stats - 2 * weights) + 4 * (rows * h * t - t * t));
    EXPECT_EQ(lm_footprint(c, rows, DDP_DEVICE_CUDA, DDP_FLOAT16).step_activation_bytes, gpu);
  }
  // A head the fused kernels cannot hold is refused where they would run it.
  LmConfig wide = lm_preset("lm-tiny");
  wide.d_model = 1024;
  wide.num_heads = 2;  // head 512
  EXPECT_NO_THROW(lm_footprint(wide, 1, DDP_DEVICE_CPU, DDP_BFLOAT16));
  EXPECT_NO_THROW(lm_footprint(wide, 1, DDP_DEVICE_CUDA, DDP_FLOAT32));
  try {
    lm_footprint(wide, 1, DDP_DEVICE_CUDA, DDP_BFLOAT16);
    ADD_FAILURE() << "a head of 512 planned under the fused attention";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "lm: head size 512 (d_model 1024 / num_heads 2) is more than the 256 a GPU's fused attention takes "
                 "under 16-bit compute: use more heads, or precision.compute = \"fp32\"");
  }
  EXPECT_TRUE(attention_keeps_weights(DDP_DEVICE_CPU, DDP_BFLOAT16));
  EXPECT_TRUE(attention_keeps_weights(DDP_DEVICE_CUDA, DDP_FLOAT32));
  EXPECT_FALSE(attention_keeps_weights(DDP_DEVICE_CUDA, DDP_BFLOAT16));
  // lm large, 32 rows, on a GPU: the GPU check's run, well under half.
  const LmConfig large = lm_preset("large");
  const double ratio = double(lm_footprint(large, 32, DDP_DEVICE_CUDA, DDP_BFLOAT16).step_activation_bytes) /
                       double(lm_footprint(large, 32, DDP_DEVICE_CUDA).step_activation_bytes);
  std::printf("lm large, 32 rows, on a GPU: bf16 activations %.3f of fp32's\n", ratio);
  EXPECT_LT(ratio, 0.5);
}

TEST(Footprint, MlpCountsWhatItAllocates) {
  const int64_t rows = 5;
  // 16-bit compute: the hidden activations in 2 bytes, one float32 working copy.
  for (const ddp_dtype compute : {DDP_FLOAT32, DDP_BFLOAT16, DDP_FLOAT16}) {
    for (const MlpConfig c : {MlpConfig{64, 3, 10}, MlpConfig{16, 0, 4}}) {
      SCOPED_TRACE("depth " + std::to_string(c.depth) + " " + ddp_dtype_name(compute));
      CpuDevice device;
      auto m = make_mlp(c, device, 1);
      m->set_compute_dtype(compute);
      std::vector<float> x(size_t(rows * c.width), 0.5f);
      std::vector<int32_t> labels(size_t(rows), 1);
      Batch batch;
      batch.x = x.data();
      batch.labels = labels.data();
      batch.rows = rows;
      const Footprint f = mlp_footprint(c, rows, DDP_DEVICE_CPU, compute);
      expect_footprint_matches(*m, f, device, 0, batch);
      const int64_t kept = c.depth * rows * c.width;
      const int64_t work = c.depth ? rows * c.width : 0;
      if (compute != DDP_FLOAT32) {
        EXPECT_EQ(mlp_footprint(c, rows, DDP_DEVICE_CPU).step_activation_bytes - f.step_activation_bytes,
                  2 * kept - 4 * work);
      }
    }
  }
}

// On a GPU the models also keep device copies of the ids and labels.
TEST(Footprint, GpuCopiesOfTokensAndLabelsAndAttentionScratch) {
  const LmConfig c = lm_preset("lm-tiny");
  const int64_t rows = 2, n = rows * c.context_length, t = c.context_length;
  const int64_t cpu = lm_footprint(c, rows, DDP_DEVICE_CPU).step_activation_bytes;
  const int64_t gpu = lm_footprint(c, rows, DDP_DEVICE_CUDA).step_activation_bytes;
  EXPECT_EQ(gpu - cpu, 4 * (2 * n + rows * c.num_heads * t * t - t * t));
  const MlpConfig m{8, 1, 3};
  EXPECT_EQ(mlp_footprint(m, 4, DDP_DEVICE_CUDA).step_activation_bytes -
                mlp_footprint(m, 4, DDP_DEVICE_CPU).step_activation_bytes,
            4 * (4 * 8 + 4));
}

// CS336's communication_accounting XXL: FFN-only blocks, accounting only.
TEST(Footprint, XxlIsFfnOnlyAndCannotBeBuilt) {
  const LmConfig c = lm_preset("xxl");
  EXPECT_TRUE(c.ffn_only);
  EXPECT_EQ(lm_parameter_count(c), int64_t(126) * 2 * 16384 * 53248);  // 2.1985e11
  const Footprint f = lm_footprint(c, 1, DDP_DEVICE_CPU);
  EXPECT_TRUE(f.plan_only);
  ASSERT_EQ(f.params.size(), 252u);
  EXPECT_EQ(f.params[0].name, "layers.0.ffn.w1.weight");
  EXPECT_EQ(f.saved_elements_per_token, 126.0 * (16384 + 53248));
  CpuDevice device;
  ModelOptions o = default_model_options("lm");
  o.set("preset", std::string("xxl"));
  DataShape shape;
  try {
    build_model("lm", o, device, 0, &shape);
    FAIL() << "built xxl";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "lm preset 'xxl' is for accounting only (FFN-only blocks, CS336's communication_accounting): "
              "`ddp plan` takes it, a run cannot build it");
  }
}

}  // namespace
}  // namespace ddp
