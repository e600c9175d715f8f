// compute.cpp — the CPU's Compute (compute.h): cblas_sgemm per product of
// a batch, and float64 loops in the fixed order of kComputeLanes for dot,
// norm and normalize; each call one task on its stream, which reads its
// operands when it runs (a dot's out, enqueued before, is an axpy's
// scalars). And make_compute, the choice by device.
//
// Built with -ffp-contract=off (engine/models/CMakeLists.txt): a product and a sum
// stay two roundings whether or not the CPU has FMA, as the CUDA kernels
// (cuda/cuda_compute.cu) compute them with explicit _rn intrinsics, so that
// both devices give the same bits for dot, norm, axpy and normalize.
#include "compute.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "error.h"
#include "stream.h"
#if DDP_WITH_CUDA
#include "cuda/cuda_compute.h"
#endif

namespace ddp {
namespace {

// The sum of term(j) for j < length, in the order compute.h defines: lane l
// takes j = l, l + kComputeLanes, ... in turn, then a tree over the lanes.
template <typename Term>
double lane_sum(size_t length, const Term& term) {
  double lanes[kComputeLanes] = {};
  for (size_t base = 0; base < length; base += kComputeLanes) {
    const size_t width = std::min(kComputeLanes, length - base);
    for (size_t l = 0; l < width; ++l) lanes[l] += term(base + l);
  }
  for (size_t half = kComputeLanes / 2; half > 0; half /= 2)
    for (size_t l = 0; l < half; ++l) lanes[l] += lanes[l + half];
  return lanes[0];
}

// Vector i of v (its element j at [j * v.inc]).
float* vector_of(const ddp_vectors& v, size_t i) { return v.ptr + i * v.stride; }

double squares(const ddp_vectors& x, size_t i) {
  const float* xi = vector_of(x, i);
  return lane_sum(x.length, [&](size_t j) {
    const double e = xi[j * x.inc];
    return e * e;
  });
}

// A leading dimension as cblas takes it: at least 1 (a row of 0 elements,
// k = 0, may have come with ld 0; OpenBLAS refuses that even then).
blasint lead(size_t ld) { return static_cast<blasint>(std::max<size_t>(ld, 1)); }

class CpuCompute final : public Compute {
 public:
  void gemm(const ddp_gemm& g, Stream& stream) override {
    stream.enqueue([g](bool cancelled) {
      if (cancelled || g.m == 0 || g.n == 0) return;
      const CBLAS_TRANSPOSE ta = g.trans_a ? CblasTrans : CblasNoTrans;
      const CBLAS_TRANSPOSE tb = g.trans_b ? CblasTrans : CblasNoTrans;
      const auto alpha = static_cast<float>(g.alpha);
      const auto beta = static_cast<float>(g.beta);
      for (size_t p = 0; p < g.batch; ++p)
        cblas_sgemm(CblasRowMajor, ta, tb, static_cast<blasint>(g.m), static_cast<blasint>(g.n),
                    static_cast<blasint>(g.k), alpha, g.a + p * g.stride_a, lead(g.lda), g.b + p * g.stride_b,
                    lead(g.ldb), beta, g.c + p * g.stride_c, lead(g.ldc));
    });
  }

  void dot(const ddp_vectors& x, const ddp_vectors& y, float* out, Stream& stream) override {
    stream.enqueue([x, y, out](bool cancelled) {
      if (cancelled) return;
      for (size_t i = 0; i < x.count; ++i) {
        const float* xi = vector_of(x, i);
        const float* yi = vector_of(y, i);
        // A float product is exact in float64: only the sum rounds.
        out[i] = static_cast<float>(lane_sum(x.length, [&](size_t j) {
          return static_cast<double>(xi[j * x.inc]) * static_cast<double>(yi[j * y.inc]);
        }));
      }
    });
  }

  void norm(const ddp_vectors& x, float* out, Stream& stream) override {
    stream.enqueue([x, out](bool cancelled) {
      if (cancelled) return;
      for (size_t i = 0; i < x.count; ++i) out[i] = static_cast<float>(std::sqrt(squares(x, i)));
    });
  }

  void axpy(double alpha, const ddp_vectors& x, const float* scalars, const ddp_vectors& y, Stream& stream) override {
    stream.enqueue([alpha, x, scalars, y](bool cancelled) {
      if (cancelled) return;
      for (size_t i = 0; i < x.count; ++i) {
        const double a = alpha * (scalars ? static_cast<double>(scalars[i]) : 1.0);
        const float* xi = vector_of(x, i);
        float* yi = vector_of(y, i);
        for (size_t j = 0; j < x.length; ++j) {
          float& e = yi[j * y.inc];
          e = static_cast<float>(static_cast<double>(e) + a * static_cast<double>(xi[j * x.inc]));
        }
      }
    });
  }

  void normalize(const ddp_vectors& x, double eps, Stream& stream) override {
    const auto e = static_cast<float>(eps);
    stream.enqueue([x, e](bool cancelled) {
      if (cancelled) return;
      for (size_t i = 0; i < x.count; ++i) {
        const float divisor = static_cast<float>(std::sqrt(squares(x, i))) + e;
        float* xi = vector_of(x, i);
        for (size_t j = 0; j < x.length; ++j) xi[j * x.inc] /= divisor;
      }
    });
  }
};

}  // namespace

std::unique_ptr<Compute> make_cpu_compute() { return std::make_unique<CpuCompute>(); }

std::unique_ptr<Compute> make_compute(ddp_device_kind kind) {
  if (kind == DDP_DEVICE_CPU) return make_cpu_compute();
#if DDP_WITH_CUDA
  return make_cuda_compute();
#else
  throw Error(
      "compute on device \"cuda\": this build of ddp has no CUDA (configured without nvcc or with "
      "-DDDP_WITH_CUDA=OFF)",
      DDP_ERR_UNSUPPORTED);
#endif
}

}  // namespace ddp
