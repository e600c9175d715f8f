// kernels.cpp — the CPU kernels (layers.h, run at once) and the choice of
// kernels by device.
#include "kernels.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <ddp/numeric.h>

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
  void linear_backward_input(float* dx, const float* dy, const float* w, int64_t n, int64_t in, int64_t out,
                             bool accumulate, float alpha) override {
    layers::linear_backward_input(dx, dy, w, n, in, out, accumulate, alpha, inputs_);
  }
  void linear_backward_weight(float* dw, const float* dy, GemmInput x, int64_t n, int64_t in, int64_t out,
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
      layers::rmsnorm_forward(floats(d), rms + i, x + i * d, g, 1, d);
      store(y, i * d, d);
    }
  }
  void rmsnorm_backward(float* dx, float* dg, const float* dy, const float* x, const float* g, const float* rms,
                        int64_t n, int64_t d, bool accumulate) override {
    layers::rmsnorm_backward(dx, dg, dy, x, g, rms, n, d, accumulate);
  }
  void rope_forward(float* x, const float* cos, const float* sin, int64_t b, int64_t t, int64_t heads,
                    int64_t dh) override {
    layers::rope_forward(x, cos, sin, b, t, heads, dh);
  }
  void rope_backward(float* dx, const float* cos, const float* sin, int64_t b, int64_t t, int64_t heads,
                     int64_t dh) override {
    layers::rope_backward(dx, cos, sin, b, t, heads, dh);
  }
  void attention_forward(float* out, float* p, const float* q, const float* k, const float* v, int64_t b, int64_t t,
                         int64_t heads, int64_t dh) override {
    layers::attention_forward(out, p, q, k, v, b, t, heads, dh, inputs_);
  }
  void attention_backward(float* dq, float* dk, float* dv, float* scratch, const float* dout, const float* p,
                          const float* q, const float* k, const float* v, int64_t b, int64_t t, int64_t heads,
                          int64_t dh) override {
    layers::attention_backward(dq, dk, dv, scratch, dout, p, q, k, v, b, t, heads, dh, inputs_);
  }
  void swiglu_forward(LayerOutput out, const float* a, const float* b, int64_t n) override {
    if (out.dtype == DDP_FLOAT32) return layers::swiglu_forward(static_cast<float*>(out.data), a, b, n);
    for (int64_t i = 0; i < n; i += kChunk) {  // (kChunk keeps the vector loops' alignment: the same bits)
      const int64_t count = std::min(kChunk, n - i);
      layers::swiglu_forward(floats(count), a + i, b + i, count);
      store(out, i, count);
    }
  }
  void swiglu_backward(float* da, float* db, const float* dout, const float* a, const float* b, int64_t n) override {
    layers::swiglu_backward(da, db, dout, a, b, n);
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
  // A 16-bit LayerOutput's float32 results pass through `staged_`, a row
  // or kChunk elements at a time: host memory of the kernels' own (a few
  // KB; uncounted, as gemm.h's rounded operands).
  static constexpr int64_t kChunk = 4096;
  float* floats(int64_t count) {
    if (staged_.size() < size_t(count)) staged_.resize(size_t(count));
    return staged_.data();
  }
  // out[at, at + count) = staged_[0, count), rounded to out's 16 bits.
  void store(const LayerOutput& out, int64_t at, int64_t count) {
    if (out.dtype != DDP_BFLOAT16 && out.dtype != DDP_FLOAT16)
      throw Error(std::string("CPU kernels: a layer output in ") + ddp_dtype_name(out.dtype) +
                  " (float32, bfloat16 or float16 only)");
    convert_cpu(static_cast<uint16_t*>(out.data) + at, out.dtype, staged_.data(), DDP_FLOAT32, size_t(count));
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
