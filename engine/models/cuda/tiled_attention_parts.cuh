// tiled_attention_parts.cuh — tiled_attention.cu's building blocks: the
// tile and shared-memory layout, a tile's load in 16 bits, a warp's two
// products on wmma fragments (scores against a tile; weights times a
// tile), its accumulators' store, and the two-lanes-a-row passes that turn
// scores into weights and weights into ds. Included by tiled_attention.cu
// alone.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cstdint>
#include <type_traits>

#include "cuda/sixteen.cuh"

namespace ddp::cuda::tiled {

namespace wmma = nvcuda::wmma;

constexpr int kTile = 64;  // rows a block owns; rows of the other side a step
constexpr int kWarps = kTile / 16;
constexpr int kThreads = kWarps * 32;
constexpr int kLdS = kTile + 4;  // float scores [kTile][kLdS]: rows off the banks' period
constexpr int kLdP = kTile + 8;  // 16-bit weights [kTile][kLdP]

// bfloat16 fragments exist from compute capability 8.0: built for an older
// GPU, the kernels trap (tiled_attention_fits keeps them from running).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define DDP_TILED_ARCH 1
#else
#define DDP_TILED_ARCH 0
#endif

using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Shared memory: `tiles` 16-bit [kTile, kDh] tiles, the float scores, the
// 16-bit weights, 3 * kTile floats of per-row statistics. Every part
// starts 32 bytes aligned, as wmma's loads and stores require.
template <int kDh>
struct Layout {
  static constexpr int kLd = kDh + 8;  // a 16-bit tile's row stride
  static constexpr int kTileElems = kTile * kLd;
  static constexpr int bytes(int tiles) {
    return tiles * kTileElems * 2 + kTile * kLdS * 4 + kTile * kLdP * 2 + 3 * kTile * 4;
  }
};

#if DDP_TILED_ARCH  // the kernels' parts: none in an older GPU's build

constexpr unsigned kAll = 0xffffffffu;

template <typename T, typename In>
__device__ T to16(In x) {
  if constexpr (std::is_same_v<In, T>)
    return x;
  else
    return narrow<T>(x);
}

// The weight as the products read it: round(exp(s - m) / sum).
template <typename T>
__device__ float weight(float s, float m, float sum) {
  return wide(narrow<T>(__fdiv_rn(expf(__fsub_rn(s, m)), sum)));
}

// The block's head and tile. Blocks run heaviest tile first: rank r of
// every head, then r + 1 (`last_first`: the last tile has the most work).
struct Block {
  int64_t bh;    // sequence * heads + head
  int tile;      // the 64-row tile this block owns
  int64_t head;  // where the head's [t, dh] matrix starts (row stride heads * dh)
};
__device__ inline Block block_of(int64_t t, int64_t heads, int64_t dh, int tiles, bool last_first) {
  const int64_t bhs = gridDim.x / tiles;
  const int rank = static_cast<int>(blockIdx.x / bhs);
  const int64_t bh = blockIdx.x % bhs;
  return {bh, last_first ? tiles - 1 - rank : rank, (bh / heads) * t * heads * dh + (bh % heads) * dh};
}

// A block's shared memory as Layout places it: kTiles 16-bit tiles, then
// the scores, the weights and the statistics; sw and pw are the calling
// warp's 16 rows of the scores and of the weights.
template <typename T, int kTiles>
struct Shared {
  T* tile[kTiles];
  float* sw;    // [16][kLdS]
  T* pw;        // [16][kLdP]
  float* stat;  // [3 kTile]
};
template <typename T, int kDh, int kTiles>
__device__ Shared<T, kTiles> carve(unsigned char* smem) {
  Shared<T, kTiles> s{};
  T* tiles = reinterpret_cast<T*>(smem);
#pragma unroll
  for (int i = 0; i < kTiles; ++i) s.tile[i] = tiles + i * Layout<kDh>::kTileElems;
  float* scores = reinterpret_cast<float*>(tiles + kTiles * Layout<kDh>::kTileElems);
  T* weights = reinterpret_cast<T*>(scores + kTile * kLdS);
  const int warp = threadIdx.x >> 5;
  s.sw = scores + warp * 16 * kLdS;
  s.pw = weights + warp * 16 * kLdP;
  s.stat = reinterpret_cast<float*>(weights + kTile * kLdP);
  return s;
}

// Rows [row0, row0 + kTile) of a head's [t, kDh] matrix (row stride d) into
// a 16-bit tile, rounded; rows at or past t are 0. The whole block. Where
// the rows start 16 bytes aligned, 16 bytes a load (4 floats or 8 16-bit
// values) and one store to the tile; else an element at a time.
template <typename T, int kDh, typename In>
__device__ void load_tile(T* tile, const In* head, int64_t row0, int64_t t, int64_t d) {
  constexpr int kVec = 16 / sizeof(In);
  static_assert(kDh % kVec == 0, "a row is whole 16-byte loads");
  if (reinterpret_cast<uintptr_t>(head) % 16 == 0 && d % kVec == 0) {
    for (int e = threadIdx.x; e < kTile * kDh / kVec; e += kThreads) {
      const int r = e / (kDh / kVec);
      const int c = e % (kDh / kVec) * kVec;
      const int64_t row = row0 + r;
      uint4 raw = make_uint4(0, 0, 0, 0);  // (+0 in every dtype)
      if (row < t) raw = *reinterpret_cast<const uint4*>(head + row * d + c);
      In x[kVec];
      memcpy(x, &raw, sizeof raw);
      T y[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) y[i] = to16<T>(x[i]);
      if constexpr (sizeof y == 16) {
        uint4 out;
        memcpy(&out, y, sizeof out);
        *reinterpret_cast<uint4*>(tile + r * Layout<kDh>::kLd + c) = out;
      } else {
        uint2 out;
        memcpy(&out, y, sizeof out);
        *reinterpret_cast<uint2*>(tile + r * Layout<kDh>::kLd + c) = out;
      }
    }
    return;
  }
  for (int e = threadIdx.x; e < kTile * kDh; e += kThreads) {
    const int r = e / kDh;
    const int c = e % kDh;
    const int64_t row = row0 + r;
    tile[r * Layout<kDh>::kLd + c] = row < t ? to16<T>(head[row * d + c]) : narrow<T>(0.0f);
  }
}

// s[16, kTile] = a[16, kDh] b[kTile, kDh]^T: a warp's 16 rows against a tile.
template <typename T, int kDh>
__device__ void products(float* s, const T* a, const T* b) {
  constexpr int ld = Layout<kDh>::kLd;
#pragma unroll
  for (int n = 0; n < kTile; n += 16) {
    Acc acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int k = 0; k < kDh; k += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
      wmma::load_matrix_sync(fa, a + k, ld);
      wmma::load_matrix_sync(fb, b + n * ld + k, ld);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(s + n, acc, kLdS, wmma::mem_row_major);
  }
  __syncwarp();
}

// acc[16, kDh] += a[16, kTile] b[kTile, kDh]: a warp's weights (or ds)
// times a tile.
template <typename T, int kDh>
__device__ void accumulate(Acc (&acc)[kDh / 16], const T* a, const T* b) {
  constexpr int ld = Layout<kDh>::kLd;
#pragma unroll
  for (int k = 0; k < kTile; k += 16) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, a + k, kLdP);
#pragma unroll
    for (int n = 0; n < kDh / 16; ++n) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
      wmma::load_matrix_sync(fb, b + k * ld + n * 16, ld);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
  __syncwarp();
}

template <int kDh>
__device__ void zero(Acc (&acc)[kDh / 16]) {
#pragma unroll
  for (int n = 0; n < kDh / 16; ++n) wmma::fill_fragment(acc[n], 0.0f);
}

// A warp's 16 rows of accumulators to rows row0 + 16 warp + r (< t) of a
// head's matrix (float32, or rounded to a 16-bit Out), through its part of
// `stage` (the block synchronised first: stage overlaps tiles other warps
// read).
template <int kDh, typename Out>
__device__ void store_rows(Out* head, int64_t row0, int64_t t, int64_t d, Acc (&acc)[kDh / 16], float* stage) {
  constexpr int ld = kDh + 4;
  const int warp = threadIdx.x >> 5;
  float* mine = stage + warp * 16 * ld;
#pragma unroll
  for (int n = 0; n < kDh / 16; ++n) wmma::store_matrix_sync(mine + n * 16, acc[n], ld, wmma::mem_row_major);
  __syncwarp();
  for (int e = threadIdx.x & 31; e < 16 * kDh; e += 32) {
    const int r = e / kDh;
    const int64_t row = row0 + warp * 16 + r;
    if (row < t) head[row * d + e % kDh] = narrow<Out>(mine[r * ld + e % kDh]);
  }
}

// Two lanes a row of a warp's 16: row lane / 2, columns 2c' + lane % 2,
// c' = c for rows 0 to 7 and c + 1 (mod 32) for rows 8 to 15, whose rows
// would otherwise fall in the same shared-memory banks as 0 to 7.
__device__ inline int lane_row() { return (threadIdx.x & 31) >> 1; }
__device__ inline int lane_col(int c) { return 2 * ((c + (lane_row() >> 3)) & (kTile / 2 - 1)) + (threadIdx.x & 1); }
__device__ inline float pair_sum(float x) { return __fadd_rn(x, __shfl_xor_sync(kAll, x, 1)); }

// The warp's weights of a step into pw: row `row` is query i, column c key
// j0 + c (dq); or row is key j, column c query i0 + c with its statistics
// in `stat` (dk, dv). 0 where j > i or either is past t.
template <typename T>
__device__ void weights_by_query(T* pw, const float* sw, int64_t i, int64_t j0, int64_t t, float m, float sum,
                                 float scale) {
  const int row = lane_row();
  for (int c = 0; c < kTile / 2; ++c) {
    const int64_t j = j0 + lane_col(c);
    const float s = __fmul_rn(scale, sw[row * kLdS + lane_col(c)]);
    pw[row * kLdP + lane_col(c)] = narrow<T>(j <= i && j < t ? weight<T>(s, m, sum) : 0.0f);
  }
  __syncwarp();
}
template <typename T>
__device__ void weights_by_key(T* pw, const float* sw, int64_t j, int64_t i0, int64_t t, const float* stat,
                               float scale) {
  const int row = lane_row();
  for (int c = 0; c < kTile / 2; ++c) {
    const int64_t i = i0 + lane_col(c);
    const float s = __fmul_rn(scale, sw[row * kLdS + lane_col(c)]);
    const float p = j <= i && i < t && j < t ? weight<T>(s, stat[lane_col(c)], stat[kTile + lane_col(c)]) : 0.0f;
    pw[row * kLdP + lane_col(c)] = narrow<T>(p);
  }
  __syncwarp();
}

// ds = round(p (dp - D) scale) over the weights in pw, in place; dp in sw;
// D of the row (`big_d`, dq) or of each column (`stat` + 2 kTile, dk).
template <typename T>
__device__ void ds_in_place(T* pw, const float* sw, const float* big_d, float row_d, float scale) {
  const int row = lane_row();
  for (int c = 0; c < kTile / 2; ++c) {
    const float p = wide(pw[row * kLdP + lane_col(c)]);
    const float dd = big_d ? big_d[lane_col(c)] : row_d;
    pw[row * kLdP + lane_col(c)] =
        narrow<T>(__fmul_rn(__fmul_rn(p, __fsub_rn(sw[row * kLdS + lane_col(c)], dd)), scale));
  }
  __syncwarp();
}

#endif  // DDP_TILED_ARCH

}  // namespace ddp::cuda::tiled
