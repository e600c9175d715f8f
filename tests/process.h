// process.h — runs the `ddp` command from a test as a user would: a child
// process with its own environment, stdout and stderr in files, a time limit.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace {

using Clock = std::chrono::steady_clock;
const std::string kDdp = std::string(DDP_BIN_DIR) + "/ddp";
const std::string kRepo = std::string(DDP_TEST_DATA_DIR) + "/..";

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

[[maybe_unused]] std::string temp_dir() {  // (not every test file that includes this makes one)
  char tmpl[] = "/tmp/ddp-test-XXXXXX";
  return mkdtemp(tmpl);
}

// Starts `ddp` with `args` and extra environment; stdout and stderr go to files.
struct Process {
  pid_t pid = -1;
  std::string out, err;
};

Process start(const std::vector<std::string>& args, const std::vector<std::string>& env,
              const std::string& log_prefix) {
  Process p{-1, log_prefix + ".out", log_prefix + ".err"};
  p.pid = fork();
  if (p.pid == 0) {
    int out = open(p.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = open(p.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out, 1);
    dup2(err, 2);
    for (const auto& kv : env) putenv(strdup(kv.c_str()));
    std::vector<char*> argv{const_cast<char*>(kDdp.c_str())};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(kDdp.c_str(), argv.data());
    _exit(127);
  }
  return p;
}

// Waits up to `limit`; kills and fails the test past it. Returns the exit code.
int wait_for(const Process& p, std::chrono::seconds limit) {
  auto deadline = Clock::now() + limit;
  int status = 0;
  while (waitpid(p.pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      kill(p.pid, SIGKILL);
      waitpid(p.pid, &status, 0);
      ADD_FAILURE() << "ddp did not finish within " << limit.count() << " s";
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The child of `parent` whose environment has RANK=<rank> (or `variable`).
inline pid_t find_rank(pid_t parent, int rank, const std::string& variable = "RANK") {
  const std::string want = variable + "=" + std::to_string(rank);
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string stat = read_file(entry.path() / "stat");
    auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 2));
    std::string state;
    pid_t ppid = 0;
    fields >> state >> ppid;
    if (ppid != parent) continue;
    std::string env = read_file(entry.path() / "environ");
    for (size_t at = 0; at < env.size(); at = env.find('\0', at) + 1) {
      if (env.compare(at, want.size() + 1, want + '\0') == 0) return std::stoi(name);
      if (env.find('\0', at) == std::string::npos) break;
    }
  }
  return -1;
}

}  // namespace
