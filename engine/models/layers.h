// layers.h — the building blocks of the reference models (docs/models.md) as
// pure functions over raw float32 buffers, forward and backward, CPU only.
// Each buffer's shape is in the comment beside it; every buffer is
// row-major and contiguous unless a row stride is named. GEMMs go through
// cblas_sgemm; elementwise loops are written so the compiler vectorises them.
//
// Conventions: forward functions overwrite their outputs. Backward functions
// *add* into parameter gradients (dw, db, dg, dtable: the engine zeroes them
// once per step, tied and accumulated uses sum) and overwrite input
// gradients unless they take `accumulate` (true: add into dx, which is how
// the residual stream collects its branches). No function allocates, but
// for a GEMM with 16-bit inputs, whose rounded copies of its operands grow
// two scratch buffers of the thread's (gemm.h).
//
// The GEMMs (linear layers, attention's products) take `inputs`, the dtype
// their operands are rounded to (gemm.h: mixed precision, emulated); every
// other buffer and all other arithmetic is float32.
//
// Deliberately absent: autograd, storage in dtypes other than float32,
// dropout, biases in the transformer, any GPU path.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gemm.h"

namespace ddp {
namespace layers {

// ---- linear: y = x W^T (+ b), W stored [out, in] as in PyTorch ----------

// y[n, out] = x[n, in] · w[out, in]^T; with accumulate, y += that instead.
// (x, and backward's dy and x: float32, or in the 16-bit `inputs`: gemm.h.)
void linear_forward(float* y, GemmInput x, const float* w, int64_t n, int64_t in, int64_t out, bool accumulate = false,
                    ddp_dtype inputs = DDP_FLOAT32);
// dx[n, in] = alpha * dy[n, out] · w[out, in] (accumulate: dx += ...).
void linear_backward_input(float* dx, GemmInput dy, const float* w, int64_t n, int64_t in, int64_t out,
                           bool accumulate = false, float alpha = 1.0f, ddp_dtype inputs = DDP_FLOAT32);
// dw[out, in] += alpha * dy[n, out]^T · x[n, in]. (alpha: a factor of dy
// folded into the GEMM instead of a pass of its own over dy.)
void linear_backward_weight(float* dw, GemmInput dy, GemmInput x, int64_t n, int64_t in, int64_t out,
                            float alpha = 1.0f, ddp_dtype inputs = DDP_FLOAT32);
// y[n, out] += b[out] broadcast over rows.
void bias_forward(float* y, const float* b, int64_t n, int64_t out);
// db[out] += sum over rows of dy[n, out], in the column-sum order below.
void bias_backward(float* db, const float* dy, int64_t n, int64_t out);

// ---- column sums (db, RMSNorm's dg): one fixed order of additions ---------

// The rows are cut into tiles of kColumnSumRows. For column j, each tile's
// terms are added in row order starting from its first term; then the tile
// sums are added into sum[j] one by one, in tile order. The CUDA kernels
// add in exactly this order (a thread per column and tile, then one per
// column), and neither side contracts a product and a sum into an FMA
// (column_sums.cpp is built with -ffp-contract=off), so both give the same
// bits.
constexpr int64_t kColumnSumRows = 64;

// ---- embedding ----------------------------------------------------------

// out[n, d] = table[tokens[i], :] for each row i. Tokens must be in range
// (callers validate: this does not).
void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t n, int64_t d);
// dtable[tokens[i], :] += dout[i, :] (scatter-add; repeated tokens sum).
void embedding_backward(float* dtable, const float* dout, const int32_t* tokens, int64_t n, int64_t d);

// ---- RMSNorm: y = x / sqrt(mean(x^2) + eps) * g, in float32 ---------------

constexpr float kRmsNormEps = 1e-5f;

// y[n, d], rms[n] kept for backward = sqrt(mean(x^2) + eps); x[n, d], g[d].
void rmsnorm_forward(float* y, float* rms, const float* x, const float* g, int64_t n, int64_t d);
// dx[n, d] (= or +=), dg[d] +=; from dy[n, d], x[n, d], g[d], rms[n].
// dg is rmsnorm_gain_backward's (skipped if null).
void rmsnorm_backward(float* dx, float* dg, const float* dy, const float* x, const float* g, const float* rms,
                      int64_t n, int64_t d, bool accumulate = false);
// dg[d] += column sums of dy_ij x_ij (1 / rms_i), in the column-sum order.
void rmsnorm_gain_backward(float* dg, const float* dy, const float* x, const float* rms, int64_t n, int64_t d);

// ---- RoPE: rotate adjacent pairs (2k, 2k+1) by pos / theta^(2k/dh) -------

// cos, sin [t, dh/2] for positions 0..t-1: angle pos / theta^(2k/dh)
// computed in float64 and rounded once to float32 (as the golden fixtures).
void rope_tables(float* cos, float* sin, int64_t t, int64_t dh, double theta);
// In place on x[b, t, heads, dh] (row stride heads*dh): position = index in t.
void rope_forward(float* x, const float* cos, const float* sin, int64_t b, int64_t t, int64_t heads, int64_t dh);
// In place on dx[b, t, heads, dh]: the inverse rotation (rotation by -angle).
void rope_backward(float* dx, const float* cos, const float* sin, int64_t b, int64_t t, int64_t heads, int64_t dh);

// ---- causal multi-head attention core -----------------------------------

// q, k, v, out [b, t, heads, dh] (row stride heads*dh, i.e. [b*t, d_model]
// with head h in columns [h*dh, (h+1)*dh)). p[b, heads, t, t] keeps the
// attention weights: softmax(q k^T / sqrt(dh)) over keys j <= i, 0 beyond.
void attention_forward(float* out, float* p, const float* q, const float* k, const float* v, int64_t b, int64_t t,
                       int64_t heads, int64_t dh, ddp_dtype inputs = DDP_FLOAT32);
// dq, dk, dv [b, t, heads, dh] overwritten; scratch [t, t]; others as above.
void attention_backward(float* dq, float* dk, float* dv, float* scratch, const float* dout, const float* p,
                        const float* q, const float* k, const float* v, int64_t b, int64_t t, int64_t heads, int64_t dh,
                        ddp_dtype inputs = DDP_FLOAT32);

// ---- elementwise --------------------------------------------------------

// out[n] = silu(a) * b, silu(z) = z * sigmoid(z).
void swiglu_forward(float* out, const float* a, const float* b, int64_t n);
// da[n], db[n] overwritten from dout[n], a[n], b[n].
void swiglu_backward(float* da, float* db, const float* dout, const float* a, const float* b, int64_t n);
// y[n] = max(x, 0); y may alias x.
void relu_forward(float* y, const float* x, int64_t n);
// dx[n] = y > 0 ? dy : 0 from the forward output y[n]; dx may alias dy.
void relu_backward(float* dx, const float* dy, const float* y, int64_t n);

// ---- loss ---------------------------------------------------------------

// Mean over n rows of -log_softmax(logits[i])[targets[i]]; logits[n, v],
// targets[n] in range; lse[n] = logsumexp of each row. Leaves in place of
// the logits the gradient of the rows' summed loss, softmax(logits[i]) -
// onehot(targets[i]), written while each row is still in cache: backward
// has only to scale it by loss_scale / n (cross_entropy_backward, or the
// alpha of the GEMMs that read it next).
double cross_entropy_forward(float* lse, float* logits, const int32_t* targets, int64_t n, int64_t v);
// dlogits[n, v] *= c, c = scale / n rounded to float first: the forward's
// gradient made that of the mean loss times scale.
void cross_entropy_backward(float* dlogits, int64_t n, int64_t v, float scale);

// Mean over n elements of (pred - y)^2, summed in double (toy models).
double mse_forward(const float* pred, const float* y, int64_t n);
// d[n] = c * (pred - y) with c = 2 * scale / n rounded to float first.
void mse_backward(float* d, const float* pred, const float* y, int64_t n, float scale);

// ---- initialisation (deterministic from a std::mt19937_64) -------------

// U(-bound, bound): nn.Linear's default init with bound = 1/sqrt(fan_in).
void init_uniform(float* w, int64_t n, float bound, std::mt19937_64& rng);
// Normal(0, std) truncated at +-3 std by rejection (nn.init.trunc_normal_
// with a = -3 std, b = 3 std).
void init_trunc_normal(float* w, int64_t n, double std, std::mt19937_64& rng);

}  // namespace layers
}  // namespace ddp
