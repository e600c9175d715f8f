// huge_pages_test.cpp — the pure parts of engine/core/huge_pages.h: the
// GLIBC_TUNABLES `ddp` starts again with, and what it reads back from the
// kernel's files.
#include "huge_pages.h"

#include <gtest/gtest.h>

namespace ddp {
namespace {

TEST(HugePagesTunable, OffUnlessAskedFor) {
  EXPECT_EQ(with_huge_pages_tunable(nullptr, nullptr), std::nullopt);
  EXPECT_EQ(with_huge_pages_tunable("glibc.malloc.arena_max=2", nullptr), std::nullopt);
  EXPECT_EQ(with_huge_pages_tunable(nullptr, "0"), std::nullopt);
  EXPECT_EQ(with_huge_pages_tunable(nullptr, ""), std::nullopt);
  EXPECT_EQ(with_huge_pages_tunable(nullptr, "yes"), std::nullopt);
}

TEST(HugePagesTunable, AddedWhereAskedForKeepingTheOtherTunables) {
  EXPECT_EQ(with_huge_pages_tunable(nullptr, "1"), "glibc.malloc.hugetlb=1");
  EXPECT_EQ(with_huge_pages_tunable("", "1"), "glibc.malloc.hugetlb=1");
  EXPECT_EQ(with_huge_pages_tunable("glibc.malloc.arena_max=2", "1"),
            "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1");
  EXPECT_EQ(with_huge_pages_tunable("glibc.malloc.hugetlbx=3", "1"),
            "glibc.malloc.hugetlbx=3:glibc.malloc.hugetlb=1");
}

TEST(HugePagesTunable, AUsersSettingIsKept) {
  EXPECT_EQ(with_huge_pages_tunable("glibc.malloc.hugetlb=0", "1"), std::nullopt);
  EXPECT_EQ(with_huge_pages_tunable("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2", "1"), std::nullopt);
}

TEST(HugePagesTunable, NotWhereTheVariableWouldOutgrowWhatExecveTakes) {
  // Linux takes at most 128 KiB in one string of the environment, its NUL
  // included: "GLIBC_TUNABLES=" + the value + NUL.
  const std::string suffix = ":glibc.malloc.hugetlb=1";
  const std::string fits(131072 - 15 - 1 - suffix.size(), 'x');
  EXPECT_EQ(with_huge_pages_tunable(fits.c_str(), "1"), fits + suffix);
  const std::string too_long = fits + "x";
  EXPECT_EQ(with_huge_pages_tunable(too_long.c_str(), "1"), std::nullopt);
}

TEST(HugePagesTunable, TheValueIsTheLastOneGiven) {
  EXPECT_EQ(malloc_hugetlb_value(nullptr), std::nullopt);
  EXPECT_EQ(malloc_hugetlb_value("glibc.malloc.arena_max=2"), std::nullopt);
  EXPECT_EQ(malloc_hugetlb_value("glibc.malloc.hugetlb=1"), "1");
  EXPECT_EQ(malloc_hugetlb_value("glibc.malloc.hugetlb=1:glibc.malloc.hugetlb=0"), "0");
}

TEST(HugePagesKernel, TheModeIsTheBracketedWord) {
  EXPECT_EQ(thp_mode("always [madvise] never\n"), "madvise");
  EXPECT_EQ(thp_mode("[always] madvise never\n"), "always");
  EXPECT_EQ(thp_mode(""), "");
  EXPECT_EQ(thp_mode("always madvise never"), "");
}

TEST(HugePagesKernel, AnonHugePagesInBytes) {
  const std::string rollup =
      "55d0c0000000-7ffd00000000 ---p 00000000 00:00 0    [rollup]\n"
      "Rss:              524288 kB\n"
      "AnonHugePages:    307200 kB\n"
      "ShmemPmdMapped:        0 kB\n";
  EXPECT_EQ(anon_huge_bytes(rollup), int64_t(307200) * 1024);
  EXPECT_EQ(anon_huge_bytes("Rss: 4 kB\n"), -1);
  EXPECT_EQ(anon_huge_bytes("AnonHugePages: lots\n"), -1);
}

}  // namespace
}  // namespace ddp
