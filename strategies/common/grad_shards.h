// grad_shards.h — ZeRO stage 2's layout of gradients (the `sharded`
// strategy, stage = 2), as pure functions: every rank computes the same
// layout from the units, the parameters' sizes and flags, the world size
// and the cap, without communicating. Header-only, so a plugin stays one
// shared library that links nothing of the engine.
//
// BUCKETS. The units are walked in backward order (the last unit first);
// each unit's trainable parameters, in reverse table order (the order
// backward finishes them), fill the current bucket while it stays within
// `cap` elements; a unit never spans two buckets, and a unit larger than
// the cap has a bucket of its own. A bucket's gradients are written by the
// backward of its units (and of units that read its tied parameters), so
// it is OPEN from the first of those units' backward to the last: the
// strategy binds its gradient storage when it opens and reduce-scatters it
// when it closes, at that unit's BACKWARD_END.
//
// SHARDS. A bucket of E elements is split into N chunks of c elements, c =
// ceil(E / N) rounded up to `align` elements, so that the reduce-scatter
// of its N x c elements (the tail zero) leaves chunk r on rank r. Rank r
// owns the elements of chunk r of every bucket: element ranges of the
// parameters, which may start or end inside one. Its shard holds its
// chunks back to back: sum of c over buckets, the same on every rank.
// Real elements per rank differ by less than N x align per bucket.
//
// THE RING. Open buckets live in one ring of device memory. Buckets are
// placed in the order they open, each after the one before, or at the
// start where it would pass the end. Two buckets that are open at once
// never share memory (the ring grows until none do); a bucket that reuses
// the memory of one that closed before it opens waits for that one's
// reduce-scatter first. The ring starts at the larger of the cap and the
// largest bucket, never more than all buckets together: at most one cap of
// full gradients (or the largest bucket) at a time, plus the shard.
//
// UNFREEZING keeps the layout stable: the buckets already laid out keep
// their parameters and chunks (the optimizer's state lives with those
// element ranges), and parameters that became trainable get new buckets
// after them, laid out by the same rule.
#pragma once

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp {
namespace strategy {

struct ShardUnit {
  std::vector<size_t> params;  // owned, ascending table indices
  std::vector<size_t> tied;    // read too, owned by another unit
};

struct ShardParam {
  size_t elements = 0;
  bool trainable = false;
};

// One parameter's slice that a rank owns.
struct OwnedRange {
  size_t param = 0;
  size_t offset = 0;  // first element of the parameter
  size_t count = 0;
  size_t shard = 0;  // where it lies in the rank's shard
};

struct ShardBucket {
  std::vector<size_t> params;  // table indices, in slot order
  std::vector<size_t> slots;   // element offset of each in the bucket
  size_t elements = 0;         // E: sum of their sizes
  size_t chunk = 0;            // c: elements per rank
  size_t padded() const { return chunk * ranks; }
  size_t ranks = 1;  // N
  size_t shard = 0;  // where its chunk lies in every rank's shard
  size_t open = 0;   // the backward position (0: the last unit) it is open from
  size_t close = 0;  // and the one it is open to
  size_t ring = 0;   // element offset in the ring
};

// Whether two buckets' ring memory overlaps (a bucket shares its own: its
// previous micro-batch's). One that opens waits for the reduce-scatter of
// every bucket in flight that shares its memory. Pure.
inline bool share_memory(const ShardBucket& a, const ShardBucket& b) {
  return a.ring < b.ring + b.padded() && b.ring < a.ring + a.padded();
}

struct ShardLayout {
  std::vector<ShardBucket> buckets;
  size_t shard_elements = 0;  // sum of chunks
  size_t ring_elements = 0;   // the ring's size
  // Per backward position: bucket indices, ascending.
  std::vector<std::vector<size_t>> opens_at;
  std::vector<std::vector<size_t>> closes_at;
};

inline size_t round_up(size_t n, size_t to) { return to == 0 ? n : (n + to - 1) / to * to; }

namespace detail {

// New buckets for the trainable parameters of `units` not in `taken`.
inline void add_buckets(ShardLayout& layout, const std::vector<ShardUnit>& units, const std::vector<ShardParam>& params,
                        const std::vector<bool>& taken, size_t cap) {
  bool fresh = true;  // the next unit starts a new bucket
  for (size_t u = units.size(); u-- > 0;) {
    std::vector<size_t> mine;
    size_t size = 0;
    for (auto it = units[u].params.rbegin(); it != units[u].params.rend(); ++it)
      if (params[*it].trainable && !taken[*it]) {
        mine.push_back(*it);
        size += params[*it].elements;
      }
    if (mine.empty()) continue;
    if (fresh || layout.buckets.back().elements + size > cap) layout.buckets.emplace_back();
    fresh = false;
    ShardBucket& b = layout.buckets.back();
    for (size_t i : mine) {
      b.params.push_back(i);
      b.slots.push_back(b.elements);
      b.elements += params[i].elements;
    }
  }
}

// Each bucket's open and close positions: the backward positions of the
// units that own or read its parameters.
inline void open_and_close(ShardLayout& layout, const std::vector<ShardUnit>& units, size_t param_count) {
  std::vector<size_t> first(param_count, SIZE_MAX);
  std::vector<size_t> last(param_count, 0);
  for (size_t u = 0; u < units.size(); ++u) {
    const size_t pos = units.size() - 1 - u;  // backward order
    for (const auto* list : {&units[u].params, &units[u].tied})
      for (size_t i : *list) {
        first[i] = std::min(first[i], pos);
        last[i] = std::max(last[i], pos);
      }
  }
  for (ShardBucket& b : layout.buckets) {
    b.open = SIZE_MAX;
    b.close = 0;
    for (size_t i : b.params) {
      b.open = std::min(b.open, first[i]);
      b.close = std::max(b.close, last[i]);
    }
  }
  layout.opens_at.assign(units.size(), {});
  layout.closes_at.assign(units.size(), {});
  for (size_t k = 0; k < layout.buckets.size(); ++k) {
    layout.opens_at[layout.buckets[k].open].push_back(k);
    layout.closes_at[layout.buckets[k].close].push_back(k);
  }
}

// Places the buckets in a ring of `size` elements; false where two open at
// once would share memory. A sweep in open order against the buckets still
// open: O(buckets x open at once), not every pair (stage 3's one bucket per
// unit of a deep model: tens of thousands, all in one slot).
inline bool place(ShardLayout& layout, size_t size) {
  std::vector<size_t> order(layout.buckets.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return layout.buckets[a].open < layout.buckets[b].open; });
  size_t cursor = 0;
  std::vector<size_t> open;  // placed buckets that may still be open
  for (size_t k : order) {
    ShardBucket& b = layout.buckets[k];
    if (cursor + b.padded() > size) cursor = 0;
    b.ring = cursor;
    cursor += b.padded();
    open.erase(std::remove_if(open.begin(), open.end(), [&](size_t x) { return layout.buckets[x].close < b.open; }),
               open.end());
    for (size_t x : open)
      if (share_memory(layout.buckets[x], b)) return false;
    open.push_back(k);
  }
  return true;
}

}  // namespace detail

// The layout for `units` (forward order) over `params` (the table), on
// `ranks` ranks, buckets of at most `cap` elements, chunks a multiple of
// `align` elements. `previous` (if given): the buckets to keep, in order
// (unfreezing). Throws std::invalid_argument for inconsistent input.
inline ShardLayout shard_layout(const std::vector<ShardUnit>& units, const std::vector<ShardParam>& params,
                                size_t ranks, size_t cap, size_t align,
                                const std::vector<std::vector<size_t>>* previous = nullptr) {
  if (ranks < 1) throw std::invalid_argument("shard_layout: ranks must be >= 1");
  if (units.empty()) throw std::invalid_argument("shard_layout: the model declares no units");
  ShardLayout layout;
  std::vector<bool> taken(params.size(), false);
  for (const auto& kept : previous ? *previous : std::vector<std::vector<size_t>>()) {
    ShardBucket b;
    for (size_t i : kept) {
      if (i >= params.size()) throw std::invalid_argument("shard_layout: a kept bucket names no parameter");
      b.params.push_back(i);
      b.slots.push_back(b.elements);
      b.elements += params[i].elements;
      taken[i] = true;
    }
    layout.buckets.push_back(std::move(b));
  }
  detail::add_buckets(layout, units, params, taken, std::max<size_t>(cap, 1));
  size_t total = 0;
  size_t largest = 0;
  for (ShardBucket& b : layout.buckets) {
    b.ranks = ranks;
    b.chunk = round_up((b.elements + ranks - 1) / ranks, align);
    b.shard = layout.shard_elements;
    layout.shard_elements += b.chunk;
    total += b.padded();
    largest = std::max(largest, b.padded());
  }
  detail::open_and_close(layout, units, params.size());
  size_t ring = std::min(total, std::max(round_up(std::min(cap, total), align * ranks), largest));
  while (!detail::place(layout, ring)) ring = std::min(total, ring + largest);
  layout.ring_elements = layout.buckets.empty() ? 0 : ring;
  return layout;
}

// The ranges rank `rank` owns, bucket by bucket, in slot order.
inline std::vector<OwnedRange> owned_ranges(const ShardLayout& layout, const std::vector<ShardParam>& params,
                                            size_t rank) {
  std::vector<OwnedRange> out;
  for (const ShardBucket& b : layout.buckets) {
    const size_t lo = rank * b.chunk;
    const size_t hi = std::min(lo + b.chunk, b.elements);
    for (size_t k = 0; k < b.params.size(); ++k) {
      const size_t start = b.slots[k];
      const size_t end = start + params[b.params[k]].elements;
      const size_t from = std::max(start, lo);
      const size_t to = std::min(end, hi);
      if (from < to) out.push_back({b.params[k], from - start, to - from, b.shard + (from - lo)});
    }
  }
  return out;
}

}  // namespace strategy
}  // namespace ddp
