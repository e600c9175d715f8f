// tensor.cpp — see tensor.h.
#include "tensor.h"

#include <cstdint>

namespace ddp {

size_t numel_of(const Shape& shape, size_t element_bytes) {
  size_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw Error("shape " + shape_string(shape) + " has a negative dimension", DDP_ERR_INVALID_ARGUMENT);
    if (d != 0 && n > SIZE_MAX / element_bytes / size_t(d))
      throw Error("shape " + shape_string(shape) + " holds more bytes than this machine can address",
                  DDP_ERR_INVALID_ARGUMENT);
    n *= size_t(d);
  }
  return n;
}

std::string shape_string(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace ddp
