// stats.h — the JSON side of a strategy's optional `stats` entry, shared by
// the plugins that report one (header-only, so a plugin stays one shared
// library that links nothing of the engine).
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>

namespace ddp {
namespace strategy {

// A JSON string literal of `text`: quotes and backslashes escaped, control
// characters as \u00XX (parameter names are plain, but never trust that).
inline std::string json_quote(const std::string& text) {
  std::string out = "\"";
  for (const unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char escape[8];
      std::snprintf(escape, sizeof escape, "\\u%04x", static_cast<unsigned>(c));
      out += escape;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// A finite double as a JSON number that reads back to the same value.
inline std::string json_number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

// The copy-out of plugin.h's `stats` entry: *needed = the full length
// WITHOUT the NUL; buf receives at most cap bytes including the NUL (always
// NUL-terminated when cap > 0; nothing is written when cap == 0). The host
// calls again with a larger buffer when *needed >= cap.
inline void write_stats(const std::string& json, char* buf, size_t cap, size_t* needed) {
  *needed = json.size();
  if (cap == 0 || buf == nullptr) return;
  const size_t n = json.size() < cap - 1 ? json.size() : cap - 1;
  std::memcpy(buf, json.data(), n);
  buf[n] = '\0';
}

}  // namespace strategy
}  // namespace ddp
