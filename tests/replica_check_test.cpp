// replica_check_test.cpp — the replica check's pure parts
// (engine/train/replica_check.h): a digest that any flipped bit changes and
// that sees every non-finite value, and the sentence naming the first
// parameter on which the ranks differ.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "replica_check.h"

namespace ddp {
namespace {

std::vector<float> ramp(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.25f * float(i) - 3.0f;
  return v;
}

// Every bit of every element, in the four-lane body and in the tails (an
// odd count leaves a last float32 outside the 64-bit words).
TEST(ReplicaDigest, AnyFlippedBitChangesIt) {
  for (size_t n : {1u, 2u, 7u, 8u, 9u, 17u}) {
    std::vector<float> v = ramp(n);
    const Digest base = digest(v.data(), n);
    EXPECT_EQ(digest(v.data(), n).bits, base.bits);
    EXPECT_TRUE(base.finite);
    for (size_t i = 0; i < n; ++i)
      for (int b = 0; b < 32; ++b) {
        std::vector<float> w = v;
        uint32_t u;
        std::memcpy(&u, &w[i], 4);
        u ^= 1u << b;
        std::memcpy(&w[i], &u, 4);
        EXPECT_NE(digest(w.data(), n).bits, base.bits) << "n " << n << " element " << i << " bit " << b;
      }
  }
}

TEST(ReplicaDigest, SwappedValuesAndLengthChangeIt) {
  std::vector<float> v = ramp(16);
  const uint64_t base = digest(v.data(), 16).bits;
  std::swap(v[3], v[12]);
  EXPECT_NE(digest(v.data(), 16).bits, base);
  const std::vector<float> zeros(3, 0.0f);
  EXPECT_NE(digest(zeros.data(), 2).bits, digest(zeros.data(), 3).bits);
  EXPECT_NE(digest(zeros.data(), 0).bits, digest(zeros.data(), 1).bits);
  // -0 and +0 compare equal but are other bits: replicas must be bit-equal.
  const float plus = 0.0f, minus = -0.0f;
  EXPECT_NE(digest(&plus, 1).bits, digest(&minus, 1).bits);
}

TEST(ReplicaDigest, SeesEveryNonFiniteValue) {
  const float bad[] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                       std::numeric_limits<float>::quiet_NaN()};
  for (size_t n : {1u, 2u, 9u, 10u})
    for (size_t i = 0; i < n; ++i)
      for (float b : bad) {
        std::vector<float> v = ramp(n);
        v[i] = b;
        EXPECT_FALSE(digest(v.data(), n).finite) << "n " << n << " at " << i << " value " << b;
      }
  std::vector<float> big(9, std::numeric_limits<float>::max());
  big[4] = std::numeric_limits<float>::denorm_min();
  EXPECT_TRUE(digest(big.data(), big.size()).finite);
}

TEST(ReplicaDivergence, NamesTheFirstParameterAndTheRanks) {
  const std::vector<std::string> names = {"fc1.weight", "fc1.bias", "fc2.weight"};
  // 3 ranks × 3 parameters, rank-major.
  std::vector<int64_t> all = {7, 8, 9, 7, 8, 9, 7, 8, 9};
  EXPECT_EQ(first_divergence(names, all, 3, 4), "");
  all[3 + 2] = 1;  // rank 1, fc2.weight
  all[6 + 1] = 1;  // rank 2, fc1.bias: the first parameter that differs
  EXPECT_EQ(first_divergence(names, all, 3, 4),
            "the replicas differ after step 5: parameter 'fc1.bias' of rank 2 differs from rank 0's (a strategy "
            "that reduced the wrong buffers or skipped one, or a transport whose results are not the same on every "
            "rank; run.debug_collectives = true compares every collective across ranks)");
  all[3 + 1] = 2;
  EXPECT_EQ(first_divergence(names, all, 3, -1),
            "the replicas differ at the end of the run: parameter 'fc1.bias' of ranks 1, 2 differs from rank 0's (a "
            "strategy that reduced the wrong buffers or skipped one, or a transport whose results are not the same "
            "on every rank; run.debug_collectives = true compares every collective across ranks)");
  EXPECT_EQ(first_divergence(names, {7, 8, 9}, 1, 0), "");
}

TEST(NonFiniteLoss, NamesTheFirstParameterNotFiniteOrSaysWhyNoneWasSearched) {
  const std::vector<std::string> names = {"fc1.weight", "fc1.bias"};
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<std::vector<float>> values = {{1.0f, 2.0f}, {0.5f, inf}};
  EXPECT_EQ(non_finite_loss(std::nan(""), names, &values),
            "the loss is nan; the first parameter that is not finite is 'fc1.bias' (element 1 is inf) "
            "(run.check_finite = false lets the run go on)");
  values[1][1] = 3.0f;
  EXPECT_EQ(non_finite_loss(double(inf), names, &values),
            "the loss is inf; every parameter is finite: the data or the forward pass made it (run.check_finite = "
            "false lets the run go on)");
  EXPECT_EQ(non_finite_loss(std::nan(""), names, nullptr),
            "the loss is nan; the strategy holds the parameters' values, so they were not searched "
            "(run.check_finite = false lets the run go on)");
}

}  // namespace
}  // namespace ddp
