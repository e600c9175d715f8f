// bucketed.cpp — the `bucketed` strategy, as in CS336 assignment 2's DDP
// with bucketed gradients (PyTorch DDP's c10d Reducer): rank 0's parameters
// are broadcast at the start; trainable parameters are packed, in reverse
// parameter order, into buckets of at most `bucket_mb` MiB, each with its
// own flat comm buffer. During the sync micro-batch's backward each
// gradient is copied into its bucket slot the moment it is final; a bucket
// whose slots are all filled is all-reduced (average) on the comm stream
// while backward goes on, then copied back into the gradients. Fewer,
// larger collectives than `overlap`, still overlapped with backward.
// Frozen parameters are never touched. Keys: bucket_mb.
//
// Order: buckets launch strictly in index order (one complete early waits
// for all lower-indexed ones), so every rank issues the same collectives in
// the same order whatever the timing.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../common/buckets.h"
#include "../common/strategy_util.h"

using ddp::plugin::DeviceBuffer;
using ddp::plugin::Failure;
using ddp::plugin::Host;
using ddp::plugin::guard;
using ddp::strategy::StrategyBase;

namespace {

constexpr size_t kNoBucket = SIZE_MAX;

struct Slot {
  size_t param;   // table index
  size_t offset;  // bytes into the bucket's buffer
  size_t bytes;
};

// Where a parameter's gradient goes: buckets[bucket].slots[slot].
struct Place {
  size_t bucket = kNoBucket;  // kNoBucket: frozen
  size_t slot = 0;
};

struct BucketState {
  std::vector<Slot> slots;  // in packing order (reverse parameter order)
  DeviceBuffer buffer;      // (sum of slot bytes) float32, the slots' gradients back to back
  size_t unfilled = 0;      // slots not yet copied in during this sync micro-batch
};

}  // namespace

struct ddp_strategy_s : StrategyBase {
  ddp_strategy_s(const ddp_host* h, const ddp_transport_v1_t* t, ddp_comm* c, double mib)
      : StrategyBase(h, t, c), bucket_mb(mib) {}
  double bucket_mb;
  std::vector<BucketState> buckets;
  std::vector<Place> place_of;    // (param_count) where each gradient goes
  std::vector<char> filled;       // (param_count) 1: copied into its slot this micro-batch
  size_t launched = 0;            // buckets [0, launched) are on the comm stream
  bool syncing = false;           // inside the micro-batch with sync_grads = 1
};

namespace {

// Shortest text that reads back as the same double ("0.001", "25").
std::string number(double x) {
  char text[32];
  return std::string(text, std::to_chars(text, text + sizeof text, x).ptr);
}

size_t cap_bytes(double mib) {
  const double bytes = mib * 1024.0 * 1024.0;
  return bytes >= double(SIZE_MAX) ? SIZE_MAX : size_t(bytes);
}

// At train begin and whenever the trainable set changes (between steps:
// finish has waited for the comm stream, so no enqueued work still uses the
// old buffers when they are freed). Depends only on sizes and the cap, so
// every rank lays out the same buckets.
void lay_out(ddp_strategy* s) {
  const Host& h = s->host;
  std::vector<ddp::strategy::ParamInfo> infos;
  for (size_t i = 0; i < h.param_count(); ++i) {
    const ddp_param& p = h.param(i);
    infos.push_back({i, p.trainable ? StrategyBase::float32_bytes(p) : 0, p.trainable != 0});
  }
  s->buckets.clear();  // free first: old and new never count together
  s->place_of.assign(h.param_count(), Place{});
  const size_t cap = cap_bytes(s->bucket_mb);
  for (const ddp::strategy::Bucket& assigned : ddp::strategy::assign_buckets(infos, cap)) {
    BucketState b;
    size_t offset = 0;
    for (size_t i : assigned.params) {
      s->place_of[i] = Place{s->buckets.size(), b.slots.size()};
      b.slots.push_back({i, offset, infos[i].bytes});
      offset += infos[i].bytes;
    }
    b.buffer = DeviceBuffer(h.raw(), assigned.bytes, DDP_MEM_COMM_BUFFERS);
    s->buckets.push_back(std::move(b));
  }
}

// Copies param i's gradient into its slot, on the compute stream where it
// was made.
void fill_slot(ddp_strategy* s, size_t i) {
  BucketState& b = s->buckets[s->place_of[i].bucket];
  const Slot& slot = b.slots[s->place_of[i].slot];
  s->host.copy(static_cast<char*>(b.buffer.get()) + slot.offset, s->host.param(i).grad, slot.bytes,
               s->host.compute_stream());
  s->filled[i] = 1;
  --b.unfilled;
}

// Launches every not-yet-launched bucket that is complete and has no
// unlaunched bucket before it: comm waits for compute (the slot copies),
// all-reduces the buffer, copies it back into the gradients.
void launch_ready_buckets(ddp_strategy* s) {
  const Host& h = s->host;
  for (; s->launched < s->buckets.size() && s->buckets[s->launched].unfilled == 0; ++s->launched) {
    BucketState& b = s->buckets[s->launched];
    char* buffer = static_cast<char*>(b.buffer.get());
    s->comm_after_compute();
    s->comm.all_reduce(h.floats(buffer, b.buffer.bytes() / sizeof(float)), DDP_REDUCE_AVG, h.comm_stream());
    for (const Slot& slot : b.slots)
      h.copy(h.param(slot.param).grad, buffer + slot.offset, slot.bytes, h.comm_stream());
  }
}

ddp_status bucketed_create(const ddp_host* host, const ddp_transport_v1_t* transport, ddp_comm* comm,
                           ddp_strategy** out) {
  return guard(host, [&] {
    const double mib = Host(host).config_float("bucket_mb", ddp::strategy::kDefaultBucketMiB);
    if (!(mib > 0) || !std::isfinite(mib))
      throw Failure(DDP_ERR_INVALID_ARGUMENT, "strategy.bucket_mb = " + number(mib) +
                                                  ": must be a finite number of MiB > 0 (default " +
                                                  number(ddp::strategy::kDefaultBucketMiB) + ")");
    *out = new ddp_strategy_s(host, transport, comm, mib);
  });
}

ddp_status bucketed_on_train_begin(ddp_strategy* s) {
  return guard(s->host.raw(), [&] {
    s->broadcast_params_from_rank0();
    lay_out(s);
  });
}

// Gradient accumulation: only the micro-batch with sync_grads communicates;
// the others only add into the gradients.
ddp_status bucketed_on_step_begin(ddp_strategy* s, const ddp_step_info* info) {
  return guard(s->host.raw(), [&] {
    if (info->params_changed) lay_out(s);
    s->syncing = info->sync_grads != 0;
    if (!s->syncing) return;
    s->filled.assign(s->host.param_count(), 0);
    for (BucketState& b : s->buckets) b.unfilled = b.slots.size();
    s->launched = 0;
  });
}

ddp_status bucketed_on_grad_ready(ddp_strategy* s, const ddp_param* param) {
  return guard(s->host.raw(), [&] {
    if (!s->syncing) return;
    const size_t i = param->index;
    if (s->place_of.at(i).bucket == kNoBucket)
      throw Failure(DDP_ERR_INVALID_ARGUMENT, std::string("on_grad_ready for '") + param->name +
                                                  "', which is in no bucket (frozen?)");
    if (s->filled[i])
      throw Failure(DDP_ERR_INVALID_ARGUMENT, std::string("on_grad_ready for '") + param->name +
                                                  "' twice in one micro-batch");
    fill_slot(s, i);
    launch_ready_buckets(s);
  });
}

// Trainable parameters the model did not use never fire; their gradients
// (zero) still go into their slots, and every remaining bucket launches, in
// index order.
ddp_status bucketed_on_backward_end(ddp_strategy* s) {
  return guard(s->host.raw(), [&] {
    if (!s->syncing) return;
    for (size_t b = s->launched; b < s->buckets.size(); ++b)
      for (const Slot& slot : s->buckets[b].slots)
        if (!s->filled[slot.param]) fill_slot(s, slot.param);
    launch_ready_buckets(s);
    s->syncing = false;
  });
}

ddp_status bucketed_finish(ddp_strategy* s) {
  return guard(s->host.raw(), [&] { s->wait_comm(); });
}

// JSON string literal (parameter names are plain, but never trust that).
std::string quoted(const char* text) {
  std::string out = "\"";
  for (const char* c = text; *c; ++c) {
    if (*c == '"' || *c == '\\') {
      out += '\\';
      out += *c;
    } else if (static_cast<unsigned char>(*c) < 0x20) {
      char escape[8];
      std::snprintf(escape, sizeof escape, "\\u%04x", static_cast<unsigned>(*c));
      out += escape;
    } else {
      out += *c;
    }
  }
  return out + "\"";
}

// {"bucket_mb": x, "buckets": [{"bytes": n, "params": ["name", ...]}, ...]}
ddp_status bucketed_stats(ddp_strategy* s, char* buf, size_t cap, size_t* needed) {
  return guard(s->host.raw(), [&] {
    std::string json = "{\"bucket_mb\": " + number(s->bucket_mb) + ", \"buckets\": [";
    for (size_t b = 0; b < s->buckets.size(); ++b) {
      json += (b ? ", " : "") + std::string("{\"bytes\": ") + std::to_string(s->buckets[b].buffer.bytes()) +
              ", \"params\": [";
      const std::vector<Slot>& slots = s->buckets[b].slots;
      for (size_t k = 0; k < slots.size(); ++k)
        json += (k ? ", " : "") + quoted(s->host.param(slots[k].param).name);
      json += "]}";
    }
    json += "]}";
    *needed = json.size();
    if (cap == 0) return;
    const size_t n = std::min(json.size(), cap - 1);
    std::memcpy(buf, json.data(), n);
    buf[n] = '\0';
  });
}

void bucketed_destroy(ddp_strategy* s) { delete s; }

}  // namespace

extern "C" DDP_PLUGIN_EXPORT const ddp_strategy_v1_t ddp_strategy_v1;
extern "C" const ddp_strategy_v1_t ddp_strategy_v1 = {
    DDP_ABI_VERSION,
    sizeof(ddp_strategy_v1_t),
    "bucketed",
    "0.1.0",
    DDP_CAP_DEVICE_CPU | DDP_CAP_DEVICE_CUDA,
    bucketed_create,
    bucketed_on_train_begin,
    bucketed_on_step_begin,
    bucketed_on_grad_ready,
    bucketed_on_backward_end,
    bucketed_finish,
    nullptr,  // optimizer_step: the engine's optimizer runs
    bucketed_stats,
    bucketed_destroy,
};
