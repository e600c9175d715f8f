// env.h — the process's environment, read once at start-up into one struct.
// main() reads it first thing (load_env); every other part of the engine
// asks env() for a variable instead of calling getenv, so what a run reads
// is read at one moment and checked in one place (tools/check_structure.py
// finds a getenv anywhere else in engine/). A rank that ddp run spawns is a
// new process: it reads its own at its own start.
//
// Deliberately not here: setting variables for the processes this one
// starts (setenv before an exec, a child's environment): those write, and
// the child reads its own at its start. Plugins read theirs themselves.
#pragma once

#include <map>
#include <optional>
#include <string>

namespace ddp {

struct Env {
  // The ddp variables, parsed.
  std::string trace;                       // DDP_TRACE: where this rank writes its trace; "" none
  std::optional<std::string> blas_choice;  // DDP_BLAS_CHOICE: the launcher's BLAS kernel choice, a JSON object
  std::optional<std::string> restarts;     // DDP_RESTARTS: the launcher's restarts so far, a JSON array
  std::optional<bool> huge_pages;          // DDP_HUGE_PAGES: 0 or 1; unset: the default
  bool huge_pages_restarted = false;       // DDP_HUGE_PAGES_RESTARTED: this process is the restart
  std::string plugin_dir;                  // DDP_PLUGIN_DIR: searched before lib/ddp; "" none
  bool debug = false;                      // DDP_DEBUG set: plugins' debug lines are printed
  int status_fd = -1;                      // DDP_STATUS_FD: the launcher's channel; -1 none
  std::string status_path;                 // DDP_STATUS_PATH: the launcher's FIFO; "" none
  std::string cache_dir;                   // DDP_CACHE_DIR: the BLAS kernel cache's folder; "" the default

  // Every variable, as it was at start-up (others read by name: HOME,
  // TMPDIR, CUDA_VISIBLE_DEVICES, a launcher's RANK or SLURM_PROCID ...).
  std::map<std::string, std::string> vars;
  // A variable's value, nullptr where it was unset (getenv's answer at
  // start-up); valid while this Env lives.
  const char* get(const char* name) const;
};

// The Env of `vars` (name -> value). Throws ConfigError naming the variable
// and its value where a ddp variable is malformed: "DDP_STATUS_FD=x in the
// environment is not a file descriptor (a number from 0 to 2147483647)". Pure.
Env parse_env(const std::map<std::string, std::string>& vars);

// This process's environment now, as a map (environ).
std::map<std::string, std::string> process_environment();

// Reads the environment into the struct env() returns (main's first call;
// throws what parse_env throws). env() reads it on its first call where
// nothing did before (a test, a tool).
void load_env();
const Env& env();
// env().get(name): a lookup for the functions that take one (the launcher's
// rank variables, the rendezvous's).
const char* env_var(const char* name);
// Replaces what env() returns: a rank's own DDP_TRACE (main.cpp), a test's
// environment. What env() returned before stays valid (and unchanged).
void set_env(Env e);

}  // namespace ddp
