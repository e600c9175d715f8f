// partition.h — pure functions shared by strategy plugins (header-only, so a
// plugin stays one shared library that links nothing of the engine).
//
// partition_params: ZeRO stage 1's assignment of trainable parameters to the
// rank that keeps their optimizer state and runs their update. Size-balanced
// greedy (longest-processing-time first): parameters by size, largest first
// (ties: lower parameter index first), each to the least-loaded rank (ties:
// the lower rank). Frozen parameters belong to nobody (-1). The result
// depends only on sizes, flags and the world size, so every rank computes the
// same owners without communicating.
//
// Stable re-partition: given the previous owners (after a parameter was
// unfrozen mid-run), a parameter that already has an owner keeps it — its
// optimizer state lives there — and only the parameters without one are
// assigned, greedily, on top of the loads the kept ones make. A parameter
// that became frozen loses its owner.
//
// Greedy keeps the largest shard within (total / N) + the largest parameter;
// a stable re-partition keeps that bound only for what it assigns.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "buckets.h"  // ParamInfo

namespace ddp {
namespace strategy {

constexpr int kNoOwner = -1;

// Bytes each rank owns: shard_bytes[r] = sum of the sizes of the trainable
// parameters whose owner is r. `owners` is aligned with `params`.
inline std::vector<size_t> shard_bytes(const std::vector<ParamInfo>& params, const std::vector<int>& owners,
                                       int world_size) {
  if (world_size < 1) throw std::invalid_argument("shard_bytes: world_size must be >= 1");
  if (owners.size() != params.size()) throw std::invalid_argument("shard_bytes: owners and params differ in size");
  std::vector<size_t> bytes(static_cast<size_t>(world_size), 0);
  for (size_t k = 0; k < params.size(); ++k) {
    const int r = owners[k];
    if (r == kNoOwner || !params[k].trainable) continue;
    if (r < 0 || r >= world_size)
      throw std::invalid_argument("shard_bytes: owner " + std::to_string(r) + " is not a rank of a world of " +
                                  std::to_string(world_size));
    bytes[static_cast<size_t>(r)] += params[k].bytes;
  }
  return bytes;
}

// Largest shard over smallest; nullopt when a shard is empty (the ratio is
// then infinite: more ranks than parameters, or nothing trainable).
inline std::optional<double> largest_to_smallest(const std::vector<size_t>& shard_bytes) {
  if (shard_bytes.empty()) return std::nullopt;
  const auto [lo, hi] = std::minmax_element(shard_bytes.begin(), shard_bytes.end());
  if (*lo == 0) return std::nullopt;
  return static_cast<double>(*hi) / static_cast<double>(*lo);
}

// owners[k] = the rank that owns params[k], or kNoOwner when it is frozen.
// `previous`, if given, is aligned with `params` (kNoOwner where there was
// no owner): owners that are still trainable are kept.
inline std::vector<int> partition_params(const std::vector<ParamInfo>& params, int world_size,
                                         const std::vector<int>* previous = nullptr) {
  if (world_size < 1) throw std::invalid_argument("partition_params: world_size must be >= 1");
  if (previous && previous->size() != params.size())
    throw std::invalid_argument("partition_params: previous owners and params differ in size");
  std::vector<int> owners(params.size(), kNoOwner);
  std::vector<size_t> load(static_cast<size_t>(world_size), 0);
  std::vector<size_t> todo;  // positions in `params` still to assign
  for (size_t k = 0; k < params.size(); ++k) {
    if (!params[k].trainable) continue;
    const int before = previous ? (*previous)[k] : kNoOwner;
    if (before != kNoOwner) {
      if (before < 0 || before >= world_size)
        throw std::invalid_argument("partition_params: previous owner " + std::to_string(before) +
                                    " is not a rank of a world of " + std::to_string(world_size));
      owners[k] = before;
      load[static_cast<size_t>(before)] += params[k].bytes;
    } else {
      todo.push_back(k);
    }
  }
  std::sort(todo.begin(), todo.end(), [&](size_t a, size_t b) {
    if (params[a].bytes != params[b].bytes) return params[a].bytes > params[b].bytes;
    return params[a].index < params[b].index;
  });
  for (size_t k : todo) {
    // min_element returns the first minimum: the lower rank on ties.
    const size_t r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    owners[k] = static_cast<int>(r);
    load[r] += params[k].bytes;
  }
  return owners;
}

}  // namespace strategy
}  // namespace ddp
