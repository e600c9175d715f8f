// schedule_test.cpp — the learning-rate schedule and the clipping factor
// (engine/train/schedule.h), pure, at the boundaries CS336's definition
// names. Whole runs against PyTorch are the conformance suite's
// (pytorch_cosine, pytorch_clip).
#include <gtest/gtest.h>

#include <cmath>

#include "schedule.h"

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

}  // namespace
}  // namespace ddp
