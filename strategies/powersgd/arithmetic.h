// arithmetic.h — the PowerSGD arithmetic of one group of matrices (layout.h:
// one shape and rank, back to back in the strategy's buffers), enqueued on
// a stream through ABI 1.9's compute entries (ddp::plugin::Host's gemm, dot,
// axpy, normalize), so the plugin links no BLAS and no CUDA. Each function
// is one step of PyTorch's powerSGD_hook for every matrix of the group, in
// as few calls as the group's layout allows. Nothing here waits, allocates
// or communicates: powersgd.cpp orders the streams and the all-reduces.
#pragma once

#include <cstddef>
#include <cstdint>

#include <ddp/plugin.hpp>

#include "layout.h"

namespace ddp {
namespace powersgd {

// The gradient of matrix k of `g` (its table entry's grad), as floats.
inline float* gradient(const plugin::Host& h, const Layout& l, const Group& g, size_t k) {
  return static_cast<float*>(h.param(l.matrices[g.first + k].param).grad);
}

// Elements from one gradient of `g` to the next where they lie evenly,
// ascending and apart (the engine packs gradients in reverse table order,
// the group's order: a model's repeated layers give one stride); 0 where
// they do not, and the group is served one matrix at a time.
inline size_t gradient_stride(const plugin::Host& h, const Layout& l, const Group& g) {
  const size_t size = g.rows * g.cols;
  if (g.count == 1) return size;
  const auto at = [&](size_t k) { return reinterpret_cast<uintptr_t>(gradient(h, l, g, k)); };
  if (at(1) <= at(0) || (at(1) - at(0)) % sizeof(float) != 0) return 0;
  const uintptr_t step = at(1) - at(0);
  for (size_t k = 2; k < g.count; ++k)
    if (at(k) != at(0) + k * step) return 0;
  return step / sizeof(float) >= size ? step / sizeof(float) : 0;
}

// error ← error + alpha · gradient for every matrix of `g`: alpha 1 makes
// M = grad + error (error feedback, in the error buffer; 1/S and −1/S
// under a loss scale S, powersgd.cpp), alpha −1 leaves
// M − grad there once grad holds the decompressed average (what PyTorch
// keeps). axpy rounds y + alpha·x once, as a float add or subtract does.
inline void add_gradients(const plugin::Host& h, const Layout& l, const Group& g, float* error, double alpha,
                          ddp_stream s) {
  const size_t size = g.rows * g.cols;
  float* mine = error + g.error_offset;  // [count, rows, cols]
  if (const size_t stride = gradient_stride(h, l, g)) {
    h.axpy(alpha, ddp_vectors{gradient(h, l, g, 0), size, 1, g.count, stride}, nullptr,
           ddp_vectors{mine, size, 1, g.count, size}, s);
    return;
  }
  for (size_t k = 0; k < g.count; ++k)
    h.axpy(alpha, ddp_vectors{gradient(h, l, g, k), size, 1, 1, size}, nullptr,
           ddp_vectors{mine + k * size, size, 1, 1, size}, s);
}

// PyTorch's _orthogonalize (Gram-Schmidt) on the columns of each of
// `count` matrices [rows, rank] back to back at x: for each column i,
//   col_i /= ||col_i|| + eps;   col_j -= (col_i · col_j) col_i for j > i.
// `scratch` holds the projections (dot's out, axpy's scalars: at least
// max(count, rank − 1) floats). Per column, the cheaper of two batchings:
// one call per later column across the matrices, or one per matrix
// across its later columns.
inline void orthogonalize(const plugin::Host& h, float* x, size_t rows, size_t rank, size_t count, double eps,
                          float* scratch, ddp_stream s) {
  const size_t size = rows * rank;
  for (size_t i = 0; i < rank; ++i) {
    const ddp_vectors col{x + i, rows, rank, count, size};  // column i of each matrix
    h.normalize(col, eps, s);
    const size_t later = rank - 1 - i;
    if (later == 0) continue;
    if (count <= later) {
      for (size_t k = 0; k < count; ++k) {
        float* m = x + k * size;
        const ddp_vectors ci{m + i, rows, rank, later, 0};        // column i, once per later column
        const ddp_vectors rest{m + i + 1, rows, rank, later, 1};  // columns i+1 .. rank-1
        h.dot(ci, rest, scratch, s);
        h.axpy(-1.0, ci, scratch, rest, s);
      }
      continue;
    }
    for (size_t j = i + 1; j < rank; ++j) {
      const ddp_vectors cj{x + j, rows, rank, count, size};
      h.dot(col, cj, scratch, s);
      h.axpy(-1.0, col, scratch, cj, s);
    }
  }
}

// C_b = op(A_b) op(B_b) for b < batch, beta 0 (ddp_gemm).
struct Product {
  bool trans_a = false;
  bool trans_b = false;
  size_t m = 0;
  size_t n = 0;
  size_t k = 0;
  const float* a = nullptr;
  size_t lda = 0;
  size_t stride_a = 0;
  const float* b = nullptr;
  size_t ldb = 0;
  size_t stride_b = 0;
  float* c = nullptr;
  size_t ldc = 0;
  size_t stride_c = 0;
  size_t batch = 1;
  double alpha = 1.0;
};
inline void multiply(const plugin::Host& h, const Product& p, ddp_stream s) {
  ddp_gemm g = plugin::Host::gemm_desc();
  g.trans_a = p.trans_a ? 1 : 0;
  g.trans_b = p.trans_b ? 1 : 0;
  g.m = p.m;
  g.n = p.n;
  g.k = p.k;
  g.alpha = p.alpha;
  g.beta = 0.0;
  g.a = p.a;
  g.lda = p.lda;
  g.stride_a = p.stride_a;
  g.b = p.b;
  g.ldb = p.ldb;
  g.stride_b = p.stride_b;
  g.c = p.c;
  g.ldc = p.ldc;
  g.stride_c = p.stride_c;
  g.batch = p.batch;
  h.gemm(g, s);
}

// P = M Q for each matrix of `g`: M [rows, cols] (the error buffer),
// Q [cols, rank], P [rows, rank].
inline void p_from_q(const plugin::Host& h, const Group& g, const float* m, const float* q, float* p, ddp_stream s) {
  multiply(h,
           {false, false, g.rows, g.rank, g.cols, m + g.error_offset, g.cols, g.rows * g.cols, q + g.q_offset, g.rank,
            g.cols * g.rank, p + g.p_offset, g.rank, g.rows * g.rank, g.count},
           s);
}

// Q = Mᵀ P for each matrix of `g`.
inline void q_from_p(const plugin::Host& h, const Group& g, const float* m, const float* p, float* q, ddp_stream s) {
  multiply(h,
           {true, false, g.cols, g.rank, g.rows, m + g.error_offset, g.cols, g.rows * g.cols, p + g.p_offset, g.rank,
            g.rows * g.rank, q + g.q_offset, g.rank, g.cols * g.rank, g.count},
           s);
}

// grad = alpha P Qᵀ for each matrix of `g`, written over its gradient
// (alpha: the loss scale, 1 unscaled): one batched product where the
// gradients lie evenly, else one per matrix.
inline void decompress(const plugin::Host& h, const Layout& l, const Group& g, const float* p, const float* q,
                       double alpha, ddp_stream s) {
  Product pr{false,           true,
             g.rows,          g.cols,
             g.rank,          p + g.p_offset,
             g.rank,          g.rows * g.rank,
             q + g.q_offset,  g.rank,
             g.cols * g.rank, gradient(h, l, g, 0),
             g.cols,          0,
             g.count,         alpha};
  if (const size_t stride = gradient_stride(h, l, g)) {
    pr.stride_c = stride;
    multiply(h, pr, s);
    return;
  }
  pr.batch = 1;
  for (size_t k = 0; k < g.count; ++k) {
    pr.a = p + g.p_offset + k * g.rows * g.rank;
    pr.b = q + g.q_offset + k * g.cols * g.rank;
    pr.c = gradient(h, l, g, k);
    multiply(h, pr, s);
  }
}

}  // namespace powersgd
}  // namespace ddp
