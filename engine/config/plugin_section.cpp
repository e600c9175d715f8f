// plugin_section.cpp — see plugin_section.h.
#include "plugin_section.h"

#include <algorithm>
#include <tuple>

#include "nearest.h"

#include "toml_read.h"

namespace ddp {

using toml_read::from_override;
using toml_read::kSetPrefix;
using toml_read::where_of;
using toml_read::wrong_type;

std::string plugin_table_name(const std::string& plugin) {
  std::string name = plugin.substr(plugin.rfind('/') == std::string::npos ? 0 : plugin.rfind('/') + 1);
  if (name.size() > 3 && name.compare(name.size() - 3, 3, ".so") == 0) name.resize(name.size() - 3);
  for (const char* prefix : {"libddp_strategy_", "libddp_transport_", "lib"})
    if (name.rfind(prefix, 0) == 0) return name.substr(std::string(prefix).size());
  return name;
}

PluginSection::PluginSection(std::string file, std::string section, const toml::table& table, const std::string& plugin)
    : file_(std::move(file)), section_(std::move(section)) {
  const std::string own = plugin.empty() ? "" : plugin_table_name(plugin);
  for (auto&& [key, node] : table) {
    if (key.str() == "plugin") continue;             // the host's key: which plugin, not its settings
    if (const toml::table* sub = node.as_table()) {  // a plugin's own table: the chosen one's only
      if (key.str() == own)
        for (auto&& [k, n] : *sub) add(section_ + "." + own, k, n);
      else
        other_tables_.emplace_back(std::string(key.str()), node.source());
      continue;
    }
    add(section_, key, node);
  }
}

void PluginSection::add(const std::string& table_name, const toml::key& key, const toml::node& node) {
  const std::string k(key.str());
  if (table_.get(k)) {
    const bool mine_set = from_override(node.source());
    const bool before_set = from_override(sources_.at(k));
    if (mine_set == before_set) {  // both in the file: named from the later one
      const toml::source_region& a = node.source();
      const toml::source_region& b = sources_.at(k);
      const bool mine_later = std::tie(a.begin.line, a.begin.column) > std::tie(b.begin.line, b.begin.column);
      const std::string mine_name = table_name + "." + k;
      const std::string mine_where = where_of(a, file_);
      throw ConfigError((mine_later ? mine_where : where(k)) + ": key '" + (mine_later ? mine_name : name_of(k)) +
                        "' is set twice: also as '" + (mine_later ? name_of(k) : mine_name) + "' at " +
                        (mine_later ? where(k) : mine_where) + " (keep one)");
    }
    if (before_set) return;  // --set wins
  }
  table_.insert_or_assign(k, node);
  sources_[k] = node.source();
  owner_[k] = table_name;
}

const toml::node* PluginSection::find(const std::string& key) const {
  read_.insert(key);
  return table_.get(key);
}

std::string PluginSection::where(const std::string& key) const { return where_of(sources_.at(key), file_); }

int64_t PluginSection::get_int(const std::string& key, int64_t fallback) const {
  const toml::node* node = find(key);
  if (!node) return fallback;
  if (!node->is_integer()) throw wrong_type(where(key), name_of(key), toml::node_type::integer, *node);
  return node->as_integer()->get();
}

double PluginSection::get_float(const std::string& key, double fallback) const {
  const toml::node* node = find(key);
  if (!node) return fallback;
  if (node->is_integer()) return double(node->as_integer()->get());
  if (!node->is_floating_point()) throw wrong_type(where(key), name_of(key), toml::node_type::floating_point, *node);
  return node->as_floating_point()->get();
}

bool PluginSection::get_bool(const std::string& key, bool fallback) const {
  const toml::node* node = find(key);
  if (!node) return fallback;
  if (!node->is_boolean()) throw wrong_type(where(key), name_of(key), toml::node_type::boolean, *node);
  return node->as_boolean()->get();
}

std::string PluginSection::get_string(const std::string& key, const std::string& fallback) const {
  const toml::node* node = find(key);
  if (!node) return fallback;
  if (!node->is_string()) throw wrong_type(where(key), name_of(key), toml::node_type::string, *node);
  return node->as_string()->get();
}

const std::string* PluginSection::first_key(const std::function<bool(const std::string&)>& pick) const {
  // File order; keys from --set come after the file's.
  auto order = [&](const std::string& key) {
    const toml::source_region& s = sources_.at(key);
    return std::make_tuple(from_override(s), s.begin.line, s.begin.column);
  };
  const std::string* first = nullptr;
  for (const auto& entry : sources_)
    if (pick(entry.first) && (!first || order(entry.first) < order(*first))) first = &entry.first;
  return first;
}

void PluginSection::check_all_read(const std::string& kind, const std::string& plugin_name) const {
  if (const std::string* key = first_key([&](const std::string& k) { return !read_.count(k); }))
    throw ConfigError(where(*key) + ": unknown key '" + name_of(*key) + "' (" + kind + " plugin '" + plugin_name +
                      "' does not read it)");
}

void PluginSection::check_declared(const std::vector<std::string>& known, const std::string& kind,
                                   const std::string& plugin_name) const {
  const std::string* key =
      first_key([&](const std::string& k) { return std::find(known.begin(), known.end(), k) == known.end(); });
  if (!key) return;
  std::string reads;
  for (const std::string& k : known) reads += (reads.empty() ? "" : ", ") + k;
  const std::string nearest = nearest_name(*key, known);
  throw ConfigError(where(*key) + ": unknown key '" + name_of(*key) + "' (" + kind + " plugin '" + plugin_name +
                    "' does not read it; " + (known.empty() ? "it reads no keys" : "it reads: " + reads) +
                    (nearest.empty() ? "" : "; did you mean '" + nearest + "'?") + ")");
}

std::string PluginSection::unknown_table(const std::vector<std::string>& available, const std::string& kind) const {
  for (const auto& [name, source] : other_tables_) {
    if (std::find(available.begin(), available.end(), name) != available.end()) continue;
    std::string there;
    for (const std::string& a : available) there += (there.empty() ? "" : ", ") + a;
    const std::string nearest = nearest_name(name, available);
    return where_of(source, file_) + ": table '[" + section_ + "." + name + "]' names no " + kind + " plugin here" +
           (nearest.empty() ? "" : "; did you mean '" + nearest + "'?") + " (there are: " + there + ")";
  }
  return "";
}

PluginSection plugin_section_from_overrides(const std::string& section, const std::vector<std::string>& overrides) {
  toml::table doc;
  for (const std::string& arg : overrides) {
    toml_read::apply_override(doc, arg);
    const std::string name = toml_read::trim(arg.substr(0, arg.find('=')));
    if (name.compare(0, section.size() + 1, section + ".") != 0)
      throw ConfigError(kSetPrefix + arg + ": only " + section + ".<key> can be set here");
    if (name == section + ".plugin")
      throw ConfigError(kSetPrefix + arg + ": the " + section + " plugin is not a key here (name it with --" + section +
                        ")");
  }
  const toml::table empty;
  const toml::table* table = doc[section].as_table();
  return PluginSection("", section, table ? *table : empty);
}

}  // namespace ddp
