// ddp/overhead_model.hpp — the communication-overhead model of CS336
// assignment 2's ddp_bucketed_benchmarking (b), as pure functions: an
// optional, header-only C++17 helper for plugin authors (no ABI: nothing
// here crosses it, and it needs nothing but the standard library).
// Strategy plugins use it for `bucket_mb = "auto"`, `ddp bench-comm` and
// `ddp plan` for its fit, tests on synthetic timings.
//
// An all-reduce of b bytes per rank takes t(b) = o + b / w: o is the fixed
// cost of one call (seconds), w the algorithm bandwidth (bytes per second,
// per-rank bytes / time, as nccl-tests' algbw).
//
// DDP with n_b equal buckets of a model of s bytes, assuming that computing
// a bucket's gradients takes as long as moving its bytes, c = s / (n_b w):
// bucket k is final at k·c; its all-reduce starts when it is final and the
// previous one has ended, and lasts o + c, so the all-reduces fall o
// further behind with each bucket: the k-th ends at (k + 1)·c + k·o, the
// last at (n_b + 1)·c + n_b·o, while backward ends at n_b·c:
//   overhead(n_b) = n_b·o + s / (n_b·w)          (time after backward)
// It is smallest at n_b* = sqrt(s / (w·o)), i.e. buckets of
//   b* = s / n_b* = sqrt(s·w·o),   overhead(n_b*) = 2·sqrt(s·o / w).
// (docs/benchmarks.md, "Communication overhead model", says the same in prose.)
//
// Not here: measuring (a strategy's own probes, `ddp bench-comm`).
// auto_probe_sizes, at the end, is what bucket_cap.h measures.
#ifndef DDP_OVERHEAD_MODEL_HPP
#define DDP_OVERHEAD_MODEL_HPP

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <vector>

namespace ddp {
namespace strategy {

// One measured all-reduce: per-rank buffer bytes and seconds.
struct CommTiming {
  double bytes;
  double seconds;
};

struct OverheadFit {
  double o_s;            // per-call overhead, seconds (may come out <= 0: none measurable)
  double w_bytes_per_s;  // algorithm bandwidth, bytes/s (+inf: no size dependence measurable)
};

// Least squares of t = o + bytes / w over the timings, with residuals
// relative to t: minimises sum(((o + b_i / w) - t_i) / t_i)^2, so a 1 MB
// point weighs as much as a 1 GB one (plain residuals would let the noise
// of the largest size decide o). Exact timings give o and w back exactly.
// Throws std::invalid_argument without two distinct sizes or with a time
// that is not a finite number > 0.
inline OverheadFit fit_overhead(const std::vector<CommTiming>& timings) {
  double largest = 0;
  double smallest = std::numeric_limits<double>::infinity();
  for (const CommTiming& t : timings) {
    if (!(t.seconds > 0) || !std::isfinite(t.seconds) || !(t.bytes >= 0) || !std::isfinite(t.bytes))
      throw std::invalid_argument("overhead fit: every timing needs bytes >= 0 and seconds > 0, finite");
    largest = std::max(largest, t.bytes);
    smallest = std::min(smallest, t.bytes);
  }
  if (timings.empty() || !(largest > smallest))
    throw std::invalid_argument("overhead fit: needs timings of at least two different sizes");
  // Columns a = 1/t and x·a (x = bytes / largest, for conditioning), target 1.
  double saa = 0;
  double sax = 0;
  double sxx = 0;
  double ra = 0;
  double rx = 0;
  for (const CommTiming& t : timings) {
    const double a = 1.0 / t.seconds;
    const double x = t.bytes / largest;
    saa += a * a;
    sax += a * a * x;
    sxx += a * a * x * x;
    ra += a;
    rx += a * x;
  }
  const double det = saa * sxx - sax * sax;
  const double o = (ra * sxx - rx * sax) / det;
  const double v = (saa * rx - sax * ra) / det / largest;  // seconds per byte
  return OverheadFit{o, v > 0 ? 1.0 / v : std::numeric_limits<double>::infinity()};
}

// Time after backward for a model of s bytes in n_b buckets (see above).
inline double predicted_overhead_s(const OverheadFit& fit, double model_bytes, double buckets) {
  return buckets * fit.o_s + model_bytes / (buckets * fit.w_bytes_per_s);
}

// n_b* = sqrt(s / (w·o)), at least 1 (+inf when o <= 0: every call is free).
inline double optimal_bucket_count(const OverheadFit& fit, double model_bytes) {
  if (!(fit.o_s > 0)) return std::numeric_limits<double>::infinity();
  return std::max(1.0, std::sqrt(model_bytes / (fit.w_bytes_per_s * fit.o_s)));
}

// b* = s / n_b* = sqrt(s·w·o), at most s (one bucket), 0 when o <= 0.
inline double optimal_bucket_bytes(const OverheadFit& fit, double model_bytes) {
  return model_bytes / optimal_bucket_count(fit, model_bytes);
}

// The all-reduce sizes (bytes, whole floats) that `bucket_mb = "auto"`
// measures for a model of s bytes: s clamped to [4 MiB, 64 MiB], and that
// divided by 8 and by 64 — three sizes a factor 8 apart around the buckets
// the model can choose (sqrt(s·w·o) lies between them for this machine's o
// and w), whatever s is; at most 64 MiB, so the probe stays well under a
// second.
inline std::vector<size_t> auto_probe_sizes(size_t model_bytes) {
  const size_t large = std::clamp<size_t>(model_bytes, size_t(4) << 20, size_t(64) << 20) / 4 * 4;
  return {large / 64 / 4 * 4, large / 8 / 4 * 4, large};
}

}  // namespace strategy
}  // namespace ddp

#endif  // DDP_OVERHEAD_MODEL_HPP
