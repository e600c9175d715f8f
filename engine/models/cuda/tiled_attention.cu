// tiled_attention.cu — tiled_attention.h's kernels: fused_attention.h's
// quantities on the tensor cores. A block is 4 warps and one 64-row tile of
// one head: query rows (forward, dq) or key rows (dk, dv), 16 a warp. It
// walks the other side's rows a 64-row tile at a time through shared
// memory, in 16 bits (q, k, v and dout rounded as fused_attention.h rounds
// them). Each product is a warp's nvcuda::wmma 16x16x16 fragments, float32
// accumulators; the scores a warp computes go through shared memory, where
// two lanes a row turn them into weights (softmax in float32, the weight
// rounded as the product reads it), then into ds. Two passes over the keys,
// as the warp kernels: the first finds each row's max and sum (forward) or
// D_i = sum_j p_ij dp_ij (dq), the second uses them, so every weight is
// exp(s - m) / sum of the final m and sum, rounded once, as the CPU's
// emulation computes it (the first pass rescales its sum at each tile's
// max, FlashAttention's online softmax, so a weight may round one 16-bit
// ulp away from the warp kernels'). A masked weight is a 0 in a product:
// a non-finite k, v or dout beside the mask reaches rows the warp kernels
// skip it for (the step is non-finite either way). No atomics: dq is one
// kernel over the keys, dk and dv another over the queries; every sum runs
// in an order fixed by the sizes, so the results repeat bit for bit.
#include "cuda/tiled_attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <string>
#include <type_traits>

#include <ddp/numeric.h>

#include "cuda/cuda_check.h"
#include "cuda/tiled_attention_parts.cuh"
#include "error.h"

namespace ddp::cuda {
namespace tiled {
namespace {

// out_i = sum_j<=i p_ij v_j (float32, or rounded to Out); stats_i =
// (m_i, sum_i). A block: a query tile.
template <typename T, int kDh, typename In, typename Out>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(Out* out, float* stats, const In* q, const In* k, const In* v, int64_t t, int64_t heads, int tiles,
                   float scale) {
#if DDP_TILED_ARCH
  using L = Layout<kDh>;
  extern __shared__ __align__(128) unsigned char smem[];
  const Shared<T, 3> sh = carve<T, kDh, 3>(smem);
  T* qs = sh.tile[0];
  T* ks = sh.tile[1];
  T* vs = sh.tile[2];
  float* sw = sh.sw;
  T* pw = sh.pw;
  const Block blk = block_of(t, heads, kDh, tiles, true);
  const int warp = threadIdx.x >> 5;
  const int64_t d = heads * kDh;
  const int64_t q0 = int64_t(blk.tile) * kTile;
  const int row = lane_row();
  const int64_t i = q0 + warp * 16 + row;  // the lane's query
  const T* qw = qs + warp * 16 * L::kLd;
  load_tile<T, kDh>(qs, q + blk.head, q0, t, d);
  float m = -INFINITY;
  float sum = 0.0f;
  for (int kt = 0; kt <= blk.tile; ++kt) {  // the row's max and sum
    __syncthreads();
    load_tile<T, kDh>(ks, k + blk.head, int64_t(kt) * kTile, t, d);
    __syncthreads();
    products<T, kDh>(sw, qw, ks);
    float tm = -INFINITY;
    for (int c = 0; c < kTile / 2; ++c) {
      const int64_t j = int64_t(kt) * kTile + lane_col(c);
      if (j <= i && j < t) tm = fmaxf(tm, __fmul_rn(scale, sw[row * kLdS + lane_col(c)]));
    }
    const float mn = fmaxf(m, fmaxf(tm, __shfl_xor_sync(kAll, tm, 1)));
    float ts = 0.0f;
    for (int c = 0; c < kTile / 2; ++c) {
      const int64_t j = int64_t(kt) * kTile + lane_col(c);
      if (j <= i && j < t) ts = __fadd_rn(ts, expf(__fsub_rn(__fmul_rn(scale, sw[row * kLdS + lane_col(c)]), mn)));
    }
    ts = pair_sum(ts);
    if (mn != -INFINITY) sum = __fadd_rn(m == -INFINITY ? 0.0f : __fmul_rn(sum, expf(__fsub_rn(m, mn))), ts);
    m = mn;
    __syncwarp();
  }
  Acc o[kDh / 16];
  zero<kDh>(o);
  for (int kt = 0; kt <= blk.tile; ++kt) {  // out = p v
    __syncthreads();
    load_tile<T, kDh>(ks, k + blk.head, int64_t(kt) * kTile, t, d);
    load_tile<T, kDh>(vs, v + blk.head, int64_t(kt) * kTile, t, d);
    __syncthreads();
    products<T, kDh>(sw, qw, ks);
    weights_by_query<T>(pw, sw, i, int64_t(kt) * kTile, t, m, sum, scale);
    accumulate<T, kDh>(o, pw, vs);
  }
  __syncthreads();
  store_rows<kDh>(out + blk.head, q0, t, d, o, reinterpret_cast<float*>(ks));
  if ((threadIdx.x & 1) == 0 && i < t) {
    stats[2 * (blk.bh * t + i)] = m;
    stats[2 * (blk.bh * t + i) + 1] = sum;
  }
#else
  __trap();
#endif
}

// dq_i = sum_j round(ds_ij) k_j, after D_i = sum_j p_ij dp_ij (into dsum).
template <typename T, int kDh, typename In>
__global__ void __launch_bounds__(kThreads)
    backward_dq_kernel(float* dq, float* dsum, const float* dout, const float* stats, const In* q, const In* k,
                       const In* v, int64_t t, int64_t heads, int tiles, float scale) {
#if DDP_TILED_ARCH
  using L = Layout<kDh>;
  extern __shared__ __align__(128) unsigned char smem[];
  const Shared<T, 4> sh = carve<T, kDh, 4>(smem);
  T* qs = sh.tile[0];
  T* dos = sh.tile[1];
  T* ks = sh.tile[2];
  T* vs = sh.tile[3];
  float* sw = sh.sw;
  T* pw = sh.pw;
  const Block blk = block_of(t, heads, kDh, tiles, true);
  const int warp = threadIdx.x >> 5;
  const int64_t d = heads * kDh;
  const int64_t q0 = int64_t(blk.tile) * kTile;
  const int row = lane_row();
  const int64_t i = q0 + warp * 16 + row;
  load_tile<T, kDh>(qs, q + blk.head, q0, t, d);
  load_tile<T, kDh>(dos, dout + blk.head, q0, t, d);
  const float m = i < t ? stats[2 * (blk.bh * t + i)] : 0.0f;
  const float sum = i < t ? stats[2 * (blk.bh * t + i) + 1] : 1.0f;
  float big_d = 0.0f;
  Acc g[kDh / 16];
  zero<kDh>(g);
  for (int pass = 0; pass < 2; ++pass) {  // D, then dq
    for (int kt = 0; kt <= blk.tile; ++kt) {
      const int64_t j0 = int64_t(kt) * kTile;
      __syncthreads();
      load_tile<T, kDh>(ks, k + blk.head, j0, t, d);
      load_tile<T, kDh>(vs, v + blk.head, j0, t, d);
      __syncthreads();
      products<T, kDh>(sw, qs + warp * 16 * L::kLd, ks);
      weights_by_query<T>(pw, sw, i, j0, t, m, sum, scale);
      products<T, kDh>(sw, dos + warp * 16 * L::kLd, vs);  // dp
      if (pass == 0) {
        float part = 0.0f;
        for (int c = 0; c < kTile / 2; ++c)
          part = __fmaf_rn(wide(pw[row * kLdP + lane_col(c)]), sw[row * kLdS + lane_col(c)], part);
        big_d = __fadd_rn(big_d, pair_sum(part));
        __syncwarp();
        continue;
      }
      ds_in_place<T>(pw, sw, nullptr, big_d, scale);
      accumulate<T, kDh>(g, pw, ks);
    }
  }
  __syncthreads();
  store_rows<kDh>(dq + blk.head, q0, t, d, g, reinterpret_cast<float*>(ks));
  if ((threadIdx.x & 1) == 0 && i < t) dsum[blk.bh * t + i] = big_d;
#else
  __trap();
#endif
}

// dv_j = sum_i>=j p_ij dout_i, dk_j = sum_i>=j round(ds_ij) q_i (dv in
// float32, or rounded to Out). A block: a key tile; the warps' products
// are transposed (keys x queries).
template <typename T, int kDh, typename In, typename Out>
__global__ void __launch_bounds__(kThreads)
    backward_dkdv_kernel(float* dk, Out* dv, const float* dsum, const float* dout, const float* stats, const In* q,
                         const In* k, const In* v, int64_t t, int64_t heads, int tiles, float scale) {
#if DDP_TILED_ARCH
  using L = Layout<kDh>;
  extern __shared__ __align__(128) unsigned char smem[];
  const Shared<T, 4> sh = carve<T, kDh, 4>(smem);
  T* ks = sh.tile[0];
  T* vs = sh.tile[1];
  T* qs = sh.tile[2];
  T* dos = sh.tile[3];
  float* sw = sh.sw;
  T* pw = sh.pw;
  float* stat = sh.stat;  // the query tile's m, sum, D
  const Block blk = block_of(t, heads, kDh, tiles, false);
  const int warp = threadIdx.x >> 5;
  const int64_t d = heads * kDh;
  const int64_t k0 = int64_t(blk.tile) * kTile;
  const int64_t j = k0 + warp * 16 + lane_row();  // the lane's key
  load_tile<T, kDh>(ks, k + blk.head, k0, t, d);
  load_tile<T, kDh>(vs, v + blk.head, k0, t, d);
  Acc gk[kDh / 16];
  Acc gv[kDh / 16];
  zero<kDh>(gk);
  zero<kDh>(gv);
  for (int it = blk.tile; it < tiles; ++it) {
    const int64_t i0 = int64_t(it) * kTile;
    __syncthreads();
    load_tile<T, kDh>(qs, q + blk.head, i0, t, d);
    load_tile<T, kDh>(dos, dout + blk.head, i0, t, d);
    for (int e = threadIdx.x; e < kTile; e += kThreads) {
      const int64_t r = blk.bh * t + i0 + e;
      const bool in = i0 + e < t;
      stat[e] = in ? stats[2 * r] : 0.0f;
      stat[kTile + e] = in ? stats[2 * r + 1] : 1.0f;
      stat[2 * kTile + e] = in ? dsum[r] : 0.0f;
    }
    __syncthreads();
    products<T, kDh>(sw, ks + warp * 16 * L::kLd, qs);  // s^T
    weights_by_key<T>(pw, sw, j, i0, t, stat, scale);
    accumulate<T, kDh>(gv, pw, dos);
    products<T, kDh>(sw, vs + warp * 16 * L::kLd, dos);  // dp^T
    ds_in_place<T>(pw, sw, stat + 2 * kTile, 0.0f, scale);
    accumulate<T, kDh>(gk, pw, qs);
  }
  __syncthreads();
  float* stage = reinterpret_cast<float*>(ks);  // the four tiles hold both
  store_rows<kDh>(dk + blk.head, k0, t, d, gk, stage);
  store_rows<kDh>(dv + blk.head, k0, t, d, gv, stage + kTile * (kDh + 4));
#else
  __trap();
#endif
}

// f(T{}) for the compute dtype's 16-bit type.
template <typename F>
void with_type(ddp_dtype dtype, F&& f) {
  if (dtype == DDP_BFLOAT16) return f(__nv_bfloat16{});
  if (dtype == DDP_FLOAT16) return f(__half{});
  throw Error(std::string("tiled attention: compute in ") + ddp_dtype_name(dtype) + " (bfloat16 or float16 only)",
              DDP_ERR_UNSUPPORTED);
}
// f(integral_constant<dh>) for the head sizes the kernels are built for.
template <typename F>
void with_dh(int64_t dh, F&& f) {
  if (dh == 16) return f(std::integral_constant<int, 16>{});
  if (dh == 32) return f(std::integral_constant<int, 32>{});
  if (dh == 64) return f(std::integral_constant<int, 64>{});
  if (dh == 128) return f(std::integral_constant<int, 128>{});
  throw Error("tiled attention: head size " + std::to_string(dh) + " (16, 32, 64 or 128)", DDP_ERR_UNSUPPORTED);
}

struct Grid {
  unsigned blocks;
  int tiles;
};
Grid grid_of(int64_t b, int64_t t, int64_t heads) {
  const int64_t tiles = (t + kTile - 1) / kTile;
  if (b * heads * tiles > INT32_MAX)
    throw Error("tiled attention: " + std::to_string(b * heads * tiles) + " tiles is more than a grid holds");
  return {static_cast<unsigned>(b * heads * tiles), static_cast<int>(tiles)};
}

// Launches `kernel` with `bytes` of shared memory (above 48 KiB: opted in).
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), const char* name, Grid g, int bytes, cudaStream_t stream, Args... args) {
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
        std::string("cudaFuncSetAttribute(") + name + ", " + std::to_string(bytes) + " bytes of shared memory)");
  kernel<<<g.blocks, kThreads, bytes, stream>>>(args...);
  check_launch(std::string("tiled attention ") + name);
}

}  // namespace
}  // namespace tiled

void check_attention_inputs(ddp_dtype compute, const GemmInput& q, const GemmInput& k, const GemmInput& v) {
  if (q.dtype != k.dtype || q.dtype != v.dtype || (q.dtype != DDP_FLOAT32 && q.dtype != compute))
    throw Error(std::string("fused attention: q, k, v in ") + ddp_dtype_name(q.dtype) + ", " + ddp_dtype_name(k.dtype) +
                    ", " + ddp_dtype_name(v.dtype) + " (float32 or " + ddp_dtype_name(compute) + ", all three alike)",
                DDP_ERR_UNSUPPORTED);
}

void check_attention_output(ddp_dtype compute, const LayerOutput& out) {
  if (out.dtype != DDP_FLOAT32 && out.dtype != compute)
    throw Error(std::string("fused attention: an output in ") + ddp_dtype_name(out.dtype) + " (float32 or " +
                    ddp_dtype_name(compute) + ")",
                DDP_ERR_UNSUPPORTED);
}

bool tiled_attention_fits(int64_t dh) {
  if (dh != 16 && dh != 32 && dh != 64 && dh != 128) return false;
  // The code the device runs, not only the device: a build for an older
  // GPU's PTX, compiled for this one by the driver, has the trapping bodies.
  thread_local int device = -1;
  thread_local bool fits = false;
  int now = 0;
  check(cudaGetDevice(&now), "cudaGetDevice");
  if (now != device) {
    cudaFuncAttributes a{};
    check(cudaFuncGetAttributes(&a, tiled::forward_kernel<__nv_bfloat16, 16, float, float>),
          "cudaFuncGetAttributes (tiled attention)");
    fits = a.ptxVersion >= 80 && a.binaryVersion >= 80;
    device = now;
  }
  return fits;
}

void tiled_attention_forward(cudaStream_t stream, ddp_dtype dtype, LayerOutput out, float* stats, GemmInput q,
                             GemmInput k, GemmInput v, int64_t b, int64_t t, int64_t heads, int64_t dh) {
  check_attention_inputs(dtype, q, k, v);
  check_attention_output(dtype, out);
  if (b * t * heads == 0) return;
  const tiled::Grid g = tiled::grid_of(b, t, heads);
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  tiled::with_type(dtype, [&](auto element) {
    using T = decltype(element);
    tiled::with_dh(dh, [&](auto size) {
      constexpr int kDh = decltype(size)::value;
      const auto run = [&](auto input, auto output) {  // q, k, v and out: float32 or T
        using In = decltype(input);
        using Out = decltype(output);
        tiled::launch(tiled::forward_kernel<T, kDh, In, Out>, "forward_kernel", g, tiled::Layout<kDh>::bytes(3), stream,
                      static_cast<Out*>(out.data), stats, static_cast<const In*>(q.data),
                      static_cast<const In*>(k.data), static_cast<const In*>(v.data), t, heads, g.tiles, scale);
      };
      const bool in16 = q.dtype != DDP_FLOAT32;
      const bool out16 = out.dtype != DDP_FLOAT32;
      if (in16 && out16)
        run(T{}, T{});
      else if (in16)
        run(T{}, float{});
      else if (out16)
        run(float{}, T{});
      else
        run(float{}, float{});
    });
  });
}

void tiled_attention_backward(cudaStream_t stream, ddp_dtype dtype, float* dq, float* dk, LayerOutput dv, float* d,
                              const float* dout, const float* stats, GemmInput q, GemmInput k, GemmInput v, int64_t b,
                              int64_t t, int64_t heads, int64_t dh) {
  check_attention_inputs(dtype, q, k, v);
  check_attention_output(dtype, dv);
  if (b * t * heads == 0) return;
  const tiled::Grid g = tiled::grid_of(b, t, heads);
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  tiled::with_type(dtype, [&](auto element) {
    using T = decltype(element);
    tiled::with_dh(dh, [&](auto size) {
      constexpr int kDh = decltype(size)::value;
      const int bytes = tiled::Layout<kDh>::bytes(4);
      const auto run = [&](auto input) {
        using In = decltype(input);
        const auto* qi = static_cast<const In*>(q.data);
        const auto* ki = static_cast<const In*>(k.data);
        const auto* vi = static_cast<const In*>(v.data);
        tiled::launch(tiled::backward_dq_kernel<T, kDh, In>, "backward_dq_kernel", g, bytes, stream, dq, d, dout, stats,
                      qi, ki, vi, t, heads, g.tiles, scale);
        const auto dkdv = [&](auto* out) {
          using Out = std::remove_pointer_t<decltype(out)>;
          tiled::launch(tiled::backward_dkdv_kernel<T, kDh, In, Out>, "backward_dkdv_kernel", g, bytes, stream, dk, out,
                        static_cast<const float*>(d), dout, stats, qi, ki, vi, t, heads, g.tiles, scale);
        };
        if (dv.dtype == DDP_FLOAT32)
          dkdv(static_cast<float*>(dv.data));
        else
          dkdv(static_cast<T*>(dv.data));
      };
      if (q.dtype == DDP_FLOAT32)
        run(float{});
      else
        run(T{});
    });
  });
}

}  // namespace ddp::cuda
