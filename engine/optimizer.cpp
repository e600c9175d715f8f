// optimizer.cpp — SGD: p -= lr * g.
#include "optimizer.h"

namespace ddp {

void Optimizer::step(std::vector<Parameter>& params, const std::vector<size_t>& indices) {
  const float lr = static_cast<float>(config_.lr);
  for (size_t i : indices) {
    Parameter& p = params.at(i);
    if (!p.trainable) continue;
    float* w = p.data.data();
    const float* g = p.grad.data();
    for (size_t k = 0; k < p.data.numel(); ++k) w[k] -= lr * g[k];
  }
}

}  // namespace ddp
