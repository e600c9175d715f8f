// plan_entry_fuzz.cpp — a strategy's plan entry saying anything
// (ddp/abi/plan.h): the input is a list of the calls it makes — buffers,
// collectives, steps, claims, periods and group collectives with arbitrary
// sizes, categories, ops and dtypes — on the footprint of `mlp` at two
// ranks, then planned as `ddp plan` and the fit check plan it
// (engine/plan/run_plan.h). Each call is recorded or refused, and the plan
// is whole or refused by name (ddp::Error): no size wraps round, no
// arithmetic overflows (UndefinedBehaviorSanitizer), nothing crashes.
#include <cstdint>
#include <string>
#include <vector>

#include <ddp/plugin.h>

#include "error.h"
#include "plugin_plan.h"
#include "plugin_section.h"
#include "registry.h"
#include "run_plan.h"

namespace {

const uint8_t* g_data = nullptr;
size_t g_size = 0;

// Little-endian values from the input; zero past its end.
struct Reader {
  size_t at = 0;
  bool done() const { return at >= g_size; }
  uint64_t next(size_t bytes) {
    uint64_t v = 0;
    for (size_t k = 0; k < bytes; ++k, ++at) v |= uint64_t(at < g_size ? g_data[at] : 0) << (8 * k);
    return v;
  }
};

// Enum values stay within what each enum's bits can hold (C++ leaves any
// other value undefined in the harness itself): the categories, ops and
// dtypes past the named ones are reached, `when` and `storage` have one bit.
ddp_status fuzzed_plan(const ddp_host*, const ddp_transport_v1_t*, ddp_plan* plan) {
  Reader r;
  while (!r.done()) {
    const uint64_t call = r.next(1) % 6;
    if (call == 0) {
      plan->buffer(plan->ctx, ddp_mem_category(r.next(1) % 8), size_t(r.next(8)), ddp_plan_when(r.next(1) % 2));
    } else if (call == 1 || call == 5) {
      const ddp_plan_collective c{ddp_collective_op(r.next(1) % 8), size_t(r.next(8)), ddp_dtype(r.next(1) % 8),
                                  int(r.next(1) & 1)};
      if (call == 1) plan->collective(plan->ctx, &c);
      else plan->group_collective(plan->ctx, &c, int(int32_t(r.next(4))));
    } else if (call == 2) {
      plan->steps(plan->ctx, size_t(r.next(2)), size_t(r.next(8)), size_t(r.next(8)));
    } else if (call == 3) {
      plan->claims(plan->ctx, ddp_storage(r.next(1) % 2), size_t(r.next(2)));
    } else {
      plan->every(plan->ctx, int64_t(r.next(8)));
    }
  }
  return DDP_OK;
}

const ddp_strategy_v1_t kStrategy = {.abi_version = DDP_ABI_VERSION, .struct_size = sizeof(ddp_strategy_v1_t),
                                     .name = "fuzzed", .version = "0", .caps = DDP_CAP_DEVICE_CPU,
                                     .plan = fuzzed_plan};
const ddp_transport_v1_t kTransport = {.abi_version = DDP_ABI_VERSION, .struct_size = sizeof(ddp_transport_v1_t),
                                       .name = "none", .version = "0", .caps = DDP_CAP_DEVICE_CPU};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ddp::Footprint model =
      ddp::model_footprint("mlp", ddp::default_model_options("mlp"), 4, DDP_DEVICE_CPU);
  g_data = data;
  g_size = size;
  const ddp::PluginSection section;
  ddp::plan::PlanRun run;
  run.model = &model;
  run.world = 2;
  try {
    std::vector<ddp::plan::RankParts> parts(2);
    for (int rank = 0; rank < 2; ++rank) {
      parts[size_t(rank)].strategy = ddp::plan::plan_strategy(kStrategy, kTransport, section, run, rank);
      parts[size_t(rank)].transport = ddp::plan::plan_transport(kTransport, section, run, rank, {});
    }
    ddp::plan::RunInput in;
    in.model = model;
    in.world_size = 2;
    in.rows_per_rank = 2;
    in.optimizer = "adamw";
    (void)ddp::plan::plan_run(in, parts);
  } catch (const ddp::Error&) {
  }
  return 0;
}
