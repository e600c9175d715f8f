// mpi_launch_test.cpp — `ddp run` with transport.plugin = "mpi": the same
// command as with gloo, the ranks started through mpirun. It trains to the
// same weights, and a rank that is killed or hangs is named within the
// timeout, as under our own launcher (launcher_test.cpp).
#include <gtest/gtest.h>

#include <signal.h>

#include <filesystem>
#include <string>
#include <thread>

#include "process.h"
#include "safetensors.h"

namespace {

namespace fs = std::filesystem;

// The one child of `parent` (our launcher's mpirun).
pid_t only_child(pid_t parent) {
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_file(entry.path() / "stat");
    const auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 2));
    std::string state;
    pid_t ppid = 0;
    fields >> state >> ppid;
    if (ppid == parent) return std::stoi(name);
  }
  return -1;
}

// Rank `rank` of a run `ddp run` (pid `ddp`) started through mpirun.
pid_t find_mpi_rank(pid_t ddp, int rank) {
  const pid_t mpirun = only_child(ddp);
  return mpirun < 0 ? -1 : find_rank(mpirun, rank, "OMPI_COMM_WORLD_RANK");
}

std::vector<std::string> toy_args(const std::string& out, const std::string& transport) {
  return {"run", kRepo + "/configs/toy.toml", "--set", "run.output_dir=\"" + out + "\"", "--set",
          "transport.plugin=\"" + transport + "\""};
}

TEST(MpiLaunch, TheTomlSwapTrainsToGloosWeightsWithProgressLines) {
  const std::string dir = temp_dir();
  for (const std::string transport : {"gloo", "mpi"}) {
    Process p = start(toy_args(dir + "/" + transport, transport), {}, dir + "/" + transport);
    ASSERT_EQ(wait_for(p, std::chrono::seconds(60)), 0) << read_file(p.err);
    EXPECT_NE(read_file(p.out).find("step 5/5  loss "), std::string::npos) << read_file(p.out);
  }
  const auto gloo = ddp::read_safetensors(dir + "/gloo/weights.safetensors");
  const auto mpi = ddp::read_safetensors(dir + "/mpi/weights.safetensors");
  ASSERT_EQ(gloo.size(), mpi.size());
  for (const auto& [name, tensor] : gloo) {
    ASSERT_TRUE(mpi.count(name)) << name;
    EXPECT_EQ(tensor.bytes, mpi.at(name).bytes) << name << " differs between gloo and mpi";
  }
  for (const auto& e : fs::directory_iterator(dir + "/mpi")) {
    const std::string name = e.path().filename();
    EXPECT_TRUE(name == "summary.json" || name == "weights.safetensors") << "left behind: " << name;
  }
  fs::remove_all(dir);
}

// A 4-rank mpi run, training; fails the test if it does not get there.
Process start_long_mpi_run(const std::string& dir, int timeout_s) {
  std::vector<std::string> args = toy_args(dir + "/out", "mpi");
  args.insert(args.end(), {"--set", "run.steps=100000000", "--set", "run.log_every=100", "--set",
                           "run.timeout_s=" + std::to_string(timeout_s), "--set", "run.world_size=4"});
  Process p = start(args, {}, dir + "/ddp");
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (read_file(p.out).find("step ") == std::string::npos && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_NE(read_file(p.out).find("step "), std::string::npos) << read_file(p.err);
  return p;
}

TEST(MpiLaunch, AKilledRankIsNamedAndTheRunStops) {
  const std::string dir = temp_dir();
  const int timeout_s = 10;
  Process p = start_long_mpi_run(dir, timeout_s);
  const pid_t victim = find_mpi_rank(p.pid, 2);
  ASSERT_GT(victim, 0) << "rank 2's process not found under mpirun";
  const auto killed_at = Clock::now();
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  EXPECT_EQ(wait_for(p, std::chrono::seconds(timeout_s + 30)), 1);
  const double took = std::chrono::duration<double>(Clock::now() - killed_at).count();
  EXPECT_LT(took, timeout_s) << "the run took " << took << " s to stop after a rank was killed";
  const std::string err = read_file(p.err);
  EXPECT_NE(err.find("ddp: rank 2 failed in step "), std::string::npos) << err;
  EXPECT_NE(err.find(": ended before completing its run, without a report (mpirun exited with code "),
            std::string::npos)
      << err;
  EXPECT_FALSE(fs::exists(dir + "/out/summary.json")) << "a failed run wrote a summary";
  fs::remove_all(dir);
}

// Fault case 9 over mpi: a plugin's exit(N) on one rank is named with the
// plugin, entry, step and code, as over gloo, at three timeouts. (Before our
// report came first, the exiting rank hung in Open MPI's MPI_Finalize at
// exit, and read as "stopped responding" after the timeout.)
TEST(MpiLaunch, APluginThatCallsExitIsNamedWithItsEntryAndStep) {
  for (const int code : {3, 0}) {
    for (const int timeout_s : {2, 5, 10}) {
      const std::string dir = temp_dir();
      std::vector<std::string> args = toy_args(dir + "/out", "mpi");
      args.insert(args.end(), {"--set", "strategy.plugin=\"" + std::string(DDP_TEST_BROKEN_PLUGIN_DIR) +
                                            "/libddp_strategy_faulty.so\"",
                               "--set", "strategy.fault=\"exit" + std::to_string(code) + "\"", "--set",
                               "strategy.entry=\"on_grad_ready\"", "--set", "strategy.step=1", "--set",
                               "strategy.rank=1", "--set", "run.timeout_s=" + std::to_string(timeout_s)});
      const auto started = Clock::now();
      Process p = start(args, {}, dir + "/ddp");
      EXPECT_EQ(wait_for(p, std::chrono::seconds(timeout_s + 30)), 1);
      const double took = std::chrono::duration<double>(Clock::now() - started).count();
      EXPECT_LT(took, timeout_s + 10) << "at run.timeout_s = " << timeout_s;
      const std::string err = read_file(p.err);
      const std::string want = "ddp: rank 1 failed in step 2: exited with code " + std::to_string(code) +
                               (code == 0 ? " before completing its run" : "") +
                               ": strategy plugin 'faulty' called exit(" + std::to_string(code) +
                               ") in on_grad_ready\nddp: stopped the other ranks; run failed\n";
      EXPECT_EQ(err.substr(err.find("ddp: ")), want) << "at run.timeout_s = " << timeout_s;  // after mpirun's lines
      EXPECT_FALSE(fs::exists(dir + "/out/summary.json"));
      fs::remove_all(dir);
    }
  }
}

// A crash in a plugin reads as under our own launcher: the signal (which
// mpirun's rank reports, as the launcher cannot see it), plugin, entry, step.
TEST(MpiLaunch, ACrashInAPluginNamesTheSignalThePluginTheEntryAndTheStep) {
  const std::string dir = temp_dir();
  std::vector<std::string> args = toy_args(dir + "/out", "mpi");
  args.insert(args.end(), {"--set", "strategy.plugin=\"" + std::string(DDP_TEST_BROKEN_PLUGIN_DIR) +
                                        "/libddp_strategy_faulty.so\"",
                           "--set", "strategy.fault=\"segv\"", "--set", "strategy.entry=\"on_grad_ready\"", "--set",
                           "strategy.step=2", "--set", "strategy.rank=1"});
  Process p = start(args, {}, dir + "/ddp");
  EXPECT_EQ(wait_for(p, std::chrono::seconds(60)), 1);
  const std::string err = read_file(p.err);
  EXPECT_EQ(err.substr(err.find("ddp: ")),
            "ddp: rank 1 failed in step 3: killed by signal 11 (Segmentation fault): strategy plugin 'faulty' "
            "crashed in on_grad_ready\nddp: stopped the other ranks; run failed\n");
  EXPECT_FALSE(fs::exists(dir + "/out/summary.json"));
  fs::remove_all(dir);
}

TEST(MpiLaunch, AHungRankIsNamedWithinTheTimeout) {
  const std::string dir = temp_dir();
  const int timeout_s = 3;
  Process p = start_long_mpi_run(dir, timeout_s);
  const pid_t victim = find_mpi_rank(p.pid, 2);
  ASSERT_GT(victim, 0);
  const auto stopped_at = Clock::now();
  ASSERT_EQ(kill(victim, SIGSTOP), 0);  // alive, but never answers again
  EXPECT_EQ(wait_for(p, std::chrono::seconds(timeout_s + 40)), 1);
  const double took = std::chrono::duration<double>(Clock::now() - stopped_at).count();
  EXPECT_LT(took, timeout_s + 10) << "the run took " << took << " s to stop after a rank hung";
  const std::string err = read_file(p.err);
  // Our first line is the verdict; Open MPI's own lines (its MPI_ABORT
  // banner, or an ORTE_ERROR_LOG line when that banner fails) may come first.
  EXPECT_EQ(err.find("ddp: rank 2 stopped responding: the other ranks timed out waiting (run.timeout_s = 3)\n"),
            err.find("ddp: "))
      << err;
  // mpirun's own children: gone, or reaped by init an instant later.
  const auto deadline = Clock::now() + std::chrono::seconds(3);
  while (kill(victim, 0) == 0 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(kill(victim, 0), -1) << "the hung rank was left behind";
  fs::remove_all(dir);
}

// An outside mpirun starting more ranks than the config's world: every
// rank refuses before it makes a rendezvous store, so none is left in
// TMPDIR, whichever rank mpirun kills while it unwinds (an empty
// ddp-rendezvous-pmix-* had been left 1 time in 11).
TEST(MpiLaunch, MoreRanksThanTheConfigsWorldLeaveNoRendezvousBehind) {
  const std::string dir = temp_dir();
  fs::create_directories(dir + "/tmp");
  for (int attempt = 0; attempt < 3; ++attempt) {
    const std::string command = "cd " + dir + " && TMPDIR=" + dir +
                                "/tmp OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 3 "
                                "--oversubscribe --bind-to none " +
                                kDdp + " run " + kRepo + "/configs/toy.toml --set 'run.output_dir=\"" + dir +
                                "/out\"' > " + dir + "/out.txt 2> " + dir + "/err.txt";
    EXPECT_NE(system(command.c_str()), 0);
    const std::string err = read_file(dir + "/err.txt");
    EXPECT_NE(err.find(": error: WORLD_SIZE=3 in the environment but run.world_size = 2 in " + kRepo +
                       "/configs/toy.toml\n"),
              std::string::npos)
        << err;
    for (const auto& entry : fs::directory_iterator(dir + "/tmp")) {
      const std::string name = entry.path().filename();
      EXPECT_NE(name.rfind("ddp-rendezvous-", 0), 0u) << "left behind: " << name;
    }
    EXPECT_FALSE(fs::exists(dir + "/out/summary.json"));
  }
  fs::remove_all(dir);
}

}  // namespace
