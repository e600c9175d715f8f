// launcher.cpp — see launcher.h. Ranks are separate processes (the same
// executable, re-executed), never threads: a rank that crashes or is killed
// must not take the launcher with it, and the launcher must see it.
#include "launcher.h"

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include "trace.h"
#include "trainer.h"

extern char** environ;

namespace ddp {
namespace {

namespace fs = std::filesystem;

volatile std::sig_atomic_t g_interrupted = 0;
void on_interrupt(int) { g_interrupted = 1; }

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

int env_int(const char* name) {
  std::string v = env_or(name, "");
  try {
    size_t used = 0;
    int value = std::stoi(v, &used);
    if (used == v.size()) return value;
  } catch (const std::exception&) {
  }
  throw Error(std::string("environment variable ") + name + "='" + v + "' is not an integer");
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

struct Child {
  pid_t pid = -1;
  bool running = true;
  int status = 0;
};

std::string describe_exit(int status, const std::string& error_file) {
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    return "killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  }
  std::string text = read_text(error_file);
  return "exited with code " + std::to_string(WEXITSTATUS(status)) + (text.empty() ? "" : ": " + text);
}

}  // namespace

int launch_local(const Config& config, const std::string& config_path,
                 const std::vector<std::string>& overrides, bool trace) {
  std::vector<std::string> args = {"ddp", "run", config_path};
  for (const auto& o : overrides) args.insert(args.end(), {"--set", o});
  std::ostringstream timeout;
  timeout << "run.timeout_s = " << config.run.timeout_s;
  return launch_ranks(config.run.world_size, config.run.output_dir, args, timeout.str(), trace);
}

int launch_ranks(int world, const std::string& output_dir, std::vector<std::string> args,
                 const std::string& timeout_note, bool trace) {
  fs::create_directories(output_dir);
  // A fresh rendezvous directory per run: Gloo's FileStore never deletes its
  // files and refuses to reuse a key.
  std::string pattern = (fs::path(output_dir) / ".rendezvous-XXXXXX").string();
  if (!mkdtemp(pattern.data())) throw Error(output_dir + ": cannot create a rendezvous directory");
  const std::string rdzv = pattern;
  auto trace_file = [&](int r) { return rdzv + "/trace.rank" + std::to_string(r) + ".json"; };

  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  std::vector<Child> children(world);
  auto kill_running = [&] {
    for (auto& c : children)
      if (c.running && c.pid > 0) kill(c.pid, SIGKILL);
  };
  const pid_t launcher = getpid();
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      std::string kv = *e;
      static const char* kOurs[] = {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "DDP_RENDEZVOUS=",
                                    "DDP_RUN_ID=", "DDP_ERROR_FILE=", "DDP_TRACE="};
      bool ours = false;
      for (const char* k : kOurs) ours |= kv.rfind(k, 0) == 0;
      if (!ours) env.push_back(kv);
    }
    env.push_back("RANK=" + std::to_string(r));
    env.push_back("LOCAL_RANK=" + std::to_string(r));
    env.push_back("WORLD_SIZE=" + std::to_string(world));
    env.push_back("DDP_RENDEZVOUS=file:" + rdzv);
    env.push_back("DDP_RUN_ID=" + fs::path(rdzv).filename().string());
    env.push_back("DDP_ERROR_FILE=" + rdzv + "/rank" + std::to_string(r) + ".error");
    if (trace) env.push_back("DDP_TRACE=" + trace_file(r));
    std::vector<char*> envp;
    for (auto& kv : env) envp.push_back(kv.data());
    envp.push_back(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      // A rank never outlives its launcher (killed by CI, by OOM, by hand).
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != launcher) _exit(1);
      execve("/proc/self/exe", argv.data(), envp.data());
      _exit(127);
    }
    if (pid < 0) {
      const int err = errno;
      kill_running();
      while (wait(nullptr) > 0) {
      }
      throw Error("cannot start rank " + std::to_string(r) + ": " + std::strerror(err));
    }
    children[r].pid = pid;
  }

  // Watch. When a rank fails, the others get a moment to fail on their own
  // (peers of a dead rank see the connection drop at once; peers of a hung
  // one time out after run.timeout_s), then whatever still runs is killed.
  // The cause is a rank killed by a signal if there is one; else, if the
  // failures were timeouts, the ranks that were still running (the hung
  // ones); else the first rank that failed.
  std::vector<int> failed;  // in the order they ended
  Clock::time_point failed_at{};
  std::vector<int> unresponsive;
  bool killed = false;
  int alive = world;
  while (alive > 0) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (int r = 0; r < world; ++r) {
        Child& c = children[r];
        if (c.pid != pid) continue;
        c.running = false;
        c.status = status;
        --alive;
        const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!ok && !killed) {
          failed.push_back(r);
          if (failed_at == Clock::time_point{}) failed_at = Clock::now();
        }
      }
      continue;
    }
    const bool grace_over = !failed.empty() && Clock::now() - failed_at > std::chrono::milliseconds(1000);
    if (!killed && (g_interrupted || grace_over)) {
      for (int r = 0; r < world; ++r)
        if (children[r].running) unresponsive.push_back(r);
      kill_running();
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  std::error_code ec;
  auto error_file = [&](int r) { return rdzv + "/rank" + std::to_string(r) + ".error"; };

  int code = 0;
  if (g_interrupted) {
    std::cerr << "ddp: interrupted; stopped all ranks\n";
    code = 130;
  } else if (!failed.empty()) {
    // Rank the failures: killed by a signal, then timed out, then any other
    // error, and last a lost connection (the echo of a peer that died).
    auto weight = [&](int r) {
      if (WIFSIGNALED(children[r].status)) return 3;
      const std::string text = read_text(error_file(r));
      for (const char* mark : {"imed out", "no answer from", "made no progress"})
        if (text.find(mark) != std::string::npos) return 2;
      for (const char* mark : {"Connection closed by peer", "Connection reset by peer", "Broken pipe"})
        if (text.find(mark) != std::string::npos) return 0;
      return 1;
    };
    int failed_rank = failed.front();
    for (int r : failed)
      if (weight(r) > weight(failed_rank)) failed_rank = r;
    const std::string cause = describe_exit(children[failed_rank].status, error_file(failed_rank));
    if (weight(failed_rank) == 2 && !unresponsive.empty()) {
      std::string list;
      for (int r : unresponsive) list += (list.empty() ? "" : ", ") + std::to_string(r);
      std::cerr << "ddp: rank" << (unresponsive.size() > 1 ? "s " : " ") << list
                << " stopped responding: the other ranks timed out waiting (" << timeout_note << ")\n"
                << "ddp: rank " << failed_rank << " reported: " << cause << "\n";
    } else {
      std::cerr << "ddp: rank " << failed_rank << " failed: " << cause << "\n";
    }
    std::cerr << "ddp: stopped the other ranks; run failed\n";
    code = 1;
  } else if (trace) {
    // Every rank wrote its trace on the way out: one file for the viewer.
    const std::string merged = (fs::path(output_dir) / "trace.json").string();
    try {
      std::vector<std::string> files;
      for (int r = 0; r < world; ++r) files.push_back(trace_file(r));
      merge_traces(files, merged);
      std::cout << "trace: " << merged << " (open it in https://ui.perfetto.dev or chrome://tracing)\n";
    } catch (const std::exception& e) {
      std::cerr << "ddp: error: " << e.what() << "\n";
      code = 1;
    }
  }
  fs::remove_all(rdzv, ec);
  return code;
}

int run_as_rank(const Config& config) {
  return run_rank([&](const RankEnv& env) {
    if (env.rank.world_size != config.run.world_size)
      throw Error("WORLD_SIZE=" + std::to_string(env.rank.world_size) + " in the environment but run.world_size = " +
                  std::to_string(config.run.world_size) + " in " + config.file);
    train_rank(config, env);
  });
}

int run_rank(const std::function<void(const RankEnv&)>& body) {
  int rank = -1;
  try {
    rank = env_int("RANK");
    RankEnv env;
    env.rank.rank = rank;
    env.rank.world_size = env_int("WORLD_SIZE");
    env.rank.local_rank = std::getenv("LOCAL_RANK") ? env_int("LOCAL_RANK") : rank;
    if (rank < 0 || rank >= env.rank.world_size)
      throw Error("RANK=" + std::to_string(rank) + " is outside [0, WORLD_SIZE)");
    env.rendezvous = env_or("DDP_RENDEZVOUS", "");
    if (env.rendezvous.empty())
      throw Error("RANK is set but DDP_RENDEZVOUS is not: set it to file:<directory shared by all ranks> "
                  "(fresh for each run) or redis:<host>:<port>");
    env.run_id = env_or("DDP_RUN_ID", "ddp");
    body(env);
    return 0;
  } catch (const std::exception& e) {
    // Under our own launcher the message goes to a file and the launcher
    // reports the rank that failed first; otherwise each rank says it.
    std::string message = e.what();
    std::string error_file = env_or("DDP_ERROR_FILE", "");
    if (error_file.empty())
      std::cerr << "ddp: rank " << rank << ": error: " << message << std::endl;
    else
      std::ofstream(error_file) << message << "\n";
    return 1;
  }
}

}  // namespace ddp
