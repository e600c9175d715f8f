// partition_test.cpp — the pure shard partition of strategies/common/partition.h.
#include <gtest/gtest.h>

#include "../strategies/common/partition.h"

namespace ddp {
namespace strategy {
namespace {

std::vector<ParamInfo> sized(const std::vector<size_t>& bytes) {
  std::vector<ParamInfo> p;
  for (size_t i = 0; i < bytes.size(); ++i) p.push_back({i, bytes[i], true});
  return p;
}

TEST(PartitionParams, LargestFirstToTheLeastLoadedRank) {
  // sizes 10 40 30 20 50 → order 50(4) 40(1) 30(2) 20(3) 10(0)
  // 50→r0 [50,0]; 40→r1 [50,40]; 30→r1 [50,70]; 20→r0 [70,70]; 10→r0 (tie → lower) [80,70]
  auto p = sized({10, 40, 30, 20, 50});
  auto owners = partition_params(p, 2);
  EXPECT_EQ(owners, (std::vector<int>{0, 1, 1, 0, 0}));
  EXPECT_EQ(shard_bytes(p, owners, 2), (std::vector<size_t>{80, 70}));
  ASSERT_TRUE(largest_to_smallest(shard_bytes(p, owners, 2)).has_value());
  EXPECT_DOUBLE_EQ(*largest_to_smallest(shard_bytes(p, owners, 2)), 80.0 / 70.0);
}

TEST(PartitionParams, EqualSizesTieToLowerIndexThenLowerRank) {
  // all 8 bytes: index 0→r0, 1→r1, 2→r2, 3→r0, 4→r1
  auto p = sized({8, 8, 8, 8, 8});
  EXPECT_EQ(partition_params(p, 3), (std::vector<int>{0, 1, 2, 0, 1}));
}

TEST(PartitionParams, BalancedOnKnownSizesWithinTheGreedyBound) {
  // The toy model's trainable parameters (float32): fc1 100, fc2 500, fc3 250.
  std::vector<ParamInfo> toy = {{0, 8, false}, {1, 400, true}, {2, 2000, true}, {3, 200, false}, {4, 1000, true}};
  auto owners = partition_params(toy, 2);
  EXPECT_EQ(owners, (std::vector<int>{kNoOwner, 1, 0, kNoOwner, 1}));
  EXPECT_EQ(shard_bytes(toy, owners, 2), (std::vector<size_t>{2000, 1400}));
  // Many parameters: the largest shard stays within total / N + largest.
  std::vector<size_t> sizes;
  size_t total = 0, largest = 0;
  for (size_t i = 0; i < 97; ++i) {
    sizes.push_back(4 * ((i * 7919) % 613 + 1));
    total += sizes.back();
    largest = std::max(largest, sizes.back());
  }
  for (int world : {1, 2, 3, 4, 8}) {
    auto p = sized(sizes);
    auto shards = shard_bytes(p, partition_params(p, world), world);
    size_t sum = 0;
    for (size_t b : shards) sum += b;
    EXPECT_EQ(sum, total) << world;
    EXPECT_LE(*std::max_element(shards.begin(), shards.end()), total / world + largest) << world;
    ASSERT_TRUE(largest_to_smallest(shards).has_value()) << world;
    EXPECT_LT(*largest_to_smallest(shards), 1.1) << world;  // many small items balance well
  }
}

TEST(PartitionParams, DeterministicAndIndependentOfCallOrder) {
  auto p = sized({12, 4, 12, 4, 100, 7, 7, 7, 64});
  auto a = partition_params(p, 4);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(partition_params(p, 4), a);
  // The tie rule is by parameter index, not by position in the list.
  auto reversed = p;
  std::reverse(reversed.begin(), reversed.end());
  auto b = partition_params(reversed, 4);
  for (size_t k = 0; k < p.size(); ++k) EXPECT_EQ(b[p.size() - 1 - k], a[k]) << k;
}

TEST(PartitionParams, FrozenParametersAreSkipped) {
  std::vector<ParamInfo> p = {{0, 1000, false}, {1, 10, true}, {2, 10, true}, {3, 500, false}};
  auto owners = partition_params(p, 2);
  EXPECT_EQ(owners, (std::vector<int>{kNoOwner, 0, 1, kNoOwner}));
  EXPECT_EQ(shard_bytes(p, owners, 2), (std::vector<size_t>{10, 10}));
}

TEST(PartitionParams, MoreRanksThanParametersLeavesEmptyShards) {
  auto p = sized({40, 20});
  auto owners = partition_params(p, 4);
  EXPECT_EQ(owners, (std::vector<int>{0, 1}));
  EXPECT_EQ(shard_bytes(p, owners, 4), (std::vector<size_t>{40, 20, 0, 0}));
  EXPECT_FALSE(largest_to_smallest(shard_bytes(p, owners, 4)).has_value());
  // Nothing trainable: every shard empty.
  std::vector<ParamInfo> frozen = {{0, 4, false}};
  EXPECT_EQ(partition_params(frozen, 3), (std::vector<int>{kNoOwner}));
  EXPECT_EQ(shard_bytes(frozen, partition_params(frozen, 3), 3), (std::vector<size_t>{0, 0, 0}));
  EXPECT_FALSE(largest_to_smallest({0, 0, 0}).has_value());
  EXPECT_TRUE(partition_params({}, 2).empty());
}

TEST(PartitionParams, WorldOfOneOwnsEverything) {
  auto p = sized({3, 1, 2});
  EXPECT_EQ(partition_params(p, 1), (std::vector<int>{0, 0, 0}));
  EXPECT_DOUBLE_EQ(*largest_to_smallest(shard_bytes(p, partition_params(p, 1), 1)), 1.0);
}

TEST(PartitionParams, StableRepartitionKeepsOwnersAndAssignsOnlyNewOnes) {
  // Before: 0 (100), 1 (60), 2 (50) trainable; 3 (80) and 4 (30) frozen.
  std::vector<ParamInfo> p = {{0, 100, true}, {1, 60, true}, {2, 50, true}, {3, 80, false}, {4, 30, false}};
  auto before = partition_params(p, 2);
  EXPECT_EQ(before, (std::vector<int>{0, 1, 1, kNoOwner, kNoOwner}));  // loads [100, 110]
  // Unfreeze 3 and 4: kept owners unchanged; 80 → r0 (100 < 110) [180,110]; 30 → r1 [180,140].
  p[3].trainable = p[4].trainable = true;
  auto after = partition_params(p, 2, &before);
  EXPECT_EQ(after, (std::vector<int>{0, 1, 1, 0, 1}));
  for (size_t k = 0; k < 3; ++k) EXPECT_EQ(after[k], before[k]) << k;
  // A fresh partition would have moved parameters (their state would be lost).
  EXPECT_NE(partition_params(p, 2), after);
  // Re-partitioning with nothing new changes nothing.
  EXPECT_EQ(partition_params(p, 2, &after), after);
  // A parameter frozen again loses its owner; the others keep theirs.
  p[1].trainable = false;
  EXPECT_EQ(partition_params(p, 2, &after), (std::vector<int>{0, kNoOwner, 1, 0, 1}));
}

TEST(PartitionParams, StableRepartitionFillsTheLeastLoadedRanks) {
  // Rank 1 and 2 start empty (more ranks than parameters); new ones go there first.
  std::vector<ParamInfo> p = {{0, 100, true}, {1, 10, false}, {2, 20, false}, {3, 5, false}};
  auto before = partition_params(p, 3);
  EXPECT_EQ(before, (std::vector<int>{0, kNoOwner, kNoOwner, kNoOwner}));
  for (auto& q : p) q.trainable = true;
  // 20 → r1, 10 → r2, 5 → r2 (loads [100, 20, 10] → r2)
  EXPECT_EQ(partition_params(p, 3, &before), (std::vector<int>{0, 2, 1, 2}));
}

TEST(PartitionParams, BadArgumentsThrow) {
  auto p = sized({4, 4});
  EXPECT_THROW(partition_params(p, 0), std::invalid_argument);
  std::vector<int> wrong_size = {0};
  EXPECT_THROW(partition_params(p, 2, &wrong_size), std::invalid_argument);
  std::vector<int> bad_rank = {5, kNoOwner};
  EXPECT_THROW(partition_params(p, 2, &bad_rank), std::invalid_argument);
  EXPECT_THROW(shard_bytes(p, {0, 7}, 2), std::invalid_argument);
}

}  // namespace
}  // namespace strategy
}  // namespace ddp
