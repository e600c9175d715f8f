// watch.h — waiting for the ranks to end, and listening to them. Each rank
// speaks on its channel (core/whereabouts.h): the step it is in, its failure
// report, and that it completed. When one fails — exits non-zero, dies of a
// signal, or exits 0 without having completed — the others get a grace to
// fail on their own (peers of a dead rank see the connection drop at once;
// peers of a hung one time out after run.timeout_s), then whatever still
// runs is killed. Ctrl-C (SIGINT) or SIGTERM kills them all at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "spawn.h"

namespace ddp {

// How one rank ended, as its launcher saw and heard it.
struct RankExit {
  int status = 0;            // waitpid's status
  int failed_order = -1;     // 0 for the first rank to fail, 1 for the next...; -1: did not fail, or
                             // only after the launcher stopped the run
  bool stopped = false;      // still running when the launcher stopped the run
  bool silent = false;       // a rank of mpirun's that had said nothing for 3 s when the first
                             // rank failed: frozen (stopped)
  bool completed = false;    // it said "completed"
  int64_t last_step = -1;    // the last "step <n>" it said (-1: none)
  std::string failure;       // the JSON of its "failure" line ("": none)
  bool status_known = true;  // false: a rank of another launcher (mpirun) that ended without a
                             // word; `status` is then the launcher's, or exit 1 if it still ran
};

struct WatchResult {
  std::vector<RankExit> ranks;  // in rank order
  bool interrupted = false;     // SIGINT or SIGTERM
};

// Whether a rank's end is a failure: an exit code other than 0, a signal,
// or an exit 0 without "completed".
bool failed(const RankExit& exit);

// Waits until every process of `ranks` has ended and its channel is read to
// the end; reaps them all and closes the channels.
WatchResult watch_ranks(const std::vector<RankProcess>& ranks, std::chrono::milliseconds grace);

// Applies one line a rank said to what is known of it (pure; for tests).
void hear(RankExit& rank, const std::string& line);

}  // namespace ddp
