// whereabouts.cpp — see whereabouts.h.
#include "whereabouts.h"

#include <mutex>
#include <set>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "env.h"

namespace ddp::whereabouts {
namespace {

std::atomic<int64_t> g_step{-1};
// The training thread's stage, published for other threads.
std::atomic<const char*> g_plugin{nullptr};
std::atomic<const char*> g_entry{nullptr};
std::atomic<int64_t> g_since_ns{0};
// Each thread's own innermost entry (the crash handler reads its thread's).
thread_local const char* t_plugin = nullptr;
thread_local const char* t_entry = nullptr;
thread_local bool t_training = false;
// The plugin entry the calling thread last left (returned from, or left
// by an exception).
thread_local const char* t_left_plugin = nullptr;
thread_local const char* t_left_entry = nullptr;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// -1: not looked up yet; -2: no channel.
std::atomic<int> g_fd{-1};

// A FIFO our launcher reads (it opened its end first, so this does not
// wait), written blocking as a pipe is.
int open_fifo(const char* path) {
  const int fd = ::open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return -2;
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

int channel_fd() {
  int fd = g_fd.load(std::memory_order_acquire);
  if (fd != -1) return fd;
  const Env& e = env();  // DDP_STATUS_FD, else DDP_STATUS_PATH
  if (e.status_fd >= 0) {
    fd = e.status_fd;
  } else {
    fd = !e.status_path.empty() ? open_fifo(e.status_path.c_str()) : -2;
  }
  g_fd.store(fd, std::memory_order_release);
  return fd;
}

// "step <n>\n" without the C library's formatting (async-signal-safe).
size_t format_step(char* out, int64_t step) {
  char digits[24];
  size_t n = 0;
  uint64_t v = uint64_t(step);
  do {
    digits[n++] = char('0' + v % 10);
    v /= 10;
  } while (v > 0);
  size_t k = 0;
  for (const char* p = "step "; *p; ++p) out[k++] = *p;
  while (n > 0) out[k++] = digits[--n];
  out[k++] = '\n';
  return k;
}

// The training thread's new stage: the time first, the entry last, so that
// training_stage() never pairs a new entry with an old time.
void publish(const char* plugin, const char* entry) {
  g_since_ns.store(now_ns(), std::memory_order_release);
  g_plugin.store(plugin, std::memory_order_release);
  g_entry.store(entry, std::memory_order_release);
}

}  // namespace

void enter_step(int64_t step) {
  g_step.store(step, std::memory_order_relaxed);
  if (step < 0 || !has_channel()) return;
  char line[40];
  send_line(line, format_step(line, step));
}

int64_t step() { return g_step.load(std::memory_order_relaxed); }

void bind_training_thread() { t_training = true; }
bool on_training_thread() { return t_training; }

Inside::Inside(const char* plugin, const char* entry) : outer_plugin_(t_plugin), outer_entry_(t_entry) {
  t_plugin = plugin;
  t_entry = entry;
  if (!t_training) return;
  publish(plugin, entry);
}

Inside::~Inside() {
  if (t_plugin) {
    t_left_plugin = t_plugin;
    t_left_entry = t_entry;
  }
  t_plugin = outer_plugin_;
  t_entry = outer_entry_;
  if (!t_training) return;
  publish(outer_plugin_, outer_entry_);
}

const char* plugin() { return t_plugin; }
const char* entry() { return t_entry; }
const char* intern(const std::string& label) {
  // Never freed, not even by exit(): a label outlives every scope, and
  // the exit handlers that report an exit() read it (isolated.h).
  static auto* const mutex = new std::mutex;
  static auto* const kept = new std::set<std::string>;
  const std::lock_guard<std::mutex> hold(*mutex);
  return kept->insert(label).first->c_str();
}

const char* left_plugin() { return t_left_plugin; }
const char* left_entry() { return t_left_entry; }

Stage training_stage() {
  // Acquire the entry, then the time: a reader that sees an entry sees a
  // time no older than the entry's (it never pairs an entry with the time
  // the previous one was left).
  const char* entry = g_entry.load(std::memory_order_acquire);
  const char* plugin = g_plugin.load(std::memory_order_acquire);
  return Stage{plugin, entry, g_since_ns.load(std::memory_order_acquire)};
}

namespace {
std::atomic<Reporter> g_reporter{nullptr};
std::atomic<bool> g_reported{false};
}  // namespace

void set_reporter(Reporter reporter) { g_reporter.store(reporter); }
void report_first(const std::exception& e) {
  const Reporter r = g_reporter.load();
  if (r && !g_reported.exchange(true)) r(e);
}
bool reported() { return g_reported.load(); }

namespace {
std::atomic<ExitReport> g_exit_report{nullptr};
}  // namespace

void set_exit_report(ExitReport report) {
  g_exit_report.store(report);
  arm_exit_report();
}
void arm_exit_report() {
  if (const ExitReport report = g_exit_report.load()) ::on_exit(report, nullptr);
}

bool has_channel() { return channel_fd() >= 0; }

void send_line(const char* line, size_t bytes) {
  const int fd = channel_fd();
  if (fd < 0) return;
  while (bytes > 0) {
    const ssize_t n = ::write(fd, line, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    line += n;
    bytes -= size_t(n);
  }
}

}  // namespace ddp::whereabouts
