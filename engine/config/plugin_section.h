// plugin_section.h — a plugin's own TOML table: [transport] or [strategy]
// minus `plugin`, with the keys of the chosen plugin's own table
// ([strategy.bucketed] when plugin = "bucketed"); the tables of the other
// plugins are not read, so one file carries settings for several and
// changing `plugin` alone swaps. Plugins read it through the host vtable (typed reads that
// throw ConfigError naming the key's location); every key read is
// remembered, so that keys no plugin read can be reported as unknown.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "error.h"

namespace ddp {

class PluginSection {
 public:
  PluginSection() = default;
  // Takes the table by reference: copying a TOML++ node drops its source
  // position, so the positions are recorded here before the copy. `plugin`:
  // the chosen plugin's name or path, whose table ([<section>.<name>]) is
  // merged in. A key set both there and in [<section>] is refused, naming
  // both places, unless one comes from --set: that one wins.
  PluginSection(std::string file, std::string section, const toml::table& table, const std::string& plugin = "");

  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_float(const std::string& key, double fallback) const;  // ints accepted
  bool get_bool(const std::string& key, bool fallback) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;

  // Throws ConfigError "<where>: unknown key '<section>.<key>' (<kind> plugin
  // '<name>' does not read it)" for the first key (in file order) not read.
  void check_all_read(const std::string& kind, const std::string& plugin_name) const;
  // Before any rank starts, from the keys a plugin declares (ddp_key): the
  // same error for the first key (file order) not in `known`, with the
  // keys the plugin reads and the nearest one if close ("... does not read
  // it; it reads: bucket_mb, compress; did you mean 'compress'?)").
  void check_declared(const std::vector<std::string>& known, const std::string& kind,
                      const std::string& plugin_name) const;
  // The other plugins' tables ([strategy.<name>] of a plugin not chosen)
  // should name a plugin of `available` (the search path's; one loaded by
  // path may not be there): "<where>: table '[strategy.bucketd]' names no
  // strategy plugin here; did you mean 'bucketed'? (there are: ...)" for
  // the first that does not, else "". A warning, not a refusal.
  std::string unknown_table(const std::vector<std::string>& available, const std::string& kind) const;

  const std::string& section() const { return section_; }

 private:
  const toml::node* find(const std::string& key) const;
  // The first key, in file order (--set's last), that `pick` accepts; null if none.
  const std::string* first_key(const std::function<bool(const std::string&)>& pick) const;
  std::string where(const std::string& key) const;  // "<file>:<l>:<c>" or "--set ..."

  void add(const std::string& table_name, const toml::key& key, const toml::node& node);
  std::string name_of(const std::string& key) const { return owner_.at(key) + "." + key; }

  std::string file_;
  std::string section_;
  toml::table table_;
  std::map<std::string, std::string> owner_;            // key -> the table it came from ("strategy.bucketed")
  std::map<std::string, toml::source_region> sources_;  // key -> position in the file
  std::vector<std::pair<std::string, toml::source_region>> other_tables_;  // not the chosen plugin's
  mutable std::set<std::string> read_;
};

// One plugin's table from --set arguments alone ("<section>.key=value", the
// value as for load_config), for commands without a config file (`ddp
// bench-comm`). Throws ConfigError naming the argument for any other
// section, and for "<section>.plugin" (the command names the plugin).
PluginSection plugin_section_from_overrides(const std::string& section, const std::vector<std::string>& overrides);

// The name a plugin's own table goes by: the name itself, or for a path
// ".../libddp_strategy_mine.so" "mine" (the file name without lib, .so and
// the kind's prefix). Pure.
std::string plugin_table_name(const std::string& plugin);

}  // namespace ddp
