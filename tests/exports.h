// exports.h — the symbols a shared library exports, for the standing rule
// that a plugin exports exactly one symbol, its entry (loader_test for every
// plugin the build ships, nccl_transport_test for the nccl one).
#pragma once

#include <cstdio>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace ddp::test {

// Every symbol `file` defines in its dynamic table (nm -D), or nullopt when
// nm is missing.
inline std::optional<std::vector<std::string>> exported_symbols(const std::string& file) {
  const std::string command = "nm -D --defined-only '" + file + "' 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return std::nullopt;
  std::string output;
  char chunk[4096];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, pipe)) > 0) output.append(chunk, n);
  if (pclose(pipe) != 0) {
    if (output.find("not found") != std::string::npos) return std::nullopt;
    ADD_FAILURE() << command << "\n" << output;
  }
  std::istringstream lines(output);
  std::string line;
  std::vector<std::string> symbols;
  while (std::getline(lines, line))
    if (!line.empty()) symbols.push_back(line.substr(line.rfind(' ') + 1));
  return symbols;
}

}  // namespace ddp::test
