// loss_scale.h — fp16's dynamic loss scaling, as torch.cuda.amp.GradScaler
// does it ([precision] loss_scale = "dynamic", fp16's default;
// docs/precision.md). Backward starts from the loss times the scale, so
// that small gradients stay above fp16's subnormals in the products that
// round them; after the strategy's reduction the engine checks every
// rank's gradients for inf and NaN, the ranks agree on the answer, and
// then either divides the gradients by the scale and steps, or skips the
// step on every rank. The scale then moves as `next_loss_scale` says.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "config.h"

namespace ddp {

// Where the scaling stands: the scale the next backward multiplies by (a
// float, as GradScaler's), the clean steps since it last changed, and the
// steps skipped over the whole run (a resumed run's earlier ones too).
// Checkpoints keep it.
struct LossScale {
  double scale = 1;
  int64_t growth_tracker = 0;
  int64_t skipped_steps = 0;
  bool operator==(const LossScale& o) const {
    return scale == o.scale && growth_tracker == o.growth_tracker && skipped_steps == o.skipped_steps;
  }
};

// The state a run starts from: init_scale (rounded to a float) where
// scaling is on, else 1. Pure.
LossScale initial_loss_scale(const PrecisionConfig& precision);

// After a step whose gradients held an inf or NaN on some rank
// (`found_inf`): the scale times backoff_factor, the tracker 0, one more
// step skipped. After a clean one: the tracker one more, and at
// growth_interval the scale times growth_factor (unless that overflows a
// float: GradScaler keeps a float32 scale) and the tracker 0. A scale
// below FLT_MIN (every step skipped for ~150 steps: what overflows is not
// the scale's doing) is the caller's to refuse. Pure.
LossScale next_loss_scale(const LossScale& now, const PrecisionConfig& precision, bool found_inf);

// checkpoint.json's "loss_scale": {"scale", "growth_tracker",
// "skipped_steps"}, and back, checked: a scale that is not a float in
// [FLT_MIN, FLT_MAX], or counts that are not whole numbers >= 0, throw
// nlohmann's other_error naming the key. Pure.
nlohmann::ordered_json loss_scale_json(const LossScale& s);
LossScale loss_scale_of(const nlohmann::ordered_json& j);

}  // namespace ddp
