// fit_check.h — whether a CPU run fits this host, checked before any rank
// starts (run.check_memory, docs/running.md "The fit check"): the plan's
// peak per rank (config_plan.h), summed over the ranks this host runs,
// against what the host can give: MemAvailable, or its cgroup's limit less
// its usage where that is lower. A run that cannot fit is refused with what
// it needs, what is available, and the largest world size that fits, if
// any does; otherwise the kernel would find out, killing a rank mid-run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config.h"
#include "run_plan.h"

namespace ddp {

struct HostMemory {
  int64_t bytes = -1;  // -1: unknown (no /proc/meminfo)
  std::string source;  // "MemAvailable" | "the cgroup's limit less its usage"
  // The limit every rank's process inherits (the tighter of RLIMIT_AS and
  // RLIMIT_DATA; -1: none), per rank, not summed: what a rank's process
  // holds of it before the run's own memory (`rank_baseline`: libraries,
  // thread stacks, allocator arenas, BLAS buffers) plus its peak must fit.
  int64_t rank_limit = -1;
  int64_t rank_baseline = 0;
  std::string rank_limit_source{};  // "RLIMIT_AS (ulimit -v)" | "RLIMIT_DATA (ulimit -d)"
  // The memory each rank's process holds beyond its plan (its own heap,
  // thread stacks and BLAS buffers as it touches them), counted once per
  // rank in the sum: what bounds how many ranks this host runs.
  int64_t rank_resident = 0;
};

// From /proc/meminfo's text and a cgroup's memory limit and usage (cgroup
// v2's memory.max and memory.current, or v1's limit_in_bytes and
// usage_in_bytes; "" where absent; "max" or a limit of 2^62 or more: none).
// Pure.
HostMemory host_memory_from(const std::string& meminfo, const std::string& cgroup_limit,
                            const std::string& cgroup_usage);
// `host` with what a rank's process takes: the soft RLIMIT_AS and
// RLIMIT_DATA (RLIM_INFINITY: none), a process's /proc/self/status text
// (its VmSize counts toward RLIMIT_AS, its VmData toward RLIMIT_DATA, its
// RssAnon is memory of its own), and what a rank maps beyond that process
// (`extra.as`, `extra.data`) and holds (`extra.resident`). The limit kept
// is the one leaving a rank the least room. Pure.
struct RankExtra {
  int64_t as = 0;
  int64_t data = 0;
  int64_t resident = 0;
};
HostMemory with_rank_limit(HostMemory host, uint64_t rlimit_as, uint64_t rlimit_data, const std::string& status,
                           const RankExtra& extra);
// What a rank's process maps and holds beyond the launcher's, before its
// run's memory: its threads' stacks and allocator arenas (72 MB a thread),
// OpenBLAS's buffers, the plugins and their threads. Measured (VmPeak,
// VmData and RssAnon of /proc/<pid>/status while training, less the plan's
// peak and the launcher's own) on toy (4 ranks) and mlp width 4096 (2
// ranks), run.threads = 1, gloo: 303 and 306 MB of address space, 167 and
// 172 MB of data, 1 and 10 MB resident; each further BLAS thread
// (run.threads) adds its 72 MB, not counted here.
inline constexpr RankExtra kRankExtra{310000000, 175000000, 10000000};
// This host's, read now (with this process's limits).
HostMemory host_memory();

// The most a rank holds at any of the plan's three moments. Pure.
int64_t peak_bytes(const plan::RankMemory& m);

// "" where the ranks' `peaks` sum within `host`; else what they need and
// what is available: "needs 33.4 GB (16.7 GB × 2 ranks), 24.4 GB available
// (MemAvailable)"; or, where the largest peak does not fit a process's
// limit, "needs 1.2 GB a rank (...), more than RLIMIT_AS (ulimit -v) allows
// a process (1.0 GB)". Pure.
std::string fit_shortfall(const std::vector<int64_t>& peaks, const HostMemory& host);
// "" where `world` ranks on this host fit `host` with their processes'
// own memory alone (HostMemory::rank_resident); else why not: "4096 ranks
// do not fit this host's memory: the run needs 45.1 GB (11.0 MB × 4096
// ranks), 24.6 GB available (MemAvailable)". Pure.
std::string world_shortfall(int64_t world, const HostMemory& host);
// The same for a number given as text (CLI11's validator of bench-comm's
// --world: "" for what is not a number, which the range check refuses),
// on this host's memory, read now.
std::string world_fits_this_host(std::string& world);

// fit_shortfall's part for the per-process limit: "" where the largest
// peak plus the baseline fits (or there is no limit). Pure.
std::string rank_limit_shortfall(const std::vector<int64_t>& peaks, const HostMemory& host);

// The check for a config whose ranks all run on this host: first that its
// run.world_size processes fit (world_shortfall, whatever the model); then
// "" where it fits
// (or the host's memory is unknown, the run is not on the CPU, or its model
// has no footprint to plan); else the
// refusal, naming the largest smaller run.world_size that fits (of the 8
// largest that divide the batch), or saying that none does. Throws what config_plan.h throws.
std::string fit_refusal(const Config& c, const HostMemory& host);

}  // namespace ddp
