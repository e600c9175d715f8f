// sharded.cpp — the `sharded` strategy: ZeRO (Rajbhandari et al. 2020)
// stage 1, optimizer state sharding (CS336 assignment 2, "Optimizer State
// Sharding"; P_os; stage1.h), stage 2, gradients sharded too (P_os+g;
// stage2.h), and stage 3, parameters sharded too (P_os+g+p, FSDP;
// stage3.h), each over the whole world or, with shard_size = g < N, within
// groups of g ranks and replicated across the N / g groups (HSDP, PyTorch
// FSDP2's HYBRID_SHARD; ../common/hsdp.h). This file reads the keys, makes
// the groups, and routes the ABI's entries to the stage.
//
// Keys ([strategy]):
//   stage      = 1 (default) | 2 | 3
//   shard_size = the world (default): ranks per shard group, a divisor of it
//   prefetch   = 1, reshard_after_forward = true, gather_dtype   (stage 3)
//   compress   = "none" (default) | "bf16" | "fp16"   (stage 1 broadcast, 2, 3)
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

#include "../common/bucket_cap.h"
#include "../common/compress.h"
#include "../common/hsdp.h"
#include "../common/stats.h"
#include "../common/strategy_util.h"
#include "stage1.h"
#include "stage2.h"
#include "stage3.h"

using ddp::plugin::Failure;
using ddp::plugin::guard;
using ddp::strategy::StrategyBase;
namespace ds = ddp::strategy;

struct ddp_strategy_s : StrategyBase {
  int stage = 1;
  ds::Hsdp groups;           // the shard and replica groups (the world alone without shard_size < N)
  ds::BucketCap bucket_cap;  // the bucket_mb key (stage 1's variant broadcast, stage 2): MiB or "auto"
  ds::Stage1 stage1;         // stage 1's partition and variant (unused above it)
  ds::Stage2 stage2;         // stage 2's gradients and shards, stage 3's too (unused in stage 1)
  ds::Stage3 stage3;         // stage 3's values (unused below it)
  bool syncing = false;      // this micro-batch's gradients are synchronised
  std::vector<ddp_held_range> held;  // held_ranges' answer, until the next hook

  ddp_strategy_s(const ddp_host* h, const ddp_transport_v1_t* t, ddp_comm* c)
      : StrategyBase(h, t, c),
        groups(*this),
        stage1(*this, groups, bucket_cap),
        stage2(*this, groups),
        stage3(*this, stage2, groups) {}
};

namespace {

constexpr ddp_key kKeys[] = {
    {"stage", "int", "ZeRO stage: 1 (default) shards optimizer state; 2 the gradients too; 3 the parameters too"},
    {"shard_size", "int", "ranks per shard group, a divisor of the world (default: the world); below it, HSDP: "
                          "sharded within groups, replicated across them"},
    {"variant", "string", "stage 1: \"broadcast\" (default): all-reduce in buckets, broadcast the updated shards; \"allgather\""},
    {"bucket_mb", "float or \"auto\"", "stage 1's variant broadcast, stage 2: the most MiB of gradients per bucket (default 25)"},
    {"compress", "string", "stage 1 broadcast, stages 2, 3: \"none\" (default), \"bf16\" or \"fp16\": the gradients reduced in 16 bits"},
    {"prefetch", "int", "stage 3: units gathered ahead of the one computing, 0 to 16 (default 1)"},
    {"reshard_after_forward", "bool", "stage 3: free a unit's gathered values after its forward (default true)"},
    {"gather_dtype", "string", "stage 3: \"float32\" (default), \"bf16\" or \"fp16\": the parameters all-gathered in 16 bits"},
    {nullptr, nullptr, nullptr},
};

// ------------------------------------------------------------------ hooks

ddp_status sharded_create(const ddp_host* host, const ddp_transport_v1_t* transport, ddp_comm* comm,
                          ddp_strategy** out) {
  return guard(host, [&] {
    if (host->struct_size < offsetof(ddp_host, run_optimizer) + sizeof(host->run_optimizer) ||
        host->run_optimizer == nullptr)
      throw Failure(DDP_ERR_UNSUPPORTED, "the engine offers no run_optimizer: the sharded strategy needs it");
    auto s = std::make_unique<ddp_strategy_s>(host, transport, comm);
    const int64_t stage = s->host.config_int("stage", 1);
    if (stage < 1 || stage > 3)
      throw Failure(DDP_ERR_INVALID_ARGUMENT, "strategy.stage must be 1, 2 or 3 (got " + std::to_string(stage) + ")");
    s->stage = int(stage);
    const int shard_size = ds::read_shard_size(s->host);
    if (s->stage == 3) {  // no bucket_mb: a bucket per unit
      ds::Stage3::check_support(host, transport);
      s->stage2.set_wire(ds::read_compress(s->host, transport));
      s->stage3.claim(ds::Stage3::read_keys(s->host, transport));
    } else if (s->stage == 2) {  // no variant: stage 2 reduce-scatters and all-gathers
      ds::Stage2::check_support(host, transport);
      s->bucket_cap = ds::BucketCap::read(s->host);
      s->stage2.set_wire(ds::read_compress(s->host, transport));
      s->stage2.claim_trainable();  // before the engine makes gradients of its own
    } else {
      s->stage1.read_keys(transport);
    }
    s->groups.split(s->host, transport, comm, shard_size);  // after every refusal of a key
    *out = s.release();
  });
}

size_t trainable_bytes(ddp_strategy* s) {
  size_t trainable = 0;
  for (size_t i = 0; i < s->host.param_count(); ++i)
    if (s->host.param(i).trainable) trainable += StrategyBase::float32_bytes(s->host.param(i));
  return trainable;
}

// Stage 2's bucket cap, in elements.
size_t stage2_cap(ddp_strategy* s) {
  return std::max<size_t>(s->bucket_cap.bytes_for(trainable_bytes(s)) / sizeof(float), 1);
}

ddp_status sharded_on_train_begin(ddp_strategy* s) {
  return guard(s->host.raw(), [&] {
    if (s->stage == 3 && s->stage3.lent()) return s->stage3.set_up();  // rank 0's values come unit by unit
    s->broadcast_params_from_rank0();
    if (s->stage == 3) return s->stage3.set_up();
    if (s->stage == 2) {
      s->bucket_cap.measure(*s);  // "auto": o and w, the same on every rank
      s->stage2.lay_out(stage2_cap(s));
      return;
    }
    s->stage1.set_up();
  });
}

ddp_status sharded_on_step_begin(ddp_strategy* s, const ddp_step_info* info) {
  return guard(s->host.raw(), [&] {
    s->syncing = info->sync_grads != 0;
    if (s->stage == 1) return s->stage1.begin(*info);
    if (info->params_changed && s->stage == 2) s->stage2.lay_out(stage2_cap(s));  // stably: new buckets for the unfrozen
    if (info->params_changed && s->stage == 3) s->stage2.lay_out(1, true);  // the same layout, the new claimed
    s->stage2.begin_micro_batch(info->micro_step == 0, s->syncing);
  });
}

ddp_status sharded_on_grad_ready(ddp_strategy* s, const ddp_param* param) {
  return guard(s->host.raw(), [&] {
    if (s->stage == 1) s->stage1.ready(*param);
  });
}

ddp_status sharded_on_backward_end(ddp_strategy* s) {
  return guard(s->host.raw(), [&] {
    if (s->stage == 1) s->stage1.backward_end();
  });
}

// Stage 2: gradients are bound and reduce-scattered unit by unit.
ddp_status sharded_on_unit(ddp_strategy* s, size_t unit, ddp_unit_phase phase) {
  return guard(s->host.raw(), [&] {
    if (s->stage == 2) s->stage2.unit(unit, phase);
    if (s->stage == 3) s->stage3.unit(unit, phase);
  });
}

// Stage 3: the engine reads the whole model unit by unit.
ddp_status sharded_unit_values(ddp_strategy* s, size_t unit, int hold) {
  return guard(s->host.raw(), [&] {
    if (s->stage == 3) s->stage3.lend(unit, hold != 0);
  });
}

// Stage 3, from ABI 1.7: the initial values, lent unit by unit.
ddp_status sharded_take_values(ddp_strategy* s, size_t unit) {
  return guard(s->host.raw(), [&] {
    if (s->stage == 3) s->stage3.take(unit);
  });
}

ddp_status sharded_finish(ddp_strategy* s) {
  return guard(s->host.raw(), [&] {
    if (!s->syncing) return;  // not the micro-batch that syncs (never the case after the last one)
    if (s->stage >= 2) return s->wait_comm();  // every bucket was reduce-scattered as it closed
    s->stage1.finish();
  });
}

ddp_status sharded_optimizer_step(ddp_strategy* s) {
  return guard(s->host.raw(), [&] {
    if (s->stage == 2) return s->stage2.step();
    if (s->stage == 3) return s->stage3.step();
    s->stage1.step();
  });
}

ddp_status sharded_stats(ddp_strategy* s, char* buf, size_t cap, size_t* needed) {
  return guard(s->host.raw(), [&] {
    if (s->stage == 1) return ds::write_stats(s->stage1.json(), buf, cap, needed);
    std::string j = "{" + s->stage2.json(s->stage) + ", " + s->groups.json_members() + ", ";
    if (s->stage == 2)
      j += s->bucket_cap.json_members(trainable_bytes(s), s->stage2.layout().buckets.size());
    else
      j += s->stage3.json();
    ds::write_stats(j + "}", buf, cap, needed);
  });
}

// ABI 1.9: every averaged gradient this rank holds, with its replicas.
ddp_status sharded_held_ranges(ddp_strategy* s, const ddp_held_range** out, size_t* count) {
  return guard(s->host.raw(), [&] {
    if (s->stage == 1) {
      s->stage1.held(s->held);
    } else {
      s->held.clear();
      for (const ddp_range& r : s->stage2.ranges())
        s->held.push_back({r.param, r.offset, r.count, r.grad, int32_t(s->groups.replicas())});
    }
    *out = s->held.data();
    *count = s->held.size();
  });
}

// Older engines (no held_ranges): variant allgather leaves each averaged
// gradient on its owner only.
ddp_status sharded_held_grads(ddp_strategy* s, size_t* indices, size_t cap, size_t* count, int* partitioned) {
  return guard(s->host.raw(), [&] {
    *partitioned = s->stage == 1 && s->stage1.partitioned() ? 1 : 0;
    *count = *partitioned ? s->stage1.owned().size() : 0;
    if (*count > cap) throw Failure(DDP_ERR_INVALID_ARGUMENT, "held_grads: room for fewer indices than parameters");
    std::copy(s->stage1.owned().begin(), s->stage1.owned().begin() + long(*count), indices);
  });
}

// Older engines, stage 2: this rank's elements of the averaged gradients, in its shard.
ddp_status sharded_grad_ranges(ddp_strategy* s, const ddp_range** ranges, size_t* count, int* partitioned) {
  return guard(s->host.raw(), [&] {
    *ranges = s->stage >= 2 ? s->stage2.ranges().data() : nullptr;
    *count = s->stage >= 2 ? s->stage2.ranges().size() : 0;
    *partitioned = s->stage >= 2 ? 1 : 0;
  });
}

void sharded_destroy(ddp_strategy* s) { delete s; }

ddp_status sharded_plan(const ddp_host* host, const ddp_transport_v1_t* transport, ddp_plan* out) {
  return guard(host, [&] {
    const ddp::plugin::Host h(host);
    const ddp::plugin::Plan plan(out);
    const int64_t stage = h.config_int("stage", 1);
    if (stage == 1) plan.leaner("stage", "2");  // for the fit check: each stage shards more than the one before
    if (stage == 1 || stage == 2) plan.leaner("stage", "3");
    if (stage < 1 || stage > 3)
      throw Failure(DDP_ERR_INVALID_ARGUMENT, "strategy.stage must be 1, 2 or 3 (got " + std::to_string(stage) + ")");
    const int shard_size = ds::read_shard_size(h);  // refuses a world it does not divide
    if (stage == 2)
      return ds::Stage2::plan(h, plan, transport, ds::BucketCap::read(h).plan_bytes(),
                              ds::read_compress(h, transport, /*planning=*/true), shard_size);
    if (stage == 3) {
      if (!DDP_PLUGIN_HAS(transport, reduce_scatter))
        throw Failure(DDP_ERR_UNSUPPORTED, std::string("strategy.stage = 3 reduce-scatters the gradients, and "
                                                       "transport '") + transport->name + "' has no reduce_scatter");
      return ds::Stage3::plan(h, plan, transport, ds::read_compress(h, transport, /*planning=*/true), shard_size);
    }
    ds::Stage1::plan(h, plan, transport, shard_size);
  });
}

}  // namespace

DDP_STRATEGY_ENTRY = {
    .abi_version = DDP_ABI_VERSION,
    .struct_size = sizeof(ddp_strategy_v1_t),
    .name = "sharded",
    .version = "0.1.0",
    .caps = DDP_CAP_DEVICE_CPU | DDP_CAP_DEVICE_CUDA | DDP_CAP_OWNS_OPTIMIZER | DDP_CAP_OWNS_GRADIENTS |
            DDP_CAP_OWNS_PARAMETERS,
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
