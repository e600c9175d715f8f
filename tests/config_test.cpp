// config_test.cpp — load_config / validate_config / PluginSection: the
// exact error messages of config.h, --set overrides, defaults and paths.
#include "config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

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

TEST_F(ConfigTest, ValueConstraints) {
  struct Case {
    std::string line, message;
  };
  const Case cases[] = {
      {"world_size = 0", ":3:14: key 'run.world_size' must be >= 1 (got 0)"},
      {"world_size = 3000000000",
       ":3:14: key 'run.world_size' must be <= 2147483647 (got 3000000000)"},
      {"seed = -1", ":3:8: key 'run.seed' must be >= 0 (got -1)"},
      {"timeout_s = 0", ":3:13: key 'run.timeout_s' must be > 0 (got 0)"},
      {"timeout_s = -1.5", ":3:13: key 'run.timeout_s' must be > 0 (got -1.5)"},
      {"log_every = 0", ":3:13: key 'run.log_every' must be >= 1 (got 0)"},
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
            model + ":5:8: key 'model.name' must be one of: toy, toy_tied (got 'bert')");
  const std::string opt = write("opt.toml", replaced("lr = 0.1", "lr = 0.1\nname = \"adam\""));
  EXPECT_EQ(load_error(opt), opt + ":12:8: key 'optimizer.name' must be one of: sgd, adamw (got 'adam')");
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
  EXPECT_EQ(load_error(path, {"run.stepz=1"}), "--set run.stepz=1: unknown key 'run.stepz'");
  EXPECT_EQ(load_error(path, {"extra.x=1"}), "--set extra.x=1: unknown section 'extra'");
}

// [strategy] of a file with plugin keys of every type, for PluginSection.
const char* const kPluginFile = R"([run]
steps = 1
[model]
name = "toy"
[data]
batch_size = 1
[optimizer]
lr = 0.1
[strategy]
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

}  // namespace
}  // namespace ddp
