// gemm.cpp — the layers' GEMM (gemm.h): cblas_sgemm, on operands rounded
// to the compute dtype first where it is not float32, and its recording.
#include "gemm.h"

#include <cblas.h>

#include <chrono>
#include <map>
#include <string>

#include <ddp/numeric.h>

#include "convert.h"
#include "error.h"

namespace ddp {

void check_gemm_input(const GemmInput& x, ddp_dtype inputs) {
  if (x.dtype == DDP_FLOAT32 || (x.dtype == inputs && (inputs == DDP_BFLOAT16 || inputs == DDP_FLOAT16))) return;
  throw Error(std::string("GEMM: an input in ") + ddp_dtype_name(x.dtype) + " where the inputs are " +
              ddp_dtype_name(inputs) + " (an operand is float32, or already in the 16-bit compute dtype)");
}

namespace layers {
namespace {

blasint bi(int64_t v) { return static_cast<blasint>(v); }

thread_local std::vector<GemmCall>* t_recorded = nullptr;

// The rounded copies of a GEMM's two operands (grown, never shrunk: the
// layers allocate nothing per call once a step has run).
thread_local std::vector<float> t_rounded_a;
thread_local std::vector<float> t_rounded_b;

// The rows x cols block at `p` (row stride ld), each element rounded to
// `dtype` (bfloat16 or float16), into `out` (row stride cols): numeric.h's
// branch-free conversions, inlined, so that each row's loop vectorises.
const float* rounded(std::vector<float>& out, const float* p, int64_t rows, int64_t cols, int64_t ld, ddp_dtype dtype) {
  const auto count = static_cast<size_t>(rows * cols);
  if (out.size() < count) out.resize(count);
  for (int64_t i = 0; i < rows; ++i) {
    float* __restrict row = out.data() + i * cols;
    const float* __restrict in = p + i * ld;
    if (dtype == DDP_BFLOAT16)
      for (int64_t j = 0; j < cols; ++j) row[j] = ddp_bf16_to_float(ddp_float_to_bf16(in[j]));
    else
      for (int64_t j = 0; j < cols; ++j) row[j] = ddp_fp16_to_float(ddp_float_to_fp16(in[j]));
  }
  return out.data();
}

// The block's 16-bit values widened to float32 (exact), a row at a time
// through convert.h.
const float* widened(std::vector<float>& out, const void* p, int64_t rows, int64_t cols, int64_t ld, ddp_dtype dtype) {
  const auto count = static_cast<size_t>(rows * cols);
  if (out.size() < count) out.resize(count);
  const auto* in = static_cast<const uint16_t*>(p);
  for (int64_t i = 0; i < rows; ++i)
    convert_cpu(out.data() + i * cols, DDP_FLOAT32, in + i * ld, dtype, static_cast<size_t>(cols));
  return out.data();
}

// Operand x (stored rows x cols, row stride ld) as the float32 values the
// product multiplies, in `out` where it must be rounded or widened (ld
// then becomes cols).
const float* operand(std::vector<float>& out, const GemmInput& x, int64_t rows, int64_t cols, int64_t& ld,
                     ddp_dtype inputs) {
  const bool sixteen = inputs == DDP_BFLOAT16 || inputs == DDP_FLOAT16;
  if (!sixteen) return static_cast<const float*>(x.data);
  const int64_t stride = ld;
  ld = cols;
  if (x.dtype == DDP_FLOAT32) return rounded(out, static_cast<const float*>(x.data), rows, cols, stride, inputs);
  return widened(out, x.data, rows, cols, stride, x.dtype);
}

}  // namespace

float round_to(ddp_dtype dtype, float x) {
  if (dtype == DDP_BFLOAT16) return ddp_bf16_to_float(ddp_float_to_bf16(x));
  if (dtype == DDP_FLOAT16) return ddp_fp16_to_float(ddp_float_to_fp16(x));
  return x;
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, GemmInput a, int64_t lda,
          GemmInput b, int64_t ldb, float beta, float* c, int64_t ldc, ddp_dtype inputs) {
  check_gemm_input(a, inputs);
  check_gemm_input(b, inputs);
  auto floats = [](const GemmInput& x) {
    return x.dtype == DDP_FLOAT32 ? static_cast<const float*>(x.data) : nullptr;  // (GemmCall)
  };
  auto packed = [](const GemmInput& x) { return x.dtype == DDP_FLOAT32 ? nullptr : x.data; };
  if (t_recorded)
    t_recorded->push_back(
        {trans_a, trans_b, m, n, k, lda, ldb, ldc, alpha, beta, floats(a), floats(b), c, packed(a), packed(b)});
  const float* fa = static_cast<const float*>(a.data);  // (read by no GEMM with an empty product)
  const float* fb = static_cast<const float*>(b.data);
  if (m > 0 && n > 0 && k > 0) {
    // op(A) is m x k: stored m x k, or k x m where transposed; B likewise.
    fa = operand(t_rounded_a, a, trans_a ? k : m, trans_a ? m : k, lda, inputs);
    fb = operand(t_rounded_b, b, trans_b ? n : k, trans_b ? k : n, ldb, inputs);
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, bi(m), bi(n),
              bi(k), alpha, fa, bi(lda), fb, bi(ldb), beta, c, bi(ldc));
}

void record_gemms(std::vector<GemmCall>* calls) { t_recorded = calls; }

double replay_gemms(const std::vector<GemmCall>& calls) {
  // A 16-bit operand reads a float32 stand-in (zeros) of its span, one per
  // operand memory, made before the clock starts.
  std::map<const void*, std::vector<float>> stand_ins;
  auto grow = [&](const void* packed, size_t span) {
    std::vector<float>& s = stand_ins[packed];
    if (s.size() < span) s.resize(span);
  };
  for (const GemmCall& g : calls) {
    if (g.packed_a) grow(g.packed_a, size_t(g.trans_a ? g.k : g.m) * size_t(g.lda));
    if (g.packed_b) grow(g.packed_b, size_t(g.trans_b ? g.n : g.k) * size_t(g.ldb));
  }
  auto operand = [&](const float* f, const void* packed) { return f ? f : stand_ins[packed].data(); };
  const auto begin = std::chrono::steady_clock::now();
  for (const GemmCall& g : calls)
    cblas_sgemm(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans, g.trans_b ? CblasTrans : CblasNoTrans, bi(g.m),
                bi(g.n), bi(g.k), g.alpha, operand(g.a, g.packed_a), bi(g.lda), operand(g.b, g.packed_b), bi(g.ldb),
                g.beta, g.c, bi(g.ldc));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
}

}  // namespace layers
}  // namespace ddp
