// endpoints_fuzz.cpp — where the ranks meet (engine/launch/rendezvous.h's
// plan_rendezvous) from arbitrary environments: lines NAME=value, read as
// the rank's environment (DDP_RENDEZVOUS, MASTER_ADDR, MASTER_PORT,
// PMIX_NAMESPACE, the launchers' local sizes...). Anything but a plan or a
// ddp::Error fails.
#include <cstdint>
#include <map>
#include <string>

#include "error.h"
#include "rendezvous.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::map<std::string, std::string> env;
  for (size_t at = 0; at <= input.size();) {
    size_t end = input.find('\n', at);
    if (end == std::string::npos) end = input.size();
    const std::string line = input.substr(at, end - at);
    const size_t eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
    at = end + 1;
  }
  const auto lookup = [&](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  try {
    (void)ddp::plan_rendezvous(lookup, "fuzz", "/tmp");
  } catch (const ddp::Error&) {
  }
  return 0;
}
