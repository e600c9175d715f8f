// huge_pages.h — transparent huge pages for the engine's memory. Its
// buffers (weights, gradients, optimizer state, activations) are tens of MB
// streamed every step; on 4 KiB pages the per-step streaming passes and the
// GEMMs' packing run several % slower than on 2 MiB pages (docs/benchmarks.md).
// glibc's malloc asks the kernel for huge pages where GLIBC_TUNABLES holds
// glibc.malloc.hugetlb=1 (glibc 2.35+; older ones ignore it), read once at
// process start: so `ddp` sets it and starts itself again, once, before
// anything else (with_huge_pages_tunable). A GLIBC_TUNABLES that already
// names glibc.malloc.hugetlb is kept as it is, and DDP_HUGE_PAGES=0 leaves
// the environment alone. Whether it took is in summary.json ("huge_pages").
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ddp {

// Where with_huge_pages_tunable says so: sets GLIBC_TUNABLES and starts
// this program again (execv of /proc/self/exe with `argv`), once (it marks
// the environment DDP_HUGE_PAGES_RESTARTED). Returns where nothing is to
// change, or where execv failed: the program goes on with small pages.
void restart_with_huge_pages(char** argv);

// The GLIBC_TUNABLES to start again with, given the current one (nullptr:
// unset) and DDP_HUGE_PAGES (nullptr: unset); nullopt where nothing is to
// change (the setting is there already, or DDP_HUGE_PAGES is "0").
std::optional<std::string> with_huge_pages_tunable(const char* tunables, const char* ddp_huge_pages);

// The value glibc.malloc.hugetlb has in `tunables` (nullptr: unset), the
// last one where it is given twice; nullopt where it is absent.
std::optional<std::string> malloc_hugetlb_value(const char* tunables);

// The mode in /sys/kernel/mm/transparent_hugepage/enabled's text (the word
// in brackets: "always", "madvise", "never"), "" if there is none.
std::string thp_mode(const std::string& enabled_text);

// AnonHugePages of /proc/<pid>/smaps_rollup's text, in bytes (-1: absent).
int64_t anon_huge_bytes(const std::string& smaps_rollup_text);

// This process now: its glibc.malloc.hugetlb, the kernel's THP mode
// ("unavailable" without /sys), its anonymous memory on huge pages (-1
// where the kernel does not say).
struct HugePages {
  std::string malloc_hugetlb, thp_mode;  // malloc_hugetlb "" where unset
  int64_t anon_huge_bytes = -1;
};
HugePages huge_pages_now();

}  // namespace ddp
