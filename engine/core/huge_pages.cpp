// huge_pages.cpp — see huge_pages.h.
#include "huge_pages.h"

#include <sys/auxv.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "env.h"

namespace ddp {
namespace {

constexpr const char* kHugetlb = "glibc.malloc.hugetlb";
constexpr const char* kRestartMark = "DDP_HUGE_PAGES_RESTARTED";
constexpr size_t kMaxArgString = 32 * 4096;  // Linux's MAX_ARG_STRLEN

bool g_asked = false;                         // ask_for_huge_pages ran
std::optional<std::string> g_value_at_start;  // glibc.malloc.hugetlb as this process started
std::optional<std::string> g_value_now;       // ... as the processes this one starts get it
bool g_restarted = false;                     // this process is restart_with_huge_pages's

std::string read_text(const char* path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return in ? text.str() : std::string();
}

}  // namespace

std::optional<std::string> malloc_hugetlb_value(const char* tunables) {
  // GLIBC_TUNABLES is name=value pairs separated by ':'.
  std::stringstream pairs(tunables ? tunables : "");
  std::string pair;
  std::optional<std::string> value;
  while (std::getline(pairs, pair, ':')) {
    const size_t eq = pair.find('=');
    if (eq != std::string::npos && pair.compare(0, eq, kHugetlb) == 0) value = pair.substr(eq + 1);
  }
  return value;
}

std::optional<std::string> with_huge_pages_tunable(const char* tunables, const char* ddp_huge_pages) {
  if (!ddp_huge_pages || std::string(ddp_huge_pages) != "1") return std::nullopt;  // off by default
  if (malloc_hugetlb_value(tunables)) return std::nullopt;
  const std::string current = tunables ? tunables : "";
  std::string out = (current.empty() ? "" : current + ":") + kHugetlb + "=1";
  if (std::string("GLIBC_TUNABLES=").size() + out.size() + 1 > kMaxArgString) return std::nullopt;
  return out;
}

void ask_for_huge_pages() {
  const char* tunables = env().get("GLIBC_TUNABLES");
  g_asked = true;
  g_value_at_start = malloc_hugetlb_value(tunables);
  g_value_now = g_value_at_start;
  g_restarted = env().huge_pages_restarted;  // kRestartMark
  unsetenv(kRestartMark);
  const char* ddp_huge_pages = env().get("DDP_HUGE_PAGES");
  if (const auto wanted = with_huge_pages_tunable(tunables, ddp_huge_pages)) {
    setenv("GLIBC_TUNABLES", wanted->c_str(), 1);  // for the processes this one starts
    g_value_now = malloc_hugetlb_value(wanted->c_str());
  }
}

void restart_with_huge_pages(char** argv) {
  const auto now = g_asked ? g_value_now : malloc_hugetlb_value(env().get("GLIBC_TUNABLES"));
  if (g_value_at_start || g_restarted || !now) return;
  // Run through ld.so by hand (no interpreter in the auxiliary vector),
  // /proc/self/exe is ld.so; under valgrind it is valgrind's tool.
  const char* preload = env().get("LD_PRELOAD");
  if (getauxval(AT_BASE) == 0 || (preload && std::string(preload).find("vgpreload") != std::string::npos)) return;
  setenv(kRestartMark, "1", 1);
  execv("/proc/self/exe", argv);
  unsetenv(kRestartMark);  // execv failed
}

std::string thp_mode(const std::string& enabled_text) {
  const size_t open = enabled_text.find('[');
  const size_t close = enabled_text.find(']', open);
  if (open == std::string::npos || close == std::string::npos) return "";
  return enabled_text.substr(open + 1, close - open - 1);
}

int64_t anon_huge_bytes(const std::string& smaps_rollup_text) {
  std::istringstream lines(smaps_rollup_text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("AnonHugePages:", 0) != 0) continue;
    std::istringstream fields(line.substr(14));
    int64_t kb = -1;
    std::string unit;
    if (fields >> kb >> unit && unit == "kB") return kb * 1024;
    return -1;
  }
  return -1;
}

HugePages huge_pages_now() {
  HugePages h;
  const auto value = g_asked ? g_value_at_start : malloc_hugetlb_value(env().get("GLIBC_TUNABLES"));
  h.malloc_hugetlb = value.value_or("");
  h.thp_mode = thp_mode(read_text("/sys/kernel/mm/transparent_hugepage/enabled"));
  if (h.thp_mode.empty()) h.thp_mode = "unavailable";
  h.anon_huge_bytes = anon_huge_bytes(read_text("/proc/self/smaps_rollup"));
  return h;
}

}  // namespace ddp
