// lm_sizes.cpp — an `lm` of a size without building it: the named presets,
// the sizes it refuses, its parameter table and units, and what it
// allocates (lm_footprint, LmModel::activation_shapes), which `ddp plan`
// counts and lm.cpp allocates.
#include <algorithm>
#include <initializer_list>
#include <string>
#include <utility>

#include "error.h"
#include "kernels.h"
#include "lm.h"

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

}  // namespace

void lm_check_sizes(const LmConfig& c) {
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

void lm_check_compute(const LmConfig& c, ddp_device_kind device, ddp_dtype compute) {
  const int64_t head = c.num_heads > 0 ? c.d_model / c.num_heads : 0;
  if (!c.ffn_only && !attention_keeps_weights(device, compute) && head > kFusedAttentionMaxHead)
    throw Error("lm: head size " + std::to_string(head) + " (d_model " + std::to_string(c.d_model) + " / num_heads " +
                    std::to_string(c.num_heads) + ") is more than the " + std::to_string(kFusedAttentionMaxHead) +
                    " a GPU's fused attention takes under 16-bit compute: use more heads, or precision.compute = "
                    "\"fp32\"",
                DDP_ERR_UNSUPPORTED);
}

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

Footprint lm_footprint(const LmConfig& c, int64_t rows, ddp_device_kind device, ddp_dtype compute) {
  lm_check_sizes(c);
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
  lm_check_compute(c, device, compute);
  const std::vector<ActBuffer> shapes = LmModel::activation_shapes(c, rows, device, compute);
  f.step_activation_bytes = act_bytes(shapes);
  int64_t floats = 0;  // the elements (mesh.h prices them)
  for (const ActBuffer& b : shapes) floats += numel(b.shape);
  if (rows > 0 && c.context_length > 0)
    f.saved_elements_per_token = static_cast<double>(floats) / static_cast<double>(rows * c.context_length);
  return f;
}

std::vector<ActBuffer> LmModel::activation_shapes(const LmConfig& c, int64_t rows, ddp_device_kind device,
                                                  ddp_dtype compute) {
  const int64_t t = c.context_length;
  const int64_t d = c.d_model;
  const int64_t f = c.d_ff;
  const int64_t h = c.num_heads;
  const int64_t n = rows * t;
  const ddp_dtype kept = compute;  // what backward keeps (BlockActs but the RMS, x0_, lnf_)
  const ddp_dtype f32 = DDP_FLOAT32;
  // Attention's p: its weights, or (CUDA in 16 bits) each row's max and sum.
  const bool weights = attention_keeps_weights(device, compute);
  const ActBuffer p = weights ? ActBuffer{{rows, h, t, t}, kept} : ActBuffer{{rows, h, t, 2}, f32};
  std::vector<ActBuffer> s;
  if (device != DDP_DEVICE_CPU) s.push_back({{2 * n}, f32});  // tokens_dev_: int32 ids in floats' bytes
  s.push_back({{n, d}, kept});                                // x0_
  for (int64_t l = 0; l < c.num_layers; ++l) {                // BlockActs, in member order
    for (const ActBuffer& b :
         {ActBuffer{{n, d}, kept}, ActBuffer{{n}, f32}, ActBuffer{{n, d}, kept}, ActBuffer{{n, d}, kept},
          ActBuffer{{n, d}, kept}, p, ActBuffer{{n, d}, kept}, ActBuffer{{n, d}, kept}, ActBuffer{{n, d}, kept},
          ActBuffer{{n}, f32}, ActBuffer{{n, f}, kept}, ActBuffer{{n, f}, kept}, ActBuffer{{n, f}, kept},
          ActBuffer{{n, d}, kept}})
      s.push_back(b);
  }
  s.push_back({{n, d}, kept});                                 // lnf_
  for (Shape b : {Shape{n}, Shape{n, c.vocab_size}, Shape{n},  // rmsf_, logits_, lse_
                  Shape{n, d}, Shape{n, d}, Shape{n, d}, Shape{n, d}, Shape{n, d}, Shape{n, d}, Shape{n, f},
                  Shape{n, f}, Shape{n, f}})  // dresid_ .. db_
    s.push_back({b, f32});
  s.push_back({{static_cast<int64_t>(attention_scratch_floats(device, compute, rows, t, h))}, f32});  // dscores_
  return s;
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

}  // namespace ddp
