// update_rules.cpp — see update_rules.h.
#include "update_rules.h"

#include <cmath>

#include "simd_clones.h"

namespace ddp {

DDP_SIMD_CLONES
double sum_of_squares(const float* x, size_t n) {
  return sum_squares_while(x, n, [](size_t) {});
}

AdamScalars adamw_scalars(double lr, double weight_decay, double beta1, double beta2, double eps, int64_t step) {
  const double bias1 = 1.0 - std::pow(beta1, double(step));
  const double bias2 = 1.0 - std::pow(beta2, double(step));
  return AdamScalars{float(1.0 - lr * weight_decay), float(beta1), float(1.0 - beta1), float(beta2), float(1.0 - beta2),
                     float(std::sqrt(bias2)),        float(eps),   float(lr / bias1)};
}

}  // namespace ddp
