// watchdog.cpp — see watchdog.h.
#include "watchdog.h"

#include <unistd.h>

#include <cstdio>

#include "failure.h"
#include "whereabouts.h"

namespace ddp {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// "strategy plugin 'x': finish: no progress for 37 s (run.timeout_s = 30
// plus 7 s); the rank was stopped", or the same for an engine wait.
std::string stuck_message(const whereabouts::Stage& stage, double seconds, const std::string& note) {
  char waited[32];
  std::snprintf(waited, sizeof waited, "%.0f s", seconds);
  const std::string where =
      stage.plugin ? std::string(stage.plugin) + ": " + stage.entry : std::string("the engine, ") + stage.entry;
  return where + ": no progress for " + waited + " (" + note + "); the rank was stopped";
}

}  // namespace

Watchdog::Watchdog(int rank, std::chrono::milliseconds limit, std::string note)
    : rank_(rank), limit_(limit), note_(std::move(note)), thread_([this] { watch(); }) {}

Watchdog::~Watchdog() {
  stop_ = true;
  thread_.join();
}

void Watchdog::watch() {
  const int64_t limit_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(limit_).count();
  for (int tick = 1; !stop_; ++tick) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (tick % 10 == 0) whereabouts::send_line("alive\n", 6);  // each second: this process is not frozen
    const whereabouts::Stage stage = whereabouts::training_stage();
    if (!stage.entry) continue;
    const int64_t waited = now_ns() - stage.since_ns;
    if (waited <= limit_ns) continue;
    RankFailure f;
    f.kind = DDP_ERR_TIMEOUT;
    f.rank = rank_;
    f.step = whereabouts::step();
    f.plugin = stage.plugin ? stage.plugin : "";
    f.entry = stage.entry;
    f.message = stuck_message(stage, double(waited) * 1e-9, note_);
    if (!report_failure(f)) std::fprintf(stderr, "ddp: rank %d: error: %s\n", rank_, f.message.c_str());
    std::fflush(stderr);
    _exit(1);
  }
}

}  // namespace ddp
