// grad_span.h — the gradients a rank holds, as the store hands them to the
// trainer (clipping, the norm, the optimizer): plain spans of device memory,
// whoever owns the storage. Neutral types: no behaviour.
#pragma once

#include <cstddef>

#include <ddp/plugin.h>

namespace ddp {

// Gradient values a rank holds: `count` floats at `grad` on the device,
// elements of parameter `param` (all of it where `whole`), held by
// `replicas` ranks, this one included (the strategy's held_grads,
// grad_ranges or held_ranges: 1 for a shard held once, the world size
// for a gradient every rank holds).
struct GradSpan {
  size_t param = 0;
  float* grad = nullptr;
  size_t count = 0;
  bool whole = true;
  int replicas = 1;
  size_t offset = 0;  // its first element in the parameter
};

// A strategy's grad_ranges (1.4): the ranges of the gradient storage it
// claimed.
struct GradRanges {
  const ddp_range* ranges = nullptr;
  size_t count = 0;
  bool partitioned = false;  // each element on one rank only
};

}  // namespace ddp
