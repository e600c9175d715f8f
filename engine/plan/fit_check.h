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
};

// From /proc/meminfo's text and a cgroup's memory limit and usage (cgroup
// v2's memory.max and memory.current, or v1's limit_in_bytes and
// usage_in_bytes; "" where absent; "max" or a limit of 2^62 or more: none).
// Pure.
HostMemory host_memory_from(const std::string& meminfo, const std::string& cgroup_limit,
                            const std::string& cgroup_usage);
// This host's, read now.
HostMemory host_memory();

// The most a rank holds at any of the plan's three moments. Pure.
int64_t peak_bytes(const plan::RankMemory& m);

// "" where the ranks' `peaks` sum within `host`; else what they need and
// what is available: "needs 33.4 GB (16.7 GB × 2 ranks), 24.4 GB available
// (MemAvailable)". Pure.
std::string fit_shortfall(const std::vector<int64_t>& peaks, const HostMemory& host);

// The check for a config whose ranks all run on this host: "" where it fits
// (or the host's memory is unknown, the run is not on the CPU, or its model
// has no footprint to plan); else the
// refusal, naming the largest smaller run.world_size that fits (of the 8
// largest that divide the batch), or saying that none does. Throws what config_plan.h throws.
std::string fit_refusal(const Config& c, const HostMemory& host);

}  // namespace ddp
