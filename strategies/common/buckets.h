// buckets.h — pure functions shared by strategy plugins (header-only, so a
// plugin stays one shared library that links nothing of the engine).
//
// assign_buckets: PyTorch DDP's bucketing (c10d Reducer): trainable
// parameters, in reverse parameter order (roughly the order backward makes
// their gradients final), are packed into buckets of at most `cap_bytes`.
// A parameter larger than the cap gets a bucket of its own. Frozen
// parameters are skipped. The result depends only on sizes and the cap, so
// every rank computes the same buckets (how they are launched, and the
// ordering invariant: bucket_sync.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ddp {
namespace strategy {

// Defaults are named, with units (c10d's kDefaultBucketBytesCap is 25 MiB).
constexpr double kDefaultBucketMiB = 25.0;

// The bytes of a cap of `mib` MiB (a finite number > 0; callers check):
// at least 1, at most SIZE_MAX.
inline size_t cap_bytes_of_mib(double mib) {
  const double bytes = mib * 1024.0 * 1024.0;
  if (bytes >= static_cast<double>(SIZE_MAX)) return SIZE_MAX;
  return bytes < 1.0 ? 1 : static_cast<size_t>(bytes);
}

struct ParamInfo {
  size_t index;  // position in the host's parameter table
  size_t bytes;  // gradient size
  bool trainable;
};

struct Bucket {
  std::vector<size_t> params;  // table indices, in the order they were packed
  size_t bytes = 0;            // sum of their sizes
};

inline std::vector<Bucket> assign_buckets(const std::vector<ParamInfo>& params, size_t cap_bytes) {
  std::vector<Bucket> buckets;
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    if (!it->trainable) continue;
    const bool fits =
        !buckets.empty() && !buckets.back().params.empty() && buckets.back().bytes + it->bytes <= cap_bytes;
    if (!fits) buckets.emplace_back();
    buckets.back().params.push_back(it->index);
    buckets.back().bytes += it->bytes;
  }
  return buckets;
}

}  // namespace strategy
}  // namespace ddp
