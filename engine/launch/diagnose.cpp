// diagnose.cpp — see diagnose.h.
#include "diagnose.h"

#include <sys/wait.h>

#include <cstdint>
#include <cstring>

namespace ddp {
namespace {

// How much a rank's failure explains the run's: the rank with the highest
// weight is named (the first of them to fail on a tie).
int weight(const RankExit& exit, const std::optional<RankFailure>& report) {
  if (WIFSIGNALED(exit.status) || !exit.status_known) return 3;
  if (!report) return 1;
  if (report->kind == DDP_ERR_TIMEOUT) return 2;
  if (report->kind == DDP_ERR_COMM) return 0;
  return 1;
}

// A rank that exited 0 without saying it completed (a plugin or a bug ended
// the process early), or one of mpirun's that ended without a word.
bool ended_early(const RankExit& exit) {
  if (!exit.status_known) return true;
  return WIFEXITED(exit.status) && WEXITSTATUS(exit.status) == 0 && !exit.completed;
}

// How the launcher that started a rank (mpirun) ended, for a rank that
// could not say how it did: mpirun's own lines, printed above, say more.
std::string launcher_said(int status) {
  if (WIFSIGNALED(status)) return "mpirun was killed by signal " + std::to_string(WTERMSIG(status));
  if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
    return "mpirun exited with code " + std::to_string(WEXITSTATUS(status)) + "; its own lines above say why";
  return "see mpirun's lines above";
}

// "killed by signal 9 (Killed)", "exited with code 1", or "exited with code
// 0 before completing its run", then what the rank reported, if it did (a
// crash handler reports too).
std::string cause(const RankExit& exit, const std::optional<RankFailure>& report) {
  std::string text;
  if (!exit.status_known) {
    text = "ended before completing its run, without a report (" + launcher_said(exit.status) + ")";
  } else if (WIFSIGNALED(exit.status)) {
    const int sig = WTERMSIG(exit.status);
    text = "killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  } else {
    text = "exited with code " + std::to_string(WEXITSTATUS(exit.status));
    if (ended_early(exit)) text += " before completing its run";
  }
  if (report && !report->message.empty()) text += ": " + report->message;
  return text;
}

// " in step N" (counted from 1, as the progress lines) where the rank said
// so: in its report, or, for one that ended early, in its last step line.
std::string at_step(const RankExit& exit, const std::optional<RankFailure>& report) {
  const int64_t step = report ? report->step : ended_early(exit) ? exit.last_step : -1;
  return step >= 0 ? " in step " + std::to_string(step + 1) : "";
}

// The first rank other than `blamed` to fail with a report of a failed
// collective (a peer's echo of the failure), or -1.
int first_echo(const std::vector<RankExit>& ranks, const std::vector<std::optional<RankFailure>>& reports, int blamed) {
  int first = -1;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (int(r) == blamed || ranks[r].failed_order < 0 || !reports[r] || reports[r]->message.empty()) continue;
    if (reports[r]->kind != DDP_ERR_COMM && reports[r]->kind != DDP_ERR_TIMEOUT) continue;
    if (first < 0 || ranks[r].failed_order < ranks[size_t(first)].failed_order) first = int(r);
  }
  return first;
}

}  // namespace

Diagnosis diagnose(const WatchResult& watched, const std::vector<std::optional<RankFailure>>& reports,
                   const std::string& timeout_note) {
  const std::vector<RankExit>& ranks = watched.ranks;
  if (watched.interrupted) return {130, "ddp: interrupted; stopped all ranks\n"};
  int blamed = -1;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].failed_order < 0) continue;
    const int w = weight(ranks[r], reports[r]);
    const int best = blamed < 0 ? -1 : weight(ranks[blamed], reports[blamed]);
    if (w > best || (w == best && ranks[r].failed_order < ranks[blamed].failed_order)) blamed = int(r);
  }
  if (blamed < 0) return {0, ""};

  // The ranks the others waited for: those that fell silent (mpirun's), else
  // those still running when the launcher stopped the run.
  std::string stopped;
  std::string silent;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].stopped) stopped += (stopped.empty() ? "" : ", ") + std::to_string(r);
    if (ranks[r].silent) silent += (silent.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!silent.empty()) stopped = silent;
  const RankExit& exit = ranks[blamed];
  const std::optional<RankFailure>& report = reports[blamed];
  std::string message;
  if (weight(exit, report) == 2 && !stopped.empty()) {
    message = "ddp: rank" + std::string(stopped.find(',') == std::string::npos ? " " : "s ") + stopped +
              " stopped responding: the other ranks timed out waiting (" + timeout_note + ")\n" + "ddp: rank " +
              std::to_string(blamed) + " reported" + at_step(exit, report) + ": " + cause(exit, report) + "\n";
  } else {
    message =
        "ddp: rank " + std::to_string(blamed) + " failed" + at_step(exit, report) + ": " + cause(exit, report) + "\n";
    const int peer = first_echo(ranks, reports, blamed);
    if (weight(exit, report) == 3 && !report && peer >= 0)  // it said nothing: what a peer saw (a collective, a unit)
      message += "ddp: rank " + std::to_string(peer) + " reported" + at_step(ranks[peer], reports[peer]) + ": " +
                 cause(ranks[peer], reports[peer]) + "\n";
  }
  return {1, message + "ddp: stopped the other ranks; run failed\n"};
}

}  // namespace ddp
