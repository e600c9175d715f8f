// whole_model.h — what reads every parameter whole between steps (the
// replica check, checkpoints, weights.safetensors, a test's snapshots):
// where the engine holds the values, as they are; where the strategy
// claimed them (ABI 1.5, DDP_STORAGE_DATA), unit by unit, each held
// through the strategy's unit_values while it is read. Internal to
// engine/train.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "model.h"

namespace ddp {

// Whether the strategy claimed any parameter's values.
bool values_claimed(const std::vector<Parameter>& params);

// Calls visit(i) for every parameter i with its values bound: in table
// order where `unit_values` is empty (the engine holds every value); else
// unit by unit in forward order (the parameters each owns), between
// unit_values(u, true) and (u, false), which every rank must call at the
// same point (the strategy may communicate). Throws Error naming `reader`,
// the parameter and its unit where the strategy bound no values, or where
// the model declares no units.
void visit_values(const Model& model, const std::function<void(size_t unit, bool hold)>& unit_values,
                  const std::string& reader, const std::function<void(size_t index)>& visit);

// A visit of every parameter's values on the host: put(i, values), each
// valid during its call (a GPU's copied out one tensor at a time).
using HostVisit = std::function<void(const std::function<void(size_t index, const float* values)>& put)>;

// Writes the safetensors file `path` on rank 0 (`writes`), tensor by tensor
// as `visit` hands them, never the whole model in memory. Where
// `collective` (the strategy gathers the values) every rank calls it at the
// same point and visits, and a rank 0 that cannot write goes on visiting,
// so that the ranks' gathers stay matched. Returns rank 0's failure as text
// ("" if none; "" on the other ranks).
std::string write_weights(const std::string& path, const std::vector<Parameter>& params, bool writes,
                          bool collective, const HostVisit& visit);

// Every parameter's values on the host, in table order, read as above.
std::vector<std::vector<float>> host_values(const Model& model,
                                            const std::function<void(size_t unit, bool hold)>& unit_values,
                                            const std::string& reader);

}  // namespace ddp
