// plugin_loader.cpp — resolves a plugin name to a file, dlopens it through
// Boost.DLL and checks its descriptor (entry symbol, kind, major ABI version,
// struct_size, required entries) before the engine may call into it. Every
// refusal is a PluginError worded as documented in plugin_loader.h.
#include "plugin_loader.h"

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <vector>

#include <ddp/numeric.h>

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <boost/filesystem.hpp>
#include <boost/system/system_error.hpp>

#include "config.h"
#include "elf_extent.h"
#include "env.h"
#include "whereabouts.h"

namespace ddp {

namespace fs = boost::filesystem;

namespace {

// Size of a v1 descriptor up to and including its last entry of ABI 1.0: a
// plugin built against an older minor may stop there, never earlier. (Of
// those entries, reduce_scatter, on_step_begin, on_grad_ready and
// on_backward_end are optional since 1.4; the others are required.)
constexpr size_t kTransportMinSize = offsetof(ddp_transport_v1_t, barrier) + sizeof(ddp_transport_v1_t::barrier);
constexpr size_t kStrategyMinSize = offsetof(ddp_strategy_v1_t, destroy) + sizeof(ddp_strategy_v1_t::destroy);

const char* entry_symbol(PluginKind kind) {
  return kind == PluginKind::Strategy ? DDP_STRATEGY_ENTRY_V1 : DDP_TRANSPORT_ENTRY_V1;
}

// The newest entry symbol of `kind` the library exports, probing majors
// from high to low as the ABI promises (a major is a new symbol); empty if
// none. Newer-major plugins are then refused with their version.
constexpr int kNewestMajorProbed = 9;
std::string newest_entry(boost::dll::shared_library& lib, PluginKind kind) {
  for (int major = kNewestMajorProbed; major >= 1; --major) {
    std::string symbol =
        std::string("ddp_") + (kind == PluginKind::Strategy ? "strategy" : "transport") + "_v" + std::to_string(major);
    if (lib.has(symbol)) return symbol;
  }
  return "";
}

PluginKind other_kind(PluginKind kind) {
  return kind == PluginKind::Strategy ? PluginKind::Transport : PluginKind::Strategy;
}

std::string abi_string(uint32_t abi_version) {
  return std::to_string(DDP_ABI_MAJOR(abi_version)) + "." + std::to_string(DDP_ABI_MINOR(abi_version));
}

// Builds "cannot load <kind> plugin '<path>' (host ABI M.m, plugin ABI M.m|none): <reason>".
class Refusal {
 public:
  Refusal(PluginKind kind, const std::string& path) : kind_(kind), path_(path) {}
  void set_plugin_abi(uint32_t abi_version) { plugin_abi_ = abi_string(abi_version); }

  [[noreturn]] void fail(const std::string& reason) const {
    throw PluginError("cannot load " + std::string(to_string(kind_)) + " plugin '" + path_ + "' (host ABI " +
                      abi_string(DDP_ABI_VERSION) + ", plugin ABI " + plugin_abi_ + "): " + reason);
  }

 private:
  PluginKind kind_;
  std::string path_;
  std::string plugin_abi_ = "none";
};

// Boost.DLL reports "...load() failed (dlerror system message: <text>): <errno text>";
// the errno part is meaningless after dlopen, so keep only dlerror's text.
std::string dlerror_text(const std::string& what) {
  static const std::string kPrefix = "dlerror system message: ";
  const size_t begin = what.find(kPrefix);
  if (begin == std::string::npos) return what;
  const size_t text = begin + kPrefix.size();
  const size_t end = what.rfind("):");
  if (end == std::string::npos || end < text) return what;
  return what.substr(text, end - text);
}

// Copies a descriptor of `struct_size` bytes into a host-sized, zeroed one, so
// entries the plugin's (older) struct lacks read as NULL.
template <typename Descriptor>
Descriptor copy_descriptor(const Descriptor& src) {
  Descriptor copy;
  std::memset(&copy, 0, sizeof copy);
  const size_t n = src.struct_size < sizeof copy ? src.struct_size : sizeof copy;
  std::memcpy(&copy, &src, n);
  return copy;
}

template <typename Descriptor>
void check_header(const Refusal& refusal, const Descriptor& d, size_t min_size) {
  if (DDP_ABI_MAJOR(d.abi_version) != DDP_ABI_VERSION_MAJOR) refusal.fail("other major ABI version");
  if (d.struct_size < min_size) {
    refusal.fail("descriptor too small (struct_size " + std::to_string(d.struct_size) + ", need " +
                 std::to_string(min_size) + ")");
  }
}

void require(const Refusal& refusal, bool present, const char* name, const char* why = nullptr) {
  if (present) return;
  std::string reason = std::string("required entry '") + name + "' is NULL";
  if (why != nullptr) reason += std::string(" (") + why + ")";
  refusal.fail(reason);
}

void check_entries(const Refusal& refusal, const ddp_transport_v1_t& t) {
  require(refusal, t.name != nullptr, "name");
  require(refusal, t.version != nullptr, "version");
  require(refusal, t.init != nullptr, "init");
  require(refusal, t.destroy != nullptr, "destroy");
  require(refusal, t.all_reduce != nullptr, "all_reduce");
  require(refusal, t.broadcast != nullptr, "broadcast");
  require(refusal, t.all_gather != nullptr, "all_gather");
  require(refusal, t.barrier != nullptr, "barrier");
}

void check_entries(const Refusal& refusal, const ddp_strategy_v1_t& s) {
  require(refusal, s.name != nullptr, "name");
  require(refusal, s.version != nullptr, "version");
  require(refusal, s.create != nullptr, "create");
  require(refusal, s.on_train_begin != nullptr, "on_train_begin");
  require(refusal, s.finish != nullptr, "finish");
  if (s.caps & DDP_CAP_OWNS_OPTIMIZER) {
    require(refusal, s.optimizer_step != nullptr, "optimizer_step", "caps has DDP_CAP_OWNS_OPTIMIZER");
  }
  if (s.caps & DDP_CAP_OWNS_GRADIENTS) {  // it holds gradients: it says where, and steps them itself
    if (!(s.caps & DDP_CAP_OWNS_OPTIMIZER))
      refusal.fail(
          "caps has DDP_CAP_OWNS_GRADIENTS without DDP_CAP_OWNS_OPTIMIZER: a strategy that holds "
          "gradients steps them itself (run_optimizer_ranges)");
    if (!s.held_ranges)  // (1.9: held_ranges says it too)
      require(refusal, s.grad_ranges != nullptr, "grad_ranges", "caps has DDP_CAP_OWNS_GRADIENTS");
  }
  if (s.caps & DDP_CAP_OWNS_PARAMETERS) {  // it holds values: it steps them, and lends them to the engine's readers
    if (!(s.caps & DDP_CAP_OWNS_OPTIMIZER))
      refusal.fail(
          "caps has DDP_CAP_OWNS_PARAMETERS without DDP_CAP_OWNS_OPTIMIZER: a strategy that holds "
          "parameters steps them itself (run_optimizer_ranges)");
    require(refusal, s.unit_values != nullptr, "unit_values", "caps has DDP_CAP_OWNS_PARAMETERS");
  }
  // Replicas that may differ: it says when they are equal again.
  if (s.caps & DDP_CAP_DIVERGENT) {
    require(refusal, s.on_step_end != nullptr, "on_step_end", "caps has DDP_CAP_DIVERGENT");
    if (s.caps & (DDP_CAP_OWNS_GRADIENTS | DDP_CAP_OWNS_PARAMETERS))  // each rank's own replica is whole
      refusal.fail(
          "caps has DDP_CAP_DIVERGENT with DDP_CAP_OWNS_GRADIENTS or DDP_CAP_OWNS_PARAMETERS: replicas "
          "that differ are whole on every rank, not shards of one model");
  }
  require(refusal, s.destroy != nullptr, "destroy");
}

}  // namespace

struct LoadedPlugin::Library {
  boost::dll::shared_library library;
  ddp_strategy_v1_t strategy{};
  ddp_transport_v1_t transport{};
};

LoadedPlugin::~LoadedPlugin() = default;

const char* to_string(PluginKind kind) { return kind == PluginKind::Strategy ? "strategy" : "transport"; }

std::string reduce_refusal(uint64_t caps, ddp_dtype reduce, const std::string& name) {
  if (reduce == DDP_FLOAT32 || (caps & DDP_CAP_REDUCE_DTYPE)) return "";
  return std::string("precision.reduce = \"") + compute_name(reduce) + "\": strategy plugin '" + name +
         "' does not reduce gradients in 16 bits (its caps lack DDP_CAP_REDUCE_DTYPE; `ddp plugins` lists "
         "them as reduce-dtype): choose a strategy that does, or precision.reduce = \"fp32\"";
}

std::string default_plugin_dir() {
  const fs::path beside = boost::dll::program_location().parent_path() / ".." / "lib" / "ddp";
  const std::string shipped = fs::weakly_canonical(beside).string();
  const std::string& given = env().plugin_dir;  // DDP_PLUGIN_DIR
  return !given.empty() ? given + ":" + shipped : shipped;
}

std::vector<std::string> search_dirs(const std::string& search_path) {
  std::vector<std::string> dirs;
  size_t begin = 0;
  for (;;) {
    const size_t end = search_path.find(':', begin);
    const std::string dir = search_path.substr(begin, end == std::string::npos ? end : end - begin);
    if (!dir.empty()) dirs.push_back(dir);
    if (end == std::string::npos) return dirs;
    begin = end + 1;
  }
}

namespace {

bool is_path(const std::string& name_or_path) {
  const std::string suffix = ".so";
  return name_or_path.find('/') != std::string::npos ||
         (name_or_path.size() >= suffix.size() &&
          name_or_path.compare(name_or_path.size() - suffix.size(), suffix.size(), suffix) == 0);
}

std::string file_name(PluginKind kind, const std::string& name) {
  return "libddp_" + std::string(to_string(kind)) + "_" + name + ".so";
}

}  // namespace

std::string resolve_plugin_path(PluginKind kind, const std::string& name_or_path, const std::string& search_path) {
  if (is_path(name_or_path)) return name_or_path;
  const std::vector<std::string> dirs = search_dirs(search_path);
  boost::system::error_code ec;
  for (const std::string& dir : dirs) {
    const fs::path candidate = fs::path(dir) / file_name(kind, name_or_path);
    if (fs::exists(candidate, ec)) return candidate.string();
  }
  return (fs::path(dirs.empty() ? std::string(".") : dirs.front()) / file_name(kind, name_or_path)).string();
}

namespace {

// Each file of the search path named libddp_<kind>_<name>.so, in order.
std::vector<fs::path> plugin_files(PluginKind kind, const std::string& search_path) {
  const std::string prefix = "libddp_" + std::string(to_string(kind)) + "_";
  const std::string suffix = ".so";
  std::vector<fs::path> files;
  for (const std::string& dir : search_dirs(search_path)) {
    boost::system::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string f = it->path().filename().string();
      if (f.size() > prefix.size() + suffix.size() && f.rfind(prefix, 0) == 0 &&
          f.compare(f.size() - suffix.size(), suffix.size(), suffix) == 0)
        files.push_back(it->path());
    }
  }
  return files;
}

bool regular(const fs::path& path) {
  boost::system::error_code ec;
  return fs::is_regular_file(path, ec);  // through links
}

}  // namespace

std::string plugin_name_of(PluginKind kind, const std::string& path) {
  const std::string f = fs::path(path).filename().string();
  const size_t prefix = std::string("libddp_").size() + std::string(to_string(kind)).size() + 1;
  const size_t suffix = 3;
  return f.size() > prefix + suffix ? f.substr(prefix, f.size() - prefix - suffix) : f;
}

std::string file_type_name(const std::string& path) {
  boost::system::error_code ec;
  const fs::file_status target = fs::status(path, ec);
  switch (target.type()) {
    case fs::regular_file: return "a regular file";
    case fs::directory_file: return "a directory";
    case fs::fifo_file: return "a FIFO";
    case fs::socket_file: return "a socket";
    case fs::block_file:
    case fs::character_file: return "a device";
    default: break;
  }
  return fs::is_symlink(fs::symlink_status(path, ec)) ? "a dangling symbolic link" : "missing";
}

std::vector<std::string> available_plugins(PluginKind kind, const std::string& search_path) {
  std::vector<std::string> names;
  for (const fs::path& file : plugin_files(kind, search_path))
    if (regular(file)) names.push_back(plugin_name_of(kind, file.string()));
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

std::vector<std::string> irregular_plugin_files(PluginKind kind, const std::string& search_path) {
  std::vector<std::string> paths;
  for (const fs::path& file : plugin_files(kind, search_path))
    if (!regular(file)) paths.push_back(file.string());
  return paths;
}

namespace {

// "file not found", and for a name what there is instead.
std::string not_found(PluginKind kind, const std::string& name_or_path, const std::string& search_path) {
  if (is_path(name_or_path)) return "file not found";
  const std::vector<std::string> names = available_plugins(kind, search_path);
  std::string reason = "file not found";
  std::string dirs;
  for (const std::string& d : search_dirs(search_path)) dirs += (dirs.empty() ? "" : ", ") + d;
  if (names.empty()) return reason + "; no " + to_string(kind) + " plugin in " + dirs;
  const std::string nearest = nearest_name(name_or_path, names);
  if (!nearest.empty()) reason += "; did you mean '" + nearest + "'?";
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  return reason + " (" + to_string(kind) + " plugins in " + dirs + ": " + list + ")";
}

}  // namespace

std::unique_ptr<LoadedPlugin> load_plugin(PluginKind kind, const std::string& name_or_path,
                                          const std::string& plugin_dir) {
  const std::string path = resolve_plugin_path(kind, name_or_path, plugin_dir);
  Refusal refusal(kind, path);

  boost::system::error_code ec;
  if (!fs::exists(path, ec)) refusal.fail(not_found(kind, name_or_path, plugin_dir));
  if (!regular(path)) refusal.fail("not a regular file (" + file_type_name(path) + ")");
  // Where a constructor or a descriptor that misbehaves is found
  // (whereabouts.h: the crash handler, the watchdog, isolated.h).
  const char* const label = whereabouts::intern(std::string(to_string(kind)) + " plugin '" + path + "'");

  std::unique_ptr<LoadedPlugin> plugin(new LoadedPlugin());
  plugin->path_ = path;
  plugin->lib_ = std::make_unique<LoadedPlugin::Library>();
  boost::dll::shared_library& lib = plugin->lib_->library;
  if (const std::string why = elf_truncation(path); !why.empty()) refusal.fail(why);
  try {
    // Absolute, so that a bare "libfoo.so" is not searched for on the
    // library path; local, so that plugins cannot see each other's symbols.
    const whereabouts::Inside in(label, "its constructors (dlopen)");
    lib.load(fs::absolute(path), boost::dll::load_mode::rtld_lazy | boost::dll::load_mode::rtld_local);
  } catch (const boost::system::system_error& e) {
    refusal.fail(dlerror_text(e.what()));
  }

  const whereabouts::Inside in(label, "its descriptor");
  const char* own = entry_symbol(kind);
  const std::string newest = newest_entry(lib, kind);
  if (newest.empty()) {
    const std::string other = newest_entry(lib, other_kind(kind));
    if (other.empty()) {
      refusal.fail("not a ddp plugin (no " DDP_STRATEGY_ENTRY_V1 " or " DDP_TRANSPORT_ENTRY_V1 " symbol)");
    }
    // Every descriptor begins with abi_version, so the version is known.
    refusal.set_plugin_abi(lib.get<const uint32_t>(other));
    refusal.fail(std::string("wrong kind: it is a ") + to_string(other_kind(kind)) + " plugin");
  }
  if (newest != own && !lib.has(own)) {  // only a newer major than this host knows
    refusal.set_plugin_abi(lib.get<const uint32_t>(newest));
    refusal.fail("other major ABI version");
  }

  if (kind == PluginKind::Strategy) {
    const auto& d = lib.get<const ddp_strategy_v1_t>(own);
    refusal.set_plugin_abi(d.abi_version);
    check_header(refusal, d, kStrategyMinSize);
    plugin->lib_->strategy = copy_descriptor(d);
    check_entries(refusal, plugin->lib_->strategy);
    plugin->strategy_ = &plugin->lib_->strategy;
  } else {
    const auto& d = lib.get<const ddp_transport_v1_t>(own);
    refusal.set_plugin_abi(d.abi_version);
    check_header(refusal, d, kTransportMinSize);
    plugin->lib_->transport = copy_descriptor(d);
    check_entries(refusal, plugin->lib_->transport);
    plugin->transport_ = &plugin->lib_->transport;
  }
  const char* named = kind == PluginKind::Strategy ? plugin->strategy_->name : plugin->transport_->name;
  if (!is_path(name_or_path) && name_or_path != named)  // a file renamed from another plugin
    refusal.fail("its descriptor names it '" + std::string(named) + "', not '" + name_or_path + "'");
  return plugin;
}

std::optional<std::vector<PluginKey>> declared_keys(const LoadedPlugin& plugin) {
  const char* const label = whereabouts::intern(std::string(plugin.strategy() ? "strategy" : "transport") +
                                                " plugin '" + plugin.path() + "'");
  const whereabouts::Inside in(label, "its descriptor's keys");
  const ddp_key* keys = plugin.strategy()    ? plugin.strategy()->keys
                        : plugin.transport() ? plugin.transport()->keys
                                             : nullptr;
  if (!keys) return std::nullopt;
  std::vector<PluginKey> out;
  for (const ddp_key* k = keys; k->name; ++k) out.push_back({k->name, k->type ? k->type : "", k->help ? k->help : ""});
  return out;
}

void check_declared_keys(const LoadedPlugin& plugin, const PluginSection& section) {
  const auto keys = declared_keys(plugin);
  if (!keys) return;
  std::vector<std::string> names;
  for (const PluginKey& k : *keys) names.push_back(k.name);
  const bool strategy = plugin.strategy() != nullptr;
  section.check_declared(names, strategy ? "strategy" : "transport",
                         strategy ? plugin.strategy()->name : plugin.transport()->name);
}

std::unique_ptr<LoadedPlugin> load_and_check(PluginKind kind, const std::string& name, const PluginSection& section) {
  std::unique_ptr<LoadedPlugin> plugin = load_plugin(kind, name);
  check_declared_keys(*plugin, section);
  const std::string warning = section.unknown_table(available_plugins(kind, default_plugin_dir()), to_string(kind));
  if (!warning.empty()) std::cerr << "ddp: warning: " << warning << "; its keys go to no plugin\n";
  return plugin;
}

}  // namespace ddp
