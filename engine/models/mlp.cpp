// mlp.cpp — the `mlp` model: forward and backward over layers.h, one GEMM
// per layer per direction with the whole micro-batch as M. Activations are
// allocated on the first forward for a given number of rows and reused.
#include "mlp.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "error.h"
#include "layers.h"

namespace ddp {

namespace {

// Throws Error for sizes the model refuses, or whose element counts (with
// `rows` rows) would pass 2^50.
void check_sizes(const MlpConfig& config, int64_t rows) {
  if (config.width < 1 || config.depth < 0 || config.classes < 1)
    throw Error("mlp: width and classes must be positive and depth non-negative (width " +
                std::to_string(config.width) + ", depth " + std::to_string(config.depth) + ", classes " +
                std::to_string(config.classes) + ")");
  if (config.depth > kMaxLayers)
    throw Error("mlp: depth " + std::to_string(config.depth) + " is more than " + std::to_string(kMaxLayers) +
                " layers (model.h's kMaxLayers)");
  const double most = std::max(double(config.width) * double(config.width) * double(config.depth + 1),
                               double(rows) * double(config.width + config.classes) * double(config.depth + 3));
  if (most > double(int64_t{1} << 50))
    throw Error("mlp: sizes too large (width " + std::to_string(config.width) + ", depth " +
                std::to_string(config.depth) + ", " + std::to_string(rows) + " rows): over 2^50 elements");
}

}  // namespace

MlpModel::MlpModel(const MlpConfig& config, Device& device, uint64_t seed, bool with_values)
    : device_(device), k_(make_kernels(device)), config_(config) {
  check_sizes(config, 0);
  const int64_t w = config.width;
  for (int64_t i = 0; i < config.depth; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    declare_param(device_, p + "weight", {w, w});
    declare_param(device_, p + "bias", {w});
    range_names_.push_back("backward layers." + std::to_string(i));
  }
  declare_param(device_, "head.weight", {config.classes, w});
  declare_param(device_, "head.bias", {config.classes});
  declare_units(mlp_units(config));
  // nn.Linear's default, U(-1/sqrt(w), 1/sqrt(w)) for weights and biases
  // alike (every fan_in is w), in table order. Drawn on the host.
  set_draw(seed, [this, w](size_t index, float* out, std::mt19937_64& rng) {
    layers::init_uniform(out, static_cast<int64_t>(numel_of(params_[index].shape)),
                         1.0f / std::sqrt(static_cast<float>(w)), rng);
  });
  if (with_values) materialise(device_);
}

std::vector<Unit> mlp_units(const MlpConfig& config) {
  std::vector<Unit> units;
  for (int64_t i = 0; i <= config.depth; ++i) {
    const size_t w = 2 * static_cast<size_t>(i);
    units.push_back({i < config.depth ? "layers." + std::to_string(i) : std::string("head"), {w, w + 1}, {}});
  }
  return units;
}

std::vector<ActBuffer> MlpModel::activation_shapes(const MlpConfig& c, int64_t rows, ddp_device_kind device,
                                                   ddp_dtype compute) {
  std::vector<ActBuffer> s(static_cast<size_t>(c.depth), ActBuffer{{rows, c.width}, compute});  // acts_
  for (Shape b : {Shape{rows, c.classes}, Shape{rows}, Shape{rows, c.width}, Shape{rows, c.width}})
    s.push_back({b, DDP_FLOAT32});  // logits_, lse_, dact_, dtmp_
  if (device != DDP_DEVICE_CPU) {
    s.push_back({{rows, c.width}, DDP_FLOAT32});  // x_dev_
    s.push_back({{rows}, DDP_FLOAT32});           // labels_dev_: int32 labels in a float tensor's bytes
  }
  if (compute != DDP_FLOAT32 && c.depth > 0) s.push_back({{rows, c.width}, DDP_FLOAT32});  // work_
  return s;
}

void MlpModel::ensure_activations(int64_t rows) {
  if (rows == rows_) return;
  acts_.clear();
  for (Tensor* old : {&x_dev_, &labels_dev_, &logits_, &lse_, &dact_, &dtmp_, &work_}) old->reset();
  const std::vector<ActBuffer> shapes = activation_shapes(config_, rows, k_->kind(), k_->compute_dtype());
  size_t next = 0;  // the shapes, taken in activation_shapes' order
  auto act = [&] {
    const ActBuffer& b = shapes.at(next++);
    return Tensor(device_, b.shape, MemCategory::Activations, b.dtype);
  };
  for (int64_t i = 0; i < config_.depth; ++i) acts_.push_back(act());
  for (Tensor* t : {&logits_, &lse_, &dact_, &dtmp_}) *t = act();
  labels_.assign(static_cast<size_t>(rows), 0);
  if (k_->kind() != DDP_DEVICE_CPU)
    for (Tensor* t : {&x_dev_, &labels_dev_}) *t = act();
  if (next < shapes.size()) work_ = act();
  rows_ = rows;
}

Footprint mlp_footprint(const MlpConfig& c, int64_t rows, ddp_device_kind device, ddp_dtype compute) {
  check_sizes(c, rows);
  Footprint f;
  for (int64_t i = 0; i < c.depth; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    f.params.push_back({p + "weight", c.width * c.width, {c.width, c.width}});
    f.params.push_back({p + "bias", c.width, {c.width}});
  }
  f.params.push_back({"head.weight", c.classes * c.width, {c.classes, c.width}});
  f.params.push_back({"head.bias", c.classes, {c.classes}});
  f.step_activation_bytes = act_bytes(MlpModel::activation_shapes(c, rows, device, compute));
  f.data = DataShape{DataShape::Classification, c.width, c.classes, 0, 0};
  f.units = mlp_units(c);
  return f;
}

float MlpModel::forward(const Batch& batch) {
  if (!batch.x || !batch.labels)
    throw Error("mlp: the batch needs inputs x and class labels (labels are integer data)");
  if (batch.rows < 1) throw Error("mlp: a batch needs at least one row");
  ensure_activations(batch.rows);
  const int64_t rows = batch.rows;
  const int64_t w = config_.width;
  const int64_t classes = config_.classes;
  for (int64_t r = 0; r < rows; ++r) {
    if (batch.labels[r] < 0 || batch.labels[r] >= classes)
      throw Error("mlp: label " + std::to_string(batch.labels[r]) + " at row " + std::to_string(r) +
                  " is outside [0, " + std::to_string(classes) + ")");
    labels_[r] = batch.labels[r];
  }
  input_ = batch.x;
  if (x_dev_.defined()) {  // a GPU: inputs and labels into its memory
    k_->upload(x_dev_.data(), batch.x, x_dev_.bytes());
    k_->upload(labels_dev_.data(), labels_.data(), labels_dev_.bytes());
    input_ = x_dev_.data();
  }
  const float* in = input_;  // [rows, width]
  for (int64_t i = 0; i < config_.depth; ++i) {
    unit_event(size_t(i), DDP_UNIT_FORWARD_BEGIN);
    // 16-bit: computed in float32 in dact_ and dtmp_ by turns, then packed.
    Tensor& a = acts_[i];
    float* out = a.dtype() == DDP_FLOAT32 ? a.data() : (i % 2 ? dtmp_ : dact_).data();
    k_->linear_forward(out, in, values(2 * i), rows, w, w);
    k_->bias_forward(out, values(2 * i + 1), rows, w);
    k_->relu_forward(out, out, rows * w);
    keep_activation(*k_, a, out);
    in = out;
    unit_event(size_t(i), DDP_UNIT_FORWARD_END);
  }
  const size_t head = 2 * static_cast<size_t>(config_.depth);
  unit_event(size_t(config_.depth), DDP_UNIT_FORWARD_BEGIN);
  k_->linear_forward(logits_.data(), in, values(head), rows, w, classes);
  k_->bias_forward(logits_.data(), values(head + 1), rows, classes);
  unit_event(size_t(config_.depth), DDP_UNIT_FORWARD_END);
  return static_cast<float>(k_->cross_entropy_forward(lse_.data(), logits_.data(), labels(), rows, classes));
}

void MlpModel::backward(float loss_scale, const GradAccumulated& accumulated) {
  if (rows_ < 1) throw Error("mlp: backward before forward");
  const int64_t rows = rows_;
  const int64_t w = config_.width;
  const int64_t classes = config_.classes;
  // Adds dy-derived gradients of linear (weight, weight + 1 = bias) with input x.
  auto linear_grads = [&](size_t weight, const float* dy, const float* x, int64_t out) {
    if (float* db = grad_out(weight + 1)) {
      k_->bias_backward(db, dy, rows, out);
      accumulated(weight + 1);
    }
    if (float* dw = grad_out(weight)) {
      k_->linear_backward_weight(dw, dy, x, rows, w, out);
      accumulated(weight);
    }
  };

  RangeLaps ranges(range_hook_);
  float* dlogits = logits_.data();                                 // [rows, classes]
  k_->cross_entropy_backward(dlogits, rows, classes, loss_scale);  // the forward left the rest
  const size_t head = 2 * static_cast<size_t>(config_.depth);
  const float* last = config_.depth ? kept(acts_.size() - 1) : input_;
  unit_event(head / 2, DDP_UNIT_BACKWARD_BEGIN);
  linear_grads(head, dlogits, last, classes);
  if (config_.depth == 0) {
    ranges.lap("backward head");
    unit_event(head / 2, DDP_UNIT_BACKWARD_END);
    return;
  }
  k_->linear_backward_input(dact_.data(), dlogits, values(head), rows, w, classes);
  ranges.lap("backward head");
  unit_event(head / 2, DDP_UNIT_BACKWARD_END);
  for (int64_t i = config_.depth - 1; i >= 0; --i) {
    unit_event(size_t(i), DDP_UNIT_BACKWARD_BEGIN);
    // dact_ holds d loss / d relu(layer i); through the ReLU, then the layer.
    k_->relu_backward(dact_.data(), dact_.data(), kept(size_t(i)), rows * w);
    linear_grads(2 * static_cast<size_t>(i), dact_.data(), i ? kept(size_t(i - 1)) : input_, w);
    if (i > 0) {
      k_->linear_backward_input(dtmp_.data(), dact_.data(), values(2 * i), rows, w, w);
      std::swap(dact_, dtmp_);
    }
    ranges.lap(range_names_[i].c_str());
    unit_event(size_t(i), DDP_UNIT_BACKWARD_END);
  }
}

std::unique_ptr<Model> make_mlp(const MlpConfig& config, Device& device, uint64_t seed, bool with_gradients,
                                bool with_values) {
  auto model = std::make_unique<MlpModel>(config, device, seed, with_values);
  if (with_gradients) model->pack_gradients(device);
  return model;
}

}  // namespace ddp
