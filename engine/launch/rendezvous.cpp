// rendezvous.cpp — see rendezvous.h.
#include "rendezvous.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <thread>
#include <vector>

#ifdef DDP_HAVE_PMIX
#include <pmix.h>
#endif

#include "env.h"
#include "error.h"

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;

std::string get(const std::function<const char*(const char*)>& lookup, const char* name) {
  const char* v = lookup(name);
  return v ? v : "";
}

// Whether the launcher says every rank runs on this host.
bool all_local(const std::function<const char*(const char*)>& lookup) {
  auto same = [&](const char* local, const char* world) {
    const std::string l = get(lookup, local);
    const std::string w = get(lookup, world);
    return !l.empty() && l == w;
  };
  return same("OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_SIZE") || get(lookup, "SLURM_STEP_NUM_NODES") == "1" ||
         same("LOCAL_WORLD_SIZE", "WORLD_SIZE") || same("MPI_LOCALNRANKS", "PMI_SIZE");
}

bool is_port(const std::string& text) {
  return !text.empty() && text.size() <= 5 &&
         std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; }) && std::stoi(text) >= 1 &&
         std::stoi(text) <= 65535;
}

// DDP_RENDEZVOUS, checked before anything connects to it.
void check_given(const std::string& given) {
  const std::string head = "DDP_RENDEZVOUS=" + given + ": ";
  if (given.rfind("file:", 0) == 0) {
    if (given.size() == 5) throw Error(head + "no directory after file:", DDP_ERR_INVALID_ARGUMENT);
    return;
  }
  if (given.rfind("redis:", 0) != 0)
    throw Error(head + "neither file:<directory shared by all ranks> nor redis:<host>:<port>",
                DDP_ERR_INVALID_ARGUMENT);
  const std::string rest = given.substr(6);
  const size_t colon = rest.rfind(':');
  if (rest.empty() || colon == 0) throw Error(head + "no host after redis:", DDP_ERR_INVALID_ARGUMENT);
  if (colon != std::string::npos && !is_port(rest.substr(colon + 1)))
    throw Error(head + "'" + rest.substr(colon + 1) + "' is not a port (1 to 65535)", DDP_ERR_INVALID_ARGUMENT);
}

// The IPv4 address of `host` ("10.0.0.1", or a name), for redis-server's bind.
std::string ipv4_of(const std::string& host) {
  addrinfo hints{};
  addrinfo* found = nullptr;
  hints.ai_family = AF_INET;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || !found)
    throw Error("MASTER_ADDR=" + host + " does not resolve to an IPv4 address", DDP_ERR_INVALID_ARGUMENT);
  char text[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr, text, sizeof text);
  freeaddrinfo(found);
  return text;
}

// This host's address for peers on others: the first up IPv4 interface but
// loopback (as the gloo transport's "auto").
std::string own_address() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) throw Error(std::string("getifaddrs: ") + std::strerror(errno), DDP_ERR_COMM);
  std::string found;
  for (ifaddrs* i = list; i && found.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK))
      continue;
    char text[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text);
    found = text;
  }
  freeifaddrs(list);
  if (found.empty())
    throw Error("no network interface but loopback: the other hosts cannot reach rank 0", DDP_ERR_COMM);
  return found;
}

// Whether a TCP connection to address:port opens.
bool reachable(const std::string& address, int port) {
  addrinfo hints{};
  addrinfo* found = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(address.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || !found) return false;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const bool ok = fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0;
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  return ok;
}

void wait_reachable(const std::string& address, int port, double timeout_s, const std::string& what) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(int64_t(timeout_s * 1000));
  while (!reachable(address, port)) {
    if (Clock::now() > deadline)
      throw Error(what + " at " + address + ":" + std::to_string(port) + " did not answer within " +
                      std::to_string(int(timeout_s)) + " s (is rank 0 started, and that port open?)",
                  DDP_ERR_TIMEOUT);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Binds a socket to address:port (0: the kernel's choice), as a server
// would (SO_REUSEADDR: a closed connection's TIME_WAIT is no obstacle), and
// lets it go: the port it got, or -errno.
int try_bind(const std::string& address, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  const int on = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  inet_pton(AF_INET, address.c_str(), &a.sin_addr);
  socklen_t len = sizeof a;
  int got = -EINVAL;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    got = -errno;
  else
    got = ntohs(a.sin_port);
  close(fd);
  return got;
}

// A port free on `address` now (the kernel's choice).
int free_port(const std::string& address) {
  const int port = try_bind(address, 0);
  if (port < 0) throw Error("no free port on " + address + ": " + std::strerror(-port), DDP_ERR_COMM);
  return port;
}

// Starts redis-server on address:port (no persistence, reachable by the
// other hosts), dying with this process; returns its pid once it answers.
int serve_redis(const std::string& address, int port) {
  const std::string p = std::to_string(port);
  if (try_bind(address, port) == -EADDRINUSE)  // else redis-server fails, and whoever holds it answers
    throw Error("rank 0 cannot serve the rendezvous at " + address + ":" + p +
                    ": another program holds that port (choose another MASTER_PORT)",
                DDP_ERR_INVALID_ARGUMENT);
  std::vector<const char*> argv = {
      "redis-server", "--bind", address.c_str(), "--port", p.c_str(),    "--protected-mode", "no",
      "--save",       "",       "--appendonly",  "no",     "--loglevel", "warning",          nullptr};
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    const int null = open("/dev/null", O_WRONLY);  // its start and stop banners are not the run's
    dup2(null, 1);
    dup2(null, 2);
    execvp(argv[0], const_cast<char* const*>(argv.data()));
    _exit(127);
  }
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  for (;;) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
        throw Error(
            "rank 0 serves the rendezvous with redis-server, which is not installed (Debian: redis-server); "
            "or set DDP_RENDEZVOUS",
            DDP_ERR_INVALID_ARGUMENT);
      throw Error("redis-server could not serve the rendezvous at " + address + ":" + p + " (port taken?)",
                  DDP_ERR_COMM);
    }
    if (reachable(address, port)) return pid;
    if (Clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      throw Error("redis-server did not answer at " + address + ":" + p + " within 10 s", DDP_ERR_COMM);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

RendezvousPlan plan_rendezvous(const std::function<const char*(const char*)>& lookup, const std::string& run_id,
                               const std::string& temp_dir) {
  const std::string given = get(lookup, "DDP_RENDEZVOUS");
  if (!given.empty()) {
    check_given(given);
    return {RendezvousPlan::kGiven, given};
  }
  const std::string addr = get(lookup, "MASTER_ADDR");
  const std::string port = get(lookup, "MASTER_PORT");
  if (!addr.empty() && !port.empty() && !is_port(port))
    throw Error("MASTER_PORT=" + port + " is not a port (1 to 65535)", DDP_ERR_INVALID_ARGUMENT);
  if (!addr.empty() && !port.empty()) return {RendezvousPlan::kMaster, addr + ":" + port};
  if (run_id != "ddp" && all_local(lookup))
    return {RendezvousPlan::kLocalFile,
            "file:" + (std::filesystem::path(temp_dir) / ("ddp-rendezvous-" + run_id)).string()};
  if (!get(lookup, "PMIX_NAMESPACE").empty()) return {RendezvousPlan::kPmix, ""};
  return {RendezvousPlan::kNone, ""};
}

namespace {

#ifdef DDP_HAVE_PMIX
// Rank 0's store location (or "error: why"), to every rank through PMIx: put
// by rank 0, a fence of all ranks bounded by the timeout, get by all.
std::string share_through_pmix(const std::string& mine, double timeout_s) {
  pmix_proc_t me;
  if (pmix_status_t rc = PMIx_Init(&me, nullptr, 0); rc != PMIX_SUCCESS)
    throw Error(std::string("PMIx_Init: ") + PMIx_Error_string(rc), DDP_ERR_COMM);
  if (me.rank == 0) {
    pmix_value_t value;
    PMIX_VALUE_LOAD(&value, mine.c_str(), PMIX_STRING);
    PMIx_Put(PMIX_GLOBAL, "ddp.rendezvous", &value);
    PMIX_VALUE_DESTRUCT(&value);
  }
  PMIx_Commit();
  pmix_proc_t all;
  pmix_proc_t zero;
  PMIX_LOAD_PROCID(&all, me.nspace, PMIX_RANK_WILDCARD);
  PMIX_LOAD_PROCID(&zero, me.nspace, 0);
  pmix_info_t info[2];
  bool collect = true;
  int seconds = std::max(1, int(timeout_s));
  PMIX_INFO_LOAD(&info[0], PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
  PMIX_INFO_LOAD(&info[1], PMIX_TIMEOUT, &seconds, PMIX_INT);
  pmix_status_t rc = PMIx_Fence(&all, 1, info, 2);
  pmix_value_t* value = nullptr;
  if (rc == PMIX_SUCCESS) rc = PMIx_Get(&zero, "ddp.rendezvous", nullptr, 0, &value);
  if (rc != PMIX_SUCCESS || !value || value->type != PMIX_STRING)
    throw Error(std::string("PMIx: rank 0's rendezvous did not arrive: ") + PMIx_Error_string(rc),
                rc == PMIX_ERR_TIMEOUT ? DDP_ERR_TIMEOUT : DDP_ERR_COMM);
  const std::string location = value->data.string;
  PMIX_VALUE_RELEASE(value);
  return location;
}
#endif

}  // namespace

Rendezvous::Rendezvous(const RankInfo& rank, const std::string& run_id, double timeout_s)
    : unwinding_(std::uncaught_exceptions()) {
  const char* tmp = env().get("TMPDIR");
  const RendezvousPlan plan = plan_rendezvous(env_var, run_id, tmp && *tmp ? tmp : "/tmp");
  switch (plan.way) {
    case RendezvousPlan::kGiven: location_ = plan.location; return;
    case RendezvousPlan::kLocalFile:
      std::filesystem::create_directories(plan.location.substr(5));
      location_ = plan.location;
      local_dir_ = plan.location.substr(5);
      return;
    case RendezvousPlan::kMaster: {
      const size_t colon = plan.location.rfind(':');
      const std::string host = plan.location.substr(0, colon);
      int port = 0;
      try {
        port = std::stoi(plan.location.substr(colon + 1));
      } catch (const std::exception&) {
        throw Error("MASTER_PORT=" + plan.location.substr(colon + 1) + " is not a port", DDP_ERR_INVALID_ARGUMENT);
      }
      if (rank.rank == 0) server_ = serve_redis(ipv4_of(host), port);
      wait_reachable(host, port, timeout_s, "the rendezvous (MASTER_ADDR, MASTER_PORT)");
      location_ = "redis:" + plan.location;
      return;
    }
    case RendezvousPlan::kPmix: {
#ifdef DDP_HAVE_PMIX
      std::string mine;
      if (rank.rank == 0) {
        try {
          const std::string address = own_address();
          const int port = free_port(address);
          server_ = serve_redis(address, port);
          mine = "redis:" + address + ":" + std::to_string(port);
        } catch (const std::exception& e) {
          mine = std::string("error: ") + e.what();  // the others hear why, rather than wait
        }
      }
      pmix_ = true;
      location_ = share_through_pmix(mine, timeout_s);
      if (location_.rfind("error: ", 0) == 0)
        throw Error((rank.rank == 0 ? "" : "rank 0: ") + location_.substr(7), DDP_ERR_COMM);
      return;
#else
      break;
#endif
    }
    case RendezvousPlan::kNone: break;
  }
  throw Error(
      "no rendezvous: set DDP_RENDEZVOUS to file:<directory shared by all ranks> (fresh for each run) or "
      "redis:<host>:<port>, or MASTER_ADDR and MASTER_PORT (rank 0 then serves a Redis store there)",
      DDP_ERR_INVALID_ARGUMENT);
}

Rendezvous::~Rendezvous() {
  if (!local_dir_.empty() && std::uncaught_exceptions() > unwinding_) {
    std::error_code ec;
    std::filesystem::remove_all(local_dir_, ec);  // peers still in it are failing too
  } else if (!local_dir_.empty()) {
    rmdir(local_dir_.c_str());  // the last rank out removes it (each removes its keys)
  }
  if (server_ > 0) {
    kill(server_, SIGTERM);
    waitpid(server_, nullptr, 0);
  }
#ifdef DDP_HAVE_PMIX
  if (pmix_) PMIx_Finalize(nullptr, 0);
#endif
}

}  // namespace ddp
