// watch.cpp — see watch.h.
#include "watch.h"

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;

volatile std::sig_atomic_t g_interrupted = 0;
void on_interrupt(int) { g_interrupted = 1; }

// A rank's channel: what it said so far, split into lines as they come.
struct Channel {
  int fd = -1;
  std::string pending;  // an incomplete last line
};

// Reads what `channel` holds now (without blocking); closes it at its end.
void listen(Channel& channel, RankExit& rank) {
  char buf[4096];
  while (channel.fd >= 0) {
    const ssize_t n = read(channel.fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return;  // EAGAIN: nothing more now
    if (n == 0) {       // the rank's end of the pipe is closed: it has exited
      close(channel.fd);
      channel.fd = -1;
      if (!channel.pending.empty()) hear(rank, channel.pending);
      channel.pending.clear();
      return;
    }
    channel.pending.append(buf, size_t(n));
    for (size_t eol; (eol = channel.pending.find('\n')) != std::string::npos;) {
      hear(rank, channel.pending.substr(0, eol));
      channel.pending.erase(0, eol + 1);
    }
  }
}

// After its rank has ended: what is left in the pipe, up to its end (or for
// at most 200 ms, should a process the rank started still hold it).
void finish_listening(Channel& channel, RankExit& rank) {
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(200);
  while (channel.fd >= 0 && Clock::now() < deadline) {
    listen(channel, rank);
    if (channel.fd >= 0) {
      pollfd p{channel.fd, POLLIN, 0};
      poll(&p, 1, 10);
    }
  }
  if (channel.fd >= 0) {
    close(channel.fd);
    channel.fd = -1;
  }
}

// Waits up to 10 ms for any channel to have something, or a rank to end.
void wait_a_little(const std::vector<Channel>& channels) {
  std::vector<pollfd> fds;
  for (const Channel& c : channels)
    if (c.fd >= 0) fds.push_back(pollfd{c.fd, POLLIN, 0});
  poll(fds.data(), fds.size(), 10);
}

}  // namespace

bool failed(const RankExit& exit) {
  return !(WIFEXITED(exit.status) && WEXITSTATUS(exit.status) == 0 && exit.completed);
}

void hear(RankExit& rank, const std::string& line) {
  if (line == "completed") {
    rank.completed = true;
  } else if (line.rfind("step ", 0) == 0) {
    try {
      rank.last_step = std::stoll(line.substr(5));
    } catch (const std::exception&) {  // not a number: ignored
    }
  } else if (line.rfind("failure ", 0) == 0 && rank.failure.empty()) {
    rank.failure = line.substr(8);  // the first report is the cause; later ones its echoes
  }
}

WatchResult watch_ranks(const std::vector<RankProcess>& ranks, std::chrono::milliseconds grace) {
  g_interrupted = 0;
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  WatchResult result;
  result.ranks.resize(ranks.size());
  std::vector<Channel> channels(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) channels[r].fd = ranks[r].channel;
  std::vector<bool> running(ranks.size(), true);
  size_t alive = ranks.size();
  int failures = 0;
  Clock::time_point first_failure{};
  bool killed = false;
  while (alive > 0) {
    for (size_t r = 0; r < ranks.size(); ++r) listen(channels[r], result.ranks[r]);
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (size_t r = 0; r < ranks.size(); ++r) {
        if (ranks[r].pid != pid) continue;
        running[r] = false;
        --alive;
        RankExit& exit = result.ranks[r];
        exit.status = status;
        finish_listening(channels[r], exit);  // all it said before it ended
        if (failed(exit) && !killed) {
          if (failures == 0) first_failure = Clock::now();
          exit.failed_order = failures++;
        }
      }
      continue;
    }
    const bool grace_over = failures > 0 && Clock::now() - first_failure > grace;
    if (!killed && (g_interrupted || grace_over)) {
      for (size_t r = 0; r < ranks.size(); ++r) {
        if (!running[r]) continue;
        result.ranks[r].stopped = true;
        kill(ranks[r].pid, SIGKILL);
      }
      killed = true;
    }
    wait_a_little(channels);
  }
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  result.interrupted = g_interrupted != 0;
  return result;
}

}  // namespace ddp
