// stage2.h — the `sharded` strategy's stage 2 (ZeRO-2, P_os+g): each rank
// keeps the averaged gradients of its own elements only. The layout is
// grad_shards.h's (buckets of whole units, a chunk per rank, a ring for the
// buckets in flight); this is what runs it, through ABI 1.4's strategy-owned
// storage:
//   on_train_begin  claims every trainable gradient (the engine releases its
//                   full copy) and allocates the shard and the ring;
//   on_unit         BACKWARD_BEGIN: the buckets that open there get their
//                   ring memory (after the reduce-scatters that used it
//                   last), cleared, and their parameters' gradients bound
//                   into it; BACKWARD_END: the buckets that close there are
//                   reduce-scattered (AVG) on the comm stream into this
//                   rank's chunk of the shard (summed over micro-batches),
//                   and unbound;
//   finish          waits for the reduce-scatters;
//   optimizer_step  the engine's optimizer on this rank's element ranges,
//                   from the shard; then, bucket by bucket on the comm
//                   stream, this rank's updated chunk is all-gathered (into
//                   the ring, idle by then) and copied into the parameters.
// With shard_size = g < N (HSDP, ../common/hsdp.h) the layout is over the
// g ranks of the shard group and this rank's place in it, the collectives
// above are the shard group's, and on the micro-batch with sync_grads each
// bucket's chunk of the shard (the micro-batches' sum) is all-reduced (AVG)
// across the replica group as the bucket closes: once per step, as
// FSDP2's set_requires_all_reduce.
// Every rank issues the same collectives in the same order: the layout is
// the same everywhere, and buckets close at unit hooks, which fire in the
// model's order, in bucket index order. Everything here throws
// ddp::plugin::Failure; the plugin's entries catch it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "../common/compress.h"
#include "../common/grad_shards.h"
#include "../common/hsdp.h"
#include "../common/stats.h"
#include "../common/strategy_util.h"

namespace ddp {
namespace strategy {

class Stage2 {
 public:
  Stage2(const StrategyBase& base, const Hsdp& groups) : base_(base), groups_(groups) {}
  Stage2(const Stage2&) = delete;
  Stage2& operator=(const Stage2&) = delete;

  // Create: what stage 2 needs of the engine and the transport, by name.
  static void check_support(const ddp_host* host, const ddp_transport_v1_t* transport) {
    if (!DDP_HOST_HAS(host, claim) || !DDP_HOST_HAS(host, run_optimizer_ranges) || !DDP_HOST_HAS(host, add) ||
        !DDP_HOST_HAS(host, unit))
      throw plugin::Failure(DDP_ERR_UNSUPPORTED, "strategy.stage = 2 needs an engine of ABI 1.4 or newer");
    if (!DDP_PLUGIN_HAS(transport, reduce_scatter))
      throw plugin::Failure(DDP_ERR_UNSUPPORTED, std::string("strategy.stage = 2 reduce-scatters the gradients, and "
                                                             "transport '") +
                                                     transport->name + "' has no reduce_scatter");
  }

  // Claims the gradient storage of every trainable parameter.
  void claim_trainable() {
    const plugin::Host& h = base_.host;
    std::vector<size_t> claim;
    for (size_t i = 0; i < h.param_count(); ++i)
      if (h.param(i).trainable) claim.push_back(i);
    h.claim_gradients(claim.data(), claim.size());
  }

  // The layout, for the trainable set of now (stably after the first
  // time), claims and buffers. Between steps only (no work in flight).
  // `every_parameter` (stage 3): frozen parameters are laid out too, so
  // that the layout is the parameters' as well and never changes (their
  // slots carry zeros), and only the trainable are claimed, bound and
  // stepped.
  void lay_out(size_t cap_elements, bool every_parameter = false) {
    const plugin::Host& h = base_.host;
    units_ = units_of(h, kNoUnits);
    params_.clear();
    trainable_.clear();
    for (size_t i = 0; i < h.param_count(); ++i) {
      const ddp_param& p = h.param(i);
      params_.push_back({StrategyBase::float32_elements(p), every_parameter || p.trainable != 0});
      trainable_.push_back(p.trainable != 0);
    }
    std::vector<std::vector<size_t>> kept;
    for (const ShardBucket& b : layout_.buckets) kept.push_back(b.params);
    layout_ = shard_layout(units_, params_, size_t(groups_.size()), cap_elements, kAlign, &kept);
    owned_ = owned_ranges(layout_, params_, size_t(groups_.rank()));
    std::vector<size_t> claim;
    for (const ShardBucket& b : layout_.buckets)
      for (size_t i : b.params)
        if (trainable_[i]) claim.push_back(i);
    h.claim_gradients(claim.data(), claim.size());
    allocate();
  }

  // on_step_begin: whether the micro-batch is the step's first, and
  // whether it syncs (its buckets' chunks then go across the replicas).
  void begin_micro_batch(bool first, bool sync) {
    first_micro_ = first;
    sync_ = sync;
  }
  // The dtype gradients travel in (compress.h): float32, or bfloat16 or
  // float16 (divided by the world size in float32 first, summed in that
  // dtype, converted back into the shard). Before lay_out.
  void set_wire(ddp_dtype wire) { wire_ = wire; }

  ddp_dtype wire() const { return wire_; }

  // on_unit: binds what opens at BACKWARD_BEGIN, reduce-scatters what
  // closes at BACKWARD_END.
  void unit(size_t unit, ddp_unit_phase phase) {
    const size_t pos = units_.size() - 1 - unit;
    if (phase == DDP_UNIT_BACKWARD_BEGIN)
      for (size_t b : layout_.opens_at[pos]) open(b);
    if (phase == DDP_UNIT_BACKWARD_END && !layout_.closes_at[pos].empty()) {
      base_.comm_after_compute();  // the unit's gradients are final on compute
      for (size_t b : layout_.closes_at[pos]) close(b);
    }
  }

  // optimizer_step: this rank's ranges, then the parameters gathered.
  void step() {
    const plugin::Host& h = base_.host;
    h.run_optimizer_ranges(ranges_.data(), ranges_.size());
    base_.comm_after_compute();
    const ddp_stream comm = h.comm_stream();
    for (const ShardBucket& b : layout_.buckets) {
      for (const OwnedRange& r : owned_)
        if (r.shard >= b.shard && r.shard < b.shard + b.chunk)
          h.copy(staging_.floats() + (r.shard - b.shard), static_cast<float*>(h.param(r.param).data) + r.offset,
                 r.count * sizeof(float), comm);
      groups_.shard().all_gather(h.floats(staging_.get(), b.chunk), h.floats(ring_.get(), b.padded()), comm);
      for (size_t k = 0; k < b.params.size(); ++k)
        h.copy(h.param(b.params[k]).data, ring_.floats() + b.slots[k], params_[b.params[k]].elements * sizeof(float),
               comm);
    }
    base_.wait_comm();
  }

  // `ddp plan`: the gradients it claims (all trainable) and holds instead
  // (shard and ring, from set-up on), its staging buffer, the elements its
  // optimizer steps; a reduce-scatter per bucket as it closes (beside
  // backward but the last), on the last micro-batch followed by the
  // all-reduce of its chunk across the replicas, then an all-gather per
  // bucket; groups of `shard_size`.
  static void plan(const plugin::Host& h, const plugin::Plan& plan, const ddp_transport_v1_t* transport,
                   size_t cap_bytes, ddp_dtype wire, int shard_size) {
    if (!DDP_PLUGIN_HAS(transport, reduce_scatter))
      throw plugin::Failure(DDP_ERR_UNSUPPORTED, std::string("strategy.stage = 2 reduce-scatters the gradients, and "
                                                             "transport '") +
                                                     transport->name + "' has no reduce_scatter");
    const std::vector<ShardUnit> units = units_of(h, kNoUnits);
    std::vector<ShardParam> params;
    for (size_t i = 0; i < h.param_count(); ++i)
      params.push_back({StrategyBase::float32_elements(h.param(i)), h.param(i).trainable != 0});
    const size_t n = size_t(shard_size);
    const ShardLayout layout = shard_layout(units, params, n, std::max<size_t>(cap_bytes / sizeof(float), 1), kAlign);
    size_t chunk = 0;
    for (const ShardBucket& b : layout.buckets) {
      for (size_t i : b.params) plan.claims_gradient(i);
      chunk = std::max(chunk, b.chunk);
    }
    for (const OwnedRange& r : owned_ranges(layout, params, size_t(h.rank() % shard_size)))
      plan.steps(r.param, r.offset, r.count);
    plan_buffers(plan, layout, chunk, wire);
    // Every micro-batch reduce-scatters its buckets; only the last one's
    // last is not issued while backward computes.
    const int32_t micro = std::max<int32_t>(plan.micro_steps(), 1);
    const size_t per_step = layout.buckets.size() * size_t(micro);
    size_t issued = 0;
    for (int32_t m = 0; m < micro; ++m)
      for (const auto& closing : layout.closes_at)
        for (size_t b : closing) {
          const bool beside = ++issued < per_step;
          plan_reduce(h, plan, layout.buckets[b], wire, shard_size, m + 1 == micro, beside);
        }
    for (const ShardBucket& b : layout.buckets)
      Hsdp::plan(plan, h.world_size(), shard_size, DDP_OP_ALL_GATHER, b.padded());
  }

  // `ddp plan`: what close() issues for bucket `b`: its reduce-scatter
  // within the shard group, and on the micro-batch that syncs (`last`) the
  // all-reduce of its chunk across the replica group, where there is one.
  static void plan_reduce(const plugin::Host& h, const plugin::Plan& plan, const ShardBucket& b, ddp_dtype wire,
                          int shard_size, bool last, bool beside) {
    const int world = h.world_size();
    Hsdp::plan(plan, world, shard_size, DDP_OP_REDUCE_SCATTER, b.padded(), wire, beside);
    if (last && shard_size < world)
      Hsdp::plan(plan, world, world / shard_size, DDP_OP_ALL_REDUCE, b.chunk, wire, beside);
  }

  // The model's units; a model without any is refused with `refusal`.
  static std::vector<ShardUnit> units_of(const plugin::Host& h, const char* refusal) {
    std::vector<ShardUnit> units;
    for (size_t u = 0; u < h.unit_count(); ++u) {
      const ddp_unit& unit = h.unit(u);
      units.push_back({{unit.params, unit.params + unit.param_count}, {unit.tied, unit.tied + unit.tied_count}});
    }
    if (units.empty()) throw plugin::Failure(DDP_ERR_UNSUPPORTED, refusal);
    return units;
  }
  static constexpr const char* kNoUnits =
      "strategy.stage = 2 binds gradients unit by unit, and this model declares no units";

  // The buffers allocate() makes for `layout` (chunk: its largest).
  static void plan_buffers(const plugin::Plan& plan, const ShardLayout& layout, size_t chunk, ddp_dtype wire) {
    if (layout.buckets.empty()) return;
    plan.buffer(DDP_MEM_GRADIENTS, layout.shard_elements * sizeof(float));
    plan.buffer(DDP_MEM_GRADIENTS, layout.ring_elements * sizeof(float));
    plan.buffer(DDP_MEM_COMM_BUFFERS, chunk * sizeof(float));
    size_t padded = 0;
    for (const ShardBucket& b : layout.buckets) padded = std::max(padded, b.padded());
    if (wire != DDP_FLOAT32) plan.buffer(DDP_MEM_COMM_BUFFERS, (padded + chunk) * ddp_dtype_size(wire));
  }

  // grad_ranges: this rank's elements of the averaged gradients.
  const std::vector<ddp_range>& ranges() const { return ranges_; }
  const ShardLayout& layout() const { return layout_; }
  const std::vector<OwnedRange>& owned() const { return owned_; }  // every laid-out parameter's
  const std::vector<ShardParam>& params() const { return params_; }
  bool trainable(size_t index) const { return trainable_[index]; }
  float* shard() const { return shard_.floats(); }

  std::string json(int stage = 2) const {
    std::string j = "\"stage\": " + std::to_string(stage) + ", \"compress\": \"" + std::string(compress_value(wire_)) +
                    "\", \"shard_elements\": " + std::to_string(layout_.shard_elements) +
                    ", \"ring_elements\": " + std::to_string(layout_.ring_elements) + ", \"owned_elements\": ";
    size_t owned = 0;
    for (const OwnedRange& r : owned_) owned += r.count;
    j += std::to_string(owned) + ", \"buckets\": [";
    for (size_t k = 0; k < layout_.buckets.size(); ++k) {
      const ShardBucket& b = layout_.buckets[k];
      j += std::string(k ? ", " : "") + "{\"elements\": " + std::to_string(b.elements) +
           ", \"chunk\": " + std::to_string(b.chunk) + ", \"params\": [";
      for (size_t i = 0; i < b.params.size(); ++i)
        j += std::string(i ? ", " : "") + json_quote(base_.host.param(b.params[i]).name);
      j += "]}";
    }
    return j + "]";
  }

  static constexpr size_t kAlign = 16;  // floats: 64 bytes, a cache line

 private:
  void allocate() {
    const plugin::Host& h = base_.host;
    // The old go first.
    shard_.reset();
    ring_.reset();
    staging_.reset();
    wire_send_.reset();
    wire_recv_.reset();
    size_t chunk = 0;
    size_t padded = 0;
    for (const ShardBucket& b : layout_.buckets) {
      chunk = std::max(chunk, b.chunk);
      padded = std::max(padded, b.padded());
    }
    if (layout_.buckets.empty()) return;
    shard_ = plugin::DeviceBuffer(h.raw(), layout_.shard_elements * sizeof(float), DDP_MEM_GRADIENTS);
    ring_ = plugin::DeviceBuffer(h.raw(), layout_.ring_elements * sizeof(float), DDP_MEM_GRADIENTS);
    // A micro-batch after the first lands here before it is added to the
    // shard; optimizer_step sends this rank's chunk from here.
    staging_ = plugin::DeviceBuffer(h.raw(), chunk * sizeof(float), DDP_MEM_COMM_BUFFERS);
    if (wire_ != DDP_FLOAT32) {  // a bucket and a chunk in the 16-bit wire dtype
      wire_send_ = plugin::DeviceBuffer(h.raw(), padded * ddp_dtype_size(wire_), DDP_MEM_COMM_BUFFERS);
      wire_recv_ = plugin::DeviceBuffer(h.raw(), chunk * ddp_dtype_size(wire_), DDP_MEM_COMM_BUFFERS);
    }
    ranges_.clear();
    for (const OwnedRange& r : owned_)
      if (trainable_[r.param]) ranges_.push_back({r.param, r.offset, r.count, shard_.floats() + r.shard, nullptr});
    events_.clear();
    for (size_t k = 0; k < layout_.buckets.size(); ++k) events_.emplace_back(h.raw());
    in_flight_.clear();
  }

  void open(size_t k) {
    const plugin::Host& h = base_.host;
    const ShardBucket& b = layout_.buckets[k];
    for (size_t n = 0; n < in_flight_.size();)  // the reduce-scatters reading this memory are done
      if (share_memory(layout_.buckets[in_flight_[n]], b)) {
        events_[in_flight_[n]].make_wait(h.compute_stream());
        in_flight_[n] = in_flight_.back();
        in_flight_.pop_back();
      } else {
        ++n;
      }
    float* memory = ring_.floats() + b.ring;
    h.fill(h.floats(memory, b.padded()), 0.0, h.compute_stream());
    for (size_t i = 0; i < b.params.size(); ++i)
      if (trainable_[b.params[i]]) h.bind_gradient(b.params[i], memory + b.slots[i]);
  }

  void close(size_t k) {
    const plugin::Host& h = base_.host;
    const ShardBucket& b = layout_.buckets[k];
    const ddp_stream comm = h.comm_stream();
    const ddp_buffer send = h.floats(ring_.floats() + b.ring, b.padded());
    const ddp_buffer mine = h.floats(shard_.floats() + b.shard, b.chunk);
    const ddp_buffer landing = h.floats(staging_.get(), b.chunk);
    const ddp_buffer& into = first_micro_ ? mine : landing;  // accumulation: added to the shard below
    if (wire_ == DDP_FLOAT32) {
      groups_.shard().reduce_scatter(send, into, DDP_REDUCE_AVG, comm);
    } else {
      const ddp_buffer wire_send = h.buffer(wire_send_.get(), b.padded(), wire_);
      const ddp_buffer wire_recv = h.buffer(wire_recv_.get(), b.chunk, wire_);
      h.scale(send, 1.0 / double(h.world_size()), comm);  // once: the sums within and across make the average
      h.convert(wire_send, send, comm);
      groups_.shard().reduce_scatter(wire_send, wire_recv, DDP_REDUCE_SUM, comm);
      h.convert(into, wire_recv, comm);
    }
    if (!first_micro_) h.add(mine, landing, comm);
    if (sync_) across(mine);
    events_[k].record(comm);
    in_flight_.push_back(k);
    for (size_t i : b.params)
      if (trainable_[i]) h.bind_gradient(i, nullptr);
  }

  // HSDP: this rank's chunk of the step's sum averaged across the replica
  // group, on the comm stream: in float32, or summed in the wire dtype
  // (the buckets were divided by the world size). Nothing without one.
  void across(const ddp_buffer& mine) const {
    if (!groups_.across()) return;
    const plugin::Host& h = base_.host;
    const ddp_stream comm = h.comm_stream();
    if (wire_ == DDP_FLOAT32) {
      groups_.across_replicas(mine, comm);
      return;
    }
    const ddp_buffer wire = h.buffer(wire_recv_.get(), mine.count, wire_);
    h.convert(wire, mine, comm);
    groups_.across_replicas(wire, comm, DDP_REDUCE_SUM);
    h.convert(mine, wire, comm);
  }

  const StrategyBase& base_;
  const Hsdp& groups_;
  std::vector<ShardUnit> units_;
  std::vector<ShardParam> params_;  // as laid out (stage 3: every parameter "trainable")
  std::vector<bool> trainable_;     // as the engine says now
  ShardLayout layout_;
  std::vector<OwnedRange> owned_;
  std::vector<ddp_range> ranges_;  // owned_, as the engine's optimizer takes them
  plugin::DeviceBuffer shard_;
  plugin::DeviceBuffer ring_;
  plugin::DeviceBuffer staging_;
  plugin::DeviceBuffer wire_send_;
  plugin::DeviceBuffer wire_recv_;
  ddp_dtype wire_ = DDP_FLOAT32;
  std::vector<plugin::Event> events_;  // per bucket: recorded after its reduce-scatter
  std::vector<size_t> in_flight_;      // buckets whose reduce-scatter may still read their ring memory
  bool first_micro_ = true;
  bool sync_ = true;  // the micro-batch syncs: its chunks go across the replicas
};

}  // namespace strategy
}  // namespace ddp
