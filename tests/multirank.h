// multirank.h — runs a test body as `world` ranks, each in its own forked
// process, the way the engine runs them (one process per rank, meeting
// through a file store in a shared directory).
//
//   auto failures = ddp::run_ranks(4, [](int rank, const std::string& dir) {
//     ... // throws std::exception on failure
//   });
//   for (auto& f : failures) ADD_FAILURE() << f;
//
// The parent forks before doing anything else, so a body may create threads,
// sockets and Gloo contexts freely; the parent must not have touched Gloo
// before (a forked child inherits only the calling thread). Each child ends
// with _exit: 0 when the body returned (and no GoogleTest assertion failed
// in it), else 1 with the message written to a per-rank file. The parent
// waits up to `timeout_s` for all of them and SIGKILLs the rest (once a
// rank has failed, its peers get `grace_s` of that).
//
// Returns one "rank <r>: <message>" per failing rank, in rank order; empty
// when every rank succeeded.
//
// Launched by mpirun instead (tests/mpirun_ranks.sh W TEST ...: a transport
// whose ranks must come from a launcher, such as mpi), each process is one
// rank and run_ranks runs the body once, as that rank, in this process: the
// ranks meet in the directory the script names (DDP_TEST_SHARED_DIR), each
// call in its own subdirectory (every rank makes the same calls in the same
// order), and wait there for each other's outcome, so that every rank
// returns every rank's failures. A world other than the launch's fails.
#pragma once

#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <iostream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace ddp {

using RankBody = std::function<void(int rank, const std::string& rendezvous_dir)>;

// The GoogleTest assertions that failed so far in the current test (a
// forked child inherits its parent's: those are not the body's).
inline int failed_assertions() {
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  if (!test) return 0;
  int failed = 0;
  for (int k = 0; k < test->result()->total_part_count(); ++k) failed += test->result()->GetTestPartResult(k).failed();
  return failed;
}

// The body's outcome: "" when it returned and no GoogleTest assertion failed
// in it.
inline std::string run_body(const RankBody& body, int rank, const std::string& dir) {
  std::string message;
  const int failed_before = failed_assertions();
  try {
    body(rank, dir);
    if (failed_assertions() > failed_before) message = "a GoogleTest assertion failed in this rank (see its output above)";
  } catch (const std::exception& e) {
    message = e.what();
    if (message.empty()) message = "exception with an empty message";
  } catch (...) {
    message = "unknown exception";
  }
  return message;
}

// This process's place when mpirun launched it: its rank, the launch's
// world and the directory all its ranks share; nullopt when not launched.
struct LaunchedRank {
  int rank = 0;
  int world = 1;
  std::string shared_dir;
};
inline std::optional<LaunchedRank> launched_rank() {
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const char* world = std::getenv("OMPI_COMM_WORLD_SIZE");
  const char* dir = std::getenv("DDP_TEST_SHARED_DIR");
  if (!rank || !world) return std::nullopt;
  if (!dir || !*dir) {
    std::cerr << "multirank: launched by mpirun without DDP_TEST_SHARED_DIR: use tests/mpirun_ranks.sh" << std::endl;
    std::abort();
  }
  return LaunchedRank{std::atoi(rank), std::atoi(world), dir};
}

// A directory for this call that every rank of a launch names alike (the
// n-th call of a process is the n-th of every other); made if missing.
inline std::string launched_call_dir(const LaunchedRank& me, const std::string& what) {
  static int calls = 0;
  const std::string dir = me.shared_dir + "/" + what + std::to_string(calls++);
  std::filesystem::create_directories(dir);
  return dir;
}

// One rank of a launched world: runs the body, publishes its outcome, waits
// up to `timeout_s` for every other rank's.
inline std::vector<std::string> run_launched_rank(const LaunchedRank& me, int world, const RankBody& body,
                                                  int timeout_s) {
  if (world != me.world)
    return {"rank " + std::to_string(me.rank) + ": the test needs " + std::to_string(world) +
            " ranks and mpirun launched " + std::to_string(me.world) + " (filter it out: --gtest_filter)"};
  const std::string base = launched_call_dir(me, "ranks");
  const std::string store_dir = base + "/store";
  std::filesystem::create_directories(store_dir);
  auto outcome = [&](int rank) { return base + "/outcome." + std::to_string(rank); };
  {
    const std::string message = run_body(body, me.rank, store_dir);
    const std::string partial = outcome(me.rank) + ".partial";
    std::ofstream(partial, std::ios::binary | std::ios::trunc) << message;
    std::filesystem::rename(partial, outcome(me.rank));  // whole, or not there
  }
  std::vector<std::string> failures;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  for (int rank = 0; rank < world; ++rank) {
    while (!std::filesystem::exists(outcome(rank)) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::ifstream in(outcome(rank), std::ios::binary);
    if (!in) {
      failures.push_back("rank " + std::to_string(rank) + ": no outcome after " + std::to_string(timeout_s) + " s");
      continue;
    }
    const std::string message{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    if (!message.empty()) failures.push_back("rank " + std::to_string(rank) + ": " + message);
  }
  return failures;
}

// How long a failed rank's peers get to fail on their own before
// fork_ranks stops them, as `ddp run`'s launcher does after its grace (1 s
// there; more here, so a peer's own report still arrives under a loaded
// CI): a peer left waiting in the rendezvous for a rank that is gone would
// otherwise run to the deadline.
constexpr int kPeerGraceSeconds = 10;

// The ranks as forked children of this process (even when launched).
// `body(rank, rendezvous_dir)`: rendezvous_dir is an empty directory made for
// this call and shared by all its ranks (use it as "file:" + dir).
inline std::vector<std::string> fork_ranks(int world, const RankBody& body, int timeout_s = 60,
                                           int grace_s = kPeerGraceSeconds) {
  namespace fs = std::filesystem;
  std::vector<std::string> failures;

  std::string base = (fs::temp_directory_path() / "ddp_multirank.XXXXXX").string();
  if (mkdtemp(base.data()) == nullptr) return {"mkdtemp failed for " + base};
  const std::string store_dir = base + "/store";
  fs::create_directory(store_dir);
  auto result_file = [&](int rank) { return base + "/failure." + std::to_string(rank); };

  std::fflush(nullptr);  // nothing buffered is written twice by the children
  std::cout.flush();
  std::cerr.flush();

  const pid_t parent = getpid();
  std::vector<pid_t> pids(static_cast<size_t>(world), -1);
  for (int rank = 0; rank < world; ++rank) {
    pid_t pid = fork();
    if (pid < 0) {
      failures.push_back("rank " + std::to_string(rank) + ": fork failed");
      break;
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test program
      if (getppid() != parent) _exit(3);
      const std::string message = run_body(body, rank, store_dir);
      if (message.empty()) _exit(0);
      {
        std::ofstream out(result_file(rank), std::ios::binary | std::ios::trunc);
        out << message;
      }
      std::fflush(nullptr);
      _exit(1);
    }
    pids[static_cast<size_t>(rank)] = pid;
  }

  // Collect, with a deadline.
  std::vector<int> status(static_cast<size_t>(world), 0);
  std::vector<bool> done(static_cast<size_t>(world), false);
  std::vector<bool> killed(static_cast<size_t>(world), false);
  for (int rank = 0; rank < world; ++rank)
    if (pids[static_cast<size_t>(rank)] < 0) done[static_cast<size_t>(rank)] = true;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int first_failed = -1;  // the first rank seen to fail, where its grace ends before the deadline
  for (;;) {
    bool all = true;
    for (int rank = 0; rank < world; ++rank) {
      size_t r = static_cast<size_t>(rank);
      if (done[r]) continue;
      pid_t got = waitpid(pids[r], &status[r], WNOHANG);
      if (got == pids[r]) {
        done[r] = true;
        const bool failed = !(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0);
        const auto grace_end = std::chrono::steady_clock::now() + std::chrono::seconds(grace_s);
        if (failed && first_failed < 0 && grace_end < deadline) {
          first_failed = rank;
          deadline = grace_end;
        }
      } else {
        all = false;
      }
    }
    if (all) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      for (int rank = 0; rank < world; ++rank) {
        size_t r = static_cast<size_t>(rank);
        if (done[r]) continue;
        kill(pids[r], SIGKILL);
        waitpid(pids[r], &status[r], 0);
        done[r] = true;
        killed[r] = true;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }

  for (int rank = 0; rank < world; ++rank) {
    size_t r = static_cast<size_t>(rank);
    if (pids[r] < 0) continue;  // never started (reported above)
    if (killed[r]) {
      failures.push_back("rank " + std::to_string(rank) + ": still running " +
                         (first_failed < 0 ? "after " + std::to_string(timeout_s) + " s"
                                           : std::to_string(grace_s) + " s after rank " +
                                                 std::to_string(first_failed) + " failed") +
                         ", killed");
      continue;
    }
    const int st = status[r];
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) continue;
    std::string message;
    {
      std::ifstream in(result_file(rank), std::ios::binary);
      message.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    if (message.empty()) {
      if (WIFSIGNALED(st))
        message = "killed by signal " + std::to_string(WTERMSIG(st));
      else
        message = "exited with status " + std::to_string(WEXITSTATUS(st));
    }
    failures.push_back("rank " + std::to_string(rank) + ": " + message);
  }

  std::error_code ec;
  fs::remove_all(base, ec);
  return failures;
}

// The ranks of a test: forked, or this process's own when launched.
inline std::vector<std::string> run_ranks(int world, const RankBody& body, int timeout_s = 60) {
  if (const auto me = launched_rank()) return run_launched_rank(*me, world, body, timeout_s);
  return fork_ranks(world, body, timeout_s);
}

}  // namespace ddp
