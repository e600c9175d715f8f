// launcher.h — starting a run's ranks on this machine and telling the user
// why it failed, in three parts: spawn (spawn.h) starts the rank processes,
// watch (watch.h) waits and stops the others once one fails, diagnose
// (diagnose.h) names the rank to blame from the structured report each rank
// writes (failure.h). `ddp run` and `ddp bench-comm` both start their ranks
// here; a rank runs its body under run_rank, which writes that report.
//
// Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, DDP_RENDEZVOUS (a fresh file
// store in a directory of its own under the output directory: Gloo's
// FileStore never deletes its files and refuses to reuse a key), DDP_RUN_ID
// and DDP_STATUS_FD or, through mpirun, DDP_STATUS_PATH (its channel to the
// launcher: core/whereabouts.h). The
// launch succeeds only if every rank said it completed.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "rank.h"

namespace ddp {

struct LaunchSpec {
  int world = 1;
  // The run's private directory (.rendezvous-XXXXXX) goes under it. The
  // caller holds its DirectoryLock: no other run owns a private directory
  // there, and those a launcher killed by SIGKILL left are removed.
  std::string output_dir;
  std::vector<std::string> args;  // every rank's argv (args[0]: the program name)
  std::string timeout_note;       // what a hung rank ran into: "run.timeout_s = 30"
  // More environment for rank r ("NAME=value"), given the run's private
  // directory; and names no rank inherits from this process.
  std::function<std::vector<std::string>(int rank, const std::string& run_dir)> rank_env;
  std::vector<std::string> unset;
  // Start the ranks through Open MPI's mpirun (found on PATH) rather than
  // as this process's children: for the mpi transport, whose ranks must be
  // MPI's. Each rank learns its number from mpirun; the launcher hears it on
  // a FIFO in the run's directory (DDP_STATUS_PATH) instead of a pipe.
  bool through_mpirun = false;
  // Called once every rank succeeded, before the run's private directory is
  // removed; an exception it throws fails the launch (reported, exit 1).
  std::function<void(const std::string& run_dir)> on_success;
};

// How a launch that failed failed: what the user was told, and whether a
// rank refused its input (a config or file error: starting again would
// only repeat it).
struct LaunchOutcome {
  std::string message;
  bool bad_input = false;
};

// Runs the ranks as child processes; returns the exit code for the user (0
// when every rank succeeded; 1 after printing which rank failed and why;
// 130 on Ctrl-C), and fills `outcome` if given.
int launch_ranks(const LaunchSpec& spec, LaunchOutcome* outcome = nullptr);

// Whether a name in an output directory is a run's private directory as
// launch_ranks makes it (".rendezvous-" and mkdtemp's six characters). Pure.
bool is_run_dir_name(const std::string& name);

// Whether ranks with transport plugin `plugin` are started through mpirun
// (LaunchSpec::through_mpirun): the mpi transport's, by name or file name.
bool needs_mpirun(const std::string& plugin);

// Runs this process as the rank that RANK, WORLD_SIZE, LOCAL_RANK and
// DDP_RENDEZVOUS (and DDP_RUN_ID) name: SIGPIPE ignored, the crash handler
// installed, a watchdog at `timeout` (run.timeout_s; `timeout_note` says so:
// "run.timeout_s = 30") plus Watchdog::kGrace. Returns 0 after saying
// "completed" on the rank's channel, or 1 after reporting the failure: on
// the channel if there is one (our launcher's), else on stderr ("ddp: rank
// <r>: error: <message>"). `check` (optional) refuses a rank before it
// touches the rendezvous (a world size the config does not have): another
// launcher may kill the rank as soon as one fails, and a store made by then
// would be left behind.
int run_rank(const std::function<void(const RankEnv&)>& body, std::chrono::milliseconds timeout,
             const std::string& timeout_note, const std::function<void(const RankInfo&)>& check = nullptr);

// A rank's failure before run_rank (its config does not load), reported as
// run_rank reports one ("ddp: error: ..." if no rank can be told). Returns 1.
int rank_failed_early(const std::exception& e);

// Whether a launcher started this process as a rank (rank_env.h: RANK,
// mpirun's, mpiexec's or srun's variables), rather than `ddp run` itself.
bool launched_as_rank();

}  // namespace ddp
