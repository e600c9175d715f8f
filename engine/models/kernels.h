// kernels.h — the layers of layers.h on one device. Models call these and
// never a device's code directly, so one model runs on the CPU (the
// functions of layers.h, run at once on the training thread) and on CUDA
// (kernels and cuBLAS enqueued on the engine's compute stream, in call
// order, without host synchronisation unless a comment says so).
//
// (Default arguments are those of layers.h; models call through Kernels&.)
// Shapes and conventions are those of layers.h (row-major, forward
// overwrites its outputs, parameter gradients are added into, `accumulate`
// adds into an input gradient). Every pointer is memory of the device the
// Kernels were made for (Device::alloc), except where "host" is said.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include <ddp/plugin.h>

#include "gemm.h"

namespace ddp {

class Device;

// Where a layer writes its result: float32 memory, or 16 bits (bfloat16 or
// float16: an activation that only backward and the GEMMs read, kept in
// the compute dtype), rounded to nearest even as convert() rounds, with
// no float32 copy and no pass of its own. A float32 pointer is one.
struct LayerOutput {
  LayerOutput(float* values) : data(values) {}  // NOLINT(google-explicit-constructor): float32 as it is
  LayerOutput(void* values, ddp_dtype type) : data(values), dtype(type) {}
  void* data = nullptr;
  ddp_dtype dtype = DDP_FLOAT32;
};
// What a layer reads of an activation backward kept: float32, or its 16
// bits as they are (gemm.h's GemmInput; widened exactly, so the same
// result as from a float32 copy, without unpacking one). A float32 pointer
// is one.
using LayerInput = GemmInput;

// What attention_forward leaves in `p` for attention_backward on a device
// of this kind computing in `compute`: true, the weights [b, heads, t, t]
// (the CPU; CUDA in float32); false, each row's softmax max and sum
// [b, heads, t, 2] in float32 (CUDA in bf16 or fp16: the fused kernels of
// cuda/fused_attention.h recompute the weights). Free functions, so `ddp
// plan` can count them.
bool attention_keeps_weights(ddp_device_kind kind, ddp_dtype compute);
// The largest head size the fused kernels take (a warp holds a row).
constexpr int64_t kFusedAttentionMaxHead = 256;
// Floats of scratch attention backward needs: the CPU [t, t]; CUDA
// [b, heads, t, t] in float32 (one softmax-backward launch for every
// sequence and head), [b, heads, t] in 16 bits.
size_t attention_scratch_floats(ddp_device_kind kind, ddp_dtype compute, int64_t b, int64_t t, int64_t heads);

class Kernels {
 public:
  virtual ~Kernels() = default;
  virtual ddp_device_kind kind() const = 0;

  // The dtype the GEMMs (linear layers, attention's products) take their
  // inputs in: float32 (the default), bfloat16 or float16, accumulating in
  // float32 (gemm.h). The CPU emulates the 16-bit ones by rounding; CUDA
  // runs them on the tensor cores (cuda/cuda_gemm.h) and throws Error for
  // another dtype.
  virtual void set_compute_dtype(ddp_dtype dtype) = 0;
  virtual ddp_dtype compute_dtype() const = 0;

  // ---- data movement (compute stream order) ------------------------------
  // dst, src device memory.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // dst device memory, src host memory; src may be reused once this returns.
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;
  // dst[0, n) = src[0, n) converted (device memory): float32 to bfloat16 or
  // float16, rounding to nearest even, and back (convert.h's pairs). The
  // 16-bit activations a 16-bit compute keeps for backward.
  virtual void convert(void* dst, ddp_dtype dst_type, const void* src, ddp_dtype src_type, size_t n) = 0;

  // ---- linear, bias ---------------------------------------------------------
  // x, and backward's dy: float32, or already in the compute dtype (gemm.h's
  // GemmInput: a kept activation, or a gradient a kernel wrote in 16 bits;
  // read as it is, the same bits as its float32 value).
  virtual void linear_forward(float* y, GemmInput x, const float* w, int64_t n, int64_t in, int64_t out,
                              bool accumulate = false) = 0;
  virtual void linear_backward_input(float* dx, GemmInput dy, const float* w, int64_t n, int64_t in, int64_t out,
                                     bool accumulate = false, float alpha = 1.0f) = 0;
  virtual void linear_backward_weight(float* dw, GemmInput dy, GemmInput x, int64_t n, int64_t in, int64_t out,
                                      float alpha = 1.0f) = 0;
  virtual void bias_forward(float* y, const float* b, int64_t n, int64_t out) = 0;
  virtual void bias_backward(float* db, const float* dy, int64_t n, int64_t out) = 0;

  // ---- embedding (tokens: device memory, in range) --------------------------
  virtual void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t n, int64_t d) = 0;
  virtual void embedding_backward(float* dtable, const float* dout, const int32_t* tokens, int64_t n, int64_t d) = 0;

  // ---- RMSNorm, RoPE ----------------------------------------------------------
  // y: float32, or 16 bits (LayerOutput); rms[n] float32.
  virtual void rmsnorm_forward(LayerOutput y, float* rms, const float* x, const float* g, int64_t n, int64_t d) = 0;
  // x: float32, or 16 bits (LayerInput).
  virtual void rmsnorm_backward(float* dx, float* dg, const float* dy, LayerInput x, const float* g, const float* rms,
                                int64_t n, int64_t d, bool accumulate = false) = 0;
  // cos, sin [t, dh/2] in device memory (fill them with layers::rope_tables
  // on the host and upload).
  // x rotated (dx rotated back), into `out`: x itself (float32, in place),
  // or 16 bits (LayerOutput: what attention or the GEMMs read, rounded
  // once; x is then scratch, its contents after unspecified).
  virtual void rope_forward(LayerOutput out, float* x, const float* cos, const float* sin, int64_t b, int64_t t,
                            int64_t heads, int64_t dh) = 0;
  virtual void rope_backward(LayerOutput out, float* dx, const float* cos, const float* sin, int64_t b, int64_t t,
                             int64_t heads, int64_t dh) = 0;

  // ---- causal attention -------------------------------------------------------
  // Floats of scratch attention_backward needs for these sizes: the device
  // kind's and compute dtype's rule, attention_scratch_floats above; `p`
  // holds what attention_keeps_weights says: weights in float32 or 16 bits
  // (the CPU's kept p: LayerOutput), a GPU's statistics in float32.
  size_t attention_scratch_floats(int64_t b, int64_t t, int64_t heads) const;
  // q, k, v: float32, or all three in the compute dtype (LayerInput); out
  // float32, or in the compute dtype (LayerOutput: what backward keeps and
  // the output projection reads).
  virtual void attention_forward(LayerOutput out, LayerOutput p, LayerInput q, LayerInput k, LayerInput v, int64_t b,
                                 int64_t t, int64_t heads, int64_t dh) = 0;
  // p, q, k, v as kept: float32, or 16 bits (LayerInput); dv float32, or
  // in the compute dtype (LayerOutput: the GEMMs' input, rounded once).
  virtual void attention_backward(float* dq, float* dk, LayerOutput dv, float* scratch, const float* dout, LayerInput p,
                                  LayerInput q, LayerInput k, LayerInput v, int64_t b, int64_t t, int64_t heads,
                                  int64_t dh) = 0;

  // ---- elementwise -------------------------------------------------------------
  // out: float32, or 16 bits (LayerOutput).
  virtual void swiglu_forward(LayerOutput out, const float* a, const float* b, int64_t n) = 0;
  // a, b: float32, or 16 bits (LayerInput); da, db: float32, or 16 bits
  // (LayerOutput, both alike: the GEMMs' inputs, rounded once here).
  virtual void swiglu_backward(LayerOutput da, LayerOutput db, const float* dout, LayerInput a, LayerInput b,
                               int64_t n) = 0;
  virtual void relu_forward(float* y, const float* x, int64_t n) = 0;
  virtual void relu_backward(float* dx, const float* dy, const float* y, int64_t n) = 0;

  // ---- losses: the forward returns the loss to the host, so it waits for
  // the compute stream (PyTorch's loss.item()); sums are in double. ---------
  // Mean cross-entropy over n rows (targets: device memory); lse[n] kept,
  // and softmax - onehot left in place of the logits (layers.h).
  virtual float cross_entropy_forward(float* lse, float* logits, const int32_t* targets, int64_t n, int64_t v) = 0;
  // dlogits[n, v] *= scale / n: the forward's gradient made the mean's.
  virtual void cross_entropy_backward(float* dlogits, int64_t n, int64_t v, float scale) = 0;
  // Mean over n elements of (pred - y)^2 (toy models).
  virtual float mse_forward(const float* pred, const float* y, int64_t n) = 0;
  // d[n] = (2 * scale / n) * (pred - y), the factor rounded to float first.
  virtual void mse_backward(float* d, const float* pred, const float* y, int64_t n, float scale) = 0;
};

// The CPU kernels: the functions of layers.h, run at once.
std::unique_ptr<Kernels> make_cpu_kernels();

// The kernels of `device`'s kind, working on its compute stream. Throws
// Error for a CUDA device in a build without CUDA.
std::unique_ptr<Kernels> make_kernels(Device& device);

}  // namespace ddp
