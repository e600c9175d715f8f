// diagnose.h — what the user is told when the ranks of a run have ended, and
// the exit code: a pure function of how each rank exited and what it said
// (watch.h, failure.h). A rank fails if it exits non-zero, dies of a signal,
// or exits 0 without having said it completed. Which rank is to blame:
//   1. a rank killed by a signal (its peers' failures are the echo);
//   2. else, if a rank's failure was a timeout, the ranks that were still
//      running when the launcher stopped the run (they hung: the others
//      timed out waiting for them), or that rank if none was;
//   3. else the first rank that failed with anything but a lost peer;
//   4. else the first rank that failed (a lost peer, DDP_ERR_COMM: usually
//      the echo of a rank that died).
// Kinds come from the reports, never from the words of a message.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "failure.h"
#include "watch.h"

namespace ddp {

struct Diagnosis {
  int exit_code = 0;    // 0: every rank succeeded; 1: a rank failed; 130: interrupted
  std::string message;  // for stderr, whole lines ("" when every rank succeeded)
};

// `reports[r]` is rank r's report, if it wrote one. `timeout_note` names the
// timeout a hung rank ran into ("run.timeout_s = 30").
Diagnosis diagnose(const WatchResult& watched, const std::vector<std::optional<RankFailure>>& reports,
                   const std::string& timeout_note);

}  // namespace ddp
