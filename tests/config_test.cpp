// config_test.cpp — load_config / validate_config / PluginSection: the
// exact error messages of config.h, --set overrides, defaults and paths.
#include "config.h"
#include "cpu_host.h"
#include "plugin_host.h"
#include "plugin_loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

namespace ddp {
namespace {

namespace fs = std::filesystem;

// The smallest valid config: only the required keys.
const char* const kMinimal = R"([run]
steps = 10

[model]
name = "toy"

[data]
batch_size = 8

[optimizer]
lr = 0.1
)";

// A fresh directory per test, so that tests can run in parallel (ctest -j).
class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("ddp_config_test_" + std::to_string(getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes `text` to <dir>/<name> and returns the path.
  std::string write(const std::string& name, const std::string& text) {
    const fs::path path = dir_ / name;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
    return path.string();
  }

  fs::path dir_;
};

// The message of the ConfigError that `f` throws, or a marker that fails
// any EXPECT_EQ against a real message.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no ConfigError>";
}

std::string load_error(const std::string& path, const std::vector<std::string>& overrides = {}) {
  return error_of([&] { load_config(path, overrides); });
}

TEST_F(ConfigTest, FullFileYieldsEveryValue) {
  const std::string path = write("full.toml", R"([run]
world_size = 4
steps = 100
seed = 42
output_dir = "out/full"
timeout_s = 12.5
log_every = 10

[model]
name = "toy_tied"
init_from = "/abs/init.safetensors"

[data]
path = "/abs/data.safetensors"
batch_size = 64

[optimizer]
name = "sgd"
lr = 0.05

[transport]
plugin = "tcp"
port = 9000

[strategy]
plugin = "bucketed"
bucket_mb = 25
)");
  const Config c = load_config(path);
  EXPECT_EQ(c.file, path);
  EXPECT_EQ(c.run.world_size, 4);
  EXPECT_EQ(c.run.steps, 100);
  EXPECT_EQ(c.run.seed, 42u);
  EXPECT_EQ(c.run.output_dir, "out/full");
  EXPECT_DOUBLE_EQ(c.run.timeout_s, 12.5);
  EXPECT_EQ(c.run.log_every, 10);
  EXPECT_EQ(c.model.name, "toy_tied");
  EXPECT_EQ(c.model.init_from, "/abs/init.safetensors");
  EXPECT_EQ(c.data.path, "/abs/data.safetensors");
  EXPECT_EQ(c.data.batch_size, 64);
  EXPECT_EQ(c.optimizer.name, "sgd");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.05);
  EXPECT_EQ(c.transport_plugin, "tcp");
  EXPECT_EQ(c.strategy_plugin, "bucketed");
  EXPECT_EQ(c.transport.section(), "transport");
  EXPECT_EQ(c.strategy.section(), "strategy");
  EXPECT_EQ(c.transport.get_int("port", 0), 9000);
  EXPECT_EQ(c.strategy.get_int("bucket_mb", 0), 25);
  // The effective document round-trips through toml_text.
  const toml::table text = toml::parse(c.toml_text);
  EXPECT_EQ(text["run"]["steps"].value<int64_t>(), 100);
  EXPECT_EQ(text["strategy"]["plugin"].value<std::string>(), "bucketed");
}

TEST_F(ConfigTest, Defaults) {
  const Config c = load_config(write("small.toml", kMinimal));
  EXPECT_EQ(c.run.world_size, 1);
  EXPECT_EQ(c.run.steps, 10);
  EXPECT_EQ(c.run.seed, 0u);
  EXPECT_EQ(c.run.output_dir, "runs/small");  // stem of the config file
  EXPECT_DOUBLE_EQ(c.run.timeout_s, 30.0);
  EXPECT_EQ(c.run.log_every, 1);
  EXPECT_EQ(c.run.device, DDP_DEVICE_CPU);
  EXPECT_FALSE(c.run.share_gpus);
  EXPECT_EQ(c.model.name, "toy");
  EXPECT_EQ(c.model.init_from, "");
  EXPECT_EQ(c.data.path, "");
  EXPECT_EQ(c.data.batch_size, 8);
  EXPECT_EQ(c.optimizer.name, "sgd");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.1);
  EXPECT_EQ(c.transport_plugin, "gloo");
  EXPECT_EQ(c.strategy_plugin, "naive");
  EXPECT_NO_THROW(c.transport.check_all_read("transport", "gloo"));
  EXPECT_NO_THROW(c.strategy.check_all_read("strategy", "naive"));
}

TEST_F(ConfigTest, IntegerAcceptedForFloat) {
  const Config c = load_config(write("c.toml", R"([run]
steps = 1
timeout_s = 5
[model]
name = "toy"
[data]
batch_size = 1
[optimizer]
lr = 2
)"));
  EXPECT_DOUBLE_EQ(c.run.timeout_s, 5.0);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 2.0);
}

TEST_F(ConfigTest, RelativePaths) {
  // Data paths are relative to the config file; output_dir to the cwd.
  const std::string path = write("configs/run.toml", R"([run]
steps = 1
output_dir = "out/rel"
[model]
name = "toy"
init_from = "../fixtures/init.safetensors"
[data]
path = "data.safetensors"
batch_size = 1
[optimizer]
lr = 0.1
)");
  const Config c = load_config(path);
  EXPECT_EQ(c.model.init_from, (dir_ / "fixtures/init.safetensors").lexically_normal().string());
  EXPECT_EQ(c.data.path, (dir_ / "configs/data.safetensors").lexically_normal().string());
  EXPECT_EQ(c.run.output_dir, "out/rel");

  // A path given on the command line is relative to the cwd.
  const Config s = load_config(path, {"data.path=cli/data.safetensors"});
  EXPECT_EQ(s.data.path, "cli/data.safetensors");
  EXPECT_EQ(s.model.init_from, (dir_ / "fixtures/init.safetensors").lexically_normal().string());
}

TEST_F(ConfigTest, FileMissing) {
  const std::string path = (dir_ / "nope.toml").string();
  EXPECT_EQ(load_error(path), path + ": cannot open config file");
  EXPECT_EQ(load_error(dir_.string()), dir_.string() + ": cannot open config file");
}

TEST_F(ConfigTest, ParseError) {
  const std::string path = write("c.toml", "[run]\nsteps = = 3\n");
  EXPECT_EQ(load_error(path),
            path + ":2:9: Error while parsing value: could not determine value type");
}

TEST_F(ConfigTest, UnknownKey) {
  const std::string typo = write("typo.toml", std::string("[run]\nsteps = 1\nstep = 2\n") +
                                                  "[model]\nname = \"toy\"\n");
  EXPECT_EQ(load_error(typo), typo + ":3:8: unknown key 'run.step'");
  // A top-level key that is not a section.
  const std::string top = write("top.toml", std::string("debug = true\n") + kMinimal);
  EXPECT_EQ(load_error(top), top + ":1:9: unknown key 'debug'");
}

TEST_F(ConfigTest, UnknownSection) {
  const std::string path = write("c.toml", std::string(kMinimal) + "\n[extra]\nx = 1\n");
  EXPECT_EQ(load_error(path), path + ":13:1: unknown section 'extra'");
}

// kMinimal with `line` added at the end of [run] (line 3 of the file).
std::string minimal_with_run(const std::string& line) {
  return "[run]\nsteps = 10\n" + line + "\n[model]\nname = \"toy\"\n[data]\nbatch_size = 8\n" +
         "[optimizer]\nlr = 0.1\n";
}

TEST_F(ConfigTest, WrongTypes) {
  struct Case {
    std::string line, message;
  };
  const Case cases[] = {
      {"world_size = \"4\"", ":3:14: key 'run.world_size' must be an integer, not a string"},
      {"world_size = 2.0", ":3:14: key 'run.world_size' must be an integer, not a float"},
      {"seed = true", ":3:8: key 'run.seed' must be an integer, not a boolean"},
      {"log_every = [1]", ":3:13: key 'run.log_every' must be an integer, not an array"},
      {"log_every = { n = 1 }", ":3:13: key 'run.log_every' must be an integer, not a table"},
      {"timeout_s = \"30\"", ":3:13: key 'run.timeout_s' must be a float, not a string"},
      {"output_dir = 7", ":3:14: key 'run.output_dir' must be a string, not an integer"},
      {"output_dir = 1979-05-27", ":3:14: key 'run.output_dir' must be a string, not a date"},
      {"output_dir = 07:32:00", ":3:14: key 'run.output_dir' must be a string, not a time"},
      {"output_dir = 1979-05-27T07:32:00",
       ":3:14: key 'run.output_dir' must be a string, not a date-time"},
  };
  for (const Case& c : cases) {
    const std::string path = write("c.toml", minimal_with_run(c.line));
    EXPECT_EQ(load_error(path), path + c.message) << c.line;
  }
  // A section that is not a table.
  const std::string path = write("s.toml", "model = \"toy\"\n[run]\nsteps = 1\n");
  EXPECT_EQ(load_error(path), path + ":1:9: key 'model' must be a table, not a string");
  // Plugin names are typed too.
  const std::string plugin = write("p.toml", std::string(kMinimal) + "[strategy]\nplugin = 3\n");
  EXPECT_EQ(load_error(plugin),
            plugin + ":13:10: key 'strategy.plugin' must be a string, not an integer");
}

TEST_F(ConfigTest, MissingRequiredKeys) {
  struct Case {
    std::string drop, key;
  };
  const Case cases[] = {{"steps = 10\n", "run.steps"},
                        {"name = \"toy\"\n", "model.name"},
                        {"batch_size = 8\n", "data.batch_size"},
                        {"lr = 0.1\n", "optimizer.lr"}};
  for (const Case& c : cases) {
    std::string text = kMinimal;
    text.erase(text.find(c.drop), c.drop.size());
    const std::string path = write("c.toml", text);
    EXPECT_EQ(load_error(path), path + ": missing required key '" + c.key + "'");
  }
  // An empty file misses the first required key.
  const std::string empty = write("empty.toml", "");
  EXPECT_EQ(load_error(empty), empty + ": missing required key 'run.steps'");
}

// A value that cannot train (issue 13): infinities and NaN are refused by
// name wherever a number is read; run.check_finite reads as a boolean.
TEST_F(ConfigTest, NonFiniteNumbersAreRefused) {
  struct Case {
    std::string set, message;
  };
  const Case cases[] = {
      {"run.timeout_s=inf", "--set run.timeout_s=inf: key 'run.timeout_s' must be finite (got inf)"},
      {"optimizer.lr=inf", "--set optimizer.lr=inf: key 'optimizer.lr' must be finite (got inf)"},
      {"optimizer.lr=nan", "--set optimizer.lr=nan: key 'optimizer.lr' must be > 0 (got nan)"},
      {"optimizer.momentum=inf", "--set optimizer.momentum=inf: key 'optimizer.momentum' must be finite (got inf)"},
      {"optimizer.weight_decay=inf",
       "--set optimizer.weight_decay=inf: key 'optimizer.weight_decay' must be finite (got inf)"},
  };
  const std::string path = write("c.toml", kMinimal);
  for (const Case& c : cases) EXPECT_EQ(load_error(path, {c.set}), c.message) << c.set;
  const std::string group = write("g.toml", std::string(kMinimal) + "[[optimizer.groups]]\nparams = \"fc1.*\"\nlr = inf\n");
  EXPECT_EQ(load_error(group), group + ":14:6: key 'optimizer.groups[0].lr' must be finite (got inf)");
  EXPECT_TRUE(load_config(path).run.check_finite);
  EXPECT_FALSE(load_config(path, {"run.check_finite=false"}).run.check_finite);
}

// The replica check (issue 13): every 10 steps by default, 0 for only at
// the end, never negative; run.debug_collectives off by default.
TEST_F(ConfigTest, ReplicaChecksAndCollectiveDebugging) {
  const std::string path = write("c.toml", kMinimal);
  EXPECT_EQ(load_config(path).run.check_replicas_every, 10);
  EXPECT_EQ(load_config(path, {"run.check_replicas_every=0"}).run.check_replicas_every, 0);
  EXPECT_EQ(load_error(path, {"run.check_replicas_every=-1"}),
            "--set run.check_replicas_every=-1: key 'run.check_replicas_every' must be >= 0 (got -1)");
  EXPECT_FALSE(load_config(path).run.debug_collectives);
  EXPECT_TRUE(load_config(path, {"run.debug_collectives=true"}).run.debug_collectives);
  EXPECT_EQ(load_error(path, {"run.debug_collectives=1"}),
            "--set run.debug_collectives=1: key 'run.debug_collectives' must be a boolean, not an integer");
}

// Hostile input (issue 13): a config that is not a regular file or is far
// too large to be one, a batch beyond what a rank can index.
TEST_F(ConfigTest, OnlyARegularFileOfBoundedSizeIsRead) {
  EXPECT_EQ(load_error("/dev/zero"), "/dev/zero: cannot open config file");
  const std::string fifo = write("c.toml", kMinimal) + ".fifo";  // no writer: opening it blocking would hang
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(load_error(fifo), fifo + ": cannot open config file");
  const std::string big = write("big.toml", std::string(kMinimal) + "# " + std::string(2 << 20, 'x') + "\n");
  EXPECT_EQ(load_error(big), big + ": " + std::to_string(std::filesystem::file_size(big)) +
                                 " bytes is not a config file (at most 1048576)");
  const std::string path = write("c.toml", kMinimal);
  EXPECT_EQ(load_error(path, {"data.batch_size=4294967296"}),
            "--set data.batch_size=4294967296: key 'data.batch_size' must be <= 2147483647 (got 4294967296)");
}

TEST_F(ConfigTest, ValueConstraints) {
  struct Case {
    std::string line, message;
  };
  const Case cases[] = {
      {"world_size = 0", ":3:14: key 'run.world_size' must be >= 1 (got 0)"},
      {"world_size = 3000000000",
       ":3:14: key 'run.world_size' must be <= 1048576 (got 3000000000)"},
      {"world_size = 1048577", ":3:14: key 'run.world_size' must be <= 1048576 (got 1048577)"},
      {"seed = -1", ":3:8: key 'run.seed' must be >= 0 (got -1)"},
      {"timeout_s = 0", ":3:13: key 'run.timeout_s' must be > 0 (got 0)"},
      {"timeout_s = -1.5", ":3:13: key 'run.timeout_s' must be > 0 (got -1.5)"},
      {"log_every = 0", ":3:13: key 'run.log_every' must be >= 1 (got 0)"},
      // Beyond what a transport's millisecond timeout holds.
      {"timeout_s = 1e16", ":3:13: key 'run.timeout_s' must be <= 1000000 (got 1e+16)"},
      {"output_dir = \"\"",
       ":3:14: key 'run.output_dir' must be a directory (\".\" for the working directory) (got '')"},
      {"output_dir = \"/\"", ":3:14: key 'run.output_dir' must be a directory other than the root (got '/')"},
      {"output_dir = \"/tmp/..\"",
       ":3:14: key 'run.output_dir' must be a directory other than the root (got '/tmp/..')"},
  };
  for (const Case& c : cases) {
    const std::string path = write("c.toml", minimal_with_run(c.line));
    EXPECT_EQ(load_error(path), path + c.message) << c.line;
  }
  auto replaced = [](const std::string& from, const std::string& to) {
    std::string text = kMinimal;
    return text.replace(text.find(from), from.size(), to);
  };
  const std::string steps = write("steps.toml", replaced("steps = 10", "steps = -1"));
  EXPECT_EQ(load_error(steps), steps + ":2:9: key 'run.steps' must be >= 0 (got -1)");
  const std::string batch = write("batch.toml", replaced("batch_size = 8", "batch_size = 0"));
  EXPECT_EQ(load_error(batch), batch + ":8:14: key 'data.batch_size' must be >= 1 (got 0)");
  const std::string lr = write("lr.toml", replaced("lr = 0.1", "lr = -0.5"));
  EXPECT_EQ(load_error(lr), lr + ":11:6: key 'optimizer.lr' must be > 0 (got -0.5)");
  const std::string model = write("model.toml", replaced("\"toy\"", "\"bert\""));
  EXPECT_EQ(load_error(model),
            model + ":5:8: key 'model.name' must be one of: toy, toy_tied, mlp, lm (got 'bert')");
  const std::string opt = write("opt.toml", replaced("lr = 0.1", "lr = 0.1\nname = \"adam\""));
  EXPECT_EQ(load_error(opt), opt + ":12:8: key 'optimizer.name' must be one of: sgd, adamw (got 'adam')");
  const std::string device = write("device.toml", replaced("steps = 10", "steps = 10\ndevice = \"gpu\""));
  EXPECT_EQ(load_error(device), device + ":3:10: key 'run.device' must be one of: cpu, cuda (got 'gpu')");
  const std::string share = write("share.toml", replaced("steps = 10", "steps = 10\nshare_gpus = 1"));
  EXPECT_EQ(load_error(share), share + ":3:14: key 'run.share_gpus' must be a boolean, not an integer");
}

TEST_F(ConfigTest, BatchNotDivisibleByWorldSize) {
  const std::string path = write("c.toml", minimal_with_run("world_size = 3"));
  // batch_size = 8 is on line 7 of minimal_with_run's text.
  EXPECT_EQ(load_error(path),
            path + ":7:14: key 'data.batch_size' (8) must be divisible by run.world_size (3)");
}

TEST_F(ConfigTest, SetOverrides) {
  const std::string path = write("c.toml", kMinimal);
  const Config c = load_config(path, {"run.steps=5", "optimizer.lr=0.25", "strategy.plugin=flat",
                                      "model.name=\"toy_tied\"", "run.seed = 7",
                                      "transport.plugin=tcp", "run.timeout_s=2",
                                      "data.path=some/file.safetensors"});
  EXPECT_EQ(c.run.steps, 5);                       // int, replaced
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.25);          // float
  EXPECT_EQ(c.strategy_plugin, "flat");            // bare word -> string, new section
  EXPECT_EQ(c.model.name, "toy_tied");             // quoted string
  EXPECT_EQ(c.run.seed, 7u);                       // added key, spaces trimmed
  EXPECT_EQ(c.transport_plugin, "tcp");
  EXPECT_DOUBLE_EQ(c.run.timeout_s, 2.0);          // int for a float
  EXPECT_EQ(c.data.path, "some/file.safetensors");  // bare word with '/' and '.'
  // The effective document shows the overrides.
  const toml::table text = toml::parse(c.toml_text);
  EXPECT_EQ(text["run"]["steps"].value<int64_t>(), 5);
  EXPECT_EQ(text["strategy"]["plugin"].value<std::string>(), "flat");
  // A plugin key from --set reaches the plugin.
  const Config p = load_config(path, {"strategy.bucket_mb=32"});
  EXPECT_EQ(p.strategy.get_int("bucket_mb", 0), 32);
}

TEST_F(ConfigTest, SetMalformed) {
  const std::string path = write("c.toml", kMinimal);
  for (const std::string arg : {"run.steps", "steps=5", "=5", ".steps=5", "run.=5", "run.a.b=1"})
    EXPECT_EQ(load_error(path, {arg}), "--set " + arg + ": expected section.key=value") << arg;
  EXPECT_EQ(load_error(path, {"run.steps=[1"}),
            "--set run.steps=[1: Error while parsing array: encountered end-of-file");
  EXPECT_EQ(load_error(path, {"run.steps="}),
            "--set run.steps=: Error while parsing key-value pair: encountered end-of-file");
}

TEST_F(ConfigTest, SetErrorsNameTheArgument) {
  const std::string path = write("c.toml", kMinimal);
  EXPECT_EQ(load_error(path, {"run.steps=abc"}),
            "--set run.steps=abc: key 'run.steps' must be an integer, not a string");
  EXPECT_EQ(load_error(path, {"optimizer.lr=true"}),
            "--set optimizer.lr=true: key 'optimizer.lr' must be a float, not a boolean");
  EXPECT_EQ(load_error(path, {"run.world_size=0"}),
            "--set run.world_size=0: key 'run.world_size' must be >= 1 (got 0)");
  // The error is at batch_size, which the file gives.
  EXPECT_EQ(load_error(path, {"run.world_size=3"}),
            path + ":8:14: key 'data.batch_size' (8) must be divisible by run.world_size (3)");
  EXPECT_EQ(load_error(path, {"run.steps=99999999999999999999"}),
            "--set run.steps=99999999999999999999: key 'run.steps': 99999999999999999999 is an integer out of range "
            "(TOML's are 64-bit: -9223372036854775808 to 9223372036854775807)");
  EXPECT_EQ(load_error(path, {"run.steps=-9_223_372_036_854_775_809"}),
            "--set run.steps=-9_223_372_036_854_775_809: key 'run.steps': -9_223_372_036_854_775_809 is an integer "
            "out of range (TOML's are 64-bit: -9223372036854775808 to 9223372036854775807)");
  EXPECT_EQ(load_error(path, {"run.stepz=1"}), "--set run.stepz=1: unknown key 'run.stepz'");
  EXPECT_EQ(load_error(path, {"extra.x=1"}), "--set extra.x=1: unknown section 'extra'");
  EXPECT_EQ(load_error(path, {"model.name=toy # comment"}),
            "--set model.name=toy # comment: 'toy # comment' is not a TOML value; a string holding "
            "characters other than letters, digits and _-./:+ takes quotes, and --set takes no comment");
  EXPECT_EQ(load_error(path, {"checkpoint.dir=\"\""}),
            "--set checkpoint.dir=\"\": key 'checkpoint.dir' must be a directory (\".\" for the working "
            "directory) (got '')");
  EXPECT_EQ(load_config(path, {"run.output_dir=\".\""}).run.output_dir, ".");
}

// The smallest valid file, to which the plugin tests add their tables.
const std::string kSmallest = R"([run]
steps = 1
[model]
name = "toy"
[data]
batch_size = 1
[optimizer]
lr = 0.1
)";

// [strategy] of a file with plugin keys of every type, for PluginSection.
const std::string kPluginFile = kSmallest + R"([strategy]
plugin = "bucketed"
zeta = 1
alpha = 2
ratio = 0.5
whole = 3
overlap = true
mode = "fast"
)";

TEST_F(ConfigTest, PluginSectionTypedReads) {
  const Config c = load_config(write("c.toml", kPluginFile));
  const PluginSection& s = c.strategy;
  EXPECT_EQ(s.get_int("zeta", 0), 1);
  EXPECT_EQ(s.get_int("alpha", 0), 2);
  EXPECT_DOUBLE_EQ(s.get_float("ratio", 0), 0.5);
  EXPECT_DOUBLE_EQ(s.get_float("whole", 0), 3.0);  // int accepted
  EXPECT_EQ(s.get_bool("overlap", false), true);
  EXPECT_EQ(s.get_string("mode", ""), "fast");
  // Missing keys give the fallback; `plugin` is the host's, not the plugin's.
  EXPECT_EQ(s.get_int("missing", -7), -7);
  EXPECT_DOUBLE_EQ(s.get_float("missing", 1.5), 1.5);
  EXPECT_EQ(s.get_bool("missing", true), true);
  EXPECT_EQ(s.get_string("plugin", "absent"), "absent");
  EXPECT_NO_THROW(s.check_all_read("strategy", "bucketed"));
}

TEST_F(ConfigTest, PluginSectionWrongTypes) {
  const std::string path = write("c.toml", kPluginFile);
  const Config c = load_config(path);
  const PluginSection& s = c.strategy;
  EXPECT_EQ(error_of([&] { s.get_int("ratio", 0); }),
            path + ":13:9: key 'strategy.ratio' must be an integer, not a float");
  EXPECT_EQ(error_of([&] { s.get_float("mode", 0); }),
            path + ":16:8: key 'strategy.mode' must be a float, not a string");
  EXPECT_EQ(error_of([&] { s.get_bool("zeta", false); }),
            path + ":11:8: key 'strategy.zeta' must be a boolean, not an integer");
  EXPECT_EQ(error_of([&] { s.get_string("overlap", ""); }),
            path + ":15:11: key 'strategy.overlap' must be a string, not a boolean");
  const Config o = load_config(path, {"strategy.mode=3"});
  EXPECT_EQ(error_of([&] { o.strategy.get_string("mode", ""); }),
            "--set strategy.mode=3: key 'strategy.mode' must be a string, not an integer");
}

// Each plugin's keys may live in a table of its own, read only while that
// plugin is the chosen one: changing `plugin` alone swaps.
const std::string kPluginTables = kSmallest + R"([strategy]
plugin = "sharded"
[strategy.bucketed]
bucket_mb = 8
[strategy.sharded]
variant = "allgather"
bucket_mb = 25.0
)";

TEST_F(ConfigTest, PluginTablesAreReadForTheChosenPluginOnly) {
  const std::string path = write("c.toml", kPluginTables);
  const Config sharded = load_config(path);
  EXPECT_EQ(sharded.strategy.get_string("variant", ""), "allgather");
  EXPECT_DOUBLE_EQ(sharded.strategy.get_float("bucket_mb", 0), 25.0);
  EXPECT_NO_THROW(sharded.strategy.check_all_read("strategy", "sharded"));
  const Config bucketed = load_config(path, {"strategy.plugin=bucketed"});
  EXPECT_DOUBLE_EQ(bucketed.strategy.get_float("bucket_mb", 0), 8.0);
  EXPECT_EQ(bucketed.strategy.get_string("variant", "none"), "none");
  EXPECT_NO_THROW(bucketed.strategy.check_all_read("strategy", "bucketed"));
  const Config naive = load_config(path, {"strategy.plugin=naive"});
  EXPECT_NO_THROW(naive.strategy.check_all_read("strategy", "naive"));
  // By path, the table goes by the plugin's name.
  const Config by_path = load_config(path, {"strategy.plugin=\"/x/libddp_strategy_bucketed.so\""});
  EXPECT_DOUBLE_EQ(by_path.strategy.get_float("bucket_mb", 0), 8.0);
  EXPECT_EQ(plugin_table_name("/opt/libddp_transport_mine.so"), "mine");
  EXPECT_EQ(plugin_table_name("gloo"), "gloo");
}

TEST_F(ConfigTest, PluginTableKeysAreCheckedNamedAndOverridable) {
  const std::string path = write("c.toml", kPluginTables + "bucket_mbb = 1\n");
  const Config c = load_config(path);
  c.strategy.get_string("variant", "");
  c.strategy.get_float("bucket_mb", 0);
  EXPECT_EQ(error_of([&] { c.strategy.check_all_read("strategy", "sharded"); }),
            path + ":16:14: unknown key 'strategy.sharded.bucket_mbb' (strategy plugin 'sharded' does not read it)");
  EXPECT_EQ(error_of([&] { c.strategy.get_bool("variant", false); }),
            path + ":14:11: key 'strategy.sharded.variant' must be a boolean, not a string");
  // --set wins over either table, in either spelling.
  EXPECT_DOUBLE_EQ(load_config(path, {"strategy.bucket_mb=4"}).strategy.get_float("bucket_mb", 0), 4.0);
  EXPECT_DOUBLE_EQ(load_config(path, {"strategy.sharded.bucket_mb=2"}).strategy.get_float("bucket_mb", 0), 2.0);
}

TEST_F(ConfigTest, AKeyInBothTablesIsRefusedNamingBoth) {
  const std::string path = write("c.toml", kSmallest + R"([strategy]
plugin = "sharded"
variant = "broadcast"
[strategy.sharded]
variant = "allgather"
)");
  EXPECT_EQ(load_error(path), path + ":13:11: key 'strategy.sharded.variant' is set twice: also as 'strategy.variant' at " +
                                  path + ":11:11 (keep one)");
}

TEST_F(ConfigTest, PluginSectionUnreadKeys) {
  const std::string path = write("c.toml", kPluginFile);
  const Config c = load_config(path, {"strategy.late=1"});
  const PluginSection& s = c.strategy;
  // First unread in file order: zeta (line 11) before alpha, though 'a' < 'z'.
  EXPECT_EQ(error_of([&] { s.check_all_read("strategy", "naive"); }),
            path + ":11:8: unknown key 'strategy.zeta' (strategy plugin 'naive' does not read it)");
  s.get_int("zeta", 0);
  EXPECT_EQ(error_of([&] { s.check_all_read("strategy", "naive"); }),
            path +
                ":12:9: unknown key 'strategy.alpha' (strategy plugin 'naive' does not read it)");
  s.get_int("alpha", 0);
  s.get_float("ratio", 0);
  s.get_float("whole", 0);
  s.get_bool("overlap", false);
  s.get_string("mode", "");
  // Keys from --set come after the file's.
  EXPECT_EQ(error_of([&] { s.check_all_read("strategy", "naive"); }),
            "--set strategy.late=1: unknown key 'strategy.late' (strategy plugin 'naive' does not "
            "read it)");
  s.get_int("late", 0);
  EXPECT_NO_THROW(s.check_all_read("strategy", "naive"));
}

// The launcher's check, from the keys a plugin declares: the first key in
// file order (then --set) that it does not declare, what it does read, and
// the nearest if one is close.
TEST_F(ConfigTest, PluginSectionKeysAgainstThoseDeclared) {
  const std::string path = write("c.toml", kPluginFile);
  const Config c = load_config(path, {"strategy.late=1"});
  const PluginSection& s = c.strategy;
  const std::vector<std::string> all = {"alpha", "late", "mode", "overlap", "ratio", "whole", "zeta"};
  EXPECT_NO_THROW(s.check_declared(all, "strategy", "mine"));
  EXPECT_EQ(error_of([&] { s.check_declared({"alpha", "mode"}, "strategy", "mine"); }),
            path + ":11:8: unknown key 'strategy.zeta' (strategy plugin 'mine' does not read it; it reads: alpha, "
                   "mode)");
  EXPECT_EQ(error_of([&] { s.check_declared({"zeta", "alpah", "mode", "overlap", "ratio", "whole", "late"},
                                            "strategy", "mine"); }),
            path + ":12:9: unknown key 'strategy.alpha' (strategy plugin 'mine' does not read it; it reads: zeta, "
                   "alpah, mode, overlap, ratio, whole, late; did you mean 'alpah'?)");
  std::vector<std::string> no_late = all;
  no_late.erase(no_late.begin() + 1);
  EXPECT_EQ(error_of([&] { s.check_declared(no_late, "strategy", "mine"); }),
            "--set strategy.late=1: unknown key 'strategy.late' (strategy plugin 'mine' does not read it; it reads: "
            "alpha, mode, overlap, ratio, whole, zeta)");
  EXPECT_EQ(error_of([&] { s.check_declared({}, "strategy", "naive"); }),
            path + ":11:8: unknown key 'strategy.zeta' (strategy plugin 'naive' does not read it; it reads no keys)");
}

// A table for a plugin the search path lacks (a misspelling, or one loaded
// by path elsewhere): a warning with the nearest name, not a refusal.
TEST_F(ConfigTest, PluginSectionTablesOfOtherPlugins) {
  const std::string path = write("c.toml", kSmallest + R"([strategy]
plugin = "naive"
[strategy.bucketed]
bucket_mb = 4
[strategy.bucketd]
bucket_mb = 8
)");
  const Config c = load_config(path);
  const std::vector<std::string> there = {"bucketed", "flat", "naive", "overlap", "sharded"};
  EXPECT_EQ(c.strategy.unknown_table(there, "strategy"),
            path + ":13:1: table '[strategy.bucketd]' names no strategy plugin here; did you mean 'bucketed'? "
                   "(there are: bucketed, flat, naive, overlap, sharded)");
  const Config d = load_config(write("d.toml", kSmallest + "[strategy]\nplugin = \"naive\"\n[strategy.sharded]\nvariant = \"allgather\"\n"));
  EXPECT_EQ(d.strategy.unknown_table(there, "strategy"), "");
}

TEST_F(ConfigTest, ValidateConfigIsPure) {
  // A document parsed from a string: `file` only names it in messages.
  const toml::table doc = toml::parse(std::string_view(kMinimal), std::string_view("ignored"));
  const Config c = validate_config(doc, "dir/named.toml");
  EXPECT_EQ(c.file, "dir/named.toml");
  EXPECT_EQ(c.run.output_dir, "runs/named");
  const toml::table bad = toml::parse(std::string_view("[run]\nsteps = -2\n"));
  EXPECT_EQ(error_of([&] { validate_config(bad, "x.toml"); }),
            "x.toml: missing required key 'model.name'");
  toml::table built = doc;  // copies carry no source positions
  built["run"].as_table()->insert_or_assign("steps", -2);
  EXPECT_EQ(error_of([&] { validate_config(built, "x.toml"); }),
            "x.toml: key 'run.steps' must be >= 0 (got -2)");
}

// ---- optimizer (sgd | adamw), [[optimizer.groups]], [schedule], grad accumulation ----

// kMinimal with `lines` added at the end of [optimizer]: its first line is
// line 12 of the file.
std::string minimal_with_optimizer(const std::string& lines) {
  return std::string(kMinimal) + lines;
}

TEST_F(ConfigTest, OptimizerDefaults) {
  const Config sgd = load_config(write("sgd.toml", kMinimal));
  EXPECT_EQ(sgd.run.grad_accum_steps, 1);
  EXPECT_EQ(sgd.optimizer.name, "sgd");
  EXPECT_DOUBLE_EQ(sgd.optimizer.momentum, 0.0);
  EXPECT_DOUBLE_EQ(sgd.optimizer.weight_decay, 0.0);  // L2 off, as torch.optim.SGD
  EXPECT_DOUBLE_EQ(sgd.optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(sgd.optimizer.beta2, 0.999);
  EXPECT_DOUBLE_EQ(sgd.optimizer.eps, 1e-8);
  EXPECT_TRUE(sgd.optimizer.groups.empty());
  EXPECT_TRUE(sgd.unfreeze.empty());

  const Config adamw = load_config(write("adamw.toml", minimal_with_optimizer("name = \"adamw\"\n")));
  EXPECT_EQ(adamw.optimizer.name, "adamw");
  EXPECT_DOUBLE_EQ(adamw.optimizer.lr, 0.1);
  EXPECT_DOUBLE_EQ(adamw.optimizer.weight_decay, 0.01);  // as torch.optim.AdamW
  EXPECT_DOUBLE_EQ(adamw.optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(adamw.optimizer.beta2, 0.999);
  EXPECT_DOUBLE_EQ(adamw.optimizer.eps, 1e-8);
  EXPECT_DOUBLE_EQ(adamw.optimizer.momentum, 0.0);
  EXPECT_EQ(adamw.run.grad_accum_steps, 1);
  EXPECT_TRUE(adamw.optimizer.groups.empty());
  EXPECT_TRUE(adamw.unfreeze.empty());

  // A group without lr / weight_decay takes the optimizer's, defaults included.
  const Config grouped = load_config(write("g.toml", minimal_with_optimizer(
      "name = \"adamw\"\n[[optimizer.groups]]\nparams = \"head.*\"\n")));
  ASSERT_EQ(grouped.optimizer.groups.size(), 1u);
  EXPECT_EQ(grouped.optimizer.groups[0].params, "head.*");
  EXPECT_DOUBLE_EQ(grouped.optimizer.groups[0].lr, 0.1);
  EXPECT_DOUBLE_EQ(grouped.optimizer.groups[0].weight_decay, 0.01);
}

TEST_F(ConfigTest, SgdMomentumAndWeightDecay) {
  const Config c = load_config(write("c.toml", minimal_with_optimizer(
      "name = \"sgd\"\nmomentum = 0.9\nweight_decay = 0.0005\n")));
  EXPECT_EQ(c.optimizer.name, "sgd");
  EXPECT_DOUBLE_EQ(c.optimizer.momentum, 0.9);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.0005);
}

TEST_F(ConfigTest, FullAdamWWithGroupsAndUnfreeze) {
  const std::string path = write("adamw.toml", R"([run]
steps = 20
grad_accum_steps = 4

[model]
name = "toy_tied"

[data]
batch_size = 16

[optimizer]
name = "adamw"
lr = 0.003
betas = [0.8, 0.95]
eps = 1e-6
weight_decay = 0.05

[[optimizer.groups]]
params = "layer1.*"
lr = 0.0001
weight_decay = 0.0

[[optimizer.groups]]
params = "head.?ias"

[schedule]

[[schedule.unfreeze]]
step = 5
params = "layer0.*"

[[schedule.unfreeze]]
step = 0
params = "emb*"
)");
  const Config c = load_config(path);
  EXPECT_EQ(c.run.steps, 20);
  EXPECT_EQ(c.run.grad_accum_steps, 4);
  EXPECT_EQ(c.data.batch_size, 16);
  const OptimizerConfig& o = c.optimizer;
  EXPECT_EQ(o.name, "adamw");
  EXPECT_DOUBLE_EQ(o.lr, 0.003);
  EXPECT_DOUBLE_EQ(o.beta1, 0.8);
  EXPECT_DOUBLE_EQ(o.beta2, 0.95);
  EXPECT_DOUBLE_EQ(o.eps, 1e-6);
  EXPECT_DOUBLE_EQ(o.weight_decay, 0.05);
  EXPECT_DOUBLE_EQ(o.momentum, 0.0);
  // Groups in file order; a missing lr / weight_decay is the optimizer's.
  ASSERT_EQ(o.groups.size(), 2u);
  EXPECT_EQ(o.groups[0].params, "layer1.*");
  EXPECT_DOUBLE_EQ(o.groups[0].lr, 0.0001);
  EXPECT_DOUBLE_EQ(o.groups[0].weight_decay, 0.0);  // explicit 0 beats the 0.05 default
  EXPECT_EQ(o.groups[1].params, "head.?ias");
  EXPECT_DOUBLE_EQ(o.groups[1].lr, 0.003);
  EXPECT_DOUBLE_EQ(o.groups[1].weight_decay, 0.05);
  // Unfreeze entries in file order (not sorted by step).
  ASSERT_EQ(c.unfreeze.size(), 2u);
  EXPECT_EQ(c.unfreeze[0].step, 5);
  EXPECT_EQ(c.unfreeze[0].params, "layer0.*");
  EXPECT_EQ(c.unfreeze[1].step, 0);
  EXPECT_EQ(c.unfreeze[1].params, "emb*");
  // The effective document keeps the arrays of tables.
  const toml::table text = toml::parse(c.toml_text);
  EXPECT_EQ(text["optimizer"]["groups"][1]["params"].value<std::string>(), "head.?ias");
  EXPECT_EQ(text["schedule"]["unfreeze"][0]["step"].value<int64_t>(), 5);
  EXPECT_EQ(text["run"]["grad_accum_steps"].value<int64_t>(), 4);
}

TEST_F(ConfigTest, IntegerAcceptedForOptimizerFloats) {
  const Config c = load_config(write("c.toml", minimal_with_optimizer(
      "name = \"adamw\"\nbetas = [0, 0.5]\neps = 1\nweight_decay = 2\n"
      "[[optimizer.groups]]\nparams = \"a\"\nlr = 3\nweight_decay = 4\n"
      "[[optimizer.groups]]\nparams = \"b\"\nlr = 5\nweight_decay = 0\n")));
  EXPECT_DOUBLE_EQ(c.optimizer.beta1, 0.0);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.5);
  EXPECT_DOUBLE_EQ(c.optimizer.eps, 1.0);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 2.0);
  ASSERT_EQ(c.optimizer.groups.size(), 2u);
  EXPECT_DOUBLE_EQ(c.optimizer.groups[0].lr, 3.0);
  EXPECT_DOUBLE_EQ(c.optimizer.groups[0].weight_decay, 4.0);
  EXPECT_DOUBLE_EQ(c.optimizer.groups[1].lr, 5.0);
  EXPECT_DOUBLE_EQ(c.optimizer.groups[1].weight_decay, 0.0);
  const Config m = load_config(write("m.toml", minimal_with_optimizer("momentum = 1\n")));
  EXPECT_DOUBLE_EQ(m.optimizer.momentum, 1.0);
}

// Each case's file is kMinimal + `lines` (the first on line 12).
struct ErrorCase {
  std::string lines, message;
};

TEST_F(ConfigTest, OptimizerValueConstraints) {
  const ErrorCase cases[] = {
      {"momentum = -0.5", ":12:12: key 'optimizer.momentum' must be >= 0 (got -0.5)"},
      {"name = \"adamw\"\neps = 0", ":13:7: key 'optimizer.eps' must be > 0 (got 0)"},
      {"name = \"adamw\"\neps = -1e-8", ":13:7: key 'optimizer.eps' must be > 0 (got -1e-08)"},
      {"weight_decay = -0.1", ":12:16: key 'optimizer.weight_decay' must be >= 0 (got -0.1)"},
      {"name = \"adamw\"\nweight_decay = -1",
       ":13:16: key 'optimizer.weight_decay' must be >= 0 (got -1)"},
      {"momentum = \"0.9\"", ":12:12: key 'optimizer.momentum' must be a float, not a string"},
      {"eps = true", ":12:7: key 'optimizer.eps' must be a float, not a boolean"},
      {"weight_decay = [0.1]", ":12:16: key 'optimizer.weight_decay' must be a float, not an array"},
      {"name = 1", ":12:8: key 'optimizer.name' must be a string, not an integer"},
  };
  for (const ErrorCase& c : cases) {
    const std::string path = write("c.toml", minimal_with_optimizer(c.lines + "\n"));
    EXPECT_EQ(load_error(path), path + c.message) << c.lines;
  }
}

TEST_F(ConfigTest, OptimizerKeyForOtherOptimizer) {
  const ErrorCase cases[] = {
      {"name = \"adamw\"\nmomentum = 0.9", ":13:12: key 'optimizer.momentum' applies to sgd only"},
      // Even the default value is refused: the key means nothing to adamw.
      {"momentum = 0.0\nname = \"adamw\"", ":12:12: key 'optimizer.momentum' applies to sgd only"},
      {"betas = [0.9, 0.999]", ":12:9: key 'optimizer.betas' applies to adamw only"},
      {"name = \"sgd\"\nbetas = [0.5, 0.5]", ":13:9: key 'optimizer.betas' applies to adamw only"},
      {"eps = 1e-8", ":12:7: key 'optimizer.eps' applies to adamw only"},
  };
  for (const ErrorCase& c : cases) {
    const std::string path = write("c.toml", minimal_with_optimizer(c.lines + "\n"));
    EXPECT_EQ(load_error(path), path + c.message) << c.lines;
  }
}

TEST_F(ConfigTest, BetasMustBeTwoFloatsInUnitInterval) {
  const ErrorCase cases[] = {
      {"betas = [0.9]", ":13:9: key 'optimizer.betas' must be two floats in [0, 1) (got [ 0.9 ])"},
      {"betas = []", ":13:9: key 'optimizer.betas' must be two floats in [0, 1) (got [])"},
      {"betas = [0.9, 0.99, 0.999]",
       ":13:9: key 'optimizer.betas' must be two floats in [0, 1) (got [ 0.9, 0.99, 0.999 ])"},
      {"betas = [0.9, 1.0]",
       ":13:9: key 'optimizer.betas' must be two floats in [0, 1) (got [ 0.9, 1.0 ])"},
      {"betas = [1, 0.5]",
       ":13:9: key 'optimizer.betas' must be two floats in [0, 1) (got [ 1, 0.5 ])"},
      {"betas = [-0.1, 0.999]",
       ":13:9: key 'optimizer.betas' must be two floats in [0, 1) (got [ -0.1, 0.999 ])"},
      {"betas = [0.9, \"0.999\"]",
       ":13:9: key 'optimizer.betas' must be two floats in [0, 1) (got [ 0.9, '0.999' ])"},
      {"betas = [true, 0.5]",
       ":13:9: key 'optimizer.betas' must be two floats in [0, 1) (got [ true, 0.5 ])"},
      {"betas = [[0.9], 0.5]",
       ":13:9: key 'optimizer.betas' must be two floats in [0, 1) (got [ [ 0.9 ], 0.5 ])"},
      {"betas = 0.9", ":13:9: key 'optimizer.betas' must be an array, not a float"},
  };
  for (const ErrorCase& c : cases) {
    const std::string path =
        write("c.toml", minimal_with_optimizer("name = \"adamw\"\n" + c.lines + "\n"));
    EXPECT_EQ(load_error(path), path + c.message) << c.lines;
  }
}

TEST_F(ConfigTest, GroupErrors) {
  const std::string adamw = "name = \"adamw\"\n";  // line 12; the group header is line 13
  const ErrorCase cases[] = {
      // Wrong types inside a group table.
      {"[[optimizer.groups]]\nparams = \"a\"\nlr = \"0.1\"",
       ":15:6: key 'optimizer.groups[0].lr' must be a float, not a string"},
      {"[[optimizer.groups]]\nparams = 7",
       ":14:10: key 'optimizer.groups[0].params' must be a string, not an integer"},
      {"[[optimizer.groups]]\nparams = \"a\"\nweight_decay = false",
       ":15:16: key 'optimizer.groups[0].weight_decay' must be a float, not a boolean"},
      // Unknown key in a group (here one that belongs to [optimizer]).
      {"[[optimizer.groups]]\nparams = \"a\"\nmomentum = 0.9",
       ":15:12: unknown key 'optimizer.groups[0].momentum'"},
      // Missing params; the position is the group's.
      {"[[optimizer.groups]]\nlr = 0.1", ":13:1: missing required key 'optimizer.groups[0].params'"},
      // Values out of range.
      {"[[optimizer.groups]]\nparams = \"a\"\nlr = 0",
       ":15:6: key 'optimizer.groups[0].lr' must be > 0 (got 0)"},
      {"[[optimizer.groups]]\nparams = \"a\"\nlr = -0.5",
       ":15:6: key 'optimizer.groups[0].lr' must be > 0 (got -0.5)"},
      {"[[optimizer.groups]]\nparams = \"a\"\nweight_decay = -0.25",
       ":15:16: key 'optimizer.groups[0].weight_decay' must be >= 0 (got -0.25)"},
      // The index names the group at fault.
      {"[[optimizer.groups]]\nparams = \"a\"\n[[optimizer.groups]]\nparams = \"b\"\nbias = 1",
       ":17:8: unknown key 'optimizer.groups[1].bias'"},
      {"[[optimizer.groups]]\nparams = \"a\"\n[[optimizer.groups]]\nlr = 1",
       ":15:1: missing required key 'optimizer.groups[1].params'"},
      // groups must be an array of tables.
      {"groups = 3", ":13:10: key 'optimizer.groups' must be an array, not an integer"},
      {"groups = [\"a\"]", ":13:11: key 'optimizer.groups[0]' must be a table, not a string"},
      {"groups = [{ params = \"a\" }, { lr = 0.1 }]",
       ":13:29: missing required key 'optimizer.groups[1].params'"},
  };
  for (const ErrorCase& c : cases) {
    const std::string path = write("c.toml", minimal_with_optimizer(adamw + c.lines + "\n"));
    EXPECT_EQ(load_error(path), path + c.message) << c.lines;
  }
}

TEST_F(ConfigTest, UnfreezeErrors) {
  const ErrorCase cases[] = {
      {"[[schedule.unfreeze]]\nstep = -1\nparams = \"a\"",
       ":13:8: key 'schedule.unfreeze[0].step' must be >= 0 (got -1)"},
      {"[[schedule.unfreeze]]\nparams = \"a\"",
       ":12:1: missing required key 'schedule.unfreeze[0].step'"},
      {"[[schedule.unfreeze]]\nstep = 1",
       ":12:1: missing required key 'schedule.unfreeze[0].params'"},
      {"[[schedule.unfreeze]]\nstep = 1.5\nparams = \"a\"",
       ":13:8: key 'schedule.unfreeze[0].step' must be an integer, not a float"},
      {"[[schedule.unfreeze]]\nstep = 1\nparams = [\"a\"]",
       ":14:10: key 'schedule.unfreeze[0].params' must be a string, not an array"},
      {"[[schedule.unfreeze]]\nstep = 1\nparams = \"a\"\nlr = 0.1",
       ":15:6: unknown key 'schedule.unfreeze[0].lr'"},
      {"[[schedule.unfreeze]]\nstep = 1\nparams = \"a\"\n[[schedule.unfreeze]]\nstep = -3\nparams = \"b\"",
       ":16:8: key 'schedule.unfreeze[1].step' must be >= 0 (got -3)"},
      {"[schedule]\nwarmup = 10", ":13:10: unknown key 'schedule.warmup'"},
      {"[schedule]\nunfreeze = \"a\"", ":13:12: key 'schedule.unfreeze' must be an array, not a string"},
      {"[schedule]\nunfreeze = [5]", ":13:13: key 'schedule.unfreeze[0]' must be a table, not an integer"},
  };
  for (const ErrorCase& c : cases) {
    const std::string path = write("c.toml", minimal_with_optimizer(c.lines + "\n"));
    EXPECT_EQ(load_error(path), path + c.message) << c.lines;
  }
}

// [precision] compute: the dtype of the GEMMs' inputs; fp32 unless set; on
// either device.
TEST_F(ConfigTest, PrecisionCompute) {
  EXPECT_EQ(load_config(write("none.toml", kMinimal)).precision.compute, DDP_FLOAT32);
  const std::string path = write("p.toml", std::string(kMinimal) + "\n[precision]\ncompute = \"bf16\"\n");
  EXPECT_EQ(load_config(path).precision.compute, DDP_BFLOAT16);
  EXPECT_EQ(load_config(path, {"precision.compute=fp16"}).precision.compute, DDP_FLOAT16);
  EXPECT_EQ(load_config(path, {"precision.compute=fp32"}).precision.compute, DDP_FLOAT32);
  EXPECT_STREQ(compute_name(DDP_BFLOAT16), "bf16");  // summary.json's name for it
  EXPECT_STREQ(compute_name(DDP_FLOAT16), "fp16");
  EXPECT_STREQ(compute_name(DDP_FLOAT32), "fp32");
  EXPECT_EQ(load_error(path, {"precision.compute=fp8"}),
            "--set precision.compute=fp8: key 'precision.compute' must be one of: fp32, bf16, fp16 (got 'fp8')");
  EXPECT_EQ(load_config(path, {"run.device=\"cuda\""}).precision.compute, DDP_BFLOAT16);  // cuBLAS's 16-bit GEMMs
  EXPECT_EQ(load_error(path, {"precision.dtype=bf16"}), "--set precision.dtype=bf16: unknown key 'precision.dtype'");
}

TEST_F(ConfigTest, PrecisionLossScale) {
  const std::string fp16 = write("fp16.toml", std::string(kMinimal) + "\n[precision]\ncompute = \"fp16\"\n");
  const PrecisionConfig p = load_config(fp16).precision;
  EXPECT_TRUE(p.loss_scale);  // fp16's default: GradScaler's
  EXPECT_EQ(p.init_scale, 65536.0);
  EXPECT_EQ(p.growth_factor, 2.0);
  EXPECT_EQ(p.backoff_factor, 0.5);
  EXPECT_EQ(p.growth_interval, 2000);
  EXPECT_FALSE(load_config(fp16, {"precision.loss_scale=\"none\""}).precision.loss_scale);
  EXPECT_FALSE(load_config(fp16, {"precision.compute=bf16"}).precision.loss_scale);
  EXPECT_TRUE(load_config(fp16, {"precision.compute=bf16", "precision.loss_scale=\"dynamic\""}).precision.loss_scale);
  const PrecisionConfig set = load_config(fp16, {"precision.init_scale=1024", "precision.growth_interval=10"}).precision;
  EXPECT_EQ(set.init_scale, 1024.0);
  EXPECT_EQ(set.growth_interval, 10);
  EXPECT_EQ(load_config(fp16).effective.at("precision.loss_scale"), "dynamic");  // what the ranks compare
  EXPECT_EQ(load_error(fp16, {"precision.loss_scale=\"static\""}),
            "--set precision.loss_scale=\"static\": key 'precision.loss_scale' must be one of: dynamic, none (got "
            "'static')");
  EXPECT_EQ(load_error(fp16, {"precision.growth_factor=1"}),
            "--set precision.growth_factor=1: key 'precision.growth_factor' must be > 1 (got 1)");
  EXPECT_EQ(load_error(fp16, {"precision.backoff_factor=1.5"}),
            "--set precision.backoff_factor=1.5: key 'precision.backoff_factor' must be < 1 (got 1.5)");
  EXPECT_EQ(load_error(fp16, {"precision.init_scale=0"}),
            "--set precision.init_scale=0: key 'precision.init_scale' must be > 0 (got 0)");
  EXPECT_EQ(load_error(fp16, {"precision.init_scale=1e-39"}),
            "--set precision.init_scale=1e-39: key 'precision.init_scale' must be >= 1.1754943508222875e-38 (FLT_MIN) "
            "(got 1e-39)");
  EXPECT_EQ(load_error(fp16, {"precision.init_scale=1e39"}),
            "--set precision.init_scale=1e39: key 'precision.init_scale' must be <= 3.4028234663852886e+38 (got 1e+39)");
  EXPECT_EQ(load_error(fp16, {"precision.growth_interval=0"}),
            "--set precision.growth_interval=0: key 'precision.growth_interval' must be >= 1 (got 0)");
  EXPECT_EQ(load_error(fp16, {"precision.compute=bf16", "precision.init_scale=8"}),
            "--set precision.init_scale=8: key 'precision.init_scale' applies to dynamic loss scaling only, which is "
            "off (precision.loss_scale = \"none\", the default unless precision.compute = \"fp16\")");
}

TEST_F(ConfigTest, GradAccumSteps) {
  const Config c = load_config(write("ok.toml", minimal_with_run("grad_accum_steps = 8")));
  EXPECT_EQ(c.run.grad_accum_steps, 8);
  const Config max = load_config(write("max.toml", minimal_with_run("grad_accum_steps = 2147483647")));
  EXPECT_EQ(max.run.grad_accum_steps, 2147483647);
  const ErrorCase cases[] = {
      {"grad_accum_steps = 0", ":3:20: key 'run.grad_accum_steps' must be >= 1 (got 0)"},
      {"grad_accum_steps = -2", ":3:20: key 'run.grad_accum_steps' must be >= 1 (got -2)"},
      {"grad_accum_steps = 2.0", ":3:20: key 'run.grad_accum_steps' must be an integer, not a float"},
      // ddp_step_info.micro_steps is an int32_t.
      {"grad_accum_steps = 2147483648",
       ":3:20: key 'run.grad_accum_steps' must be <= 2147483647 (got 2147483648)"},
  };
  for (const ErrorCase& e : cases) {
    const std::string path = write("c.toml", minimal_with_run(e.lines));
    EXPECT_EQ(load_error(path), path + e.message) << e.lines;
  }
}

TEST_F(ConfigTest, SetOptimizerAndGradAccum) {
  const std::string path = write("c.toml", kMinimal);
  const Config c = load_config(path, {"run.grad_accum_steps=3", "optimizer.name=adamw"});
  EXPECT_EQ(c.run.grad_accum_steps, 3);
  EXPECT_EQ(c.optimizer.name, "adamw");             // bare word -> string
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.01);  // adamw's default follows the name
  EXPECT_DOUBLE_EQ(c.optimizer.beta1, 0.9);
  const toml::table text = toml::parse(c.toml_text);
  EXPECT_EQ(text["run"]["grad_accum_steps"].value<int64_t>(), 3);
  EXPECT_EQ(text["optimizer"]["name"].value<std::string>(), "adamw");

  const Config b = load_config(path, {"optimizer.name=adamw", "optimizer.betas=[0.5, 0.75]"});
  EXPECT_DOUBLE_EQ(b.optimizer.beta1, 0.5);
  EXPECT_DOUBLE_EQ(b.optimizer.beta2, 0.75);

  EXPECT_EQ(load_error(path, {"run.grad_accum_steps=0"}),
            "--set run.grad_accum_steps=0: key 'run.grad_accum_steps' must be >= 1 (got 0)");
  EXPECT_EQ(load_error(path, {"optimizer.name=adam"}),
            "--set optimizer.name=adam: key 'optimizer.name' must be one of: sgd, adamw (got 'adam')");
  EXPECT_EQ(load_error(path, {"optimizer.name=adamw", "optimizer.betas=[0.5]"}),
            "--set optimizer.betas=[0.5]: key 'optimizer.betas' must be two floats in [0, 1) (got [ 0.5 ])");
  // The key at fault is in the file; --set only changed the optimizer.
  const std::string sgd = write("sgd.toml", minimal_with_optimizer("momentum = 0.9\n"));
  EXPECT_EQ(load_error(sgd, {"optimizer.name=adamw"}),
            sgd + ":12:12: key 'optimizer.momentum' applies to sgd only");
  EXPECT_DOUBLE_EQ(load_config(sgd, {"optimizer.momentum=0.5"}).optimizer.momentum, 0.5);
}

// [model] for lm and mlp, [data] kinds, run.threads.
std::string with_model_and_data(const std::string& model, const std::string& data) {
  return "[run]\nsteps = 10\n[model]\n" + model + "\n[data]\nbatch_size = 8\n" + data + "\n[optimizer]\nlr = 0.1\n";
}

TEST_F(ConfigTest, LmAndMlpHyperParameters) {
  const Config lm = load_config(write("lm.toml", with_model_and_data(
      "name = \"lm\"\npreset = \"lm-cpu\"\nd_model = 128\nrope_theta = 500000", "")));
  EXPECT_EQ(lm.model.options.get_string("preset"), "lm-cpu");
  EXPECT_EQ(lm.model.options.get_int("d_model"), 128);
  EXPECT_EQ(lm.model.options.get_int("num_layers"), 0);  // from the preset
  EXPECT_EQ(lm.model.options.get_float("rope_theta"), 500000.0);
  const Config tiny = load_config(write("tiny.toml", with_model_and_data("name = \"lm\"", "")));
  EXPECT_EQ(tiny.model.options.get_string("preset"), "lm-tiny");
  const Config mlp = load_config(write("mlp.toml", with_model_and_data("name = \"mlp\"\nwidth = 64\ndepth = 2", "")));
  EXPECT_EQ(mlp.model.options.get_int("width"), 64);
  EXPECT_EQ(mlp.model.options.get_int("depth"), 2);
  EXPECT_EQ(mlp.model.options.get_int("classes"), 10);
  const Config t = load_config(write("t.toml", minimal_with_run("threads = 2")));
  EXPECT_EQ(t.run.threads, 2);
  EXPECT_EQ(load_config(write("d.toml", minimal_with_run(""))).run.threads, 1);
}

TEST_F(ConfigTest, ModelKeysBelongToTheirModel) {
  const struct {
    std::string model, message;
  } cases[] = {
      {"name = \"toy\"\nd_model = 64", ":5:11: key 'model.d_model' applies to model 'lm' only"},
      {"name = \"lm\"\nwidth = 64", ":5:9: key 'model.width' applies to model 'mlp' only"},
      {"name = \"mlp\"\npreset = \"lm-cpu\"", ":5:10: key 'model.preset' applies to model 'lm' only"},
      {"name = \"lm\"\npreset = \"huge\"",
       ":5:10: key 'model.preset' must be one of: lm-tiny, lm-cpu, small, medium, large, xl, 2.7B, xxl (got 'huge')"},
      {"name = \"lm\"\nnum_heads = 0", ":5:13: key 'model.num_heads' must be >= 1 (got 0)"},
  };
  for (const auto& c : cases) {
    const std::string path = write("c.toml", with_model_and_data(c.model, ""));
    EXPECT_EQ(load_error(path), path + c.message) << c.model;
  }
}

TEST_F(ConfigTest, DataKinds) {
  EXPECT_EQ(load_config(write("r.toml", with_model_and_data("name = \"lm\"", ""))).data.kind, "random");
  EXPECT_EQ(load_config(write("s.toml", with_model_and_data("name = \"lm\"", "path = \"d.safetensors\""))).data.kind,
            "safetensors");
  const Config tokens = load_config(write("k.toml", with_model_and_data("name = \"lm\"", "path = \"train.bin\"")));
  EXPECT_EQ(tokens.data.kind, "tokens");
  EXPECT_EQ(tokens.data.path, (dir_ / "train.bin").string());
  const struct {
    std::string model, data, message;
  } cases[] = {
      {"name = \"lm\"", "kind = \"random\"\npath = \"x.bin\"", ":8:8: key 'data.path' is not used with data.kind = \"random\""},
      {"name = \"lm\"", "kind = \"tokens\"", ": missing required key 'data.path' (data.kind = \"tokens\")"},
      {"name = \"toy\"", "path = \"train.bin\"", ":7:8: data.kind = \"tokens\" (a token file) needs model 'lm'"},
      {"name = \"lm\"", "kind = \"csv\"", ":7:8: key 'data.kind' must be one of: random, safetensors, tokens (got 'csv')"},
  };
  for (const auto& c : cases) {
    const std::string path = write("c.toml", with_model_and_data(c.model, c.data));
    EXPECT_EQ(load_error(path), path + c.message) << c.data;
  }
  EXPECT_EQ(load_error(write("th.toml", minimal_with_run("threads = 0"))),
            (dir_ / "th.toml").string() + ":3:11: key 'run.threads' must be >= 1 (got 0)");
}

}  // namespace
}  // namespace ddp

namespace ddp {
namespace {

TEST_F(ConfigTest, ScheduleCheckpointAndClippingKeys) {
  const std::string path = write("s.toml", kMinimal);
  const Config plain = load_config(path);
  EXPECT_EQ(plain.lr_schedule.kind, "constant");
  EXPECT_EQ(plain.optimizer.clip_grad_norm, 0.0);
  EXPECT_EQ(plain.checkpoint.every, 0);
  EXPECT_EQ(plain.checkpoint.keep, 2);
  EXPECT_EQ(plain.checkpoint.dir, "runs/s/checkpoints");
  EXPECT_EQ(plain.run.max_restarts, 0);
  const Config cosine = load_config(path, {"schedule.lr=\"cosine\"", "schedule.warmup_steps=2", "schedule.min_lr=0.01",
                                           "optimizer.clip_grad_norm=1.0", "checkpoint.every=5"});
  EXPECT_EQ(cosine.lr_schedule.kind, "cosine");
  EXPECT_EQ(cosine.lr_schedule.warmup_steps, 2);
  EXPECT_EQ(cosine.lr_schedule.cosine_steps, 10) << "defaults to run.steps";
  EXPECT_EQ(cosine.lr_schedule.min_lr, 0.01);
  EXPECT_EQ(cosine.optimizer.clip_grad_norm, 1.0);
  EXPECT_EQ(cosine.checkpoint.every, 5);
}

TEST_F(ConfigTest, ScheduleKeysThatCannotTrainAreRefused) {
  const std::string path = write("s.toml", kMinimal);
  EXPECT_EQ(load_error(path, {"schedule.warmup_steps=2"}),
            "--set schedule.warmup_steps=2: key 'schedule.warmup_steps' applies to lr = \"cosine\" only");
  EXPECT_EQ(load_error(path, {"schedule.lr=\"cosine\"", "schedule.min_lr=0.5"}),
            "--set schedule.min_lr=0.5: key 'schedule.min_lr' must be <= optimizer.lr (0.1) (got 0.5)");
  EXPECT_EQ(load_error(path, {"schedule.lr=\"cosine\"", "schedule.warmup_steps=4", "schedule.cosine_steps=4"}),
            "--set schedule.cosine_steps=4: key 'schedule.cosine_steps' must be >= 5 (got 4)");
  EXPECT_EQ(load_error(path, {"schedule.lr=\"linear\""}),
            "--set schedule.lr=\"linear\": key 'schedule.lr' must be one of: constant, cosine (got 'linear')");
  EXPECT_EQ(load_error(path, {"optimizer.clip_grad_norm=0.0"}),
            "--set optimizer.clip_grad_norm=0.0: key 'optimizer.clip_grad_norm' must be > 0 (got 0)");
  EXPECT_EQ(load_error(path, {"checkpoint.keep=0"}), "--set checkpoint.keep=0: key 'checkpoint.keep' must be >= 1 (got 0)");
}

// Every shipped config in configs/ takes every shipped strategy by
// `strategy.plugin` alone: each plugin's keys sit in its own table, so the
// swap leaves no key the new plugin does not read (the check a run makes
// when the plugin loads: unknown key 'strategy.period' where they did not).
TEST(ShippedConfigs, EveryOneTakesEveryShippedStrategyByPluginAlone) {
  const std::vector<std::string> strategies = {"naive", "flat", "overlap", "bucketed",
                                               "sharded", "powersgd", "localsgd", "diloco"};
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(DDP_TEST_DATA_DIR "/../configs"))
    if (entry.path().extension() == ".toml") files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 12u) << "configs/ holds a config per strategy and the larger models'";
  for (const std::string& strategy : strategies) {
    const std::unique_ptr<LoadedPlugin> plugin = load_plugin(PluginKind::Strategy, strategy, DDP_TEST_PLUGIN_DIR);
    for (const std::string& file : files) {
      const Config config = load_config(file, {"strategy.plugin=" + strategy});
      EXPECT_EQ(config.strategy_plugin, strategy) << file;
      EXPECT_EQ(error_of([&] { check_declared_keys(*plugin, config.strategy); }), "<no ConfigError>")
          << file << " with strategy.plugin=" << strategy;
    }
  }
}

// powersgd keeps its error feedback divided by each step's loss scale
// (ddp_step_info::loss_scale, ABI 1.12): an engine older than 1.12 does
// not give it, so there a scaled loss is refused by name; unscaled, or
// scaled under this engine, create goes on.
TEST(ShippedStrategies, PowerSgdRefusesLossScalingFromAnEngineOlderThan1_12) {
  const std::unique_ptr<LoadedPlugin> plugin = load_plugin(PluginKind::Strategy, "powersgd", DDP_TEST_PLUGIN_DIR);
  const auto create = [&](bool scaled, uint32_t minor) {
    test::CpuPluginHost cpu("strategy");
    cpu.services.precision.loss_scaled = scaled ? 1 : 0;
    ddp_host host = *cpu.get();
    host.abi_version = (1u << 16) | minor;
    ddp_strategy* s = nullptr;
    take_plugin_error();
    const ddp_status status = plugin->strategy()->create(&host, nullptr, nullptr, &s);
    if (s) plugin->strategy()->destroy(s);
    return status == DDP_OK ? std::string("ok") : take_plugin_error();
  };
  EXPECT_EQ(create(true, 11),
            "precision.loss_scale = \"dynamic\": powersgd keeps its error feedback divided by each step's loss "
            "scale, which an engine older than ABI 1.12 does not give; use precision.loss_scale = \"none\" (or "
            "compute = \"bf16\")");
  EXPECT_EQ(create(false, 11), "ok");
  EXPECT_EQ(create(true, DDP_ABI_VERSION_MINOR), "ok");
}

}  // namespace
}  // namespace ddp
