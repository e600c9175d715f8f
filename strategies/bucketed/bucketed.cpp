// bucketed.cpp — the `bucketed` strategy, as in CS336 assignment 2's DDP
// with bucketed gradients (PyTorch DDP's c10d Reducer): rank 0's parameters
// are broadcast at the start; trainable parameters are packed, in reverse
// parameter order, into buckets of at most `bucket_mb` MiB. The engine lays
// the gradients out back to back in that order, so a bucket is a run of
// gradient memory: once all its gradients are final in the sync
// micro-batch's backward, it is all-reduced (average) where it lies, on the
// comm stream, while backward goes on (in_place = false: a flat buffer per
// bucket, gradients copied in and back). Fewer, larger collectives than
// `overlap`, still overlapped with backward.
// Frozen parameters are never touched.
//
// The engine owns the optimizer step; the strategy only orders it: with
// `overlap_optimizer` (the default) finish says each bucket's parameters
// final once its average has arrived (ddp_host::grads_final, ABI 1.10), and
// the engine updates bucket by bucket as they do, so the last bucket's
// all-reduce — the one backward cannot hide, it starts when backward ends
// — overlaps the update of the others instead of blocking the training
// thread. Off, finish waits for every bucket and the whole update follows,
// as in PyTorch DDP. The results are the same either way.
//
// Keys: bucket_mb (MiB, default 25, or "auto": ../common/bucket_cap.h),
// overlap_optimizer (default true), compress ("none", "bf16" or "fp16":
// gradients travel in that dtype, ../common/compress.h; unset: [precision]
// reduce), in_place (default true).
//
// The bucket machinery, and the ordering invariant that keeps every rank's
// collectives in the same order, live in ../common/bucket_sync.h (shared
// with `sharded`).
#include <string>
#include <vector>

#include "../common/bucket_cap.h"
#include "../common/bucket_sync.h"
#include "../common/compress.h"
#include "../common/plan_util.h"
#include "../common/stats.h"
#include "../common/strategy_util.h"

using ddp::plugin::guard;
using ddp::strategy::BucketCap;
using ddp::strategy::BucketSync;
using ddp::strategy::StrategyBase;

struct ddp_strategy_s : StrategyBase {
  ddp_strategy_s(const ddp_host* h, const ddp_transport_v1_t* t, ddp_comm* c, BucketCap bucket_cap, bool overlap_opt)
      : StrategyBase(h, t, c), cap(std::move(bucket_cap)), overlap_optimizer(overlap_opt), buckets(*this) {}
  BucketCap cap;              // the bucket_mb key: MiB, or "auto" (measured at train begin)
  size_t gradient_bytes = 0;  // trainable gradients of the current layout
  bool overlap_optimizer;     // the key: update bucket by bucket as averages arrive
  BucketSync buckets;
};

namespace {

constexpr ddp_key kKeys[] = {
    {"bucket_mb", "float or \"auto\"",
     "the most MiB of gradients per bucket (default 25); \"auto\": from the overhead model"},
    {"overlap_optimizer", "bool", "true (default): update bucket by bucket as each average arrives"},
    {"compress", "string",
     "the dtype gradients travel in: \"none\" (float32), \"bf16\" or \"fp16\"; unset: [precision] reduce"},
    {"in_place", "bool",
     "true (default): average gradients in their own memory, where they lie as a bucket; false: copy"},
    {nullptr, nullptr, nullptr},
};

// At train begin and whenever the trainable set changes (between steps).
void lay_out(ddp_strategy* s) {
  std::vector<ddp::strategy::ParamInfo> infos;
  s->gradient_bytes = 0;
  for (size_t i = 0; i < s->host.param_count(); ++i) {
    const ddp_param& p = s->host.param(i);
    infos.push_back({i, p.trainable ? StrategyBase::float32_bytes(p) : 0, p.trainable != 0});
    s->gradient_bytes += infos.back().bytes;
  }
  s->buckets.lay_out(infos, s->cap.bytes_for(s->gradient_bytes));
}

ddp_status bucketed_create(const ddp_host* host, const ddp_transport_v1_t* transport, ddp_comm* comm,
                           ddp_strategy** out) {
  return guard(host, [&] {
    const ddp::plugin::Host h(host);
    BucketCap cap = BucketCap::read(h);
    const bool overlap_optimizer = h.config_bool("overlap_optimizer", true);
    const ddp_dtype wire = ddp::strategy::read_compress(h, transport);
    const bool in_place = h.config_bool("in_place", true);
    *out = new ddp_strategy_s(host, transport, comm, std::move(cap), overlap_optimizer);
    (*out)->buckets.set_wire(wire);
    (*out)->buckets.allow_in_place(in_place);
  });
}

ddp_status bucketed_on_train_begin(ddp_strategy* s) {
  return guard(s->host.raw(), [&] {
    s->broadcast_params_from_rank0();
    s->cap.measure(*s);  // bucket_mb = "auto": o and w, the same on every rank
    lay_out(s);
  });
}

// Gradient accumulation: only the micro-batch with sync_grads communicates;
// the others only add into the gradients.
ddp_status bucketed_on_step_begin(ddp_strategy* s, const ddp_step_info* info) {
  return guard(s->host.raw(), [&] {
    if (info->params_changed) lay_out(s);
    s->buckets.begin_micro_batch(info->sync_grads != 0);
  });
}

ddp_status bucketed_on_grad_ready(ddp_strategy* s, const ddp_param* param) {
  return guard(s->host.raw(), [&] { s->buckets.ready(*param); });
}

// Trainable parameters the model did not use never fire; their gradients
// (zero) still go into their slots, and every remaining bucket launches, in
// index order.
ddp_status bucketed_on_backward_end(ddp_strategy* s) {
  return guard(s->host.raw(), [&] { s->buckets.flush(); });
}

// With overlap_optimizer, the engine's optimizer step waits for each bucket.
ddp_status bucketed_finish(ddp_strategy* s) {
  return guard(s->host.raw(), [&] {
    if (s->overlap_optimizer)
      s->buckets.say_final_by_bucket();
    else
      s->wait_comm();
  });
}

// {"bucket_mb": x (or "auto", "auto": {...}: bucket_cap.h), "overlap_optimizer": b, "compress": c,
//  "in_place": b, "buckets": [{"bytes": n, "in_place": b, "params": ["name", ...]}, ...]}
ddp_status bucketed_stats(ddp_strategy* s, char* buf, size_t cap, size_t* needed) {
  return guard(s->host.raw(), [&] {
    // (Appended, not "{" + std::string: GCC 12's -Wrestrict misfires on
    // inserting before a temporary, PR 105329.)
    std::string json = "{";
    json += s->cap.json_members(s->gradient_bytes, s->buckets.size());
    json += ", \"overlap_optimizer\": ";
    json += s->overlap_optimizer ? "true" : "false";
    json += ", \"compress\": \"";
    json += ddp::strategy::compress_value(s->buckets.wire());
    json += "\", \"in_place\": ";
    json += s->buckets.in_place_allowed() ? "true" : "false";
    json += ", \"buckets\": ";
    json += s->buckets.json();
    json += "}";
    ddp::strategy::write_stats(json, buf, cap, needed);
  });
}

void bucketed_destroy(ddp_strategy* s) { delete s; }

// `ddp plan`: the buckets' all-reduces and buffers (plan_util.h; the last
// beside the updates of the others where the optimizer overlaps them and no
// clipping makes the engine wait for every gradient), and the optimizer on
// every trainable parameter.
ddp_status bucketed_plan(const ddp_host* host, const ddp_transport_v1_t* transport, ddp_plan* out) {
  return guard(host, [&] {
    const ddp::plugin::Host h(host);
    const ddp::plugin::Plan plan(out);
    const size_t cap = BucketCap::read(h).plan_bytes();
    const bool overlap_optimizer = h.config_bool("overlap_optimizer", true);
    const ddp_dtype wire = ddp::strategy::read_compress(h, transport, /*planning=*/true);
    const bool in_place = h.config_bool("in_place", true);
    const auto infos = ddp::strategy::param_infos(h);
    ddp::strategy::plan_buckets(plan, infos, cap, wire, in_place, overlap_optimizer && !plan.clips());
    for (const ddp::strategy::ParamInfo& p : infos)
      if (p.trainable) plan.steps(p.index, 0, p.bytes / sizeof(float));
  });
}

}  // namespace

DDP_STRATEGY_ENTRY = {
    .abi_version = DDP_ABI_VERSION,
    .struct_size = sizeof(ddp_strategy_v1_t),
    .name = "bucketed",
    .version = "0.1.0",
    .caps = DDP_CAP_DEVICE_CPU | DDP_CAP_DEVICE_CUDA | DDP_CAP_REDUCE_DTYPE,
    .create = bucketed_create,
    .on_train_begin = bucketed_on_train_begin,
    .on_step_begin = bucketed_on_step_begin,
    .on_grad_ready = bucketed_on_grad_ready,
    .on_backward_end = bucketed_on_backward_end,
    .finish = bucketed_finish,
    .stats = bucketed_stats,
    .destroy = bucketed_destroy,
    .keys = kKeys,
    .plan = bucketed_plan,
};
