// host_compute_test — ddp_host's compute entries (ABI 1.9: gemm, dot, norm,
// axpy, normalize) through the vtable a real PluginHost gives, on the CPU:
// gemm against a float64 triple loop (every transpose pair, batches with
// strides, leading dimensions past the rows, alpha and beta, beta 0 over
// NaN); dot, norm, axpy and normalize against float64 sums, and bit for bit
// against the order compute.h defines (written again here, independently);
// work on the comm stream (an executor thread) in order with a copy after
// it; every refusal's exact text and status; and plugin.hpp's wrappers,
// including an older engine's refusal by name.
//
// Built with -ffp-contract=off (tests/CMakeLists.txt), so the references'
// products and sums round as written, as the engine's loops do.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cpu_host.h"
#include "device_like_stream.h"

namespace ddp {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The order of compute.h, written out independently of compute.cpp: 256
// lanes, lane l summing terms l, l + 256, ... in turn, then a halving tree.
double lane_order_sum(const std::vector<double>& terms) {
  std::vector<double> lanes(256, 0.0);
  for (size_t j = 0; j < terms.size(); ++j) lanes[j % 256] += terms[j];
  for (size_t half = 128; half >= 1; half /= 2)
    for (size_t l = 0; l < half; ++l) lanes[l] += lanes[l + half];
  return lanes[0];
}

double plain_sum(const std::vector<double>& terms) {
  double s = 0;
  for (double t : terms) s += t;
  return s;
}

// Element j of vector i of v.
float& at(const ddp_vectors& v, size_t i, size_t j) { return v.ptr[i * v.stride + j * v.inc]; }

std::vector<double> products(const ddp_vectors& x, const ddp_vectors& y, size_t i) {
  std::vector<double> terms(x.length);
  for (size_t j = 0; j < x.length; ++j) terms[j] = double(at(x, i, j)) * double(at(y, i, j));
  return terms;
}

class ComputeEntries : public ::testing::Test {
 protected:
  test::CpuPluginHost plugin_host{"strategy"};
  const ddp_host* h = plugin_host.get();
  ddp_stream compute = h->compute_stream(h->ctx);
  ddp_stream comm = h->comm_stream(h->ctx);

  // Waits for everything enqueued on the comm stream so far.
  void drain_comm() {
    ddp_event event = nullptr;
    ASSERT_EQ(h->event_create(h->ctx, &event), DDP_OK);
    ASSERT_EQ(h->event_record(h->ctx, event, comm), DDP_OK);
    ASSERT_EQ(h->event_synchronize(h->ctx, event), DDP_OK);
    h->event_destroy(h->ctx, event);
  }
};

// ------------------------------------------------------------------ gemm

// A batch of products with every operand padded: rows `pad` elements past
// their length, products `gap` elements apart beyond one operand's extent.
struct GemmData {
  ddp_gemm g{};
  std::vector<float> a, b, c;
};

GemmData gemm_data(size_t m, size_t n, size_t k, size_t batch, int ta, int tb, size_t pad, uint32_t seed) {
  GemmData d;
  ddp_gemm& g = d.g;
  g.struct_size = sizeof(ddp_gemm);
  g.trans_a = ta;
  g.trans_b = tb;
  g.m = m;
  g.n = n;
  g.k = k;
  g.alpha = 1.0;
  g.beta = 0.0;
  g.batch = batch;
  const size_t rows_a = ta ? k : m, rows_b = tb ? n : k;
  g.lda = (ta ? m : k) + pad;
  g.ldb = (tb ? k : n) + pad;
  g.ldc = n + pad;
  g.stride_a = rows_a * g.lda + 3;
  g.stride_b = rows_b * g.ldb + 5;
  g.stride_c = m * g.ldc + 7;
  d.a = random_floats(g.stride_a * batch, seed);
  d.b = random_floats(g.stride_b * batch, seed + 1);
  d.c = random_floats(g.stride_c * batch, seed + 2);
  g.a = d.a.data();
  g.b = d.b.data();
  g.c = d.c.data();
  return d;
}

// C's element (p, i, j) and whether (i, j) is inside the product.
size_t c_index(const ddp_gemm& g, size_t p, size_t i, size_t j) { return p * g.stride_c + i * g.ldc + j; }

// Checks d.c (after the call) against the float64 triple loop over the
// inputs, `before` holding C as it was; elements of C outside the products
// (padding, gaps) must be untouched, bit for bit.
void expect_gemm_result(const GemmData& d, const std::vector<float>& before) {
  const ddp_gemm& g = d.g;
  std::vector<bool> inside(d.c.size(), false);
  for (size_t p = 0; p < g.batch; ++p) {
    const float* a = d.a.data() + p * g.stride_a;
    const float* b = d.b.data() + p * g.stride_b;
    for (size_t i = 0; i < g.m; ++i) {
      for (size_t j = 0; j < g.n; ++j) {
        double sum = 0, magnitude = 0;
        for (size_t q = 0; q < g.k; ++q) {
          const double av = g.trans_a ? a[q * g.lda + i] : a[i * g.lda + q];
          const double bv = g.trans_b ? b[j * g.ldb + q] : b[q * g.ldb + j];
          sum += av * bv;
          magnitude += std::fabs(av * bv);
        }
        const size_t at_c = c_index(g, p, i, j);
        inside[at_c] = true;
        const double old = g.beta == 0.0 ? 0.0 : double(before[at_c]);  // beta 0: C is not read
        const double want = g.alpha * sum + g.beta * old;
        const double tol = 1e-6 * double(g.k + 2) * (std::fabs(g.alpha) * magnitude + std::fabs(g.beta * old));
        ASSERT_NEAR(d.c[at_c], want, tol) << "product " << p << " C(" << i << ", " << j << ")";
      }
    }
  }
  for (size_t e = 0; e < d.c.size(); ++e) {
    if (!inside[e]) {
      ASSERT_TRUE(same_bits(d.c[e], before[e])) << "C's element " << e << " outside the products";
    }
  }
}

TEST_F(ComputeEntries, GemmEveryTransposePairAgainstFloat64) {
  for (int ta = 0; ta <= 1; ++ta) {
    for (int tb = 0; tb <= 1; ++tb) {
      // Small and odd, and large enough for OpenBLAS's blocked kernels.
      for (const size_t size : {size_t(1), size_t(9)}) {
        SCOPED_TRACE("trans_a " + std::to_string(ta) + " trans_b " + std::to_string(tb) + " size " +
                     std::to_string(size));
        GemmData d = gemm_data(5 * size, 7 * size, 3 * size + 2, 3, ta, tb, 4, 100u + 4 * ta + 2 * tb);
        d.g.alpha = 1.5;
        d.g.beta = -0.5;
        const std::vector<float> before = d.c;
        ASSERT_EQ(h->gemm(h->ctx, &d.g, compute), DDP_OK) << take_plugin_error();
        expect_gemm_result(d, before);
      }
    }
  }
}

// beta 0 overwrites C, NaN included (C is not read); with k = 0 the
// product is empty and C becomes beta C: 0.
TEST_F(ComputeEntries, GemmBetaZeroOverwritesNaN) {
  for (int ta = 0; ta <= 1; ++ta) {
    GemmData d = gemm_data(6, 4, 5, 2, ta, 1 - ta, 2, 7);
    for (size_t p = 0; p < 2; ++p)
      for (size_t i = 0; i < 6; ++i)
        for (size_t j = 0; j < 4; ++j) d.c[c_index(d.g, p, i, j)] = kNaN;
    d.g.alpha = 2.0;
    const std::vector<float> before = d.c;
    ASSERT_EQ(h->gemm(h->ctx, &d.g, compute), DDP_OK) << take_plugin_error();
    expect_gemm_result(d, before);
  }
  GemmData empty = gemm_data(3, 4, 0, 1, 0, 0, 0, 9);
  empty.g.lda = 0;  // a row of A holds k = 0 elements
  std::fill(empty.c.begin(), empty.c.end(), kNaN);
  ASSERT_EQ(h->gemm(h->ctx, &empty.g, compute), DDP_OK) << take_plugin_error();
  for (size_t i = 0; i < 3 * 4; ++i) EXPECT_EQ(empty.c[i], 0.0f) << i;
}

// The same inputs give the same bits, call after call.
TEST_F(ComputeEntries, GemmRepeatsBitwise) {
  GemmData d = gemm_data(70, 90, 110, 2, 1, 0, 3, 21);
  const std::vector<float> before = d.c;
  ASSERT_EQ(h->gemm(h->ctx, &d.g, compute), DDP_OK);
  const std::vector<float> first = d.c;
  d.c = before;
  d.g.c = d.c.data();
  ASSERT_EQ(h->gemm(h->ctx, &d.g, compute), DDP_OK);
  EXPECT_TRUE(same_bits(first, d.c));
  EXPECT_FALSE(same_bits(first, before));
}

// -------------------------------------------------------- dot and norm

// A [rows, cols] matrix whose rows are ld floats apart, with its rows and
// its columns (inc ld: strided) as vectors.
struct Matrix {
  Matrix(size_t r, size_t c, size_t pad, uint32_t seed) : rows(r), cols(c), ld(c + pad) {
    data = random_floats(rows * ld, seed);
  }
  ddp_vectors row_vectors() { return ddp_vectors{data.data(), cols, 1, rows, ld}; }
  ddp_vectors column_vectors() { return ddp_vectors{data.data(), rows, ld, cols, 1}; }
  size_t rows, cols, ld;
  std::vector<float> data;
};

TEST_F(ComputeEntries, DotOfRowsAndStridedColumnsAgainstFloat64) {
  // More than 256 elements per vector in both views, and a count over 1.
  Matrix x(300, 520, 3, 1), y(300, 520, 5, 2);
  for (const bool columns : {false, true}) {
    SCOPED_TRACE(columns ? "columns" : "rows");
    const ddp_vectors xv = columns ? x.column_vectors() : x.row_vectors();
    const ddp_vectors yv = columns ? y.column_vectors() : y.row_vectors();
    std::vector<float> out(xv.count, kNaN), again(xv.count, kNaN);
    ASSERT_EQ(h->dot(h->ctx, &xv, &yv, out.data(), compute), DDP_OK) << take_plugin_error();
    ASSERT_EQ(h->dot(h->ctx, &xv, &yv, again.data(), compute), DDP_OK);
    EXPECT_TRUE(same_bits(out, again));
    for (size_t i = 0; i < xv.count; ++i) {
      const std::vector<double> terms = products(xv, yv, i);
      double magnitude = 0;
      for (double t : terms) magnitude += std::fabs(t);
      EXPECT_NEAR(out[i], plain_sum(terms), 1e-7 * magnitude) << i;
      EXPECT_TRUE(same_bits(out[i], static_cast<float>(lane_order_sum(terms)))) << i;
    }
  }
}

// Vectors whose float64 sum depends on the order at float's resolution, so
// that the order compute.h defines is seen, not only its rounding: 2^60
// and -2^60 meet in lane 0 (elements 0 and 256) or in the tree's first
// step (lanes 0 and 128), before they can absorb the 1 of lane 1. Summed
// from left to right, or the lanes from left to right, the 1 is lost.
TEST_F(ComputeEntries, DotSumsInTheDocumentedOrder) {
  const float big = std::ldexp(1.0f, 60);
  std::vector<float> x(2 * 512, 0.0f), ones(2 * 512, 1.0f), out(2, kNaN);
  x[0] = big;  // vector 0: the same lane
  x[1] = 1.0f;
  x[256] = -big;
  x[512 + 0] = big;  // vector 1: lanes 0 and 128, the tree's first step
  x[512 + 1] = 1.0f;
  x[512 + 128] = -big;
  const ddp_vectors xv{x.data(), 512, 1, 2, 512}, yv{ones.data(), 512, 1, 2, 512};
  ASSERT_EQ(h->dot(h->ctx, &xv, &yv, out.data(), compute), DDP_OK) << take_plugin_error();
  for (size_t i = 0; i < 2; ++i) {
    const std::vector<double> terms = products(xv, yv, i);
    EXPECT_EQ(plain_sum(terms), 0.0) << i;  // left to right: the 1 is absorbed
    double lanes_in_a_row = 0;  // each lane's sum, then the lanes left to right
    for (size_t l = 0; l < 256; ++l) lanes_in_a_row += terms[l] + terms[l + 256];
    EXPECT_EQ(lanes_in_a_row, i == 0 ? 1.0 : 0.0) << i;
    EXPECT_EQ(lane_order_sum(terms), 1.0) << i;
    EXPECT_EQ(out[i], 1.0f) << i;
  }
}

TEST_F(ComputeEntries, NormOfRowsAndStridedColumnsAgainstFloat64) {
  Matrix x(270, 600, 2, 3);
  for (const bool columns : {false, true}) {
    SCOPED_TRACE(columns ? "columns" : "rows");
    const ddp_vectors xv = columns ? x.column_vectors() : x.row_vectors();
    std::vector<float> out(xv.count, kNaN), again(xv.count, kNaN);
    ASSERT_EQ(h->norm(h->ctx, &xv, out.data(), compute), DDP_OK) << take_plugin_error();
    ASSERT_EQ(h->norm(h->ctx, &xv, again.data(), compute), DDP_OK);
    EXPECT_TRUE(same_bits(out, again));
    for (size_t i = 0; i < xv.count; ++i) {
      const std::vector<double> terms = products(xv, xv, i);
      EXPECT_NEAR(out[i], std::sqrt(plain_sum(terms)), 1e-6 * std::sqrt(plain_sum(terms))) << i;
      EXPECT_TRUE(same_bits(out[i], static_cast<float>(std::sqrt(lane_order_sum(terms))))) << i;
    }
  }
  // Empty vectors: a norm of 0.
  const ddp_vectors empty{x.data.data(), 0, 1, 2, 0};
  float zero[2] = {kNaN, kNaN};
  ASSERT_EQ(h->norm(h->ctx, &empty, zero, compute), DDP_OK);
  EXPECT_EQ(zero[0], 0.0f);
  EXPECT_EQ(zero[1], 0.0f);
}

// ---------------------------------------------------- axpy, normalize

// y_ij = float(y_ij + (alpha s_i) x_ij), in float64.
float axpy_of(float y, double alpha, float s, float x) {
  const double a = alpha * double(s);
  return static_cast<float>(double(y) + a * double(x));
}

TEST_F(ComputeEntries, AxpyWithAndWithoutScalars) {
  Matrix x(40, 6, 1, 4), y(40, 6, 2, 5);
  const ddp_vectors xv = x.column_vectors(), yv = y.column_vectors();
  const std::vector<float> y0 = y.data;
  ASSERT_EQ(h->axpy(h->ctx, 0.25, &xv, nullptr, &yv, compute), DDP_OK) << take_plugin_error();
  for (size_t i = 0; i < xv.count; ++i)
    for (size_t j = 0; j < xv.length; ++j)
      ASSERT_TRUE(same_bits(at(yv, i, j), axpy_of(y0[j * y.ld + i], 0.25, 1.0f, at(xv, i, j)))) << i << "," << j;
  for (size_t r = 0; r < y.rows; ++r)  // the padding column is not a vector's
    EXPECT_TRUE(same_bits(y.data[r * y.ld + 6], y0[r * y.ld + 6]));

  const std::vector<float> y1 = y.data;
  const std::vector<float> scalars = {0.5f, -2.0f, 0.0f, 3.0f, 1e-3f, -0.75f};
  ASSERT_EQ(h->axpy(h->ctx, -1.5, &xv, scalars.data(), &yv, compute), DDP_OK) << take_plugin_error();
  for (size_t i = 0; i < xv.count; ++i)
    for (size_t j = 0; j < xv.length; ++j)
      ASSERT_TRUE(same_bits(at(yv, i, j), axpy_of(y1[j * y.ld + i], -1.5, scalars[i], at(xv, i, j))))
          << i << "," << j;
}

// Gram-Schmidt as PowerSGD runs it, all enqueued on one stream: each column
// normalized, then its projection (a dot's out, the axpy's scalars, read
// when the axpy runs) taken off the later columns. The result is
// orthonormal.
TEST_F(ComputeEntries, GramSchmidtThroughDotAxpyNormalize) {
  Matrix p(500, 4, 0, 6);
  void* mem = nullptr;  // the projections: device memory, as a strategy's would be
  ASSERT_EQ(h->alloc(h->ctx, p.cols * sizeof(float), DDP_MEM_COMM_BUFFERS, &mem), DDP_OK);
  float* proj = static_cast<float*>(mem);
  for (size_t i = 0; i < p.cols; ++i) {
    ddp_vectors col{p.data.data() + i, p.rows, p.ld, 1, 1};
    ASSERT_EQ(h->normalize(h->ctx, &col, 0.0, compute), DDP_OK) << take_plugin_error();
    if (i + 1 == p.cols) break;
    // The later columns, and as many copies of column i (stride 0: read only).
    ddp_vectors rest{p.data.data() + i + 1, p.rows, p.ld, p.cols - i - 1, 1};
    ddp_vectors same{p.data.data() + i, p.rows, p.ld, p.cols - i - 1, 0};
    ASSERT_EQ(h->dot(h->ctx, &same, &rest, proj, compute), DDP_OK) << take_plugin_error();
    ASSERT_EQ(h->axpy(h->ctx, -1.0, &same, proj, &rest, compute), DDP_OK) << take_plugin_error();
  }
  for (size_t i = 0; i < p.cols; ++i)
    for (size_t j = 0; j <= i; ++j) {
      double d = 0;
      for (size_t r = 0; r < p.rows; ++r) d += double(p.data[r * p.ld + i]) * p.data[r * p.ld + j];
      EXPECT_NEAR(d, i == j ? 1.0 : 0.0, 1e-5) << i << "," << j;
    }
  h->free(h->ctx, mem);
}

TEST_F(ComputeEntries, NormalizeWithEpsZeroAndPositive) {
  for (const double eps : {0.0, 0.5}) {
    SCOPED_TRACE("eps " + std::to_string(eps));
    Matrix x(3, 700, 1, 8);
    const std::vector<float> x0 = x.data;
    const ddp_vectors xv = x.row_vectors();
    ASSERT_EQ(h->normalize(h->ctx, &xv, eps, compute), DDP_OK) << take_plugin_error();
    for (size_t i = 0; i < xv.count; ++i) {
      std::vector<double> terms(xv.length);
      for (size_t j = 0; j < xv.length; ++j) terms[j] = double(x0[i * x.ld + j]) * x0[i * x.ld + j];
      const float norm = static_cast<float>(std::sqrt(lane_order_sum(terms)));
      const float divisor = norm + static_cast<float>(eps);
      double squares = 0;
      for (size_t j = 0; j < xv.length; ++j) {
        ASSERT_TRUE(same_bits(at(xv, i, j), x0[i * x.ld + j] / divisor)) << i << "," << j;
        squares += double(at(xv, i, j)) * at(xv, i, j);
      }
      const double want = double(norm) / (double(norm) + eps);  // 1 for eps 0
      EXPECT_NEAR(std::sqrt(squares), want, 1e-6) << i;
      EXPECT_TRUE(same_bits(x.data[i * x.ld + 700], x0[i * x.ld + 700]));  // padding
    }
  }
}

// As torch's `col /= norm + eps`: 0 / 0 with eps 0, 0 / eps otherwise.
TEST_F(ComputeEntries, NormalizeOfAZeroVector) {
  std::vector<float> zero(10, 0.0f);
  const ddp_vectors v{zero.data(), 10, 1, 1, 10};
  ASSERT_EQ(h->normalize(h->ctx, &v, 0.0, compute), DDP_OK);
  for (float e : zero) EXPECT_TRUE(std::isnan(e));
  std::fill(zero.begin(), zero.end(), 0.0f);
  ASSERT_EQ(h->normalize(h->ctx, &v, 1e-8, compute), DDP_OK);
  for (float e : zero) EXPECT_EQ(e, 0.0f);
}

// ------------------------------------------------------------ streams

// On the comm stream (an executor thread) the work waits its turn: behind a
// host function that holds the stream, nothing has run; released, the gemm,
// then a copy of its C, then norms of the copy, then an axpy that reads
// them run in that order, the same bits as on the compute stream.
TEST_F(ComputeEntries, CommStreamWorkCompletesInOrderWithACopyAfterIt) {
  GemmData d = gemm_data(96, 80, 112, 3, 0, 1, 0, 31);
  GemmData inline_d = d;  // the same inputs, for the compute stream
  inline_d.g.a = inline_d.a.data();
  inline_d.g.b = inline_d.b.data();
  inline_d.g.c = inline_d.c.data();
  std::vector<float> copied(d.c.size(), kNaN);
  std::vector<float> norms(3 * 96, kNaN);
  std::atomic<bool> open{false};
  const ddp_host_func gate = [](void* user, int) {
    while (!static_cast<std::atomic<bool>*>(user)->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return DDP_OK;
  };
  ASSERT_EQ(h->launch_host_func(h->ctx, comm, gate, &open), DDP_OK);
  ASSERT_EQ(h->gemm(h->ctx, &d.g, comm), DDP_OK);
  ASSERT_EQ(h->copy(h->ctx, copied.data(), d.c.data(), d.c.size() * sizeof(float), comm), DDP_OK);
  const ddp_vectors c_rows{copied.data(), 80, 1, 96, 80};  // one product's rows (products are m ldc + 7 apart)
  for (size_t p = 0; p < 3; ++p) {
    ddp_vectors batch_rows = c_rows;
    batch_rows.ptr = copied.data() + p * d.g.stride_c;
    ASSERT_EQ(h->norm(h->ctx, &batch_rows, norms.data() + p * 96, comm), DDP_OK);
  }
  // Then each of the first product's row norms into y, as an axpy's scalars
  // (read when the axpy runs, not when it is enqueued: still NaN then).
  std::vector<float> ones(96, 1.0f), y(96, 0.0f);
  const ddp_vectors one_each{ones.data(), 1, 1, 96, 1}, y_each{y.data(), 1, 1, 96, 1};
  ASSERT_EQ(h->axpy(h->ctx, 1.0, &one_each, norms.data(), &y_each, comm), DDP_OK);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(same_bits(d.c, inline_d.c));  // the stream is held: nothing ran
  EXPECT_TRUE(std::isnan(copied[0]));
  EXPECT_TRUE(std::isnan(norms[0]));
  EXPECT_EQ(y[0], 0.0f);
  open = true;
  drain_comm();
  EXPECT_TRUE(same_bits(y, std::vector<float>(norms.begin(), norms.begin() + 96)));

  ASSERT_EQ(h->gemm(h->ctx, &inline_d.g, compute), DDP_OK);
  EXPECT_TRUE(same_bits(d.c, inline_d.c));
  EXPECT_TRUE(same_bits(copied, inline_d.c));  // the copy ran after the gemm
  for (size_t p = 0; p < 3; ++p)
    for (size_t i = 0; i < 96; ++i) {
      std::vector<double> terms(80);
      for (size_t j = 0; j < 80; ++j) {
        const double e = inline_d.c[c_index(d.g, p, i, j)];
        terms[j] = e * e;
      }
      ASSERT_TRUE(same_bits(norms[p * 96 + i], static_cast<float>(std::sqrt(lane_order_sum(terms))))) << p << "," << i;
    }
}

// ----------------------------------------------------------- refusals

// The status and error text of a call that must fail.
template <typename Call>
std::pair<ddp_status, std::string> refusal(Call&& call) {
  const ddp_status status = call();
  return {status, status == DDP_OK ? std::string("(accepted)") : take_plugin_error()};
}

using Refused = std::pair<ddp_status, std::string>;
Refused invalid(const std::string& text) { return {DDP_ERR_INVALID_ARGUMENT, text}; }

TEST_F(ComputeEntries, GemmRefusals) {
  GemmData d = gemm_data(4, 5, 6, 2, 0, 0, 0, 41);
  const std::vector<float> before = d.c;
  auto with = [&](auto change) {
    ddp_gemm g = d.g;
    change(g);
    return refusal([&] { return h->gemm(h->ctx, &g, compute); });
  };
  const std::string size = std::to_string(sizeof(ddp_gemm));
  EXPECT_EQ(refusal([&] { return h->gemm(h->ctx, nullptr, compute); }), invalid("gemm: NULL ddp_gemm"));
  EXPECT_EQ(with([](ddp_gemm& g) { g.struct_size = 8; }),
            invalid("gemm: struct_size 8 is less than ABI 1.9's ddp_gemm (" + size +
                    " bytes): set it to sizeof(ddp_gemm)"));
  EXPECT_EQ(with([](ddp_gemm& g) { g.struct_size = sizeof(ddp_gemm) - 1; }),
            invalid("gemm: struct_size " + std::to_string(sizeof(ddp_gemm) - 1) + " is less than ABI 1.9's ddp_gemm (" +
                    size + " bytes): set it to sizeof(ddp_gemm)"));
  EXPECT_EQ(with([](ddp_gemm& g) { g.trans_a = 2; }), invalid("gemm: trans_a is 2 (0 or 1)"));
  EXPECT_EQ(with([](ddp_gemm& g) { g.trans_b = -1; }), invalid("gemm: trans_b is -1 (0 or 1)"));
  EXPECT_EQ(with([](ddp_gemm& g) { g.batch = 0; }), invalid("gemm: batch is 0 (at least 1 product)"));
  EXPECT_EQ(with([](ddp_gemm& g) { g.a = nullptr; }), invalid("gemm: a is NULL"));
  EXPECT_EQ(with([](ddp_gemm& g) { g.b = nullptr; }), invalid("gemm: b is NULL"));
  EXPECT_EQ(with([](ddp_gemm& g) { g.c = nullptr; }), invalid("gemm: c is NULL"));
  EXPECT_EQ(with([](ddp_gemm& g) { g.lda = 5; }),
            invalid("gemm: lda 5 is less than a row of A (6 elements: k, as trans_a is 0)"));
  EXPECT_EQ(with([](ddp_gemm& g) {
              g.trans_a = 1;
              g.lda = 3;
            }),
            invalid("gemm: lda 3 is less than a row of A (4 elements: m, as trans_a is 1)"));
  EXPECT_EQ(with([](ddp_gemm& g) { g.ldb = 4; }),
            invalid("gemm: ldb 4 is less than a row of B (5 elements: n, as trans_b is 0)"));
  EXPECT_EQ(with([](ddp_gemm& g) {
              g.trans_b = 1;
              g.ldb = 5;
            }),
            invalid("gemm: ldb 5 is less than a row of B (6 elements: k, as trans_b is 1)"));
  EXPECT_EQ(with([](ddp_gemm& g) { g.ldc = 4; }), invalid("gemm: ldc 4 is less than a row of C (5 elements: n)"));
  EXPECT_EQ(with([](ddp_gemm& g) { g.stride_c = 19; }),
            invalid("gemm: stride_c 19 is less than one C (20 elements from its first to its last): the products "
                    "would write over each other"));
  EXPECT_EQ(with([](ddp_gemm& g) {
              g.m = size_t(1) << 31;
              g.batch = 1;  // (with 2 its C would first be found to overlap the next)
            }),
            invalid("gemm: m 2147483648 is beyond the int range BLAS takes (at most 2147483647)"));
  EXPECT_EQ(with([](ddp_gemm& g) { g.batch = size_t(1) << 32; }),
            invalid("gemm: batch 4294967296 is beyond the int range BLAS takes (at most 2147483647)"));
  EXPECT_EQ(refusal([&] { return h->gemm(h->ctx, &d.g, nullptr); }), invalid("gemm: NULL stream"));
  EXPECT_TRUE(same_bits(d.c, before));  // nothing ran
  // A product that overlaps nothing (stride_c 0 with one product) is fine.
  d.g.batch = 1;
  d.g.stride_c = 0;
  EXPECT_EQ(h->gemm(h->ctx, &d.g, compute), DDP_OK) << take_plugin_error();
}

// An output may share no element with what the entry reads (the header's
// rule): refused by name, nothing run. Columns of one matrix whose elements
// differ (Gram-Schmidt's column i against the ones after it) are apart.
TEST_F(ComputeEntries, AnOutputOverlappingAnOperandIsRefused) {
  std::vector<float> mem(64, 1.0f);
  const std::vector<float> before = mem;
  const ddp_vectors x{mem.data(), 4, 1, 2, 4}, y{mem.data() + 4, 4, 1, 2, 4};  // x's second vector is y's first
  float* inside_x = mem.data() + 2;
  EXPECT_EQ(refusal([&] { return h->norm(h->ctx, &x, inside_x, compute); }),
            invalid("norm: out overlaps x: an entry's output may share no element with what it reads"));
  EXPECT_EQ(refusal([&] { return h->dot(h->ctx, &x, &x, inside_x, compute); }),
            invalid("dot: out overlaps x: an entry's output may share no element with what it reads"));
  EXPECT_EQ(refusal([&] { return h->axpy(h->ctx, 1.0, &x, nullptr, &y, compute); }),
            invalid("axpy: y overlaps x: an entry's output may share no element with what it reads"));
  EXPECT_EQ(refusal([&] { return h->axpy(h->ctx, 1.0, &x, mem.data() + 9, &y, compute); }),
            invalid("axpy: y overlaps x: an entry's output may share no element with what it reads"));
  const ddp_vectors far{mem.data() + 32, 4, 1, 2, 4};
  EXPECT_EQ(refusal([&] { return h->axpy(h->ctx, 1.0, &x, mem.data() + 33, &far, compute); }),
            invalid("axpy: y overlaps scalars: an entry's output may share no element with what it reads"));
  EXPECT_EQ(refusal([&] { return h->axpy(h->ctx, std::nan(""), &x, nullptr, &far, compute); }),
            invalid("axpy: alpha is not a finite number"));
  ddp_gemm g = plugin::Host::gemm_desc();
  g.m = g.n = g.k = 2, g.alpha = 1.0, g.a = mem.data(), g.lda = 2, g.b = mem.data() + 8, g.ldb = 2;
  g.c = mem.data() + 2, g.ldc = 2;  // C's first row is A's second
  EXPECT_EQ(refusal([&] { return h->gemm(h->ctx, &g, compute); }),
            invalid("gemm: c overlaps a: an entry's output may share no element with what it reads"));
  g.c = mem.data() + 16, g.beta = std::numeric_limits<double>::infinity();
  EXPECT_EQ(refusal([&] { return h->gemm(h->ctx, &g, compute); }), invalid("gemm: alpha and beta are finite numbers"));
  EXPECT_TRUE(same_bits(mem, before));  // nothing ran
  // A matrix [4, 3] of columns: column 0 against columns 1 and 2 (inc 3),
  // and column 1 of a batch of two against their column 2: apart.
  const ddp_vectors col0{mem.data(), 4, 3, 2, 0}, rest{mem.data() + 1, 4, 3, 2, 1};
  EXPECT_EQ(h->axpy(h->ctx, -1.0, &col0, nullptr, &rest, compute), DDP_OK) << take_plugin_error();
  const ddp_vectors ones{mem.data() + 1, 4, 3, 2, 12}, twos{mem.data() + 2, 4, 3, 2, 12};
  EXPECT_EQ(h->axpy(h->ctx, -1.0, &ones, nullptr, &twos, compute), DDP_OK) << take_plugin_error();
}

TEST_F(ComputeEntries, VectorRefusals) {
  std::vector<float> mem(64, 1.0f), out(8, kNaN);
  const std::vector<float> before = mem;
  const ddp_vectors x{mem.data(), 4, 1, 2, 4}, y{mem.data() + 16, 4, 1, 2, 4};
  ddp_vectors no_ptr = x, three = y, five = y, flat = x, shared = y;
  no_ptr.ptr = nullptr;
  three.count = 3;
  five.length = 5;
  flat.inc = 0;
  shared.stride = 2;  // vector 1 starts inside vector 0
  EXPECT_EQ(refusal([&] { return h->dot(h->ctx, nullptr, &y, out.data(), compute); }), invalid("dot: x is NULL"));
  EXPECT_EQ(refusal([&] { return h->dot(h->ctx, &x, nullptr, out.data(), compute); }), invalid("dot: y is NULL"));
  EXPECT_EQ(refusal([&] { return h->dot(h->ctx, &no_ptr, &y, out.data(), compute); }),
            invalid("dot: x's ptr is NULL"));
  EXPECT_EQ(refusal([&] { return h->dot(h->ctx, &x, &three, out.data(), compute); }),
            invalid("dot: x holds 2 vectors and y 3: the counts must be equal"));
  EXPECT_EQ(refusal([&] { return h->dot(h->ctx, &x, &five, out.data(), compute); }),
            invalid("dot: x's vectors hold 4 elements and y's 5: the lengths must be equal"));
  EXPECT_EQ(refusal([&] { return h->dot(h->ctx, &x, &y, nullptr, compute); }), invalid("dot: out is NULL"));
  EXPECT_EQ(refusal([&] { return h->dot(h->ctx, &flat, &y, out.data(), compute); }),
            invalid("dot: x's inc is 0, which makes its 4 elements one (1 for a row of a matrix, the row length "
                    "for a column)"));
  EXPECT_EQ(refusal([&] { return h->dot(h->ctx, &x, &y, out.data(), nullptr); }), invalid("dot: NULL stream"));
  EXPECT_EQ(refusal([&] { return h->norm(h->ctx, nullptr, out.data(), compute); }), invalid("norm: x is NULL"));
  EXPECT_EQ(refusal([&] { return h->norm(h->ctx, &x, nullptr, compute); }), invalid("norm: out is NULL"));
  EXPECT_EQ(refusal([&] { return h->axpy(h->ctx, 1.0, &x, nullptr, &three, compute); }),
            invalid("axpy: x holds 2 vectors and y 3: the counts must be equal"));
  EXPECT_EQ(refusal([&] { return h->axpy(h->ctx, 1.0, &x, nullptr, &shared, compute); }),
            invalid("axpy: y's vectors overlap (2 of 4 elements, inc 1, stride 2): the vectors an entry writes may "
                    "share no element"));
  EXPECT_EQ(refusal([&] { return h->axpy(h->ctx, 1.0, &x, nullptr, &no_ptr, compute); }),
            invalid("axpy: y's ptr is NULL"));
  EXPECT_EQ(refusal([&] { return h->normalize(h->ctx, &shared, 0.0, compute); }),
            invalid("normalize: x's vectors overlap (2 of 4 elements, inc 1, stride 2): the vectors an entry writes "
                    "may share no element"));
  EXPECT_EQ(refusal([&] { return h->normalize(h->ctx, &x, -1.0, compute); }),
            invalid("normalize: eps -1 is not a finite number >= 0"));
  EXPECT_EQ(refusal([&] { return h->normalize(h->ctx, &x, std::nan(""), compute); }),
            invalid("normalize: eps nan is not a finite number >= 0"));
  EXPECT_TRUE(same_bits(mem, before));  // nothing ran
  EXPECT_TRUE(std::isnan(out[0]));
  // Read-only operands may overlap themselves (dot's x, stride 0), and x and
  // y of dot may be the same vectors.
  ddp_vectors repeated = x;
  repeated.stride = 0;
  EXPECT_EQ(h->dot(h->ctx, &repeated, &x, out.data(), compute), DDP_OK) << take_plugin_error();
  EXPECT_EQ(out[0], 4.0f);
  EXPECT_EQ(out[1], 4.0f);
}

// Inside a host function on a device stream (a CUDA stream's callback
// thread, here a stream with a device's interface) every compute entry is
// refused by name, with copy's words, and nothing runs.
TEST_F(ComputeEntries, RefusedInsideAHostFunctionOnADeviceStream) {
  test::DeviceLikeStream device_stream("device");
  const ddp_stream s = reinterpret_cast<ddp_stream>(&device_stream);
  GemmData d = gemm_data(2, 2, 2, 1, 0, 0, 0, 51);
  const std::vector<float> before = d.c;
  std::vector<float> mem(8, 1.0f), out(2, kNaN);
  const ddp_vectors x{mem.data(), 4, 1, 2, 4};
  std::vector<std::pair<std::string, Refused>> got;
  std::string copy_text;
  device_stream.enqueue([&](bool) {
    got.emplace_back("gemm", refusal([&] { return h->gemm(h->ctx, &d.g, s); }));
    got.emplace_back("dot", refusal([&] { return h->dot(h->ctx, &x, &x, out.data(), s); }));
    got.emplace_back("norm", refusal([&] { return h->norm(h->ctx, &x, out.data(), s); }));
    got.emplace_back("axpy", refusal([&] { return h->axpy(h->ctx, 1.0, &x, nullptr, &x, s); }));
    got.emplace_back("normalize", refusal([&] { return h->normalize(h->ctx, &x, 0.0, s); }));
    copy_text = refusal([&] { return h->copy(h->ctx, out.data(), mem.data(), 4, s); }).second;
  });
  device_stream.synchronize();
  const std::string words = ": not allowed inside a host function on a device stream (CUDA allows no CUDA calls "
                            "there, and none may block): call it at enqueue time, on the calling thread";
  EXPECT_EQ(copy_text, "copy" + words);  // the same words as the host's other entries
  ASSERT_EQ(got.size(), 5u);
  for (const auto& [entry, outcome] : got) EXPECT_EQ(outcome, Refused(DDP_ERR_UNSUPPORTED, entry + words));
  EXPECT_TRUE(same_bits(d.c, before));
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_EQ(mem[0], 1.0f);
}

// -------------------------------------------------------- plugin.hpp

TEST_F(ComputeEntries, PluginHppWrappers) {
  const plugin::Host host(h);
  // C[2, 3] = A[2, 4] B[4, 3] through the wrappers' descriptor.
  std::vector<float> a = random_floats(8, 61), b = random_floats(12, 62), c(6, kNaN);
  ddp_gemm g = plugin::Host::gemm_desc();
  EXPECT_EQ(g.struct_size, sizeof(ddp_gemm));
  g.m = 2;
  g.n = 3;
  g.k = 4;
  g.a = a.data();
  g.lda = 4;
  g.b = b.data();
  g.ldb = 3;
  g.c = c.data();
  g.ldc = 3;
  host.gemm(g, host.compute_stream());
  for (size_t i = 0; i < 2; ++i)
    for (size_t j = 0; j < 3; ++j) {
      double want = 0;
      for (size_t q = 0; q < 4; ++q) want += double(a[i * 4 + q]) * b[q * 3 + j];
      EXPECT_NEAR(c[i * 3 + j], want, 1e-6) << i << "," << j;
    }
  // rows_of and columns_of of C, and the other four.
  const ddp_vectors rows = plugin::Host::rows_of(c.data(), 2, 3, 3);
  const ddp_vectors cols = plugin::Host::columns_of(c.data(), 2, 3, 3);
  EXPECT_EQ(rows.count, 2u);
  EXPECT_EQ(rows.length, 3u);
  EXPECT_EQ(rows.stride, 3u);
  EXPECT_EQ(cols.count, 3u);
  EXPECT_EQ(cols.length, 2u);
  EXPECT_EQ(cols.inc, 3u);
  EXPECT_EQ(cols.stride, 1u);
  float norms[3] = {}, dots[3] = {};
  host.norm(cols, norms, host.compute_stream());
  host.dot(cols, cols, dots, host.compute_stream());
  for (size_t j = 0; j < 3; ++j) {
    EXPECT_NEAR(norms[j], std::hypot(c[j], c[3 + j]), 1e-6);
    EXPECT_NEAR(dots[j], double(c[j]) * c[j] + double(c[3 + j]) * c[3 + j], 1e-6);
  }
  host.normalize(cols, 0.0, host.compute_stream());
  for (size_t j = 0; j < 3; ++j) EXPECT_NEAR(std::hypot(c[j], c[3 + j]), 1.0, 1e-6) << j;
  std::vector<float> d(6, 1.0f);
  host.axpy(2.0, rows, nullptr, plugin::Host::rows_of(d.data(), 2, 3, 3), host.compute_stream());
  for (size_t e = 0; e < 6; ++e) EXPECT_FLOAT_EQ(d[e], 1.0f + 2.0f * c[e]) << e;
  // A refusal throws the host's text, already set.
  g.batch = 0;
  try {
    host.gemm(g, host.compute_stream());
    ADD_FAILURE() << "batch 0 was accepted";
  } catch (const plugin::Failure& f) {
    EXPECT_EQ(f.status(), DDP_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(f.text_is_set());
    EXPECT_EQ(take_plugin_error(), "gemm: batch is 0 (at least 1 product)");
  }
}

// An engine older than 1.9 hands a shorter ddp_host: every wrapper refuses
// by name instead of calling past its end.
TEST_F(ComputeEntries, PluginHppRefusesOnAnOlderEngine) {
  ddp_host old = *h;
  old.abi_version = (1u << 16) | 8u;
  old.struct_size = static_cast<uint32_t>(offsetof(ddp_host, gemm));
  const plugin::Host host(&old);
  std::vector<float> mem(4, 1.0f);
  const ddp_vectors v{mem.data(), 4, 1, 1, 4};
  float out = 0;
  const std::vector<std::pair<std::string, std::function<void()>>> calls = {
      {"gemm", [&] { host.gemm(plugin::Host::gemm_desc(), compute); }},
      {"dot", [&] { host.dot(v, v, &out, compute); }},
      {"norm", [&] { host.norm(v, &out, compute); }},
      {"axpy", [&] { host.axpy(1.0, v, nullptr, v, compute); }},
      {"normalize", [&] { host.normalize(v, 0.0, compute); }},
  };
  for (const auto& [entry, call] : calls) {
    try {
      call();
      ADD_FAILURE() << entry << " was called";
    } catch (const plugin::Failure& f) {
      EXPECT_EQ(f.status(), DDP_ERR_UNSUPPORTED);
      EXPECT_EQ(std::string(f.what()), entry + ": this engine's ABI 1.8 lacks it (it needs ABI 1.9 or newer)");
    }
  }
  EXPECT_EQ(mem[0], 1.0f);
  // The engine itself offers all five.
  EXPECT_TRUE(DDP_HOST_HAS(h, gemm) && DDP_HOST_HAS(h, dot) && DDP_HOST_HAS(h, norm) && DDP_HOST_HAS(h, axpy) &&
              DDP_HOST_HAS(h, normalize));
}

}  // namespace
}  // namespace ddp
