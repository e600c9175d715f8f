// collective_check.cpp — see collective_check.h.
#include "collective_check.h"

#include <ddp/numeric.h>

namespace ddp {
namespace {

const char* op_name(int64_t op) {
  static const char* kOps[] = {"?", "all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier"};
  return op >= 1 && op <= 5 ? kOps[op] : "an unknown collective";
}

const char* dtype_words(int64_t dtype) {
  return dtype >= 0 && dtype <= DDP_FLOAT16 ? ddp_dtype_name(static_cast<ddp_dtype>(dtype))
                                            : "elements of an unknown type";
}

const char* reduce_name(int64_t op) { return op == 0 ? "sum" : op == 1 ? "avg" : "unknown op"; }

}  // namespace

void to_words(const CollectiveCall& c, int64_t* w) {
  w[0] = c.seq;
  w[1] = c.op;
  w[2] = c.count;
  w[3] = c.dtype;
  w[4] = c.arg;
  w[5] = c.param;
}

CollectiveCall from_words(const int64_t* w) { return CollectiveCall{w[0], w[1], w[2], w[3], w[4], w[5]}; }

std::string describe(const CollectiveCall& c, const std::vector<std::string>& names) {
  if (c.op == kStepEnd)
    return std::string("returned saying step ") + std::to_string(c.arg + 1) + " is " + (c.count ? "" : "not ") +
           "a sync point";
  std::string s = op_name(c.op);
  if (c.op == 5) return s;
  if (c.op == 1 || c.op == 4) s += std::string(" (") + reduce_name(c.arg) + ")";
  if (c.op == 2) s += " from rank " + std::to_string(c.arg);
  s += " of " + std::to_string(c.count) + " " + dtype_words(c.dtype);
  if (c.op == 3) s += " into " + std::to_string(c.arg);
  if (c.param >= 0 && size_t(c.param) < names.size()) s += " (parameter '" + names[size_t(c.param)] + "')";
  return s;
}

std::string first_mismatch(const std::vector<int64_t>& all, int world, const std::vector<std::string>& names,
                           const std::vector<int>& ranks, const std::string& group) {
  const auto rank = [&](int r) { return std::to_string(r < int(ranks.size()) ? ranks[size_t(r)] : r); };
  const CollectiveCall first = from_words(all.data());
  for (int r = 1; r < world; ++r) {
    const int64_t* w = all.data() + size_t(r) * kCallWords;
    bool same = true;
    for (size_t k = 0; k < kCallWords; ++k) same = same && w[k] == all[k];
    if (same) continue;
    const CollectiveCall other = from_words(w);
    const std::string which = first.seq == other.seq
                                  ? "collective #" + std::to_string(first.seq + 1)
                                  : "the next collective (rank " + rank(0) + "'s #" + std::to_string(first.seq + 1) +
                                        ", rank " + rank(r) + "'s #" + std::to_string(other.seq + 1) + ")";
    const std::string who = group.empty() ? "the ranks" : "the ranks of " + group;
    const std::string of = group.empty() ? "" : " of the group";
    return who + " disagree on " + which + of + ": rank " + rank(0) + " calls " + describe(first, names) + ", rank " +
           rank(r) + " calls " + describe(other, names) +
           ": every rank must issue the same collectives in the same order";
  }
  return "";
}

std::string step_end_mismatch(const std::vector<int64_t>& all, int world, const std::vector<std::string>& names,
                              int64_t step) {
  const CollectiveCall first = from_words(all.data());
  const std::string n = std::to_string(step + 1);
  for (int r = 1; r < world; ++r) {
    const CollectiveCall other = from_words(all.data() + size_t(r) * kCallWords);
    const bool ended = first.op == kStepEnd;
    const bool other_ended = other.op == kStepEnd;
    if (!ended && !other_ended) {  // two collectives: as run.debug_collectives says them
      std::vector<int64_t> pair(all.begin(), all.begin() + long(kCallWords));
      pair.insert(pair.end(), all.begin() + long(size_t(r) * kCallWords),
                  all.begin() + long(size_t(r + 1) * kCallWords));
      const std::string mismatch = first_mismatch(pair, 2, names, {0, r});
      if (!mismatch.empty()) return mismatch;
      continue;
    }
    if (ended && other_ended) {
      if (first.count == other.count) continue;
      return "the ranks disagree on whether step " + n + " is a sync point: rank 0 says it " +
             (first.count ? "is" : "is not") + ", rank " + std::to_string(r) + " says it " +
             (other.count ? "is" : "is not") + ": every rank must answer on_step_end alike";
    }
    return "the ranks disagree in on_step_end of step " + n + ": rank 0 " +
           (ended ? describe(first, names) : "calls " + describe(first, names)) + ", rank " + std::to_string(r) + " " +
           (other_ended ? describe(other, names) : "calls " + describe(other, names)) +
           ": every rank must answer on_step_end alike, with the same collectives";
  }
  return "";
}

}  // namespace ddp
