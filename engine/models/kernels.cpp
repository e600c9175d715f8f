// kernels.cpp — the CPU kernels (layers.h, run at once) and the choice of
// kernels by device.
#include "kernels.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <ddp/numeric.h>  // ddp_dtype_name

#include "convert.h"
#include "device.h"
#include "error.h"
#include "layers.h"
#if DDP_WITH_CUDA
#include "cuda/cuda_kernels.h"
#endif

namespace ddp {
namespace {

class CpuKernels final : public Kernels {
 public:
  ddp_device_kind kind() const override { return DDP_DEVICE_CPU; }
  void set_compute_dtype(ddp_dtype dtype) override { inputs_ = dtype; }
  ddp_dtype compute_dtype() const override { return inputs_; }

  void copy(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void convert(void* dst, ddp_dtype dst_type, const void* src, ddp_dtype src_type, size_t n) override {
    convert_cpu(dst, dst_type, src, src_type, n);
  }

  void linear_forward(float* y, GemmInput x, const float* w, int64_t n, int64_t in, int64_t out,
                      bool accumulate) override {
    layers::linear_forward(y, x, w, n, in, out, accumulate, inputs_);
  }
  void linear_backward_input(float* dx, GemmInput dy, const float* w, int64_t n, int64_t in, int64_t out,
                             bool accumulate, float alpha) override {
    layers::linear_backward_input(dx, dy, w, n, in, out, accumulate, alpha, inputs_);
  }
  void linear_backward_weight(float* dw, GemmInput dy, GemmInput x, int64_t n, int64_t in, int64_t out,
                              float alpha) override {
    layers::linear_backward_weight(dw, dy, x, n, in, out, alpha, inputs_);
  }
  void bias_forward(float* y, const float* b, int64_t n, int64_t out) override { layers::bias_forward(y, b, n, out); }
  void bias_backward(float* db, const float* dy, int64_t n, int64_t out) override {
    layers::bias_backward(db, dy, n, out);
  }
  void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t n, int64_t d) override {
    layers::embedding_forward(out, tokens, table, n, d);
  }
  void embedding_backward(float* dtable, const float* dout, const int32_t* tokens, int64_t n, int64_t d) override {
    layers::embedding_backward(dtable, dout, tokens, n, d);
  }
  void rmsnorm_forward(LayerOutput y, float* rms, const float* x, const float* g, int64_t n, int64_t d) override {
    if (y.dtype == DDP_FLOAT32) return layers::rmsnorm_forward(static_cast<float*>(y.data), rms, x, g, n, d);
    for (int64_t i = 0; i < n; ++i) {  // a row at a time (rows are independent: the same bits)
      float* row = floats(d);
      layers::rmsnorm_forward(row, rms + i, x + i * d, g, 1, d);
      store(y, i * d, row, d);
    }
  }
  void rmsnorm_backward(float* dx, float* dg, const float* dy, LayerInput x, const float* g, const float* rms,
                        int64_t n, int64_t d, bool accumulate) override {
    if (x.dtype == DDP_FLOAT32) return layers::rmsnorm_backward(dx, dg, dy, f32(x), g, rms, n, d, accumulate);
    // A tile of dg's column sums at a time (layers.h): the same additions.
    float* tile = floats(layers::kColumnSumRows * d);
    for (int64_t r0 = 0; r0 < n; r0 += layers::kColumnSumRows) {
      const int64_t rows = std::min(layers::kColumnSumRows, n - r0);
      layers::rmsnorm_backward(dx + r0 * d, dg, dy + r0 * d, widened(x, r0 * d, rows * d, tile), g, rms + r0, rows, d,
                               accumulate);
    }
  }
  void rope_forward(LayerOutput out, float* x, const float* cos, const float* sin, int64_t b, int64_t t, int64_t heads,
                    int64_t dh) override {
    layers::rope_forward(x, cos, sin, b, t, heads, dh);
    placed(out, x, b * t * heads * dh);
  }
  void rope_backward(LayerOutput out, float* dx, const float* cos, const float* sin, int64_t b, int64_t t,
                     int64_t heads, int64_t dh) override {
    layers::rope_backward(dx, cos, sin, b, t, heads, dh);
    placed(out, dx, b * t * heads * dh);
  }
  // 16 bits: a sequence at a time (sequences are independent: the same bits).
  void attention_forward(LayerOutput out, LayerOutput p, LayerInput q, LayerInput k, LayerInput v, int64_t b, int64_t t,
                         int64_t heads, int64_t dh) override {
    if (out.dtype == DDP_FLOAT32 && p.dtype == DDP_FLOAT32 && q.dtype == DDP_FLOAT32 && k.dtype == DDP_FLOAT32 &&
        v.dtype == DDP_FLOAT32)
      return layers::attention_forward(f32(out), f32(p), f32(q), f32(k), f32(v), b, t, heads, dh, inputs_);
    const int64_t seq = t * heads * dh;
    const int64_t weights = heads * t * t;
    float* staged = floats(4 * seq + weights);  // q, k, v widened; out, p before their rounding
    for (int64_t s = 0; s < b; ++s) {
      const int64_t at = s * seq;
      float* os = out.dtype == DDP_FLOAT32 ? f32(out) + at : staged + 3 * seq;
      float* ps = p.dtype == DDP_FLOAT32 ? f32(p) + s * weights : staged + 4 * seq;
      layers::attention_forward(os, ps, widened(q, at, seq, staged), widened(k, at, seq, staged + seq),
                                widened(v, at, seq, staged + 2 * seq), 1, t, heads, dh, inputs_);
      if (out.dtype != DDP_FLOAT32) store(out, at, os, seq);
      if (p.dtype != DDP_FLOAT32) store(p, s * weights, ps, weights);
    }
  }
  void attention_backward(float* dq, float* dk, LayerOutput dv, float* scratch, const float* dout, LayerInput p,
                          LayerInput q, LayerInput k, LayerInput v, int64_t b, int64_t t, int64_t heads,
                          int64_t dh) override {
    const bool wide = dv.dtype == DDP_FLOAT32;
    if (wide && p.dtype == DDP_FLOAT32 && q.dtype == DDP_FLOAT32 && k.dtype == DDP_FLOAT32 && v.dtype == DDP_FLOAT32)
      return layers::attention_backward(dq, dk, f32(dv), scratch, dout, f32(p), f32(q), f32(k), f32(v), b, t, heads, dh,
                                        inputs_);
    const int64_t seq = t * heads * dh;
    const int64_t weights = heads * t * t;
    float* staged = floats(4 * seq + weights);  // q, k, v widened; dv before its rounding; p widened
    for (int64_t s = 0; s < b; ++s) {
      const int64_t at = s * seq;
      float* dvs = wide ? f32(dv) + at : staged + 3 * seq;
      layers::attention_backward(dq + at, dk + at, dvs, scratch, dout + at,
                                 widened(p, s * weights, weights, staged + 4 * seq), widened(q, at, seq, staged),
                                 widened(k, at, seq, staged + seq), widened(v, at, seq, staged + 2 * seq), 1, t, heads,
                                 dh, inputs_);
      if (!wide) store(dv, at, dvs, seq);
    }
  }
  void swiglu_forward(LayerOutput out, const float* a, const float* b, int64_t n) override {
    if (out.dtype == DDP_FLOAT32) return layers::swiglu_forward(static_cast<float*>(out.data), a, b, n);
    for (int64_t i = 0; i < n; i += kChunk) {  // (kChunk keeps the vector loops' alignment: the same bits)
      const int64_t count = std::min(kChunk, n - i);
      float* staged = floats(count);
      layers::swiglu_forward(staged, a + i, b + i, count);
      store(out, i, staged, count);
    }
  }
  void swiglu_backward(LayerOutput da, LayerOutput db, const float* dout, LayerInput a, LayerInput b,
                       int64_t n) override {
    if (da.dtype != db.dtype)
      throw Error(std::string("CPU kernels: swiglu_backward's da in ") + ddp_dtype_name(da.dtype) + ", db in " +
                  ddp_dtype_name(db.dtype) + " (one dtype for both)");
    const bool wide = da.dtype == DDP_FLOAT32;
    if (wide && a.dtype == DDP_FLOAT32 && b.dtype == DDP_FLOAT32)
      return layers::swiglu_backward(f32(da), f32(db), dout, f32(a), f32(b), n);
    float* staged = floats(4 * kChunk);  // a, b widened; da, db before their rounding
    for (int64_t i = 0; i < n; i += kChunk) {
      const int64_t count = std::min(kChunk, n - i);
      float* ga = wide ? f32(da) + i : staged + 2 * kChunk;
      float* gb = wide ? f32(db) + i : staged + 3 * kChunk;
      layers::swiglu_backward(ga, gb, dout + i, widened(a, i, count, staged), widened(b, i, count, staged + kChunk),
                              count);
      if (wide) continue;
      store(da, i, ga, count);
      store(db, i, gb, count);
    }
  }
  void relu_forward(float* y, const float* x, int64_t n) override { layers::relu_forward(y, x, n); }
  void relu_backward(float* dx, const float* dy, const float* y, int64_t n) override {
    layers::relu_backward(dx, dy, y, n);
  }
  float cross_entropy_forward(float* lse, float* logits, const int32_t* targets, int64_t n, int64_t v) override {
    return static_cast<float>(layers::cross_entropy_forward(lse, logits, targets, n, v));
  }
  void cross_entropy_backward(float* dlogits, int64_t n, int64_t v, float scale) override {
    layers::cross_entropy_backward(dlogits, n, v, scale);
  }
  float mse_forward(const float* pred, const float* y, int64_t n) override {
    return static_cast<float>(layers::mse_forward(pred, y, n));
  }
  void mse_backward(float* d, const float* pred, const float* y, int64_t n, float scale) override {
    layers::mse_backward(d, pred, y, n, scale);
  }

 private:
  // 16-bit outputs and inputs pass through `staged_` in float32, a part at
  // a time (elementwise: kChunk elements; RMSNorm: a row, or a tile of
  // kColumnSumRows rows; attention: a sequence): host memory of the
  // kernels' own, uncounted, as gemm.h's rounded operands (lm large: 10.5 MB).
  static constexpr int64_t kChunk = 4096;
  float* floats(int64_t count) {
    if (staged_.size() < size_t(count)) staged_.resize(size_t(count));
    return staged_.data();
  }
  static void check_16(ddp_dtype dtype, const char* what) {
    if (dtype != DDP_BFLOAT16 && dtype != DDP_FLOAT16)
      throw Error(std::string("CPU kernels: a layer ") + what + " in " + ddp_dtype_name(dtype) +
                  " (float32, bfloat16 or float16 only)");
  }
  // out[at, at + count) = from[0, count), rounded to out's 16 bits.
  static void store(const LayerOutput& out, int64_t at, const float* from, int64_t count) {
    check_16(out.dtype, "output");
    convert_cpu(static_cast<uint16_t*>(out.data) + at, out.dtype, from, DDP_FLOAT32, size_t(count));
  }
  static const float* f32(const LayerInput& x) { return static_cast<const float*>(x.data); }
  static float* f32(const LayerOutput& x) { return static_cast<float*>(x.data); }
  // x[0, n) (rotated in place) into out: nothing where out is x; copied to
  // another float32 out; rounded into a 16-bit one.
  static void placed(const LayerOutput& out, const float* x, int64_t n) {
    if (out.dtype == DDP_FLOAT32 && out.data != x) std::memcpy(out.data, x, sizeof(float) * size_t(n));
    if (out.dtype != DDP_FLOAT32) store(out, 0, x, n);
  }
  // x[at, at + count) in float32: its own memory, or widened into `into`.
  static const float* widened(const LayerInput& x, int64_t at, int64_t count, float* into) {
    if (x.dtype == DDP_FLOAT32) return f32(x) + at;
    check_16(x.dtype, "input");
    convert_cpu(into, DDP_FLOAT32, static_cast<const uint16_t*>(x.data) + at, x.dtype, size_t(count));
    return into;
  }

  ddp_dtype inputs_ = DDP_FLOAT32;
  std::vector<float> staged_;
};

}  // namespace

bool attention_keeps_weights(ddp_device_kind kind, ddp_dtype compute) {
  return kind == DDP_DEVICE_CPU || compute == DDP_FLOAT32;
}

size_t attention_scratch_floats(ddp_device_kind kind, ddp_dtype compute, int64_t b, int64_t t, int64_t heads) {
  const size_t square = static_cast<size_t>(t * t);
  if (kind == DDP_DEVICE_CPU) return square;
  return attention_keeps_weights(kind, compute) ? static_cast<size_t>(b * heads) * square
                                                : static_cast<size_t>(b * heads * t);
}

size_t Kernels::attention_scratch_floats(int64_t b, int64_t t, int64_t heads) const {
  return ddp::attention_scratch_floats(kind(), compute_dtype(), b, t, heads);
}

std::unique_ptr<Kernels> make_cpu_kernels() { return std::make_unique<CpuKernels>(); }

std::unique_ptr<Kernels> make_kernels(Device& device) {
  if (device.kind() == DDP_DEVICE_CPU) return make_cpu_kernels();
#if DDP_WITH_CUDA
  return make_cuda_kernels(device.compute_stream().native());
#else
  throw Error("this build has no CUDA (configure with -DDDP_WITH_CUDA=ON where nvcc exists)");
#endif
}

}  // namespace ddp
