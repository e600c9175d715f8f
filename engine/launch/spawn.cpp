// spawn.cpp — see spawn.h.
#include "spawn.h"

#include <fcntl.h>
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

std::vector<RankProcess> spawn_ranks(std::vector<std::string> args, std::vector<std::vector<std::string>> envs) {
  std::vector<char*> argv = pointers(args);
  std::vector<RankProcess> ranks;
  const pid_t launcher = getpid();
  auto give_up = [&](size_t r, int err) {
    for (const RankProcess& p : ranks) {
      kill(p.pid, SIGKILL);
      close(p.channel);
    }
    while (wait(nullptr) > 0) {
    }
    throw Error("cannot start rank " + std::to_string(r) + ": " + std::strerror(err));
  };
  for (size_t r = 0; r < envs.size(); ++r) {
    int fds[2];  // close-on-exec: no rank inherits another's channel
    if (pipe2(fds, O_CLOEXEC) != 0) give_up(r, errno);
    envs[r].push_back("DDP_STATUS_FD=" + std::to_string(fds[1]));
    std::vector<char*> envp = pointers(envs[r]);
    const pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != launcher) _exit(1);  // the launcher died before prctl
      fcntl(fds[1], F_SETFD, 0);            // this rank's write end survives the exec
      execve("/proc/self/exe", argv.data(), envp.data());
      _exit(127);
    }
    const int err = errno;
    close(fds[1]);
    if (pid < 0) {
      close(fds[0]);
      give_up(r, err);
    }
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    ranks.push_back(RankProcess{pid, fds[0]});
  }
  return ranks;
}

}  // namespace ddp
