// trace.cpp — see trace.h. Chrome trace event format: complete events
// ("ph": "X", ts and dur in microseconds) and metadata events ("ph": "M")
// naming processes and threads.
#include "trace.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "atomic_file.h"
#include "error.h"

namespace ddp {
namespace {

using json = nlohmann::ordered_json;

constexpr int kComputeLane = 0;
constexpr int kCommunicationLane = 1;

int64_t ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

json metadata(const char* what, int pid, int tid, const std::string& name) {
  return {{"name", what}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}};
}

}  // namespace

Trace::Trace(int rank, size_t expected_events) : rank_(rank) { events_.reserve(expected_events); }

void Trace::add(const Event& event) {
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    events_.push_back(event);
  } catch (const std::exception&) {  // out of memory: lose the event, not the run
  }
}

void Trace::compute(const char* name, Clock::time_point begin, Clock::time_point end) {
  add(Event{name, ns(begin), ns(end), step(), -1, nullptr});
}

void Trace::collective(const char* op, int64_t bytes, int64_t step, Clock::time_point begin, Clock::time_point end,
                       const char* group) {
  add(Event{op, ns(begin), ns(end), step, bytes, group});
}

void Trace::write(const std::string& path) const {
  json events = json::array();
  events.push_back(metadata("process_name", rank_, kComputeLane, "rank " + std::to_string(rank_)));
  events.push_back(metadata("thread_name", rank_, kComputeLane, "compute"));
  events.push_back(metadata("thread_name", rank_, kCommunicationLane, "communication"));
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Event& e : events_) {
    const bool comm = e.bytes >= 0;
    json args = comm ? json{{"op", e.name}, {"bytes", e.bytes}, {"step", e.step}} : json{{"step", e.step}};
    if (e.group) args["group"] = e.group;
    events.push_back({{"name", e.name},
                      {"ph", "X"},
                      {"pid", rank_},
                      {"tid", comm ? kCommunicationLane : kComputeLane},
                      {"ts", e.begin_ns / 1e3},
                      {"dur", (e.end_ns - e.begin_ns) / 1e3},
                      {"args", std::move(args)}});
  }
  write_file_atomically(path, json{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}}.dump() + "\n");
}

void merge_traces(const std::vector<std::string>& rank_files, const std::string& output) {
  json merged = json::array();
  for (const std::string& file : rank_files) {
    std::ifstream in(file);
    if (!in) throw Error(file + ": cannot open the rank's trace");
    json part = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (part.is_discarded() || !part.contains("traceEvents") || !part["traceEvents"].is_array())
      throw Error(file + ": not a trace (a rank's trace file is malformed)");
    for (json& e : part["traceEvents"]) merged.push_back(std::move(e));
  }
  // Steady-clock times count from boot: start the picture at 0 instead.
  double first = std::numeric_limits<double>::infinity();
  for (const json& e : merged)
    if (e.contains("ts")) first = std::min(first, e["ts"].get<double>());
  for (json& e : merged)
    if (e.contains("ts")) e["ts"] = std::round((e["ts"].get<double>() - first) * 1e3) / 1e3;
  write_file_atomically(output, json{{"traceEvents", std::move(merged)}, {"displayTimeUnit", "ms"}}.dump() + "\n");
  std::error_code ec;
  for (const std::string& file : rank_files) std::filesystem::remove(file, ec);
}

std::string rank_trace_path(const std::string& dir, const std::string& rank) {
  return (std::filesystem::path(dir) / ("trace.rank" + rank + ".json")).string();
}

}  // namespace ddp
