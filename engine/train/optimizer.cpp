// optimizer.cpp — SGD (momentum, coupled weight decay) and AdamW (decoupled
// weight decay, bias correction), following torch.optim's single-tensor
// code path of PyTorch 1.13 operation by operation, in float32, so results
// match PyTorch to rounding.
#include "optimizer.h"

#include "update_rules.h"
#if DDP_WITH_CUDA
#include "cuda/cuda_ops.h"
#endif

#include <fnmatch.h>

#include <cmath>

namespace ddp {
namespace {

// The update loops are built twice, for AVX2 and for the baseline, and the
// loader picks one per machine (GCC function multi-versioning). AVX2 alone,
// not x86-64-v3: without FMA the compiler cannot fuse a multiply and an add,
// so every operation rounds exactly as the scalar code and PyTorch's do, and
// results are bitwise the same on every machine. The file is compiled with
// -fno-math-errno so sqrt vectorises (v >= 0: sqrt never sets errno here).
// With AdamW on lm-cpu's 9.3 M parameters: 6 ms instead of 45.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DDP_UPDATE_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define DDP_UPDATE_CLONES
#endif

DDP_UPDATE_CLONES
void sgd_plain(float* __restrict w, const float* __restrict g, size_t n, float lr, float wd) {
  for (size_t k = 0; k < n; ++k) w[k] += -lr * (wd != 0.0f ? g[k] + wd * w[k] : g[k]);
}

DDP_UPDATE_CLONES
void sgd_momentum(float* __restrict w, const float* __restrict g, float* __restrict buf, size_t n, float lr, float wd,
                  float mu, bool first) {
  for (size_t k = 0; k < n; ++k) {
    const float d = wd != 0.0f ? g[k] + wd * w[k] : g[k];
    buf[k] = first ? d : buf[k] * mu + d;
    w[k] += -lr * buf[k];
  }
}

// Returns the sum of g's squares, as sum_of_squares (update_rules.h) takes it,
// bit for bit: measured in the pass that reads g anyway, the gradient norm
// of an unclipped step costs no pass of its own.
DDP_UPDATE_CLONES
double adamw_update(float* __restrict w, const float* __restrict g, float* __restrict m, float* __restrict v, size_t n,
                    const AdamScalars c) {
  return sum_squares_while(g, n, [&](size_t k) {
    w[k] *= c.decay;
    m[k] = m[k] * c.b1 + c.one_minus_b1 * g[k];         // exp_avg.mul_(b1).add_(g, alpha=1-b1)
    v[k] = v[k] * c.b2 + c.one_minus_b2 * g[k] * g[k];  // exp_avg_sq.mul_(b2).addcmul_(g, g, value=1-b2)
    const float denom = std::sqrt(v[k]) / c.bias2_sqrt + c.eps;
    w[k] = w[k] + -c.step_size * m[k] / denom;  // param.addcdiv_(m, denom, value=-step_size)
  });
}

}  // namespace

bool name_matches(const std::string& pattern, const std::string& name) {
  return fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
}

Optimizer::Optimizer(const OptimizerConfig& config, Device& device, const std::vector<Parameter>& params)
    : config_(config), device_(device), state_(params.size()), grad_sq_(params.size(), std::nan("")) {
  whole_.reserve(params.size());
  for (size_t g = 0; g < config.groups.size(); ++g) {
    bool used = false;
    for (const Parameter& p : params) used |= name_matches(config.groups[g].params, p.name);
    if (!used)
      throw ConfigError("optimizer.groups[" + std::to_string(g) + "].params: '" + config.groups[g].params +
                        "' matches no parameter of the model");
  }
  for (const Parameter& p : params) {
    Hyper h{config.lr, config.weight_decay};
    for (const ParamGroupConfig& g : config.groups) {
      if (name_matches(g.params, p.name)) {
        h = Hyper{g.lr, g.weight_decay};
        break;
      }
    }
    hyper_.push_back(h);
  }
}

Optimizer::~Optimizer() = default;

void Optimizer::begin_step(double lr_scale) {
  lr_scale_ = lr_scale;
  skipping_ = false;
  grad_sq_.assign(hyper_.size(), std::nan(""));
}

void Optimizer::step(std::vector<Parameter>& params, const size_t* indices, size_t count) {
  whole_.clear();
  for (size_t k = 0; k < count; ++k) {
    const Parameter& p = params.at(indices[k]);
    whole_.push_back(StepRange{indices[k], 0, p.data.numel(), p.grad.data(), nullptr});
  }
  step_ranges(params, whole_.data(), whole_.size());
}

void Optimizer::step_ranges(std::vector<Parameter>& params, const StepRange* ranges, size_t count) {
  for (size_t k = 0; k < count; ++k) {
    const StepRange& r = ranges[k];
    if (r.param >= params.size())
      throw Error("optimizer: parameter index " + std::to_string(r.param) + " is not in the table of " +
                      std::to_string(params.size()),
                  DDP_ERR_INVALID_ARGUMENT);
    Parameter& p = params[r.param];
    if (!p.trainable || p.uses == 0) continue;
    if (r.offset > p.data.numel() || r.count > p.data.numel() - r.offset)
      throw Error("optimizer: elements [" + std::to_string(r.offset) + ", " + std::to_string(r.offset + r.count) +
                      ") are outside parameter '" + p.name + "' of " + std::to_string(p.data.numel()),
                  DDP_ERR_INVALID_ARGUMENT);
    // No gradient given: the parameter's own (the engine's, or one bound).
    const float* g = r.grad ? r.grad : p.grad.defined() ? p.grad.data() + r.offset : nullptr;
    if (!g) throw Error("optimizer: no gradient for parameter '" + p.name + "'", DDP_ERR_INVALID_ARGUMENT);
    State& s = state_for(p, r);
    if (!r.data && !p.data.data())
      throw Error("optimizer: no values for parameter '" + p.name +
                      "': the strategy claimed them, so a range of it "
                      "must give its data (ddp_range::data)",
                  DDP_ERR_INVALID_ARGUMENT);
    if (skipping_) {  // the state a first update would start from (zeros), a resumed one's taken up
      if (keeps_state() && !s.first.defined())
        s.first = Tensor(device_, Shape{int64_t(r.count)}, MemCategory::OptimizerState);
      if (is_adamw() && !s.second.defined())
        s.second = Tensor(device_, Shape{int64_t(r.count)}, MemCategory::OptimizerState);
      continue;
    }
    float* w = r.data ? r.data : p.data.data() + r.offset;
    const Hyper h{hyper_[r.param].lr * lr_scale_, hyper_[r.param].weight_decay};
    const StepRange with{r.param, r.offset, r.count, g, w};
    if (config_.name == "adamw") {
      adamw(with, w, h, s, r.offset == 0 && r.count == p.data.numel());
    } else {
      sgd(with, w, h, s);
    }
  }
}

Optimizer::State& Optimizer::state_for(const Parameter& p, const StepRange& r) {
  auto& pieces = state_[r.param];
  for (const auto& s : pieces) {
    if (s->offset == r.offset && s->count == r.count) return *s;
    if (r.offset < s->offset + s->count && s->offset < r.offset + r.count)
      throw Error("optimizer: the state of '" + p.name + "' elements [" + std::to_string(s->offset) + ", " +
                      std::to_string(s->offset + s->count) + ") lives on this rank, and a step asks for [" +
                      std::to_string(r.offset) + ", " + std::to_string(r.offset + r.count) +
                      "): optimizer state never moves between ranges (or ranks)",
                  DDP_ERR_INVALID_ARGUMENT);
  }
  auto s = std::make_unique<State>();
  s->offset = r.offset;
  s->count = r.count;
  take_up(r.param, p, *s);
  pieces.push_back(std::move(s));
  return *pieces.back();
}

std::vector<SavedState> Optimizer::saved(size_t i) const {
  std::vector<SavedState> out;
  if (i >= state_.size()) return out;
  for (const auto& s : state_[i])
    out.push_back(SavedState{s->steps, s->first.to_host(), s->second.to_host(), s->offset, s->count});
  return out;
}

// A resumed parameter's state: the slice of it this range steps.
void Optimizer::take_up(size_t i, const Parameter& p, State& s) {
  SavedState saved;
  if (!restore_ || !restore_(i, s.offset, s.count, saved)) return;
  s.steps = saved.steps;
  const auto upload = [&](Tensor& t, const std::vector<float>& values) {
    if (values.empty()) return;
    if (values.size() != s.count)
      throw Error("checkpoint: optimizer state of '" + p.name + "' elements [" + std::to_string(s.offset) + ", " +
                      std::to_string(s.offset + s.count) + ") came as " + std::to_string(values.size()),
                  DDP_ERR_INTERNAL);
    t = Tensor(device_, Shape{int64_t(s.count)}, MemCategory::OptimizerState);
    device_.upload(t.data(), values.data(), t.bytes());
  };
  upload(s.first, saved.first);
  upload(s.second, saved.second);
}

// d = g + wd * w;  buf = momentum * buf + d (buf = d at first);  w -= lr * buf
void Optimizer::sgd(const StepRange& r, float* w, const Hyper& h, State& s) {
  const size_t n = r.count;
  const float* g = r.grad;
  const float lr = float(h.lr);
  const float wd = float(h.weight_decay);
  const float mu = float(config_.momentum);
  const bool first = mu != 0.0f && !s.first.defined();
  if (first) s.first = Tensor(device_, Shape{int64_t(n)}, MemCategory::OptimizerState);
#if DDP_WITH_CUDA
  if (void* stream = device_.compute_stream().native()) {
    if (mu == 0.0f)
      cuda_ops::sgd_plain(stream, w, g, n, lr, wd);
    else
      cuda_ops::sgd_momentum(stream, w, g, s.first.data(), n, lr, wd, mu, first);
    return;
  }
#endif
  if (mu == 0.0f)
    sgd_plain(w, g, n, lr, wd);
  else
    sgd_momentum(w, g, s.first.data(), n, lr, wd, mu, first);
}

// torch.optim.AdamW (_single_tensor_adamw, PyTorch 1.13):
//   w *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g
//   denom = sqrt(v) / sqrt(1 - b2^t) + eps;  w -= lr / (1 - b1^t) * m / denom
// The update measures the gradient's sum of squares (grad_squares) where
// it reads the whole parameter's.
void Optimizer::adamw(const StepRange& r, float* w, const Hyper& h, State& s, bool whole) {
  if (!s.first.defined()) {
    s.first = Tensor(device_, Shape{int64_t(r.count)}, MemCategory::OptimizerState);
    s.second = Tensor(device_, Shape{int64_t(r.count)}, MemCategory::OptimizerState);
  }
  s.steps += 1;
  const AdamScalars c = adamw_scalars(h.lr, h.weight_decay, config_.beta1, config_.beta2, config_.eps, s.steps);
#if DDP_WITH_CUDA
  if (void* stream = device_.compute_stream().native()) {
    cuda_ops::adamw_update(stream, w, r.grad, s.first.data(), s.second.data(), r.count, c);
    return;
  }
#endif
  const double squares = adamw_update(w, r.grad, s.first.data(), s.second.data(), r.count, c);
  if (whole) grad_sq_.at(r.param) = squares;
}

}  // namespace ddp
