// column_sums.cpp — the layers whose results are column sums (bias and
// RMSNorm gain gradients), in the fixed order layers.h defines. Built with
// -ffp-contract=off (engine/models/CMakeLists.txt): a product and a sum stay two
// roundings whether or not the CPU has FMA, as the CUDA kernels compute
// them, so both give the same bits. Apart from this file the layers may
// contract (the exp polynomial is faster with FMA).
#include <algorithm>

#include "layers.h"
#include "simd_clones.h"

namespace ddp {
namespace layers {

// Column sums (layers.h) over a chunk of kColumnChunk columns at a time, so
// one tile's running sums stay on the stack (no allocation).
constexpr int64_t kColumnChunk = 256;

DDP_SIMD_CLONES
void bias_backward(float* __restrict db, const float* dy, int64_t n, int64_t out) {
  float tile[kColumnChunk];
  for (int64_t j0 = 0; j0 < out; j0 += kColumnChunk) {
    const int64_t w = std::min(kColumnChunk, out - j0);
    for (int64_t r0 = 0; r0 < n; r0 += kColumnSumRows) {
      const int64_t r1 = std::min(n, r0 + kColumnSumRows);
      const float* __restrict first = dy + r0 * out + j0;
#pragma omp simd
      for (int64_t j = 0; j < w; ++j) tile[j] = first[j];
      for (int64_t i = r0 + 1; i < r1; ++i) {
        const float* __restrict dyi = dy + i * out + j0;
#pragma omp simd
        for (int64_t j = 0; j < w; ++j) tile[j] += dyi[j];
      }
#pragma omp simd
      for (int64_t j = 0; j < w; ++j) db[j0 + j] += tile[j];
    }
  }
}

// dg[d] += column sums of dy_ij x_ij (1 / rms_i), as bias_backward sums.
DDP_SIMD_CLONES
void rmsnorm_gain_backward(float* __restrict dg, const float* dy, const float* x, const float* rms, int64_t n,
                           int64_t d) {
  float tile[kColumnChunk];
  for (int64_t j0 = 0; j0 < d; j0 += kColumnChunk) {
    const int64_t w = std::min(kColumnChunk, d - j0);
    for (int64_t r0 = 0; r0 < n; r0 += kColumnSumRows) {
      const int64_t r1 = std::min(n, r0 + kColumnSumRows);
      const float inv0 = 1.0f / rms[r0];
      const float* __restrict dy0 = dy + r0 * d + j0;
      const float* __restrict x0 = x + r0 * d + j0;
#pragma omp simd
      for (int64_t j = 0; j < w; ++j) tile[j] = dy0[j] * x0[j] * inv0;
      for (int64_t i = r0 + 1; i < r1; ++i) {
        const float inv = 1.0f / rms[i];
        const float* __restrict dyi = dy + i * d + j0;
        const float* __restrict xi = x + i * d + j0;
#pragma omp simd
        for (int64_t j = 0; j < w; ++j) tile[j] += dyi[j] * xi[j] * inv;
      }
#pragma omp simd
      for (int64_t j = 0; j < w; ++j) dg[j0 + j] += tile[j];
    }
  }
}

}  // namespace layers
}  // namespace ddp
