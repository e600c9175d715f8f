// huge_pages.cpp — see huge_pages.h.
#include "huge_pages.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace ddp {
namespace {

constexpr const char* kHugetlb = "glibc.malloc.hugetlb";

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
  if (ddp_huge_pages && std::string(ddp_huge_pages) == "0") return std::nullopt;
  if (malloc_hugetlb_value(tunables)) return std::nullopt;
  const std::string current = tunables ? tunables : "";
  return (current.empty() ? "" : current + ":") + kHugetlb + "=1";
}

void restart_with_huge_pages(char** argv) {
  const auto tunables = with_huge_pages_tunable(std::getenv("GLIBC_TUNABLES"), std::getenv("DDP_HUGE_PAGES"));
  if (!tunables || std::getenv("DDP_HUGE_PAGES_RESTARTED")) return;
  setenv("GLIBC_TUNABLES", tunables->c_str(), 1);
  setenv("DDP_HUGE_PAGES_RESTARTED", "1", 1);
  execv("/proc/self/exe", argv);
}

std::string thp_mode(const std::string& enabled_text) {
  const size_t open = enabled_text.find('['), close = enabled_text.find(']', open);
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
  h.malloc_hugetlb = malloc_hugetlb_value(std::getenv("GLIBC_TUNABLES")).value_or("");
  h.thp_mode = thp_mode(read_text("/sys/kernel/mm/transparent_hugepage/enabled"));
  if (h.thp_mode.empty()) h.thp_mode = "unavailable";
  h.anon_huge_bytes = anon_huge_bytes(read_text("/proc/self/smaps_rollup"));
  return h;
}

}  // namespace ddp
