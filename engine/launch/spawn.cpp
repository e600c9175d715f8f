// spawn.cpp — see spawn.h.
#include "spawn.h"

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include "error.h"

extern char** environ;

namespace ddp {
namespace {

std::string name_of(const std::string& entry) { return entry.substr(0, entry.find('=')); }

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

std::vector<std::string> rank_environment(const std::vector<std::string>& set, const std::vector<std::string>& unset) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e, name = name_of(kv);
    bool replaced = false;
    for (const std::string& s : set) replaced |= name_of(s) == name;
    for (const std::string& u : unset) replaced |= u == name;
    if (!replaced) env.push_back(kv);
  }
  env.insert(env.end(), set.begin(), set.end());
  return env;
}

std::vector<pid_t> spawn_ranks(std::vector<std::string> args, std::vector<std::vector<std::string>> envs) {
  std::vector<char*> argv = pointers(args);
  std::vector<pid_t> pids;
  const pid_t launcher = getpid();
  for (size_t r = 0; r < envs.size(); ++r) {
    std::vector<char*> envp = pointers(envs[r]);
    const pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != launcher) _exit(1);  // the launcher died before prctl
      execve("/proc/self/exe", argv.data(), envp.data());
      _exit(127);
    }
    if (pid < 0) {
      const int err = errno;
      for (pid_t p : pids) kill(p, SIGKILL);
      while (wait(nullptr) > 0) {
      }
      throw Error("cannot start rank " + std::to_string(r) + ": " + std::strerror(err));
    }
    pids.push_back(pid);
  }
  return pids;
}

}  // namespace ddp
