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

double clip_gradients(const std::vector<GradSpan>& held, bool gather, double max_norm, Device& device, int world,
                      const std::function<void(const std::vector<double>&, std::vector<double>&)>& all_gather,
                      const std::vector<double>* known) {
  double mine = 0, everyones = 0;  // held by fewer than every rank (each / its replicas), by every rank
  for (const GradSpan& s : held) {
    const bool everywhere = s.replicas >= world;
    double& sum = everywhere ? everyones : mine;
    double squares;
    // (A gradient with a NaN has a NaN sum: it is measured again, as NaN.)
    if (s.whole && known && s.param < known->size() && !std::isnan((*known)[s.param])) {
      squares = (*known)[s.param];
    } else {
      std::vector<float> host;
      if (device.kind() != DDP_DEVICE_CPU) {
        host.resize(s.count);
        device.download(host.data(), s.grad, s.count * sizeof(float));
      }
      squares = sum_of_squares(host.empty() ? s.grad : host.data(), s.count);
    }
    sum += everywhere || s.replicas <= 1 ? squares : squares / double(s.replicas);
  }
  double sum = everyones;
  if (gather) {
    std::vector<double> all(static_cast<size_t>(world));
    all_gather({mine}, all);
    sum = 0;
    for (double part : all) sum += part;
    sum += everyones;
  }
  const double norm = std::sqrt(sum);
  const double coef = max_norm > 0 ? clip_coefficient(norm, max_norm) : 1.0;
  if (coef < 1.0)
    for (const GradSpan& s : held) device.scale(s.grad, s.count, float(coef), device.compute_stream());
  return norm;
}

}  // namespace ddp
