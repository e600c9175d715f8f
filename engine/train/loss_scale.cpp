// loss_scale.cpp — see loss_scale.h.
#include "loss_scale.h"

#include <cfloat>
#include <cmath>
#include <string>

namespace ddp {

LossScale initial_loss_scale(const PrecisionConfig& precision) {
  LossScale s;
  if (precision.loss_scale) s.scale = double(float(precision.init_scale));
  return s;
}

LossScale next_loss_scale(const LossScale& now, const PrecisionConfig& precision, bool found_inf) {
  LossScale next = now;
  if (found_inf) {
    next.scale = double(float(now.scale * precision.backoff_factor));
    next.growth_tracker = 0;
    ++next.skipped_steps;
    return next;
  }
  next.growth_tracker = now.growth_tracker + 1;
  if (next.growth_tracker < precision.growth_interval) return next;
  const double grown = double(float(now.scale * precision.growth_factor));
  if (std::isfinite(grown)) next.scale = grown;
  next.growth_tracker = 0;
  return next;
}

nlohmann::ordered_json loss_scale_json(const LossScale& s) {
  return {{"scale", s.scale}, {"growth_tracker", s.growth_tracker}, {"skipped_steps", s.skipped_steps}};
}

LossScale loss_scale_of(const nlohmann::ordered_json& j) {
  using json = nlohmann::ordered_json;
  const auto wrong = [&](const char* key, const char* what) {
    return json::other_error::create(
        501, std::string("'loss_scale'.'") + key + "' is " + j.at(key).dump() + ", not " + what, &j);
  };
  LossScale s;
  const json& scale = j.at("scale");
  if (!scale.is_number() || !(scale.get<double>() >= FLT_MIN) || scale.get<double>() > FLT_MAX ||
      double(float(scale.get<double>())) != scale.get<double>())
    throw wrong("scale", "a float from FLT_MIN to FLT_MAX");
  s.scale = scale.get<double>();
  for (const char* key : {"growth_tracker", "skipped_steps"}) {
    const json& v = j.at(key);
    if (!v.is_number_integer() ||
        (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t(INT64_MAX) : v.get<int64_t>() < 0))
      throw wrong(key, "a whole number >= 0");
  }
  s.growth_tracker = j.at("growth_tracker").get<int64_t>();
  s.skipped_steps = j.at("skipped_steps").get<int64_t>();
  return s;
}

}  // namespace ddp
