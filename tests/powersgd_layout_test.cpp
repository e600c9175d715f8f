// powersgd_layout_test.cpp — the pure part of the `powersgd` strategy
// (strategies/powersgd/layout.h): which gradients are matrices and at which
// rank, where each lies in the buffers, what a step sends, the state's
// names, and the initial Q drawn from the seed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "../strategies/powersgd/layout.h"

namespace ddp {
namespace powersgd {
namespace {

Tensor t(size_t index, const std::string& name, std::vector<int64_t> shape, bool trainable = true) {
  return Tensor{index, name, std::move(shape), trainable};
}

// toy: a frozen vector, fc1 [10, 10], fc2 [50, 10], a frozen bias, fc3 [5, 50].
std::vector<Tensor> toy() {
  return {t(0, "no_grad_fixed_param", {2}, false), t(1, "fc1.weight", {10, 10}), t(2, "fc2.fc.weight", {50, 10}),
          t(3, "fc2.fc.bias", {50}, false), t(4, "fc3.weight", {5, 50})};
}

TEST(PowerSgdLayout, MatricesInPackingOrderAtTheirClampedRank) {
  const Layout l = lay_out(toy(), 2);
  ASSERT_EQ(l.matrices.size(), 3u);
  EXPECT_TRUE(l.vectors.empty());  // both vectors are frozen
  // Packing order: reverse table order.
  EXPECT_EQ(l.matrices[0].param, 4u);
  EXPECT_EQ(l.matrices[1].param, 2u);
  EXPECT_EQ(l.matrices[2].param, 1u);
  EXPECT_EQ(l.matrices[0].rows, 5u);
  EXPECT_EQ(l.matrices[0].cols, 50u);
  EXPECT_EQ(l.p_elements, (5 + 50 + 10) * 2u);
  EXPECT_EQ(l.q_elements, (50 + 10 + 10) * 2u);
  EXPECT_EQ(l.error_elements, 250u + 500u + 100u);
  EXPECT_EQ(l.bytes_per_step(), 4u * ((5 + 50) * 2 + (50 + 10) * 2 + (10 + 10) * 2));
  EXPECT_EQ(l.dense_bytes(), 4u * 850);
  EXPECT_DOUBLE_EQ(l.compression_ratio(), 850.0 / 270.0);
}

TEST(PowerSgdLayout, RankIsClampedToTheSmallerSide) {
  const Layout l = lay_out(toy(), 1000);
  EXPECT_EQ(l.matrices[0].rank, 5u);   // fc3 [5, 50]
  EXPECT_EQ(l.matrices[1].rank, 10u);  // fc2 [50, 10]
  EXPECT_EQ(l.matrices[2].rank, 10u);  // fc1 [10, 10]
  EXPECT_EQ(clamp_rank(3, 7, 2), 2u);
  EXPECT_EQ(clamp_rank(3, 1, 9), 1u);
  EXPECT_EQ(clamp_rank(3, 8, 9), 3u);
}

TEST(PowerSgdLayout, AMatrixIsItsFirstDimensionByTheRest) {
  const Layout l = lay_out({t(0, "conv.weight", {8, 3, 5, 5}), t(1, "conv.bias", {8}), t(2, "scalar", {})}, 4);
  ASSERT_EQ(l.matrices.size(), 1u);
  EXPECT_EQ(l.matrices[0].rows, 8u);
  EXPECT_EQ(l.matrices[0].cols, 75u);
  EXPECT_EQ(l.matrices[0].rank, 4u);
  // 1-D and 0-D gradients are vectors, back to back in packing order.
  ASSERT_EQ(l.vectors.size(), 2u);
  EXPECT_EQ(l.vectors[0].param, 2u);
  EXPECT_EQ(l.vectors[0].numel, 1u);
  EXPECT_EQ(l.vectors[0].offset, 0u);
  EXPECT_EQ(l.vectors[1].param, 1u);
  EXPECT_EQ(l.vectors[1].offset, 1u);
  EXPECT_EQ(l.vector_elements, 9u);
  EXPECT_EQ(l.bytes_per_step(), 4u * ((8 + 75) * 4 + 9));
}

TEST(PowerSgdLayout, MatricesOfOneShapeAreAGroupBackToBack) {
  // Three layers of [6, 4] and their biases, a head [3, 4]: reverse order.
  std::vector<Tensor> p;
  for (size_t k = 0; k < 3; ++k) {
    p.push_back(t(2 * k, "layers." + std::to_string(k) + ".weight", {6, 4}));
    p.push_back(t(2 * k + 1, "layers." + std::to_string(k) + ".bias", {6}));
  }
  p.push_back(t(6, "head.weight", {3, 4}));
  const Layout l = lay_out(p, 2);
  ASSERT_EQ(l.groups.size(), 2u);
  EXPECT_EQ(l.groups[0].rows, 3u);  // the head comes first in packing order
  EXPECT_EQ(l.groups[0].count, 1u);
  const Group& layers = l.groups[1];
  EXPECT_EQ(layers.count, 3u);
  EXPECT_EQ(layers.first, 1u);
  for (size_t k = 0; k < 3; ++k) {
    const Matrix& m = l.matrices[layers.first + k];
    EXPECT_EQ(m.param, 4 - 2 * k);  // layers.2, .1, .0
    EXPECT_EQ(m.group, 1u);
    EXPECT_EQ(m.error_offset, layers.error_offset + k * 24);
    EXPECT_EQ(m.p_offset, layers.p_offset + k * 12);
    EXPECT_EQ(m.q_offset, layers.q_offset + k * 8);
  }
  EXPECT_EQ(layers.error_offset, 12u);
  EXPECT_EQ(l.scratch_elements, 3u);  // max(group count 3, rank - 1 = 1)
  EXPECT_EQ(l.vector_elements, 18u);
}

TEST(PowerSgdLayout, FrozenAndEmptyGradientsAreLeftOut) {
  const Layout l = lay_out({t(0, "a", {4, 4}, false), t(1, "b", {0, 4}), t(2, "c", {0})}, 2);
  EXPECT_TRUE(l.matrices.empty());
  EXPECT_TRUE(l.vectors.empty());
  EXPECT_EQ(l.bytes_per_step(), 0u);
  EXPECT_EQ(l.compression_ratio(), 0.0);
}

TEST(PowerSgdLayout, StateNamesKeepOnlyPlainCharacters) {
  EXPECT_EQ(state_name("layers.0.attn.w_q", ".error"), "layers.0.attn.w_q.error");
  EXPECT_EQ(state_name("blocks[3]/mlp-up", ".q"), "blocks_3__mlp_up.q");
}

TEST(PowerSgdLayout, InitialQIsStandardNormalAndTheSameForTheSameSeedAndName) {
  std::vector<float> a(20001), b(20001), c(20001), d(20001);
  initial_q(0, "fc1.weight", a.data(), a.size());
  initial_q(0, "fc1.weight", b.data(), b.size());
  initial_q(1, "fc1.weight", c.data(), c.size());
  initial_q(0, "fc2.weight", d.data(), d.size());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, d);
  double sum = 0, squares = 0;
  for (const float x : a) {
    ASSERT_TRUE(std::isfinite(x));
    sum += x, squares += double(x) * x;
  }
  const double mean = sum / a.size(), var = squares / a.size() - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.03);  // 4.2 standard errors at n = 20001
  EXPECT_NEAR(var, 1.0, 0.05);
  // A prefix is the same whatever the count (an odd count drops the last sine).
  std::vector<float> short_q(7);
  initial_q(0, "fc1.weight", short_q.data(), short_q.size());
  EXPECT_TRUE(std::equal(short_q.begin(), short_q.end(), a.begin()));
  std::set<float> distinct(a.begin(), a.end());
  EXPECT_GT(distinct.size(), 19990u);
  // Pinned: README.md documents the draw, and another would change every run's trajectory.
  EXPECT_EQ(a[0], -0x1.3935aep+0f);
  EXPECT_EQ(a[1], -0x1.3b9e6ap-1f);
  EXPECT_EQ(a[2], 0x1.a28b38p-3f);
  EXPECT_EQ(a[3], 0x1.347274p-1f);
}

TEST(PowerSgdLayout, SplitMixAndFnvAreTheReferenceFunctions) {
  uint64_t state = 0;
  EXPECT_EQ(splitmix64(state), 0xe220a8397b1dcdafull);  // SplitMix64's first output from seed 0
  EXPECT_EQ(fnv1a(""), 14695981039346656037ull);
  EXPECT_EQ(fnv1a("a"), 0xaf63dc4c8601ec8cull);
}

}  // namespace
}  // namespace powersgd
}  // namespace ddp
