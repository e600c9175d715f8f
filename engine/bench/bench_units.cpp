// bench_units.cpp — the pure functions of bench_comm.h: collective names,
// bus factors, sizes, buffer counts, iteration counts and the aggregation
// of the ranks' times (each with its unit test in bench_comm_test).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "bench_comm.h"
#include "error.h"

namespace ddp {
namespace {

constexpr size_t kFloat = sizeof(float);

}  // namespace

const char* to_string(Collective op) {
  switch (op) {
    case Collective::AllReduce: return "all_reduce";
    case Collective::AllGather: return "all_gather";
    case Collective::ReduceScatter: return "reduce_scatter";
    case Collective::Broadcast: return "broadcast";
  }
  return "?";
}

Collective parse_collective(const std::string& text) {
  for (Collective op : {Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter, Collective::Broadcast})
    if (text == to_string(op)) return op;
  throw Error("--ops: unknown collective '" + text + "' (all_reduce, all_gather, reduce_scatter, broadcast)");
}

double bus_factor(Collective op, int world) {
  const double n = world;
  switch (op) {
    case Collective::AllReduce: return 2.0 * (n - 1) / n;
    case Collective::AllGather:
    case Collective::ReduceScatter: return (n - 1) / n;
    case Collective::Broadcast: return 1.0;
  }
  return 0;
}

size_t parse_size(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  std::string unit;
  for (char c : text.substr(digits)) unit += char(std::toupper(static_cast<unsigned char>(c)));
  const std::vector<std::pair<std::string, size_t>> units = {{"", 1},
                                                             {"B", 1},
                                                             {"K", 1ull << 10},
                                                             {"KB", 1ull << 10},
                                                             {"KIB", 1ull << 10},
                                                             {"M", 1ull << 20},
                                                             {"MB", 1ull << 20},
                                                             {"MIB", 1ull << 20},
                                                             {"G", 1ull << 30},
                                                             {"GB", 1ull << 30},
                                                             {"GIB", 1ull << 30}};
  for (const auto& [name, scale] : units) {
    if (digits == 0 || unit != name || digits > 12) continue;
    const size_t value = std::stoull(text.substr(0, digits)) * scale;
    if (value > 0) return value;
  }
  throw Error("--sizes: '" + text + "' is not a size in bytes > 0 (e.g. 4096, 4KB, 1MB, 1GB)");
}

std::string format_size(size_t bytes) {
  for (const auto& [name, scale] :
       {std::pair<const char*, size_t>{"GB", 1ull << 30}, {"MB", 1ull << 20}, {"KB", 1ull << 10}})
    if (bytes >= scale && bytes % scale == 0) return std::to_string(bytes / scale) + name;
  return std::to_string(bytes) + "B";
}

BufferCounts buffer_counts(Collective op, size_t bytes, int world) {
  const size_t floats = bytes / kFloat;
  const size_t n = size_t(world);
  switch (op) {
    case Collective::AllReduce:
    case Collective::Broadcast: return {floats, floats};
    case Collective::AllGather: return {floats / n, floats / n * n};
    case Collective::ReduceScatter: return {floats / n * n, floats / n};
  }
  return {};
}

int default_iters(size_t bytes) {
  const double per_size = double(2ull << 30) / double(std::max<size_t>(bytes, 1));
  return int(std::clamp(std::round(per_size), 5.0, 50.0));
}

TimeStats aggregate_times(const std::vector<std::vector<double>>& times) {
  if (times.empty() || times[0].empty()) throw Error("bench-comm: no times to aggregate");
  const size_t iters = times[0].size();
  std::vector<double> per_iteration(iters, 0.0);
  for (const auto& rank : times) {
    if (rank.size() != iters) throw Error("bench-comm: ranks timed different numbers of iterations");
    for (size_t i = 0; i < iters; ++i) per_iteration[i] += rank[i] / double(times.size());
  }
  TimeStats stats;
  for (double t : per_iteration) stats.mean_s += t / double(iters);
  std::sort(per_iteration.begin(), per_iteration.end());
  stats.median_s = iters % 2 ? per_iteration[iters / 2] : (per_iteration[iters / 2 - 1] + per_iteration[iters / 2]) / 2;
  return stats;
}

}  // namespace ddp
