// watch.cpp — see watch.h.
#include "watch.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <iterator>
#include <optional>
#include <thread>

#include "failure.h"

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;

volatile std::sig_atomic_t g_interrupted = 0;
void on_interrupt(int) { g_interrupted = 1; }

// Ctrl-C, SIGTERM and a hang-up (the terminal closed) stop the ranks and end
// the run cleanly while they run; each signal's own setting comes back
// afterwards. One the caller ignores stays ignored: `nohup ddp run` must
// outlive its terminal.
class InterruptHandlers {
 public:
  InterruptHandlers() {
    for (size_t i = 0; i < std::size(kSignals); ++i) {
      sigaction(kSignals[i], nullptr, &old_[i]);
      if (old_[i].sa_handler == SIG_IGN) continue;
      struct sigaction on {};
      on.sa_handler = on_interrupt;
      sigemptyset(&on.sa_mask);
      sigaction(kSignals[i], &on, nullptr);
    }
  }
  ~InterruptHandlers() {
    for (size_t i = 0; i < std::size(kSignals); ++i) sigaction(kSignals[i], &old_[i], nullptr);
  }
  InterruptHandlers(const InterruptHandlers&) = delete;
  InterruptHandlers& operator=(const InterruptHandlers&) = delete;

 private:
  static constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
  struct sigaction old_[std::size(kSignals)]{};
};

// A rank's channel: what it said so far, split into lines as they come.
struct Channel {
  int fd = -1;
  bool fifo = false;               // a FIFO the rank opens itself: no writer yet reads as an end, too
  bool heard = false;              // anything came on it
  Clock::time_point last_heard{};  // when it last said something (ranks say "alive" each second)
  std::string pending;             // an incomplete last line
};

// Reads what `channel` holds now (without blocking); closes it at its end.
void listen(Channel& channel, RankExit& rank) {
  char buf[4096];
  while (channel.fd >= 0) {
    const ssize_t n = read(channel.fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return;                                     // EAGAIN: nothing more now
    if (n == 0 && channel.fifo && !channel.heard) return;  // the rank has not opened it yet
    if (n == 0) {                                          // the rank's end of the pipe is closed: it has exited
      close(channel.fd);
      channel.fd = -1;
      if (!channel.pending.empty()) hear(rank, channel.pending);
      channel.pending.clear();
      return;
    }
    channel.heard = true;
    channel.last_heard = Clock::now();
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

// Waits for `pid` up to 5 s, then SIGTERM, 5 s more, then SIGKILL.
void reap(pid_t pid) {
  for (int signal : {0, SIGTERM, SIGKILL}) {
    if (signal != 0) kill(pid, signal);
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(5);
    while (Clock::now() < deadline) {
      if (waitpid(pid, nullptr, WNOHANG) != 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  waitpid(pid, nullptr, 0);
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

namespace {

// The status a rank of another launcher reported it would end with: the
// signal its crash handler re-raises, else its exit code (1 where its
// report does not say).
int reported_status(const RankExit& exit) {
  const std::optional<RankFailure> report = parse_failure(exit.failure);
  if (report && report->signal > 0 && report->signal < 128) return W_EXITCODE(0, report->signal);
  return W_EXITCODE((report ? report->exit_code : 1) & 0xff, 0);
}

// What is known of the run while it is watched.
struct Watch {
  const std::vector<RankProcess>& ranks;
  WatchResult result;
  std::vector<Channel> channels;
  std::vector<bool> running;
  int failures = 0;
  Clock::time_point first_failure{};
  bool killed = false;
  Clock::time_point killed_at{};
  int launcher_signal = 0;  // the last signal sent to a launcher of ranks

  // Rank r has ended with `status`: all it said before, and whether it failed.
  void ended(size_t r, int status) {
    running[r] = false;
    RankExit& exit = result.ranks[r];
    exit.status = status;
    finish_listening(channels[r], exit);
    if (failed(exit)) count_failure(r);
  }

  void count_failure(size_t r) {
    RankExit& exit = result.ranks[r];
    if (killed || exit.stopped || exit.failed_order >= 0) return;
    if (failures == 0) {
      first_failure = Clock::now();
      mark_silent();
    }
    exit.failed_order = failures++;
  }

  // At the first failure, a rank of another launcher that has been silent
  // for 3 s (no "alive" line: stopped, or frozen) is the one that stopped
  // responding; what it says once its launcher wakes it to stop it does
  // not count.
  void mark_silent() {
    for (size_t r = 0; r < ranks.size(); ++r)
      if (ranks[r].shared && running[r] && channels[r].heard &&
          Clock::now() - channels[r].last_heard > std::chrono::seconds(3))
        result.ranks[r].stopped = result.ranks[r].silent = true;
  }

  // A rank of another launcher fails when it says so: its launcher may take
  // a while to let it end (mpirun stops the job when one rank ends).
  void heard_failure(size_t r) {
    if (ranks[r].shared && running[r] && !result.ranks[r].failure.empty()) count_failure(r);
  }

  // A rank of another launcher whose channel closed: it ended. How is not
  // ours to see, so what it said decides (reported_status; unknown without
  // a report). One that ends without a word once another failed was
  // stopped by its launcher, as ours stops the others.
  void channel_closed(size_t r) {
    RankExit& exit = result.ranks[r];
    exit.status_known = exit.completed || !exit.failure.empty();
    exit.stopped |= !exit.status_known && failures > 0;
    ended(r, exit.completed ? 0 : reported_status(exit));
  }

  // The launcher that started the ranks ended: whichever of them had not,
  // ended with it (its own status where the rank said nothing).
  void launcher_ended(pid_t pid, int status) {
    for (size_t r = 0; r < ranks.size(); ++r) {
      if (!running[r] || ranks[r].pid != pid) continue;
      finish_listening(channels[r], result.ranks[r]);
      RankExit& exit = result.ranks[r];
      exit.status_known = exit.completed || !exit.failure.empty();
      exit.stopped |= !exit.status_known && failures > 0;
      ended(r, exit.completed ? 0 : !exit.failure.empty() ? reported_status(exit) : status);
    }
  }

  // After the grace (or at Ctrl-C): every rank still running is stopped.
  // A launcher of ranks (mpirun) stops its own once one failed or at Ctrl-C,
  // and a second signal while it does can crash it: it gets SIGTERM only if
  // it still runs 5 s later, and SIGKILL 5 s after that.
  void stop() {
    const Clock::time_point now = Clock::now();
    if (!killed) {
      killed = true;
      killed_at = now;
      for (size_t r = 0; r < ranks.size(); ++r) {
        if (!running[r]) continue;
        result.ranks[r].stopped = true;
        if (!ranks[r].shared) kill(ranks[r].pid, SIGKILL);
      }
    }
    const int signal = now - killed_at > std::chrono::seconds(10)  ? SIGKILL
                       : now - killed_at > std::chrono::seconds(5) ? SIGTERM
                                                                   : 0;
    if (signal == 0 || signal == launcher_signal) return;
    launcher_signal = signal;
    for (size_t r = 0; r < ranks.size(); ++r)
      if (running[r] && ranks[r].shared) {
        kill(ranks[r].pid, signal);  // once: every shared rank has the same launcher
        return;
      }
  }
};

}  // namespace

WatchResult watch_ranks(const std::vector<RankProcess>& ranks, std::chrono::milliseconds grace) {
  g_interrupted = 0;
  const InterruptHandlers handlers;
  Watch w{ranks, {}, std::vector<Channel>(ranks.size()), std::vector<bool>(ranks.size(), true)};
  w.result.ranks.resize(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) w.channels[r] = Channel{ranks[r].channel, ranks[r].shared, false, {}, {}};
  auto alive = [&] { return std::count(w.running.begin(), w.running.end(), true) > 0; };
  while (alive()) {
    for (size_t r = 0; r < ranks.size(); ++r) {
      listen(w.channels[r], w.result.ranks[r]);
      w.heard_failure(r);
      if (ranks[r].shared && w.running[r] && w.channels[r].fd < 0) w.channel_closed(r);
    }
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (size_t r = 0; r < ranks.size(); ++r)
        if (ranks[r].pid == pid && w.running[r] && !ranks[r].shared) w.ended(r, status);
      w.launcher_ended(pid, status);
      continue;
    }
    const bool grace_over = w.failures > 0 && Clock::now() - w.first_failure > grace;
    if (g_interrupted || grace_over) w.stop();
    wait_a_little(w.channels);
  }
  // A launcher whose ranks all ended is reaped too: it exits at once, or is
  // stopped.
  for (size_t r = 0; r < ranks.size(); ++r)
    if (ranks[r].shared) {
      reap(ranks[r].pid);
      break;
    }
  w.result.interrupted = g_interrupted != 0;
  return w.result;
}

}  // namespace ddp
