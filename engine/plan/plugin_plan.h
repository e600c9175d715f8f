// plugin_plan.h — what the plugins of a run say they will send and hold,
// rank by rank, through their `plan` entries (ABI 1.4, ddp/abi/plan.h):
// each is called with a host made for planning (the rank and world, its
// own TOML table, the parameter table and the units of the model's
// footprint; nothing that reaches a device) and a ddp_plan that records
// what it reports. Nothing here knows a strategy or a transport by name.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ddp/plugin.h>

#include "model.h"
#include "plugin_section.h"

namespace ddp {
namespace plan {

// Bytes per memory category, in ddp_mem_category order.
using Bytes = std::array<int64_t, DDP_MEM_CATEGORY_COUNT>;

// One collective of a step on one rank: its name as summary.json and the
// transport count it ("all_reduce", ...), its bytes as comm_bytes counts
// them (the buffer; all_gather: what it receives), and whether it is
// issued while the rank still computes (on a CPU it shares the cores).
struct Collective {
  std::string op;
  int64_t bytes = 0;
  bool beside_compute = false;
  int64_t every = 1;  // once every this many steps (a divergent strategy's sync points, 1.8)
  int group = 0;      // the size of the group it runs in (ddp_plan::group_collective, 1.9); 0: the world
  // The ranks it runs among at a world of `world`.
  int ranks(int world) const { return group > 0 ? group : world; }
};

// What one plugin said of one rank.
struct PluginPart {
  std::string label;                                        // "strategy plugin 'naive'"
  bool planned = false;                                     // it has a plan entry (else the rest is empty)
  std::vector<ddp_plan_collective> collectives;             // a strategy's, in the order they start
  std::vector<int64_t> every;                               // per collective: its period in steps (1.8; 1: every step)
  std::vector<int> groups;                                  // per collective: its group's size (1.9; 0: the world)
  Bytes setup{};                                            // its buffers held from the end of set-up on
  Bytes step{};                                             // its buffers held from the first step on
  bool says_steps = false;                                  // it named what its optimizer steps
  int64_t stepped = 0;                                      // the elements it named
  std::vector<bool> claimed;                                // per parameter: its gradient storage claimed
  std::vector<bool> claimed_values;                         // per parameter: its values claimed (1.5)
  std::vector<std::pair<std::string, std::string>> leaner;  // a strategy's settings that hold less (1.6)
  bool takes_values = false;  // a strategy lent its claimed values unit by unit (take_values, 1.7)
};

// The most a plan entry may report for one rank, its buffers together and
// its collectives together: 2^50 bytes (1 PiB), far beyond any host, and
// small enough that sums over 4096 ranks and three moments stay within
// int64.
inline constexpr int64_t kMaxPlannedBytes = int64_t{1} << 50;
// "" where `bytes` more after `recorded` (<= kMaxPlannedBytes) stay within
// kMaxPlannedBytes; else why not, in words: "18446744073709551615 bytes
// are more than a rank can hold: ...". Pure.
std::string plan_bytes_problem(uint64_t bytes, int64_t recorded);

// The run a plan is for, as the planning host describes it.
struct PlanRun {
  const Footprint* model = nullptr;
  int world = 1;
  ddp_device_kind device = DDP_DEVICE_CPU;
  int64_t timeout_ms = 30000;
  int micro_steps = 1;
  bool clips = false;
  ddp_precision precision{sizeof(ddp_precision), DDP_FLOAT32, DDP_FLOAT32, 0};  // [precision]
};

// Calls the strategy's plan entry for `rank` (over `transport`, whose
// dtypes and entries it may read); a part with planned = false where it
// has none. Throws Error in the plugin's words, naming it, where it fails.
PluginPart plan_strategy(const ddp_strategy_v1_t& strategy, const ddp_transport_v1_t& transport,
                         const PluginSection& section, const PlanRun& run, int rank);
// The same for the transport, given the step's collectives and the size
// of each one's group (0: the world).
PluginPart plan_transport(const ddp_transport_v1_t& transport, const PluginSection& section, const PlanRun& run,
                          int rank, const std::vector<ddp_plan_collective>& collectives,
                          const std::vector<int>& groups = {});

// A collective as the plan and summary.json name and count it.
Collective collective_of(const ddp_plan_collective& c);

}  // namespace plan
}  // namespace ddp
