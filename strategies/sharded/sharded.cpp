// sharded.cpp — the `sharded` strategy: ZeRO (Rajbhandari et al. 2020)
// stage 1, optimizer state sharding (CS336 assignment 2, "Optimizer State
// Sharding"; P_os; stage1.h), stage 2, gradients sharded too (P_os+g;
// stage2.h), and stage 3, parameters sharded too (P_os+g+p, FSDP;
// stage3.h), each over the whole world or, with shard_size = g < N, within
// groups of g ranks and replicated across the N / g groups (HSDP, PyTorch
// FSDP2's HYBRID_SHARD; ../common/hsdp.h). This file reads the keys, makes
// the groups, and routes the ABI's entries to the part of the strategy
// chosen at create from `stage` and `variant` (part.h, stages.h).
//
// Keys ([strategy]):
//   stage      = 1 (default) | 2 | 3
//   shard_size = the world (default): ranks per shard group, a divisor of it
//   prefetch   = 1, reshard_after_forward = true, gather_dtype (unset:
//                [precision] compute)                  (stage 3)
//   compress   = "none" | "bf16" | "fp16" (unset: [precision] reduce)
//                                                      (stage 1 broadcast, 2, 3)
//   variant    = "broadcast" (default) | "allgather"   (stage 1)
//   bucket_mb  = 25.0  gradient bucket cap, MiB, or "auto" (stage 1's variant
//                      broadcast, and stage 2; ../common/bucket_cap.h)
//
// held_ranges (ABI 1.9): the averaged gradients this rank holds and how
// many ranks hold each (the world for stage 1's broadcast, N / g for the
// shards), so the engine's gradient norm counts each element once.
// held_grads (1.2) and grad_ranges (1.4) say it to older engines, which
// make no groups.
//
// Only micro-batches with sync_grads communicate in stage 1 (gradient
// accumulation); stages 2 and 3 reduce-scatter every micro-batch's.
#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "../common/hsdp.h"
#include "../common/stats.h"
#include "../common/strategy_util.h"
#include "part.h"
#include "stages.h"

using ddp::plugin::Failure;
using ddp::plugin::guard;
using ddp::strategy::StrategyBase;
namespace ds = ddp::strategy;

struct ddp_strategy_s : StrategyBase {
  ds::Hsdp groups;                        // the shard and replica groups (the world alone without shard_size < N)
  std::unique_ptr<ds::ShardedPart> part;  // the stage (and variant) chosen at create
  bool syncing = false;                   // this micro-batch's gradients are synchronised
  std::vector<ddp_held_range> held;       // held_ranges' answer, until the next hook

  ddp_strategy_s(const ddp_host* h, const ddp_transport_v1_t* t, ddp_comm* c) : StrategyBase(h, t, c), groups(*this) {}
};

namespace {

constexpr ddp_key kKeys[] = {
    {"stage", "int", "ZeRO stage: 1 (default) shards optimizer state; 2 the gradients too; 3 the parameters too"},
    {"shard_size", "int",
     "ranks per shard group, a divisor of the world (default: the world); below it, HSDP: "
     "sharded within groups, replicated across them"},
    {"variant", "string",
     "stage 1: \"broadcast\" (default): all-reduce in buckets, broadcast the updated shards; \"allgather\""},
    {"bucket_mb", "float or \"auto\"",
     "stage 1's variant broadcast, stage 2: the most MiB of gradients per bucket (default 25)"},
    {"compress", "string",
     "stage 1 broadcast, stages 2, 3: \"none\", \"bf16\" or \"fp16\": the gradients reduced in 16 bits; unset: "
     "[precision] reduce"},
    {"prefetch", "int", "stage 3: units gathered ahead of the one computing, 0 to 16 (default 1)"},
    {"reshard_after_forward", "bool", "stage 3: free a unit's gathered values after its forward (default true)"},
    {"gather_dtype", "string",
     "stage 3: \"float32\", \"bf16\" or \"fp16\": the parameters all-gathered in 16 bits; unset: [precision] "
     "compute"},
    {nullptr, nullptr, nullptr},
};

// ------------------------------------------------------------------ hooks

// strategy.stage, or the refusal that names it.
int read_stage(const ddp::plugin::Host& h) {
  const int64_t stage = h.config_int("stage", 1);
  if (stage < 1 || stage > 3)
    throw Failure(DDP_ERR_INVALID_ARGUMENT, "strategy.stage must be 1, 2 or 3 (got " + std::to_string(stage) + ")");
  return int(stage);
}

ddp_status sharded_create(const ddp_host* host, const ddp_transport_v1_t* transport, ddp_comm* comm,
                          ddp_strategy** out) {
  return guard(host, [&] {
    if (host->struct_size < offsetof(ddp_host, run_optimizer) + sizeof(host->run_optimizer) ||
        host->run_optimizer == nullptr)
      throw Failure(DDP_ERR_UNSUPPORTED, "the engine offers no run_optimizer: the sharded strategy needs it");
    auto s = std::make_unique<ddp_strategy_s>(host, transport, comm);
    const int stage = read_stage(s->host);
    const int shard_size = ds::read_shard_size(s->host);
    s->part = ds::make_part(stage, *s, s->groups, transport);
    s->groups.split(s->host, transport, comm, shard_size);  // after every refusal of a key
    *out = s.release();
  });
}

ddp_status sharded_on_train_begin(ddp_strategy* s) {
  return guard(s->host.raw(), [&] { s->part->set_up(); });
}

ddp_status sharded_on_step_begin(ddp_strategy* s, const ddp_step_info* info) {
  return guard(s->host.raw(), [&] {
    s->syncing = info->sync_grads != 0;
    s->part->begin(*info, s->syncing);
  });
}

// Stage 1's variant broadcast: its buckets.
ddp_status sharded_on_grad_ready(ddp_strategy* s, const ddp_param* param) {
  return guard(s->host.raw(), [&] { s->part->ready(*param); });
}

ddp_status sharded_on_backward_end(ddp_strategy* s) {
  return guard(s->host.raw(), [&] { s->part->backward_end(); });
}

// Stages 2 and 3: gradients are bound and reduce-scattered unit by unit.
ddp_status sharded_on_unit(ddp_strategy* s, size_t unit, ddp_unit_phase phase) {
  return guard(s->host.raw(), [&] { s->part->unit(unit, phase); });
}

// Stage 3: the engine reads the whole model unit by unit.
ddp_status sharded_unit_values(ddp_strategy* s, size_t unit, int hold) {
  return guard(s->host.raw(), [&] { s->part->lend(unit, hold != 0); });
}

// Stage 3, from ABI 1.7: the initial values, lent unit by unit.
ddp_status sharded_take_values(ddp_strategy* s, size_t unit) {
  return guard(s->host.raw(), [&] { s->part->take(unit); });
}

ddp_status sharded_finish(ddp_strategy* s) {
  return guard(s->host.raw(), [&] {
    if (!s->syncing) return;  // not the micro-batch that syncs (never the case after the last one)
    s->part->finish();
  });
}

ddp_status sharded_optimizer_step(ddp_strategy* s) {
  return guard(s->host.raw(), [&] { s->part->step(); });
}

ddp_status sharded_stats(ddp_strategy* s, char* buf, size_t cap, size_t* needed) {
  return guard(s->host.raw(), [&] { ds::write_stats(s->part->json(), buf, cap, needed); });
}

// ABI 1.9: every averaged gradient this rank holds, with its replicas.
ddp_status sharded_held_ranges(ddp_strategy* s, const ddp_held_range** out, size_t* count) {
  return guard(s->host.raw(), [&] {
    s->part->held(s->held);
    *out = s->held.data();
    *count = s->held.size();
  });
}

// Older engines (no held_ranges): variant allgather leaves each averaged
// gradient on its owner only.
ddp_status sharded_held_grads(ddp_strategy* s, size_t* indices, size_t cap, size_t* count, int* partitioned) {
  return guard(s->host.raw(), [&] {
    const std::vector<size_t>* owned = s->part->partition();
    *partitioned = owned != nullptr ? 1 : 0;
    *count = owned != nullptr ? owned->size() : 0;
    if (*count > cap) throw Failure(DDP_ERR_INVALID_ARGUMENT, "held_grads: room for fewer indices than parameters");
    if (owned != nullptr) std::copy(owned->begin(), owned->end(), indices);
  });
}

// Older engines, stages 2 and 3: this rank's elements of the averaged
// gradients, in its shard.
ddp_status sharded_grad_ranges(ddp_strategy* s, const ddp_range** ranges, size_t* count, int* partitioned) {
  return guard(s->host.raw(), [&] {
    const std::vector<ddp_range>* mine = s->part->ranges();
    *ranges = mine != nullptr ? mine->data() : nullptr;
    *count = mine != nullptr ? mine->size() : 0;
    *partitioned = mine != nullptr ? 1 : 0;
  });
}

void sharded_destroy(ddp_strategy* s) { delete s; }

// For the fit check each stage shards more than the one before: the
// stages above this one are the leaner.
ddp_status sharded_plan(const ddp_host* host, const ddp_transport_v1_t* transport, ddp_plan* out) {
  return guard(host, [&] {
    const ddp::plugin::Host h(host);
    const ddp::plugin::Plan plan(out);
    const int stage = read_stage(h);
    static const char* const kStageValues[] = {"1", "2", "3"};  // as TOML writes them, for the engine to keep
    for (int leaner = stage + 1; leaner <= 3; ++leaner) plan.leaner("stage", kStageValues[leaner - 1]);
    const int shard_size = ds::read_shard_size(h);  // refuses a world it does not divide
    ds::plan_stage(stage, h, plan, transport, shard_size);
  });
}

}  // namespace

DDP_STRATEGY_ENTRY = {
    .abi_version = DDP_ABI_VERSION,
    .struct_size = sizeof(ddp_strategy_v1_t),
    .name = "sharded",
    .version = "0.1.0",
    .caps = DDP_CAP_DEVICE_CPU | DDP_CAP_DEVICE_CUDA | DDP_CAP_OWNS_OPTIMIZER | DDP_CAP_OWNS_GRADIENTS |
            DDP_CAP_OWNS_PARAMETERS | DDP_CAP_REDUCE_DTYPE,
    .create = sharded_create,
    .on_train_begin = sharded_on_train_begin,
    .on_step_begin = sharded_on_step_begin,
    .on_grad_ready = sharded_on_grad_ready,
    .on_backward_end = sharded_on_backward_end,
    .finish = sharded_finish,
    .optimizer_step = sharded_optimizer_step,
    .stats = sharded_stats,
    .destroy = sharded_destroy,
    .held_grads = sharded_held_grads,
    .keys = kKeys,
    .on_unit = sharded_on_unit,
    .grad_ranges = sharded_grad_ranges,
    .plan = sharded_plan,
    .unit_values = sharded_unit_values,
    .take_values = sharded_take_values,
    .held_ranges = sharded_held_ranges,
};
