// stage1.h — the `sharded` strategy's stage 1 (ZeRO-1, P_os; CS336
// assignment 2's "Optimizer State Sharding"): every trainable parameter has
// one owner in its shard group (strategies/common/partition.h over the g
// ranks of the group: size-balanced, the same on every rank); each rank
// runs the engine's optimizer on the parameters its place in the group
// owns, so the engine creates optimizer state for 1/g of the model per
// rank; then the owners send the updated parameters to their group. With
// shard_size = g < N (HSDP, ../common/hsdp.h) the replicas in the other
// groups step the same parameters with the same gradients and state.
//
// variant "broadcast" (the assignment's form): gradients are averaged as in
// `bucketed`, by the same code (../common/bucket_sync.h, which also states
// the ordering invariant) — buckets of at most bucket_mb in reverse
// parameter order, each filled on on_grad_ready and all-reduced (AVG) on
// the comm stream as soon as it is complete, in bucket index order, within
// the shard group and then across the replica group (with `compress`:
// divided by N once, summed in the 16-bit dtype at both levels) — then each
// rank steps its own parameters and every trainable parameter is broadcast
// from its owner within the shard group.
//
// variant "allgather" (ZeRO / DeepSpeed's form): one flat buffer grouped by
// owner (place p's parameters contiguous in region p, each region padded
// to S = the largest shard, in elements). finish: reduce_scatter (AVG)
// within the shard group, so each rank receives its group's average of
// exactly its own parameters' gradients, then all_reduce (AVG) of that
// S-element shard across the replica group; optimizer_step: each rank
// steps its parameters, puts them in the shard, all_gather within the
// shard group, every rank copies the others' parameters back.
//
// When on_step_begin says params_changed (a parameter unfrozen mid-run) the
// partition is recomputed stably (owned parameters keep their owner: their
// optimizer state lives there) and buckets/layout are rebuilt. Stage1 is the
// partition both variants share; Stage1Broadcast and Stage1AllGather are
// the variants, each a part of its own (part.h). Everything here throws
// ddp::plugin::Failure; the plugin's entries catch it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include "../common/bucket_cap.h"
#include "../common/bucket_sync.h"
#include "../common/buckets.h"
#include "../common/compress.h"
#include "../common/hsdp.h"
#include "../common/partition.h"
#include "../common/plan_util.h"
#include "../common/stats.h"
#include "../common/strategy_util.h"
#include "part.h"

namespace ddp {
namespace strategy {

// The partition over the shard group, which both variants keep; a variant
// lays out what it moves (lay_out) and says it in stats (json_layout).
class Stage1 : public ShardedPart {
 public:
  enum class Variant { Broadcast, AllGather };

  // The variant key, or the refusal that names it.
  static Variant read_variant(const plugin::Host& h, std::string* name) {
    *name = h.config_string("variant", "broadcast");
    if (*name == "broadcast") return Variant::Broadcast;
    if (*name == "allgather") return Variant::AllGather;
    throw plugin::Failure(DDP_ERR_INVALID_ARGUMENT,
                          "strategy.variant must be \"broadcast\" or \"allgather\" (got \"" + *name + "\")");
  }

  // on_step_begin: a parameter unfrozen mid-run is given an owner, stably.
  void begin(const ddp_step_info& info, bool /*sync*/) override {
    if (info.params_changed) build(/*stable=*/true);
  }

  std::string json() const override;
  static void plan(const plugin::Host& h, const plugin::Plan& plan, const ddp_transport_v1_t* transport,
                   int shard_size);

 protected:
  Stage1(const StrategyBase& base, const Hsdp& groups, const char* variant_name)
      : base_(base), groups_(groups), variant_name_(variant_name) {}

  // The variant's layout of what it moves, for the partition of now.
  virtual void lay_out(const std::vector<ParamInfo>& infos) = 0;
  // The variant's members of stats, after the partition's.
  virtual std::string json_layout() const = 0;

  // The engine's optimizer on this rank's parameters only (compute stream,
  // blocking; it keeps state for exactly these).
  void step_owned() const { base_.host.run_optimizer(owned_.data(), owned_.size()); }
  void build(bool stable);

  const StrategyBase& base_;
  const Hsdp& groups_;
  const std::string variant_name_;

  // The partition (per table index): owners are places in the shard group.
  std::vector<int> owners_;
  std::vector<size_t> owned_;      // this rank's parameters, table order
  std::vector<size_t> trainable_;  // every trainable parameter, table order
  std::vector<size_t> shard_bytes_;
};

// Variant broadcast: buckets all-reduced, the owners' updates broadcast.
class Stage1Broadcast : public Stage1 {
 public:
  // create: bucket_mb and compress, which shape this variant's buckets
  // only (not read for allgather, so that setting them there is refused as
  // keys the plugin does not read, not silently ignored).
  Stage1Broadcast(const StrategyBase& base, const Hsdp& groups, const ddp_transport_v1_t* transport)
      : Stage1(base, groups, "broadcast"), buckets_(base) {
    cap_ = BucketCap::read(base_.host);
    buckets_.set_wire(read_compress(base_.host, transport));
  }

  void set_up() override {
    base_.broadcast_params_from_rank0();
    buckets_.set_comms(groups_.shard(), groups_.across());
    cap_.measure(base_);  // "auto": o and w, the same on every rank
    build(/*stable=*/false);
  }
  void begin(const ddp_step_info& info, bool sync) override {
    Stage1::begin(info, sync);
    buckets_.begin_micro_batch(sync);
  }
  void ready(const ddp_param& param) override { buckets_.ready(param); }
  void backward_end() override { buckets_.flush(); }
  void finish() override {
    buckets_.flush();  // normally done by on_backward_end; then a no-op
    base_.wait_comm();
  }
  // The owners' updates to their group.
  void step() override {
    const plugin::Host& h = base_.host;
    step_owned();
    base_.comm_after_compute();
    for (size_t i : trainable_) {
      const ddp_param& p = h.param(i);
      groups_.shard().broadcast(h.floats(p.data, p.numel), owners_[i], h.comm_stream());
    }
    base_.wait_comm();
  }
  // Every averaged gradient on every rank.
  void held(std::vector<ddp_held_range>& out) const override {
    out.clear();
    for (size_t i : trainable_)
      out.push_back({i, 0, base_.host.param(i).numel, nullptr, int32_t(base_.host.world_size())});
  }

  static void plan_comm(const plugin::Host& h, const plugin::Plan& plan, const ddp_transport_v1_t* transport,
                        const std::vector<ParamInfo>& infos, int shard_size);

 private:
  void lay_out(const std::vector<ParamInfo>& infos) override {
    gradient_bytes_ = 0;
    for (const ParamInfo& info : infos) gradient_bytes_ += info.trainable ? info.bytes : 0;
    buckets_.lay_out(infos, cap_.bytes_for(gradient_bytes_));
  }
  std::string json_layout() const override {
    return ", " + cap_.json_members(gradient_bytes_, buckets_.size()) + ", \"compress\": \"" +
           compress_value(buckets_.wire()) + "\", \"buckets\": " + buckets_.json();
  }

  BucketCap cap_;              // the bucket_mb key: MiB or "auto"
  BucketSync buckets_;         // the gradient buckets
  size_t gradient_bytes_ = 0;  // trainable gradients of the current layout
};

// Variant allgather: one flat buffer, reduce-scattered and all-gathered.
class Stage1AllGather : public Stage1 {
 public:
  // create: what the variant needs of the transport.
  Stage1AllGather(const StrategyBase& base, const Hsdp& groups, const ddp_transport_v1_t* transport)
      : Stage1(base, groups, "allgather") {
    check_reduce_scatter(transport);
    check_float32_reduce(base_.host);
  }

  void set_up() override {
    base_.broadcast_params_from_rank0();
    build(/*stable=*/false);
  }
  void finish() override;
  void step() override;
  // Each averaged gradient on its owners (one per shard group).
  void held(std::vector<ddp_held_range>& out) const override {
    out.clear();
    for (size_t i : owned_) out.push_back({i, 0, base_.host.param(i).numel, nullptr, int32_t(groups_.replicas())});
  }
  const std::vector<size_t>* partition() const override { return &owned_; }

  static void check_reduce_scatter(const ddp_transport_v1_t* transport) {
    if (!DDP_PLUGIN_HAS(transport, reduce_scatter))
      throw plugin::Failure(DDP_ERR_UNSUPPORTED, std::string("strategy.variant = \"allgather\" reduce-scatters the "
                                                             "gradients, and transport '") +
                                                     transport->name + "' has no reduce_scatter");
  }
  // Its flat buffer is reduce-scattered in float32: a run whose
  // [precision] reduce is 16-bit is refused, naming the key.
  static void check_float32_reduce(const plugin::Host& h) {
    const ddp_dtype reduce = run_precision(h.raw()).reduce;
    if (reduce != DDP_FLOAT32)
      throw plugin::Failure(DDP_ERR_UNSUPPORTED, std::string("precision.reduce = \"") + compress_value(reduce) +
                                                     "\": strategy.variant = \"allgather\" reduces in float32 only "
                                                     "(variant \"broadcast\" and stages 2 and 3 take it; or "
                                                     "precision.reduce = \"fp32\")");
  }
  static void plan_comm(const plugin::Plan& plan, const ddp_transport_v1_t* transport, const std::vector<size_t>& owned,
                        int world, int shard_size);

 private:
  void lay_out(const std::vector<ParamInfo>& infos) override;
  std::string json_layout() const override { return ", \"shard_elements\": " + std::to_string(shard_elements_); }

  std::vector<size_t> flat_offset_;  // per table index: element offset in `flat_`
  size_t shard_elements_ = 0;        // S
  plugin::DeviceBuffer flat_;        // [S * g]: gradients, then parameters
  plugin::DeviceBuffer shard_;       // [S]: this rank's averaged grads, then params
};

// All trainable grads into the owner-grouped flat buffer (compute), then
// reduce_scatter: this rank receives its group's average of its own
// region, averaged across the replicas next.
inline void Stage1AllGather::finish() {
  if (shard_elements_ == 0) return;
  const plugin::Host& h = base_.host;
  const ddp_stream compute = h.compute_stream();
  const ddp_stream comm = h.comm_stream();
  for (size_t i : trainable_) {
    const ddp_param& p = h.param(i);
    h.copy(flat_.floats() + flat_offset_[i], p.grad, p.numel * sizeof(float), compute);
  }
  base_.comm_after_compute();
  const ddp_buffer shard = h.floats(shard_.get(), shard_elements_);
  groups_.shard().reduce_scatter(h.floats(flat_.get(), shard_elements_ * size_t(groups_.size())), shard, DDP_REDUCE_AVG,
                                 comm);
  groups_.across_replicas(shard, comm);
  const size_t base = size_t(groups_.rank()) * shard_elements_;
  for (size_t i : owned_) {
    const ddp_param& p = h.param(i);
    h.copy(p.grad, shard_.floats() + (flat_offset_[i] - base), p.numel * sizeof(float), comm);
  }
  base_.wait_comm();
}

// This rank's updated parameters into its shard, all_gather within the
// shard group, every rank copies the others' parameters back.
inline void Stage1AllGather::step() {
  const plugin::Host& h = base_.host;
  step_owned();
  if (shard_elements_ == 0) return;
  const ddp_stream comm = h.comm_stream();
  const size_t base = size_t(groups_.rank()) * shard_elements_;
  for (size_t i : owned_) {
    const ddp_param& p = h.param(i);
    h.copy(shard_.floats() + (flat_offset_[i] - base), p.data, p.numel * sizeof(float), h.compute_stream());
  }
  base_.comm_after_compute();
  groups_.shard().all_gather(h.floats(shard_.get(), shard_elements_),
                             h.floats(flat_.get(), shard_elements_ * size_t(groups_.size())), comm);
  for (size_t i : trainable_) {
    if (owners_[i] == groups_.rank()) continue;  // already holds its own update
    const ddp_param& p = h.param(i);
    h.copy(p.data, flat_.floats() + flat_offset_[i], p.numel * sizeof(float), comm);
  }
  base_.wait_comm();
}

inline void Stage1AllGather::lay_out(const std::vector<ParamInfo>& /*infos*/) {
  const plugin::Host& h = base_.host;
  const size_t n = size_t(groups_.size());
  flat_.reset();
  shard_.reset();
  flat_offset_.assign(owners_.size(), SIZE_MAX);
  std::vector<size_t> used(n, 0);  // elements per place
  for (size_t i : trainable_) used[size_t(owners_[i])] += h.param(i).numel;
  shard_elements_ = 0;
  for (size_t u : used) shard_elements_ = std::max(shard_elements_, u);
  std::vector<size_t> cursor(n, 0);
  for (size_t i : trainable_) {  // table order within each place's region
    const size_t r = size_t(owners_[i]);
    flat_offset_[i] = r * shard_elements_ + cursor[r];
    cursor[r] += h.param(i).numel;
  }
  if (shard_elements_ == 0) return;  // nothing trainable: nothing to move
  flat_ = plugin::DeviceBuffer(h.raw(), shard_elements_ * n * sizeof(float), DDP_MEM_COMM_BUFFERS);
  shard_ = plugin::DeviceBuffer(h.raw(), shard_elements_ * sizeof(float), DDP_MEM_COMM_BUFFERS);
}

// (Re)computes the partition over the shard group — stably if `stable` —
// and the variant's layout.
inline void Stage1::build(bool stable) {
  const plugin::Host& h = base_.host;
  const size_t count = h.param_count();
  std::vector<ParamInfo> infos;
  for (size_t i = 0; i < count; ++i) {
    const ddp_param& p = h.param(i);
    infos.push_back({i, StrategyBase::float32_bytes(p), p.trainable != 0});
  }
  if (stable && owners_.size() != count)
    throw plugin::Failure(DDP_ERR_INTERNAL, "the parameter table changed size during the run");
  owners_ = partition_params(infos, groups_.size(), stable ? &owners_ : nullptr);
  shard_bytes_ = shard_bytes(infos, owners_, groups_.size());
  owned_.clear();
  trainable_.clear();
  for (size_t i = 0; i < count; ++i) {
    if (owners_[i] == kNoOwner) continue;
    trainable_.push_back(i);
    if (owners_[i] == groups_.rank()) owned_.push_back(i);
  }
  lay_out(infos);
  std::string shards;
  for (size_t b : shard_bytes_) shards += (shards.empty() ? "" : ", ") + std::to_string(b);
  h.log(DDP_LOG_DEBUG, "partition (" + variant_name_ + "): " + std::to_string(owned_.size()) + " of " +
                           std::to_string(trainable_.size()) + " trainable parameters owned here; shard bytes [" +
                           shards + "]");
}

inline std::string Stage1::json() const {
  std::string j = "{\"variant\": " + json_quote(variant_name_) + ", " + groups_.json_members() + ", \"owners\": {";
  bool first = true;
  for (size_t i = 0; i < owners_.size(); ++i) {
    if (owners_[i] == kNoOwner) continue;
    j += (first ? "" : ", ") + json_quote(base_.host.param(i).name) + ": " + std::to_string(owners_[i]);
    first = false;
  }
  j += "}, \"shard_bytes\": [";
  for (size_t r = 0; r < shard_bytes_.size(); ++r) j += (r ? ", " : "") + std::to_string(shard_bytes_[r]);
  j += "], \"largest_to_smallest\": ";
  const auto ratio = largest_to_smallest(shard_bytes_);
  if (ratio) {
    char num[64];
    std::snprintf(num, sizeof num, "%.6g", *ratio);
    j += num;
  } else {
    j += "null";
  }
  return j + json_layout() + "}";
}

// `ddp plan`: the owners' optimizer state (the partition over the shard
// group), then the variant's collectives.
inline void Stage1::plan(const plugin::Host& h, const plugin::Plan& plan, const ddp_transport_v1_t* transport,
                         int shard_size) {
  std::string variant_name;
  const Variant variant = read_variant(h, &variant_name);
  const auto infos = param_infos(h);
  const std::vector<int> owners = partition_params(infos, shard_size);
  std::vector<size_t> owned(size_t(shard_size), 0);
  for (const ParamInfo& p : infos) {
    if (owners[p.index] == kNoOwner) continue;
    owned[size_t(owners[p.index])] += p.bytes / sizeof(float);
    if (owners[p.index] == h.rank() % shard_size) plan.steps(p.index, 0, p.bytes / sizeof(float));
  }
  if (variant == Variant::Broadcast) return Stage1Broadcast::plan_comm(h, plan, transport, infos, shard_size);
  Stage1AllGather::check_float32_reduce(h);
  Stage1AllGather::plan_comm(plan, transport, owned, h.world_size(), shard_size);
}

// Each bucket's all-reduce (averaged in place; compressed, through a buffer
// in the wire dtype) within the shard group and across the replica group,
// then a broadcast per trainable parameter from its owner within the shard
// group.
inline void Stage1Broadcast::plan_comm(const plugin::Host& h, const plugin::Plan& plan,
                                       const ddp_transport_v1_t* transport, const std::vector<ParamInfo>& infos,
                                       int shard_size) {
  const int world = h.world_size();
  const int replicas = world / shard_size;
  const std::vector<Bucket> buckets = assign_buckets(infos, BucketCap::read(h).plan_bytes());
  const ddp_dtype wire = read_compress(h, transport, /*planning=*/true);
  for (size_t k = 0; k < buckets.size(); ++k) {
    const size_t elements = buckets[k].bytes / sizeof(float);
    const bool beside = k + 1 < buckets.size();  // the last is issued once backward is done
    if (wire != DDP_FLOAT32) plan.buffer(DDP_MEM_COMM_BUFFERS, elements * ddp_dtype_size(wire));
    Hsdp::plan(plan, world, shard_size, DDP_OP_ALL_REDUCE, elements, wire, beside);
    if (replicas > 1) Hsdp::plan(plan, world, replicas, DDP_OP_ALL_REDUCE, elements, wire, beside);
  }
  for (const ParamInfo& p : infos)
    if (p.trainable) Hsdp::plan(plan, world, shard_size, DDP_OP_BROADCAST, p.bytes / sizeof(float));
}

// A flat buffer of g shards and one shard, a reduce-scatter of g x S
// elements within the shard group, an all-reduce of S across the replica
// group, an all-gather of g x S within the shard group (S: the largest
// place's; `owned`: the elements each place owns).
inline void Stage1AllGather::plan_comm(const plugin::Plan& plan, const ddp_transport_v1_t* transport,
                                       const std::vector<size_t>& owned, int world, int shard_size) {
  check_reduce_scatter(transport);
  const int replicas = world / shard_size;
  const size_t shard = *std::max_element(owned.begin(), owned.end());
  const size_t g = size_t(shard_size);
  if (shard == 0) return;
  plan.buffer(DDP_MEM_COMM_BUFFERS, shard * (g + 1) * sizeof(float));
  Hsdp::plan(plan, world, shard_size, DDP_OP_REDUCE_SCATTER, shard * g);
  if (replicas > 1) Hsdp::plan(plan, world, replicas, DDP_OP_ALL_REDUCE, shard);
  Hsdp::plan(plan, world, shard_size, DDP_OP_ALL_GATHER, shard * g);
}

}  // namespace strategy
}  // namespace ddp
