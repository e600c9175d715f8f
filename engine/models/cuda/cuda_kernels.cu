// cuda_kernels.cu — the models' kernels (kernels.h) on a CUDA GPU: the
// functions of layers.h, enqueued in call order on one stream. GEMMs are
// cuBLAS (cuda_gemm.h: float32 without TF32, or the compute dtype's 16-bit
// inputs on the tensor cores), the rest are the CUDA kernels below, one
// group per layer, computing in float32 (RMSNorm and SwiGLU may store
// their output in 16 bits, and backward's RMSNorm, SwiGLU and attention
// read kept 16-bit inputs: kernels.h's LayerOutput, LayerInput). They
// compute what the CPU does to float32 rounding
// (agreement 1e-5 relative is tested in tests/cuda_kernels_test.cpp):
// accurate expf/logf/sqrtf and IEEE division (no fast math), the CPU's order
// of operations within an element, and sums in double where the CPU sums in
// double. The column sums (bias and RMSNorm gain gradients) and the
// embedding's scatter-add are the CPU's bit for bit (same additions, same
// order, no FMA contraction).
//
// Every result is the same from run to run: no float atomics, every
// reduction runs in a fixed order given by the sizes alone (cuBLAS is
// deterministic on one GPU model and toolkit).
//
// Attention in float32 materialises p as the CPU does (the causal GEMMs
// compute the masked half too); in 16 bits it is fused_attention.h's
// (no [t, t] weights in memory). Deliberately absent: 16-bit arithmetic
// in the elementwise kernels, any tuning beyond a sensible launch geometry.
//
// Every call runs on the device current when the kernels were made. A CUDA
// or cuBLAS failure throws Error naming the call and CUDA's message. The
// kernels themselves are in layer_kernels.cuh; this file is their host side.
#include <cuda_runtime_api.h>
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <string>

#include <ddp/numeric.h>

#include "convert.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_gemm.h"
#include "cuda/cuda_kernels.h"
#include "cuda/cuda_ops.h"
#include "cuda/fused_attention.h"
#include "error.h"
#include "layer_kernels.cuh"
#include "layers.h"

namespace ddp {
namespace {

// ---- errors -----------------------------------------------------------------

using cuda::check;

// One-block-per-row grids take int counts.
int to_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX)
    throw Error(std::string("CUDA kernels: ") + what + " = " + std::to_string(v) +
                " is out of int range (cuBLAS sizes, grid dimensions)");
  return static_cast<int>(v);
}

// ---- the Kernels -----------------------------------------------------------------

// Uploads go through pinned staging slots, used in turn, each reused once
// the copy out of it has run (an event); a larger upload goes in chunks. So
// the caller's memory is free once upload returns, whatever kind of host
// memory it is, and uploads in a row (tokens, then targets) do not wait for
// the stream.
constexpr int kStagingSlots = 4;
constexpr size_t kSlotBytes = size_t{1} << 20;

class CudaKernels final : public Kernels {
 public:
  explicit CudaKernels(cudaStream_t stream) : stream_(stream), gemms_(stream) {
    try {
      for (Slot& slot : slots_) check(cudaEventCreateWithFlags(&slot.sent, cudaEventDisableTiming), "cudaEventCreate");
      check(cudaMallocHost(&host_sum_, sizeof(double)), "cudaMallocHost");
    } catch (...) {
      release();
      throw;
    }
  }
  ~CudaKernels() override { release(); }
  CudaKernels(const CudaKernels&) = delete;
  CudaKernels& operator=(const CudaKernels&) = delete;

  ddp_device_kind kind() const override { return DDP_DEVICE_CUDA; }
  void set_compute_dtype(ddp_dtype dtype) override { gemms_.set_inputs(dtype); }
  ddp_dtype compute_dtype() const override { return gemms_.inputs(); }

  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync (copy)");
  }

  void convert(void* dst, ddp_dtype dst_type, const void* src, ddp_dtype src_type, size_t n) override {
    if (std::string why = convert_refusal(dst_type, src_type); !why.empty()) throw Error(why, DDP_ERR_UNSUPPORTED);
    if (n > 0) cuda_ops::convert(stream_, dst, dst_type, src, src_type, n);
  }

  void upload(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    for (size_t done = 0; done < bytes; done += kSlotBytes) {
      const size_t chunk = std::min(kSlotBytes, bytes - done);
      Slot& slot = slots_[next_slot_];
      next_slot_ = (next_slot_ + 1) % kStagingSlots;
      if (!slot.host) check(cudaMallocHost(&slot.host, kSlotBytes), "cudaMallocHost (staging)");
      check(cudaEventSynchronize(slot.sent),
            "cudaEventSynchronize (staging)");  // its last copy ran
      std::memcpy(slot.host, static_cast<const char*>(src) + done, chunk);
      check(cudaMemcpyAsync(static_cast<char*>(dst) + done, slot.host, chunk, cudaMemcpyHostToDevice, stream_),
            "cudaMemcpyAsync (upload)");
      check(cudaEventRecord(slot.sent, stream_), "cudaEventRecord (staging)");
    }
  }

  // ---- linear ------------------------------------------------------------------
  // Row-major operands as layers.cpp's cblas calls, through gemms_ (cuda_gemm.h).

  void linear_forward(float* y, GemmInput x, const float* w, int64_t n, int64_t in, int64_t out,
                      bool accumulate) override {
    // y[n, out] (+)= x[n, in] · w[out, in]^T
    gemms_.gemm(false, true, n, out, in, 1.0f, x, in, w, in, accumulate ? 1.0f : 0.0f, y, out);
  }
  void linear_backward_input(float* dx, GemmInput dy, const float* w, int64_t n, int64_t in, int64_t out,
                             bool accumulate, float alpha) override {
    // dx[n, in] (+)= alpha * dy[n, out] · w[out, in]
    gemms_.gemm(false, false, n, in, out, alpha, dy, out, w, in, accumulate ? 1.0f : 0.0f, dx, in);
  }
  void linear_backward_weight(float* dw, GemmInput dy, GemmInput x, int64_t n, int64_t in, int64_t out,
                              float alpha) override {
    // dw[out, in] += alpha * dy[n, out]^T · x[n, in]
    gemms_.gemm(true, false, out, in, n, alpha, dy, out, x, in, 1.0f, dw, in);
  }

  void bias_forward(float* y, const float* b, int64_t n, int64_t out) override {
    if (n * out == 0) return;
    bias_forward_kernel<<<grid_for(n * out), kThreads, 0, stream_>>>(y, b, n, out);
    check_launch("bias_forward_kernel");
  }
  void bias_backward(float* db, const float* dy, int64_t n, int64_t out) override {
    column_sum(stream_, scratch_floats(column_sum_scratch(n, out)), db, n, out, BiasTerm{dy, out},
               "column_tile_sums_kernel (bias_backward)");
  }

  // ---- embedding -----------------------------------------------------------------

  void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t n, int64_t d) override {
    if (n * d == 0) return;
    embedding_forward_kernel<<<grid_for(n * d), kThreads, 0, stream_>>>(out, tokens, table, n, d);
    check_launch("embedding_forward_kernel");
  }
  void embedding_backward(float* dtable, const float* dout, const int32_t* tokens, int64_t n, int64_t d) override {
    if (n * d == 0) return;
    const int items = to_int(n, "embedding_backward rows");
    // Scratch: sorted tokens, positions, sorted positions, then CUB's own.
    size_t cub_bytes = 0;
    check(cub::DeviceRadixSort::SortPairs(nullptr, cub_bytes, tokens, static_cast<int32_t*>(nullptr),
                                          static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), items,
                                          0, 32, stream_),
          "cub::DeviceRadixSort::SortPairs (size)");
    const size_t ints = (static_cast<size_t>(n) * 3 + 63) / 64 * 64;  // CUB's part 256-byte aligned
    int32_t* keys = static_cast<int32_t*>(scratch_bytes(ints * sizeof(int32_t) + cub_bytes));
    int32_t* positions = keys + n;
    int32_t* sorted_positions = positions + n;
    iota_kernel<<<grid_for(n), kThreads, 0, stream_>>>(positions, n);
    check_launch("iota_kernel");
    check(cub::DeviceRadixSort::SortPairs(keys + ints, cub_bytes, tokens, keys, positions, sorted_positions, items, 0,
                                          32, stream_),
          "cub::DeviceRadixSort::SortPairs (tokens)");
    embedding_runs_kernel<<<blocks(n, "embedding_backward rows"), kThreads, 0, stream_>>>(dtable, dout, keys,
                                                                                          sorted_positions, n, d);
    check_launch("embedding_runs_kernel");
  }

  // ---- RMSNorm, RoPE -----------------------------------------------------------------

  void rmsnorm_forward(LayerOutput y, float* rms, const float* x, const float* g, int64_t n, int64_t d) override {
    with_store(y, [&](auto store) {
      if (n == 0) return;
      rmsnorm_forward_kernel<<<blocks(n, "rmsnorm rows"), kThreads, 0, stream_>>>(store, rms, x, g, d);
      check_launch("rmsnorm_forward_kernel");
    });
  }
  void rmsnorm_backward(float* dx, float* dg, const float* dy, LayerInput x, const float* g, const float* rms,
                        int64_t n, int64_t d, bool accumulate) override {
    with_load(x, [&](auto load) {
      if (n == 0) return;
      rmsnorm_backward_kernel<<<blocks(n, "rmsnorm rows"), kThreads, 0, stream_>>>(dx, dy, load, g, rms, d, accumulate);
      check_launch("rmsnorm_backward_kernel");
      if (dg)
        column_sum(stream_, scratch_floats(column_sum_scratch(n, d)), dg, n, d,
                   RmsGainTerm<decltype(load)>{dy, load, rms, d}, "column_tile_sums_kernel (rmsnorm dg)");
    });
  }

  void rope_forward(LayerOutput out, float* x, const float* cos, const float* sin, int64_t b, int64_t t, int64_t heads,
                    int64_t dh) override {
    with_store(out, [&](auto store) { rope(store, x, cos, sin, b, t, heads, dh, 1.0f); });
  }
  void rope_backward(LayerOutput out, float* dx, const float* cos, const float* sin, int64_t b, int64_t t,
                     int64_t heads, int64_t dh) override {
    with_store(out, [&](auto store) { rope(store, dx, cos, sin, b, t, heads, dh, -1.0f); });
  }

  // ---- causal attention --------------------------------------------------------------

  // The attention scratch (kernels.h: [b, heads, t, t]) holds ds (dp first)
  // for every sequence and head at once: one softmax-backward launch
  // instead of one per sequence. The same size as p.

  // An attention operand that must be float32 here, or Error saying why.
  // p is float32 on a GPU (the weights in float32 compute, else the rows'
  // statistics: attention_keeps_weights).
  static constexpr const char* kPIsFloat = "a GPU keeps it in float32: kernels.h's attention_keeps_weights";
  static constexpr const char* kFloat32Compute = "float32 compute reads and writes float32";
  static void check_float32(ddp_dtype dtype, const char* what, const char* why) {
    if (dtype != DDP_FLOAT32)
      throw Error(std::string("CUDA kernels: attention's ") + what + " in " + ddp_dtype_name(dtype) + " (" + why + ")");
  }
  static float* floats_of(const LayerOutput& x, const char* what, const char* why) {
    check_float32(x.dtype, what, why);
    return static_cast<float*>(x.data);
  }
  static const float* floats_of(const LayerInput& x, const char* what, const char* why) {
    check_float32(x.dtype, what, why);
    return static_cast<const float*>(x.data);
  }

  void attention_forward(LayerOutput o, LayerOutput kept, LayerInput kept_q, LayerInput kept_k, LayerInput kept_v,
                         int64_t b, int64_t t, int64_t heads, int64_t dh) override {
    float* p = floats_of(kept, "p", kPIsFloat);
    if (gemms_.inputs() != DDP_FLOAT32) {  // 16 bits: no [t, t] weights (kernels.h)
      cuda::fused_attention_forward(stream_, gemms_.inputs(), o, p, kept_q, kept_k, kept_v, b, t, heads, dh);
      return;
    }
    const char* why = kFloat32Compute;
    float* out = floats_of(o, "out", why);
    const float* q = floats_of(kept_q, "q", why);
    const float* k = floats_of(kept_k, "k", why);
    const float* v = floats_of(kept_v, "v", why);
    if (b * t * heads * dh == 0) return;
    const int64_t d = heads * dh;
    const int64_t tt = t * t;
    const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
    for (int64_t s = 0; s < b; ++s) {
      const int64_t off = s * t * d;  // sequence s; head h at + h*dh
      // scores p_h[t, t] = q_h[t, dh] · k_h[t, dh]^T / sqrt(dh)
      gemms_.gemm_heads(false, true, t, t, dh, scale, q + off, d, dh, k + off, d, dh, 0.0f, p + s * heads * tt, t, tt,
                        heads);
    }
    const int64_t rows = b * heads * t;
    causal_softmax_kernel<<<blocks((rows + kRowsPerBlock - 1) / kRowsPerBlock, "attention rows"), kThreads, 0,
                            stream_>>>(p, rows, t);
    check_launch("causal_softmax_kernel");
    for (int64_t s = 0; s < b; ++s) {
      const int64_t off = s * t * d;
      // out_h[t, dh] = p_h[t, t] · v_h[t, dh]
      gemms_.gemm_heads(false, false, t, dh, t, 1.0f, p + s * heads * tt, t, tt, v + off, d, dh, 0.0f, out + off, d, dh,
                        heads);
    }
  }

  void attention_backward(float* dq, float* dk, LayerOutput dv, float* scratch, const float* dout, LayerInput kept_p,
                          LayerInput kept_q, LayerInput kept_k, LayerInput kept_v, int64_t b, int64_t t, int64_t heads,
                          int64_t dh) override {
    const float* p = floats_of(kept_p, "p", kPIsFloat);
    if (gemms_.inputs() != DDP_FLOAT32) {  // q, k, v as kept, read by the fused kernels
      cuda::fused_attention_backward(stream_, gemms_.inputs(), dq, dk, dv, scratch, dout, p, kept_q, kept_k, kept_v, b,
                                     t, heads, dh);
      return;
    }
    const char* why = kFloat32Compute;
    float* dvf = floats_of(dv, "dv", why);
    const float* q = floats_of(kept_q, "q", why);
    const float* k = floats_of(kept_k, "k", why);
    const float* v = floats_of(kept_v, "v", why);
    if (b * t * heads * dh == 0) return;
    const int64_t d = heads * dh;
    const int64_t tt = t * t;
    const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
    for (int64_t s = 0; s < b; ++s) {
      const int64_t off = s * t * d;
      const float* ps = p + s * heads * tt;
      // dp_h[t, t] = dout_h[t, dh] · v_h[t, dh]^T
      gemms_.gemm_heads(false, true, t, t, dh, 1.0f, dout + off, d, dh, v + off, d, dh, 0.0f, scratch + s * heads * tt,
                        t, tt, heads);
      // dv_h[t, dh] = p_h[t, t]^T · dout_h[t, dh]
      gemms_.gemm_heads(true, false, t, dh, t, 1.0f, ps, t, tt, dout + off, d, dh, 0.0f, dvf + off, d, dh, heads);
    }
    const int64_t rows = b * heads * t;
    causal_softmax_backward_kernel<<<blocks((rows + kRowsPerBlock - 1) / kRowsPerBlock, "attention rows"), kThreads, 0,
                                     stream_>>>(scratch, p, rows, t, scale);
    check_launch("causal_softmax_backward_kernel");
    for (int64_t s = 0; s < b; ++s) {
      const int64_t off = s * t * d;
      const float* ds = scratch + s * heads * tt;
      // dq_h[t, dh] = ds_h[t, t] · k_h[t, dh];  dk_h[t, dh] = ds_h[t, t]^T · q_h[t, dh]
      gemms_.gemm_heads(false, false, t, dh, t, 1.0f, ds, t, tt, k + off, d, dh, 0.0f, dq + off, d, dh, heads);
      gemms_.gemm_heads(true, false, t, dh, t, 1.0f, ds, t, tt, q + off, d, dh, 0.0f, dk + off, d, dh, heads);
    }
  }

  // ---- elementwise -------------------------------------------------------------------

  void swiglu_forward(LayerOutput out, const float* a, const float* b, int64_t n) override {
    with_store(out, [&](auto store) {
      if (n == 0) return;
      swiglu_forward_kernel<<<grid_for(n), kThreads, 0, stream_>>>(store, a, b, n);
      check_launch("swiglu_forward_kernel");
    });
  }
  void swiglu_backward(LayerOutput da, LayerOutput db, const float* dout, LayerInput a, LayerInput b,
                       int64_t n) override {
    if (a.dtype != b.dtype || da.dtype != db.dtype)
      throw Error(std::string("CUDA kernels: swiglu_backward's a in ") + ddp_dtype_name(a.dtype) + ", b in " +
                  ddp_dtype_name(b.dtype) + ", da in " + ddp_dtype_name(da.dtype) + ", db in " +
                  ddp_dtype_name(db.dtype) + " (one dtype for a and b, one for da and db)");
    with_load(a, [&](auto load) {
      with_store(da, [&](auto store) {
        if (n == 0) return;
        swiglu_backward_kernel<<<grid_for(n), kThreads, 0, stream_>>>(store, store_like(store, db), dout, load,
                                                                      load_like(load, b), n);
        check_launch("swiglu_backward_kernel");
      });
    });
  }
  void relu_forward(float* y, const float* x, int64_t n) override {
    if (n == 0) return;
    relu_forward_kernel<<<grid_for(n), kThreads, 0, stream_>>>(y, x, n);
    check_launch("relu_forward_kernel");
  }
  void relu_backward(float* dx, const float* dy, const float* y, int64_t n) override {
    if (n == 0) return;
    relu_backward_kernel<<<grid_for(n), kThreads, 0, stream_>>>(dx, dy, y, n);
    check_launch("relu_backward_kernel");
  }

  // ---- losses ------------------------------------------------------------------------

  float cross_entropy_forward(float* lse, float* logits, const int32_t* targets, int64_t n, int64_t v) override {
    double total = 0.0;
    if (n > 0) {
      double* terms = device_doubles(static_cast<size_t>(n) + 1);  // [n] terms, then the sum
      cross_entropy_forward_kernel<<<blocks(n, "cross_entropy rows"), kThreads, 0, stream_>>>(lse, terms, logits,
                                                                                              targets, v);
      check_launch("cross_entropy_forward_kernel");
      if (v > 0) {
        cross_entropy_gradient_kernel<<<grid_for(n * v), kThreads, 0, stream_>>>(logits, lse, targets, n, v);
        check_launch("cross_entropy_gradient_kernel");
      }
      total = sum_to_host(terms + n, terms, n);
    }
    return static_cast<float>(total / static_cast<double>(n));
  }
  void cross_entropy_backward(float* dlogits, int64_t n, int64_t v, float scale) override {
    if (n * v == 0) return;
    const float c = scale / static_cast<float>(n);  // rounded to float first, as the CPU
    cuda_ops::scale(stream_, dlogits, static_cast<size_t>(n * v), c);
  }

  float mse_forward(const float* pred, const float* y, int64_t n) override {
    double total = 0.0;
    if (n > 0) {
      const int64_t parts = std::min<int64_t>(grid_for(n), kMseBlocks);
      double* partial = device_doubles(static_cast<size_t>(parts) + 1);  // [parts], then the sum
      mse_partial_kernel<<<static_cast<unsigned>(parts), kThreads, 0, stream_>>>(partial, pred, y, n);
      check_launch("mse_partial_kernel");
      total = sum_to_host(partial + parts, partial, parts);
    }
    return static_cast<float>(total / static_cast<double>(n));
  }
  void mse_backward(float* d, const float* pred, const float* y, int64_t n, float scale) override {
    if (n == 0) return;
    const float c = 2.0f * scale / static_cast<float>(n);  // rounded to float first, as the CPU
    mse_backward_kernel<<<grid_for(n), kThreads, 0, stream_>>>(d, pred, y, n, c);
    check_launch("mse_backward_kernel");
  }

 private:
  template <typename Store>
  void rope(Store out, const float* x, const float* cos, const float* sin, int64_t b, int64_t t, int64_t heads,
            int64_t dh, float sign) {
    const int64_t pairs = b * t * heads * (dh / 2);
    if (pairs == 0) return;
    rope_kernel<<<grid_for(pairs), kThreads, 0, stream_>>>(out, x, cos, sin, pairs, t, heads, dh, dh / 2, sign);
    check_launch("rope_kernel");
  }

  // A grid of one block per row (or per group of rows).
  static unsigned blocks(int64_t n, const char* what) { return static_cast<unsigned>(to_int(n, what)); }

  // Device scratch for the losses' partial sums, the column sums and the
  // embedding's sort; its contents live for one call. Grown on demand
  // (rarely: the sizes are those of the step); the stream is idle before
  // the old buffer goes.
  void* scratch_bytes(size_t bytes) {
    if (bytes > scratch_size_) {
      check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (scratch)");
      if (scratch_) check(cudaFree(scratch_), "cudaFree (scratch)");
      scratch_ = nullptr;
      scratch_size_ = 0;
      check(cudaMalloc(&scratch_, bytes), "cudaMalloc (scratch)");
      scratch_size_ = bytes;
    }
    return scratch_;
  }
  float* scratch_floats(size_t count) { return static_cast<float*>(scratch_bytes(count * sizeof(float))); }
  double* device_doubles(size_t count) { return static_cast<double*>(scratch_bytes(count * sizeof(double))); }

  // Sums in[n] into *out on the device and returns it to the host, waiting
  // for the stream (the loss's .item()).
  double sum_to_host(double* out, const double* in, int64_t n) {
    sum_doubles_kernel<<<1, kThreads, 0, stream_>>>(out, in, n);
    check_launch("sum_doubles_kernel");
    check(cudaMemcpyAsync(host_sum_, out, sizeof(double), cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync (loss)");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (loss)");
    return *host_sum_;
  }

  // Teardown never throws: work still queued may use the buffers, so wait
  // for the device first (not the stream: it may be gone already), ignoring
  // errors (a failed stream has reported them).
  void release() noexcept {
    cudaDeviceSynchronize();
    for (Slot& slot : slots_) {
      if (slot.sent) cudaEventDestroy(slot.sent);
      if (slot.host) cudaFreeHost(slot.host);
      slot = Slot{};
    }
    if (host_sum_) cudaFreeHost(host_sum_);
    if (scratch_) cudaFree(scratch_);
    cudaGetLastError();
    host_sum_ = nullptr;
    scratch_ = nullptr;
  }

  cudaStream_t stream_;
  cuda::Gemms gemms_;  // the GEMMs, in the compute dtype
  struct Slot {
    void* host = nullptr;        // pinned [kSlotBytes], allocated at its first use
    cudaEvent_t sent = nullptr;  // recorded after the copy out of it
  };
  Slot slots_[kStagingSlots];
  int next_slot_ = 0;
  double* host_sum_ = nullptr;  // pinned, a loss on its way to the host
  void* scratch_ = nullptr;     // device [scratch_size_] bytes: scratch_bytes
  size_t scratch_size_ = 0;
};

}  // namespace

std::unique_ptr<Kernels> make_cuda_kernels(void* stream) {
  return std::make_unique<CudaKernels>(static_cast<cudaStream_t>(stream));
}

}  // namespace ddp
