// gather_schedule.h — ZeRO stage 3's (FSDP's) order of parameter gathers
// and releases over the unit hooks, as a pure function: every rank
// computes the same schedule from the units alone, so every rank issues
// the same all-gathers in the same order. Header-only, as grad_shards.h.
//
// POSITIONS. One micro-batch visits 2U positions: forward of unit p for p
// < U, then backward of unit 2U-1-p. A position NEEDS the full copy of its
// unit's parameters and of every unit owning a parameter it reads (tied).
//
// AT A POSITION'S BEGIN (on_unit(..., FORWARD_BEGIN / BACKWARD_BEGIN)):
// - `gather`: all-gathers to issue on the comm stream, in this order:
//   first the needed units that are neither held nor in flight, then
//   PREFETCHES, the units the next positions need, in the order they are
//   needed, while fewer than `prefetch` units are in flight for later
//   positions (FSDP's forward and backward prefetch, limited as its
//   limit_all_gathers);
// - `wait`: the needed units whose gather is in flight: the compute stream
//   waits for them (their event) before the unit runs; they are held from
//   then on.
// AT ITS END: `release`: the needed units to free (after the unit's
// compute): those needed nowhere later in the micro-batch, and those whose
// next use is not the very next position, except, with
// `reshard_after_forward` false, after a forward position (then the copy is
// kept until backward, FSDP's reshard_after_forward = False). A unit whose
// backward follows its forward directly (the last) is never released in
// between. Nothing is held after the last position.
#pragma once

#include <algorithm>
#include <cstddef>
#include <set>
#include <stdexcept>
#include <vector>

#include "grad_shards.h"  // ShardUnit

namespace ddp {
namespace strategy {

struct GatherHook {
  std::vector<size_t> gather;   // units to all-gather now, in this order
  std::vector<size_t> wait;     // units the compute stream waits for, ascending
  std::vector<size_t> release;  // units to free after the unit's compute, ascending
};

struct GatherSchedule {
  std::vector<GatherHook> begin;           // per position
  std::vector<GatherHook> end;             // per position
  std::vector<std::vector<size_t>> needs;  // per position: the units it reads, ascending
  size_t gathers = 0;                      // all-gathers per micro-batch
  size_t peak_units = 0;                   // most units held or in flight at once
  size_t peak_elements = 0;                // the same in elements (unit_elements)
};

// The unit at position p of U units.
inline size_t unit_at(size_t p, size_t units) { return p < units ? p : 2 * units - 1 - p; }

// Per unit, the units whose parameters it reads: itself and the owners of
// its tied parameters, ascending. Throws std::invalid_argument where a tied
// parameter has no owner.
inline std::vector<std::vector<size_t>> units_read(const std::vector<ShardUnit>& units) {
  std::vector<size_t> owner;
  for (size_t u = 0; u < units.size(); ++u)
    for (size_t i : units[u].params) {
      if (i >= owner.size()) owner.resize(i + 1, SIZE_MAX);
      owner[i] = u;
    }
  std::vector<std::vector<size_t>> out(units.size());
  for (size_t u = 0; u < units.size(); ++u) {
    std::set<size_t> read{u};
    for (size_t i : units[u].tied) {
      if (i >= owner.size() || owner[i] == SIZE_MAX)
        throw std::invalid_argument("gather_schedule: a unit reads a parameter no unit owns");
      read.insert(owner[i]);
    }
    out[u].assign(read.begin(), read.end());
  }
  return out;
}

namespace detail {

// Per position p, per unit of needs[p] (in its order): the first position
// after p that needs it too, or SIZE_MAX. One pass from the end.
inline std::vector<std::vector<size_t>> next_uses(const std::vector<std::vector<size_t>>& needs, size_t units) {
  std::vector<std::vector<size_t>> next(needs.size());
  std::vector<size_t> seen(units, SIZE_MAX);
  for (size_t p = needs.size(); p-- > 0;) {
    for (size_t x : needs[p]) next[p].push_back(seen[x]);
    for (size_t x : needs[p]) seen[x] = p;
  }
  return next;
}

struct GatherState {
  std::set<size_t> held;
  std::set<size_t> in_flight;
  size_t elements = 0;  // of the units in either
  bool has(size_t x) const { return held.count(x) || in_flight.count(x); }
};

// The gathers to issue at position p's begin: the needed ones, then
// prefetches while fewer than `prefetch` later units are in flight.
inline void issue(GatherSchedule& s, GatherState& st, size_t p, size_t prefetch,
                  const std::vector<size_t>& unit_elements) {
  GatherHook& hook = s.begin[p];
  auto start = [&](size_t x) {
    hook.gather.push_back(x);
    st.in_flight.insert(x);
    st.elements += unit_elements.empty() ? 0 : unit_elements[x];
  };
  for (size_t x : s.needs[p])
    if (!st.has(x)) start(x);
  auto later_in_flight = [&] {
    size_t n = 0;
    for (size_t x : st.in_flight) n += !std::binary_search(s.needs[p].begin(), s.needs[p].end(), x);
    return n;
  };
  for (size_t q = p + 1; q < s.needs.size() && later_in_flight() < prefetch; ++q)
    for (size_t x : s.needs[q])
      if (!st.has(x) && later_in_flight() < prefetch) start(x);
}

}  // namespace detail

// The schedule for `units` (forward order), with at most `prefetch` units
// in flight ahead of the one computing; `unit_elements` (one per unit, or
// empty) sizes peak_elements. Throws std::invalid_argument for a model
// without units or with a tied parameter no unit owns.
inline GatherSchedule gather_schedule(const std::vector<ShardUnit>& units, size_t prefetch, bool reshard_after_forward,
                                      const std::vector<size_t>& unit_elements = {}) {
  if (units.empty()) throw std::invalid_argument("gather_schedule: the model declares no units");
  if (!unit_elements.empty() && unit_elements.size() != units.size())
    throw std::invalid_argument("gather_schedule: unit_elements must give one size per unit");
  const size_t n = units.size();
  const size_t positions = 2 * n;
  const std::vector<std::vector<size_t>> read = units_read(units);
  GatherSchedule s;
  s.begin.resize(positions);
  s.end.resize(positions);
  for (size_t p = 0; p < positions; ++p) s.needs.push_back(read[unit_at(p, n)]);
  const std::vector<std::vector<size_t>> next_use = detail::next_uses(s.needs, n);
  detail::GatherState st;
  for (size_t p = 0; p < positions; ++p) {
    detail::issue(s, st, p, prefetch, unit_elements);
    s.gathers += s.begin[p].gather.size();
    s.peak_units = std::max(s.peak_units, st.held.size() + st.in_flight.size());
    s.peak_elements = std::max(s.peak_elements, st.elements);
    for (size_t x : s.needs[p])
      if (st.in_flight.erase(x)) {
        s.begin[p].wait.push_back(x);
        st.held.insert(x);
      }
    for (size_t k = 0; k < s.needs[p].size(); ++k) {
      const size_t x = s.needs[p][k];
      const size_t next = next_use[p][k];
      const bool keep = next == p + 1 || (next != SIZE_MAX && !reshard_after_forward && p < n);
      if (!keep) {
        s.end[p].release.push_back(x);
        st.held.erase(x);
        st.elements -= unit_elements.empty() ? 0 : unit_elements[x];
      }
    }
  }
  return s;
}

}  // namespace strategy
}  // namespace ddp
