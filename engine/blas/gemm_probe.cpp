// gemm_probe.cpp — gemm_probe.h over OpenBLAS's cblas_sgemm.
#include "gemm_probe.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <sstream>

#include "blas_info.h"
#include "error.h"

namespace ddp {

std::vector<GemmShape> model_gemm_shapes(const Footprint& f, int64_t rows) {
  const int64_t m = rows * std::max<int64_t>(1, f.data.context);
  std::vector<GemmShape> shapes;
  auto add = [&](GemmShape s) {
    if (std::find(shapes.begin(), shapes.end(), s) == shapes.end()) shapes.push_back(s);
  };
  for (const ParamSize& p : f.params) {
    if (p.shape.size() != 2) continue;
    const int64_t out = p.shape[0];
    const int64_t in = p.shape[1];
    add({m, in, out});
    add({m, out, in});
    add({out, m, in});
  }
  return shapes;
}

std::string format_shapes(const std::vector<GemmShape>& shapes) {
  std::string text;
  for (const GemmShape& s : shapes)
    text += (text.empty() ? "" : ",") + std::to_string(s.m) + "x" + std::to_string(s.k) + "x" + std::to_string(s.n);
  return text;
}

std::vector<GemmShape> parse_shapes(const std::string& text) {
  std::vector<GemmShape> shapes;
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    GemmShape s;
    char x1 = 0;
    char x2 = 0;
    std::istringstream one(item);
    if (!(one >> s.m >> x1 >> s.k >> x2 >> s.n) || x1 != 'x' || x2 != 'x' || !one.eof() || s.m < 1 || s.k < 1 ||
        s.n < 1 || s.m > (1 << 20) || s.k > (1 << 20) || s.n > (1 << 20))
      throw Error("GEMM shape '" + item + "': expected MxKxN, each between 1 and 2^20");
    shapes.push_back(s);
  }
  if (shapes.empty() || text.back() == ',') throw Error("GEMM shapes '" + text + "': expected MxKxN,...");
  return shapes;
}

namespace {

// Best time of `repeats` runs of one GEMM, and the worst relative error
// of 64 sampled entries.
std::pair<double, double> time_one(const GemmShape& s, int repeats, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> a(static_cast<size_t>(s.m * s.k));
  std::vector<float> b(static_cast<size_t>(s.k * s.n));
  std::vector<float> c(static_cast<size_t>(s.m * s.n));
  for (float& v : a) v = dist(rng);
  for (float& v : b) v = dist(rng);
  const auto blas_int = [](int64_t v) { return static_cast<blasint>(v); };
  double best = INFINITY;
  for (int r = 0; r <= repeats; ++r) {  // the first is a warm-up
    const auto begin = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_int(s.m), blas_int(s.n), blas_int(s.k), 1.0f, a.data(),
                blas_int(s.k), b.data(), blas_int(s.n), 0.0f, c.data(), blas_int(s.n));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    if (r > 0) best = std::min(best, seconds);
  }
  double worst = 0.0;
  std::uniform_int_distribution<int64_t> row(0, s.m - 1);
  std::uniform_int_distribution<int64_t> col(0, s.n - 1);
  for (int i = 0; i < 64; ++i) {
    const int64_t r = row(rng);
    const int64_t q = col(rng);
    double exact = 0.0;
    double scale = 0.0;
    for (int64_t j = 0; j < s.k; ++j) {
      const double term = double(a[size_t(r * s.k + j)]) * double(b[size_t(j * s.n + q)]);
      exact += term;
      scale += std::abs(term);
    }
    const double err = std::abs(double(c[size_t(r * s.n + q)]) - exact) / std::max(scale, 1e-30);
    worst = std::isnan(err) ? INFINITY : std::max(worst, err);
  }
  return {best, worst};
}

}  // namespace

nlohmann::json probe_gemms(const std::vector<GemmShape>& shapes, int repeats, int threads) {
  set_blas_threads(threads);
  std::mt19937 rng(7);
  double seconds = 0.0;
  double flop = 0.0;
  double worst = 0.0;
  for (const GemmShape& s : shapes) {
    std::pair<double, double> timed;
    try {
      timed = time_one(s, std::max(1, repeats), rng);
    } catch (const std::bad_alloc&) {  // said, with its size, to the launcher (blas_choice.cpp)
      const double bytes = 4.0 * (double(s.m) * double(s.k) + double(s.k) * double(s.n) + double(s.m) * double(s.n));
      return {{"error", "out of memory allocating " + std::to_string(int64_t(bytes)) + " bytes for the GEMM " +
                            format_shapes({s})},
              {"ok", false}};
    }
    const auto [best, err] = timed;
    seconds += best;
    flop += 2.0 * double(s.m) * double(s.k) * double(s.n);
    worst = std::max(worst, err);
  }
  return {{"corename", openblas_get_corename()},
          {"config", openblas_get_config()},
          {"seconds", seconds},
          {"gflops", flop / seconds / 1e9},
          {"worst_error", worst},
          {"ok", worst < 1e-4}};
}

}  // namespace ddp
