// models.cpp — `toy` and `toy_tied` (docs/models.md): chains of bias-free
// (or frozen-bias) linear layers and ReLUs with an MSE loss, forward and
// backward written out over the device's kernels (kernels.h). A layer names its weight by index
// into the parameter table, which is how `toy_tied` uses fc2.weight twice.
#include "model.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "error.h"
#include "kernels.h"

namespace ddp {
namespace {

struct Layer {
  enum Kind { Linear, Relu } kind;
  int weight = -1;  // parameter index (Linear)
  int bias = -1;    // parameter index or -1
  int64_t in = 0;
  int64_t out = 0;
  size_t unit = 0;  // a linear layer and the ReLU after it are one unit
};

// The units of a chain of layers (and each layer's unit, set here).
std::vector<Unit> sequential_units(std::vector<Layer>& layers, const std::vector<Parameter>& params) {
  std::vector<Unit> units;
  std::vector<bool> owned(params.size(), false);
  for (Layer& l : layers) {
    if (l.kind == Layer::Linear) {
      units.push_back({"fc" + std::to_string(units.size() + 1), {}, {}});  // the toys' module names
      for (int p : {l.weight, l.bias}) {
        if (p < 0) continue;
        const size_t i = static_cast<size_t>(p);
        (owned[i] ? units.back().tied : units.back().params).push_back(i);
        owned[i] = true;
      }
    }
    l.unit = units.empty() ? 0 : units.size() - 1;
  }
  for (size_t i = 0; i < params.size(); ++i)
    if (!owned[i]) units.front().params.push_back(i);
  for (Unit& u : units) std::sort(u.params.begin(), u.params.end());
  return units;
}

class SequentialMse final : public Model {
 public:
  SequentialMse(Device& device, std::vector<Layer> layers)
      : device_(device), k_(make_kernels(device)), layers_(std::move(layers)) {}

  int64_t input_width() const override { return layers_.front().in; }
  int64_t output_width() const override { return out_width_; }
  void set_compute_dtype(ddp_dtype dtype) override { k_->set_compute_dtype(dtype); }

  void add_param(const std::string& name, Shape shape, bool trainable, int uses = 1) {
    Parameter& p = declare_param(device_, name, shape);
    p.trainable = trainable;
    p.uses = uses;
  }

  // Each linear layer (with the ReLU after it) is a unit, named after its
  // module (fc1, fc2, ...); a parameter no layer reads goes to the first
  // unit, a weight a later layer reads again is tied there.
  // `draw`: the constructor's draw of each parameter (model.h's set_draw).
  void finish_setup(uint64_t seed, Draw draw) {
    set_draw(seed, std::move(draw));
    declare_units(sequential_units(layers_, params_));
    int64_t width = 0;
    for (auto& l : layers_) width = l.kind == Layer::Linear ? l.out : width;
    out_width_ = width;
    // A linear layer's range (with the ReLU after it) is named after its
    // weight: "backward fc2.fc" for fc2.fc.weight.
    for (const Layer& l : layers_) {
      std::string name = l.kind == Layer::Linear ? params_[l.weight].name : "";
      if (name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0) name.resize(name.size() - 7);
      range_names_.push_back("backward " + name);
    }
  }

  float forward(const Batch& batch) override {
    ensure_activations(batch.rows);
    input_ = batch.x;
    target_ = batch.y;
    if (x_dev_.defined()) {  // a GPU: x and y into its memory
      k_->upload(x_dev_.data(), batch.x, x_dev_.bytes());
      k_->upload(y_dev_.data(), batch.y, y_dev_.bytes());
      input_ = x_dev_.data();
      target_ = y_dev_.data();
    }
    const float* in = input_;
    int64_t width = input_width();
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& l = layers_[i];
      if (i == 0 || l.unit != layers_[i - 1].unit) {
        if (i > 0) unit_event(layers_[i - 1].unit, DDP_UNIT_FORWARD_END);
        unit_event(l.unit, DDP_UNIT_FORWARD_BEGIN);
      }
      float* out = acts_[i].data();
      if (l.kind == Layer::Linear) {
        // out[B, o] = in[B, i] · W[o, i]^T (+ b)
        k_->linear_forward(out, in, values(l.weight), batch.rows, l.in, l.out);
        if (l.bias >= 0) k_->bias_forward(out, values(l.bias), batch.rows, l.out);
        width = l.out;
      } else {
        k_->relu_forward(out, in, batch.rows * width);
      }
      in = out;
    }
    unit_event(layers_.back().unit, DDP_UNIT_FORWARD_END);
    // MSE, mean over all elements (summed in double).
    return k_->mse_forward(acts_.back().data(), target_, batch.rows * out_width_);
  }

  void backward(float loss_scale, const GradAccumulated& accumulated) override {
    const int64_t rows = rows_;
    RangeLaps ranges(range_hook_);
    // d(mean((p - y)^2))/dp = 2 (p - y) / n
    k_->mse_backward(grads_.back().data(), acts_.back().data(), target_, rows * out_width_, loss_scale);
    for (size_t i = layers_.size(); i-- > 0;) {
      const Layer& l = layers_[i];
      if (i + 1 == layers_.size() || l.unit != layers_[i + 1].unit) {
        if (i + 1 < layers_.size()) unit_event(layers_[i + 1].unit, DDP_UNIT_BACKWARD_END);
        unit_event(l.unit, DDP_UNIT_BACKWARD_BEGIN);
      }
      const float* dout = grads_[i].data();
      const float* in = i == 0 ? input_ : acts_[i - 1].data();
      float* din = i == 0 ? nullptr : grads_[i - 1].data();
      if (l.kind == Layer::Relu) {
        k_->relu_backward(din, dout, acts_[i].data(), static_cast<int64_t>(acts_[i].numel()));
        continue;
      }
      // din[B, i] = dout[B, o] · W[o, i]
      if (din) k_->linear_backward_input(din, dout, values(l.weight), rows, l.in, l.out);
      if (float* db = l.bias >= 0 ? grad_out(static_cast<size_t>(l.bias)) : nullptr) {
        k_->bias_backward(db, dout, rows, l.out);
        accumulated(static_cast<size_t>(l.bias));
      }
      if (float* dw = grad_out(static_cast<size_t>(l.weight))) {  // dW[o, i] += dout[B, o]^T · in[B, i]
        k_->linear_backward_weight(dw, dout, in, rows, l.in, l.out);
        accumulated(static_cast<size_t>(l.weight));
      }
      ranges.lap(range_names_[i].c_str());
    }
    unit_event(layers_.front().unit, DDP_UNIT_BACKWARD_END);
  }

 private:
  void ensure_activations(int64_t rows) {
    if (rows == rows_) return;
    acts_.clear();
    grads_.clear();
    x_dev_.reset();
    y_dev_.reset();
    if (k_->kind() != DDP_DEVICE_CPU) {
      x_dev_ = Tensor(device_, Shape{rows, input_width()}, MemCategory::Activations);
      y_dev_ = Tensor(device_, Shape{rows, output_width()}, MemCategory::Activations);
    }
    int64_t width = input_width();
    for (const Layer& l : layers_) {
      if (l.kind == Layer::Linear) width = l.out;
      acts_.emplace_back(device_, Shape{rows, width}, MemCategory::Activations);
      grads_.emplace_back(device_, Shape{rows, width}, MemCategory::Activations);
    }
    rows_ = rows;
  }

  Device& device_;
  std::unique_ptr<Kernels> k_;  // the device's layers
  std::vector<Layer> layers_;
  int64_t out_width_ = 0;
  int64_t rows_ = -1;
  const float* input_ = nullptr;   // x of the last forward [rows, in]
  const float* target_ = nullptr;  // y of the last forward [rows, out]
  Tensor x_dev_;                   // a GPU's copy of x
  Tensor y_dev_;                   // a GPU's copy of y
  std::vector<Tensor> acts_;       // output of layer i [rows, width_i]
  std::vector<Tensor> grads_;      // d loss / d acts_[i]
};

Layer linear(int weight, int64_t in, int64_t out, int bias = -1) {
  return Layer{Layer::Linear, weight, bias, in, out, 0};
}
Layer relu() { return Layer{Layer::Relu}; }

// nn.Linear's default initialisation: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for
// weight and bias alike. Drawn on the host.
void init_uniform(float* out, size_t n, int64_t fan_in, std::mt19937_64& rng) {
  float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
  std::uniform_real_distribution<float> dist(-bound, bound);
  for (size_t k = 0; k < n; ++k) out[k] = dist(rng);
}

std::unique_ptr<Model> make_toy(const std::string& name, Device& device, uint64_t seed) {
  if (name == "toy") {
    // 0 no_grad_fixed_param, 1 fc1.weight, 2 fc2.fc.weight, 3 fc2.fc.bias, 4 fc3.weight
    auto m = std::make_unique<SequentialMse>(
        device, std::vector<Layer>{linear(1, 10, 10), relu(), linear(2, 10, 50, 3), relu(), linear(4, 50, 5)});
    m->add_param("no_grad_fixed_param", {2}, false, 0);
    m->add_param("fc1.weight", {10, 10}, true);
    m->add_param("fc2.fc.weight", {50, 10}, true);
    m->add_param("fc2.fc.bias", {50}, false);
    m->add_param("fc3.weight", {5, 50}, true);
    m->finish_setup(seed, [m = m.get()](size_t index, float* out, std::mt19937_64& rng) {
      static constexpr int64_t fan_in[] = {0, 10, 10, 10, 50};
      const size_t n = numel_of(m->params()[index].shape);
      if (index == 0)
        std::fill(out, out + n, 2.0f);
      else
        init_uniform(out, n, fan_in[index], rng);
    });
    return m;
  }
  if (name == "toy_tied") {
    // 0 fc1.weight, 1 fc2.weight (also fc4), 2 fc3.weight, 3 fc5.weight
    auto m = std::make_unique<SequentialMse>(
        device, std::vector<Layer>{linear(0, 10, 10), relu(), linear(1, 10, 50), relu(), linear(2, 50, 10), relu(),
                                   linear(1, 10, 50), relu(), linear(3, 50, 5)});
    m->add_param("fc1.weight", {10, 10}, true);
    m->add_param("fc2.weight", {50, 10}, true, /*uses=*/2);
    m->add_param("fc3.weight", {10, 50}, true);
    m->add_param("fc5.weight", {5, 50}, true);
    m->finish_setup(seed, [m = m.get()](size_t index, float* out, std::mt19937_64& rng) {
      static constexpr int64_t fan_in[] = {10, 10, 50, 50};
      init_uniform(out, numel_of(m->params()[index].shape), fan_in[index], rng);
    });
    return m;
  }
  throw Error("unknown model '" + name + "' (known: toy, toy_tied)");
}

}  // namespace

std::unique_ptr<Model> make_model(const std::string& name, Device& device, uint64_t seed, bool with_gradients,
                                  bool with_values) {
  std::unique_ptr<Model> model = make_toy(name, device, seed);
  if (with_values) model->materialise(device);
  if (with_gradients) model->pack_gradients(device);
  return model;
}

void Model::pack_gradients(Device& device) {
  packed_ = true;
  size_t total = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = params_[i];
    if (held_elsewhere(i)) continue;  // not the model's block
    p.grad.reset();
    if (p.trainable) total += numel_of(p.shape);
  }
  gradient_block_.reset();  // the old block goes before the new one comes
  if (total == 0) return;
  gradient_block_ = Tensor(device, Shape{static_cast<int64_t>(total)}, MemCategory::Gradients);
  device.fill(gradient_block_.data(), total, 0.0f, device.compute_stream());
  size_t offset = 0;
  for (size_t i = params_.size(); i-- > 0;) {
    Parameter& p = params_[i];
    if (!p.trainable || held_elsewhere(i)) continue;
    p.grad = Tensor::view(device, gradient_block_.data() + offset, p.shape);
    offset += p.grad.numel();
  }
}

void Model::set_draw(uint64_t seed, Draw draw) {
  draw_ = std::move(draw);
  seed_ = seed;
  rng_.seed(seed);
  next_draw_ = 0;
}

void Model::draw_initial(size_t index, float* out) {
  if (index >= params_.size() || !draw_)
    throw Error("draw_initial: parameter " + std::to_string(index) + " of " + std::to_string(params_.size()) +
                    (draw_ ? "" : ", and the model sets no draw"),
                DDP_ERR_INTERNAL);
  if (index < next_draw_) {  // back to the start
    rng_.seed(seed_);
    next_draw_ = 0;
  }
  std::vector<float> skipped;
  for (; next_draw_ < index; ++next_draw_) {  // the ones between, drawn and dropped
    skipped.resize(numel_of(params_[next_draw_].shape));
    draw_(next_draw_, skipped.data(), rng_);
  }
  draw_(index, out, rng_);
  ++next_draw_;
}

void Model::materialise(Device& device) {
  std::vector<float> host;
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = params_[i];
    p.data = Tensor(device, p.shape, MemCategory::Parameters);
    host.resize(p.data.numel());
    draw_initial(i, host.data());
    device.upload(p.data.data(), host.data(), p.data.bytes());
  }
}

void check_units(const std::vector<Unit>& units, size_t param_count) {
  std::vector<int> owner(param_count, -1);
  for (size_t u = 0; u < units.size(); ++u) {
    for (size_t i : units[u].params) {
      if (i >= param_count)
        throw Error("unit '" + units[u].name + "' owns parameter " + std::to_string(i) + " of a table of " +
                    std::to_string(param_count));
      if (owner[i] >= 0)
        throw Error("parameter " + std::to_string(i) + " is owned by two units, '" + units[size_t(owner[i])].name +
                    "' and '" + units[u].name + "'");
      owner[i] = static_cast<int>(u);
    }
  }
  for (size_t i = 0; i < param_count; ++i)
    if (!units.empty() && owner[i] < 0) throw Error("parameter " + std::to_string(i) + " belongs to no unit");
  for (size_t u = 0; u < units.size(); ++u)
    for (size_t i : units[u].tied)
      if (i >= param_count || owner[i] < 0 || owner[i] == static_cast<int>(u))
        throw Error("unit '" + units[u].name + "' ties parameter " + std::to_string(i) +
                    ", which is not another unit's");
}

void Model::declare_units(std::vector<Unit> units) {
  check_units(units, params_.size());
  units_ = std::move(units);
  for (size_t u = 0; u < units_.size(); ++u)
    for (size_t i : units_[u].params) params_[i].unit = u;
}

void Model::unbound_gradient(size_t index) const {
  const Parameter& p = params_[index];
  if (!held_elsewhere(index))
    throw Error("backward reached the gradient of '" + p.name +
                    "', which has no storage: the model's gradients "
                    "were never made (Model::pack_gradients)",
                DDP_ERR_INTERNAL);
  const std::string unit = p.unit < units_.size() ? units_[p.unit].name : std::string("?");
  throw Error("backward reached the gradient of '" + p.name + "', whose storage the strategy claimed and bound " +
                  "none to: bind it (ddp_host::bind) at the latest in on_unit(BACKWARD_BEGIN) of unit '" + unit +
                  "' or of a unit that reads it before",
              DDP_ERR_INVALID_ARGUMENT);
}

void Model::unbound_values(size_t index) const {
  const Parameter& p = params_[index];
  const std::string unit = p.unit < units_.size() ? units_[p.unit].name : std::string("?");
  throw Error("the model read the values of '" + p.name + "', which the strategy claimed and bound none to: bind " +
                  "them (ddp_host::bind, DDP_STORAGE_DATA) at the latest in on_unit(FORWARD_BEGIN or BACKWARD_BEGIN) " +
                  "of each unit that reads them (unit '" + unit + "' owns them)",
              DDP_ERR_INVALID_ARGUMENT);
}

void keep_activation(Kernels& kernels, Tensor& saved, const float* value) {
  if (saved.dtype() == DDP_FLOAT32) {
    if (saved.data() != value) throw Error("keep_activation: a float32 activation computed outside its memory");
    return;
  }
  kernels.convert(saved.raw(), saved.dtype(), value, DDP_FLOAT32, saved.numel());
}

const float* unpack_activation(Kernels& kernels, const Tensor& saved, Tensor& into) {
  if (saved.dtype() == DDP_FLOAT32) return saved.data();
  if (into.numel() < saved.numel()) throw Error("unpack_activation: the working buffer is smaller than the tensor");
  kernels.convert(into.data(), DDP_FLOAT32, saved.raw(), saved.dtype(), saved.numel());
  return into.data();
}

int64_t act_bytes(const std::vector<ActBuffer>& buffers) {
  int64_t bytes = 0;
  for (const ActBuffer& b : buffers)
    bytes += static_cast<int64_t>(numel_of(b.shape)) * (b.dtype == DDP_FLOAT32 ? 4 : 2);
  return bytes;
}

}  // namespace ddp
