// launcher.h — `ddp run`: starts world_size rank processes on this machine
// (the same executable, with RANK/WORLD_SIZE/DDP_RENDEZVOUS set), watches
// them, and when one fails stops the others and names it. With RANK set in
// the environment it is one rank of a run someone else launched.
#pragma once

#include <string>
#include <vector>

#include "config.h"

namespace ddp {

// Runs every rank of `config` as child processes of this one; returns the
// exit code for the user (0 when every rank succeeded). With `trace`, each
// rank records a trace and the ranks' traces are merged into
// <output_dir>/trace.json (see trace.h).
int launch_local(const Config& config, const std::string& config_path,
                 const std::vector<std::string>& overrides, bool trace = false);

// Runs this process as the rank given by RANK, WORLD_SIZE, LOCAL_RANK and
// DDP_RENDEZVOUS (and DDP_RUN_ID). On failure writes the message to stderr
// and to $DDP_ERROR_FILE (if set) and returns 1.
int run_as_rank(const Config& config);

}  // namespace ddp
