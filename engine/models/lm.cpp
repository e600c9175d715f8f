// lm.cpp — the `lm` Transformer's forward and hand-written backward over the
// layers of layers.h. Batch and time are folded into the GEMMs' M dimension
// (N = rows * T); residual adds ride on the GEMMs (beta = 1). Activations and
// backward scratch are allocated on the first forward for a given number of
// rows and reused: forward and backward themselves never allocate.
#include "lm.h"

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <random>
#include <utility>

#include "error.h"
#include "kernels.h"
#include "layers.h"

namespace ddp {

const std::vector<LmPreset>& lm_presets() {
  // {vocab, context, d_model, layers, heads, d_ff}. The GPT-2-like sizes
  // (small .. 2.7B) use context 256 here, the CS336 benchmarking setting.
  static const std::vector<LmPreset> presets = {
      {"lm-tiny", {512, 32, 64, 2, 4, 256}},
      {"lm-cpu", {10000, 128, 256, 4, 4, 1024}},
      {"small", {10000, 256, 768, 12, 12, 3072}},
      {"medium", {10000, 256, 1024, 24, 16, 4096}},
      {"large", {10000, 256, 1280, 36, 20, 5120}},
      {"xl", {10000, 256, 1600, 48, 25, 6400}},
      {"2.7B", {10000, 256, 2560, 32, 32, 10240}},
      // Accounting only (`ddp plan`): 126 FFN-only blocks, 2.2e11 parameters.
      {"xxl", {0, 0, 16384, 126, 0, 53248, 10000, true}},
  };
  return presets;
}

LmConfig lm_preset(const std::string& name) {
  std::string known;
  for (const LmPreset& p : lm_presets()) {
    if (p.name == name) return p.config;
    known += (known.empty() ? "" : ", ") + p.name;
  }
  throw Error("unknown lm preset '" + name + "' (known: " + known + ")");
}

int64_t lm_parameter_count(const LmConfig& c) {
  const int64_t d = c.d_model;
  if (c.ffn_only) return c.num_layers * 2 * d * c.d_ff;
  const int64_t per_layer = 2 * d + 4 * d * d + 3 * d * c.d_ff;
  return 2 * c.vocab_size * d + c.num_layers * per_layer + d;
}

namespace {

// Throws Error if the product of `sizes` (elements of a tensor or a sum of
// them) exceeds 2^50: sizes no machine holds, whose counts would overflow.
void check_product(std::initializer_list<int64_t> sizes) {
  int64_t product = 1;
  std::string text;
  for (const int64_t v : sizes) {
    text += (text.empty() ? "" : " x ") + std::to_string(v);
    if (__builtin_mul_overflow(product, v, &product) || product > (int64_t{1} << 50))
      throw Error("lm: sizes too large: " + text + "... elements (at most 2^50)");
  }
}

// Throws Error for sizes no model can have: what the constructor refuses,
// and sizes whose element counts would overflow.
void check_sizes(const LmConfig& c) {
  if (c.num_layers > kMaxLayers)
    throw Error("lm: num_layers " + std::to_string(c.num_layers) + " is more than " + std::to_string(kMaxLayers) +
                " layers (model.h's kMaxLayers)");
  if (c.ffn_only) {  // accounting only: its widths and depth
    if (c.d_model < 1 || c.d_ff < 1 || c.num_layers < 1)
      throw Error("lm: an FFN-only model needs d_model, d_ff and num_layers of at least 1");
    check_product({c.num_layers, c.d_model, c.d_ff});
    return;
  }
  if (c.vocab_size < 1 || c.context_length < 1 || c.d_model < 1 || c.num_layers < 0 || c.num_heads < 1 || c.d_ff < 1 ||
      !(c.rope_theta > 0))
    throw Error("lm: sizes must be positive (vocab_size " + std::to_string(c.vocab_size) + ", context_length " +
                std::to_string(c.context_length) + ", d_model " + std::to_string(c.d_model) + ", num_layers " +
                std::to_string(c.num_layers) + ", num_heads " + std::to_string(c.num_heads) + ", d_ff " +
                std::to_string(c.d_ff) + ")");
  if (c.d_model % c.num_heads != 0 || (c.d_model / c.num_heads) % 2 != 0)
    throw Error("lm: d_model " + std::to_string(c.d_model) + " must split into num_heads " +
                std::to_string(c.num_heads) + " heads of an even size (RoPE rotates pairs)");
  check_product({c.num_layers, c.d_model, c.d_ff});
  check_product({c.vocab_size, c.d_model});
  check_product({c.context_length, c.context_length, c.num_heads});
}

}  // namespace

std::vector<std::pair<std::string, Shape>> lm_parameter_shapes(const LmConfig& c) {
  const int64_t d = c.d_model;
  const int64_t f = c.d_ff;
  const int64_t v = c.vocab_size;
  std::vector<std::pair<std::string, Shape>> table;
  if (!c.ffn_only) table.push_back({"token_embeddings.weight", {v, d}});
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    if (c.ffn_only) {
      table.push_back({p + "ffn.w1.weight", {f, d}});
      table.push_back({p + "ffn.w2.weight", {d, f}});
      continue;
    }
    table.push_back({p + "ln1.weight", {d}});
    for (const char* m : {"q_proj", "k_proj", "v_proj", "output_proj"})
      table.push_back({p + "attn." + m + ".weight", {d, d}});
    table.push_back({p + "ln2.weight", {d}});
    table.push_back({p + "ffn.w1.weight", {f, d}});
    table.push_back({p + "ffn.w2.weight", {d, f}});
    table.push_back({p + "ffn.w3.weight", {f, d}});
  }
  if (!c.ffn_only) {
    table.push_back({"ln_final.weight", {d}});
    table.push_back({"lm_head.weight", {v, d}});
  }
  return table;
}

namespace {
int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (const int64_t v : s) n *= v;
  return n;
}
}  // namespace

Footprint lm_footprint(const LmConfig& c, int64_t rows, ddp_device_kind device) {
  check_sizes(c);
  check_product({rows, c.context_length, c.vocab_size + c.d_ff + c.num_heads * c.context_length});
  Footprint f;
  for (const auto& [name, shape] : lm_parameter_shapes(c)) f.params.push_back({name, numel(shape), shape});
  f.data = DataShape{DataShape::Tokens, 0, 0, c.context_length, c.vocab_size};
  f.units = lm_units(c);
  f.d_model = c.d_model;
  f.d_ff = c.d_ff;
  f.layers = c.num_layers;
  f.plan_only = c.ffn_only;
  f.ffn_matrices = c.ffn_only ? 2 : 3;  // SwiGLU: w1, w2, w3
  if (c.ffn_only) {                     // backward keeps each linear's input: D + F per token per block
    f.saved_elements_per_token = static_cast<double>(c.num_layers * (c.d_model + c.d_ff));
    return f;
  }
  const int64_t half = c.d_model / c.num_heads / 2;
  const int64_t kFloat = 4;
  f.setup_activation_bytes = 2 * c.context_length * half * kFloat;  // RoPE cos, sin
  int64_t floats = 0;
  for (const Shape& s : LmModel::activation_shapes(c, rows, device)) floats += numel(s);
  f.step_activation_bytes = floats * kFloat;
  if (rows > 0 && c.context_length > 0)
    f.saved_elements_per_token = static_cast<double>(floats) / static_cast<double>(rows * c.context_length);
  return f;
}

LmModel::LmModel(const LmConfig& config, Device& device, uint64_t seed, bool with_values)
    : device_(device), k_(make_kernels(device)), config_(config) {
  const LmConfig& c = config_;
  if (c.ffn_only) throw Error("lm: an FFN-only size is for accounting only; no model is built of it");
  check_sizes(c);
  head_dim_ = c.d_model / c.num_heads;

  for (const auto& [name, shape] : lm_parameter_shapes(c)) declare_param(device_, name, shape);
  declare_units(lm_units(c));
  for (int64_t l = 0; l < c.num_layers; ++l) range_names_.push_back("backward layers." + std::to_string(l));

  // In table order: embeddings N(0, 1), linears N(0, 2 / (in + out)), both
  // truncated at 3 std; RMSNorm gains 1. Drawn on the host.
  set_draw(seed, [this](size_t index, float* out, std::mt19937_64& rng) {
    const Parameter& p = params_[index];
    const int64_t n = static_cast<int64_t>(numel_of(p.shape));
    if (p.shape.size() == 1) {
      std::fill(out, out + n, 1.0f);
    } else if (p.name == "token_embeddings.weight") {
      layers::init_trunc_normal(out, n, 1.0, rng);
    } else {
      const double fan = static_cast<double>(p.shape[0] + p.shape[1]);
      layers::init_trunc_normal(out, n, std::sqrt(2.0 / fan), rng);
    }
  });

  const int64_t t = c.context_length;
  const int64_t half = head_dim_ / 2;
  rope_cos_ = Tensor(device_, {t, half}, MemCategory::Activations);
  rope_sin_ = Tensor(device_, {t, half}, MemCategory::Activations);
  std::vector<float> cos(static_cast<size_t>(t * half));
  std::vector<float> sin(cos.size());
  layers::rope_tables(cos.data(), sin.data(), t, head_dim_, c.rope_theta);
  device_.upload(rope_cos_.data(), cos.data(), rope_cos_.bytes());
  device_.upload(rope_sin_.data(), sin.data(), rope_sin_.bytes());
  if (with_values) materialise(device_);
}

std::vector<Shape> LmModel::activation_shapes(const LmConfig& c, int64_t rows, ddp_device_kind device) {
  const int64_t t = c.context_length;
  const int64_t d = c.d_model;
  const int64_t f = c.d_ff;
  const int64_t h = c.num_heads;
  const int64_t n = rows * t;
  std::vector<Shape> s;
  if (device != DDP_DEVICE_CPU) s.push_back({2 * n});  // tokens_dev_: int32 ids in floats' bytes
  s.push_back({n, d});                                 // x0_
  for (int64_t l = 0; l < c.num_layers; ++l)           // BlockActs, in member order
    for (Shape b : {Shape{n, d}, Shape{n}, Shape{n, d}, Shape{n, d}, Shape{n, d}, Shape{rows, h, t, t}, Shape{n, d},
                    Shape{n, d}, Shape{n, d}, Shape{n}, Shape{n, f}, Shape{n, f}, Shape{n, f}, Shape{n, d}})
      s.push_back(b);
  for (Shape b : {Shape{n, d}, Shape{n}, Shape{n, c.vocab_size}, Shape{n},  // lnf_ .. lse_
                  Shape{n, d}, Shape{n, d}, Shape{n, d}, Shape{n, d}, Shape{n, d}, Shape{n, d}, Shape{n, f},
                  Shape{n, f}, Shape{n, f}})  // dresid_ .. db_
    s.push_back(b);
  s.push_back({static_cast<int64_t>(attention_scratch_floats(device, rows, t, h))});  // dscores_
  return s;
}

void LmModel::ensure_activations(int64_t rows) {
  if (rows == rows_) return;
  // Release the old sizes first so the peak never holds both.
  blocks_.clear();
  for (Tensor* old : {&tokens_dev_, &x0_, &lnf_, &rmsf_, &logits_, &lse_, &dresid_, &dln_, &datt_, &dq_, &dk_, &dv_,
                      &dgate_, &da_, &db_, &dscores_})
    old->reset();

  const int64_t n = rows * config_.context_length;
  inputs_.assign(static_cast<size_t>(n), 0);
  targets_.assign(static_cast<size_t>(n), 0);
  const std::vector<Shape> shapes = activation_shapes(config_, rows, k_->kind());
  size_t next = 0;  // the shapes, taken in activation_shapes' order
  auto act = [&] { return Tensor(device_, shapes.at(next++), MemCategory::Activations); };
  if (k_->kind() != DDP_DEVICE_CPU) tokens_dev_ = act();
  x0_ = act();
  blocks_.resize(static_cast<size_t>(config_.num_layers));
  for (BlockActs& b : blocks_)
    for (Tensor* t :
         {&b.ln1, &b.rms1, &b.q, &b.k, &b.v, &b.p, &b.att, &b.h, &b.ln2, &b.rms2, &b.a, &b.b, &b.gate, &b.y})
      *t = act();
  for (Tensor* t :
       {&lnf_, &rmsf_, &logits_, &lse_, &dresid_, &dln_, &datt_, &dq_, &dk_, &dv_, &dgate_, &da_, &db_, &dscores_})
    *t = act();
  if (next != shapes.size()) throw Error("lm: activation_shapes and ensure_activations disagree");
  rows_ = rows;
}

float LmModel::forward(const Batch& batch) {
  if (!batch.tokens) throw Error("lm: the batch has no tokens (the lm model trains on token data)");
  if (batch.rows < 1) throw Error("lm: a batch needs at least one row");
  ensure_activations(batch.rows);
  const int64_t rows = batch.rows;
  const int64_t t = config_.context_length;
  const int64_t d = config_.d_model;
  const int64_t f = config_.d_ff;
  const int64_t heads = config_.num_heads;
  const int64_t vocab = config_.vocab_size;
  const int64_t n = rows * t;

  for (int64_t r = 0; r < rows; ++r) {
    const int32_t* row = batch.tokens + r * (t + 1);
    for (int64_t i = 0; i <= t; ++i)
      if (row[i] < 0 || row[i] >= vocab)
        throw Error("lm: token " + std::to_string(row[i]) + " at row " + std::to_string(r) + ", position " +
                    std::to_string(i) + " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    std::memcpy(&inputs_[r * t], row, sizeof(int32_t) * t);
    std::memcpy(&targets_[r * t], row + 1, sizeof(int32_t) * t);
  }
  if (tokens_dev_.defined()) {  // a GPU: the kernels read the ids from its memory
    k_->upload(tokens_dev_.data(), inputs_.data(), sizeof(int32_t) * n);
    k_->upload(tokens_dev_.data() + n, targets_.data(), sizeof(int32_t) * n);
  }

  const size_t head = head_unit();
  unit_event(0, DDP_UNIT_FORWARD_BEGIN);
  k_->embedding_forward(x0_.data(), in_tokens(), w(0), n, d);
  unit_event(0, DDP_UNIT_FORWARD_END);
  const float* x = x0_.data();  // [N, D] the residual stream entering each block
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    unit_event(block_unit(l), DDP_UNIT_FORWARD_BEGIN);
    BlockActs& b = blocks_[l];
    // h = x + output_proj(attention(RoPE(q), RoPE(k), v)) of RMSNorm1(x)
    k_->rmsnorm_forward(b.ln1.data(), b.rms1.data(), x, w(layer_param(l, kLn1)), n, d);
    k_->linear_forward(b.q.data(), b.ln1.data(), w(layer_param(l, kQ)), n, d, d);
    k_->linear_forward(b.k.data(), b.ln1.data(), w(layer_param(l, kK)), n, d, d);
    k_->linear_forward(b.v.data(), b.ln1.data(), w(layer_param(l, kV)), n, d, d);
    k_->rope_forward(b.q.data(), rope_cos_.data(), rope_sin_.data(), rows, t, heads, head_dim_);
    k_->rope_forward(b.k.data(), rope_cos_.data(), rope_sin_.data(), rows, t, heads, head_dim_);
    k_->attention_forward(b.att.data(), b.p.data(), b.q.data(), b.k.data(), b.v.data(), rows, t, heads, head_dim_);
    k_->copy(b.h.data(), x, b.h.bytes());
    k_->linear_forward(b.h.data(), b.att.data(), w(layer_param(l, kO)), n, d, d, true);
    // y = h + w2(silu(w1 z) * w3 z), z = RMSNorm2(h)
    k_->rmsnorm_forward(b.ln2.data(), b.rms2.data(), b.h.data(), w(layer_param(l, kLn2)), n, d);
    k_->linear_forward(b.a.data(), b.ln2.data(), w(layer_param(l, kW1)), n, d, f);
    k_->linear_forward(b.b.data(), b.ln2.data(), w(layer_param(l, kW3)), n, d, f);
    k_->swiglu_forward(b.gate.data(), b.a.data(), b.b.data(), n * f);
    k_->copy(b.y.data(), b.h.data(), b.y.bytes());
    k_->linear_forward(b.y.data(), b.gate.data(), w(layer_param(l, kW2)), n, f, d, true);
    x = b.y.data();
    unit_event(block_unit(l), DDP_UNIT_FORWARD_END);
  }
  unit_event(head, DDP_UNIT_FORWARD_BEGIN);
  k_->rmsnorm_forward(lnf_.data(), rmsf_.data(), x, w(ln_final_index()), n, d);
  k_->linear_forward(logits_.data(), lnf_.data(), w(lm_head_index()), n, d, vocab);
  unit_event(head, DDP_UNIT_FORWARD_END);
  return static_cast<float>(k_->cross_entropy_forward(lse_.data(), logits_.data(), target_tokens(), n, vocab));
}

void LmModel::weight_grad(size_t index, const float* dy, const float* x, int64_t in, int64_t out, float alpha) {
  const int64_t n = rows_ * config_.context_length;
  if (float* dw = g(index)) k_->linear_backward_weight(dw, dy, x, n, in, out, alpha);
}

// Block l's backward: dresid_ holds dy on entry and dx on return.
void LmModel::block_backward(int64_t l, const GradAccumulated& done) {
  const int64_t rows = rows_;
  const int64_t t = config_.context_length;
  const int64_t d = config_.d_model;
  const int64_t f = config_.d_ff;
  const int64_t heads = config_.num_heads;
  const int64_t n = rows * t;
  BlockActs& b = blocks_[l];
  const float* x = l ? blocks_[l - 1].y.data() : x0_.data();
  // dresid_ holds dy; FFN branch: y = h + w2 gate.
  k_->linear_backward_input(dgate_.data(), dresid_.data(), w(layer_param(l, kW2)), n, f, d);
  k_->swiglu_backward(da_.data(), db_.data(), dgate_.data(), b.a.data(), b.b.data(), n * f);
  weight_grad(layer_param(l, kW3), db_.data(), b.ln2.data(), d, f);
  done(layer_param(l, kW3));
  weight_grad(layer_param(l, kW2), dresid_.data(), b.gate.data(), f, d);
  done(layer_param(l, kW2));
  weight_grad(layer_param(l, kW1), da_.data(), b.ln2.data(), d, f);
  done(layer_param(l, kW1));
  k_->linear_backward_input(dln_.data(), da_.data(), w(layer_param(l, kW1)), n, d, f);
  k_->linear_backward_input(dln_.data(), db_.data(), w(layer_param(l, kW3)), n, d, f, true);
  k_->rmsnorm_backward(dresid_.data(), g(layer_param(l, kLn2)), dln_.data(), b.h.data(), w(layer_param(l, kLn2)),
                       b.rms2.data(), n, d, /*accumulate=*/true);
  done(layer_param(l, kLn2));
  // dresid_ holds dh; attention branch: h = x + output_proj att.
  k_->linear_backward_input(datt_.data(), dresid_.data(), w(layer_param(l, kO)), n, d, d);
  weight_grad(layer_param(l, kO), dresid_.data(), b.att.data(), d, d);
  done(layer_param(l, kO));
  k_->attention_backward(dq_.data(), dk_.data(), dv_.data(), dscores_.data(), datt_.data(), b.p.data(), b.q.data(),
                         b.k.data(), b.v.data(), rows, t, heads, head_dim_);
  k_->rope_backward(dq_.data(), rope_cos_.data(), rope_sin_.data(), rows, t, heads, head_dim_);
  k_->rope_backward(dk_.data(), rope_cos_.data(), rope_sin_.data(), rows, t, heads, head_dim_);
  weight_grad(layer_param(l, kV), dv_.data(), b.ln1.data(), d, d);
  done(layer_param(l, kV));
  weight_grad(layer_param(l, kK), dk_.data(), b.ln1.data(), d, d);
  done(layer_param(l, kK));
  weight_grad(layer_param(l, kQ), dq_.data(), b.ln1.data(), d, d);
  done(layer_param(l, kQ));
  k_->linear_backward_input(dln_.data(), dq_.data(), w(layer_param(l, kQ)), n, d, d);
  k_->linear_backward_input(dln_.data(), dk_.data(), w(layer_param(l, kK)), n, d, d, true);
  k_->linear_backward_input(dln_.data(), dv_.data(), w(layer_param(l, kV)), n, d, d, true);
  k_->rmsnorm_backward(dresid_.data(), g(layer_param(l, kLn1)), dln_.data(), x, w(layer_param(l, kLn1)), b.rms1.data(),
                       n, d, /*accumulate=*/true);
  done(layer_param(l, kLn1));
}

void LmModel::backward(float loss_scale, const GradAccumulated& accumulated) {
  if (rows_ < 1) throw Error("lm: backward before forward");
  const int64_t d = config_.d_model;
  const int64_t vocab = config_.vocab_size;
  const int64_t n = rows_ * config_.context_length;
  const GradAccumulated done = [&](size_t index) {
    if (params_[index].trainable) accumulated(index);
  };
  RangeLaps ranges(range_hook_);

  // Head: the forward left softmax - onehot in place of the logits; the
  // mean's 1 / N and the loss scale go into the alpha of the two GEMMs
  // that read it, not a pass of their own over [N, V]. In 16-bit compute
  // the GEMMs round their inputs, so the gradient is scaled before, as
  // autograd gives it to them (gemm.h).
  float* dlogits = logits_.data();  // [N, V]
  float c = loss_scale / static_cast<float>(n);
  unit_event(head_unit(), DDP_UNIT_BACKWARD_BEGIN);
  if (k_->compute_dtype() != DDP_FLOAT32) {
    k_->cross_entropy_backward(dlogits, n, vocab, loss_scale);
    c = 1.0f;
  }
  weight_grad(lm_head_index(), dlogits, lnf_.data(), d, vocab, c);
  done(lm_head_index());
  k_->linear_backward_input(dln_.data(), dlogits, w(lm_head_index()), n, d, vocab, false, c);
  ranges.lap("backward lm_head");
  const float* x_last = config_.num_layers ? blocks_.back().y.data() : x0_.data();
  k_->rmsnorm_backward(dresid_.data(), g(ln_final_index()), dln_.data(), x_last, w(ln_final_index()), rmsf_.data(), n,
                       d);
  done(ln_final_index());
  ranges.lap("backward ln_final");
  unit_event(head_unit(), DDP_UNIT_BACKWARD_END);

  for (int64_t l = config_.num_layers - 1; l >= 0; --l) {
    unit_event(block_unit(l), DDP_UNIT_BACKWARD_BEGIN);
    block_backward(l, done);
    ranges.lap(range_names_[l].c_str());
    unit_event(block_unit(l), DDP_UNIT_BACKWARD_END);
  }
  unit_event(0, DDP_UNIT_BACKWARD_BEGIN);
  if (float* de = g(0)) k_->embedding_backward(de, dresid_.data(), in_tokens(), n, d);
  done(0);
  ranges.lap("backward token_embeddings");
  unit_event(0, DDP_UNIT_BACKWARD_END);
}

// By the parameters' names, in table order (an FFN-only size has blocks alone).
std::vector<Unit> lm_units(const LmConfig& config) {
  std::vector<Unit> units;
  size_t index = 0;
  for (const auto& [name, shape] : lm_parameter_shapes(config)) {
    std::string unit = "head";  // ln_final, lm_head
    if (name.rfind("token_embeddings.", 0) == 0) unit = "embedding";
    if (name.rfind("layers.", 0) == 0) unit = name.substr(0, name.find('.', 7));
    if (units.empty() || units.back().name != unit) units.push_back({unit, {}, {}});
    units.back().params.push_back(index++);
  }
  return units;
}

std::unique_ptr<Model> make_lm(const LmConfig& config, Device& device, uint64_t seed, bool with_gradients,
                               bool with_values) {
  auto model = std::make_unique<LmModel>(config, device, seed, with_values);
  if (with_gradients) model->pack_gradients(device);
  return model;
}

}  // namespace ddp
