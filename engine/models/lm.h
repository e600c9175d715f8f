// lm.h — the `lm` model of docs/models.md: a pre-norm decoder-only
// Transformer (Stanford CS336's BasicsTransformerLM) with RoPE, SwiGLU and
// RMSNorm, no biases, trained on next-token cross-entropy, on either device:
// its layers are the device's kernels (kernels.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels.h"
#include "model.h"

namespace ddp {

struct LmConfig {
  int64_t vocab_size = 0;
  int64_t context_length = 0;  // T: a batch row holds T + 1 tokens
  int64_t d_model = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t d_ff = 0;
  double rope_theta = 10000;
  // Blocks of two linear layers only, d_model -> d_ff -> d_model: no
  // attention, norms, embeddings or head (CS336's communication_accounting
  // XXL). Accounting only: `ddp plan` takes it, a model cannot be built.
  bool ffn_only = false;
};

// The named sizes of docs/models.md, in its order: lm-tiny, lm-cpu, small,
// medium, large, xl, 2.7B.
struct LmPreset {
  std::string name;
  LmConfig config;
};
const std::vector<LmPreset>& lm_presets();
// The preset of that name. Throws Error listing the names for an unknown one.
LmConfig lm_preset(const std::string& name);

// Throws Error for sizes no model can have: what LmModel refuses, and sizes
// whose element counts would pass 2^50.
void lm_check_sizes(const LmConfig& config);
// Throws Error for sizes this device's kernels cannot run in `compute`: a
// head above kFusedAttentionMaxHead under a GPU's fused attention.
void lm_check_compute(const LmConfig& config, ddp_device_kind device, ddp_dtype compute);
// Parameters of a model of this size (token embeddings and lm_head untied).
int64_t lm_parameter_count(const LmConfig& config);
// The parameter table, names and shapes in the spec's order (the model's,
// exactly).
std::vector<std::pair<std::string, Shape>> lm_parameter_shapes(const LmConfig& config);
// What a model of this size holds with `rows` rows per micro-batch
// (model.h): what LmModel allocates, on that kind of device, computing in
// `compute` (set_compute_dtype).
Footprint lm_footprint(const LmConfig& config, int64_t rows, ddp_device_kind device, ddp_dtype compute = DDP_FLOAT32);

// Parameters in the spec's order and names, initialised from the seed given
// to make_lm. Batches carry `tokens` [rows, T + 1] (T = context_length):
// inputs tokens[:, :T], targets tokens[:, 1:]; forward returns the mean
// cross-entropy over rows * T positions. input_width() is T + 1 (tokens per
// row), output_width() the vocabulary size.
class LmModel final : public Model {
 public:
  // Throws Error for inconsistent sizes (d_model not a multiple of
  // num_heads, an odd head size, a non-positive size).
  // `with_values`: as make_model's (model.h).
  LmModel(const LmConfig& config, Device& device, uint64_t seed, bool with_values = true);

  int64_t input_width() const override { return config_.context_length + 1; }
  int64_t output_width() const override { return config_.vocab_size; }
  // Under bf16 or fp16, what backward keeps (BlockActs, x0_, lnf_; the RMS
  // statistics stay float32) is held in that dtype: forward computes each
  // block in float32 in the backward buffers and packs (or writes it kept
  // directly: RMSNorm, RoPE's q and k, attention's weights on a CPU and
  // output, SwiGLU), and backward's layers read the kept tensors as they
  // are (docs/precision.md).
  void set_compute_dtype(ddp_dtype dtype) override;
  // Throws Error for a token outside [0, vocab_size).
  float forward(const Batch& batch) override;
  // Calls accumulated(i) in strictly decreasing i: lm_head first,
  // token_embeddings last (frozen parameters are skipped).
  void backward(float loss_scale, const GradAccumulated& accumulated) override;

  const LmConfig& config() const { return config_; }
  // softmax - onehot(targets) [rows, T, vocab_size] of the last forward's
  // logits: the gradient of the summed loss, which the forward leaves in
  // place of the logits (layers::cross_entropy_forward). Backward reads it.
  const float* loss_gradient() const { return logits_.data(); }

 private:
  // dW += alpha * dy^T x over the last forward's N rows, where index trains.
  void weight_grad(size_t index, GemmInput dy, GemmInput x, int64_t in, int64_t out, float alpha = 1.0f);
  void block_backward(int64_t l, const GradAccumulated& done);
  // dresid_ as the two GEMMs of a branch's output projection read it:
  // float32 as it is; in a 16-bit compute rounded once, into dln_'s first
  // half (free until the GEMMs that write dln_), not once by each.
  GemmInput residual_dy();
  // Parameter indices in the table (spec order).
  static constexpr size_t kLn1 = 0;
  static constexpr size_t kQ = 1;
  static constexpr size_t kK = 2;
  static constexpr size_t kV = 3;
  static constexpr size_t kO = 4;
  static constexpr size_t kLn2 = 5;
  static constexpr size_t kW1 = 6;
  static constexpr size_t kW2 = 7;
  static constexpr size_t kW3 = 8;
  static constexpr size_t kPerLayer = 9;
  size_t layer_param(int64_t layer, size_t which) const { return 1 + static_cast<size_t>(layer) * kPerLayer + which; }
  size_t ln_final_index() const { return 1 + static_cast<size_t>(config_.num_layers) * kPerLayer; }
  size_t lm_head_index() const { return ln_final_index() + 1; }
  const float* w(size_t index) const { return values(index); }
  // The gradient buffer of a trainable parameter, or null for a frozen one.
  float* g(size_t index) { return grad_out(index); }
  // Units (lm_units): the embedding, each block, the final norm with the head.
  size_t block_unit(int64_t layer) const { return 1 + static_cast<size_t>(layer); }
  size_t head_unit() const { return 1 + static_cast<size_t>(config_.num_layers); }
  void ensure_activations(int64_t rows);
  // The shapes ensure_activations allocates, in its order (lm_footprint
  // sums them).
  static std::vector<ActBuffer> activation_shapes(const LmConfig& c, int64_t rows, ddp_device_kind device,
                                                  ddp_dtype compute);
  friend Footprint lm_footprint(const LmConfig& config, int64_t rows, ddp_device_kind device, ddp_dtype compute);
  // The token ids the kernels read: host vectors on the CPU, else device
  // memory (tokens_dev_).
  const int32_t* in_tokens() const {
    return tokens_dev_.defined() ? reinterpret_cast<const int32_t*>(tokens_dev_.data()) : inputs_.data();
  }
  const int32_t* target_tokens() const {
    return tokens_dev_.defined() ? reinterpret_cast<const int32_t*>(tokens_dev_.data()) + inputs_.size()
                                 : targets_.data();
  }

  // What one block keeps from forward for backward. N = rows * T.
  struct BlockActs {
    Tensor ln1;   // [N, D] RMSNorm1(x)
    Tensor rms1;  // [N]
    Tensor q;     // [N, D] after RoPE
    Tensor k;     // [N, D] after RoPE
    Tensor v;     // [N, D]
    Tensor p;     // [rows, H, T, T] attention weights (CUDA in 16 bits: [rows, H, T, 2], kernels.h)
    Tensor att;   // [N, D] attention output before output_proj
    Tensor h;     // [N, D] x + Attn(RMSNorm1(x))
    Tensor ln2;   // [N, D] RMSNorm2(h)
    Tensor rms2;  // [N]
    Tensor a;     // [N, F] w1 ln2
    Tensor b;     // [N, F] w3 ln2
    Tensor gate;  // [N, F] silu(a) * b
    Tensor y;     // [N, D] block output h + w2 gate
  };
  // Where block l's forward writes each of them in float32: their own
  // memory in float32 compute; in 16-bit, the backward scratch (free
  // during forward), from which keep() packs them. (ln1, q and k after
  // RoPE, p, att, ln2 and gate are written as kept: output().)
  struct BlockFloats {
    float* q;
    float* k;
    float* v;
    float* h;
    float* a;
    float* b;
    float* y;
  };
  BlockFloats forward_floats(BlockActs& b);
  // keep_activation (model.h) on this model's kernels.
  void keep(Tensor& saved, const float* value) { keep_activation(*k_, saved, value); }
  // A kept activation as a layer writes it directly, and as layers read
  // it: its float32 memory, or its 16 bits (kernels.h's LayerOutput and
  // LayerInput).
  static LayerOutput output(Tensor& saved) { return {saved.raw(), saved.dtype()}; }
  static LayerInput kept(const Tensor& saved) { return {saved.raw(), saved.dtype()}; }
  // A float32 scratch gradient that only GEMMs read (backward's da, db, dv),
  // as a kernel writes it and the GEMMs read it: in the compute dtype, a
  // 16-bit one in the first half of its bytes, rounded once where each
  // GEMM would round it (the same bits).
  LayerOutput gemm_only(Tensor& scratch) const { return {scratch.raw(), k_->compute_dtype()}; }
  GemmInput gemm_read(const Tensor& scratch) const { return {scratch.raw(), k_->compute_dtype()}; }

  Device& device_;
  std::unique_ptr<Kernels> k_;  // the device's layers
  LmConfig config_;
  int64_t head_dim_ = 0;
  Tensor rope_cos_;  // [T, head_dim / 2]
  Tensor rope_sin_;  // [T, head_dim / 2]

  int64_t rows_ = -1;             // rows the activations are sized for
  std::vector<int32_t> inputs_;   // [N] tokens[:, :T]
  std::vector<int32_t> targets_;  // [N] tokens[:, 1:]
  Tensor tokens_dev_;             // [2N] int32: inputs_, targets_ on a GPU
  Tensor x0_;                     // [N, D] token embeddings
  std::vector<BlockActs> blocks_;
  Tensor lnf_;     // [N, D] RMSNorm_final(last block's y)
  Tensor rmsf_;    // [N]
  Tensor logits_;  // [N, V]; softmax - onehot in place from the end of forward
  Tensor lse_;     // [N] logsumexp of each row of logits

  // Backward scratch, shared by all blocks.
  Tensor dresid_;  // [N, D] d loss / d residual stream
  Tensor dln_;     // [N, D] d loss / d RMSNorm output
  Tensor datt_;    // [N, D]
  Tensor dq_;      // [N, D]
  Tensor dk_;
  Tensor dv_;
  Tensor dgate_;  // [N, F]
  Tensor da_;     // [N, F]
  Tensor db_;
  Tensor dscores_;  // attention backward's scratch (CPU: [T, T])
};

// `with_gradients`: with its gradients (pack_gradients); the engine makes
// them itself, once it knows which a strategy claims.
// `with_values`: as make_model's (model.h).
std::unique_ptr<Model> make_lm(const LmConfig& config, Device& device, uint64_t seed, bool with_gradients = true,
                               bool with_values = true);

// Its units, in forward order: "embedding" (token_embeddings), "layers.{l}"
// (the block's 9 parameters) for each block, "head" (ln_final, lm_head).
std::vector<Unit> lm_units(const LmConfig& config);

}  // namespace ddp
