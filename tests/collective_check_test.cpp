// collective_check_test.cpp — run.debug_collectives' pure parts
// (engine/host/collective_check.h): how a collective is described, and the
// sentence naming the first rank whose next collective is another.
#include <gtest/gtest.h>

#include "collective_check.h"
#include "plugin_host.h"

namespace ddp {
namespace {

const std::vector<std::string> kNames = {"fc1.weight", "fc1.bias"};

TEST(CollectiveCheck, DescribesEachCollective) {
  EXPECT_EQ(describe({0, 1, 1024, 0, 0, 0}, kNames), "all_reduce (sum) of 1024 float32 (parameter 'fc1.weight')");
  EXPECT_EQ(describe({0, 1, 3, 1, 1, -1}, kNames), "all_reduce (avg) of 3 float64");
  EXPECT_EQ(describe({0, 2, 5, 2, 1, 1}, kNames), "broadcast from rank 1 of 5 int32 (parameter 'fc1.bias')");
  EXPECT_EQ(describe({0, 3, 4, 4, 8, -1}, kNames), "all_gather of 4 bfloat16 into 8");
  EXPECT_EQ(describe({0, 4, 8, 5, 0, -1}, kNames), "reduce_scatter (sum) of 8 float16");
  EXPECT_EQ(describe({0, 5, 0, 0, 0, -1}, kNames), "barrier");
  EXPECT_EQ(describe({0, kStepEnd, 0, 0, 6, -1}, kNames), "returned saying step 7 is not a sync point");
  // Out of range (a corrupt word) never indexes past a table.
  EXPECT_EQ(describe({0, 9, 2, 77, 0, 5}, kNames), "an unknown collective of 2 elements of an unknown type");
}

TEST(CollectiveCheck, WordsRoundTrip) {
  const CollectiveCall call{3, 4, 5, 1, 0, 2};
  int64_t words[kCallWords];
  to_words(call, words);
  const CollectiveCall back = from_words(words);
  EXPECT_EQ(back.seq, 3);
  EXPECT_EQ(back.op, 4);
  EXPECT_EQ(back.count, 5);
  EXPECT_EQ(back.dtype, 1);
  EXPECT_EQ(back.arg, 0);
  EXPECT_EQ(back.param, 2);
}

std::vector<int64_t> gathered(const std::vector<CollectiveCall>& calls) {
  std::vector<int64_t> all(calls.size() * kCallWords);
  for (size_t r = 0; r < calls.size(); ++r) to_words(calls[r], all.data() + r * kCallWords);
  return all;
}

TEST(CollectiveCheck, NamesTheFirstRankThatDisagrees) {
  const CollectiveCall a{6, 1, 250, 0, 1, 0};
  EXPECT_EQ(first_mismatch(gathered({a, a, a}), 3, kNames), "");
  CollectiveCall shorter = a, other = a;
  shorter.count = 249;
  other.param = 1;
  EXPECT_EQ(first_mismatch(gathered({a, other, shorter}), 3, kNames),
            "the ranks disagree on collective #7: rank 0 calls all_reduce (avg) of 250 float32 (parameter "
            "'fc1.weight'), rank 1 calls all_reduce (avg) of 250 float32 (parameter 'fc1.bias'): every rank must "
            "issue the same collectives in the same order");
  CollectiveCall ahead = a;
  ahead.seq = 7;
  ahead.op = 5;
  EXPECT_EQ(first_mismatch(gathered({a, ahead}), 2, kNames),
            "the ranks disagree on the next collective (rank 0's #7, rank 1's #8): rank 0 calls all_reduce (avg) "
            "of 250 float32 (parameter 'fc1.weight'), rank 1 calls barrier: every rank must issue the same "
            "collectives in the same order");
}

// Under a divergent strategy: each rank's return from on_step_end
// (kStepEnd), or the collective it issues in it while another has returned.
TEST(CollectiveCheck, StepEndNamesWhatEachRankDidAtTheEndOfTheStep) {
  const CollectiveCall synced{6, kStepEnd, 1, 0, 1, -1}, local{6, kStepEnd, 0, 0, 1, -1};
  const CollectiveCall average{6, 1, 250, 0, 1, 0};
  EXPECT_EQ(step_end_mismatch(gathered({synced, synced, synced}), 3, kNames, 1), "");
  EXPECT_EQ(step_end_mismatch(gathered({local, local}), 2, kNames, 1), "");
  CollectiveCall later = synced;  // a count of collectives is no answer: only what each said
  later.seq = 9;
  EXPECT_EQ(step_end_mismatch(gathered({synced, later}), 2, kNames, 1), "");
  EXPECT_EQ(step_end_mismatch(gathered({synced, synced, local}), 3, kNames, 1),
            "the ranks disagree on whether step 2 is a sync point: rank 0 says it is, rank 2 says it is not: every "
            "rank must answer on_step_end alike");
  EXPECT_EQ(step_end_mismatch(gathered({local, synced}), 2, kNames, 4),
            "the ranks disagree on whether step 5 is a sync point: rank 0 says it is not, rank 1 says it is: every "
            "rank must answer on_step_end alike");
  EXPECT_EQ(step_end_mismatch(gathered({average, local}), 2, kNames, 1),
            "the ranks disagree in on_step_end of step 2: rank 0 calls all_reduce (avg) of 250 float32 (parameter "
            "'fc1.weight'), rank 1 returned saying step 2 is not a sync point: every rank must answer on_step_end "
            "alike, with the same collectives");
  EXPECT_EQ(step_end_mismatch(gathered({local, local, average}), 3, kNames, 1),
            "the ranks disagree in on_step_end of step 2: rank 0 returned saying step 2 is not a sync point, rank 2 "
            "calls all_reduce (avg) of 250 float32 (parameter 'fc1.weight'): every rank must answer on_step_end "
            "alike, with the same collectives");
  CollectiveCall other = average;  // two collectives: as run.debug_collectives says them
  other.param = 1;
  EXPECT_EQ(step_end_mismatch(gathered({average, average, other}), 3, kNames, 1),
            "the ranks disagree on collective #7: rank 0 calls all_reduce (avg) of 250 float32 (parameter "
            "'fc1.weight'), rank 2 calls all_reduce (avg) of 250 float32 (parameter 'fc1.bias'): every rank must "
            "issue the same collectives in the same order");
}

}  // namespace
}  // namespace ddp

namespace ddp {
namespace {

// What each rank sends (and receives) per collective of S buffer bytes, as
// nccl-tests' bus bandwidth counts it: an all-gather's S is the gathered
// buffer, of which each rank sends (n-1)/n, not S.
TEST(BusBytes, AsNcclTestsCountThem) {
  EXPECT_EQ(bus_bytes("all_reduce", 1000, 2), 1000);
  EXPECT_EQ(bus_bytes("all_reduce", 1000, 4), 1500);
  EXPECT_EQ(bus_bytes("all_gather", 1000, 4), 750);
  EXPECT_EQ(bus_bytes("reduce_scatter", 1000, 4), 750);
  EXPECT_EQ(bus_bytes("broadcast", 1000, 4), 1000);
  EXPECT_EQ(bus_bytes("barrier", 0, 4), 0);
  EXPECT_EQ(bus_bytes("all_reduce", 1000, 1), 0);  // one rank sends nothing
  // ZeRO's reduce_scatter + all_gather moves what one all_reduce moves.
  EXPECT_EQ(bus_bytes("reduce_scatter", 1000, 4) + bus_bytes("all_gather", 1000, 4), bus_bytes("all_reduce", 1000, 4));
}

}  // namespace
}  // namespace ddp
