// gemm.cpp — the layers' GEMM (gemm.h): cblas_sgemm, on operands rounded
// to the compute dtype first where it is not float32, and its recording.
#include "gemm.h"

#include <cblas.h>

#include <chrono>

#include <ddp/numeric.h>

namespace ddp {
namespace layers {
namespace {

blasint bi(int64_t v) { return static_cast<blasint>(v); }

thread_local std::vector<GemmCall>* t_recorded = nullptr;

// The rounded copies of a GEMM's two operands (grown, never shrunk: the
// layers allocate nothing per call once a step has run).
thread_local std::vector<float> t_rounded_a;
thread_local std::vector<float> t_rounded_b;

// One row's elements rounded by `round` (numeric.h's branch-free
// conversions, inlined: the loop vectorises).
template <typename Round>
void round_row(float* __restrict out, const float* __restrict in, int64_t cols, Round round) {
  for (int64_t j = 0; j < cols; ++j) out[j] = round(in[j]);
}

// The rows x cols block at `p` (row stride ld), each element rounded to
// `dtype` (bfloat16 or float16), into `out` (row stride cols).
const float* rounded(std::vector<float>& out, const float* p, int64_t rows, int64_t cols, int64_t ld, ddp_dtype dtype) {
  const auto count = static_cast<size_t>(rows * cols);
  if (out.size() < count) out.resize(count);
  const auto bf16 = [](float x) { return ddp_bf16_to_float(ddp_float_to_bf16(x)); };
  const auto fp16 = [](float x) { return ddp_fp16_to_float(ddp_float_to_fp16(x)); };
  for (int64_t i = 0; i < rows; ++i) {
    float* row = out.data() + i * cols;
    if (dtype == DDP_BFLOAT16)
      round_row(row, p + i * ld, cols, bf16);
    else
      round_row(row, p + i * ld, cols, fp16);
  }
  return out.data();
}

}  // namespace

float round_to(ddp_dtype dtype, float x) {
  if (dtype == DDP_BFLOAT16) return ddp_bf16_to_float(ddp_float_to_bf16(x));
  if (dtype == DDP_FLOAT16) return ddp_fp16_to_float(ddp_float_to_fp16(x));
  return x;
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc, ddp_dtype inputs) {
  if (t_recorded) t_recorded->push_back({trans_a, trans_b, m, n, k, lda, ldb, ldc, alpha, beta, a, b, c});
  if ((inputs == DDP_BFLOAT16 || inputs == DDP_FLOAT16) && m > 0 && n > 0 && k > 0) {
    // op(A) is m x k: stored m x k, or k x m where transposed; B likewise.
    a = rounded(t_rounded_a, a, trans_a ? k : m, trans_a ? m : k, lda, inputs);
    lda = trans_a ? m : k;
    b = rounded(t_rounded_b, b, trans_b ? n : k, trans_b ? k : n, ldb, inputs);
    ldb = trans_b ? k : n;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, bi(m), bi(n),
              bi(k), alpha, a, bi(lda), b, bi(ldb), beta, c, bi(ldc));
}

void record_gemms(std::vector<GemmCall>* calls) { t_recorded = calls; }

double replay_gemms(const std::vector<GemmCall>& calls) {
  const auto begin = std::chrono::steady_clock::now();
  for (const GemmCall& g : calls)
    cblas_sgemm(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans, g.trans_b ? CblasTrans : CblasNoTrans, bi(g.m),
                bi(g.n), bi(g.k), g.alpha, g.a, bi(g.lda), g.b, bi(g.ldb), g.beta, g.c, bi(g.ldc));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
}

}  // namespace layers
}  // namespace ddp
