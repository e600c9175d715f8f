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
// waits up to `timeout_s` for all of them and SIGKILLs the rest.
//
// Returns one "rank <r>: <message>" per failing rank, in rank order; empty
// when every rank succeeded.
#pragma once

#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace ddp {

// `body(rank, rendezvous_dir)`: rendezvous_dir is an empty directory made for
// this call and shared by all its ranks (use it as "file:" + dir).
inline std::vector<std::string> run_ranks(
    int world, const std::function<void(int rank, const std::string& rendezvous_dir)>& body,
    int timeout_s = 60) {
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
      std::string message;
      try {
        body(rank, store_dir);
        if (::testing::Test::HasFailure())
          message = "a GoogleTest assertion failed in this rank (see its output above)";
      } catch (const std::exception& e) {
        message = e.what();
        if (message.empty()) message = "exception with an empty message";
      } catch (...) {
        message = "unknown exception";
      }
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
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  for (;;) {
    bool all = true;
    for (int rank = 0; rank < world; ++rank) {
      size_t r = static_cast<size_t>(rank);
      if (done[r]) continue;
      pid_t got = waitpid(pids[r], &status[r], WNOHANG);
      if (got == pids[r]) {
        done[r] = true;
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
      failures.push_back("rank " + std::to_string(rank) + ": still running after " +
                         std::to_string(timeout_s) + " s, killed");
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

}  // namespace ddp
