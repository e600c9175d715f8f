// sharded.cpp — the `sharded` strategy: ZeRO (Rajbhandari et al. 2020)
// stage 1, optimizer state sharding (CS336 assignment 2, "Optimizer State
// Sharding"; P_os), stage 2, gradients sharded too (P_os+g; stage2.h), and
// stage 3, parameters sharded too (P_os+g+p, FSDP; stage3.h).
//
// Stage 1 (the default). Every trainable parameter has one owner rank
// (strategies/common/partition.h: size-balanced, the same on every rank);
// each rank runs the engine's optimizer on the parameters it owns only, so
// the engine creates optimizer state for 1/N of the model per rank; then
// the owners send the updated parameters to everyone.
//
// Keys ([strategy]):
//   stage     = 1 (default) | 2 | 3
//   prefetch  = 1, reshard_after_forward = true   (stage 3)
//   variant   = "broadcast" (default) | "allgather"   (stage 1)
//   bucket_mb = 25.0  gradient bucket cap, MiB, or "auto" (stage 1's variant
//                     broadcast, and stage 2; ../common/bucket_cap.h)
//
// variant "broadcast" (the assignment's form): gradients are averaged as in
// `bucketed`, by the same code (../common/bucket_sync.h, which also states
// the ordering invariant) — buckets of at most bucket_mb in reverse
// parameter order, each filled on on_grad_ready and all-reduced (AVG) on
// the comm stream as soon as it is complete, in bucket index order — then
// each rank steps its own parameters and every trainable parameter is
// broadcast from its owner.
//
// variant "allgather" (ZeRO / DeepSpeed's form): one flat buffer grouped by
// owner (rank r's parameters contiguous in region r, each region padded to
// S = the largest shard, in elements). finish: reduce_scatter (AVG), so each
// rank receives the averaged gradients of exactly its own parameters;
// optimizer_step: each rank steps its parameters, puts them in a shard of S
// elements, all_gather, every rank copies the others' parameters back.
//
// held_grads (ABI 1.2): with allgather, each rank holds its own parameters'
// averaged gradients only, so the engine's gradient clipping adds the
// ranks' squared norms.
//
// Only micro-batches with sync_grads communicate (gradient accumulation).
// When on_step_begin says params_changed (a parameter unfrozen mid-run) the
// partition is recomputed stably (owned parameters keep their owner: their
// optimizer state lives there) and buckets/layout are rebuilt.
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "../common/bucket_cap.h"
#include "../common/bucket_sync.h"
#include "../common/compress.h"
#include "../common/buckets.h"
#include "../common/partition.h"
#include "../common/stats.h"
#include "../common/plan_util.h"
#include "../common/strategy_util.h"
#include "stage2.h"
#include "stage3.h"

using ddp::plugin::DeviceBuffer;
using ddp::plugin::Failure;
using ddp::plugin::guard;
using ddp::strategy::BucketSync;
using ddp::strategy::StrategyBase;
namespace ds = ddp::strategy;

namespace {

enum class Variant { Broadcast, AllGather };
constexpr size_t kNone = static_cast<size_t>(-1);
constexpr size_t kFloat = sizeof(float);

}  // namespace

struct ddp_strategy_s : StrategyBase {
  int stage = 1;
  ddp::strategy::Stage2 stage2;  // stage 2's gradients and shards, stage 3's too (unused in stage 1)
  ddp::strategy::Stage3 stage3;  // stage 3's values (unused below it)
  Variant variant = Variant::Broadcast;
  std::string variant_name;
  ds::BucketCap bucket_cap;   // the bucket_mb key (variant broadcast): MiB or "auto"
  size_t gradient_bytes = 0;  // trainable gradients of the current layout

  bool syncing = false;  // this micro-batch's gradients are synchronised

  // The partition (per table index).
  std::vector<int> owners;
  std::vector<size_t> owned;      // this rank's parameters, table order
  std::vector<size_t> trainable;  // every trainable parameter, table order
  std::vector<size_t> shard_bytes;

  // variant broadcast: the gradient buckets (empty for allgather)
  BucketSync buckets;

  // variant allgather
  std::vector<size_t> flat_offset;  // per table index: element offset in `flat`
  size_t shard_elements = 0;        // S
  DeviceBuffer flat;                // [S * N]: gradients, then parameters
  DeviceBuffer shard;               // [S]: this rank's averaged grads, then params

  ddp_strategy_s(const ddp_host* h, const ddp_transport_v1_t* t, ddp_comm* c)
      : StrategyBase(h, t, c), stage2(*this), stage3(*this, stage2), buckets(*this) {}
};

namespace {

constexpr ddp_key kKeys[] = {
    {"stage", "int", "ZeRO stage: 1 (default) shards optimizer state; 2 the gradients too; 3 the parameters too"},
    {"variant", "string", "stage 1: \"broadcast\" (default): all-reduce in buckets, broadcast the updated shards; \"allgather\""},
    {"bucket_mb", "float or \"auto\"", "stage 1's variant broadcast, stage 2: the most MiB of gradients per bucket (default 25)"},
    {"compress", "string", "stages 2, 3: \"none\" (default), \"bf16\" or \"fp16\": the gradients reduce-scattered in 16 bits"},
    {"prefetch", "int", "stage 3: units gathered ahead of the one computing, 0 to 16 (default 1)"},
    {"reshard_after_forward", "bool", "stage 3: free a unit's gathered values after its forward (default true)"},
    {"gather_dtype", "string", "stage 3: \"float32\" (default), \"bf16\" or \"fp16\": the parameters all-gathered in 16 bits"},
    {nullptr, nullptr, nullptr},
};

// -------------------------------------------------- partition and layouts

void build_flat_layout(ddp_strategy* s) {
  const size_t n = static_cast<size_t>(s->host.world_size());
  s->flat.reset();
  s->shard.reset();
  s->flat_offset.assign(s->owners.size(), kNone);
  std::vector<size_t> used(n, 0);  // elements per rank
  for (size_t i : s->trainable) used[static_cast<size_t>(s->owners[i])] += s->host.param(i).numel;
  s->shard_elements = 0;
  for (size_t u : used) s->shard_elements = std::max(s->shard_elements, u);
  std::vector<size_t> cursor(n, 0);
  for (size_t i : s->trainable) {  // table order within each rank's region
    const size_t r = static_cast<size_t>(s->owners[i]);
    s->flat_offset[i] = r * s->shard_elements + cursor[r];
    cursor[r] += s->host.param(i).numel;
  }
  if (s->shard_elements == 0) return;  // nothing trainable: nothing to move
  s->flat = DeviceBuffer(s->host.raw(), s->shard_elements * n * kFloat, DDP_MEM_COMM_BUFFERS);
  s->shard = DeviceBuffer(s->host.raw(), s->shard_elements * kFloat, DDP_MEM_COMM_BUFFERS);
}

// (Re)computes the partition — stably if `stable` — and the variant's layout.
void build(ddp_strategy* s, bool stable) {
  const size_t count = s->host.param_count();
  std::vector<ds::ParamInfo> infos;
  for (size_t i = 0; i < count; ++i) {
    const ddp_param& p = s->host.param(i);
    infos.push_back({i, StrategyBase::float32_bytes(p), p.trainable != 0});
  }
  if (stable && s->owners.size() != count)
    throw Failure(DDP_ERR_INTERNAL, "the parameter table changed size during the run");
  s->owners = ds::partition_params(infos, s->host.world_size(), stable ? &s->owners : nullptr);
  s->shard_bytes = ds::shard_bytes(infos, s->owners, s->host.world_size());
  s->owned.clear();
  s->trainable.clear();
  for (size_t i = 0; i < count; ++i) {
    if (s->owners[i] == ds::kNoOwner) continue;
    s->trainable.push_back(i);
    if (s->owners[i] == s->host.rank()) s->owned.push_back(i);
  }
  if (s->variant == Variant::Broadcast) {
    s->gradient_bytes = 0;
    for (const ds::ParamInfo& info : infos) s->gradient_bytes += info.trainable ? info.bytes : 0;
    s->buckets.lay_out(infos, s->bucket_cap.bytes_for(s->gradient_bytes));
  } else {
    build_flat_layout(s);
  }
  std::string shards;
  for (size_t b : s->shard_bytes) shards += (shards.empty() ? "" : ", ") + std::to_string(b);
  s->host.log(DDP_LOG_DEBUG, "partition (" + s->variant_name + "): " + std::to_string(s->owned.size()) + " of " +
                                 std::to_string(s->trainable.size()) + " trainable parameters owned here; shard bytes [" +
                                 shards + "]");
}

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
    if (s->stage == 3) {  // no bucket_mb: a bucket per unit
      ddp::strategy::Stage3::check_support(host, transport);
      s->stage2.set_wire(ds::read_compress(s->host, transport));
      s->stage3.claim(ddp::strategy::Stage3::read_keys(s->host, transport));
      *out = s.release();
      return;
    }
    if (s->stage == 2) {  // no variant: stage 2 reduce-scatters and all-gathers
      ddp::strategy::Stage2::check_support(host, transport);
      s->bucket_cap = ds::BucketCap::read(s->host);
      s->stage2.set_wire(ds::read_compress(s->host, transport));
      s->stage2.claim_trainable();  // before the engine makes gradients of its own
      *out = s.release();
      return;
    }
    s->variant_name = s->host.config_string("variant", "broadcast");
    if (s->variant_name == "broadcast") {
      s->variant = Variant::Broadcast;
    } else if (s->variant_name == "allgather") {
      s->variant = Variant::AllGather;
    } else {
      throw Failure(DDP_ERR_INVALID_ARGUMENT, "strategy.variant must be \"broadcast\" or \"allgather\" (got \"" +
                                                  s->variant_name + "\")");
    }
    // bucket_mb shapes the broadcast variant's buckets only: not read for
    // allgather, so that setting it there is refused as a key the plugin
    // does not read, not silently ignored.
    if (s->variant == Variant::Broadcast) s->bucket_cap = ds::BucketCap::read(s->host);
    if (s->variant == Variant::AllGather && !DDP_PLUGIN_HAS(transport, reduce_scatter))
      throw Failure(DDP_ERR_UNSUPPORTED, std::string("strategy.variant = \"allgather\" reduce-scatters the gradients, "
                                                     "and transport '") + transport->name + "' has no reduce_scatter");
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
  return std::max<size_t>(s->bucket_cap.bytes_for(trainable_bytes(s)) / kFloat, 1);
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
    if (s->variant == Variant::Broadcast) s->bucket_cap.measure(*s);  // "auto": o and w, same on every rank
    build(s, /*stable=*/false);
  });
}

ddp_status sharded_on_step_begin(ddp_strategy* s, const ddp_step_info* info) {
  return guard(s->host.raw(), [&] {
    if (s->stage >= 2) {
      if (info->params_changed && s->stage == 2) s->stage2.lay_out(stage2_cap(s));  // stably: new buckets for the unfrozen
      if (info->params_changed && s->stage == 3) s->stage2.lay_out(1, true);  // the same layout, the new claimed
      s->stage2.begin_micro_batch(info->micro_step == 0);
      s->syncing = info->sync_grads != 0;
      return;
    }
    if (info->params_changed) build(s, /*stable=*/true);
    s->syncing = info->sync_grads != 0;
    if (s->variant == Variant::Broadcast) s->buckets.begin_micro_batch(s->syncing);
  });
}

ddp_status sharded_on_grad_ready(ddp_strategy* s, const ddp_param* param) {
  return guard(s->host.raw(), [&] {
    if (s->stage == 1 && s->variant == Variant::Broadcast) s->buckets.ready(*param);
  });
}

ddp_status sharded_on_backward_end(ddp_strategy* s) {
  return guard(s->host.raw(), [&] {
    if (s->stage == 1 && s->variant == Variant::Broadcast) s->buckets.flush();
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
    if (s->stage >= 2) {  // every bucket was reduce-scattered as it closed
      s->wait_comm();
      return;
    }
    if (s->variant == Variant::Broadcast) {
      s->buckets.flush();  // normally done by on_backward_end; then a no-op
      s->wait_comm();
      return;
    }
    if (s->shard_elements == 0) return;
    // All trainable grads into the owner-grouped flat buffer (compute), then
    // reduce_scatter: this rank receives the average of its own region.
    const ddp_stream compute = s->host.compute_stream(), comm = s->host.comm_stream();
    for (size_t i : s->trainable) {
      const ddp_param& p = s->host.param(i);
      s->host.copy(s->flat.floats() + s->flat_offset[i], p.grad, p.numel * kFloat, compute);
    }
    s->comm_after_compute();
    const size_t n = static_cast<size_t>(s->host.world_size());
    s->comm.reduce_scatter(s->host.floats(s->flat.get(), s->shard_elements * n),
                           s->host.floats(s->shard.get(), s->shard_elements), DDP_REDUCE_AVG, comm);
    const size_t base = static_cast<size_t>(s->host.rank()) * s->shard_elements;
    for (size_t i : s->owned) {
      const ddp_param& p = s->host.param(i);
      s->host.copy(p.grad, s->shard.floats() + (s->flat_offset[i] - base), p.numel * kFloat, comm);
    }
    s->wait_comm();
  });
}

ddp_status sharded_optimizer_step(ddp_strategy* s) {
  return guard(s->host.raw(), [&] {
    if (s->stage == 2) return s->stage2.step();
    if (s->stage == 3) return s->stage3.step();
    // The engine's optimizer on this rank's parameters only (compute stream,
    // blocking); it keeps state for exactly these.
    s->host.run_optimizer(s->owned.data(), s->owned.size());
    const ddp_stream compute = s->host.compute_stream(), comm = s->host.comm_stream();
    if (s->variant == Variant::Broadcast) {
      s->comm_after_compute();
      for (size_t i : s->trainable) {
        const ddp_param& p = s->host.param(i);
        s->comm.broadcast(s->host.floats(p.data, p.numel), s->owners[i], comm);
      }
      s->wait_comm();
      return;
    }
    if (s->shard_elements == 0) return;
    const size_t n = static_cast<size_t>(s->host.world_size());
    const size_t base = static_cast<size_t>(s->host.rank()) * s->shard_elements;
    for (size_t i : s->owned) {
      const ddp_param& p = s->host.param(i);
      s->host.copy(s->shard.floats() + (s->flat_offset[i] - base), p.data, p.numel * kFloat, compute);
    }
    s->comm_after_compute();
    s->comm.all_gather(s->host.floats(s->shard.get(), s->shard_elements),
                       s->host.floats(s->flat.get(), s->shard_elements * n), comm);
    for (size_t i : s->trainable) {
      if (s->owners[i] == s->host.rank()) continue;  // already holds its own update
      const ddp_param& p = s->host.param(i);
      s->host.copy(p.data, s->flat.floats() + s->flat_offset[i], p.numel * kFloat, comm);
    }
    s->wait_comm();
  });
}

ddp_status sharded_stats(ddp_strategy* s, char* buf, size_t cap, size_t* needed) {
  return guard(s->host.raw(), [&] {
    if (s->stage == 2) {
      ds::write_stats("{" + s->stage2.json() + ", " + s->bucket_cap.json_members(trainable_bytes(s),
                                                                                s->stage2.layout().buckets.size()) + "}",
                      buf, cap, needed);
      return;
    }
    if (s->stage == 3) return ds::write_stats("{" + s->stage2.json(3) + ", " + s->stage3.json() + "}", buf, cap, needed);
    std::string j = "{\"variant\": " + ds::json_quote(s->variant_name) + ", \"owners\": {";
    bool first = true;
    for (size_t i = 0; i < s->owners.size(); ++i) {
      if (s->owners[i] == ds::kNoOwner) continue;
      j += (first ? "" : ", ") + ds::json_quote(s->host.param(i).name) + ": " + std::to_string(s->owners[i]);
      first = false;
    }
    j += "}, \"shard_bytes\": [";
    for (size_t r = 0; r < s->shard_bytes.size(); ++r) j += (r ? ", " : "") + std::to_string(s->shard_bytes[r]);
    j += "], \"largest_to_smallest\": ";
    const auto ratio = ds::largest_to_smallest(s->shard_bytes);
    if (ratio) {
      char num[64];
      std::snprintf(num, sizeof num, "%.6g", *ratio);
      j += num;
    } else {
      j += "null";
    }
    if (s->variant == Variant::Broadcast) {
      j += ", " + s->bucket_cap.json_members(s->gradient_bytes, s->buckets.size()) + ", \"buckets\": " + s->buckets.json();
    } else {
      j += ", \"shard_elements\": " + std::to_string(s->shard_elements);
    }
    j += "}";
    ds::write_stats(j, buf, cap, needed);
  });
}

// Variant allgather leaves each averaged gradient on its owner only.
ddp_status sharded_held_grads(ddp_strategy* s, size_t* indices, size_t cap, size_t* count, int* partitioned) {
  return guard(s->host.raw(), [&] {
    *partitioned = s->stage == 1 && s->variant == Variant::AllGather ? 1 : 0;
    *count = *partitioned ? s->owned.size() : 0;
    if (*count > cap) throw Failure(DDP_ERR_INVALID_ARGUMENT, "held_grads: room for fewer indices than parameters");
    std::copy(s->owned.begin(), s->owned.begin() + long(*count), indices);
  });
}

// Stage 2: this rank's elements of the averaged gradients, in its shard.
ddp_status sharded_grad_ranges(ddp_strategy* s, const ddp_range** ranges, size_t* count, int* partitioned) {
  return guard(s->host.raw(), [&] {
    *ranges = s->stage >= 2 ? s->stage2.ranges().data() : nullptr;
    *count = s->stage >= 2 ? s->stage2.ranges().size() : 0;
    *partitioned = s->stage >= 2 ? 1 : 0;
  });
}

void sharded_destroy(ddp_strategy* s) { delete s; }

// `ddp plan`, stage 1: the owners' optimizer state (the partition), and
// variant broadcast: the buckets' all-reduces (averaged in place), then a
// broadcast per trainable parameter from its owner; variant allgather: a
// flat buffer of N shards and one shard, a reduce-scatter and an all-gather
// of N x S elements (S: the largest rank's).
void plan_stage1(const ddp::plugin::Host& h, const ddp::plugin::Plan& plan, const ddp_transport_v1_t* transport) {
  const std::string variant = h.config_string("variant", "broadcast");
  if (variant != "broadcast" && variant != "allgather")
    throw Failure(DDP_ERR_INVALID_ARGUMENT, "strategy.variant must be \"broadcast\" or \"allgather\" (got \"" + variant +
                                                "\")");
  const auto infos = ds::param_infos(h);
  const std::vector<int> owners = ds::partition_params(infos, h.world_size());
  std::vector<size_t> owned(size_t(h.world_size()), 0);
  for (const ds::ParamInfo& p : infos) {
    if (owners[p.index] == ds::kNoOwner) continue;
    owned[size_t(owners[p.index])] += p.bytes / kFloat;
    if (owners[p.index] == h.rank()) plan.steps(p.index, 0, p.bytes / kFloat);
  }
  if (variant == "broadcast") {
    ds::plan_buckets(plan, infos, ds::BucketCap::read(h).plan_bytes(), DDP_FLOAT32, true, false);
    for (const ds::ParamInfo& p : infos)
      if (p.trainable) plan.collective(DDP_OP_BROADCAST, p.bytes / kFloat);
    return;
  }
  if (!DDP_PLUGIN_HAS(transport, reduce_scatter))
    throw Failure(DDP_ERR_UNSUPPORTED, std::string("strategy.variant = \"allgather\" reduce-scatters the gradients, "
                                                   "and transport '") + transport->name + "' has no reduce_scatter");
  const size_t shard = *std::max_element(owned.begin(), owned.end()), n = size_t(h.world_size());
  if (shard == 0) return;
  plan.buffer(DDP_MEM_COMM_BUFFERS, shard * (n + 1) * kFloat);
  plan.collective(DDP_OP_REDUCE_SCATTER, shard * n);
  plan.collective(DDP_OP_ALL_GATHER, shard * n);
}

ddp_status sharded_plan(const ddp_host* host, const ddp_transport_v1_t* transport, ddp_plan* out) {
  return guard(host, [&] {
    const ddp::plugin::Host h(host);
    const ddp::plugin::Plan plan(out);
    const int64_t stage = h.config_int("stage", 1);
    if (stage == 1) plan.leaner("stage", "2");  // for the fit check: each stage shards more than the one before
    if (stage == 1 || stage == 2) plan.leaner("stage", "3");
    if (stage == 2)
      return ddp::strategy::Stage2::plan(h, plan, transport, ds::BucketCap::read(h).plan_bytes(),
                                         ds::read_compress(h, transport, /*planning=*/true));
    if (stage == 3) {
      if (!DDP_PLUGIN_HAS(transport, reduce_scatter))
        throw Failure(DDP_ERR_UNSUPPORTED, std::string("strategy.stage = 3 reduce-scatters the gradients, and "
                                                       "transport '") + transport->name + "' has no reduce_scatter");
      return ddp::strategy::Stage3::plan(h, plan, transport, ds::read_compress(h, transport, /*planning=*/true));
    }
    if (stage != 1)
      throw Failure(DDP_ERR_INVALID_ARGUMENT, "strategy.stage must be 1, 2 or 3 (got " + std::to_string(stage) + ")");
    plan_stage1(h, plan, transport);
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
};
