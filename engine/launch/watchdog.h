// watchdog.h — every rank ends within its timeout, whatever a plugin does.
// A thread reads the training thread's stage (core/whereabouts.h) every
// 100 ms; a rank that has stayed inside one plugin entry, or one of the
// engine's own waits (draining the streams at teardown), for longer than
// `limit` is reported as a timeout failure naming the rank, the step, the
// plugin and the entry and how long it waited, and the process exits at
// once with code 1: a stuck thread cannot be unwound. In the spirit of
// PyTorch's NCCL heartbeat monitor.
//
// The limit sits above the engine's own wait limit (run.timeout_s + 5 s),
// so that a collective that times out is reported by the wait that saw it;
// the watchdog catches what no wait does: a plugin entry that never
// returns, a host function stuck on a stream at teardown.
#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

namespace ddp {

class Watchdog {
 public:
  // `note` says where the limit comes from ("run.timeout_s = 30 plus 7 s").
  Watchdog(int rank, std::chrono::milliseconds limit, std::string note);
  ~Watchdog();  // stops the thread
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // The grace above run.timeout_s: above the engine's wait limit (+5 s), and
  // with the launcher's own grace (1 s) within run.timeout_s + 10 s.
  static constexpr std::chrono::seconds kGrace{7};

 private:
  void watch();
  int rank_;
  std::chrono::milliseconds limit_;
  std::string note_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace ddp
