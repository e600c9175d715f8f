// restart_test.cpp — a run outlives its processes (issue 14), tried with the
// real `ddp` command as a user runs it:
//  - a rank killed with SIGKILL in the middle of a run with checkpoint.every
//    = 2 and run.max_restarts = 1: the run restarts from its latest
//    checkpoint, loses at most 2 steps, and ends with the uninterrupted
//    run's weights and losses, bit for bit; summary.json records the restart;
//  - ranks killed while a checkpoint is being written leave `latest` naming
//    the previous one, from which --resume ends equal to the uninterrupted
//    run (and the partial checkpoint is cleared away);
//  - a full checkpoint.dir is named by the rank that could not write, and
//    neither it nor a rank that refused its config is restarted.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "process.h"
#include "safetensors.h"

namespace {

namespace fs = std::filesystem;
constexpr int kSteps = 400;

std::vector<std::string> toy_run(const std::string& out, const std::vector<std::string>& more = {}) {
  std::vector<std::string> args = {"run",   kRepo + "/configs/toy.toml", "--set", "run.output_dir=\"" + out + "\"",
                                   "--set", "run.steps=" + std::to_string(kSteps), "--set", "run.log_every=10",
                                   "--set", "optimizer.momentum=0.9"};
  for (const std::string& m : more) args.insert(args.end(), {"--set", m});
  return args;
}

nlohmann::json summary_of(const std::string& out) { return nlohmann::json::parse(read_file(out + "/summary.json")); }

// The uninterrupted run: its weights file's bytes and its summary.
struct Reference {
  std::string weights;
  nlohmann::json summary;
};
Reference reference(const std::string& dir) {
  Process p = start(toy_run(dir + "/whole"), {}, dir + "/whole");
  EXPECT_EQ(wait_for(p, std::chrono::seconds(120)), 0) << read_file(p.err);
  return {read_file(dir + "/whole/weights.safetensors"), summary_of(dir + "/whole")};
}

// The step of the last progress line in `text` (0 if none).
int last_step(const std::string& text) {
  const size_t at = text.rfind("\nstep ");
  if (at != std::string::npos) return std::stoi(text.substr(at + 6));
  return text.rfind("step ", 0) == 0 ? std::stoi(text.substr(5)) : 0;
}

int checkpoint_step(const std::string& path) { return std::stoi(path.substr(path.rfind("step-") + 5)); }

TEST(Restart, ARankKilledMidRunRestartsFromTheLatestCheckpointAndEndsEqual) {
  const std::string dir = temp_dir();
  const Reference whole = reference(dir);
  const std::string out = dir + "/restarted";
  Process p = start(toy_run(out, {"checkpoint.every=2", "run.max_restarts=1"}), {}, dir + "/restarted");
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (last_step(read_file(p.out)) < 100 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const pid_t victim = find_rank(p.pid, 1);
  ASSERT_GT(victim, 0) << "rank 1 not found; the run said:\n" << read_file(p.out) << read_file(p.err);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  const int seen = last_step(read_file(p.out));
  ASSERT_EQ(wait_for(p, std::chrono::seconds(120)), 0) << read_file(p.err);

  std::string err = read_file(p.err);
  // What rank 0 saw of it, if it said so within the launcher's second.
  const std::string echo = "ddp: rank 0 reported in step ";
  if (const size_t at = err.find(echo); at != std::string::npos) err.erase(at, err.find('\n', at) + 1 - at);
  EXPECT_EQ(err.substr(0, err.find("from ")), "ddp: rank 1 failed: killed by signal 9 (Killed)\n"
                                               "ddp: stopped the other ranks; run failed\n"
                                               "ddp: restarting the run (1 of run.max_restarts = 1) ")
      << err;
  EXPECT_EQ(read_file(out + "/weights.safetensors"), whole.weights) << "the restarted run ended elsewhere";
  const nlohmann::json summary = summary_of(out);
  EXPECT_EQ(summary["loss"], whole.summary["loss"]);
  ASSERT_EQ(summary["restarts"].size(), 1u) << summary["restarts"];
  const std::string from = summary["restarts"][0]["resumed_from"];
  EXPECT_GE(checkpoint_step(from), seen - 2) << "lost more than 2 steps: killed after step " << seen;
  EXPECT_EQ(summary["first_step"], checkpoint_step(from));
  EXPECT_NE(summary["restarts"][0]["failure"].get<std::string>().find("rank 1 failed: killed by signal 9"),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(Restart, RanksKilledWhileACheckpointIsWrittenLeaveThePreviousOneToResumeFrom) {
  const std::string dir = temp_dir();
  const Reference whole = reference(dir);
  const std::string out = dir + "/killed", checkpoints = out + "/checkpoints";
  // Kill every rank the moment a checkpoint is being built; a kill that
  // lands after its rename did not test this, so try again.
  std::string partial;
  for (int attempt = 0; attempt < 20 && partial.empty(); ++attempt) {
    fs::remove_all(out);
    Process p = start(toy_run(out, {"checkpoint.every=1"}), {}, dir + "/killed");
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    std::string seen;
    while (seen.empty() && Clock::now() < deadline && waitpid(p.pid, nullptr, WNOHANG) == 0) {
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(checkpoints, ec)) {
        const std::string name = e.path().filename();
        if (name.size() > 8 && name.compare(name.size() - 8, 8, ".partial") == 0 && name > "step-00000050")
          seen = name;
      }
    }
    for (int r = 0; r < 2; ++r)
      if (const pid_t rank = find_rank(p.pid, r); rank > 0) kill(rank, SIGKILL);
    wait_for(p, std::chrono::seconds(60));
    if (!seen.empty() && fs::exists(checkpoints + "/" + seen)) partial = seen;
  }
  ASSERT_FALSE(partial.empty()) << "never killed the ranks in the middle of a checkpoint";
  const std::string latest = read_file(checkpoints + "/latest");
  EXPECT_LT(latest, partial) << "latest names the checkpoint that was being written";
  EXPECT_TRUE(fs::exists(checkpoints + "/" + latest.substr(0, latest.size() - 1) + "/checkpoint.json"));

  std::vector<std::string> args = toy_run(out, {"checkpoint.every=1"});
  args.push_back("--resume");
  Process p = start(args, {}, dir + "/resumed");
  ASSERT_EQ(wait_for(p, std::chrono::seconds(120)), 0) << read_file(p.err);
  EXPECT_EQ(read_file(out + "/weights.safetensors"), whole.weights);
  EXPECT_EQ(summary_of(out)["loss"], whole.summary["loss"]);
  for (const auto& e : fs::directory_iterator(checkpoints))
    EXPECT_EQ(e.path().filename().string().find(".partial"), std::string::npos) << "left behind: " << e.path();
  fs::remove_all(dir);
}

// A checkpoint.dir that runs out of space: rank 0's own report is the one
// named (its peer's "rank 0 could not write" is the echo), and a disk that
// refused the files is not worth a restart.
TEST(Restart, AFullCheckpointDirIsNamedByTheRankThatWroteAndNotRestarted) {
  if (geteuid() != 0 || system("unshare -m true 2>/dev/null") != 0) GTEST_SKIP() << "needs root for unshare -m";
  const std::string dir = temp_dir();
  fs::create_directories(dir + "/full");
  std::ofstream(dir + "/run.sh") << "mount -t tmpfs -o size=20k tmpfs " << dir << "/full || exit 99\n"
                                 << kDdp << " run " << kRepo << "/configs/toy.toml --set run.steps=6"
                                 << " --set checkpoint.every=1 --set optimizer.momentum=0.9 --set run.max_restarts=2"
                                 << " --set 'checkpoint.dir=\"" << dir << "/full/ck\"' --set 'run.output_dir=\""
                                 << dir << "/out\"' > /dev/null 2> " << dir << "/err\n";
  for (int attempt = 0; attempt < 3; ++attempt) {  // whichever rank notices first
    const int status = system(("unshare -m sh " + dir + "/run.sh").c_str());
    ASSERT_TRUE(WIFEXITED(status));
    ASSERT_NE(WEXITSTATUS(status), 99) << "could not mount a tmpfs";
    EXPECT_EQ(WEXITSTATUS(status), 1);
    const std::string err = read_file(dir + "/err");
    EXPECT_NE(err.find("ddp: rank 0 failed in step "), std::string::npos) << err;
    EXPECT_NE(err.find("cannot write file (No space left on device)"), std::string::npos) << err;
    EXPECT_EQ(err.find("restarting"), std::string::npos) << err;
  }
  fs::remove_all(dir);
}

TEST(Restart, ARankThatRefusesItsConfigIsNotRestarted) {
  const std::string dir = temp_dir();
  const std::string out = dir + "/out";
  fs::create_directories(out + "/checkpoints");
  std::ofstream(out + "/checkpoints/latest") << "step-00000002\n";
  Process p = start(toy_run(out, {"checkpoint.every=2", "run.max_restarts=3"}), {}, dir + "/ddp");
  EXPECT_EQ(wait_for(p, std::chrono::seconds(60)), 1);
  const std::string err = read_file(p.err);
  EXPECT_EQ(err.find("restarting"), std::string::npos) << err;
  EXPECT_NE(err.find("holds an earlier run's checkpoints"), std::string::npos) << err;
  fs::remove_all(dir);
}

}  // namespace
