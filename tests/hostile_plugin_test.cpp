// hostile_plugin_test.cpp — plugin code the launcher runs before any rank
// starts (constructors, descriptors, plan entries) that exits, crashes or
// hangs; plugin files that are corrupt, renamed, or not files at all. Each
// ends non-zero within its bound, naming the file, the entry and the
// cause: chosen by the config, and merely present in DDP_PLUGIN_DIR.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <ddp/plugin.h>

#include "process.h"

namespace {

namespace fs = std::filesystem;
const std::string kBroken = DDP_TEST_BROKEN_PLUGIN_DIR;
const std::string kAbi = "1." + std::to_string(DDP_ABI_VERSION_MINOR);

std::string hostile(const std::string& variant) { return kBroken + "/libddp_strategy_hostile_" + variant + ".so"; }

// What each variant's code does, as the launcher names it (at a bound of 2 s).
const std::vector<std::pair<std::string, std::string>> kCauses = {
    {"ctor_exit", "called exit(0) in its constructors (dlopen)"},
    {"ctor_crash", "crashed in its constructors (dlopen) (SIGSEGV)"},
    {"ctor_hang", "did not return from its constructors (dlopen) within 2 s"},
    {"plan_exit", "called exit(0) in plan"},
    {"plan_crash", "crashed in plan (SIGSEGV)"},
    {"plan_abort", "crashed in plan (SIGABRT)"},
    {"plan_hang", "did not return from plan within 2 s"},
};

// An mlp that fits any host: the fit check plans it, so every variant runs.
std::vector<std::string> small_run(const std::string& dir, const std::string& strategy, double timeout_s) {
  return {"run", kRepo + "/configs/mlp.toml", "--set", "run.output_dir=\"" + dir + "/out\"", "--set",
          "strategy.plugin=\"" + strategy + "\"", "--set", "run.timeout_s=" + std::to_string(timeout_s)};
}

TEST(HostilePlugin, ChosenItsCodeEndsTheRunWithinTheBoundNamingFileEntryAndCause) {
  const std::string dir = temp_dir();
  for (const auto& [variant, cause] : kCauses) {
    const auto began = Clock::now();
    Process p = start(small_run(dir, hostile(variant), 2), {}, dir + "/" + variant);
    EXPECT_EQ(wait_for(p, std::chrono::seconds(30)), 1) << variant;
    EXPECT_LT(Clock::now() - began, std::chrono::seconds(2 + 10)) << variant;
    EXPECT_EQ(read_file(p.err), "ddp: error: checking the run's plugins before any rank starts: strategy plugin '" +
                                    hostile(variant) + "' " + cause + "\n");
    EXPECT_EQ(read_file(p.out), "");
    EXPECT_FALSE(fs::exists(dir + "/out")) << variant;
  }
  fs::remove_all(dir);
}

// A directory of every hostile variant, a FIFO and a corrupt copy of naive
// (the middle third of its bytes overwritten: int3 where code was).
std::string hostile_dir() {
  const std::string dir = temp_dir();
  for (const auto& [variant, cause] : kCauses)
    fs::create_symlink(hostile(variant), dir + "/libddp_strategy_hostile_" + variant + ".so");
  EXPECT_EQ(mkfifo((dir + "/libddp_strategy_fifo.so").c_str(), 0644), 0);
  const std::string corrupt = dir + "/libddp_strategy_corrupt.so";
  fs::copy_file(std::string(DDP_TEST_PLUGIN_DIR) + "/libddp_strategy_naive.so", corrupt);
  const auto size = fs::file_size(corrupt);
  std::fstream f(corrupt, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(std::streamoff(size / 3));
  f << std::string(size / 3, '\xCC');
  return dir;
}

TEST(HostilePlugin, MerelyPresentTheFitChecksSearchSkipsItWithANote) {
  const std::string dir = hostile_dir();
  const auto began = Clock::now();
  Process p = start({"run", kRepo + "/configs/mlp.toml", "--set", "model.depth=60000", "--set", "model.width=4096",
                     "--set", "run.output_dir=\"" + dir + "/out\"", "--set", "run.timeout_s=8"},
                    {"DDP_PLUGIN_DIR=" + dir}, dir + "/run");
  EXPECT_EQ(wait_for(p, std::chrono::seconds(40)), 1);
  EXPECT_LT(Clock::now() - began, std::chrono::seconds(8 + 10));
  const std::string err = read_file(p.err);
  for (const auto& [variant, cause] : kCauses) {
    const std::string said = cause.substr(0, cause.find(" within "));  // each gets a share of run.timeout_s
    EXPECT_NE(err.find("ddp: note: the fit check's search skipped a plugin: strategy plugin '" + dir +
                       "/libddp_strategy_hostile_" + variant + ".so' " + said),
              std::string::npos)
        << variant << "\n" << err;
  }
  EXPECT_NE(err.find("ddp: note: the fit check's search skipped a plugin: '" + dir +
                     "/libddp_strategy_fifo.so' is not a regular file (a FIFO): skipped\n"),
            std::string::npos) << err;
  EXPECT_NE(err.find("ddp: note: the fit check's search skipped a plugin: strategy plugin '" + dir +
                     "/libddp_strategy_corrupt.so' "),
            std::string::npos) << err;
  EXPECT_NE(err.find("\nddp: error: " + kRepo + "/configs/mlp.toml: the run does not fit this host's memory: it "
                     "needs 16173.0 GB"),
            std::string::npos) << err;
  EXPECT_FALSE(fs::exists(dir + "/out"));
  fs::remove_all(dir);
}

TEST(HostilePlugin, MerelyPresentDdpPluginsListsWhatEachDid) {
  const std::string dir = hostile_dir();
  const auto began = Clock::now();
  Process p = start({"plugins", "--timeout", "2"}, {"DDP_PLUGIN_DIR=" + dir}, dir + "/plugins");
  EXPECT_EQ(wait_for(p, std::chrono::seconds(40)), 0) << read_file(p.err);
  EXPECT_LT(Clock::now() - began, std::chrono::seconds(2 * 2 + 10));  // two hang, each bounded
  const std::string out = read_file(p.out);
  for (const auto& [variant, cause] : kCauses) {
    const std::string path = dir + "/libddp_strategy_hostile_" + variant + ".so";
    const std::string line = variant.rfind("ctor_", 0) == 0 ? "cannot load: strategy plugin '" + path + "' " + cause
                                                            : "cpu,plans  " + path;  // its plan is not called
    EXPECT_NE(out.find(line + "\n"), std::string::npos) << variant << "\n" << out;
  }
  EXPECT_NE(out.find("strategy   fifo        cannot load: '" + dir + "/libddp_strategy_fifo.so' is not a regular "
                     "file (a FIFO): skipped\n"),
            std::string::npos) << out;
  EXPECT_NE(out.find("strategy   corrupt     cannot load: "), std::string::npos) << out;
  EXPECT_NE(out.find("strategy   naive       0."), std::string::npos) << "the others are listed as ever\n" << out;
  fs::remove_all(dir);
}

TEST(HostilePlugin, ChosenCorruptFifoOrRenamedFilesAreRefusedByName) {
  const std::string dir = hostile_dir();
  Process p = start(small_run(dir, dir + "/libddp_strategy_corrupt.so", 2), {}, dir + "/corrupt");
  EXPECT_NE(wait_for(p, std::chrono::seconds(30)), 0);
  std::string err = read_file(p.err);
  EXPECT_EQ(err.rfind("ddp: error: ", 0), 0u) << err;
  EXPECT_NE(err.find("strategy plugin '" + dir + "/libddp_strategy_corrupt.so'"), std::string::npos) << err;
  p = start(small_run(dir, "fifo", 2), {"DDP_PLUGIN_DIR=" + dir}, dir + "/fifo");
  EXPECT_EQ(wait_for(p, std::chrono::seconds(30)), 1);
  EXPECT_EQ(read_file(p.err), "ddp: error: cannot load strategy plugin '" + dir + "/libddp_strategy_fifo.so' (host ABI " +
                                  kAbi + ", plugin ABI none): not a regular file (a FIFO)\n");
  // bucketed's file under naive's name is not naive.
  const std::string renamed = temp_dir();
  fs::copy_file(std::string(DDP_TEST_PLUGIN_DIR) + "/libddp_strategy_bucketed.so",
                renamed + "/libddp_strategy_naive.so");
  p = start(small_run(dir, "naive", 2), {"DDP_PLUGIN_DIR=" + renamed}, dir + "/renamed");
  EXPECT_EQ(wait_for(p, std::chrono::seconds(30)), 1);
  EXPECT_EQ(read_file(p.err), "ddp: error: cannot load strategy plugin '" + renamed +
                                  "/libddp_strategy_naive.so' (host ABI " + kAbi + ", plugin ABI " + kAbi +
                                  "): its descriptor names it 'bucketed', not 'naive'\n");
  EXPECT_FALSE(fs::exists(dir + "/out"));
  fs::remove_all(dir);
  fs::remove_all(renamed);
}

TEST(HostilePlugin, DdpPlanAndBenchCommNameItsCode) {
  const std::string dir = temp_dir();
  for (const std::string variant : {"plan_exit", "plan_hang"}) {
    Process p = start({"plan", kRepo + "/configs/mlp.toml", "--set", "strategy.plugin=\"" + hostile(variant) + "\"",
                       "--set", "run.timeout_s=2"},
                      {}, dir + "/plan");
    EXPECT_EQ(wait_for(p, std::chrono::seconds(30)), 1);
    const std::string cause = variant == "plan_exit" ? "called exit(0) in plan" : "did not return from plan within 2 s";
    EXPECT_EQ(read_file(p.err), "ddp: error: ddp plan: strategy plugin '" + hostile(variant) + "' " + cause + "\n");
    EXPECT_EQ(read_file(p.out), "") << "no half of a plan";
  }
  Process p = start({"bench-comm", "--transport", hostile("ctor_crash"), "--world", "2", "--sizes", "4KB", "--out",
                     dir + "/bench"},
                    {}, dir + "/bench");
  EXPECT_EQ(wait_for(p, std::chrono::seconds(30)), 1);
  EXPECT_EQ(read_file(p.err), "ddp: error: bench-comm: transport plugin '" + hostile("ctor_crash") +
                                  "' crashed in its constructors (dlopen) (SIGSEGV)\n");
  fs::remove_all(dir);
}

}  // namespace
