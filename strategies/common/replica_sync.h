// replica_sync.h — what the strategies whose replicas differ between sync
// points (localsgd, diloco: DDP_CAP_DIVERGENT) share: every parameter's
// values laid out back to back in table order (a slot per parameter, so a
// copy of the model is one buffer), the period that says which steps are
// sync points, and an average over ranks of spans of float32 memory in one
// all-reduce. Header-only, on the public ABI and strategy_util.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "strategy_util.h"

namespace ddp {
namespace strategy {

// A span of float32 elements on the run's device.
struct Span {
  float* ptr;
  size_t count;
};

// Where each parameter's values start in a buffer of them all, in table
// order, and the total; every parameter float32 (else refused by name).
struct ModelSlots {
  std::vector<size_t> offset;
  size_t total = 0;
};
inline ModelSlots model_slots(const plugin::Host& host) {
  ModelSlots slots;
  for (size_t i = 0; i < host.param_count(); ++i) {
    slots.offset.push_back(slots.total);
    slots.total += StrategyBase::float32_elements(host.param(i));
  }
  return slots;
}

// A strategy's `period` key: required, >= 1 (steps between sync points).
inline int64_t period_key(const plugin::Host& host, const char* strategy) {
  const int64_t period = host.config_int("period", 0);
  if (period < 1)
    throw plugin::Failure(DDP_ERR_INVALID_ARGUMENT,
                          std::string("strategy.period: ") + strategy +
                              " needs the number of steps between sync points, an integer >= 1" +
                              (period == 0 ? " (the key is required)" : ", not " + std::to_string(period)));
  return period;
}

// Runs `collective` (given the buffer, on the comm stream) over `spans`
// as one buffer, after what compute has enqueued so far: where they lie
// back to back, in place; otherwise copied into `staging` (room for them
// all), through it and copied back. Blocking. The same spans on every
// rank, in the same order.
template <typename Collective>
void over_spans(const StrategyBase& s, const std::vector<Span>& spans, float* staging, Collective&& collective) {
  size_t total = 0;
  bool packed = true;
  for (const Span& span : spans) {
    packed &= total == 0 || span.ptr == spans.front().ptr + total;
    total += span.count;
  }
  if (total == 0) return;
  const plugin::Host& h = s.host;
  if (packed) {
    s.comm_after_compute();
    collective(h.floats(spans.front().ptr, total));
    s.wait_comm();
    return;
  }
  size_t at = 0;
  for (const Span& span : spans) {
    h.copy(staging + at, span.ptr, span.count * sizeof(float), h.compute_stream());
    at += span.count;
  }
  s.comm_after_compute();
  collective(h.floats(staging, total));
  at = 0;
  for (const Span& span : spans) {
    h.copy(span.ptr, staging + at, span.count * sizeof(float), h.comm_stream());
    at += span.count;
  }
  s.wait_comm();
}

// Averages `spans` over ranks in one all-reduce (over_spans).
inline void average_spans(const StrategyBase& s, const std::vector<Span>& spans, float* staging) {
  over_spans(s, spans, staging,
             [&](const ddp_buffer& buf) { s.comm.all_reduce(buf, DDP_REDUCE_AVG, s.host.comm_stream()); });
}

// Rank 0's values of `spans` on every rank, in one broadcast (over_spans).
// At set-up, over the whole model: the largest collective the strategy
// issues, so a transport that stages collectives (gloo on a GPU) sizes its
// buffers there, not at the first sync point.
inline void broadcast_spans(const StrategyBase& s, const std::vector<Span>& spans, float* staging) {
  over_spans(s, spans, staging, [&](const ddp_buffer& buf) { s.comm.broadcast(buf, 0, s.host.comm_stream()); });
}

// Whether step `info` is the run's last: a strategy whose replicas differ
// between sync points ends the run with one, so that weights.safetensors
// (rank 0's) is every rank's model.
inline bool last_step(const ddp_step_info* info) { return info->step + 1 == info->total_steps; }

// The trainable gradients in reverse table order (as the engine packs
// them: then in place), to average as DDP does.
inline std::vector<Span> trainable_grads(const plugin::Host& host) {
  std::vector<Span> spans;
  for (size_t i = host.param_count(); i-- > 0;) {
    const ddp_param& p = host.param(i);
    if (p.trainable) spans.push_back({static_cast<float*>(p.grad), StrategyBase::float32_elements(p)});
  }
  return spans;
}

// The values of the parameters `which` names (by table index), in table
// order.
inline std::vector<Span> values_of(const plugin::Host& host, const std::vector<bool>& which) {
  std::vector<Span> spans;
  for (size_t i = 0; i < host.param_count(); ++i) {
    const ddp_param& p = host.param(i);
    if (which[i]) spans.push_back({static_cast<float*>(p.data), StrategyBase::float32_elements(p)});
  }
  return spans;
}

}  // namespace strategy
}  // namespace ddp
