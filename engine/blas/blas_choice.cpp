// blas_choice.cpp — blas_choice.h: the candidates probed in child
// processes, the cache.
#include "blas_choice.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <optional>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "atomic_file.h"
#include "blas_info.h"
#include "blas_kernels.h"
#include "env.h"
#include "error.h"
#include "signal_name.h"

namespace ddp {

using json = nlohmann::json;

json BlasChoice::json() const { return {{"kernel", kernel}, {"source", source}, {"timings_s", timings}}; }

std::string blas_cache_path() {
  namespace fs = std::filesystem;
  if (!env().cache_dir.empty()) return (fs::path(env().cache_dir) / "blas-kernel.json").string();
  if (const char* x = env().get("XDG_CACHE_HOME"); x && *x) return (fs::path(x) / "ddp" / "blas-kernel.json").string();
  const char* home = env().get("HOME");
  return (fs::path(home && *home ? home : "/tmp") / ".cache" / "ddp" / "blas-kernel.json").string();
}

std::string blas_machine_key() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  std::string model = "unknown CPU";
  while (std::getline(cpuinfo, line))
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  return model + " | " + blas_build();
}

namespace {

// An entry as this program writes it. Anything else (a hand edit, another
// version's format) is no choice: measured over, and then replaced.
bool usable(const json& entry) {
  return entry.is_object() && entry.contains("kernel") && entry["kernel"].is_string() &&
         !entry["kernel"].get<std::string>().empty() && (!entry.contains("gflop") || entry["gflop"].is_number()) &&
         (!entry.contains("timings_s") || entry["timings_s"].is_object());
}

json read_cache() {
  std::ifstream in(blas_cache_path());
  if (!in) return json::object();
  json doc = json::parse(in, nullptr, false);
  return doc.is_object() ? doc : json::object();
}

// The stop signals that reached this process while a probe ran: the probe
// is stopped, and the run with it.
// The stop signal that came while a probe ran (0: none). A handler, not a
// blocked mask: a signal sent to the process may land on any of its
// threads (OpenBLAS's own among them), and a thread that does not block it
// would take the default action, the launcher's silent death.
volatile sig_atomic_t g_stop = 0;
void on_stop(int sig) { g_stop = sig; }

// SIGINT, SIGTERM and SIGHUP caught for the scope's life, then as before.
struct StopSignals {
  struct sigaction old[3]{};
  static constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGHUP};
  StopSignals() {
    g_stop = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    for (int k = 0; k < 3; ++k) sigaction(kSignals[k], &sa, &old[k]);
  }
  ~StopSignals() {
    for (int k = 0; k < 3; ++k) sigaction(kSignals[k], &old[k], nullptr);
  }
};

// One candidate's probe in a child process of its own process group: its
// standard output, or nullopt where it failed, died or ran past 120 s.
// SIGINT, SIGTERM and SIGHUP are caught while it runs; one that comes stops
// the probe and throws, naming it.
std::optional<std::string> run_child(const std::string& exe, const std::vector<std::string>& args,
                                     const std::string& kernel) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return std::nullopt;
  const StopSignals caught;
  std::vector<char*> argv{const_cast<char*>(exe.c_str())};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // a launcher killed outright takes its probe with it
    const int null = open("/dev/null", O_WRONLY);
    dup2(out[1], 1);
    dup2(null, 2);
    if (kernel == "default")
      unsetenv("OPENBLAS_CORETYPE");
    else
      setenv("OPENBLAS_CORETYPE", kernel.c_str(), 1);
    execv(exe.c_str(), argv.data());  // (exec restores the caught signals' default actions)
    _exit(127);
  }
  if (pid > 0) setpgid(pid, pid);  // either side may set it first
  close(out[1]);
  std::string text;
  bool late = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (pid > 0) {
    if (g_stop != 0 || (late = std::chrono::steady_clock::now() > deadline)) break;
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buf[4096];
    const ssize_t n = read(out[0], buf, sizeof buf);
    if (n == 0 || (n < 0 && errno != EINTR)) break;
    if (n > 0) text.append(buf, size_t(n));
  }
  const int sig = g_stop;
  int status = 0;
  if (pid > 0 && (sig > 0 || late)) {
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
  }
  if (pid > 0)
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  close(out[0]);
  if (sig > 0)
    throw Error(std::string("interrupted by ") + signal_name(sig) + " while choosing the BLAS kernel: the probe of " +
                    kernel + " was stopped, and no rank started",
                DDP_ERR_INTERNAL);
  if (pid <= 0 || late || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  return text;
}

// One candidate's probe: its JSON ("seconds", or an "error": out of
// memory), or null if it died, timed out or printed something else.
json run_probe(const std::string& exe, const std::string& kernel, const std::vector<GemmShape>& shapes, int threads) {
  const std::optional<std::string> out = run_child(
      exe, {"blas-probe", "--repeats", "2", "--threads", std::to_string(threads), "--shapes", format_shapes(shapes)},
      kernel);
  if (!out) return nullptr;
  json doc = json::parse(*out, nullptr, false);
  return doc.is_object() && (doc.contains("seconds") || doc.contains("error")) ? doc : json(nullptr);
}

double gflop(const std::vector<GemmShape>& shapes) {
  double flop = 0.0;
  for (const GemmShape& s : shapes) flop += 2.0 * double(s.m) * double(s.k) * double(s.n);
  return flop / 1e9;
}

// Case-insensitive: OpenBLAS names its loaded kernel "Haswell", "SkylakeX", ...
bool same_name(const std::string& a, const std::string& b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) { return std::tolower(x) == std::tolower(y); });
}

// Every candidate, in rounds that rotate their order (so that whatever else
// runs on the machine meets them alike), each kept at its best round. A
// candidate is dropped for good when its probe dies (not for this CPU),
// its results are wrong, or OpenBLAS loaded another kernel instead (or the
// one it picks by itself: measured as "default").
BlasChoice measure(const std::vector<GemmShape>& shapes, const std::string& exe, int threads) {
  if (const std::string problem =
          probe_memory_problem(shapes, int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGESIZE)));
      !problem.empty())
    throw Error("BLAS kernel: " + problem);
  std::cerr << "ddp: choosing the BLAS kernel: timing the model's GEMMs with each, once for this machine ("
            << blas_cache_path() << ")" << std::endl;
  constexpr int kRounds = 3;
  std::vector<std::string> alive = {"default"};
  alive.insert(alive.end(), blas_kernel_candidates().begin(), blas_kernel_candidates().end());
  std::string default_core;
  std::string out_of_memory;
  BlasChoice best{"", "measured"};
  const auto began = std::chrono::steady_clock::now();
  for (int round = 0; round < kRounds; ++round) {
    const std::vector<std::string> order = alive;
    for (size_t i = 0; i < order.size(); ++i) {
      const std::string& k = order[(i + size_t(round)) % order.size()];
      if (std::chrono::steady_clock::now() - began > std::chrono::seconds(2))  // a long one: say where it is
        std::cerr << "BLAS kernel: probing " << k << " (" << i + 1 << " of " << order.size() << ", round " << round + 1
                  << " of " << kRounds << ")..." << std::endl;
      const json r = run_probe(exe, k, shapes, threads);
      if (r.is_object() && r.contains("error")) out_of_memory = r["error"].get<std::string>();
      const std::string core = r.is_object() ? r.value("corename", "") : "";
      if (k == "default" && round == 0) default_core = core;
      const bool same_as_default = k != "default" && same_name(core, default_core);
      if (r.is_null() || !r.value("ok", false) || (k != "default" && !same_name(core, k)) || same_as_default) {
        alive.erase(std::find(alive.begin(), alive.end(), k));
        continue;
      }
      const double s = r["seconds"].get<double>();
      if (!best.timings.contains(k) || s < best.timings[k].get<double>()) best.timings[k] = s;
    }
  }
  double best_s = INFINITY;
  for (const auto& [k, s] : best.timings.items())
    if (s.get<double>() < best_s) {
      best_s = s.get<double>();
      best.kernel = k;
    }
  if (best.kernel.empty() && !out_of_memory.empty())
    throw Error("BLAS kernel: the probe ran out of memory (" + out_of_memory +
                    "): the model's GEMMs need more "
                    "memory than this host gives, whatever the kernel",
                DDP_ERR_OUT_OF_MEMORY);
  if (best.kernel.empty())
    throw Error("BLAS kernel: no candidate ran the model's GEMMs correctly (OpenBLAS " + blas_build() +
                "); set OPENBLAS_CORETYPE or run.blas_kernel");
  return best;
}

}  // namespace

namespace {

// OpenBLAS reads kernel names in any case.
std::string lowercase(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

}  // namespace

std::string probe_memory_problem(const std::vector<GemmShape>& shapes, int64_t memory_bytes) {
  for (const GemmShape& g : shapes) {
    const double bytes = 4.0 * (double(g.m) * double(g.k) + double(g.k) * double(g.n) + double(g.m) * double(g.n));
    if (memory_bytes > 0 && bytes > double(memory_bytes)) {
      char text[128];
      std::snprintf(text, sizeof text, "%.1f GB for its three matrices, more than this host's %.1f GB", bytes / 1e9,
                    double(memory_bytes) / 1e9);
      return "the model's GEMM " + format_shapes({g}) + " needs " + text +
             " of memory: the model does not fit this host, whatever the kernel (run.check_memory = false skipped "
             "the fit check that says so)";
    }
  }
  return "";
}

std::string missing_cpu_feature(const std::string& kernel, const std::function<bool(const std::string&)>& supports) {
  // What OpenBLAS's own dispatch (driver/others/dynamic.c) checks for each.
  static const std::pair<const char*, std::vector<std::string>> needs[] = {
      {"sandybridge", {"avx"}},
      {"haswell", {"avx2", "fma"}},
      {"zen", {"avx2", "fma"}},
      {"skylakex", {"avx512f", "avx512bw"}},
      {"cooperlake", {"avx512f", "avx512bw", "avx512bf16"}}};
  const std::string name = lowercase(kernel);
  for (const auto& [k, features] : needs)
    if (name == k)
      for (const std::string& f : features)
        if (!supports(f)) return f;
  return "";
}

namespace {

bool cpu_supports(const std::string& feature) {
  __builtin_cpu_init();
  if (feature == "avx") return __builtin_cpu_supports("avx");
  if (feature == "avx2") return __builtin_cpu_supports("avx2");
  if (feature == "fma") return __builtin_cpu_supports("fma");
  if (feature == "avx512f") return __builtin_cpu_supports("avx512f");
  if (feature == "avx512bw") return __builtin_cpu_supports("avx512bw");
  return feature == "avx512bf16" && __builtin_cpu_supports("avx512bf16");
}

// A kernel given by the user, refused where this CPU cannot run it.
BlasChoice given_kernel(const std::string& kernel, const std::string& source, const std::string& where) {
  if (const std::string lacks = missing_cpu_feature(kernel, cpu_supports); !lacks.empty())
    throw Error(where + " needs the CPU feature " + lacks +
                    ", which this CPU lacks (its GEMMs would die of an "
                    "illegal instruction): remove it, or name a kernel this CPU runs",
                DDP_ERR_INVALID_ARGUMENT);
  return {kernel, source};
}

}  // namespace

BlasChoice choose_blas_kernel(const std::string& setting, const std::vector<GemmShape>& shapes, const std::string& exe,
                              int threads) {
  if (const char* env = ddp::env().get("OPENBLAS_CORETYPE"); env && *env) {
    const std::string where = std::string("OPENBLAS_CORETYPE=") + env + " in the environment";
    BlasChoice given = given_kernel(env, "environment", where);
    // This process's OpenBLAS read the variable as it loaded: a name it does
    // not know (a typo) leaves its own pick, which the ranks would get too.
    if (lowercase(env) != lowercase(blas_kernel_loaded()))
      throw Error(where + " is not a kernel this OpenBLAS (" + blas_build() + ") knows: it loaded " +
                      blas_kernel_loaded() + " instead; name one it has, or unset it",
                  DDP_ERR_INVALID_ARGUMENT);
    return given;
  }
  if (setting != "auto") return given_kernel(setting, "config", "run.blas_kernel = \"" + setting + "\"");
  const std::string key = blas_machine_key();
  const std::string model =
      format_shapes(shapes) + " on " + std::to_string(threads) + (threads == 1 ? " thread" : " threads");
  json cache = read_cache();
  if (!cache[key].is_object()) cache[key] = json::object();
  const json& known = cache[key];
  if (known.contains(model) && usable(known[model]))
    return {known[model]["kernel"].get<std::string>(), "cache", known[model].value("timings_s", json::object())};
  BlasChoice choice = measure(shapes, exe, threads);
  cache[key][model] = {{"kernel", choice.kernel}, {"timings_s", choice.timings}, {"gflop", gflop(shapes)}};
  try {
    std::filesystem::create_directories(std::filesystem::path(blas_cache_path()).parent_path());
    write_file_atomically(blas_cache_path(), cache.dump(2) + "\n");
  } catch (const std::exception&) {  // no cache where it cannot be written: measure next time too
  }
  return choice;
}

void apply_cached_blas_kernel(char** argv) {
  if (env().get("OPENBLAS_CORETYPE") || env().blas_choice) return;
  const json cache = read_cache();
  const std::string key = blas_machine_key();
  if (!cache.contains(key) || !cache[key].is_object()) return;
  // The shapes of this run are not known yet: the choice measured on the
  // most work, the likeliest to hold for a real model.
  const json* best = nullptr;
  for (const auto& [shapes, entry] : cache[key].items())
    if (usable(entry) && (!best || entry.value("gflop", 0.0) > best->value("gflop", 0.0))) best = &entry;
  if (!best) return;
  const std::string kernel = best->value("kernel", "");
  BlasChoice choice{kernel, "cache", best->value("timings_s", json::object())};
  setenv("DDP_BLAS_CHOICE", choice.json().dump().c_str(), 1);
  if (kernel.empty() || kernel == "default") return;
  setenv("OPENBLAS_CORETYPE", kernel.c_str(), 1);
  execv("/proc/self/exe", argv);  // returns only on failure: go on with OpenBLAS's own pick
}

}  // namespace ddp
