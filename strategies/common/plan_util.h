// plan_util.h — what the shipped strategies' plan entries (ABI 1.4,
// ddp/abi/plan.h) share: the parameter table as ParamInfos, and the
// all-reduces and buffers of buckets as bucket_sync.h makes them.
// Header-only; throws ddp::plugin::Failure.
#pragma once

#include <cstddef>
#include <vector>

#include "buckets.h"
#include "strategy_util.h"

namespace ddp {
namespace strategy {

// Every parameter of the table: index, float32 gradient bytes, trainable.
inline std::vector<ParamInfo> param_infos(const plugin::Host& h) {
  std::vector<ParamInfo> infos;
  for (size_t i = 0; i < h.param_count(); ++i) {
    const ddp_param& p = h.param(i);
    infos.push_back({i, StrategyBase::float32_bytes(p), p.trainable != 0});
  }
  return infos;
}

// Each bucket's all-reduce (of its elements, in `wire`), beside compute but
// the last (and the last too where `last_beside` and there are others),
// and the buffers BucketSync makes for them, from set-up on: a float32 one
// unless averaged in place (the engine packs the gradients so that every
// bucket can be), and a 16-bit one for a compressed wire.
inline void plan_buckets(const plugin::Plan& plan, const std::vector<ParamInfo>& infos, size_t cap_bytes,
                         ddp_dtype wire, bool in_place, bool last_beside) {
  const std::vector<Bucket> buckets = assign_buckets(infos, cap_bytes);
  for (size_t k = 0; k < buckets.size(); ++k) {
    const size_t elements = buckets[k].bytes / sizeof(float);
    if (!in_place) plan.buffer(DDP_MEM_COMM_BUFFERS, buckets[k].bytes);
    if (wire != DDP_FLOAT32) plan.buffer(DDP_MEM_COMM_BUFFERS, elements * ddp_dtype_size(wire));
    const bool last = k + 1 == buckets.size();
    plan.collective(DDP_OP_ALL_REDUCE, elements, wire, !last || (last_beside && buckets.size() > 1));
  }
}

}  // namespace strategy
}  // namespace ddp
