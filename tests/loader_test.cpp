// loader_test.cpp — the plugin loader: name resolution, the plugin directory,
// successful loads, and every refusal with its exact message, against the
// small plugins of tests/plugins (built into DDP_TEST_BROKEN_PLUGIN_DIR).
#include <dlfcn.h>
#include <stdlib.h>

#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <algorithm>

#include <gtest/gtest.h>

#include "env.h"
#include "exports.h"
#include "plugin_loader.h"

namespace ddp {
namespace {

// This engine's ABI, as refusals name it: "1.12".
const std::string kAbi = "1." + std::to_string(DDP_ABI_VERSION_MINOR);


namespace fs = std::filesystem;

const std::string kDir = DDP_TEST_BROKEN_PLUGIN_DIR;

std::string plugin_file(const std::string& kind, const std::string& name) {
  return kDir + "/libddp_" + kind + "_" + name + ".so";
}

// Sets or unsets DDP_PLUGIN_DIR for one test and restores it afterwards
// (the engine reads its environment once: load_env reads it again).
class PluginDirEnv {
 public:
  explicit PluginDirEnv(const char* value) {
    if (const char* old = getenv("DDP_PLUGIN_DIR")) old_ = old;
    if (value != nullptr) {
      setenv("DDP_PLUGIN_DIR", value, 1);
    } else {
      unsetenv("DDP_PLUGIN_DIR");
    }
    load_env();
  }
  ~PluginDirEnv() {
    if (old_) {
      setenv("DDP_PLUGIN_DIR", old_->c_str(), 1);
    } else {
      unsetenv("DDP_PLUGIN_DIR");
    }
    load_env();
  }

 private:
  std::optional<std::string> old_;
};

// The message load_plugin refuses with, or "" when it loads.
std::string refusal(PluginKind kind, const std::string& name_or_path,
                    const std::string& plugin_dir = kDir) {
  try {
    load_plugin(kind, name_or_path, plugin_dir);
  } catch (const PluginError& e) {
    return e.what();
  }
  return "";
}

TEST(PluginKind, ToString) {
  EXPECT_STREQ(to_string(PluginKind::Strategy), "strategy");
  EXPECT_STREQ(to_string(PluginKind::Transport), "transport");
}

TEST(ResolvePluginPath, NameBecomesFileInPluginDir) {
  EXPECT_EQ(resolve_plugin_path(PluginKind::Strategy, "naive", "/opt/ddp/lib/ddp"),
            "/opt/ddp/lib/ddp/libddp_strategy_naive.so");
  EXPECT_EQ(resolve_plugin_path(PluginKind::Transport, "gloo", "/opt/ddp/lib/ddp"),
            "/opt/ddp/lib/ddp/libddp_transport_gloo.so");
  EXPECT_EQ(resolve_plugin_path(PluginKind::Transport, "gloo", "plugins"),
            "plugins/libddp_transport_gloo.so");
}

TEST(ResolvePluginPath, PathIsTakenAsGiven) {
  const std::string dir = "/opt/ddp/lib/ddp";
  EXPECT_EQ(resolve_plugin_path(PluginKind::Strategy, "/tmp/libmine.so", dir), "/tmp/libmine.so");
  EXPECT_EQ(resolve_plugin_path(PluginKind::Strategy, "./mine", dir), "./mine");
  EXPECT_EQ(resolve_plugin_path(PluginKind::Strategy, "sub/dir/mine", dir), "sub/dir/mine");
  EXPECT_EQ(resolve_plugin_path(PluginKind::Transport, "libmine.so", dir), "libmine.so");
}

// DDP_PLUGIN_DIR goes in front of the shipped plugins, not instead of
// them: naming one's own directory keeps gloo and the shipped strategies.
TEST(DefaultPluginDir, EnvironmentGoesInFront) {
  PluginDirEnv env("/somewhere/else:/and/more");
  EXPECT_EQ(default_plugin_dir(), "/somewhere/else:/and/more:" + fs::weakly_canonical(DDP_TEST_PLUGIN_DIR).string());
  EXPECT_EQ(search_dirs(default_plugin_dir()),
            (std::vector<std::string>{"/somewhere/else", "/and/more", fs::weakly_canonical(DDP_TEST_PLUGIN_DIR).string()}));
  EXPECT_EQ(search_dirs("::a::b:"), (std::vector<std::string>{"a", "b"}));
}

TEST(ResolvePluginPath, TheFirstDirectoryThatHasIt) {
  const std::string search = kDir + ":" + std::string(DDP_TEST_PLUGIN_DIR);
  EXPECT_EQ(resolve_plugin_path(PluginKind::Transport, "gloo", search),
            std::string(DDP_TEST_PLUGIN_DIR) + "/libddp_transport_gloo.so");
  EXPECT_EQ(resolve_plugin_path(PluginKind::Strategy, "older_minor", search), plugin_file("strategy", "older_minor"));
  EXPECT_EQ(resolve_plugin_path(PluginKind::Strategy, "nowhere", search), plugin_file("strategy", "nowhere"));
  auto plugin = load_plugin(PluginKind::Transport, "gloo", "/nonexistent:" + search);
  EXPECT_EQ(plugin->path(), std::string(DDP_TEST_PLUGIN_DIR) + "/libddp_transport_gloo.so");
}

TEST(NearestName, OnlyWhatIsCloseEnoughToBeATypo) {
  const std::vector<std::string> names = {"bucketed", "flat", "naive", "overlap", "sharded"};
  EXPECT_EQ(nearest_name("bucketd", names), "bucketed");
  EXPECT_EQ(nearest_name("Naive", names), "naive");
  EXPECT_EQ(nearest_name("overlapped", names), "overlap");
  EXPECT_EQ(nearest_name("zero1", names), "");
  EXPECT_EQ(nearest_name("x", {}), "");
}

TEST(LoadPluginRefuses, AMisspeltNameSuggestsTheNearestAndListsWhatThereIs) {
  const std::string dir = std::string(DDP_TEST_PLUGIN_DIR);
  const auto names = available_plugins(PluginKind::Strategy, dir);
  ASSERT_FALSE(names.empty());
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  try {
    load_plugin(PluginKind::Strategy, "bucketd", dir);
    ADD_FAILURE() << "loaded";
  } catch (const PluginError& e) {
    EXPECT_EQ(std::string(e.what()), "cannot load strategy plugin '" + dir +
                                         "/libddp_strategy_bucketd.so' (host ABI " + kAbi + ", plugin ABI none): file not "
                                         "found; did you mean 'bucketed'? (strategy plugins in " +
                                         dir + ": " + list + ")");
  }
  EXPECT_NE(std::find(names.begin(), names.end(), "bucketed"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "naive"), names.end());
}

TEST(DefaultPluginDir, BesideTheExecutable) {
  // The test binary lives in <build>/bin, like ddp itself.
  PluginDirEnv env(nullptr);
  EXPECT_EQ(default_plugin_dir(), fs::weakly_canonical(DDP_TEST_PLUGIN_DIR).string());
}

TEST(LoadPlugin, ByNameFromDdpPluginDir) {
  PluginDirEnv env(kDir.c_str());
  auto plugin = load_plugin(PluginKind::Strategy, "valid");
  EXPECT_EQ(plugin->path(), plugin_file("strategy", "valid"));
  ASSERT_NE(plugin->strategy(), nullptr);
  EXPECT_STREQ(plugin->strategy()->name, "valid");
}

// Holding gradients (1.4) goes with stepping them: the loader refuses the
// one without the other, and a claiming strategy without grad_ranges.
TEST(LoadPluginRefuses, OwnsGradientsWithoutOwningTheOptimizer) {
  EXPECT_EQ(refusal(PluginKind::Strategy, "claims_noopt"),
            "cannot load strategy plugin '" + plugin_file("strategy", "claims_noopt") +
                "' (host ABI " + kAbi + ", plugin ABI " + kAbi + "): caps has DDP_CAP_OWNS_GRADIENTS without DDP_CAP_OWNS_OPTIMIZER: "
                "a strategy that holds gradients steps them itself (run_optimizer_ranges)");
}

// Holding values (1.5) goes with stepping them and lending them unit by
// unit to the engine's readers.
TEST(LoadPluginRefuses, OwnsParametersWithoutUnitValues) {
  EXPECT_EQ(refusal(PluginKind::Strategy, "claims_values_nounit"),
            "cannot load strategy plugin '" + plugin_file("strategy", "claims_values_nounit") +
                "' (host ABI " + kAbi + ", plugin ABI " + kAbi + "): required entry 'unit_values' is NULL (caps has "
                "DDP_CAP_OWNS_PARAMETERS)");
}

// Replicas that may differ (1.8) need the entry that says when they are
// equal again.
TEST(LoadPluginRefuses, DivergentWithoutOnStepEnd) {
  EXPECT_EQ(refusal(PluginKind::Strategy, "divergent_noentry"),
            "cannot load strategy plugin '" + plugin_file("strategy", "divergent_noentry") +
                "' (host ABI " + kAbi + ", plugin ABI " + kAbi + "): required entry 'on_step_end' is NULL (caps has "
                "DDP_CAP_DIVERGENT)");
}

TEST(LoadPluginRefuses, DivergentShards) {
  EXPECT_EQ(refusal(PluginKind::Strategy, "divergent_shards"),
            "cannot load strategy plugin '" + plugin_file("strategy", "divergent_shards") +
                "' (host ABI " + kAbi + ", plugin ABI " + kAbi + "): caps has DDP_CAP_DIVERGENT with DDP_CAP_OWNS_GRADIENTS or "
                "DDP_CAP_OWNS_PARAMETERS: replicas that differ are whole on every rank, not shards of one model");
}

TEST(LoadPlugin, ValidStrategy) {
  auto plugin = load_plugin(PluginKind::Strategy, "valid", kDir);
  EXPECT_EQ(plugin->path(), plugin_file("strategy", "valid"));
  EXPECT_EQ(plugin->transport(), nullptr);
  const ddp_strategy_v1_t* s = plugin->strategy();
  ASSERT_NE(s, nullptr);
  // Built against the 1.3 header as released (tests/abi_1_3): it loads as
  // it is, and what 1.4 appended reads as absent.
  EXPECT_EQ(s->abi_version, (1u << 16) | 3u);
  EXPECT_EQ(s->struct_size, offsetof(ddp_strategy_v1_t, on_unit));
  EXPECT_EQ(s->on_unit, nullptr);
  EXPECT_EQ(s->plan, nullptr);
  EXPECT_STREQ(s->name, "valid");
  EXPECT_STREQ(s->version, "1.2.3");
  EXPECT_EQ(s->caps, DDP_CAP_DEVICE_CPU | DDP_CAP_OWNS_OPTIMIZER);
  EXPECT_NE(s->optimizer_step, nullptr);
  EXPECT_EQ(s->stats, nullptr);  // optional
  // The library is still loaded: its entries can be called.
  EXPECT_EQ(s->finish(nullptr), DDP_OK);
}

TEST(LoadPlugin, ValidTransport) {
  auto plugin = load_plugin(PluginKind::Transport, plugin_file("transport", "valid"));
  EXPECT_EQ(plugin->strategy(), nullptr);
  const ddp_transport_v1_t* t = plugin->transport();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->abi_version, (1u << 16) | 3u);  // built against 1.3, as above
  EXPECT_EQ(t->struct_size, offsetof(ddp_transport_v1_t, plan));
  EXPECT_EQ(t->plan, nullptr);
  EXPECT_STREQ(t->name, "valid");
  EXPECT_STREQ(t->version, "0.4.0");
  EXPECT_EQ(t->caps, DDP_CAP_DEVICE_CPU | DDP_CAP_DEVICE_CUDA);
  EXPECT_EQ(t->barrier(nullptr, nullptr), DDP_OK);
}

TEST(LoadPlugin, BareFileNameIsRelativeToWorkingDirectory) {
  // Not searched for on the library path as dlopen would a bare name.
  const fs::path cwd = fs::current_path();
  fs::current_path(kDir);
  std::unique_ptr<LoadedPlugin> plugin;
  EXPECT_NO_THROW(plugin = load_plugin(PluginKind::Transport, "libddp_transport_valid.so",
                                       "/nonexistent"));
  fs::current_path(cwd);
  ASSERT_NE(plugin, nullptr);
  EXPECT_EQ(plugin->path(), "libddp_transport_valid.so");
  ASSERT_NE(plugin->transport(), nullptr);
  EXPECT_STREQ(plugin->transport()->name, "valid");
}

TEST(LoadPlugin, NewerMinorWithLargerDescriptor) {
  auto plugin = load_plugin(PluginKind::Strategy, "newer_minor", kDir);
  const ddp_strategy_v1_t* s = plugin->strategy();
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(DDP_ABI_MAJOR(s->abi_version), 1u);
  EXPECT_EQ(DDP_ABI_MINOR(s->abi_version), 9u);
  EXPECT_GT(s->struct_size, sizeof(ddp_strategy_v1_t));
  EXPECT_STREQ(s->name, "newer_minor");
}

// A plugin built against ABI 1.1 loads on this 1.2 engine, and the entry
// 1.2 appended (held_grads) reads as absent whatever lies past its struct.
TEST(LoadPlugin, OlderMinorLoadsWithoutTheEntriesAppendedSince) {
  auto plugin = load_plugin(PluginKind::Strategy, "older_minor", kDir);
  const ddp_strategy_v1_t* s = plugin->strategy();
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(DDP_ABI_MINOR(s->abi_version), 1u);
  EXPECT_EQ(s->held_grads, nullptr);
  EXPECT_NE(s->finish, nullptr);
}

TEST(LoadPluginRefuses, FileNotFoundByName) {
  std::string list;
  for (const auto& n : available_plugins(PluginKind::Strategy, kDir)) list += (list.empty() ? "" : ", ") + n;
  EXPECT_EQ(refusal(PluginKind::Strategy, "missing"),
            "cannot load strategy plugin '" + plugin_file("strategy", "missing") +
                "' (host ABI " + kAbi + ", plugin ABI none): file not found (strategy plugins in " + kDir + ": " + list + ")");
  EXPECT_EQ(refusal(PluginKind::Strategy, "missing", "/nonexistent"),
            "cannot load strategy plugin '/nonexistent/libddp_strategy_missing.so' (host ABI " + kAbi + ", plugin ABI none): "
            "file not found; no strategy plugin in /nonexistent");
}

TEST(LoadPluginRefuses, FileNotFoundByPath) {
  EXPECT_EQ(refusal(PluginKind::Transport, "/nonexistent/libddp_transport_x.so"),
            "cannot load transport plugin '/nonexistent/libddp_transport_x.so' "
            "(host ABI " + kAbi + ", plugin ABI none): file not found");
}

TEST(LoadPluginRefuses, NotAPlugin) {
  const std::string path = kDir + "/libnot_a_ddp_plugin.so";  // a shared library, but no entry symbol
  EXPECT_EQ(refusal(PluginKind::Strategy, path),
            "cannot load strategy plugin '" + path +
                "' (host ABI " + kAbi + ", plugin ABI none): not a ddp plugin "
                "(no ddp_strategy_v1 or ddp_transport_v1 symbol)");
}

TEST(LoadPluginRefuses, NotASharedLibrary) {
  char tmpl[] = "/tmp/ddp_loader_test.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const fs::path dir = tmpl;
  const std::string path = (dir / "libddp_strategy_garbage.so").string();
  {
    std::ofstream out(path);
    out << "this is a text file, not a shared library\n";
  }
  // The reason is dlerror()'s own text, whatever this libc words it as.
  void* handle = dlopen(path.c_str(), RTLD_LAZY | RTLD_LOCAL);
  ASSERT_EQ(handle, nullptr);
  const std::string dl_message = dlerror();

  EXPECT_EQ(refusal(PluginKind::Strategy, "garbage", dir.string()),
            "cannot load strategy plugin '" + path + "' (host ABI " + kAbi + ", plugin ABI none): " +
                dl_message);
  fs::remove_all(dir);
}

// dlopen maps a library cut short and dies of SIGBUS touching what is not
// there: the file is measured against its ELF headers first.
TEST(LoadPluginRefuses, ATruncatedLibraryIsNamedNotLoaded) {
  char tmpl[] = "/tmp/ddp_loader_test.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const fs::path dir = tmpl;
  const std::string whole = std::string(DDP_TEST_PLUGIN_DIR) + "/libddp_strategy_naive.so";
  const uintmax_t size = fs::file_size(whole);
  const std::string path = (dir / "libddp_strategy_cut.so").string();
  for (const uintmax_t cut : {uintmax_t{40}, uintmax_t{3000}, uintmax_t{12000}, size / 2, size - 1}) {
    fs::copy_file(whole, path, fs::copy_options::overwrite_existing);
    fs::resize_file(path, cut);
    const std::string got = refusal(PluginKind::Strategy, path);
    EXPECT_EQ(got.rfind("cannot load strategy plugin '" + path + "' (host ABI " + kAbi + ", plugin ABI none): truncated: " +
                            std::to_string(cut) + " bytes, where its ELF headers describe ",
                        0),
              0u)
        << got;
  }
  fs::remove_all(dir);
}

TEST(LoadPluginRefuses, NewerMajorEntrySymbol) {
  EXPECT_EQ(refusal(PluginKind::Strategy, "v2"),
            "cannot load strategy plugin '" + plugin_file("strategy", "v2") +
                "' (host ABI " + kAbi + ", plugin ABI 2.3): other major ABI version");
}

// A v1 symbol whose descriptor claims another major (a broken build).
TEST(LoadPluginRefuses, OtherMajorAbiVersion) {
  EXPECT_EQ(refusal(PluginKind::Strategy, "abi2"),
            "cannot load strategy plugin '" + plugin_file("strategy", "abi2") +
                "' (host ABI " + kAbi + ", plugin ABI 2.0): other major ABI version");
}

TEST(LoadPluginRefuses, StrategyLoadedAsTransport) {
  const std::string path = plugin_file("strategy", "valid");
  EXPECT_EQ(refusal(PluginKind::Transport, path),
            "cannot load transport plugin '" + path +
                "' (host ABI " + kAbi + ", plugin ABI 1.3): wrong kind: it is a strategy plugin");
}

TEST(LoadPluginRefuses, TransportLoadedAsStrategy) {
  const std::string path = plugin_file("transport", "valid");
  EXPECT_EQ(refusal(PluginKind::Strategy, path),
            "cannot load strategy plugin '" + path +
                "' (host ABI " + kAbi + ", plugin ABI 1.3): wrong kind: it is a transport plugin");
}

TEST(LoadPluginRefuses, DescriptorTooSmall) {
  const size_t have = offsetof(ddp_transport_v1_t, barrier);
  const size_t need = have + sizeof(ddp_transport_v1_t::barrier);
  EXPECT_EQ(refusal(PluginKind::Transport, "small"),
            "cannot load transport plugin '" + plugin_file("transport", "small") +
                "' (host ABI " + kAbi + ", plugin ABI 1.3): descriptor too small (struct_size " +
                std::to_string(have) + ", need " + std::to_string(need) + ")");
}

TEST(LoadPluginRefuses, NullName) {
  EXPECT_EQ(refusal(PluginKind::Transport, "noname"),
            "cannot load transport plugin '" + plugin_file("transport", "noname") +
                "' (host ABI " + kAbi + ", plugin ABI 1.3): required entry 'name' is NULL");
}

TEST(LoadPluginRefuses, NullRequiredEntry) {
  EXPECT_EQ(refusal(PluginKind::Strategy, "nofinish"),
            "cannot load strategy plugin '" + plugin_file("strategy", "nofinish") +
                "' (host ABI " + kAbi + ", plugin ABI 1.3): required entry 'finish' is NULL");
}

TEST(LoadPluginRefuses, OwnsOptimizerWithoutOptimizerStep) {
  EXPECT_EQ(refusal(PluginKind::Strategy, "ownsopt"),
            "cannot load strategy plugin '" + plugin_file("strategy", "ownsopt") +
                "' (host ABI " + kAbi + ", plugin ABI 1.3): required entry 'optimizer_step' is NULL "
                "(caps has DDP_CAP_OWNS_OPTIMIZER)");
}


// Standing rule: a plugin exports exactly one symbol, its entry — the test
// plugins and every plugin the build ships.
TEST(PluginExports, ExactlyItsEntrySymbol) {
  std::vector<std::string> files = {plugin_file("strategy", "valid"), plugin_file("transport", "valid")};
  for (const auto& entry : std::filesystem::directory_iterator(DDP_TEST_PLUGIN_DIR))
    if (entry.path().filename().string().rfind("libddp_", 0) == 0) files.push_back(entry.path().string());
  ASSERT_GE(files.size(), 4u) << "the shipped plugins (gloo, naive) are missing from " << DDP_TEST_PLUGIN_DIR;
  for (const auto& file : files) {
    auto symbols = test::exported_symbols(file);
    if (!symbols) GTEST_SKIP() << "nm is not available";
    const bool strategy = file.find("libddp_strategy_") != std::string::npos;
    EXPECT_EQ(*symbols, std::vector<std::string>{strategy ? DDP_STRATEGY_ENTRY_V1 : DDP_TRANSPORT_ENTRY_V1})
        << file;
  }
}

// Every shipped plugin loads and describes itself with its folder's name.
TEST(ShippedPlugins, LoadByName) {
  for (const auto& [kind, name] : {std::pair{PluginKind::Transport, "gloo"}, std::pair{PluginKind::Strategy, "naive"}}) {
    auto plugin = load_plugin(kind, name, DDP_TEST_PLUGIN_DIR);
    const char* described = kind == PluginKind::Strategy ? plugin->strategy()->name : plugin->transport()->name;
    EXPECT_STREQ(described, name);
  }
}

}  // namespace
}  // namespace ddp

namespace ddp {
namespace {

TEST(FormatPlugins, OneLinePerPluginOrWhyItCannotLoadThenItsKeys) {
  PluginInfo ok{PluginKind::Strategy, "sharded", "/p/libddp_strategy_sharded.so", "0.2.0", (1u << 16) | 3,
                DDP_CAP_DEVICE_CPU | DDP_CAP_DEVICE_CUDA | DDP_CAP_OWNS_OPTIMIZER, "",
                std::vector<PluginKey>{{"variant", "string", "how"}, {"bucket_mb", "float", "MiB"}}, 0};
  PluginInfo none{PluginKind::Strategy, "naive", "/p/n.so", "0.1.0", (1u << 16) | 3, DDP_CAP_DEVICE_CPU, "",
                  std::vector<PluginKey>{}, 0};
  PluginInfo old{PluginKind::Strategy, "old", "/p/o.so", "0.1.0", (1u << 16) | 2, DDP_CAP_DEVICE_CPU, "",
                 std::nullopt, 0};
  PluginInfo bad{PluginKind::Transport, "x", "/p/libddp_transport_x.so", "", 0, 0, "cannot load transport plugin",
                 std::nullopt, 0};
  PluginInfo gloo{PluginKind::Transport, "gloo", "/p/g.so", "0.4.0", (1u << 16) | 3, DDP_CAP_DEVICE_CPU, "",
                  std::vector<PluginKey>{}, DDP_DTYPE_BIT(DDP_FLOAT32) | DDP_DTYPE_BIT(DDP_BFLOAT16)};
  PluginInfo zero2{PluginKind::Strategy, "z2", "/p/z.so", "0.3.0", (1u << 16) | 4,
                   DDP_CAP_DEVICE_CPU | DDP_CAP_OWNS_OPTIMIZER | DDP_CAP_OWNS_GRADIENTS, "", std::vector<PluginKey>{}, 0,
                   /*plans=*/true};
  EXPECT_EQ(format_plugins({zero2}),
            "strategy   z2          0.3.0  ABI 1.4  cpu,owns-optimizer,owns-gradients,plans  /p/z.so\n    (no keys)\n");
  PluginInfo zero3 = zero2;
  zero3.name = "z3", zero3.abi_version = (1u << 16) | 5, zero3.caps |= DDP_CAP_OWNS_PARAMETERS;
  EXPECT_EQ(format_plugins({zero3}), "strategy   z3          0.3.0  ABI 1.5  "
                                     "cpu,owns-optimizer,owns-gradients,owns-parameters,plans  /p/z.so\n    (no keys)\n");
  PluginInfo reduces = zero3;  // (1.11) a strategy that reduces in [precision] reduce
  reduces.name = "r";
  reduces.abi_version = (1u << 16) | 11;
  reduces.caps |= DDP_CAP_REDUCE_DTYPE;
  EXPECT_EQ(format_plugins({reduces}),
            "strategy   r           0.3.0  ABI 1.11  "
            "cpu,owns-optimizer,owns-gradients,owns-parameters,reduce-dtype,plans  /p/z.so\n    (no keys)\n");
  EXPECT_EQ(format_plugins({ok, none, old, bad, gloo}),
            "strategy   sharded     0.2.0  ABI 1.3  cpu,cuda,owns-optimizer  /p/libddp_strategy_sharded.so\n"
            "    variant             string            how\n"
            "    bucket_mb           float             MiB\n"
            "strategy   naive       0.1.0  ABI 1.3  cpu  /p/n.so\n"
            "    (no keys)\n"
            "strategy   old         0.1.0  ABI 1.2  cpu  /p/o.so\n"
            "    (keys not declared: checked once the plugin starts)\n"
            "transport  x           cannot load: cannot load transport plugin\n"
            "transport  gloo        0.4.0  ABI 1.3  cpu  /p/g.so\n"
            "    dtypes: float32, bfloat16\n"
            "    (no keys)\n");
}

// Every plugin of the search path, loaded as a run loads it: the broken
// test plugins say why, the shipped ones give their descriptors.
TEST(DescribePlugins, LoadsEachAsARunWould) {
  const auto shipped = describe_plugins(PluginKind::Transport, DDP_TEST_PLUGIN_DIR);
  auto gloo = std::find_if(shipped.begin(), shipped.end(), [](const PluginInfo& p) { return p.name == "gloo"; });
  ASSERT_NE(gloo, shipped.end());
  EXPECT_EQ(gloo->refusal, "");
  EXPECT_EQ(gloo->abi_version, DDP_ABI_VERSION);
  EXPECT_TRUE(gloo->caps & DDP_CAP_DEVICE_CPU);
  const auto broken = describe_plugins(PluginKind::Strategy, kDir, std::chrono::seconds(5));  // one hangs
  auto abi2 = std::find_if(broken.begin(), broken.end(), [](const PluginInfo& p) { return p.name == "abi2"; });
  ASSERT_NE(abi2, broken.end());
  EXPECT_EQ(abi2->refusal, refusal(PluginKind::Strategy, "abi2"));
}

}  // namespace
}  // namespace ddp
