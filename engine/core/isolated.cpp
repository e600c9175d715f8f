// isolated.cpp — see isolated.h.
//
// The child reports on a pipe, one record, its first byte saying which:
//   R<result>                  body returned
//   E<status>\n<message>       body threw
//   X<code>\t<plugin>\t<entry> something called exit()  (glibc's on_exit)
//   C<signal>\t<plugin>\t<entry> a fatal signal
//   H\t<plugin>\t<entry>       its own timer ran out (the bound)
// The last three come from handlers, written with write(2) alone.
#include "isolated.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <new>

#include "error.h"
#include "signal_name.h"
#include "whereabouts.h"

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;

// Time the parent waits past the child's own bound before it kills it
// (a child whose timer cannot fire: SIGALRM blocked, a handler stuck).
constexpr std::chrono::milliseconds kKillGrace{2000};
// What a nested call leaves its parent to report in.
constexpr std::chrono::milliseconds kReportMargin{1000};

int g_fd = -1;                   // the child's end of the pipe
Clock::time_point g_deadline{};  // the child's bound; epoch outside a child
char g_alt_stack[64 * 1024];

// Appends to a fixed buffer, async-signal-safe.
struct Record {
  char text[4096];
  size_t size = 0;
  void add(const char* s) {
    while (s && *s && size < sizeof text) text[size++] = *s++;
  }
  void add_int(long v) {
    char digits[24];
    int n = 0;
    unsigned long u = v < 0 ? 0UL - (unsigned long)v : (unsigned long)v;
    do {
      digits[n++] = char('0' + u % 10);
      u /= 10;
    } while (u > 0);
    if (v < 0) add("-");
    while (n > 0 && size < sizeof text) text[size++] = digits[--n];
  }
  // "\t<plugin>\t<entry>" of the innermost scope of the calling thread, or
  // else of the bound (child's main) thread.
  void add_where() {
    const char* plugin = whereabouts::plugin();
    const char* entry = whereabouts::entry();
    if (!plugin && !entry) {
      const whereabouts::Stage stage = whereabouts::training_stage();
      plugin = stage.plugin;
      entry = stage.entry;
    }
    add("\t");
    add(plugin);
    add("\t");
    add(entry);
  }
  void send() const {
    size_t done = 0;
    while (done < size) {
      const ssize_t n = write(g_fd, text + done, size - done);
      if (n <= 0 && errno != EINTR) return;
      if (n > 0) done += size_t(n);
    }
  }
};

void on_fatal_signal(int sig) {
  Record r;
  r.add("C");
  r.add_int(sig);
  r.add_where();
  r.send();
  signal(sig, SIG_DFL);
  raise(sig);
}

// "H<ms>": how long the child has been in its current entry (a plan loop
// that calls an entry many times is not an entry that never returned).
void on_timer(int) {
  Record r;
  r.add("H");
  const whereabouts::Stage stage = whereabouts::training_stage();
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  const int64_t now_ns = int64_t(now.tv_sec) * 1000000000 + now.tv_nsec;
  r.add_int(long(stage.entry && stage.since_ns > 0 ? (now_ns - stage.since_ns) / 1000000 : -1));
  r.add_where();
  r.send();
  _exit(124);
}

void on_exit_call(int code, void*) {
  Record r;
  r.add("X");
  r.add_int(code);
  r.add_where();
  r.send();
  std::fflush(nullptr);
  _exit(code == 0 ? 1 : code);
}

void send_all(const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(g_fd, text.data() + done, text.size() - done);
    if (n <= 0 && errno != EINTR) return;
    if (n > 0) done += size_t(n);
  }
}

// The child: handlers that report, its own timer, then `body`.
[[noreturn]] void child(int fd, std::chrono::milliseconds bound, const std::function<std::string()>& body) {
  g_fd = fd;
  g_deadline = Clock::now() + bound;
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // a launcher killed meanwhile takes its check with it
  setpgid(0, 0);                     // a group of its own: what plugin code forks is killed with it
  whereabouts::bind_training_thread();
  stack_t ss{};
  ss.ss_sp = g_alt_stack;
  ss.ss_size = sizeof g_alt_stack;
  sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND | SA_ONSTACK | SA_NODEFER;
  sa.sa_handler = on_fatal_signal;
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGSYS, SIGTRAP}) sigaction(sig, &sa, nullptr);
  sa.sa_flags = SA_ONSTACK;
  sa.sa_handler = on_timer;
  sigaction(SIGALRM, &sa, nullptr);
  sigset_t alarm_only;
  sigemptyset(&alarm_only);
  sigaddset(&alarm_only, SIGALRM);
  sigprocmask(SIG_UNBLOCK, &alarm_only, nullptr);
  itimerval timer{};
  timer.it_value.tv_sec = long(bound.count() / 1000);
  timer.it_value.tv_usec = long(bound.count() % 1000) * 1000;
  setitimer(ITIMER_REAL, &timer, nullptr);
  on_exit(on_exit_call, nullptr);
  std::string out;
  try {
    out = "R" + body();
  } catch (const std::bad_alloc&) {
    out = "E" + std::to_string(int(DDP_ERR_OUT_OF_MEMORY)) + "\nout of memory";
  } catch (const std::exception& e) {
    out = "E" + std::to_string(int(kind_of(e))) + "\n" + e.what();
  }
  timer = {};
  setitimer(ITIMER_REAL, &timer, nullptr);
  send_all(out);
  std::fflush(nullptr);
  _exit(0);
}

std::string seconds_text(double s) {
  char out[32];
  std::snprintf(out, sizeof out, s >= 100 ? "%.0f s" : "%.3g s", s);
  return out;
}

// What the child read from the pipe until it closed, and its wait status.
struct Outcome {
  std::string report;
  int status = 0;
  bool timed_out = false;
};

// Reads what the child sends until it has ended (not until the pipe
// closes: what plugin code forked may hold it open, or close it early);
// past the bound and the grace, kills its process group.
Outcome wait_for(pid_t pid, int fd, std::chrono::milliseconds bound) {
  Outcome o;
  const Clock::time_point give_up = Clock::now() + bound + kKillGrace;
  char buffer[65536];
  bool ended = false;
  bool open = true;
  while (!ended) {
    ended = waitpid(pid, &o.status, WNOHANG) == pid;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(give_up - Clock::now());
    if (!ended && left.count() <= 0) {
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      o.timed_out = true;
      while (waitpid(pid, &o.status, 0) < 0 && errno == EINTR) {}
      ended = true;
    }
    // What the pipe holds now (all of it once the child has ended).
    pollfd p{fd, POLLIN, 0};
    while (open && poll(&p, 1, ended ? 0 : int(std::min<int64_t>(std::max<int64_t>(left.count(), 0), 50))) > 0) {
      const ssize_t n = read(fd, buffer, sizeof buffer);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        open = false;
        break;
      }
      o.report.append(buffer, size_t(n));
    }
  }
  close(fd);
  kill(-pid, SIGKILL);  // what it forked, if any is left
  return o;
}

// "<plugin> ... in <entry>" from a record's "\t<plugin>\t<entry>".
struct Where {
  std::string plugin;
  std::string entry;
};
Where where_of(const std::string& record) {
  Where w;
  const size_t a = record.find('\t');
  if (a == std::string::npos) return w;
  const size_t b = record.find('\t', a + 1);
  w.plugin = record.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1);
  if (b != std::string::npos) w.entry = record.substr(b + 1);
  return w;
}

}  // namespace

std::string isolated_ending(const std::string& report, int wait_status, bool timed_out, double bound_s) {
  const char kind = report.empty() ? '\0' : report[0];
  const Where w = where_of(report);
  const std::string who = w.plugin.empty() ? "the check" : w.plugin;
  const std::string in = w.entry.empty() ? (w.plugin.empty() ? " outside any plugin entry" : "") : " in " + w.entry;
  if (kind == 'X') {
    const std::string code = report.substr(1, report.find('\t') - 1);
    return who + " called exit(" + code + ")" + in;
  }
  if (kind == 'C') {
    const int sig = std::atoi(report.c_str() + 1);
    return who + " crashed" + in + " (" + signal_name(sig) + ")";
  }
  if (kind == 'H' || timed_out) {
    if (w.entry.empty()) return who + " did not finish within " + seconds_text(bound_s);
    // An entry entered late in the bound did not hang: the work around it
    // (a plan of many ranks calling it again and again) did not end.
    const double in_entry_s = kind == 'H' ? std::atof(report.c_str() + 1) / 1000 : -1;
    if (in_entry_s >= 0 && 2 * in_entry_s < bound_s)
      return "the check did not finish within " + seconds_text(bound_s) + " (it was in " + w.entry + " of " + who +
             ", entered " + seconds_text(in_entry_s) + " before)";
    return who + " did not return from " + w.entry + " within " + seconds_text(bound_s);
  }
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    return "the check was killed by signal " + std::to_string(sig) + " (" + signal_name(sig) + ")";
  }
  const int code = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1;
  return "the check ended (exit code " + std::to_string(code) + ") without a result";
}

std::chrono::milliseconds isolated_time_left() {
  if (g_deadline == Clock::time_point{}) return std::chrono::milliseconds::max();
  return std::chrono::duration_cast<std::chrono::milliseconds>(g_deadline - Clock::now()) - kReportMargin;
}

std::string run_isolated(const std::string& what, std::chrono::milliseconds bound,
                         const std::function<std::string()>& body) {
  bound = std::min(std::max(bound, std::chrono::milliseconds(1)), isolated_time_left());  // within a parent's
  if (bound.count() <= 0) {
    const std::string none = "no time was left for it within the bound of the check it is part of";
    throw Error(what.empty() ? none : what + ": " + none);
  }
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw Error(what + ": cannot create a pipe: " + std::strerror(errno));
  std::fflush(nullptr);  // what is buffered is written once, not by both
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    throw Error(what + ": cannot start a process for it: " + std::strerror(errno));
  }
  if (pid == 0) {
    close(fds[0]);
    child(fds[1], bound, body);
  }
  close(fds[1]);
  const Outcome o = wait_for(pid, fds[0], bound);
  if (!o.report.empty() && o.report[0] == 'R' && !o.timed_out) return o.report.substr(1);
  if (!o.report.empty() && o.report[0] == 'E' && !o.timed_out) {
    const size_t nl = o.report.find('\n');
    const auto status = ddp_status(std::atoi(o.report.c_str() + 1));
    throw Error(nl == std::string::npos ? what : o.report.substr(nl + 1), status);
  }
  const std::string ending = isolated_ending(o.report, o.status, o.timed_out, double(bound.count()) / 1000);
  throw Error(what.empty() ? ending : what + ": " + ending);
}

}  // namespace ddp
