// fit_check.cpp — see fit_check.h.
#include "fit_check.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "config_plan.h"
#include "error.h"
#include "registry.h"

namespace ddp {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return in ? std::string(std::istreambuf_iterator<char>(in), {}) : std::string();
}

// A byte count as cgroups write it; -1 for "max", a limit of 2^62 or more
// (v1's "none"), or anything that is not a number.
int64_t cgroup_bytes(const std::string& text) {
  const size_t end = text.find_last_not_of(" \n");
  const std::string t = end == std::string::npos ? "" : text.substr(0, end + 1);
  if (t.empty() || t.size() > 19 || t.find_first_not_of("0123456789") != std::string::npos) return -1;
  const int64_t v = std::stoll(t);
  return v >= (int64_t{1} << 62) ? -1 : v;
}

std::string gb(int64_t bytes) {
  char out[32];
  std::snprintf(out, sizeof out, "%.1f GB", double(bytes) / 1e9);
  return out;
}

int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

std::vector<int64_t> peaks_of(const Config& c) {
  const plan::RunPlan p = [&] {
    try {
      return plan_config(c, config_footprint(c));
    } catch (const std::invalid_argument& e) {
      throw Error(c.file + ": " + e.what(), DDP_ERR_INVALID_ARGUMENT);
    }
  }();
  std::vector<int64_t> peaks;
  for (const plan::RankMemory& m : p.ranks) peaks.push_back(peak_bytes(m));
  return peaks;
}

}  // namespace

HostMemory host_memory_from(const std::string& meminfo, const std::string& cgroup_limit,
                            const std::string& cgroup_usage) {
  HostMemory host;
  std::istringstream lines(meminfo);
  std::string key;
  int64_t kb = 0;
  while (lines >> key >> kb) {
    if (key == "MemAvailable:") host = {kb * 1024, "MemAvailable"};
    lines.ignore(256, '\n');
  }
  const int64_t limit = cgroup_bytes(cgroup_limit), usage = cgroup_bytes(cgroup_usage);
  if (limit >= 0 && usage >= 0 && (host.bytes < 0 || limit - usage < host.bytes))
    host = {std::max<int64_t>(limit - usage, 0), "the cgroup's limit less its usage"};
  return host;
}

HostMemory host_memory() {
  const std::string v2 = "/sys/fs/cgroup/memory.", v1 = "/sys/fs/cgroup/memory/memory.";
  std::string limit = read_text(v2 + "max"), usage = read_text(v2 + "current");
  if (limit.empty()) limit = read_text(v1 + "limit_in_bytes"), usage = read_text(v1 + "usage_in_bytes");
  return host_memory_from(read_text("/proc/meminfo"), limit, usage);
}

int64_t peak_bytes(const plan::RankMemory& m) {
  int64_t most = 0;
  for (const plan::Bytes* b : {&m.after_setup, &m.before_optimizer_step, &m.after_optimizer_step})
    most = std::max(most, std::accumulate(b->begin(), b->end(), int64_t{0}));
  return most;
}

std::string fit_shortfall(const std::vector<int64_t>& peaks, const HostMemory& host) {
  const int64_t need = sum(peaks);
  if (host.bytes < 0 || need <= host.bytes || peaks.empty()) return "";
  const int64_t most = *std::max_element(peaks.begin(), peaks.end());
  const bool same = std::all_of(peaks.begin(), peaks.end(), [&](int64_t p) { return p == most; });
  const std::string ranks = std::to_string(peaks.size()) + (peaks.size() == 1 ? " rank" : " ranks");
  return "needs " + gb(need) + " (" + (same ? gb(most) + " × " + ranks : ranks + ", up to " + gb(most) + " each") +
         "), " + gb(host.bytes) + " available (" + host.source + ")";
}

std::string fit_refusal(const Config& c, const HostMemory& host) {
  const ModelInfo* model = find_model(c.model.name);  // a model without a footprint cannot be planned
  if (c.run.device != DDP_DEVICE_CPU || host.bytes < 0 || !model || !model->footprint) return "";
  const std::string shortfall = fit_shortfall(peaks_of(c), host);
  if (shortfall.empty()) return "";
  std::string instead = "; no smaller run.world_size fits either: a strategy that shards more, or a smaller model";
  // The largest few world sizes below (each plan costs time in its ranks).
  for (int w = c.run.world_size - 1, tried = 0; w >= 1 && tried < 8; --w) {
    if (c.data.batch_size % w != 0) continue;
    ++tried;
    Config fewer = c;
    fewer.run.world_size = w;
    const std::vector<int64_t> peaks = peaks_of(fewer);
    if (fit_shortfall(peaks, host).empty()) {
      instead = "; run.world_size = " + std::to_string(w) + " needs " + gb(sum(peaks));
      break;
    }
  }
  return c.file + ": the run does not fit this host's memory: it " + shortfall + instead +
         " (run.check_memory = false runs it anyway)";
}

}  // namespace ddp
