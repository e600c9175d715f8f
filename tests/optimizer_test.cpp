// optimizer_test.cpp — the engine's optimizer on element ranges
// (engine/train/optimizer.h): a parameter stepped in pieces gets the bits
// it gets whole, its state lives with each range and never moves (a step
// that overlaps a range's state otherwise is refused naming the
// parameter), and a resumed state is taken up slice by slice.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "device.h"
#include "optimizer.h"

namespace ddp {
namespace {

struct Fixture {
  CpuDevice device;
  std::vector<Parameter> params;
  std::vector<float> grad;

  Fixture() {
    Parameter p;
    p.name = "w";
    p.shape = {10};
    p.data = Tensor(device, p.shape, MemCategory::Parameters);
    p.grad = Tensor(device, p.shape, MemCategory::Gradients);
    for (size_t i = 0; i < 10; ++i) p.data.data()[i] = 0.1f * float(i) - 0.3f, p.grad.data()[i] = 0.05f * float(i + 1);
    params.push_back(std::move(p));
  }
  std::vector<float> weights() const { return params[0].data.to_host(); }
};

OptimizerConfig config(const std::string& name) {
  OptimizerConfig c;
  c.name = name;
  c.lr = 0.1;
  c.momentum = name == "sgd" ? 0.9 : 0.0;
  c.weight_decay = 0.01;
  return c;
}

TEST(OptimizerRanges, APieceWiseStepGivesTheWholeStepsBits) {
  for (const char* name : {"sgd", "adamw"}) {
    Fixture whole, pieces;
    Optimizer a(config(name), whole.device, whole.params), b(config(name), pieces.device, pieces.params);
    const float* g = pieces.params[0].grad.data();
    const StepRange halves[] = {{0, 0, 3, g, nullptr}, {0, 3, 7, g + 3, nullptr}};
    for (int step = 0; step < 3; ++step) {
      a.step(whole.params, std::vector<size_t>{0});
      b.step_ranges(pieces.params, halves, 2);
    }
    EXPECT_EQ(whole.weights(), pieces.weights()) << name;
    const std::vector<SavedState> saved = b.saved(0);
    ASSERT_EQ(saved.size(), 2u) << name;
    EXPECT_EQ(saved[1].offset, 3u);
    EXPECT_EQ(saved[1].count, 7u);
    EXPECT_FALSE(b.whole_state(0, 10));
    EXPECT_TRUE(a.whole_state(0, 10));
  }
}

// State never moves: a range that overlaps another's state, or the whole
// parameter where its state is in pieces, is refused naming the parameter.
TEST(OptimizerRanges, StateNeverMovesBetweenRanges) {
  Fixture f;
  Optimizer o(config("adamw"), f.device, f.params);
  const float* g = f.params[0].grad.data();
  const StepRange first{0, 0, 4, g, nullptr}, overlapping{0, 2, 4, g + 2, nullptr};
  o.step_ranges(f.params, &first, 1);
  try {
    o.step_ranges(f.params, &overlapping, 1);
    FAIL() << "an overlapping range was stepped";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "optimizer: the state of 'w' elements [0, 4) lives on this rank, and a step asks for "
                           "[2, 6): optimizer state never moves between ranges (or ranks)");
  }
  EXPECT_THROW(o.step(f.params, std::vector<size_t>{0}), Error);
  const StepRange outside{0, 8, 4, g, nullptr};
  try {
    o.step_ranges(f.params, &outside, 1);
    FAIL() << "a range outside the parameter was stepped";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "optimizer: elements [8, 12) are outside parameter 'w' of 10");
  }
}

// A resumed parameter's state is taken up by each range as its slice, asked
// for as the range first steps: the same bits as if never interrupted.
TEST(OptimizerRanges, AResumedStateIsTakenUpSliceBySlice) {
  Fixture before, after;
  Optimizer a(config("adamw"), before.device, before.params);
  a.step(before.params, std::vector<size_t>{0});
  std::memcpy(after.params[0].data.data(), before.params[0].data.data(), 10 * sizeof(float));
  Optimizer b(config("adamw"), after.device, after.params);
  const SavedState whole = a.saved(0).front();
  std::vector<std::pair<size_t, size_t>> asked;
  b.restore_on_first_step([&](size_t param, size_t offset, size_t count, SavedState& out) {
    if (param != 0) return false;
    asked.emplace_back(offset, count);
    out = SavedState{whole.steps, {whole.first.begin() + long(offset), whole.first.begin() + long(offset + count)},
                     {whole.second.begin() + long(offset), whole.second.begin() + long(offset + count)}, offset, count};
    return true;
  });
  a.step(before.params, std::vector<size_t>{0});
  const float* g = after.params[0].grad.data();
  const StepRange halves[] = {{0, 0, 5, g, nullptr}, {0, 5, 5, g + 5, nullptr}};
  b.step_ranges(after.params, halves, 2);
  EXPECT_EQ(before.weights(), after.weights());
  EXPECT_EQ(b.state_steps(0), 2);
  EXPECT_EQ(asked, (std::vector<std::pair<size_t, size_t>>{{0, 5}, {5, 5}}));
}

}  // namespace
}  // namespace ddp
