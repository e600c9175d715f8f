// launcher.h — `ddp run`: starts world_size rank processes on this machine
// (the same executable, with RANK/WORLD_SIZE/DDP_RENDEZVOUS set), watches
// them, and when one fails stops the others and names it. With RANK set in
// the environment it is one rank of a run someone else launched. `ddp
// bench-comm` starts and runs its ranks with the same two functions
// (launch_ranks, run_rank).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "config.h"

namespace ddp {

struct RankEnv;  // trainer.h

// Runs every rank of `config` as child processes of this one; returns the
// exit code for the user (0 when every rank succeeded). With `trace`, each
// rank records a trace and the ranks' traces are merged into
// <output_dir>/trace.json (see trace.h).
int launch_local(const Config& config, const std::string& config_path,
                 const std::vector<std::string>& overrides, bool trace = false);

// The machinery under launch_local, for any command whose ranks are this
// executable: starts `world` processes running `args` (args[0] is the
// program name) with the rank environment set and a fresh rendezvous
// directory under `output_dir`, watches them, and when one fails stops the
// others and names it; `timeout_note` names the timeout a hung rank ran
// into ("run.timeout_s = 30"). Returns the exit code for the user.
int launch_ranks(int world, const std::string& output_dir, std::vector<std::string> args,
                 const std::string& timeout_note, bool trace = false);

// Runs this process as the rank given by RANK, WORLD_SIZE, LOCAL_RANK and
// DDP_RENDEZVOUS (and DDP_RUN_ID). On failure writes the message to stderr
// and to $DDP_ERROR_FILE (if set) and returns 1.
int run_as_rank(const Config& config);

// The same for any rank body: parses the rank environment, runs `body`,
// reports its failure as above.
int run_rank(const std::function<void(const RankEnv&)>& body);

}  // namespace ddp
