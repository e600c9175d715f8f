// bucket_sync.h — gradient averaging in buckets, overlapped with backward
// (PyTorch DDP's c10d Reducer), optionally in a 16-bit float (compress.h),
// optionally in two levels (HSDP: within a shard group, then across the
// replica group; hsdp.h), shared by the `bucketed` strategy and the
// `sharded` strategy's variant "broadcast". Header-only, so a plugin stays
// one shared library that links nothing of the engine. Everything here
// throws ddp::plugin::Failure; the plugin's entries catch it with
// ddp::plugin::guard.
//
// The trainable parameters are packed into buckets (assign_buckets in
// buckets.h: reverse parameter order, at most cap_bytes each), every bucket
// a flat float32 buffer of "slots", one per parameter. Where the bucket's
// gradients already lie back to back in slot order (the engine packs them
// so: Model::pack_gradients), the buffer is that memory itself and
// nothing is copied (PyTorch's gradient_as_bucket_view); otherwise the
// bucket has a buffer of its own, each gradient is copied into its slot
// on the compute stream the moment on_grad_ready says it is final, and
// back after the average. A bucket whose slots are all filled is launched
// on the comm stream: the comm stream waits for an event recorded on
// compute (the gradients and slot copies), and all-reduces (averages) the
// buffer.
//
// ORDERING INVARIANT. All ranks must issue the same collectives in the same
// order (plugin.h). Buckets are therefore launched strictly in bucket index
// order: a bucket that is complete early waits until every lower-indexed
// bucket has launched, and launching happens only from ready() and flush()
// on the training thread, never from timing (no event is polled). The
// sequence of all-reduces is then bucket 0, 1, ..., each with its fixed
// size, on every rank: the layout depends only on parameter sizes and the
// cap, identical everywhere, and which bucket a given on_grad_ready
// completes depends only on the engine's on_grad_ready order, which depends
// only on the model. Trainable parameters the model did not use never fire:
// flush() (on_backward_end) fills their slots with their (zero) gradients
// and launches every remaining bucket, still in index order, so a bucket
// holding one of them is always launched, by flush() if not before.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "buckets.h"
#include "stats.h"
#include "strategy_util.h"

namespace ddp {
namespace strategy {

class BucketSync {
 public:
  // `base` is the strategy this belongs to (its host, comm and events); it
  // must outlive this object.
  explicit BucketSync(const StrategyBase& base) : base_(base), within_(&base.comm) {}
  BucketSync(const BucketSync&) = delete;
  BucketSync& operator=(const BucketSync&) = delete;

  // The comms a bucket is averaged over: all-reduced within `within`, then
  // (where `across` is not nullptr) across `across`, a hierarchical
  // all-reduce whose result is the average over the world when `within`
  // and `across` are a shard group and its replica group (hsdp.h). Both
  // must outlive this object. Default: the strategy's comm alone.
  void set_comms(const plugin::Comm& within, const plugin::Comm* across) {
    within_ = &within;
    across_ = across;
  }

  // The dtype gradients travel in (compress.h): float32 (the default), or
  // bfloat16 or float16 through a second buffer per bucket. Before lay_out.
  void set_wire(ddp_dtype wire) { wire_ = wire; }
  ddp_dtype wire() const { return wire_; }
  // Whether a bucket whose gradients lie back to back is averaged in
  // their memory (true, the default) or copied as any other. Before lay_out.
  void allow_in_place(bool allow) { allow_in_place_ = allow; }
  bool in_place_allowed() const { return allow_in_place_; }

  // (Re)makes the buckets for `infos` (ParamInfo::index = table index,
  // bytes = float32 gradient bytes; frozen entries are skipped) with a cap
  // of cap_bytes. At train begin and whenever the trainable set changes,
  // i.e. only between steps: finish has waited for the comm stream, so no
  // enqueued work still uses the old buffers when they are freed.
  void lay_out(const std::vector<ParamInfo>& infos, size_t cap_bytes) {
    const size_t count = base_.host.param_count();
    buckets_.clear();  // free first: old and new never count together
    place_of_.assign(count, Place{});
    filled_.assign(count, 0);
    std::vector<size_t> bytes_of(count, 0);
    for (const ParamInfo& info : infos) {
      if (info.index >= count)
        throw plugin::Failure(DDP_ERR_INTERNAL, "bucket layout: parameter index " + std::to_string(info.index) +
                                                    " is not in the table of " + std::to_string(count));
      bytes_of[info.index] = info.bytes;
    }
    for (const Bucket& assigned : assign_buckets(infos, cap_bytes)) {
      BucketState b(base_.host.raw());
      size_t offset = 0;
      for (const size_t i : assigned.params) {
        place_of_[i] = Place{buckets_.size(), b.slots.size()};
        b.slots.push_back(Slot{i, offset, bytes_of[i]});
        b.params.push_back(i);
        offset += bytes_of[i];
      }
      b.bytes = assigned.bytes;
      b.in_place = allow_in_place_ && base_.packed_grads(b.params) != nullptr;
      if (!b.in_place) b.buffer = plugin::DeviceBuffer(base_.host.raw(), assigned.bytes, DDP_MEM_COMM_BUFFERS);
      if (wire_ != DDP_FLOAT32)
        b.wire = plugin::DeviceBuffer(base_.host.raw(), assigned.bytes / sizeof(float) * ddp_dtype_size(wire_),
                                      DDP_MEM_COMM_BUFFERS);
      buckets_.push_back(std::move(b));
    }
    syncing_ = false;
    launched_ = buckets_.size();  // nothing to launch until a sync micro-batch begins
  }

  // on_step_begin, after any lay_out: `sync` is the micro-batch's
  // sync_grads. Only a syncing micro-batch fills slots and communicates;
  // the others only add into the gradients (gradient accumulation).
  void begin_micro_batch(bool sync) {
    syncing_ = sync;
    if (!syncing_) return;
    filled_.assign(base_.host.param_count(), 0);
    for (BucketState& b : buckets_) b.unfilled = b.slots.size();
    launched_ = 0;
  }

  bool syncing() const { return syncing_; }

  // on_grad_ready: `param`'s gradient is final on the compute stream. Copies
  // it into its slot and launches what the ordering invariant allows.
  // Non-blocking; nothing outside a syncing micro-batch.
  void ready(const ddp_param& param) {
    if (!syncing_) return;
    const size_t i = param.index;
    if (i >= place_of_.size() || place_of_[i].bucket == kNoBucket)
      throw plugin::Failure(DDP_ERR_INVALID_ARGUMENT,
                            std::string("on_grad_ready for '") + param.name + "', which is in no bucket (frozen?)");
    if (filled_[i])
      throw plugin::Failure(DDP_ERR_INVALID_ARGUMENT,
                            std::string("on_grad_ready for '") + param.name + "' twice in one micro-batch");
    fill_slot(i);
    launch_ready();
  }

  // on_backward_end: fills the slots of parameters that never fired (their
  // gradients are zero) and launches every remaining bucket, in index
  // order. Non-blocking; idempotent (a second call in the same micro-batch,
  // e.g. from finish as a safety net, does nothing).
  void flush() {
    if (!syncing_) return;
    for (size_t b = launched_; b < buckets_.size(); ++b)
      for (const Slot& slot : buckets_[b].slots)
        if (!filled_[slot.param]) fill_slot(slot.param);
    launch_ready();
    syncing_ = false;
  }

  // In finish, for the engine's optimizer step (ABI 1.10, grads_final):
  // each bucket's parameters, in launch order, said final once its
  // all-reduce (and copies back) have run. The engine waits for each in
  // turn and updates it, so the updates of the first buckets overlap the
  // communication of the last ones (the update is per parameter: the order
  // changes no result).
  void say_final_by_bucket() const {
    for (const BucketState& b : buckets_) base_.host.grads_final(b.done.raw(), b.params.data(), b.params.size());
  }

  size_t size() const { return buckets_.size(); }

  // The layout as a JSON array, in bucket (= launch) order:
  // [{"bytes": n, "in_place": b, "params": ["name", ...]}, ...], params in
  // packing order; in_place: averaged in the gradients' own memory.
  std::string json() const {
    std::string out = "[";
    for (size_t b = 0; b < buckets_.size(); ++b) {
      out += (b ? ", " : "") + std::string("{\"bytes\": ") + std::to_string(buckets_[b].bytes) +
             ", \"in_place\": " + (buckets_[b].in_place ? "true" : "false") + ", \"params\": [";
      const std::vector<Slot>& slots = buckets_[b].slots;
      for (size_t k = 0; k < slots.size(); ++k)
        out += (k ? ", " : "") + json_quote(base_.host.param(slots[k].param).name);
      out += "]}";
    }
    return out + "]";
  }

 private:
  static constexpr size_t kNoBucket = SIZE_MAX;

  struct Slot {
    size_t param;   // table index
    size_t offset;  // bytes into the bucket's buffer
    size_t bytes;
  };
  // Where a parameter's gradient goes: buckets_[bucket].slots[slot].
  struct Place {
    size_t bucket = kNoBucket;  // kNoBucket: frozen
    size_t slot = 0;
  };
  struct BucketState {
    explicit BucketState(const ddp_host* host) : done(host) {}
    std::vector<Slot> slots;      // in packing order (reverse parameter order)
    std::vector<size_t> params;   // the slots' table indices, same order
    size_t bytes = 0;             // the slots' float32 bytes together
    bool in_place = false;        // the gradients lie as the slots would: no buffer, no copies
    plugin::DeviceBuffer buffer;  // else the slots' gradients back to back, float32
    plugin::DeviceBuffer wire;    // the same in the wire dtype (compress), else empty
    plugin::Event done;           // recorded on comm after the average (and copies back)
    size_t unfilled = 0;          // slots not yet filled (final) in this sync micro-batch
  };

  char* slot_memory(const Slot& slot) const { return static_cast<char*>(base_.host.param(slot.param).grad); }
  // The bucket's float32 buffer: its own, or the gradients' memory.
  char* buffer_of(const BucketState& b) const {
    return b.in_place ? slot_memory(b.slots.front()) : static_cast<char*>(b.buffer.get());
  }

  // Copies param i's gradient into its slot, on the compute stream where it
  // was made (nothing to copy where the bucket is the gradients' memory).
  void fill_slot(size_t i) {
    BucketState& b = buckets_[place_of_[i].bucket];
    const Slot& slot = b.slots[place_of_[i].slot];
    if (!b.in_place)
      base_.host.copy(buffer_of(b) + slot.offset, base_.host.param(i).grad, slot.bytes, base_.host.compute_stream());
    filled_[i] = 1;
    --b.unfilled;
  }

  // Launches every not-yet-launched bucket that is complete and has no
  // unlaunched bucket before it (the ordering invariant above).
  void launch_ready() {
    const plugin::Host& h = base_.host;
    for (; launched_ < buckets_.size() && buckets_[launched_].unfilled == 0; ++launched_) {
      BucketState& b = buckets_[launched_];
      char* buffer = buffer_of(b);
      base_.comm_after_compute();
      average(b);
      if (!b.in_place)
        for (const Slot& slot : b.slots)
          h.copy(h.param(slot.param).grad, buffer + slot.offset, slot.bytes, h.comm_stream());
      b.done.record(h.comm_stream());
    }
  }

  // Enqueues the average of bucket b's buffer over ranks on the comm stream:
  // in float32 (averaged within, then across), or (compress) divided by
  // the world size once, converted to the wire dtype, summed there within
  // and across, and converted back.
  void average(BucketState& b) const {
    const plugin::Host& h = base_.host;
    const ddp_buffer floats = h.floats(buffer_of(b), b.bytes / sizeof(float));
    if (wire_ == DDP_FLOAT32) {
      within_->all_reduce(floats, DDP_REDUCE_AVG, h.comm_stream());
      if (across_) across_->all_reduce(floats, DDP_REDUCE_AVG, h.comm_stream());
      return;
    }
    const ddp_buffer wire = h.buffer(b.wire.get(), floats.count, wire_);
    h.scale(floats, 1.0 / h.world_size(), h.comm_stream());
    h.convert(wire, floats, h.comm_stream());
    within_->all_reduce(wire, DDP_REDUCE_SUM, h.comm_stream());
    if (across_) across_->all_reduce(wire, DDP_REDUCE_SUM, h.comm_stream());
    h.convert(floats, wire, h.comm_stream());
  }

  const StrategyBase& base_;
  const plugin::Comm* within_;            // a bucket's first all-reduce: the strategy's comm, or a shard group's
  const plugin::Comm* across_ = nullptr;  // its second (the replica group's), or none
  ddp_dtype wire_ = DDP_FLOAT32;
  bool allow_in_place_ = true;
  std::vector<BucketState> buckets_;
  std::vector<Place> place_of_;  // (param_count) where each gradient goes
  std::vector<char> filled_;     // (param_count) 1: in its slot (final) this micro-batch
  size_t launched_ = 0;          // buckets [0, launched_) are on the comm stream
  bool syncing_ = false;         // inside the micro-batch with sync_grads = 1
};

}  // namespace strategy
}  // namespace ddp
