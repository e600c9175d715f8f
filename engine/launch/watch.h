// watch.h — waiting for the ranks to end. When one fails, the others get a
// grace to fail on their own (peers of a dead rank see the connection drop
// at once; peers of a hung one time out after run.timeout_s), then whatever
// still runs is killed. Ctrl-C (SIGINT) or SIGTERM kills them all at once.
#pragma once

#include <chrono>
#include <sys/types.h>
#include <vector>

namespace ddp {

// How one rank ended, as its launcher saw it.
struct RankExit {
  int status = 0;         // waitpid's status
  int failed_order = -1;  // 0 for the first rank to fail, 1 for the next...; -1: did not fail, or
                          // only after the launcher stopped the run
  bool stopped = false;   // still running when the launcher stopped the run
};

struct WatchResult {
  std::vector<RankExit> ranks;  // in rank order
  bool interrupted = false;     // SIGINT or SIGTERM
};

// Waits until every process of `pids` has ended; reaps them all.
WatchResult watch_ranks(const std::vector<pid_t>& pids, std::chrono::milliseconds grace);

}  // namespace ddp
