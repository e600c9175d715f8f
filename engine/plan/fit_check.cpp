// fit_check.cpp — see fit_check.h.
#include "fit_check.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <numeric>
#include <optional>
#include <sstream>
#include <stdexcept>

#include <sys/resource.h>

#include "config_plan.h"
#include "error.h"
#include "isolated.h"
#include "plugin_loader.h"
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

// "16.7 GB"; under 0.1 GB, in MB ("35.2 MB"), where GB would round to 0.0.
std::string gb(int64_t bytes) {
  char out[32];
  if (bytes < 100000000)
    std::snprintf(out, sizeof out, "%.1f MB", double(bytes) / 1e6);
  else
    std::snprintf(out, sizeof out, "%.1f GB", double(bytes) / 1e9);
  return out;
}

// a + b, or INT64_MAX where that overflows: a plan of a million ranks of
// 2^50 bytes each needs "more than there is", never a wrapped sum.
int64_t add_or_most(int64_t a, int64_t b) {
  int64_t out = 0;
  return __builtin_add_overflow(a, b, &out) ? std::numeric_limits<int64_t>::max() : out;
}
int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}, add_or_most); }

plan::RunPlan plan_of(const Config& c, bool check_keys = true) {
  try {
    return plan_config(c, config_footprint(c), check_keys);
  } catch (const std::invalid_argument& e) {
    throw Error(c.file + ": " + e.what(), DDP_ERR_INVALID_ARGUMENT);
  }
}

std::vector<int64_t> peaks_of(const plan::RunPlan& p) {
  std::vector<int64_t> peaks;
  for (const plan::RankMemory& m : p.ranks) peaks.push_back(peak_bytes(m));
  return peaks;
}

// The run with `sets` ("strategy.<table>.<key>=<value>", ...) added to its
// --set overrides, in place of the user's for the same keys (in either
// table), planned without refusing keys the variant does not read (stage
// 1's `variant` under stage 3); nullopt where it cannot be planned
// (another plugin that refuses a key of this config).
std::optional<plan::RunPlan> plan_with(const Config& c, const std::vector<std::string>& sets) {
  std::vector<std::string> overrides;
  for (const std::string& user : c.overrides) {
    const std::string key = user.substr(0, user.find('='));
    bool replaced = false;
    for (const std::string& set : sets) {
      const std::string mine = set.substr(0, set.find('='));
      const std::string flat = "strategy." + mine.substr(mine.rfind('.') + 1);  // strategy.<key>
      replaced |= key == mine || (mine.rfind("strategy.", 0) == 0 && key == flat);
    }
    if (!replaced) overrides.push_back(user);
  }
  overrides.insert(overrides.end(), sets.begin(), sets.end());
  try {
    return plan_of(load_config(c.file, overrides), /*check_keys=*/false);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

bool fits(const std::optional<plan::RunPlan>& p, const HostMemory& host) {
  return p && fit_shortfall(peaks_of(*p), host).empty();
}
std::string needs(const std::string& what, const plan::RunPlan& p) {
  return "; " + what + " needs " + gb(sum(peaks_of(p)));
}
// A key in the plugin's own table, where a --set of the user's may have put it too (the later wins).
std::string key_of(const std::string& plugin, const std::string& key) {
  return "strategy." + plugin_table_name(plugin) + "." + key;
}

// "; strategy.plugin = "<other>" [with <key> = <value>] needs 18.6 GB"
// where the other plugin fits at its defaults or at a leaner setting; "".
std::string other_that_fits(const Config& c, const PluginInfo& other, const HostMemory& host) {
  const std::string plugin = "strategy.plugin=\"" + other.name + "\"";
  const std::string named = "strategy.plugin = \"" + other.name + "\"";
  const std::optional<plan::RunPlan> p = plan_with(c, {plugin});
  if (!p) return "";
  if (fits(p, host)) return needs(named, *p);
  for (const auto& [key, value] : p->leaner)
    if (const auto q = plan_with(c, {plugin, key_of(other.name, key) + "=" + value}); fits(q, host))
      return needs(named + " with " + key_of(other.name, key) + " = " + value, *q);
  return "";
}

// "; <what> needs 18.6 GB" for the mildest strategy setting that fits: the
// strategy's own leaner settings (ddp_plan::leaner) first, then each other
// strategy plugin of the search path, at its defaults, then at its leaner
// settings; "" where none fits. Each other plugin is asked in a process of
// its own (isolated.h): one whose code exits, crashes or hangs there is
// skipped with a note naming it.
std::string leaner_that_fits(const Config& c, const plan::RunPlan& planned, const HostMemory& host) {
  for (const auto& [key, value] : planned.leaner)
    if (const auto p = plan_with(c, {key_of(c.strategy_plugin, key) + "=" + value}); fits(p, host))
      return needs(key_of(c.strategy_plugin, key) + " = " + value, *p);
  // Each plugin's code gets a quarter of run.timeout_s at most: one that
  // hangs leaves time to the others and to the refusal.
  const auto share = std::chrono::milliseconds(int64_t(c.run.timeout_s * 250));
  const std::vector<PluginInfo> others = describe_plugins(PluginKind::Strategy, default_plugin_dir(), share);
  for (const PluginInfo& other : others)
    if (other.misbehaved) std::cerr << "ddp: note: the fit check's search skipped a plugin: " << other.refusal << "\n";
  for (size_t k = 0; k < others.size(); ++k) {
    const PluginInfo& other = others[k];
    if (!other.refusal.empty() || !other.plans || other.name == c.strategy_plugin || other.path == c.strategy_plugin)
      continue;
    if (isolated_time_left() < share / 4) {
      std::cerr << "ddp: note: the fit check's search stopped within run.timeout_s, before strategy plugin '"
                << other.path << "' and " << others.size() - k - 1 << " more\n";
      break;
    }
    try {
      const std::string found = run_isolated("", share, [&] { return other_that_fits(c, other, host); });
      if (!found.empty()) return found;
    } catch (const Error& e) {
      std::cerr << "ddp: note: the fit check's search skipped a plugin: " << e.what() << "\n";
    }
  }
  return "";
}

// "; run.world_size = 1 needs 17.8 GB" for the largest smaller world size
// that fits (of the 8 largest that divide the batch: each plan costs time
// in its ranks); "" where none does.
std::string world_that_fits(const Config& c, const HostMemory& host) {
  for (int w = c.run.world_size - 1, tried = 0; w >= 1 && tried < 8; --w) {
    if (c.data.batch_size % w != 0) continue;
    ++tried;
    Config fewer = c;
    fewer.run.world_size = w;
    const std::vector<int64_t> peaks = peaks_of(plan_of(fewer));
    if (fit_shortfall(peaks, host).empty())
      return "; run.world_size = " + std::to_string(w) + " needs " + gb(sum(peaks));
  }
  return "";
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
  const int64_t limit = cgroup_bytes(cgroup_limit);
  const int64_t usage = cgroup_bytes(cgroup_usage);
  if (limit >= 0 && usage >= 0 && (host.bytes < 0 || limit - usage < host.bytes))
    host = {std::max<int64_t>(limit - usage, 0), "the cgroup's limit less its usage"};
  return host;
}

HostMemory with_rank_limit(HostMemory host, uint64_t rlimit_as, uint64_t rlimit_data, const std::string& status,
                           const RankExtra& extra) {
  auto status_bytes = [&](const std::string& key) {  // "VmSize:\t  123456 kB", among lines of words ("Name:\tddp")
    std::istringstream lines(status);
    std::string line;
    std::string name;
    int64_t kb = 0;
    while (std::getline(lines, line))
      if (std::istringstream words(line); words >> name >> kb && name == key) return kb * 1024;
    return int64_t{0};
  };
  const struct {
    uint64_t limit;
    int64_t baseline;
    const char* source;
  } limits[] = {{rlimit_as, status_bytes("VmSize:") + extra.as, "RLIMIT_AS (ulimit -v)"},
                {rlimit_data, status_bytes("VmData:") + extra.data, "RLIMIT_DATA (ulimit -d)"}};
  host.rank_resident = status_bytes("RssAnon:") + extra.resident;
  for (const auto& l : limits) {
    if (l.limit == RLIM_INFINITY || l.limit >= (uint64_t{1} << 62)) continue;
    const int64_t limit = int64_t(l.limit);
    const int64_t baseline = l.baseline;
    if (host.rank_limit < 0 || limit - baseline < host.rank_limit - host.rank_baseline) {
      host.rank_limit = limit;
      host.rank_baseline = baseline;
      host.rank_limit_source = l.source;
    }
  }
  return host;
}

HostMemory host_memory() {
  const std::string v2 = "/sys/fs/cgroup/memory.";
  const std::string v1 = "/sys/fs/cgroup/memory/memory.";
  std::string limit = read_text(v2 + "max");
  std::string usage = read_text(v2 + "current");
  if (limit.empty()) {
    limit = read_text(v1 + "limit_in_bytes");
    usage = read_text(v1 + "usage_in_bytes");
  }
  rlimit as{RLIM_INFINITY, RLIM_INFINITY};
  rlimit data{RLIM_INFINITY, RLIM_INFINITY};
  getrlimit(RLIMIT_AS, &as);
  getrlimit(RLIMIT_DATA, &data);
  return with_rank_limit(host_memory_from(read_text("/proc/meminfo"), limit, usage), as.rlim_cur, data.rlim_cur,
                         read_text("/proc/self/status"), kRankExtra);
}

int64_t peak_bytes(const plan::RankMemory& m) {
  int64_t most = 0;
  for (const plan::Bytes* b : {&m.after_setup, &m.before_optimizer_step, &m.after_optimizer_step})
    most = std::max(most, std::accumulate(b->begin(), b->end(), int64_t{0}));
  return most;
}

std::string rank_limit_shortfall(const std::vector<int64_t>& peaks, const HostMemory& host) {
  if (host.rank_limit < 0 || peaks.empty()) return "";
  const int64_t most = *std::max_element(peaks.begin(), peaks.end());
  if (add_or_most(most, host.rank_baseline) <= host.rank_limit) return "";
  return "needs " + gb(add_or_most(most, host.rank_baseline)) + " a rank (" + gb(most) + " planned + " +
         gb(host.rank_baseline) +
         " a rank's process maps before its run's memory: libraries, thread stacks, BLAS buffers), more than " +
         host.rank_limit_source + " allows each process (" + gb(host.rank_limit) + ")";
}

std::string fit_shortfall(const std::vector<int64_t>& peaks, const HostMemory& host) {
  if (std::string over = rank_limit_shortfall(peaks, host); !over.empty()) return over;
  const int64_t need = add_or_most(sum(peaks), int64_t(peaks.size()) * host.rank_resident);
  if (host.bytes < 0 || need <= host.bytes || peaks.empty()) return "";
  const int64_t most = *std::max_element(peaks.begin(), peaks.end()) + host.rank_resident;
  const bool same = std::all_of(peaks.begin(), peaks.end(), [&](int64_t p) { return p + host.rank_resident == most; });
  const std::string ranks = std::to_string(peaks.size()) + (peaks.size() == 1 ? " rank" : " ranks");
  return "needs " + gb(need) + " (" + (same ? gb(most) + " × " + ranks : ranks + ", up to " + gb(most) + " each") +
         "), " + gb(host.bytes) + " available (" + host.source + ")";
}

std::string world_shortfall(int64_t world, const HostMemory& host) {
  HostMemory whole = host;  // the host's memory alone: a limit on each process is the plan's check, not the world's
  whole.rank_limit = -1;
  const std::string shortfall = fit_shortfall(std::vector<int64_t>(size_t(std::max<int64_t>(world, 0)), 0), whole);
  return shortfall.empty() ? "" : std::to_string(world) + " ranks do not fit this host's memory: the run " + shortfall;
}

std::string world_fits_this_host(std::string& world) {
  char* end = nullptr;
  const long long n = std::strtoll(world.c_str(), &end, 10);
  if (world.empty() || *end != '\0' || n < 1 || n > kMaxWorldSize) return "";
  return world_shortfall(n, host_memory());
}

std::string fit_refusal(const Config& c, const HostMemory& host) {
  // Any model, any device: each rank is a process of this host's.
  if (const std::string many = world_shortfall(c.run.world_size, host); !many.empty())
    return c.file + ": " + many + " (run.check_memory = false runs it anyway)";
  const ModelInfo* model = find_model(c.model.name);  // a model without a footprint cannot be planned
  if (c.run.device != DDP_DEVICE_CPU || host.bytes < 0 || !model || !model->footprint) return "";
  const plan::RunPlan planned = plan_of(c);
  const std::string shortfall = fit_shortfall(peaks_of(planned), host);
  if (shortfall.empty()) return "";
  std::string instead = leaner_that_fits(c, planned, host) + world_that_fits(c, host);
  if (instead.empty())
    instead = "; no strategy setting or smaller run.world_size fits: a strategy that shards more, or a smaller model";
  return c.file + ": the run does not fit this host's memory: it " + shortfall + instead +
         " (run.check_memory = false runs it anyway)";
}

}  // namespace ddp
