// collective_check.h — run.debug_collectives. Collectives match across
// ranks by order alone: if rank 1's next all-reduce is of another size,
// type or buffer than rank 0's, the transport hangs, fails with a message
// about sizes, or — same size, other buffer — silently mixes two tensors.
// With the check on, before each collective a strategy issues every rank's
// description of it (sequence number, op, count, type, argument, and the
// parameter whose memory it is) is all-gathered and compared, and the
// first disagreement stops the run naming both sides. It costs one small
// blocking all-gather per collective: a debugging aid, off by default.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp {

// A collective as a rank describes it; kCallWords int64 on the wire.
struct CollectiveCall {
  int64_t seq = 0;     // this rank's count of collectives before it
  int64_t op = 0;      // 1 all_reduce, 2 broadcast, 3 all_gather, 4 reduce_scatter, 5 barrier; kStepEnd
  int64_t count = 0;   // elements sent
  int64_t dtype = 0;   // ddp_dtype
  int64_t arg = 0;     // all_reduce, reduce_scatter: ddp_reduce_op; broadcast: root; all_gather: count received
  int64_t param = -1;  // the parameter whose data or gradient holds the buffer; -1: none
};
constexpr size_t kCallWords = 6;
// Not a collective: a rank's return from on_step_end of a divergent
// strategy (count: 1 if it said the step is a sync point, else 0; arg: the
// step, from 0), gathered as a call is so that it meets, in the same
// all-gather, the description of a collective another rank's strategy is
// about to issue in on_step_end.
constexpr int64_t kStepEnd = 6;
void to_words(const CollectiveCall& call, int64_t* words);
CollectiveCall from_words(const int64_t* words);

// "all_reduce (sum) of 1024 float32 (parameter 'fc1.weight')". Pure.
std::string describe(const CollectiveCall& call, const std::vector<std::string>& param_names);

// `all` holds every rank's call (world × kCallWords, rank order): the first
// rank that disagrees with rank 0, as a sentence naming both calls; "" if
// all agree. Within a group (ABI 1.9), `all` holds its members' calls in
// group order, `ranks` their world ranks and `group` its label ("group
// 'shard' (ranks 2, 3)"); the sentence names the group and world ranks.
// Pure.
std::string first_mismatch(const std::vector<int64_t>& all, int world, const std::vector<std::string>& param_names,
                           const std::vector<int>& ranks = {}, const std::string& group = "");

// Under a divergent strategy, what the ranks did at the end of step
// `step` (from 0): `all` holds each one's record of its return from
// on_step_end (kStepEnd) or of the collective it issues in it instead,
// world × kCallWords in rank order. The first rank that disagrees with
// rank 0, as a sentence naming the step and what each did: whether the
// step is a sync point, or a collective one rank issues while another has
// returned; two collectives as first_mismatch says them. "" if all agree.
// Pure.
std::string step_end_mismatch(const std::vector<int64_t>& all, int world, const std::vector<std::string>& param_names,
                              int64_t step);

}  // namespace ddp
