// fused_attention.cu — fused_attention.h's kernels: one warp per row of
// one head, each lane holding the elements c * 32 + lane of a [dh] row.
// A weight p_ij is recomputed, never stored: score s = scale (q_i . k_j)
// (the products and the warp's sum in one fixed order, shared by every
// kernel through score(), so each recomputation is the forward's bit for
// bit), p = round(exp(s - m_i) / sum_i) with the row's max m_i and sum
// sum_i of the forward's two passes. The CPU's emulation computes the same
// quantities with BLAS's summation order (layers.cpp's attention).
#include "cuda/fused_attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <string>
#include <type_traits>

#include <ddp/numeric.h>

#include "cuda/cuda_check.h"
#include "cuda/sixteen.cuh"
#include "cuda/tiled_attention.h"
#include "error.h"
#include "kernels.h"

namespace ddp::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int64_t kMaxDh = kFusedAttentionMaxHead;

struct RoundBf16 {
  __device__ float operator()(float x) const { return wide(narrow<__nv_bfloat16>(x)); }
};
struct RoundHalf {
  __device__ float operator()(float x) const { return wide(narrow<__half>(x)); }
};
// The 16-bit type a rounding rounds to.
template <typename R>
using SixteenOf = std::conditional_t<std::is_same_v<R, RoundBf16>, __nv_bfloat16, __half>;

// The lane's elements of a [dh] row at x, rounded (0 beyond dh; a value
// already in the compute dtype rounds to itself).
template <int kPer, typename In, typename R>
__device__ void load(float (&out)[kPer], const In* x, int64_t dh, int lane, R round) {
  for (int c = 0; c < kPer; ++c) {
    const int64_t e = int64_t(c) * 32 + lane;
    out[c] = e < dh ? round(wide(x[e])) : 0.0f;
  }
}

// The lane's elements into a [dh] row at x: float32, or rounded to Out.
template <int kPer, typename Out>
__device__ void store(Out* x, const float (&in)[kPer], int64_t dh, int lane) {
  for (int c = 0; c < kPer; ++c) {
    const int64_t e = int64_t(c) * 32 + lane;
    if (e < dh) x[e] = narrow<Out>(in[c]);
  }
}

// a . b over the row: each lane its elements in order, then the warp's
// butterfly (every lane gets the same bits).
template <int kPer>
__device__ float dot(const float (&a)[kPer], const float (&b)[kPer]) {
  float s = 0.0f;
  for (int c = 0; c < kPer; ++c) s = __fmaf_rn(a[c], b[c], s);
  for (int o = 16; o > 0; o >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, o));
  return s;
}

template <int kPer>
__device__ float score(const float (&q)[kPer], const float (&k)[kPer], float scale) {
  return __fmul_rn(scale, dot(q, k));
}

// The weight, rounded as the product p v reads it.
template <typename R>
__device__ float weight(float s, float m, float sum, R round) {
  return round(__fdiv_rn(expf(__fsub_rn(s, m)), sum));
}

// Row r of the b * heads * t rows: ((bi * heads) + h) * t + i.
struct Row {
  int64_t i;     // its position in the sequence
  int64_t head;  // where its head's [t, dh] matrix starts in q, k, v (row stride heads * dh)
};
__device__ Row row_of(int64_t r, int64_t t, int64_t heads, int64_t dh) {
  const int64_t bh = r / t;
  return {r % t, (bh / heads) * t * heads * dh + (bh % heads) * dh};
}

// out_i = sum_j<=i p_ij v_j; stats_i = (max_j s_ij, sum_j exp(s_ij - max)).
template <int kPer, typename In, typename Out, typename R>
__global__ void forward_kernel(Out* out, float* stats, const In* q, const In* k, const In* v, int64_t rows, int64_t t,
                               int64_t heads, int64_t dh, float scale, R round) {
  const int64_t r = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;  // whole warps
  const int lane = threadIdx.x & 31;
  const int64_t d = heads * dh;
  const Row w = row_of(r, t, heads, dh);
  float qr[kPer];
  float kr[kPer];
  float vr[kPer];
  float o[kPer];
  load(qr, q + w.head + w.i * d, dh, lane, round);
  float m = -INFINITY;
  for (int64_t j = 0; j <= w.i; ++j) {
    load(kr, k + w.head + j * d, dh, lane, round);
    m = fmaxf(m, score(qr, kr, scale));
  }
  float sum = 0.0f;
  for (int64_t j = 0; j <= w.i; ++j) {
    load(kr, k + w.head + j * d, dh, lane, round);
    sum = __fadd_rn(sum, expf(__fsub_rn(score(qr, kr, scale), m)));
  }
  for (int c = 0; c < kPer; ++c) o[c] = 0.0f;
  for (int64_t j = 0; j <= w.i; ++j) {
    load(kr, k + w.head + j * d, dh, lane, round);
    load(vr, v + w.head + j * d, dh, lane, round);
    const float p = weight(score(qr, kr, scale), m, sum, round);
    for (int c = 0; c < kPer; ++c) o[c] = __fmaf_rn(p, vr[c], o[c]);
  }
  store(out + w.head + w.i * d, o, dh, lane);
  if (lane == 0) {
    stats[2 * r] = m;
    stats[2 * r + 1] = sum;
  }
}

// Per query row i: D_i = sum_j p_ij dp_ij (dp_ij = dout_i . v_j), then
// dq_i = sum_j round(ds_ij) k_j, ds_ij = p_ij (dp_ij - D_i) scale.
template <int kPer, typename In, typename R>
__global__ void backward_dq_kernel(float* dq, float* dsum, const float* dout, const float* stats, const In* q,
                                   const In* k, const In* v, int64_t rows, int64_t t, int64_t heads, int64_t dh,
                                   float scale, R round) {
  const int64_t r = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int lane = threadIdx.x & 31;
  const int64_t d = heads * dh;
  const Row w = row_of(r, t, heads, dh);
  float qr[kPer];
  float dor[kPer];
  float kr[kPer];
  float vr[kPer];
  float g[kPer];
  load(qr, q + w.head + w.i * d, dh, lane, round);
  load(dor, dout + w.head + w.i * d, dh, lane, round);
  const float m = stats[2 * r];
  const float sum = stats[2 * r + 1];
  float big_d = 0.0f;
  for (int64_t j = 0; j <= w.i; ++j) {
    load(kr, k + w.head + j * d, dh, lane, round);
    load(vr, v + w.head + j * d, dh, lane, round);
    big_d = __fmaf_rn(weight(score(qr, kr, scale), m, sum, round), dot(dor, vr), big_d);
  }
  for (int c = 0; c < kPer; ++c) g[c] = 0.0f;
  for (int64_t j = 0; j <= w.i; ++j) {
    load(kr, k + w.head + j * d, dh, lane, round);
    load(vr, v + w.head + j * d, dh, lane, round);
    const float p = weight(score(qr, kr, scale), m, sum, round);
    const float ds = round(__fmul_rn(__fmul_rn(p, __fsub_rn(dot(dor, vr), big_d)), scale));
    for (int c = 0; c < kPer; ++c) g[c] = __fmaf_rn(ds, kr[c], g[c]);
  }
  store(dq + w.head + w.i * d, g, dh, lane);
  if (lane == 0) dsum[r] = big_d;
}

// Per key row j: dv_j = sum_i>=j p_ij dout_i, dk_j = sum_i>=j round(ds_ij) q_i.
template <int kPer, typename In, typename Out, typename R>
__global__ void backward_dkdv_kernel(float* dk, Out* dv, const float* dsum, const float* dout, const float* stats,
                                     const In* q, const In* k, const In* v, int64_t rows, int64_t t, int64_t heads,
                                     int64_t dh, float scale, R round) {
  const int64_t r = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int lane = threadIdx.x & 31;
  const int64_t d = heads * dh;
  const Row w = row_of(r, t, heads, dh);  // w.i: the key's position j
  float kr[kPer];
  float vr[kPer];
  float qr[kPer];
  float dor[kPer];
  float gk[kPer];
  float gv[kPer];
  load(kr, k + w.head + w.i * d, dh, lane, round);
  load(vr, v + w.head + w.i * d, dh, lane, round);
  for (int c = 0; c < kPer; ++c) {
    gk[c] = 0.0f;
    gv[c] = 0.0f;
  }
  for (int64_t i = w.i; i < t; ++i) {
    const int64_t ri = r - w.i + i;  // query i's row, same sequence and head
    load(qr, q + w.head + i * d, dh, lane, round);
    load(dor, dout + w.head + i * d, dh, lane, round);
    const float p = weight(score(qr, kr, scale), stats[2 * ri], stats[2 * ri + 1], round);
    const float ds = round(__fmul_rn(__fmul_rn(p, __fsub_rn(dot(dor, vr), dsum[ri])), scale));
    for (int c = 0; c < kPer; ++c) {
      gv[c] = __fmaf_rn(p, dor[c], gv[c]);
      gk[c] = __fmaf_rn(ds, qr[c], gk[c]);
    }
  }
  store(dk + w.head + w.i * d, gk, dh, lane);
  store(dv + w.head + w.i * d, gv, dh, lane);
}

// f(round) for the dtype's rounding; f(per) for the elements a lane holds.
template <typename F>
void with_round(ddp_dtype dtype, F&& f) {
  if (dtype == DDP_BFLOAT16) return f(RoundBf16{});
  if (dtype == DDP_FLOAT16) return f(RoundHalf{});
  throw Error(std::string("fused attention: compute in ") + ddp_dtype_name(dtype) + " (bfloat16 or float16 only)",
              DDP_ERR_UNSUPPORTED);
}
template <typename F>
void with_per(int64_t dh, F&& f) {
  if (dh < 1 || dh > kMaxDh)
    throw Error("fused attention: head size " + std::to_string(dh) + " (1 to " + std::to_string(kMaxDh) + ")",
                DDP_ERR_UNSUPPORTED);
  if (dh <= 32) return f(std::integral_constant<int, 1>{});
  if (dh <= 64) return f(std::integral_constant<int, 2>{});
  if (dh <= 128) return f(std::integral_constant<int, 4>{});
  f(std::integral_constant<int, 8>{});
}

// f(round, element) for the compute dtype's rounding and the inputs'
// dtype: float32, or the compute dtype itself; q, k and v alike.
template <typename F>
void with_round_and_inputs(ddp_dtype dtype, const GemmInput& q, const GemmInput& k, const GemmInput& v, F&& f) {
  check_attention_inputs(dtype, q, k, v);
  const bool same = q.dtype == dtype;
  with_round(dtype, [&](auto round) {
    if (!same) return f(round, float{});
    f(round, SixteenOf<decltype(round)>{});
  });
}

unsigned grid_of(int64_t rows) {
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > INT32_MAX) throw Error("fused attention: " + std::to_string(rows) + " rows is more than a grid holds");
  return static_cast<unsigned>(blocks);
}

}  // namespace

void fused_attention_forward(cudaStream_t stream, ddp_dtype dtype, LayerOutput out, float* stats, GemmInput q,
                             GemmInput k, GemmInput v, int64_t b, int64_t t, int64_t heads, int64_t dh) {
  if (tiled_attention_fits(dh)) return tiled_attention_forward(stream, dtype, out, stats, q, k, v, b, t, heads, dh);
  check_attention_output(dtype, out);
  const int64_t rows = b * heads * t;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  with_round_and_inputs(dtype, q, k, v, [&](auto round, auto element) {
    if (rows == 0) return;
    using In = decltype(element);
    using Sixteen = SixteenOf<decltype(round)>;
    with_per(dh, [&](auto per) {
      const auto run = [&](auto* o) {  // out in float32 or the compute dtype
        forward_kernel<decltype(per)::value><<<grid_of(rows), kWarpsPerBlock * 32, 0, stream>>>(
            o, stats, static_cast<const In*>(q.data), static_cast<const In*>(k.data), static_cast<const In*>(v.data),
            rows, t, heads, dh, scale, round);
        check_launch("fused attention forward_kernel");
      };
      if (out.dtype == DDP_FLOAT32)
        run(static_cast<float*>(out.data));
      else
        run(static_cast<Sixteen*>(out.data));
    });
  });
}

void fused_attention_backward(cudaStream_t stream, ddp_dtype dtype, float* dq, float* dk, LayerOutput dv, float* d,
                              const float* dout, const float* stats, GemmInput q, GemmInput k, GemmInput v, int64_t b,
                              int64_t t, int64_t heads, int64_t dh) {
  if (tiled_attention_fits(dh))
    return tiled_attention_backward(stream, dtype, dq, dk, dv, d, dout, stats, q, k, v, b, t, heads, dh);
  check_attention_output(dtype, dv);
  const int64_t rows = b * heads * t;
  if (rows == 0) return;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  with_round_and_inputs(dtype, q, k, v, [&](auto round, auto element) {
    using In = decltype(element);
    const auto* qi = static_cast<const In*>(q.data);
    const auto* ki = static_cast<const In*>(k.data);
    const auto* vi = static_cast<const In*>(v.data);
    using Sixteen = SixteenOf<decltype(round)>;
    with_per(dh, [&](auto per) {
      constexpr int kPer = decltype(per)::value;
      backward_dq_kernel<kPer><<<grid_of(rows), kWarpsPerBlock * 32, 0, stream>>>(dq, d, dout, stats, qi, ki, vi, rows,
                                                                                  t, heads, dh, scale, round);
      check_launch("fused attention backward_dq_kernel");
      const auto dkdv = [&](auto* out) {  // dv in float32 or the compute dtype
        backward_dkdv_kernel<kPer><<<grid_of(rows), kWarpsPerBlock * 32, 0, stream>>>(
            dk, out, d, dout, stats, qi, ki, vi, rows, t, heads, dh, scale, round);
        check_launch("fused attention backward_dkdv_kernel");
      };
      if (dv.dtype == DDP_FLOAT32)
        dkdv(static_cast<float*>(dv.data));
      else
        dkdv(static_cast<Sixteen*>(dv.data));
    });
  });
}

}  // namespace ddp::cuda
