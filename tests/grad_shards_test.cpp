// grad_shards_test.cpp — ZeRO stage 2's layout (strategies/common/
// grad_shards.h) alone: buckets of whole units in backward order, a chunk
// per rank and the element ranges each rank owns, the ring of buckets in
// flight, tied weights, and a layout kept stable when parameters unfreeze.
#include <gtest/gtest.h>

#include <random>
#include <stdexcept>
#include <vector>

#include "../strategies/common/grad_shards.h"

namespace ddp {
namespace strategy {
namespace {

// One parameter per unit, of these sizes, all trainable.
std::vector<ShardUnit> one_each(size_t n) {
  std::vector<ShardUnit> units;
  for (size_t i = 0; i < n; ++i) units.push_back({{i}, {}});
  return units;
}
std::vector<ShardParam> sized(const std::vector<size_t>& sizes) {
  std::vector<ShardParam> params;
  for (size_t s : sizes) params.push_back({s, true});
  return params;
}

TEST(GradShards, BucketsOfWholeUnitsInBackwardOrderWithinTheCap) {
  // a 10, b 20, c 30; cap 35: c alone, then b and a.
  const ShardLayout l = shard_layout(one_each(3), sized({10, 20, 30}), 2, 35, 16);
  ASSERT_EQ(l.buckets.size(), 2u);
  EXPECT_EQ(l.buckets[0].params, (std::vector<size_t>{2}));
  EXPECT_EQ(l.buckets[1].params, (std::vector<size_t>{1, 0}));
  EXPECT_EQ(l.buckets[1].slots, (std::vector<size_t>{0, 20}));
  // 30 elements on 2 ranks: chunks of 15, rounded up to 16 floats.
  EXPECT_EQ(l.buckets[0].chunk, 16u);
  EXPECT_EQ(l.buckets[0].padded(), 32u);
  EXPECT_EQ(l.shard_elements, 32u);
  EXPECT_EQ(l.buckets[1].shard, 16u);
  // A unit larger than the cap is a bucket of its own.
  EXPECT_EQ(shard_layout(one_each(3), sized({10, 20, 30}), 2, 5, 16).buckets.size(), 3u);
}

TEST(GradShards, EachRankOwnsItsChunkOfEveryBucketAsElementRanges) {
  const std::vector<ShardParam> params = sized({10, 20, 30});
  const ShardLayout l = shard_layout(one_each(3), params, 2, 35, 16);
  const auto r0 = owned_ranges(l, params, 0), r1 = owned_ranges(l, params, 1);
  ASSERT_EQ(r0.size(), 2u);
  EXPECT_EQ((std::vector<size_t>{r0[0].param, r0[0].offset, r0[0].count, r0[0].shard}), (std::vector<size_t>{2, 0, 16, 0}));
  EXPECT_EQ((std::vector<size_t>{r0[1].param, r0[1].offset, r0[1].count, r0[1].shard}), (std::vector<size_t>{1, 0, 16, 16}));
  // Rank 1: the rest of c, the end of b, all of a (a range may start inside a parameter).
  ASSERT_EQ(r1.size(), 3u);
  EXPECT_EQ((std::vector<size_t>{r1[0].param, r1[0].offset, r1[0].count, r1[0].shard}), (std::vector<size_t>{2, 16, 14, 0}));
  EXPECT_EQ((std::vector<size_t>{r1[1].param, r1[1].offset, r1[1].count, r1[1].shard}), (std::vector<size_t>{1, 16, 4, 16}));
  EXPECT_EQ((std::vector<size_t>{r1[2].param, r1[2].offset, r1[2].count, r1[2].shard}), (std::vector<size_t>{0, 0, 10, 20}));
}

// Random sizes, units and worlds: every element is owned by exactly one
// rank, in the chunk its shard position says, and a rank's owned elements
// differ from another's by less than N x align per bucket.
TEST(GradShards, EveryElementHasExactlyOneOwner) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t n_params = 1 + rng() % 12, world = 1 + rng() % 6, cap = 1 + rng() % 300;
    std::vector<ShardParam> params;
    for (size_t i = 0; i < n_params; ++i) params.push_back({1 + rng() % 100, rng() % 5 != 0});
    std::vector<ShardUnit> units(1);
    for (size_t i = 0; i < n_params; ++i) {
      if (i > 0 && rng() % 2 == 0) units.emplace_back();
      units.back().params.push_back(i);
    }
    const ShardLayout l = shard_layout(units, params, world, cap, 16);
    std::vector<std::vector<int>> owned(n_params);
    for (size_t i = 0; i < n_params; ++i) owned[i].assign(params[i].elements, 0);
    std::vector<size_t> per_rank(world, 0);
    for (size_t r = 0; r < world; ++r)
      for (const OwnedRange& o : owned_ranges(l, params, r)) {
        ASSERT_TRUE(params[o.param].trainable);
        ASSERT_LE(o.offset + o.count, params[o.param].elements);
        ASSERT_LE(o.shard + o.count, l.shard_elements);
        for (size_t e = o.offset; e < o.offset + o.count; ++e) ++owned[o.param][e];
        per_rank[r] += o.count;
      }
    for (size_t i = 0; i < n_params; ++i)
      for (int count : owned[i]) ASSERT_EQ(count, params[i].trainable ? 1 : 0) << "trial " << trial;
    const auto [lo, hi] = std::minmax_element(per_rank.begin(), per_rank.end());
    EXPECT_LT(*hi - *lo, world * 16 * std::max<size_t>(l.buckets.size(), 1)) << "trial " << trial;
  }
}

TEST(GradShards, TheRingHoldsTheLargerOfTheCapAndTheLargestBucket) {
  // A bucket per unit (cap 8): c 32, b 32, a 16 padded; one at a time, in the
  // largest's memory; each shares the others' (and its own, of the micro-batch before).
  const ShardLayout l = shard_layout(one_each(3), sized({10, 20, 30}), 2, 8, 16);
  ASSERT_EQ(l.buckets.size(), 3u);
  EXPECT_EQ(l.ring_elements, 32u);
  for (const ShardBucket& b : l.buckets) EXPECT_EQ(b.ring, 0u);
  for (const ShardBucket& a : l.buckets)
    for (const ShardBucket& b : l.buckets) EXPECT_TRUE(share_memory(a, b));
  // A cap above one bucket lets one fill while the one before is reduce-scattered.
  const ShardLayout two = shard_layout(one_each(3), sized({30, 30, 30}), 2, 40, 16);
  ASSERT_EQ(two.buckets.size(), 3u);
  EXPECT_EQ(two.ring_elements, 64u);
  EXPECT_EQ(two.buckets[0].ring, 0u);
  EXPECT_EQ(two.buckets[1].ring, 32u);
  EXPECT_EQ(two.buckets[2].ring, 0u);
  EXPECT_FALSE(share_memory(two.buckets[0], two.buckets[1]));
  EXPECT_TRUE(share_memory(two.buckets[0], two.buckets[2]));
  // Never more than all buckets together.
  EXPECT_EQ(shard_layout(one_each(3), sized({10, 20, 30}), 2, 1 << 20, 16).ring_elements, 64u);
  EXPECT_EQ(l.opens_at[0], (std::vector<size_t>{0}));  // backward position 0: the last unit
  EXPECT_EQ(l.closes_at[2], (std::vector<size_t>{2}));
}

// A tied weight (unit 2 reads unit 1's): its bucket opens at unit 2's
// backward and closes at unit 1's; a bucket open meanwhile never shares
// its memory.
TEST(GradShards, ATiedWeightKeepsItsBucketOpenAcrossTheUnitsThatReadIt) {
  const std::vector<ShardUnit> units = {{{0}, {}}, {{1}, {}}, {{2}, {1}}, {{3}, {}}};
  const ShardLayout l = shard_layout(units, sized({16, 16, 16, 16}), 2, 1, 16);
  ASSERT_EQ(l.buckets.size(), 4u);  // [3], [2], [1], [0]
  const ShardBucket &of_2 = l.buckets[1], &of_1 = l.buckets[2];
  EXPECT_EQ(of_1.params, (std::vector<size_t>{1}));
  EXPECT_EQ(of_1.open, 1u);  // unit 2's backward (position 1) writes it first
  EXPECT_EQ(of_1.close, 2u);
  EXPECT_TRUE(of_1.ring >= of_2.ring + of_2.padded() || of_2.ring >= of_1.ring + of_1.padded())
      << "two buckets open at once share memory";
  EXPECT_EQ(l.ring_elements, 64u);  // grown past the cap: two buckets are open at once
}

TEST(GradShards, UnfreezingKeepsTheBucketsAndAddsNewOnes) {
  std::vector<ShardParam> params = sized({10, 20, 30});
  params[1].trainable = false;
  const ShardLayout before = shard_layout(one_each(3), params, 2, 100, 16);
  ASSERT_EQ(before.buckets.size(), 1u);
  EXPECT_EQ(before.buckets[0].params, (std::vector<size_t>{2, 0}));
  params[1].trainable = true;
  const std::vector<std::vector<size_t>> kept = {before.buckets[0].params};
  const ShardLayout after = shard_layout(one_each(3), params, 2, 100, 16, &kept);
  ASSERT_EQ(after.buckets.size(), 2u);
  EXPECT_EQ(after.buckets[0].params, before.buckets[0].params);
  EXPECT_EQ(after.buckets[0].chunk, before.buckets[0].chunk);
  EXPECT_EQ(after.buckets[1].params, (std::vector<size_t>{1}));
  // Rank 0's old ranges are where they were.
  const auto old_ranges = owned_ranges(before, params, 0), new_ranges = owned_ranges(after, params, 0);
  for (size_t k = 0; k < old_ranges.size(); ++k) {
    EXPECT_EQ(new_ranges[k].param, old_ranges[k].param);
    EXPECT_EQ(new_ranges[k].offset, old_ranges[k].offset);
    EXPECT_EQ(new_ranges[k].count, old_ranges[k].count);
  }
}

TEST(GradShards, AModelWithoutUnitsIsRefused) {
  EXPECT_THROW(shard_layout({}, sized({10}), 2, 100, 16), std::invalid_argument);
  EXPECT_THROW(shard_layout(one_each(1), sized({10}), 0, 100, 16), std::invalid_argument);
}

}  // namespace
}  // namespace strategy
}  // namespace ddp
