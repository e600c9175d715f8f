// step_timeline.cpp — see step_timeline.h.
#include "step_timeline.h"

#include <filesystem>

namespace ddp {

StepTimeline::StepTimeline(std::unique_ptr<Trace> trace, Stream& compute)
    : trace_(std::move(trace)), compute_(compute) {}

StepTimeline::~StepTimeline() {
  for (void* stamp : stamps_) compute_.release_timestamp(stamp);
}

StepTimeline::Mark StepTimeline::mark() {
  Mark m{Clock::now()};
  if (trace_ && compute_.native()) {
    m.stamp = int(stamps_.size());
    stamps_.push_back(compute_.record_timestamp());
  }
  return m;
}

void StepTimeline::range(const char* name, const Mark& begin) {
  if (!trace_) return;
  const Mark end = mark();
  if (begin.stamp < 0) {
    trace_->compute(name, begin.host, end.host);
  } else {
    device_ranges_.push_back({name, begin.stamp, end.stamp});
  }
}

void StepTimeline::layer(const char* name, Clock::time_point begin, Clock::time_point end) {
  if (!trace_) return;
  if (lap_.stamp < 0) {
    trace_->compute(name, begin, end);
    return;
  }
  const Mark now = mark();
  device_ranges_.push_back({name, lap_.stamp, now.stamp});
  lap_ = now;
}

void StepTimeline::begin_step(int64_t step) {
  if (trace_) trace_->set_step(step);
}

void StepTimeline::end_step() {
  if (!stamps_.empty()) {  // the step's GPU ranges, still in its step
    std::vector<Clock::time_point> at(stamps_.size());
    compute_.resolve_timestamps(stamps_.data(), stamps_.size(), at.data());
    for (const DeviceRange& r : device_ranges_) trace_->compute(r.name, at[r.begin], at[r.end]);
    for (void* stamp : stamps_) compute_.release_timestamp(stamp);
    stamps_.clear();
    device_ranges_.clear();
  }
  if (trace_) trace_->set_step(-1);  // what follows (checks, checkpoints, outputs) is in no step
}

void StepTimeline::write(const std::string& path) const {
  if (!trace_) return;
  const auto dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir);
  trace_->write(path);
}

}  // namespace ddp
