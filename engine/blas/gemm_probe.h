// gemm_probe.h — the GEMMs a model's step runs, and timing them with the
// BLAS kernel this process loaded (`ddp blas-probe`, run once per
// candidate kernel by blas_choice.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model.h"

namespace ddp {

// One cblas_sgemm: C[m, n] = A[m, k] B[k, n] (row-major, no transposes:
// the kernel's speed at these sizes is what is being measured).
struct GemmShape {
  int64_t m = 0;
  int64_t k = 0;
  int64_t n = 0;
  bool operator==(const GemmShape& o) const { return m == o.m && k == o.k && n == o.n; }
};

// The weight GEMMs of one step of the model, `rows` rows per micro-batch:
// for every weight matrix [out, in] with M = rows x tokens per row, the
// forward (M x in x out), the input gradient (M x out x in) and the weight
// gradient (out x M x in); each shape once, in first-use order. Pure.
std::vector<GemmShape> model_gemm_shapes(const Footprint& model, int64_t rows);

// "1024x256x256,..." and back. parse_shapes throws Error for text that is
// not such a list of positive sizes.
std::string format_shapes(const std::vector<GemmShape>& shapes);
std::vector<GemmShape> parse_shapes(const std::string& text);

// In this process, on `threads` BLAS threads (the run's run.threads): each
// shape's best time of `repeats` (after one warm-up)
// on random inputs, and 64 sampled entries of each result against a
// double-precision dot product (relative error, over the row's scale).
// {"corename", "config", "seconds" (sum of the best times), "gflops",
//  "worst_error", "ok" (worst_error < 1e-4)}.
nlohmann::json probe_gemms(const std::vector<GemmShape>& shapes, int repeats, int threads);

}  // namespace ddp
