// schedule.cpp — see schedule.h.
#include "schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "update_rules.h"

namespace ddp {

double scheduled_lr(const LrScheduleConfig& s, double lr, int64_t step) {
  if (s.kind != "cosine") return lr;
  const double t = double(step);
  const double warmup = double(s.warmup_steps);
  const double cosine = double(s.cosine_steps);
  if (t < warmup) return t / warmup * lr;
  if (t <= cosine) return s.min_lr + 0.5 * (1 + std::cos((t - warmup) / (cosine - warmup) * M_PI)) * (lr - s.min_lr);
  return s.min_lr;
}

double clip_coefficient(double total_norm, double max_norm) { return std::min(1.0, max_norm / (total_norm + 1e-6)); }

double clip_gradients(const std::vector<GradSpan>& held, bool gather, double max_norm, Device& device, int world,
                      const std::function<void(const std::vector<double>&, std::vector<double>&)>& all_gather,
                      const std::vector<double>* known, double unscale) {
  // Each span's squares: the update's where it measured them, else the
  // device's, every other span in one call (on a GPU: read there, one
  // float64 per chunk copied back). (A gradient with a NaN has a NaN sum:
  // it is measured again, as NaN.)
  std::vector<double> squares(held.size());
  std::vector<const float*> x;
  std::vector<size_t> n;
  std::vector<size_t> at;
  for (size_t k = 0; k < held.size(); ++k) {
    const GradSpan& s = held[k];
    if (s.whole && known && s.param < known->size() && !std::isnan((*known)[s.param])) {
      squares[k] = (*known)[s.param];
      continue;
    }
    x.push_back(s.grad);
    n.push_back(s.count);
    at.push_back(k);
  }
  std::vector<double> measured(x.size());
  device.sums_of_squares(x.data(), n.data(), x.size(), measured.data());
  for (size_t j = 0; j < at.size(); ++j) squares[at[j]] = measured[j];
  double mine = 0;       // held by fewer than every rank (each / its replicas)
  double everyones = 0;  // held by every rank
  for (size_t k = 0; k < held.size(); ++k) {
    const GradSpan& s = held[k];
    const bool everywhere = s.replicas >= world;
    double& sum = everywhere ? everyones : mine;
    sum += everywhere || s.replicas <= 1 ? squares[k] : squares[k] / double(s.replicas);
  }
  double sum = everyones;
  if (gather) {
    std::vector<double> all(static_cast<size_t>(world));
    all_gather({mine}, all);
    sum = 0;
    for (double part : all) sum += part;
    sum += everyones;
  }
  const double norm = std::sqrt(sum) * unscale;
  const double coef = (max_norm > 0 ? clip_coefficient(norm, max_norm) : 1.0) * unscale;
  if (coef != 1.0)
    for (const GradSpan& s : held) device.scale(s.grad, s.count, float(coef), device.compute_stream());
  return norm;
}

std::string overlapping_spans(std::vector<GradSpan> spans, const std::vector<std::string>& names) {
  std::sort(spans.begin(), spans.end(), [](const GradSpan& a, const GradSpan& b) {
    return a.param != b.param ? a.param < b.param : a.offset < b.offset;
  });
  for (size_t k = 1; k < spans.size(); ++k) {
    const GradSpan& a = spans[k - 1];
    const GradSpan& b = spans[k];
    if (a.param != b.param || b.offset >= a.offset + a.count || b.count == 0) continue;
    const std::string name = a.param < names.size() ? names[a.param] : std::to_string(a.param);
    return "two ranges hold elements [" + std::to_string(b.offset) + ", " +
           std::to_string(std::min(a.offset + a.count, b.offset + b.count)) + ") of parameter '" + name + "'";
  }
  return "";
}

std::vector<double> held_once(const std::vector<GradSpan>& spans, size_t params) {
  std::vector<double> out(params, 0.0);
  for (const GradSpan& s : spans)
    if (s.param < params) out[s.param] += double(s.count) / double(std::max(s.replicas, 1));
  return out;
}

std::string coverage_problem(const std::vector<double>& every, int world, const std::vector<size_t>& numel,
                             const std::vector<bool>& trainable, const std::vector<std::string>& names) {
  const size_t params = numel.size();
  for (size_t p = 0; p < params; ++p) {
    if (!trainable[p]) continue;
    double held = 0;
    for (int r = 0; r < world; ++r) held += every[size_t(r) * params + p];
    if (std::fabs(held - double(numel[p])) <= 1e-6 * double(numel[p])) continue;
    char times[32];
    std::snprintf(times, sizeof times, "%.4g", held / double(numel[p]));
    return "the ranks hold the averaged gradient of parameter '" + names[p] + "' " + times +
           " times over, counting each range once per its replicas, not once: its ranges miss or repeat elements, "
           "or name the wrong number of replicas";
  }
  return "";
}

}  // namespace ddp
