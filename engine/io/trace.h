// trace.h — `ddp run --trace`: one rank's timeline in memory, written at the
// end as a Chrome trace (the JSON Perfetto and chrome://tracing load), and
// the launcher's merge of the rank files into one.
//
// Each rank is a process (pid = rank, named "rank r") with two lanes:
// tid 0 "compute" (step, forward, backward and its per-layer ranges, the
// strategy hooks, optimizer) and tid 1 "communication" (each collective the
// strategy issued, from when the comm stream starts it to when it is done,
// with args {"op", "bytes", "step"}, and "group" for a collective of a
// group a strategy made (ABI 1.9); step -1 outside any step: set-up, and
// between steps the replica check, checkpoints and the outputs, which a
// strategy holding the values gathers for). Times are steady_clock, which is one
// clock for every process on the machine, so the ranks line up.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "device.h"

namespace ddp {

class Trace {
 public:
  // `expected_events` is reserved up front: recording then only copies a
  // few words (the vector grows past it if needed).
  Trace(int rank, size_t expected_events);

  // The step later events belong to (set by the trainer at each step's
  // start, -1 at its end).
  void set_step(int64_t step) { step_.store(step, std::memory_order_relaxed); }
  int64_t step() const { return step_.load(std::memory_order_relaxed); }

  // `name` and `op` must outlive the Trace (literals, or names a model keeps).
  // Thread-safe; never throws (an event that cannot be stored is dropped).
  void compute(const char* name, Clock::time_point begin, Clock::time_point end);
  // `group` (ABI 1.9): the label of the group it ran in ("group 'shard'
  // (ranks 0, 1)", outliving the Trace); null for the world's.
  void collective(const char* op, int64_t bytes, int64_t step, Clock::time_point begin, Clock::time_point end,
                  const char* group = nullptr);

  // {"traceEvents": [...], "displayTimeUnit": "ms"}, itself a valid trace.
  void write(const std::string& path) const;

 private:
  struct Event {
    const char* name;  // compute: the range; communication: the op
    int64_t begin_ns;
    int64_t end_ns;
    int64_t step;
    int64_t bytes;      // -1 on the compute lane
    const char* group;  // the collective's group label; null: the world's (and compute)
  };
  void add(const Event& event);

  int rank_;
  std::atomic<int64_t> step_{-1};
  mutable std::mutex mutex_;  // compute and communication record from different threads
  std::vector<Event> events_;
};

// Where rank `rank` writes its trace in `dir` when the ranks' files are to
// be merged (the launcher's run directory) or kept (ranks of another
// launcher): <dir>/trace.rank<rank>.json.
std::string rank_trace_path(const std::string& dir, const std::string& rank);

// Writes one trace holding every event of the rank files (in their order),
// times shifted so the earliest is 0, to `output` (atomically), then
// removes the rank files. Throws Error naming a file that cannot be read.
void merge_traces(const std::vector<std::string>& rank_files, const std::string& output);

}  // namespace ddp
