// stage3.h — the `sharded` strategy's stage 3 (ZeRO-3, FSDP's FULL_SHARD,
// P_os+g+p): each rank keeps its own elements of the parameters too, and
// the full values of a unit exist only while the unit computes. Built on
// stage 2 (stage2.h), whose layout it shares with one bucket per unit and
// every parameter laid out, frozen ones too: rank r holds chunk r of every
// unit's values (its value shard) and of its averaged gradients (stage
// 2's shard), element for element the same ranges. Through ABI 1.5's
// claimed values:
//   create          claims every parameter's values and every trainable
//                   gradient;
//   on_train_begin  lays out the shards; from an engine of ABI 1.7 on,
//   take_values     then takes the values unit by unit as the engine lends
//                   them: rank 0's unit broadcast, this rank's chunks
//                   copied into its value shard (no rank ever holds the
//                   whole model). An older engine holds them all through
//                   on_train_begin, which copies the chunks there (after
//                   rank 0's values are broadcast);
//   on_unit         at each unit's BEGIN, the gathers the schedule says
//                   (gather_schedule.h: the units it reads, then up to
//                   `prefetch` units ahead) are all-gathered on the comm
//                   stream into free slots, the compute stream waits for
//                   those it needs (in gather_dtype, converted back to
//                   float32 there), and their parameters' values are bound
//                   there; backward binds and reduce-scatters gradients as
//                   stage 2 does; at END, the units the schedule releases
//                   are unbound and their slots freed (after the compute);
//   optimizer_step  the engine's optimizer on this rank's ranges, values
//                   and gradients both in the shards: nothing to gather
//                   after it (the next forward gathers);
//   unit_values     the engine's whole-model readers, one unit at a time.
// With shard_size = g < N (HSDP, ../common/hsdp.h) the values are sharded
// over the g ranks of the shard group (gathers within it, unit_values
// within it); take_values broadcasts rank 0's unit over the world, so that
// every replica starts from rank 0's values, and takes this rank's place's
// chunks; gradients go as stage 2's, across the replicas once per step.
// Every rank issues the same gathers in the same order: the schedule is a
// pure function of the units, and the hooks fire in the model's order.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "../common/gather_schedule.h"
#include "stage2.h"

namespace ddp {
namespace strategy {

class Stage3 {
 public:
  static constexpr int64_t kMaxPrefetch = 16;

  Stage3(const StrategyBase& base, Stage2& grads, const Hsdp& groups) : base_(base), grads_(grads), groups_(groups) {}
  Stage3(const Stage3&) = delete;
  Stage3& operator=(const Stage3&) = delete;

  // Create: the engine's and the transport's support, by name.
  static void check_support(const ddp_host* host, const ddp_transport_v1_t* transport) {
    if (DDP_ABI_MINOR(host->abi_version) < 5 || !DDP_HOST_HAS(host, add))
      throw plugin::Failure(DDP_ERR_UNSUPPORTED,
                            "strategy.stage = 3 needs an engine of ABI 1.5 or newer (claimed "
                            "parameter values)");
    if (!DDP_PLUGIN_HAS(transport, reduce_scatter))
      throw plugin::Failure(DDP_ERR_UNSUPPORTED, std::string("strategy.stage = 3 reduce-scatters the gradients, and "
                                                             "transport '") +
                                                     transport->name + "' has no reduce_scatter");
  }

  struct Keys {
    size_t prefetch = 1;
    bool reshard_after_forward = true;
    ddp_dtype gather = DDP_FLOAT32;  // gather_dtype: what the parameters are all-gathered in
  };
  // Its keys, as create and plan read them (`planning`: a plan's host
  // converts nothing; the run's will); throws for a bad value, and for a
  // gather dtype the transport does not take.
  static Keys read_keys(const plugin::Host& h, const ddp_transport_v1_t* transport, bool planning = false) {
    Keys k;
    // Unset, the run's [precision] compute: parameters travel in the dtype
    // they are computed in (FSDP's param_dtype).
    const std::string gather = h.config_string("gather_dtype", kUnset);
    const bool set = gather != kUnset;
    if (set && gather != "float32" && gather != "bf16" && gather != "fp16")
      throw plugin::Failure(DDP_ERR_INVALID_ARGUMENT,
                            "strategy.gather_dtype must be \"float32\", \"bf16\" or "
                            "\"fp16\" (got \"" +
                                gather + "\")");
    k.gather = !set ? run_precision(h.raw()).compute : gather == "float32" ? DDP_FLOAT32 : *compress_dtype(gather);
    const std::string why =
        compress_refusal(k.gather, transport->name, ddp_transport_dtypes(transport),
                         planning || plugin::has_convert(h.raw()), set ? "strategy.gather_dtype" : "precision.compute");
    if (!why.empty())
      throw plugin::Failure(DDP_ERR_UNSUPPORTED,
                            why + (set ? ""
                                       : " (strategy.gather_dtype, unset, follows it: gather_dtype = \"float32\" "
                                         "gathers in float32)"));
    const int64_t prefetch = h.config_int("prefetch", 1);
    if (prefetch < 0 || prefetch > kMaxPrefetch)
      throw plugin::Failure(DDP_ERR_INVALID_ARGUMENT, "strategy.prefetch must be a number of units from 0 to " +
                                                          std::to_string(kMaxPrefetch) + " (got " +
                                                          std::to_string(prefetch) + ")");
    k.prefetch = size_t(prefetch);
    k.reshard_after_forward = h.config_bool("reshard_after_forward", true);
    return k;
  }

  static std::vector<ShardUnit> units_of(const plugin::Host& h) {
    return Stage2::units_of(h,
                            "strategy.stage = 3 gathers the parameters unit by unit, and this model declares no "
                            "units");
  }

  // Create: every value and every trainable gradient are the strategy's.
  void claim(const Keys& keys) {
    const plugin::Host& h = base_.host;
    keys_ = keys;
    units_ = units_of(h);
    std::vector<size_t> all;
    for (size_t i = 0; i < h.param_count(); ++i) all.push_back(i);
    h.claim_values(all.data(), all.size());
    grads_.claim_trainable();
  }

  // on_train_begin, after the broadcast: the layout (one bucket per unit,
  // every parameter), the value shard filled from the engine's copy, the
  // schedule and its slots. Blocks until the copy is done.
  void set_up() {
    const plugin::Host& h = base_.host;
    grads_.lay_out(/*cap_elements=*/1, /*every_parameter=*/true);
    const ShardLayout& layout = grads_.layout();
    values_ =
        plugin::DeviceBuffer(h.raw(), std::max<size_t>(layout.shard_elements, 1) * sizeof(float), DDP_MEM_PARAMETERS);
    if (!lent()) take_chunks(kNone);  // an engine before 1.7 holds every value now
    bucket_of_.assign(units_.size(), kNone);
    for (size_t b = 0; b < layout.buckets.size(); ++b) bucket_of_[h.param(layout.buckets[b].params.front()).unit] = b;
    std::vector<size_t> sizes;
    size_t largest = 0;
    size_t chunk = 0;
    for (size_t u = 0; u < units_.size(); ++u) {
      sizes.push_back(bucket_of_[u] == kNone ? 0 : layout.buckets[bucket_of_[u]].padded());
      largest = std::max(largest, sizes.back());
      if (bucket_of_[u] != kNone) chunk = std::max(chunk, layout.buckets[bucket_of_[u]].chunk);
    }
    wire_send_.reset();
    wire_recv_.reset();
    if (keys_.gather != DDP_FLOAT32) {  // a chunk and a unit in the gather dtype, converted on the comm stream
      wire_send_ = plugin::DeviceBuffer(h.raw(), chunk * ddp_dtype_size(keys_.gather), DDP_MEM_COMM_BUFFERS);
      wire_recv_ = plugin::DeviceBuffer(h.raw(), largest * ddp_dtype_size(keys_.gather), DDP_MEM_COMM_BUFFERS);
    }
    schedule_ = gather_schedule(units_, keys_.prefetch, keys_.reshard_after_forward, sizes);
    slots_.clear();
    freed_.clear();
    gathered_.clear();
    for (size_t k = 0; k < std::max<size_t>(schedule_.peak_units, 1); ++k) {
      slots_.emplace_back(h.raw(), std::max<size_t>(largest, 1) * sizeof(float), DDP_MEM_PARAMETERS);
      freed_.emplace_back(h.raw());
    }
    for (size_t u = 0; u < units_.size(); ++u) gathered_.emplace_back(h.raw());
    slot_of_.assign(units_.size(), kNone);
    slot_used_.assign(slots_.size(), false);
    slot_busy_.assign(slots_.size(), false);
    base_.comm_after_compute();
    base_.wait_comm();  // the engine frees its copy once on_train_begin returns
  }

  // Whether the engine lends the values unit by unit (take_values, ABI
  // 1.7; stage 3 claims them all, and refuses a model without units): then
  // it holds none in on_train_begin.
  bool lent() const { return DDP_ABI_MINOR(base_.host.raw()->abi_version) >= 7; }

  // take_values: rank 0's values of `unit` (over the world: every replica
  // starts from them), then this rank's chunks of them.
  void take(size_t unit) {
    const plugin::Host& h = base_.host;
    base_.comm_after_compute();  // the engine's upload of them
    for (size_t i : units_[unit].params)
      base_.comm.broadcast(h.floats(h.param(i).data, StrategyBase::float32_elements(h.param(i))), 0, h.comm_stream());
    base_.wait_comm();  // before the compute stream copies from them
    take_chunks(unit);
    base_.comm_after_compute();
    base_.wait_comm();  // the engine frees them once take_values returns
  }

  // on_unit: gathers, waits and binds at BEGIN; gradients as stage 2;
  // releases at END.
  void unit(size_t unit, ddp_unit_phase phase) {
    const bool forward = phase == DDP_UNIT_FORWARD_BEGIN || phase == DDP_UNIT_FORWARD_END;
    const size_t pos = forward ? unit : 2 * units_.size() - 1 - unit;
    if (phase == DDP_UNIT_FORWARD_BEGIN || phase == DDP_UNIT_BACKWARD_BEGIN) {
      const GatherHook& hook = schedule_.begin[pos];
      if (!hook.gather.empty()) base_.comm_after_compute();  // the optimizer's update of the shard
      for (size_t x : hook.gather) gather(x, keys_.gather);
      for (size_t x : hook.wait) hold(x);
      if (!forward) grads_.unit(unit, phase);
      return;
    }
    if (!forward) grads_.unit(unit, phase);
    for (size_t x : schedule_.end[pos].release) release(x);
  }

  // optimizer_step: this rank's elements, values and gradients in the shards.
  void step() {
    const plugin::Host& h = base_.host;
    ranges_.clear();
    for (const OwnedRange& r : grads_.owned())
      if (grads_.trainable(r.param))
        ranges_.push_back({r.param, r.offset, r.count, grads_.shard() + r.shard, values_.floats() + r.shard});
    h.run_optimizer_ranges(ranges_.data(), ranges_.size());
  }

  // unit_values: the engine reads the unit's values between steps.
  void lend(size_t unit, bool hold_it) {
    if (bucket_of_[unit] == kNone) return;
    if (!hold_it) return release(unit);
    base_.comm_after_compute();
    gather(unit, DDP_FLOAT32);  // the values themselves, whatever the step's gathers travel in
    this->hold(unit);
    base_.comm_after_compute();
    base_.wait_comm();  // in place when unit_values returns
  }

  // `ddp plan`: every value and trainable gradient claimed; the value
  // shard and the gather slots (parameters), stage 2's shard, ring and
  // staging (its plan, with one bucket per unit and every parameter laid
  // out); this rank's trainable elements stepped; per micro-batch, the
  // schedule's all-gathers and a reduce-scatter per unit as it closes
  // (and on the last micro-batch its chunk's all-reduce across the
  // replicas); groups of `shard_size`.
  static void plan(const plugin::Host& h, const plugin::Plan& plan, const ddp_transport_v1_t* transport, ddp_dtype wire,
                   int shard_size) {
    const Keys keys = read_keys(h, transport, /*planning=*/true);
    const std::vector<ShardUnit> units = units_of(h);
    std::vector<ShardParam> params;
    for (size_t i = 0; i < h.param_count(); ++i) {
      params.push_back({StrategyBase::float32_elements(h.param(i)), true});
      plan.claims_values(i);
      if (h.param(i).trainable) plan.claims_gradient(i);
    }
    const ShardLayout layout = shard_layout(units, params, size_t(shard_size), 1, Stage2::kAlign);
    std::vector<size_t> bucket_of(units.size(), kNone);
    std::vector<size_t> sizes(units.size(), 0);
    size_t chunk = 0;
    size_t largest = 0;
    for (size_t b = 0; b < layout.buckets.size(); ++b) {
      const ShardBucket& bucket = layout.buckets[b];
      bucket_of[h.param(bucket.params.front()).unit] = b;
      sizes[h.param(bucket.params.front()).unit] = bucket.padded();
      chunk = std::max(chunk, bucket.chunk);
      largest = std::max(largest, bucket.padded());
    }
    for (const OwnedRange& r : owned_ranges(layout, params, size_t(h.rank() % shard_size)))
      if (h.param(r.param).trainable) plan.steps(r.param, r.offset, r.count);
    const GatherSchedule s = gather_schedule(units, keys.prefetch, keys.reshard_after_forward, sizes);
    plan.buffer(DDP_MEM_PARAMETERS, std::max<size_t>(layout.shard_elements, 1) * sizeof(float));
    for (size_t k = 0; k < std::max<size_t>(s.peak_units, 1); ++k)
      plan.buffer(DDP_MEM_PARAMETERS, std::max<size_t>(largest, 1) * sizeof(float));
    if (keys.gather != DDP_FLOAT32) plan.buffer(DDP_MEM_COMM_BUFFERS, (chunk + largest) * ddp_dtype_size(keys.gather));
    Stage2::plan_buffers(plan, layout, chunk, wire);
    const int32_t micro = std::max<int32_t>(plan.micro_steps(), 1);
    const size_t per_step = layout.buckets.size() * size_t(micro);
    size_t reduced = 0;
    for (int32_t m = 0; m < micro; ++m)
      for (size_t p = 0; p < 2 * units.size(); ++p) {
        for (size_t x : s.begin[p].gather)
          if (bucket_of[x] != kNone)
            Hsdp::plan(plan, h.world_size(), shard_size, DDP_OP_ALL_GATHER, sizes[x], keys.gather, p > 0);
        if (p < units.size()) continue;
        for (size_t b : layout.closes_at[p - units.size()]) {
          const bool beside = ++reduced < per_step;
          Stage2::plan_reduce(h, plan, layout.buckets[b], wire, shard_size, m + 1 == micro, beside);
        }
      }
  }

  std::string json() const {
    return "\"prefetch\": " + std::to_string(keys_.prefetch) +
           ", \"reshard_after_forward\": " + (keys_.reshard_after_forward ? "true" : "false") +
           ", \"gather_dtype\": \"" + (keys_.gather == DDP_FLOAT32 ? "float32" : compress_value(keys_.gather)) +
           "\", \"gathers_per_micro_batch\": " + std::to_string(schedule_.gathers) +
           ", \"gather_slots\": " + std::to_string(slots_.size());
  }

 private:
  // Copies this rank's chunks of `unit`'s parameters (kNone: every unit's)
  // from where the engine holds them into the value shard.
  void take_chunks(size_t unit) {
    const plugin::Host& h = base_.host;
    for (const OwnedRange& r : grads_.owned())
      if (unit == kNone || h.param(r.param).unit == unit)
        h.copy(values_.floats() + r.shard, static_cast<const float*>(h.param(r.param).data) + r.offset,
               r.count * sizeof(float), h.compute_stream());
  }

  static constexpr size_t kNone = static_cast<size_t>(-1);

  // Enqueues unit x's all-gather on the comm stream into a free slot, in
  // `dtype`: float32 straight into it; else this rank's chunk converted,
  // gathered in the 16-bit dtype and converted into the slot.
  void gather(size_t x, ddp_dtype dtype) {
    const size_t b = bucket_of_[x];
    if (b == kNone) return;
    const plugin::Host& h = base_.host;
    const ShardBucket& bucket = grads_.layout().buckets[b];
    size_t slot = 0;
    while (slot < slots_.size() && slot_busy_[slot]) ++slot;
    if (slot == slots_.size())
      throw plugin::Failure(DDP_ERR_INTERNAL, "stage 3: no free slot to gather unit " + std::to_string(x) + " into");
    const ddp_stream comm = h.comm_stream();
    if (slot_used_[slot]) freed_[slot].make_wait(comm);  // the compute that read its last unit is done
    const ddp_buffer mine = h.floats(values_.floats() + bucket.shard, bucket.chunk);
    const ddp_buffer full = h.floats(slots_[slot].get(), bucket.padded());
    if (dtype == DDP_FLOAT32) {
      groups_.shard().all_gather(mine, full, comm);
    } else {
      const ddp_buffer send = h.buffer(wire_send_.get(), bucket.chunk, dtype);
      const ddp_buffer recv = h.buffer(wire_recv_.get(), bucket.padded(), dtype);
      h.convert(send, mine, comm);
      groups_.shard().all_gather(send, recv, comm);
      h.convert(full, recv, comm);  // before the next gather reuses recv: the same stream
    }
    gathered_[x].record(comm);
    slot_of_[x] = slot;
    slot_busy_[slot] = true;
    slot_used_[slot] = true;
  }

  // The compute stream waits for unit x's gather; its values are bound.
  void hold(size_t x) {
    const size_t b = bucket_of_[x];
    if (b == kNone) return;
    const plugin::Host& h = base_.host;
    gathered_[x].make_wait(h.compute_stream());
    const ShardBucket& bucket = grads_.layout().buckets[b];
    float* memory = slots_[slot_of_[x]].floats();
    for (size_t k = 0; k < bucket.params.size(); ++k) h.bind_values(bucket.params[k], memory + bucket.slots[k]);
  }

  // Unit x's values unbound; its slot free once the compute reading it is.
  void release(size_t x) {
    const size_t b = bucket_of_[x];
    if (b == kNone) return;
    const plugin::Host& h = base_.host;
    for (size_t i : grads_.layout().buckets[b].params) h.bind_values(i, nullptr);
    const size_t slot = slot_of_[x];
    freed_[slot].record(h.compute_stream());
    slot_busy_[slot] = false;
    slot_of_[x] = kNone;
  }

  const StrategyBase& base_;
  Stage2& grads_;
  const Hsdp& groups_;
  Keys keys_;
  std::vector<ShardUnit> units_;
  std::vector<size_t> bucket_of_;  // per unit: its bucket in stage 2's layout, or kNone (no parameters)
  GatherSchedule schedule_;
  plugin::DeviceBuffer values_;  // this rank's chunk of every unit's values
  // gather_dtype other than float32: a chunk, a unit.
  plugin::DeviceBuffer wire_send_;
  plugin::DeviceBuffer wire_recv_;
  std::vector<plugin::DeviceBuffer> slots_;  // full copies of gathered units
  std::vector<plugin::Event> freed_;         // per slot: recorded after the compute that read it
  std::vector<plugin::Event> gathered_;      // per unit: recorded after its all-gather
  std::vector<size_t> slot_of_;              // per unit: its slot while gathered
  std::vector<bool> slot_used_;
  std::vector<bool> slot_busy_;
  std::vector<ddp_range> ranges_;
};

}  // namespace strategy
}  // namespace ddp
