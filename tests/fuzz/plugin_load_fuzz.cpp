// plugin_load_fuzz.cpp — a real plugin (tests/plugins/strategy_valid.c,
// built) with bytes changed in place, its size kept: the corruption the
// ELF extent check cannot see. The input is a list of patches of 3 bytes
// each: an offset (2 bytes, little-endian, modulo the file's size) and the
// byte written there. Loaded as the launcher loads plugins (in a child,
// bounded: engine/core/isolated.h), it loads, is refused by name, or its
// child's end is named; the fuzzing process itself never goes down, and
// nothing but ddp::Error comes back.
#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>

#include "error.h"
#include "isolated.h"
#include "memfile.h"
#include "plugin_loader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string plugin = [] {
    std::ifstream in(DDP_FUZZ_PLUGIN, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  if (plugin.empty()) std::abort();
  std::string bytes = plugin;
  for (size_t at = 0; at + 3 <= size; at += 3)
    bytes[(data[at] | size_t(data[at + 1]) << 8) % bytes.size()] = char(data[at + 2]);
  MemFile file(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  try {
    ddp::run_isolated("", std::chrono::milliseconds(2000), [&] {
      return std::string(ddp::load_plugin(ddp::PluginKind::Strategy, file.path())->strategy()->name);
    });
  } catch (const ddp::Error&) {
  }
  return 0;
}
