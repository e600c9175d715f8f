// error.h — the engine's one error type. Inside the engine errors are
// exceptions carrying a user-facing message (file, line, key or rank named by
// whoever throws); across the plugin ABI they are ddp_status codes; only
// main() turns them into an exit code.
#pragma once

#include <stdexcept>
#include <string>

namespace ddp {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace ddp
