// whereabouts.h — where this rank is, and its line to the launcher.
//
// The training thread says where it is: the step, and the plugin entry it is
// in (Inside, around every call into a plugin, and around the engine's own
// unbounded waits). Whoever must speak for a
// rank that cannot reads it: the crash handler (a fault inside plugin code),
// the watchdog (a training thread that stopped making progress), the
// launcher (a rank that exited before it completed). Host functions a
// plugin runs on a stream say so on their own thread. Writes are relaxed
// atomic stores; reads are lock-free and async-signal-safe.
//
// The launcher's channel: our launcher hands each rank the write end of a
// pipe (the fd in DDP_STATUS_FD) or, for ranks it starts through mpirun
// (which passes no descriptor on), the path of a FIFO it reads
// (DDP_STATUS_PATH), and the rank sends one line per event:
//   step <n>          as optimizer step n (from 0) begins
//   failure <json>    when it fails (engine/launch/failure.h)
//   completed         once its work is done and its outputs are in place
//   alive             each second, from the rank's watchdog (launch/watchdog.h):
//                     a rank that falls silent is frozen
// A pipe, not a file: a full disk cannot refuse it, and the launcher sees
// it close when the rank dies. Without either variable (ranks of another
// launcher) nothing is sent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

namespace ddp::whereabouts {

// The training thread's step (-1: set-up or the end of the run); sends
// "step <n>" when n >= 0.
void enter_step(int64_t step);
int64_t step();

// The calling thread is inside `entry` of `plugin` for the scope's
// lifetime (both strings outlive it: a PluginHost's label, a literal), or,
// with plugin == nullptr, in a wait of the engine's own that `entry` names
// ("draining the streams"): the watchdog bounds both. On a stream's thread
// it marks a host function. Scopes nest; the innermost is reported.
class Inside {
 public:
  Inside(const char* plugin, const char* entry);
  ~Inside();
  Inside(const Inside&) = delete;
  Inside& operator=(const Inside&) = delete;

 private:
  const char* outer_plugin_;
  const char* outer_entry_;
};

// The innermost scope of the calling thread (nullptr: none; plugin is
// nullptr too for an engine wait). Safe in a signal handler.
const char* plugin();
const char* entry();
// The plugin entry the calling thread last left, by a return or by an
// exception passing through its scope (nullptr: none yet).
// A copy of `label` kept for the life of the process, for an Inside scope
// whose label is made on the fly (left_plugin() may name it after the
// scope, and its maker, have gone).
const char* intern(const std::string& label);
const char* left_plugin();
const char* left_entry();

// The training thread's plugin entry and when it entered it (steady clock,
// ns), as another thread (the watchdog) sees them.
struct Stage {
  const char* plugin;  // nullptr: the engine's
  const char* entry;   // nullptr: in no scope (the engine's own work)
  int64_t since_ns;
};
Stage training_stage();
// Marks the calling thread as the training thread (whose Inside scopes
// training_stage reports).
void bind_training_thread();
bool on_training_thread();  // the calling thread is the bound one (async-signal-safe)

// The rank's first failure, reported as soon as it is caught (run_rank sets
// the reporter), before the teardown that follows it: a teardown that then
// crashes or hangs cannot hide the cause. report_first calls the reporter
// once per process; reported() says whether it has.
using Reporter = void (*)(const std::exception& e);
void set_reporter(Reporter reporter);
void report_first(const std::exception& e);
bool reported();

// A process exit in the middle of the run (a plugin's exit()): the handler
// run_rank gives, called with the exit code (glibc's on_exit). Exit
// handlers run last-registered first, and a library a plugin starts may
// register its own that block (Open MPI's MPI_Finalize waits for every
// rank): arm_exit_report registers it again after such a start, so that
// the report comes before them. Each call adds one registration.
using ExitReport = void (*)(int code, void* arg);
void set_exit_report(ExitReport report);
void arm_exit_report();

// The channel: whether there is one, and a whole line sent on it (the
// newline included). Async-signal-safe; a failed write is dropped.
bool has_channel();
void send_line(const char* line, size_t bytes);

}  // namespace ddp::whereabouts
