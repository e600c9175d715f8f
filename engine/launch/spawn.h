// spawn.h — starting rank processes: this executable again
// (/proc/self/exe), never threads, so that a rank that crashes or is killed
// cannot take the launcher with it, and the launcher sees it. A rank never
// outlives its launcher (killed by CI, by the OOM killer, by hand).
#pragma once

#include <sys/types.h>
#include <string>
#include <vector>

namespace ddp {

// The environment of a rank: this process's own, less every variable named
// in `set` (NAME=value entries) or `unset` (NAME), plus `set`.
std::vector<std::string> rank_environment(const std::vector<std::string>& set, const std::vector<std::string>& unset);

// A rank process, and the read end of its channel (whereabouts.h): a pipe
// whose write end the rank finds in DDP_STATUS_FD. Non-blocking.
struct RankProcess {
  pid_t pid = -1;
  int channel = -1;
  bool shared = false;  // pid is the launcher's that started every rank (spawn_through)
};

// Starts one process per entry of `envs`, each running `args` (args[0] is
// the program name) with that environment and DDP_STATUS_FD. Throws Error
// naming the rank that could not be started, after killing and reaping the
// ones that were.
std::vector<RankProcess> spawn_ranks(std::vector<std::string> args, std::vector<std::vector<std::string>> envs);

// Starts the ranks through another launcher (mpirun): one process running
// `command` (the launcher's whole command line; command[0] is looked up on
// PATH) with the environment `env`. Rank r's channel is a FIFO made at
// fifos[r] and opened here before the launcher starts; the rank finds it in
// DDP_STATUS_PATH (the command gives it). Every RankProcess holds the
// launcher's pid, shared. Throws Error if a FIFO cannot be made or the
// launcher cannot be started.
std::vector<RankProcess> spawn_through(std::vector<std::string> command, std::vector<std::string> env,
                                       const std::vector<std::string>& fifos);

}  // namespace ddp
