// part.h — what the `sharded` strategy asks of its stage: one part per
// stage, and stage 1's per variant (Stage1Broadcast and Stage1AllGather,
// stage1.h; Stage2Part and Stage3Part, stages.h), chosen once at create from
// the `stage` and `variant` keys (make_part, stages.h). The ABI's entries in
// sharded.cpp route to the part without asking which stage it is; a part
// keeps the defaults of the entries its stage does nothing in. Everything
// here throws ddp::plugin::Failure; the plugin's entries catch it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "../common/strategy_util.h"

namespace ddp {
namespace strategy {

class ShardedPart {
 public:
  ShardedPart() = default;
  ShardedPart(const ShardedPart&) = delete;
  ShardedPart& operator=(const ShardedPart&) = delete;
  virtual ~ShardedPart() = default;

  // on_train_begin: rank 0's values on every rank, and the layout (the
  // groups are made, in create).
  virtual void set_up() = 0;
  // on_step_begin; `sync`: this micro-batch's gradients are synchronised.
  virtual void begin(const ddp_step_info& info, bool sync) = 0;
  // on_grad_ready, on_backward_end, on_unit, unit_values, take_values.
  virtual void ready(const ddp_param& /*param*/) {}
  virtual void backward_end() {}
  virtual void unit(size_t /*unit*/, ddp_unit_phase /*phase*/) {}
  virtual void lend(size_t /*unit*/, bool /*hold*/) {}
  virtual void take(size_t /*unit*/) {}
  // finish of the micro-batch that syncs (the others do nothing).
  virtual void finish() = 0;
  // optimizer_step.
  virtual void step() = 0;
  // stats: one JSON object.
  virtual std::string json() const = 0;
  // held_ranges (1.9): every averaged gradient this rank holds, with its
  // replicas.
  virtual void held(std::vector<ddp_held_range>& out) const = 0;
  // held_grads (1.2): the parameters whose averaged gradients this rank
  // alone holds in its group, or nullptr where it holds every one (or
  // grad_ranges says which elements it holds).
  virtual const std::vector<size_t>* partition() const { return nullptr; }
  // grad_ranges (1.4): this rank's elements of the averaged gradients, or
  // nullptr where it holds whole parameters.
  virtual const std::vector<ddp_range>* ranges() const { return nullptr; }
};

}  // namespace strategy
}  // namespace ddp
