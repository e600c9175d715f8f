// stages.h — the `sharded` strategy's parts for stages 2 and 3 (over
// Stage2 and Stage3, stage2.h and stage3.h), and the one place that chooses
// a part from the `stage` and `variant` keys: make_part at create, and
// plan_stage for `ddp plan`. What each stage does is said in its header;
// here only which entry does what. Everything here throws
// ddp::plugin::Failure; the plugin's entries catch it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "../common/bucket_cap.h"
#include "../common/compress.h"
#include "../common/hsdp.h"
#include "../common/strategy_util.h"
#include "part.h"
#include "stage1.h"
#include "stage2.h"
#include "stage3.h"

namespace ddp {
namespace strategy {

// The bytes of the trainable parameters of now.
inline size_t trainable_bytes(const plugin::Host& h) {
  size_t trainable = 0;
  for (size_t i = 0; i < h.param_count(); ++i)
    if (h.param(i).trainable) trainable += StrategyBase::float32_bytes(h.param(i));
  return trainable;
}

// held_ranges of stages 2 and 3: this rank's ranges of the shards, each
// held by one rank per shard group.
inline void shard_held(const std::vector<ddp_range>& ranges, const Hsdp& groups, std::vector<ddp_held_range>& out) {
  out.clear();
  for (const ddp_range& r : ranges) out.push_back({r.param, r.offset, r.count, r.grad, int32_t(groups.replicas())});
}

// Stage 2: gradients bound and reduce-scattered unit by unit, in buckets of
// at most bucket_mb (no variant: stage 2 reduce-scatters and all-gathers).
class Stage2Part : public ShardedPart {
 public:
  // create: claims the trainable gradients before the engine makes its own.
  Stage2Part(const StrategyBase& base, const Hsdp& groups, const ddp_transport_v1_t* transport)
      : base_(base), groups_(groups), grads_(base, groups) {
    Stage2::check_support(base.host.raw(), transport);
    cap_ = BucketCap::read(base.host);
    grads_.set_wire(read_compress(base.host, transport));
    grads_.claim_trainable();
  }

  void set_up() override {
    base_.broadcast_params_from_rank0();
    cap_.measure(base_);  // "auto": o and w, the same on every rank
    grads_.lay_out(cap_elements());
  }
  void begin(const ddp_step_info& info, bool sync) override {
    if (info.params_changed) grads_.lay_out(cap_elements());  // stably: new buckets for the unfrozen
    grads_.begin_micro_batch(info.micro_step == 0, sync);
  }
  void unit(size_t unit, ddp_unit_phase phase) override { grads_.unit(unit, phase); }
  void finish() override { base_.wait_comm(); }  // every bucket was reduce-scattered as it closed
  void step() override { grads_.step(); }
  std::string json() const override {
    return "{" + grads_.json(2) + ", " + groups_.json_members() + ", " +
           cap_.json_members(trainable_bytes(base_.host), grads_.layout().buckets.size()) + "}";
  }
  void held(std::vector<ddp_held_range>& out) const override { shard_held(grads_.ranges(), groups_, out); }
  const std::vector<ddp_range>* ranges() const override { return &grads_.ranges(); }

 private:
  // The bucket cap, in elements.
  size_t cap_elements() const {
    return std::max<size_t>(cap_.bytes_for(trainable_bytes(base_.host)) / sizeof(float), 1);
  }

  const StrategyBase& base_;
  const Hsdp& groups_;
  BucketCap cap_;  // the bucket_mb key: MiB or "auto"
  Stage2 grads_;
};

// Stage 3: stage 2's gradients with a bucket per unit (no bucket_mb), and
// the values sharded too.
class Stage3Part : public ShardedPart {
 public:
  // create: claims every parameter's values and the trainable gradients.
  Stage3Part(const StrategyBase& base, const Hsdp& groups, const ddp_transport_v1_t* transport)
      : base_(base), groups_(groups), grads_(base, groups), values_(base, grads_, groups) {
    Stage3::check_support(base.host.raw(), transport);
    grads_.set_wire(read_compress(base.host, transport));
    values_.claim(Stage3::read_keys(base.host, transport));
  }

  // From ABI 1.7 rank 0's values come unit by unit (take_values).
  void set_up() override {
    if (!values_.lent()) base_.broadcast_params_from_rank0();
    values_.set_up();
  }
  void begin(const ddp_step_info& info, bool sync) override {
    if (info.params_changed) grads_.lay_out(1, true);  // the same layout, the new claimed
    grads_.begin_micro_batch(info.micro_step == 0, sync);
  }
  void unit(size_t unit, ddp_unit_phase phase) override { values_.unit(unit, phase); }
  void lend(size_t unit, bool hold) override { values_.lend(unit, hold); }
  void take(size_t unit) override { values_.take(unit); }
  void finish() override { base_.wait_comm(); }  // every unit was reduce-scattered as backward left it
  void step() override { values_.step(); }
  std::string json() const override {
    return "{" + grads_.json(3) + ", " + groups_.json_members() + ", " + values_.json() + "}";
  }
  void held(std::vector<ddp_held_range>& out) const override { shard_held(grads_.ranges(), groups_, out); }
  const std::vector<ddp_range>* ranges() const override { return &grads_.ranges(); }

 private:
  const StrategyBase& base_;
  const Hsdp& groups_;
  Stage2 grads_;
  Stage3 values_;
};

// create: the part for `stage` (1 to 3) and, in stage 1, the variant key.
inline std::unique_ptr<ShardedPart> make_part(int stage, const StrategyBase& base, const Hsdp& groups,
                                              const ddp_transport_v1_t* transport) {
  switch (stage) {
    case 1: {
      std::string name;
      if (Stage1::read_variant(base.host, &name) == Stage1::Variant::Broadcast)
        return std::make_unique<Stage1Broadcast>(base, groups, transport);
      return std::make_unique<Stage1AllGather>(base, groups, transport);
    }
    case 2: return std::make_unique<Stage2Part>(base, groups, transport);
    default: return std::make_unique<Stage3Part>(base, groups, transport);
  }
}

// `ddp plan` for `stage` (1 to 3).
inline void plan_stage(int stage, const plugin::Host& h, const plugin::Plan& plan, const ddp_transport_v1_t* transport,
                       int shard_size) {
  switch (stage) {
    case 1: return Stage1::plan(h, plan, transport, shard_size);
    case 2:
      return Stage2::plan(h, plan, transport, BucketCap::read(h).plan_bytes(),
                          read_compress(h, transport, /*planning=*/true), shard_size);
    default:
      if (!DDP_PLUGIN_HAS(transport, reduce_scatter))
        throw plugin::Failure(DDP_ERR_UNSUPPORTED, std::string("strategy.stage = 3 reduce-scatters the gradients, "
                                                               "and transport '") +
                                                       transport->name + "' has no reduce_scatter");
      return Stage3::plan(h, plan, transport, read_compress(h, transport, /*planning=*/true), shard_size);
  }
}

}  // namespace strategy
}  // namespace ddp
