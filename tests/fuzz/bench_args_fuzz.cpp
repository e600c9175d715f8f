// bench_args_fuzz.cpp — bench-comm's arguments as a user types them
// (engine/bench/bench_comm.h): each line of the input is a --sizes value,
// a collective's name and a --load value. parse_size either refuses by
// name (ddp::Error) or gives a size that format_size writes back to the
// same size; parse_collective and parse_load refuse or name a choice.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "bench_comm.h"
#include "compute_load.h"
#include "error.h"

namespace {

template <typename F>
void refused_or(F&& check) {
  try {
    check();
  } catch (const ddp::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  for (size_t at = 0; at <= input.size();) {
    size_t end = input.find('\n', at);
    if (end == std::string::npos) end = input.size();
    const std::string arg = input.substr(at, end - at);
    refused_or([&] {
      const size_t bytes = ddp::parse_size(arg);
      if (ddp::parse_size(ddp::format_size(bytes)) != bytes) std::abort();  // a size that does not read back
    });
    refused_or([&] { (void)ddp::parse_collective(arg); });
    refused_or([&] { (void)ddp::parse_load(arg); });
    at = end + 1;
  }
  return 0;
}
