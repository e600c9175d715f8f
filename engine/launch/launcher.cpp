// launcher.cpp — see launcher.h.
#include "launcher.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <utility>

#include "crash_handler.h"
#include "diagnose.h"
#include "env.h"
#include "error.h"
#include "failure.h"
#include "rank_env.h"
#include "rendezvous.h"
#include "spawn.h"
#include "watch.h"
#include "watchdog.h"
#include "whereabouts.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;

// A failed rank's peers get this long to fail on their own before the
// launcher stops them (a dead peer's connections drop at once).
constexpr std::chrono::milliseconds kGrace{1000};

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = env().get(name);
  return v && *v ? v : fallback;
}

// A run id every rank of one launch agrees on and the next launch does not
// reuse, from the launcher that started the ranks (SLURM, Open MPI's PMIx,
// torchrun); "ddp" when none says (ranks started by hand: set DDP_RUN_ID).
std::string default_run_id() {
  if (const char* job = env().get("SLURM_JOB_ID"))
    return std::string("slurm-") + job + "." + env_or("SLURM_STEP_ID", "0");
  if (const char* ns = env().get("PMIX_NAMESPACE")) return std::string("pmix-") + ns;
  if (const char* id = env().get("TORCHELASTIC_RUN_ID")) return std::string("torchrun-") + id;
  return "ddp";
}

// What every rank of a launch shares: the run's private store and its id.
std::vector<std::string> shared_environment(const std::string& run_dir) {
  return {"DDP_RENDEZVOUS=file:" + run_dir, "DDP_RUN_ID=" + fs::path(run_dir).filename().string()};
}

std::vector<std::vector<std::string>> environments(const LaunchSpec& spec, const std::string& run_dir) {
  std::vector<std::string> unset = spec.unset;
  unset.push_back("DDP_STATUS_FD");  // spawn_ranks sets each rank's own
  std::vector<std::vector<std::string>> envs;
  for (int r = 0; r < spec.world; ++r) {
    std::vector<std::string> set = shared_environment(run_dir);
    set.insert(set.end(), {"RANK=" + std::to_string(r), "LOCAL_RANK=" + std::to_string(r),
                           "WORLD_SIZE=" + std::to_string(spec.world)});
    if (spec.rank_env) {
      const std::vector<std::string> more = spec.rank_env(r, run_dir);
      set.insert(set.end(), more.begin(), more.end());
    }
    envs.push_back(rank_environment(set, unset));
  }
  return envs;
}

// The ranks as mpirun's: one app context per rank (MPMD), so that each gets
// its own variables (-x) and its channel; mpirun's environment is this
// process's, with what every rank shares. Ranks of a root user need
// --allow-run-as-root, as every rank of ours may run as root; more ranks than
// cores need --oversubscribe, as ours may; no binding, as ours have none.
std::vector<RankProcess> spawn_mpirun(const LaunchSpec& spec, const std::string& run_dir) {
  std::vector<std::string> command = {"mpirun", "--bind-to", "none", "--oversubscribe"};
  if (geteuid() == 0) command.push_back("--allow-run-as-root");
  std::vector<std::string> fifos;
  const std::string exe = fs::read_symlink("/proc/self/exe").string();
  for (int r = 0; r < spec.world; ++r) {
    fifos.push_back((fs::path(run_dir) / ("status-" + std::to_string(r))).string());
    if (r > 0) command.push_back(":");
    command.insert(command.end(), {"-np", "1", "-x", "DDP_STATUS_PATH=" + fifos.back()});
    if (spec.rank_env)
      for (const std::string& kv : spec.rank_env(r, run_dir)) command.insert(command.end(), {"-x", kv});
    command.push_back(exe);
    command.insert(command.end(), spec.args.begin() + 1, spec.args.end());
  }
  std::vector<std::string> unset = spec.unset;
  unset.insert(unset.end(), {"RANK", "WORLD_SIZE", "LOCAL_RANK", "DDP_STATUS_FD", "DDP_STATUS_PATH"});
  return spawn_through(command, rank_environment(shared_environment(run_dir), unset), fifos);
}

}  // namespace

bool needs_mpirun(const std::string& plugin) {
  const std::string name = fs::path(plugin).filename().string();
  return name == "mpi" || name.rfind("libddp_transport_mpi.", 0) == 0;
}

bool is_run_dir_name(const std::string& name) {
  const std::string prefix = ".rendezvous-";
  return name.size() == prefix.size() + 6 && name.rfind(prefix, 0) == 0 &&
         name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", prefix.size()) ==
             std::string::npos;
}

int launch_ranks(const LaunchSpec& spec, LaunchOutcome* outcome) {
  fs::create_directories(spec.output_dir);
  std::error_code ec;  // a launcher killed by SIGKILL left its run's directory: ours to remove under the lock
  for (const fs::directory_entry& e : fs::directory_iterator(spec.output_dir, ec))
    if (is_run_dir_name(e.path().filename().string()) && e.is_directory(ec) && !e.is_symlink(ec))
      fs::remove_all(e.path(), ec);
  std::string pattern = (fs::path(spec.output_dir) / ".rendezvous-XXXXXX").string();
  if (!mkdtemp(pattern.data())) throw Error(spec.output_dir + ": cannot create a rendezvous directory");
  const std::string run_dir = pattern;
  struct RemoveRunDir {  // whatever happens: the run's private directory goes
    const std::string& dir;
    ~RemoveRunDir() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } remove_run_dir{run_dir};

  const std::vector<RankProcess> ranks =
      spec.through_mpirun ? spawn_mpirun(spec, run_dir) : spawn_ranks(spec.args, environments(spec, run_dir));
  const WatchResult watched = watch_ranks(ranks, kGrace);
  std::vector<std::optional<RankFailure>> reports;
  for (const RankExit& r : watched.ranks)
    reports.push_back(r.failure.empty() ? std::nullopt : parse_failure(r.failure));
  Diagnosis verdict = diagnose(watched, reports, spec.timeout_note);
  if (verdict.exit_code == 0 && spec.on_success) {
    try {
      spec.on_success(run_dir);
    } catch (const std::exception& e) {
      verdict = {1, std::string("ddp: error: ") + e.what() + "\n"};
    }
  }
  std::cerr << verdict.message;
  if (outcome) {
    outcome->message = verdict.message;
    for (const auto& report : reports) outcome->bad_input |= report && report->kind == DDP_ERR_INVALID_ARGUMENT;
  }
  return verdict.exit_code;
}

namespace {
// Under our own launcher the report goes on the channel and the launcher
// names the rank to blame; otherwise each rank says it. Once: a failure the
// trainer reported before its teardown is not reported again. Returns 1.
std::atomic<int> g_rank{-1};
void report_now(const std::exception& e) {
  const int rank = g_rank.load();
  if (!report_failure(failure_of(e, rank))) std::cerr << "ddp: rank " << rank << ": error: " << e.what() << std::endl;
}
// A plugin that calls exit() in the middle of the run (glibc's on_exit
// gives the code). Under our launcher the rank reports it, with the plugin,
// entry and step, and the launcher adds that no "completed" came; under
// another one the exit code would be the plugin's (0 looks like success),
// so it becomes 1 here.
std::atomic<bool> g_in_body{false};
bool g_exit_armed = false;  // run_rank runs once per process; a test may run it again
// It ends the process itself: the static destructors must not run while
// the streams' and the watchdog's threads still do.
void exited_early(int code, void*) {
  if (!g_in_body.load() || whereabouts::reported()) return;  // a failure said already: its teardown
  try {
    const std::string exit = "exit(" + std::to_string(code) + ")";
    Error error("the process called " + exit + " before completing its run");
    if (const char* plugin = whereabouts::plugin()) {
      const char* entry = whereabouts::entry();
      error = Error(std::string(plugin) + " called " + exit + (entry ? std::string(" in ") + entry : std::string()));
      error.in_plugin(plugin, entry ? entry : "");
    }
    error.at_step(whereabouts::step());
    if (whereabouts::has_channel()) {
      RankFailure failure = failure_of(error, g_rank.load());
      failure.exit_code = code;  // for a launcher that cannot see it (mpirun's rank)
      report_failure(failure);
      std::fflush(nullptr);
      std::_Exit(code);  // the launcher names it; no "completed" came
    }
    std::fprintf(stderr, "ddp: rank %d: error: %s\n", g_rank.load(), error.what());
  } catch (...) {}
  std::fflush(nullptr);
  std::_Exit(1);
}

int report(const std::exception& e, int rank) {
  g_rank.store(rank);
  whereabouts::set_reporter(report_now);
  whereabouts::report_first(e);
  return 1;
}
}  // namespace

int run_rank(const std::function<void(const RankEnv&)>& body, std::chrono::milliseconds timeout,
             const std::string& timeout_note, const std::function<void(const RankInfo&)>& check) {
  int rank = -1;
  // A peer's closed socket is an error to report, not a death by SIGPIPE
  // that would hide the cause.
  std::signal(SIGPIPE, SIG_IGN);
  whereabouts::has_channel();  // looked up now, not first in a signal handler
  try {
    const std::optional<RankSource> source = rank_from_environment(env_var);
    if (!source)
      throw Error("no launcher says which rank this is (RANK, OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID)",
                  DDP_ERR_INVALID_ARGUMENT);
    rank = source->rank.rank;
    g_rank.store(rank);
    whereabouts::set_reporter(report_now);
    install_crash_handler(rank);
    if (check) check(source->rank);
    RankEnv env;
    env.rank = source->rank;
    env.run_id = env_or("DDP_RUN_ID", default_run_id());
    const Rendezvous rendezvous(env.rank, env.run_id, double(timeout.count()) / 1000);
    env.rendezvous = rendezvous.location();
    const Watchdog watchdog(rank, timeout + Watchdog::kGrace, timeout_note + " plus 7 s");
    if (!std::exchange(g_exit_armed, true)) whereabouts::set_exit_report(exited_early);
    g_in_body = true;
    body(env);
    g_in_body = false;
    whereabouts::send_line("completed\n", 10);
    return 0;
  } catch (const std::exception& e) {
    g_in_body = false;
    return report(e, rank);
  }
}

int rank_failed_early(const std::exception& e) {
  std::optional<RankSource> source;
  try {
    source = rank_from_environment(env_var);
  } catch (const std::exception&) {  // no rank to name
  }
  if (!source) {
    std::cerr << "ddp: error: " << e.what() << std::endl;
    return 1;
  }
  return report(e, source->rank.rank);
}

bool launched_as_rank() {
  try {
    return rank_from_environment(env_var).has_value();
  } catch (const std::exception&) {
    return true;  // a rank with a bad variable: run_rank says which
  }
}

}  // namespace ddp
