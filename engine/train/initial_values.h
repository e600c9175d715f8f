// initial_values.h — where each parameter's first values come from, one
// tensor at a time, so that a model need never be whole in memory: the
// checkpoint a run resumes, model.init_from, or else the model's own draw
// (Model::draw_initial). The engine fills its own parameters from here
// once the strategy has claimed its part, and lends a strategy that takes
// values unit by unit (ddp_strategy_v1_t::take_values, ABI 1.7) one unit
// at a time. Internal to engine/train.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "model.h"
#include "safetensors.h"

namespace ddp {

class InitialValues {
 public:
  explicit InitialValues(Model& model) : model_(model) {}
  // Reads every parameter from `file` from now on (its caller has checked
  // that it holds each one, by name and shape).
  void read_from(std::unique_ptr<SafetensorsReader> file) { file_ = std::move(file); }
  // Parameter `index`'s values into `out` (its numel floats, on the host).
  // Throws Error naming the file and the tensor for one not float32, or a
  // short read (a file changed since it was checked).
  void fill(size_t index, float* out);
  // The same, into new storage of the parameter's shape on `device`
  // (category Parameters).
  Tensor make(size_t index, Device& device);

 private:
  Model& model_;
  std::unique_ptr<SafetensorsReader> file_;
};

}  // namespace ddp
