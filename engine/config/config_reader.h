// config_reader.h — the typed reads of a parsed run file's fixed sections
// (config.cpp's): each key's type and value constraints, with the message
// that names the file, line and key, and the effective value of every key
// read with a fallback. What the sections mean, and how they are put
// together into a Config, is config.cpp's.
#pragma once

#include <algorithm>
#include <climits>
#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "config.h"
#include "schema.h"
#include "toml_read.h"

namespace ddp {

// Reads the fixed sections of a parsed document. check_structure() first;
// the typed reads then assume types are right and check value constraints.
class ConfigReader {
 public:
  ConfigReader(const toml::table& doc, const std::string& file) : doc_(doc), file_(file) {}

  void check_structure() const {
    for (auto&& [name, node] : doc_) {
      const std::string section(name.str());
      if (!is_known_section(section)) {
        if (node.is_table()) throw ConfigError(where(node) + ": unknown section '" + section + "'");
        throw ConfigError(where(node) + ": unknown key '" + section + "'");
      }
      if (!node.is_table()) throw toml_read::wrong_type(where(node), section, toml::node_type::table, node);
      for (auto&& [key_name, value] : *node.as_table()) {
        const std::string key(key_name.str());
        const std::optional<toml::node_type> type = key_type(section, key);
        if (!type) {
          if (is_plugin_section(section)) continue;
          throw ConfigError(where(value) + ": unknown key '" + section + "." + key + "'");
        }
        if (!toml_read::has_type(value, *type))
          throw toml_read::wrong_type(where(value), section + "." + key, *type, value);
      }
    }
    for (const KeySpec& s : schema())
      if (s.required && !find(s.section, s.key))
        throw ConfigError(file_ + ": missing required key '" + s.section + "." + s.key + "'");
  }

  // What every key read with a fallback holds, set or not: "section.key" →
  // its value as text (Config::effective).
  const std::map<std::string, std::string>& effective() const { return effective_; }

  int64_t integer(const char* section, const char* key, int64_t fallback, int64_t min, int64_t max = INT64_MAX) const {
    const toml::node* node = find(section, key);
    const int64_t value = node ? node->as_integer()->get() : fallback;
    if (node) {
      require(value >= min, section, key, ">= " + std::to_string(min), std::to_string(value));
      require(value <= max, section, key, "<= " + std::to_string(max), std::to_string(value));
    }
    return note(section, key, value, std::to_string(value));
  }

  double positive(const char* section, const char* key, double fallback, double max = INFINITY) const {
    const toml::node* node = find(section, key);
    if (!node) return note(section, key, fallback, exact(fallback));
    const double value = node->is_integer() ? double(node->as_integer()->get()) : node->as_floating_point()->get();
    require(value > 0, section, key, "> 0", toml_read::format_double(value));  // also rejects nan
    require(std::isfinite(value), section, key, "finite", toml_read::format_double(value));
    require(value <= max, section, key, "<= " + exact(max), toml_read::format_double(value));
    return note(section, key, value, exact(value));
  }

  double non_negative(const char* section, const char* key, double fallback) const {
    const toml::node* node = find(section, key);
    if (!node) return note(section, key, fallback, exact(fallback));
    const double value = as_double(*node);
    require(value >= 0, section, key, ">= 0", toml_read::format_double(value));
    require(std::isfinite(value), section, key, "finite", toml_read::format_double(value));
    return note(section, key, value, exact(value));
  }

  // optimizer.betas: exactly two floats, each in [0, 1).
  std::pair<double, double> betas(double b1, double b2) const {
    const toml::node* node = find("optimizer", "betas");
    if (!node) return {b1, b2};
    const toml::array& a = *node->as_array();
    bool ok = a.size() == 2;
    for (size_t i = 0; ok && i < 2; ++i) {
      ok = toml_read::has_type(a[i], toml::node_type::floating_point);
      if (ok) ok = as_double(a[i]) >= 0 && as_double(a[i]) < 1;
    }
    // Floats as format_double writes them elsewhere ("0.9", not TOML++'s
    // full-precision "0.90000000000000002").
    std::ostringstream got;
    got << toml::toml_formatter(a, toml::toml_formatter::default_flags | toml::format_flags::relaxed_float_precision);
    require(ok, "optimizer", "betas", "two floats in [0, 1)", got.str());
    return {as_double(a[0]), as_double(a[1])};
  }

  // An array of tables ([[section.key]]), each checked against `fields`
  // (name → type, required); calls `read(table, where_prefix)` for each.
  template <typename Read>
  void tables(const char* section, const char* key,
              std::initializer_list<std::tuple<const char*, toml::node_type, bool>> fields, Read read) const {
    const toml::node* node = find(section, key);
    if (!node) return;
    size_t index = 0;
    for (const toml::node& element : *node->as_array()) {
      const std::string name = std::string(section) + "." + key + "[" + std::to_string(index++) + "]";
      if (!element.is_table()) throw toml_read::wrong_type(where(element), name, toml::node_type::table, element);
      const toml::table& t = *element.as_table();
      for (auto&& [k, v] : t) {
        const std::string_view key_name = k.str();  // (a lambda may not capture a structured binding in C++17)
        auto field =
            std::find_if(fields.begin(), fields.end(), [&](const auto& f) { return key_name == std::get<0>(f); });
        if (field == fields.end())
          throw ConfigError(where(v) + ": unknown key '" + name + "." + std::string(k.str()) + "'");
        if (!toml_read::has_type(v, std::get<1>(*field)))
          throw toml_read::wrong_type(where(v), name + "." + std::string(k.str()), std::get<1>(*field), v);
      }
      for (const auto& f : fields)
        if (std::get<2>(f) && !t.contains(std::get<0>(f)))
          throw ConfigError(where(element) + ": missing required key '" + name + "." + std::get<0>(f) + "'");
      read(t, name);
    }
  }

  static double as_double(const toml::node& node) {
    return node.is_integer() ? double(node.as_integer()->get()) : node.as_floating_point()->get();
  }

  std::string string(const char* section, const char* key, const std::string& fallback) const {
    const toml::node* node = find(section, key);
    const std::string value = node ? node->as_string()->get() : fallback;
    return note(section, key, value, value);
  }

  // A directory the run writes into. The working directory is written
  // ".", so an empty value is a key left blank, and the root is refused.
  std::string directory(const char* section, const char* key, const std::string& fallback) const {
    const std::string value = string(section, key, fallback);
    if (!find(section, key)) return value;
    require(!value.empty(), section, key, "a directory (\".\" for the working directory)", "''");
    const std::filesystem::path path = std::filesystem::path(value).lexically_normal();
    require(path.has_relative_path() || !path.has_root_directory(), section, key, "a directory other than the root",
            "'" + value + "'");
    return value;
  }

  bool boolean(const char* section, const char* key, bool fallback) const {
    const toml::node* node = find(section, key);
    const bool value = node ? node->as_boolean()->get() : fallback;
    return note(section, key, value, value ? "true" : "false");
  }

  std::string one_of(const char* section, const char* key, const std::string& fallback,
                     const std::vector<std::string>& allowed) const {
    const std::string value = string(section, key, fallback);
    std::string list;
    for (const std::string& a : allowed) list += (list.empty() ? "" : ", ") + a;
    require(std::find(allowed.begin(), allowed.end(), value) != allowed.end(), section, key, "one of: " + list,
            "'" + value + "'");
    return value;
  }

  // A path written in the file is relative to the file's directory, so that
  // a config in configs/ can name ../tests/fixtures/...; one given with --set
  // is relative to the working directory, like any command-line path.
  std::string path_from_file(const char* section, const char* key) const {
    const toml::node* node = find(section, key);
    if (!node) return "";
    const std::filesystem::path path(node->as_string()->get());
    if (path.is_absolute() || toml_read::from_override(node->source())) return path.string();
    return (std::filesystem::path(file_).parent_path() / path).lexically_normal().string();
  }

  PluginSection plugin_section(const char* section, const std::string& plugin) const {
    static const toml::table empty;
    const toml::table* table = doc_[section].as_table();
    return PluginSection(file_, section, table ? *table : empty, plugin);
  }

  const toml::node* find(const char* section, const char* key) const { return doc_[section][key].node(); }

  const toml::node* find(const char* section) const { return doc_[section].node(); }
  const std::string& file() const { return file_; }
  std::string where(const toml::node& node) const { return toml_read::where_of(node.source(), file_); }

  void require(bool ok, const char* section, const char* key, const std::string& constraint,
               const std::string& got) const {
    if (ok) return;
    throw ConfigError(where(*find(section, key)) + ": key '" + section + "." + key + "' must be " + constraint +
                      " (got " + got + ")");
  }

 private:
  template <typename T>
  T note(const char* section, const char* key, T value, std::string text) const {
    effective_[std::string(section) + "." + key] = std::move(text);
    return value;
  }
  static std::string exact(double x) { return shortest_text(x); }

  const toml::table& doc_;
  const std::string& file_;
  mutable std::map<std::string, std::string> effective_;
};

}  // namespace ddp
