// initial_values.cpp — see initial_values.h.
#include "initial_values.h"

#include <vector>

namespace ddp {

void InitialValues::fill(size_t index, float* out) {
  const Parameter& p = model_.params().at(index);
  if (!file_) return model_.draw_initial(index, out);
  file_->read_floats(p.name, 0, numel_of(p.shape), out);
}

Tensor InitialValues::make(size_t index, Device& device) {
  const Parameter& p = model_.params().at(index);
  Tensor t(device, p.shape, MemCategory::Parameters);
  std::vector<float> host(t.numel());
  fill(index, host.data());
  device.upload(t.data(), host.data(), t.bytes());
  return t;
}

}  // namespace ddp
