// schedule_test.cpp — the learning-rate schedule and the clipping factor
// (engine/train/schedule.h), pure, at the boundaries CS336's definition
// names. Whole runs against PyTorch are the conformance suite's
// (pytorch_cosine, pytorch_clip).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "schedule.h"
#include "update_rules.h"

namespace ddp {
namespace {

TEST(Schedule, ConstantIsTheOptimizersLr) {
  EXPECT_EQ(scheduled_lr(LrScheduleConfig{}, 0.1, 0), 0.1);
  EXPECT_EQ(scheduled_lr(LrScheduleConfig{}, 0.1, 1000), 0.1);
}

TEST(Schedule, CosineWarmsUpDecaysAndHolds) {
  LrScheduleConfig s;
  s.kind = "cosine";
  s.warmup_steps = 4;
  s.cosine_steps = 12;
  s.min_lr = 0.1;
  EXPECT_EQ(scheduled_lr(s, 1.0, 0), 0.0);
  EXPECT_EQ(scheduled_lr(s, 1.0, 2), 0.5);
  EXPECT_EQ(scheduled_lr(s, 1.0, 4), 1.0);                           // the top, at T_w
  EXPECT_NEAR(scheduled_lr(s, 1.0, 8), 0.1 + 0.5 * 0.9, 1e-15);      // half-way: cos(pi/2) = 0
  EXPECT_NEAR(scheduled_lr(s, 1.0, 12), 0.1, 1e-15);                 // T_c: min_lr
  EXPECT_EQ(scheduled_lr(s, 1.0, 13), 0.1);                          // after: min_lr
  s.warmup_steps = 0;
  EXPECT_EQ(scheduled_lr(s, 1.0, 0), 1.0);
}

TEST(Schedule, ClipCoefficientIsPyTorchsClamped) {
  EXPECT_EQ(clip_coefficient(0.5, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(clip_coefficient(4.0, 1.0), 1.0 / (4.0 + 1e-6));
  EXPECT_EQ(clip_coefficient(0.0, 1.0), 1.0);
}

// sum_of_squares: exact where every partial sum is (1² + ... + n²), 0 for
// nothing, and the fixed lanes of update_rules.h bit for bit, which here
// differ from adding the squares one after another.
TEST(Schedule, SumOfSquaresIsExactAndInFixedLanes) {
  EXPECT_EQ(sum_of_squares(nullptr, 0), 0.0);
  for (size_t n : {1u, 15u, 16u, 17u, 1000u, 4099u}) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = float(i + 1);
    EXPECT_EQ(sum_of_squares(x.data(), n), double(n) * double(n + 1) * double(2 * n + 1) / 6) << n;
  }
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<float> x(1003);
  for (float& v : x) v = std::ldexp(mantissa(gen), exponent(gen)) * (gen() % 2 ? 1.0f : -1.0f);
  double lane[kSquareLanes] = {}, sequential = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    lane[i % kSquareLanes] += double(x[i]) * double(x[i]);
    sequential += double(x[i]) * double(x[i]);
  }
  double want = 0;
  for (double l : lane) want += l;
  EXPECT_EQ(sum_of_squares(x.data(), x.size()), want);
  EXPECT_NE(want, sequential);  // the lanes are what the test pins down
}

// held_ranges' promises (1.9), checked: one rank's spans never repeat an
// element; over the ranks each trainable parameter is held once, counting
// each span once per its replicas.
TEST(HeldRanges, OverlapsAndCoverage) {
  const std::vector<std::string> names = {"a", "b"};
  auto span = [](size_t param, size_t offset, size_t count, int replicas) {
    GradSpan s;
    s.param = param, s.offset = offset, s.count = count, s.replicas = replicas;
    return s;
  };
  EXPECT_EQ(overlapping_spans({span(0, 0, 10, 1), span(0, 10, 5, 1), span(1, 0, 10, 1)}, names), "");
  EXPECT_EQ(overlapping_spans({span(1, 0, 10, 1), span(0, 4, 6, 1), span(0, 0, 5, 1)}, names),
            "two ranges hold elements [4, 5) of parameter 'a'");
  EXPECT_EQ(overlapping_spans({span(0, 0, 10, 1), span(0, 3, 0, 1)}, names), "");  // an empty span holds nothing
  // HSDP on 4 ranks, shard groups of 2: each rank holds half of `a`, held by 2 replicas.
  std::vector<double> every;
  for (int r = 0; r < 4; ++r) {
    const std::vector<double> mine = held_once({span(0, size_t(r % 2) * 5, 5, 2)}, 2);
    every.insert(every.end(), mine.begin(), mine.end());
  }
  EXPECT_EQ(coverage_problem(every, 4, {10, 7}, {true, false}, names), "");
  EXPECT_EQ(coverage_problem(every, 4, {10, 7}, {true, true}, names),
            "the ranks hold the averaged gradient of parameter 'b' 0 times over, counting each range once per its "
            "replicas, not once: its ranges miss or repeat elements, or name the wrong number of replicas");
  every[0] *= 2;  // rank 0 says it alone holds its half
  EXPECT_NE(coverage_problem(every, 4, {10, 7}, {true, false}, names).find("'a' 1.25 times over"), std::string::npos);
}

}  // namespace
}  // namespace ddp
