// plugin_loader.h — finds, loads and checks strategy and transport plugins
// with Boost.DLL (used only as a portable dlopen: no C++ type crosses).
//
// A plugin name ("naive") resolves to libddp_<kind>_<name>.so in the first
// directory of the search path that has it; anything containing '/' or
// ending in ".so" is a path taken as given.
// Refusals throw PluginError with exactly this message:
//   cannot load <kind> plugin '<path>' (host ABI <M>.<m>, plugin ABI <M>.<m>|none): <reason>
// reasons: "file not found"
//          "not a regular file (a FIFO)"   (never opened: it could block)
//          "its descriptor names it '<name>', not '<chosen>'"
//              (chosen by name: a file renamed from another plugin)
//          "file not found; did you mean '<name>'? (<kind> plugins in <dirs>: <names>)"
//              (a name: the nearest name, if one is close, and what there is)
//          "not a ddp plugin (no ddp_strategy_v1 or ddp_transport_v1 symbol)"
//          "other major ABI version"
//          "wrong kind: it is a <other kind> plugin"
//          "descriptor too small (struct_size <n>, need <m>)"
//          "required entry '<entry>' is NULL"
//          "caps has DDP_CAP_OWNS_GRADIENTS without DDP_CAP_OWNS_OPTIMIZER: ..."
//          "<dlerror text>"   (file exists but dlopen failed)
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ddp/plugin.h>

#include "error.h"
#include "nearest.h"
#include "plugin_section.h"

namespace ddp {

class PluginError : public Error {
 public:
  using Error::Error;
};

enum class PluginKind { Strategy, Transport };
const char* to_string(PluginKind kind);  // "strategy" | "transport"

// The search path of plugin names: $DDP_PLUGIN_DIR's directories
// (colon-separated), if set, then the shipped plugins' directory,
// <directory of the running executable>/../lib/ddp.
std::string default_plugin_dir();

// The directories of a search path ("a:b:c"; empty entries dropped). Pure.
std::vector<std::string> search_dirs(const std::string& search_path);

// Resolves a name or path as described above; a name found nowhere
// resolves into the first directory (for the refusal to name).
std::string resolve_plugin_path(PluginKind kind, const std::string& name_or_path, const std::string& search_path);

// The names of the plugins of `kind` in the search path, sorted, each once:
// the regular files (or links to them) named libddp_<kind>_<name>.so.
std::vector<std::string> available_plugins(PluginKind kind, const std::string& search_path);
// The files of the search path named as plugins of `kind` that are not
// regular files (a FIFO, a directory, a dangling link): never opened.
std::vector<std::string> irregular_plugin_files(PluginKind kind, const std::string& search_path);
// "naive" of ".../libddp_strategy_naive.so". Pure.
std::string plugin_name_of(PluginKind kind, const std::string& path);
// What a path is, in words: "a regular file", "a FIFO", "a directory",
// "a socket", "a device", "a dangling symbolic link", "missing".
std::string file_type_name(const std::string& path);

// Keeps the library loaded for as long as the descriptor is used.
class LoadedPlugin {
 public:
  ~LoadedPlugin();
  const std::string& path() const { return path_; }
  const ddp_strategy_v1_t* strategy() const { return strategy_; }     // Strategy kind
  const ddp_transport_v1_t* transport() const { return transport_; }  // Transport kind

 private:
  friend std::unique_ptr<LoadedPlugin> load_plugin(PluginKind, const std::string&, const std::string&);
  LoadedPlugin() = default;
  struct Library;
  std::unique_ptr<Library> lib_;
  std::string path_;
  const ddp_strategy_v1_t* strategy_ = nullptr;
  const ddp_transport_v1_t* transport_ = nullptr;
};

// Whether a descriptor's caps cover `device` (DDP_CAP_DEVICE_CPU or _CUDA).
inline bool supports_device(uint64_t caps, ddp_device_kind device) {
  return caps & (device == DDP_DEVICE_CUDA ? DDP_CAP_DEVICE_CUDA : DDP_CAP_DEVICE_CPU);
}

// "" where a strategy of `caps`, named `name`, may run under [precision]
// reduce = `reduce`; else why not, naming the key. Pure.
std::string reduce_refusal(uint64_t caps, ddp_dtype reduce, const std::string& name);

std::unique_ptr<LoadedPlugin> load_plugin(PluginKind kind, const std::string& name_or_path,
                                          const std::string& plugin_dir = default_plugin_dir());

// One TOML key a plugin declares (ddp_key), copied.
struct PluginKey {
  std::string name;
  std::string type;
  std::string help;
};
// The keys the plugin declares in its descriptor, or nullopt where it
// declares none (keys NULL, or a plugin older than ABI 1.3).
std::optional<std::vector<PluginKey>> declared_keys(const LoadedPlugin& plugin);
// The keys of the plugin's table against those it declares, if it declares
// them (PluginSection::check_declared: throws ConfigError naming the first
// unknown one); nothing for a plugin that declares none.
void check_declared_keys(const LoadedPlugin& plugin, const PluginSection& section);
// Before any rank starts (`ddp run`, `ddp plan`): loads the plugin every rank
// will load and checks its table's keys against those it declares; warns on
// stderr of a table of the section that names no plugin of the search path
// (PluginSection::unknown_table).
std::unique_ptr<LoadedPlugin> load_and_check(PluginKind kind, const std::string& name, const PluginSection& section);

// What `ddp plugins` says of one plugin of the search path: loaded and
// checked as a run would load it, or why it cannot be (plugin_listing.cpp).
struct PluginInfo {
  PluginKind kind = PluginKind::Strategy;
  std::string name;  // as a config names it
  std::string path;
  std::string version;  // from its descriptor
  uint32_t abi_version = 0;
  uint64_t caps = 0;
  std::string refusal;  // "" if it loads
  std::optional<std::vector<PluginKey>> keys;
  uint64_t dtypes = 0;      // a transport's (ddp_transport_dtypes); 0 for a strategy
  bool plans = false;       // it has a plan entry (ABI 1.4): `ddp plan` asks it
  bool misbehaved = false;  // its code exited, crashed or hung as it was loaded; or not a regular file
};
// How long loading one plugin may take in `ddp plugins` (its constructors
// and descriptor), unless --timeout says.
constexpr std::chrono::milliseconds kPluginLoadBound{30000};
// Each plugin is loaded in a child process of its own (isolated.h), within
// `bound`: one that exits, crashes or hangs there is listed with that as
// its refusal. Files that are not regular files are listed as skipped.
std::vector<PluginInfo> describe_plugins(PluginKind kind, const std::string& search_path = default_plugin_dir(),
                                         std::chrono::milliseconds bound = kPluginLoadBound);

// The listing, one line per plugin (name, version, ABI, what it supports,
// path; or the refusal). Pure.
std::string format_plugins(const std::vector<PluginInfo>& plugins);

}  // namespace ddp
