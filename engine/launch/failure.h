// failure.h — how a rank tells its launcher why it failed: a structured
// report, one line "failure <json>" on the rank's channel
// (core/whereabouts.h), read by the launcher's diagnosis (diagnose.h). The
// launcher ranks failures by `kind`, never by the message's words.
//
// The report is one JSON object:
//   {"kind": "timeout", "rank": 2, "step": 17,
//    "plugin": "strategy plugin 'naive'", "entry": "finish",
//    "message": "strategy plugin 'naive': finish: gloo all_reduce ...",
//    "exit_code": 1, "signal": 0}
// kind: a status word of error.h's kind_name ("timeout": a wait outlasted
// run.timeout_s; "comm": a peer or the network failed; "invalid_argument":
// the configuration or a file it names; "internal": anything else, ...); step: the
// 0-based optimizer step (-1: set-up or the end of the run); plugin and
// entry: empty unless a plugin entry returned the error; exit_code: the
// code the rank exits with (1, or a plugin's exit(N)), and signal: the one
// it dies of (its crash handler's report; 0: none), for a launcher that
// cannot see how it ended (a rank mpirun started).
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <string>

#include <ddp/plugin.h>

namespace ddp {

struct RankFailure {
  ddp_status kind = DDP_ERR_INTERNAL;
  int rank = -1;
  int64_t step = -1;
  std::string plugin;
  std::string entry;
  std::string message;
  int exit_code = 1;
  int signal = 0;
};

// The report of an exception that ended rank `rank` (an Error's fields,
// or the text and DDP_ERR_INTERNAL of any other exception).
RankFailure failure_of(const std::exception& e, int rank);

// The report as one line of JSON (no newline), and back; nullopt if `json`
// is not such a report.
std::string failure_json(const RankFailure& failure);
std::optional<RankFailure> parse_failure(const std::string& json);

// Sends "failure <json>" on this rank's channel; false if it has none.
bool report_failure(const RankFailure& failure);

}  // namespace ddp
