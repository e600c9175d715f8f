// overhead_model_test.cpp — the pure overhead model of
// plugins/include/ddp/overhead_model.hpp on synthetic timings with known o and w.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include <ddp/overhead_model.hpp>

namespace ddp {
namespace strategy {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::vector<CommTiming> exact(double o, double w, const std::vector<double>& sizes) {
  std::vector<CommTiming> out;
  for (double b : sizes) out.push_back({b, o + b / w});
  return out;
}

TEST(OverheadFit, ExactTimingsGiveOAndWBack) {
  const double o = 250e-6, w = 1.3e9;  // 250 µs per call, 1.3 GB/s
  const OverheadFit fit = fit_overhead(exact(o, w, {1 * kMiB, 10 * kMiB, 100 * kMiB, 1024 * kMiB}));
  EXPECT_NEAR(fit.o_s, o, o * 1e-9);
  EXPECT_NEAR(fit.w_bytes_per_s, w, w * 1e-9);
}

TEST(OverheadFit, TwoSizesAreEnough) {
  const OverheadFit fit = fit_overhead(exact(1e-3, 5e8, {4096, 8 * kMiB}));
  EXPECT_NEAR(fit.o_s, 1e-3, 1e-12);
  EXPECT_NEAR(fit.w_bytes_per_s, 5e8, 1e-3);
}

// ±5 % multiplicative noise, 20 repetitions of 4 sizes: plain least squares
// would let the 1 GiB points' noise (tens of ms) swamp o (250 µs); the
// relative residuals keep o within 10 %.
TEST(OverheadFit, RelativeResidualsKeepOUnderNoiseOfLargeSizes) {
  const double o = 250e-6, w = 1.3e9;
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> noise(0.95, 1.05);
  std::vector<CommTiming> t;
  for (int rep = 0; rep < 20; ++rep)
    for (double b : {1 * kMiB, 10 * kMiB, 100 * kMiB, 1024 * kMiB}) t.push_back({b, (o + b / w) * noise(rng)});
  const OverheadFit fit = fit_overhead(t);
  EXPECT_NEAR(fit.o_s, o, 0.1 * o);
  EXPECT_NEAR(fit.w_bytes_per_s, w, 0.05 * w);
}

TEST(OverheadFit, TimesThatDoNotGrowWithSizeMeanUnboundedBandwidth) {
  const OverheadFit fit = fit_overhead({{1000, 1e-4}, {2000, 1e-4}, {3000, 0.99e-4}});
  EXPECT_TRUE(std::isinf(fit.w_bytes_per_s));
  EXPECT_NEAR(fit.o_s, 1e-4, 1e-6);
}

TEST(OverheadFit, RefusesOneSizeOrBadTimes) {
  EXPECT_THROW(fit_overhead({}), std::invalid_argument);
  EXPECT_THROW(fit_overhead({{1000, 1e-3}, {1000, 2e-3}}), std::invalid_argument);
  EXPECT_THROW(fit_overhead({{1000, 1e-3}, {2000, 0}}), std::invalid_argument);
  EXPECT_THROW(fit_overhead({{1000, 1e-3}, {2000, NAN}}), std::invalid_argument);
  EXPECT_THROW(fit_overhead({{1000, 1e-3}, {2000, INFINITY}}), std::invalid_argument);
}

TEST(OverheadModel, PredictionIsCallsTimesOPlusLastBucket) {
  const OverheadFit fit{1e-3, 1e9};
  // 100 MB in 10 buckets: 10 × 1 ms + 10 MB / 1 GB/s = 20 ms
  EXPECT_NEAR(predicted_overhead_s(fit, 100e6, 10), 0.020, 1e-12);
  // one bucket: o + s / w, the whole all-reduce after backward
  EXPECT_NEAR(predicted_overhead_s(fit, 100e6, 1), 0.101, 1e-12);
}

TEST(OverheadModel, OptimumIsSqrtSWOAndMinimisesThePrediction) {
  const OverheadFit fit{1e-3, 1e9};
  const double s = 100e6;
  // n_b* = sqrt(1e8 / (1e9 · 1e-3)) = 10 (shown above: 20 ms); b* = sqrt(s w o) = 10 MB
  EXPECT_NEAR(optimal_bucket_count(fit, s), 10.0, 1e-9);
  EXPECT_NEAR(optimal_bucket_bytes(fit, s), 10e6, 1e-3);
  EXPECT_NEAR(predicted_overhead_s(fit, s, 10), 2 * std::sqrt(s * fit.o_s / fit.w_bytes_per_s), 1e-12);
  for (double n : {1.0, 5.0, 9.0, 11.0, 20.0, 100.0}) EXPECT_GT(predicted_overhead_s(fit, s, n), 0.020) << n;
}

TEST(OverheadModel, OptimumStaysBetweenOneBucketAndFreeCalls) {
  // A small model on a slow call: one bucket, never fewer.
  EXPECT_EQ(optimal_bucket_count({1e-3, 1e9}, 1000), 1.0);
  EXPECT_EQ(optimal_bucket_bytes({1e-3, 1e9}, 1000), 1000);
  // Unbounded bandwidth: one bucket.
  EXPECT_EQ(optimal_bucket_count({1e-3, INFINITY}, 1e8), 1.0);
  // No per-call cost: as many buckets as there are parameters.
  EXPECT_TRUE(std::isinf(optimal_bucket_count({0, 1e9}, 1e8)));
  EXPECT_EQ(optimal_bucket_bytes({-1e-5, 1e9}, 1e8), 0);
}

TEST(OverheadModel, AutoProbesThreeSizesAFactorEightApart) {
  const size_t mib = 1 << 20;
  // lm-cpu's 37 MB of gradients: the model's size and two smaller ones
  EXPECT_EQ(auto_probe_sizes(37000000), (std::vector<size_t>{578124, 4625000, 37000000}));
  // toy's 3.4 kB: still three distinct sizes, from 4 MiB down
  EXPECT_EQ(auto_probe_sizes(3400), (std::vector<size_t>{64 * 1024, 512 * 1024, 4 * mib}));
  // 10 GB: capped at 64 MiB
  EXPECT_EQ(auto_probe_sizes(size_t(10) << 30), (std::vector<size_t>{mib, 8 * mib, 64 * mib}));
  for (size_t s : {size_t(1), size_t(1001), size_t(37000003), size_t(1) << 40})
    for (size_t b : auto_probe_sizes(s)) EXPECT_EQ(b % 4, 0u) << s;
}

}  // namespace
}  // namespace strategy
}  // namespace ddp
