// schedule.cpp — see schedule.h.
#include "schedule.h"

#include <algorithm>
#include <cmath>

#include "simd_clones.h"
#include "update_rules.h"

namespace ddp {

double scheduled_lr(const LrScheduleConfig& s, double lr, int64_t step) {
  if (s.kind != "cosine") return lr;
  const double t = double(step), warmup = double(s.warmup_steps), cosine = double(s.cosine_steps);
  if (t < warmup) return t / warmup * lr;
  if (t <= cosine) return s.min_lr + 0.5 * (1 + std::cos((t - warmup) / (cosine - warmup) * M_PI)) * (lr - s.min_lr);
  return s.min_lr;
}

double clip_coefficient(double total_norm, double max_norm) { return std::min(1.0, max_norm / (total_norm + 1e-6)); }

DDP_SIMD_CLONES
double sum_of_squares(const float* x, size_t n) {
  return sum_squares_while(x, n, [](size_t) {});
}

double clip_gradients(std::vector<Parameter>& params, const std::vector<size_t>& held, bool partitioned,
                      double max_norm, Device& device, int world,
                      const std::function<void(const std::vector<double>&, std::vector<double>&)>& all_gather,
                      const std::vector<double>* known) {
  double sum = 0;
  for (size_t i : held) {
    const Parameter& p = params[i];
    // (A gradient with a NaN has a NaN sum: it is measured again, as NaN.)
    if (known && i < known->size() && !std::isnan((*known)[i])) {
      sum += (*known)[i];
      continue;
    }
    const std::vector<float> host = device.kind() == DDP_DEVICE_CPU ? std::vector<float>() : p.grad.to_host();
    const float* g = host.empty() ? p.grad.data() : host.data();
    sum += sum_of_squares(g, p.grad.numel());
  }
  if (partitioned) {
    std::vector<double> all(static_cast<size_t>(world));
    all_gather({sum}, all);
    sum = 0;
    for (double part : all) sum += part;
  }
  const double norm = std::sqrt(sum);
  const double coef = max_norm > 0 ? clip_coefficient(norm, max_norm) : 1.0;
  if (coef < 1.0)
    for (size_t i : held) device.scale(params[i].grad.data(), params[i].grad.numel(), float(coef), device.compute_stream());
  return norm;
}

}  // namespace ddp
