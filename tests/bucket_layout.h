// bucket_layout.h — whether two runs of one configuration laid out the same
// gradient buckets at every step, read from their summaries'
// strategy_stats (strategies/common/bucket_cap.h's members). With
// bucket_mb = "auto" the cap comes from start-up timing probes, so two runs
// may lay out different buckets and sum gradients (and their squares) in
// another order: their grad norms may differ in the last bits. Pure: a unit
// test of its own (bucket_cap_test.cpp, BucketLayouts.*).
#pragma once

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

namespace ddp {
namespace test {

// "" where the two runs provably had the same layout at every step, else
// why that is not known (for a failure message). For runs whose trainable
// set only grows (parameters unfrozen, none frozen): the same layout when
// neither measured its cap (a number of MiB, or no buckets), when both
// measured the same fit (o_s, w_bytes_per_s), or when both chose one cap
// holding every trainable gradient, or both a cap of 1 byte (one parameter
// per bucket), at the end: the model's cap, sqrt(s·w·o) clamped to [1, s],
// is then clamped the same way for every smaller trainable set s before.
inline std::string bucket_layouts_differ(const nlohmann::json& a, const nlohmann::json& b) {
  const bool auto_a = a.is_object() && a.contains("auto");
  const bool auto_b = b.is_object() && b.contains("auto");
  if (!auto_a && !auto_b) return "";
  if (auto_a != auto_b) return "one run measured its bucket cap (bucket_mb = \"auto\"), the other did not";
  const nlohmann::json& fa = a.at("auto");
  const nlohmann::json& fb = b.at("auto");
  if (fa.at("gradient_bytes") != fb.at("gradient_bytes"))
    return "the runs ended with " + fa.at("gradient_bytes").dump() + " and " + fb.at("gradient_bytes").dump() +
           " trainable gradient bytes";
  if (fa.at("o_s") == fb.at("o_s") && fa.at("w_bytes_per_s") == fb.at("w_bytes_per_s")) return "";
  const double bytes = fa.at("gradient_bytes").get<double>();
  const double cap_a = std::round(fa.at("chosen_bucket_mb").get<double>() * 1024 * 1024);
  const double cap_b = std::round(fb.at("chosen_bucket_mb").get<double>() * 1024 * 1024);
  if (cap_a == cap_b && (cap_a == bytes || cap_a == 1)) return "";
  return "bucket_mb = \"auto\" measured other fits: caps of " + fa.at("chosen_bucket_mb").dump() + " and " +
         fb.at("chosen_bucket_mb").dump() + " MiB for " + fa.at("gradient_bytes").dump() + " gradient bytes";
}

}  // namespace test
}  // namespace ddp
