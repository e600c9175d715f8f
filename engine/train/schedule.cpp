// schedule.cpp — see schedule.h.
#include "schedule.h"

#include <algorithm>
#include <cmath>

#include <cblas.h>

namespace ddp {

double scheduled_lr(const LrScheduleConfig& s, double lr, int64_t step) {
  if (s.kind != "cosine") return lr;
  const double t = double(step), warmup = double(s.warmup_steps), cosine = double(s.cosine_steps);
  if (t < warmup) return t / warmup * lr;
  if (t <= cosine) return s.min_lr + 0.5 * (1 + std::cos((t - warmup) / (cosine - warmup) * M_PI)) * (lr - s.min_lr);
  return s.min_lr;
}

double clip_coefficient(double total_norm, double max_norm) { return std::min(1.0, max_norm / (total_norm + 1e-6)); }

double clip_gradients(std::vector<Parameter>& params, const std::vector<size_t>& held, bool partitioned,
                      double max_norm, Device& device, int world,
                      const std::function<void(const std::vector<double>&, std::vector<double>&)>& all_gather) {
  double sum = 0;
  for (size_t i : held) {
    const Parameter& p = params[i];
    const std::vector<float> host = device.kind() == DDP_DEVICE_CPU ? std::vector<float>() : p.grad.to_host();
    const float* g = host.empty() ? p.grad.data() : host.data();
    sum += cblas_dsdot(int(p.grad.numel()), g, 1, g, 1);  // float32 in, accumulated in float64
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
