// whole_model.h — writing every parameter whole between steps
// (weights.safetensors, a checkpoint's weights), tensor by tensor as a
// visit hands them: the store's per-unit view (param_store.h) reads them,
// unit by unit where the strategy holds the values. Internal to
// engine/train.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "model.h"

namespace ddp {

// A visit of every parameter's values on the host: put(i, values), each
// valid during its call (a GPU's copied out one tensor at a time).
using HostVisit = std::function<void(const std::function<void(size_t index, const float* values)>& put)>;

// Writes the safetensors file `path` on rank 0 (`writes`), tensor by tensor
// as `visit` hands them, never the whole model in memory. Where
// `collective` (the strategy gathers the values) every rank calls it at the
// same point and visits, and a rank 0 that cannot write goes on visiting,
// so that the ranks' gathers stay matched. Returns rank 0's failure as text
// ("" if none; "" on the other ranks).
std::string write_weights(const std::string& path, const std::vector<Parameter>& params, bool writes, bool collective,
                          const HostVisit& visit);

}  // namespace ddp
