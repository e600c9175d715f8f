// precision_test.cpp — emulated mixed precision's two pieces (gemm.h):
// round_to, a float rounded to bfloat16 or float16 and back (to nearest,
// ties to even, overflow to infinity, NaN kept), against values worked out
// by hand; and gemm with rounded inputs, against the same products of the
// rounded operands summed in double, for every transpose and a row stride
// wider than the rows; an operand given already in 16 bits (GemmInput)
// gives the bits of its float32 value, and one of another dtype is refused;
// the CPU kernels' layers that write their kept output in 16 bits
// (LayerOutput) write the float32 result's rounding, and those that read
// kept inputs in 16 bits (LayerInput) give their float32 values' results,
// bit for bit.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include <ddp/numeric.h>

#include "error.h"
#include "gemm.h"
#include "kernels.h"
#include "layers.h"

namespace ddp {
namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

TEST(RoundTo, Bfloat16RoundsToNearestTiesToEven) {
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7 (bf16 keeps 7 fraction
  // bits): the tie goes to the even 1. 1 + 3 * 2^-8 ties between 1 + 2^-7
  // and 1 + 2^-6: to the even 1 + 2^-6. Just above a tie rounds up.
  EXPECT_EQ(layers::round_to(DDP_BFLOAT16, 1.0f + 0x1.0p-8f), 1.0f);
  EXPECT_EQ(layers::round_to(DDP_BFLOAT16, 1.0f + 3 * 0x1.0p-8f), 1.0f + 0x1.0p-6f);
  EXPECT_EQ(layers::round_to(DDP_BFLOAT16, 1.0f + 0x1.0p-8f + 0x1.0p-20f), 1.0f + 0x1.0p-7f);
  EXPECT_EQ(layers::round_to(DDP_BFLOAT16, -3.0f), -3.0f);  // exact stays
  // The largest float rounds up to infinity; a NaN stays a NaN.
  EXPECT_EQ(layers::round_to(DDP_BFLOAT16, std::numeric_limits<float>::max()),
            std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(layers::round_to(DDP_BFLOAT16, std::nanf(""))));
  // bf16 has float32's exponent range: the smallest normal float is exact.
  EXPECT_EQ(layers::round_to(DDP_BFLOAT16, from_bits(0x00800000u)), from_bits(0x00800000u));
}

TEST(RoundTo, Float16RoundsToNearestTiesToEvenAndOverflows) {
  // fp16 keeps 10 fraction bits: 1 + 2^-11 ties to 1, 1 + 3 * 2^-11 to 1 + 2^-9.
  EXPECT_EQ(layers::round_to(DDP_FLOAT16, 1.0f + 0x1.0p-11f), 1.0f);
  EXPECT_EQ(layers::round_to(DDP_FLOAT16, 1.0f + 3 * 0x1.0p-11f), 1.0f + 0x1.0p-9f);
  // 65504 is the largest fp16; 65520 is halfway to 2^16, which is out of
  // range: it and anything above round to infinity, just below to 65504.
  EXPECT_EQ(layers::round_to(DDP_FLOAT16, 65504.0f), 65504.0f);
  EXPECT_EQ(layers::round_to(DDP_FLOAT16, 65519.0f), 65504.0f);
  EXPECT_EQ(layers::round_to(DDP_FLOAT16, 65520.0f), std::numeric_limits<float>::infinity());
  EXPECT_EQ(layers::round_to(DDP_FLOAT16, -1e6f), -std::numeric_limits<float>::infinity());
  // Subnormals: steps of 2^-24; 2^-25 ties to 0 (even), 3 * 2^-25 to 2^-23.
  EXPECT_EQ(layers::round_to(DDP_FLOAT16, 0x1.0p-24f), 0x1.0p-24f);
  EXPECT_EQ(layers::round_to(DDP_FLOAT16, 0x1.0p-25f), 0.0f);
  EXPECT_EQ(layers::round_to(DDP_FLOAT16, 3 * 0x1.0p-25f), 0x1.0p-23f);
  EXPECT_TRUE(std::isnan(layers::round_to(DDP_FLOAT16, std::nanf(""))));
}

TEST(RoundTo, Float32IsTheValueItself) {
  for (const float x : {0.1f, 1e-40f, 3e38f, -7.25f}) EXPECT_EQ(layers::round_to(DDP_FLOAT32, x), x);
}

// A rows x cols matrix stored with row stride ld, entries N(0, 1).
std::vector<float> random_matrix(int64_t rows, int64_t ld, std::mt19937_64& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> m(static_cast<size_t>(rows * ld));
  for (float& v : m) v = normal(rng);
  return m;
}

TEST(Gemm, RoundsBothInputsAndAccumulatesInFloat32) {
  const int64_t m = 7, n = 5, k = 33;
  std::mt19937_64 rng(3);
  for (const ddp_dtype dtype : {DDP_BFLOAT16, DDP_FLOAT16}) {
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        // Stored as given to gemm: A is m x k (k x m transposed), B k x n
        // (n x k transposed), each with 3 extra columns of stride.
        const int64_t a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
        const std::vector<float> a = random_matrix(a_rows, a_cols + 3, rng), b = random_matrix(b_rows, b_cols + 3, rng);
        std::vector<float> c(static_cast<size_t>(m * n), 1.0f);
        layers::gemm(ta, tb, m, n, k, 0.5f, a.data(), a_cols + 3, b.data(), b_cols + 3, 2.0f, c.data(), n, dtype);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            double sum = 0, magnitude = 0;
            for (int64_t p = 0; p < k; ++p) {
              const float x = ta ? a[size_t(p * (a_cols + 3) + i)] : a[size_t(i * (a_cols + 3) + p)];
              const float y = tb ? b[size_t(j * (b_cols + 3) + p)] : b[size_t(p * (b_cols + 3) + j)];
              const double term = double(layers::round_to(dtype, x)) * double(layers::round_to(dtype, y));
              sum += term;
              magnitude += std::abs(term);
            }
            const double want = 0.5 * sum + 2.0;
            // float32 accumulation: within k ulps of the terms' magnitude.
            EXPECT_NEAR(c[size_t(i * n + j)], want, 0.5 * magnitude * double(k) * 0x1.0p-24 + 1e-6)
                << "dtype " << dtype << ", trans " << ta << tb << ", C[" << i << "," << j << "]";
          }
        }
      }
    }
  }
}

// A product of unrounded operands: float32 GEMM inputs are taken as they
// are, and rounding them changes the result (so the check above could tell).
TEST(Gemm, Float32InputsAreNotRounded) {
  const float a[2] = {1.0f + 0x1.0p-20f, 1.0f};
  const float b[2] = {1.0f, 1.0f};
  float c = 0;
  layers::gemm(false, false, 1, 1, 2, 1.0f, a, 2, b, 1, 0.0f, &c, 1, DDP_FLOAT32);
  EXPECT_EQ(c, 2.0f + 0x1.0p-20f);
  layers::gemm(false, false, 1, 1, 2, 1.0f, a, 2, b, 1, 0.0f, &c, 1, DDP_BFLOAT16);
  EXPECT_EQ(c, 2.0f);
}

// x's elements in `dtype`'s 16 bits (to nearest even), the same layout.
std::vector<uint16_t> packed(const std::vector<float>& x, ddp_dtype dtype) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    out[i] = dtype == DDP_BFLOAT16 ? ddp_float_to_bf16(x[i]) : ddp_float_to_fp16(x[i]);
  return out;
}

// A kept activation (model.h) goes to the GEMM in its 16 bits: the product
// is the float32 value's, bit for bit, for each operand, transpose and a
// row stride wider than the rows.
TEST(Gemm, ASixteenBitInputGivesTheBitsOfItsFloat32Value) {
  const int64_t m = 6, n = 9, k = 40;
  std::mt19937_64 rng(11);
  for (const ddp_dtype dtype : {DDP_BFLOAT16, DDP_FLOAT16}) {
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        const int64_t lda = (ta ? m : k) + 2;
        const int64_t ldb = (tb ? k : n) + 5;
        const std::vector<float> a = random_matrix(ta ? k : m, lda, rng);
        const std::vector<float> b = random_matrix(tb ? n : k, ldb, rng);
        const std::vector<uint16_t> a16 = packed(a, dtype);
        const std::vector<uint16_t> b16 = packed(b, dtype);
        std::vector<float> want(size_t(m * n), 0.25f);
        layers::gemm(ta, tb, m, n, k, 1.5f, a.data(), lda, b.data(), ldb, 1.0f, want.data(), n, dtype);
        for (int sixteen = 1; sixteen < 4; ++sixteen) {  // A, B, both
          const GemmInput ia = sixteen & 1 ? GemmInput(a16.data(), dtype) : GemmInput(a.data());
          const GemmInput ib = sixteen & 2 ? GemmInput(b16.data(), dtype) : GemmInput(b.data());
          std::vector<float> got(size_t(m * n), 0.25f);
          layers::gemm(ta, tb, m, n, k, 1.5f, ia, lda, ib, ldb, 1.0f, got.data(), n, dtype);
          EXPECT_EQ(std::memcmp(got.data(), want.data(), sizeof(float) * got.size()), 0)
              << "dtype " << dtype << ", trans " << ta << tb << ", 16-bit operands " << sixteen;
        }
      }
    }
  }
}

TEST(Gemm, RefusesASixteenBitInputOfAnotherDtype) {
  const uint16_t x[4] = {0x3f80, 0x3f80, 0x3f80, 0x3f80};
  const float y[4] = {1, 1, 1, 1};
  float c[4] = {};
  const auto message = [&](ddp_dtype inputs) {
    try {
      layers::gemm(false, false, 2, 2, 2, 1.0f, GemmInput(x, DDP_BFLOAT16), 2, y, 2, 0.0f, c, 2, inputs);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(DDP_FLOAT16),
            "GEMM: an input in bfloat16 where the inputs are float16 (an operand is float32, or already in the 16-bit "
            "compute dtype)");
  EXPECT_EQ(message(DDP_FLOAT32),
            "GEMM: an input in bfloat16 where the inputs are float32 (an operand is float32, or already in the 16-bit "
            "compute dtype)");
  EXPECT_EQ(message(DDP_BFLOAT16), "no error");
  EXPECT_EQ(c[0], 2.0f);
}

// The GEMM-only floor replays a step's GEMMs in float32: a 16-bit operand
// is recorded by its memory and read from a float32 stand-in of its size
// (zeros), one per memory.
TEST(Gemm, AReplayReadsAStandInForASixteenBitOperand) {
  const int64_t m = 3, n = 4, k = 5;
  const std::vector<uint16_t> a16(size_t(k * (m + 1)), 0x3f80);  // bf16 1.0, A transposed, stride m + 1
  const std::vector<float> b(size_t(k * n), 1.0f);
  std::vector<float> c(size_t(m * n), 7.0f);
  std::vector<layers::GemmCall> calls;
  layers::record_gemms(&calls);
  layers::gemm(true, false, m, n, k, 1.0f, GemmInput(a16.data(), DDP_BFLOAT16), m + 1, b.data(), n, 0.0f, c.data(), n,
               DDP_BFLOAT16);
  layers::record_gemms(nullptr);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].a, nullptr);
  EXPECT_EQ(calls[0].packed_a, a16.data());
  EXPECT_EQ(calls[0].b, b.data());
  EXPECT_EQ(calls[0].packed_b, nullptr);
  EXPECT_EQ(c[0], 5.0f);  // the step's product: k ones
  EXPECT_GE(layers::replay_gemms(calls), 0.0);
  for (const float v : c) EXPECT_EQ(v, 0.0f);  // the stand-in's
}

// RMSNorm (row by row) and SwiGLU (4096 elements at a time, here 3 chunks
// and a tail) in 16 bits: the float32 result rounded, as keep_activation
// would have rounded it.
TEST(CpuKernels, SixteenBitOutputsAreTheFloat32ResultsRounded) {
  std::mt19937_64 rng(5);
  const int64_t n = 13, d = 1000, count = 3 * 4096 + 7;
  const std::vector<float> x = random_matrix(n, d, rng), g = random_matrix(1, d, rng);
  const std::vector<float> a = random_matrix(1, count, rng), b = random_matrix(1, count, rng);
  const std::vector<float> dout = random_matrix(1, count, rng);
  const int64_t rb = 2, rt = 5, rheads = 3, rdh = 8, rsize = rb * rt * rheads * rdh;  // RoPE's backward
  const std::vector<float> rx = random_matrix(1, rsize, rng);
  std::vector<float> cos(static_cast<size_t>(rt * rdh / 2)), sin = cos, rdx = rx, ry = rx;
  layers::rope_tables(cos.data(), sin.data(), rt, rdh, 10000.0);
  const std::unique_ptr<Kernels> k = make_cpu_kernels();
  k->rope_backward(rdx.data(), rdx.data(), cos.data(), sin.data(), rb, rt, rheads, rdh);
  k->rope_forward(ry.data(), ry.data(), cos.data(), sin.data(), rb, rt, rheads, rdh);
  std::vector<float> y(static_cast<size_t>(n * d));
  std::vector<float> rms(static_cast<size_t>(n));
  std::vector<float> gate(static_cast<size_t>(count)), da = gate, db = gate;
  k->rmsnorm_forward(y.data(), rms.data(), x.data(), g.data(), n, d);
  k->swiglu_forward(gate.data(), a.data(), b.data(), count);
  k->swiglu_backward(da.data(), db.data(), dout.data(), a.data(), b.data(), count);
  for (const ddp_dtype dtype : {DDP_BFLOAT16, DDP_FLOAT16}) {
    SCOPED_TRACE(dtype);
    std::vector<uint16_t> y16(y.size());
    std::vector<uint16_t> gate16(gate.size()), da16 = gate16, db16 = gate16;
    std::vector<float> rms16(rms.size());
    k->rmsnorm_forward(LayerOutput(y16.data(), dtype), rms16.data(), x.data(), g.data(), n, d);
    k->swiglu_forward(LayerOutput(gate16.data(), dtype), a.data(), b.data(), count);
    k->swiglu_backward(LayerOutput(da16.data(), dtype), LayerOutput(db16.data(), dtype), dout.data(), a.data(),
                       b.data(), count);
    EXPECT_EQ(y16, packed(y, dtype));
    EXPECT_EQ(rms16, rms);
    EXPECT_EQ(gate16, packed(gate, dtype));
    EXPECT_EQ(da16, packed(da, dtype));
    EXPECT_EQ(db16, packed(db, dtype));
    std::vector<uint16_t> rdx16(rx.size());
    std::vector<float> scratch = rx;  // (rope_backward's 16-bit output leaves it unspecified)
    k->rope_backward(LayerOutput(rdx16.data(), dtype), scratch.data(), cos.data(), sin.data(), rb, rt, rheads, rdh);
    EXPECT_EQ(rdx16, packed(rdx, dtype));
    std::vector<uint16_t> ry16(rx.size());
    scratch = rx;
    k->rope_forward(LayerOutput(ry16.data(), dtype), scratch.data(), cos.data(), sin.data(), rb, rt, rheads, rdh);
    EXPECT_EQ(ry16, packed(ry, dtype));
  }
  try {
    k->swiglu_forward(LayerOutput(gate.data(), DDP_FLOAT64), a.data(), b.data(), count);
    ADD_FAILURE() << "a float64 output was taken";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "CPU kernels: a layer output in float64 (float32, bfloat16 or float16 only)");
  }
  std::vector<uint16_t> da16(da.size());
  try {
    k->swiglu_backward(LayerOutput(da16.data(), DDP_BFLOAT16), db.data(), dout.data(), a.data(), b.data(), count);
    ADD_FAILURE() << "da and db of two dtypes were taken";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "CPU kernels: swiglu_backward's da in bfloat16, db in float32 (one dtype for both)");
  }
}

// x rounded to `dtype` and back: the float32 values of its 16 bits.
std::vector<float> rounded(const std::vector<float>& x, ddp_dtype dtype) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = layers::round_to(dtype, x[i]);
  return out;
}

// Backward's layers on kept 16-bit inputs: RMSNorm over 150 rows (dg's
// column sums cross 64-row tiles), SwiGLU over 3 chunks and a tail,
// attention over 3 sequences (and its forward writing 16-bit weights).
TEST(CpuKernels, SixteenBitInputsGiveTheirFloat32ValuesResults) {
  std::mt19937_64 rng(6);
  const std::unique_ptr<Kernels> k = make_cpu_kernels();
  for (const ddp_dtype dtype : {DDP_BFLOAT16, DDP_FLOAT16}) {
    SCOPED_TRACE(dtype);
    k->set_compute_dtype(dtype);
    const int64_t n = 150, d = 40, count = 3 * 4096 + 7;
    const std::vector<float> x = rounded(random_matrix(n, d, rng), dtype), dy = random_matrix(n, d, rng);
    const std::vector<float> g = random_matrix(1, d, rng), rms = random_matrix(1, n, rng);
    const std::vector<uint16_t> x16 = packed(x, dtype);
    std::vector<float> dx(static_cast<size_t>(n * d), 0.5f), dx16 = dx, dg = g, dg16 = g;
    k->rmsnorm_backward(dx.data(), dg.data(), dy.data(), x.data(), g.data(), rms.data(), n, d, true);
    k->rmsnorm_backward(dx16.data(), dg16.data(), dy.data(), LayerInput(x16.data(), dtype), g.data(), rms.data(), n, d,
                        true);
    EXPECT_EQ(dx16, dx);
    EXPECT_EQ(dg16, dg);

    const std::vector<float> a = rounded(random_matrix(1, count, rng), dtype);
    const std::vector<float> b = rounded(random_matrix(1, count, rng), dtype), dout = random_matrix(1, count, rng);
    std::vector<float> da(static_cast<size_t>(count)), db = da, da16 = da, db16 = da;
    k->swiglu_backward(da.data(), db.data(), dout.data(), a.data(), b.data(), count);
    k->swiglu_backward(da16.data(), db16.data(), dout.data(), LayerInput(packed(a, dtype).data(), dtype),
                       LayerInput(packed(b, dtype).data(), dtype), count);
    EXPECT_EQ(da16, da);
    EXPECT_EQ(db16, db);
    std::vector<uint16_t> da_both(da.size()), db_both(db.size());  // 16-bit inputs and outputs
    k->swiglu_backward(LayerOutput(da_both.data(), dtype), LayerOutput(db_both.data(), dtype), dout.data(),
                       LayerInput(packed(a, dtype).data(), dtype), LayerInput(packed(b, dtype).data(), dtype), count);
    EXPECT_EQ(da_both, packed(da, dtype));
    EXPECT_EQ(db_both, packed(db, dtype));

    const int64_t s = 3, t = 9, heads = 2, dh = 4, size = s * t * heads * dh;
    const std::vector<float> q = rounded(random_matrix(1, size, rng), dtype), kk = rounded(random_matrix(1, size, rng), dtype);
    const std::vector<float> v = rounded(random_matrix(1, size, rng), dtype), dat = random_matrix(1, size, rng);
    std::vector<float> out(static_cast<size_t>(size)), out16 = out, p(static_cast<size_t>(s * heads * t * t));
    std::vector<uint16_t> p16(p.size());
    k->attention_forward(out.data(), p.data(), q.data(), kk.data(), v.data(), s, t, heads, dh);
    k->attention_forward(out16.data(), LayerOutput(p16.data(), dtype), q.data(), kk.data(), v.data(), s, t, heads, dh);
    EXPECT_EQ(out16, out);
    EXPECT_EQ(p16, packed(p, dtype));
    const std::vector<uint16_t> q16 = packed(q, dtype), k16 = packed(kk, dtype), v16 = packed(v, dtype);
    std::vector<uint16_t> att16(out.size()), p16b(p.size());  // 16 bits in, 16 bits out: lm's forward
    k->attention_forward(LayerOutput(att16.data(), dtype), LayerOutput(p16b.data(), dtype),
                         LayerInput(q16.data(), dtype), LayerInput(k16.data(), dtype), LayerInput(v16.data(), dtype), s,
                         t, heads, dh);
    EXPECT_EQ(att16, packed(out, dtype));
    EXPECT_EQ(p16b, p16);
    std::vector<float> scratch(k->attention_scratch_floats(s, t, heads));
    std::vector<float> dq(static_cast<size_t>(size)), dk = dq, dv = dq, dq16 = dq, dk16 = dq, dv16 = dq;
    const std::vector<float> p_kept = rounded(p, dtype);
    k->attention_backward(dq.data(), dk.data(), dv.data(), scratch.data(), dat.data(), p_kept.data(), q.data(),
                          kk.data(), v.data(), s, t, heads, dh);
    k->attention_backward(dq16.data(), dk16.data(), dv16.data(), scratch.data(), dat.data(),
                          LayerInput(p16.data(), dtype), LayerInput(q16.data(), dtype), LayerInput(k16.data(), dtype),
                          LayerInput(v16.data(), dtype), s, t, heads, dh);
    EXPECT_EQ(dq16, dq);
    EXPECT_EQ(dk16, dk);
    EXPECT_EQ(dv16, dv);
    std::vector<uint16_t> dv_out(dv.size());  // dv written in 16 bits, as lm's GEMMs read it
    k->attention_backward(dq16.data(), dk16.data(), LayerOutput(dv_out.data(), dtype), scratch.data(), dat.data(),
                          LayerInput(p16.data(), dtype), LayerInput(q16.data(), dtype), LayerInput(k16.data(), dtype),
                          LayerInput(v16.data(), dtype), s, t, heads, dh);
    EXPECT_EQ(dv_out, packed(dv, dtype));
    EXPECT_EQ(dq16, dq);
  }
}

}  // namespace
}  // namespace ddp
