// watch.cpp — see watch.h.
#include "watch.h"

#include <sys/wait.h>

#include <csignal>
#include <thread>

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;

volatile std::sig_atomic_t g_interrupted = 0;
void on_interrupt(int) { g_interrupted = 1; }

bool succeeded(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

}  // namespace

WatchResult watch_ranks(const std::vector<pid_t>& pids, std::chrono::milliseconds grace) {
  g_interrupted = 0;
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  WatchResult result;
  result.ranks.resize(pids.size());
  std::vector<bool> running(pids.size(), true);
  size_t alive = pids.size();
  int failures = 0;
  Clock::time_point first_failure{};
  bool killed = false;
  while (alive > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (size_t r = 0; r < pids.size(); ++r) {
        if (pids[r] != pid) continue;
        running[r] = false;
        --alive;
        result.ranks[r].status = status;
        if (!succeeded(status) && !killed) {
          if (failures == 0) first_failure = Clock::now();
          result.ranks[r].failed_order = failures++;
        }
      }
      continue;
    }
    const bool grace_over = failures > 0 && Clock::now() - first_failure > grace;
    if (!killed && (g_interrupted || grace_over)) {
      for (size_t r = 0; r < pids.size(); ++r) {
        if (!running[r]) continue;
        result.ranks[r].stopped = true;
        kill(pids[r], SIGKILL);
      }
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  result.interrupted = g_interrupted != 0;
  return result;
}

}  // namespace ddp
