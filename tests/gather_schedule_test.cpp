// gather_schedule_test.cpp — ZeRO stage 3's order of parameter gathers
// and releases (strategies/common/gather_schedule.h) alone: the gather
// before each unit, prefetch within its bound, release after forward (or
// not), the last unit kept between its forward and backward, tied
// parameters, and the invariants over random models.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <stdexcept>
#include <vector>

#include "../strategies/common/gather_schedule.h"

namespace ddp {
namespace strategy {
namespace {

using V = std::vector<size_t>;

std::vector<ShardUnit> chain(size_t n) {
  std::vector<ShardUnit> units;
  for (size_t i = 0; i < n; ++i) units.push_back({{i}, {}});
  return units;
}

TEST(GatherSchedule, WithoutPrefetchEachUnitIsGatheredWhereItRunsAndReleasedAfter) {
  const GatherSchedule s = gather_schedule(chain(3), 0, true);
  ASSERT_EQ(s.begin.size(), 6u);  // forward 0 1 2, backward 2 1 0
  const std::vector<V> gather{{0}, {1}, {2}, {}, {1}, {0}};
  const std::vector<V> release{{0}, {1}, {}, {2}, {1}, {0}};  // the last unit: kept into its backward
  for (size_t p = 0; p < 6; ++p) {
    EXPECT_EQ(s.begin[p].gather, gather[p]) << p;
    EXPECT_EQ(s.begin[p].wait, gather[p]) << p;
    EXPECT_EQ(s.end[p].release, release[p]) << p;
  }
  EXPECT_EQ(s.gathers, 5u);  // two per unit, but the last unit's one
  EXPECT_EQ(s.peak_units, 1u);
}

TEST(GatherSchedule, PrefetchGathersTheNextUnitWhileThisOneComputes) {
  const GatherSchedule s = gather_schedule(chain(3), 1, true, {10, 20, 30});
  const std::vector<V> gather{{0, 1}, {2}, {1}, {}, {0}, {}};
  const std::vector<V> wait{{0}, {1}, {2}, {}, {1}, {0}};
  for (size_t p = 0; p < 6; ++p) {
    EXPECT_EQ(s.begin[p].gather, gather[p]) << p;
    EXPECT_EQ(s.begin[p].wait, wait[p]) << p;
  }
  EXPECT_EQ(s.gathers, 5u);
  EXPECT_EQ(s.peak_units, 2u);  // the one computing and the one in flight
  EXPECT_EQ(s.peak_elements, 50u);  // units 2 and 1, from forward 2's begin
}

TEST(GatherSchedule, PrefetchIsBoundedByTheUnitsInFlight) {
  const GatherSchedule s = gather_schedule(chain(5), 2, true);
  EXPECT_EQ(s.begin[0].gather, (V{0, 1, 2}));
  EXPECT_EQ(s.begin[1].gather, (V{3}));
  EXPECT_EQ(s.peak_units, 3u);
  // An absurd prefetch gathers what the micro-batch needs, once each.
  const GatherSchedule all = gather_schedule(chain(5), 1000, true);
  EXPECT_EQ(all.begin[0].gather, (V{0, 1, 2, 3, 4}));
  EXPECT_EQ(all.gathers, 9u);
}

TEST(GatherSchedule, WithoutReshardAfterForwardTheCopiesStayUntilBackward) {
  const GatherSchedule s = gather_schedule(chain(3), 0, false);
  for (size_t p = 0; p < 3; ++p) EXPECT_TRUE(s.end[p].release.empty()) << p;
  for (size_t p = 3; p < 6; ++p) EXPECT_TRUE(s.begin[p].gather.empty()) << p;
  EXPECT_EQ(s.gathers, 3u);
  EXPECT_EQ(s.peak_units, 3u);  // the whole model after forward
}

// The head reads the embedding's weight (toy_tied, lm): unit 0 is gathered
// with the head, kept from its forward into its backward, released after.
TEST(GatherSchedule, ATiedParameterGathersItsOwnersUnit) {
  const std::vector<ShardUnit> units{{{0}, {}}, {{1}, {}}, {{2}, {0}}};
  EXPECT_EQ(units_read(units), (std::vector<V>{{0}, {1}, {0, 2}}));
  const GatherSchedule s = gather_schedule(units, 0, true);
  const std::vector<V> gather{{0}, {1}, {0, 2}, {}, {1}, {0}};
  const std::vector<V> release{{0}, {1}, {}, {0, 2}, {1}, {0}};
  for (size_t p = 0; p < 6; ++p) {
    EXPECT_EQ(s.begin[p].gather, gather[p]) << p;
    EXPECT_EQ(s.end[p].release, release[p]) << p;
  }
}

TEST(GatherSchedule, RefusesAModelWithoutUnitsAndAnUnownedTiedParameter) {
  EXPECT_THROW(gather_schedule({}, 1, true), std::invalid_argument);
  EXPECT_THROW(gather_schedule({{{0}, {5}}}, 1, true), std::invalid_argument);
  EXPECT_THROW(gather_schedule(chain(2), 1, true, {1}), std::invalid_argument);
}

// Random models (chains with tied reads), prefetch 0..3, both reshard
// settings, replayed: a unit runs only with every unit it reads held; a
// gather is never issued for a unit held or in flight, and every gather
// is waited for before its unit runs; later units in flight never exceed
// prefetch; only held units are released; nothing is held at the end.
TEST(GatherSchedule, ReplayedOverRandomModelsItKeepsItsInvariants) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t n = 1 + rng() % 7;
    std::vector<ShardUnit> units = chain(n);
    for (size_t u = 0; u < n; ++u)
      if (rng() % 3 == 0) {
        const size_t owner = rng() % n;
        if (owner != u) units[u].tied.push_back(owner);  // unit `owner` owns parameter `owner`
      }
    const size_t prefetch = rng() % 4;
    const bool reshard = rng() % 2;
    const GatherSchedule s = gather_schedule(units, prefetch, reshard);
    std::set<size_t> held, in_flight;
    size_t gathers = 0;
    for (size_t p = 0; p < 2 * n; ++p) {
      for (size_t x : s.begin[p].gather) {
        ASSERT_FALSE(held.count(x) || in_flight.count(x)) << trial << " p" << p << " u" << x;
        in_flight.insert(x), ++gathers;
      }
      for (size_t x : s.begin[p].wait) {
        ASSERT_TRUE(in_flight.erase(x)) << trial;
        held.insert(x);
      }
      for (size_t x : s.needs[p]) ASSERT_TRUE(held.count(x)) << trial << " p" << p << " needs u" << x;
      size_t later = 0;
      for (size_t x : in_flight) later += !std::count(s.needs[p].begin(), s.needs[p].end(), x);
      EXPECT_LE(later, prefetch) << trial;
      for (size_t x : s.end[p].release) ASSERT_TRUE(held.erase(x)) << trial;
      if (!reshard && p < n) {
        EXPECT_TRUE(s.end[p].release.empty()) << trial;
      }
    }
    EXPECT_TRUE(held.empty() && in_flight.empty()) << trial;
    EXPECT_EQ(gathers, s.gathers) << trial;
    size_t uses = 0;  // at most a gather per unit read per position
    for (const auto& needs : s.needs) uses += needs.size();
    EXPECT_LE(s.gathers, uses) << trial;
  }
}

}  // namespace
}  // namespace strategy
}  // namespace ddp
