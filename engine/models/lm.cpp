// lm.cpp — the `lm` Transformer's forward and hand-written backward over the
// layers of layers.h. Batch and time are folded into the GEMMs' M dimension
// (N = rows * T); residual adds ride on the GEMMs (beta = 1). Activations and
// backward scratch are allocated on the first forward for a given number of
// rows and reused: forward and backward themselves never allocate.
#include "lm.h"

#include <cmath>
#include <cstring>
#include <random>
#include <utility>

#include "error.h"
#include "kernels.h"
#include "layers.h"

namespace ddp {

LmModel::LmModel(const LmConfig& config, Device& device, uint64_t seed, bool with_values)
    : device_(device), k_(make_kernels(device)), config_(config) {
  const LmConfig& c = config_;
  if (c.ffn_only) throw Error("lm: an FFN-only size is for accounting only; no model is built of it");
  lm_check_sizes(c);
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
  const std::vector<ActBuffer> shapes = activation_shapes(config_, rows, k_->kind(), k_->compute_dtype());
  size_t next = 0;  // the shapes, taken in activation_shapes' order
  auto act = [&] {
    const ActBuffer& b = shapes.at(next++);
    return Tensor(device_, b.shape, MemCategory::Activations, b.dtype);
  };
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

void LmModel::set_compute_dtype(ddp_dtype dtype) {
  lm_check_compute(config_, k_->kind(), dtype);
  k_->set_compute_dtype(dtype);
  rows_ = -1;  // the next forward allocates the activations in it
}

LmModel::BlockFloats LmModel::forward_floats(BlockActs& b) {
  if (b.q.dtype() == DDP_FLOAT32)
    return {b.q.data(), b.k.data(), b.v.data(), b.h.data(), b.a.data(), b.b.data(), b.y.data()};
  // The residual stream x -> h -> y stays in dresid_, each added to in place.
  return {dq_.data(), dk_.data(), dv_.data(), dresid_.data(), da_.data(), db_.data(), dresid_.data()};
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
  const bool packed = x0_.dtype() != DDP_FLOAT32;  // forward_floats
  unit_event(0, DDP_UNIT_FORWARD_BEGIN);
  float* x = packed ? dresid_.data() : x0_.data();  // [N, D] the residual stream entering each block
  k_->embedding_forward(x, in_tokens(), w(0), n, d);
  keep(x0_, x);
  unit_event(0, DDP_UNIT_FORWARD_END);
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    unit_event(block_unit(l), DDP_UNIT_FORWARD_BEGIN);
    BlockActs& s = blocks_[l];
    const BlockFloats b = forward_floats(s);
    // h = x + output_proj(attention(RoPE(q), RoPE(k), v)) of RMSNorm1(x),
    // ln1 written as kept (16-bit compute: rounded once; the GEMMs read it so)
    k_->rmsnorm_forward(output(s.ln1), s.rms1.data(), x, w(layer_param(l, kLn1)), n, d);
    k_->linear_forward(b.q, kept(s.ln1), w(layer_param(l, kQ)), n, d, d);
    k_->linear_forward(b.k, kept(s.ln1), w(layer_param(l, kK)), n, d, d);
    k_->linear_forward(b.v, kept(s.ln1), w(layer_param(l, kV)), n, d, d);
    // q and k rotated, and attention's output, written as kept (16-bit
    // compute: rounded once; attention and the GEMMs read them so).
    k_->rope_forward(output(s.q), b.q, rope_cos_.data(), rope_sin_.data(), rows, t, heads, head_dim_);
    k_->rope_forward(output(s.k), b.k, rope_cos_.data(), rope_sin_.data(), rows, t, heads, head_dim_);
    keep(s.v, b.v);
    k_->attention_forward(output(s.att), output(s.p), kept(s.q), kept(s.k), kept(s.v), rows, t, heads, head_dim_);
    if (b.h != x) k_->copy(b.h, x, sizeof(float) * n * d);
    k_->linear_forward(b.h, kept(s.att), w(layer_param(l, kO)), n, d, d, true);
    keep(s.h, b.h);
    // y = h + w2(silu(w1 z) * w3 z), z = RMSNorm2(h)
    k_->rmsnorm_forward(output(s.ln2), s.rms2.data(), b.h, w(layer_param(l, kLn2)), n, d);
    k_->linear_forward(b.a, kept(s.ln2), w(layer_param(l, kW1)), n, d, f);
    k_->linear_forward(b.b, kept(s.ln2), w(layer_param(l, kW3)), n, d, f);
    k_->swiglu_forward(output(s.gate), b.a, b.b, n * f);
    for (auto [saved, value] : {std::pair{&s.a, b.a}, {&s.b, b.b}}) keep(*saved, value);
    if (b.y != b.h) k_->copy(b.y, b.h, sizeof(float) * n * d);
    k_->linear_forward(b.y, kept(s.gate), w(layer_param(l, kW2)), n, f, d, true);
    keep(s.y, b.y);
    x = b.y;
    unit_event(block_unit(l), DDP_UNIT_FORWARD_END);
  }
  unit_event(head, DDP_UNIT_FORWARD_BEGIN);
  k_->rmsnorm_forward(output(lnf_), rmsf_.data(), x, w(ln_final_index()), n, d);
  k_->linear_forward(logits_.data(), kept(lnf_), w(lm_head_index()), n, d, vocab);
  unit_event(head, DDP_UNIT_FORWARD_END);
  return static_cast<float>(k_->cross_entropy_forward(lse_.data(), logits_.data(), target_tokens(), n, vocab));
}

void LmModel::weight_grad(size_t index, GemmInput dy, GemmInput x, int64_t in, int64_t out, float alpha) {
  const int64_t n = rows_ * config_.context_length;
  if (float* dw = g(index)) k_->linear_backward_weight(dw, dy, x, n, in, out, alpha);
}

GemmInput LmModel::residual_dy() {
  const ddp_dtype compute = k_->compute_dtype();
  if (compute == DDP_FLOAT32) return dresid_.data();
  k_->convert(dln_.raw(), compute, dresid_.data(), DDP_FLOAT32, dresid_.numel());
  return {dln_.raw(), compute};
}

// Block l's backward: dresid_ holds dy on entry and dx on return. Every
// layer reads the kept tensors as they are (kept(): 16 bits under a
// 16-bit compute).
void LmModel::block_backward(int64_t l, const GradAccumulated& done) {
  const int64_t rows = rows_;
  const int64_t t = config_.context_length;
  const int64_t d = config_.d_model;
  const int64_t f = config_.d_ff;
  const int64_t heads = config_.num_heads;
  const int64_t n = rows * t;
  const BlockActs& b = blocks_[l];
  // dresid_ holds dy; FFN branch: y = h + w2 gate.
  const GemmInput dy = residual_dy();
  k_->linear_backward_input(dgate_.data(), dy, w(layer_param(l, kW2)), n, f, d);
  k_->swiglu_backward(gemm_only(da_), gemm_only(db_), dgate_.data(), kept(b.a), kept(b.b), n * f);
  weight_grad(layer_param(l, kW3), gemm_read(db_), kept(b.ln2), d, f);
  done(layer_param(l, kW3));
  weight_grad(layer_param(l, kW2), dy, kept(b.gate), f, d);
  done(layer_param(l, kW2));
  weight_grad(layer_param(l, kW1), gemm_read(da_), kept(b.ln2), d, f);
  done(layer_param(l, kW1));
  k_->linear_backward_input(dln_.data(), gemm_read(da_), w(layer_param(l, kW1)), n, d, f);
  k_->linear_backward_input(dln_.data(), gemm_read(db_), w(layer_param(l, kW3)), n, d, f, true);
  k_->rmsnorm_backward(dresid_.data(), g(layer_param(l, kLn2)), dln_.data(), kept(b.h), w(layer_param(l, kLn2)),
                       b.rms2.data(), n, d, /*accumulate=*/true);
  done(layer_param(l, kLn2));
  // dresid_ holds dh; attention branch: h = x + output_proj att.
  const GemmInput dh = residual_dy();
  k_->linear_backward_input(datt_.data(), dh, w(layer_param(l, kO)), n, d, d);
  weight_grad(layer_param(l, kO), dh, kept(b.att), d, d);
  done(layer_param(l, kO));
  k_->attention_backward(dq_.data(), dk_.data(), gemm_only(dv_), dscores_.data(), datt_.data(), kept(b.p), kept(b.q),
                         kept(b.k), kept(b.v), rows, t, heads, head_dim_);
  // dq, dk through RoPE's backward: in place in float32; in 16 bits into
  // the two halves of datt_ (attention's backward has read it), as the
  // GEMMs read them (gemm_only).
  const bool sixteen = k_->compute_dtype() != DDP_FLOAT32;
  const LayerOutput dq = sixteen ? LayerOutput(datt_.raw(), k_->compute_dtype()) : LayerOutput(dq_.data());
  const LayerOutput dk =
      sixteen ? LayerOutput(static_cast<uint16_t*>(datt_.raw()) + n * d, k_->compute_dtype()) : LayerOutput(dk_.data());
  k_->rope_backward(dq, dq_.data(), rope_cos_.data(), rope_sin_.data(), rows, t, heads, head_dim_);
  k_->rope_backward(dk, dk_.data(), rope_cos_.data(), rope_sin_.data(), rows, t, heads, head_dim_);
  const GemmInput gdq(dq.data, dq.dtype);
  const GemmInput gdk(dk.data, dk.dtype);
  weight_grad(layer_param(l, kV), gemm_read(dv_), kept(b.ln1), d, d);
  done(layer_param(l, kV));
  weight_grad(layer_param(l, kK), gdk, kept(b.ln1), d, d);
  done(layer_param(l, kK));
  weight_grad(layer_param(l, kQ), gdq, kept(b.ln1), d, d);
  done(layer_param(l, kQ));
  k_->linear_backward_input(dln_.data(), gdq, w(layer_param(l, kQ)), n, d, d);
  k_->linear_backward_input(dln_.data(), gdk, w(layer_param(l, kK)), n, d, d, true);
  k_->linear_backward_input(dln_.data(), gemm_read(dv_), w(layer_param(l, kV)), n, d, d, true);
  k_->rmsnorm_backward(dresid_.data(), g(layer_param(l, kLn1)), dln_.data(), kept(l ? blocks_[l - 1].y : x0_),
                       w(layer_param(l, kLn1)), b.rms1.data(), n, d, /*accumulate=*/true);
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
  weight_grad(lm_head_index(), dlogits, kept(lnf_), d, vocab, c);
  done(lm_head_index());
  k_->linear_backward_input(dln_.data(), dlogits, w(lm_head_index()), n, d, vocab, false, c);
  ranges.lap("backward lm_head");
  const Tensor& x_last = config_.num_layers ? blocks_.back().y : x0_;
  k_->rmsnorm_backward(dresid_.data(), g(ln_final_index()), dln_.data(), kept(x_last), w(ln_final_index()),
                       rmsf_.data(), n, d);
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

std::unique_ptr<Model> make_lm(const LmConfig& config, Device& device, uint64_t seed, bool with_gradients,
                               bool with_values) {
  auto model = std::make_unique<LmModel>(config, device, seed, with_values);
  if (with_gradients) model->pack_gradients(device);
  return model;
}

}  // namespace ddp