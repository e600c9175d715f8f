// mlp.h — the `mlp` model of docs/models.md: `depth` width x width linear
// layers with bias, each followed by ReLU, then a linear head to `classes`
// logits; mean cross-entropy against integer labels. Many parameters, little
// compute: it makes gradient synchronisation visible. On either device,
// through the device's kernels (kernels.h).
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels.h"
#include "model.h"

namespace ddp {

struct MlpConfig {
  int64_t width = 0;
  int64_t depth = 0;
  int64_t classes = 0;
};

// Parameters layers.{i}.weight [width, width], layers.{i}.bias [width] for
// i < depth, then head.weight [classes, width], head.bias [classes], all
// nn.Linear's default U(-1/sqrt(in), 1/sqrt(in)) from the seed. Batches carry
// x [rows, width] and labels [rows] in [0, classes).
class MlpModel final : public Model {
 public:
  // Throws Error for a non-positive width or classes, or a negative depth.
  // `with_values`: as make_model's (model.h).
  MlpModel(const MlpConfig& config, Device& device, uint64_t seed, bool with_values = true);

  int64_t input_width() const override { return config_.width; }
  int64_t output_width() const override { return config_.classes; }
  // Under bf16 or fp16 the hidden activations backward keeps (acts_) are
  // held in it: forward computes each layer in float32 in the backward
  // scratch and packs; backward unpacks into work_ before reading.
  void set_compute_dtype(ddp_dtype dtype) override {
    k_->set_compute_dtype(dtype);
    rows_ = -1;  // the next forward allocates the activations in it
  }
  // Throws Error for missing x or labels, or a label outside [0, classes).
  float forward(const Batch& batch) override;
  // Calls accumulated(i) in strictly decreasing i (bias before weight).
  void backward(float loss_scale, const GradAccumulated& accumulated) override;

  const MlpConfig& config() const { return config_; }
  // softmax - onehot(labels) [rows, classes] of the last forward's logits,
  // left in place of them (layers::cross_entropy_forward); backward scales it.
  const float* loss_gradient() const { return logits_.data(); }

 private:
  void ensure_activations(int64_t rows);
  // The shapes ensure_activations allocates, in its order.
  static std::vector<ActBuffer> activation_shapes(const MlpConfig& c, int64_t rows, ddp_device_kind device,
                                                  ddp_dtype compute);
  friend Footprint mlp_footprint(const MlpConfig& config, int64_t rows, ddp_device_kind device, ddp_dtype compute);
  // acts_[i] in float32: its own memory, or unpacked into work_.
  const float* kept(size_t i) { return unpack_activation(*k_, acts_[i], work_); }
  // The labels the kernels read: host on the CPU, else device memory.
  const int32_t* labels() const {
    return labels_dev_.defined() ? reinterpret_cast<const int32_t*>(labels_dev_.data()) : labels_.data();
  }

  Device& device_;
  std::unique_ptr<Kernels> k_;  // the device's layers
  MlpConfig config_;
  int64_t rows_ = -1;
  const float* input_ = nullptr;  // x of the last forward [rows, width]
  std::vector<int32_t> labels_;   // [rows]
  Tensor x_dev_;                  // a GPU's copy of x
  Tensor labels_dev_;             // a GPU's copy of labels_
  std::vector<Tensor> acts_;      // relu(layer i) [rows, width], i < depth
  Tensor logits_;                 // [rows, classes]; softmax - onehot from forward on
  Tensor lse_;                    // [rows]
  Tensor dact_;                   // [rows, width] backward scratch (ping-pong)
  Tensor dtmp_;
  Tensor work_;  // [rows, width] float32 copy of a 16-bit acts_[i] (16-bit compute only)
};

// `with_gradients`, `with_values`: as make_lm's.
std::unique_ptr<Model> make_mlp(const MlpConfig& config, Device& device, uint64_t seed, bool with_gradients = true,
                                bool with_values = true);

// Its units: "layers.{i}" (weight and bias) for i < depth, then "head".
std::vector<Unit> mlp_units(const MlpConfig& config);

// What an mlp of this size holds with `rows` rows per micro-batch
// (model.h): what MlpModel allocates, on that kind of device, computing in
// `compute`.
Footprint mlp_footprint(const MlpConfig& config, int64_t rows, ddp_device_kind device, ddp_dtype compute = DDP_FLOAT32);

}  // namespace ddp
