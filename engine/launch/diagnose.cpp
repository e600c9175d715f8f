// diagnose.cpp — see diagnose.h.
#include "diagnose.h"

#include <sys/wait.h>

#include <cstring>

namespace ddp {
namespace {

// How much a rank's failure explains the run's: the rank with the highest
// weight is named (the first of them to fail on a tie).
int weight(const RankExit& exit, const std::optional<RankFailure>& report) {
  if (WIFSIGNALED(exit.status)) return 3;
  if (!report) return 1;
  if (report->kind == DDP_ERR_TIMEOUT) return 2;
  if (report->kind == DDP_ERR_COMM) return 0;
  return 1;
}

// "killed by signal 9 (Killed)", or "exited with code 1: <message>", and
// where the failure happened when the rank said.
std::string cause(const RankExit& exit, const std::optional<RankFailure>& report) {
  if (WIFSIGNALED(exit.status)) {
    const int sig = WTERMSIG(exit.status);
    return "killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  }
  std::string text = "exited with code " + std::to_string(WEXITSTATUS(exit.status));
  if (report && !report->message.empty()) text += ": " + report->message;
  return text;
}

std::string at_step(const std::optional<RankFailure>& report) {
  return report && report->step >= 0 ? " in step " + std::to_string(report->step + 1) : "";
}

}  // namespace

Diagnosis diagnose(const WatchResult& watched, const std::vector<std::optional<RankFailure>>& reports,
                   const std::string& timeout_note) {
  const std::vector<RankExit>& ranks = watched.ranks;
  if (watched.interrupted) return {130, "ddp: interrupted; stopped all ranks\n"};
  int blamed = -1;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].failed_order < 0) continue;
    const int w = weight(ranks[r], reports[r]), best = blamed < 0 ? -1 : weight(ranks[blamed], reports[blamed]);
    if (w > best || (w == best && ranks[r].failed_order < ranks[blamed].failed_order)) blamed = int(r);
  }
  if (blamed < 0) return {0, ""};

  std::string stopped;
  for (size_t r = 0; r < ranks.size(); ++r)
    if (ranks[r].stopped) stopped += (stopped.empty() ? "" : ", ") + std::to_string(r);
  const RankExit& exit = ranks[blamed];
  const std::optional<RankFailure>& report = reports[blamed];
  std::string message;
  if (weight(exit, report) == 2 && !stopped.empty()) {
    message = "ddp: rank" + std::string(stopped.find(',') == std::string::npos ? " " : "s ") + stopped +
              " stopped responding: the other ranks timed out waiting (" + timeout_note + ")\n" + "ddp: rank " +
              std::to_string(blamed) + " reported" + at_step(report) + ": " + cause(exit, report) + "\n";
  } else {
    message = "ddp: rank " + std::to_string(blamed) + " failed" + at_step(report) + ": " + cause(exit, report) + "\n";
  }
  return {1, message + "ddp: stopped the other ranks; run failed\n"};
}

}  // namespace ddp
