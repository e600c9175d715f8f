// huge_pages.h — transparent huge pages for the engine's memory. Its
// buffers (weights, gradients, optimizer state, activations) are tens of MB
// streamed every step; on 4 KiB pages the per-step streaming passes and the
// GEMMs' packing run several % slower than on 2 MiB pages (docs/benchmarks.md).
// glibc's malloc asks the kernel for huge pages where GLIBC_TUNABLES holds
// glibc.malloc.hugetlb=1 (glibc 2.35+; older ones ignore it), read once, at
// process start. Off by default: a run of a few dozen steps pays more at the
// first touch of huge pages than its steps gain (docs/benchmarks.md). With
// DDP_HUGE_PAGES=1, `ddp` sets it at start for the processes it starts
// (ask_for_huge_pages), and a process that does the heavy work itself (a
// rank, a GEMM benchmark) but started without it starts itself again, once
// (restart_with_huge_pages). A GLIBC_TUNABLES that already names
// glibc.malloc.hugetlb is kept as it is. summary.json's "huge_pages" says
// what rank 0 got.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ddp {

// First thing in main: notes whether this process started with
// glibc.malloc.hugetlb, clears the mark of a restart (so that it reaches no
// child), and sets GLIBC_TUNABLES where with_huge_pages_tunable says so.
void ask_for_huge_pages();

// Where ask_for_huge_pages set the tunable but this process started without
// it: starts this program again (execv of /proc/self/exe with `argv`),
// marked so that it does not do so twice. Returns otherwise, and where it
// cannot restart (started through the dynamic loader by hand, under
// valgrind) or execv fails: the process goes on with small pages.
void restart_with_huge_pages(char** argv);

// The GLIBC_TUNABLES to set, given the current one (nullptr: unset) and
// DDP_HUGE_PAGES (nullptr: unset); nullopt where nothing is to change
// (DDP_HUGE_PAGES is not "1", the setting is there already, or the variable
// would outgrow what execve takes in one string, 128 KiB).
std::optional<std::string> with_huge_pages_tunable(const char* tunables, const char* ddp_huge_pages);

// The value glibc.malloc.hugetlb has in `tunables` (nullptr: unset), the
// last one where it is given twice; nullopt where it is absent.
std::optional<std::string> malloc_hugetlb_value(const char* tunables);

// The mode in /sys/kernel/mm/transparent_hugepage/enabled's text (the word
// in brackets: "always", "madvise", "never"), "" if there is none.
std::string thp_mode(const std::string& enabled_text);

// AnonHugePages of /proc/<pid>/smaps_rollup's text, in bytes (-1: absent).
int64_t anon_huge_bytes(const std::string& smaps_rollup_text);

// This process: the glibc.malloc.hugetlb it started with, which glibc read
// then ("" where unset; glibc before 2.35 ignores it), the kernel's THP
// mode ("unavailable" without /sys), its anonymous memory on huge pages now
// (-1 where the kernel does not say): the proof that they took.
struct HugePages {
  std::string malloc_hugetlb;
  std::string thp_mode;
  int64_t anon_huge_bytes = -1;
};
HugePages huge_pages_now();

}  // namespace ddp
