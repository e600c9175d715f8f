// step_timeline.h — `ddp run --trace`: the compute lane of this rank's
// trace (engine/io/trace.h), step by step: the step, the strategy's hooks,
// forward, backward and its per-layer ranges, the optimizer. Without a
// trace every call is a branch and a clock read.
//
// On the CPU a mark is the host clock, which is when the compute stream
// (the training thread) got there. On a GPU the host only enqueues: a mark
// is also a timestamp the compute stream takes when the GPU gets there (a
// CUDA event), and the step's ranges are resolved to those times at its end.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stream.h"
#include "trace.h"

namespace ddp {

class StepTimeline {
 public:
  // `trace` null: no trace, nothing recorded. `compute` is the stream whose
  // progress the marks follow.
  StepTimeline(std::unique_ptr<Trace> trace, Stream& compute);
  ~StepTimeline();  // releases device timestamps not yet resolved

  Trace* trace() const { return trace_.get(); }  // for the metered transport's lane

  struct Mark {
    Clock::time_point host;
    int stamp = -1;  // index in stamps_ (GPU runs with a trace)
  };
  Mark mark();
  // [begin, now] on the compute lane under `name` (a literal, or a name the
  // model keeps).
  void range(const char* name, const Mark& begin);
  // The model's per-layer backward ranges (Model::set_range_hook): each runs
  // from the previous one's end, the first from start_layers' mark.
  void start_layers(const Mark& at) { lap_ = at; }
  void layer(const char* name, Clock::time_point begin, Clock::time_point end);

  void begin_step(int64_t step);
  // GPU runs: places the step's ranges at the times the GPU reached them.
  void end_step();
  // Writes the trace (creating its directory) if there is one.
  void write(const std::string& path) const;

 private:
  struct DeviceRange {
    const char* name;
    int begin;  // indices in stamps_
    int end;
  };
  std::unique_ptr<Trace> trace_;
  Stream& compute_;
  std::vector<void*> stamps_;  // this step's device timestamps (GPU runs with a trace)
  std::vector<DeviceRange> device_ranges_;
  Mark lap_;  // where the model's next per-layer range begins
};

}  // namespace ddp
