// replica_check.cpp — see replica_check.h.
#include "replica_check.h"

#include <cmath>
#include <cstring>

namespace ddp {
namespace {

constexpr uint64_t kPrime = 0x9e3779b97f4a7c15ull;  // 2^64 / golden ratio, odd

uint64_t mix(uint64_t h, uint64_t w) {
  h ^= w;
  h *= kPrime;
  return h ^ (h >> 29);
}

// Both float32 halves of a word have an exponent of all ones (inf or nan)?
bool all_ones_exponent(uint64_t w) {
  return (w & 0x7f800000ull) == 0x7f800000ull || (w & 0x7f80000000000000ull) == 0x7f80000000000000ull;
}

}  // namespace

Digest digest(const float* data, size_t count) {
  // Four independent lanes over 64-bit words, so the multiplies overlap.
  uint64_t lane[4] = {1, 2, 3, 4};
  bool bad = false;
  const size_t words = count / 2;
  size_t i = 0;
  for (; i + 4 <= words; i += 4) {
    uint64_t w[4];
    std::memcpy(w, data + 2 * i, sizeof w);
    for (int k = 0; k < 4; ++k) {
      lane[k] = mix(lane[k], w[k]);
      bad |= all_ones_exponent(w[k]);
    }
  }
  for (; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, data + 2 * i, sizeof w);
    lane[0] = mix(lane[0], w);
    bad |= all_ones_exponent(w);
  }
  if (count % 2) {
    uint32_t last;
    std::memcpy(&last, data + count - 1, sizeof last);
    lane[1] = mix(lane[1], last);
    bad |= (last & 0x7f800000u) == 0x7f800000u;
  }
  uint64_t h = count;
  for (uint64_t l : lane) h = mix(h, l);
  return Digest{h, !bad};
}

std::string first_divergence(const std::vector<std::string>& names, const std::vector<int64_t>& all, int world,
                             int64_t step) {
  const size_t n = names.size();
  for (size_t p = 0; p < n; ++p) {
    std::string ranks;
    int count = 0;
    for (int r = 1; r < world; ++r) {
      if (all[size_t(r) * n + p] == all[p]) continue;
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      ++count;
    }
    if (count == 0) continue;
    const std::string when = step >= 0 ? "after step " + std::to_string(step + 1) : "at the end of the run";
    return "the replicas differ " + when + ": parameter '" + names[p] + "' of rank" + (count > 1 ? "s " : " ") + ranks +
           " differs from rank 0's (a strategy that reduced the wrong buffers or skipped one, or a transport "
           "whose results are not the same on every rank; run.debug_collectives = true compares every collective "
           "across ranks)";
  }
  return "";
}

// run.check_finite: a loss that is not a number stops the run; the first
// parameter that is not finite either says where it came from.
std::string non_finite_loss(double loss, const std::vector<std::string>& names,
                            const std::vector<std::vector<float>>* values) {
  std::string text = "the loss is " + std::string(std::isnan(loss) ? "nan" : "inf") + "; ";
  if (!values)
    return text +
           "the strategy holds the parameters' values, so they were not searched (run.check_finite = "
           "false lets the run go on)";
  for (size_t p = 0; p < values->size() && p < names.size(); ++p) {
    const std::vector<float>& v = (*values)[p];
    for (size_t i = 0; i < v.size(); ++i)
      if (!std::isfinite(v[i]))
        return text + "the first parameter that is not finite is '" + names[p] + "' (element " + std::to_string(i) +
               " is " + std::to_string(v[i]) + ") (run.check_finite = false lets the run go on)";
  }
  return text +
         "every parameter is finite: the data or the forward pass made it (run.check_finite = false "
         "lets the run go on)";
}

}  // namespace ddp
