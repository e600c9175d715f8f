// config_fuzz.cpp — libFuzzer target: the config reader (TOML++ and every
// check behind load_config) on arbitrary bytes. A line "%%" splits the
// input: what follows, line by line, are --set overrides. The only
// acceptable outcome besides a config is ddp::Error (a message naming the
// file or key); anything else — a crash, a sanitizer report, another
// exception escaping — is a finding.
#include <string>
#include <vector>

#include "config.h"
#include "error.h"
#include "memfile.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find("\n%%\n");
  std::vector<std::string> overrides;
  if (split != std::string::npos) {
    size_t at = split + 4;
    while (at <= input.size()) {
      size_t end = input.find('\n', at);
      if (end == std::string::npos) end = input.size();
      overrides.push_back(input.substr(at, end - at));
      at = end + 1;
    }
  }
  const std::string text = input.substr(0, split);
  MemFile file(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  try {
    ddp::load_config(file.path(), overrides);
  } catch (const ddp::Error&) {
  }
  return 0;
}
