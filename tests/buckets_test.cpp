// buckets_test.cpp — the pure bucket assignment of strategies/common/buckets.h.
#include <gtest/gtest.h>

#include "../strategies/common/buckets.h"
#include "../strategies/common/compress.h"

namespace ddp {
namespace strategy {
namespace {

std::vector<std::vector<size_t>> layout(const std::vector<Bucket>& buckets) {
  std::vector<std::vector<size_t>> out;
  for (const auto& b : buckets) out.push_back(b.params);
  return out;
}

TEST(AssignBuckets, ReverseOrderPackedUpToTheCap) {
  // sizes 40, 40, 40, 40 bytes; cap 100 → [3, 2] [1, 0]
  std::vector<ParamInfo> p = {{0, 40, true}, {1, 40, true}, {2, 40, true}, {3, 40, true}};
  auto b = assign_buckets(p, 100);
  EXPECT_EQ(layout(b), (std::vector<std::vector<size_t>>{{3, 2}, {1, 0}}));
  EXPECT_EQ(b[0].bytes, 80u);
  EXPECT_EQ(b[1].bytes, 80u);
}

TEST(AssignBuckets, ExactlyAtTheCapStaysInOneBucket) {
  std::vector<ParamInfo> p = {{0, 50, true}, {1, 50, true}};
  EXPECT_EQ(layout(assign_buckets(p, 100)), (std::vector<std::vector<size_t>>{{1, 0}}));
}

TEST(AssignBuckets, ParameterLargerThanTheCapGetsItsOwnBucket) {
  std::vector<ParamInfo> p = {{0, 10, true}, {1, 500, true}, {2, 10, true}, {3, 10, true}};
  auto b = assign_buckets(p, 100);
  EXPECT_EQ(layout(b), (std::vector<std::vector<size_t>>{{3, 2}, {1}, {0}}));
  EXPECT_EQ(b[1].bytes, 500u);
}

TEST(AssignBuckets, FrozenParametersAreSkipped) {
  std::vector<ParamInfo> p = {{0, 8, false}, {1, 400, true}, {2, 2000, true}, {3, 200, false}, {4, 1000, true}};
  EXPECT_EQ(layout(assign_buckets(p, 2400)), (std::vector<std::vector<size_t>>{{4}, {2, 1}}));
}

TEST(AssignBuckets, TinyCapGivesOneBucketPerParameter) {
  std::vector<ParamInfo> p = {{0, 4, true}, {1, 4, true}, {2, 4, true}};
  EXPECT_EQ(layout(assign_buckets(p, 1)), (std::vector<std::vector<size_t>>{{2}, {1}, {0}}));
}

TEST(AssignBuckets, HugeCapGivesOneBucket) {
  std::vector<ParamInfo> p = {{0, 4, true}, {1, 4, true}, {2, 4, true}};
  auto b = assign_buckets(p, size_t(25) << 20);
  EXPECT_EQ(layout(b), (std::vector<std::vector<size_t>>{{2, 1, 0}}));
  EXPECT_EQ(b[0].bytes, 12u);
}

TEST(AssignBuckets, NothingTrainableGivesNoBuckets) {
  EXPECT_TRUE(assign_buckets({{0, 4, false}}, 100).empty());
  EXPECT_TRUE(assign_buckets({}, 100).empty());
}

}  // namespace
}  // namespace strategy
}  // namespace ddp

// ------------------------------------------------------- compress (compress.h)

namespace ddp::strategy {
namespace {

TEST(Compress, ValuesOfTheKey) {
  EXPECT_EQ(compress_dtype("none"), DDP_FLOAT32);
  EXPECT_EQ(compress_dtype("bf16"), DDP_BFLOAT16);
  EXPECT_EQ(compress_dtype("fp16"), DDP_FLOAT16);
  EXPECT_EQ(compress_dtype("BF16"), std::nullopt);
  EXPECT_EQ(compress_dtype("int8"), std::nullopt);
}

TEST(Compress, RefusedWhereTheTransportOrHostCannot) {
  const uint64_t f32 = DDP_DTYPE_BIT(DDP_FLOAT32) | DDP_DTYPE_BIT(DDP_INT64);
  const uint64_t all = f32 | DDP_DTYPE_BIT(DDP_BFLOAT16) | DDP_DTYPE_BIT(DDP_FLOAT16);
  EXPECT_EQ(compress_refusal(DDP_FLOAT32, "old", DDP_DTYPE_BIT(DDP_FLOAT32), false), "");
  EXPECT_EQ(compress_refusal(DDP_BFLOAT16, "gloo", all, true), "");
  EXPECT_EQ(compress_refusal(DDP_BFLOAT16, "old", f32, true),
            "strategy.compress = \"bf16\": transport 'old' does not take bfloat16 (it takes float32, int64)");
  EXPECT_EQ(compress_refusal(DDP_FLOAT16, "gloo", all, false),
            "strategy.compress = \"fp16\": this engine has no host->convert (it needs ABI 1.3 or newer)");
}

}  // namespace
}  // namespace ddp::strategy
