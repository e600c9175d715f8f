// layers.cpp — forward and backward of the model building blocks (see
// layers.h for shapes and conventions). GEMMs are cblas_sgemm with the batch
// and time dimensions folded into M; the rest are flat loops marked
// `omp simd` (compiled with -fopenmp-simd: vectorisation only, no threads),
// exp included, through a polynomial exp the compiler can vectorise.
#include "layers.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "simd_clones.h"

namespace ddp {
namespace layers {

namespace {

blasint bi(int64_t v) { return static_cast<blasint>(v); }

// op(A) op(B) through gemm.h, with cblas's transposes.
void sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint m, blasint n, blasint k, float alpha, GemmInput a,
           blasint lda, GemmInput b, blasint ldb, float beta, float* c, blasint ldc, ddp_dtype inputs) {
  gemm(ta == CblasTrans, tb == CblasTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, inputs);
}

// exp(x) for float32, branch-free so loops over it vectorise: Cephes' expf
// (x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial in r, times 2^n),
// relative error about 1e-7 (within 2 ulp of expf) on [-87.3, 88.3]. Outside
// it the power of two is clamped to stay a normal float: exp of a very
// negative x is ~1e-38 instead of 0, of a very large one ~2e38 instead of inf
// (valid for |x| < 1e6; softmax and sigmoid inputs here are far inside). The
// clamp is on the integer n: a float clamp of x is turned into branches by
// GCC's jump threading, which then stops the vectoriser.
inline float exp_approx(float x) {
  // Round x / ln2 to the nearest integer: adding and subtracting 1.5 * 2^23
  // leaves no fraction bits (|x / ln2| < 2^22).
  float n = x * 1.44269504088896341f + 12582912.0f;
  n -= 12582912.0f;
  float r = x - n * 0.693359375f;  // ln2 in two parts for an exact reduction
  r = r + n * 2.12194440e-4f;
  float r2 = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r2 + r + 1.0f;
  const int32_t e = std::min(std::max(static_cast<int32_t>(n), -126), 127);
  return p * __builtin_bit_cast(float, (e + 127) << 23);  // p * 2^e
}

inline float sigmoid(float z) { return 1.0f / (1.0f + exp_approx(-z)); }

}  // namespace

// ---- linear ---------------------------------------------------------------

void linear_forward(float* y, GemmInput x, const float* w, int64_t n, int64_t in, int64_t out, bool accumulate,
                    ddp_dtype inputs) {
  sgemm(CblasNoTrans, CblasTrans, bi(n), bi(out), bi(in), 1.0f, x, bi(in), w, bi(in), accumulate ? 1.0f : 0.0f, y,
        bi(out), inputs);
}

void linear_backward_input(float* dx, GemmInput dy, const float* w, int64_t n, int64_t in, int64_t out, bool accumulate,
                           float alpha, ddp_dtype inputs) {
  sgemm(CblasNoTrans, CblasNoTrans, bi(n), bi(in), bi(out), alpha, dy, bi(out), w, bi(in), accumulate ? 1.0f : 0.0f, dx,
        bi(in), inputs);
}

void linear_backward_weight(float* dw, GemmInput dy, GemmInput x, int64_t n, int64_t in, int64_t out, float alpha,
                            ddp_dtype inputs) {
  sgemm(CblasTrans, CblasNoTrans, bi(out), bi(in), bi(n), alpha, dy, bi(out), x, bi(in), 1.0f, dw, bi(in), inputs);
}

DDP_SIMD_CLONES
void bias_forward(float* y, const float* __restrict b, int64_t n, int64_t out) {
  for (int64_t i = 0; i < n; ++i) {
    float* __restrict yi = y + i * out;
#pragma omp simd
    for (int64_t j = 0; j < out; ++j) yi[j] += b[j];
  }
}

// ---- embedding ------------------------------------------------------------

void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t n, int64_t d) {
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(out + i * d, table + static_cast<int64_t>(tokens[i]) * d, sizeof(float) * d);
}

DDP_SIMD_CLONES
void embedding_backward(float* dtable, const float* dout, const int32_t* tokens, int64_t n, int64_t d) {
  for (int64_t i = 0; i < n; ++i) {
    float* __restrict row = dtable + static_cast<int64_t>(tokens[i]) * d;
    const float* __restrict g = dout + i * d;
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) row[j] += g[j];
  }
}

// ---- RMSNorm --------------------------------------------------------------

DDP_SIMD_CLONES
void rmsnorm_forward(float* y, float* rms, const float* x, const float* __restrict g, int64_t n, int64_t d) {
  for (int64_t i = 0; i < n; ++i) {
    const float* __restrict xi = x + i * d;
    float* __restrict yi = y + i * d;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < d; ++j) ss += xi[j] * xi[j];
    const float r = std::sqrt(ss / static_cast<float>(d) + kRmsNormEps);
    rms[i] = r;
    // (x / rms) * g, in PyTorch's order of operations.
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) yi[j] = xi[j] / r * g[j];
  }
}

DDP_SIMD_CLONES
void rmsnorm_backward(float* dx, float* __restrict dg, const float* dy, const float* x, const float* __restrict g,
                      const float* rms, int64_t n, int64_t d, bool accumulate) {
  // y_j = g_j x_j / r, r = sqrt(mean(x^2) + eps):
  // dx_j = g_j dy_j / r - x_j sum_i(g_i dy_i x_i) / (d r^3);  dg_j += dy_j x_j / r.
  for (int64_t i = 0; i < n; ++i) {
    const float* __restrict xi = x + i * d;
    const float* __restrict dyi = dy + i * d;
    float* __restrict dxi = dx + i * d;
    const float inv = 1.0f / rms[i];
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j < d; ++j) dot += g[j] * dyi[j] * xi[j];
    const float c = dot * inv * inv * inv / static_cast<float>(d);
    if (accumulate) {
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) dxi[j] += g[j] * dyi[j] * inv - xi[j] * c;
    } else {
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) dxi[j] = g[j] * dyi[j] * inv - xi[j] * c;
    }
  }
  if (dg) rmsnorm_gain_backward(dg, dy, x, rms, n, d);
}

// ---- RoPE -----------------------------------------------------------------

void rope_tables(float* cos, float* sin, int64_t t, int64_t dh, double theta) {
  const int64_t half = dh / 2;
  for (int64_t pos = 0; pos < t; ++pos) {
    for (int64_t k = 0; k < half; ++k) {
      const double angle =
          static_cast<double>(pos) / std::pow(theta, 2.0 * static_cast<double>(k) / static_cast<double>(dh));
      cos[pos * half + k] = static_cast<float>(std::cos(angle));
      sin[pos * half + k] = static_cast<float>(std::sin(angle));
    }
  }
}

namespace {
// Rotates each pair (x0, x1) by +angle (sign = 1) or -angle (sign = -1).
DDP_SIMD_CLONES
void rope_rotate(float* x, const float* cos, const float* sin, int64_t b, int64_t t, int64_t heads, int64_t dh,
                 float sign) {
  const int64_t half = dh / 2;
  for (int64_t bt = 0; bt < b * t; ++bt) {
    const int64_t pos = bt % t;
    const float* __restrict c = cos + pos * half;
    const float* __restrict s = sin + pos * half;
    for (int64_t h = 0; h < heads; ++h) {
      float* __restrict xh = x + (bt * heads + h) * dh;
#pragma omp simd
      for (int64_t k = 0; k < half; ++k) {
        const float x0 = xh[2 * k];
        const float x1 = xh[2 * k + 1];
        const float sk = sign * s[k];
        xh[2 * k] = c[k] * x0 - sk * x1;
        xh[2 * k + 1] = sk * x0 + c[k] * x1;
      }
    }
  }
}
}  // namespace

void rope_forward(float* x, const float* cos, const float* sin, int64_t b, int64_t t, int64_t heads, int64_t dh) {
  rope_rotate(x, cos, sin, b, t, heads, dh, 1.0f);
}

void rope_backward(float* dx, const float* cos, const float* sin, int64_t b, int64_t t, int64_t heads, int64_t dh) {
  rope_rotate(dx, cos, sin, b, t, heads, dh, -1.0f);
}

// ---- attention ------------------------------------------------------------

// Causal attention skips the masked half: queries go in blocks of
// kQueryBlock rows, and a block [r0, r1) only meets keys [0, r1) — about
// 5/8 of the full score matrix at t = 128, as FlashAttention's causal
// tiling does. Entries of p beyond the diagonal are still written as 0.
constexpr int64_t kQueryBlock = 32;

DDP_SIMD_CLONES
void attention_forward(float* out, float* p, const float* q, const float* k, const float* v, int64_t b, int64_t t,
                       int64_t heads, int64_t dh, ddp_dtype inputs) {
  const int64_t d = heads * dh;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  for (int64_t bi_ = 0; bi_ < b; ++bi_) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t off = bi_ * t * d + h * dh;   // head h of sequence bi_, row stride d
      float* ph = p + (bi_ * heads + h) * t * t;  // [t, t]
      for (int64_t r0 = 0; r0 < t; r0 += kQueryBlock) {
        const int64_t r1 = std::min(r0 + kQueryBlock, t);
        const int64_t rows = r1 - r0;
        // scores[r0:r1, 0:r1] = q_h[r0:r1] · k_h[0:r1]^T / sqrt(dh)
        sgemm(CblasNoTrans, CblasTrans, bi(rows), bi(r1), bi(dh), scale, q + off + r0 * d, bi(d), k + off, bi(d), 0.0f,
              ph + r0 * t, bi(t), inputs);
        for (int64_t i = r0; i < r1; ++i) {
          float* __restrict row = ph + i * t;
          float m = row[0];
#pragma omp simd reduction(max : m)
          for (int64_t j = 0; j <= i; ++j) m = row[j] > m ? row[j] : m;
          float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
          for (int64_t j = 0; j <= i; ++j) {
            const float e = exp_approx(row[j] - m);
            row[j] = e;
            sum += e;
          }
#pragma omp simd
          for (int64_t j = 0; j <= i; ++j) row[j] /= sum;
          std::fill(row + i + 1, row + t, 0.0f);  // the causal mask
        }
        // out_h[r0:r1] = p[r0:r1, 0:r1] · v_h[0:r1]
        sgemm(CblasNoTrans, CblasNoTrans, bi(rows), bi(dh), bi(r1), 1.0f, ph + r0 * t, bi(t), v + off, bi(d), 0.0f,
              out + off + r0 * d, bi(d), inputs);
      }
    }
  }
}

DDP_SIMD_CLONES
void attention_backward(float* dq, float* dk, float* dv, float* scratch, const float* dout, const float* p,
                        const float* q, const float* k, const float* v, int64_t b, int64_t t, int64_t heads, int64_t dh,
                        ddp_dtype inputs) {
  const int64_t d = heads * dh;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  const int64_t last = (t - 1) / kQueryBlock * kQueryBlock;  // r0 of the last query block
  for (int64_t bi_ = 0; bi_ < b; ++bi_) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t off = bi_ * t * d + h * dh;
      const float* ph = p + (bi_ * heads + h) * t * t;  // [t, t]
      // Last block first: it meets every key, so it writes dk_h and dv_h
      // whole (beta 0) and the earlier blocks add into their prefixes.
      for (int64_t r0 = last; r0 >= 0; r0 -= kQueryBlock) {
        const int64_t r1 = std::min(r0 + kQueryBlock, t);
        const int64_t rows = r1 - r0;
        const float beta = r0 == last ? 0.0f : 1.0f;
        const float* pb = ph + r0 * t;  // p[r0:r1, 0:r1], row stride t
        float* sb = scratch + r0 * t;   // dp, then ds, same place
        // dp[r0:r1, 0:r1] = dout_h[r0:r1] · v_h[0:r1]^T
        sgemm(CblasNoTrans, CblasTrans, bi(rows), bi(r1), bi(dh), 1.0f, dout + off + r0 * d, bi(d), v + off, bi(d),
              0.0f, sb, bi(t), inputs);
        // dv_h[0:r1] += p[r0:r1, 0:r1]^T · dout_h[r0:r1]
        sgemm(CblasTrans, CblasNoTrans, bi(r1), bi(dh), bi(rows), 1.0f, pb, bi(t), dout + off + r0 * d, bi(d), beta,
              dv + off, bi(d), inputs);
        // Softmax backward, scaled: ds_ij = p_ij (dp_ij - sum_k p_ik dp_ik) / sqrt(dh);
        // masked entries have p = 0 and stay 0.
        for (int64_t i = r0; i < r1; ++i) {
          const float* __restrict pr = ph + i * t;
          float* __restrict dr = scratch + i * t;
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int64_t j = 0; j <= i; ++j) dot += pr[j] * dr[j];
#pragma omp simd
          for (int64_t j = 0; j <= i; ++j) dr[j] = pr[j] * (dr[j] - dot) * scale;
          std::fill(dr + i + 1, dr + r1, 0.0f);
        }
        // dq_h[r0:r1] = ds[r0:r1, 0:r1] · k_h[0:r1];  dk_h[0:r1] += ds^T · q_h[r0:r1]
        sgemm(CblasNoTrans, CblasNoTrans, bi(rows), bi(dh), bi(r1), 1.0f, sb, bi(t), k + off, bi(d), 0.0f,
              dq + off + r0 * d, bi(d), inputs);
        sgemm(CblasTrans, CblasNoTrans, bi(r1), bi(dh), bi(rows), 1.0f, sb, bi(t), q + off + r0 * d, bi(d), beta,
              dk + off, bi(d), inputs);
      }
    }
  }
}

// ---- elementwise ----------------------------------------------------------

DDP_SIMD_CLONES
void swiglu_forward(float* __restrict out, const float* __restrict a, const float* __restrict b, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] * sigmoid(a[i]) * b[i];
}

DDP_SIMD_CLONES
void swiglu_backward(float* __restrict da, float* __restrict db, const float* __restrict dout,
                     const float* __restrict a, const float* __restrict b, int64_t n) {
  // d silu(z)/dz = s (1 + z (1 - s)), s = sigmoid(z)
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float z = a[i];
    const float s = sigmoid(z);
    db[i] = dout[i] * z * s;
    da[i] = dout[i] * b[i] * s * (1.0f + z * (1.0f - s));
  }
}

DDP_SIMD_CLONES
void relu_forward(float* y, const float* x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

DDP_SIMD_CLONES
void relu_backward(float* dx, const float* dy, const float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float g = dy[i];  // loaded unconditionally so the select vectorises
    dx[i] = y[i] > 0.0f ? g : 0.0f;
  }
}

// ---- cross-entropy ----------------------------------------------------------

DDP_SIMD_CLONES
double cross_entropy_forward(float* lse, float* logits, const int32_t* targets, int64_t n, int64_t v) {
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    float* __restrict row = logits + i * v;
    float m = row[0];
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < v; ++j) m = row[j] > m ? row[j] : m;
    const float target_logit = row[targets[i]];
    // One exp an element: exp(x - m) kept in place, then scaled by 1 / sum
    // while the row (v floats) is still in L1/L2.
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < v; ++j) {
      const float e = exp_approx(row[j] - m);
      row[j] = e;
      sum += e;
    }
    lse[i] = m + std::log(sum);
    total += static_cast<double>(lse[i]) - static_cast<double>(target_logit);
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t j = 0; j < v; ++j) row[j] *= inv;
    row[targets[i]] -= 1.0f;
  }
  return total / static_cast<double>(n);
}

DDP_SIMD_CLONES
void cross_entropy_backward(float* dlogits, int64_t n, int64_t v, float scale) {
  const float c = scale / static_cast<float>(n);
#pragma omp simd
  for (int64_t k = 0; k < n * v; ++k) dlogits[k] *= c;
}

// ---- mean squared error (toy models): plain loops, as the models had them ----

double mse_forward(const float* pred, const float* y, int64_t n) {
  double sum = 0.0;
  for (int64_t k = 0; k < n; ++k) {
    const double d = static_cast<double>(pred[k]) - y[k];
    sum += d * d;
  }
  return sum / static_cast<double>(n);
}

void mse_backward(float* d, const float* pred, const float* y, int64_t n, float scale) {
  const float c = 2.0f * scale / static_cast<float>(n);
  for (int64_t k = 0; k < n; ++k) d[k] = c * (pred[k] - y[k]);
}

// ---- initialisation ---------------------------------------------------------

void init_uniform(float* w, int64_t n, float bound, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(-bound, bound);
  for (int64_t i = 0; i < n; ++i) w[i] = dist(rng);
}

void init_trunc_normal(float* w, int64_t n, double std, std::mt19937_64& rng) {
  std::normal_distribution<double> normal(0.0, std);
  for (int64_t i = 0; i < n; ++i) {
    double x;
    do x = normal(rng);
    while (std::abs(x) > 3.0 * std);
    w[i] = static_cast<float>(x);
  }
}

}  // namespace layers
}  // namespace ddp
