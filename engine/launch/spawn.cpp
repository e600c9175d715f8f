// spawn.cpp — see spawn.h.
#include "spawn.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
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

// fork + exec, the child never outliving this process; `keep` (or -1) is
// the one descriptor the child keeps across the exec. Returns the child's
// pid, or -1 with errno.
pid_t start(const char* file, bool search_path, std::vector<char*>& argv, std::vector<char*>& envp, int keep) {
  const pid_t launcher = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != launcher) _exit(1);  // the launcher died before prctl
    if (keep >= 0) fcntl(keep, F_SETFD, 0);
    if (search_path) {
      execvpe(file, argv.data(), envp.data());
    } else {
      execve(file, argv.data(), envp.data());
    }
    _exit(127);
  }
  return pid;
}

}  // namespace

std::vector<std::string> rank_environment(const std::vector<std::string>& set, const std::vector<std::string>& unset) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const std::string name = name_of(kv);
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
  auto give_up = [&](size_t r, int err) {
    for (const RankProcess& p : ranks) {
      kill(p.pid, SIGKILL);
      close(p.channel);
    }
    while (wait(nullptr) > 0) {}
    throw Error("cannot start rank " + std::to_string(r) + ": " + std::strerror(err));
  };
  for (size_t r = 0; r < envs.size(); ++r) {
    int fds[2];  // close-on-exec: no rank inherits another's channel
    if (pipe2(fds, O_CLOEXEC) != 0) give_up(r, errno);
    envs[r].push_back("DDP_STATUS_FD=" + std::to_string(fds[1]));
    std::vector<char*> envp = pointers(envs[r]);
    const pid_t pid = start("/proc/self/exe", false, argv, envp, fds[1]);
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

std::vector<RankProcess> spawn_through(std::vector<std::string> command, std::vector<std::string> env,
                                       const std::vector<std::string>& fifos) {
  std::vector<RankProcess> ranks;
  auto give_up = [&](const std::string& why) {
    for (const RankProcess& p : ranks) close(p.channel);
    throw Error(why);
  };
  for (const std::string& fifo : fifos) {
    // Read end non-blocking: opening it waits for no writer, and the rank's
    // open for writing then finds a reader.
    int fd = -1;
    if (mkfifo(fifo.c_str(), 0600) != 0 || (fd = open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)) < 0)
      give_up("cannot make the channel " + fifo + ": " + std::strerror(errno));
    ranks.push_back(RankProcess{-1, fd, true});
  }
  std::vector<char*> argv = pointers(command);
  std::vector<char*> envp = pointers(env);
  const pid_t pid = start(command[0].c_str(), true, argv, envp, -1);
  if (pid < 0) give_up("cannot start " + command[0] + ": " + std::strerror(errno));
  for (RankProcess& p : ranks) p.pid = pid;
  return ranks;
}

}  // namespace ddp
