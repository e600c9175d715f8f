// toml_read.cpp — see toml_read.h.
#include "toml_read.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace ddp::toml_read {

namespace fs = std::filesystem;

const char* const kSetPrefix = "--set ";

namespace {
// A config is a few kilobytes; this bounds what a wrong path makes us read.
constexpr uintmax_t kMaxConfigBytes = 1 << 20;
}  // namespace

const char* type_name(toml::node_type type) {
  switch (type) {
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::string: return "a string";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    case toml::node_type::none: break;
  }
  return "nothing";
}

bool has_type(const toml::node& node, toml::node_type type) {
  return node.type() == type || (type == toml::node_type::floating_point && node.is_integer());
}

bool from_override(const toml::source_region& source) { return source.path && source.path->rfind(kSetPrefix, 0) == 0; }

std::string where_of(const toml::source_region& source, const std::string& file) {
  if (from_override(source)) return *source.path;
  if (source.begin.line == 0) return file;  // built in code, not parsed
  return file + ":" + std::to_string(source.begin.line) + ":" + std::to_string(source.begin.column);
}

ConfigError wrong_type(const std::string& where, const std::string& name, toml::node_type expected,
                       const toml::node& node) {
  return ConfigError(where + ": key '" + name + "' must be " + type_name(expected) + ", not " + type_name(node.type()));
}

std::string format_double(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

namespace {

// Letters, digits and '_' '-': what a bare TOML key may hold, so that
// "<key> = <value>" parses as exactly one key.
bool is_bare_key(const std::string& s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isalnum(c) || c == '_' || c == '-'; });
}

// A word that may stand for a string without quotes (plugin names, paths).
// It holds no quote or backslash, so quoting it always yields valid TOML.
bool is_bare_word(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) {
    return std::isalnum(c) || std::string("_-./:+").find(char(c)) != std::string::npos;
  });
}

}  // namespace

std::string trim(const std::string& s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t") - first + 1);
}

// Digits (no leading zero), with a sign and underscores between them as
// TOML allows: what toml++ refuses only where it is out of range.
static bool is_integer_text(const std::string& v) {
  const size_t first = v.find_first_not_of("+-") == 1 ? 1 : 0;
  return v.size() > first && v[first] >= '1' && v[first] <= '9' && std::isdigit(static_cast<unsigned char>(v.back())) &&
         v.find_first_not_of("0123456789_", first) == std::string::npos;
}

// Parses the value as TOML with "--set <arg>" as source path, so that the
// node reports itself as "--set <arg>" wherever it is later found wrong.
void apply_override(toml::table& doc, const std::string& arg) {
  const std::string source = kSetPrefix + arg;
  const auto eq = arg.find('=');
  const std::string name = trim(arg.substr(0, eq));
  // section.key, or section.table.key (a plugin's own table: strategy.bucketed.bucket_mb)
  std::vector<std::string> parts;
  for (size_t begin = 0;;) {
    const size_t dot = name.find('.', begin);
    parts.push_back(name.substr(begin, dot == std::string::npos ? dot : dot - begin));
    if (dot == std::string::npos) break;
    begin = dot + 1;
  }
  const bool plugin_table = parts.size() == 3 && (parts[0] == "strategy" || parts[0] == "transport");
  bool bare = parts.size() == 2 || plugin_table;
  for (const std::string& p : parts) bare = bare && is_bare_key(p);
  if (eq == std::string::npos || !bare) throw ConfigError(source + ": expected section.key=value");
  const std::string& key = parts.back();

  const std::string value = trim(arg.substr(eq + 1));
  toml::table parsed;
  try {
    parsed = toml::parse(key + " = " + value, source);
  } catch (const toml::parse_error& e) {
    // A word, then something a word may not hold (a space, '#'): toml++
    // would say "expected 'true'"; say what the value needs instead.
    if (!value.empty() && std::isalpha(static_cast<unsigned char>(value[0])) && !is_bare_word(value))
      throw ConfigError(source + ": '" + value +
                        "' is not a TOML value; a string holding "
                        "characters other than letters, digits and _-./:+ takes quotes, and "
                        "--set takes no comment");
    if (is_integer_text(value))
      throw ConfigError(source + ": key '" + name + "': " + value +
                        " is an integer out of range (TOML's are "
                        "64-bit: -9223372036854775808 to 9223372036854775807)");
    if (!is_bare_word(value)) throw ConfigError(source + ": " + std::string(e.description()));
    parsed = toml::parse(key + " = \"" + value + "\"", source);
  }

  toml::table* table = &doc;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    toml::node* existing = table->get(parts[i]);
    if (!existing) {  // a new table holding the key: moving the parsed one keeps its source
      if (i + 2 == parts.size()) {
        table->insert(parts[i], std::move(parsed));
        return;
      }
      table->insert(parts[i], toml::table{});
      existing = table->get(parts[i]);
    }
    table = existing->as_table();
    if (!table) return;  // the file has a non-table there; validation reports it
  }
  table->insert_or_assign(key, std::move(*parsed.get(key)));  // moving keeps the source
}

toml::table parse_file(const std::string& path) {
  std::error_code ec;
  // Checked before the open: opening a FIFO would block until a writer came.
  if (!fs::is_regular_file(path, ec)) throw ConfigError(path + ": cannot open config file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot open config file");
  std::string text(kMaxConfigBytes + 1, '\0');  // at most this much is read, whatever the file does meanwhile
  in.read(text.data(), std::streamsize(text.size()));
  text.resize(size_t(in.gcount()));
  if (text.size() > kMaxConfigBytes)
    throw ConfigError(path + ": " + std::to_string(fs::file_size(path, ec)) + " bytes is not a config file (at most " +
                      std::to_string(kMaxConfigBytes) + ")");
  try {
    return toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    const auto& begin = e.source().begin;
    throw ConfigError(path + ":" + std::to_string(begin.line) + ":" + std::to_string(begin.column) + ": " +
                      std::string(e.description()));
  }
}

}  // namespace ddp::toml_read
